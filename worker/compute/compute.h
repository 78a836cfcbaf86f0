// The numeric kernels a model needs, behind one interface with a CPU
// implementation (OpenBLAS for matrix products) and a CUDA one (kernels and
// cuBLAS, in a shared object loaded at run time).
//
// Pointers passed to the kernels are device pointers of this Compute (host
// memory for the CPU one): memory from Alloc(), moved with Upload() and
// Download(). Matrices are row-major; `ld*` is the distance in elements
// between consecutive rows. Kernels are asynchronous on the GPU: they are
// queued in order on one stream, and Download() and Synchronize() wait for
// everything queued before them.
//
// Errors: kernels do not report; a failure (a CUDA launch error, a cuBLAS
// status) is remembered and returned by the next Synchronize() (or
// Download()), which the caller turns into a Status. After an error the
// Compute is unusable.
//
// This header uses the standard library only, because the CUDA
// implementation is compiled by nvcc into a separate shared object.
//
// Thread safety: none; one Compute per training thread.
#ifndef PS_WORKER_COMPUTE_COMPUTE_H_
#define PS_WORKER_COMPUTE_COMPUTE_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace ps {

class Compute {
 public:
  virtual ~Compute() = default;

  // "cpu (N threads)" or "cuda:0 NVIDIA H100 ...".
  virtual std::string name() const = 0;
  virtual bool is_gpu() const = 0;

  // --- Memory -------------------------------------------------------------
  // nullptr when out of memory. Alloc(0) returns nullptr too.
  virtual void* Alloc(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  // Host <-> device copies. Upload may return before the copy is done: the
  // caller keeps `src` valid and unchanged until the next Synchronize() or
  // Download() (Model keeps its batch and parameters until Run() ends with
  // a Download()).
  virtual void Upload(void* dst, const void* src, size_t bytes) = 0;
  // Waits for queued work, then copies. "" on success, else the error.
  virtual std::string Download(void* dst, const void* src, size_t bytes) = 0;
  // Waits for queued work. "" on success, else the first error since the
  // Compute was created.
  virtual std::string Synchronize() = 0;

  // --- Dense linear algebra ---------------------------------------------
  // C[m x n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T.
  // op(A) is m x k, op(B) is k x n. A stored m x k (k x m when trans_a).
  // beta = 0: C is not read (it may hold NaN), as in BLAS. k = 0 scales C.
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                    float alpha, const float* a, int lda, const float* b,
                    int ldb, float beta, float* c, int ldc) = 0;

  // --- Elementwise ---------------------------------------------------------
  // x[i] = value for i < n.
  virtual void Fill(size_t n, float value, float* x) = 0;
  // x[r * ldx + c] += bias[c], r < rows, c < cols.
  virtual void AddBias(int rows, int cols, const float* bias, float* x,
                       int ldx) = 0;
  // out[c] = beta * out[c] + sum_r x[r * ldx + c]. beta = 0: out is not
  // read.
  virtual void ColumnSum(int rows, int cols, const float* x, int ldx,
                         float beta, float* out) = 0;
  // x[i] = max(x[i], 0) for i < n.
  virtual void Relu(size_t n, float* x) = 0;
  // dy[i] = y[i] > 0 ? dy[i] : 0 (y: the ReLU's output).
  virtual void ReluBackward(size_t n, const float* y, float* dy) = 0;
  // dst[r * ldd + c] = src[r * lds + c].
  virtual void Copy2D(int rows, int cols, const float* src, int lds,
                      float* dst, int ldd) = 0;
  // dst[r * ldd + c] += src[r * lds + c].
  virtual void Add2D(int rows, int cols, const float* src, int lds,
                     float* dst, int ldd) = 0;

  // --- Sparse features -----------------------------------------------------
  // Embedding bags. Bag j (j < num_bags) holds features
  // [offsets[j], offsets[j + 1]); feature i selects row rows[i] of `table`
  // (rows of `dim` floats, row stride ld_table) with weight values[i].
  // Bag j = b * fields + f (example b, field f) is written to
  // out[(b * out_fields + f) * dim .. + dim) as the weighted sum of its rows
  // (zeros for an empty bag). num_bags = batch * fields; out_fields >= fields
  // leaves room for other vectors between examples (slots f >= fields are
  // neither read nor written).
  virtual void EmbeddingBag(int batch, int fields, int out_fields, int dim,
                            const uint32_t* offsets, const uint32_t* rows,
                            const float* values, const float* table,
                            int ld_table, float* out) = 0;
  // The gradient of EmbeddingBag: d_table[rows[i]] += values[i] * d_out of
  // feature i's bag. d_table is accumulated into, not overwritten.
  virtual void EmbeddingBagBackward(int batch, int fields, int out_fields,
                                    int dim, const uint32_t* offsets,
                                    const uint32_t* rows, const float* values,
                                    const float* d_out, float* d_table,
                                    int ld_table) = 0;

  // Factorization machine over per-example feature lists (offsets has
  // batch + 1 entries). Row r of `table` (stride ld_table) holds the linear
  // weight w_r at column 0 and the factor v_r at columns 1..k. For example
  // b with features (r_i, x_i):
  //   logits[b] += sum_i w_{r_i} x_i
  //              + 0.5 * sum_c [(sum_i v_{r_i,c} x_i)^2 - sum_i v_{r_i,c}^2 x_i^2]
  // and sums[b * k + c] = sum_i v_{r_i,c} x_i (kept for the backward pass).
  // k = 0 is logistic regression's linear part (sums may then be nullptr).
  virtual void FmForward(int batch, int k, const uint32_t* offsets,
                         const uint32_t* rows, const float* values,
                         const float* table, int ld_table, float* sums,
                         float* logits) = 0;
  // Accumulates into d_table (laid out like table, row stride ld_table) the
  // gradient given d_logits[b] and FmForward's sums:
  //   d w_r     += d_logits[b] * x_i
  //   d v_{r,c} += d_logits[b] * x_i * (sums[b,c] - v_{r,c} x_i).
  virtual void FmBackward(int batch, int k, const uint32_t* offsets,
                          const uint32_t* rows, const float* values,
                          const float* table, int ld_table, const float* sums,
                          const float* d_logits, float* d_table) = 0;

  // DLRM dot interaction. x holds batch x n vectors of dim floats
  // (x[(b * n + i) * dim + c]). For each example, the dot products of the
  // pairs (i, j), i > j, in the order (1,0), (2,0), (2,1), (3,0), ... are
  // written to out[b * ld_out + p], p < n (n - 1) / 2.
  virtual void DotInteraction(int batch, int n, int dim, const float* x,
                              float* out, int ld_out) = 0;
  // d_x (overwritten) = the gradient of DotInteraction's outputs given
  // d_out: d x_i = sum_{j != i} d_out(i, j) x_j.
  virtual void DotInteractionBackward(int batch, int n, int dim,
                                      const float* x, const float* d_out,
                                      int ld_out, float* d_x) = 0;

  // --- Losses ---------------------------------------------------------------
  // In both losses any of probs, loss and d_logits may be nullptr: that
  // output is not written.
  // Binary cross-entropy from logits: probs[b] = sigmoid(logits[b]),
  // loss[b] = log(1 + e^z) - y z (stable for any z),
  // d_logits[b] = (probs[b] - labels[b]) * scale.
  virtual void SigmoidCrossEntropy(int batch, const float* logits,
                                   const float* labels, float scale,
                                   float* probs, float* loss,
                                   float* d_logits) = 0;
  // Softmax cross-entropy over `classes`; labels are class indices stored
  // as floats. probs = softmax(logits) row by row, loss[b] = -log
  // probs[b, y_b], d_logits = (probs - onehot(y)) * scale. A label outside
  // [0, classes) gives loss 0 and zero gradient for that row.
  virtual void SoftmaxCrossEntropy(int batch, int classes,
                                   const float* logits, const float* labels,
                                   float scale, float* probs, float* loss,
                                   float* d_logits) = 0;
};

}  // namespace ps

#endif  // PS_WORKER_COMPUTE_COMPUTE_H_
