#include "server/key_cache.h"

#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(KeyListCacheTest, StoredListsAreFoundByDigestAndCount) {
  KeyListCache cache(1 << 20);
  const std::vector<uint64_t> keys = {5, 9, 1, 5};
  const uint64_t d = KeyListDigest(keys);
  ASSERT_TRUE(cache.Store(7, 3, d, keys).ok());
  KeyListCache::List* found = cache.Find(7, 3, d, keys.size());
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->keys, keys);
  EXPECT_EQ(found->owned_epoch, KeyListCache::kNever);
  EXPECT_EQ(cache.Stored(7, 3), found);
  EXPECT_EQ(cache.bytes(), 32);
  // Another sender, slot, digest or count finds nothing.
  EXPECT_EQ(cache.Find(8, 3, d, 4), nullptr);
  EXPECT_EQ(cache.Find(7, 4, d, 4), nullptr);
  EXPECT_EQ(cache.Find(7, 3, d ^ 1, 4), nullptr);
  EXPECT_EQ(cache.Find(7, 3, d, 3), nullptr);
  EXPECT_EQ(cache.Find(7, 0, d, 4), nullptr);
  EXPECT_EQ(cache.Find(7, kKeyListSlots + 1, d, 4), nullptr);
}

TEST(KeyListCacheTest, DigestsDependOnOrderAndCount) {
  EXPECT_NE(KeyListDigest(std::vector<uint64_t>{1, 2}), KeyListDigest(std::vector<uint64_t>{2, 1}));
  EXPECT_NE(KeyListDigest(std::vector<uint64_t>{0}), KeyListDigest(std::vector<uint64_t>{0, 0}));
  EXPECT_NE(KeyListDigest({}), 0u);
  std::vector<uint64_t> many(1001, 3);
  const uint64_t d = KeyListDigest(many);
  many[1000] = 4;  // the tail, past the 4-wide lanes
  EXPECT_NE(KeyListDigest(many), d);
}

TEST(KeyListCacheTest, AStoreReplacesTheSlotAndAWrongDigestEmptiesIt) {
  KeyListCache cache(1 << 20);
  const std::vector<uint64_t> a = {1, 2, 3}, b = {4, 5};
  ASSERT_TRUE(cache.Store(1, 1, KeyListDigest(a), a).ok());
  // The rows a table found for a (RowMemo) do not carry over to b.
  KeyListCache::List* list_a = cache.Stored(1, 1);
  ASSERT_NE(list_a, nullptr);
  list_a->rows.generation = 9;
  list_a->rows.rows = {4, 5, 6};
  ASSERT_TRUE(cache.Store(1, 1, KeyListDigest(b), b).ok());
  EXPECT_EQ(cache.Find(1, 1, KeyListDigest(a), 3), nullptr);
  KeyListCache::List* list_b = cache.Find(1, 1, KeyListDigest(b), 2);
  ASSERT_NE(list_b, nullptr);
  EXPECT_EQ(list_b->rows.generation, 0u);
  EXPECT_TRUE(list_b->rows.rows.empty());
  EXPECT_EQ(cache.bytes(), 16);
  // A lying digest is refused and the slot no longer holds b.
  EXPECT_EQ(cache.Store(1, 1, 12345, a).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Find(1, 1, KeyListDigest(b), 2), nullptr);
  EXPECT_EQ(cache.bytes(), 0);
}

TEST(KeyListCacheTest, ABudgetBoundsEachSender) {
  KeyListCache cache(80);  // 10 keys per sender
  const std::vector<uint64_t> six(6, 1), four(4, 2), one = {3};
  ASSERT_TRUE(cache.Store(1, 1, KeyListDigest(six), six).ok());
  ASSERT_TRUE(cache.Store(1, 2, KeyListDigest(four), four).ok());
  EXPECT_EQ(cache.Store(1, 3, KeyListDigest(one), one).code(),
            absl::StatusCode::kInvalidArgument);
  // Another sender has its own budget; replacing a slot frees its bytes.
  EXPECT_TRUE(cache.Store(2, 3, KeyListDigest(one), one).ok());
  EXPECT_TRUE(cache.Store(1, 1, KeyListDigest(one), one).ok());
  EXPECT_TRUE(cache.Store(1, 3, KeyListDigest(one), one).ok());
  EXPECT_EQ(cache.bytes(), 8 * (1 + 4 + 1 + 1));
}

TEST(KeyListCacheTest, RetainForgetsDepartedSendersAndOffRefusesStores) {
  KeyListCache cache(1 << 20);
  const std::vector<uint64_t> k = {1};
  ASSERT_TRUE(cache.Store(1, 1, KeyListDigest(k), k).ok());
  ASSERT_TRUE(cache.Store(2, 1, KeyListDigest(k), k).ok());
  cache.Retain({2});
  EXPECT_EQ(cache.Find(1, 1, KeyListDigest(k), 1), nullptr);
  ASSERT_NE(cache.Find(2, 1, KeyListDigest(k), 1), nullptr);
  EXPECT_EQ(cache.bytes(), 8);
  KeyListCache off(-1);
  EXPECT_FALSE(off.Store(1, 1, KeyListDigest(k), k).ok());
}

}  // namespace
}  // namespace ps
