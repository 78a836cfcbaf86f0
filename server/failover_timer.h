// The failover measurement: the slots this server took over as their new
// primary, and the time from applying the view that promoted them to
// answering the first request for one of them (logged once per promotion).
// Serving thread only; not thread-safe. Internal to //server:server.
#ifndef PS_SERVER_FAILOVER_TIMER_H_
#define PS_SERVER_FAILOVER_TIMER_H_

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"

namespace ps {

class FailoverTimer {
 public:
  // `clock` times the measurement; not owned, must outlive this.
  explicit FailoverTimer(const Clock* clock) : clock_(clock) {}

  // Sizes the slot marks to the view's slot count (clearing them when it
  // changes).
  void SizeSlots(uint32_t num_slots);
  // Marks slot `slot` (< the size set by SizeSlots) promoted here.
  void MarkPromoted(uint32_t slot) { promoted_[slot] = true; }
  // The view of `epoch` promoted slots: the measurement starts now.
  void Start(uint64_t epoch);
  // Whether the measurement waits for its first request and one of `slots`
  // (each < the size set by SizeSlots) was promoted here.
  bool Touches(absl::Span<const uint32_t> slots) const;
  // A request for promoted slots was answered: logs the measurement once.
  void FirstServed();

 private:
  const Clock* const clock_;
  std::vector<bool> promoted_;
  bool awaiting_first_ = false;
  absl::Time promoted_at_;
  uint64_t promoted_epoch_ = 0;
};

}  // namespace ps

#endif  // PS_SERVER_FAILOVER_TIMER_H_
