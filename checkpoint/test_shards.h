// Test helpers of //checkpoint: small shard files written through the
// format's writer, without tables. Test-only; thread-compatible.
#ifndef PS_CHECKPOINT_TEST_SHARDS_H_
#define PS_CHECKPOINT_TEST_SHARDS_H_

#include <stdlib.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/catalog.h"
#include "checkpoint/format.h"
#include "gtest/gtest.h"
#include "common/status.h"
#include "proto/checkpoint.pb.h"
#include "proto/config.pb.h"

namespace ps {
namespace checkpoint_test {

constexpr uint32_t kNumSlots = 64;

// The state sizes of the optimizer rules (as common/optimizer.h has them)
// that the tests use; INVALID_ARGUMENT for any other.
inline absl::StatusOr<int> TestStateSize(const OptimizerConfig& c) {
  switch (c.kind_case()) {
    case OptimizerConfig::kSgd:
      return 0;
    case OptimizerConfig::kAdagrad:
    case OptimizerConfig::kMomentum:
      return 1;
    case OptimizerConfig::kAdam:
      return 2;
    default:
      return absl::InvalidArgumentError("no optimizer rule");
  }
}

// A sparse table of dim 2 with Adagrad (4 floats per row).
inline TableConfig SparseConfig(uint32_t id) {
  TableConfig c;
  c.set_id(id);
  c.set_name(absl::StrCat("sparse", id));
  c.mutable_sparse()->set_dim(2);
  c.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.1f);
  return c;
}

// A dense table of size 10 in blocks of 4 (the last one short) with
// momentum (one state float per value).
inline TableConfig DenseConfig(uint32_t id) {
  TableConfig c;
  c.set_id(id);
  c.set_name(absl::StrCat("dense", id));
  c.mutable_dense()->set_size(10);
  c.mutable_dense()->set_block_size(4);
  c.mutable_optimizer()->mutable_momentum()->set_learning_rate(0.1f);
  return c;
}

// The full state of row `key` of a SparseConfig table: 4 floats.
inline std::vector<float> RowState(uint64_t key) {
  const float k = static_cast<float>(key);
  return {k, k + 0.25f, -k, 1.0f / (k + 1)};
}

// Writes a shard of one SparseConfig(1) table holding `rows` rows (keys
// 1..rows) and one DenseConfig(2) table, every block.
inline absl::StatusOr<ShardFile> WriteTestShard(const std::string& dir, uint32_t rank,
                                                uint64_t clock, uint64_t rows = 10) {
  ShardHeader header;
  header.set_clock(clock);
  header.set_rank(rank);
  header.set_num_slots(kNumSlots);
  *header.add_tables() = SparseConfig(1);
  *header.add_tables() = DenseConfig(2);
  return WriteShardFile(dir, header, [&](ShardWriter& out) -> absl::Status {
    std::vector<uint64_t> keys;
    std::vector<float> state;
    for (uint64_t key = 1; key <= rows; ++key) {
      keys.push_back(key);
      for (float f : RowState(key)) state.push_back(f);
    }
    if (!keys.empty()) {
      absl::Status s = out.Rows(0, keys, state);
      if (!s.ok()) return s;
    }
    absl::Status s = out.EndTable(0, keys.size());
    if (!s.ok()) return s;
    for (uint64_t block = 0; block < 3; ++block) {
      const size_t n = block < 2 ? 4 : 2;
      std::vector<float> values(n, static_cast<float>(block));
      std::vector<float> momentum(n, 0.5f);
      s = out.Block(1, block, values, momentum);
      if (!s.ok()) return s;
    }
    return out.EndTable(1, 3);
  });
}

// Writes a complete one-server checkpoint at `clock` under root.
inline CheckpointManifest WriteTestCheckpoint(const std::string& root, uint64_t clock) {
  const std::string dir = CheckpointPath(root, clock);
  auto shard = WriteTestShard(dir, 0, clock);
  EXPECT_TRUE(shard.ok()) << shard.status();
  CheckpointManifest manifest;
  manifest.set_clock(clock);
  manifest.set_num_servers(1);
  manifest.set_num_slots(kNumSlots);
  if (shard.ok()) *manifest.add_shards() = *shard;
  EXPECT_TRUE(WriteManifest(dir, manifest).ok());
  return manifest;
}

// A fresh directory under the test's temporary directory.
inline std::string NewRoot() {
  std::string tmpl = ::testing::TempDir();
  if (tmpl.empty() || tmpl.back() != '/') tmpl += '/';
  tmpl += "ckpt_test_XXXXXX";
  char* dir = ::mkdtemp(tmpl.data());
  EXPECT_NE(dir, nullptr);
  return tmpl;
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace checkpoint_test
}  // namespace ps

#endif  // PS_CHECKPOINT_TEST_SHARDS_H_
