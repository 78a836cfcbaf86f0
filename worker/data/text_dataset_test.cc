// Text-file datasets through OpenDataset (and internal::OpenTextDataset to
// force tiny buffers, so lines cross buffer boundaries).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "gtest/gtest.h"
#include "worker/data/dataset.h"
#include "worker/data/glob.h"
#include "worker/data/keys.h"
#include "worker/data/readers.h"
#include "worker/data/test_util.h"

namespace ps::data {
namespace {

using ::ps::data::testing::CriteoLine;
using ::ps::data::testing::TempPath;
using ::ps::data::testing::WriteFile;

DataConfig FilesConfig(FileDataConfig::Format format,
                       const std::vector<std::string>& train,
                       BadLinePolicy policy = SKIP) {
  DataConfig c;
  FileDataConfig* f = c.mutable_files();
  f->set_format(format);
  for (const std::string& t : train) f->add_train_files(t);
  f->add_test_files(train.empty() ? "none" : train[0]);
  f->set_on_bad_line(policy);
  return c;
}

std::unique_ptr<Dataset> MustOpen(const DataConfig& c, uint32_t rank = 0,
                                  uint32_t k = 1,
                                  Split split = Split::kTrain) {
  absl::StatusOr<std::unique_ptr<Dataset>> d =
      OpenDataset(c, split, rank, k, 0, false);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : nullptr;
}

// Reads a whole pass; returns the key of field 0 of each example (which
// identifies CriteoLine examples) and checks the batch invariants.
std::vector<uint64_t> ReadAll(Dataset* d, size_t max = 3) {
  std::vector<uint64_t> ids;
  ExampleBatch b;
  for (;;) {
    absl::StatusOr<size_t> n = d->Next(max, &b);
    EXPECT_TRUE(n.ok()) << n.status();
    if (!n.ok() || *n == 0) break;
    EXPECT_EQ(b.size, *n);
    EXPECT_EQ(b.labels.size(), *n);
    EXPECT_EQ(b.dense.size(), *n * d->schema().num_dense);
    EXPECT_EQ(b.offsets.size(), *n + 1);
    EXPECT_EQ(b.offsets.back(), b.keys.size());
    EXPECT_EQ(b.values.size(), b.keys.size());
    EXPECT_EQ(b.fields.size(), b.keys.size());
    for (size_t i = 0; i < *n; ++i) {
      ids.push_back(b.offsets[i] < b.offsets[i + 1] ? b.keys[b.offsets[i]]
                                                    : 0);
    }
  }
  return ids;
}

TEST(CriteoDatasetTest, GoodLinesCrlfBlankAndNoFinalNewline) {
  const std::string path = WriteFile(
      "good.tsv", absl::StrCat(CriteoLine(0), "\n", CriteoLine(1), "\r\n",
                               "\n\r\n", CriteoLine(2), "\n", CriteoLine(3)));
  std::unique_ptr<Dataset> d =
      MustOpen(FilesConfig(FileDataConfig::CRITEO, {path}));
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->schema().num_dense, 13u);
  EXPECT_EQ(d->schema().num_fields, 26u);
  EXPECT_EQ(d->schema().num_classes, 2u);
  EXPECT_FALSE(d->schema().has_true_logits);
  ExampleBatch b;
  absl::StatusOr<size_t> n = d->Next(100, &b);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(*n, 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(b.labels[i], static_cast<float>(i % 2));
    EXPECT_EQ(b.keys[i * 26], CriteoKey(0, i));
    EXPECT_EQ(b.offsets[i], i * 26);
    for (uint32_t f = 0; f < 26; ++f) {
      EXPECT_EQ(b.fields[i * 26 + f], f);
      EXPECT_EQ(b.values[i * 26 + f], 1.0f);
    }
  }
  EXPECT_TRUE(b.true_logits.empty());
  EXPECT_EQ(*d->Next(100, &b), 0u);
  EXPECT_EQ(b.size, 0u);
  const ReadStats s = d->stats();
  EXPECT_EQ(s.lines, 6u);  // two blank ones
  EXPECT_EQ(s.examples, 4u);
  EXPECT_EQ(s.bad_lines, 0u);
}

TEST(CriteoDatasetTest, BadLinesSkippedAndReportedWithFileAndLine) {
  std::string content;
  content += CriteoLine(0) + "\n";                       // line 1
  content += "1\t2\t3\n";                                // 2: columns
  content += CriteoLine(1) + "\n";                       // 3
  std::string bad_hex = CriteoLine(2);
  bad_hex.replace(bad_hex.rfind('\t') + 1, std::string::npos, "zz");
  content += bad_hex + "\r\n";                           // 4: C26
  content += "\n";                                       // 5: blank
  std::string bad_label = CriteoLine(3);
  bad_label[0] = '7';
  content += bad_label + "\n";                           // 6: label
  content += CriteoLine(4);                              // 7
  const std::string path = WriteFile("bad.tsv", content);

  std::unique_ptr<Dataset> d =
      MustOpen(FilesConfig(FileDataConfig::CRITEO, {path}));
  EXPECT_EQ(ReadAll(d.get()),
            (std::vector<uint64_t>{CriteoKey(0, 0), CriteoKey(0, 1),
                                   CriteoKey(0, 4)}));
  const std::vector<std::string> reports = d->bad_line_reports();
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(reports[0],
            path + ":2: has 3 tab-separated columns, expected 40");
  EXPECT_EQ(reports[1],
            path + ":4: column 40 (C26): 'zz' is not hexadecimal");
  EXPECT_EQ(reports[2], path + ":6: column 1 (label): '7' is not 0 or 1");
  EXPECT_EQ(d->stats().bad_lines, 3u);

  // A second pass counts them again but does not report them twice.
  ASSERT_TRUE(d->Rewind().ok());
  EXPECT_EQ(ReadAll(d.get()).size(), 3u);
  EXPECT_EQ(d->stats().bad_lines, 6u);
  EXPECT_EQ(d->stats().examples, 6u);
  EXPECT_EQ(d->bad_line_reports().size(), 3u);

  // FAIL stops at the first one with DATA_LOSS naming file and line.
  std::unique_ptr<Dataset> f =
      MustOpen(FilesConfig(FileDataConfig::CRITEO, {path}, FAIL));
  ExampleBatch b;
  absl::StatusOr<size_t> n = f->Next(100, &b);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(n.status().message(),
            path + ":2: has 3 tab-separated columns, expected 40");
  // Reading on continues after the bad line.
  n = f->Next(1, &b);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(b.keys[0], CriteoKey(0, 1));
}

TEST(CriteoDatasetTest, LineNumbersOfLaterWorkersCountTheWholeFile) {
  std::string content;
  for (int i = 0; i < 100; ++i) {
    content += (i == 90 ? std::string("garbage") : CriteoLine(i)) + "\n";
  }
  const std::string path = WriteFile("later.tsv", content);
  // The bad line (91) is in the last worker's share.
  std::unique_ptr<Dataset> d =
      MustOpen(FilesConfig(FileDataConfig::CRITEO, {path}), 3, 4);
  ReadAll(d.get());
  ASSERT_EQ(d->bad_line_reports().size(), 1u);
  EXPECT_EQ(d->bad_line_reports()[0],
            path + ":91: has 1 tab-separated columns, expected 40");
}

// Every line exactly once, in order, for 1..5 workers over 3 files of
// different sizes (one without a final newline, one with CRLF, an empty
// one), and buffer sizes down to a few bytes.
TEST(CriteoDatasetTest, SplitsAcrossWorkersCoverEveryExampleOnce) {
  std::vector<std::string> files;
  std::vector<uint64_t> want;
  uint64_t next = 0;
  const int sizes[] = {37, 0, 5, 101};
  for (int f = 0; f < 4; ++f) {
    std::string content;
    for (int i = 0; i < sizes[f]; ++i) {
      want.push_back(CriteoKey(0, next));
      content += CriteoLine(next++);
      if (f == 2 && i == 2) content += "\n";  // a blank line
      if (i + 1 < sizes[f] || f != 3) content += (f == 2 ? "\r\n" : "\n");
    }
    files.push_back(WriteFile(absl::StrCat("split", f, ".tsv"), content));
  }
  const DataConfig c = FilesConfig(FileDataConfig::CRITEO, files);
  for (size_t buffer : {size_t{7}, size_t{100}, size_t{4} << 20}) {
    for (uint32_t k = 1; k <= 5; ++k) {
      std::vector<uint64_t> got;
      for (uint32_t r = 0; r < k; ++r) {
        internal::LineReaderOptions opt;
        opt.buffer_bytes = buffer;
        absl::StatusOr<std::unique_ptr<Dataset>> d =
            internal::OpenTextDataset(c.files(), Split::kTrain, r, k, opt);
        ASSERT_TRUE(d.ok()) << d.status();
        const std::vector<uint64_t> part = ReadAll(d->get(), 4);
        EXPECT_EQ((*d)->stats().bad_lines, 0u);
        got.insert(got.end(), part.begin(), part.end());
        // Shares are even, up to one line each way.
        EXPECT_NEAR(static_cast<double>(part.size()),
                    static_cast<double>(want.size()) / k, 2.0)
            << "k=" << k << " r=" << r;
      }
      EXPECT_EQ(got, want) << "k=" << k << " buffer=" << buffer;
    }
  }
  // The test split is whole for every rank.
  DataConfig t = c;
  t.mutable_files()->clear_test_files();
  for (const std::string& f : files) t.mutable_files()->add_test_files(f);
  std::unique_ptr<Dataset> d = MustOpen(t, 3, 4, Split::kTest);
  EXPECT_EQ(ReadAll(d.get()), want);
}

// Many more workers than lines, and ranges that start mid-line, right at a
// line start and right after a '\r'.
TEST(CriteoDatasetTest, TinyFilesManyWorkers) {
  const std::string a = WriteFile("tiny_a.tsv", CriteoLine(0) + "\r\n");
  const std::string b =
      WriteFile("tiny_b.tsv", CriteoLine(1) + "\n" + CriteoLine(2));
  const DataConfig c = FilesConfig(FileDataConfig::CRITEO, {a, b});
  for (uint32_t k : {1u, 2u, 3u, 50u, 1000u}) {
    std::vector<uint64_t> got;
    for (uint32_t r = 0; r < k; ++r) {
      std::unique_ptr<Dataset> d = MustOpen(c, r, k);
      const std::vector<uint64_t> part = ReadAll(d.get());
      got.insert(got.end(), part.begin(), part.end());
    }
    EXPECT_EQ(got, (std::vector<uint64_t>{CriteoKey(0, 0), CriteoKey(0, 1),
                                          CriteoKey(0, 2)}))
        << k;
  }
}

TEST(CriteoDatasetTest, RewindRepeatsThePass) {
  std::string content;
  for (int i = 0; i < 50; ++i) content += CriteoLine(i) + "\n";
  const std::string path = WriteFile("rewind.tsv", content);
  std::unique_ptr<Dataset> d =
      MustOpen(FilesConfig(FileDataConfig::CRITEO, {path}), 1, 3);
  const std::vector<uint64_t> first = ReadAll(d.get(), 7);
  ASSERT_FALSE(first.empty());
  ASSERT_TRUE(d->Rewind().ok());
  EXPECT_EQ(ReadAll(d.get(), 5), first);
  // At the end of a pass Next keeps answering 0 until Rewind.
  ExampleBatch b;
  EXPECT_EQ(*d->Next(2, &b), 0u);
  // Rewind in the middle of a pass.
  ASSERT_TRUE(d->Rewind().ok());
  ASSERT_EQ(*d->Next(2, &b), 2u);
  EXPECT_EQ(d->stats().examples, 2 * first.size() + 2);
  ASSERT_TRUE(d->Rewind().ok());
  EXPECT_EQ(ReadAll(d.get(), 100), first);
  EXPECT_EQ(d->stats().examples, 3 * first.size() + 2);
}

TEST(CriteoDatasetTest, BatchReuseDoesNotReallocate) {
  std::string content;
  for (int i = 0; i < 100; ++i) content += CriteoLine(i) + "\n";
  const std::string path = WriteFile("reuse.tsv", content);
  std::unique_ptr<Dataset> d =
      MustOpen(FilesConfig(FileDataConfig::CRITEO, {path}));
  ExampleBatch b;
  ASSERT_EQ(*d->Next(16, &b), 16u);
  const uint64_t* keys = b.keys.data();
  const float* dense = b.dense.data();
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(*d->Next(16, &b), 16u);
    EXPECT_EQ(b.keys.data(), keys);
    EXPECT_EQ(b.dense.data(), dense);
  }
}

TEST(FilesDatasetTest, LongLinesAreBadLinesNotMemory) {
  const std::string path = WriteFile(
      "long.tsv", CriteoLine(0) + "\n" + std::string(5000, 'x') + "\n" +
                      CriteoLine(1) + "\n" + std::string(3000, 'y'));
  DataConfig c = FilesConfig(FileDataConfig::CRITEO, {path});
  internal::LineReaderOptions opt;
  opt.buffer_bytes = 64;
  opt.max_line_bytes = 1000;
  absl::StatusOr<std::unique_ptr<Dataset>> d =
      internal::OpenTextDataset(c.files(), Split::kTrain, 0, 1, opt);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(ReadAll(d->get()),
            (std::vector<uint64_t>{CriteoKey(0, 0), CriteoKey(0, 1)}));
  EXPECT_EQ((*d)->bad_line_reports(),
            (std::vector<std::string>{
                path + ":2: line is longer than 1000 bytes",
                path + ":4: line is longer than 1000 bytes"}));
}

TEST(FilesDatasetTest, LibsvmThroughOpenDataset) {
  const std::string path = WriteFile(
      "data.svm",
      "+1 1:0.5 3:2 # first\n-1 qid:4 2:1\r\n\n# comment only\n0\n"
      "1 bad\n1 4:inf\n1 7:1");
  DataConfig c = FilesConfig(FileDataConfig::LIBSVM, {path});
  c.mutable_files()->set_hash_buckets(1 << 20);
  std::unique_ptr<Dataset> d = MustOpen(c);
  EXPECT_EQ(d->schema().num_dense, 0u);
  EXPECT_EQ(d->schema().num_fields, 1u);
  ExampleBatch b;
  ASSERT_EQ(*d->Next(10, &b), 4u);
  EXPECT_EQ(b.labels, (std::vector<float>{1, 0, 0, 1}));
  EXPECT_EQ(b.offsets, (std::vector<uint32_t>{0, 2, 3, 3, 4}));
  const uint64_t m = 1 << 20;
  EXPECT_EQ(b.keys, (std::vector<uint64_t>{LibsvmKey(1) % m, LibsvmKey(3) % m,
                                           LibsvmKey(2) % m,
                                           LibsvmKey(7) % m}));
  EXPECT_EQ(b.values, (std::vector<float>{0.5f, 2, 1, 1}));
  EXPECT_EQ(b.fields, (std::vector<uint32_t>(4, 0)));
  EXPECT_TRUE(b.dense.empty());
  EXPECT_EQ(d->bad_line_reports(),
            (std::vector<std::string>{
                path + ":6: token 2 'bad' is not index:value",
                path + ":7: token 2 '4:inf': value is not finite"}));
}

TEST(FilesDatasetTest, GlobsAndOpenErrors) {
  const std::string dir = TempPath("globdir");
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  WriteFile("globdir/part-2.tsv", CriteoLine(2) + "\n");
  WriteFile("globdir/part-1.tsv", CriteoLine(1) + "\n");
  WriteFile("globdir/part-10.tsv", CriteoLine(10) + "\n");
  absl::StatusOr<std::vector<std::string>> g =
      ExpandGlobs({dir + "/part-?.tsv", dir + "/part-*.tsv"});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(*g, (std::vector<std::string>{dir + "/part-1.tsv",
                                          dir + "/part-2.tsv",
                                          dir + "/part-10.tsv"}));

  std::unique_ptr<Dataset> d =
      MustOpen(FilesConfig(FileDataConfig::CRITEO, {dir + "/part-*.tsv"}));
  EXPECT_EQ(ReadAll(d.get()),
            (std::vector<uint64_t>{CriteoKey(0, 1), CriteoKey(0, 10),
                                   CriteoKey(0, 2)}));

  absl::StatusOr<std::unique_ptr<Dataset>> bad = OpenDataset(
      FilesConfig(FileDataConfig::CRITEO, {dir + "/nothing-*.tsv"}),
      Split::kTrain, 0, 1, 0, false);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("nothing-*.tsv"), std::string::npos);

  bad = OpenDataset(FilesConfig(FileDataConfig::CRITEO, {dir}), Split::kTrain,
                    0, 1, 0, false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument)
      << bad.status();

  if (geteuid() != 0) {
    const std::string locked = WriteFile("locked.tsv", CriteoLine(0));
    ASSERT_EQ(chmod(locked.c_str(), 0), 0);
    bad = OpenDataset(FilesConfig(FileDataConfig::CRITEO, {locked}),
                      Split::kTrain, 0, 1, 0, false);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kPermissionDenied)
        << bad.status();
    EXPECT_NE(bad.status().message().find(locked), std::string::npos);
  }

  DataConfig no_format = FilesConfig(FileDataConfig::FORMAT_UNSPECIFIED,
                                     {dir + "/part-1.tsv"});
  EXPECT_EQ(OpenDataset(no_format, Split::kTrain, 0, 1, 0, false)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenDataset(FilesConfig(FileDataConfig::CRITEO, {}),
                        Split::kTrain, 0, 1, 0, false)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenDataset(FilesConfig(FileDataConfig::CRITEO,
                                    {dir + "/part-1.tsv"}),
                        Split::kTrain, 2, 2, 0, false)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenDataset(DataConfig(), Split::kTrain, 0, 1, 0, false)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Files of random bytes and mutated lines never crash the reader.
TEST(FilesDatasetTest, GarbageFilesNeverCrash) {
  // Thousands of bad lines would be logged; the test is about not crashing.
  const std::shared_ptr<spdlog::logger> log = GetLogger("data");
  const spdlog::level::level_enum level = log->level();
  log->set_level(spdlog::level::off);
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 40; ++iter) {
    std::string content;
    const size_t n = rng() % 5000;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t r = rng();
      content.push_back(r % 13 == 0 ? '\n' : r % 11 == 0 ? '\t'
                                                         : static_cast<char>(r >> 8));
    }
    if (iter % 2 == 0) content += CriteoLine(iter) + "\n";
    const std::string path = WriteFile("garbage.bin", content);
    for (auto format : {FileDataConfig::CRITEO, FileDataConfig::LIBSVM}) {
      for (uint32_t k : {1u, 3u}) {
        for (uint32_t r = 0; r < k; ++r) {
          internal::LineReaderOptions opt;
          opt.buffer_bytes = 1 + rng() % 200;
          opt.max_line_bytes = 1 + rng() % 3000;
          absl::StatusOr<std::unique_ptr<Dataset>> d =
              internal::OpenTextDataset(FilesConfig(format, {path}).files(),
                                        Split::kTrain, r, k, opt);
          ASSERT_TRUE(d.ok()) << d.status();
          ReadAll(d->get(), 1 + rng() % 10);
          EXPECT_LE((*d)->bad_line_reports().size(), 100u);
        }
      }
    }
  }
  log->set_level(level);
}

// A file of many 4 MiB read buffers (~64 MB) gives every line exactly once
// on every pass. (Speed belongs in benchmarks, not here.)
TEST(CriteoDatasetTest, LargeFileGivesEveryLineOncePerPass) {
  const std::string path = TempPath("large.tsv");
  uint64_t lines = 0;
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::string chunk;
    for (int i = 0; i < 4096; ++i) chunk += CriteoLine(i * 31 + 5) + "\n";
    size_t written = 0;
    while (written < (size_t{64} << 20)) {
      written += std::fwrite(chunk.data(), 1, chunk.size(), f);
      lines += 4096;
    }
    std::fclose(f);
  }
  std::unique_ptr<Dataset> d =
      MustOpen(FilesConfig(FileDataConfig::CRITEO, {path}));
  ExampleBatch b;
  for (int pass = 0; pass < 2; ++pass) {
    if (pass > 0) {
      ASSERT_TRUE(d->Rewind().ok());
    }
    uint64_t examples = 0;
    for (;;) {
      absl::StatusOr<size_t> n = d->Next(1024, &b);
      ASSERT_TRUE(n.ok());
      if (*n == 0) break;
      examples += *n;
    }
    EXPECT_EQ(examples, lines) << "pass " << pass;
  }
  EXPECT_EQ(d->stats().bad_lines, 0u);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace ps::data
