// The CUDA backend of Compute, built by nvcc into libps_cuda.so and loaded
// at run time by compute_factory.cc (dlopen), so that binaries run, on the
// CPU, on machines without CUDA. The only exported symbol is
// PsCreateCudaCompute; everything else has hidden visibility.
//
// Summation orders follow the CPU kernels where that is cheap (one thread
// per output element looping over the same axis), so the two backends agree
// to float rounding. The backward scatters use atomicAdd: their results are
// exact up to the order of the additions, which varies between runs.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "worker/compute/compute.h"

namespace ps {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

// Blocks for n threads, capped: the elementwise kernels loop (grid stride).
inline unsigned int Blocks(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(std::min<size_t>(std::max<size_t>(blocks, 1),
                                                    65535u * 8));
}

__device__ inline float WarpSum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;  // complete in lane 0
}

__device__ inline float WarpMaxAll(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  }
  return v;  // in every lane
}

__device__ inline float WarpSumAll(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// --- Elementwise ------------------------------------------------------------

__global__ void FillKernel(size_t n, float value, float* x) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    x[i] = value;
  }
}

// C = beta * C; beta = 0 does not read C (BLAS semantics).
__global__ void ScaleKernel(int m, int n, float beta, float* c, int ldc) {
  const size_t total = size_t{static_cast<unsigned>(m)} * n;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    float* p = c + (i / n) * ldc + i % n;
    *p = beta == 0.0f ? 0.0f : beta * *p;
  }
}

__global__ void AddBiasKernel(int rows, int cols, const float* bias, float* x,
                              int ldx) {
  const size_t total = size_t{static_cast<unsigned>(rows)} * cols;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t c = i % cols;
    x[(i / cols) * ldx + c] += bias[c];
  }
}

// A block of kColumnTile x kColumnLanes threads per kColumnTile columns:
// lane y sums rows y, y + kColumnLanes, ... of its column (consecutive
// threads read consecutive addresses), then thread y = 0 adds the lanes'
// partial sums in order. Deterministic, but not the CPU's summation order:
// one thread per column walking every row was latency-bound (one block for
// a bias of <= 256 columns, up to 10^6 dependent loads per thread).
constexpr int kColumnTile = 32;
constexpr int kColumnLanes = 32;  // kColumnTile * kColumnLanes <= 1024
__global__ void ColumnSumKernel(int rows, int cols, const float* x, int ldx,
                                float beta, float* out) {
  __shared__ float partial[kColumnLanes][kColumnTile + 1];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  float acc = 0.0f;
  if (c < cols) {
    for (int r = threadIdx.y; r < rows; r += kColumnLanes) {
      acc += x[size_t{static_cast<unsigned>(r)} * ldx + c];
    }
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float sum = 0.0f;
  for (int y = 0; y < kColumnLanes; ++y) sum += partial[y][threadIdx.x];
  out[c] = beta == 0.0f ? sum : beta * out[c] + sum;
}

__global__ void ReluKernel(size_t n, float* x) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    x[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }
}

__global__ void ReluBackwardKernel(size_t n, const float* y, float* dy) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    if (!(y[i] > 0.0f)) dy[i] = 0.0f;
  }
}

__global__ void Add2DKernel(int rows, int cols, const float* src, int lds,
                            float* dst, int ldd) {
  const size_t total = size_t{static_cast<unsigned>(rows)} * cols;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t r = i / cols, c = i % cols;
    dst[r * ldd + c] += src[r * lds + c];
  }
}

// --- Sparse features ----------------------------------------------------------

// One thread per (bag, column): the bag's features in order, so reads of a
// table row are coalesced across the threads of the row's columns.
__global__ void EmbeddingBagKernel(int fields, int out_fields, int dim,
                                   size_t total, const uint32_t* offsets,
                                   const uint32_t* rows, const float* values,
                                   const float* table, int ld_table,
                                   float* out) {
  for (size_t t = blockIdx.x * size_t{blockDim.x} + threadIdx.x; t < total;
       t += size_t{gridDim.x} * blockDim.x) {
    const size_t bag = t / dim;
    const int c = static_cast<int>(t % dim);
    const size_t b = bag / fields, f = bag % fields;
    float acc = 0.0f;
    for (uint32_t i = offsets[bag]; i < offsets[bag + 1]; ++i) {
      acc += values[i] * table[size_t{rows[i]} * ld_table + c];
    }
    out[(b * out_fields + f) * dim + c] = acc;
  }
}

__global__ void EmbeddingBagBackwardKernel(int fields, int out_fields, int dim,
                                           size_t total,
                                           const uint32_t* offsets,
                                           const uint32_t* rows,
                                           const float* values,
                                           const float* d_out, float* d_table,
                                           int ld_table) {
  for (size_t t = blockIdx.x * size_t{blockDim.x} + threadIdx.x; t < total;
       t += size_t{gridDim.x} * blockDim.x) {
    const size_t bag = t / dim;
    const int c = static_cast<int>(t % dim);
    const size_t b = bag / fields, f = bag % fields;
    const float g = d_out[(b * out_fields + f) * dim + c];
    if (g == 0.0f) continue;
    for (uint32_t i = offsets[bag]; i < offsets[bag + 1]; ++i) {
      atomicAdd(&d_table[size_t{rows[i]} * ld_table + c], values[i] * g);
    }
  }
}

// One warp per example. Lanes own factor columns (c = lane, lane + 32, ...)
// and walk the features in order, as the CPU does; the linear term is split
// over lanes by feature and reduced.
__global__ void FmForwardKernel(int batch, int k, const uint32_t* offsets,
                                const uint32_t* rows, const float* values,
                                const float* table, int ld_table, float* sums,
                                float* logits) {
  const int b = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (b >= batch) return;  // whole warps exit together
  const uint32_t begin = offsets[b], end = offsets[b + 1];
  float linear = 0.0f;
  for (uint32_t i = begin + lane; i < end; i += kWarp) {
    linear += table[size_t{rows[i]} * ld_table] * values[i];
  }
  float pair = 0.0f;
  for (int c = lane; c < k; c += kWarp) {
    float s = 0.0f, sq = 0.0f;
    for (uint32_t i = begin; i < end; ++i) {
      const float vx = table[size_t{rows[i]} * ld_table + 1 + c] * values[i];
      s += vx;
      sq += vx * vx;
    }
    sums[size_t{static_cast<unsigned>(b)} * k + c] = s;
    pair += s * s - sq;
  }
  linear = WarpSum(linear);
  pair = WarpSum(pair);
  if (lane == 0) logits[b] += linear + 0.5f * pair;
}

__global__ void FmBackwardKernel(int batch, int k, const uint32_t* offsets,
                                 const uint32_t* rows, const float* values,
                                 const float* table, int ld_table,
                                 const float* sums, const float* d_logits,
                                 float* d_table) {
  const int b = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (b >= batch) return;
  const float g = d_logits[b];
  if (g == 0.0f) return;
  const uint32_t begin = offsets[b], end = offsets[b + 1];
  for (uint32_t i = begin + lane; i < end; i += kWarp) {
    atomicAdd(&d_table[size_t{rows[i]} * ld_table], g * values[i]);
  }
  for (int c = lane; c < k; c += kWarp) {
    const float s = sums[size_t{static_cast<unsigned>(b)} * k + c];
    for (uint32_t i = begin; i < end; ++i) {
      const size_t at = size_t{rows[i]} * ld_table + 1 + c;
      const float x = values[i];
      atomicAdd(&d_table[at], g * x * (s - table[at] * x));
    }
  }
}

// One block per example; the example's n vectors are staged in shared
// memory when they fit (they do for every DLRM size in practice), with a
// row stride of dim + 1: the threads of a warp read x_i[c] and x_j[c] for
// the same c and different i, j, which with a stride of dim (a multiple of
// 32 banks for the usual sizes) all fall in one bank.
__global__ void DotInteractionKernel(int n, int dim, const float* x,
                                     float* out, int ld_out, bool staged) {
  extern __shared__ float smem[];
  const int b = blockIdx.x;
  const float* xb = x + size_t{static_cast<unsigned>(b)} * n * dim;
  int stride = dim;
  if (staged) {
    stride = dim + 1;
    for (int t = threadIdx.x; t < n * dim; t += blockDim.x) {
      smem[(t / dim) * stride + t % dim] = xb[t];
    }
    __syncthreads();
    xb = smem;
  }
  const int pairs = n * (n - 1) / 2;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    // Pair p = i (i - 1) / 2 + j with j < i; invert, then fix rounding.
    int i = static_cast<int>((1.0f + sqrtf(1.0f + 8.0f * p)) * 0.5f);
    while (i * (i - 1) / 2 > p) --i;
    while ((i + 1) * i / 2 <= p) ++i;
    const int j = p - i * (i - 1) / 2;
    const float* xi = xb + i * stride;
    const float* xj = xb + j * stride;
    float dot = 0.0f;
    for (int c = 0; c < dim; ++c) dot += xi[c] * xj[c];
    out[size_t{static_cast<unsigned>(b)} * ld_out + p] = dot;
  }
}

// One block per example, one thread per element of d_x: d x_i[c] =
// sum_{j != i} g(i, j) x_j[c], j in order (the CPU's order).
__global__ void DotInteractionBackwardKernel(int n, int dim, const float* x,
                                             const float* d_out, int ld_out,
                                             float* d_x, bool staged) {
  extern __shared__ float smem[];
  const int b = blockIdx.x;
  const size_t base = size_t{static_cast<unsigned>(b)} * n * dim;
  const float* xb = x + base;
  if (staged) {
    for (int t = threadIdx.x; t < n * dim; t += blockDim.x) smem[t] = xb[t];
    __syncthreads();
    xb = smem;
  }
  const float* g = d_out + size_t{static_cast<unsigned>(b)} * ld_out;
  for (int t = threadIdx.x; t < n * dim; t += blockDim.x) {
    const int i = t / dim, c = t % dim;
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) {
      if (j == i) continue;
      const int hi = max(i, j), lo = min(i, j);
      acc += g[hi * (hi - 1) / 2 + lo] * xb[j * dim + c];
    }
    d_x[base + t] = acc;
  }
}

// --- Losses -----------------------------------------------------------------

__global__ void SigmoidCrossEntropyKernel(int batch, const float* logits,
                                          const float* labels, float scale,
                                          float* probs, float* loss,
                                          float* d_logits) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  const float z = logits[b], y = labels[b];
  const float e = expf(-fabsf(z));  // in (0, 1]: never overflows
  const float p = z >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
  if (probs != nullptr) probs[b] = p;
  if (loss != nullptr) loss[b] = fmaxf(z, 0.0f) - y * z + log1pf(e);
  if (d_logits != nullptr) d_logits[b] = (p - y) * scale;
}

// One warp per row.
__global__ void SoftmaxCrossEntropyKernel(int batch, int classes,
                                          const float* logits,
                                          const float* labels, float scale,
                                          float* probs, float* loss,
                                          float* d_logits) {
  const int b = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (b >= batch) return;
  const size_t base = size_t{static_cast<unsigned>(b)} * classes;
  const float* z = logits + base;
  float mx = -INFINITY;
  for (int c = lane; c < classes; c += kWarp) mx = fmaxf(mx, z[c]);
  mx = WarpMaxAll(mx);
  float sum = 0.0f;
  for (int c = lane; c < classes; c += kWarp) sum += expf(z[c] - mx);
  sum = WarpSumAll(sum);
  const float inv = 1.0f / sum;
  const float y = labels[b];
  const bool valid = y >= 0.0f && y < static_cast<float>(classes);
  const int label = valid ? static_cast<int>(y) : -1;
  for (int c = lane; c < classes; c += kWarp) {
    const float p = expf(z[c] - mx) * inv;
    if (probs != nullptr) probs[base + c] = p;
    if (d_logits != nullptr) {
      d_logits[base + c] = valid ? (p - (c == label ? 1.0f : 0.0f)) * scale : 0.0f;
    }
  }
  if (lane == 0 && loss != nullptr) {
    loss[b] = valid ? logf(sum) - (z[label] - mx) : 0.0f;
  }
}

// --- The Compute --------------------------------------------------------------

const char* CublasStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
  }
}

std::string CudaError(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err) + " (" +
         std::to_string(static_cast<int>(err)) + "): " + cudaGetErrorString(err);
}

class CudaCompute final : public Compute {
 public:
  // Use Create(): construction may fail.
  CudaCompute() = default;
  CudaCompute(const CudaCompute&) = delete;
  CudaCompute& operator=(const CudaCompute&) = delete;

  ~CudaCompute() override {
    if (device_ >= 0) cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // "" on success, else why the device is unusable. Any CUDA error counts:
  // without a driver, cudaGetDeviceCount fails (e.g. error 35,
  // cudaErrorInsufficientDriver) rather than reporting zero devices.
  std::string Init(int device) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear it, so it does not leak into later calls
      return CudaError("cudaGetDeviceCount", err);
    }
    if (count == 0) return "no CUDA device";
    if (device < 0 || device >= count) {
      return "CUDA device " + std::to_string(device) + " requested, " +
             std::to_string(count) + " present";
    }
    device_ = device;
    if ((err = cudaSetDevice(device)) != cudaSuccess) {
      return CudaError("cudaSetDevice", err);
    }
    cudaDeviceProp prop;
    if ((err = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) {
      return CudaError("cudaGetDeviceProperties", err);
    }
    name_ = "cuda:" + std::to_string(device) + " " + prop.name;
    max_shared_ = prop.sharedMemPerBlock;
    int pools = 0;
    if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported,
                               device) == cudaSuccess) {
      use_pools_ = pools != 0;
    }
    if (use_pools_) {
      // By default the pool returns freed memory to the driver at every
      // synchronisation, so a model that frees its per-step buffers would
      // pay for fresh allocations every step. Keep it instead.
      cudaMemPool_t pool;
      if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
      }
      cudaGetLastError();  // best effort: a failure only costs speed
    }
    // Creating the stream is the first call that needs a working context.
    if ((err = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)) !=
        cudaSuccess) {
      stream_ = nullptr;
      return CudaError("cudaStreamCreate", err);
    }
    cublasStatus_t status = cublasCreate(&blas_);
    if (status != CUBLAS_STATUS_SUCCESS) {
      blas_ = nullptr;
      return std::string("cublasCreate: ") + CublasStatusName(status);
    }
    if ((status = cublasSetStream(blas_, stream_)) != CUBLAS_STATUS_SUCCESS) {
      return std::string("cublasSetStream: ") + CublasStatusName(status);
    }
    return "";
  }

  std::string name() const override { return name_; }
  bool is_gpu() const override { return true; }

  void* Alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    Bind();
    void* ptr = nullptr;
    // Stream-ordered allocation: freeing and reusing per-step buffers does
    // not synchronise the device, unlike cudaFree.
    const cudaError_t err = use_pools_ ? cudaMallocAsync(&ptr, bytes, stream_)
                                       : cudaMalloc(&ptr, bytes);
    if (err != cudaSuccess) {
      // Out of memory is the caller's to handle (nullptr), not a sticky
      // error; clear it so the next launch check does not see it. Anything
      // else (e.g. an earlier kernel's fault surfacing here) is remembered,
      // so Synchronize() reports it rather than the caller an "out of
      // memory".
      cudaGetLastError();
      if (err != cudaErrorMemoryAllocation) Check("cudaMalloc", err);
      return nullptr;
    }
    return ptr;
  }

  void Free(void* ptr) override {
    if (ptr == nullptr) return;
    Bind();
    Check("cudaFree", use_pools_ ? cudaFreeAsync(ptr, stream_) : cudaFree(ptr));
  }

  void Upload(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    Bind();
    Check("cudaMemcpyAsync (upload)",
          cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  }

  std::string Download(void* dst, const void* src, size_t bytes) override {
    Bind();
    if (bytes > 0) {
      Check("cudaMemcpyAsync (download)",
            cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    }
    return Synchronize();
  }

  std::string Synchronize() override {
    Bind();
    Check("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
    return error_;
  }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
            const float* a, int lda, const float* b, int ldb, float beta,
            float* c, int ldc) override {
    if (m <= 0 || n <= 0) return;
    Bind();
    if (k <= 0) {
      // cuBLAS rejects ld < max(1, k) even when it reads nothing.
      ScaleKernel<<<Blocks(size_t{static_cast<unsigned>(m)} * n), kThreads, 0,
                    stream_>>>(m, n, beta, c, ldc);
      CheckLaunch("Gemm (k = 0)");
      return;
    }
    // cuBLAS is column-major, where a row-major matrix reads as its
    // transpose: compute C^T (n x m) = op(B)^T op(A)^T.
    const cublasStatus_t status = cublasSgemm(
        blas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
        trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda,
        &beta, c, ldc);
    if (status != CUBLAS_STATUS_SUCCESS && error_.empty()) {
      error_ = std::string("cublasSgemm: ") + CublasStatusName(status);
    }
  }

  void Fill(size_t n, float value, float* x) override {
    if (n == 0) return;
    Bind();
    FillKernel<<<Blocks(n), kThreads, 0, stream_>>>(n, value, x);
    CheckLaunch("Fill");
  }

  void AddBias(int rows, int cols, const float* bias, float* x,
               int ldx) override {
    if (rows <= 0 || cols <= 0) return;
    Bind();
    AddBiasKernel<<<Blocks(size_t{static_cast<unsigned>(rows)} * cols),
                    kThreads, 0, stream_>>>(rows, cols, bias, x, ldx);
    CheckLaunch("AddBias");
  }

  void ColumnSum(int rows, int cols, const float* x, int ldx, float beta,
                 float* out) override {
    if (cols <= 0) return;
    Bind();
    ColumnSumKernel<<<(cols + kColumnTile - 1) / kColumnTile,
                      dim3(kColumnTile, kColumnLanes), 0, stream_>>>(
        std::max(rows, 0), cols, x, ldx, beta, out);
    CheckLaunch("ColumnSum");
  }

  void Relu(size_t n, float* x) override {
    if (n == 0) return;
    Bind();
    ReluKernel<<<Blocks(n), kThreads, 0, stream_>>>(n, x);
    CheckLaunch("Relu");
  }

  void ReluBackward(size_t n, const float* y, float* dy) override {
    if (n == 0) return;
    Bind();
    ReluBackwardKernel<<<Blocks(n), kThreads, 0, stream_>>>(n, y, dy);
    CheckLaunch("ReluBackward");
  }

  void Copy2D(int rows, int cols, const float* src, int lds, float* dst,
              int ldd) override {
    if (rows <= 0 || cols <= 0) return;
    Bind();
    const size_t width = size_t{static_cast<unsigned>(cols)} * sizeof(float);
    if (rows == 1) {
      // cudaMemcpy2D rejects pitches below the width, which a single row
      // may have (the strides are then unused).
      Check("cudaMemcpyAsync (Copy2D)",
            cudaMemcpyAsync(dst, src, width, cudaMemcpyDeviceToDevice,
                            stream_));
      return;
    }
    Check("cudaMemcpy2DAsync",
          cudaMemcpy2DAsync(dst, size_t{static_cast<unsigned>(ldd)} * sizeof(float),
                            src, size_t{static_cast<unsigned>(lds)} * sizeof(float),
                            width, rows, cudaMemcpyDeviceToDevice, stream_));
  }

  void Add2D(int rows, int cols, const float* src, int lds, float* dst,
             int ldd) override {
    if (rows <= 0 || cols <= 0) return;
    Bind();
    Add2DKernel<<<Blocks(size_t{static_cast<unsigned>(rows)} * cols), kThreads,
                  0, stream_>>>(rows, cols, src, lds, dst, ldd);
    CheckLaunch("Add2D");
  }

  void EmbeddingBag(int batch, int fields, int out_fields, int dim,
                    const uint32_t* offsets, const uint32_t* rows,
                    const float* values, const float* table, int ld_table,
                    float* out) override {
    if (batch <= 0 || fields <= 0 || dim <= 0) return;
    Bind();
    const size_t total = size_t{static_cast<unsigned>(batch)} * fields * dim;
    EmbeddingBagKernel<<<Blocks(total), kThreads, 0, stream_>>>(
        fields, out_fields, dim, total, offsets, rows, values, table, ld_table,
        out);
    CheckLaunch("EmbeddingBag");
  }

  void EmbeddingBagBackward(int batch, int fields, int out_fields, int dim,
                            const uint32_t* offsets, const uint32_t* rows,
                            const float* values, const float* d_out,
                            float* d_table, int ld_table) override {
    if (batch <= 0 || fields <= 0 || dim <= 0) return;
    Bind();
    const size_t total = size_t{static_cast<unsigned>(batch)} * fields * dim;
    EmbeddingBagBackwardKernel<<<Blocks(total), kThreads, 0, stream_>>>(
        fields, out_fields, dim, total, offsets, rows, values, d_out, d_table,
        ld_table);
    CheckLaunch("EmbeddingBagBackward");
  }

  void FmForward(int batch, int k, const uint32_t* offsets,
                 const uint32_t* rows, const float* values, const float* table,
                 int ld_table, float* sums, float* logits) override {
    if (batch <= 0) return;
    Bind();
    FmForwardKernel<<<WarpBlocks(batch), kThreads, 0, stream_>>>(
        batch, std::max(k, 0), offsets, rows, values, table, ld_table, sums,
        logits);
    CheckLaunch("FmForward");
  }

  void FmBackward(int batch, int k, const uint32_t* offsets,
                  const uint32_t* rows, const float* values, const float* table,
                  int ld_table, const float* sums, const float* d_logits,
                  float* d_table) override {
    if (batch <= 0) return;
    Bind();
    FmBackwardKernel<<<WarpBlocks(batch), kThreads, 0, stream_>>>(
        batch, std::max(k, 0), offsets, rows, values, table, ld_table, sums,
        d_logits, d_table);
    CheckLaunch("FmBackward");
  }

  void DotInteraction(int batch, int n, int dim, const float* x, float* out,
                      int ld_out) override {
    if (batch <= 0 || n < 2) return;
    Bind();
    // Staged rows are padded to dim + 1 floats (see the kernel).
    const size_t shared =
        size_t{static_cast<unsigned>(n)} * (std::max(dim, 0) + 1) * sizeof(float);
    const bool staged = dim > 0 && shared <= max_shared_;
    DotInteractionKernel<<<batch, 128, staged ? shared : 0, stream_>>>(
        n, dim, x, out, ld_out, staged);
    CheckLaunch("DotInteraction");
  }

  void DotInteractionBackward(int batch, int n, int dim, const float* x,
                              const float* d_out, int ld_out,
                              float* d_x) override {
    if (batch <= 0 || n <= 0 || dim <= 0) return;
    Bind();
    const size_t shared = size_t{static_cast<unsigned>(n)} * dim * sizeof(float);
    const bool staged = shared <= max_shared_;
    DotInteractionBackwardKernel<<<batch, 128, staged ? shared : 0, stream_>>>(
        n, dim, x, d_out, ld_out, d_x, staged);
    CheckLaunch("DotInteractionBackward");
  }

  void SigmoidCrossEntropy(int batch, const float* logits, const float* labels,
                           float scale, float* probs, float* loss,
                           float* d_logits) override {
    if (batch <= 0) return;
    Bind();
    SigmoidCrossEntropyKernel<<<(batch + kThreads - 1) / kThreads, kThreads, 0,
                                stream_>>>(batch, logits, labels, scale, probs,
                                           loss, d_logits);
    CheckLaunch("SigmoidCrossEntropy");
  }

  void SoftmaxCrossEntropy(int batch, int classes, const float* logits,
                           const float* labels, float scale, float* probs,
                           float* loss, float* d_logits) override {
    if (batch <= 0 || classes <= 0) return;
    Bind();
    SoftmaxCrossEntropyKernel<<<WarpBlocks(batch), kThreads, 0, stream_>>>(
        batch, classes, logits, labels, scale, probs, loss, d_logits);
    CheckLaunch("SoftmaxCrossEntropy");
  }

 private:
  // Blocks of kThreads for one warp per item.
  static unsigned int WarpBlocks(int items) {
    const int per_block = kThreads / kWarp;
    return static_cast<unsigned int>((items + per_block - 1) / per_block);
  }

  // The calling thread may not be the one that created this Compute, and
  // the current device is per thread.
  void Bind() {
    if (device_ != 0) cudaSetDevice(device_);
  }

  void Check(const char* what, cudaError_t err) {
    if (err != cudaSuccess && error_.empty()) error_ = CudaError(what, err);
  }
  void CheckLaunch(const char* kernel) { Check(kernel, cudaGetLastError()); }

  int device_ = -1;
  std::string name_;
  size_t max_shared_ = 48 * 1024;
  bool use_pools_ = false;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  // The first error since creation; kernels do not report, Synchronize()
  // and Download() return it.
  std::string error_;
};

void WriteError(const std::string& message, char* error, size_t error_len) {
  if (error == nullptr || error_len == 0) return;
  const size_t n = std::min(message.size(), error_len - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

}  // namespace
}  // namespace ps

// The library's only entry point (see compute_factory.cc). Returns a new
// Compute on `device`, owned by the caller (delete it through ps::Compute),
// or nullptr with the reason in `error` (NUL-terminated, truncated to
// error_len) when no GPU is usable. Never throws.
extern "C" __attribute__((visibility("default"))) ps::Compute*
PsCreateCudaCompute(int device, char* error, size_t error_len) {
  try {
    auto* compute = new ps::CudaCompute();
    const std::string why = compute->Init(device);
    if (!why.empty()) {
      delete compute;
      ps::WriteError(why, error, error_len);
      return nullptr;
    }
    ps::WriteError("", error, error_len);
    return compute;
  } catch (const std::exception& e) {
    ps::WriteError(std::string("PsCreateCudaCompute: ") + e.what(), error,
                   error_len);
    return nullptr;
  }
}
