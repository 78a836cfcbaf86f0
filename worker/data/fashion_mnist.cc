// Dataset over Fashion-MNIST idx files.
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/data/dataset.h"
#include "worker/data/idx.h"
#include "worker/data/readers.h"
#include "worker/data/synthetic_ctr.h"

namespace ps::data::internal {
namespace {

constexpr uint32_t kImageMagic = 0x00000803;
constexpr uint32_t kLabelMagic = 0x00000801;
constexpr uint32_t kSide = 28;
constexpr uint32_t kPixels = kSide * kSide;
constexpr uint32_t kClasses = 10;

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// `dir/name.gz` if present, else `dir/name`; NOT_FOUND naming both.
absl::StatusOr<std::string> FindFile(const std::string& dir,
                                     const std::string& name) {
  const std::string base = absl::StrCat(dir, "/", name);
  if (Exists(base + ".gz")) return base + ".gz";
  if (Exists(base)) return base;
  return absl::NotFoundError(absl::StrCat(
      "Fashion-MNIST file not found: neither ", base, ".gz nor ", base,
      " exists (apt-get install dataset-fashion-mnist, or set "
      "data.fashion_mnist.dir)"));
}

class FashionMnistDataset final : public Dataset {
 public:
  FashionMnistDataset(std::vector<uint8_t> pixels, std::vector<uint8_t> labels)
      : pixels_(std::move(pixels)), labels_(std::move(labels)) {
    schema_.num_dense = kPixels;
    schema_.num_fields = 0;
    schema_.num_classes = kClasses;
  }

  const Schema& schema() const override { return schema_; }
  ReadStats stats() const override { return stats_; }
  std::vector<std::string> bad_line_reports() const override { return {}; }
  std::optional<uint64_t> ExamplesPerPass() const override {
    return labels_.size();
  }

  absl::Status Rewind() override {
    pos_ = 0;
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Skip(uint64_t n) override {
    const uint64_t take = std::min<uint64_t>(n, labels_.size() - pos_);
    pos_ += static_cast<size_t>(take);
    stats_.examples += take;
    return take;
  }

  absl::StatusOr<size_t> Next(size_t max, ExampleBatch* out) override {
    if (max == 0 || out == nullptr) {
      return absl::InvalidArgumentError("Next: max must be > 0, out non-null");
    }
    const size_t n = std::min(max, labels_.size() - pos_);
    out->Clear(kPixels);
    out->size = n;
    out->labels.resize(n);
    out->dense.resize(n * kPixels);
    out->offsets.assign(n + 1, 0);
    const uint8_t* src = pixels_.data() + pos_ * kPixels;
    for (size_t i = 0; i < n * kPixels; ++i) {
      out->dense[i] = static_cast<float>(src[i]) * (1.0f / 255.0f);
    }
    for (size_t i = 0; i < n; ++i) {
      out->labels[i] = static_cast<float>(labels_[pos_ + i]);
    }
    pos_ += n;
    stats_.examples += n;
    return n;
  }

 private:
  Schema schema_;
  ReadStats stats_;
  std::vector<uint8_t> pixels_;  // this worker's images, kPixels each
  std::vector<uint8_t> labels_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> OpenFashionMnist(
    const FashionMnistConfig& config, Split split, uint32_t rank,
    uint32_t num_workers) {
  const std::string dir =
      config.dir().empty() ? std::string(kDefaultFashionMnistDir) : config.dir();
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  PS_ASSIGN_OR_RETURN(const std::string images_path,
                      FindFile(dir, prefix + "-images-idx3-ubyte"));
  PS_ASSIGN_OR_RETURN(const std::string labels_path,
                      FindFile(dir, prefix + "-labels-idx1-ubyte"));
  PS_ASSIGN_OR_RETURN(IdxArray labels, ReadIdx(labels_path, kLabelMagic));
  PS_ASSIGN_OR_RETURN(IdxArray images, ReadIdx(images_path, kImageMagic));
  if (images.dims.size() != 3 || images.dims[1] != kSide ||
      images.dims[2] != kSide) {
    return absl::DataLossError(
        absl::StrCat(images_path, ": images are not 28x28"));
  }
  const uint64_t count = images.dims[0];
  if (labels.dims.size() != 1 || labels.dims[0] != count) {
    return absl::DataLossError(absl::StrCat(
        labels_path, " holds ", labels.dims.empty() ? 0 : labels.dims[0],
        " labels but ", images_path, " holds ", count, " images"));
  }
  for (uint64_t i = 0; i < count; ++i) {
    if (labels.data[i] >= kClasses) {
      return absl::DataLossError(absl::StrCat(
          labels_path, ": label ", int{labels.data[i]}, " of image ", i,
          " is not a class 0..9"));
    }
  }
  uint64_t used = count;
  if (split == Split::kTrain && config.num_train() > 0) {
    if (config.num_train() > count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.fashion_mnist.num_train is ", config.num_train(), " but ",
          images_path, " holds only ", count, " images"));
    }
    used = config.num_train();
  }
  const auto [begin, end] = ctr::ShardRange(used, rank, num_workers);
  std::vector<uint8_t> pixels(images.data.begin() + begin * kPixels,
                              images.data.begin() + end * kPixels);
  std::vector<uint8_t> shard_labels(labels.data.begin() + begin,
                                    labels.data.begin() + end);
  return std::make_unique<FashionMnistDataset>(std::move(pixels),
                                               std::move(shard_labels));
}

}  // namespace ps::data::internal
