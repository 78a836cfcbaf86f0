#include "worker/models/model.h"

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/model_layout.h"
#include "gtest/gtest.h"
#include "worker/compute/compute_factory.h"
#include "worker/compute/cpu_compute.h"

namespace ps {
namespace {

enum class Backend { kCpu, kGpu };

// A config whose data has `dense` numeric features and `fields` categorical
// fields (synthetic), or Fashion-MNIST's shape for the 10-class MLP.
JobConfig ConfigFor(ModelConfig::Kind kind, bool ten_classes = false) {
  JobConfig config;
  if (ten_classes) {
    config.mutable_data()->mutable_fashion_mnist();
  } else {
    SyntheticCtrConfig* d = config.mutable_data()->mutable_synthetic_ctr();
    d->set_num_numeric(4);
    d->set_num_categorical(3);
  }
  ModelConfig* m = config.mutable_training()->mutable_model();
  m->set_kind(kind);
  m->set_embedding_dim(kind == ModelConfig::FM ? 3 : 4);
  m->add_bottom_mlp(6);
  m->add_top_mlp(5);
  m->add_hidden(ten_classes ? 4 : 7);
  m->add_hidden(5);
  ApplyDefaults(&config);
  return config;
}

// A batch of `n` examples: random dense features, one key per field from a
// small vocabulary (so rows repeat across examples), fields in a scrambled
// order, and for binary models an extra weighted feature on odd examples.
data::ExampleBatch RandomBatch(const ModelLayout& layout, int n,
                               std::mt19937* rng) {
  std::normal_distribution<float> normal(0, 1);
  std::uniform_int_distribution<int> vocab(0, 3);
  data::ExampleBatch b;
  b.size = n;
  b.num_dense = layout.data.num_dense;
  b.offsets.push_back(0);
  for (int i = 0; i < n; ++i) {
    if (layout.kind == ModelConfig::MLP) {
      b.labels.push_back(static_cast<float>(i % layout.data.num_classes));
    } else {
      b.labels.push_back(static_cast<float>(i % 3 == 0));
    }
    for (uint32_t j = 0; j < layout.data.num_dense; ++j) {
      b.dense.push_back(0.5f * normal(*rng));
    }
    for (uint32_t f = layout.data.num_fields; f-- > 0;) {
      b.keys.push_back(1000 * f + vocab(*rng));
      b.values.push_back(1.0f);
      b.fields.push_back(f);
    }
    if (layout.kind != ModelConfig::MLP && i % 2 == 1) {
      b.keys.push_back(77);  // a weighted feature shared by several examples
      b.values.push_back(0.5f + 0.25f * i);
      b.fields.push_back(0);
    }
    b.offsets.push_back(static_cast<uint32_t>(b.keys.size()));
  }
  return b;
}

class ModelTest
    : public ::testing::TestWithParam<std::tuple<Backend, int>> {
 protected:
  void SetUp() override {
    if (std::get<0>(GetParam()) == Backend::kGpu) {
      std::string why;
      auto gpu = CreateCompute(GPU, 1, &why);
      if (!gpu.ok()) GTEST_SKIP() << "no GPU: " << gpu.status().message();
      compute_ = std::move(*gpu);
    } else {
      compute_ = CreateCpuCompute(1);
    }
  }
  std::unique_ptr<Compute> compute_;
};

struct Case {
  ModelConfig::Kind kind;
  bool ten_classes;
};
const Case kCases[] = {{ModelConfig::LR, false},
                       {ModelConfig::FM, false},
                       {ModelConfig::DLRM, false},
                       {ModelConfig::MLP, false},
                       {ModelConfig::MLP, true}};

// The gradients the model computes match central finite differences of
// its mean loss, for every sparse value and a sample of dense ones.
TEST_P(ModelTest, GradientsMatchFiniteDifferences) {
  const Case c = kCases[std::get<1>(GetParam())];
  const JobConfig config = ConfigFor(c.kind, c.ten_classes);
  auto layout = LayoutModel(config);
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto model = Model::Create(*layout, compute_.get());
  ASSERT_TRUE(model.ok()) << model.status();
  std::mt19937 rng(42);
  const int n = 6;
  data::ExampleBatch batch = RandomBatch(*layout, n, &rng);
  SparseIndexer indexer;
  SparseInput sparse;
  ASSERT_TRUE(indexer.Index(*layout, batch, &sparse).ok());
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> rows(sparse.keys.size() * layout->sparse_dim);
  for (float& v : rows) v = 0.4f * normal(rng);
  std::vector<float> dense = InitialDenseParameters(*layout, 1.0f, 7);
  // Non-zero biases and linear weights, so their gradients are exercised
  // away from special points.
  for (float& v : dense) {
    if (v == 0) v = 0.2f * normal(rng);
  }

  ModelOutput out;
  ASSERT_TRUE((*model)->Run(batch, sparse, rows.data(), dense.data(), true, &out).ok());
  ASSERT_EQ(out.sparse_grad.size(), rows.size());
  ASSERT_EQ(out.dense_grad.size(), dense.size());
  const double loss0 = out.loss_sum / n;
  ASSERT_TRUE(std::isfinite(loss0));

  auto mean_loss = [&]() {
    ModelOutput o;
    EXPECT_TRUE((*model)->Run(batch, sparse, rows.data(), dense.data(), false, &o).ok());
    return o.loss_sum / n;
  };
  const float eps = 2e-3f;
  auto check = [&](std::vector<float>* params, size_t i, float analytic,
                   const std::string& what) {
    const float saved = (*params)[i];
    (*params)[i] = saved + eps;
    const double up = mean_loss();
    (*params)[i] = saved - eps;
    const double down = mean_loss();
    (*params)[i] = saved;
    const double numeric = (up - down) / (2 * eps);
    EXPECT_NEAR(analytic, numeric, 2e-3 + 0.02 * std::fabs(numeric))
        << what << "[" << i << "]";
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    check(&rows, i, out.sparse_grad[i], "sparse");
  }
  std::uniform_int_distribution<size_t> pick(0, dense.size() - 1);
  const size_t samples = std::min<size_t>(dense.size(), 300);
  for (size_t s = 0; s < samples; ++s) {
    const size_t i = dense.size() <= 300 ? s : pick(rng);
    check(&dense, i, out.dense_grad[i], "dense");
  }
  // The gradient is not trivially zero.
  double norm = 0;
  for (float g : out.dense_grad) norm += g * g;
  for (float g : out.sparse_grad) norm += g * g;
  EXPECT_GT(norm, 1e-8);
}

std::string CaseName(const ::testing::TestParamInfo<std::tuple<Backend, int>>& info) {
  const Case c = kCases[std::get<1>(info.param)];
  return absl::StrCat(std::get<0>(info.param) == Backend::kCpu ? "Cpu" : "Gpu",
                      ModelConfig::Kind_Name(c.kind), c.ten_classes ? "10" : "");
}

INSTANTIATE_TEST_SUITE_P(All, ModelTest,
                         ::testing::Combine(::testing::Values(Backend::kCpu,
                                                              Backend::kGpu),
                                            ::testing::Range(0, 5)),
                         CaseName);

// CPU and GPU compute the same outputs and gradients (within 1e-4).
TEST(ModelAgreementTest, CpuAndGpuAgree) {
  std::string why;
  auto gpu = CreateCompute(GPU, 1, &why);
  if (!gpu.ok()) GTEST_SKIP() << "no GPU: " << gpu.status().message();
  auto cpu = CreateCpuCompute(1);
  for (const Case& c : kCases) {
    const JobConfig config = ConfigFor(c.kind, c.ten_classes);
    auto layout = LayoutModel(config);
    ASSERT_TRUE(layout.ok());
    std::mt19937 rng(3);
    data::ExampleBatch batch = RandomBatch(*layout, 256, &rng);
    SparseIndexer indexer;
    SparseInput sparse;
    ASSERT_TRUE(indexer.Index(*layout, batch, &sparse).ok());
    std::normal_distribution<float> normal(0, 1);
    std::vector<float> rows(sparse.keys.size() * layout->sparse_dim);
    for (float& v : rows) v = 0.4f * normal(rng);
    std::vector<float> dense = InitialDenseParameters(*layout, 1.0f, 7);
    ModelOutput a, b;
    auto m1 = Model::Create(*layout, cpu.get());
    auto m2 = Model::Create(*layout, gpu->get());
    ASSERT_TRUE((*m1)->Run(batch, sparse, rows.data(), dense.data(), true, &a).ok());
    ASSERT_TRUE((*m2)->Run(batch, sparse, rows.data(), dense.data(), true, &b).ok());
    EXPECT_NEAR(a.loss_sum / 256, b.loss_sum / 256, 1e-4);
    for (size_t i = 0; i < a.probs.size(); ++i) EXPECT_NEAR(a.probs[i], b.probs[i], 1e-4);
    for (size_t i = 0; i < a.dense_grad.size(); ++i) {
      EXPECT_NEAR(a.dense_grad[i], b.dense_grad[i], 1e-4) << i;
    }
    for (size_t i = 0; i < a.sparse_grad.size(); ++i) {
      EXPECT_NEAR(a.sparse_grad[i], b.sparse_grad[i], 1e-4) << i;
    }
  }
}

TEST(SparseIndexerTest, DeduplicatesAndGroupsBagsByField) {
  const JobConfig config = ConfigFor(ModelConfig::DLRM);
  auto layout = LayoutModel(config);
  ASSERT_TRUE(layout.ok());
  data::ExampleBatch b;
  b.size = 2;
  b.labels = {0, 1};
  b.dense.assign(8, 0);
  b.num_dense = 4;
  // Example 0: fields 2, 0, 0; example 1: field 1 only.
  b.keys = {5, 9, 5, 9};
  b.values = {1, 2, 3, 4};
  b.fields = {2, 0, 0, 1};
  b.offsets = {0, 3, 4};
  SparseIndexer indexer;
  SparseInput s;
  ASSERT_TRUE(indexer.Index(*layout, b, &s).ok());
  EXPECT_EQ(s.keys, (std::vector<uint64_t>{5, 9}));
  // Bags (example, field): (0,0) = {9:2, 5:3}, (0,1) = {}, (0,2) = {5:1},
  // (1,0) = {}, (1,1) = {9:4}, (1,2) = {}.
  EXPECT_EQ(s.offsets, (std::vector<uint32_t>{0, 2, 2, 3, 3, 4, 4}));
  EXPECT_EQ(s.rows, (std::vector<uint32_t>{1, 0, 0, 1}));
  EXPECT_EQ(s.values, (std::vector<float>{2, 3, 1, 4}));

  b.fields[3] = 3;  // not a field of a 3-field model
  EXPECT_EQ(indexer.Index(*layout, b, &s).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelErrorsTest, BadLabelIsInvalidArgument) {
  auto cpu = CreateCpuCompute(1);
  for (const Case& c : kCases) {
    const JobConfig config = ConfigFor(c.kind, c.ten_classes);
    auto layout = LayoutModel(config);
    ASSERT_TRUE(layout.ok());
    auto model = Model::Create(*layout, cpu.get());
    std::mt19937 rng(1);
    data::ExampleBatch batch = RandomBatch(*layout, 4, &rng);
    batch.labels[2] = c.kind == ModelConfig::MLP ? 99.0f : 0.5f;
    SparseIndexer indexer;
    SparseInput sparse;
    ASSERT_TRUE(indexer.Index(*layout, batch, &sparse).ok());
    std::vector<float> rows(sparse.keys.size() * layout->sparse_dim, 0.1f);
    std::vector<float> dense(layout->dense_size, 0.1f);
    ModelOutput out;
    EXPECT_EQ((*model)->Run(batch, sparse, rows.data(), dense.data(), true, &out).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(ModelLayoutTest, SizesFollowTheArchitecture) {
  auto lr = LayoutModel(ConfigFor(ModelConfig::LR));
  ASSERT_TRUE(lr.ok());
  EXPECT_EQ(lr->dense_size, 5u);
  EXPECT_EQ(lr->sparse_dim, 1u);
  auto fm = LayoutModel(ConfigFor(ModelConfig::FM));
  EXPECT_EQ(fm->sparse_dim, 4u);
  auto dlrm = LayoutModel(ConfigFor(ModelConfig::DLRM));
  ASSERT_TRUE(dlrm.ok());
  // Bottom 4 -> 6 -> 4, 4 vectors: top input 4 + 6 pairs, top 10 -> 5 -> 1.
  EXPECT_EQ(dlrm->num_vectors, 4u);
  EXPECT_EQ(dlrm->top_input, 10u);
  EXPECT_EQ(dlrm->dense_size, (4 * 6 + 6) + (6 * 4 + 4) + (10 * 5 + 5) + (5 + 1));
  auto mlp = LayoutModel(ConfigFor(ModelConfig::MLP, true));
  ASSERT_TRUE(mlp.ok());
  EXPECT_EQ(mlp->dense_size, (784 * 4 + 4) + (4 * 5 + 5) + (5 * 10 + 10));

  JobConfig libsvm;
  libsvm.mutable_data()->mutable_files()->set_format(FileDataConfig::LIBSVM);
  libsvm.mutable_training()->mutable_model()->set_kind(ModelConfig::DLRM);
  ApplyDefaults(&libsvm);
  EXPECT_EQ(LayoutModel(libsvm).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
