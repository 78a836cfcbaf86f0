#include "worker/router.h"

#include <cstdint>
#include <vector>

#include "common/hash.h"
#include "gtest/gtest.h"

namespace ps {
namespace kv_internal {
namespace {

// 16 slots over 3 servers, as a scheduler would spread them.
std::vector<uint32_t> ThreeServers() {
  std::vector<uint32_t> owners(16);
  for (uint32_t s = 0; s < owners.size(); ++s) owners[s] = s % 3;
  return owners;
}

TEST(RouterTest, SparseOwnerFollowsTheSlotMap) {
  const std::vector<uint32_t> owners = ThreeServers();
  for (uint64_t key = 0; key < 100; ++key) {
    EXPECT_EQ(SparseOwner(owners, 7, key), owners[SparseSlot(7, key, 16)]);
  }
}

TEST(RouterTest, SplitSparseRoutesEveryKeyOnce) {
  const std::vector<uint32_t> owners = ThreeServers();
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 1001; ++k) keys.push_back(k * 7919);
  const SparseSplit split = SplitSparse(owners, /*sole_owner=*/-1, 3, 5, keys);
  ASSERT_EQ(split.owners.size(), keys.size());
  ASSERT_EQ(split.counts.size(), 3u);
  std::vector<uint32_t> expected_counts(3, 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(split.owners[i], SparseOwner(owners, 5, keys[i]));
    ++expected_counts[split.owners[i]];
  }
  EXPECT_EQ(split.counts, expected_counts);
  EXPECT_EQ(split.Servers(), (std::vector<uint32_t>{0, 1, 2}));
  size_t seen = 0;
  for (uint32_t s : split.Servers()) {
    const std::vector<uint32_t> idx = split.IndicesOf(s);
    EXPECT_EQ(idx.size(), split.counts[s]);
    for (size_t j = 0; j < idx.size(); ++j) {
      EXPECT_EQ(split.owners[idx[j]], s);
      if (j > 0) {
        EXPECT_LT(idx[j - 1], idx[j]);  // request order
      }
    }
    seen += idx.size();
  }
  EXPECT_EQ(seen, keys.size());
}

TEST(RouterTest, SplitSparseWithASoleOwnerHashesNothing) {
  const std::vector<uint32_t> owners(16, 1);
  const std::vector<uint64_t> keys = {1, 2, 3};
  const SparseSplit split = SplitSparse(owners, /*sole_owner=*/1, 2, 0, keys);
  EXPECT_TRUE(split.owners.empty());
  EXPECT_EQ(split.counts, (std::vector<uint32_t>{0, 3}));
  EXPECT_EQ(split.Servers(), (std::vector<uint32_t>{1}));
}

TEST(RouterTest, SplitSparseOfNoKeysHasNoServers) {
  const SparseSplit split = SplitSparse(ThreeServers(), -1, 3, 0, {});
  EXPECT_TRUE(split.Servers().empty());
  EXPECT_EQ(split.counts, (std::vector<uint32_t>{0, 0, 0}));
}

TEST(RouterTest, SplitDenseCutsAtBlockBoundaries) {
  const std::vector<uint32_t> owners = ThreeServers();
  // Elements [5, 35) in blocks of 10: [5,10) [10,20) [20,30) [30,35).
  const DenseRange range{5, 30};
  const DenseSplit split = SplitDense(owners, 3, 2, 10, {&range, 1});
  ASSERT_EQ(split.pieces.size(), 4u);
  const uint64_t begins[] = {5, 10, 20, 30};
  const uint64_t lengths[] = {5, 10, 10, 5};
  uint64_t offset = 0;
  std::vector<uint64_t> totals(3, 0);
  for (size_t i = 0; i < 4; ++i) {
    const DensePiece& p = split.pieces[i];
    EXPECT_EQ(p.begin, begins[i]);
    EXPECT_EQ(p.length, lengths[i]);
    EXPECT_EQ(p.offset, offset);
    EXPECT_EQ(p.source, 0u);
    EXPECT_EQ(p.owner, owners[DenseBlockSlot(2, p.begin / 10, 16)]);
    EXPECT_EQ(p.owner, DenseOwner(owners, 2, 10, p.begin));
    totals[p.owner] += p.length;
    offset += p.length;
  }
  EXPECT_EQ(split.totals, totals);
}

TEST(RouterTest, SplitDenseTellsContiguousShares) {
  // Slots alternate between two servers, so consecutive blocks mostly land
  // on different servers; a one-server map makes everything contiguous.
  const std::vector<uint32_t> one(16, 0);
  const DenseRange range{0, 100};
  const DenseSplit whole = SplitDense(one, 1, 0, 10, {&range, 1});
  EXPECT_EQ(whole.Servers(), (std::vector<uint32_t>{0}));
  EXPECT_EQ(whole.totals[0], 100u);
  EXPECT_EQ(whole.first[0], 0u);
  EXPECT_TRUE(whole.contiguous[0]);

  const std::vector<uint32_t> owners = ThreeServers();
  const DenseSplit split = SplitDense(owners, 3, 0, 10, {&range, 1});
  for (uint32_t s : split.Servers()) {
    // Contiguous exactly when the server's pieces follow one another.
    bool contiguous = true;
    int64_t next = -1;
    uint64_t first = 0;
    for (const DensePiece& p : split.pieces) {
      if (p.owner != s) continue;
      if (next < 0) {
        first = p.offset;
      } else if (static_cast<uint64_t>(next) != p.offset) {
        contiguous = false;
      }
      next = static_cast<int64_t>(p.offset + p.length);
    }
    EXPECT_EQ(split.contiguous[s], contiguous) << s;
    EXPECT_EQ(split.first[s], first) << s;
  }
}

TEST(RouterTest, SplittingAgainGivesTheSamePieces) {
  // A failover re-splits a part's segments (already cut at blocks) by the
  // new map: the pieces must be those a fresh split of the range gives.
  const std::vector<uint32_t> before(16, 0);
  const std::vector<uint32_t> after = ThreeServers();
  const DenseRange range{3, 57};
  const DenseSplit first = SplitDense(before, 1, 4, 8, {&range, 1});
  std::vector<DenseRange> segments;
  for (const DensePiece& p : first.pieces)
    segments.push_back({p.begin, p.length});
  const DenseSplit again = SplitDense(after, 3, 4, 8, segments);
  const DenseSplit fresh = SplitDense(after, 3, 4, 8, {&range, 1});
  ASSERT_EQ(again.pieces.size(), fresh.pieces.size());
  for (size_t i = 0; i < fresh.pieces.size(); ++i) {
    EXPECT_EQ(again.pieces[i].begin, fresh.pieces[i].begin);
    EXPECT_EQ(again.pieces[i].length, fresh.pieces[i].length);
    EXPECT_EQ(again.pieces[i].owner, fresh.pieces[i].owner);
    EXPECT_EQ(again.pieces[i].offset, fresh.pieces[i].offset);
    EXPECT_EQ(again.pieces[i].source, i);
  }
  EXPECT_EQ(again.totals, fresh.totals);
  EXPECT_EQ(again.contiguous, fresh.contiguous);
}

TEST(RouterTest, SplitDenseOfSeveralRangesNumbersTheirPieces) {
  const std::vector<uint32_t> owners = ThreeServers();
  const std::vector<DenseRange> ranges = {{0, 15}, {40, 5}};
  const DenseSplit split = SplitDense(owners, 3, 1, 10, ranges);
  ASSERT_EQ(split.pieces.size(), 3u);
  EXPECT_EQ(split.pieces[0].source, 0u);
  EXPECT_EQ(split.pieces[1].source, 0u);
  EXPECT_EQ(split.pieces[1].begin, 10u);
  EXPECT_EQ(split.pieces[1].offset, 10u);
  EXPECT_EQ(split.pieces[2].source, 1u);
  EXPECT_EQ(split.pieces[2].begin, 40u);
  EXPECT_EQ(split.pieces[2].offset, 15u);
}

}  // namespace
}  // namespace kv_internal
}  // namespace ps
