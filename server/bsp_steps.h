// BSP steps in the making: the pushes buffered for every step not applied
// yet, and the divisors (workers averaged) of the steps applied last, which
// a promoted backup needs for steps its old primary applied without
// announcing them. Serving thread only; not thread-safe. Internal to
// //server:server.
#ifndef PS_SERVER_BSP_STEPS_H_
#define PS_SERVER_BSP_STEPS_H_

#include <cstdint>
#include <map>

#include "server/step_buffers.h"

namespace ps {

struct BspSteps {
  // Step -> the sums of the pushes buffered for it.
  std::map<uint64_t, StepBuffer> buffers;

  // Step `step` was applied averaged over `divisor` workers; the last 64
  // are kept.
  void NoteDivisor(uint64_t step, uint32_t divisor) {
    recent_divisors_[step] = divisor;
    while (recent_divisors_.size() > kRecent)
      recent_divisors_.erase(recent_divisors_.begin());
  }
  // The divisor step `step` was applied with; `otherwise` if not kept.
  uint32_t RecentDivisor(uint64_t step, uint32_t otherwise) const {
    auto d = recent_divisors_.find(step);
    return d != recent_divisors_.end() ? d->second : otherwise;
  }

 private:
  static constexpr size_t kRecent = 64;
  std::map<uint64_t, uint32_t> recent_divisors_;
};

}  // namespace ps

#endif  // PS_SERVER_BSP_STEPS_H_
