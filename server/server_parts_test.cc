// Unit tests of the smaller parts of KVServer::Impl (server/BUILD
// :server_parts) on their own.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/protocol.h"
#include "gtest/gtest.h"
#include "server/bsp_steps.h"
#include "server/deferred_pulls.h"
#include "server/failover_timer.h"
#include "server/lease_fence.h"
#include "server/serving_thread.h"
#include "server/table_stats_publisher.h"
#include "server/view_inbox.h"

namespace ps {
namespace {

using SteadyClock = std::chrono::steady_clock;

TEST(LeaseFenceTest, ServesWithoutLeaseAndRefusesOnceLapsed) {
  std::atomic<uint64_t> fenced{0}, lapsed{0};
  LeaseFence fence(&fenced, &lapsed);
  ServerRefusal refusal = REFUSAL_NONE;
  EXPECT_TRUE(fence.Check(3, &refusal).ok());

  fence.SetLease(SteadyClock::now() + std::chrono::hours(1));
  EXPECT_TRUE(fence.Check(3, &refusal).ok());

  fence.SetLease(SteadyClock::now() - std::chrono::milliseconds(1));
  const absl::Status refused = fence.Check(3, &refusal);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refusal, LEASE_LAPSED);
  EXPECT_NE(refused.message().find("server 3's lease lapsed"),
            absl::string_view::npos)
      << refused;
  EXPECT_EQ(lapsed.load(), 1u);
  EXPECT_EQ(fenced.load(), 0u);

  // Renewed: serving again.
  fence.SetLease(SteadyClock::now() + std::chrono::hours(1));
  EXPECT_TRUE(fence.Check(3, &refusal).ok());
}

TEST(LeaseFenceTest, FenceRefusesEveryRequestWithTheFirstReason) {
  std::atomic<uint64_t> fenced{0}, lapsed{0};
  LeaseFence fence(&fenced, &lapsed);
  fence.SetLease(SteadyClock::now() + std::chrono::hours(1));
  fence.Fence("declared dead");
  fence.Fence("a later reason");
  ServerRefusal refusal = REFUSAL_NONE;
  const absl::Status refused = fence.Check(1, &refusal);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refusal, NOT_MEMBER);
  EXPECT_NE(refused.message().find("(declared dead)"), absl::string_view::npos)
      << refused;
  EXPECT_EQ(fenced.load(), 1u);
  EXPECT_EQ(lapsed.load(), 0u);
}

TEST(FailoverTimerTest, TouchesOnlyPromotedSlotsUntilFirstServed) {
  FakeClock clock;
  FailoverTimer timer(&clock);
  timer.SizeSlots(4);
  timer.MarkPromoted(2);
  const std::vector<uint32_t> promoted = {0, 2}, other = {0, 1, 3};
  // Not started: nothing is awaited.
  EXPECT_FALSE(timer.Touches(promoted));
  timer.Start(7);
  EXPECT_TRUE(timer.Touches(promoted));
  EXPECT_FALSE(timer.Touches(other));
  clock.Advance(absl::Milliseconds(5));
  timer.FirstServed();
  EXPECT_FALSE(timer.Touches(promoted));
  // A new slot count clears the marks.
  timer.SizeSlots(8);
  timer.Start(8);
  EXPECT_FALSE(timer.Touches(promoted));
}

TEST(TableStatsPublisherTest, DueEveryPeriodAndReturnsWhatWasPublished) {
  TableStatsPublisher publisher(absl::Seconds(1));
  const absl::Time t0 = absl::UnixEpoch();
  EXPECT_TRUE(publisher.Due(t0));
  EXPECT_TRUE(publisher.Get().empty());
  std::vector<TableStats> stats(1);
  stats[0].set_table_id(5);
  publisher.Publish(t0, stats);
  EXPECT_FALSE(publisher.Due(t0 + absl::Milliseconds(999)));
  EXPECT_TRUE(publisher.Due(t0 + absl::Seconds(1)));
  ASSERT_EQ(publisher.Get().size(), 1u);
  EXPECT_EQ(publisher.Get()[0].table_id(), 5u);
}

TEST(BspStepsTest, KeepsTheLast64Divisors) {
  BspSteps steps;
  for (uint64_t step = 0; step < 70; ++step)
    steps.NoteDivisor(step, static_cast<uint32_t>(step + 100));
  EXPECT_EQ(steps.RecentDivisor(69, 1), 169u);
  EXPECT_EQ(steps.RecentDivisor(6, 1), 106u);
  EXPECT_EQ(steps.RecentDivisor(5, 1), 1u);  // forgotten
}

TEST(DeferredPullsTest, WatchdogReportsTheOldestAtMostEveryInterval) {
  DeferredPulls pulls;
  const absl::Time t0 = absl::UnixEpoch();
  const absl::Duration timeout = absl::Seconds(10), interval = absl::Seconds(5);
  EXPECT_FALSE(pulls.WatchdogDue(t0 + absl::Hours(1), timeout, interval));
  DeferredPull pull;
  pull.since = t0;
  pulls.Add(std::move(pull));
  EXPECT_FALSE(pulls.WatchdogDue(t0 + absl::Seconds(9), timeout, interval));
  EXPECT_TRUE(pulls.WatchdogDue(t0 + absl::Seconds(10), timeout, interval));
  EXPECT_FALSE(pulls.WatchdogDue(t0 + absl::Seconds(14), timeout, interval));
  EXPECT_TRUE(pulls.WatchdogDue(t0 + absl::Seconds(15), timeout, interval));
}

DeferredPull PullAt(uint64_t clock) {
  DeferredPull pull;
  pull.clock = clock;
  return pull;
}

TEST(DeferredPullsTest, AnswerAllowedHandsOverAdmittedPullsOldestFirst) {
  DeferredPulls pulls;
  for (uint64_t clock : {7, 3, 9, 5}) pulls.Add(PullAt(clock));
  std::vector<uint64_t> answered;
  const auto upto = [](uint64_t limit) {
    return [limit](uint64_t clock) { return clock <= limit; };
  };
  const auto record = [&](const DeferredPull& p) {
    answered.push_back(p.clock);
  };
  pulls.AnswerAllowed(upto(2), record);  // none: nothing is walked
  EXPECT_TRUE(answered.empty());
  EXPECT_EQ(pulls.size(), 4u);
  pulls.AnswerAllowed(upto(7), record);
  EXPECT_EQ(answered, std::vector<uint64_t>({7, 3, 5}));
  ASSERT_EQ(pulls.size(), 1u);
  EXPECT_EQ(pulls.front().clock, 9u);
  // The index follows: only 9 is left.
  EXPECT_FALSE(pulls.AnyAllowed(upto(8)));
  EXPECT_TRUE(pulls.AnyAllowed(upto(9)));
}

TEST(DeferredPullsTest, AnyAllowedAsksTheSmallestClockOfEachSide) {
  DeferredPulls pulls;
  std::vector<uint64_t> asked;
  const auto below = [&](uint64_t limit) {
    return [&asked, limit](uint64_t clock) {
      asked.push_back(clock);
      return clock <= limit || clock >= kFinishedClock;
    };
  };
  EXPECT_FALSE(pulls.AnyAllowed(below(100)));
  EXPECT_TRUE(asked.empty());
  pulls.Add(PullAt(7));
  pulls.Add(PullAt(5));
  pulls.Add(PullAt(9));
  pulls.Add(PullAt(5));
  EXPECT_FALSE(pulls.AnyAllowed(below(4)));
  EXPECT_EQ(asked, std::vector<uint64_t>({5}));
  EXPECT_TRUE(pulls.AnyAllowed(below(5)));
  // Erasing one of the two pulls at 5 keeps 5 the smallest; erasing both
  // makes it 7.
  auto it = pulls.begin();
  ++it;  // the first pull at 5
  it = pulls.Erase(it);
  EXPECT_TRUE(pulls.AnyAllowed(below(5)));
  ++it;  // the second pull at 5
  pulls.Erase(it);
  EXPECT_EQ(pulls.size(), 2u);
  EXPECT_FALSE(pulls.AnyAllowed(below(6)));
  EXPECT_TRUE(pulls.AnyAllowed(below(7)));
  // A pull at the finished clock is asked about on its own: the checkpoint
  // gate lets it through while holding back smaller clocks.
  pulls.Add(PullAt(kFinishedClock));
  asked.clear();
  EXPECT_TRUE(pulls.AnyAllowed(below(6)));
  EXPECT_EQ(asked, std::vector<uint64_t>({7, kFinishedClock}));
  // Only finished-clock pulls: asked once.
  while (pulls.begin()->clock != kFinishedClock) pulls.Erase(pulls.begin());
  asked.clear();
  EXPECT_FALSE(pulls.AnyAllowed([&](uint64_t clock) {
    asked.push_back(clock);
    return false;
  }));
  EXPECT_EQ(asked, std::vector<uint64_t>({kFinishedClock}));
  EXPECT_EQ(pulls.front().clock, kFinishedClock);
}

TEST(ServingThreadTest, CountsTheThreadsCpuTimeAndKeepsItAfterTheEnd) {
  ServingThread serving;
  EXPECT_EQ(serving.cpu_nanos(), 0u);
  std::atomic<bool> spun{false};
  serving.Start([&] {
    // Burn about 20 ms of CPU, then wait to be stopped.
    const auto until = SteadyClock::now() + std::chrono::milliseconds(20);
    volatile uint64_t x = 0;
    while (SteadyClock::now() < until) x = x + 1;
    spun.store(true);
    while (!serving.stop_requested()) usleep(1000);
    serving.MarkStopped();
  });
  while (!spun.load()) usleep(1000);
  const uint64_t running = serving.cpu_nanos();
  // At least most of the 20 ms: the spin was on the CPU unless preempted.
  EXPECT_GT(running, 5000000u);
  serving.Stop();
  const uint64_t ended = serving.cpu_nanos();
  EXPECT_GE(ended, running);
  EXPECT_LT(ended, running + 1000000000u);
  EXPECT_EQ(serving.cpu_nanos(), ended);
}

TEST(ViewInboxTest, PostWakesAndStandaloneViewsStay) {
  ViewInbox inbox;
  ASSERT_TRUE(inbox.OpenWake().ok());
  EXPECT_FALSE(inbox.Current()->has_view);
  auto view = std::make_shared<ServerView>();
  view->epoch = 4;
  view->has_view = true;
  inbox.Post(view);
  EXPECT_EQ(inbox.Current()->epoch, 4u);
  uint64_t count = 0;
  ASSERT_EQ(read(inbox.wake_fd(), &count, sizeof(count)),
            static_cast<ssize_t>(sizeof(count)));
  EXPECT_EQ(count, 1u);

  auto standalone = std::make_shared<ServerView>();
  standalone->all = true;
  inbox.Install(standalone);
  inbox.Post(view);
  EXPECT_TRUE(inbox.Current()->all);
}

}  // namespace
}  // namespace ps
