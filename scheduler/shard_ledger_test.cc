#include "scheduler/shard_ledger.h"

#include <random>
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

// Orphan, CountDone, AllDone and HeldBy answer from indexes kept as shards
// change: after any sequence of changes, and through the journal, they
// say what a walk over every shard says.
TEST(ShardLedgerTest, ItsIndexesAgreeWithAWalkAfterAnyChanges) {
  constexpr uint32_t kShards = 16;
  constexpr uint64_t kHolders = 5;
  std::mt19937 rng(7);
  auto check = [&](const ShardLedger& ledger, bool reassign) {
    int first_orphan = -1;
    uint32_t done = 0;
    for (uint32_t s = 0; s < kShards; ++s) {
      const ShardLedger::Shard& shard = ledger.shard(s);
      if (shard.state == State::kOrphaned && first_orphan < 0) first_orphan = s;
      done += shard.state == State::kDone;
    }
    EXPECT_EQ(ledger.Orphan(), reassign ? first_orphan : -1);
    EXPECT_EQ(ledger.CountDone(), done);
    EXPECT_EQ(ledger.AllDone(), done == kShards);
    for (uint64_t h = 1; h <= kHolders; ++h) {
      for (uint32_t except : {0u, 3u, kShards}) {
        int held = -1;
        for (uint32_t s = 0; s < kShards && held < 0; ++s) {
          const ShardLedger::Shard& shard = ledger.shard(s);
          if (s != except && shard.state == State::kActive && shard.holder == h) {
            held = static_cast<int>(s);
          }
        }
        EXPECT_EQ(ledger.HeldBy(h, except), held) << "holder " << h;
      }
    }
  };
  for (bool reassign : {true, false}) {
    ShardLedger ledger(kShards, reassign);
    for (int step = 0; step < 3000; ++step) {
      const uint32_t s = rng() % kShards;
      const uint64_t holder = 1 + rng() % kHolders;
      switch (rng() % 6) {
        case 0:
        case 1:
          if (ledger.Available(s)) ledger.Assign(s, holder);
          break;
        case 2:
          ledger.Finish(holder, At(s, 1, 0, /*done=*/true));
          break;
        case 3:
          ledger.Release(holder, /*done=*/rng() % 4 == 0, nullptr);
          break;
        case 4: {
          const DataPosition at = At(s, 0, rng() % 3, rng() % 5 == 0);
          ledger.Release(holder, false, &at);
          break;
        }
        default:
          if (rng() % 40 == 0) {
            google::protobuf::RepeatedPtrField<DataPosition> positions;
            for (uint32_t t = 0; t < kShards; ++t) {
              *positions.Add() = At(t, 0, 0, rng() % 3 == 0);
            }
            ASSERT_TRUE(ledger.Restore(positions));
          }
      }
      ASSERT_NO_FATAL_FAILURE(check(ledger, reassign)) << "step " << step;
      if (step % 100 == 0) {
        SchedulerJournal journal;
        ledger.ToJournal(&journal);
        ShardLedger restored(kShards, reassign);
        restored.FromJournal(journal);
        ASSERT_NO_FATAL_FAILURE(check(restored, reassign)) << "step " << step;
        EXPECT_EQ(restored.Orphan(), ledger.Orphan());
        EXPECT_EQ(restored.CountDone(), ledger.CountDone());
      }
    }
  }
}

}  // namespace
}  // namespace ps
