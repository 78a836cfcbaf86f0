// Dataset::Skip for every reader: after Skip(k) a pass continues exactly
// where reading k examples and dropping them would have left it, which is
// what resuming a data shard at a batch index relies on (worker/trainer.cc).
#include <sys/stat.h>

#include <cerrno>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/data/dataset.h"
#include "worker/data/test_util.h"

namespace ps::data {
namespace {

using ::ps::data::testing::CriteoLine;
using ::ps::data::testing::TempPath;
using ::ps::data::testing::WriteFile;

// One example, every field of it.
struct Example {
  float label = 0;
  float true_logit = 0;
  std::vector<float> dense;
  std::vector<uint64_t> keys;
  std::vector<float> values;
  std::vector<uint32_t> fields;

  bool operator==(const Example& o) const {
    return label == o.label && true_logit == o.true_logit &&
           dense == o.dense && keys == o.keys && values == o.values &&
           fields == o.fields;
  }
};

void Split(const ExampleBatch& b, std::vector<Example>* out) {
  ASSERT_EQ(b.offsets.size(), b.size + 1);
  for (size_t i = 0; i < b.size; ++i) {
    Example e;
    e.label = b.labels[i];
    if (!b.true_logits.empty()) e.true_logit = b.true_logits[i];
    e.dense.assign(b.dense.begin() + i * b.num_dense,
                   b.dense.begin() + (i + 1) * b.num_dense);
    const uint32_t lo = b.offsets[i], hi = b.offsets[i + 1];
    e.keys.assign(b.keys.begin() + lo, b.keys.begin() + hi);
    e.values.assign(b.values.begin() + lo, b.values.begin() + hi);
    e.fields.assign(b.fields.begin() + lo, b.fields.begin() + hi);
    out->push_back(std::move(e));
  }
}

// The rest of the pass, read `max` at a time.
std::vector<Example> ReadRest(Dataset* d, size_t max) {
  std::vector<Example> all;
  ExampleBatch b;
  for (;;) {
    absl::StatusOr<size_t> n = d->Next(max, &b);
    EXPECT_TRUE(n.ok()) << n.status();
    if (!n.ok() || *n == 0) break;
    Split(b, &all);
  }
  return all;
}

using Opener = std::function<absl::StatusOr<std::unique_ptr<Dataset>>()>;

std::unique_ptr<Dataset> MustOpen(const Opener& open) {
  absl::StatusOr<std::unique_ptr<Dataset>> d = open();
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : nullptr;
}

// For each skip count k (examples): a fresh reader that skips k and reads
// on equals the full pass without its first k examples; the same holds in
// a later pass (after Rewind), after Skip(0), and for a skip in two parts.
// A skip past the end returns what was left and ends the pass.
void ExpectSkipEqualsReadAndDrop(const Opener& open,
                                 const std::vector<uint64_t>& skips,
                                 size_t batch) {
  std::unique_ptr<Dataset> ref = MustOpen(open);
  ASSERT_NE(ref, nullptr);
  const std::vector<Example> all = ReadRest(ref.get(), 1);
  ASSERT_GT(all.size(), 0u);
  const ReadStats full = ref->stats();
  for (uint64_t k : skips) {
    SCOPED_TRACE(absl::StrCat("skip ", k, " of ", all.size(), ", batch ", batch));
    const std::vector<Example> want(
        all.begin() + std::min<uint64_t>(k, all.size()), all.end());
    std::unique_ptr<Dataset> d = MustOpen(open);
    ASSERT_NE(d, nullptr);
    absl::StatusOr<uint64_t> skipped = d->Skip(k);
    ASSERT_TRUE(skipped.ok()) << skipped.status();
    EXPECT_EQ(*skipped, std::min<uint64_t>(k, all.size()));
    EXPECT_TRUE(ReadRest(d.get(), batch) == want);
    // Skipped examples count as read: a whole pass is a whole pass.
    EXPECT_EQ(d->stats().examples, full.examples);
    EXPECT_EQ(d->stats().lines, full.lines);
    EXPECT_EQ(d->stats().bad_lines, full.bad_lines);

    // The second pass, skipping in two parts.
    ASSERT_TRUE(d->Rewind().ok());
    ASSERT_EQ(*d->Skip(0), 0u);
    ASSERT_EQ(*d->Skip(k / 2), std::min<uint64_t>(k / 2, all.size()));
    ASSERT_EQ(*d->Skip(k - k / 2),
              std::min<uint64_t>(k, all.size()) -
                  std::min<uint64_t>(k / 2, all.size()));
    EXPECT_TRUE(ReadRest(d.get(), batch) == want);
    EXPECT_EQ(*d->Skip(1), 0u);  // the pass is over
  }
  // Skipping after some batches were read, as a resumed step loop does not
  // but a caller may: position is position.
  std::unique_ptr<Dataset> d = MustOpen(open);
  ASSERT_NE(d, nullptr);
  ExampleBatch b;
  ASSERT_TRUE(d->Next(batch, &b).ok());
  ASSERT_TRUE(d->Skip(batch).ok());
  const size_t from = std::min(all.size(), 2 * batch);
  EXPECT_TRUE(ReadRest(d.get(), batch) ==
              std::vector<Example>(all.begin() + from, all.end()));
}

DataConfig SyntheticConfig() {
  DataConfig c;
  SyntheticCtrConfig* s = c.mutable_synthetic_ctr();
  s->set_num_train(1003);
  s->set_num_test(10);
  s->set_num_categorical(4);
  s->set_num_numeric(2);
  return c;
}

TEST(SkipTest, SyntheticContiguous) {
  for (uint32_t k : {1u, 3u}) {
    for (uint32_t r = 0; r < k; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " of ", k));
      ExpectSkipEqualsReadAndDrop(
          [&] {
            return OpenDataset(SyntheticConfig(), Split::kTrain, r, k, 32,
                                false);
          },
          {0, 1, 31, 32, 33, 64 * 5, 333, 334, 1003, 5000}, 32);
    }
  }
}

// shard_by_batch: whole batches are stepped over at once; skips that end
// mid-batch, on the last (short) batch and past the end.
TEST(SkipTest, SyntheticShardByBatch) {
  for (uint32_t k : {1u, 2u, 5u}) {
    for (uint32_t r = 0; r < k; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " of ", k));
      ExpectSkipEqualsReadAndDrop(
          [&] {
            return OpenDataset(SyntheticConfig(), Split::kTrain, r, k, 16,
                                true);
          },
          {0, 1, 15, 16, 17, 48, 160, 199, 200, 201, 250, 1003, 4000}, 16);
    }
  }
}

DataConfig FilesConfig(FileDataConfig::Format format,
                       const std::vector<std::string>& train,
                       BadLinePolicy policy = SKIP) {
  DataConfig c;
  FileDataConfig* f = c.mutable_files();
  f->set_format(format);
  for (const std::string& t : train) f->add_train_files(t);
  f->add_test_files(train[0]);
  f->set_on_bad_line(policy);
  return c;
}

// Two files of good, blank and malformed lines: skipping counts examples,
// never blank or bad lines, and still counts the bad lines it passed.
TEST(SkipTest, CriteoFilesWithBlankAndBadLines) {
  std::string a, b;
  for (int i = 0; i < 150; ++i) {
    absl::StrAppend(&a, CriteoLine(i), "\n");
    if (i % 17 == 0) absl::StrAppend(&a, "\n");
    if (i % 23 == 0) absl::StrAppend(&a, "1\tnot a criteo line\n");
  }
  for (int i = 150; i < 230; ++i) {
    absl::StrAppend(&b, CriteoLine(i), i % 11 == 0 ? "\r\n" : "\n");
  }
  const std::string pa = WriteFile("skip-a.tsv", a);
  const std::string pb = WriteFile("skip-b.tsv", b + "2\tbad label");
  const DataConfig c = FilesConfig(FileDataConfig::CRITEO, {pa, pb});
  for (uint32_t k : {1u, 2u, 3u}) {
    for (uint32_t r = 0; r < k; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " of ", k));
      ExpectSkipEqualsReadAndDrop(
          [&] { return OpenDataset(c, Split::kTrain, r, k, 0, false); },
          {0, 1, 9, 10, 11, 40, 75, 76, 150, 229, 230, 231, 10000}, 10);
    }
  }
}

TEST(SkipTest, LibsvmFile) {
  std::string text;
  for (int i = 0; i < 120; ++i) {
    absl::StrAppend(&text, i % 2 ? "+1" : "-1", " ", i + 1, ":0.5 ", i + 1000,
                    ":", i, i % 13 == 0 ? " # comment" : "", "\n");
    if (i % 19 == 0) absl::StrAppend(&text, "1 bad\n\n");
  }
  const DataConfig c =
      FilesConfig(FileDataConfig::LIBSVM, {WriteFile("skip.svm", text)});
  for (uint32_t k : {1u, 2u}) {
    for (uint32_t r = 0; r < k; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " of ", k));
      ExpectSkipEqualsReadAndDrop(
          [&] { return OpenDataset(c, Split::kTrain, r, k, 0, false); },
          {0, 1, 7, 8, 59, 60, 61, 119, 120, 500}, 8);
    }
  }
}

// Under on_bad_line FAIL a skip over a malformed line fails as reading it
// would, naming the line.
TEST(SkipTest, BadLineInTheSkippedPartFailsUnderFail) {
  const std::string path = WriteFile(
      "skip-fail.tsv", absl::StrCat(CriteoLine(0), "\n", CriteoLine(1),
                                    "\nnonsense\n", CriteoLine(3), "\n"));
  absl::StatusOr<std::unique_ptr<Dataset>> d =
      OpenDataset(FilesConfig(FileDataConfig::CRITEO, {path}, FAIL),
                  Split::kTrain, 0, 1, 0, false);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*(*d)->Skip(2), 2u);
  absl::StatusOr<uint64_t> s = (*d)->Skip(1);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << s.status();
  EXPECT_NE(s.status().message().find(path + ":3"), std::string::npos)
      << s.status();
}

std::string BigEndian(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}

TEST(SkipTest, FashionMnist) {
  const std::string dir = TempPath("skip-mnist");
  ASSERT_TRUE(mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST);
  constexpr uint32_t kCount = 53;
  std::string images = BigEndian(0x803) + BigEndian(kCount) + BigEndian(28) +
                       BigEndian(28);
  for (uint32_t i = 0; i < kCount * 784; ++i) {
    images.push_back(static_cast<char>((i * 7 + i / 784) % 256));
  }
  std::string labels = BigEndian(0x801) + BigEndian(kCount);
  for (uint32_t i = 0; i < kCount; ++i) labels.push_back(static_cast<char>(i % 10));
  WriteFile("skip-mnist/train-images-idx3-ubyte", images);
  WriteFile("skip-mnist/train-labels-idx1-ubyte", labels);
  DataConfig c;
  c.mutable_fashion_mnist()->set_dir(dir);
  for (uint32_t k : {1u, 3u}) {
    for (uint32_t r = 0; r < k; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " of ", k));
      ExpectSkipEqualsReadAndDrop(
          [&] { return OpenDataset(c, Split::kTrain, r, k, 0, false); },
          {0, 1, 4, 5, 17, 18, 53, 100}, 5);
    }
  }
}

// The real files when Debian's dataset-fashion-mnist is installed.
TEST(SkipTest, RealFashionMnist) {
  struct stat st;
  if (stat(kDefaultFashionMnistDir, &st) != 0) {
    GTEST_SKIP() << kDefaultFashionMnistDir << " not installed";
  }
  DataConfig c;
  c.mutable_fashion_mnist()->set_num_train(1000);
  ExpectSkipEqualsReadAndDrop(
      [&] { return OpenDataset(c, Split::kTrain, 1, 2, 0, false); },
      {0, 100, 500}, 64);
}

}  // namespace
}  // namespace ps::data
