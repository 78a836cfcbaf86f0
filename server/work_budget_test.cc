#include "server/work_budget.h"

#include "absl/time/time.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(WorkBudgetTest, StepsTakeAtMostTheShareOfBusyTime) {
  FakeClock clock;
  WorkBudget budget(&clock, 0.25, absl::Milliseconds(2));
  // A busy thread: requests of 1 ms, and a 3 ms step whenever allowed.
  absl::Duration background;
  for (int i = 0; i < 10000; ++i) {
    clock.Advance(absl::Milliseconds(1));
    if (budget.Allowed()) {
      clock.Advance(absl::Milliseconds(3));
      budget.Spend(absl::Milliseconds(3));
      background += absl::Milliseconds(3);
    }
  }
  const double share =
      absl::FDivDuration(background, clock.Now() - absl::UnixEpoch());
  EXPECT_LE(share, 0.25 + 1e-3);
  EXPECT_GE(share, 0.20);
}

TEST(WorkBudgetTest, WaitSaysWhenTheNextStepMayRun) {
  FakeClock clock;
  WorkBudget budget(&clock, 0.5, absl::Milliseconds(1));
  EXPECT_TRUE(budget.Allowed());
  EXPECT_EQ(budget.Wait(), absl::ZeroDuration());
  budget.Spend(absl::Milliseconds(3));  // 2 ms in debt
  EXPECT_FALSE(budget.Allowed());
  const absl::Duration wait = budget.Wait();
  EXPECT_GE(wait, absl::Milliseconds(4));
  EXPECT_LE(wait, absl::Milliseconds(4) + absl::Microseconds(2));
  clock.Advance(wait - absl::Microseconds(10));
  EXPECT_FALSE(budget.Allowed());
  clock.Advance(absl::Microseconds(10));
  EXPECT_TRUE(budget.Allowed());
}

TEST(WorkBudgetTest, CreditIsCappedAtTheBurst) {
  FakeClock clock;
  WorkBudget budget(&clock, 0.5, absl::Milliseconds(2));
  clock.Advance(absl::Seconds(10));  // idle: no more than the burst saved
  budget.Spend(absl::Milliseconds(2));
  EXPECT_FALSE(budget.Allowed());
}

TEST(WorkBudgetTest, AFullShareNeverHoldsBack) {
  FakeClock clock;
  WorkBudget budget(&clock, 1.0, absl::Milliseconds(1));
  budget.Spend(absl::Seconds(5));
  EXPECT_TRUE(budget.Allowed());
  EXPECT_EQ(budget.Wait(), absl::ZeroDuration());
}

}  // namespace
}  // namespace ps
