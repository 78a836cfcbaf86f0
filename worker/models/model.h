// The models a worker trains (logistic regression, factorization machine,
// DLRM-lite, an MLP classifier), written once against ps::Compute so the
// same code runs on the CPU and on a GPU.
//
// A model holds no parameters: every step the trainer pulls the rows of the
// batch's distinct keys and the dense table from the servers, the model
// computes the mean loss over the batch and its gradient with respect to
// those rows and the dense table, and the trainer pushes the gradients.
// Layouts come from common/model_layout.h.
//
// Thread safety: none; one Model (and its Compute) per training thread.
// Ownership: the Compute is not owned and must outlive the model.
#ifndef PS_WORKER_MODELS_MODEL_H_
#define PS_WORKER_MODELS_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/model_layout.h"
#include "common/status.h"
#include "worker/compute/compute.h"
#include "worker/data/dataset.h"

namespace ps {

// A batch's sparse features mapped to the rows of its distinct keys.
// LR and FM: one feature list per example (offsets has batch + 1 entries).
// DLRM: one bag per (example, field), bag b * num_fields + f (offsets has
// batch * num_fields + 1 entries), so features are regrouped by field.
struct SparseInput {
  std::vector<uint64_t> keys;  // distinct keys, in order of first use
  std::vector<uint32_t> offsets;
  std::vector<uint32_t> rows;  // index into keys, one per feature
  std::vector<float> values;
};

// Builds `out` for `batch` under `layout`. INVALID_ARGUMENT when a
// feature's field is not below the layout's field count (DLRM only; the
// other models ignore fields). Reuses `out`'s and its own capacity.
class SparseIndexer {
 public:
  absl::Status Index(const ModelLayout& layout, const data::ExampleBatch& batch,
                     SparseInput* out);

 private:
  absl::flat_hash_map<uint64_t, uint32_t> position_;
  std::vector<uint32_t> counts_;
};

struct ModelOutput {
  // Binary models: P(label = 1) per example. MLP: batch x classes
  // probabilities, row-major.
  std::vector<float> probs;
  double loss_sum = 0;  // summed over the batch (the gradient is the mean's)
  // Gradients of the mean loss (only when asked for): rows x sparse_dim,
  // and dense_size floats in the dense table's layout.
  std::vector<float> sparse_grad;
  std::vector<float> dense_grad;
};

class Model {
 public:
  // INVALID_ARGUMENT for a layout kind this code does not know.
  static absl::StatusOr<std::unique_ptr<Model>> Create(
      const ModelLayout& layout, Compute* compute);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelLayout& layout() const { return layout_; }
  Compute* compute() const { return compute_; }

  // Forward pass on `batch` (and `sparse`, built by SparseIndexer for
  // it), with sparse_rows = sparse.keys.size() x sparse_dim floats and
  // dense = layout().dense_size floats; with `backward` the gradients too.
  // Errors: INVALID_ARGUMENT when sizes disagree with the layout or a
  // label is out of range (rows with a bad class count no loss);
  // RESOURCE_EXHAUSTED when device memory runs out; INTERNAL for a device
  // error.
  absl::Status Run(const data::ExampleBatch& batch, const SparseInput& sparse,
                   const float* sparse_rows, const float* dense, bool backward,
                   ModelOutput* out);

  // Validates `batch` and copies its inputs (features, labels, feature
  // lists) to the device, so that on a GPU the copy overlaps with the
  // pulls of the parameters that Run() then needs. Optional: Run() calls
  // it when the batch was not prepared. `batch` and `sparse` must stay
  // unchanged until Run(). Errors as Run()'s.
  absl::Status Prepare(const data::ExampleBatch& batch,
                       const SparseInput& sparse);

 private:
  // Device memory that grows and is reused across steps.
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
  };

  Model(const ModelLayout& layout, Compute* compute);
  // Makes `b` hold at least `count` elements of T; false when out of memory.
  template <typename T>
  T* Ensure(Buffer* b, size_t count);
  absl::Status DeviceError();

  // Layer helpers: y = act(W x + b) for the batch, and the backward pass
  // given dy (already through the activation). d_in may be null.
  void LayerForward(const DenseLayer& l, int batch, const float* in,
                    const float* dense, float* out);
  void LayerBackward(const DenseLayer& l, int batch, const float* in,
                     const float* dense, float* dy, float* d_dense,
                     float* d_in);

  // A stack of layers whose activations use buffers kNumFixed + 2 * (first
  // + i) (and + 1 for their gradients). MlpForward returns the last output
  // (written to last_out when given), nullptr when out of memory.
  // MlpBackward takes dy at the last output (after its activation) and
  // writes the gradient at `in` to d_in when not null; false when out of
  // memory.
  const float* MlpForward(const std::vector<DenseLayer>& layers, size_t first,
                          int batch, const float* in, const float* dense,
                          float* last_out);
  bool MlpBackward(const std::vector<DenseLayer>& layers, size_t first,
                   int batch, const float* in, const float* dense, float* dy,
                   float* d_dense, float* d_in);

  // One Run's sizes and device pointers: the inputs Prepare uploaded, the
  // parameters, and the pass's outputs and gradients. Only the sparse
  // pointers are null, for a model without sparse features.
  struct Pass {
    int n = 0;              // examples in the batch, > 0
    int classes = 1;        // outputs per example
    size_t num_rows = 0;    // distinct sparse rows
    bool backward = false;  // gradients too
    float scale = 0;        // 1 / n: the loss is the batch's mean
    const float* features = nullptr;
    const float* labels = nullptr;
    const uint32_t* offsets = nullptr;
    const uint32_t* index = nullptr;
    const float* values = nullptr;
    const float* dense = nullptr;
    const float* rows = nullptr;
    float* logits = nullptr;
    float* probs = nullptr;
    float* loss = nullptr;
    float* dlogits = nullptr;
    float* ddense = nullptr;
    float* dsparse = nullptr;
  };
  // Fills `p` for a prepared batch of n > 0 examples and uploads the
  // parameters; RESOURCE_EXHAUSTED when device memory runs out.
  absl::Status StartPass(int n, size_t num_rows, bool backward,
                         const float* sparse_rows, const float* dense, Pass* p);
  // The forward pass (and with p.backward the backward pass) of each model
  // kind, queued on the device; false when device memory runs out.
  bool RunLinear(const Pass& p);  // LR and FM
  bool RunMlp(const Pass& p);
  bool RunDlrm(const Pass& p);
  // Copies the loss, the probabilities and the gradients to `out` (the
  // download waits for the queued kernels); INTERNAL on a device error.
  absl::Status FinishPass(const Pass& p, ModelOutput* out);

  const ModelLayout layout_;
  Compute* const compute_;
  std::vector<Buffer> buffers_;
  // The batch whose inputs are on the device (Prepare), until Run uses it.
  const data::ExampleBatch* prepared_ = nullptr;
};

// Dense initial values: He-normal weights (standard deviation
// gain * sqrt(2 / fan_in); sqrt(1 / fan_in) for a final layer without
// ReLU), zero biases; all zeros for LR and FM. Deterministic in `seed`.
std::vector<float> InitialDenseParameters(const ModelLayout& layout, float gain,
                                          uint64_t seed);

}  // namespace ps

#endif  // PS_WORKER_MODELS_MODEL_H_
