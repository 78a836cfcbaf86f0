// What one server spends per step on tracking N workers, with no sockets
// and no other thread: the consistency controller (clocks, BSP/SSP gating,
// step completion), the BSP step buffers, the per-sender sequence windows
// and the queue of deferred pulls, driven in one thread in the order a
// server sees a consistency_bench step. It tells what the server's own
// bookkeeping costs as N grows, apart from how many cores the machine has.
//
// The driver calls the server's own classes (server/consistency.h,
// step_buffers.h, replication.h SeqWindow, deferred_pulls.h,
// checkpoint_gate.h) in the order KVServer::Impl does
// (server/request_pipeline.cc Validate and Apply, server/server.cc
// Progress); what it leaves out is per request and the same for every N:
// decoding, admission, routing, replies, ZeroMQ.
//
// Thread-compatible: plain functions.
#ifndef PS_TESTS_BENCH_CONSISTENCY_BOOKKEEPING_H_
#define PS_TESTS_BENCH_CONSISTENCY_BOOKKEEPING_H_

#include <cstdint>

#include "common/status.h"
#include "proto/config.pb.h"

namespace ps::bench {

struct BookkeepingOptions {
  ConsistencyMode mode = BSP;
  uint32_t staleness = 0;  // SSP
  int workers = 16;
  // Measured steps (every worker takes each), after `warmup` steps.
  int steps = 100;
  int warmup = 10;
  // Payload of each push and pull: sparse keys (one row of `dim` floats
  // each, distinct per worker) and dense floats. Small, so that the
  // bookkeeping, not the arithmetic on gradients, is what is timed.
  int keys = 1;
  int dim = 8;
  int dense = 8;
};

struct BookkeepingResult {
  // This thread's CPU time per step (all N workers' requests of one
  // step), in nanoseconds.
  double ns_per_step = 0;
  // Pulls deferred and BSP steps applied over the measured steps, to show
  // that the mode did what it should.
  uint64_t deferred = 0;
  uint64_t steps_applied = 0;
  // Bytes of the per-sender sequence windows the server keeps.
  uint64_t seq_window_bytes = 0;
};

// Runs the steps once. INVALID_ARGUMENT for a bad option.
absl::StatusOr<BookkeepingResult> MeasureBookkeeping(
    const BookkeepingOptions& options);

}  // namespace ps::bench

#endif  // PS_TESTS_BENCH_CONSISTENCY_BOOKKEEPING_H_
