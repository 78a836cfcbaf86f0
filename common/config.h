// Loading and validating the job configuration (proto/config.proto).
//
// A configuration file is never trusted: parse errors name the file, line
// and column; validation errors name the field path (e.g.
// "tables[1].sparse.dim"). Defaults documented in config.proto are filled in
// before validation, so code that reads a loaded config never sees a 0 that
// means "default".
#ifndef PS_COMMON_CONFIG_H_
#define PS_COMMON_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/status.h"
#include "proto/config.pb.h"

namespace ps {

// Parses `text` (textproto of JobConfig), fills defaults and validates.
// `source` names the input in error messages (usually the file path).
// Errors: INVALID_ARGUMENT with "source:line:column: ..." or
// "source: field.path: ...".
absl::StatusOr<JobConfig> ParseJobConfig(absl::string_view text,
                                         absl::string_view source);

// Reads and parses the file at `path`. NOT_FOUND if it cannot be read.
absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path);

// Fills documented defaults in place. Idempotent.
void ApplyDefaults(JobConfig* config);

// `limits` with every unset (0) field at its default (proto/config.proto
// DataPlaneLimits). ApplyDefaults uses it; components use it on configs
// that may not have been through ApplyDefaults.
DataPlaneLimits LimitsWithDefaults(DataPlaneLimits limits);

// Checks every field of a config that already has defaults applied.
absl::Status ValidateJobConfig(const JobConfig& config);

// Checks an optimizer block: one rule set, used by config validation and by
// the servers' Optimizer::Create. INVALID_ARGUMENT naming each bad field
// under `path` (e.g. "optimizer.adam.beta1: must be in [0, 1)").
absl::Status ValidateOptimizer(const OptimizerConfig& optimizer,
                               const std::string& path = "optimizer");

// Checks a sparse table block (limits, admission, eviction), used by config
// validation and by the servers' Table::Create. INVALID_ARGUMENT naming each
// bad field under `path`.
absl::Status ValidateSparseTable(const SparseTableConfig& sparse,
                                 const std::string& path = "sparse");

// Checks a consistency block (also used for run-time mode changes).
// INVALID_ARGUMENT naming the field ("mode: ...", "staleness: ...").
absl::Status ValidateConsistency(const ConsistencyConfig& consistency);

// A stable 64-bit digest of the config, used to refuse nodes started with a
// different file.
uint64_t ConfigFingerprint(const JobConfig& config);

// How many server ranks a job may use: cluster.elastic.max_servers for an
// elastic job (spares join at ranks num_servers and up), else num_servers.
// Ranks are below it; slot maps and views may name any of them.
inline uint32_t MaxServerRanks(const ClusterConfig& cluster) {
  return cluster.has_elastic() ? cluster.elastic().max_servers()
                               : cluster.num_servers();
}

// The table called `name`, or NOT_FOUND.
// The dense table on the servers that holds the optimizer state of the
// all-reduced dense table `table` (DenseTableConfig.ALLREDUCE), so that
// checkpoints hold it once: "<table>.allreduce_state", state floats per
// element times the table's size, the element's floats together as
// common/optimizer.h lays them out. ApplyDefaults adds it to the job (with
// the highest table id not in use, counting down from 65535) when the
// table's optimizer keeps state.
std::string AllReduceStateTable(absl::string_view table);
// Floats of optimizer state per element (Optimizer::state_size).
uint32_t OptimizerStateFloats(const OptimizerConfig& optimizer);

absl::StatusOr<const TableConfig*> FindTable(const JobConfig& config,
                                             absl::string_view name);

}  // namespace ps

#endif  // PS_COMMON_CONFIG_H_
