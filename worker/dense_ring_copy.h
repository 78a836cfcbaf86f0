// The servers' copy of a worker's all-reduced dense tables, and the order
// in which a step, a join and the worker's data-plane clock meet that copy.
// One implementation for both front ends: the C++ trainer (one dense table)
// and the C ABI of the Python package (the job's all-reduced tables as one
// replica, concatenated in the order given).
//
// The servers stay each table's home for export, evaluation and
// checkpoints: WriteServers assigns the replica's values to the tables and
// its optimizer state to their companion tables ("<table>.allreduce_state",
// common/config.h AllReduceStateTable); ReadServers reads them back (a
// resumed job).
//
// EndStep orders the clock and the collective: the clock moves on first,
// because the all-reduce may wait for a ring to form again, and under BSP
// and SSP a member blocked there must not hold back the pulls of the
// members it waits for. The one exception is the last step before a
// checkpoint's cut (KVClient::checkpoint_clock): the servers must hold that
// step's values when they write the cut, so the ring's first member writes
// them before its clock reaches the cut (writes at clock cut - 1 are not
// held back).
//
// JoinRunning joins a ring that is already training (a replacement, or a
// worker back from a shard's end). Under BSP and SSP its members may wait
// for this worker's clock while it waits for them, so its clock reads
// finished meanwhile and then resumes at the members' clock (or its own,
// when later).
//
// Thread safety: const methods may be called from any thread; the
// AllReducedTable and KVClient passed in follow their own contracts (one
// training thread per table). Nothing is owned.
#ifndef PS_WORKER_DENSE_RING_COPY_H_
#define PS_WORKER_DENSE_RING_COPY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "worker/dense_ring.h"
#include "worker/kv_client.h"

namespace ps {

class DenseRingCopy {
 public:
  // One table of the replica: its elements [offset, offset + size) of the
  // replica, and the companion table of its optimizer state (none for a
  // stateless optimizer such as SGD).
  struct Part {
    uint32_t id = 0;
    uint64_t offset = 0;
    uint64_t size = 0;
    std::optional<uint32_t> state_id;
  };

  // The copy of `tables` (dense, ALLREDUCE, one optimizer config, in
  // replica order) in `config`, whose loader added the companion tables.
  // NOT_FOUND when a companion table is missing.
  static absl::StatusOr<DenseRingCopy> Create(
      const JobConfig& config, absl::Span<const TableConfig* const> tables);

  const std::vector<Part>& parts() const { return parts_; }
  // Optimizer-state floats per element.
  uint32_t state_floats() const { return state_floats_; }

  // Assigns the replica's values and optimizer state to the servers and
  // waits; the first error of any write.
  absl::Status WriteServers(KVClient& kv, const AllReducedTable& t) const;
  // Replaces the replica's values, and its optimizer state when
  // `with_state`, by the servers' copy, keeping its step.
  absl::Status ReadServers(KVClient& kv, AllReducedTable& t,
                           bool with_state) const;

  // Ends one step: `end_step` moves the worker's clock on (and may queue
  // what it returns), and the all-reduce of `grad` runs after it, except on
  // the last step before a checkpoint's cut (see above). On an error of
  // the all-reduce at that step, `end_step` is not called. Errors:
  // AllReducedTable::Step's, WriteServers'.
  absl::Status EndStep(KVClient& kv, AllReducedTable& t,
                       absl::Span<const float> grad,
                       absl::FunctionRef<void()> end_step) const;

  // Joins a ring that trains (see above). `paused_clock` receives the clock
  // the worker had (AllReducedTable::Options::clock reads it while the
  // clock shows finished); `restart(clock)` resumes the worker's clock. A
  // worker already finished only joins. Errors: the join's, then the
  // clock's.
  static absl::Status JoinRunning(
      KVClient& kv, AllReducedTable& t, std::atomic<uint64_t>& paused_clock,
      const std::function<absl::Status(uint64_t)>& restart);

 private:
  DenseRingCopy(std::vector<Part> parts, uint32_t state_floats)
      : parts_(std::move(parts)), state_floats_(state_floats) {}

  std::vector<Part> parts_;
  uint32_t state_floats_ = 0;
};

}  // namespace ps

#endif  // PS_WORKER_DENSE_RING_COPY_H_
