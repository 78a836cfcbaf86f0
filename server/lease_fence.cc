#include "server/lease_fence.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/server_log.h"

namespace ps {

void LeaseFence::SetLease(std::chrono::steady_clock::time_point until) {
  int64_t ticks = until.time_since_epoch().count();
  // kNoLease means "not enforced"; a lease that far away is the same.
  if (ticks == kNoLease) --ticks;
  lease_until_.store(ticks, std::memory_order_release);
}

void LeaseFence::Fence(std::string why) {
  {
    absl::MutexLock lock(&fence_mu_);
    if (fenced_.load()) return;
    fence_why_ = std::move(why);
    ServerLog()->warn("fenced: {}; refusing every request from now on",
                      fence_why_);
  }
  fenced_.store(true, std::memory_order_release);
}

absl::Status LeaseFence::Check(uint32_t rank, ServerRefusal* refusal) {
  absl::Status refused;
  if (fenced_.load(std::memory_order_acquire)) {
    fenced_refusals_->fetch_add(1, std::memory_order_relaxed);
    *refusal = NOT_MEMBER;
    std::string why;
    {
      absl::MutexLock lock(&fence_mu_);
      why = fence_why_;
    }
    refused = absl::UnavailableError(absl::StrCat(
        "server ", rank, " is no longer a member of the job (", why,
        "): refresh the cluster view and retry with the slots' new owner"));
  } else {
    const int64_t until = lease_until_.load(std::memory_order_acquire);
    if (until == kNoLease) return absl::OkStatus();
    using SteadyClock = std::chrono::steady_clock;
    const SteadyClock::time_point now = SteadyClock::now();
    const SteadyClock::time_point end{SteadyClock::duration(until)};
    if (now < end) {
      if (refusing_ != 0) {
        ServerLog()->info(
            "lease renewed: serving again after refusing {} requests",
            refusing_);
        refusing_ = 0;
      }
      return absl::OkStatus();
    }
    lease_refusals_->fetch_add(1, std::memory_order_relaxed);
    *refusal = LEASE_LAPSED;
    refused = absl::UnavailableError(absl::StrCat(
        "server ", rank, "'s lease lapsed ",
        std::chrono::duration_cast<std::chrono::milliseconds>(now - end)
            .count(),
        "ms ago: it has not reached the scheduler; retry"));
  }
  if (refusing_++ == 0)
    ServerLog()->warn("refusing requests: {}", refused.message());
  return refused;
}

}  // namespace ps
