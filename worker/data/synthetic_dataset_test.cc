#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/dataset.h"
#include "worker/data/synthetic_ctr.h"

namespace ps::data {
namespace {

DataConfig Config() {
  DataConfig c;
  SyntheticCtrConfig* s = c.mutable_synthetic_ctr();
  s->set_num_train(1003);
  s->set_num_test(257);
  s->set_num_categorical(5);
  s->set_num_numeric(3);
  return c;  // the rest left at 0: OpenDataset applies the defaults
}

ctr::SyntheticCtr Generator() {
  DataConfig c = Config();
  SyntheticCtrConfig s = c.synthetic_ctr();
  // The documented defaults, as common/config.cc fills them.
  s.set_seed(1);
  s.set_max_vocab(1000);
  s.set_min_vocab(10);
  s.set_zipf_exponent(1.1f);
  s.set_weight_scale(0.3f);
  s.set_bias(-2.0f);
  absl::StatusOr<ctr::SyntheticCtr> g = ctr::SyntheticCtr::Create(s);
  EXPECT_TRUE(g.ok()) << g.status();
  return *std::move(g);
}

// Appends example `index` of the generator's `split` to `want` in the
// ExampleBatch layout.
void AppendExpected(const ctr::SyntheticCtr& g, ctr::Split split,
                    uint64_t index, ExampleBatch* want) {
  ctr::Batch b;
  ASSERT_TRUE(g.Fill(split, index, 1, &b).ok());
  want->labels.push_back(b.labels[0]);
  want->true_logits.push_back(b.true_logits[0]);
  want->dense.insert(want->dense.end(), b.numeric.begin(), b.numeric.end());
  for (uint32_t f = 0; f < g.num_categorical(); ++f) {
    want->keys.push_back(b.keys[f]);
    want->fields.push_back(f);
    want->values.push_back(1.0f);
  }
  ++want->size;
}

// All of a pass, concatenated, with max examples per Next().
ExampleBatch ReadPass(Dataset* d, size_t max) {
  ExampleBatch all, b;
  for (;;) {
    absl::StatusOr<size_t> n = d->Next(max, &b);
    EXPECT_TRUE(n.ok()) << n.status();
    if (!n.ok() || *n == 0) break;
    EXPECT_EQ(b.offsets.size(), *n + 1);
    for (size_t i = 0; i <= *n; ++i) {
      EXPECT_EQ(b.offsets[i], i * d->schema().num_fields);
    }
    all.labels.insert(all.labels.end(), b.labels.begin(), b.labels.end());
    all.true_logits.insert(all.true_logits.end(), b.true_logits.begin(),
                           b.true_logits.end());
    all.dense.insert(all.dense.end(), b.dense.begin(), b.dense.end());
    all.keys.insert(all.keys.end(), b.keys.begin(), b.keys.end());
    all.fields.insert(all.fields.end(), b.fields.begin(), b.fields.end());
    all.values.insert(all.values.end(), b.values.begin(), b.values.end());
    all.size += *n;
  }
  return all;
}

void ExpectSame(const ExampleBatch& got, const ExampleBatch& want) {
  EXPECT_EQ(got.size, want.size);
  EXPECT_EQ(got.labels, want.labels);
  EXPECT_EQ(got.true_logits, want.true_logits);
  EXPECT_EQ(got.dense, want.dense);
  EXPECT_EQ(got.keys, want.keys);
  EXPECT_EQ(got.fields, want.fields);
  EXPECT_EQ(got.values, want.values);
}

TEST(SyntheticDatasetTest, ContiguousShardsEqualFill) {
  const ctr::SyntheticCtr g = Generator();
  for (uint32_t k : {1u, 3u}) {
    for (uint32_t r = 0; r < k; ++r) {
      absl::StatusOr<std::unique_ptr<Dataset>> d =
          OpenDataset(Config(), Split::kTrain, r, k, 64, false);
      ASSERT_TRUE(d.ok()) << d.status();
      EXPECT_EQ((*d)->schema().num_dense, 3u);
      EXPECT_EQ((*d)->schema().num_fields, 5u);
      EXPECT_TRUE((*d)->schema().has_true_logits);
      ExampleBatch want;
      const auto [begin, end] = ctr::ShardRange(1003, r, k);
      for (uint64_t i = begin; i < end; ++i) {
        AppendExpected(g, ctr::Split::kTrain, i, &want);
      }
      ExpectSame(ReadPass(d->get(), 50), want);
      ASSERT_TRUE((*d)->Rewind().ok());
      ExpectSame(ReadPass(d->get(), 1000), want);
      EXPECT_EQ((*d)->stats().examples, 2 * want.size);
    }
  }
}

// shard_by_batch: worker r of k takes batches r, r+k, ... of batch_size,
// like the original LR trainer's batching; Next() crosses batch boundaries.
TEST(SyntheticDatasetTest, ShardByBatchEqualsTrainerBatches) {
  const ctr::SyntheticCtr g = Generator();
  const uint64_t b = 64;
  for (uint32_t k : {1u, 2u, 5u}) {
    for (uint32_t r = 0; r < k; ++r) {
      absl::StatusOr<std::unique_ptr<Dataset>> d =
          OpenDataset(Config(), Split::kTrain, r, k, b, true);
      ASSERT_TRUE(d.ok()) << d.status();
      ExampleBatch want;
      for (uint64_t pos = r * b; pos < 1003; pos += k * b) {
        for (uint64_t i = pos; i < std::min(pos + b, uint64_t{1003}); ++i) {
          AppendExpected(g, ctr::Split::kTrain, i, &want);
        }
      }
      ExpectSame(ReadPass(d->get(), 64), want);
      ASSERT_TRUE((*d)->Rewind().ok());
      ExpectSame(ReadPass(d->get(), 100), want);
    }
  }
}

TEST(SyntheticDatasetTest, TestSplitIsWhole) {
  const ctr::SyntheticCtr g = Generator();
  absl::StatusOr<std::unique_ptr<Dataset>> d =
      OpenDataset(Config(), Split::kTest, 2, 3, 64, true);
  ASSERT_TRUE(d.ok()) << d.status();
  ExampleBatch want;
  for (uint64_t i = 0; i < 257; ++i) {
    AppendExpected(g, ctr::Split::kTest, i, &want);
  }
  ExpectSame(ReadPass(d->get(), 100), want);
}

TEST(SyntheticDatasetTest, Errors) {
  EXPECT_EQ(OpenDataset(Config(), Split::kTrain, 0, 1, 0, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  DataConfig bad = Config();
  bad.mutable_synthetic_ctr()->set_min_vocab(5000);
  EXPECT_EQ(OpenDataset(bad, Split::kTrain, 0, 1, 1, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<Dataset>> d =
      OpenDataset(Config(), Split::kTrain, 0, 1, 1, false);
  ASSERT_TRUE(d.ok());
  ExampleBatch b;
  EXPECT_EQ((*d)->Next(0, &b).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::data
