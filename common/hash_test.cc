#include "common/hash.h"

#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

// Routing must be a pure function of (table, key): workers and servers
// compute it independently and must agree forever.
TEST(HashTest, SlotsAreStableAcrossVersions) {
  EXPECT_EQ(SparseSlot(0, 0, 4096), SparseSlot(0, 0, 4096));
  // Golden values: a change here moves keys between servers, so processes
  // of different versions cannot share a job; it must be deliberate.
  // (Checkpoints survive it: a restore recomputes every row's slot.) The
  // slot functions changed once, from two mixes and `hash % n` to one mix
  // and HashToRange, to take a 64-bit division and a mix off the per-key
  // paths.
  EXPECT_EQ(Mix64(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(Mix64(1), 0x910a2dec89025cc1ULL);
  EXPECT_EQ(SparseSlot(3, 12345, 4096), 2798u);
  EXPECT_EQ(SparseSlot(0, 0, 4096), 2672u);
  EXPECT_EQ(DenseBlockSlot(4, 7, 4096), 1397u);
}

TEST(HashTest, SparseSlotsSpreadEvenly) {
  constexpr uint32_t kSlots = 64;
  std::vector<int> count(kSlots, 0);
  constexpr int kKeys = 64000;
  for (uint64_t k = 0; k < kKeys; ++k) ++count[SparseSlot(3, k, kSlots)];
  for (int c : count) {
    // Expected 1000 per slot; 5 sigma is about 160.
    EXPECT_GT(c, 840);
    EXPECT_LT(c, 1160);
  }
}

TEST(HashTest, TablesSharingKeysLandOnDifferentSlots) {
  int same = 0;
  for (uint64_t k = 0; k < 1000; ++k) {
    same += SparseSlot(1, k, 1024) == SparseSlot(2, k, 1024);
  }
  EXPECT_LT(same, 10);
}

TEST(HashTest, DenseBlocksAndSparseKeysUseDifferentSpaces) {
  int same = 0;
  for (uint64_t b = 0; b < 1000; ++b) {
    same += DenseBlockSlot(1, b, 1024) == SparseSlot(1, b, 1024);
  }
  EXPECT_LT(same, 10);
}

TEST(HashTest, HashToUnitIsInRange) {
  for (uint64_t i = 0; i < 1000; ++i) {
    double u = HashToUnit(Mix64(i));
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
  EXPECT_EQ(HashToUnit(0), 0.0);
  EXPECT_LT(HashToUnit(~0ULL), 1.0);
}

TEST(HashTest, HashToRangeCoversTheRangeEvenly) {
  EXPECT_EQ(HashToRange(0, 7), 0u);
  EXPECT_EQ(HashToRange(~0ULL, 7), 6u);
  std::vector<int> counts(10, 0);
  for (uint64_t i = 0; i < 100000; ++i) {
    const uint32_t r = HashToRange(Mix64(i), 10);
    ASSERT_LT(r, 10u);
    ++counts[r];
  }
  for (int c : counts) {
    EXPECT_GT(c, 9500);
    EXPECT_LT(c, 10500);
  }
}

}  // namespace
}  // namespace ps
