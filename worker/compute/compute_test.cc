// Tests of the Compute backends: every kernel against a double-precision
// reference, backward kernels against finite differences of the forward
// ones, CPU against GPU, and the factory's choice of backend.
//
// The kernel tests are parameterised over the backends; the GPU instances
// are skipped (GTEST_SKIP, with the reason) where no GPU is usable.
#include "worker/compute/compute.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "worker/compute/compute_factory.h"
#include "worker/compute/cpu_compute.h"

namespace ps {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kTol = 1e-4;

enum class Backend { kCpu, kGpu };

void PrintTo(Backend backend, std::ostream* os) {
  *os << (backend == Backend::kCpu ? "Cpu" : "Gpu");
}

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return ::testing::PrintToString(info.param);
}

// The backend, or nullptr with the reason in *why.
std::unique_ptr<Compute> MakeBackend(Backend backend, std::string* why) {
  if (backend == Backend::kCpu) return CreateCpuCompute(2);
  absl::StatusOr<std::unique_ptr<Compute>> gpu =
      CreateCompute(ComputeDevice::GPU, 1, nullptr);
  if (!gpu.ok()) {
    *why = std::string(gpu.status().message());
    return nullptr;
  }
  return *std::move(gpu);
}

// Memory of a Compute holding a copy of `host`. The host copy stays alive
// as long as the buffer, as Upload's contract asks.
template <typename T>
class Buffer {
 public:
  Buffer(Compute* compute, std::vector<T> host)
      : compute_(compute), host_(std::move(host)) {
    ptr_ = static_cast<T*>(compute_->Alloc(host_.size() * sizeof(T)));
    if (!host_.empty()) {
      EXPECT_NE(ptr_, nullptr);
      compute_->Upload(ptr_, host_.data(), host_.size() * sizeof(T));
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { compute_->Free(ptr_); }

  T* get() { return ptr_; }
  size_t size() const { return host_.size(); }

  // Sets element i on the device (and in the host copy).
  void Set(size_t i, T value) {
    host_[i] = value;
    compute_->Upload(ptr_ + i, &host_[i], sizeof(T));
  }

  std::vector<T> Read() {
    std::vector<T> out(host_.size());
    EXPECT_EQ(compute_->Download(out.data(), ptr_, out.size() * sizeof(T)),
              "");
    return out;
  }

 private:
  Compute* compute_;
  std::vector<T> host_;
  T* ptr_ = nullptr;
};

class Random {
 public:
  explicit Random(uint32_t seed) : rng_(seed) {}
  float Uniform(float lo = -1.0f, float hi = 1.0f) {
    return std::uniform_real_distribution<float>(lo, hi)(rng_);
  }
  std::vector<float> Vector(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = Uniform(lo, hi);
    return v;
  }
  int Int(int lo, int hi) {  // [lo, hi]
    return std::uniform_int_distribution<int>(lo, hi)(rng_);
  }

 private:
  std::mt19937 rng_;
};

// |got - want| <= tol * (1 + |want|) everywhere; NaN only where want is.
::testing::AssertionResult AllNear(const std::vector<float>& got,
                                   const std::vector<double>& want,
                                   double tol = kTol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << "size " << got.size() << " != " << want.size();
  }
  int bad = 0;
  ::testing::AssertionResult result = ::testing::AssertionFailure();
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::isnan(want[i])
                        ? std::isnan(got[i])
                        : std::fabs(got[i] - want[i]) <=
                              tol * (1.0 + std::fabs(want[i]));
    if (!ok && bad++ < 8) {
      result << "\n  [" << i << "] got " << got[i] << ", want " << want[i];
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return result << "\n  " << bad << " of " << got.size() << " differ";
}

std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Features for `bags` bags of 0..max_size entries each, rows below
// num_rows; every third bag is forced empty.
struct Bags {
  std::vector<uint32_t> offsets{0};
  std::vector<uint32_t> rows;
  std::vector<float> values;
};

Bags MakeBags(Random& rnd, int bags, int max_size, int num_rows) {
  Bags out;
  for (int j = 0; j < bags; ++j) {
    const int size = j % 3 == 1 ? 0 : rnd.Int(1, max_size);
    for (int i = 0; i < size; ++i) {
      out.rows.push_back(rnd.Int(0, num_rows - 1));
      out.values.push_back(rnd.Uniform(-1.5f, 1.5f));
    }
    out.offsets.push_back(out.rows.size());
  }
  return out;
}

class ComputeTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    std::string why;
    compute_ = MakeBackend(GetParam(), &why);
    if (compute_ == nullptr) GTEST_SKIP() << "no usable GPU: " << why;
  }
  void TearDown() override {
    if (compute_ != nullptr) {
      EXPECT_EQ(compute_->Synchronize(), "");
    }
  }

  template <typename T>
  std::unique_ptr<Buffer<T>> Make(std::vector<T> host) {
    return std::make_unique<Buffer<T>>(compute_.get(), std::move(host));
  }

  std::unique_ptr<Compute> compute_;
};

TEST_P(ComputeTest, Basics) {
  EXPECT_FALSE(compute_->name().empty());
  EXPECT_EQ(compute_->is_gpu(), GetParam() == Backend::kGpu);
  EXPECT_EQ(compute_->Alloc(0), nullptr);
  compute_->Free(nullptr);
  void* p = compute_->Alloc(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  compute_->Free(p);
  EXPECT_EQ(compute_->Synchronize(), "");
}

TEST_P(ComputeTest, Gemm) {
  Random rnd(1);
  struct Shape {
    int m, n, k;
  };
  for (const Shape& s : {Shape{1, 1, 1}, Shape{7, 13, 5}, Shape{33, 65, 17},
                         Shape{64, 3, 129}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.0f, -1.3f}) {
          SCOPED_TRACE(testing::Message() << "m=" << s.m << " n=" << s.n
                                          << " k=" << s.k << " ta=" << ta
                                          << " tb=" << tb << " beta=" << beta);
          // Stored shapes, with padding columns (ld > cols).
          const int a_rows = ta ? s.k : s.m, a_cols = ta ? s.m : s.k;
          const int b_rows = tb ? s.n : s.k, b_cols = tb ? s.k : s.n;
          const int lda = a_cols + 3, ldb = b_cols + 2, ldc = s.n + 5;
          std::vector<float> a = rnd.Vector(a_rows * lda);
          std::vector<float> b = rnd.Vector(b_rows * ldb);
          std::vector<float> c = rnd.Vector(s.m * ldc);
          // beta = 0 must not read C: NaN there must not leak out.
          if (beta == 0.0f) {
            for (int r = 0; r < s.m; ++r) c[r * ldc] = kNaN;
          }
          const float alpha = 0.7f;
          std::vector<double> want = ToDouble(c);
          for (int i = 0; i < s.m; ++i) {
            for (int j = 0; j < s.n; ++j) {
              double sum = 0;
              for (int l = 0; l < s.k; ++l) {
                const double av = ta ? a[l * lda + i] : a[i * lda + l];
                const double bv = tb ? b[j * ldb + l] : b[l * ldb + j];
                sum += av * bv;
              }
              want[i * ldc + j] =
                  alpha * sum + (beta == 0.0f ? 0.0 : beta * c[i * ldc + j]);
            }
          }
          auto da = Make(a), db = Make(b), dc = Make(c);
          compute_->Gemm(ta, tb, s.m, s.n, s.k, alpha, da->get(), lda,
                         db->get(), ldb, beta, dc->get(), ldc);
          EXPECT_TRUE(AllNear(dc->Read(), want));
        }
      }
    }
  }
}

TEST_P(ComputeTest, GemmWithEmptyInnerDimensionScalesC) {
  const int m = 3, n = 4, ldc = 6;
  std::vector<float> c(m * ldc, 2.0f);
  auto dc = Make(c);
  compute_->Gemm(false, false, m, n, 0, 1.0f, nullptr, 1, nullptr, n, 0.5f,
                 dc->get(), ldc);
  std::vector<double> want(m * ldc, 2.0);
  for (int r = 0; r < m; ++r) {
    for (int j = 0; j < n; ++j) want[r * ldc + j] = 1.0;
  }
  EXPECT_TRUE(AllNear(dc->Read(), want));
  // beta = 0 overwrites, NaN included.
  std::vector<float> nans(m * ldc, kNaN);
  auto dn = Make(nans);
  compute_->Gemm(true, true, m, n, 0, 1.0f, nullptr, 1, nullptr, 1, 0.0f,
                 dn->get(), ldc);
  std::vector<float> got = dn->Read();
  for (int r = 0; r < m; ++r) {
    for (int j = 0; j < ldc; ++j) {
      if (j < n) {
        EXPECT_EQ(got[r * ldc + j], 0.0f);
      } else {
        EXPECT_TRUE(std::isnan(got[r * ldc + j]));  // padding untouched
      }
    }
  }
}

TEST_P(ComputeTest, Elementwise) {
  Random rnd(2);
  // Fill.
  {
    auto x = Make(rnd.Vector(1001));
    compute_->Fill(1000, 2.5f, x->get());
    std::vector<float> got = x->Read();
    EXPECT_TRUE(std::all_of(got.begin(), got.end() - 1,
                            [](float v) { return v == 2.5f; }));
    EXPECT_NE(got.back(), 2.5f);
    compute_->Fill(0, 1.0f, x->get());  // no-op
  }
  const int rows = 37, cols = 11, ld = 13;
  std::vector<float> x = rnd.Vector(rows * ld);
  // AddBias.
  {
    std::vector<float> bias = rnd.Vector(cols);
    std::vector<double> want = ToDouble(x);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) want[r * ld + c] += bias[c];
    }
    auto dx = Make(x), db = Make(bias);
    compute_->AddBias(rows, cols, db->get(), dx->get(), ld);
    EXPECT_TRUE(AllNear(dx->Read(), want));
  }
  // ColumnSum, with beta = 0 (out not read) and beta != 0.
  for (float beta : {0.0f, 0.5f}) {
    std::vector<float> out = rnd.Vector(cols + 1);
    if (beta == 0.0f) std::fill(out.begin(), out.end() - 1, kNaN);
    std::vector<double> want = ToDouble(out);
    for (int c = 0; c < cols; ++c) {
      double sum = 0;
      for (int r = 0; r < rows; ++r) sum += x[r * ld + c];
      want[c] = (beta == 0.0f ? 0.0 : beta * out[c]) + sum;
    }
    auto dx = Make(x), dout = Make(out);
    compute_->ColumnSum(rows, cols, dx->get(), ld, beta, dout->get());
    EXPECT_TRUE(AllNear(dout->Read(), want)) << "beta " << beta;
  }
  // Relu and ReluBackward (zero counts as inactive).
  {
    std::vector<float> v = rnd.Vector(1001);
    v[0] = 0.0f;
    std::vector<double> want(v.size());
    for (size_t i = 0; i < v.size(); ++i) want[i] = std::max(v[i], 0.0f);
    auto dv = Make(v);
    compute_->Relu(v.size(), dv->get());
    const std::vector<float> y = dv->Read();
    EXPECT_TRUE(AllNear(y, want));

    std::vector<float> dy = rnd.Vector(v.size());
    std::vector<double> want_dy(v.size());
    for (size_t i = 0; i < v.size(); ++i) want_dy[i] = y[i] > 0 ? dy[i] : 0.0;
    auto ddy = Make(dy);
    compute_->ReluBackward(v.size(), dv->get(), ddy->get());
    EXPECT_TRUE(AllNear(ddy->Read(), want_dy));
  }
  // Copy2D and Add2D between different strides; padding left alone.
  {
    const int ldd = 17;
    std::vector<float> dst = rnd.Vector(rows * ldd);
    std::vector<double> copied = ToDouble(dst), added = ToDouble(dst);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        copied[r * ldd + c] = x[r * ld + c];
        added[r * ldd + c] = double{dst[r * ldd + c]} + x[r * ld + c];
      }
    }
    auto dx = Make(x), d1 = Make(dst), d2 = Make(dst);
    compute_->Copy2D(rows, cols, dx->get(), ld, d1->get(), ldd);
    compute_->Add2D(rows, cols, dx->get(), ld, d2->get(), ldd);
    EXPECT_TRUE(AllNear(d1->Read(), copied));
    EXPECT_TRUE(AllNear(d2->Read(), added));
  }
}

TEST_P(ComputeTest, EmbeddingBag) {
  Random rnd(3);
  const int batch = 5, fields = 3, out_fields = 4, num_rows = 20;
  for (int dim : {1, 7, 16, 64}) {
    SCOPED_TRACE(testing::Message() << "dim=" << dim);
    const int ld = dim + 3;
    const Bags bags = MakeBags(rnd, batch * fields, 4, num_rows);
    std::vector<float> table = rnd.Vector(num_rows * ld);
    // Slots f >= fields keep their sentinel.
    std::vector<float> out(batch * out_fields * dim, 123.0f);
    std::vector<double> want(out.size(), 123.0);
    for (int b = 0; b < batch; ++b) {
      for (int f = 0; f < fields; ++f) {
        const int bag = b * fields + f;
        for (int c = 0; c < dim; ++c) {
          double sum = 0;
          for (uint32_t i = bags.offsets[bag]; i < bags.offsets[bag + 1]; ++i) {
            sum += double{bags.values[i]} * table[bags.rows[i] * ld + c];
          }
          want[(b * out_fields + f) * dim + c] = sum;
        }
      }
    }
    auto doff = Make(bags.offsets), drows = Make(bags.rows);
    auto dvals = Make(bags.values), dtable = Make(table), dout = Make(out);
    compute_->EmbeddingBag(batch, fields, out_fields, dim, doff->get(),
                           drows->get(), dvals->get(), dtable->get(), ld,
                           dout->get());
    EXPECT_TRUE(AllNear(dout->Read(), want));
  }
}

TEST_P(ComputeTest, EmbeddingBagBackward) {
  Random rnd(4);
  // Few rows, so that features share rows and the scatter must accumulate.
  const int batch = 6, fields = 3, out_fields = 5, num_rows = 4;
  for (int dim : {1, 8, 13}) {
    SCOPED_TRACE(testing::Message() << "dim=" << dim);
    const int ld = dim + 2;
    const Bags bags = MakeBags(rnd, batch * fields, 6, num_rows);
    std::vector<float> d_out = rnd.Vector(batch * out_fields * dim);
    std::vector<float> d_table = rnd.Vector(num_rows * ld);  // accumulated
    std::vector<double> want = ToDouble(d_table);
    for (int b = 0; b < batch; ++b) {
      for (int f = 0; f < fields; ++f) {
        const int bag = b * fields + f;
        for (uint32_t i = bags.offsets[bag]; i < bags.offsets[bag + 1]; ++i) {
          for (int c = 0; c < dim; ++c) {
            want[bags.rows[i] * ld + c] +=
                double{bags.values[i]} * d_out[(b * out_fields + f) * dim + c];
          }
        }
      }
    }
    auto doff = Make(bags.offsets), drows = Make(bags.rows);
    auto dvals = Make(bags.values), dgo = Make(d_out), dgt = Make(d_table);
    compute_->EmbeddingBagBackward(batch, fields, out_fields, dim, doff->get(),
                                   drows->get(), dvals->get(), dgo->get(),
                                   dgt->get(), ld);
    EXPECT_TRUE(AllNear(dgt->Read(), want));
  }
}

// Reference FM: logits += linear + pairwise; sums as in compute.h.
void FmReference(int batch, int k, const Bags& f,
                 const std::vector<float>& table, int ld,
                 std::vector<double>* sums, std::vector<double>* logits) {
  sums->assign(static_cast<size_t>(batch) * k, 0.0);
  for (int b = 0; b < batch; ++b) {
    double linear = 0, pair = 0;
    for (uint32_t i = f.offsets[b]; i < f.offsets[b + 1]; ++i) {
      linear += double{table[f.rows[i] * ld]} * f.values[i];
    }
    for (int c = 0; c < k; ++c) {
      double s = 0, sq = 0;
      for (uint32_t i = f.offsets[b]; i < f.offsets[b + 1]; ++i) {
        const double vx = double{table[f.rows[i] * ld + 1 + c]} * f.values[i];
        s += vx;
        sq += vx * vx;
      }
      (*sums)[b * k + c] = s;
      pair += s * s - sq;
    }
    (*logits)[b] += linear + 0.5 * pair;
  }
}

TEST_P(ComputeTest, FmForward) {
  Random rnd(5);
  const int batch = 7, num_rows = 9;
  for (int k : {0, 1, 5, 16}) {
    SCOPED_TRACE(testing::Message() << "k=" << k);
    const int ld = 1 + k + 2;
    const Bags f = MakeBags(rnd, batch, 8, num_rows);  // rows repeat
    std::vector<float> table = rnd.Vector(num_rows * ld);
    std::vector<float> logits = rnd.Vector(batch);  // accumulated into
    std::vector<double> want_sums, want_logits = ToDouble(logits);
    FmReference(batch, k, f, table, ld, &want_sums, &want_logits);

    auto doff = Make(f.offsets), drows = Make(f.rows);
    auto dvals = Make(f.values);
    auto dtable = Make(table), dlogits = Make(logits);
    // k = 0: no sums buffer at all (nullptr).
    auto dsums = Make(std::vector<float>(batch * k, kNaN));
    compute_->FmForward(batch, k, doff->get(), drows->get(), dvals->get(),
                        dtable->get(), ld, dsums->get(), dlogits->get());
    EXPECT_TRUE(AllNear(dlogits->Read(), want_logits));
    EXPECT_TRUE(AllNear(dsums->Read(), want_sums));
  }
}

TEST_P(ComputeTest, FmBackward) {
  Random rnd(6);
  const int batch = 7, num_rows = 5;
  for (int k : {0, 3, 16}) {
    SCOPED_TRACE(testing::Message() << "k=" << k);
    const int ld = 1 + k + 1;
    const Bags f = MakeBags(rnd, batch, 8, num_rows);
    std::vector<float> table = rnd.Vector(num_rows * ld);
    std::vector<float> sums = rnd.Vector(batch * k);  // any sums will do
    std::vector<float> d_logits = rnd.Vector(batch);
    std::vector<float> d_table = rnd.Vector(num_rows * ld);
    std::vector<double> want = ToDouble(d_table);
    for (int b = 0; b < batch; ++b) {
      for (uint32_t i = f.offsets[b]; i < f.offsets[b + 1]; ++i) {
        const double x = f.values[i], g = d_logits[b];
        const int r = f.rows[i];
        want[r * ld] += g * x;
        for (int c = 0; c < k; ++c) {
          want[r * ld + 1 + c] +=
              g * x * (sums[b * k + c] - double{table[r * ld + 1 + c]} * x);
        }
      }
    }
    auto doff = Make(f.offsets), drows = Make(f.rows);
    auto dvals = Make(f.values);
    auto dtable = Make(table), dsums = Make(sums), dgl = Make(d_logits);
    auto dgt = Make(d_table);
    compute_->FmBackward(batch, k, doff->get(), drows->get(), dvals->get(),
                         dtable->get(), ld, dsums->get(), dgl->get(),
                         dgt->get());
    EXPECT_TRUE(AllNear(dgt->Read(), want));
  }
}

TEST_P(ComputeTest, DotInteraction) {
  Random rnd(7);
  const int batch = 4;
  for (int n : {1, 2, 5, 27}) {
    for (int dim : {1, 8, 13}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " dim=" << dim);
      const int pairs = n * (n - 1) / 2, ld_out = pairs + 3;
      std::vector<float> x = rnd.Vector(batch * n * dim);
      std::vector<float> out(batch * ld_out, 77.0f);  // padding sentinel
      std::vector<double> want(out.size(), 77.0);
      for (int b = 0; b < batch; ++b) {
        int p = 0;
        for (int i = 1; i < n; ++i) {
          for (int j = 0; j < i; ++j) {
            double dot = 0;
            for (int c = 0; c < dim; ++c) {
              dot += double{x[(b * n + i) * dim + c]} * x[(b * n + j) * dim + c];
            }
            want[b * ld_out + p++] = dot;
          }
        }
      }
      auto dx = Make(x), dout = Make(out);
      compute_->DotInteraction(batch, n, dim, dx->get(), dout->get(), ld_out);
      EXPECT_TRUE(AllNear(dout->Read(), want));

      // Backward: d_x is overwritten (NaN before), padding of d_out ignored.
      std::vector<float> d_out = rnd.Vector(batch * ld_out);
      std::vector<double> want_dx(x.size(), 0.0);
      for (int b = 0; b < batch; ++b) {
        int p = 0;
        for (int i = 1; i < n; ++i) {
          for (int j = 0; j < i; ++j, ++p) {
            const double g = d_out[b * ld_out + p];
            for (int c = 0; c < dim; ++c) {
              want_dx[(b * n + i) * dim + c] += g * x[(b * n + j) * dim + c];
              want_dx[(b * n + j) * dim + c] += g * x[(b * n + i) * dim + c];
            }
          }
        }
      }
      auto dgo = Make(d_out), dgx = Make(std::vector<float>(x.size(), kNaN));
      compute_->DotInteractionBackward(batch, n, dim, dx->get(), dgo->get(),
                                       ld_out, dgx->get());
      EXPECT_TRUE(AllNear(dgx->Read(), want_dx));
    }
  }
}

TEST_P(ComputeTest, SigmoidCrossEntropyIsStable) {
  const std::vector<float> logits = {0.0f,   1.0f,   -1.0f, 20.0f,  -20.0f,
                                     100.0f, -100.0f, 1e4f,  -1e4f,  88.8f,
                                     -88.8f, 3.3f,    -3.3f, 1e30f, -1e30f};
  std::vector<float> labels;
  for (size_t i = 0; i < logits.size(); ++i) {
    labels.push_back(i % 3 == 0 ? 0.0f : i % 3 == 1 ? 1.0f : 0.3f);
  }
  const float scale = 0.25f;
  const int batch = logits.size();
  std::vector<double> want_p(batch), want_loss(batch), want_d(batch);
  for (int b = 0; b < batch; ++b) {
    const double z = logits[b], y = labels[b];
    want_p[b] = z >= 0 ? 1.0 / (1.0 + std::exp(-z))
                       : std::exp(z) / (1.0 + std::exp(z));
    want_loss[b] = std::max(z, 0.0) - y * z + std::log1p(std::exp(-std::fabs(z)));
    want_d[b] = (want_p[b] - y) * scale;
  }
  auto dl = Make(logits), dy = Make(labels);
  auto dp = Make(std::vector<float>(batch)), dloss = Make(std::vector<float>(batch));
  auto dd = Make(std::vector<float>(batch));
  compute_->SigmoidCrossEntropy(batch, dl->get(), dy->get(), scale, dp->get(),
                                dloss->get(), dd->get());
  EXPECT_TRUE(AllNear(dp->Read(), want_p));
  EXPECT_TRUE(AllNear(dloss->Read(), want_loss));
  EXPECT_TRUE(AllNear(dd->Read(), want_d));

  // Outputs may be left out.
  auto dd2 = Make(std::vector<float>(batch));
  compute_->SigmoidCrossEntropy(batch, dl->get(), dy->get(), scale, nullptr,
                                nullptr, dd2->get());
  EXPECT_TRUE(AllNear(dd2->Read(), want_d));
}

TEST_P(ComputeTest, SoftmaxCrossEntropy) {
  Random rnd(8);
  for (int classes : {1, 10, 37}) {
    SCOPED_TRACE(testing::Message() << "classes=" << classes);
    const int batch = 8;
    std::vector<float> logits = rnd.Vector(batch * classes, -5.0f, 5.0f);
    for (int c = 0; c < classes; ++c) {
      logits[1 * classes + c] *= 1e4f;  // huge logits: exp would overflow
      logits[2 * classes + c] -= 1e5f;  // hugely negative
    }
    // In range, out of range (both sides, NaN), and a fractional label
    // (truncated to its class).
    const std::vector<float> labels = {
        0.0f, static_cast<float>(classes - 1), static_cast<float>(classes / 2),
        -1.0f, static_cast<float>(classes), kNaN,
        std::min(2.7f, classes - 0.5f), 1e9f};
    const float scale = 0.5f;
    std::vector<double> want_p(batch * classes), want_loss(batch),
        want_d(batch * classes);
    for (int b = 0; b < batch; ++b) {
      const float* z = &logits[b * classes];
      const double mx = *std::max_element(z, z + classes);
      double sum = 0;
      for (int c = 0; c < classes; ++c) sum += std::exp(z[c] - mx);
      const float y = labels[b];
      const bool valid = y >= 0 && y < classes;
      const int label = valid ? static_cast<int>(y) : -1;
      for (int c = 0; c < classes; ++c) {
        const double p = std::exp(z[c] - mx) / sum;
        want_p[b * classes + c] = p;
        want_d[b * classes + c] = valid ? (p - (c == label)) * scale : 0.0;
      }
      want_loss[b] = valid ? std::log(sum) - (z[label] - mx) : 0.0;
    }
    auto dl = Make(logits), dy = Make(labels);
    auto dp = Make(std::vector<float>(batch * classes));
    auto dloss = Make(std::vector<float>(batch));
    auto dd = Make(std::vector<float>(batch * classes));
    compute_->SoftmaxCrossEntropy(batch, classes, dl->get(), dy->get(), scale,
                                  dp->get(), dloss->get(), dd->get());
    EXPECT_TRUE(AllNear(dp->Read(), want_p));
    EXPECT_TRUE(AllNear(dloss->Read(), want_loss));
    EXPECT_TRUE(AllNear(dd->Read(), want_d));
  }
}

// --- Finite differences ---------------------------------------------------------
// Each check takes J = sum(G * forward(theta)) for random G, gets dJ/dtheta
// from the backward kernel with d_out = G, and compares a sample of entries
// with central differences of J through the forward kernel. The forward
// kernels are linear or quadratic in any single parameter, so central
// differences are exact up to rounding and a large step keeps that small.
constexpr float kStep = 0.1f;
constexpr double kFdTol = 2e-3;

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += double{a[i]} * b[i];
  return sum;
}

// Compares grad[i] with (J(theta_i + step) - J(theta_i - step)) / (2 step)
// for the sampled i; `objective` runs the forward pass on `param`'s current
// contents.
template <typename Objective>
void CheckGradient(Buffer<float>& param, const std::vector<float>& grad,
                   const std::vector<size_t>& sample, Objective objective) {
  std::vector<float> theta = param.Read();
  for (size_t i : sample) {
    param.Set(i, theta[i] + kStep);
    const double plus = objective();
    param.Set(i, theta[i] - kStep);
    const double minus = objective();
    param.Set(i, theta[i]);
    const double numeric = (plus - minus) / (2 * kStep);
    EXPECT_NEAR(grad[i], numeric, kFdTol * (1 + std::fabs(numeric)))
        << "parameter " << i;
  }
}

std::vector<size_t> Sample(Random& rnd, size_t n, int count) {
  std::vector<size_t> out;
  for (int i = 0; i < count; ++i) out.push_back(rnd.Int(0, n - 1));
  return out;
}

TEST_P(ComputeTest, EmbeddingBagGradientMatchesFiniteDifferences) {
  Random rnd(9);
  const int batch = 4, fields = 3, out_fields = 4, dim = 5, ld = 6,
            num_rows = 6;
  const Bags bags = MakeBags(rnd, batch * fields, 4, num_rows);
  const std::vector<float> g = rnd.Vector(batch * out_fields * dim);
  auto doff = Make(bags.offsets), drows = Make(bags.rows);
  auto dvals = Make(bags.values), dtable = Make(rnd.Vector(num_rows * ld));
  auto dg = Make(g), dout = Make(std::vector<float>(g.size(), 0.0f));
  auto dgrad = Make(std::vector<float>(num_rows * ld, 0.0f));
  compute_->EmbeddingBagBackward(batch, fields, out_fields, dim, doff->get(),
                                 drows->get(), dvals->get(), dg->get(),
                                 dgrad->get(), ld);
  const std::vector<float> grad = dgrad->Read();
  // The slots between examples are not outputs: leave them out of J.
  std::vector<float> mask(g.size(), 0.0f);
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < fields * dim; ++i) mask[b * out_fields * dim + i] = 1;
  }
  CheckGradient(*dtable, grad, Sample(rnd, num_rows * ld, 40), [&] {
    compute_->EmbeddingBag(batch, fields, out_fields, dim, doff->get(),
                           drows->get(), dvals->get(), dtable->get(), ld,
                           dout->get());
    std::vector<float> out = dout->Read();
    for (size_t i = 0; i < out.size(); ++i) out[i] *= mask[i];
    return Dot(out, g);
  });
}

TEST_P(ComputeTest, FmGradientMatchesFiniteDifferences) {
  Random rnd(10);
  const int batch = 5, k = 4, ld = 1 + k + 1, num_rows = 4;
  const Bags f = MakeBags(rnd, batch, 6, num_rows);  // rows repeat
  const std::vector<float> g = rnd.Vector(batch);
  auto doff = Make(f.offsets), drows = Make(f.rows);
    auto dvals = Make(f.values);
  auto dtable = Make(rnd.Vector(num_rows * ld));
  auto dsums = Make(std::vector<float>(batch * k));
  auto dlogits = Make(std::vector<float>(batch, 0.0f));
  auto dg = Make(g), dgrad = Make(std::vector<float>(num_rows * ld, 0.0f));
  compute_->FmForward(batch, k, doff->get(), drows->get(), dvals->get(),
                      dtable->get(), ld, dsums->get(), dlogits->get());
  compute_->FmBackward(batch, k, doff->get(), drows->get(), dvals->get(),
                       dtable->get(), ld, dsums->get(), dg->get(),
                       dgrad->get());
  const std::vector<float> grad = dgrad->Read();
  std::vector<size_t> all(num_rows * ld);
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  CheckGradient(*dtable, grad, all, [&] {
    compute_->Fill(batch, 0.0f, dlogits->get());
    compute_->FmForward(batch, k, doff->get(), drows->get(), dvals->get(),
                        dtable->get(), ld, dsums->get(), dlogits->get());
    return Dot(dlogits->Read(), g);
  });
}

TEST_P(ComputeTest, DotInteractionGradientMatchesFiniteDifferences) {
  Random rnd(11);
  const int batch = 3, n = 6, dim = 7, pairs = n * (n - 1) / 2,
            ld_out = pairs + 1;
  std::vector<float> g = rnd.Vector(batch * ld_out);
  for (int b = 0; b < batch; ++b) g[b * ld_out + pairs] = 0;  // padding
  auto dx = Make(rnd.Vector(batch * n * dim)), dg = Make(g);
  auto dout = Make(std::vector<float>(g.size(), 0.0f));
  auto dgrad = Make(std::vector<float>(batch * n * dim));
  compute_->DotInteractionBackward(batch, n, dim, dx->get(), dg->get(), ld_out,
                                   dgrad->get());
  const std::vector<float> grad = dgrad->Read();
  CheckGradient(*dx, grad, Sample(rnd, batch * n * dim, 40), [&] {
    compute_->DotInteraction(batch, n, dim, dx->get(), dout->get(), ld_out);
    return Dot(dout->Read(), g);
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, ComputeTest,
                         ::testing::Values(Backend::kCpu, Backend::kGpu),
                         BackendName);

// --- CPU against GPU -------------------------------------------------------------

// Runs every kernel at model-like sizes on deterministic inputs and returns
// all outputs, named.
std::vector<std::pair<std::string, std::vector<float>>> RunAll(Compute* c) {
  Random rnd(12);
  std::vector<std::pair<std::string, std::vector<float>>> results;
  auto make = [c](std::vector<float> v) {
    return std::make_unique<Buffer<float>>(c, std::move(v));
  };
  auto make_u = [c](std::vector<uint32_t> v) {
    return std::make_unique<Buffer<uint32_t>>(c, std::move(v));
  };
  {  // Gemm, all transposes.
    const int m = 130, n = 97, k = 201;
    auto a = make(rnd.Vector(m * k)), b = make(rnd.Vector(k * n));
    for (int t = 0; t < 4; ++t) {
      auto out = make(rnd.Vector(m * n));
      c->Gemm(t & 1, t & 2, m, n, k, 0.5f, a->get(), (t & 1) ? m : k, b->get(),
              (t & 2) ? k : n, 0.25f, out->get(), n);
      results.emplace_back("Gemm" + std::to_string(t), out->Read());
    }
  }
  const int batch = 256, fields = 26, dim = 16, num_rows = 1000;
  const Bags bags = MakeBags(rnd, batch * fields, 3, num_rows);
  auto off = make_u(bags.offsets), rows = make_u(bags.rows);
  auto vals = make(bags.values);
  {  // EmbeddingBag and its backward; DotInteraction on the result.
    const int out_fields = fields + 1, n = out_fields;
    auto table = make(rnd.Vector(num_rows * dim));
    auto out = make(rnd.Vector(batch * out_fields * dim));
    c->EmbeddingBag(batch, fields, out_fields, dim, off->get(), rows->get(),
                    vals->get(), table->get(), dim, out->get());
    results.emplace_back("EmbeddingBag", out->Read());
    auto grad = make(std::vector<float>(num_rows * dim, 0.0f));
    c->EmbeddingBagBackward(batch, fields, out_fields, dim, off->get(),
                            rows->get(), vals->get(), out->get(), grad->get(),
                            dim);
    results.emplace_back("EmbeddingBagBackward", grad->Read());
    const int pairs = n * (n - 1) / 2;
    auto inter = make(std::vector<float>(batch * pairs));
    c->DotInteraction(batch, n, dim, out->get(), inter->get(), pairs);
    results.emplace_back("DotInteraction", inter->Read());
    auto dx = make(std::vector<float>(batch * n * dim));
    c->DotInteractionBackward(batch, n, dim, out->get(), inter->get(), pairs,
                              dx->get());
    results.emplace_back("DotInteractionBackward", dx->Read());
  }
  {  // FM over all of an example's features, then both losses.
    const int k = 8, ld = 1 + k;
    std::vector<uint32_t> ex_off;
    for (int b = 0; b <= batch; ++b) ex_off.push_back(bags.offsets[b * fields]);
    auto eoff = make_u(ex_off);
    auto table = make(rnd.Vector(num_rows * ld, -0.3f, 0.3f));
    auto sums = make(std::vector<float>(batch * k));
    auto logits = make(std::vector<float>(batch, 0.0f));
    c->FmForward(batch, k, eoff->get(), rows->get(), vals->get(), table->get(),
                 ld, sums->get(), logits->get());
    results.emplace_back("FmForward.logits", logits->Read());
    results.emplace_back("FmForward.sums", sums->Read());
    std::vector<float> labels(batch);
    for (float& y : labels) y = rnd.Int(0, 1);
    auto y = make(labels);
    auto p = make(std::vector<float>(batch)), loss = make(p->Read());
    auto d = make(p->Read());
    c->SigmoidCrossEntropy(batch, logits->get(), y->get(), 1.0f / batch,
                           p->get(), loss->get(), d->get());
    results.emplace_back("Sigmoid.probs", p->Read());
    results.emplace_back("Sigmoid.loss", loss->Read());
    results.emplace_back("Sigmoid.d", d->Read());
    auto grad = make(std::vector<float>(num_rows * ld, 0.0f));
    c->FmBackward(batch, k, eoff->get(), rows->get(), vals->get(),
                  table->get(), ld, sums->get(), d->get(), grad->get());
    results.emplace_back("FmBackward", grad->Read());
  }
  {  // Softmax, ColumnSum.
    const int classes = 10;
    auto logits = make(rnd.Vector(batch * classes, -8.0f, 8.0f));
    std::vector<float> labels(batch);
    for (float& y : labels) y = rnd.Int(-1, classes);
    auto y = make(labels);
    auto p = make(std::vector<float>(batch * classes));
    auto loss = make(std::vector<float>(batch));
    auto d = make(std::vector<float>(batch * classes));
    c->SoftmaxCrossEntropy(batch, classes, logits->get(), y->get(), 0.1f,
                           p->get(), loss->get(), d->get());
    results.emplace_back("Softmax.probs", p->Read());
    results.emplace_back("Softmax.loss", loss->Read());
    results.emplace_back("Softmax.d", d->Read());
    auto sum = make(std::vector<float>(classes, 1.0f));
    c->ColumnSum(batch, classes, d->get(), classes, 1.0f, sum->get());
    results.emplace_back("ColumnSum", sum->Read());
  }
  EXPECT_EQ(c->Synchronize(), "");
  return results;
}

TEST(ComputeAgreementTest, CpuAndGpuAgree) {
  std::string why;
  std::unique_ptr<Compute> gpu = MakeBackend(Backend::kGpu, &why);
  if (gpu == nullptr) GTEST_SKIP() << "no usable GPU: " << why;
  std::unique_ptr<Compute> cpu = CreateCpuCompute(1);
  const auto want = RunAll(cpu.get());
  const auto got = RunAll(gpu.get());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(AllNear(got[i].second, ToDouble(want[i].second)))
        << want[i].first;
  }
}

// --- Factory ---------------------------------------------------------------------

TEST(ComputeFactoryTest, CpuOnRequest) {
  std::string why;
  absl::StatusOr<std::unique_ptr<Compute>> compute =
      CreateCompute(ComputeDevice::CPU, 3, &why);
  ASSERT_TRUE(compute.ok()) << compute.status();
  EXPECT_FALSE((*compute)->is_gpu());
  EXPECT_EQ((*compute)->name(), "cpu (3 threads)");
  EXPECT_FALSE(why.empty());
}

TEST(ComputeFactoryTest, AutoFallsBackToCpuWithAReason) {
  std::string gpu_why;
  const bool gpu = GpuAvailable(&gpu_why);
  std::string why;
  absl::StatusOr<std::unique_ptr<Compute>> compute =
      CreateCompute(ComputeDevice::AUTO, 1, &why);
  ASSERT_TRUE(compute.ok()) << compute.status();
  EXPECT_EQ((*compute)->is_gpu(), gpu);
  if (gpu) {
    EXPECT_TRUE(why.empty()) << why;
  } else {
    EXPECT_FALSE(gpu_why.empty());
    EXPECT_THAT(why, ::testing::HasSubstr(gpu_why));
    std::cout << "AUTO chose the CPU: " << why << "\n";
  }
  // Asking again gives the same answer (the library is loaded once).
  std::string again;
  EXPECT_EQ(GpuAvailable(&again), gpu);
  EXPECT_EQ(again, gpu_why);
}

// Where the NVIDIA driver is missing, the answer says so, and cuBLAS and the
// CUDA runtime are never loaded into the process to find out.
TEST(ComputeFactoryTest, NoDriverIsNamedWithoutLoadingCuda) {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver != nullptr) GTEST_SKIP() << "this machine has the NVIDIA driver";
  std::string why;
  absl::StatusOr<std::unique_ptr<Compute>> compute =
      CreateCompute(ComputeDevice::AUTO, 1, &why);
  ASSERT_TRUE(compute.ok()) << compute.status();
  EXPECT_FALSE((*compute)->is_gpu());
  if (why.find("built without CUDA") != std::string::npos) {
    GTEST_SKIP() << why;
  }
  EXPECT_THAT(why, ::testing::HasSubstr("no NVIDIA driver (libcuda.so.1"));
  std::ifstream maps("/proc/self/maps");
  std::stringstream mapped;
  mapped << maps.rdbuf();
  for (const char* library : {"libcublas", "libcudart", "libps_cuda"}) {
    EXPECT_EQ(mapped.str().find(library), std::string::npos)
        << library << " was loaded";
  }
}

TEST(ComputeFactoryTest, GpuFailsWithoutOne) {
  std::string gpu_why;
  const bool gpu = GpuAvailable(&gpu_why);
  absl::StatusOr<std::unique_ptr<Compute>> compute =
      CreateCompute(ComputeDevice::GPU, 1, nullptr);
  if (gpu) {
    ASSERT_TRUE(compute.ok()) << compute.status();
    EXPECT_TRUE((*compute)->is_gpu());
  } else {
    EXPECT_EQ(compute.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(compute.status().message()),
                ::testing::HasSubstr(gpu_why));
  }
}

TEST(ComputeFactoryTest, RejectsUnknownDevice) {
  absl::StatusOr<std::unique_ptr<Compute>> compute =
      CreateCompute(static_cast<ComputeDevice>(42), 1, nullptr);
  EXPECT_EQ(compute.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
