#include "server/disk_tier.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/testing/tier_damage.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/disk_tier_", name, "_",
                      getpid());
}

DiskTier::Options SmallOptions(const std::string& name) {
  DiskTier::Options o;
  o.dir = TestDir(name);
  o.state_floats = 6;
  o.table_id = 3;
  o.num_slots = 64;
  o.memory_bytes = 2 << 20;
  return o;
}

std::vector<float> StateOf(uint64_t key, size_t n) {
  std::vector<float> s(n);
  for (size_t i = 0; i < n; ++i) {
    s[i] = static_cast<float>(key % 1000) * 0.001f + static_cast<float>(i);
  }
  // Values whose bits a conversion could lose.
  s[0] = -0.0f;
  s[1] = std::numeric_limits<float>::denorm_min();
  return s;
}

TEST(DiskTierTest, ARowComesBackBitForBitWithItsTag) {
  auto tier = DiskTier::Open(SmallOptions("roundtrip"));
  ASSERT_TRUE(tier.ok()) << tier.status();
  const std::vector<float> state = StateOf(77, 6);
  ColdRowTag tag{123456789012ULL, 4000000000u, 17};
  ASSERT_TRUE(*(*tier)->Put(77, state.data(), tag));
  EXPECT_EQ((*tier)->rows(), 1u);

  std::vector<float> back(6, 9.0f);
  ColdRowTag got;
  auto found = (*tier)->Get(77, back.data(), &got);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(*found);
  EXPECT_EQ(std::memcmp(back.data(), state.data(), 6 * sizeof(float)), 0);
  EXPECT_TRUE(std::signbit(back[0]));
  EXPECT_EQ(got.last_step, tag.last_step);
  EXPECT_EQ(got.last_second, tag.last_second);
  EXPECT_EQ(got.touches, tag.touches);

  auto missing = (*tier)->Get(78, back.data(), &got);
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(*missing);

  ASSERT_TRUE((*tier)->Delete(77).ok());
  EXPECT_EQ((*tier)->rows(), 0u);
  EXPECT_FALSE(*(*tier)->Get(77, back.data(), &got));
  const DiskTierCounters c = (*tier)->Counters();
  EXPECT_EQ(c.demotions, 1u);
  EXPECT_EQ(c.cold_reads, 1u);
  EXPECT_EQ(c.cold_misses, 2u);
}

TEST(DiskTierTest, MultiGetReadsManyRowsThroughFlushedFiles) {
  DiskTier::Options o = SmallOptions("multiget");
  auto tier = DiskTier::Open(o);
  ASSERT_TRUE(tier.ok()) << tier.status();
  // Far more than the memtables hold, so most rows are read from files.
  constexpr uint64_t kRows = 40000;
  for (uint64_t k = 0; k < kRows; ++k) {
    const std::vector<float> s = StateOf(k * 7919, 6);
    ASSERT_TRUE(*(*tier)->Put(k * 7919, s.data(), ColdRowTag{k, 0, 1}));
  }
  EXPECT_GT((*tier)->DiskBytes(), 0u);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < kRows; k += 97) keys.push_back(k * 7919);
  keys.push_back(5);  // never stored
  std::vector<float> states(keys.size() * 6);
  std::vector<ColdRowTag> tags(keys.size());
  std::vector<bool> found;
  ASSERT_TRUE((*tier)->MultiGet(keys, states.data(), tags.data(), &found).ok());
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    ASSERT_TRUE(found[i]) << keys[i];
    const std::vector<float> want = StateOf(keys[i], 6);
    ASSERT_EQ(std::memcmp(&states[i * 6], want.data(), 6 * sizeof(float)), 0);
    EXPECT_EQ(tags[i].last_step, keys[i] / 7919);
  }
  EXPECT_FALSE(found.back());
  // The tier's RAM stays near what it was given.
  EXPECT_LE((*tier)->MemoryBytes(), 2 * o.memory_bytes);
}

TEST(DiskTierTest, RowsOfOneSlotAreOneRangeAndLeaveTogether) {
  DiskTier::Options o = SmallOptions("slots");
  auto tier = DiskTier::Open(o);
  ASSERT_TRUE(tier.ok()) << tier.status();
  const uint64_t key = 0x0102030405060708ULL;
  const std::string stored = (*tier)->StoredKey(key);
  ASSERT_EQ(stored.size(), 12u);
  const uint32_t slot = SparseSlot(o.table_id, key, o.num_slots);
  EXPECT_EQ(static_cast<unsigned char>(stored[3]), slot);
  EXPECT_EQ(stored.substr(4),
            std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));

  std::vector<uint64_t> per_slot(o.num_slots, 0);
  for (uint64_t k = 1; k <= 5000; ++k) {
    const std::vector<float> s = StateOf(k, 6);
    ASSERT_TRUE(*(*tier)->Put(k, s.data(), ColdRowTag{}));
    ++per_slot[SparseSlot(o.table_id, k, o.num_slots)];
  }
  std::vector<bool> leaving(o.num_slots, false);
  leaving[5] = leaving[6] = leaving[63] = true;
  // A read of some slots gives their rows, whole, and nothing else.
  std::vector<uint64_t> read_keys;
  ASSERT_TRUE(
      (*tier)
          ->ForEachRow(
              100,
              [&](absl::Span<const uint64_t> keys,
                  absl::Span<const float> states) {
                for (size_t i = 0; i < keys.size(); ++i) {
                  EXPECT_TRUE(
                      leaving[SparseSlot(o.table_id, keys[i], o.num_slots)]);
                  const std::vector<float> want = StateOf(keys[i], 6);
                  EXPECT_EQ(std::memcmp(&states[i * 6], want.data(),
                                        6 * sizeof(float)),
                            0);
                }
                read_keys.insert(read_keys.end(), keys.begin(), keys.end());
                return absl::OkStatus();
              },
              &leaving)
          .ok());
  EXPECT_EQ(read_keys.size(), per_slot[5] + per_slot[6] + per_slot[63]);
  // The tier counts its rows per slot (the planner's bytes per slot).
  for (uint32_t slot = 0; slot < o.num_slots; ++slot)
    ASSERT_EQ((*tier)->slot_rows(slot), per_slot[slot]) << slot;
  auto removed = (*tier)->DeleteSlots(leaving);
  ASSERT_TRUE(removed.ok()) << removed.status();
  for (uint32_t slot = 0; slot < o.num_slots; ++slot) {
    ASSERT_EQ((*tier)->slot_rows(slot), leaving[slot] ? 0 : per_slot[slot])
        << slot;
  }
  EXPECT_EQ(*removed, per_slot[5] + per_slot[6] + per_slot[63]);
  EXPECT_EQ((*tier)->rows(), 5000 - *removed);
  std::vector<float> back(6);
  ColdRowTag tag;
  for (uint64_t k = 1; k <= 5000; ++k) {
    const bool gone = leaving[SparseSlot(o.table_id, k, o.num_slots)];
    ASSERT_EQ(*(*tier)->Get(k, back.data(), &tag), !gone) << k;
  }
}

TEST(DiskTierTest, RowsPastMaxDiskBytesAreRefused) {
  DiskTier::Options o = SmallOptions("cap");
  auto probe = DiskTier::Open(o);
  ASSERT_TRUE(probe.ok());
  o.max_disk_bytes = 10 * (*probe)->RowBytes();
  probe->reset();
  auto tier = DiskTier::Open(o);
  ASSERT_TRUE(tier.ok());
  const std::vector<float> s = StateOf(1, 6);
  for (uint64_t k = 0; k < 10; ++k) ASSERT_TRUE(*(*tier)->Put(k, s.data(), {}));
  EXPECT_FALSE(*(*tier)->Put(10, s.data(), {}));
  EXPECT_EQ((*tier)->rows(), 10u);
  EXPECT_EQ((*tier)->Counters().cold_rows_dropped, 1u);
  ASSERT_TRUE((*tier)->Delete(3).ok());
  EXPECT_TRUE(*(*tier)->Put(10, s.data(), {}));
}

TEST(DiskTierTest, ACorruptedFileIsAnErrorNeverAWrongRow) {
  auto tier = DiskTier::Open(SmallOptions("corrupt"));
  ASSERT_TRUE(tier.ok()) << tier.status();
  constexpr uint64_t kRows = 40000;
  for (uint64_t k = 0; k < kRows; ++k) {
    const std::vector<float> s = StateOf(k, 6);
    ASSERT_TRUE(*(*tier)->Put(k, s.data(), ColdRowTag{k, 0, 1}));
  }
  size_t errors = 0, data_loss = 0, right = 0;
  std::vector<float> back(6);
  for (int round = 0; round < 5 && data_loss == 0; ++round) {
    ASSERT_GT(testing::CorruptTierFiles(SmallOptions("corrupt").dir), 0);
    for (uint64_t k = round; k < kRows; k += 7) {
      ColdRowTag tag;
      absl::StatusOr<bool> found = (*tier)->Get(k, back.data(), &tag);
      if (!found.ok()) {
        ++errors;
        if (found.status().code() == absl::StatusCode::kDataLoss) ++data_loss;
        continue;
      }
      // Rows still in a memtable, or in a block the damage missed, are read
      // whole; none is read wrong or missing.
      ASSERT_TRUE(*found) << k;
      const std::vector<float> want = StateOf(k, 6);
      ASSERT_EQ(std::memcmp(back.data(), want.data(), 6 * sizeof(float)), 0)
          << k;
      ++right;
    }
  }
  EXPECT_GT(data_loss, 0u) << errors << " errors, " << right << " rows read";
  EXPECT_GE((*tier)->Counters().errors, errors);
}

TEST(DiskTierTest, OpenEmptiesTheDirectoryAndTheTierRemovesIt) {
  DiskTier::Options o = SmallOptions("wipe");
  std::filesystem::create_directories(o.dir);
  { std::ofstream(o.dir + "/left-by-a-crash") << "stale"; }
  {
    auto tier = DiskTier::Open(o);
    ASSERT_TRUE(tier.ok()) << tier.status();
    EXPECT_FALSE(std::filesystem::exists(o.dir + "/left-by-a-crash"));
    const std::vector<float> s = StateOf(1, 6);
    ASSERT_TRUE(*(*tier)->Put(1, s.data(), {}));
  }
  EXPECT_FALSE(std::filesystem::exists(o.dir));
  // A new tier in the same place starts empty.
  auto again = DiskTier::Open(o);
  ASSERT_TRUE(again.ok());
  std::vector<float> back(6);
  ColdRowTag tag;
  EXPECT_FALSE(*(*again)->Get(1, back.data(), &tag));
}

TEST(DiskTierTest, BadOptionsAndFileSystemsWithoutDirectIoAreClearErrors) {
  DiskTier::Options o = SmallOptions("bad");
  o.memory_bytes = 1000;
  EXPECT_EQ(DiskTier::Open(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = SmallOptions("bad");
  o.dir.clear();
  EXPECT_EQ(DiskTier::Open(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  if (std::filesystem::exists("/dev/shm")) {
    o = SmallOptions("shm");
    o.dir = absl::StrCat("/dev/shm/disk_tier_test_", getpid());
    auto tier = DiskTier::Open(o);
    if (!tier.ok()) {
      EXPECT_EQ(tier.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(std::string(tier.status().message()),
                  HasSubstr("buffered_io"));
      o.buffered_io = true;
      auto buffered = DiskTier::Open(o);
      EXPECT_TRUE(buffered.ok()) << buffered.status();
    }
    std::filesystem::remove_all(o.dir);
  }
}

}  // namespace
}  // namespace ps
