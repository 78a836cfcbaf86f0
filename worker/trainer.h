// Trains the job's model (training.model: LR, FM, DLRM-lite or an MLP)
// through the parameter servers, on the CPU or a GPU.
//
// Each step: read this worker's next batch, map its keys to distinct rows,
// pull those rows and the dense table, run the model forward and backward
// (worker/models), push the gradients of the mean loss, advance the clock.
// The servers apply their optimizers; the consistency mode (ASYNC, BSP,
// SSP) decides when a pull is answered. The next batch is read while the
// previous step's pushes are in flight.
//
// Initialisation: rank 0 writes the model's dense initial values (He
// initialisation for MLP layers) to the servers before its first step; the
// other workers wait at a barrier for that and then pull, so every worker
// starts from the same parameters.
//
// Not thread-safe: one trainer per thread. The KVClient is not owned.
#ifndef PS_WORKER_TRAINER_H_
#define PS_WORKER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model_layout.h"
#include "proto/config.pb.h"
#include "worker/compute/compute.h"
#include "worker/data/dataset.h"
#include "worker/evaluation.h"
#include "worker/kv_client.h"
#include "worker/models/model.h"

namespace ps {

struct TrainResult {
  uint64_t examples = 0;  // processed by this worker, all epochs
  uint64_t steps = 0;
  double seconds = 0;
  double mean_loss = 0;  // over the last epoch
  data::ReadStats read;  // of the training data
  std::vector<std::string> bad_lines;  // "file:line: reason", the first 100
};


// How the trainer reaches the rest of the job. All optional.
struct TrainerHooks {
  // Polled between steps; true ends training early.
  std::function<bool()> stop;
  // Called with the clock after each step (for heartbeats); at the end with
  // kFinishedClock.
  std::function<void(uint64_t)> on_clock;
  // A barrier across all workers of the job (the scheduler's). Without one
  // the workers other than rank 0 do not wait for its initial values.
  std::function<absl::Status(absl::string_view name)> barrier;
};

class Trainer {
 public:
  // Opens this worker's data and the compute device (training.device).
  // INVALID_ARGUMENT for a model that does not fit the data or the tables;
  // the data reader's errors; FAILED_PRECONDITION when device GPU is asked
  // for and none is usable.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const JobConfig& config, KVClient* client, uint32_t rank,
      uint32_t num_workers);

  // Trains for training.epochs passes (or max_steps). Rank 0 evaluates
  // every training.eval_interval_steps and appends each evaluation to
  // training.metrics_file. Ends with the clock at kFinishedClock, so this
  // worker never holds back the others' synchronous waits.
  absl::StatusOr<TrainResult> Train(const TrainerHooks& hooks);

  // Scores the test data with the current server parameters.
  // FAILED_PRECONDITION when the job has no test data.
  absl::StatusOr<EvalResult> Evaluate();

  // Appends one JSON line for `eval` to training.metrics_file (if set).
  absl::Status AppendMetrics(const EvalResult& eval, uint64_t step,
                             double train_loss) const;

  // Saves the model (dense table, every row of the sparse table) to `path`
  // (worker/model_file.h). Call after every worker's training is done.
  absl::Status Export(const std::string& path);

  // "cpu (1 thread)", "cuda:0 ...": where gradients are computed.
  std::string device_name() const { return compute_->name(); }
  // Why the CPU was used under device AUTO ("" when a GPU is used or the
  // CPU was asked for).
  const std::string& why_cpu() const { return why_cpu_; }

 private:
  Trainer(const JobConfig& config, KVClient* client, uint32_t rank,
          uint32_t num_workers, ModelLayout layout);

  // One step's batch, its keys and the parameters pulled for it.
  struct Step {
    data::ExampleBatch batch;
    size_t n = 0;
    SparseInput sparse;
    std::vector<float> rows;   // keys x sparse_dim
    std::vector<float> dense;  // the dense table
    std::optional<Completion> sparse_pull;
    std::optional<Completion> dense_pull;
  };
  // Reads the next batch of `dataset` into `step`, maps its keys and sends
  // the pulls of its parameters. false at the end of the pass.
  absl::StatusOr<bool> Load(data::Dataset* dataset, size_t batch_size,
                            Step* step);
  // Sends the pulls of step->sparse.keys' rows and the dense table.
  void StartPull(Step* step);
  // Waits for them. Under BSP/SSP a pull may wait for slower workers: a
  // pull that times out is sent again a few times, with a log line each.
  absl::Status FinishPull(Step* step);
  // Rank 0 writes the initial dense values; everyone meets at a barrier.
  absl::Status Initialize(const TrainerHooks& hooks);

  const JobConfig config_;
  KVClient* const client_;
  const uint32_t rank_;
  const uint32_t num_workers_;
  const ModelLayout layout_;
  uint32_t sparse_table_ = 0;
  uint32_t dense_table_ = 0;
  double start_seconds_ = 0;

  std::unique_ptr<Compute> compute_;
  std::string why_cpu_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<data::Dataset> train_data_;
  SparseIndexer indexer_;
  Step steps_[2];  // the current step and, with prefetch, the next
  Step eval_step_;
  ModelOutput output_;
};

}  // namespace ps

#endif  // PS_WORKER_TRAINER_H_
