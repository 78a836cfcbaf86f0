// The slot-move planner: minimal movement, balance by bytes, the rules on
// removed servers, spares and backups.
#include "scheduler/move_planner.h"

#include <cstdint>
#include <map>
#include <vector>

#include "common/protocol.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// `servers` ranks 0.. owning equal contiguous ranges of `slots` slots.
MovePlanInput Even(uint32_t slots, uint32_t servers) {
  MovePlanInput in;
  for (uint32_t s = 0; s < slots; ++s) {
    in.owner.push_back(static_cast<uint32_t>(uint64_t{s} * servers / slots));
    in.weight.push_back(1);
  }
  for (uint32_t r = 0; r < servers; ++r) in.live.push_back(r);
  return in;
}

// Weight each rank owns once `plan` is done.
std::map<uint32_t, uint64_t> After(const MovePlanInput& in,
                                   const MovePlan& plan) {
  std::vector<uint32_t> owner = in.owner;
  for (const SlotMove& m : plan.moves) {
    for (uint32_t s : m.slots()) {
      EXPECT_EQ(owner[s], m.source());
      owner[s] = m.target();
    }
  }
  std::map<uint32_t, uint64_t> load;
  for (size_t s = 0; s < owner.size(); ++s) load[owner[s]] += in.weight[s];
  return load;
}

TEST(MovePlannerTest, TwoToFourMovesHalfAndBalances) {
  MovePlanInput in = Even(4096, 2);
  in.live = {0, 1, 2, 3};  // 2 and 3 are spares
  in.servers = 4;
  absl::StatusOr<MovePlan> plan = PlanMoves(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->slots_moved, 2048u);
  EXPECT_THAT(plan->added, ElementsAre(2, 3));
  EXPECT_TRUE(plan->emptied.empty());
  const auto load = After(in, *plan);
  for (uint32_t r = 0; r < 4; ++r) EXPECT_EQ(load.at(r), 1024u) << r;
  for (const SlotMove& m : plan->moves) {
    EXPECT_LT(m.source(), 2u);
    EXPECT_GE(m.target(), 2u);
  }
}

TEST(MovePlannerTest, FourToThreeMovesAQuarterOffTheNamedServer) {
  MovePlanInput in = Even(4096, 4);
  in.servers = 3;
  in.remove = {1};
  absl::StatusOr<MovePlan> plan = PlanMoves(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->slots_moved, 1024u);
  EXPECT_THAT(plan->emptied, ElementsAre(1));
  const auto load = After(in, *plan);
  EXPECT_FALSE(load.count(1) > 0);
  for (uint32_t r : {0u, 2u, 3u}) {
    EXPECT_NEAR(static_cast<double>(load.at(r)), 4096 / 3.0, 1.0) << r;
  }
  for (const SlotMove& m : plan->moves) EXPECT_EQ(m.source(), 1u);
}

TEST(MovePlannerTest, ScaleInWithoutANameEmptiesTheLightestServer) {
  MovePlanInput in = Even(12, 3);
  in.weight[8] = 0;  // server 2 holds the least
  in.weight[9] = 0;
  in.servers = 2;
  absl::StatusOr<MovePlan> plan = PlanMoves(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->emptied, ElementsAre(2));
}

TEST(MovePlannerTest, BalancesBytesNotSlotCounts) {
  // Server 0's first 8 slots hold 10 bytes each, every other slot 1.
  MovePlanInput in = Even(64, 2);
  for (int s = 0; s < 8; ++s) in.weight[s] = 10;
  in.live = {0, 1, 2};
  in.servers = 3;
  absl::StatusOr<MovePlan> plan = PlanMoves(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto load = After(in, *plan);
  const double share = (8 * 10 + 56) / 3.0;
  for (uint32_t r = 0; r < 3; ++r) {
    EXPECT_NEAR(static_cast<double>(load.at(r)), share, 10.0) << r;
  }
  EXPECT_LT(plan->weight_moved, plan->weight_total / 2);
}

TEST(MovePlannerTest, ASlotGoingToItsBackupIsAPromotion) {
  MovePlanInput in = Even(12, 3);
  for (uint32_t s = 0; s < 12; ++s) in.backup.push_back((in.owner[s] + 1) % 3);
  in.replicated = true;
  in.servers = 2;
  in.remove = {2};  // slots 8-11 are backed by server 0
  absl::StatusOr<MovePlan> plan = PlanMoves(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->slots_moved, 4u);
  const auto load = After(in, *plan);
  EXPECT_EQ(load.at(0), 6u);
  EXPECT_EQ(load.at(1), 6u);
  for (const SlotMove& m : plan->moves) {
    EXPECT_EQ(m.source(), 2u);
    EXPECT_EQ(m.promote(), m.target() == 0u) << m.target();
  }
}

TEST(MovePlannerTest, NothingToDoPlansNoMove) {
  MovePlanInput in = Even(64, 4);
  in.servers = 4;
  absl::StatusOr<MovePlan> plan = PlanMoves(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->moves.empty());
}

TEST(MovePlannerTest, RefusesWhatCannotBeDone) {
  MovePlanInput in = Even(64, 2);
  in.servers = 3;
  EXPECT_THAT(std::string(PlanMoves(in).status().message()),
              HasSubstr("start 1 more server_main"));
  in.servers = 0;
  EXPECT_EQ(PlanMoves(in).status().code(), absl::StatusCode::kInvalidArgument);
  in.servers = 1;
  in.remove = {7};
  EXPECT_THAT(std::string(PlanMoves(in).status().message()),
              HasSubstr("server 7 is not a live server"));
  in.remove.clear();
  in.live = {1};  // the owner of slots 0-31 is gone
  EXPECT_EQ(PlanMoves(in).status().code(),
            absl::StatusCode::kFailedPrecondition);
  in = Even(64, 2);
  in.replicated = true;
  in.servers = 1;
  EXPECT_THAT(std::string(PlanMoves(in).status().message()),
              HasSubstr("at least 2 servers"));
}

}  // namespace
}  // namespace ps
