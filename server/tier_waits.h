// Requests that wait for their cold rows to be read from a disk tier
// (ColdReader), kept per sender in arrival order so that a sender's later
// messages (its ADVANCE_CLOCK under BSP) stay behind its waiting request,
// while other senders' requests are served. The eventfd wakes the serving
// thread when a reader finished a batch. Serving thread only, except
// wake.Wake(). Internal to //server:server.
#ifndef PS_SERVER_TIER_WAITS_H_
#define PS_SERVER_TIER_WAITS_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "server/wake_fd.h"
#include "zmq.hpp"

namespace ps {

class SparseTable;

struct TierWait {
  zmq::message_t identity;
  std::vector<zmq::message_t> frames;
  // The table whose reader's batch the request waits for; null while the
  // request only waits behind an earlier one of its sender (it is looked
  // at once it is the first).
  SparseTable* table = nullptr;
  uint64_t batch = 0;
  absl::Time since;
  uint64_t bytes = 0;  // counted in the server's held bytes while waiting
};

struct TierWaits {
  // The tables' readers wake the serving thread with it.
  WakeFd wake;
  // The waiting requests of each sender (by its connection's identity),
  // oldest first; a sender with none has no entry.
  absl::flat_hash_map<std::string, std::deque<TierWait>> senders;
};

}  // namespace ps

#endif  // PS_SERVER_TIER_WAITS_H_
