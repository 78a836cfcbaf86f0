// Training and test data for workers: one interface over synthetic CTR
// data, text files (Criteo TSV, libsvm) and Fashion-MNIST.
//
// A Dataset is one worker's view of one split. Workers of a job open the
// same DataConfig with their own rank and together see every training
// example exactly once per pass:
//   * synthetic data: examples [0, num_train) split as worker/trainer.cc
//     does (a contiguous ShardRange, or every k-th batch);
//   * text files: the files are one byte stream of T bytes; worker r of k
//     reads the lines that start in [r*T/k, (r+1)*T/k), so any number and
//     size of files split evenly;
//   * Fashion-MNIST: a contiguous ShardRange of the training images.
// The test split is never sharded: every worker gets all of it.
//
// Keys of file data (stable: models and checkpoints depend on them):
//   * Criteo categorical field f (0..25) with hexadecimal value h:
//     CriteoKey(f, h); an empty field: CriteoKey(f, kCriteoMissing)
//     (worker/data/keys.h).
//   * libsvm index i: LibsvmKey(i).
//   * FileDataConfig.hash_buckets > 0: the key above modulo hash_buckets.
#ifndef PS_WORKER_DATA_DATASET_H_
#define PS_WORKER_DATA_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/config.pb.h"
#include "worker/data/keys.h"

namespace ps::data {

enum class Split { kTrain, kTest };

// A minibatch in struct-of-arrays layout. Readers resize the vectors to the
// batch; reusing one ExampleBatch for equal or smaller batches does not
// reallocate.
struct ExampleBatch {
  size_t size = 0;
  // size: 0 or 1 for binary tasks, the class index for multi-class ones.
  std::vector<float> labels;
  uint32_t num_dense = 0;  // dense features per example
  std::vector<float> dense;  // size * num_dense, row-major
  // size + 1: the sparse features of example i are [offsets[i], offsets[i+1]).
  std::vector<uint32_t> offsets;
  std::vector<uint64_t> keys;     // feature keys
  std::vector<float> values;      // feature values (1 for categorical)
  std::vector<uint32_t> fields;   // field of each feature, < num_fields
  // Synthetic data only: the generating model's logit; otherwise empty.
  std::vector<float> true_logits;

  // Empties the batch (keeping capacity) for examples of `dense_features`
  // dense features: size 0, offsets {0}.
  void Clear(uint32_t dense_features) {
    size = 0;
    num_dense = dense_features;
    labels.clear();
    dense.clear();
    offsets.assign(1, 0);
    keys.clear();
    values.clear();
    fields.clear();
    true_logits.clear();
  }
};

struct Schema {
  uint32_t num_dense = 0;   // dense features per example
  uint32_t num_fields = 0;  // sparse features have fields 0..num_fields-1
  uint32_t num_classes = 2;
  bool has_true_logits = false;
};

// Cumulative over all passes.
struct ReadStats {
  uint64_t lines = 0;      // text lines read, blank and bad ones included
  uint64_t examples = 0;   // examples returned
  uint64_t bad_lines = 0;  // malformed lines (skipped, or the one that failed)
  uint64_t bytes = 0;      // input bytes consumed (text files only)
};

// One worker's view of one split. Not thread-safe: use one per thread.
class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual const Schema& schema() const = 0;

  // Replaces the contents of `out` with the next min(max, remaining)
  // examples of this pass and returns how many: fewer than `max` only at the
  // end of the pass, 0 once it is over (until Rewind()).
  // Errors: INVALID_ARGUMENT if max is 0 or out is null; DATA_LOSS
  // "file:line: reason" for a malformed line when on_bad_line is FAIL; I/O
  // errors naming the file. After an error `out` is unspecified; reading on
  // continues after the offending line.
  virtual absl::StatusOr<size_t> Next(size_t max, ExampleBatch* out) = 0;

  // Skips the next min(n, remaining) examples of this pass, exactly as if
  // they were read with Next() and dropped, and returns how many: fewer
  // than `n` only at the end of the pass. So after Skip(k), Next() returns
  // example k of the pass (counting from where the pass stood), which is
  // how a worker resumes a shard at a batch index: Skip(batch * batch_size).
  // Readers that can seek do: synthetic data and Fashion-MNIST are index
  // addressed and skip without generating or copying an example. Text
  // files read and parse the skipped lines (the default below), since
  // only parsing tells a malformed or blank line (which is not an example)
  // from a good one. Skipped examples and lines count in stats() as read;
  // errors are Next()'s (e.g. DATA_LOSS for a malformed skipped line under
  // on_bad_line FAIL).
  virtual absl::StatusOr<uint64_t> Skip(uint64_t n);

  // Starts a new pass from the beginning of this worker's share.
  virtual absl::Status Rewind() = 0;

  virtual ReadStats stats() const = 0;

  // Examples in one pass of this share, for progress and time-left
  // estimates: exact for data read by index (synthetic, Fashion-MNIST);
  // for text files estimated from the bytes and examples read so far (the
  // share's bytes times examples per byte), nullopt before anything was
  // read.
  virtual std::optional<uint64_t> ExamplesPerPass() const = 0;

  // The first 100 malformed lines of the first pass, as "file:line: reason"
  // (line numbers are 1-based and count every line of the file).
  virtual std::vector<std::string> bad_line_reports() const = 0;
};

// Opens worker `rank` of `num_workers`'s share of `split` of `config`.
// For kTest every worker gets the whole test data (as rank 0 of 1).
// `batch_size` and `shard_by_batch` matter for synthetic data only: with
// shard_by_batch worker r takes batches r, r+k, r+2k, ... of batch_size
// examples (as worker/trainer.cc does); otherwise a contiguous share.
// Zero-valued synthetic_ctr fields take their documented defaults; an empty
// fashion_mnist.dir means kDefaultFashionMnistDir.
//
// Errors: INVALID_ARGUMENT for an empty DataConfig, rank >= num_workers,
// missing file lists or format, or shard_by_batch with batch_size 0;
// NOT_FOUND naming a glob pattern that matches nothing or a missing file;
// PERMISSION_DENIED for an unreadable file; DATA_LOSS for a corrupt
// Fashion-MNIST file. Text files are opened lazily: only their sizes are
// read here.
absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(
    const DataConfig& config, Split split, uint32_t rank,
    uint32_t num_workers, uint32_t batch_size, bool shard_by_batch);

// Where Debian's dataset-fashion-mnist package installs the files.
inline constexpr char kDefaultFashionMnistDir[] =
    "/usr/share/datasets/fashion-mnist";

}  // namespace ps::data

#endif  // PS_WORKER_DATA_DATASET_H_
