#include "server/table.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "google/protobuf/text_format.h"
#include "server/optimizer.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "proto/data_plane.pb.h"
#include "server/initializer.h"

namespace ps {
namespace {

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

TableConfig SparseConfig(uint32_t id, uint32_t dim, float lr,
                         InitializerConfig::Kind kind = InitializerConfig::ZEROS) {
  TableConfig c;
  c.set_id(id);
  c.set_name("sparse");
  c.mutable_sparse()->set_dim(dim);
  c.mutable_optimizer()->mutable_sgd()->set_learning_rate(lr);
  c.mutable_init()->set_kind(kind);
  return c;
}

TableConfig DenseConfig(uint32_t id, uint64_t size, uint32_t block_size,
                        float lr) {
  TableConfig c;
  c.set_id(id);
  c.set_name("dense");
  c.mutable_dense()->set_size(size);
  c.mutable_dense()->set_block_size(block_size);
  c.mutable_optimizer()->mutable_sgd()->set_learning_rate(lr);
  return c;
}

std::unique_ptr<Table> MustCreate(const TableConfig& config) {
  auto table = Table::Create(config);
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? std::move(table).value() : nullptr;
}

std::unique_ptr<SparseTable> MustCreateSparse(const TableConfig& config) {
  std::unique_ptr<Table> t = MustCreate(config);
  if (t == nullptr || t->AsSparse() == nullptr) {
    ADD_FAILURE() << "not a sparse table";
    return nullptr;
  }
  return std::unique_ptr<SparseTable>(static_cast<SparseTable*>(t.release()));
}

std::unique_ptr<DenseTable> MustCreateDense(const TableConfig& config) {
  std::unique_ptr<Table> t = MustCreate(config);
  if (t == nullptr || t->AsDense() == nullptr) {
    ADD_FAILURE() << "not a dense table";
    return nullptr;
  }
  return std::unique_ptr<DenseTable>(static_cast<DenseTable*>(t.release()));
}

std::vector<float> PullSparse(SparseTable& t, const std::vector<uint64_t>& keys) {
  std::vector<float> out(keys.size() * t.dim(), -12345.0f);
  t.Pull(keys, out.data());
  return out;
}

Segments MakeSegments(
    const std::vector<std::pair<uint64_t, uint64_t>>& begin_length) {
  Segments segments;
  for (const auto& [begin, length] : begin_length) {
    DenseSegment* s = segments.Add();
    s->set_begin(begin);
    s->set_length(length);
  }
  return segments;
}

std::vector<float> PullDense(DenseTable& t, const Segments& segments) {
  uint64_t n = 0;
  for (const DenseSegment& s : segments) n += s.length();
  std::vector<float> out(n, -12345.0f);
  t.Pull(segments, out.data());
  return out;
}

// Reads the whole table, one segment per block.
std::vector<float> PullAllDense(DenseTable& t) {
  std::vector<std::pair<uint64_t, uint64_t>> segs;
  for (uint64_t b = 0; b < t.size(); b += t.block_size()) {
    segs.push_back({b, std::min(t.block_size(), t.size() - b)});
  }
  return PullDense(t, MakeSegments(segs));
}

// ------------------------------------------------------------ Table::Create

TEST(TableCreateTest, BuildsTheRequestedKind) {
  auto sparse = MustCreate(SparseConfig(3, 4, 0.1f));
  ASSERT_NE(sparse, nullptr);
  EXPECT_EQ(sparse->id(), 3u);
  ASSERT_NE(sparse->AsSparse(), nullptr);
  EXPECT_EQ(sparse->AsDense(), nullptr);
  EXPECT_EQ(sparse->AsSparse()->dim(), 4u);

  auto dense = MustCreate(DenseConfig(5, 10, 4, 0.1f));
  ASSERT_NE(dense, nullptr);
  EXPECT_EQ(dense->id(), 5u);
  EXPECT_EQ(dense->AsSparse(), nullptr);
  ASSERT_NE(dense->AsDense(), nullptr);
  EXPECT_EQ(dense->AsDense()->size(), 10u);
  EXPECT_EQ(dense->AsDense()->block_size(), 4u);
}

TEST(TableCreateTest, RejectsBadConfigs) {
  TableConfig neither;
  neither.set_name("neither");
  neither.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);

  TableConfig no_optimizer = SparseConfig(0, 2, 0.1f);
  no_optimizer.clear_optimizer();
  TableConfig zero_lr = SparseConfig(0, 2, 0.0f);
  TableConfig nan_lr = DenseConfig(0, 10, 4, std::nanf(""));
  TableConfig negative_acc = SparseConfig(0, 2, 0.1f);
  negative_acc.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.1f);
  negative_acc.mutable_optimizer()->mutable_adagrad()->set_epsilon(1e-8f);
  negative_acc.mutable_optimizer()->mutable_adagrad()->set_initial_accumulator(
      -1.0f);
  const TableConfig zero_dim = SparseConfig(0, 0, 0.1f);
  const TableConfig zero_size = DenseConfig(0, 0, 4, 0.1f);
  const TableConfig zero_block = DenseConfig(0, 10, 0, 0.1f);

  const std::pair<const char*, const TableConfig*> cases[] = {
      {"neither sparse nor dense", &neither},
      {"no optimizer", &no_optimizer},
      {"lr 0", &zero_lr},
      {"lr NaN", &nan_lr},
      {"negative accumulator", &negative_acc},
      {"sparse dim 0", &zero_dim},
      {"dense size 0", &zero_size},
      {"dense block_size 0", &zero_block},
  };
  for (const auto& [name, config] : cases) {
    SCOPED_TRACE(name);
    auto t = Table::Create(*config);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(t.status().message().empty());
  }
}

// ------------------------------------------------------------ SparseTable

TEST(SparseTableTest, PullsAnswerInitialValuesAndPushesCreateRows) {
  auto t = MustCreateSparse(SparseConfig(0, 3, 0.5f, InitializerConfig::ZEROS));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->num_rows(), 0u);
  EXPECT_EQ(PullSparse(*t, {5, 9}), std::vector<float>(6, 0.0f));
  // A pull creates nothing: a key only ever read holds no memory.
  EXPECT_EQ(t->num_rows(), 0u);
  const std::vector<float> g(9, 1.0f);
  t->Push({9, 5, 9}, g.data());
  EXPECT_EQ(t->num_rows(), 2u);
  PullSparse(*t, {5, 1ULL << 63});
  EXPECT_EQ(t->num_rows(), 2u);
  t->Push({1ULL << 63}, g.data());
  EXPECT_EQ(t->num_rows(), 3u);
  EXPECT_EQ(t->counters().admissions, 3u);
  EXPECT_EQ(t->counters().keys_pushed, 4u);
  EXPECT_EQ(t->counters().keys_pulled, 4u);
}

TEST(SparseTableTest, ConstantInit) {
  TableConfig c = SparseConfig(0, 2, 0.5f, InitializerConfig::CONSTANT);
  c.mutable_init()->set_value(1.5f);
  auto t = MustCreateSparse(c);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(PullSparse(*t, {0, kU64Max, 77}), std::vector<float>(6, 1.5f));
}

TEST(SparseTableTest, UniformInitInRangeAndMatchesInitializer) {
  TableConfig c = SparseConfig(7, 4, 0.5f, InitializerConfig::UNIFORM);
  c.mutable_init()->set_scale(0.1f);
  c.mutable_init()->set_seed(42);
  auto t = MustCreateSparse(c);
  ASSERT_NE(t, nullptr);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 5000; ++k) keys.push_back(k * 1000003);
  const std::vector<float> v = PullSparse(*t, keys);
  float lo = 1, hi = -1;
  double sum = 0;
  for (float x : v) {
    ASSERT_GE(x, -0.1f);
    ASSERT_LE(x, 0.1f);
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    sum += x;
  }
  // 20000 draws cover the range and centre on 0 (sd of the mean of
  // U[-0.1, 0.1] over 20000 draws is 0.1/sqrt(3*20000) = 4e-4).
  EXPECT_LT(lo, -0.099f);
  EXPECT_GT(hi, 0.099f);
  EXPECT_NEAR(sum / v.size(), 0.0, 2e-3);
  // Row k holds elements 0..dim-1 of key k for this table id.
  for (size_t i = 0; i < 10; ++i) {
    float want[4];
    InitializeValues(c.init(), 7, keys[i], 0, 4, want);
    for (int e = 0; e < 4; ++e) EXPECT_EQ(v[i * 4 + e], want[e]);
  }
}

TEST(SparseTableTest, NormalInitHasRoughlyTheRightMoments) {
  TableConfig c = SparseConfig(1, 1, 0.5f, InitializerConfig::NORMAL);
  c.mutable_init()->set_scale(2.0f);
  c.mutable_init()->set_seed(9);
  auto t = MustCreateSparse(c);
  ASSERT_NE(t, nullptr);
  constexpr int kKeys = 40000;
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < kKeys; ++k) keys.push_back(k);
  const std::vector<float> v = PullSparse(*t, keys);
  double sum = 0, sum_sq = 0;
  int beyond_2sd = 0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sum_sq += static_cast<double>(x) * x;
    beyond_2sd += std::fabs(x) > 4.0f;
  }
  const double mean = sum / kKeys;
  const double sd = std::sqrt(sum_sq / kKeys - mean * mean);
  // Standard error of the mean is 2/sqrt(40000) = 0.01; of the sd about
  // 2/sqrt(2*40000) = 0.007. Bounds are about 5 standard errors.
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(sd, 2.0, 0.05);
  // A normal puts 4.55% beyond 2 sd; a uniform of the same sd puts none.
  EXPECT_NEAR(beyond_2sd / static_cast<double>(kKeys), 0.0455, 0.006);
}

TEST(SparseTableTest, InitIsDeterministicAndSeedDependent) {
  TableConfig c = SparseConfig(2, 3, 0.5f, InitializerConfig::UNIFORM);
  c.mutable_init()->set_scale(1.0f);
  c.mutable_init()->set_seed(1);
  auto a = MustCreateSparse(c);
  auto b = MustCreateSparse(c);
  c.mutable_init()->set_seed(2);
  auto other_seed = MustCreateSparse(c);
  c.mutable_init()->set_seed(1);
  c.set_id(3);
  auto other_table = MustCreateSparse(c);
  ASSERT_TRUE(a && b && other_seed && other_table);

  std::vector<uint64_t> keys = {0, 1, 2, 12345, kU64Max, 1ULL << 40};
  std::vector<uint64_t> reversed(keys.rbegin(), keys.rend());
  const std::vector<float> va = PullSparse(*a, keys);
  // Creating the rows in another order must not change their values: the
  // initial value depends on the key, not on the row slot it lands in.
  const std::vector<float> vb_rev = PullSparse(*b, reversed);
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t j = keys.size() - 1 - i;
    for (int e = 0; e < 3; ++e) EXPECT_EQ(va[i * 3 + e], vb_rev[j * 3 + e]);
  }
  const std::vector<float> vs = PullSparse(*other_seed, keys);
  const std::vector<float> vt = PullSparse(*other_table, keys);
  for (size_t i = 0; i < va.size(); ++i) {
    EXPECT_NE(va[i], vs[i]) << "element " << i;
    EXPECT_NE(va[i], vt[i]) << "element " << i;
  }
  // Elements of one row differ from each other too.
  EXPECT_NE(va[0], va[1]);
  EXPECT_NE(va[1], va[2]);
}

TEST(SparseTableTest, PushAppliesSgdPerRow) {
  TableConfig c = SparseConfig(0, 2, 0.5f, InitializerConfig::CONSTANT);
  c.mutable_init()->set_value(1.0f);
  auto t = MustCreateSparse(c);
  ASSERT_NE(t, nullptr);
  PullSparse(*t, {10});  // row 10 exists before the push; row 20 does not
  const std::vector<uint64_t> keys = {10, 20};
  const std::vector<float> g = {1.0f, -2.0f, 0.5f, 4.0f};
  t->Push(keys, g.data());
  EXPECT_EQ(t->num_rows(), 2u);
  // w = 1 - 0.5 * g, for the row created by the push as well.
  EXPECT_EQ(PullSparse(*t, {10, 20, 30}),
            (std::vector<float>{0.5f, 2.0f, 0.75f, -1.0f, 1.0f, 1.0f}));
  const std::vector<float> g2 = {2.0f, 2.0f};
  t->Push({20}, g2.data());
  EXPECT_EQ(PullSparse(*t, {20, 10}),
            (std::vector<float>{-0.25f, -2.0f, 0.5f, 2.0f}));
}

TEST(SparseTableTest, DuplicateKeysInOnePushApplyTwiceInOrder) {
  // SGD: both gradients land on the row.
  auto sgd = MustCreateSparse(SparseConfig(0, 1, 0.5f));
  ASSERT_NE(sgd, nullptr);
  const std::vector<float> g = {1.0f, 2.0f, 4.0f};
  sgd->Push({8, 9, 8}, g.data());
  EXPECT_EQ(PullSparse(*sgd, {8, 9}), (std::vector<float>{-2.5f, -1.0f}));
  EXPECT_EQ(sgd->num_rows(), 2u);

  // Adagrad is order-sensitive, which pins "in order": with accumulator 0,
  //   g = 3 then 4: w = -(3/3 + 4/5) = -1.8
  //   g = 4 then 3: w = -(4/4 + 3/5) = -1.6
  TableConfig c = SparseConfig(0, 1, 1.0f);
  AdagradConfig* a = c.mutable_optimizer()->mutable_adagrad();
  a->set_learning_rate(1.0f);
  a->set_initial_accumulator(0.0f);
  a->set_epsilon(1e-8f);
  auto adagrad = MustCreateSparse(c);
  ASSERT_NE(adagrad, nullptr);
  const std::vector<float> g34 = {3.0f, 4.0f};
  adagrad->Push({5, 5}, g34.data());
  const std::vector<float> g43 = {4.0f, 3.0f};
  adagrad->Push({6, 6}, g43.data());
  const std::vector<float> v = PullSparse(*adagrad, {5, 6});
  EXPECT_FLOAT_EQ(v[0], -1.8f);
  EXPECT_FLOAT_EQ(v[1], -1.6f);
}

TEST(SparseTableTest, AdagradStateIsPerRowAndElement) {
  // Rows interleave values and accumulators; each element of each row has
  // its own accumulator. lr 1, accumulator starts at 0:
  //   key 1: e0 g 3 then 4 -> acc 9, 25  -> w = -1 - 0.8 = -1.8
  //          e1 g 4 then 3 -> acc 16, 25 -> w = -1 - 0.6 = -1.6
  //   key 2: e0 g 4 -> -1, e1 g 3 -> -1
  TableConfig c = SparseConfig(0, 2, 1.0f);
  AdagradConfig* a = c.mutable_optimizer()->mutable_adagrad();
  a->set_learning_rate(1.0f);
  a->set_initial_accumulator(0.0f);
  a->set_epsilon(1e-8f);
  auto t = MustCreateSparse(c);
  ASSERT_NE(t, nullptr);
  const std::vector<float> g1 = {3, 4, 4, 3};
  t->Push({1, 2}, g1.data());
  const std::vector<float> g2 = {4, 3};
  t->Push({1}, g2.data());
  const std::vector<float> v = PullSparse(*t, {1, 2});
  ASSERT_EQ(v.size(), 4u);
  EXPECT_FLOAT_EQ(v[0], -1.8f);
  EXPECT_FLOAT_EQ(v[1], -1.6f);
  EXPECT_FLOAT_EQ(v[2], -1.0f);
  EXPECT_FLOAT_EQ(v[3], -1.0f);
}

TEST(SparseTableTest, MultiDimRowsAreRowMajor) {
  constexpr uint32_t kDim = 5;
  auto t = MustCreateSparse(SparseConfig(0, kDim, 1.0f));
  ASSERT_NE(t, nullptr);
  const std::vector<uint64_t> keys = {100, 7, 3000000000ULL};
  std::vector<float> g;
  for (size_t i = 0; i < keys.size(); ++i) {
    for (uint32_t e = 0; e < kDim; ++e) g.push_back(10.0f * i + e);
  }
  t->Push(keys, g.data());
  // Element e of key i got -(10 i + e); pull in another order.
  EXPECT_EQ(PullSparse(*t, {3000000000ULL, 100}),
            (std::vector<float>{-20, -21, -22, -23, -24, -0, -1, -2, -3, -4}));
  EXPECT_EQ(PullSparse(*t, {7}), (std::vector<float>{-10, -11, -12, -13, -14}));
}

TEST(SparseTableTest, RowsBeyondOneChunkKeepTheirValues) {
  // 16384 rows fit one chunk; 40000 rows span three, so rows are written
  // before and after chunks get added.
  constexpr uint64_t kRows = 40000;
  auto t = MustCreateSparse(SparseConfig(0, 2, 1.0f));
  ASSERT_NE(t, nullptr);
  std::vector<uint64_t> keys;
  std::vector<float> g;
  for (uint64_t i = 0; i < kRows; ++i) {
    keys.push_back(i * 7919 + 3);
    g.push_back(static_cast<float>(i));
    g.push_back(-static_cast<float>(i) - 0.5f);
  }
  // Push in several batches so that rows created early are written again
  // after later chunks exist.
  t->Push(keys, g.data());
  t->Push(absl::MakeConstSpan(keys).subspan(0, 100), g.data());
  EXPECT_EQ(t->num_rows(), kRows);
  std::vector<uint64_t> reversed(keys.rbegin(), keys.rend());
  const std::vector<float> v = PullSparse(*t, reversed);
  EXPECT_EQ(t->num_rows(), kRows);
  size_t mismatches = 0;
  for (uint64_t j = 0; j < kRows; ++j) {
    const uint64_t i = kRows - 1 - j;
    const float times = i < 100 ? 2.0f : 1.0f;
    mismatches += v[2 * j] != -times * i;
    mismatches += v[2 * j + 1] != times * (i + 0.5f);
  }
  EXPECT_EQ(mismatches, 0u);
}

// ------------------------------------------------------------- DenseTable

TEST(DenseTableTest, ValidateSegments) {
  // size 10, block_size 4: blocks [0, 4), [4, 8), [8, 10).
  auto t = MustCreateDense(DenseConfig(0, 10, 4, 0.5f));
  ASSERT_NE(t, nullptr);
  const std::vector<std::pair<uint64_t, uint64_t>> good[] = {
      {},
      {{0, 4}},
      {{4, 4}},
      {{8, 2}},
      {{9, 1}},
      {{5, 2}, {0, 1}, {8, 1}, {5, 2}},
  };
  for (const auto& segs : good) {
    SCOPED_TRACE(testing::Message() << "good case of " << segs.size());
    EXPECT_TRUE(t->ValidateSegments(MakeSegments(segs)).ok());
  }
  const std::pair<const char*, std::vector<std::pair<uint64_t, uint64_t>>>
      bad[] = {
          {"empty", {{2, 0}}},
          {"begin at end", {{10, 1}}},
          {"begin past end", {{11, 1}}},
          {"begin far past end", {{kU64Max, 1}}},
          {"length past end", {{8, 3}}},
          {"length past end from 0", {{0, 11}}},
          {"begin + length overflows", {{9, kU64Max}}},
          {"begin + length wraps to inside", {{9, kU64Max - 5}}},
          {"huge length", {{0, kU64Max}}},
          {"crosses block 0/1", {{3, 2}}},
          {"crosses block 1/2", {{6, 4}}},
          {"spans two blocks from start", {{0, 5}}},
          {"valid then invalid", {{0, 4}, {3, 2}}},
          {"invalid then valid", {{10, 1}, {0, 4}}},
      };
  for (const auto& [name, segs] : bad) {
    SCOPED_TRACE(name);
    absl::Status s = t->ValidateSegments(MakeSegments(segs));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(s.message().empty());
  }
}

TEST(DenseTableTest, ValidateSegmentsCatchesWrappingEnds) {
  // With a single block the block check cannot catch an end that wrapped
  // around: begin + length must not be computed naively.
  auto one_block = MustCreateDense(DenseConfig(0, 10, 16, 0.5f));
  ASSERT_NE(one_block, nullptr);
  // 9 + (2^64 - 1) wraps to 8, which is inside the table and the block.
  EXPECT_EQ(one_block->ValidateSegments(MakeSegments({{9, kU64Max}})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(one_block->ValidateSegments(MakeSegments({{1, kU64Max - 1}})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(one_block->ValidateSegments(MakeSegments({{0, 10}})).ok());

  // A table reaching up to UINT64_MAX: the last element is addressable,
  // one past it wraps to 0. No element is touched, so nothing is allocated.
  auto huge = MustCreateDense(DenseConfig(0, kU64Max, 1u << 26, 0.5f));
  ASSERT_NE(huge, nullptr);
  EXPECT_TRUE(huge->ValidateSegments(MakeSegments({{kU64Max - 1, 1}})).ok());
  EXPECT_EQ(huge->ValidateSegments(MakeSegments({{kU64Max - 1, 2}})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(huge->ValidateSegments(MakeSegments({{kU64Max - 2, kU64Max}}))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DenseTableTest, PushPullAcrossBlocksExactSgd) {
  TableConfig c = DenseConfig(0, 10, 4, 0.5f);
  c.mutable_init()->set_kind(InitializerConfig::CONSTANT);
  c.mutable_init()->set_value(2.0f);
  auto t = MustCreateDense(c);
  ASSERT_NE(t, nullptr);
  // Segment [2, 4) is in block 0, [4, 7) in block 1; gradients are laid out
  // segment after segment.
  const std::vector<float> g = {1, 2, 3, 4, 5};
  t->Push(MakeSegments({{2, 2}, {4, 3}}), g.data());
  // w = 2 - 0.5 g.
  EXPECT_EQ(PullAllDense(*t),
            (std::vector<float>{2, 2, 1.5, 1, 0.5, 0, -0.5, 2, 2, 2}));
  // Pull returns values in segment order, not index order.
  EXPECT_EQ(PullDense(*t, MakeSegments({{6, 1}, {2, 2}, {4, 1}})),
            (std::vector<float>{-0.5, 1.5, 1, 0.5}));
}

TEST(DenseTableTest, ShortLastBlock) {
  // size 10, block_size 4: the last block holds only elements 8 and 9.
  auto t = MustCreateDense(DenseConfig(0, 10, 4, 1.0f));
  ASSERT_NE(t, nullptr);
  const std::vector<float> g = {3, 4};
  t->Push(MakeSegments({{8, 2}}), g.data());
  const std::vector<float> g9 = {1};
  t->Push(MakeSegments({{9, 1}}), g9.data());
  EXPECT_EQ(PullDense(*t, MakeSegments({{8, 2}})),
            (std::vector<float>{-3, -5}));
  EXPECT_EQ(PullDense(*t, MakeSegments({{9, 1}})), (std::vector<float>{-5}));
  // Only the touched block is materialised: 2 floats, no optimizer state.
  EXPECT_EQ(t->MemoryBytes(), 2 * sizeof(float));
}

TEST(DenseTableTest, AdagradStateIsPerElement) {
  // A push to an element in the middle of a block must use that element's
  // accumulator, not the block's first one. lr 1, accumulator starts at 0,
  // block 1 holds elements 4..7:
  //   element 5: g = 3 -> acc 9, w = -1;  then g = 4 -> acc 25, w = -1.8
  //   element 6: g = 4 -> acc 16, w = -1
  //   element 4: g = 4 -> acc 16, w = -1  (-0.625 if it shared 5's acc)
  TableConfig c = DenseConfig(0, 10, 4, 1.0f);
  AdagradConfig* a = c.mutable_optimizer()->mutable_adagrad();
  a->set_learning_rate(1.0f);
  a->set_initial_accumulator(0.0f);
  a->set_epsilon(1e-8f);
  auto t = MustCreateDense(c);
  ASSERT_NE(t, nullptr);
  const std::vector<float> g1 = {3};
  t->Push(MakeSegments({{5, 1}}), g1.data());
  const std::vector<float> g2 = {4, 4};
  t->Push(MakeSegments({{5, 2}}), g2.data());
  const std::vector<float> g3 = {4};
  t->Push(MakeSegments({{4, 1}}), g3.data());
  const std::vector<float> v = PullDense(*t, MakeSegments({{4, 4}}));
  EXPECT_FLOAT_EQ(v[0], -1.0f);
  EXPECT_FLOAT_EQ(v[1], -1.8f);
  EXPECT_FLOAT_EQ(v[2], -1.0f);
  EXPECT_EQ(v[3], 0.0f);
}

TEST(DenseTableTest, InitIsIndependentOfBlockSize) {
  TableConfig c = DenseConfig(4, 100, 7, 0.5f);
  c.mutable_init()->set_kind(InitializerConfig::UNIFORM);
  c.mutable_init()->set_scale(1.0f);
  c.mutable_init()->set_seed(5);
  auto small_blocks = MustCreateDense(c);
  c.mutable_dense()->set_block_size(64);
  auto big_blocks = MustCreateDense(c);
  ASSERT_TRUE(small_blocks && big_blocks);
  const std::vector<float> a = PullAllDense(*small_blocks);
  const std::vector<float> b = PullAllDense(*big_blocks);
  ASSERT_EQ(a.size(), 100u);
  EXPECT_EQ(a, b);
  // Element i is element i of key 0 for this table, and the values are not
  // all the same (so the comparison above is not trivially true).
  std::vector<float> want(100);
  InitializeValues(c.init(), 4, 0, 0, 100, want.data());
  EXPECT_EQ(a, want);
  EXPECT_NE(a[0], a[1]);
  EXPECT_NE(a[6], a[7]);
}

// Optimizers with wider state (Adam: m, v, t; FTRL: z, n) keep it per row
// and element inside the table: a table's updates equal the optimizer's
// own on separate state.
TEST(SparseTableTest, WiderOptimizerStateIsKeptPerRowAndElement) {
  for (const char* opt : {"adam { learning_rate: 0.1 }", "ftrl { alpha: 0.5 l1: 0.01 }",
                          "momentum { learning_rate: 0.1 nesterov: true }"}) {
    TableConfig tc;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
        absl::StrCat("id: 1 name: \"t\" sparse { dim: 3 } optimizer { ", opt, " }"), &tc));
    JobConfig job;
    *job.add_tables() = tc;
    ApplyDefaults(&job);
    tc = job.tables(0);
    auto table = Table::Create(tc);
    ASSERT_TRUE(table.ok()) << table.status();
    auto reference = Optimizer::Create(tc.optimizer());
    ASSERT_TRUE(reference.ok());
    const int s = (*reference)->state_size();
    // Separate reference state for keys 7 and 9, three elements each.
    std::vector<float> w7(3, 0), w9(3, 0), st7(3 * s), st9(3 * s);
    (*reference)->InitState(st7.data(), 3);
    (*reference)->InitState(st9.data(), 3);
    SparseTable* t = (*table)->AsSparse();
    const std::vector<std::vector<float>> grads = {
        {0.5f, -1, 2, 1, 1, 1}, {0.25f, 0, -3, -2, 0.5f, 4}, {1, 1, 1, 0, 0, 0}};
    for (const auto& g : grads) {
      t->Push(std::vector<uint64_t>{7, 9}, g.data());
      (*reference)->Apply(w7.data(), st7.data(), g.data(), 3, 1.0f);
      (*reference)->Apply(w9.data(), st9.data(), g.data() + 3, 3, 1.0f);
    }
    // Key 9 also gets a push alone: its state must not bleed into key 7's.
    const float extra[3] = {0.1f, 0.2f, 0.3f};
    t->Push(std::vector<uint64_t>{9}, extra);
    (*reference)->Apply(w9.data(), st9.data(), extra, 3, 1.0f);
    std::vector<float> out(6);
    t->Pull(std::vector<uint64_t>{7, 9}, out.data());
    for (int e = 0; e < 3; ++e) {
      EXPECT_EQ(out[e], w7[e]) << opt << " key 7 element " << e;
      EXPECT_EQ(out[3 + e], w9[e]) << opt << " key 9 element " << e;
    }
  }
}

}  // namespace
}  // namespace ps
