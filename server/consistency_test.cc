#include "server/consistency.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/protocol.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Worker = ConsistencyController::Worker;

constexpr uint64_t kFinished = kFinishedClock;

ConsistencyConfig Config(ConsistencyMode mode, uint32_t staleness = 0) {
  ConsistencyConfig c;
  c.set_mode(mode);
  c.set_staleness(staleness);
  return c;
}

// Three live workers: node ids 11, 12, 13 with ranks 0, 1, 2, started at 0.
std::vector<Worker> ThreeWorkers() {
  return {{11, 0, 0}, {12, 1, 0}, {13, 2, 0}};
}

// Every clock in [0, limit) for which a pull is ready now.
std::vector<uint64_t> ReadyClocks(const ConsistencyController& c, uint64_t limit) {
  std::vector<uint64_t> ready;
  for (uint64_t clock = 0; clock < limit; ++clock) {
    if (c.PullReady(clock)) ready.push_back(clock);
  }
  return ready;
}

// Pulls at clocks 0..last, i.e. the expected result of ReadyClocks when
// exactly the clocks up to `last` are ready.
std::vector<uint64_t> UpTo(uint64_t last) {
  std::vector<uint64_t> v;
  for (uint64_t c = 0; c <= last; ++c) v.push_back(c);
  return v;
}

// Applies every complete BSP step as the server does; returns them in order.
std::vector<uint64_t> DrainCompleteSteps(ConsistencyController& c) {
  std::vector<uint64_t> steps;
  uint64_t step;
  while (c.NextCompleteStep(&step)) {
    steps.push_back(step);
    c.ForgetStep(step);
    c.StepApplied();
    if (steps.size() > 1000) {
      ADD_FAILURE() << "NextCompleteStep does not stop";
      break;
    }
  }
  return steps;
}

// --- ASYNC ------------------------------------------------------------------

TEST(ConsistencyAsyncTest, PullsAreAlwaysReadyAndNothingIsBuffered) {
  ConsistencyController c(Config(ASYNC));
  c.SetLiveWorkers(ThreeWorkers());
  c.Advance(11, 5);  // 12 and 13 stay at 0.
  for (uint64_t clock : {uint64_t{0}, uint64_t{1}, uint64_t{6}, uint64_t{1000000},
                         kFinished}) {
    EXPECT_TRUE(c.PullReady(clock)) << clock;
    EXPECT_FALSE(c.ShouldBuffer(clock)) << clock;
  }
  // BSP steps exist only under BSP, even if one were marked.
  c.NoteBuffered(0);
  c.Advance(12, 5);
  c.Advance(13, 5);
  uint64_t step;
  EXPECT_FALSE(c.NextCompleteStep(&step));
}

TEST(ConsistencyAsyncTest, UnspecifiedModeMeansAsync) {
  ConsistencyController c(Config(CONSISTENCY_MODE_UNSPECIFIED));
  EXPECT_EQ(c.mode(), ASYNC);
  c.SetLiveWorkers(ThreeWorkers());
  EXPECT_TRUE(c.PullReady(100));
  // SetMode normalises the same way.
  c.SetMode(Config(SSP, 0));
  EXPECT_EQ(c.mode(), SSP);
  c.SetMode(Config(CONSISTENCY_MODE_UNSPECIFIED));
  EXPECT_EQ(c.mode(), ASYNC);
}

// --- SSP --------------------------------------------------------------------

class SspTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  SspTest() : c_(Config(SSP, GetParam())) {}
  uint64_t s() const { return GetParam(); }
  ConsistencyController c_;
};

TEST_P(SspTest, PullAtClockCIsReadyIffEveryLiveWorkerIsAtLeastCMinusS) {
  c_.SetLiveWorkers(ThreeWorkers());
  const uint64_t limit = 20;
  // Everyone at 0: pulls up to s are ready.
  EXPECT_EQ(c_.MinClock(), 0u);
  EXPECT_EQ(ReadyClocks(c_, limit), UpTo(s()));

  // The slowest worker decides; faster ones change nothing.
  c_.Advance(11, 4);
  c_.Advance(12, 2);
  EXPECT_EQ(c_.MinClock(), 0u);
  EXPECT_EQ(ReadyClocks(c_, limit), UpTo(s()));

  c_.Advance(13, 3);
  EXPECT_EQ(c_.MinClock(), 2u);
  EXPECT_EQ(ReadyClocks(c_, limit), UpTo(2 + s()));

  c_.Advance(12, 5);
  EXPECT_EQ(c_.MinClock(), 3u);
  EXPECT_EQ(ReadyClocks(c_, limit), UpTo(3 + s()));
  EXPECT_TRUE(c_.PullReady(3 + s()));
  EXPECT_FALSE(c_.PullReady(4 + s()));

  // SSP applies pushes at once: nothing is buffered, no BSP steps.
  EXPECT_FALSE(c_.ShouldBuffer(3));
  uint64_t step;
  EXPECT_FALSE(c_.NextCompleteStep(&step));
}

TEST_P(SspTest, LiveWorkerThatNeverReportedCountsAtItsStartClock) {
  // Rank 2 joined at clock 6 and has sent no clock yet.
  c_.SetLiveWorkers({{11, 0, 0}, {12, 1, 0}, {13, 2, 6}});
  c_.Advance(11, 9);
  c_.Advance(12, 8);
  EXPECT_EQ(c_.MinClock(), 6u);
  EXPECT_EQ(ReadyClocks(c_, 30), UpTo(6 + s()));

  // A report below the start clock does not pull it back.
  c_.Advance(13, 2);
  EXPECT_EQ(c_.MinClock(), 6u);
  c_.Advance(13, 7);
  EXPECT_EQ(c_.MinClock(), 7u);
  EXPECT_EQ(ReadyClocks(c_, 30), UpTo(7 + s()));
}

TEST_P(SspTest, LiveWorkerStartedAtZeroThatNeverReportedHoldsEveryoneBack) {
  c_.SetLiveWorkers(ThreeWorkers());
  c_.Advance(11, 10);
  c_.Advance(12, 10);
  // 13 is live but silent.
  EXPECT_EQ(c_.MinClock(), 0u);
  EXPECT_TRUE(c_.PullReady(s()));
  EXPECT_FALSE(c_.PullReady(s() + 1));
}

TEST_P(SspTest, RemovingTheSlowWorkerReleasesWaitsAtOnce) {
  c_.SetLiveWorkers(ThreeWorkers());
  c_.Advance(11, 10);
  c_.Advance(12, 10);
  c_.Advance(13, 1);
  EXPECT_FALSE(c_.PullReady(10));
  c_.SetLiveWorkers({{11, 0, 0}, {12, 1, 0}});
  EXPECT_EQ(c_.MinClock(), 10u);
  EXPECT_TRUE(c_.PullReady(10));
  EXPECT_EQ(ReadyClocks(c_, 30), UpTo(10 + s()));
}

TEST_P(SspTest, FinishedWorkerNeverHoldsAnyoneBack) {
  c_.SetLiveWorkers(ThreeWorkers());
  c_.Advance(11, kFinished);
  c_.Advance(12, 4);
  c_.Advance(13, 5);
  EXPECT_EQ(c_.MinClock(), 4u);
  EXPECT_EQ(ReadyClocks(c_, 30), UpTo(4 + s()));
  // The finished worker's own later pulls wait until everyone finished.
  EXPECT_FALSE(c_.PullReady(kFinished));
  c_.Advance(12, kFinished);
  c_.Advance(13, kFinished);
  EXPECT_TRUE(c_.PullReady(kFinished));
}

TEST_P(SspTest, NoLiveWorkersMeansEveryPullIsReady) {
  c_.SetLiveWorkers({});
  EXPECT_EQ(c_.MinClock(), ConsistencyController::kNoWorkers);
  EXPECT_TRUE(c_.PullReady(0));
  EXPECT_TRUE(c_.PullReady(1000));
  EXPECT_TRUE(c_.PullReady(kFinished));
}

INSTANTIATE_TEST_SUITE_P(Staleness, SspTest, ::testing::Values(0u, 1u, 3u));

// --- BSP --------------------------------------------------------------------

TEST(ConsistencyBspTest, PushesAreBufferedIffAtOrAfterTheAppliedClock) {
  ConsistencyController c(Config(BSP));
  c.SetLiveWorkers({{11, 0, 0}, {12, 1, 0}});
  EXPECT_EQ(c.applied_clock(), 0u);
  EXPECT_TRUE(c.ShouldBuffer(0));
  EXPECT_TRUE(c.ShouldBuffer(5));

  c.Advance(11, 2);
  c.Advance(12, 2);
  uint64_t step;
  EXPECT_FALSE(c.NextCompleteStep(&step));  // Nothing buffered.
  EXPECT_EQ(c.applied_clock(), 2u);
  EXPECT_FALSE(c.ShouldBuffer(0));
  EXPECT_FALSE(c.ShouldBuffer(1));
  EXPECT_TRUE(c.ShouldBuffer(2));
  EXPECT_TRUE(c.ShouldBuffer(3));
}

TEST(ConsistencyBspTest, PullAtClockCWaitsForEveryStepBelowC) {
  ConsistencyController c(Config(BSP));
  c.SetLiveWorkers({{11, 0, 0}, {12, 1, 0}});
  EXPECT_TRUE(c.PullReady(0));
  EXPECT_FALSE(c.PullReady(1));
  c.NoteBuffered(0);
  c.Advance(11, 1);
  EXPECT_THAT(DrainCompleteSteps(c), IsEmpty());
  EXPECT_FALSE(c.PullReady(1));
  c.Advance(12, 1);
  EXPECT_THAT(DrainCompleteSteps(c), ElementsAre(0));
  EXPECT_EQ(c.applied_clock(), 1u);
  EXPECT_TRUE(c.PullReady(1));
  EXPECT_FALSE(c.PullReady(2));
}

TEST(ConsistencyBspTest, StepIsCompleteOnlyWhenEveryLiveWorkerIsPastIt) {
  ConsistencyController c(Config(BSP));
  c.SetLiveWorkers(ThreeWorkers());
  c.NoteBuffered(0);
  uint64_t step = 99;
  c.Advance(11, 1);
  EXPECT_FALSE(c.NextCompleteStep(&step));
  c.Advance(12, 1);
  EXPECT_FALSE(c.NextCompleteStep(&step));
  EXPECT_EQ(c.applied_clock(), 0u);
  c.Advance(13, 1);
  ASSERT_TRUE(c.NextCompleteStep(&step));
  EXPECT_EQ(step, 0u);
  EXPECT_EQ(c.applied_clock(), 0u);  // Moves only once the caller applied it.
  c.ForgetStep(0);
  c.StepApplied();
  EXPECT_EQ(c.applied_clock(), 1u);
  EXPECT_FALSE(c.NextCompleteStep(&step));
  EXPECT_EQ(c.applied_clock(), 1u);
}

TEST(ConsistencyBspTest, StepsWithNothingBufferedAreSkipped) {
  ConsistencyController c(Config(BSP));
  c.SetLiveWorkers({{11, 0, 0}, {12, 1, 0}});
  c.NoteBuffered(3);
  c.NoteBuffered(7);
  c.Advance(11, 10);
  c.Advance(12, 10);
  uint64_t step;
  ASSERT_TRUE(c.NextCompleteStep(&step));
  EXPECT_EQ(step, 3u);
  EXPECT_EQ(c.applied_clock(), 3u);
  c.ForgetStep(3);
  c.StepApplied();
  ASSERT_TRUE(c.NextCompleteStep(&step));
  EXPECT_EQ(step, 7u);
  EXPECT_EQ(c.applied_clock(), 7u);
  c.ForgetStep(7);
  c.StepApplied();
  EXPECT_FALSE(c.NextCompleteStep(&step));
  // Nothing left to apply: applied_clock jumps to the slowest live clock.
  EXPECT_EQ(c.applied_clock(), 10u);
}

TEST(ConsistencyBspTest, AppliedClockJumpsToTheMinLiveClockNotBeyond) {
  ConsistencyController c(Config(BSP));
  c.SetLiveWorkers(ThreeWorkers());
  c.Advance(11, 9);
  c.Advance(12, 4);
  c.Advance(13, 6);
  uint64_t step;
  EXPECT_FALSE(c.NextCompleteStep(&step));
  EXPECT_EQ(c.applied_clock(), 4u);
  EXPECT_TRUE(c.PullReady(4));
  EXPECT_FALSE(c.PullReady(5));
  // A buffered step at the slowest clock is not complete.
  c.NoteBuffered(4);
  EXPECT_FALSE(c.NextCompleteStep(&step));
  EXPECT_EQ(c.applied_clock(), 4u);
}

TEST(ConsistencyBspTest, FinishedCountCountsWorkersPastTheStepEvenAfterLeaving) {
  ConsistencyController c(Config(BSP));
  c.SetLiveWorkers(ThreeWorkers());
  c.Advance(11, 4);
  c.Advance(12, 4);
  c.Advance(13, 4);
  uint64_t step;
  EXPECT_FALSE(c.NextCompleteStep(&step));
  c.NoteBuffered(4);
  // Nobody is past step 4 yet; the divisor is still at least 1.
  EXPECT_EQ(c.FinishedCount(4), 1u);
  c.Advance(11, 5);
  EXPECT_EQ(c.FinishedCount(4), 1u);
  c.Advance(13, 5);
  EXPECT_EQ(c.FinishedCount(4), 2u);
  // Rank 2 (node 13) finished step 4 and then left: it still counts.
  c.SetLiveWorkers({{11, 0, 0}, {12, 1, 0}});
  EXPECT_EQ(c.FinishedCount(4), 2u);
  EXPECT_FALSE(c.NextCompleteStep(&step));  // Node 12 is not done yet.
  c.Advance(12, 5);
  EXPECT_EQ(c.FinishedCount(4), 3u);
  ASSERT_TRUE(c.NextCompleteStep(&step));
  EXPECT_EQ(step, 4u);
  EXPECT_EQ(c.FinishedCount(4), 3u);
  // Reports repeated or beyond the step do not count a worker twice.
  c.Advance(12, 5);
  c.Advance(12, 6);
  EXPECT_EQ(c.FinishedCount(4), 3u);
  c.ForgetStep(4);
  EXPECT_EQ(c.FinishedCount(4), 1u);
}

TEST(ConsistencyBspTest, FinishedCountOfAnUnknownStepIsOne) {
  ConsistencyController c(Config(BSP));
  c.SetLiveWorkers(ThreeWorkers());
  c.Advance(11, 10);
  c.Advance(12, 10);
  // Step 3 was never buffered, so finishers are not tracked for it.
  EXPECT_EQ(c.FinishedCount(3), 1u);
}

TEST(ConsistencyBspTest, NoteBufferedCountsWorkersAlreadyPastTheStep) {
  ConsistencyController c(Config(BSP));
  // Node 13 joined at clock 9 and has not reported yet.
  c.SetLiveWorkers({{11, 0, 0}, {12, 1, 0}, {13, 2, 9}});
  c.Advance(11, 6);
  c.Advance(12, 3);
  c.NoteBuffered(4);
  EXPECT_EQ(c.FinishedCount(4), 2u);  // Nodes 11 (clock 6) and 13 (start 9).
  // Noting the step again keeps what was counted.
  c.NoteBuffered(4);
  EXPECT_EQ(c.FinishedCount(4), 2u);
  c.Advance(12, 4);
  EXPECT_EQ(c.FinishedCount(4), 2u);  // At 4: not past step 4.
  c.Advance(12, 5);
  EXPECT_EQ(c.FinishedCount(4), 3u);
}

TEST(ConsistencyBspTest, RemovingTheSlowWorkerReleasesWaitsAtOnce) {
  ConsistencyController c(Config(BSP));
  c.SetLiveWorkers({{11, 0, 0}, {12, 1, 0}});
  c.NoteBuffered(0);
  c.Advance(11, 1);
  uint64_t step;
  EXPECT_FALSE(c.NextCompleteStep(&step));
  EXPECT_FALSE(c.PullReady(1));
  c.SetLiveWorkers({{11, 0, 0}});
  EXPECT_THAT(DrainCompleteSteps(c), ElementsAre(0));
  EXPECT_TRUE(c.PullReady(1));
  EXPECT_EQ(c.FinishedCount(0), 1u);
}

TEST(ConsistencyBspTest, FinishedWorkerNeverHoldsBackAndIsNotWalkedOver) {
  ConsistencyController c(Config(BSP));
  c.SetLiveWorkers({{11, 0, 0}, {12, 1, 0}});
  const absl::Time start = absl::Now();
  c.Advance(11, kFinished);
  c.NoteBuffered(0);
  c.NoteBuffered(2);
  EXPECT_THAT(DrainCompleteSteps(c), IsEmpty());
  c.Advance(12, 3);
  EXPECT_THAT(DrainCompleteSteps(c), ElementsAre(0, 2));
  EXPECT_EQ(c.applied_clock(), 3u);
  // Both finished: everything up to the finished clock is applied at once,
  // without visiting 2^62 steps one by one.
  c.Advance(12, kFinished);
  EXPECT_THAT(DrainCompleteSteps(c), IsEmpty());
  EXPECT_EQ(c.applied_clock(), kFinished);
  EXPECT_TRUE(c.PullReady(kFinished));
  // A walk over the range would take years; a broken version hangs here.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(ConsistencyBspTest, WithoutLiveWorkersBufferedStepsAreReturnedInOrder) {
  ConsistencyController c(Config(BSP));
  c.SetLiveWorkers({});
  EXPECT_EQ(c.MinClock(), ConsistencyController::kNoWorkers);
  c.NoteBuffered(5);
  c.NoteBuffered(0);
  c.NoteBuffered(2);
  EXPECT_THAT(DrainCompleteSteps(c), ElementsAre(0, 2, 5));
  EXPECT_EQ(c.applied_clock(), 6u);
  EXPECT_EQ(c.FinishedCount(5), 1u);
}

// --- Mode changes -----------------------------------------------------------

TEST(ConsistencyModeTest, EnteringBspStartsAggregationAtTheMaxLiveClock) {
  ConsistencyController c(Config(ASYNC));
  c.SetLiveWorkers(ThreeWorkers());
  c.Advance(11, 3);
  c.Advance(12, 7);
  c.Advance(13, 5);
  EXPECT_FALSE(c.SetMode(Config(BSP)));
  EXPECT_EQ(c.mode(), BSP);
  EXPECT_EQ(c.applied_clock(), 7u);
  // Earlier steps were applied as they came; their late pushes still are.
  EXPECT_FALSE(c.ShouldBuffer(3));
  EXPECT_FALSE(c.ShouldBuffer(6));
  EXPECT_TRUE(c.ShouldBuffer(7));
  EXPECT_TRUE(c.PullReady(7));
  EXPECT_FALSE(c.PullReady(8));
  // The slower workers catching up does not complete step 7 ...
  c.NoteBuffered(7);
  c.Advance(11, 7);
  c.Advance(13, 7);
  c.Advance(12, 8);
  EXPECT_THAT(DrainCompleteSteps(c), IsEmpty());
  // ... only their finishing it does.
  c.Advance(11, 8);
  c.Advance(13, 8);
  EXPECT_THAT(DrainCompleteSteps(c), ElementsAre(7));
  EXPECT_EQ(c.applied_clock(), 8u);
}

TEST(ConsistencyModeTest, EnteringBspIgnoresFinishedWorkersClocks) {
  // A worker that finished training (clock 2^62) but is still live, e.g.
  // evaluating, must not make BSP start at 2^62: that would apply every
  // later push at once and answer every pull, i.e. stay ASYNC.
  ConsistencyController c(Config(SSP, 2));
  c.SetLiveWorkers(ThreeWorkers());
  c.Advance(11, kFinished);
  c.Advance(12, 4);
  c.Advance(13, 6);
  EXPECT_FALSE(c.SetMode(Config(BSP)));
  EXPECT_EQ(c.applied_clock(), 6u);
  EXPECT_TRUE(c.ShouldBuffer(6));
  EXPECT_FALSE(c.PullReady(7));
}

TEST(ConsistencyModeTest, SetModeReportsWhetherBspWasLeft) {
  ConsistencyController c(Config(BSP));
  c.SetLiveWorkers(ThreeWorkers());
  EXPECT_FALSE(c.SetMode(Config(BSP)));       // Staying: no flush.
  EXPECT_TRUE(c.SetMode(Config(ASYNC)));      // Leaving BSP: flush.
  EXPECT_EQ(c.mode(), ASYNC);
  EXPECT_FALSE(c.SetMode(Config(SSP, 1)));    // Never was BSP.
  EXPECT_FALSE(c.SetMode(Config(ASYNC)));
  EXPECT_FALSE(c.SetMode(Config(BSP)));
  EXPECT_TRUE(c.SetMode(Config(SSP, 3)));     // Leaving BSP for SSP too.
  EXPECT_EQ(c.mode(), SSP);
  EXPECT_EQ(c.config().staleness(), 3u);
  EXPECT_FALSE(c.ShouldBuffer(c.applied_clock()));
}

TEST(ConsistencyModeTest, StayingInBspKeepsTheAppliedClock) {
  ConsistencyController c(Config(BSP));
  c.SetLiveWorkers({{11, 0, 0}, {12, 1, 0}});
  c.Advance(11, 9);
  c.Advance(12, 2);
  uint64_t step;
  EXPECT_FALSE(c.NextCompleteStep(&step));
  EXPECT_EQ(c.applied_clock(), 2u);
  // A new view carrying BSP again must not skip steps 2..8.
  EXPECT_FALSE(c.SetMode(Config(BSP)));
  EXPECT_EQ(c.applied_clock(), 2u);
  EXPECT_TRUE(c.ShouldBuffer(2));
}

TEST(ConsistencyModeTest, SetModeKeepsWatchdogSettingsWhenTheNewConfigHasNone) {
  ConsistencyConfig initial = Config(BSP);
  initial.set_watchdog_timeout_ms(1000);
  initial.set_watchdog_interval_ms(500);
  ConsistencyController c(initial);
  c.SetMode(Config(SSP, 2));
  EXPECT_EQ(c.mode(), SSP);
  EXPECT_EQ(c.config().staleness(), 2u);
  EXPECT_EQ(c.config().watchdog_timeout_ms(), 1000u);
  EXPECT_EQ(c.config().watchdog_interval_ms(), 500u);
  // Settings given explicitly are taken; a missing one is still kept.
  ConsistencyConfig next = Config(ASYNC);
  next.set_watchdog_timeout_ms(3000);
  c.SetMode(next);
  EXPECT_EQ(c.config().watchdog_timeout_ms(), 3000u);
  EXPECT_EQ(c.config().watchdog_interval_ms(), 500u);
}

// --- Clocks and the watchdog helper ------------------------------------------

TEST(ConsistencyClockTest, BehindListsLiveRanksBelowTheClockSortedByRank) {
  ConsistencyController c(Config(BSP));
  // Given out of rank order; node 14 joined at clock 2 and never reported.
  c.SetLiveWorkers({{13, 2, 0}, {11, 0, 0}, {14, 3, 2}, {12, 1, 0}});
  c.Advance(11, 5);
  c.Advance(12, 1);
  c.Advance(13, 4);
  auto behind = c.Behind(5);
  ASSERT_EQ(behind.size(), 3u);
  EXPECT_EQ(behind[0].rank, 1u);
  EXPECT_EQ(behind[0].clock, 1u);
  EXPECT_EQ(behind[1].rank, 2u);
  EXPECT_EQ(behind[1].clock, 4u);
  EXPECT_EQ(behind[2].rank, 3u);
  EXPECT_EQ(behind[2].clock, 2u);

  behind = c.Behind(2);
  ASSERT_EQ(behind.size(), 1u);
  EXPECT_EQ(behind[0].rank, 1u);
  EXPECT_THAT(c.Behind(1), IsEmpty());
  EXPECT_THAT(c.Behind(0), IsEmpty());

  // Workers no longer live are not listed.
  c.SetLiveWorkers({{11, 0, 0}, {13, 2, 0}});
  behind = c.Behind(5);
  ASSERT_EQ(behind.size(), 1u);
  EXPECT_EQ(behind[0].rank, 2u);
  EXPECT_EQ(behind[0].clock, 4u);
}

TEST(ConsistencyClockTest, AdvanceWithASmallerClockIsIgnored) {
  ConsistencyController c(Config(SSP, 0));
  c.SetLiveWorkers({{11, 0, 0}});
  c.Advance(11, 5);
  EXPECT_EQ(c.MinClock(), 5u);
  c.Advance(11, 3);
  EXPECT_EQ(c.MinClock(), 5u);
  c.Advance(11, 5);
  EXPECT_EQ(c.MinClock(), 5u);
  c.Advance(11, 6);
  EXPECT_EQ(c.MinClock(), 6u);
}

TEST(ConsistencyControllerTest, AFinishedWorkerDoesNotCountForStepsItSkipped) {
  ConsistencyController c(Config(BSP));
  c.SetLiveWorkers({{11, 0, 0}, {12, 1, 0}});
  // Both take steps 0..2; worker 11 then runs out of data and finishes.
  c.Advance(11, 3);
  c.Advance(12, 3);
  c.Advance(11, kFinished);
  // Worker 12's last batch, step 3, is averaged over worker 12 alone, as
  // one worker with the combined batch would average it.
  c.NoteBuffered(3);
  c.Advance(12, 4);
  EXPECT_EQ(c.FinishedCount(3), 1u);
  uint64_t step;
  ASSERT_TRUE(c.NextCompleteStep(&step));
  EXPECT_EQ(step, 3u);
  // A step buffered before the finish still counts the finished worker.
  ConsistencyController d(Config(BSP));
  d.SetLiveWorkers({{11, 0, 0}, {12, 1, 0}});
  d.NoteBuffered(0);
  d.Advance(11, 1);
  d.Advance(12, 1);
  d.Advance(11, kFinished);
  EXPECT_EQ(d.FinishedCount(0), 2u);
}

TEST(ConsistencyControllerTest, AClockReportBeforeTheViewThatListsTheWorkerIsKept) {
  ConsistencyController c(Config(SSP, 0));
  c.SetLiveWorkers({{11, 0, 0}});
  c.Advance(11, 5);
  // Worker 12's report overtakes the view that lists it; an older view
  // without it must not erase the report.
  c.Advance(12, 5);
  c.SetLiveWorkers({{11, 0, 0}});
  c.SetLiveWorkers({{11, 0, 0}, {12, 1, 0}});
  EXPECT_EQ(c.MinClock(), 5u);
  EXPECT_TRUE(c.PullReady(5));
  // A worker that was live and left is forgotten.
  c.SetLiveWorkers({{11, 0, 0}});
  c.SetLiveWorkers({{11, 0, 0}, {12, 1, 0}});
  EXPECT_EQ(c.MinClock(), 0u);
}

// --- The index of live clocks ------------------------------------------------

// MinClock() as a scan over the live workers would compute it, from every
// report the controller was given: the reference the index must match.
class ScanReference {
 public:
  void SetLive(const std::vector<Worker>& workers) {
    absl::flat_hash_set<uint64_t> now;
    for (const Worker& w : workers) now.insert(w.node_id);
    for (const Worker& w : live_) {
      if (!now.contains(w.node_id)) {
        steps_.erase(w.node_id);
        finished_.erase(w.node_id);
      }
    }
    live_ = workers;
  }
  void Advance(uint64_t node, uint64_t clock) {
    if (clock >= kFinished) {
      finished_.insert(node);
      return;
    }
    steps_[node] = std::max(steps_[node], clock);
  }
  void Restart(uint64_t node, uint64_t clock) {
    if (clock >= kFinished) return Advance(node, clock);
    finished_.erase(node);
    steps_[node] = clock;
  }
  uint64_t MinClock() const {
    uint64_t min = ConsistencyController::kNoWorkers;
    for (const Worker& w : live_) {
      auto it = steps_.find(w.node_id);
      const uint64_t steps =
          std::max(w.start_clock, it == steps_.end() ? 0 : it->second);
      min = std::min(min, finished_.contains(w.node_id) ? kFinished : steps);
    }
    return min;
  }

 private:
  std::vector<Worker> live_;
  absl::flat_hash_map<uint64_t, uint64_t> steps_;
  absl::flat_hash_set<uint64_t> finished_;
};

TEST(ConsistencyIndexTest, MinClockMatchesAScanOverRandomReportsAndViews) {
  // Nodes 1..12; views list random subsets with random start clocks;
  // reports (larger, smaller, repeated, finished, restarts) come from live
  // and not-yet-listed nodes alike.
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    ConsistencyController c(Config(SSP, 1));
    ScanReference ref;
    for (int op = 0; op < 400; ++op) {
      const uint64_t node = 1 + rng() % 12;
      const int kind = static_cast<int>(rng() % 20);
      if (kind == 0) {
        std::vector<Worker> view;
        for (uint64_t n = 1; n <= 12; ++n) {
          if (rng() % 3 != 0)
            view.push_back({n, static_cast<uint32_t>(n), rng() % 4});
        }
        c.SetLiveWorkers(view);
        ref.SetLive(view);
      } else if (kind == 1) {
        c.Advance(node, kFinished);
        ref.Advance(node, kFinished);
      } else if (kind == 2) {
        const uint64_t clock = rng() % 10;
        c.Restart(node, clock);
        ref.Restart(node, clock);
      } else {
        const uint64_t clock = rng() % 12;
        c.Advance(node, clock);
        ref.Advance(node, clock);
      }
      ASSERT_EQ(c.MinClock(), ref.MinClock())
          << "trial " << trial << " op " << op;
      for (uint64_t clock :
           {uint64_t{0}, uint64_t{3}, uint64_t{9}, kFinished}) {
        const uint64_t min = ref.MinClock();
        EXPECT_EQ(c.PullReady(clock),
                  min == ConsistencyController::kNoWorkers || clock <= min + 1);
      }
    }
  }
}

TEST(ConsistencyIndexTest, ANodeListedTwiceCountsOnce) {
  ConsistencyController c(Config(SSP, 0));
  c.SetLiveWorkers({{11, 0, 0}, {11, 0, 0}, {12, 1, 0}});
  c.Advance(11, 4);
  c.Advance(12, 2);
  EXPECT_EQ(c.MinClock(), 2u);
  c.Advance(12, 6);
  EXPECT_EQ(c.MinClock(), 4u);
  EXPECT_THAT(c.Behind(5), ElementsAre(::testing::Field(
                               &ConsistencyController::Laggard::rank, 0u)));
}

TEST(ConsistencyIndexTest, MinClockFollowsFinishRestartAndLeaving) {
  ConsistencyController c(Config(BSP));
  c.SetLiveWorkers({{11, 0, 0}, {12, 1, 3}});
  EXPECT_EQ(c.MinClock(), 0u);
  c.Advance(11, 5);
  EXPECT_EQ(c.MinClock(), 3u);  // 12's start clock
  c.Advance(12, kFinished);
  EXPECT_EQ(c.MinClock(), 5u);
  c.Advance(11, kFinished);
  EXPECT_EQ(c.MinClock(), kFinished);
  c.Restart(12, 2);
  EXPECT_EQ(c.MinClock(), 3u);  // not below its start clock
  c.SetLiveWorkers({{11, 0, 0}});
  EXPECT_EQ(c.MinClock(), kFinished);
  c.SetLiveWorkers({});
  EXPECT_EQ(c.MinClock(), ConsistencyController::kNoWorkers);
}

}  // namespace
}  // namespace ps
