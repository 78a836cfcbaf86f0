// A server's admission of data-plane requests: the sender and message
// limits (config.data_plane.limits), the budget of bytes held aside
// (max_held_bytes), and the gradient policy (config.data_plane.gradients)
// applied to pushed values before anything of them is kept. Step "Admit"
// and "Police" of the request pipeline (server/request_pipeline.cc). (Not
// to be confused with server/admission.h, the sparse tables' admission
// sketch for new keys.)
//
// Owned and used by the server's serving thread only: no locks. It adds to
// counters the server owns (ServerCounters fields, read by other threads
// as relaxed atomics), and reads the time through the injected Clock.
//
// Invariants: every limit is set (LimitsWithDefaults); the standalone
// senders kept number at most max_standalone_senders, and a sender once
// admitted stays admitted; held_bytes goes above max_held_bytes only if
// the caller holds what RoomToHold / MayHold refused.
//
// Errors: a refusal is an absl::Status saying which limit, with its config
// name, and is counted (limit_refusals, unknown_sender_refusals,
// nonfinite_pushes_rejected); RESOURCE_EXHAUSTED for what is too large or
// too many, UNAVAILABLE for what may succeed on retry (server busy, a
// sender the view does not have yet), INVALID_ARGUMENT for a push the
// gradient policy refuses.
#ifndef PS_SERVER_REQUEST_ADMISSION_H_
#define PS_SERVER_REQUEST_ADMISSION_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "proto/data_plane.pb.h"
#include "zmq.hpp"

namespace ps {

class Admission {
public:
  // The server's counters this adds to; each must outlive the Admission.
  struct Counters {
    // Bytes of requests held aside now (the caller adds and subtracts what
    // it holds and releases; read here).
    std::atomic<uint64_t> *held_bytes = nullptr;
    std::atomic<uint64_t> *limit_refusals = nullptr;
    std::atomic<uint64_t> *unknown_sender_refusals = nullptr;
    std::atomic<uint64_t> *nonfinite_values = nullptr;
    std::atomic<uint64_t> *nonfinite_pushes_rejected = nullptr;
  };
  // Live worker node id -> rank, as the installed view has it.
  using WorkerRanks = absl::flat_hash_map<uint64_t, uint32_t>;

  // `data_plane`: the job's config (limits left 0 take their defaults);
  // `max_standalone_senders`: senders a standalone server keeps state for;
  // `clock` (not owned, outlives this): the non-finite log's throttle.
  Admission(const DataPlaneConfig &data_plane, size_t max_standalone_senders,
            const Clock *clock, Counters counters);
  Admission(const Admission &) = delete;
  Admission &operator=(const Admission &) = delete;

  // The limits, defaults applied.
  const DataPlaneLimits &limits() const { return limits_; }

  // Counts non-finite values by {worker, action} there too (null: not).
  // Set before the serving thread starts.
  void set_nonfinite_family(metrics::CounterFamily *family) {
    nonfinite_family_ = family;
  }

  // Checks a request's size (all frames: `message_bytes`), key count and
  // sender before anything is kept for the sender. Senders: node 0 (a
  // tool) and STATS pass; a standalone server (no view) admits up to
  // max_standalone_senders distinct senders, remembering each; otherwise
  // the sender must be in `worker_rank` (the view of `epoch`).
  // RESOURCE_EXHAUSTED over a limit, UNAVAILABLE for a sender the view
  // does not have.
  absl::Status AdmitRequest(uint64_t message_bytes, const RequestHeader &h,
                            bool standalone, const WorkerRanks &worker_rank,
                            uint64_t epoch);

  // Applies the gradient policy to a push's (or, `assign`, an ASSIGN's)
  // `n` values, in place: non-finite values are counted (by the sender's
  // rank in `worker_rank`, or the header's own claim on a `standalone`
  // server) and logged at most once a second; then the push is refused
  // (INVALID_ARGUMENT; always for an ASSIGN, and unless the policy is CLIP
  // with clip_value > 0) or NaN becomes 0 and +/-Inf +/-clip_value. A push
  // is then clipped to [-clip_value, clip_value] when clip_value > 0.
  absl::Status PolicePushValues(const RequestHeader &h, bool standalone,
                                const WorkerRanks &worker_rank, bool assign,
                                float *values, size_t n);

  // Whether `bytes` more may be held aside: held_bytes + bytes within
  // max_held_bytes.
  bool MayHold(uint64_t bytes) const;
  // OK if a request of `frames` may be held aside; otherwise UNAVAILABLE
  // naming what `waiting` (e.g. "pushes wait for a checkpoint") and the
  // bytes held, counted as a limit refusal.
  absl::Status RoomToHold(const std::vector<zmq::message_t> &frames,
                          absl::string_view waiting);

  // Bytes of a message, all frames together.
  static uint64_t FramesBytes(const std::vector<zmq::message_t> &frames);

private:
  const DataPlaneLimits limits_;
  const GradientPolicy gradients_;
  const size_t max_standalone_senders_;
  const Clock *const clock_;
  const Counters counters_;
  // Senders a standalone server keeps state for.
  absl::flat_hash_set<uint64_t> standalone_senders_;
  // Non-finite gradients: counters by worker label, and the log throttle.
  metrics::CounterFamily *nonfinite_family_ = nullptr;
  absl::Time last_nonfinite_log_ = absl::InfinitePast();
  uint64_t nonfinite_unlogged_ = 0;
};

} // namespace ps

#endif // PS_SERVER_REQUEST_ADMISSION_H_
