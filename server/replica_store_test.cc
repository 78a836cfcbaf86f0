// ReplicaStore's rules, directly: no server, no sockets, no tables.
#include "server/replica_store.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/hash.h"
#include "server/replication.h"
#include "server/step_buffers.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using replication::SeqWindow;

constexpr uint32_t kSlots = 8;
constexpr uint32_t kTable = 3; // sparse, dim 1
constexpr uint64_t kPrimary = 10, kOtherPrimary = 11;
constexpr uint64_t kWorker = 1, kOtherWorker = 2;

const ReplicaStore::Dims &Dims() {
  static const auto *const dims = new ReplicaStore::Dims{{kTable, 1}};
  return *dims;
}

// The first `n` keys of table kTable that fall in `slot`.
std::vector<uint64_t> KeysIn(uint32_t slot, size_t n) {
  std::vector<uint64_t> keys;
  for (uint64_t key = 1; keys.size() < n; ++key) {
    if (SparseSlot(kTable, key, kSlots) == slot)
      keys.push_back(key);
  }
  return keys;
}

// Adds `value` to the buffered sum of each key.
void AddSums(StepBuffer &buffer, const std::vector<uint64_t> &keys,
             double value) {
  StepBuffer::Sparse &b = buffer.sparse[kTable];
  for (uint64_t key : keys) {
    auto [it, inserted] =
        b.index.try_emplace(key, static_cast<uint32_t>(b.keys.size()));
    if (inserted) {
      b.keys.push_back(key);
      b.sums.push_back(0.0);
    }
    b.sums[it->second] += value;
  }
}

// The buffered keys of kTable, sorted.
std::vector<uint64_t> KeysOf(const StepBuffer &buffer) {
  auto it = buffer.sparse.find(kTable);
  if (it == buffer.sparse.end())
    return {};
  std::vector<uint64_t> keys = it->second.keys;
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::vector<uint64_t> Sorted(std::vector<uint64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(ReplicaStoreTest,
     ASequenceNumberIsADuplicateOfTheSamePrimaryAndSenderOnly) {
  ReplicaStore store;
  EXPECT_FALSE(store.SeenOrRecord(kPrimary, kWorker, 5));
  EXPECT_TRUE(store.SeenOrRecord(kPrimary, kWorker, 5));
  EXPECT_TRUE(store.SeenOrRecord(kPrimary, kWorker, 5));
  EXPECT_FALSE(store.SeenOrRecord(kPrimary, kOtherWorker, 5));
  EXPECT_FALSE(store.SeenOrRecord(kOtherPrimary, kWorker, 5));
  EXPECT_FALSE(store.SeenOrRecord(kPrimary, kWorker, 6));
  // No sequence number: never a duplicate.
  EXPECT_FALSE(store.SeenOrRecord(kPrimary, kWorker, 0));
  EXPECT_FALSE(store.SeenOrRecord(kPrimary, kWorker, 0));
}

TEST(ReplicaStoreTest, MergedWindowsMakeTheirNumbersDuplicates) {
  ReplicaStore store;
  SeqWindow w;
  w.Record(7);
  w.Record(9);
  store.MergeSeqs(kPrimary, kWorker, w);
  EXPECT_TRUE(store.SeenOrRecord(kPrimary, kWorker, 7));
  EXPECT_TRUE(store.SeenOrRecord(kPrimary, kWorker, 9));
  EXPECT_FALSE(store.SeenOrRecord(kPrimary, kWorker, 8));
  EXPECT_FALSE(store.SeenOrRecord(kOtherPrimary, kWorker, 7));
}

TEST(ReplicaStoreTest, TakeStepMovesTheStepOutOnce) {
  ReplicaStore store;
  AddSums(store.Buffer(kPrimary, 4), {1, 2}, 1.0);
  AddSums(store.Buffer(kPrimary, 5), {3}, 1.0);
  AddSums(store.Buffer(kOtherPrimary, 4), {9}, 1.0);
  EXPECT_EQ(store.buffered_steps(kPrimary), 2u);

  StepBuffer out;
  ASSERT_TRUE(store.TakeStep(kPrimary, 4, &out));
  EXPECT_EQ(KeysOf(out), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(store.buffered_steps(kPrimary), 1u);
  StepBuffer again;
  EXPECT_FALSE(store.TakeStep(kPrimary, 4, &again));
  EXPECT_TRUE(KeysOf(again).empty());
  EXPECT_FALSE(store.TakeStep(12, 4, &again));
  // The other primary's step 4 is its own.
  ASSERT_TRUE(store.TakeStep(kOtherPrimary, 4, &out));
  EXPECT_EQ(KeysOf(out), (std::vector<uint64_t>{9}));
}

TEST(ReplicaStoreTest, ACatchUpDropsWhatWasBufferedOfItsSlotsOnly) {
  ReplicaStore store;
  store.SizeSlots(kSlots);
  const std::vector<uint64_t> in2 = KeysIn(2, 3), in5 = KeysIn(5, 2);
  for (uint64_t step : {0, 1}) {
    AddSums(store.Buffer(kPrimary, step), in2, 1.0);
    AddSums(store.Buffer(kPrimary, step), in5, 1.0);
    AddSums(store.Buffer(kOtherPrimary, step), in2, 1.0);
  }
  store.EndCatchUp(std::vector<uint32_t>{2, 5});
  ASSERT_TRUE(store.caught_up(2));

  // A new catch-up of slot 2 from kPrimary: slot 2 is not caught up, and
  // kPrimary's buffered slot-2 sums are gone (the snapshot holds them).
  store.BeginCatchUp(kPrimary, std::vector<uint32_t>{2}, Dims());
  EXPECT_FALSE(store.caught_up(2));
  EXPECT_TRUE(store.caught_up(5));
  for (uint64_t step : {0, 1}) {
    StepBuffer out;
    ASSERT_TRUE(store.TakeStep(kPrimary, step, &out));
    EXPECT_EQ(KeysOf(out), Sorted(in5)) << step;
    ASSERT_TRUE(store.TakeStep(kOtherPrimary, step, &out));
    EXPECT_EQ(KeysOf(out), Sorted(in2)) << step;
  }
  store.EndCatchUp(std::vector<uint32_t>{2});
  EXPECT_TRUE(store.caught_up(2));
}

TEST(ReplicaStoreTest, SlotsOutsideTheSizedRangeAreNeverCaughtUp) {
  ReplicaStore store;
  store.EndCatchUp(std::vector<uint32_t>{1}); // not sized yet: ignored
  EXPECT_FALSE(store.caught_up(1));
  store.SizeSlots(kSlots);
  store.EndCatchUp(std::vector<uint32_t>{1, kSlots, kSlots + 5});
  EXPECT_TRUE(store.caught_up(1));
  EXPECT_FALSE(store.caught_up(kSlots));
  store.BeginCatchUp(kPrimary, std::vector<uint32_t>{kSlots + 1},
                     Dims()); // ignored
  EXPECT_TRUE(store.caught_up(1));
  // The same count keeps the record; a new slot map starts it over.
  store.SizeSlots(kSlots);
  EXPECT_TRUE(store.caught_up(1));
  store.SizeSlots(2 * kSlots);
  EXPECT_FALSE(store.caught_up(1));
}

TEST(ReplicaStoreTest, TakeOverHandsOverTheMaskedSlotsInStepOrder) {
  ReplicaStore store;
  store.SizeSlots(kSlots);
  const std::vector<uint64_t> in3 = KeysIn(3, 2), in6 = KeysIn(6, 2);
  AddSums(store.Buffer(kPrimary, 7), in3, 2.0);
  AddSums(store.Buffer(kPrimary, 7), in6, 1.0);
  AddSums(store.Buffer(kPrimary, 8), in6, 1.0); // nothing of slot 3: skipped
  AddSums(store.Buffer(kPrimary, 9), in3, 4.0);
  store.Buffer(kPrimary, 9).pushers.insert(kWorker);
  AddSums(store.Buffer(kOtherPrimary, 7), in3, 1.0);
  EXPECT_FALSE(store.SeenOrRecord(kPrimary, kWorker, 21));
  EXPECT_FALSE(store.SeenOrRecord(kOtherPrimary, kWorker, 22));

  std::vector<bool> mask(kSlots, false);
  mask[3] = true;
  ReplicaStore::Windows seqs;
  std::vector<uint64_t> steps;
  store.TakeOver(kPrimary, mask, kSlots, Dims(), &seqs,
                 [&](uint64_t step, StepBuffer &&moved) {
                   steps.push_back(step);
                   EXPECT_EQ(KeysOf(moved), Sorted(in3)) << step;
                   const StepBuffer::Sparse &b = moved.sparse.at(kTable);
                   for (double sum : b.sums)
                     EXPECT_EQ(sum, step == 7 ? 2.0 : 4.0);
                 });
  EXPECT_EQ(steps, (std::vector<uint64_t>{7, 9}));
  // kPrimary's windows became the server's; kOtherPrimary's did not.
  ASSERT_EQ(seqs.count(kWorker), 1u);
  EXPECT_EQ(seqs[kWorker].Test(21), SeqWindow::Check::kDuplicate);
  EXPECT_NE(seqs[kWorker].Test(22), SeqWindow::Check::kDuplicate);
  // What belongs to other slots stays buffered.
  StepBuffer out;
  ASSERT_TRUE(store.TakeStep(kPrimary, 7, &out));
  EXPECT_EQ(KeysOf(out), Sorted(in6));
  ASSERT_TRUE(store.TakeStep(kOtherPrimary, 7, &out));
  EXPECT_EQ(KeysOf(out), Sorted(in3));
}

TEST(ReplicaStoreTest, RetainForgetsDeadPrimariesAndGoneSenders) {
  ReplicaStore store;
  EXPECT_FALSE(store.SeenOrRecord(kPrimary, kWorker, 1));
  EXPECT_FALSE(store.SeenOrRecord(kPrimary, kOtherWorker, 1));
  EXPECT_FALSE(store.SeenOrRecord(kOtherPrimary, kWorker, 1));
  AddSums(store.Buffer(kPrimary, 0), {1}, 1.0);
  AddSums(store.Buffer(kOtherPrimary, 0), {1}, 1.0);

  store.Retain(/*live_servers=*/{kPrimary}, /*live_workers=*/{kWorker});
  EXPECT_TRUE(store.SeenOrRecord(kPrimary, kWorker, 1));
  EXPECT_FALSE(store.SeenOrRecord(kPrimary, kOtherWorker, 1)); // forgotten
  EXPECT_FALSE(store.SeenOrRecord(kOtherPrimary, kWorker, 1)); // forgotten
  EXPECT_EQ(store.buffered_steps(kPrimary), 1u);
  EXPECT_EQ(store.buffered_steps(kOtherPrimary), 0u);
}

TEST(ReplicaStoreTest, AppliedKeysAreCountedByTable) {
  ReplicaStore store;
  EXPECT_EQ(store.applied(kTable), 0u);
  store.CountApplied(kTable, 3);
  store.CountApplied(kTable, 4);
  store.CountApplied(kTable + 1, 1);
  EXPECT_EQ(store.applied(kTable), 7u);
  EXPECT_EQ(store.applied(kTable + 1), 1u);
}

} // namespace
} // namespace ps
