// Pulls the serving thread may not answer yet (the consistency rule, or a
// checkpoint in progress), oldest first, and the rate limit of the
// watchdog that reports the oldest. Serving thread only; not thread-safe.
// Internal to //server:server.
#ifndef PS_SERVER_DEFERRED_PULLS_H_
#define PS_SERVER_DEFERRED_PULLS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/time/time.h"
#include "common/protocol.h"
#include "server/replication_primary.h"
#include "zmq.hpp"

namespace ps {

// One deferred pull.
struct DeferredPull {
  zmq::message_t identity;
  std::vector<zmq::message_t> frames;  // a PULL request
  uint64_t clock = 0;
  uint32_t rank = 0;
  absl::Time since;
  // A PUSH_PULL's push half: the backups' answers its answer waits for.
  std::vector<ReplicationPrimary::Need> needs;
  // Counted in the server's held bytes while deferred.
  uint64_t bytes = 0;
};

// The queue, oldest first, and an index of its clocks: the serving thread
// asks whether any pull may be answered after every clock advance, and
// with N workers up to ~N pulls wait at once, so that question must not
// walk the queue (N advances a step would make it O(N^2) per step).
class DeferredPulls {
 public:
  using Queue = std::deque<DeferredPull>;

  bool empty() const { return queue_.empty(); }
  size_t size() const { return queue_.size(); }
  // The oldest pull; requires !empty().
  const DeferredPull& front() const { return queue_.front(); }
  Queue::iterator begin() { return queue_.begin(); }
  Queue::iterator end() { return queue_.end(); }

  // Appends `pull` (the newest).
  void Add(DeferredPull pull) {
    ++clocks_[pull.clock];
    queue_.push_back(std::move(pull));
  }
  // Removes the pull at `it`; returns the one after it.
  Queue::iterator Erase(Queue::iterator it) {
    auto c = clocks_.find(it->clock);
    if (c != clocks_.end() && --c->second == 0) clocks_.erase(c);
    return queue_.erase(it);
  }

  // Whether `allowed(clock)` holds for the clock of some pull held here.
  // `allowed` must be downward closed on each side of kFinishedClock: if
  // it holds for a clock, it holds for every smaller clock on the same
  // side (true of the consistency rules and of the checkpoint gate, which
  // lets pulls at kFinishedClock and above through). Then only the
  // smallest clock of each side needs asking: O(log n).
  template <typename Allowed>
  bool AnyAllowed(Allowed allowed) const {
    if (clocks_.empty()) return false;
    if (allowed(clocks_.begin()->first)) return true;
    auto finished = clocks_.lower_bound(kFinishedClock);
    return finished != clocks_.end() && finished != clocks_.begin() &&
           allowed(finished->first);
  }

  // Hands every pull whose clock `allowed` admits to `answer` (oldest
  // first), then drops it; the others stay. Walks the queue only when
  // AnyAllowed says some pull may go (the same condition on `allowed`).
  template <typename Allowed, typename Answer>
  void AnswerAllowed(Allowed allowed, Answer answer) {
    if (!AnyAllowed(allowed)) return;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (!allowed(it->clock)) {
        ++it;
        continue;
      }
      answer(*it);
      it = Erase(it);
    }
  }

  // Whether the watchdog reports the oldest pull at `now`: it has waited
  // `timeout` and the last report is `interval` old. Notes the report.
  bool WatchdogDue(absl::Time now, absl::Duration timeout,
                   absl::Duration interval) {
    if (queue_.empty()) return false;
    if (now - queue_.front().since < timeout ||
        now - last_watchdog_log_ < interval) {
      return false;
    }
    last_watchdog_log_ = now;
    return true;
  }

 private:
  Queue queue_;
  // Clock -> how many pulls in queue_ are at it.
  absl::btree_map<uint64_t, uint32_t> clocks_;
  absl::Time last_watchdog_log_ = absl::InfinitePast();
};

}  // namespace ps

#endif  // PS_SERVER_DEFERRED_PULLS_H_
