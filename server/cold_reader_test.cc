#include "server/cold_reader.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/disk_tier.h"

namespace ps {
namespace {

constexpr size_t kFloats = 4;

std::unique_ptr<DiskTier> OpenTier(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  DiskTier::Options o;
  o.dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/cold_reader_", name,
                       "_", getpid());
  o.state_floats = kFloats;
  o.num_slots = 64;
  o.memory_bytes = 1 << 20;
  o.buffered_io = true;  // tmpfs has no direct I/O
  auto tier = DiskTier::Open(o);
  EXPECT_TRUE(tier.ok()) << tier.status();
  return tier.ok() ? std::move(*tier) : nullptr;
}

std::vector<float> StateOf(uint64_t key) {
  return {static_cast<float>(key), 1.0f, 2.0f, -static_cast<float>(key)};
}

void Put(DiskTier& tier, uint64_t key, uint64_t step) {
  const std::vector<float> s = StateOf(key);
  ASSERT_TRUE(tier.Put(key, s.data(), ColdRowTag{step, 0, 1}).ok());
}

// Installs batches until `batch` is, waiting for the reader.
void InstallUpTo(ColdReader& reader, uint64_t batch) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (reader.installed() < batch && absl::Now() < deadline) {
    absl::Status error;
    if (!reader.InstallOne(&error)) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_TRUE(error.ok()) << error;
  }
  ASSERT_GE(reader.installed(), batch);
}

TEST(ColdReaderTest, ReadsABatchOffTheCallersThreadAndStagesItsRows) {
  std::unique_ptr<DiskTier> tier = OpenTier("stage");
  ASSERT_NE(tier, nullptr);
  for (uint64_t key = 1; key <= 50; ++key) Put(*tier, key, key);
  std::atomic<int> done{0};
  ColdReader reader(tier.get(), kFloats, 1000, [&] { done.fetch_add(1); });
  std::vector<uint64_t> keys;
  for (uint64_t key = 1; key <= 60; ++key)
    keys.push_back(key);  // 51..60 absent
  const uint64_t batch = reader.Submit(keys);
  EXPECT_EQ(batch, 1u);
  EXPECT_TRUE(reader.busy());
  uint64_t reading = 0;
  EXPECT_EQ(reader.Find(7, &reading), ColdReader::Where::kReading);
  EXPECT_EQ(reading, batch);
  // Keys already being read are not read twice.
  EXPECT_EQ(reader.Submit(std::vector<uint64_t>{3, 7}), 0u);
  InstallUpTo(reader, batch);
  EXPECT_FALSE(reader.busy());
  EXPECT_GE(done.load(), 1);
  EXPECT_EQ(reader.staged_rows(), 50u);
  EXPECT_EQ(reader.rows_read(), 50u);
  for (uint64_t key = 1; key <= 50; ++key) {
    ColdRowTag tag;
    const float* state = reader.Staged(key, &tag);
    ASSERT_NE(state, nullptr) << key;
    EXPECT_EQ(std::vector<float>(state, state + kFloats), StateOf(key));
    EXPECT_EQ(tag.last_step, key);
    EXPECT_EQ(reader.Find(key, &reading), ColdReader::Where::kStaged);
  }
  ColdRowTag tag;
  EXPECT_EQ(reader.Staged(55, &tag), nullptr);
  EXPECT_EQ(reader.Find(55, &reading), ColdReader::Where::kNone);
}

TEST(ColdReaderTest, ARowWrittenWhileItsReadIsInFlightIsNeverStaged) {
  std::unique_ptr<DiskTier> tier = OpenTier("stale");
  ASSERT_NE(tier, nullptr);
  for (uint64_t key = 1; key <= 20; ++key) Put(*tier, key, 1);
  // The reader's `done` blocks until the test has written: the batch is
  // certainly in flight when the table changes the rows.
  absl::Notification written;
  ColdReader reader(tier.get(), kFloats, 1000,
                    [&] { written.WaitForNotification(); });
  std::vector<uint64_t> keys = {1, 2, 3, 4};
  const uint64_t batch = reader.Submit(keys);
  // Key 2 is promoted (deleted from the tier), key 3 deleted and stored
  // again with another state: the batch's copies of both are stale.
  reader.Invalidate(2);
  ASSERT_TRUE(tier->Delete(2).ok());
  reader.Invalidate(3);
  ASSERT_TRUE(tier->Delete(3).ok());
  Put(*tier, 3, 9);
  written.Notify();
  InstallUpTo(reader, batch);
  ColdRowTag tag;
  EXPECT_NE(reader.Staged(1, &tag), nullptr);
  EXPECT_EQ(reader.Staged(2, &tag), nullptr);
  EXPECT_EQ(reader.Staged(3, &tag), nullptr);
  EXPECT_NE(reader.Staged(4, &tag), nullptr);
  // A staged row written later goes too.
  reader.Invalidate(4);
  EXPECT_EQ(reader.Staged(4, &tag), nullptr);
  // Read again, key 3 is staged with what the tier holds now.
  InstallUpTo(reader, reader.Submit(std::vector<uint64_t>{3}));
  ASSERT_NE(reader.Staged(3, &tag), nullptr);
  EXPECT_EQ(tag.last_step, 9u);
}

TEST(ColdReaderTest, RowsStayTillTheirRequestsRanOrWhilePinned) {
  std::unique_ptr<DiskTier> tier = OpenTier("cap");
  ASSERT_NE(tier, nullptr);
  for (uint64_t key = 1; key <= 45; ++key) Put(*tier, key, 1);
  ColdReader reader(tier.get(), kFloats, 10, nullptr);
  ColdRowTag tag;
  // A batch's rows stay until the requests waiting for them ran (the
  // caller's Trim), then go, unless a request kept to run again pinned
  // them.
  InstallUpTo(reader, reader.Submit(std::vector<uint64_t>{41, 42, 43}));
  EXPECT_FALSE(reader.last_promote());
  EXPECT_EQ(reader.last_staged(), (std::vector<uint64_t>{41, 42, 43}));
  EXPECT_EQ(reader.staged_rows(), 3u);
  reader.Pin(std::vector<uint64_t>{42});
  reader.Trim();
  EXPECT_EQ(reader.staged_rows(), 1u);
  EXPECT_EQ(reader.Staged(41, &tag), nullptr);
  EXPECT_NE(reader.Staged(42, &tag), nullptr);
  // Pins count: two pins need two unpins.
  reader.Pin(std::vector<uint64_t>{42});
  reader.Unpin(std::vector<uint64_t>{42});
  reader.Trim();
  EXPECT_NE(reader.Staged(42, &tag), nullptr);
  reader.Unpin(std::vector<uint64_t>{42});
  EXPECT_EQ(reader.pinned_rows(), 0u);
  // A batch to promote is told so; the next install drops its rows.
  std::vector<uint64_t> ahead;
  for (uint64_t key = 1; key <= 20; ++key) ahead.push_back(key);
  InstallUpTo(reader, reader.Submit(ahead, /*promote=*/true));
  EXPECT_TRUE(reader.last_promote());
  EXPECT_EQ(reader.last_staged().size(), 20u);
  // Twenty rows, past max_staged_rows until Trim.
  EXPECT_EQ(reader.staged_rows(), 21u);
  reader.Trim();
  EXPECT_EQ(reader.staged_rows(), 1u);  // the unpinned 42, below the cap
  // A pinned row the table writes goes at once.
  InstallUpTo(reader, reader.Submit(std::vector<uint64_t>{40}));
  reader.Pin(std::vector<uint64_t>{40});
  reader.Invalidate(40);
  EXPECT_EQ(reader.pinned_rows(), 0u);
  EXPECT_EQ(reader.Staged(40, &tag), nullptr);
  EXPECT_LT(reader.MemoryBytes(), size_t{64} << 10);
}

}  // namespace
}  // namespace ps
