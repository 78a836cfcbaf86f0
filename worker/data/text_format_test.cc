#include "worker/data/text_format.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "worker/data/keys.h"

namespace ps::data::internal {
namespace {

// 40 columns: label, I1..I13, C1..C26, from explicit pieces.
std::string Join(const std::string& label, std::vector<std::string> ints,
                 std::vector<std::string> cats) {
  ints.resize(13);
  cats.resize(26);
  return absl::StrCat(label, "\t", absl::StrJoin(ints, "\t"), "\t",
                      absl::StrJoin(cats, "\t"));
}

TEST(CriteoParserTest, ParsesValuesAndEmptyFields) {
  CriteoParser p;
  CriteoExample ex;
  std::string reason;
  const std::string line =
      Join("1", {"5", "", "-3", "0", "+2"}, {"68fd1e64", "", "ABCDEF12", "a"});
  ASSERT_TRUE(p.Parse(line, &ex, &reason)) << reason;
  EXPECT_EQ(ex.label, 1.0f);
  EXPECT_FLOAT_EQ(ex.dense[0], std::log1p(5.0f));
  EXPECT_EQ(ex.dense[1], 0.0f);  // empty
  EXPECT_EQ(ex.dense[2], 0.0f);  // negative
  EXPECT_EQ(ex.dense[3], 0.0f);
  EXPECT_FLOAT_EQ(ex.dense[4], std::log1p(2.0f));
  for (int j = 5; j < 13; ++j) EXPECT_EQ(ex.dense[j], 0.0f);
  EXPECT_EQ(ex.keys[0], CriteoKey(0, 0x68fd1e64));
  EXPECT_EQ(ex.keys[1], CriteoKey(1, kCriteoMissing));
  EXPECT_EQ(ex.keys[2], CriteoKey(2, 0xabcdef12));  // case-insensitive
  EXPECT_EQ(ex.keys[3], CriteoKey(3, 0xa));
  EXPECT_EQ(ex.keys[25], CriteoKey(25, kCriteoMissing));
  EXPECT_NE(CriteoKey(0, 5), CriteoKey(1, 5));

  // Large integers: a table lookup below 4096, log1p above, saturation far
  // above.
  ASSERT_TRUE(p.Parse(Join("0", {"4095", "4096", "123456789012345678901234"},
                           {}),
                      &ex, &reason))
      << reason;
  EXPECT_EQ(ex.label, 0.0f);
  EXPECT_FLOAT_EQ(ex.dense[0], std::log1p(4095.0f));
  EXPECT_FLOAT_EQ(ex.dense[1], std::log1p(4096.0f));
  EXPECT_GT(ex.dense[2], 40.0f);
  EXPECT_TRUE(std::isfinite(ex.dense[2]));

  // A label written as a number other than a single digit.
  ASSERT_TRUE(p.Parse(Join("1.0", {}, {}), &ex, &reason)) << reason;
  EXPECT_EQ(ex.label, 1.0f);
}

TEST(CriteoParserTest, HashBuckets) {
  CriteoParser p(1000);
  CriteoExample ex;
  std::string reason;
  ASSERT_TRUE(p.Parse(Join("0", {}, {"ff", ""}), &ex, &reason));
  EXPECT_EQ(ex.keys[0], CriteoKey(0, 0xff) % 1000);
  EXPECT_EQ(ex.keys[1], CriteoKey(1, kCriteoMissing) % 1000);
  for (uint64_t k : ex.keys) EXPECT_LT(k, 1000u);
}

TEST(CriteoParserTest, EveryBadKindNamesItsColumn) {
  CriteoParser p;
  CriteoExample ex;
  struct Case {
    std::string line;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"1\t2\t3", "has 3 tab-separated columns, expected 40"},
      {Join("1", {}, {}) + "\textra", "has 41 tab-separated columns"},
      {Join("x", {}, {}), "column 1 (label): 'x' is not a number"},
      {Join("", {}, {}), "column 1 (label): '' is not a number"},
      {Join("2", {}, {}), "column 1 (label): '2' is not 0 or 1"},
      {Join("1", {"", "3.5"}, {}), "column 3 (I2): '3.5' is not an integer"},
      {Join("1", {"", "", "abc"}, {}),
       "column 4 (I3): 'abc' is not an integer"},
      {Join("1", {"-"}, {}), "column 2 (I1): '-' is not an integer"},
      {Join("1", {}, {"", "zz"}), "column 16 (C2): 'zz' is not hexadecimal"},
      {Join("1", {}, {"123456789"}),
       "column 15 (C1): '123456789' is longer than 8 hexadecimal digits"},
      {Join("1", {}, {"", "", "", "", "", "", "", "", "", "", "", "", "", "",
                      "", "", "", "", "", "", "", "", "", "", "", "g"}),
       "column 40 (C26): 'g' is not hexadecimal"},
  };
  for (const Case& c : cases) {
    std::string reason;
    EXPECT_FALSE(p.Parse(c.line, &ex, &reason)) << c.line;
    EXPECT_NE(reason.find(c.reason), std::string::npos)
        << "got: " << reason << "\nwant: " << c.reason;
  }
}

TEST(LibsvmParserTest, LabelsQidCommentsAndValues) {
  LibsvmParser p;
  float label = -5;
  std::vector<uint64_t> keys;
  std::vector<float> values;
  std::string reason;
  ASSERT_EQ(p.Parse("+1 qid:3 1:0.5 7:-2e3\t12:1 # a comment 3:4", &label,
                    &keys, &values, &reason),
            ParseResult::kOk)
      << reason;
  EXPECT_EQ(label, 1.0f);
  EXPECT_EQ(keys, (std::vector<uint64_t>{LibsvmKey(1), LibsvmKey(7),
                                         LibsvmKey(12)}));
  EXPECT_EQ(values, (std::vector<float>{0.5f, -2000.0f, 1.0f}));

  for (const char* neg : {"-1", "0", "-1.0"}) {
    keys.clear();
    values.clear();
    ASSERT_EQ(p.Parse(absl::StrCat(neg, " 3:1"), &label, &keys, &values,
                      &reason),
              ParseResult::kOk)
        << neg;
    EXPECT_EQ(label, 0.0f);
  }
  ASSERT_EQ(p.Parse("1", &label, &keys, &values, &reason), ParseResult::kOk);
  EXPECT_EQ(label, 1.0f);
  EXPECT_EQ(p.Parse("", &label, &keys, &values, &reason), ParseResult::kBlank);
  EXPECT_EQ(p.Parse("  \t ", &label, &keys, &values, &reason),
            ParseResult::kBlank);
  EXPECT_EQ(p.Parse("# only a comment", &label, &keys, &values, &reason),
            ParseResult::kBlank);
}

TEST(LibsvmParserTest, HashBuckets) {
  LibsvmParser p(10);
  float label;
  std::vector<uint64_t> keys;
  std::vector<float> values;
  std::string reason;
  ASSERT_EQ(p.Parse("1 123:1 456:2", &label, &keys, &values, &reason),
            ParseResult::kOk);
  EXPECT_EQ(keys, (std::vector<uint64_t>{LibsvmKey(123) % 10,
                                         LibsvmKey(456) % 10}));
}

TEST(LibsvmParserTest, BadLines) {
  LibsvmParser p;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"2 1:1", "label '2' is not one of 1, +1, 0, -1"},
      {"yes 1:1", "label 'yes' is not one of"},
      {"1 17", "token 2 '17' is not index:value"},
      {"1 1:1 x:2", "token 3 'x:2': index is not a non-negative integer"},
      {"1 -3:2", "index is not a non-negative integer"},
      {"1 :2", "index is not a non-negative integer"},
      {"1 3:", "value is not a number"},
      {"1 3:abc", "value is not a number"},
      {"1 3:1:2", "value is not a number"},
      {"1 3:nan", "value is not finite"},
      {"1 3:inf", "value is not finite"},
      {"1 3:1e999", "value is not finite"},
      {"1 3:1e39", "value is not finite"},  // finite double, not float
  };
  for (const auto& [line, want] : cases) {
    float label;
    std::vector<uint64_t> keys;
    std::vector<float> values;
    std::string reason;
    EXPECT_EQ(p.Parse(line, &label, &keys, &values, &reason),
              ParseResult::kBad)
        << line;
    EXPECT_NE(reason.find(want), std::string::npos)
        << line << " -> " << reason;
  }
  // Underflow is not an error: the value is just tiny.
  float label;
  std::vector<uint64_t> keys;
  std::vector<float> values;
  std::string reason;
  EXPECT_EQ(p.Parse("1 3:1e-400", &label, &keys, &values, &reason),
            ParseResult::kOk)
      << reason;
}

// Random bytes, and random mutations of good lines, never crash a parser.
TEST(ParserFuzzTest, RandomInputNeverCrashes) {
  std::mt19937_64 rng(42);
  CriteoParser criteo(97);
  LibsvmParser libsvm;
  const std::string good_criteo =
      Join("1", {"5", "", "-3", "7"}, {"68fd1e64", "", "ab"});
  const std::string good_libsvm = "-1 qid:2 1:0.5 99:3 # c";
  const std::string alphabet = "0123456789abcdefxyz+-.:#eE \t\r\x80\xff";
  int criteo_ok = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s;
    switch (iter % 3) {
      case 0: {  // random bytes
        const size_t n = rng() % 300;
        for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>(rng()));
        break;
      }
      case 1: {  // mutated Criteo line
        s = good_criteo;
        for (int m = 0; m < 3; ++m) {
          s[rng() % s.size()] = alphabet[rng() % alphabet.size()];
        }
        break;
      }
      case 2: {  // mutated libsvm line
        s = good_libsvm;
        for (int m = 0; m < 3; ++m) {
          s[rng() % s.size()] = alphabet[rng() % alphabet.size()];
        }
        break;
      }
    }
    CriteoExample ex;
    std::string reason;
    if (criteo.Parse(s, &ex, &reason)) {
      ++criteo_ok;
      for (uint64_t k : ex.keys) ASSERT_LT(k, 97u);
      for (float d : ex.dense) ASSERT_TRUE(std::isfinite(d));
    } else {
      ASSERT_FALSE(reason.empty());
    }
    float label;
    std::vector<uint64_t> keys;
    std::vector<float> values;
    if (libsvm.Parse(s, &label, &keys, &values, &reason) == ParseResult::kOk) {
      ASSERT_TRUE(label == 0 || label == 1);
      for (float v : values) ASSERT_TRUE(std::isfinite(v));
    }
  }
  EXPECT_GT(criteo_ok, 0);  // some mutations stay valid
}

}  // namespace
}  // namespace ps::data::internal
