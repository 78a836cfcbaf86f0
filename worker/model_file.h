// A trained model saved to one file: the job config it was trained with
// (model, tables, data shape), the dense table and every sparse row.
//
// Format (little-endian): "PSMODEL1", then u64 sizes and raw arrays:
//   config_bytes, config (serialized JobConfig);
//   dense_count, dense floats;
//   sparse_dim (u32), row_count, keys (u64 each), rows (row_count x dim);
//   u64 checksum of everything before it.
// Files are written to a temporary name and renamed, so a crash never
// leaves a half-written model under the final name.
#ifndef PS_WORKER_MODEL_FILE_H_
#define PS_WORKER_MODEL_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/config.pb.h"

namespace ps {

struct SavedModel {
  JobConfig config;
  std::vector<float> dense;
  uint32_t sparse_dim = 0;  // set by SaveModel's caller or from the config
  std::vector<uint64_t> keys;
  std::vector<float> rows;  // keys.size() x sparse_dim
};

// Errors: INVALID_ARGUMENT when rows.size() != keys.size() * sparse_dim
// (sparse_dim is taken from the config's layout when 0); UNAVAILABLE when
// the file cannot be written.
absl::Status SaveModel(const std::string& path, const SavedModel& model);

// NOT_FOUND when the file cannot be opened; DATA_LOSS when it is not a
// model file, is truncated, or its checksum does not match.
absl::StatusOr<SavedModel> LoadModel(const std::string& path);

}  // namespace ps

#endif  // PS_WORKER_MODEL_FILE_H_
