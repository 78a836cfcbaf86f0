// KVServer's counters (KVServer::Stats documents each): one list,
// PS_SERVER_COUNTERS, names every counter once, and both the atomics the
// serving thread adds to and the copy into Stats are generated from it, so
// a counter cannot be added to one and forgotten in the other.
// Internal to //server:server.
#ifndef PS_SERVER_SERVER_COUNTERS_H_
#define PS_SERVER_SERVER_COUNTERS_H_

#include <atomic>
#include <cstdint>

#include "server/server.h"

// X(Stats field). Stats fields not listed here are filled from elsewhere
// (the peer gate's connection counts).
#define PS_SERVER_COUNTERS(X)  \
  X(requests)                  \
  X(errors)                    \
  X(keys_pushed)               \
  X(keys_pulled)               \
  X(pulls_deferred)            \
  X(bsp_steps_applied)         \
  X(duplicate_pushes)          \
  X(checkpoints_written)       \
  X(rows_restored)             \
  X(forwards)                  \
  X(replica_messages)          \
  X(catchups_sent)             \
  X(rows_copied)               \
  X(slots_promoted)            \
  X(unreplicated_pushes)       \
  X(limit_refusals)            \
  X(unknown_sender_refusals)   \
  X(nonfinite_values)          \
  X(nonfinite_pushes_rejected) \
  X(held_bytes)                \
  X(lease_refusals)            \
  X(fenced_refusals)           \
  X(move_slots_in)             \
  X(move_slots_out)            \
  X(move_rows_in)              \
  X(move_rows_out)             \
  X(move_fences)               \
  X(move_aborts)               \
  X(move_fenced_refusals)      \
  X(move_fence_max_micros)     \
  X(keys_prefetched)           \
  X(tier_waits)                \
  X(tier_wait_micros)

namespace ps {

// Written by the serving thread (held_bytes also goes down: a gauge), read
// from any thread. Relaxed order: each counter is read on its own.
struct ServerCounters {
#define PS_SERVER_COUNTER_FIELD(name) std::atomic<uint64_t> name{0};
  PS_SERVER_COUNTERS(PS_SERVER_COUNTER_FIELD)
#undef PS_SERVER_COUNTER_FIELD

  // Every counter, copied into the Stats field of the same name.
  KVServer::Stats Snapshot() const {
    KVServer::Stats s;
#define PS_SERVER_COUNTER_COPY(name) s.name = name.load(std::memory_order_relaxed);
    PS_SERVER_COUNTERS(PS_SERVER_COUNTER_COPY)
#undef PS_SERVER_COUNTER_COPY
    return s;
  }
};

}  // namespace ps

#endif  // PS_SERVER_SERVER_COUNTERS_H_
