#include "server/checkpoint.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/hash.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "proto/checkpoint.pb.h"
#include "proto/config.pb.h"
#include "server/table.h"
#include "server/table_rows.h"

namespace ps {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kNumSlots = 64;

// ------------------------------------------------------------- fixtures

AdamConfig Adam() {
  AdamConfig adam;
  adam.set_learning_rate(0.01f);
  adam.set_beta1(0.9f);
  adam.set_beta2(0.999f);
  adam.set_epsilon(1e-8f);
  return adam;
}

TableConfig AdagradSparse() {
  TableConfig c;
  c.set_id(1);
  c.set_name("emb_adagrad");
  c.mutable_sparse()->set_dim(4);
  c.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.1f);
  c.mutable_optimizer()->mutable_adagrad()->set_initial_accumulator(0.1f);
  c.mutable_optimizer()->mutable_adagrad()->set_epsilon(1e-8f);
  c.mutable_init()->set_kind(InitializerConfig::NORMAL);
  c.mutable_init()->set_scale(0.01f);
  return c;
}

// Evictable (a TTL), so its rows carry RowMeta.
TableConfig AdamSparseWithTtl() {
  TableConfig c;
  c.set_id(2);
  c.set_name("emb_adam_ttl");
  c.mutable_sparse()->set_dim(3);
  c.mutable_sparse()->set_ttl_steps(1000000);
  *c.mutable_optimizer()->mutable_adam() = Adam();
  c.mutable_init()->set_kind(InitializerConfig::UNIFORM);
  c.mutable_init()->set_scale(0.05f);
  return c;
}

// Budgeted with LRU eviction (RowMeta, chunks capped by the budget).
TableConfig FtrlSparseWithBudget() {
  TableConfig c;
  c.set_id(3);
  c.set_name("emb_ftrl_budget");
  c.mutable_sparse()->set_dim(2);
  c.mutable_sparse()->set_memory_budget_bytes(1 << 20);
  c.mutable_sparse()->set_eviction(EVICT_LRU);
  c.mutable_optimizer()->mutable_ftrl()->set_alpha(0.05f);
  c.mutable_optimizer()->mutable_ftrl()->set_beta(1.0f);
  return c;
}

TableConfig MomentumDense() {
  TableConfig c;
  c.set_id(4);
  c.set_name("mlp");
  c.mutable_dense()->set_size(1000);
  c.mutable_dense()->set_block_size(64);  // the last block is short
  c.mutable_optimizer()->mutable_momentum()->set_learning_rate(0.05f);
  c.mutable_optimizer()->mutable_momentum()->set_momentum(0.9f);
  c.mutable_init()->set_kind(InitializerConfig::NORMAL);
  c.mutable_init()->set_scale(0.1f);
  return c;
}

TableConfig AdamDense() {
  TableConfig c;
  c.set_id(5);
  c.set_name("bias");
  c.mutable_dense()->set_size(10);
  c.mutable_dense()->set_block_size(3);
  *c.mutable_optimizer()->mutable_adam() = Adam();
  return c;
}

std::vector<TableConfig> AllConfigs() {
  return {AdagradSparse(), AdamSparseWithTtl(), FtrlSparseWithBudget(),
          MomentumDense(), AdamDense()};
}

using Tables = std::vector<std::unique_ptr<Table>>;

Tables MakeTables(const std::vector<TableConfig>& configs) {
  Tables tables;
  for (const TableConfig& c : configs) {
    auto t = Table::Create(c);
    EXPECT_TRUE(t.ok()) << t.status();
    if (t.ok()) tables.push_back(std::move(t).value());
  }
  return tables;
}

std::vector<const Table*> ConstPtrs(const Tables& tables) {
  std::vector<const Table*> out;
  for (const auto& t : tables) out.push_back(t.get());
  return out;
}

std::vector<Table*> Ptrs(const Tables& tables) {
  std::vector<Table*> out;
  for (const auto& t : tables) out.push_back(t.get());
  return out;
}

// A deterministic, non-trivial gradient.
float Grad(uint64_t key, uint32_t element, int round) {
  return static_cast<float>(HashToUnit(HashCombine(key * 31 + element, round)) - 0.5);
}

// Pushes `rounds` gradients to the keys of `keys` and the dense blocks
// that `only` selects (all by default), so that weights and optimizer state
// move away from their initial values.
void Train(Tables& tables, const std::vector<uint64_t>& keys, const RowFilter& only,
           int rounds) {
  for (int round = 0; round < rounds; ++round) {
    for (auto& table : tables) {
      if (SparseTable* sparse = table->AsSparse()) {
        std::vector<uint64_t> selected;
        std::vector<float> grads;
        for (uint64_t key : keys) {
          if (only.sparse && !only.sparse(table->id(), key)) continue;
          selected.push_back(key);
          for (uint32_t e = 0; e < sparse->dim(); ++e) grads.push_back(Grad(key, e, round));
        }
        sparse->Advance(round, absl::UnixEpoch() + absl::Seconds(round));
        sparse->Push(selected, grads.data());
      } else {
        DenseTable* dense = table->AsDense();
        Segments segments;
        std::vector<float> grads;
        for (uint64_t b = 0; b < dense->num_blocks(); ++b) {
          if (only.dense && !only.dense(dense->id(), b)) continue;
          DenseSegment* s = segments.Add();
          s->set_begin(b * dense->block_size());
          s->set_length(dense->BlockLength(b));
          for (uint64_t e = 0; e < s->length(); ++e) {
            grads.push_back(Grad(s->begin() + e, 0, round));
          }
        }
        dense->Push(segments, grads.data());
      }
    }
  }
}

RowFilter EvenBlocks() {
  RowFilter even;
  even.dense = [](uint32_t, uint64_t block) { return block % 2 == 0; };
  return even;
}

std::vector<uint64_t> Keys(uint64_t first, uint64_t n) {
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < n; ++i) keys.push_back(Mix64(first + i));
  return keys;
}

// Every row and block of some tables, keyed by (table id, key or block),
// with its full state as raw bits.
using Snapshot = std::map<std::pair<uint32_t, uint64_t>, std::vector<uint32_t>>;

std::vector<uint32_t> Bits(absl::Span<const float> a, absl::Span<const float> b = {}) {
  std::vector<uint32_t> bits(a.size() + b.size());
  std::memcpy(bits.data(), a.data(), a.size() * sizeof(float));
  if (!b.empty()) std::memcpy(bits.data() + a.size(), b.data(), b.size() * sizeof(float));
  return bits;
}

// Adds the tables' rows to *snapshot; fails the test on a repeated entry.
void AddToSnapshot(const Tables& tables, Snapshot* snapshot, const std::string& who) {
  for (const auto& table : tables) {
    const bool dense = table->AsDense() != nullptr;
    // Dense blocks apart from sparse keys.
    const uint32_t id = dense ? table->id() | 0x80000000u : table->id();
    const absl::Status read = ForEachTableRow(
        *table, 7,
        [&](uint64_t row, absl::Span<const float> values,
            absl::Span<const float> state) {
          const bool inserted =
              snapshot->emplace(std::make_pair(id, row), Bits(values, state))
                  .second;
          EXPECT_TRUE(inserted)
              << who << ": table " << table->id()
              << (dense ? " block " : " key ") << row << " seen twice";
        });
    ASSERT_TRUE(read.ok()) << read;
  }
}

Snapshot SnapshotOf(const Tables& tables) {
  Snapshot s;
  AddToSnapshot(tables, &s, "snapshot");
  return s;
}

// A fresh directory under the test's temporary directory.
std::string NewRoot() {
  std::string tmpl = ::testing::TempDir();
  if (tmpl.empty() || tmpl.back() != '/') tmpl += '/';
  tmpl += "ckpt_test_XXXXXX";
  char* dir = ::mkdtemp(tmpl.data());
  EXPECT_NE(dir, nullptr);
  return tmpl;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint32_t> ContiguousSlotMap(uint32_t servers) {
  std::vector<uint32_t> owner(kNumSlots);
  for (uint32_t s = 0; s < kNumSlots; ++s) owner[s] = s * servers / kNumSlots;
  return owner;
}

// Writes a complete one-server checkpoint of `tables` at `clock`.
CheckpointManifest WriteCheckpoint(const std::string& root, uint64_t clock,
                                   const Tables& tables) {
  const std::string dir = CheckpointPath(root, clock);
  auto shard = WriteShard(dir, 0, clock, kNumSlots, ConstPtrs(tables));
  EXPECT_TRUE(shard.ok()) << shard.status();
  CheckpointManifest manifest;
  manifest.set_clock(clock);
  manifest.set_num_servers(1);
  manifest.set_num_slots(kNumSlots);
  if (shard.ok()) *manifest.add_shards() = *shard;
  EXPECT_TRUE(WriteManifest(dir, manifest).ok());
  return manifest;
}

// Trained tables: 300 keys in every sparse table, every dense block.
Tables TrainedTables() {
  Tables tables = MakeTables(AllConfigs());
  Train(tables, Keys(0, 300), {}, 3);
  return tables;
}

// ---------------------------------------------------------------- tests
// (The catalog's own cases, names, MANIFEST checks and pruning, are in
// checkpoint/catalog_test.cc; these need tables.)

TEST(TableExportTest, ImportRowValidates) {
  Tables tables = MakeTables({AdagradSparse()});
  SparseTable& t = *tables[0]->AsSparse();
  ASSERT_EQ(t.state_floats(), 8u);  // dim 4, Adagrad: one accumulator each
  std::vector<float> state(8, 0.5f);
  EXPECT_TRUE(t.ImportRow(7, state).ok());
  EXPECT_EQ(t.num_rows(), 1u);
  EXPECT_EQ(t.counters().admissions, 0u);
  state[3] = 2.0f;
  EXPECT_TRUE(t.ImportRow(7, state).ok());  // overwrites
  EXPECT_EQ(t.num_rows(), 1u);
  std::vector<float> pulled(4);
  t.Pull(std::vector<uint64_t>{7}, pulled.data());
  EXPECT_EQ(pulled[3], 2.0f);

  EXPECT_EQ(t.ImportRow(8, absl::MakeConstSpan(state).subspan(1)).code(),
            absl::StatusCode::kInvalidArgument);
  state[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(t.ImportRow(8, state).code(), absl::StatusCode::kInvalidArgument);
  state[5] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(t.ImportRow(7, state).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.num_rows(), 1u);
}

TEST(TableExportTest, ExportVisitsEveryRowOnceWhateverThePageSize) {
  Tables tables = MakeTables({AdamSparseWithTtl()});
  SparseTable& t = *tables[0]->AsSparse();
  std::vector<float> state(t.state_floats());
  std::set<uint64_t> expected;
  for (uint64_t k = 0; k < 5000; ++k) {
    state[0] = static_cast<float>(k);
    ASSERT_TRUE(t.ImportRow(Mix64(k), state).ok());
    expected.insert(Mix64(k));
  }
  for (size_t page : {1, 7, 16, 1000, 100000}) {
    SCOPED_TRACE(absl::StrCat("page ", page));
    std::vector<uint64_t> keys;
    std::vector<float> rows;
    uint64_t cursor = 0;
    size_t pages = 0;
    do {
      const size_t before = keys.size();
      cursor = t.ExportRows(cursor, page, &keys, &rows);
      EXPECT_LE(keys.size() - before, page);
      ++pages;
    } while (cursor != 0);
    EXPECT_EQ(std::set<uint64_t>(keys.begin(), keys.end()), expected);
    EXPECT_EQ(keys.size(), expected.size());
    EXPECT_GE(pages, (expected.size() + page - 1) / page);
    ASSERT_EQ(rows.size(), keys.size() * t.state_floats());
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(Mix64(static_cast<uint64_t>(rows[i * t.state_floats()])), keys[i]);
    }
  }
  std::vector<uint64_t> keys;
  std::vector<float> rows;
  EXPECT_EQ(t.ExportRows(~uint64_t{0}, 10, &keys, &rows), 0u);
  EXPECT_TRUE(keys.empty());
}

TEST(TableExportTest, ImportInExportOrderTakesLinearTime) {
  // Index order is hash order; importing 1M rows in that order into a
  // growing index took minutes (probe runs grow with the table). In export
  // order it takes well under a second.
  TableConfig c = AdagradSparse();
  c.mutable_sparse()->set_dim(1);
  c.mutable_optimizer()->clear_adagrad();
  c.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  Tables source = MakeTables({c});
  Tables copy = MakeTables({c});
  const float one = 1.0f;
  for (uint64_t k = 0; k < 1000000; ++k) {
    ASSERT_TRUE(source[0]->AsSparse()->ImportRow(k, absl::MakeConstSpan(&one, 1)).ok());
  }
  const absl::Time start = absl::Now();
  absl::Status imported;
  const absl::Status read = ForEachTableRow(
      *source[0], 4096,
      [&](uint64_t key, absl::Span<const float> row, absl::Span<const float>) {
        if (imported.ok()) imported = copy[0]->AsSparse()->ImportRow(key, row);
      });
  ASSERT_TRUE(read.ok()) << read;
  ASSERT_TRUE(imported.ok()) << imported;
  EXPECT_EQ(copy[0]->AsSparse()->num_rows(), 1000000u);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST(TableExportTest, ImportRowBypassesAdmissionAndRespectsBudget) {
  TableConfig c = AdagradSparse();
  c.mutable_sparse()->set_admit_after_pushes(5);
  c.mutable_sparse()->set_admission_sketch_width(1024);
  c.mutable_sparse()->set_memory_budget_bytes(1 << 20);  // no eviction
  Tables tables = MakeTables({c});
  SparseTable& t = *tables[0]->AsSparse();
  std::vector<float> state(t.state_floats(), 0.25f);
  size_t imported = 0;
  absl::Status status;
  while ((status = t.ImportRow(imported, state)).ok()) ++imported;
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_EQ(imported, t.max_rows());
  EXPECT_EQ(t.num_rows(), t.max_rows());
  EXPECT_TRUE(t.ImportRow(0, state).ok());  // overwriting needs no room
}

TEST(TableExportTest, EvictingTableMakesRoom) {
  TableConfig c = FtrlSparseWithBudget();
  c.mutable_sparse()->set_memory_budget_bytes(1 << 20);
  Tables tables = MakeTables({c});
  SparseTable& t = *tables[0]->AsSparse();
  std::vector<float> state(t.state_floats(), 0.25f);
  for (uint64_t k = 0; k < t.max_rows() + 10; ++k) ASSERT_TRUE(t.ImportRow(k, state).ok());
  EXPECT_EQ(t.num_rows(), t.max_rows());
  EXPECT_EQ(t.counters().evictions_budget, 10u);
}

TEST(TableExportTest, ImportBlockValidates) {
  Tables tables = MakeTables({AdamDense()});  // size 10, blocks of 3
  DenseTable& t = *tables[0]->AsDense();
  ASSERT_EQ(t.num_blocks(), 4u);
  EXPECT_EQ(t.BlockLength(3), 1u);
  std::vector<float> values(3, 1.0f), state(9, 0.5f);
  EXPECT_TRUE(t.ImportBlock(1, values, state).ok());
  EXPECT_EQ(t.num_created_blocks(), 1u);
  EXPECT_EQ(t.ImportBlock(4, values, state).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.ImportBlock(3, values, state).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(t.ImportBlock(3, absl::MakeConstSpan(values).subspan(0, 1),
                            absl::MakeConstSpan(state).subspan(0, 3))
                  .ok());
  values[0] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(t.ImportBlock(0, values, state).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.num_created_blocks(), 2u);
}

TEST(CheckpointTest, RoundTripIsBitExact) {
  Tables original = TrainedTables();
  const Snapshot expected = SnapshotOf(original);
  ASSERT_EQ(expected.size(), 3 * 300 + 16 + 4);

  const std::string root = NewRoot();
  WriteCheckpoint(root, 100, original);
  const std::string dir = CheckpointPath(root, 100);
  EXPECT_FALSE(fs::exists(dir + "/shard-0.ckpt.tmp"));
  EXPECT_FALSE(fs::exists(dir + "/MANIFEST.tmp"));
  auto manifest = VerifyCheckpoint(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->clock(), 100u);

  Tables restored = MakeTables(AllConfigs());
  auto stats = RestoreShards(dir, *manifest, Ptrs(restored));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->rows_restored, 900u);
  EXPECT_EQ(stats->blocks_restored, 20u);
  EXPECT_EQ(SnapshotOf(restored), expected);

  // Restored tables keep training exactly like the originals.
  Train(original, Keys(200, 200), EvenBlocks(), 2);
  Train(restored, Keys(200, 200), EvenBlocks(), 2);
  EXPECT_EQ(SnapshotOf(restored), SnapshotOf(original));

  auto digest = DigestCheckpoint(dir);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(digest->sparse_rows, 900u);
  EXPECT_EQ(digest->dense_blocks, 20u);
  Tables again = TrainedTables();
  EXPECT_EQ(DigestTables(ConstPtrs(again)), *digest);
  EXPECT_NE(DigestTables(ConstPtrs(original)), *digest);
}

TEST(CheckpointTest, EmptyTablesRoundTrip) {
  Tables empty = MakeTables(AllConfigs());
  const std::string root = NewRoot();
  const CheckpointManifest manifest = WriteCheckpoint(root, 0, empty);
  Tables restored = MakeTables(AllConfigs());
  auto stats = RestoreShards(CheckpointPath(root, 0), manifest, Ptrs(restored));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->rows_read + stats->blocks_read, 0u);
  EXPECT_TRUE(SnapshotOf(restored).empty());
}

TEST(CheckpointTest, LargeRowsSpanManyRecords) {
  // 20000 rows of 64 + 64 floats: about 10 MiB, several sparse records.
  TableConfig c = AdagradSparse();
  c.mutable_sparse()->set_dim(64);
  Tables tables = MakeTables({c});
  std::vector<float> state(128);
  for (uint64_t k = 0; k < 20000; ++k) {
    for (size_t i = 0; i < state.size(); ++i) state[i] = static_cast<float>(k * 128 + i);
    ASSERT_TRUE(tables[0]->AsSparse()->ImportRow(Mix64(k), state).ok());
  }
  const std::string root = NewRoot();
  const CheckpointManifest manifest = WriteCheckpoint(root, 5, tables);
  EXPECT_GT(manifest.shards(0).bytes(), 9u << 20);
  Tables restored = MakeTables({c});
  ASSERT_TRUE(RestoreShards(CheckpointPath(root, 5), manifest, Ptrs(restored)).ok());
  EXPECT_EQ(SnapshotOf(restored), SnapshotOf(tables));
}

// Servers of an n-way contiguous slot map, each trained only on what it owns.
std::vector<Tables> TrainedServers(uint32_t n) {
  const std::vector<uint32_t> owner = ContiguousSlotMap(n);
  const std::vector<uint64_t> keys = Keys(1000, 600);
  std::vector<Tables> servers;
  for (uint32_t rank = 0; rank < n; ++rank) {
    servers.push_back(MakeTables(AllConfigs()));
    Train(servers.back(), keys, OwnedSlotsFilter(owner, rank), 3);
  }
  return servers;
}

TEST(CheckpointTest, ReshardsOntoFewerAndMoreServers) {
  std::vector<Tables> three = TrainedServers(3);
  Snapshot original;
  for (uint32_t r = 0; r < 3; ++r) {
    AddToSnapshot(three[r], &original, absl::StrCat("writer ", r));
  }
  ASSERT_EQ(original.size(), 3 * 600 + 16 + 4);

  const std::string root = NewRoot();
  const std::string dir = CheckpointPath(root, 42);
  const std::vector<uint32_t> owner3 = ContiguousSlotMap(3);
  CheckpointManifest manifest;
  manifest.set_clock(42);
  manifest.set_num_servers(3);
  manifest.set_num_slots(kNumSlots);
  ParameterDigest writers_digest;
  for (uint32_t r = 0; r < 3; ++r) {
    auto shard = WriteShard(dir, r, 42, kNumSlots, ConstPtrs(three[r]),
                            OwnedSlotsFilter(owner3, r));
    ASSERT_TRUE(shard.ok()) << shard.status();
    *manifest.add_shards() = *shard;
    writers_digest += DigestTables(ConstPtrs(three[r]));
  }
  DataPosition* position = manifest.add_positions();
  position->set_shard(1);
  position->set_epoch(2);
  position->set_batch(17);
  ASSERT_TRUE(WriteManifest(dir, manifest).ok());
  auto verified = VerifyCheckpoint(dir);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->positions(0).batch(), 17u);
  auto digest = DigestCheckpoint(dir);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, writers_digest);

  for (uint32_t m : {2u, 4u}) {
    SCOPED_TRACE(absl::StrCat("restoring onto ", m, " servers"));
    const std::vector<uint32_t> owner = ContiguousSlotMap(m);
    Snapshot merged;
    ParameterDigest restored_digest;
    uint64_t rows = 0;
    for (uint32_t rank = 0; rank < m; ++rank) {
      Tables tables = MakeTables(AllConfigs());
      const RowFilter mine = OwnedSlotsFilter(owner, rank);
      auto stats = RestoreShards(dir, *verified, Ptrs(tables), mine);
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_EQ(stats->files, 3u);
      EXPECT_EQ(stats->rows_read, 1800u);
      rows += stats->rows_restored;
      // Every row a server holds is one its slots own.
      Snapshot own = SnapshotOf(tables);
      for (const auto& [id_key, bits] : own) {
        if (id_key.first & 0x80000000u) {
          EXPECT_TRUE(mine.dense(id_key.first & 0x7fffffffu, id_key.second));
        } else {
          EXPECT_TRUE(mine.sparse(id_key.first, id_key.second));
        }
      }
      EXPECT_GT(own.size(), 0u);
      // AddToSnapshot fails on a row held by two servers.
      AddToSnapshot(tables, &merged, absl::StrCat("server ", rank, " of ", m));
      restored_digest += DigestTables(ConstPtrs(tables));
    }
    EXPECT_EQ(rows, 1800u);
    EXPECT_TRUE(merged == original);
    EXPECT_EQ(restored_digest, *digest);
  }
}

TEST(CheckpointTest, RestoreRefusesMismatchedTablesAndChangesNothing) {
  Tables original = TrainedTables();
  const std::string root = NewRoot();
  const CheckpointManifest manifest = WriteCheckpoint(root, 7, original);
  const std::string dir = CheckpointPath(root, 7);

  auto expect_refused = [&](std::vector<TableConfig> configs, absl::string_view what) {
    SCOPED_TRACE(std::string(what));
    Tables tables = MakeTables(configs);
    auto stats = RestoreShards(dir, manifest, Ptrs(tables));
    EXPECT_EQ(stats.status().code(), absl::StatusCode::kFailedPrecondition)
        << stats.status();
    EXPECT_TRUE(absl::StrContains(stats.status().message(), what)) << stats.status();
    EXPECT_TRUE(SnapshotOf(tables).empty());
  };
  std::vector<TableConfig> configs = AllConfigs();
  configs[0].mutable_sparse()->set_dim(5);
  expect_refused(configs, "dim");
  configs = AllConfigs();
  *configs[1].mutable_optimizer()->mutable_adagrad() =
      AdagradSparse().optimizer().adagrad();
  expect_refused(configs, "optimizer");
  configs = AllConfigs();
  configs[3].mutable_dense()->set_block_size(32);
  expect_refused(configs, "block_size");
  configs = AllConfigs();
  configs[4].mutable_dense()->set_size(11);
  expect_refused(configs, "size");
  configs = AllConfigs();
  configs.pop_back();
  expect_refused(configs, "which the job does not");
  configs = AllConfigs();
  TableConfig extra = AdagradSparse();
  extra.set_id(9);
  extra.set_name("new");
  configs.push_back(extra);
  expect_refused(configs, "which the checkpoint does not");
  configs = AllConfigs();
  TableConfig as_dense = MomentumDense();
  as_dense.set_id(1);
  configs[0] = as_dense;
  expect_refused(configs, "kind");

  // Learning rates, budgets and TTLs may change.
  configs = AllConfigs();
  configs[0].mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.5f);
  configs[1].mutable_sparse()->set_ttl_steps(5);
  Tables tables = MakeTables(configs);
  EXPECT_TRUE(RestoreShards(dir, manifest, Ptrs(tables)).ok());
}

TEST(CheckpointTest, WriteShardRefusesNonFiniteValues) {
  TableConfig c = AdagradSparse();
  c.mutable_optimizer()->clear_adagrad();
  c.mutable_optimizer()->mutable_sgd()->set_learning_rate(1.0f);
  Tables tables = MakeTables({c});
  std::vector<float> grads(4, std::numeric_limits<float>::infinity());
  tables[0]->AsSparse()->Push(std::vector<uint64_t>{99}, grads.data());
  const std::string dir = CheckpointPath(NewRoot(), 1);
  auto shard = WriteShard(dir, 0, 1, kNumSlots, ConstPtrs(tables));
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kFailedPrecondition) << shard.status();
  EXPECT_TRUE(absl::StrContains(shard.status().message(), "key 99"));
  EXPECT_FALSE(fs::exists(dir + "/shard-0.ckpt"));
  EXPECT_FALSE(fs::exists(dir + "/shard-0.ckpt.tmp"));
}

// Two valid checkpoints, 100 and 200, of the same tables.
class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = NewRoot();
    tables_ = TrainedTables();
    WriteCheckpoint(root_, 100, tables_);
    // Checkpoint 200 has two shards, so that one can go missing.
    dir_ = CheckpointPath(root_, 200);
    manifest_.set_clock(200);
    manifest_.set_num_servers(2);
    for (uint32_t r = 0; r < 2; ++r) {
      auto shard = WriteShard(dir_, r, 200, kNumSlots, ConstPtrs(tables_),
                              OwnedSlotsFilter(ContiguousSlotMap(2), r));
      ASSERT_TRUE(shard.ok()) << shard.status();
      *manifest_.add_shards() = *shard;
    }
    ASSERT_TRUE(WriteManifest(dir_, manifest_).ok());
    ASSERT_TRUE(VerifyCheckpoint(dir_).ok());
    shard_ = dir_ + "/shard-1.ckpt";
    bytes_ = ReadBytes(shard_);
  }

  // The damaged checkpoint 200 is refused and 100 is found instead, with
  // 200 reported as skipped for a reason containing `why`.
  void ExpectFallback(absl::string_view why) {
    auto verified = VerifyCheckpoint(dir_);
    EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss) << verified.status();
    EXPECT_TRUE(absl::StrContains(verified.status().message(), why)) << verified.status();
    auto latest = FindLatestCheckpoint(root_);
    ASSERT_TRUE(latest.ok()) << latest.status();
    EXPECT_EQ(latest->dir, CheckpointPath(root_, 100));
    EXPECT_EQ(latest->manifest.clock(), 100u);
    ASSERT_EQ(latest->skipped.size(), 1u);
    EXPECT_TRUE(absl::StartsWith(latest->skipped[0], "ckpt-00000000000000000200: "))
        << latest->skipped[0];
    EXPECT_TRUE(absl::StrContains(latest->skipped[0], why)) << latest->skipped[0];
  }

  // Restoring checkpoint 200 with its original manifest fails with
  // DATA_LOSS (and never crashes).
  void ExpectRestoreDataLoss() {
    Tables fresh = MakeTables(AllConfigs());
    auto stats = RestoreShards(dir_, manifest_, Ptrs(fresh));
    EXPECT_EQ(stats.status().code(), absl::StatusCode::kDataLoss) << stats.status();
    auto digest = DigestCheckpoint(dir_);
    EXPECT_FALSE(digest.ok());
  }

  std::string root_;
  Tables tables_;
  std::string dir_;
  CheckpointManifest manifest_;
  std::string shard_;
  std::string bytes_;
};

TEST_F(CorruptionTest, FlippedByteInShard) {
  bytes_[bytes_.size() / 2] ^= 0x10;
  WriteBytes(shard_, bytes_);
  ExpectFallback("shard-1.ckpt: file checksum mismatch");
  ExpectRestoreDataLoss();
}

TEST_F(CorruptionTest, TruncatedShard) {
  WriteBytes(shard_, bytes_.substr(0, bytes_.size() - 100));
  ExpectFallback("shard-1.ckpt: size is");
  ExpectRestoreDataLoss();
}

TEST_F(CorruptionTest, DeletedShard) {
  ASSERT_EQ(::unlink(shard_.c_str()), 0);
  ExpectFallback("shard-1.ckpt: listed in the MANIFEST but missing");
  ExpectRestoreDataLoss();
}

TEST_F(CorruptionTest, WrongMagic) {
  bytes_[0] = 'X';
  WriteBytes(shard_, bytes_);
  ExpectFallback("shard-1.ckpt: wrong magic number");
  ExpectRestoreDataLoss();
}

TEST_F(CorruptionTest, GarbageManifest) {
  WriteBytes(dir_ + "/MANIFEST", "this is not a manifest at all, just some text");
  ExpectFallback("MANIFEST: wrong magic number");
}

TEST_F(CorruptionTest, FlippedByteInManifest) {
  std::string manifest = ReadBytes(dir_ + "/MANIFEST");
  manifest[20] ^= 1;
  WriteBytes(dir_ + "/MANIFEST", manifest);
  ExpectFallback("MANIFEST: file checksum mismatch");
}

TEST_F(CorruptionTest, ShardOfAnotherAttempt) {
  // A valid shard file of the same size, but not the one the manifest
  // lists (say, rewritten by a retry after the manifest was written).
  Train(tables_, Keys(0, 300), {}, 1);
  auto shard = WriteShard(dir_, 1, 200, kNumSlots, ConstPtrs(tables_),
                          OwnedSlotsFilter(ContiguousSlotMap(2), 1));
  ASSERT_TRUE(shard.ok());
  ASSERT_EQ(shard->bytes(), bytes_.size());
  ExpectFallback("shard-1.ckpt: checksum");
  ExpectRestoreDataLoss();
}

TEST_F(CorruptionTest, EveryFlippedByteIsDetectedOnRestore) {
  // Every byte of the file is covered by a checksum.
  const size_t step = std::max<size_t>(1, bytes_.size() / 300);
  for (size_t pos = 0; pos < bytes_.size(); pos += step) {
    SCOPED_TRACE(absl::StrCat("byte ", pos, " of ", bytes_.size()));
    std::string damaged = bytes_;
    damaged[pos] ^= static_cast<char>(1 << (pos % 8));
    WriteBytes(shard_, damaged);
    ExpectRestoreDataLoss();
  }
  // And the last bytes, the trailer.
  for (size_t pos = bytes_.size() - 8; pos < bytes_.size(); ++pos) {
    std::string damaged = bytes_;
    damaged[pos] ^= 0x80;
    WriteBytes(shard_, damaged);
    ExpectRestoreDataLoss();
  }
}

TEST_F(CorruptionTest, EveryTruncationIsDetectedOnRestore) {
  // With a manifest that agrees with the truncated size, the structure
  // itself must reveal the truncation.
  const size_t step = std::max<size_t>(1, bytes_.size() / 200);
  for (size_t size = 0; size < bytes_.size(); size += step) {
    SCOPED_TRACE(absl::StrCat("truncated to ", size, " of ", bytes_.size()));
    WriteBytes(shard_, bytes_.substr(0, size));
    CheckpointManifest lying = manifest_;
    lying.mutable_shards(1)->set_bytes(size);
    Tables fresh = MakeTables(AllConfigs());
    auto stats = RestoreShards(dir_, lying, Ptrs(fresh));
    EXPECT_FALSE(stats.ok());
    if (!stats.ok()) {
      EXPECT_TRUE(stats.status().code() == absl::StatusCode::kDataLoss ||
                  stats.status().code() == absl::StatusCode::kInvalidArgument)
          << stats.status();
    }
  }
}

// Rewrites the shard with bytes [at, at + patch.size()) replaced and the
// file's checksum (in its trailer and the manifest) recomputed. The
// record's own checksum is read only after its sizes were checked, so only
// the format checks stand between such a file and a huge allocation.
void PatchRecordHeader(const std::string& path, size_t at, const std::string& patch,
                       CheckpointManifest* manifest, int rank) {
  std::string bytes = ReadBytes(path);
  bytes.replace(at, patch.size(), patch);
  const uint64_t file_sum = Checksum64(bytes.data(), bytes.size() - 8);
  std::memcpy(&bytes[bytes.size() - 8], &file_sum, 8);
  WriteBytes(path, bytes);
  manifest->mutable_shards(rank)->set_checksum(file_sum);
}

TEST_F(CorruptionTest, AbsurdCountsAreRefusedBeforeAllocating) {
  // The first record after the header: offset 16 (preamble) + 24 (record
  // header) + header payload + 8 (its checksum).
  uint64_t header_payload;
  std::memcpy(&header_payload, bytes_.data() + 16 + 16, 8);
  const size_t first = 16 + 24 + header_payload + 8;
  uint32_t type;
  std::memcpy(&type, bytes_.data() + first, 4);
  ASSERT_EQ(type, 2u);  // sparse rows of table 0

  for (uint64_t count : {uint64_t{1} << 40, ~uint64_t{0}, uint64_t{0}}) {
    for (uint64_t payload : {uint64_t{1} << 60, ~uint64_t{0}, uint64_t{40} * (8 + 32)}) {
      SCOPED_TRACE(absl::StrCat("count ", count, " payload ", payload));
      std::string patch(16, '\0');
      std::memcpy(&patch[0], &count, 8);
      std::memcpy(&patch[8], &payload, 8);
      WriteBytes(shard_, bytes_);
      CheckpointManifest patched = manifest_;
      PatchRecordHeader(shard_, first + 8, patch, &patched, 1);
      Tables fresh = MakeTables(AllConfigs());
      auto stats = RestoreShards(dir_, patched, Ptrs(fresh));
      EXPECT_EQ(stats.status().code(), absl::StatusCode::kDataLoss) << stats.status();
    }
  }
}

TEST_F(CorruptionTest, PartialCheckpointIsSkipped) {
  // Shards of 300 but no manifest: a checkpoint interrupted before commit.
  ASSERT_TRUE(WriteShard(CheckpointPath(root_, 300), 0, 300, kNumSlots,
                         ConstPtrs(tables_))
                  .ok());
  auto latest = FindLatestCheckpoint(root_);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->manifest.clock(), 200u);
  ASSERT_EQ(latest->skipped.size(), 1u);
  EXPECT_EQ(latest->skipped[0], "ckpt-00000000000000000300: incomplete: no MANIFEST");
  EXPECT_EQ(VerifyCheckpoint(CheckpointPath(root_, 300)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CorruptionTest, NothingValidIsNotFound) {
  WriteBytes(shard_, "");
  ASSERT_TRUE(fs::remove(CheckpointPath(root_, 100) + "/MANIFEST"));
  auto latest = FindLatestCheckpoint(root_);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(latest.status().message(), "ckpt-00000000000000000200"))
      << latest.status();
  EXPECT_EQ(FindLatestCheckpoint(root_ + "/nonexistent").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CorruptionTest, ManifestOfAnotherClock) {
  // A checkpoint directory renamed by hand.
  fs::rename(dir_, CheckpointPath(root_, 250));
  dir_ = CheckpointPath(root_, 250);
  auto verified = VerifyCheckpoint(dir_);
  EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(verified.status().message(), "clock 200"))
      << verified.status();
}

}  // namespace
}  // namespace ps
