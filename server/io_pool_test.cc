#include "server/io_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(IoPoolTest, EveryTaskRunsOnceAndAllAreInFlightTogether) {
  IoPool pool(3);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::atomic<int>> runs(4);
    // Each task waits until all four started: only a pool that runs them
    // at once (three helpers and the caller) sees them all start.
    std::atomic<int> started{0};
    std::atomic<bool> alone{false};
    pool.Run(4, [&](size_t i) {
      ++started;
      const absl::Time give_up = absl::Now() + absl::Seconds(10);
      while (started.load() < 4 && absl::Now() < give_up)
        absl::SleepFor(absl::Microseconds(50));
      if (started.load() < 4) alone = true;
      ++runs[i];
    });
    ASSERT_FALSE(alone.load()) << "round " << round;
    for (const auto& r : runs) ASSERT_EQ(r.load(), 1);
  }
}

TEST(IoPoolTest, MoreTasksThanThreadsAndNoHelpers) {
  for (int threads : {0, 2}) {
    IoPool pool(threads);
    std::vector<std::atomic<int>> runs(100);
    pool.Run(100, [&](size_t i) { ++runs[i]; });
    for (const auto& r : runs) EXPECT_EQ(r.load(), 1) << threads;
    pool.Run(0, [&](size_t) { FAIL() << "no task to run"; });
  }
}

TEST(IoPoolTest, CallersFromSeveralThreadsTakeTurns) {
  IoPool pool(2);
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 20; ++round)
        pool.Run(5, [&](size_t) { ++total; });
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 20 * 5);
}

}  // namespace
}  // namespace ps
