// Pulls the serving thread may not answer yet (the consistency rule, or a
// checkpoint in progress), oldest first, and the rate limit of the
// watchdog that reports the oldest. Serving thread only; not thread-safe.
// Internal to //server:server.
#ifndef PS_SERVER_DEFERRED_PULLS_H_
#define PS_SERVER_DEFERRED_PULLS_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/time/time.h"
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

struct DeferredPulls {
  std::deque<DeferredPull> queue;  // oldest first

  // Whether the watchdog reports the oldest pull at `now`: it has waited
  // `timeout` and the last report is `interval` old. Notes the report.
  bool WatchdogDue(absl::Time now, absl::Duration timeout,
                   absl::Duration interval) {
    if (queue.empty()) return false;
    if (now - queue.front().since < timeout ||
        now - last_watchdog_log_ < interval) {
      return false;
    }
    last_watchdog_log_ = now;
    return true;
  }

 private:
  absl::Time last_watchdog_log_ = absl::InfinitePast();
};

}  // namespace ps

#endif  // PS_SERVER_DEFERRED_PULLS_H_
