#include "scheduler/shard_ledger.h"

#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

using State = ShardLedger::State;

DataPosition At(uint32_t shard, uint64_t epoch, uint64_t batch, bool done = false) {
  DataPosition p;
  p.set_shard(shard);
  p.set_epoch(epoch);
  p.set_batch(batch);
  p.set_done(done);
  return p;
}

TEST(ShardLedgerTest, ShardsStartUnstartedAtTheirBeginning) {
  ShardLedger ledger(3, /*reassign=*/true);
  ASSERT_EQ(ledger.size(), 3u);
  for (uint32_t s = 0; s < 3; ++s) {
    EXPECT_EQ(ledger.shard(s).state, State::kUnstarted);
    EXPECT_EQ(ledger.shard(s).position.shard(), s);
    EXPECT_TRUE(ledger.Available(s));
  }
  EXPECT_FALSE(ledger.AllDone());
  EXPECT_EQ(ledger.Orphan(), -1);
}

TEST(ShardLedgerTest, HeartbeatsMoveOnlyTheHoldersShard) {
  ShardLedger ledger(2, true);
  const DataPosition start = ledger.Assign(0, /*holder=*/7);
  EXPECT_EQ(start.shard(), 0u);
  EXPECT_FALSE(start.done());
  EXPECT_FALSE(ledger.Available(0));
  ledger.Report(7, At(0, 1, 5));
  ledger.Report(8, At(0, 9, 9));  // not its holder
  ledger.Report(7, At(1, 9, 9));  // not its shard
  ledger.Report(7, At(5, 9, 9));  // no such shard
  EXPECT_EQ(ledger.shard(0).position.epoch(), 1u);
  EXPECT_EQ(ledger.shard(0).position.batch(), 5u);
  EXPECT_EQ(ledger.shard(1).position.epoch(), 0u);
}

TEST(ShardLedgerTest, AReleasedShardIsOrphanedAtItsLastPositionAndResumed) {
  ShardLedger ledger(2, /*reassign=*/true);
  ledger.Assign(0, 7);
  ledger.Report(7, At(0, 2, 3));
  ledger.Release(7, /*done=*/false, nullptr);
  EXPECT_EQ(ledger.shard(0).state, State::kOrphaned);
  EXPECT_EQ(ledger.shard(0).holder, 0u);
  EXPECT_EQ(ledger.Orphan(), 0);
  EXPECT_TRUE(ledger.Available(0));
  const DataPosition resumed = ledger.Assign(0, 9);
  EXPECT_EQ(resumed.epoch(), 2u);
  EXPECT_EQ(resumed.batch(), 3u);
  EXPECT_EQ(ledger.Orphan(), -1);
}

TEST(ShardLedgerTest, ALeavingWorkersOwnPositionWins) {
  ShardLedger ledger(2, true);
  ledger.Assign(1, 7);
  ledger.Report(7, At(1, 1, 1));
  const DataPosition left = At(1, 4, 4);
  ledger.Release(7, false, &left);
  EXPECT_EQ(ledger.shard(1).position.epoch(), 4u);
  // A position at the end of the shard makes it done, not orphaned.
  ledger.Assign(1, 8);
  const DataPosition end = At(1, 5, 0, /*done=*/true);
  ledger.Release(8, false, &end);
  EXPECT_EQ(ledger.shard(1).state, State::kDone);
}

TEST(ShardLedgerTest, SkipRestDropsTheRestOfALostShard) {
  ShardLedger ledger(1, /*reassign=*/false);
  ledger.Assign(0, 7);
  ledger.Release(7, false, nullptr);
  EXPECT_EQ(ledger.shard(0).state, State::kDone);
  EXPECT_EQ(ledger.Orphan(), -1);
  EXPECT_TRUE(ledger.AllDone());
}

TEST(ShardLedgerTest, FinishedShardsAreDoneAndTheJobEndsWithTheLast) {
  ShardLedger ledger(2, true);
  ledger.Assign(0, 7);
  ledger.Assign(1, 8);
  EXPECT_FALSE(ledger.Finish(8, At(0, 1, 0)));  // not its shard
  EXPECT_TRUE(ledger.Finish(7, At(0, 1, 0)));
  EXPECT_FALSE(ledger.Finish(7, At(0, 1, 0)));  // already done
  EXPECT_EQ(ledger.CountDone(), 1u);
  EXPECT_TRUE(ledger.shard(0).position.done());
  EXPECT_FALSE(ledger.AllDone());
  ledger.Release(8, /*done=*/true, nullptr);
  EXPECT_TRUE(ledger.AllDone());
}

TEST(ShardLedgerTest, HeldByFindsTheShardAClaimWasGiven) {
  ShardLedger ledger(3, true);
  ledger.Assign(2, 7);
  EXPECT_EQ(ledger.HeldBy(7, /*except=*/0), 2);
  EXPECT_EQ(ledger.HeldBy(7, /*except=*/2), -1);
  EXPECT_EQ(ledger.HeldBy(8, 0), -1);
}

TEST(ShardLedgerTest, RestoreNeedsOnePositionPerShard) {
  ShardLedger ledger(2, true);
  CheckpointManifest m;
  *m.add_positions() = At(0, 3, 1);
  EXPECT_FALSE(ledger.Restore(m.positions()));
  EXPECT_EQ(ledger.shard(0).position.epoch(), 0u);
  *m.add_positions() = At(1, 9, 0, /*done=*/true);
  EXPECT_TRUE(ledger.Restore(m.positions()));
  EXPECT_EQ(ledger.shard(0).state, State::kUnstarted);
  EXPECT_EQ(ledger.shard(0).position.epoch(), 3u);
  EXPECT_EQ(ledger.shard(1).state, State::kDone);
}

TEST(ShardLedgerTest, ManifestTakesReportsOverTheLedger) {
  ShardLedger ledger(3, true);
  ledger.Assign(0, 7);
  ledger.Report(7, At(0, 1, 1));
  ledger.Assign(2, 8);
  ledger.Finish(8, At(2, 4, 0));
  const DataPosition reported = At(0, 1, 9);
  CheckpointManifest m;
  ledger.FillManifest({&reported, nullptr, nullptr}, &m);
  ASSERT_EQ(m.positions_size(), 3);
  EXPECT_EQ(m.positions(0).batch(), 9u);
  EXPECT_EQ(m.positions(1).shard(), 1u);
  EXPECT_FALSE(m.positions(1).done());
  EXPECT_TRUE(m.positions(2).done());
}

TEST(ShardLedgerTest, TheJournalRoundTrips) {
  ShardLedger ledger(3, true);
  ledger.Assign(0, 7);
  ledger.Report(7, At(0, 2, 2));
  ledger.Assign(1, 8);
  ledger.Release(8, false, nullptr);
  ledger.Assign(2, 9);
  ledger.Finish(9, At(2, 1, 0));
  SchedulerJournal j;
  ledger.ToJournal(&j);
  ASSERT_EQ(j.shards_size(), 3);
  EXPECT_EQ(j.shards(0).state(), JournalShard::ACTIVE);
  EXPECT_EQ(j.shards(1).state(), JournalShard::ORPHANED);
  EXPECT_EQ(j.shards(2).state(), JournalShard::DONE);
  ShardLedger back(3, true);
  back.FromJournal(j);
  for (uint32_t s = 0; s < 3; ++s) {
    EXPECT_EQ(back.shard(s).state, ledger.shard(s).state);
    EXPECT_EQ(back.shard(s).holder, ledger.shard(s).holder);
    EXPECT_EQ(back.shard(s).position.SerializeAsString(),
              ledger.shard(s).position.SerializeAsString());
  }
}

}  // namespace
}  // namespace ps
