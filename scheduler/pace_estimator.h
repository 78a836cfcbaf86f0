// A worker's training pace (steps per second), measured from the clocks its
// heartbeats report. The scheduler sets a checkpoint's clock far enough
// ahead of the fastest worker for the view to reach every node before that
// worker gets there (ClusterState::StartCheckpoint), and /metrics shows it.
//
// A value type with no clock of its own: the caller passes the time of each
// observation. Not thread-safe; ClusterState keeps one per node under its
// mutex.
#ifndef PS_SCHEDULER_PACE_ESTIMATOR_H_
#define PS_SCHEDULER_PACE_ESTIMATOR_H_

#include <cstdint>

#include "absl/time/time.h"

namespace ps {

class PaceEstimator {
 public:
  // Heartbeats at least this far apart measure a worker's pace.
  static constexpr absl::Duration kWindow = absl::Milliseconds(200);

  // A heartbeat at `now` reported `clock` (a training clock, short of
  // kFinishedClock; clocks do not go back between calls). The first call
  // only starts the measurement. Until a whole kWindow has passed since it,
  // the pace is the one since the first call; from then on, the pace over
  // the last pair of observations at least kWindow apart.
  void Observe(uint64_t clock, absl::Time now);

  // Whether Observe was called at all (before, the pace is not known).
  bool started() const { return since_ != absl::InfinitePast(); }
  // Steps per second; 0 until known.
  double steps_per_second() const { return steps_per_second_; }

 private:
  double steps_per_second_ = 0;
  // Clock and time the current window started at.
  uint64_t clock_ = 0;
  absl::Time since_ = absl::InfinitePast();
  // Whether steps_per_second_ spans a whole kWindow; before, it is the
  // pace since the first observation.
  bool measured_ = false;
};

}  // namespace ps

#endif  // PS_SCHEDULER_PACE_ESTIMATOR_H_
