// Trains the job's model (training.model: LR, FM, DLRM-lite or an MLP)
// through the parameter servers, on the CPU or a GPU.
//
// Each step: read the next batch of the data shard being trained, map its
// keys to distinct rows, pull those rows and the dense table, run the model
// forward and backward (worker/models), push the gradients of the mean
// loss, advance the clock. The servers apply their optimizers; the
// consistency mode (ASYNC, BSP, SSP) decides when a pull is answered. The
// next batch is read while the previous step's pushes are in flight.
//
// Data shards and positions. Shard s of a job is what worker rank s reads
// (data::OpenDataset with rank s). A DataPosition (proto/scheduler.proto)
// says where a shard stands: the epoch being read and the index of the next
// batch to train in it, both 0-based, or done. A worker trains the shards a
// ShardCursor (worker/shard_cursor.h, the job's shard protocol) hands out,
// each from its position (skipping the batches before it with
// Dataset::Skip) through the remaining epochs: its own shard, then the rest
// of shards whose workers died or were preempted, until every shard is
// done. A worker that is idle, or waits for work, has its clock at
// kFinishedClock, so it never holds back the others' BSP/SSP waits; the
// cursor restarts it at the job's clock when it gets a shard.
//
// Progress is reported (TrainerHooks::on_step) once a step's pushes are
// acknowledged, so a reported position never runs ahead of what the
// servers hold: a worker that is killed and resumed from its last report
// trains the batches after it a second time (those of the last heartbeat
// interval and one step more), and skips none. A worker that is asked to
// stop (TrainerHooks::stop, e.g. on SIGTERM) finishes the step in progress,
// waits for its pushes, and ends with TrainResult::position at exactly the
// next untrained batch: resumed from there, nothing is trained twice and
// nothing skipped.
//
// Initialisation: in a fresh job (the client's clock is 0 when Train
// starts) rank 0 writes the model's dense initial values (He initialisation
// for MLP layers) to the servers before its first step, and the workers
// meet at the cursor's start barrier ("ps-start") before they pull, so
// every worker starts from the same parameters. A worker that joins a running
// job, or a job restored from a checkpoint (clock > 0), neither writes nor
// waits: it pulls the current parameters.
//
// Log lines meant for tools (positions 0-based, as in DataPosition):
//   "training shard S from epoch E batch B at clock C"
//
// Not thread-safe: one trainer per thread. The KVClient is not owned.
// Time comes from the Clock given to Create (not owned).
#ifndef PS_WORKER_TRAINER_H_
#define PS_WORKER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/model_layout.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/client.h"
#include "worker/compute/compute.h"
#include "worker/data/dataset.h"
#include "worker/dense_ring.h"
#include "worker/dense_ring_copy.h"
#include "worker/evaluation.h"
#include "worker/kv_client.h"
#include "worker/models/model.h"
#include "worker/shard_cursor.h"

namespace ps {

struct TrainResult {
  // Cumulative over every shard this worker trained.
  uint64_t examples = 0;
  uint64_t steps = 0;
  double seconds = 0;
  double mean_loss = 0;                // over the last epoch trained
  data::ReadStats read;                // of the training data
  std::vector<std::string> bad_lines;  // "file:line: reason", the first 100
  // The client's clock when training began (0: a fresh job).
  uint64_t start_clock = 0;
  // The shards this worker started training, in order: its own and any it
  // took over (a shard appears again if it came back to this worker).
  std::vector<uint32_t> shards;
  // Training ended because hooks.stop said so, with work left.
  bool preempted = false;
  // Steps whose loss or gradients were not finite. With
  // data_plane.gradients.nonfinite CLIP they were pushed for the servers to
  // clip (and are counted here); otherwise the first one ends training
  // with an error.
  uint64_t nonfinite_steps = 0;
  // Where this worker stands. Preempted: the next untrained batch of the
  // shard it held (done when it had finished that shard and was waiting
  // for more work). Otherwise the final position of the last shard it
  // trained (done). Absent when it never held a shard.
  std::optional<DataPosition> position;
};

// How the trainer reaches the rest of the job. All optional. stop, barrier
// and claim serve Train(hooks, start) only, which builds its ShardCursor
// from them; Train(shards, hooks) uses the cursor's.
struct TrainerHooks {
  // Polled between steps, and between requests for work; true ends
  // training (see Trainer::Train).
  std::function<bool()> stop;
  // Progress, for heartbeats: called once the pushes of a step are
  // acknowledged with the clock after that step and the position of the
  // next batch to train; when a shard ends (done, stopped or max_steps)
  // with kFinishedClock and the shard's final position. Called on the
  // training thread, in clock order.
  std::function<void(uint64_t clock, const DataPosition& next)> on_step;
  // The clock alone, at the same points as on_step.
  std::function<void(uint64_t clock)> on_clock;
  // Metrics: after each step is computed and its pushes are sent, the
  // step's example count and its wall time (from the start of the step:
  // reading or waiting for its pull, compute, sending the pushes; a
  // periodic evaluation is not included). On the training thread.
  std::function<void(uint64_t examples, absl::Duration step_time)> on_trained;
  // For the scheduler's view of the job (its progress, time left and
  // curves), on the training thread. After each step: its examples, their
  // summed loss and how many examples that covers (0 and 0 for a step
  // whose loss was not finite), and the time the step waited for its pulls
  // (under BSP and SSP mostly the wait for slower workers).
  std::function<void(uint64_t examples, double loss_sum, uint64_t loss_examples,
                     absl::Duration pull_wait)>
      on_step_trained;
  // Batches in one epoch of the shard being trained (Dataset::
  // ExamplesPerPass over the batch size; 0 when not known): when a shard
  // starts and whenever the estimate changes.
  std::function<void(uint64_t batches)> on_shard_batches;
  // A metric measured at step `step`: each periodic evaluation's
  // "test_auc", "test_logloss" and "test_accuracy" (those the model has).
  std::function<void(const std::string& name, double value, uint64_t step)>
      on_metric;
  // A barrier across all workers of the job (the scheduler's). Without one
  // the workers other than rank 0 do not wait for its initial values. An
  // error ends training with it, unless stop() is true by then (preempted
  // while waiting).
  std::function<absl::Status(absl::string_view name)> barrier;
  // Reports `finished` (the final position of the shard this worker just
  // ended, done; null when asking again after WAIT) and asks for a shard to
  // train (ClaimShardResponse). May block for a while (a long poll); stop()
  // is checked between calls, so keep each call short enough for a prompt
  // exit. UNAVAILABLE and DEADLINE_EXCEEDED are retried, with `finished`
  // again; other errors end training. Without a claim hook the worker ends
  // after its first shard.
  std::function<absl::StatusOr<ClaimShardResponse>(
      const DataPosition* finished)>
      claim;
};

class Trainer {
 public:
  // Opens this worker's data and the compute device (training.device).
  // INVALID_ARGUMENT for a model that does not fit the data or the tables;
  // the data reader's errors; FAILED_PRECONDITION when device GPU is asked
  // for and none is usable.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const JobConfig& config, KVClient* client, uint32_t rank,
      uint32_t num_workers, Clock* clock = Clock::Real());

  // Trains the shards `shards` hands out, each from its position through
  // the remaining epochs of training.epochs, until it hands out no more
  // (every shard done, or a stop). Starts the cursor first: in a fresh job
  // rank 0 writes the initial dense values before the start barrier.
  // training.max_steps caps this worker's steps over all shards: reaching
  // it ends the shard being trained as done where it stands (the rest is
  // not trained, by anyone), and later assignments are reported done
  // without training (ShardCursor::Cap). Rank 0 evaluates every
  // training.eval_interval_steps of its own steps and appends each
  // evaluation to training.metrics_file.
  //
  // A stop (shards->stop_requested()) ends training promptly: after the
  // step in progress (its pushes acknowledged), while waiting at the start
  // barrier, or between requests for work; the result is then `preempted`
  // with the exact position to resume from. Ends with the clock at
  // kFinishedClock, so this worker never holds back the others'
  // synchronous waits.
  //
  // Errors: the cursor's (INVALID_ARGUMENT for a shard outside the job or
  // a claim answer that makes no sense); the data reader's, the servers'
  // and the hooks' errors; INTERNAL for a non-finite loss or gradient
  // (nothing of that step is pushed).
  absl::StatusOr<TrainResult> Train(ShardCursor* shards,
                                    const TrainerHooks& hooks);
  // Train over a cursor built from hooks.claim, hooks.barrier and
  // hooks.stop, starting with shard start->shard from *start (none: the
  // worker asks at once); without hooks.claim the worker ends after it.
  absl::StatusOr<TrainResult> Train(const TrainerHooks& hooks,
                                    std::optional<DataPosition> start);
  // Trains shard `rank` from its beginning (a job without failures).
  absl::StatusOr<TrainResult> Train(const TrainerHooks& hooks);

  // Keeps the dense table on this worker, synchronised with the other
  // workers by a ring all-reduce (worker/dense_ring.h), when the job's
  // dense table has sync ALLREDUCE; call before Train. `scheduler`: this
  // worker's registered client (not owned, outlives the trainer); `host`:
  // the address the other workers reach this one's ring at. The replica
  // starts from the model's initial dense values in a fresh job, and from
  // the servers' copy of the table (written when a checkpoint is cut and
  // when training ends) in a job that resumes; either way the ring's most
  // advanced member broadcasts its state when this worker joins. Without
  // this call a job whose dense table is all-reduced fails to train with
  // FAILED_PRECONDITION.
  absl::Status UseDenseRing(SchedulerClient* scheduler,
                            const std::string& host);
  // The all-reduced dense table (null when the servers hold it, and after
  // Train returns).
  const AllReducedTable* dense_ring() const { return ring_.get(); }

  // Scores the test data with the current server parameters.
  // FAILED_PRECONDITION when the job has no test data.
  absl::StatusOr<EvalResult> Evaluate();
  // Gives `eval`'s metrics, measured at step `step`, to hooks.on_metric.
  static void ReportMetrics(const TrainerHooks& hooks, const EvalResult& eval,
                            uint64_t step);

  // Appends one JSON line for `eval` to training.metrics_file (if set):
  // the step, `examples` this worker has trained, the wall time and the
  // seconds since Train() began, the training loss and the test metrics.
  // deploy/plot/plot_metrics.sh plots these files.
  absl::Status AppendMetrics(const EvalResult& eval, uint64_t step,
                             uint64_t examples, double train_loss) const;

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
          uint32_t num_workers, ModelLayout layout, Clock* clock);

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
  // Reads the next batch of `dataset` into `step`, maps its keys and (with
  // `pull`) sends the pulls of its parameters. false at the end of the pass.
  absl::StatusOr<bool> Load(data::Dataset* dataset, size_t batch_size,
                            Step* step, bool pull = true);
  // Sends the pulls of step->sparse.keys' rows and the dense table.
  void StartPull(Step* step);
  // Waits for them. Under BSP/SSP a pull may wait for slower workers: a
  // pull that times out is sent again a few times, with a log line each.
  absl::Status FinishPull(Step* step);
  // Rank 0 writes the initial dense values (the cursor's start barrier
  // follows).
  absl::Status Initialize();
  // The dense values a step computes with: the pulled ones, or the
  // all-reduced replica.
  const float* DenseValues(const Step& step) const;
  // The model's initial dense values (the table's initializer for models
  // whose layers start at zero).
  std::vector<float> InitialDense() const;
  // Writes the replica to the servers and leaves the ring (no-op without).
  absl::Status LeaveDenseRing();
  // The dense step of an all-reduced table: the all-reduce, and the clock
  // and the servers' copy around it (RunStep; DenseRingCopy::EndStep).
  struct ShardRun;
  absl::Status RingStep(ShardRun* run);
  // Joins the dense ring when this worker is not in one (no-op otherwise):
  // `together` (a fresh job's workers after the start barrier) waits for
  // every worker. Otherwise (a replacement, a resumed job, a worker back
  // from waiting for work) its clock reads finished while it waits
  // (DenseRingCopy::JoinRunning).
  absl::Status JoinDenseRing(bool together);

  // How TrainShard ended.
  enum class ShardEnd { kDone, kStopped, kCapped };
  // The state of the shard being trained, across its steps.
  struct ShardRun {
    const TrainerHooks* hooks = nullptr;
    std::function<bool()> stop;
    DataPosition at;  // the next batch to train
    // The previous step's pushes; waited for before the next step's
    // compute so at most one step of updates is in flight per worker.
    std::vector<Completion> in_flight;
    // That step's clock and next position: reported only once its pushes
    // are acknowledged, so a position never runs ahead of the servers.
    std::optional<std::pair<uint64_t, DataPosition>> unreported;
    absl::Time last_log = absl::InfinitePast();
    absl::Time last_nonfinite_log = absl::InfinitePast();
    uint64_t examples_at_log = 0;
    double window_loss = 0;
    uint64_t window_count = 0;
    double epoch_loss = 0;
    uint64_t epoch_count = 0;
    // The current step's wait for its pulls, and the non-finite steps
    // counted before it (TrainResult::nonfinite_steps).
    absl::Duration pull_wait;
    uint64_t nonfinite_before = 0;
    // The shard's batches per epoch last given to hooks->on_shard_batches.
    uint64_t shard_batches = 0;
  };
  // Tells hooks->on_shard_batches of a new estimate of the shard's size.
  void ReportShardBatches(ShardRun* run);

  // Trains shard from.shard from `from` until it is done, `stop` or
  // max_steps; adds to *result. Returns the position reached (done for
  // kDone) with every push acknowledged; *end says why it returned.
  absl::StatusOr<DataPosition> TrainShard(const std::function<bool()>& stop,
                                          const TrainerHooks& hooks,
                                          const DataPosition& from,
                                          TrainResult* result, ShardEnd* end);
  // The rest of the epoch run->at is in: kDone at its end.
  absl::StatusOr<ShardEnd> TrainEpoch(ShardRun* run, TrainResult* result);
  // Skips to batch at.batch() of the pass; false when the pass ends first.
  absl::StatusOr<bool> SkipTo(const DataPosition& at, uint64_t batch_size);
  // Waits for the previous step's pushes, then reports its progress.
  absl::Status Settle(ShardRun* run);
  // Forward and backward on `current`, then its pushes and clock advance.
  absl::Status RunStep(Step* current, ShardRun* run, TrainResult* result);
  // A non-finite loss or gradient: INTERNAL, or counted under CLIP.
  absl::Status CheckFinite(ShardRun* run, TrainResult* result);
  // Counts the step, logs, and evaluates on rank 0 when due.
  absl::Status AfterStep(size_t n, absl::Time step_start, ShardRun* run,
                         TrainResult* result);
  // The read statistics of every shard read, into *result.
  void AddReadStats(TrainResult* result);
  // Positions train_data_ at the start of a pass over `shard`.
  absl::Status OpenShard(uint32_t shard);
  // Progress after a step, reported once its pushes are acknowledged.
  static void Report(const TrainerHooks& hooks, uint64_t clock,
                     const DataPosition& position);

  const JobConfig config_;
  KVClient* const client_;
  const uint32_t rank_;
  const uint32_t num_workers_;
  const ModelLayout layout_;
  Clock* const clock_;
  uint32_t sparse_table_ = 0;
  bool sparse_tiered_ = false;  // the sparse table has a disk tier
  uint32_t dense_table_ = 0;
  // The dense table's config, and its replica when it is all-reduced, with
  // the servers' copy of it.
  const TableConfig* dense_config_ = nullptr;
  std::unique_ptr<AllReducedTable> ring_;
  std::optional<DenseRingCopy> ring_copy_;
  // The clock a worker waiting to join the ring will resume at (its clock
  // is finished meanwhile); what it tells the others as the source (read
  // by the ring's clock callback).
  std::atomic<uint64_t> paused_clock_{0};

  std::unique_ptr<Compute> compute_;
  std::string why_cpu_;
  std::unique_ptr<Model> model_;
  // The shard being read, and the stats of shards read before it.
  std::unique_ptr<data::Dataset> train_data_;
  uint32_t data_shard_ = 0;
  data::ReadStats earlier_read_;
  std::vector<std::string> earlier_bad_lines_;
  SparseIndexer indexer_;
  Step steps_[2];  // the current step and, with prefetch, the next
  Step eval_step_;
  ModelOutput output_;
  // When Train() began; the metrics file's "seconds" count from it.
  absl::Time train_began_ = absl::InfinitePast();
  // Rank 0's last periodic evaluation (training.eval_interval_s), or the
  // first step when there was none yet.
  absl::Time last_eval_ = absl::InfinitePast();
};

}  // namespace ps

#endif  // PS_WORKER_TRAINER_H_
