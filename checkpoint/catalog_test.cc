#include "checkpoint/catalog.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "checkpoint/test_shards.h"
#include "gtest/gtest.h"
#include "common/status.h"
#include "proto/checkpoint.pb.h"

namespace ps {
namespace {

namespace fs = std::filesystem;
using checkpoint_test::NewRoot;
using checkpoint_test::ReadBytes;
using checkpoint_test::WriteBytes;
using checkpoint_test::WriteTestCheckpoint;
using checkpoint_test::WriteTestShard;

TEST(Checksum64Test, MatchesXxh64ReferenceValues) {
  EXPECT_EQ(Checksum64("", 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(Checksum64("a", 1), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(Checksum64("abc", 3), 0x44BC2CF5AD770999ULL);
  const std::string s = "Nobody inspects the spammish repetition";
  EXPECT_EQ(Checksum64(s.data(), s.size()), 0xFBCEA83C8A378BF1ULL);
}

TEST(Checksum64Test, PiecesEqualTheWhole) {
  const std::string s = "Nobody inspects the spammish repetition";
  for (size_t cut = 0; cut <= s.size(); cut += 7) {
    EXPECT_EQ(Checksum64Pieces({{s.data(), cut}, {s.data() + cut, s.size() - cut}}, 42),
              Checksum64(s.data(), s.size(), 42));
  }
}

TEST(CheckpointNamesTest, FormatAndParse) {
  EXPECT_EQ(CheckpointDirName(400), "ckpt-00000000000000000400");
  EXPECT_EQ(ParseCheckpointDirName("ckpt-00000000000000000400"), 400u);
  EXPECT_EQ(ParseCheckpointDirName(CheckpointDirName(~uint64_t{0})), ~uint64_t{0});
  EXPECT_FALSE(ParseCheckpointDirName("ckpt-400").has_value());
  EXPECT_FALSE(ParseCheckpointDirName("ckpt-0000000000000000040x").has_value());
  EXPECT_FALSE(ParseCheckpointDirName("ckpt-99999999999999999999").has_value());
  EXPECT_EQ(CheckpointPath("/r/", 1), "/r/ckpt-00000000000000000001");
  EXPECT_EQ(ShardFileName(3), "shard-3.ckpt");
}

TEST(CheckpointTest, WriteManifestChecksItsShards) {
  const std::string dir = CheckpointPath(NewRoot(), 3);
  auto shard = WriteTestShard(dir, 0, 3);
  ASSERT_TRUE(shard.ok());
  CheckpointManifest m;
  m.set_clock(3);
  m.set_num_servers(2);
  *m.add_shards() = *shard;
  EXPECT_EQ(WriteManifest(dir, m).code(), absl::StatusCode::kInvalidArgument);
  ShardFile* second = m.add_shards();
  *second = *shard;
  EXPECT_EQ(WriteManifest(dir, m).code(), absl::StatusCode::kInvalidArgument);  // rank 0 twice
  second->set_rank(1);
  second->set_file("../shard-1.ckpt");
  EXPECT_EQ(WriteManifest(dir, m).code(), absl::StatusCode::kInvalidArgument);
  second->set_file(ShardFileName(1));
  EXPECT_EQ(WriteManifest(dir, m).code(), absl::StatusCode::kFailedPrecondition);  // missing
  m.set_num_servers(1);
  m.mutable_shards()->RemoveLast();
  m.mutable_shards(0)->set_bytes(shard->bytes() + 1);
  EXPECT_EQ(WriteManifest(dir, m).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(fs::exists(dir + "/MANIFEST"));
  EXPECT_EQ(VerifyCheckpoint(dir).status().code(), absl::StatusCode::kNotFound);
}

TEST(CatalogTest, VerifyAndLatestFallBackPastADamagedShard) {
  const std::string root = NewRoot();
  WriteTestCheckpoint(root, 100);
  WriteTestCheckpoint(root, 200);
  const std::string dir = CheckpointPath(root, 200);
  ASSERT_TRUE(VerifyCheckpoint(dir).ok());
  const std::string shard = dir + "/" + ShardFileName(0);
  std::string bytes = ReadBytes(shard);
  bytes[bytes.size() / 2] ^= 0x10;
  WriteBytes(shard, bytes);
  auto verified = VerifyCheckpoint(dir);
  EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss) << verified.status();
  EXPECT_TRUE(absl::StrContains(verified.status().message(),
                                "shard-0.ckpt: file checksum mismatch"))
      << verified.status();
  auto latest = FindLatestCheckpoint(root);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->dir, CheckpointPath(root, 100));
  EXPECT_EQ(latest->manifest.clock(), 100u);
  ASSERT_EQ(latest->skipped.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(latest->skipped[0], "ckpt-00000000000000000200: "))
      << latest->skipped[0];
}

TEST(PruneTest, KeepsTheNewestComplete) {
  const std::string root = NewRoot();
  for (uint64_t clock : {100, 200, 300, 400, 500}) WriteTestCheckpoint(root, clock);
  // Incomplete: one older than the newest complete (abandoned), one newer
  // (being written).
  for (uint64_t clock : {50, 600}) {
    ASSERT_TRUE(WriteTestShard(CheckpointPath(root, clock), 0, clock).ok());
  }
  fs::create_directories(root + "/not-a-checkpoint");
  EXPECT_EQ(PruneCheckpoints(root, 0).status().code(), absl::StatusCode::kInvalidArgument);
  auto removed = PruneCheckpoints(root, 2);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, (std::vector<std::string>{
                          CheckpointDirName(300), CheckpointDirName(200),
                          CheckpointDirName(100), CheckpointDirName(50)}));
  auto left = ListCheckpoints(root);
  ASSERT_TRUE(left.ok());
  std::vector<uint64_t> clocks;
  for (const CheckpointDirEntry& e : *left) clocks.push_back(e.clock);
  EXPECT_EQ(clocks, (std::vector<uint64_t>{600, 500, 400}));
  EXPECT_TRUE(fs::exists(root + "/not-a-checkpoint"));
  // Idempotent.
  removed = PruneCheckpoints(root, 2);
  ASSERT_TRUE(removed.ok());
  EXPECT_TRUE(removed->empty());
}

}  // namespace
}  // namespace ps
