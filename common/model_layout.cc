#include "common/model_layout.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

constexpr uint32_t kMaxWidth = 65536;
constexpr uint64_t kMaxDense = uint64_t{1} << 32;

// Appends layers in -> widths... -> last to `layers`, assigning offsets from
// *next. The last layer gets no ReLU when `last_relu` is false.
absl::Status AddMlp(uint32_t in, const google::protobuf::RepeatedField<uint32_t>& widths,
                    uint32_t last, bool last_relu, const char* what,
                    std::vector<DenseLayer>* layers, uint64_t* next) {
  std::vector<uint32_t> outs(widths.begin(), widths.end());
  outs.push_back(last);
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i] == 0 || outs[i] > kMaxWidth) {
      return absl::InvalidArgumentError(absl::StrCat(
          "training.model.", what, ": layer widths must be in 1..", kMaxWidth));
    }
    DenseLayer l;
    l.in = in;
    l.out = outs[i];
    l.w_offset = *next;
    l.b_offset = l.w_offset + uint64_t{l.in} * l.out;
    l.relu = i + 1 < outs.size() || last_relu;
    *next = l.b_offset + l.out;
    if (*next > kMaxDense) {
      return absl::InvalidArgumentError(
          "training.model: more than 2^32 dense parameters");
    }
    layers->push_back(l);
    in = l.out;
  }
  return absl::OkStatus();
}

}  // namespace

DataShape ShapeOfData(const DataConfig& data) {
  DataShape s;
  switch (data.source_case()) {
    case DataConfig::kSyntheticCtr:
      s.num_dense = data.synthetic_ctr().num_numeric();
      s.num_fields = data.synthetic_ctr().num_categorical();
      break;
    case DataConfig::kFiles:
      if (data.files().format() == FileDataConfig::CRITEO) {
        s.num_dense = 13;
        s.num_fields = 26;
      } else {
        s.num_dense = 0;
        s.num_fields = 1;
      }
      break;
    case DataConfig::kFashionMnist:
      s.num_dense = 784;
      s.num_fields = 0;
      s.num_classes = 10;
      break;
    case DataConfig::SOURCE_NOT_SET:
      break;
  }
  return s;
}

absl::StatusOr<ModelLayout> LayoutModel(const JobConfig& config) {
  const ModelConfig& m = config.training().model();
  ModelLayout l;
  l.kind = m.kind() == ModelConfig::KIND_UNSPECIFIED ? ModelConfig::LR
                                                     : m.kind();
  l.data = ShapeOfData(config.data());
  const bool binary = l.data.num_classes == 2;
  if (l.kind != ModelConfig::MLP && !binary) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.model: ", ModelConfig::Kind_Name(l.kind),
        " predicts clicks (2 classes) but the data has ", l.data.num_classes,
        " classes; use kind: MLP"));
  }
  uint64_t next = 0;
  switch (l.kind) {
    case ModelConfig::LR:
    case ModelConfig::FM:
      l.embedding_dim = l.kind == ModelConfig::FM ? m.embedding_dim() : 0;
      if (l.kind == ModelConfig::FM &&
          (l.embedding_dim == 0 || l.embedding_dim > 1024)) {
        return absl::InvalidArgumentError(
            "training.model.embedding_dim: must be in 1..1024");
      }
      l.sparse_dim = 1 + l.embedding_dim;
      l.dense_size = uint64_t{l.data.num_dense} + 1;
      return l;
    case ModelConfig::DLRM: {
      l.embedding_dim = m.embedding_dim();
      if (l.embedding_dim == 0 || l.embedding_dim > 1024) {
        return absl::InvalidArgumentError(
            "training.model.embedding_dim: must be in 1..1024");
      }
      l.sparse_dim = l.embedding_dim;
      const bool has_bottom = l.data.num_dense > 0;
      if (has_bottom) {
        absl::Status s = AddMlp(l.data.num_dense, m.bottom_mlp(),
                                l.embedding_dim, /*last_relu=*/true,
                                "bottom_mlp", &l.bottom, &next);
        if (!s.ok()) return s;
      }
      l.num_vectors = l.data.num_fields + (has_bottom ? 1 : 0);
      if (l.num_vectors < 2) {
        return absl::InvalidArgumentError(
            "training.model: DLRM needs at least two vectors to interact "
            "(categorical fields, plus one for the dense features); this "
            "data has fewer. Use LR or FM");
      }
      l.top_input = (has_bottom ? l.embedding_dim : 0) +
                    l.num_vectors * (l.num_vectors - 1) / 2;
      absl::Status s = AddMlp(l.top_input, m.top_mlp(), 1,
                              /*last_relu=*/false, "top_mlp", &l.top, &next);
      if (!s.ok()) return s;
      l.dense_size = next;
      return l;
    }
    case ModelConfig::MLP: {
      if (l.data.num_dense == 0) {
        return absl::InvalidArgumentError(
            "training.model: MLP needs dense features; this data has none");
      }
      const uint32_t classes = m.num_classes();
      if (classes < 2 || classes > kMaxWidth) {
        return absl::InvalidArgumentError(
            "training.model.num_classes: must be in 2..65536");
      }
      if (classes != l.data.num_classes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "training.model.num_classes: ", classes, " but the data has ",
            l.data.num_classes, " classes"));
      }
      absl::Status s = AddMlp(l.data.num_dense, m.hidden(), classes,
                              /*last_relu=*/false, "hidden", &l.top, &next);
      if (!s.ok()) return s;
      l.dense_size = next;
      return l;
    }
    default:
      return absl::InvalidArgumentError("training.model.kind: unknown kind");
  }
}

}  // namespace ps
