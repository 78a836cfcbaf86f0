// Dataset over examples/ctr's synthetic CTR generator.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/data/dataset.h"
#include "worker/data/readers.h"
#include "worker/data/synthetic_ctr.h"

namespace ps::data::internal {
namespace {

// This worker's examples are segments [pos, pos + len): one contiguous
// ShardRange, or batches rank, rank + k, ... of batch_size (shard_by_batch).
// The same arithmetic as the original LR trainer's batching, kept lazy so a billion
// examples do not need a million-entry batch list.
class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(ctr::SyntheticCtr gen, ctr::Split split, uint64_t first,
                   uint64_t stride, uint64_t segment, uint64_t end)
      : gen_(std::move(gen)),
        split_(split),
        first_(first),
        stride_(stride),
        segment_(segment),
        end_(end) {
    schema_.num_dense = gen_.num_numeric();
    schema_.num_fields = gen_.num_categorical();
    schema_.num_classes = 2;
    schema_.has_true_logits = true;
    Reset();
  }

  const Schema& schema() const override { return schema_; }
  ReadStats stats() const override { return stats_; }
  std::vector<std::string> bad_line_reports() const override { return {}; }
  // Segments of segment_ examples start at first_, first_ + stride_, ...
  // below end_; the last may be cut short by end_.
  std::optional<uint64_t> ExamplesPerPass() const override {
    if (end_ <= first_) return 0;
    if (stride_ == 0) return end_ - first_;
    const uint64_t segments = (end_ - first_ + stride_ - 1) / stride_;
    const uint64_t last = first_ + (segments - 1) * stride_;
    return (segments - 1) * segment_ + std::min(segment_, end_ - last);
  }

  absl::Status Rewind() override {
    Reset();
    return absl::OkStatus();
  }

  // The same walk over segments as Next(), without generating anything;
  // whole segments (shard_by_batch's batches) are stepped over at once.
  absl::StatusOr<uint64_t> Skip(uint64_t n) override {
    uint64_t skipped = 0;
    while (skipped < n && pos_ < end_) {
      const uint64_t left = n - skipped;
      if (stride_ > 0 && pos_ == seg_start_ && left >= segment_ &&
          seg_start_ + segment_ <= end_) {
        // Segments starting at seg_start_ + i * stride_ for i < whole end
        // at or before end_, so each holds segment_ examples.
        const uint64_t whole =
            std::min(left / segment_,
                     (end_ - seg_start_ - segment_) / stride_ + 1);
        seg_start_ += whole * stride_;
        pos_ = seg_start_;
        skipped += whole * segment_;
        continue;
      }
      const uint64_t seg_end = std::min(seg_start_ + segment_, end_);
      const uint64_t take = std::min(left, seg_end - pos_);
      pos_ += take;
      skipped += take;
      if (pos_ == seg_end) {
        if (stride_ == 0) break;
        seg_start_ += stride_;
        pos_ = seg_start_;
      }
    }
    stats_.examples += skipped;
    return skipped;
  }

  absl::StatusOr<size_t> Next(size_t max, ExampleBatch* out) override {
    if (max == 0 || out == nullptr) {
      return absl::InvalidArgumentError("Next: max must be > 0, out non-null");
    }
    const uint32_t nf = gen_.num_categorical();
    out->Clear(gen_.num_numeric());
    size_t n = 0;
    while (n < max && pos_ < end_) {
      const uint64_t seg_end = std::min(seg_start_ + segment_, end_);
      const uint64_t take = std::min<uint64_t>(max - n, seg_end - pos_);
      PS_RETURN_IF_ERROR(gen_.Fill(split_, pos_, take, &scratch_));
      Append(scratch_, nf, out);
      n += take;
      pos_ += take;
      if (pos_ == seg_end) {  // on to this worker's next segment
        if (stride_ == 0) break;
        seg_start_ += stride_;
        pos_ = seg_start_;
      }
    }
    out->size = n;
    stats_.examples += n;
    return n;
  }

 private:
  void Reset() {
    seg_start_ = first_;
    pos_ = first_;
  }

  static void Append(const ctr::Batch& b, uint32_t nf, ExampleBatch* out) {
    out->labels.insert(out->labels.end(), b.labels.begin(), b.labels.end());
    out->true_logits.insert(out->true_logits.end(), b.true_logits.begin(),
                            b.true_logits.end());
    out->dense.insert(out->dense.end(), b.numeric.begin(), b.numeric.end());
    out->keys.insert(out->keys.end(), b.keys.begin(), b.keys.end());
    out->values.resize(out->keys.size(), 1.0f);
    for (size_t i = 0; i < b.size; ++i) {
      for (uint32_t f = 0; f < nf; ++f) out->fields.push_back(f);
      out->offsets.push_back(static_cast<uint32_t>(out->offsets.back() + nf));
    }
  }

  ctr::SyntheticCtr gen_;
  const ctr::Split split_;
  const uint64_t first_;    // start of the first segment
  const uint64_t stride_;   // distance between segment starts; 0: one
  const uint64_t segment_;  // segment length
  const uint64_t end_;      // no example at or past this
  uint64_t seg_start_ = 0;  // start of the current segment
  uint64_t pos_ = 0;        // next example
  Schema schema_;
  ReadStats stats_;
  ctr::Batch scratch_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> OpenSyntheticDataset(
    const SyntheticCtrConfig& config, Split split, uint32_t rank,
    uint32_t num_workers, uint32_t batch_size, bool shard_by_batch) {
  // Fill zero fields with their documented defaults; a no-op for a config
  // that came through ps::LoadJobConfig.
  JobConfig job;
  *job.mutable_data()->mutable_synthetic_ctr() = config;
  ApplyDefaults(&job);
  PS_ASSIGN_OR_RETURN(ctr::SyntheticCtr gen,
                      ctr::SyntheticCtr::Create(job.data().synthetic_ctr()));
  const ctr::Split s =
      split == Split::kTrain ? ctr::Split::kTrain : ctr::Split::kTest;
  const uint64_t total = gen.size(s);
  if (split == Split::kTrain && shard_by_batch) {
    if (batch_size == 0) {
      return absl::InvalidArgumentError(
          "shard_by_batch needs a batch_size > 0");
    }
    const uint64_t b = batch_size;
    const uint64_t first = std::min(uint64_t{rank} * b, total);
    return std::make_unique<SyntheticDataset>(std::move(gen), s, first,
                                              uint64_t{num_workers} * b, b,
                                              total);
  }
  const auto [begin, end] = split == Split::kTrain
                                ? ctr::ShardRange(total, rank, num_workers)
                                : std::make_pair(uint64_t{0}, total);
  return std::make_unique<SyntheticDataset>(std::move(gen), s, begin, 0,
                                            end - begin, end);
}

}  // namespace ps::data::internal
