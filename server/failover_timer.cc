#include "server/failover_timer.h"

#include <memory>

#include "server/server_log.h"

namespace ps {

void FailoverTimer::SizeSlots(uint32_t num_slots) {
  if (promoted_.size() != num_slots) promoted_.assign(num_slots, false);
}

void FailoverTimer::Start(uint64_t epoch) {
  awaiting_first_ = true;
  promoted_at_ = clock_->Now();
  promoted_epoch_ = epoch;
}

bool FailoverTimer::Touches(absl::Span<const uint32_t> slots) const {
  if (!awaiting_first_) return false;
  for (uint32_t slot : slots) {
    if (promoted_[slot]) return true;
  }
  return false;
}

void FailoverTimer::FirstServed() {
  if (!awaiting_first_) return;
  awaiting_first_ = false;
  const absl::Time now = clock_->Now();
  ServerLog()->info(
      "failover: first request for the slots promoted at epoch {} answered "
      "{:.1f} ms after that view was applied (unix_us={})",
      promoted_epoch_, absl::ToDoubleMilliseconds(now - promoted_at_),
      absl::ToUnixMicros(now));
}

}  // namespace ps
