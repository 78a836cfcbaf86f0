#include "worker/model_file.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "common/config.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

SavedModel Example() {
  SavedModel m;
  m.config.mutable_training()->mutable_model()->set_kind(ModelConfig::FM);
  m.config.mutable_data()->mutable_synthetic_ctr()->set_num_numeric(2);
  ApplyDefaults(&m.config);
  m.dense = {0.5f, -1.0f, 2.0f};
  m.sparse_dim = 9;
  m.keys = {7, 1ULL << 63};
  for (int i = 0; i < 18; ++i) m.rows.push_back(i * 0.25f);
  return m;
}

TEST(ModelFileTest, RoundTrips) {
  const std::string path = TempPath("model.bin");
  const SavedModel m = Example();
  ASSERT_TRUE(SaveModel(path, m).ok());
  auto loaded = LoadModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config.SerializeAsString(), m.config.SerializeAsString());
  EXPECT_EQ(loaded->dense, m.dense);
  EXPECT_EQ(loaded->sparse_dim, 9u);
  EXPECT_EQ(loaded->keys, m.keys);
  EXPECT_EQ(loaded->rows, m.rows);
}

TEST(ModelFileTest, RejectsMismatchedRows) {
  SavedModel m = Example();
  m.rows.pop_back();
  EXPECT_EQ(SaveModel(TempPath("bad.bin"), m).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelFileTest, CorruptionIsDataLoss) {
  const std::string path = TempPath("corrupt.bin");
  ASSERT_TRUE(SaveModel(path, Example()).ok());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Every truncation and a flipped bit anywhere are detected.
  for (size_t len = 0; len < bytes.size(); len += 7) {
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), len);
    EXPECT_EQ(LoadModel(path).status().code(), absl::StatusCode::kDataLoss)
        << len;
  }
  for (size_t i = 0; i < bytes.size(); i += 5) {
    std::string flipped = bytes;
    flipped[i] ^= 0x10;
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(flipped.data(), flipped.size());
    EXPECT_FALSE(LoadModel(path).ok()) << i;
  }
  EXPECT_EQ(LoadModel(TempPath("missing.bin")).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ps
