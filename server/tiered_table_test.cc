// A sparse table with a disk tier against the same table without a budget:
// demotion and promotion must change no parameter and no optimizer state.
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/initializer.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "server/checkpoint.h"
#include "server/table.h"
#include "server/testing/tier_damage.h"

namespace ps {
namespace {

std::string TierDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tiered_table_",
                      getpid());
}

TableConfig Config(const std::string& optimizer, const std::string& sparse) {
  TableConfig tc;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      absl::StrCat(
          "id: 4 name: \"emb\" optimizer { ", optimizer, " } sparse { ", sparse,
          " } init { kind: ",
          absl::StrContains(optimizer, "ftrl") ? "ZEROS" : "UNIFORM scale: 0.1",
          " }"),
      &tc));
  JobConfig job;
  *job.add_tables() = tc;
  ApplyDefaults(&job);
  return job.tables(0);
}

// Adagrad (learning rate 0.1) of dimension `dim`, with a 1 MiB budget,
// `eviction` and a disk tier in `dir` (`tier`: more of its fields).
TableConfig TieredAdagrad(int dim, const std::string& eviction,
                          const std::string& dir,
                          const std::string& tier = "") {
  return Config(
      "adagrad { learning_rate: 0.1 }",
      absl::StrCat("dim: ", dim,
                   " admit_after_pushes: 1 memory_budget_bytes: "
                   "1048576 eviction: ",
                   eviction, " disk_tier { dir: \"", dir, "\" ", tier, " }"));
}

// The keys Mix64(0), ..., Mix64(n - 1).
std::vector<uint64_t> MixedKeys(size_t n) {
  std::vector<uint64_t> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = Mix64(i);
  return keys;
}

std::unique_ptr<SparseTable> Create(const TableConfig& tc) {
  auto t = Table::Create(tc);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return nullptr;
  return std::unique_ptr<SparseTable>(static_cast<SparseTable*>(t->release()));
}

// key -> full state of every row, in RAM and on disk.
std::map<uint64_t, std::vector<float>> AllRows(const SparseTable& t) {
  std::map<uint64_t, std::vector<float>> rows;
  const size_t stride = t.state_floats();
  std::vector<uint64_t> keys;
  std::vector<float> state;
  uint64_t cursor = 0;
  do {
    keys.clear();
    state.clear();
    cursor = t.ExportRows(cursor, 4096, &keys, &state);
    for (size_t i = 0; i < keys.size(); ++i) {
      rows[keys[i]].assign(state.begin() + i * stride,
                           state.begin() + (i + 1) * stride);
    }
  } while (cursor != 0);
  EXPECT_TRUE(t.ExportColdRows(1000, [&](absl::Span<const uint64_t> k,
                                         absl::Span<const float> s) {
                 for (size_t i = 0; i < k.size(); ++i) {
                   EXPECT_EQ(rows.count(k[i]), 0u)
                       << "key " << k[i] << " in RAM and on disk";
                   rows[k[i]].assign(s.begin() + i * stride,
                                     s.begin() + (i + 1) * stride);
                 }
                 return absl::OkStatus();
               }).ok());
  return rows;
}

// A seeded training-like sequence: each step pulls a batch (half from a
// set larger than the budget holds, half from a large id space), then pushes
// gradients for it, with a key-list memo on odd steps (the key cache's path)
// and without on even ones. Pulls must match bit for bit at every step.
void RunSameSequence(SparseTable& plain, SparseTable& tiered, int steps,
                     size_t batch, uint64_t space, uint64_t seed) {
  const uint32_t dim = plain.dim();
  uint64_t rng = seed;
  std::vector<uint64_t> keys(batch);
  std::vector<float> grads(batch * dim);
  std::vector<float> a(batch * dim), b(batch * dim);
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < batch; ++i) {
      rng = Mix64(rng + i);
      keys[i] = (rng & 1) ? (rng >> 8) % (space / 20) : (rng >> 8) % space;
      for (uint32_t d = 0; d < dim; ++d) {
        grads[i * dim + d] =
            static_cast<float>(static_cast<int>((rng >> (d % 40)) % 2001) -
                               1000) /
            4000.0f;
      }
    }
    const absl::Time now = absl::FromUnixSeconds(1000 + step);
    plain.Advance(step, now);
    tiered.Advance(step, now);
    RowMemo memo_a, memo_b;
    const bool memo = step % 2 == 1;
    plain.Pull(keys, a.data(), memo ? &memo_a : nullptr);
    tiered.Pull(keys, b.data(), memo ? &memo_b : nullptr);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
        << "step " << step;
    const float lr_scale = 1.0f / static_cast<float>(1 + step % 3);
    plain.Push(keys, grads.data(), lr_scale, memo ? &memo_a : nullptr);
    tiered.Push(keys, grads.data(), lr_scale, memo ? &memo_b : nullptr);
  }
}

class TieredTableTest : public ::testing::TestWithParam<const char*> {
 protected:
  void TearDown() override { std::filesystem::remove_all(TierDir()); }
};

TEST_P(TieredTableTest, DemotedRowsComeBackBitForBit) {
  const std::string optimizer = GetParam();
  const TableConfig plain_config =
      Config(optimizer, "dim: 16 admit_after_pushes: 1");
  const TableConfig tiered_config = Config(
      optimizer,
      absl::StrCat("dim: 16 admit_after_pushes: 1 memory_budget_bytes: 1048576 "
                   "eviction: EVICT_LFU disk_tier { dir: \"",
                   TierDir(), "\" buffered_io: true }"));
  auto plain = Create(plain_config);
  auto tiered = Create(tiered_config);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(tiered, nullptr);
  ASSERT_NE(tiered->disk_tier(), nullptr);
  RunSameSequence(*plain, *tiered, 30, 5000, 300000, 7);

  const auto want = AllRows(*plain);
  const auto got = AllRows(*tiered);
  ASSERT_EQ(got.size(), want.size());
  size_t differing = 0;
  for (const auto& [key, state] : want) {
    auto it = got.find(key);
    ASSERT_NE(it, got.end()) << key;
    if (std::memcmp(it->second.data(), state.data(),
                    state.size() * sizeof(float)) != 0) {
      ++differing;
    }
  }
  EXPECT_EQ(differing, 0u);

  // Most rows live on disk, and rows went down and came back many times.
  const TableStats s = tiered->Stats();
  EXPECT_EQ(s.rows() + s.cold_rows(), want.size());
  EXPECT_LT(s.rows() * 8, want.size())
      << "the budget should hold a few percent";
  EXPECT_GT(s.demotions(), want.size());
  EXPECT_GT(s.promotions(), want.size() / 4);
  EXPECT_EQ(s.demotions() - s.promotions(), s.cold_rows());
  EXPECT_EQ(s.tier_errors(), 0u);
  EXPECT_EQ(s.admissions(), plain->counters().admissions);
  EXPECT_EQ(s.pushes_filtered(), plain->counters().pushes_filtered);
  EXPECT_LE(s.bytes(), tiered_config.sparse().memory_budget_bytes() * 5 / 4);
  std::printf(
      "[ measured ] %s: %zu rows, %llu in RAM, %llu demotions, %llu "
      "promotions, "
      "%llu cold reads, %llu disk reads, %llu B on disk\n",
      optimizer.c_str(), want.size(), static_cast<unsigned long long>(s.rows()),
      static_cast<unsigned long long>(s.demotions()),
      static_cast<unsigned long long>(s.promotions()),
      static_cast<unsigned long long>(s.cold_reads()),
      static_cast<unsigned long long>(s.disk_reads()),
      static_cast<unsigned long long>(s.disk_bytes()));
}

INSTANTIATE_TEST_SUITE_P(
    EveryOptimizer, TieredTableTest,
    ::testing::Values(
        "sgd { learning_rate: 0.5 }",
        "momentum { learning_rate: 0.1 momentum: 0.9 nesterov: true }",
        "adagrad { learning_rate: 0.1 }", "adam { learning_rate: 0.01 }",
        "ftrl { alpha: 0.5 l1: 0.01 }"),
    [](const ::testing::TestParamInfo<const char*>& info) {
      return std::string(info.param)
          .substr(0, std::string(info.param).find(' '));
    });

TEST(TieredTableTtlTest, AColdRowPastItsTtlReadsAsNew) {
  const std::string dir = TierDir() + "_ttl";
  const TableConfig tc =
      Config("sgd { learning_rate: 0.5 }",
             absl::StrCat("dim: 4 admit_after_pushes: 1 ttl_steps: 10 "
                          "memory_budget_bytes: 1048576 "
                          "eviction: EVICT_LRU disk_tier { dir: \"",
                          dir, "\" }"));
  auto t = Create(tc);
  ASSERT_NE(t, nullptr);
  const size_t n = t->max_rows() + 100;
  std::vector<uint64_t> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = i + 1;
  std::vector<float> grads(n * 4, 1.0f);
  t->Advance(1, absl::FromUnixSeconds(1));
  t->Push(keys, grads.data());  // the first 100 keys are demoted
  ASSERT_EQ(t->Stats().cold_rows(), 100u);
  std::vector<float> fresh(4), cold(4);
  InitializeValues(tc.init(), tc.id(), 1, 0, 4, fresh.data());
  t->Pull(std::vector<uint64_t>{1}, cold.data());
  EXPECT_NE(std::memcmp(fresh.data(), cold.data(), sizeof(float) * 4), 0)
      << "within its TTL the cold row is read from disk";
  // Pulled, key 1 came into RAM, and another row went to disk.
  EXPECT_EQ(t->Stats().cold_rows(), 100u);
  EXPECT_EQ(t->Stats().promotions(), 1u);
  t->Advance(20, absl::FromUnixSeconds(2));
  // Key 2 is still cold, and past its TTL.
  InitializeValues(tc.init(), tc.id(), 2, 0, 4, fresh.data());
  t->Pull(std::vector<uint64_t>{2}, cold.data());
  EXPECT_EQ(std::memcmp(fresh.data(), cold.data(), sizeof(float) * 4), 0);
  EXPECT_EQ(t->Stats().cold_rows(), 99u);
  EXPECT_EQ(t->Stats().promotions(), 1u);
  std::filesystem::remove_all(dir);
}

TEST(TieredTableFailureTest, ADamagedTierIsReportedAndNotTrustedAgain) {
  const std::string dir = TierDir() + "_damaged";
  const TableConfig tc =
      TieredAdagrad(16, "EVICT_LRU", dir, "buffered_io: true");
  auto t = Create(tc);
  ASSERT_NE(t, nullptr);
  const size_t n = 20000;
  const std::vector<uint64_t> keys = MixedKeys(n);
  std::vector<float> grads(n * 16, 0.01f);
  t->Push(keys, grads.data());
  ASSERT_GT(t->Stats().cold_rows(), n / 2);
  EXPECT_TRUE(t->tier_failure().ok());
  // Reading the cold rows back meets the damage.
  std::vector<float> out(n * 16);
  for (int round = 0; round < 5 && t->tier_failure().ok(); ++round) {
    ASSERT_GT(testing::CorruptTierFiles(dir), 0);
    t->Pull(keys, out.data());
  }
  EXPECT_EQ(t->tier_failure().code(), absl::StatusCode::kDataLoss)
      << t->tier_failure();
  EXPECT_NE(t->tier_failure().message().find("disk tier of table 'emb'"),
            std::string::npos)
      << t->tier_failure();
  EXPECT_GT(t->Stats().tier_errors(), 0u);
  // What restores or moves rows into the table refuses from then on.
  const std::vector<float> state(t->state_floats(), 0.5f);
  EXPECT_EQ(t->ImportRow(keys[0], state).code(), absl::StatusCode::kDataLoss);
  t.reset();
  std::filesystem::remove_all(dir);
}

TEST(TieredTableCheckpointTest,
     ACheckpointHoldsTheColdRowsAndRestoresOntoAPlainTable) {
  const std::string dir = TierDir() + "_ckpt";
  const TableConfig tc = TieredAdagrad(8, "EVICT_LFU", dir);
  auto t = Create(tc);
  ASSERT_NE(t, nullptr);
  const std::vector<uint64_t> keys = MixedKeys(20000);
  std::vector<float> grads(keys.size() * 8, 0.25f);
  t->Push(keys, grads.data());
  ASSERT_GT(t->Stats().cold_rows(), 10000u);
  const Table* tables[] = {t.get()};
  const ParameterDigest before = DigestTables(tables);
  EXPECT_EQ(before.sparse_rows, keys.size());

  auto shard = WriteShard(dir + "/ckpt", 0, 5, 64, tables);
  ASSERT_TRUE(shard.ok()) << shard.status();
  CheckpointManifest manifest;
  manifest.set_clock(5);
  manifest.set_num_servers(1);
  manifest.set_num_slots(64);
  *manifest.add_shards() = *shard;
  for (const TableConfig& target_config :
       {Config("adagrad { learning_rate: 0.1 }",
               "dim: 8 admit_after_pushes: 1"),
        tc}) {
    auto target = Create(target_config);
    ASSERT_NE(target, nullptr);
    Table* targets[] = {target.get()};
    auto restored =
        RestoreShards(dir + "/ckpt", manifest, targets, RowFilter{});
    ASSERT_TRUE(restored.ok()) << restored.status();
    const Table* restored_tables[] = {target.get()};
    EXPECT_EQ(DigestTables(restored_tables), before);
  }
  std::filesystem::remove_all(dir);
}

// A hint (PREFETCH) larger than RAM promotes only the first keys that
// half of it holds: more would evict what it promoted itself.
TEST(TieredTablePrefetchTest, AHintPromotesAtMostHalfOfWhatRamHolds) {
  const std::string dir = TierDir() + "_hint";
  auto t = Create(TieredAdagrad(8, "EVICT_LRU", dir, "buffered_io: true"));
  ASSERT_NE(t, nullptr);
  std::atomic<int> batches{0};
  t->StartColdReader([&] { ++batches; });
  const size_t max_rows = t->max_rows();
  const std::vector<uint64_t> keys = MixedKeys(3 * max_rows);
  std::vector<float> grads(keys.size() * 8, 0.25f);
  t->Push(keys, grads.data());
  // The first keys were demoted by the later ones.
  const uint64_t promoted_before = t->Stats().promotions();
  const std::vector<uint64_t> hint(keys.begin(), keys.begin() + 2 * max_rows);
  const uint64_t batch = t->ColdWait(hint, /*promote=*/true);
  ASSERT_GT(batch, 0u);
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (t->cold_reader()->installed() < batch && absl::Now() < give_up) {
    if (!t->InstallColdReads()) absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_GE(t->cold_reader()->installed(), batch);
  const uint64_t promoted = t->Stats().promotions() - promoted_before;
  EXPECT_GT(promoted, max_rows / 4);
  EXPECT_LE(promoted, max_rows / 2);
  // They are the hint's first keys, all in RAM now.
  for (size_t i = 0; i < promoted; ++i)
    EXPECT_FALSE(t->RowState(hint[i]).empty()) << i;
  t.reset();
  std::filesystem::remove_all(dir);
}

// A shard written in parts holds the rows as they were at Begin, those in
// RAM and those on disk, while the table goes on changing (every row
// pushed again, promoted and demoted) as Finish runs on another thread.
TEST(TieredTableCheckpointTest,
     AShardWrittenInPartsHoldsItsCutWhileTheTableGoesOn) {
  const std::string dir = TierDir() + "_parts";
  const TableConfig tc = TieredAdagrad(8, "EVICT_LFU", dir);
  TableConfig plain_config =
      Config("adagrad { learning_rate: 0.1 }", "dim: 8 admit_after_pushes: 1");
  plain_config.set_id(7);
  auto tiered = Create(tc);
  auto plain = Create(plain_config);
  ASSERT_NE(tiered, nullptr);
  ASSERT_NE(plain, nullptr);
  const std::vector<uint64_t> keys = MixedKeys(20000);
  std::vector<float> grads(keys.size() * 8, 0.25f);
  tiered->Push(keys, grads.data());
  plain->Push(absl::MakeConstSpan(keys).subspan(0, 500), grads.data());
  ASSERT_GT(tiered->Stats().cold_rows(), 10000u);
  // Half the keys, as a server's own slots would be.
  RowFilter keep;
  keep.sparse = [](uint32_t, uint64_t key) { return key % 2 == 0; };
  auto kept = [](std::map<uint64_t, std::vector<float>> rows) {
    for (auto it = rows.begin(); it != rows.end();) {
      it = it->first % 2 == 0 ? std::next(it) : rows.erase(it);
    }
    return rows;
  };
  const auto want_tiered = kept(AllRows(*tiered));
  const auto want_plain = kept(AllRows(*plain));

  // The tiered table comes first, so its cold rows go between the spill's
  // records of both tables.
  const Table* tables[] = {tiered.get(), plain.get()};
  auto write = ShardWriteInParts::Begin(dir + "/ckpt", dir + "/spill", 0, 5, 64,
                                        tables, keep);
  ASSERT_TRUE(write.ok()) << write.status();
  // Changed before Finish begins, and while it runs.
  std::vector<float> more(keys.size() * 8, -0.5f);
  auto change = [&] {
    tiered->Push(keys, more.data());
    plain->Push(absl::MakeConstSpan(keys).subspan(0, 500), more.data());
  };
  change();
  change();
  absl::StatusOr<ShardFile> shard = absl::UnknownError("not run");
  std::thread finish([&] { shard = (*write)->Finish(); });
  change();
  finish.join();
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_GT((*write)->cold_rows(), 5000u);
  EXPECT_GT((*write)->spilled_rows(), 500u);
  write->reset();
  EXPECT_TRUE(std::filesystem::is_empty(dir + "/spill"));

  CheckpointManifest manifest;
  manifest.set_clock(5);
  manifest.set_num_servers(1);
  manifest.set_num_slots(64);
  *manifest.add_shards() = *shard;
  TableConfig restored_tiered_config = plain_config;
  restored_tiered_config.set_id(4);
  auto restored_tiered = Create(restored_tiered_config);
  auto restored_plain = Create(plain_config);
  Table* targets[] = {restored_tiered.get(), restored_plain.get()};
  auto restored = RestoreShards(dir + "/ckpt", manifest, targets, RowFilter{});
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(AllRows(*restored_tiered) == want_tiered);
  EXPECT_TRUE(AllRows(*restored_plain) == want_plain);
  EXPECT_EQ(want_tiered.size() + want_plain.size(), restored->rows_restored);
  tiered.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ps
