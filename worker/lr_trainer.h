// Sparse logistic regression trained through the parameter servers.
//
// Model: p = sigmoid(b + sum_f w[key_f] + sum_j v_j x_j). The per-key
// weights w live in a sparse table of dim 1, and (v, b) in a dense table of
// num_numeric + 1 elements (b last); both are named in the job config's
// `training` block. Each step pulls the weights of the batch's distinct
// keys, computes the mean log-loss gradient and pushes it; the servers
// apply their optimizer.
//
// Not thread-safe: one trainer per thread. The KVClient is not owned.
#ifndef PS_WORKER_LR_TRAINER_H_
#define PS_WORKER_LR_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "examples/ctr/synthetic_ctr.h"
#include "proto/config.pb.h"
#include "worker/kv_client.h"

namespace ps {

struct TrainResult {
  uint64_t examples = 0;  // processed by this worker, all epochs
  uint64_t steps = 0;
  double seconds = 0;
  double mean_loss = 0;  // over the last epoch
};

struct EvalResult {
  uint64_t examples = 0;
  double auc = 0;
  double logloss = 0;
  double oracle_auc = 0;      // AUC of the generating model's logits
  double oracle_logloss = 0;  // log loss of the generating model
};

class LrTrainer {
 public:
  // INVALID_ARGUMENT when the config lacks synthetic_ctr data or the tables
  // named in `training`.
  static absl::StatusOr<std::unique_ptr<LrTrainer>> Create(
      const JobConfig& config, KVClient* client, uint32_t rank,
      uint32_t num_workers);

  // Trains over this worker's shard for the configured epochs, logging
  // progress every training.log_interval_s. `stop` is polled between steps;
  // when it returns true training ends early (result covers what was done).
  // After each step the worker's clock advances and `on_clock` gets it (for
  // heartbeats); at the end the clock becomes kFinishedClock, so this
  // worker never holds back the others' synchronous waits.
  absl::StatusOr<TrainResult> Train(
      const std::function<bool()>& stop,
      const std::function<void(uint64_t)>& on_clock = nullptr);

  // Scores the whole test split with the current server parameters.
  absl::StatusOr<EvalResult> Evaluate();

 private:
  LrTrainer(const JobConfig& config, KVClient* client, ctr::SyntheticCtr data,
            uint32_t rank, uint32_t num_workers);

  // Distinct keys of `batch` into unique_keys_ and key_index_ (the position
  // of each batch key in unique_keys_).
  void Dedup(const ctr::Batch& batch);
  // Pulls the weights for the current unique keys and the dense weights.
  // Under BSP/SSP a pull may wait for slower workers: a pull that times out
  // is sent again a few times, with a log line each time.
  absl::Status PullWeights();
  // (first example, count) of each of this worker's batches in one epoch.
  std::vector<std::pair<uint64_t, uint64_t>> Batches() const;
  // Probabilities of the batch from the pulled weights.
  void Forward(const ctr::Batch& batch, std::vector<float>* logits) const;

  const JobConfig config_;
  KVClient* const client_;
  const ctr::SyntheticCtr data_;
  const uint32_t rank_;
  const uint32_t num_workers_;
  uint32_t sparse_table_ = 0;
  uint32_t dense_table_ = 0;
  uint32_t num_numeric_ = 0;

  absl::flat_hash_map<uint64_t, uint32_t> dedup_;
  std::vector<uint64_t> unique_keys_;
  std::vector<uint32_t> key_index_;
  std::vector<float> sparse_w_;
  std::vector<float> dense_w_;
  // Gradients are summed in double over the batch (so the sum does not
  // depend on how examples are split into batches, to float precision) and
  // pushed as float.
  std::vector<double> sparse_sum_;
  std::vector<double> dense_sum_;
  std::vector<float> sparse_g_;
  std::vector<float> dense_g_;
};

}  // namespace ps

#endif  // PS_WORKER_LR_TRAINER_H_
