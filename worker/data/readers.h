// The Dataset implementations behind OpenDataset(). Internal to worker/data;
// declared here so tests can set reader options. Arguments are validated by
// OpenDataset() (rank < num_workers, num_workers > 0); for kTest callers
// pass rank 0 of 1.
#ifndef PS_WORKER_DATA_READERS_H_
#define PS_WORKER_DATA_READERS_H_

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "proto/config.pb.h"
#include "worker/data/dataset.h"
#include "worker/data/line_reader.h"

namespace ps::data::internal {

absl::StatusOr<std::unique_ptr<Dataset>> OpenTextDataset(
    const FileDataConfig& config, Split split, uint32_t rank,
    uint32_t num_workers, LineReaderOptions options = {});

absl::StatusOr<std::unique_ptr<Dataset>> OpenSyntheticDataset(
    const SyntheticCtrConfig& config, Split split, uint32_t rank,
    uint32_t num_workers, uint32_t batch_size, bool shard_by_batch);

absl::StatusOr<std::unique_ptr<Dataset>> OpenFashionMnist(
    const FashionMnistConfig& config, Split split, uint32_t rank,
    uint32_t num_workers);

}  // namespace ps::data::internal

#endif  // PS_WORKER_DATA_READERS_H_
