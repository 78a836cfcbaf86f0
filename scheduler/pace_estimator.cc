#include "scheduler/pace_estimator.h"

namespace ps {

void PaceEstimator::Observe(uint64_t clock, absl::Time now) {
  if (since_ == absl::InfinitePast()) {
    since_ = now;
    clock_ = clock;
    return;
  }
  const absl::Duration window = now - since_;
  const bool whole = window >= kWindow;
  // Until a whole window has passed, the pace so far. A fast job reaches
  // its first checkpoint interval within one window; with no pace its
  // first checkpoints were set two steps ahead, were passed before the view
  // reached the workers, and were abandoned, each retry costing a round of
  // heartbeats.
  if (whole || (!measured_ && window > absl::ZeroDuration())) {
    steps_per_second_ = (clock - clock_) / absl::ToDoubleSeconds(window);
  }
  if (whole) {
    since_ = now;
    clock_ = clock;
    measured_ = true;
  }
}

}  // namespace ps
