// Consistency control on a server: tracks workers' clocks, decides when a
// pull may be answered, and (under BSP) which buffered steps are complete.
//
// Clocks: a worker's clock is the number of steps it has completed. It is
// reported by ADVANCE_CLOCK messages, which each worker sends to every
// server after the step's pushes, so a clock report always arrives after
// the pushes it covers. Liveness comes from the cluster view: only live
// workers are waited for, and a worker that dies or leaves stops counting
// at once. A live worker not heard from yet counts at its start clock.
//
// Rules, for a pull at clock c:
//   ASYNC   answered at once;
//   SSP(s)  answered once every live worker's clock >= c - s;
//   BSP     answered once every step < c has been applied.
// Under BSP, pushes of step t are buffered and applied, averaged, once every
// live worker's clock is > t (it finished step t).
//
// Cost: every worker sends a few requests per step, and each may ask for
// MinClock() (pull answers, SSP gating, BSP completion), so the smallest
// live clock is kept in an ordered index rather than found by a scan:
// MinClock() is O(1) and a clock change O(log N) for N live workers.
// SetLiveWorkers() is O(N log N); it runs once per cluster view.
//
// Not thread-safe: owned by the server's serving thread.
#ifndef PS_SERVER_CONSISTENCY_H_
#define PS_SERVER_CONSISTENCY_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"

namespace ps {

class ConsistencyController {
 public:
  struct Worker {
    uint64_t node_id = 0;
    uint32_t rank = 0;
    uint64_t start_clock = 0;
  };
  // A live worker that holds back progress, for watchdog messages.
  struct Laggard {
    uint32_t rank = 0;
    uint64_t clock = 0;
  };

  static constexpr uint64_t kNoWorkers = std::numeric_limits<uint64_t>::max();

  explicit ConsistencyController(const ConsistencyConfig& config);

  // Replaces the set of live workers (from the cluster view). A node id
  // listed twice counts once (the first entry).
  void SetLiveWorkers(const std::vector<Worker>& workers);

  // Changes the mode. Returns true when BSP was left: the caller must then
  // flush buffered steps (BufferedSteps()) before anything else.
  // Entering BSP starts aggregation at the largest clock of the live workers
  // still training (finished ones, at 2^62, are left out): steps before it
  // were applied as they came, so pushes for them still apply at once.
  bool SetMode(const ConsistencyConfig& config);

  const ConsistencyConfig& config() const { return config_; }
  ConsistencyMode mode() const { return config_.mode(); }

  // Records that worker `node_id` completed `clock` steps. Clocks only grow;
  // a smaller value is ignored.
  void Advance(uint64_t node_id, uint64_t clock);

  // A worker that had finished (kFinishedClock) resumes training at
  // `clock` (to take over an orphaned data shard): it counts again, from
  // `clock` on.
  void Restart(uint64_t node_id, uint64_t clock);

  // BSP: steps below `clock` count as applied (a server restored from a
  // checkpoint taken at `clock`).
  void SetAppliedClock(uint64_t clock) {
    applied_clock_ = std::max(applied_clock_, clock);
  }

  // Smallest clock among live workers (kFinishedClock for a finished one);
  // kNoWorkers when none is live. O(1).
  uint64_t MinClock() const {
    return live_clocks_.empty() ? kNoWorkers : live_clocks_.begin()->first;
  }

  // Whether a pull at `clock` may be answered now.
  bool PullReady(uint64_t clock) const;

  // BSP: steps < applied_clock() have been applied. Whether a push of step
  // `clock` must be buffered rather than applied at once.
  uint64_t applied_clock() const { return applied_clock_; }
  bool ShouldBuffer(uint64_t clock) const {
    return mode() == BSP && clock >= applied_clock_;
  }

  // BSP: the next buffered step that every live worker has finished, if
  // any; the caller applies its buffer, then calls StepApplied(). Steps
  // without buffered data are passed over (applied_clock() moves up to the
  // slowest live clock), since there is nothing to apply for them.
  // Steps >= `limit` are neither returned nor passed over (a checkpoint at
  // `limit` must be written first).
  bool NextCompleteStep(uint64_t* step, uint64_t limit = kNoWorkers);

  // Pushes further ahead of the applied steps than this are refused: no
  // worker can be that far ahead under BSP, and buffering them would only
  // hold memory.
  static constexpr uint64_t kMaxStepsAhead = 1000000;
  void StepApplied() { ++applied_clock_; }

  // How many workers finished `step`: the divisor of its average. Counted
  // when their clocks pass it, so a worker that finished a step and then
  // left still counts for that step; a worker that ended training
  // (kFinishedClock) does not count for steps it never took. At least 1.
  uint32_t FinishedCount(uint64_t step) const;
  // Marks `step` as having buffered data, so finishers are counted for it.
  void NoteBuffered(uint64_t step);
  void ForgetStep(uint64_t step) { finished_.erase(step); }

  // Live workers whose clock is below `clock`, for the watchdog.
  std::vector<Laggard> Behind(uint64_t clock) const;

 private:
  // The clock waits use: kFinishedClock for a worker that finished.
  uint64_t ClockOf(uint64_t node_id, uint64_t start_clock) const;
  uint64_t ClockOf(const Worker& w) const {
    return ClockOf(w.node_id, w.start_clock);
  }
  // Steps the worker has completed (its clock before it finished).
  uint64_t StepsTaken(uint64_t node_id, uint64_t start_clock) const;
  uint64_t StepsTaken(const Worker& w) const {
    return StepsTaken(w.node_id, w.start_clock);
  }
  // Runs `change` (which may change what ClockOf says of `node_id`) and
  // moves the node in live_clocks_ if it is live and its clock changed.
  template <typename Change>
  void ChangeClock(uint64_t node_id, Change change);
  void IndexClock(uint64_t clock) { ++live_clocks_[clock]; }
  void UnindexClock(uint64_t clock);

  ConsistencyConfig config_;
  std::vector<Worker> live_;
  // Live node id -> its start clock; and the live workers' ClockOf() as a
  // multiset (clock -> how many), whose first key is MinClock().
  absl::flat_hash_map<uint64_t, uint64_t> live_start_;
  absl::btree_map<uint64_t, uint32_t> live_clocks_;
  absl::flat_hash_map<uint64_t, uint64_t> clocks_;  // node id -> steps taken
  absl::flat_hash_set<uint64_t> finished_nodes_;     // reported kFinishedClock
  uint64_t applied_clock_ = 0;
  // Buffered step -> node ids whose clock passed it.
  absl::btree_map<uint64_t, absl::flat_hash_set<uint64_t>> finished_;
};

}  // namespace ps

#endif  // PS_SERVER_CONSISTENCY_H_
