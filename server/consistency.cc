#include "server/consistency.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/protocol.h"

namespace ps {

ConsistencyController::ConsistencyController(const ConsistencyConfig& config)
    : config_(config) {
  if (config_.mode() == CONSISTENCY_MODE_UNSPECIFIED) config_.set_mode(ASYNC);
}

void ConsistencyController::SetLiveWorkers(const std::vector<Worker>& workers) {
  // Forget the clocks of workers that were live and are no longer (a node
  // id is never reused). Reports from nodes not yet listed are kept: a new
  // worker's first clock report may arrive before the view that lists it.
  absl::flat_hash_map<uint64_t, uint64_t> now_live;
  now_live.reserve(workers.size());
  std::vector<Worker> live;
  live.reserve(workers.size());
  for (const Worker& w : workers) {
    if (now_live.try_emplace(w.node_id, w.start_clock).second)
      live.push_back(w);
  }
  for (const Worker& w : live_) {
    if (!now_live.contains(w.node_id)) {
      clocks_.erase(w.node_id);
      finished_nodes_.erase(w.node_id);
    }
  }
  live_ = std::move(live);
  live_start_ = std::move(now_live);
  live_clocks_.clear();
  for (const Worker& w : live_) IndexClock(ClockOf(w));
}

template <typename Change>
void ConsistencyController::ChangeClock(uint64_t node_id, Change change) {
  const auto live = live_start_.find(node_id);
  if (live == live_start_.end()) {
    change();
    return;
  }
  const uint64_t before = ClockOf(node_id, live->second);
  change();
  const uint64_t after = ClockOf(node_id, live->second);
  if (after == before) return;
  UnindexClock(before);
  IndexClock(after);
}

void ConsistencyController::UnindexClock(uint64_t clock) {
  auto it = live_clocks_.find(clock);
  if (it == live_clocks_.end()) return;  // cannot happen: indexed when live
  if (--it->second == 0) live_clocks_.erase(it);
}

bool ConsistencyController::SetMode(const ConsistencyConfig& config) {
  const ConsistencyMode old_mode = config_.mode();
  const uint32_t timeout = config_.watchdog_timeout_ms();
  const uint32_t interval = config_.watchdog_interval_ms();
  config_ = config;
  if (config_.mode() == CONSISTENCY_MODE_UNSPECIFIED) config_.set_mode(ASYNC);
  // Watchdog settings come from the job config, not from run-time changes.
  if (config_.watchdog_timeout_ms() == 0) config_.set_watchdog_timeout_ms(timeout);
  if (config_.watchdog_interval_ms() == 0) config_.set_watchdog_interval_ms(interval);
  if (old_mode != BSP && config_.mode() == BSP) {
    // Finished workers are left out: 2^62 would put every later step of
    // the others before the start, i.e. BSP would never buffer anything.
    uint64_t max_clock = 0;
    for (const Worker& w : live_) {
      const uint64_t c = ClockOf(w);
      if (c < kFinishedClock) max_clock = std::max(max_clock, c);
    }
    applied_clock_ = std::max(applied_clock_, max_clock);
  }
  return old_mode == BSP && config_.mode() != BSP;
}

void ConsistencyController::Advance(uint64_t node_id, uint64_t clock) {
  if (clock >= kFinishedClock) {
    // The worker is done: it holds nobody back from now on, but it took no
    // part in the steps it skipped, so it is not counted as finishing them.
    ChangeClock(node_id, [&] { finished_nodes_.insert(node_id); });
    return;
  }
  // Nearly every request repeats its sender's clock: only a larger one
  // changes anything.
  const auto known = clocks_.find(node_id);
  const uint64_t c = known == clocks_.end() ? 0 : known->second;
  if (clock <= c) return;
  // Steps in [c, clock) are now finished by this worker.
  for (auto it = finished_.lower_bound(c); it != finished_.end() && it->first < clock;
       ++it) {
    it->second.insert(node_id);
  }
  ChangeClock(node_id, [&] { clocks_[node_id] = clock; });
}

void ConsistencyController::Restart(uint64_t node_id, uint64_t clock) {
  if (clock >= kFinishedClock) {
    Advance(node_id, clock);
    return;
  }
  ChangeClock(node_id, [&] {
    finished_nodes_.erase(node_id);
    clocks_[node_id] = clock;
  });
}

uint64_t ConsistencyController::StepsTaken(uint64_t node_id,
                                           uint64_t start_clock) const {
  auto it = clocks_.find(node_id);
  return std::max(start_clock, it == clocks_.end() ? 0 : it->second);
}

uint64_t ConsistencyController::ClockOf(uint64_t node_id,
                                        uint64_t start_clock) const {
  return finished_nodes_.contains(node_id) ? kFinishedClock
                                           : StepsTaken(node_id, start_clock);
}

bool ConsistencyController::PullReady(uint64_t clock) const {
  switch (config_.mode()) {
    case BSP:
      return clock <= applied_clock_;
    case SSP: {
      const uint64_t min_clock = MinClock();
      return min_clock == kNoWorkers || clock <= min_clock + config_.staleness();
    }
    default:
      return true;
  }
}

bool ConsistencyController::NextCompleteStep(uint64_t* step, uint64_t limit) {
  if (config_.mode() != BSP) return false;
  // Every live worker has finished the steps below min_clock (all of them
  // when none is live). Steps with nothing buffered here need no work, so
  // jump over them instead of walking: clocks can be far apart (a finished
  // worker's clock is 2^62).
  const uint64_t min_clock = std::min(MinClock(), limit);
  const uint64_t next_buffered =
      finished_.empty() ? kNoWorkers : std::max(applied_clock_, finished_.begin()->first);
  if (next_buffered < min_clock) {
    applied_clock_ = next_buffered;
    *step = next_buffered;
    return true;
  }
  if (min_clock != kNoWorkers) applied_clock_ = std::max(applied_clock_, min_clock);
  return false;
}

uint32_t ConsistencyController::FinishedCount(uint64_t step) const {
  auto it = finished_.find(step);
  const size_t n = it == finished_.end() ? 0 : it->second.size();
  return static_cast<uint32_t>(std::max<size_t>(n, 1));
}

void ConsistencyController::NoteBuffered(uint64_t step) {
  if (finished_.contains(step)) return;
  auto& set = finished_[step];
  // Workers that are already past this step (pushes arriving after their
  // own clock report cannot happen, but a late joiner's start clock can be
  // ahead) count as finished.
  for (const Worker& w : live_) {
    if (StepsTaken(w) > step) set.insert(w.node_id);
  }
}

std::vector<ConsistencyController::Laggard> ConsistencyController::Behind(
    uint64_t clock) const {
  std::vector<Laggard> behind;
  for (const Worker& w : live_) {
    const uint64_t c = ClockOf(w);
    if (c < clock) behind.push_back({w.rank, c});
  }
  std::sort(behind.begin(), behind.end(),
            [](const Laggard& a, const Laggard& b) { return a.rank < b.rank; });
  return behind;
}

}  // namespace ps
