// The server's lease and fence: whether the serving thread may act on a
// request now. The scheduler's session renews the lease (SetLease) and
// fences a server that is no longer a member (Fence); the serving thread
// checks both before it looks at a request (Check). Internal to
// //server:server.
#ifndef PS_SERVER_LEASE_FENCE_H_
#define PS_SERVER_LEASE_FENCE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "proto/data_plane.pb.h"

namespace ps {

class LeaseFence {
 public:
  // The counters Check adds its refusals to; they must outlive this.
  LeaseFence(std::atomic<uint64_t>* fenced_refusals,
             std::atomic<uint64_t>* lease_refusals)
      : fenced_refusals_(fenced_refusals), lease_refusals_(lease_refusals) {}
  LeaseFence(const LeaseFence&) = delete;
  LeaseFence& operator=(const LeaseFence&) = delete;

  // Any thread. Requests are refused once the steady clock reaches `until`;
  // the first call starts enforcement, later ones move the end.
  void SetLease(std::chrono::steady_clock::time_point until);
  // Any thread. Every request is refused from now on; the first call's
  // `why` is logged and quoted in the refusals, later calls do nothing.
  void Fence(std::string why);

  // Serving thread only. OK, or the refusal (UNAVAILABLE, naming server
  // `rank`; *refusal says why: NOT_MEMBER or LEASE_LAPSED), counted and
  // logged: the first of a run of refusals, and the end of the run.
  absl::Status Check(uint32_t rank, ServerRefusal* refusal);

 private:
  // lease_until_: the lease's end in steady-clock ticks
  // (time_since_epoch().count()); kNoLease until SetLease is called.
  static constexpr int64_t kNoLease = INT64_MAX;
  std::atomic<int64_t> lease_until_{kNoLease};
  std::atomic<bool> fenced_{false};
  mutable absl::Mutex fence_mu_;
  std::string fence_why_ ABSL_GUARDED_BY(fence_mu_);
  // Refusals since the server last served a request (0: serving). Serving
  // thread only.
  uint64_t refusing_ = 0;
  std::atomic<uint64_t>* const fenced_refusals_;
  std::atomic<uint64_t>* const lease_refusals_;
};

}  // namespace ps

#endif  // PS_SERVER_LEASE_FENCE_H_
