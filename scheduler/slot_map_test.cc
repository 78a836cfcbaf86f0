#include "scheduler/slot_map.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr uint32_t kNone = kNoBackup;

TEST(SlotMapTest, InitialLayoutIsContiguousAndBackedByTheNextRank) {
  const SlotMap m = SlotMap::Initial(8, 3, /*replicated=*/true);
  EXPECT_THAT(m.owner(), ElementsAre(0, 0, 0, 1, 1, 1, 2, 2));
  EXPECT_THAT(m.backup(), ElementsAre(1, 1, 1, 2, 2, 2, 0, 0));
  EXPECT_TRUE(m.replicated());
}

TEST(SlotMapTest, WithoutReplicationThereAreNoBackups) {
  SlotMap m = SlotMap::Initial(4, 2, /*replicated=*/false);
  EXPECT_THAT(m.owner(), ElementsAre(0, 0, 1, 1));
  EXPECT_THAT(m.backup(), IsEmpty());
  EXPECT_FALSE(m.replicated());
  // Nothing moves: a replacement restores the slots of its rank.
  const SlotMap::Failed f = m.Fail(0, {false, true});
  EXPECT_EQ(f.promoted + f.orphaned + f.lost_backup, 0u);
  EXPECT_EQ(m.AssignBackups({false, true}).assigned, 0u);
  EXPECT_THAT(m.owner(), ElementsAre(0, 0, 1, 1));
}

TEST(SlotMapTest, ASingleReplicatedServerHasNoBackup) {
  const SlotMap m = SlotMap::Initial(2, 1, /*replicated=*/true);
  EXPECT_THAT(m.owner(), ElementsAre(0, 0));
  EXPECT_THAT(m.backup(), ElementsAre(kNone, kNone));
}

TEST(SlotMapTest, FailPromotesLiveBackupsAndDropsTheDeadCopies) {
  SlotMap m = SlotMap::Initial(6, 3, /*replicated=*/true);
  // owner 0 0 1 1 2 2, backup 1 1 2 2 0 0; rank 1 dies.
  const std::vector<bool> live = {true, false, true};
  const SlotMap::Failed f = m.Fail(1, live);
  EXPECT_EQ(f.promoted, 2u);
  EXPECT_EQ(f.lost_backup, 2u);
  EXPECT_EQ(f.orphaned, 0u);
  EXPECT_THAT(m.owner(), ElementsAre(0, 0, 2, 2, 2, 2));
  EXPECT_THAT(m.backup(), ElementsAre(kNone, kNone, kNone, kNone, 0, 0));
  // Each slot gets the least loaded other live server: only one is left.
  const SlotMap::Assigned a = m.AssignBackups(live);
  EXPECT_EQ(a.assigned, 4u);
  EXPECT_EQ(a.without, 0u);
  EXPECT_THAT(m.backup(), ElementsAre(2, 2, 0, 0, 0, 0));
}

TEST(SlotMapTest, ASlotWithoutALiveCopyStaysWithTheDeadRank) {
  SlotMap m = SlotMap::Initial(4, 2, /*replicated=*/true);
  // Rank 1 died first (its slots went to 0), then rank 0 dies too.
  std::vector<bool> live = {true, false};
  m.Fail(1, live);
  m.AssignBackups(live);
  EXPECT_THAT(m.owner(), ElementsAre(0, 0, 0, 0));
  live = {false, false};
  const SlotMap::Failed f = m.Fail(0, live);
  EXPECT_EQ(f.promoted, 0u);
  EXPECT_EQ(f.orphaned, 4u);
  EXPECT_THAT(m.owner(), ElementsAre(0, 0, 0, 0));
  EXPECT_THAT(m.backup(), ElementsAre(kNone, kNone, kNone, kNone));
  const SlotMap::Assigned a = m.AssignBackups(live);
  EXPECT_EQ(a.assigned, 0u);
  EXPECT_EQ(a.without, 0u);  // dead owners get no backup
}

TEST(SlotMapTest, BackupsGoToTheLeastLoadedServer) {
  // owner 0 everywhere, one slot backed by 1: the new backups prefer 2.
  SlotMap m(3, {0, 0, 0}, {1, kNone, kNone});
  const SlotMap::Assigned a = m.AssignBackups({true, true, true});
  EXPECT_EQ(a.assigned, 2u);
  EXPECT_THAT(m.backup(), ElementsAre(1, 2, 1));
}

TEST(SlotMapTest, NoOtherLiveServerLeavesSlotsWithoutBackup) {
  SlotMap m(2, {0, 0}, {kNone, kNone});
  const SlotMap::Assigned a = m.AssignBackups({true, false});
  EXPECT_EQ(a.assigned, 0u);
  EXPECT_EQ(a.without, 2u);
}

TEST(SlotMapTest, AReplacementBacksWhatItsRankHeldInTheInitialLayout) {
  SlotMap m = SlotMap::Initial(6, 3, /*replicated=*/true);
  std::vector<bool> live = {true, false, true};
  m.Fail(1, live);
  m.AssignBackups(live);
  ASSERT_THAT(m.owner(), ElementsAre(0, 0, 2, 2, 2, 2));
  // Rank 1 comes back: it backs the slots it owned (2, 3: now on 2) and
  // those it backed (0, 1); slots 4, 5 keep their backup on 0.
  live = {true, true, true};
  EXPECT_EQ(m.Adopt(1, live), 4u);
  EXPECT_THAT(m.owner(), ElementsAre(0, 0, 2, 2, 2, 2));
  EXPECT_THAT(m.backup(), ElementsAre(1, 1, 1, 1, 0, 0));
  EXPECT_EQ(m.AssignBackups(live).assigned, 0u);
}

TEST(SlotMapTest, AReplacementOwnsWhatHadNoLiveCopy) {
  // Slots 2 and 3 lost every copy and stayed with rank 1.
  SlotMap m(2, {0, 0, 1, 1}, {kNone, kNone, kNone, kNone});
  const std::vector<bool> live = {true, true};
  // It restores 2 and 3 (not backed) and backs 0 and 1.
  EXPECT_EQ(m.Adopt(1, live), 2u);
  EXPECT_THAT(m.backup(), ElementsAre(1, 1, kNone, kNone));
  EXPECT_EQ(m.AssignBackups(live).assigned, 2u);
  EXPECT_THAT(m.backup(), ElementsAre(1, 1, 0, 0));
}

TEST(SlotMapTest, RanksOutsideTheLiveListCountAsDead) {
  SlotMap m(2, {0, 0}, {1, 5});
  const SlotMap::Failed f = m.Fail(0, {false, false});
  EXPECT_EQ(f.promoted, 0u);
  EXPECT_EQ(f.orphaned, 2u);
}

}  // namespace
}  // namespace ps
