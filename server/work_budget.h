// How much of the serving thread a slot move's background work may take
// while requests are waiting: the copy's chunks, the upkeep of the fence
// digests and the stepwise drop of rows moved away (server/server.cc's
// serving loop).
//
// Each of those steps is bounded, but run after every request they would
// take the thread in turns with the requests: on a busy server a copy at
// full speed cuts the requests' rate by the copy's cost per request, for as
// long as the copy lasts, so a larger table means a longer stretch of slow
// requests. The budget gives background work at most `share` of the
// thread's wall time while requests come in; an idle thread runs it freely
// (the caller says when it is idle).
//
// Credit accrues at `share` seconds per second of wall time, up to
// `burst`; a step runs while the credit is positive and is charged its
// duration, so the credit may go negative by one step and is paid back
// before the next. share >= 1 never holds a step back.
//
// Not thread-safe: the serving thread's. Time comes from `clock` (not
// owned; must outlive this).
#ifndef PS_SERVER_WORK_BUDGET_H_
#define PS_SERVER_WORK_BUDGET_H_

#include "absl/time/time.h"
#include "common/clock.h"

namespace ps {

class WorkBudget {
 public:
  WorkBudget(const Clock* clock, double share, absl::Duration burst);

  // Whether a step may run now (credit left).
  bool Allowed();
  // Charges a step that took `spent`.
  void Spend(absl::Duration spent);
  // How long until Allowed() holds: zero when it does now.
  absl::Duration Wait();

  double share() const { return share_; }

 private:
  void Accrue();

  const Clock* clock_;
  const double share_;
  const absl::Duration burst_;
  absl::Duration credit_;
  absl::Time last_;
};

}  // namespace ps

#endif  // PS_SERVER_WORK_BUDGET_H_
