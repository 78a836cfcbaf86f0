#include "worker/data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/data/dataset.h"
#include "worker/data/test_util.h"

namespace ps::data {
namespace {

using ::ps::data::testing::TempPath;
using ::ps::data::testing::WriteFile;

std::string BigEndian(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string Images(uint32_t count, uint32_t rows = 28, uint32_t cols = 28) {
  std::string s = BigEndian(0x803) + BigEndian(count) + BigEndian(rows) +
                  BigEndian(cols);
  for (uint32_t i = 0; i < count * rows * cols; ++i) {
    s.push_back(static_cast<char>((i * 7 + i / 784) % 256));
  }
  return s;
}

std::string Labels(uint32_t count, uint8_t bad_at = 255) {
  std::string s = BigEndian(0x801) + BigEndian(count);
  for (uint32_t i = 0; i < count; ++i) {
    s.push_back(static_cast<char>(i == bad_at ? 10 : i % 10));
  }
  return s;
}

void WriteGz(const std::string& path, const std::string& content) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, content.data(), content.size()),
            static_cast<int>(content.size()));
  gzclose(f);
}

TEST(IdxTest, ReadsRawAndGzip) {
  const std::string raw = WriteFile("images.idx", Images(3));
  WriteGz(TempPath("images.idx.gz"), Images(3));
  for (const std::string& path : {raw, TempPath("images.idx.gz")}) {
    absl::StatusOr<IdxArray> a = ReadIdx(path, 0x803);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->dims, (std::vector<uint32_t>{3, 28, 28}));
    ASSERT_EQ(a->data.size(), 3u * 784);
    EXPECT_EQ(a->data[785], (785 * 7 + 1) % 256);
  }
}

TEST(IdxTest, CorruptFilesAreClearErrors) {
  struct Case {
    std::string name, content;
    uint32_t magic;
    std::string want;
  };
  std::string truncated = Images(2);
  truncated.resize(truncated.size() - 10);
  std::string gz_garbage = Images(1);
  const std::vector<Case> cases = {
      {"wrong_magic", Labels(3), 0x803, "magic number is 0x00000801"},
      {"short_header", std::string("\0\0", 2), 0x801, "truncated idx header"},
      {"short_dims", BigEndian(0x803) + BigEndian(2), 0x803,
       "truncated idx header"},
      {"truncated", truncated, 0x803, "truncated: the header promises 1568"},
      {"trailing", Images(1) + "x", 0x803, "has bytes after the 784 bytes"},
      {"huge_dims", BigEndian(0x803) + BigEndian(0xffffffff) +
                        BigEndian(0xffffffff) + BigEndian(0xffffffff) + "abc",
       0x803, "truncated"},
  };
  for (const Case& c : cases) {
    const std::string path = WriteFile(c.name, c.content);
    absl::StatusOr<IdxArray> a = ReadIdx(path, c.magic);
    ASSERT_FALSE(a.ok()) << c.name;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss) << c.name;
    EXPECT_NE(a.status().message().find(c.want), std::string::npos)
        << c.name << ": " << a.status();
    EXPECT_NE(a.status().message().find(path), std::string::npos);
  }
  // A gzip file cut in the middle.
  WriteGz(TempPath("cut.gz"), Images(50));
  std::string gz;
  {
    std::FILE* f = std::fopen(TempPath("cut.gz").c_str(), "rb");
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) gz.append(buf, n);
    std::fclose(f);
  }
  gz.resize(gz.size() / 2);
  const std::string cut = WriteFile("cut2.gz", gz);
  absl::StatusOr<IdxArray> a = ReadIdx(cut, 0x803);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss) << a.status();

  EXPECT_EQ(ReadIdx(TempPath("no-such-file"), 0x803).status().code(),
            absl::StatusCode::kNotFound);
}

DataConfig MnistConfig(const std::string& dir, uint32_t num_train = 0) {
  DataConfig c;
  c.mutable_fashion_mnist()->set_dir(dir);
  c.mutable_fashion_mnist()->set_num_train(num_train);
  return c;
}

TEST(FashionMnistTest, SmallHandWrittenFiles) {
  const std::string dir = TempPath("mnist");
  ASSERT_EQ(mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST, true);
  WriteGz(dir + "/train-images-idx3-ubyte.gz", Images(10));
  WriteGz(dir + "/train-labels-idx1-ubyte.gz", Labels(10));
  WriteFile("mnist/t10k-images-idx3-ubyte", Images(4));  // uncompressed
  WriteFile("mnist/t10k-labels-idx1-ubyte", Labels(4));

  // Worker 1 of 3 of 10 images: ShardRange gives [4, 7).
  absl::StatusOr<std::unique_ptr<Dataset>> d =
      OpenDataset(MnistConfig(dir), Split::kTrain, 1, 3, 0, false);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->schema().num_dense, 784u);
  EXPECT_EQ((*d)->schema().num_fields, 0u);
  EXPECT_EQ((*d)->schema().num_classes, 10u);
  ExampleBatch b;
  ASSERT_EQ(*(*d)->Next(2, &b), 2u);
  EXPECT_EQ(b.labels, (std::vector<float>{4, 5}));
  EXPECT_EQ(b.offsets, (std::vector<uint32_t>{0, 0, 0}));
  EXPECT_TRUE(b.keys.empty());
  ASSERT_EQ(b.dense.size(), 2u * 784);
  const uint32_t i = 4 * 784 + 100;
  EXPECT_FLOAT_EQ(b.dense[100], ((i * 7 + i / 784) % 256) / 255.0f);
  ASSERT_EQ(*(*d)->Next(5, &b), 1u);
  EXPECT_EQ(b.labels, (std::vector<float>{6}));
  EXPECT_EQ(*(*d)->Next(5, &b), 0u);
  ASSERT_TRUE((*d)->Rewind().ok());
  EXPECT_EQ(*(*d)->Next(5, &b), 3u);

  d = OpenDataset(MnistConfig(dir, 6), Split::kTrain, 0, 1, 0, false);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*(*d)->Next(100, &b), 6u);
  d = OpenDataset(MnistConfig(dir, 6), Split::kTest, 1, 3, 0, false);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*(*d)->Next(100, &b), 4u);
  EXPECT_EQ(OpenDataset(MnistConfig(dir, 11), Split::kTrain, 0, 1, 0, false)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);

  // Mismatched counts, bad labels, wrong image size, missing files.
  WriteFile("mnist/t10k-labels-idx1-ubyte", Labels(5));
  EXPECT_EQ(OpenDataset(MnistConfig(dir), Split::kTest, 0, 1, 0, false)
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  WriteFile("mnist/t10k-labels-idx1-ubyte", Labels(4, 2));
  absl::Status s =
      OpenDataset(MnistConfig(dir), Split::kTest, 0, 1, 0, false).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("label 10 of image 2"), std::string::npos) << s;
  WriteFile("mnist/t10k-labels-idx1-ubyte", Labels(4));
  WriteFile("mnist/t10k-images-idx3-ubyte", Images(4, 27, 28));
  EXPECT_EQ(OpenDataset(MnistConfig(dir), Split::kTest, 0, 1, 0, false)
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  s = OpenDataset(MnistConfig(dir + "/nope"), Split::kTest, 0, 1, 0, false)
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("t10k-"), std::string::npos);
}

TEST(FashionMnistTest, RealDebianDataset) {
  struct stat st;
  if (stat(kDefaultFashionMnistDir, &st) != 0) {
    GTEST_SKIP() << kDefaultFashionMnistDir << " not installed";
  }
  DataConfig c;
  c.mutable_fashion_mnist();  // default dir
  absl::StatusOr<std::unique_ptr<Dataset>> train =
      OpenDataset(c, Split::kTrain, 0, 1, 0, false);
  ASSERT_TRUE(train.ok()) << train.status();
  absl::StatusOr<std::unique_ptr<Dataset>> test =
      OpenDataset(c, Split::kTest, 0, 1, 0, false);
  ASSERT_TRUE(test.ok()) << test.status();
  for (auto* d : {train->get(), test->get()}) {
    ExampleBatch b;
    size_t total = 0;
    std::vector<int> per_class(10);
    float max_pixel = 0;
    for (;;) {
      absl::StatusOr<size_t> n = d->Next(4096, &b);
      ASSERT_TRUE(n.ok());
      if (*n == 0) break;
      total += *n;
      for (float l : b.labels) ++per_class[static_cast<int>(l)];
      for (float p : b.dense) max_pixel = std::max(max_pixel, p);
    }
    EXPECT_EQ(total, d == train->get() ? 60000u : 10000u);
    for (int k = 0; k < 10; ++k) EXPECT_EQ(per_class[k], total / 10);
    EXPECT_EQ(max_pixel, 1.0f);
  }
}

}  // namespace
}  // namespace ps::data
