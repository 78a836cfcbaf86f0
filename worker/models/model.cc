#include "worker/models/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ps {
namespace {

// Device buffers by role; per-layer activations and their gradients follow
// kNumFixed, two per layer (bottom layers first, then top).
enum BufferId : size_t {
  kDense = 0,
  kRows,
  kOffsets,
  kRowIndex,
  kValues,
  kFeatures,
  kLabels,
  kLogits,
  kProbs,
  kLoss,
  kDLogits,
  kFmSums,
  kDSparse,
  kDDense,
  kVectors,  // DLRM: batch x num_vectors x dim
  kDVectors,
  kTopIn,  // DLRM: batch x top_input
  kDTopIn,
  kDBottomOut,  // DLRM: batch x dim
  kNumFixed,
};

}  // namespace

absl::Status SparseIndexer::Index(const ModelLayout& layout,
                                  const data::ExampleBatch& batch,
                                  SparseInput* out) {
  const size_t n = batch.size;
  const size_t features = n == 0 ? 0 : batch.offsets[n];
  out->keys.clear();
  position_.clear();
  out->rows.resize(features);
  out->values.resize(features);
  if (layout.kind != ModelConfig::DLRM) {
    out->offsets.assign(batch.offsets.begin(), batch.offsets.begin() + n + 1);
    for (size_t i = 0; i < features; ++i) {
      auto [it, inserted] = position_.try_emplace(
          batch.keys[i], static_cast<uint32_t>(out->keys.size()));
      if (inserted) out->keys.push_back(batch.keys[i]);
      out->rows[i] = it->second;
      out->values[i] = batch.values[i];
    }
    return absl::OkStatus();
  }
  // DLRM: a counting sort of each example's features by field makes the
  // (example, field) bags contiguous.
  const uint32_t fields = layout.data.num_fields;
  out->offsets.assign(n * fields + 1, 0);
  for (size_t i = 0; i < features; ++i) {
    if (batch.fields[i] >= fields) {
      return absl::InvalidArgumentError(
          absl::StrCat("feature field ", batch.fields[i],
                       " is not below the model's ", fields, " fields"));
    }
  }
  for (size_t b = 0; b < n; ++b) {
    for (uint32_t i = batch.offsets[b]; i < batch.offsets[b + 1]; ++i) {
      ++out->offsets[b * fields + batch.fields[i] + 1];
    }
  }
  for (size_t j = 0; j < n * fields; ++j)
    out->offsets[j + 1] += out->offsets[j];
  counts_.assign(out->offsets.begin(), out->offsets.end() - 1);
  for (size_t b = 0; b < n; ++b) {
    for (uint32_t i = batch.offsets[b]; i < batch.offsets[b + 1]; ++i) {
      const uint32_t dst = counts_[b * fields + batch.fields[i]]++;
      auto [it, inserted] = position_.try_emplace(
          batch.keys[i], static_cast<uint32_t>(out->keys.size()));
      if (inserted) out->keys.push_back(batch.keys[i]);
      out->rows[dst] = it->second;
      out->values[dst] = batch.values[i];
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelLayout& layout,
                                                     Compute* compute) {
  switch (layout.kind) {
    case ModelConfig::LR:
    case ModelConfig::FM:
    case ModelConfig::DLRM:
    case ModelConfig::MLP:
      break;
    default:
      return absl::InvalidArgumentError("unknown model kind");
  }
  if (compute == nullptr) return absl::InvalidArgumentError("no compute");
  return std::unique_ptr<Model>(new Model(layout, compute));
}

Model::Model(const ModelLayout& layout, Compute* compute)
    : layout_(layout),
      compute_(compute),
      buffers_(kNumFixed + 2 * (layout.bottom.size() + layout.top.size())) {}

Model::~Model() {
  for (Buffer& b : buffers_) compute_->Free(b.ptr);
}

template <typename T>
T* Model::Ensure(Buffer* b, size_t count) {
  const size_t bytes = std::max<size_t>(count, 1) * sizeof(T);
  if (b->bytes < bytes) {
    compute_->Free(b->ptr);
    // Grow geometrically so batches of varying size settle quickly.
    const size_t want = std::max(bytes, b->bytes + b->bytes / 2);
    b->ptr = compute_->Alloc(want);
    b->bytes = b->ptr == nullptr ? 0 : want;
  }
  return static_cast<T*>(b->ptr);
}

absl::Status Model::DeviceError() {
  const std::string err = compute_->Synchronize();
  if (err.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(compute_->name(), ": ", err));
}

void Model::LayerForward(const DenseLayer& l, int batch, const float* in,
                         const float* dense, float* out) {
  compute_->Gemm(false, true, batch, l.out, l.in, 1.0f, in, l.in,
                 dense + l.w_offset, l.in, 0.0f, out, l.out);
  compute_->AddBias(batch, l.out, dense + l.b_offset, out, l.out);
  if (l.relu) compute_->Relu(size_t(batch) * l.out, out);
}

void Model::LayerBackward(const DenseLayer& l, int batch, const float* in,
                          const float* dense, float* dy, float* d_dense,
                          float* d_in) {
  // dW = dy^T x, db = column sums of dy, dx = dy W.
  compute_->Gemm(true, false, l.out, l.in, batch, 1.0f, dy, l.out, in, l.in,
                 0.0f, d_dense + l.w_offset, l.in);
  compute_->ColumnSum(batch, l.out, dy, l.out, 0.0f, d_dense + l.b_offset);
  if (d_in != nullptr) {
    compute_->Gemm(false, false, batch, l.in, l.out, 1.0f, dy, l.out,
                   dense + l.w_offset, l.in, 0.0f, d_in, l.in);
  }
}

const float* Model::MlpForward(const std::vector<DenseLayer>& layers,
                               size_t first, int batch, const float* in,
                               const float* dense, float* last_out) {
  for (size_t i = 0; i < layers.size(); ++i) {
    float* y = i + 1 == layers.size() && last_out != nullptr
                   ? last_out
                   : Ensure<float>(&buffers_[kNumFixed + 2 * (first + i)],
                                   size_t(batch) * layers[i].out);
    if (y == nullptr) return nullptr;
    LayerForward(layers[i], batch, in, dense, y);
    in = y;
  }
  return in;
}

bool Model::MlpBackward(const std::vector<DenseLayer>& layers, size_t first,
                        int batch, const float* in, const float* dense,
                        float* dy, float* d_dense, float* d_in) {
  for (size_t i = layers.size(); i-- > 0;) {
    // Layer i's input: the stack's input, or layer i - 1's ReLU output.
    const float* x = i == 0
                         ? in
                         : static_cast<const float*>(
                               buffers_[kNumFixed + 2 * (first + i - 1)].ptr);
    float* dx =
        i == 0 ? d_in
               : Ensure<float>(&buffers_[kNumFixed + 2 * (first + i - 1) + 1],
                               size_t(batch) * layers[i].in);
    if (i > 0 && dx == nullptr) return false;
    LayerBackward(layers[i], batch, x, dense, dy, d_dense, dx);
    if (i > 0) compute_->ReluBackward(size_t(batch) * layers[i].in, x, dx);
    dy = dx;
  }
  return true;
}

absl::Status Model::Prepare(const data::ExampleBatch& batch,
                            const SparseInput& sparse) {
  prepared_ = nullptr;
  const ModelLayout& L = layout_;
  const int n = static_cast<int>(batch.size);
  const uint32_t nd = L.data.num_dense;
  const bool binary = L.kind != ModelConfig::MLP;
  const int classes = binary ? 1 : static_cast<int>(L.top.back().out);
  const bool uses_sparse = L.kind != ModelConfig::MLP;
  if (batch.labels.size() < batch.size ||
      batch.dense.size() < batch.size * nd ||
      (uses_sparse &&
       (sparse.offsets.empty() || sparse.rows.size() < sparse.offsets.back() ||
        sparse.values.size() < sparse.offsets.back()))) {
    return absl::InvalidArgumentError("batch arrays are shorter than its size");
  }
  for (int b = 0; b < n; ++b) {
    const float y = batch.labels[b];
    const bool ok = binary ? (y == 0.0f || y == 1.0f)
                           : (y >= 0 && y < classes && y == std::floor(y));
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", y, " of example ", b, " is not a class of a ",
                       binary ? 2 : classes, "-class model"));
    }
  }
  if (n == 0) {
    prepared_ = &batch;
    return absl::OkStatus();
  }
  Compute& c = *compute_;
  float* d_features = Ensure<float>(&buffers_[kFeatures], size_t(n) * nd);
  float* d_labels = Ensure<float>(&buffers_[kLabels], n);
  uint32_t* d_offsets = nullptr;
  uint32_t* d_index = nullptr;
  float* d_values = nullptr;
  const size_t features = uses_sparse ? sparse.offsets.back() : 0;
  if (uses_sparse) {
    d_offsets = Ensure<uint32_t>(&buffers_[kOffsets], sparse.offsets.size());
    d_index = Ensure<uint32_t>(&buffers_[kRowIndex], features);
    d_values = Ensure<float>(&buffers_[kValues], features);
  }
  if (!d_features || !d_labels ||
      (uses_sparse && (!d_offsets || !d_index || !d_values))) {
    return absl::ResourceExhaustedError(
        absl::StrCat(c.name(), ": out of device memory"));
  }
  if (nd > 0) {
    c.Upload(d_features, batch.dense.data(), size_t(n) * nd * sizeof(float));
  }
  c.Upload(d_labels, batch.labels.data(), size_t(n) * sizeof(float));
  if (uses_sparse) {
    c.Upload(d_offsets, sparse.offsets.data(),
             sparse.offsets.size() * sizeof(uint32_t));
    if (features > 0) {
      c.Upload(d_index, sparse.rows.data(), features * sizeof(uint32_t));
      c.Upload(d_values, sparse.values.data(), features * sizeof(float));
    }
  }
  prepared_ = &batch;
  return absl::OkStatus();
}

absl::Status Model::Run(const data::ExampleBatch& batch,
                        const SparseInput& sparse, const float* sparse_rows,
                        const float* dense, bool backward, ModelOutput* out) {
  if (prepared_ != &batch) PS_RETURN_IF_ERROR(Prepare(batch, sparse));
  // The next Run needs its own Prepare.
  prepared_ = nullptr;
  const ModelLayout& L = layout_;
  const int n = static_cast<int>(batch.size);
  const int classes =
      L.kind != ModelConfig::MLP ? 1 : static_cast<int>(L.top.back().out);
  const size_t num_rows = sparse.keys.size();
  out->loss_sum = 0;
  // Every element is overwritten by the downloads (or by zeros for an
  // empty batch), so no fill pass.
  out->probs.resize(size_t(n) * classes);
  if (backward) {
    out->sparse_grad.resize(num_rows * L.sparse_dim);
    out->dense_grad.resize(L.dense_size);
  }
  if (n == 0) {
    std::fill(out->sparse_grad.begin(), out->sparse_grad.end(), 0.0f);
    std::fill(out->dense_grad.begin(), out->dense_grad.end(), 0.0f);
    return absl::OkStatus();
  }
  Pass p;
  PS_RETURN_IF_ERROR(StartPass(n, num_rows, backward, sparse_rows, dense, &p));
  bool ok = false;
  switch (L.kind) {
    case ModelConfig::LR:
    case ModelConfig::FM:
      ok = RunLinear(p);
      break;
    case ModelConfig::MLP:
      ok = RunMlp(p);
      break;
    case ModelConfig::DLRM:
      ok = RunDlrm(p);
      break;
    default:
      return absl::InvalidArgumentError("unknown model kind");
  }
  if (!ok) {
    return absl::ResourceExhaustedError(
        absl::StrCat(compute_->name(), ": out of device memory"));
  }
  return FinishPass(p, out);
}

absl::Status Model::StartPass(int n, size_t num_rows, bool backward,
                              const float* sparse_rows, const float* dense,
                              Pass* p) {
  const ModelLayout& L = layout_;
  const bool uses_sparse = L.kind != ModelConfig::MLP;
  p->n = n;
  p->classes =
      L.kind != ModelConfig::MLP ? 1 : static_cast<int>(L.top.back().out);
  p->num_rows = num_rows;
  p->backward = backward;
  p->scale = 1.0f / static_cast<float>(n);
  // Inputs uploaded by Prepare().
  p->features = static_cast<const float*>(buffers_[kFeatures].ptr);
  p->labels = static_cast<const float*>(buffers_[kLabels].ptr);
  p->offsets = static_cast<const uint32_t*>(buffers_[kOffsets].ptr);
  p->index = static_cast<const uint32_t*>(buffers_[kRowIndex].ptr);
  p->values = static_cast<const float*>(buffers_[kValues].ptr);
  float* d_dense = Ensure<float>(&buffers_[kDense], L.dense_size);
  p->dense = d_dense;
  p->logits = Ensure<float>(&buffers_[kLogits], size_t(n) * p->classes);
  p->probs = Ensure<float>(&buffers_[kProbs], size_t(n) * p->classes);
  p->loss = Ensure<float>(&buffers_[kLoss], n);
  p->dlogits = Ensure<float>(&buffers_[kDLogits], size_t(n) * p->classes);
  p->ddense = Ensure<float>(&buffers_[kDDense], L.dense_size);
  float* d_rows = nullptr;
  if (uses_sparse) {
    d_rows = Ensure<float>(&buffers_[kRows], num_rows * L.sparse_dim);
    p->rows = d_rows;
    p->dsparse = Ensure<float>(&buffers_[kDSparse], num_rows * L.sparse_dim);
  }
  if (!d_dense || !p->logits || !p->probs || !p->loss || !p->dlogits ||
      !p->ddense || (uses_sparse && (!d_rows || !p->dsparse))) {
    return absl::ResourceExhaustedError(
        absl::StrCat(compute_->name(), ": out of device memory"));
  }
  compute_->Upload(d_dense, dense, L.dense_size * sizeof(float));
  if (uses_sparse && num_rows > 0) {
    compute_->Upload(d_rows, sparse_rows,
                     num_rows * L.sparse_dim * sizeof(float));
  }
  return absl::OkStatus();
}

bool Model::RunLinear(const Pass& p) {
  const ModelLayout& L = layout_;
  Compute& c = *compute_;
  const int n = p.n;
  const uint32_t nd = L.data.num_dense;
  const int k = static_cast<int>(L.embedding_dim);
  float* sums = Ensure<float>(&buffers_[kFmSums], size_t(n) * std::max(k, 1));
  if (sums == nullptr) return false;
  c.Fill(n, 0.0f, p.logits);
  c.FmForward(n, k, p.offsets, p.index, p.values, p.rows, L.sparse_dim, sums,
              p.logits);
  if (nd > 0) {
    c.Gemm(false, true, n, 1, nd, 1.0f, p.features, nd, p.dense, nd, 1.0f,
           p.logits, 1);
  }
  c.AddBias(n, 1, p.dense + nd, p.logits, 1);
  c.SigmoidCrossEntropy(n, p.logits, p.labels, p.scale, p.probs, p.loss,
                        p.dlogits);
  if (!p.backward) return true;
  if (p.num_rows > 0) {
    c.Fill(p.num_rows * L.sparse_dim, 0.0f, p.dsparse);
    c.FmBackward(n, k, p.offsets, p.index, p.values, p.rows, L.sparse_dim, sums,
                 p.dlogits, p.dsparse);
  }
  if (nd > 0) {
    c.Gemm(true, false, 1, nd, n, 1.0f, p.dlogits, 1, p.features, nd, 0.0f,
           p.ddense, nd);
  }
  c.ColumnSum(n, 1, p.dlogits, 1, 0.0f, p.ddense + nd);
  return true;
}

bool Model::RunMlp(const Pass& p) {
  const ModelLayout& L = layout_;
  if (!MlpForward(L.top, 0, p.n, p.features, p.dense, p.logits)) return false;
  compute_->SoftmaxCrossEntropy(p.n, p.classes, p.logits, p.labels, p.scale,
                                p.probs, p.loss, p.dlogits);
  if (!p.backward) return true;
  return MlpBackward(L.top, 0, p.n, p.features, p.dense, p.dlogits, p.ddense,
                     nullptr);
}

bool Model::RunDlrm(const Pass& p) {
  const ModelLayout& L = layout_;
  Compute& c = *compute_;
  const int n = p.n;
  const int d = static_cast<int>(L.embedding_dim);
  const int fields = static_cast<int>(L.data.num_fields);
  const int nv = static_cast<int>(L.num_vectors);
  const int ti = static_cast<int>(L.top_input);
  const bool has_bottom = !L.bottom.empty();
  const size_t nb = L.bottom.size();
  float* vectors = Ensure<float>(&buffers_[kVectors], size_t(n) * nv * d);
  float* top_in = Ensure<float>(&buffers_[kTopIn], size_t(n) * ti);
  if (vectors == nullptr || top_in == nullptr) return false;
  c.EmbeddingBag(n, fields, nv, d, p.offsets, p.index, p.values, p.rows, d,
                 vectors);
  const float* bottom_out = nullptr;
  if (has_bottom) {
    bottom_out = MlpForward(L.bottom, 0, n, p.features, p.dense, nullptr);
    if (bottom_out == nullptr) return false;
    c.Copy2D(n, d, bottom_out, d, vectors + size_t(fields) * d, nv * d);
    c.Copy2D(n, d, bottom_out, d, top_in, ti);
  }
  const int pair_offset = has_bottom ? d : 0;
  c.DotInteraction(n, nv, d, vectors, top_in + pair_offset, ti);
  if (!MlpForward(L.top, nb, n, top_in, p.dense, p.logits)) return false;
  c.SigmoidCrossEntropy(n, p.logits, p.labels, p.scale, p.probs, p.loss,
                        p.dlogits);
  if (!p.backward) return true;
  float* d_top_in = Ensure<float>(&buffers_[kDTopIn], size_t(n) * ti);
  float* d_vectors = Ensure<float>(&buffers_[kDVectors], size_t(n) * nv * d);
  if (d_top_in == nullptr || d_vectors == nullptr) return false;
  // The top MLP's input (interactions) has no activation.
  if (!MlpBackward(L.top, nb, n, top_in, p.dense, p.dlogits, p.ddense,
                   d_top_in)) {
    return false;
  }
  c.DotInteractionBackward(n, nv, d, vectors, d_top_in + pair_offset, ti,
                           d_vectors);
  if (p.num_rows > 0) {
    c.Fill(p.num_rows * L.sparse_dim, 0.0f, p.dsparse);
    c.EmbeddingBagBackward(n, fields, nv, d, p.offsets, p.index, p.values,
                           d_vectors, p.dsparse, d);
  }
  if (!has_bottom) return true;
  // The bottom output feeds both the interactions and the top input.
  float* d_bottom = Ensure<float>(&buffers_[kDBottomOut], size_t(n) * d);
  if (d_bottom == nullptr) return false;
  c.Copy2D(n, d, d_vectors + size_t(fields) * d, nv * d, d_bottom, d);
  c.Add2D(n, d, d_top_in, ti, d_bottom, d);
  c.ReluBackward(size_t(n) * d, bottom_out, d_bottom);
  return MlpBackward(L.bottom, 0, n, p.features, p.dense, d_bottom, p.ddense,
                     nullptr);
}

absl::Status Model::FinishPass(const Pass& p, ModelOutput* out) {
  const ModelLayout& L = layout_;
  Compute& c = *compute_;
  const bool uses_sparse = L.kind != ModelConfig::MLP;
  std::vector<float> loss(p.n);
  std::string err =
      c.Download(loss.data(), p.loss, size_t(p.n) * sizeof(float));
  if (err.empty()) {
    err = c.Download(out->probs.data(), p.probs,
                     size_t(p.n) * p.classes * sizeof(float));
  }
  if (err.empty() && p.backward) {
    err = c.Download(out->dense_grad.data(), p.ddense,
                     L.dense_size * sizeof(float));
    if (err.empty() && uses_sparse && p.num_rows > 0) {
      err = c.Download(out->sparse_grad.data(), p.dsparse,
                       p.num_rows * L.sparse_dim * sizeof(float));
    }
  }
  if (!err.empty()) {
    return absl::InternalError(absl::StrCat(c.name(), ": ", err));
  }
  double sum = 0;
  for (float v : loss) sum += v;
  out->loss_sum = sum;
  return absl::OkStatus();
}

std::vector<float> InitialDenseParameters(const ModelLayout& layout, float gain,
                                          uint64_t seed) {
  std::vector<float> params(layout.dense_size, 0.0f);
  std::mt19937_64 rng(seed);
  auto fill = [&](const std::vector<DenseLayer>& layers) {
    for (const DenseLayer& l : layers) {
      const double stddev = (l.relu ? gain * std::sqrt(2.0 / l.in)
                                    : gain * std::sqrt(1.0 / l.in));
      std::normal_distribution<double> normal(0.0, stddev);
      for (uint64_t i = 0; i < uint64_t{l.in} * l.out; ++i) {
        params[l.w_offset + i] = static_cast<float>(normal(rng));
      }
    }
  };
  fill(layout.bottom);
  fill(layout.top);
  return params;
}

}  // namespace ps
