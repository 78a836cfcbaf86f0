#include "checkpoint/format.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "checkpoint/catalog.h"
#include "checkpoint/test_shards.h"
#include "gtest/gtest.h"
#include "common/status.h"
#include "proto/checkpoint.pb.h"

namespace ps {
namespace {

using checkpoint_test::NewRoot;
using checkpoint_test::ReadBytes;
using checkpoint_test::RowState;
using checkpoint_test::SparseConfig;
using checkpoint_test::TestStateSize;
using checkpoint_test::WriteBytes;
using checkpoint_test::WriteTestShard;

// Records what a reader passes on.
class Recorder : public ShardVisitor {
 public:
  absl::Status Rows(size_t t, absl::Span<const uint64_t> keys,
                    absl::Span<const float> state) override {
    EXPECT_EQ(t, 0u);
    keys_.insert(keys_.end(), keys.begin(), keys.end());
    state_.insert(state_.end(), state.begin(), state.end());
    return absl::OkStatus();
  }
  absl::Status Block(size_t t, uint64_t block, absl::Span<const float> values,
                     absl::Span<const float> state) override {
    EXPECT_EQ(t, 1u);
    blocks_.push_back(block);
    lengths_.push_back(values.size());
    EXPECT_EQ(state.size(), values.size());  // momentum: one per value
    for (float v : values) EXPECT_EQ(v, static_cast<float>(block));
    return absl::OkStatus();
  }

  std::vector<uint64_t> keys_;
  std::vector<float> state_;
  std::vector<uint64_t> blocks_;
  std::vector<size_t> lengths_;
};

TEST(ShardFormatTest, WriterAndReaderRoundTrip) {
  const std::string dir = CheckpointPath(NewRoot(), 7);
  auto shard = WriteTestShard(dir, 3, 7, 25);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->rank(), 3u);
  EXPECT_EQ(shard->file(), ShardFileName(3));
  const std::string bytes = ReadBytes(dir + "/" + shard->file());
  EXPECT_EQ(bytes.size(), shard->bytes());
  EXPECT_EQ(Checksum64(bytes.data(), bytes.size() - 8), shard->checksum());

  auto reader = ShardReader::Open(dir, *shard, 7, TestStateSize);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->header().rank(), 3u);
  ASSERT_EQ((*reader)->layouts().size(), 2u);
  const TableLayout& sparse = (*reader)->layouts()[0];
  EXPECT_TRUE(sparse.sparse);
  EXPECT_EQ(sparse.stride, 4u);
  const TableLayout& dense = (*reader)->layouts()[1];
  EXPECT_FALSE(dense.sparse);
  EXPECT_EQ(dense.num_blocks, 3u);
  EXPECT_EQ(dense.BlockLength(2), 2u);
  Recorder seen;
  ASSERT_TRUE((*reader)->ReadAll(seen).ok());
  ASSERT_EQ(seen.keys_.size(), 25u);
  for (uint64_t i = 0; i < 25; ++i) {
    EXPECT_EQ(seen.keys_[i], i + 1);
    const std::vector<float> want = RowState(i + 1);
    EXPECT_EQ(std::vector<float>(seen.state_.begin() + i * 4, seen.state_.begin() + i * 4 + 4),
              want);
  }
  EXPECT_EQ(seen.blocks_, (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(seen.lengths_, (std::vector<size_t>{4, 4, 2}));
}

TEST(ShardFormatTest, ReaderRefusesAnotherClockOrRank) {
  const std::string dir = CheckpointPath(NewRoot(), 7);
  auto shard = WriteTestShard(dir, 0, 7);
  ASSERT_TRUE(shard.ok());
  auto reader = ShardReader::Open(dir, *shard, 8, TestStateSize);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(reader.status().message(), "clock 7")) << reader.status();
  ShardFile other = *shard;
  other.set_rank(1);
  reader = ShardReader::Open(dir, other, 7, TestStateSize);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
}

TEST(ShardFormatTest, UnknownOptimizerRuleIsCorrupt) {
  const std::string dir = CheckpointPath(NewRoot(), 7);
  auto shard = WriteTestShard(dir, 0, 7);
  ASSERT_TRUE(shard.ok());
  auto none = [](const OptimizerConfig&) -> absl::StatusOr<int> {
    return absl::InvalidArgumentError("no rule");
  };
  auto reader = ShardReader::Open(dir, *shard, 7, none);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(reader.status().message(), "no rule")) << reader.status();
}

TEST(ShardFormatTest, EveryFlippedByteOrTruncationIsDetected) {
  const std::string dir = CheckpointPath(NewRoot(), 7);
  auto shard = WriteTestShard(dir, 0, 7, 40);
  ASSERT_TRUE(shard.ok());
  const std::string path = dir + "/" + shard->file();
  const std::string bytes = ReadBytes(path);
  auto read = [&](const ShardFile& entry) -> absl::Status {
    auto reader = ShardReader::Open(dir, entry, 7, TestStateSize);
    if (!reader.ok()) return reader.status();
    Recorder seen;
    return (*reader)->ReadAll(seen);
  };
  for (size_t pos = 0; pos < bytes.size(); ++pos) {
    SCOPED_TRACE(absl::StrCat("byte ", pos, " of ", bytes.size()));
    std::string damaged = bytes;
    damaged[pos] ^= static_cast<char>(1 << (pos % 8));
    WriteBytes(path, damaged);
    const absl::Status s = read(*shard);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  }
  for (size_t size = 0; size < bytes.size(); ++size) {
    SCOPED_TRACE(absl::StrCat("truncated to ", size, " of ", bytes.size()));
    WriteBytes(path, bytes.substr(0, size));
    ShardFile lying = *shard;
    lying.set_bytes(size);
    const absl::Status s = read(lying);
    EXPECT_FALSE(s.ok());
  }
}

TEST(ShardFormatTest, HeaderOverLimitIsRefused) {
  ShardHeader header;
  TableConfig big = SparseConfig(1);
  big.set_name(std::string((size_t{64} << 20) + 1, 'x'));
  *header.add_tables() = big;
  auto shard = WriteShardFile(CheckpointPath(NewRoot(), 1), header,
                              [](ShardWriter&) { return absl::OkStatus(); });
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
