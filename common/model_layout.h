// The shapes of a job's model: what the data gives a model (dense features,
// categorical fields, classes), how wide the sparse rows are, and where each
// dense weight sits in the dense table. Servers, workers, the config
// validator and `predict` all derive these from the same JobConfig through
// this one function, so they cannot disagree.
#ifndef PS_COMMON_MODEL_LAYOUT_H_
#define PS_COMMON_MODEL_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "proto/config.pb.h"

namespace ps {

// What every example of a data source looks like.
struct DataShape {
  uint32_t num_dense = 0;    // dense (numeric) features per example
  uint32_t num_fields = 0;   // categorical fields (sparse feature groups)
  uint32_t num_classes = 2;  // 2: binary (one logit); > 2: softmax
};

// Shape of the data `data` describes; defaults applied. Criteo: 13 dense,
// 26 fields; libsvm: 0 dense, 1 field; Fashion-MNIST: 784 dense, 0 fields,
// 10 classes; synthetic: num_numeric, num_categorical.
DataShape ShapeOfData(const DataConfig& data);

// A fully connected layer y = W x + b: W is out x in, row-major, at
// [w_offset, w_offset + in * out) of the dense table, b at
// [b_offset, b_offset + out).
struct DenseLayer {
  uint32_t in = 0;
  uint32_t out = 0;
  uint64_t w_offset = 0;
  uint64_t b_offset = 0;
  bool relu = true;  // ReLU after the layer
};

struct ModelLayout {
  ModelConfig::Kind kind = ModelConfig::LR;
  DataShape data;
  // Floats per sparse row: LR 1, FM 1 + embedding_dim, DLRM embedding_dim,
  // MLP 0 (no sparse table).
  uint32_t sparse_dim = 0;
  uint32_t embedding_dim = 0;
  // LR and FM: numeric weights at [0, num_dense), bias at num_dense.
  // DLRM: the bottom MLP's layers (may be empty when there are no dense
  // features), then the top MLP's (last has 1 output, no ReLU).
  // MLP: `top` only; the last layer has num_classes outputs, no ReLU.
  std::vector<DenseLayer> bottom;
  std::vector<DenseLayer> top;
  // DLRM: vectors that interact (fields + 1 with a bottom MLP), and the
  // width of the top MLP's input (embedding_dim when there is a bottom MLP,
  // plus n (n - 1) / 2 dot products).
  uint32_t num_vectors = 0;
  uint32_t top_input = 0;
  uint64_t dense_size = 0;  // floats in the dense table
};

// The layout of config.training().model() on config.data(); defaults
// applied. INVALID_ARGUMENT when the model cannot be built on this data
// (e.g. DLRM with fewer than two vectors to interact, MLP on a binary
// task, a layer width of 0 or above 65536), or the parameter count exceeds
// 2^32.
absl::StatusOr<ModelLayout> LayoutModel(const JobConfig& config);

}  // namespace ps

#endif  // PS_COMMON_MODEL_LAYOUT_H_
