#include "scheduler/rank_runs.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(RankRunsTest, ConsecutiveRanksBecomeOneRun) {
  std::vector<uint32_t> all(10000);
  for (uint32_t r = 0; r < all.size(); ++r) all[r] = r;
  EXPECT_THAT(ToRankRuns(all), ElementsAre(0, 10000));
  EXPECT_TRUE(ToRankRuns({}).empty());
}

TEST(RankRunsTest, GapsSplitRunsAndTheRanksComeBack) {
  const std::vector<uint32_t> ranks = {0, 1, 2, 5, 7, 8, UINT32_MAX};
  const std::vector<uint32_t> runs = ToRankRuns(ranks);
  EXPECT_THAT(runs, ElementsAre(0, 3, 5, 1, 7, 2, UINT32_MAX, 1));
  auto back = FromRankRuns(runs, 100);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, ranks);
}

TEST(RankRunsTest, MalformedRunsAreRefused) {
  struct Case {
    std::vector<uint32_t> runs;
    const char* why;
  };
  const Case cases[] = {
      {{0, 3, 5}, "pairs"},
      {{4, 0}, "empty"},
      {{UINT32_MAX, 2}, "past the largest rank"},
      {{5, 2, 3, 1}, "does not start after"},
      {{0, 2, 2, 1}, "does not start after"},  // touching: one run
      {{0, 60, 100, 41}, "more than 100 ranks"},
  };
  for (const Case& c : cases) {
    auto ranks = FromRankRuns(c.runs, 100);
    ASSERT_FALSE(ranks.ok()) << c.why;
    EXPECT_EQ(ranks.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ranks.status().message(), HasSubstr(c.why));
  }
  // A huge count is refused before anything is allocated.
  EXPECT_FALSE(FromRankRuns({0, 4000000000u}, 1u << 20).ok());
}

}  // namespace
}  // namespace ps
