#include "server/work_budget.h"

#include <algorithm>

namespace ps {

WorkBudget::WorkBudget(const Clock* clock, double share, absl::Duration burst)
    : clock_(clock),
      share_(share),
      burst_(std::max(burst, absl::ZeroDuration())),
      credit_(burst_),
      last_(clock->Now()) {}

void WorkBudget::Accrue() {
  const absl::Time now = clock_->Now();
  if (now > last_) credit_ = std::min(burst_, credit_ + (now - last_) * share_);
  last_ = std::max(last_, now);
}

bool WorkBudget::Allowed() {
  if (share_ >= 1) return true;
  Accrue();
  return credit_ > absl::ZeroDuration();
}

void WorkBudget::Spend(absl::Duration spent) {
  if (share_ >= 1) return;
  Accrue();
  credit_ -= std::max(spent, absl::ZeroDuration());
}

absl::Duration WorkBudget::Wait() {
  if (share_ >= 1) return absl::ZeroDuration();
  Accrue();
  if (credit_ > absl::ZeroDuration()) return absl::ZeroDuration();
  if (share_ <= 0) return absl::InfiniteDuration();
  // Credit just above zero: one accrual step more than the deficit.
  return (absl::ZeroDuration() - credit_) / share_ + absl::Microseconds(1);
}

}  // namespace ps
