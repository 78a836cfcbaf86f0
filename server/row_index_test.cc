#include "server/row_index.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(RowIndexTest, EmptyFindsNothing) {
  RowIndex index;
  EXPECT_EQ(index.Find(0), RowIndex::kNotFound);
  EXPECT_FALSE(index.Erase(0));
  EXPECT_EQ(index.MemoryBytes(), 0u);
}

TEST(RowIndexTest, InsertFindEraseAllKeyValues) {
  RowIndex index;
  const uint64_t keys[] = {0, 1, ~uint64_t{0}, uint64_t{1} << 63, 12345};
  for (uint32_t i = 0; i < 5; ++i) index.Insert(keys[i], i * 10);
  for (uint32_t i = 0; i < 5; ++i) EXPECT_EQ(index.Find(keys[i]), i * 10);
  EXPECT_EQ(index.size(), 5u);
  EXPECT_TRUE(index.Erase(~uint64_t{0}));
  EXPECT_FALSE(index.Erase(~uint64_t{0}));
  EXPECT_EQ(index.Find(~uint64_t{0}), RowIndex::kNotFound);
  EXPECT_EQ(index.Find(12345), 40u);
  EXPECT_EQ(index.size(), 4u);
}

// Random inserts and erases against a reference map: backward-shift
// deletion must keep every remaining key reachable.
TEST(RowIndexTest, ChurnMatchesReferenceMap) {
  RowIndex index;
  absl::flat_hash_map<uint64_t, uint32_t> ref;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 200000; ++step) {
    // Small key range so probe runs collide and wrap often.
    const uint64_t key = rng() % 3000;
    if (ref.contains(key)) {
      ASSERT_TRUE(index.Erase(key));
      ref.erase(key);
    } else {
      const uint32_t row = static_cast<uint32_t>(step);
      index.Insert(key, row);
      ref[key] = row;
    }
    if (step % 9973 == 0) {
      for (uint64_t k = 0; k < 3000; ++k) {
        auto it = ref.find(k);
        ASSERT_EQ(index.Find(k), it == ref.end() ? RowIndex::kNotFound : it->second)
            << "key " << k << " at step " << step;
      }
    }
  }
  EXPECT_EQ(index.size(), ref.size());
  size_t seen = 0;
  index.ForEach([&](uint64_t key, uint32_t row) {
    ++seen;
    EXPECT_EQ(ref.at(key), row);
  });
  EXPECT_EQ(seen, ref.size());
}

TEST(RowIndexTest, GrowthStopsAtMaxEntries) {
  RowIndex index;
  index.set_max_entries(1000);
  for (uint32_t i = 0; i < 1000; ++i) index.Insert(i * 977, i);
  EXPECT_EQ(index.capacity(), RowIndex::CapacityFor(1000));
  EXPECT_EQ(index.MemoryBytes(), RowIndex::CapacityFor(1000) * RowIndex::kBytesPerSlot);
  for (uint32_t i = 0; i < 1000; ++i) ASSERT_EQ(index.Find(i * 977), i);
}

// The longest run of occupied slots: what a lookup that misses may probe.
size_t LongestRun(const RowIndex& index) {
  size_t longest = 0;
  size_t run = 0;
  for (size_t i = 0; i < index.capacity(); ++i) {
    bool occupied = false;
    index.ForEachFrom(i, 1, [&](uint64_t, uint32_t) {
      occupied = true;
      return true;
    });
    run = occupied ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  return longest;
}

// The index hash is one multiply: structured key sets (consecutive ids,
// ids in the high half only, multiples of a power of two) must spread over
// the slots about as well as random keys, or linear probing degrades.
TEST(RowIndexTest, StructuredKeysSpreadLikeRandomOnes) {
  constexpr uint32_t kKeys = 50000;  // load 0.76 at capacity 65536
  auto fill = [](auto key_of) {
    auto index = std::make_unique<RowIndex>();
    for (uint32_t i = 0; i < kKeys; ++i) index->Insert(key_of(i), i);
    for (uint32_t i = 0; i < kKeys; ++i) EXPECT_EQ(index->Find(key_of(i)), i);
    return index;
  };
  std::mt19937_64 rng(3);
  std::vector<uint64_t> random(kKeys);
  for (auto& k : random) k = rng();
  const size_t random_run = LongestRun(*fill([&](uint32_t i) { return random[i]; }));
  struct Family {
    const char* name;
    uint64_t (*key_of)(uint32_t);
  };
  for (const Family& f : {
           Family{"consecutive", [](uint32_t i) { return uint64_t{i}; }},
           Family{"high half", [](uint32_t i) { return uint64_t{i} << 32; }},
           Family{"top bits", [](uint32_t i) { return uint64_t{i} << 46; }},
           Family{"multiples of 4096", [](uint32_t i) { return uint64_t{i} * 4096; }},
           Family{"both halves", [](uint32_t i) { return (uint64_t{i} << 32) | i; }},
       }) {
    const size_t run = LongestRun(*fill(f.key_of));
    EXPECT_LE(run, 2 * random_run + 16) << f.name << " (random keys: " << random_run << ")";
    std::printf("[ measured ] %s: longest probe run %zu slots (random keys %zu)\n", f.name, run,
                random_run);
  }
}

TEST(RowIndexTest, CapacityForKeepsLoadAtMostFourFifths) {
  for (size_t n : {0, 1, 7, 8, 100, 1001, 123457}) {
    const size_t c = RowIndex::CapacityFor(n);
    EXPECT_LE(n * 5, c * 4) << n;
    if (n > 8) {
      EXPECT_GT(n * 5, (c - 1) * 4) << n;
    }
  }
}

}  // namespace
}  // namespace ps
