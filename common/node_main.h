// The start every binary's main() shares, after flags are parsed: keep
// large message buffers in the process (common/allocator.h), set the log
// level, check required flags, load and validate the job config. Flags
// are read by main() itself and passed in as values.
#ifndef PS_COMMON_NODE_MAIN_H_
#define PS_COMMON_NODE_MAIN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "spdlog/spdlog.h"

namespace ps {

// Cluster sizes that replace the config file's (flags --num_servers and
// --num_workers, which launchers such as deploy/launch/psnode set from the
// cluster manager's environment). 0 keeps the file's value; the amended
// config is validated again, and its fingerprint covers the new sizes, so
// every process of a job must be given the same values.
struct ClusterSizeOverride {
  int64_t num_servers = 0;
  int64_t num_workers = 0;
};

// `required`: (flag name, value) pairs that must not be empty. On any
// problem (including a negative or invalid size override), logs it on
// `log` and returns nullopt; the caller exits with 2.
std::optional<JobConfig> StartNode(
    spdlog::logger& log, absl::string_view log_level, const std::string& config_path,
    const std::vector<std::pair<const char*, std::string>>& required = {},
    const ClusterSizeOverride& sizes = {});

// Applies `sizes` to `config` (defaults already filled) and validates the
// result. INVALID_ARGUMENT naming the flag for a negative size, or the
// config's validation error ("cluster.replication: 2 needs at least 2
// servers").
absl::Status OverrideClusterSize(const ClusterSizeOverride& sizes, JobConfig* config);

}  // namespace ps

#endif  // PS_COMMON_NODE_MAIN_H_
