// A dense table kept by every training worker and synchronised by a ring
// all-reduce (config: DenseTableConfig.sync = ALLREDUCE), instead of pushed
// to and pulled from the servers.
//
// Each Step(grad) sums the gradients of every ring member with gloo's
// bandwidth-optimal ring (reduce-scatter then all-gather, 2·(P−1)·N/P
// floats sent and received per member for P members and N elements),
// divides by P and applies the table's optimizer (common/optimizer.h, the
// servers' rules, with the same learning-rate schedule by step) to the
// replica. Every member applies the same average to the same state, so the
// replicas stay bit-identical, and P workers with batch b train like one
// worker with batch P·b, exactly as BSP does on the servers.
//
// Membership: the ring's members are the workers that asked the scheduler
// to join (scheduler/ring_registry.h); a generation is formed when every
// live member of the previous one has asked again. A member that finds a
// new generation forming (a background thread long-polls the scheduler), or
// whose collective fails (a peer died: its connections close and gloo
// throws at once; a peer that hangs: AllReduceConfig.timeout_ms), closes
// its connections, so the others' collectives fail too, and joins the next
// generation. Forming waits for a dead member only until the scheduler
// declares it dead (cluster.heartbeat_timeout_ms); Step gives up with
// DEADLINE_EXCEEDED after AllReduceConfig.form_timeout_ms without a ring.
// A worker joining a ring that trains calls Join first, with its clock
// moved out of the others' way (worker/dense_ring_copy.h JoinRunning):
// under BSP and SSP the members may be waiting for its clock.
//
// Joining: a newly formed generation first agrees on the member that has
// applied the most steps (members that were in a ring before preferred over
// a joiner's initial or servers' values; the lowest ring rank among
// equals) and
// broadcasts its values, optimizer state and step count to all, so a
// joining or replacement worker receives the current dense state, and
// members that diverged by one step when a peer died mid all-reduce (some
// finished the all-gather, some did not) are made equal again. A member
// that was behind drops the gradient it was about to reduce: that step was
// applied with its gradient by the members that finished it.
//
// Thread safety: not thread-safe, except that the background watcher is
// internal; one table per training thread. The SchedulerClient is not
// owned and must outlive the table. Errors are absl::Status; gloo's
// exceptions never leave this class.
#ifndef PS_WORKER_DENSE_RING_H_
#define PS_WORKER_DENSE_RING_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/optimizer.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "scheduler/client.h"

namespace ps {

class AllReducedTable {
 public:
  struct Options {
    // The table (dense; its optimizer and size are used).
    TableConfig table;
    // cluster.num_workers: the learning-rate multiplier of
    // scale_with_workers counts configured workers, as on the servers.
    uint32_t num_workers = 1;
    AllReduceConfig allreduce;
    // A registered worker's client. Not owned.
    SchedulerClient* scheduler = nullptr;
    // The address the other members reach this worker's ring connections
    // at (gloo binds a free port on it).
    std::string host = "127.0.0.1";
    // This worker's data-plane clock (KVClient::clock), sent with the state
    // when this member is the source, so that a joining worker can resume
    // at the members' clock (peer_clock()). Unset: 0.
    std::function<uint64_t()> clock;
  };

  // The replica starts from `values` (table.dense.size floats), fresh
  // optimizer state and step `step` (the number of steps applied, which
  // the learning-rate schedule reads). No ring is joined until the first
  // Step or Join. INVALID_ARGUMENT for a table that is not dense, a size
  // mismatch or a bad optimizer.
  static absl::StatusOr<std::unique_ptr<AllReducedTable>> Create(
      Options options, std::vector<float> values, uint64_t step);
  // Leaves the ring (the others form a new generation at once).
  ~AllReducedTable();
  AllReducedTable(const AllReducedTable&) = delete;
  AllReducedTable& operator=(const AllReducedTable&) = delete;

  // The replica: values, optimizer state (state_size floats per element,
  // interleaved as common/optimizer.h lays it out), and steps applied.
  const std::vector<float>& values() const { return values_; }
  const std::vector<float>& state() const { return state_; }
  uint64_t step() const { return step_; }
  // Replaces the replica (restoring a checkpoint). INVALID_ARGUMENT on a
  // size mismatch. The next formation still broadcasts the most advanced
  // member's state.
  absl::Status Reset(std::vector<float> values, std::vector<float> state,
                     uint64_t step);

  // Averages `grad` (values().size() finite floats) over the ring and
  // applies it; forms or re-forms the ring first when needed. Errors:
  // INVALID_ARGUMENT for a size mismatch; DEADLINE_EXCEEDED when no ring
  // formed within form_timeout_ms; the scheduler's errors (NOT_FOUND: this
  // worker is no longer a member of the job).
  absl::Status Step(absl::Span<const float> grad);
  // Joins the ring now (a worker that starts or resumes training: it
  // receives the current state at once). `min_members`: workers that start
  // a job together pass their number, so the first ring holds them all
  // (JoinRingRequest.min_members). Errors as Step's.
  absl::Status Join(uint32_t min_members = 0);
  // Leaves the ring (no more training work for now); Step joins again.
  absl::Status Leave();

  // The data-plane clock of the member whose state the last formation
  // broadcast (Options::clock), or 0.
  uint64_t peer_clock() const { return peer_clock_; }
  // Whether this worker is in a connected ring that no one asked to form
  // again: the next Step will not wait for a formation.
  bool connected() const { return ring_ != nullptr && !RejoinRequested(); }

  // The current ring's size (0 when not in one), this member's rank in it,
  // and its generation.
  uint32_t ring_size() const;
  uint32_t ring_rank() const;
  // A hash of the replica's values and optimizer state, equal wherever
  // they are equal bit for bit: what logs compare.
  uint64_t Digest() const;
  uint64_t generation() const { return generation_.load(); }
  // Collectives that failed and made this member form the ring again.
  uint64_t reforms() const { return reforms_; }

 private:
  struct Ring;
  AllReducedTable(Options options, std::unique_ptr<Optimizer> optimizer);

  // Joins the next generation (waiting until `deadline` for it to form),
  // connects it and agrees on the state. `pending`: called from Step, with
  // a gradient to reduce.
  absl::Status Form(absl::Time deadline, uint32_t min_members, bool pending);
  // Connects the generation `joined` (size > 1); false on a gloo error
  // (logged), after which the caller joins again.
  bool Connect(const JoinRingResponse& joined);
  // The most advanced member broadcasts its state; false on a gloo error.
  bool Synchronise(bool pending);
  // Applies sum / members to the replica (sum: values_.size() floats,
  // scaled in place).
  void ApplyAverage(float* sum, float contributors);
  void Watch();
  bool RejoinRequested() const;
  void CloseRing();

  const Options options_;
  const std::unique_ptr<Optimizer> optimizer_;
  std::vector<float> values_;
  std::vector<float> state_;
  uint64_t step_ = 0;
  // The replica holds a ring's state (it was in a formed ring), not only
  // initial or servers' values: such a member is preferred as the source.
  bool synchronised_ = false;
  std::unique_ptr<Ring> ring_;
  uint64_t reforms_ = 0;
  // The generation the scheduler last named while this worker's join was
  // pending (JoinRingRequest.after_generation).
  uint64_t asked_after_ = 0;
  uint64_t peer_clock_ = 0;
  // The state a ring's members synchronised on (the source's), logged when
  // the ring forms: every member of a generation logs the same step and
  // digest, which is how a broadcast that did not take shows.
  uint64_t synced_step_ = 0;
  uint64_t synced_digest_ = 0;

  // The generation this member holds (0: none) and the one the watcher
  // found must be left; read by the training thread.
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> rejoin_{0};
  absl::Mutex watch_mu_;
  bool stop_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::thread watcher_;
};

}  // namespace ps

#endif  // PS_WORKER_DENSE_RING_H_
