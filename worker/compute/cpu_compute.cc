#include "worker/compute/cpu_compute.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// Debian's /usr/include/x86_64-linux-gnu/cblas.h is an alternative that may
// point at the reference CBLAS header, which lacks OpenBLAS's extensions.
// The library we link (-lopenblas) always has this one, so declare it here.
extern "C" void openblas_set_num_threads(int num_threads);

namespace ps {
namespace {

// The kernels below are written so that GCC vectorises the inner loop over
// the contiguous `dim` / `cols` axis: __restrict tells it the output does
// not alias the inputs, and `#pragma omp simd` (with -fopenmp-simd, no
// OpenMP runtime) lets it reorder the float reductions, which it otherwise
// may not do without -ffast-math.

// Numerically stable log(1 + e^z) - y z and sigmoid(z).
inline void SigmoidLoss(float z, float y, float* p, float* loss) {
  const float e = std::exp(-std::fabs(z));  // in (0, 1]: never overflows
  *p = z >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
  *loss = std::max(z, 0.0f) - y * z + std::log1p(e);
}

// The hottest DLRM kernels (the dot interaction is ~40% of a step) are
// compiled twice: for the build's baseline ISA and for AVX2 + FMA, picked
// at run time, so one binary runs everywhere and uses 256-bit vectors where
// it can. The bodies are always-inlined templates so each copy is
// vectorised for its own target.
#define PS_ALWAYS_INLINE __attribute__((always_inline)) inline

// Forward: for each example, x^T is built in scratch (dim x n_pad, n_pad =
// n rounded up to 8), so the dot products of vector i with vectors
// j0..j0+7 are one 8-wide vector FMA per element c; the pairs (i, 0..i-1)
// are contiguous in the output. kDim > 0 fixes dim at compile time (the
// common embedding sizes), which unrolls the c loop; 0 reads `dim`.
template <int kDim>
PS_ALWAYS_INLINE void DotForwardBody(int batch, int n, int dim_arg,
                                     const float* x, float* out, int ld_out,
                                     float* __restrict xt) {
  const int dim = kDim > 0 ? kDim : dim_arg;
  const int n_pad = (n + 7) / 8 * 8;
  for (int b = 0; b < batch; ++b) {
    const float* xb = x + static_cast<size_t>(b) * n * dim;
    for (int i = 0; i < n; ++i) {
      for (int c = 0; c < dim; ++c) xt[c * n_pad + i] = xb[i * dim + c];
    }
    float* o = out + static_cast<size_t>(b) * ld_out;
    for (int i = 1; i < n; ++i) {
      const float* xi = xb + static_cast<size_t>(i) * dim;
      float* dst = o + i * (i - 1) / 2;
      for (int j0 = 0; j0 < i; j0 += 8) {
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int c = 0; c < dim; ++c) {
          const float s = xi[c];
          const float* __restrict row = xt + c * n_pad + j0;
#pragma omp simd
          for (int v = 0; v < 8; ++v) acc[v] += s * row[v];
        }
        const int m = std::min(8, i - j0);
        for (int v = 0; v < m; ++v) dst[j0 + v] = acc[v];
      }
    }
  }
}

// Backward: d x_i = sum_j G(i, j) x_j with G the symmetric pair-gradient
// matrix (zero diagonal), expanded per example into scratch so the inner
// loop is a plain vector FMA over the contiguous dim axis, accumulated in
// a local array the compiler keeps in registers for a fixed kDim.
template <int kDim>
PS_ALWAYS_INLINE void DotBackwardBody(int batch, int n, int dim_arg,
                                      const float* x, const float* d_out,
                                      int ld_out, float* d_x,
                                      float* __restrict g) {
  const int dim = kDim > 0 ? kDim : dim_arg;
  for (int b = 0; b < batch; ++b) {
    const float* xb = x + static_cast<size_t>(b) * n * dim;
    const float* pairs = d_out + static_cast<size_t>(b) * ld_out;
    for (int i = 0; i < n; ++i) {
      g[i * n + i] = 0.0f;
      const float* p = pairs + i * (i - 1) / 2;
      for (int j = 0; j < i; ++j) {
        g[i * n + j] = p[j];
        g[j * n + i] = p[j];
      }
    }
    for (int i = 0; i < n; ++i) {
      float* __restrict d = d_x + (static_cast<size_t>(b) * n + i) * dim;
      const float* gi = g + i * n;
      if constexpr (kDim > 0) {
        float acc[kDim] = {};
        for (int j = 0; j < n; ++j) {
          const float w = gi[j];
          const float* __restrict xj = xb + static_cast<size_t>(j) * kDim;
#pragma omp simd
          for (int c = 0; c < kDim; ++c) acc[c] += w * xj[c];
        }
        for (int c = 0; c < kDim; ++c) d[c] = acc[c];
      } else {
        for (int c = 0; c < dim; ++c) d[c] = 0.0f;
        for (int j = 0; j < n; ++j) {
          const float w = gi[j];
          const float* __restrict xj = xb + static_cast<size_t>(j) * dim;
#pragma omp simd
          for (int c = 0; c < dim; ++c) d[c] += w * xj[c];
        }
      }
    }
  }
}

// One function per ISA; each switches to a fixed-dim instantiation.
#define PS_DOT_DISPATCH(BODY, ...)        \
  switch (dim) {                          \
    case 8:                               \
      BODY<8>(__VA_ARGS__);               \
      break;                              \
    case 16:                              \
      BODY<16>(__VA_ARGS__);              \
      break;                              \
    case 32:                              \
      BODY<32>(__VA_ARGS__);              \
      break;                              \
    default:                              \
      BODY<0>(__VA_ARGS__);               \
  }

void DotForwardBase(int batch, int n, int dim, const float* x, float* out,
                    int ld_out, float* xt) {
  PS_DOT_DISPATCH(DotForwardBody, batch, n, dim, x, out, ld_out, xt)
}
__attribute__((target("avx2,fma"))) void DotForwardAvx2(
    int batch, int n, int dim, const float* x, float* out, int ld_out,
    float* xt) {
  PS_DOT_DISPATCH(DotForwardBody, batch, n, dim, x, out, ld_out, xt)
}
void DotBackwardBase(int batch, int n, int dim, const float* x,
                     const float* d_out, int ld_out, float* d_x, float* g) {
  PS_DOT_DISPATCH(DotBackwardBody, batch, n, dim, x, d_out, ld_out, d_x, g)
}
__attribute__((target("avx2,fma"))) void DotBackwardAvx2(
    int batch, int n, int dim, const float* x, const float* d_out,
    int ld_out, float* d_x, float* g) {
  PS_DOT_DISPATCH(DotBackwardBody, batch, n, dim, x, d_out, ld_out, d_x, g)
}
#undef PS_DOT_DISPATCH

bool HasAvx2Fma() {
  static const bool has = __builtin_cpu_supports("avx2") &&
                          __builtin_cpu_supports("fma");
  return has;
}

class CpuCompute final : public Compute {
 public:
  explicit CpuCompute(int threads) : threads_(std::max(threads, 1)) {
    openblas_set_num_threads(threads_);
  }

  std::string name() const override {
    return "cpu (" + std::to_string(threads_) + " threads)";
  }
  bool is_gpu() const override { return false; }

  void* Alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    // aligned_alloc requires a size that is a multiple of the alignment.
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded < bytes) return nullptr;  // overflow
    return std::aligned_alloc(kAlign, rounded);
  }
  void Free(void* ptr) override { std::free(ptr); }
  void Upload(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  std::string Download(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return "";
  }
  std::string Synchronize() override { return ""; }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
            const float* a, int lda, const float* b, int ldb, float beta,
            float* c, int ldc) override {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
      // BLAS checks lda >= max(1, k) and friends even when nothing is read;
      // do the C = beta * C part here so callers may pass any ld with k = 0.
      ScaleRows(m, n, beta, c, ldc);
      return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b,
                ldb, beta, c, ldc);
  }

  void Fill(size_t n, float value, float* x) override {
    std::fill(x, x + n, value);
  }

  void AddBias(int rows, int cols, const float* bias, float* x,
               int ldx) override {
    for (int r = 0; r < rows; ++r) {
      float* __restrict row = x + static_cast<size_t>(r) * ldx;
#pragma omp simd
      for (int c = 0; c < cols; ++c) row[c] += bias[c];
    }
  }

  void ColumnSum(int rows, int cols, const float* x, int ldx, float beta,
                 float* out) override {
    if (cols <= 0) return;
    // Row by row into a scratch vector: contiguous reads. (The GPU kernel
    // sums in another order; the two agree to float rounding.)
    scratch_.assign(cols, 0.0f);
    float* __restrict acc = scratch_.data();
    for (int r = 0; r < rows; ++r) {
      const float* __restrict row = x + static_cast<size_t>(r) * ldx;
#pragma omp simd
      for (int c = 0; c < cols; ++c) acc[c] += row[c];
    }
    if (beta == 0.0f) {
      std::copy(acc, acc + cols, out);  // out is not read: may hold NaN
    } else {
      for (int c = 0; c < cols; ++c) out[c] = beta * out[c] + acc[c];
    }
  }

  void Relu(size_t n, float* x) override {
#pragma omp simd
    for (size_t i = 0; i < n; ++i) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }

  void ReluBackward(size_t n, const float* y, float* dy) override {
    const float* __restrict yy = y;
    float* __restrict d = dy;
#pragma omp simd
    for (size_t i = 0; i < n; ++i) d[i] = yy[i] > 0.0f ? d[i] : 0.0f;
  }

  void Copy2D(int rows, int cols, const float* src, int lds, float* dst,
              int ldd) override {
    if (cols <= 0) return;
    for (int r = 0; r < rows; ++r) {
      std::memcpy(dst + static_cast<size_t>(r) * ldd,
                  src + static_cast<size_t>(r) * lds, cols * sizeof(float));
    }
  }

  void Add2D(int rows, int cols, const float* src, int lds, float* dst,
             int ldd) override {
    for (int r = 0; r < rows; ++r) {
      const float* __restrict s = src + static_cast<size_t>(r) * lds;
      float* __restrict d = dst + static_cast<size_t>(r) * ldd;
#pragma omp simd
      for (int c = 0; c < cols; ++c) d[c] += s[c];
    }
  }

  void EmbeddingBag(int batch, int fields, int out_fields, int dim,
                    const uint32_t* offsets, const uint32_t* rows,
                    const float* values, const float* table, int ld_table,
                    float* out) override {
    for (int b = 0; b < batch; ++b) {
      for (int f = 0; f < fields; ++f) {
        const size_t bag = static_cast<size_t>(b) * fields + f;
        float* __restrict o =
            out + (static_cast<size_t>(b) * out_fields + f) * dim;
        std::fill(o, o + dim, 0.0f);
        for (uint32_t i = offsets[bag]; i < offsets[bag + 1]; ++i) {
          const float w = values[i];
          const float* __restrict t =
              table + static_cast<size_t>(rows[i]) * ld_table;
#pragma omp simd
          for (int c = 0; c < dim; ++c) o[c] += w * t[c];
        }
      }
    }
  }

  void EmbeddingBagBackward(int batch, int fields, int out_fields, int dim,
                            const uint32_t* offsets, const uint32_t* rows,
                            const float* values, const float* d_out,
                            float* d_table, int ld_table) override {
    for (int b = 0; b < batch; ++b) {
      for (int f = 0; f < fields; ++f) {
        const size_t bag = static_cast<size_t>(b) * fields + f;
        const float* __restrict g =
            d_out + (static_cast<size_t>(b) * out_fields + f) * dim;
        for (uint32_t i = offsets[bag]; i < offsets[bag + 1]; ++i) {
          const float w = values[i];
          float* __restrict t =
              d_table + static_cast<size_t>(rows[i]) * ld_table;
#pragma omp simd
          for (int c = 0; c < dim; ++c) t[c] += w * g[c];
        }
      }
    }
  }

  void FmForward(int batch, int k, const uint32_t* offsets,
                 const uint32_t* rows, const float* values, const float* table,
                 int ld_table, float* sums, float* logits) override {
    scratch_.assign(std::max(k, 0), 0.0f);
    float* __restrict sq = scratch_.data();
    for (int b = 0; b < batch; ++b) {
      float linear = 0.0f;
      float* __restrict s = k > 0 ? sums + static_cast<size_t>(b) * k : nullptr;
      if (k > 0) {
        std::fill(s, s + k, 0.0f);
        std::fill(sq, sq + k, 0.0f);
      }
      for (uint32_t i = offsets[b]; i < offsets[b + 1]; ++i) {
        const float x = values[i];
        const float* __restrict row =
            table + static_cast<size_t>(rows[i]) * ld_table;
        linear += row[0] * x;
        const float* __restrict v = row + 1;
#pragma omp simd
        for (int c = 0; c < k; ++c) {
          const float vx = v[c] * x;
          s[c] += vx;
          sq[c] += vx * vx;
        }
      }
      float pair = 0.0f;
#pragma omp simd reduction(+ : pair)
      for (int c = 0; c < k; ++c) pair += s[c] * s[c] - sq[c];
      logits[b] += linear + 0.5f * pair;
    }
  }

  void FmBackward(int batch, int k, const uint32_t* offsets,
                  const uint32_t* rows, const float* values, const float* table,
                  int ld_table, const float* sums, const float* d_logits,
                  float* d_table) override {
    for (int b = 0; b < batch; ++b) {
      const float g = d_logits[b];
      const float* __restrict s =
          k > 0 ? sums + static_cast<size_t>(b) * k : nullptr;
      for (uint32_t i = offsets[b]; i < offsets[b + 1]; ++i) {
        const float x = values[i];
        const float gx = g * x;
        const size_t base = static_cast<size_t>(rows[i]) * ld_table;
        const float* __restrict v = table + base + 1;
        float* __restrict d = d_table + base;
        d[0] += gx;
#pragma omp simd
        for (int c = 0; c < k; ++c) d[1 + c] += gx * (s[c] - v[c] * x);
      }
    }
  }

  void DotInteraction(int batch, int n, int dim, const float* x, float* out,
                      int ld_out) override {
    if (n < 2) return;
    // x^T with rows padded to a multiple of 8 (zeros past n).
    dot_scratch_.assign(static_cast<size_t>(dim) * ((n + 7) / 8 * 8), 0.0f);
    float* xt = dot_scratch_.data();
    if (HasAvx2Fma()) {
      DotForwardAvx2(batch, n, dim, x, out, ld_out, xt);
    } else {
      DotForwardBase(batch, n, dim, x, out, ld_out, xt);
    }
  }

  void DotInteractionBackward(int batch, int n, int dim, const float* x,
                              const float* d_out, int ld_out,
                              float* d_x) override {
    // Gathered per output vector (d x_i = sum_j g(i, j) x_j) rather than
    // scattered per pair: every d_x element is written once and needs no
    // zeroing pass.
    dot_scratch_.resize(static_cast<size_t>(n) * n);
    if (HasAvx2Fma()) {
      DotBackwardAvx2(batch, n, dim, x, d_out, ld_out, d_x, dot_scratch_.data());
    } else {
      DotBackwardBase(batch, n, dim, x, d_out, ld_out, d_x, dot_scratch_.data());
    }
  }

  void SigmoidCrossEntropy(int batch, const float* logits, const float* labels,
                           float scale, float* probs, float* loss,
                           float* d_logits) override {
    for (int b = 0; b < batch; ++b) {
      float p, l;
      SigmoidLoss(logits[b], labels[b], &p, &l);
      if (probs != nullptr) probs[b] = p;
      if (loss != nullptr) loss[b] = l;
      if (d_logits != nullptr) d_logits[b] = (p - labels[b]) * scale;
    }
  }

  void SoftmaxCrossEntropy(int batch, int classes, const float* logits,
                           const float* labels, float scale, float* probs,
                           float* loss, float* d_logits) override {
    if (classes <= 0) return;
    scratch_.resize(classes);
    float* __restrict e = scratch_.data();
    for (int b = 0; b < batch; ++b) {
      const float* __restrict z = logits + static_cast<size_t>(b) * classes;
      // Subtracting the row's maximum keeps exp() from overflowing for
      // huge logits; the loss is then log(sum) - (z_y - max).
      float mx = z[0];
      for (int c = 1; c < classes; ++c) mx = std::max(mx, z[c]);
      float sum = 0.0f;
      for (int c = 0; c < classes; ++c) {
        e[c] = std::exp(z[c] - mx);
        sum += e[c];
      }
      const float inv = 1.0f / sum;
      const float y = labels[b];
      // The negated comparison also sends NaN to "out of range".
      const bool valid = y >= 0.0f && y < static_cast<float>(classes);
      const int label = valid ? static_cast<int>(y) : -1;
      const size_t base = static_cast<size_t>(b) * classes;
      if (probs != nullptr) {
        for (int c = 0; c < classes; ++c) probs[base + c] = e[c] * inv;
      }
      if (loss != nullptr) {
        loss[b] = valid ? std::log(sum) - (z[label] - mx) : 0.0f;
      }
      if (d_logits != nullptr) {
        for (int c = 0; c < classes; ++c) {
          d_logits[base + c] =
              valid ? (e[c] * inv - (c == label ? 1.0f : 0.0f)) * scale : 0.0f;
        }
      }
    }
  }

 private:
  static constexpr size_t kAlign = 64;

  // C = beta * C over an m x n block; beta = 0 writes zeros without reading
  // C, as BLAS does.
  static void ScaleRows(int m, int n, float beta, float* c, int ldc) {
    for (int r = 0; r < m; ++r) {
      float* row = c + static_cast<size_t>(r) * ldc;
      if (beta == 0.0f) {
        std::fill(row, row + n, 0.0f);
      } else if (beta != 1.0f) {
        for (int j = 0; j < n; ++j) row[j] *= beta;
      }
    }
  }

  const int threads_;
  // Per-call temporaries, kept to avoid an allocation per kernel call.
  std::vector<float> scratch_;
  std::vector<float> dot_scratch_;  // DotInteraction's per-example scratch
};

}  // namespace

std::unique_ptr<Compute> CreateCpuCompute(int threads) {
  return std::make_unique<CpuCompute>(threads);
}

}  // namespace ps
