#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/initializer.h"
#include "common/logging.h"
#include "common/protocol.h"
#include "common/status.h"
#include "common/wire.h"
#include "worker/compute/compute_factory.h"
#include "worker/model_file.h"

namespace ps {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger =
      new std::shared_ptr<spdlog::logger>(GetLogger("trainer"));
  return *logger;
}

// As many "file:line: reason" reports as one reader keeps.
constexpr size_t kMaxBadLineReports = 100;

std::string JsonNumber(double v) {
  return std::isfinite(v) ? absl::StrFormat("%.6g", v) : "null";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const JobConfig& config, KVClient* client, uint32_t rank,
    uint32_t num_workers, Clock* clock) {
  // The config loader's rules: the model fits the data and the tables.
  PS_RETURN_IF_ERROR(ValidateJobConfig(config));
  PS_ASSIGN_OR_RETURN(ModelLayout layout, LayoutModel(config));
  const TrainingConfig& tr = config.training();
  std::unique_ptr<Trainer> t(
      new Trainer(config, client, rank, num_workers, std::move(layout), clock));
  PS_ASSIGN_OR_RETURN(const TableConfig* dense,
                      FindTable(t->config_, tr.dense_table()));
  t->dense_table_ = dense->id();
  t->dense_config_ = dense;
  if (t->layout_.sparse_dim > 0) {
    PS_ASSIGN_OR_RETURN(const TableConfig* sparse,
                        FindTable(config, tr.sparse_table()));
    t->sparse_table_ = sparse->id();
    t->sparse_tiered_ = sparse->sparse().has_disk_tier();
  }
  PS_ASSIGN_OR_RETURN(
      t->train_data_,
      data::OpenDataset(config.data(), data::Split::kTrain, rank, num_workers,
                        tr.batch_size(), tr.shard_by_batch()));
  PS_ASSIGN_OR_RETURN(
      t->compute_,
      CreateCompute(tr.device(), static_cast<int>(tr.threads()), &t->why_cpu_));
  PS_ASSIGN_OR_RETURN(t->model_, Model::Create(t->layout_, t->compute_.get()));
  return t;
}

Trainer::Trainer(const JobConfig& config, KVClient* client, uint32_t rank,
                 uint32_t num_workers, ModelLayout layout, Clock* clock)
    : config_(config),
      client_(client),
      rank_(rank),
      num_workers_(num_workers),
      layout_(std::move(layout)),
      clock_(clock) {}

void Trainer::StartPull(Step* step) {
  step->rows.resize(step->sparse.keys.size() * layout_.sparse_dim);
  step->dense.resize(layout_.dense_size);
  step->sparse_pull.reset();
  if (layout_.sparse_dim > 0) {
    step->sparse_pull =
        client_->Pull(sparse_table_, step->sparse.keys, step->rows.data());
  }
  step->dense_pull.reset();
  // An all-reduced table is read from this worker's replica.
  if (ring_ == nullptr) {
    step->dense_pull = client_->PullDense(dense_table_, 0, step->dense.size(),
                                          step->dense.data());
  }
}

const float* Trainer::DenseValues(const Step& step) const {
  return ring_ != nullptr ? ring_->values().data() : step.dense.data();
}

std::vector<float> Trainer::InitialDense() const {
  std::vector<float> init =
      InitialDenseParameters(layout_, config_.training().model().init_gain(),
                             config_.training().model().init_seed());
  const bool all_zero =
      std::all_of(init.begin(), init.end(), [](float v) { return v == 0; });
  // LR and FM start from the table's own initial values, as the servers
  // create them.
  if (all_zero) {
    InitializeValues(dense_config_->init(), dense_config_->id(), 0, 0,
                     init.size(), init.data());
  }
  return init;
}

absl::Status Trainer::UseDenseRing(SchedulerClient* scheduler,
                                   const std::string& host) {
  if (dense_config_->dense().sync() != DenseTableConfig::ALLREDUCE) {
    return absl::OkStatus();
  }
  PS_ASSIGN_OR_RETURN(DenseRingCopy copy,
                      DenseRingCopy::Create(config_, {dense_config_}));
  const uint64_t clock = client_->clock();
  AllReducedTable::Options options;
  options.table = *dense_config_;
  options.num_workers = config_.cluster().num_workers();
  options.allreduce = config_.allreduce();
  options.scheduler = scheduler;
  options.host = host;
  options.clock = [this] {
    const uint64_t clock = client_->clock();
    return clock < kFinishedClock ? clock : paused_clock_.load();
  };
  // A resumed job's replica is read from the servers just below.
  std::vector<float> values =
      clock > 0 ? std::vector<float>(layout_.dense_size) : InitialDense();
  PS_ASSIGN_OR_RETURN(ring_, AllReducedTable::Create(std::move(options),
                                                     std::move(values), clock));
  ring_copy_ = std::move(copy);
  if (clock > 0) {
    // A resumed job: the servers hold the table as the ring last wrote it
    // (restored from a checkpoint, or left by the workers before).
    PS_RETURN_IF_ERROR(
        ring_copy_->ReadServers(*client_, *ring_, /*with_state=*/true));
    Log()->info(
        "read the dense state from the servers at clock {} (digest "
        "{:016x})",
        clock, ring_->Digest());
  }
  return absl::OkStatus();
}

absl::Status Trainer::RingStep(ShardRun* run) {
  // No server clips an all-reduced gradient: CLIP (CheckFinite let it
  // through) drops the non-finite elements here, on every worker alike.
  for (float& g : output_.dense_grad) {
    if (!std::isfinite(g)) g = 0;
  }
  // The all-reduce overlaps with the sparse push in flight.
  return ring_copy_->EndStep(*client_, *ring_, output_.dense_grad, [&] {
    run->in_flight.push_back(client_->AdvanceClock());
  });
}

absl::Status Trainer::JoinDenseRing(bool together) {
  if (ring_ == nullptr || ring_->connected()) return absl::OkStatus();
  if (together) return ring_->Join(num_workers_);
  const uint64_t before = client_->clock();
  PS_RETURN_IF_ERROR(DenseRingCopy::JoinRunning(
      *client_, *ring_, paused_clock_, [&](uint64_t resume) {
        if (resume != before) {
          Log()->info("resuming at the dense ring's clock {} (was at {})",
                      resume, before);
        }
        return client_->RestartClock(resume).Wait();
      }));
  return absl::OkStatus();
}

absl::Status Trainer::LeaveDenseRing() {
  if (ring_ == nullptr) return absl::OkStatus();
  // The servers keep the table for export, evaluation and a resumed job:
  // the replicas are equal at equal steps, and the member that trains
  // longest writes last.
  PS_RETURN_IF_ERROR(ring_copy_->WriteServers(*client_, *ring_));
  Log()->info(
      "wrote the dense state on leaving the ring at step {}, clock {} "
      "(digest {:016x})",
      ring_->step(), client_->clock(), ring_->Digest());
  return ring_->Leave();
}

absl::Status Trainer::FinishPull(Step* step) {
  // Under BSP/SSP the servers hold a pull until slower workers catch up,
  // which may take longer than a request timeout: such a pull is asked
  // again, up to 20 times. Under ASYNC nothing holds a pull, so one that is
  // not answered in time means the server cannot be reached: the worker
  // fails at once (within cluster.request_timeout_ms, as documented) and
  // its shard goes on elsewhere, rather than hanging 20 timeouts long.
  const int kAttempts = client_->consistency_mode() == ASYNC ? 1 : 20;
  for (int attempt = 1;; ++attempt) {
    const absl::Status s =
        step->sparse_pull ? step->sparse_pull->Wait() : absl::OkStatus();
    const absl::Status d =
        step->dense_pull ? step->dense_pull->Wait() : absl::OkStatus();
    if (s.ok() && d.ok()) return absl::OkStatus();
    const absl::Status& err = s.ok() ? d : s;
    if (err.code() != absl::StatusCode::kDeadlineExceeded ||
        attempt == kAttempts) {
      return err;
    }
    // Pulls are idempotent. Under BSP/SSP the servers hold a pull until
    // slower workers catch up, and their watchdog names those workers.
    Log()->warn(
        "pull at clock {} not answered in time (attempt {} of {}); asking "
        "again",
        client_->clock(), attempt, kAttempts);
    StartPull(step);
  }
}

absl::StatusOr<bool> Trainer::Load(data::Dataset* dataset, size_t batch_size,
                                   Step* step, bool pull) {
  PS_ASSIGN_OR_RETURN(step->n, dataset->Next(batch_size, &step->batch));
  if (step->n == 0) return false;
  PS_RETURN_IF_ERROR(indexer_.Index(layout_, step->batch, &step->sparse));
  if (pull) StartPull(step);
  return true;
}

absl::Status Trainer::Initialize() {
  // Every replica of an all-reduced table starts from the same values.
  if (ring_ != nullptr) return absl::OkStatus();
  const std::vector<float> init =
      InitialDenseParameters(layout_, config_.training().model().init_gain(),
                             config_.training().model().init_seed());
  const bool all_zero =
      std::all_of(init.begin(), init.end(), [](float v) { return v == 0; });
  // LR and FM start from the tables' own initial values.
  if (all_zero) return absl::OkStatus();
  if (rank_ == 0) {
    PS_RETURN_IF_ERROR(client_->AssignDense(dense_table_, 0, init).Wait());
    Log()->info("wrote {} initial dense parameters", init.size());
  }
  return absl::OkStatus();
}

void Trainer::Report(const TrainerHooks& hooks, uint64_t clock,
                     const DataPosition& position) {
  if (hooks.on_step) hooks.on_step(clock, position);
  if (hooks.on_clock) hooks.on_clock(clock);
}

absl::Status Trainer::OpenShard(uint32_t shard) {
  if (train_data_ != nullptr && data_shard_ == shard) {
    return train_data_->Rewind();
  }
  if (train_data_ != nullptr) {
    const data::ReadStats r = train_data_->stats();
    earlier_read_.lines += r.lines;
    earlier_read_.examples += r.examples;
    earlier_read_.bad_lines += r.bad_lines;
    earlier_read_.bytes += r.bytes;
    for (std::string& line : train_data_->bad_line_reports()) {
      if (earlier_bad_lines_.size() >= kMaxBadLineReports) break;
      earlier_bad_lines_.push_back(std::move(line));
    }
    train_data_.reset();
  }
  const TrainingConfig& tr = config_.training();
  PS_ASSIGN_OR_RETURN(
      train_data_,
      data::OpenDataset(config_.data(), data::Split::kTrain, shard,
                        num_workers_, tr.batch_size(), tr.shard_by_batch()));
  data_shard_ = shard;
  return absl::OkStatus();
}

absl::StatusOr<bool> Trainer::SkipTo(const DataPosition& at,
                                     uint64_t batch_size) {
  if (at.batch() == 0) return true;
  // Every batch but an epoch's last holds batch_size examples, so batch b
  // starts at example b * batch_size of the pass.
  const uint64_t skip = at.batch() > UINT64_MAX / batch_size
                            ? UINT64_MAX
                            : at.batch() * batch_size;
  PS_ASSIGN_OR_RETURN(const uint64_t skipped, train_data_->Skip(skip));
  return skipped >= skip;  // false: the position was this epoch's end
}

absl::Status Trainer::Settle(ShardRun* run) {
  for (const Completion& push : run->in_flight) PS_RETURN_IF_ERROR(push.Wait());
  run->in_flight.clear();
  if (run->unreported) {
    Report(*run->hooks, run->unreported->first, run->unreported->second);
    run->unreported.reset();
  }
  return absl::OkStatus();
}

absl::Status Trainer::CheckFinite(ShardRun* run, TrainResult* result) {
  if (std::isfinite(output_.loss_sum) && AllFinite(output_.dense_grad) &&
      AllFinite(output_.sparse_grad)) {
    return absl::OkStatus();
  }
  const GradientPolicy& policy = config_.data_plane().gradients();
  if (policy.nonfinite() != GradientPolicy::CLIP) {
    // Pushing would spread the NaN to every worker through the servers.
    return absl::InternalError(absl::StrCat(
        "worker rank ", rank_, ", step ", result->steps + 1,
        ": the loss or a gradient is not finite (learning rate too "
        "large?); nothing of this step was pushed (data_plane.gradients."
        "nonfinite CLIP would let the servers clip it instead)"));
  }
  // The servers clip what is pushed (and count it by worker); the loss of
  // this step is left out of the averages.
  const absl::Time now = clock_->Now();
  if (result->nonfinite_steps++ == 0 ||
      now - run->last_nonfinite_log >= absl::Seconds(10)) {
    Log()->warn(
        "worker rank {}: step {} has a non-finite loss or gradient ({} such "
        "steps "
        "so far); pushed for the servers to clip (data_plane.gradients CLIP)",
        rank_, result->steps + 1, result->nonfinite_steps);
    run->last_nonfinite_log = now;
  }
  if (!std::isfinite(output_.loss_sum)) output_.loss_sum = 0;
  return absl::OkStatus();
}

absl::Status Trainer::RunStep(Step* current, ShardRun* run,
                              TrainResult* result) {
  PS_RETURN_IF_ERROR(model_->Run(current->batch, current->sparse,
                                 current->rows.data(), DenseValues(*current),
                                 /*backward=*/true, &output_));
  PS_RETURN_IF_ERROR(CheckFinite(run, result));
  if (layout_.sparse_dim > 0 && !current->sparse.keys.empty()) {
    run->in_flight.push_back(client_->Push(sparse_table_, current->sparse.keys,
                                           output_.sparse_grad));
  }
  if (ring_ != nullptr) {
    PS_RETURN_IF_ERROR(RingStep(run));
  } else {
    run->in_flight.push_back(
        client_->PushDense(dense_table_, 0, output_.dense_grad));
    // The step ends after its pushes; servers receive this after them.
    run->in_flight.push_back(client_->AdvanceClock());
  }
  run->at.set_batch(run->at.batch() + 1);
  run->unreported.emplace(client_->clock(), run->at);
  return absl::OkStatus();
}

absl::Status Trainer::AfterStep(size_t n, absl::Time step_start, ShardRun* run,
                                TrainResult* result) {
  const TrainingConfig& tr = config_.training();
  run->epoch_loss += output_.loss_sum;
  run->window_loss += output_.loss_sum;
  run->epoch_count += n;
  run->window_count += n;
  result->examples += n;
  ++result->steps;
  const absl::Time now = clock_->Now();
  if (run->hooks->on_trained) run->hooks->on_trained(n, now - step_start);
  if (run->hooks->on_step_trained) {
    const bool finite = result->nonfinite_steps == run->nonfinite_before;
    run->hooks->on_step_trained(n, finite ? output_.loss_sum : 0,
                                finite ? n : 0, run->pull_wait);
  }
  ReportShardBatches(run);
  if (now - run->last_log >= absl::Seconds(tr.log_interval_s())) {
    Log()->info(
        "shard {} epoch {} step {}: {} examples, {:.0f} examples/s, loss "
        "{:.4f}",
        run->at.shard(), run->at.epoch(), result->steps, result->examples,
        (result->examples - run->examples_at_log) /
            absl::ToDoubleSeconds(now - run->last_log),
        run->window_loss / std::max<uint64_t>(run->window_count, 1));
    run->last_log = now;
    run->examples_at_log = result->examples;
    run->window_loss = 0;
    run->window_count = 0;
  }
  if (rank_ != 0) return absl::OkStatus();
  const bool by_steps = tr.eval_interval_steps() > 0 &&
                        result->steps % tr.eval_interval_steps() == 0;
  const bool by_time = tr.eval_interval_s() > 0 &&
                       now - last_eval_ >= absl::Seconds(tr.eval_interval_s());
  if (last_eval_ == absl::InfinitePast()) last_eval_ = now;
  if (!by_steps && !by_time) return absl::OkStatus();
  PS_RETURN_IF_ERROR(Settle(run));
  absl::StatusOr<EvalResult> eval = Evaluate();
  // The interval counts from the end of an evaluation, so a slow one does
  // not leave training no time in between.
  last_eval_ = clock_->Now();
  if (eval.ok()) {
    Log()->info("step {}: {}", result->steps, Describe(*eval));
    ReportMetrics(*run->hooks, *eval, client_->clock());
    return AppendMetrics(
        *eval, result->steps, result->examples,
        run->epoch_loss / std::max<uint64_t>(run->epoch_count, 1));
  }
  if (eval.status().code() == absl::StatusCode::kFailedPrecondition)
    return absl::OkStatus();
  return eval.status();
}

void Trainer::ReportShardBatches(ShardRun* run) {
  if (!run->hooks->on_shard_batches) return;
  const std::optional<uint64_t> examples = train_data_->ExamplesPerPass();
  const uint64_t batch = config_.training().batch_size();
  const uint64_t batches =
      examples.has_value() && batch > 0 ? (*examples + batch - 1) / batch : 0;
  if (batches == run->shard_batches) return;
  run->shard_batches = batches;
  run->hooks->on_shard_batches(batches);
}

void Trainer::ReportMetrics(const TrainerHooks& hooks, const EvalResult& eval,
                            uint64_t step) {
  if (!hooks.on_metric) return;
  // What the model does not have is NaN (EvalResult).
  if (std::isfinite(eval.auc)) hooks.on_metric("test_auc", eval.auc, step);
  if (std::isfinite(eval.logloss))
    hooks.on_metric("test_logloss", eval.logloss, step);
  if (std::isfinite(eval.accuracy))
    hooks.on_metric("test_accuracy", eval.accuracy, step);
}

absl::StatusOr<Trainer::ShardEnd> Trainer::TrainEpoch(ShardRun* run,
                                                      TrainResult* result) {
  const TrainingConfig& tr = config_.training();
  const uint64_t max_steps = tr.max_steps();
  // With prefetching, the step after the current one is read and its pull
  // sent before the current step is computed.
  Step* current = &steps_[0];
  Step* next = &steps_[1];
  bool next_loaded = false;
  // Fetch ahead (a sparse table with a disk tier): the next step's batch
  // is read and its keys sent as a PREFETCH, its pull not yet.
  bool next_read = false;
  ShardEnd end = ShardEnd::kDone;
  while (true) {
    const absl::Time step_start = clock_->Now();
    const bool stop = run->stop();
    if (stop || (max_steps > 0 && result->steps >= max_steps)) {
      Log()->info("{} after {} steps",
                  stop ? "stop requested" : "training.max_steps reached",
                  result->steps);
      end = stop ? ShardEnd::kStopped : ShardEnd::kCapped;
      break;
    }
    if (next_loaded) {
      std::swap(current, next);
      next_loaded = false;
    } else if (next_read) {
      std::swap(current, next);
      next_read = false;
      StartPull(current);
    } else {
      // Reading overlaps with the previous step's pushes. Requests to one
      // server are applied in order, so this pull sees the previous step's
      // push without waiting for its acknowledgement first.
      PS_ASSIGN_OR_RETURN(bool loaded,
                          Load(train_data_.get(), tr.batch_size(), current));
      if (!loaded) break;
    }
    // The batch's inputs go to the device while its pull is in flight.
    PS_RETURN_IF_ERROR(model_->Prepare(current->batch, current->sparse));
    if (sparse_tiered_ && !tr.prefetch()) {
      // The servers read the next batch's cold rows from disk while this
      // step computes, so its pull finds them in RAM. A hint only: the
      // values the step sees are the same in every consistency mode.
      PS_ASSIGN_OR_RETURN(next_read, Load(train_data_.get(), tr.batch_size(),
                                          next, /*pull=*/false));
      if (next_read && !next->sparse.keys.empty())
        (void)client_->Prefetch(sparse_table_, next->sparse.keys);
    }
    const absl::Time wait_start = clock_->Now();
    PS_RETURN_IF_ERROR(FinishPull(current));
    run->pull_wait = clock_->Now() - wait_start;
    if (tr.prefetch()) {
      // Sent before this step's push: the next step's parameters miss this
      // worker's own last update (ASYNC only, by config).
      PS_ASSIGN_OR_RETURN(next_loaded,
                          Load(train_data_.get(), tr.batch_size(), next));
    }
    PS_RETURN_IF_ERROR(Settle(run));
    run->nonfinite_before = result->nonfinite_steps;
    PS_RETURN_IF_ERROR(RunStep(current, run, result));
    PS_RETURN_IF_ERROR(AfterStep(current->n, step_start, run, result));
  }
  if (next_loaded) {
    // Stopped with a prefetched step: let its pull finish (its buffers are
    // reused), it is simply not trained on.
    (void)FinishPull(next);
  }
  return end;
}

absl::StatusOr<DataPosition> Trainer::TrainShard(
    const std::function<bool()>& stop, const TrainerHooks& hooks,
    const DataPosition& from, TrainResult* result, ShardEnd* end) {
  const TrainingConfig& tr = config_.training();
  *end = ShardEnd::kDone;
  ShardRun run;
  run.hooks = &hooks;
  run.stop = stop;
  run.at = from;  // the next batch to train
  if (from.done() || from.epoch() >= tr.epochs()) {
    Log()->info("shard {} is already done (epoch {} of {})", from.shard(),
                from.epoch(), tr.epochs());
    run.at.set_done(true);
    return run.at;
  }
  Log()->info("training shard {} from epoch {} batch {} at clock {}",
              from.shard(), from.epoch(), from.batch(), client_->clock());
  if (tr.batch_size() == 0) {
    // The config loader fills in the default; a hand-built config may not.
    return absl::InvalidArgumentError("training.batch_size must be > 0");
  }
  PS_RETURN_IF_ERROR(OpenShard(from.shard()));
  PS_RETURN_IF_ERROR(JoinDenseRing(false));
  ReportShardBatches(&run);
  run.last_log = clock_->Now();
  run.examples_at_log = result->examples;
  DataPosition& at = run.at;
  for (; at.epoch() < tr.epochs();
       at.set_epoch(at.epoch() + 1), at.set_batch(0)) {
    if (at.epoch() != from.epoch()) PS_RETURN_IF_ERROR(train_data_->Rewind());
    PS_ASSIGN_OR_RETURN(const bool within, SkipTo(at, tr.batch_size()));
    if (!within) continue;
    run.epoch_loss = 0;
    run.epoch_count = 0;
    PS_ASSIGN_OR_RETURN(*end, TrainEpoch(&run, result));
    if (run.epoch_count > 0) {
      result->mean_loss = run.epoch_loss / run.epoch_count;
      Log()->info("shard {} epoch {} {}: mean training loss {:.4f}", at.shard(),
                  at.epoch(),
                  *end == ShardEnd::kDone
                      ? std::string("done")
                      : absl::StrCat("stopped before batch ", at.batch()),
                  result->mean_loss);
    }
    if (*end != ShardEnd::kDone) break;  // before the loop moves `at` on
  }
  PS_RETURN_IF_ERROR(Settle(&run));
  if (*end == ShardEnd::kDone) {
    at.set_epoch(tr.epochs());
    at.set_batch(0);
  }
  // max_steps ends this worker's part of the job where it stands.
  at.set_done(*end != ShardEnd::kStopped);
  return at;
}

absl::StatusOr<TrainResult> Trainer::Train(const TrainerHooks& hooks) {
  DataPosition own;
  own.set_shard(rank_);
  return Train(hooks, own);
}

absl::StatusOr<TrainResult> Trainer::Train(const TrainerHooks& hooks,
                                           std::optional<DataPosition> start) {
  ShardCursor::Job job;
  job.barrier = hooks.barrier;
  job.claim = hooks.claim;
  job.stop = hooks.stop;
  job.restart = [this](uint64_t clock) {
    return client_->RestartClock(clock).Wait();
  };
  ShardCursor::Options options;
  options.num_shards = num_workers_;
  options.start_clock = client_->clock();
  options.initial = std::move(start);
  options.clock = clock_;
  ShardCursor shards(std::move(job), std::move(options));
  return Train(&shards, hooks);
}

absl::StatusOr<TrainResult> Trainer::Train(ShardCursor* shards,
                                           const TrainerHooks& hooks) {
  const TrainingConfig& tr = config_.training();
  Log()->info(
      "training {} ({} dense parameters, sparse rows of {}) on {}, batch {}, "
      "{} epoch(s), {}",
      ModelConfig::Kind_Name(layout_.kind), layout_.dense_size,
      layout_.sparse_dim, compute_->name(), tr.batch_size(), tr.epochs(),
      ConsistencyMode_Name(config_.consistency().mode()));
  if (!why_cpu_.empty()) Log()->info("no GPU: {}", why_cpu_);
  TrainResult result;
  result.start_clock = client_->clock();
  const absl::Time began = clock_->Now();
  train_began_ = began;
  if (result.start_clock > 0) {
    // Writing initial values now would wipe out what the job learned.
    Log()->info(
        "joining at clock {}: training from the servers' current parameters",
        result.start_clock);
  }
  if (ring_ == nullptr &&
      dense_config_->dense().sync() == DenseTableConfig::ALLREDUCE) {
    return absl::FailedPreconditionError(
        "the dense table is all-reduced (sync ALLREDUCE) but the trainer "
        "was given no scheduler for the ring (Trainer::UseDenseRing)");
  }
  PS_RETURN_IF_ERROR(shards->Start([this] { return Initialize(); }));
  // Workers starting a job together form the first ring together. One
  // joining a running job joins before each shard it trains (TrainShard),
  // and receives the dense state from the ring then.
  if (result.start_clock == 0) PS_RETURN_IF_ERROR(JoinDenseRing(true));
  const std::function<bool()> stop = [shards] {
    return shards->stop_requested();
  };
  while (true) {
    PS_ASSIGN_OR_RETURN(std::optional<DataPosition> shard, shards->Next());
    if (!shard) break;  // every shard done, or stopped
    result.shards.push_back(shard->shard());
    ShardEnd end;
    PS_ASSIGN_OR_RETURN(DataPosition at,
                        TrainShard(stop, hooks, *shard, &result, &end));
    // Out of the ring while it has no work: the others go on without it.
    // Its copy of the table is written before its clock is finished, so a
    // checkpoint cut once every worker has finished holds it.
    PS_RETURN_IF_ERROR(LeaveDenseRing());
    // Idle from here until the next shard, if any: never hold back the
    // others' synchronous waits.
    PS_RETURN_IF_ERROR(client_->AdvanceClockTo(kFinishedClock).Wait());
    Report(hooks, kFinishedClock, at);
    shards->Ended(at);
    if (end == ShardEnd::kCapped) shards->Cap();
  }
  result.preempted = shards->stopped();
  result.position = shards->position();
  // From here on (evaluation, export) the servers' copy is the table: this
  // worker's replica may be behind the last worker's.
  ring_.reset();
  // Never hold back the others' synchronous waits from now on.
  PS_RETURN_IF_ERROR(client_->AdvanceClockTo(kFinishedClock).Wait());
  result.seconds = absl::ToDoubleSeconds(clock_->Now() - began);
  AddReadStats(&result);
  return result;
}

void Trainer::AddReadStats(TrainResult* result) {
  result->read = earlier_read_;
  result->bad_lines = earlier_bad_lines_;
  if (train_data_ != nullptr) {
    const data::ReadStats r = train_data_->stats();
    result->read.lines += r.lines;
    result->read.examples += r.examples;
    result->read.bad_lines += r.bad_lines;
    result->read.bytes += r.bytes;
    for (std::string& line : train_data_->bad_line_reports()) {
      if (result->bad_lines.size() >= kMaxBadLineReports) break;
      result->bad_lines.push_back(std::move(line));
    }
  }
  if (result->read.bad_lines > 0) {
    Log()->warn("skipped {} malformed line(s) of {} read",
                result->read.bad_lines, result->read.lines);
  }
}

absl::StatusOr<EvalResult> Trainer::Evaluate() {
  if (config_.data().has_files() &&
      config_.data().files().test_files().empty()) {
    return absl::FailedPreconditionError("data.files.test_files is empty");
  }
  PS_ASSIGN_OR_RETURN(
      std::unique_ptr<data::Dataset> test,
      data::OpenDataset(config_.data(), data::Split::kTest, 0, 1, 8192, false));
  constexpr size_t kEvalBatch = 8192;
  EvalAccumulator scores(layout_.kind == ModelConfig::MLP
                             ? static_cast<int>(layout_.top.back().out)
                             : 1);
  Step& step = eval_step_;
  while (true) {
    PS_ASSIGN_OR_RETURN(bool loaded, Load(test.get(), kEvalBatch, &step));
    if (!loaded) break;
    PS_RETURN_IF_ERROR(FinishPull(&step));
    PS_RETURN_IF_ERROR(model_->Run(step.batch, step.sparse, step.rows.data(),
                                   DenseValues(step), /*backward=*/false,
                                   &output_));
    scores.Add(step.batch, output_);
  }
  return scores.Result();
}

absl::Status Trainer::AppendMetrics(const EvalResult& eval, uint64_t step,
                                    uint64_t examples,
                                    double train_loss) const {
  const std::string& path = config_.training().metrics_file();
  if (path.empty()) return absl::OkStatus();
  std::ofstream out(path, std::ios::app);
  out << absl::StrCat(
      "{\"step\":", step, ",\"rank\":", rank_, ",\"examples\":", examples,
      ",\"time\":",
      JsonNumber(absl::ToDoubleSeconds(clock_->Now() - absl::UnixEpoch())),
      ",\"seconds\":",
      JsonNumber(train_began_ == absl::InfinitePast()
                     ? 0.0
                     : absl::ToDoubleSeconds(clock_->Now() - train_began_)),
      ",\"train_loss\":", JsonNumber(train_loss),
      ",\"test_examples\":", eval.examples,
      ",\"test_auc\":", JsonNumber(eval.auc),
      ",\"test_logloss\":", JsonNumber(eval.logloss),
      ",\"test_accuracy\":", JsonNumber(eval.accuracy), "}\n");
  out.flush();
  if (!out) {
    return absl::UnavailableError(
        absl::StrCat("cannot append to training.metrics_file ", path));
  }
  return absl::OkStatus();
}

absl::Status Trainer::Export(const std::string& path) {
  SavedModel saved;
  saved.config = config_;
  saved.dense.resize(layout_.dense_size);
  PS_RETURN_IF_ERROR(
      client_
          ->PullDense(dense_table_, 0, saved.dense.size(), saved.dense.data())
          .Wait());

  if (layout_.sparse_dim > 0) {
    PS_RETURN_IF_ERROR(
        client_->ScanAll(sparse_table_, &saved.keys, &saved.rows));
  }
  PS_RETURN_IF_ERROR(SaveModel(path, saved));
  Log()->info("saved the model to {}: {} dense parameters, {} sparse rows",
              path, saved.dense.size(), saved.keys.size());
  return absl::OkStatus();
}

}  // namespace ps
