#include "worker/data/dataset.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/data/readers.h"

namespace ps::data {

absl::StatusOr<uint64_t> Dataset::Skip(uint64_t n) {
  // Reading is the only way to skip a stream of lines; a reader that can
  // seek overrides this. Bounded chunks keep the scratch batch small.
  constexpr uint64_t kChunk = 4096;
  ExampleBatch scratch;
  uint64_t skipped = 0;
  while (skipped < n) {
    const size_t want = static_cast<size_t>(std::min(kChunk, n - skipped));
    absl::StatusOr<size_t> got = Next(want, &scratch);
    if (!got.ok()) return got.status();
    skipped += *got;
    if (*got < want) break;  // end of the pass
  }
  return skipped;
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(
    const DataConfig& config, Split split, uint32_t rank,
    uint32_t num_workers, uint32_t batch_size, bool shard_by_batch) {
  if (num_workers == 0 || rank >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker rank ", rank, " is not below num_workers ", num_workers));
  }
  if (split == Split::kTest) {  // the test split is never sharded
    rank = 0;
    num_workers = 1;
  }
  switch (config.source_case()) {
    case DataConfig::kSyntheticCtr:
      return internal::OpenSyntheticDataset(config.synthetic_ctr(), split,
                                            rank, num_workers, batch_size,
                                            shard_by_batch);
    case DataConfig::kFiles:
      return internal::OpenTextDataset(config.files(), split, rank,
                                       num_workers);
    case DataConfig::kFashionMnist:
      return internal::OpenFashionMnist(config.fashion_mnist(), split, rank,
                                        num_workers);
    case DataConfig::SOURCE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "data: set one of synthetic_ctr, files or fashion_mnist");
}

}  // namespace ps::data
