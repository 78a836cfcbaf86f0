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
#include "absl/time/clock.h"
#include "common/config.h"
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
    uint32_t num_workers) {
  // The config loader's rules: the model fits the data and the tables.
  PS_RETURN_IF_ERROR(ValidateJobConfig(config));
  PS_ASSIGN_OR_RETURN(ModelLayout layout, LayoutModel(config));
  const TrainingConfig& tr = config.training();
  std::unique_ptr<Trainer> t(
      new Trainer(config, client, rank, num_workers, std::move(layout)));
  PS_ASSIGN_OR_RETURN(const TableConfig* dense, FindTable(config, tr.dense_table()));
  t->dense_table_ = dense->id();
  if (t->layout_.sparse_dim > 0) {
    PS_ASSIGN_OR_RETURN(const TableConfig* sparse,
                        FindTable(config, tr.sparse_table()));
    t->sparse_table_ = sparse->id();
  }
  PS_ASSIGN_OR_RETURN(
      t->train_data_,
      data::OpenDataset(config.data(), data::Split::kTrain, rank, num_workers,
                        tr.batch_size(), tr.shard_by_batch()));
  PS_ASSIGN_OR_RETURN(t->compute_,
                      CreateCompute(tr.device(), static_cast<int>(tr.threads()),
                                    &t->why_cpu_));
  PS_ASSIGN_OR_RETURN(t->model_, Model::Create(t->layout_, t->compute_.get()));
  return t;
}

Trainer::Trainer(const JobConfig& config, KVClient* client, uint32_t rank,
                 uint32_t num_workers, ModelLayout layout)
    : config_(config),
      client_(client),
      rank_(rank),
      num_workers_(num_workers),
      layout_(std::move(layout)) {}

void Trainer::StartPull(Step* step) {
  step->rows.resize(step->sparse.keys.size() * layout_.sparse_dim);
  step->dense.resize(layout_.dense_size);
  step->sparse_pull.reset();
  if (layout_.sparse_dim > 0) {
    step->sparse_pull =
        client_->Pull(sparse_table_, step->sparse.keys, step->rows.data());
  }
  step->dense_pull = client_->PullDense(dense_table_, 0, step->dense.size(),
                                        step->dense.data());
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
    const absl::Status d = step->dense_pull->Wait();
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
                                   Step* step) {
  PS_ASSIGN_OR_RETURN(step->n, dataset->Next(batch_size, &step->batch));
  if (step->n == 0) return false;
  PS_RETURN_IF_ERROR(indexer_.Index(layout_, step->batch, &step->sparse));
  StartPull(step);
  return true;
}

absl::Status Trainer::Initialize(const TrainerHooks& hooks) {
  const std::vector<float> init = InitialDenseParameters(
      layout_, config_.training().model().init_gain(),
      config_.training().model().init_seed());
  const bool all_zero =
      std::all_of(init.begin(), init.end(), [](float v) { return v == 0; });
  // LR and FM start from the tables' own initial values.
  if (all_zero) return absl::OkStatus();
  if (rank_ == 0) {
    PS_RETURN_IF_ERROR(client_->AssignDense(dense_table_, 0, init).Wait());
    Log()->info("wrote {} initial dense parameters", init.size());
  }
  if (hooks.barrier && num_workers_ > 1) {
    PS_RETURN_IF_ERROR(hooks.barrier("dense_init"));
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

absl::StatusOr<DataPosition> Trainer::TrainShard(const TrainerHooks& hooks,
                                                 const DataPosition& from,
                                                 TrainResult* result,
                                                 ShardEnd* end) {
  const TrainingConfig& tr = config_.training();
  *end = ShardEnd::kDone;
  DataPosition at = from;  // the next batch to train
  if (from.done() || from.epoch() >= tr.epochs()) {
    Log()->info("shard {} is already done (epoch {} of {})", from.shard(),
                from.epoch(), tr.epochs());
    at.set_done(true);
    return at;
  }
  Log()->info("training shard {} from epoch {} batch {} at clock {}",
              from.shard(), from.epoch(), from.batch(), client_->clock());
  const uint64_t batch_size = tr.batch_size();
  if (batch_size == 0) {
    // The config loader fills in the default; a hand-built config may not.
    return absl::InvalidArgumentError("training.batch_size must be > 0");
  }
  PS_RETURN_IF_ERROR(OpenShard(from.shard()));
  const uint64_t max_steps = tr.max_steps();
  const absl::Duration log_every = absl::Seconds(tr.log_interval_s());
  absl::Time last_log = absl::Now();
  absl::Time last_nonfinite_log = absl::InfinitePast();
  uint64_t examples_at_log = result->examples;
  double window_loss = 0;
  uint64_t window_count = 0;
  // The previous step's pushes; waited for before the next step's compute
  // so at most one step of updates is in flight per worker.
  std::vector<Completion> in_flight;
  // That step's clock and next position: reported only once its pushes
  // are acknowledged, so a position never runs ahead of the servers.
  std::optional<std::pair<uint64_t, DataPosition>> unreported;
  auto settle = [&]() -> absl::Status {
    for (const Completion& push : in_flight) PS_RETURN_IF_ERROR(push.Wait());
    in_flight.clear();
    if (unreported) {
      Report(hooks, unreported->first, unreported->second);
      unreported.reset();
    }
    return absl::OkStatus();
  };
  // With prefetching, the step after the current one is read and its pull
  // sent before the current step is computed.
  const bool prefetch = tr.prefetch();
  Step* current = &steps_[0];
  Step* next = &steps_[1];
  for (; at.epoch() < tr.epochs(); at.set_epoch(at.epoch() + 1), at.set_batch(0)) {
    if (at.epoch() != from.epoch()) PS_RETURN_IF_ERROR(train_data_->Rewind());
    if (at.batch() > 0) {
      // Every batch but an epoch's last holds batch_size examples, so
      // batch b starts at example b * batch_size of the pass.
      const uint64_t skip = at.batch() > UINT64_MAX / batch_size
                                ? UINT64_MAX
                                : at.batch() * batch_size;
      PS_ASSIGN_OR_RETURN(const uint64_t skipped, train_data_->Skip(skip));
      if (skipped < skip) continue;  // the position was this epoch's end
    }
    double epoch_loss = 0;
    uint64_t epoch_count = 0;
    bool next_loaded = false;
    while (true) {
      const absl::Time step_start = absl::Now();
      const bool stop = hooks.stop && hooks.stop();
      if (stop || (max_steps > 0 && result->steps >= max_steps)) {
        Log()->info("{} after {} steps",
                    stop ? "stop requested" : "training.max_steps reached",
                    result->steps);
        *end = stop ? ShardEnd::kStopped : ShardEnd::kCapped;
        break;
      }
      if (next_loaded) {
        std::swap(current, next);
        next_loaded = false;
      } else {
        // Reading overlaps with the previous step's pushes. Requests to one
        // server are applied in order, so this pull sees the previous
        // step's push without waiting for its acknowledgement first.
        PS_ASSIGN_OR_RETURN(bool loaded,
                            Load(train_data_.get(), batch_size, current));
        if (!loaded) break;
      }
      // The batch's inputs go to the device while its pull is in flight.
      PS_RETURN_IF_ERROR(model_->Prepare(current->batch, current->sparse));
      PS_RETURN_IF_ERROR(FinishPull(current));
      if (prefetch) {
        // Sent before this step's push: the next step's parameters miss
        // this worker's own last update (ASYNC only, by config).
        PS_ASSIGN_OR_RETURN(next_loaded,
                            Load(train_data_.get(), batch_size, next));
      }
      PS_RETURN_IF_ERROR(settle());

      const size_t n = current->n;
      PS_RETURN_IF_ERROR(model_->Run(current->batch, current->sparse,
                                     current->rows.data(), current->dense.data(),
                                     /*backward=*/true, &output_));
      if (!std::isfinite(output_.loss_sum) || !AllFinite(output_.dense_grad) ||
          !AllFinite(output_.sparse_grad)) {
        const GradientPolicy& policy = config_.data_plane().gradients();
        if (policy.nonfinite() != GradientPolicy::CLIP) {
          // Pushing would spread the NaN to every worker through the servers.
          return absl::InternalError(absl::StrCat(
              "worker rank ", rank_, ", step ", result->steps + 1,
              ": the loss or a gradient is not finite (learning rate too "
              "large?); nothing of this step was pushed (data_plane.gradients."
              "nonfinite CLIP would let the servers clip it instead)"));
        }
        // The servers clip what is pushed (and count it by worker); the
        // loss of this step is left out of the averages.
        if (result->nonfinite_steps++ == 0 || absl::Now() - last_nonfinite_log >= absl::Seconds(10)) {
          Log()->warn("worker rank {}: step {} has a non-finite loss or gradient ({} such steps "
                      "so far); pushed for the servers to clip (data_plane.gradients CLIP)",
                      rank_, result->steps + 1, result->nonfinite_steps);
          last_nonfinite_log = absl::Now();
        }
        if (!std::isfinite(output_.loss_sum)) output_.loss_sum = 0;
      }
      if (layout_.sparse_dim > 0 && !current->sparse.keys.empty()) {
        in_flight.push_back(client_->Push(sparse_table_, current->sparse.keys,
                                          output_.sparse_grad));
      }
      in_flight.push_back(
          client_->PushDense(dense_table_, 0, output_.dense_grad));
      // The step ends after its pushes; servers receive this after them.
      in_flight.push_back(client_->AdvanceClock());
      at.set_batch(at.batch() + 1);
      unreported.emplace(client_->clock(), at);

      epoch_loss += output_.loss_sum;
      window_loss += output_.loss_sum;
      epoch_count += n;
      window_count += n;
      result->examples += n;
      ++result->steps;
      const absl::Time now = absl::Now();
      if (hooks.on_trained) hooks.on_trained(n, now - step_start);
      if (now - last_log >= log_every) {
        Log()->info(
            "shard {} epoch {} step {}: {} examples, {:.0f} examples/s, loss "
            "{:.4f}",
            at.shard(), at.epoch(), result->steps, result->examples,
            (result->examples - examples_at_log) /
                absl::ToDoubleSeconds(now - last_log),
            window_loss / std::max<uint64_t>(window_count, 1));
        last_log = now;
        examples_at_log = result->examples;
        window_loss = 0;
        window_count = 0;
      }
      if (rank_ == 0 && tr.eval_interval_steps() > 0 &&
          result->steps % tr.eval_interval_steps() == 0) {
        PS_RETURN_IF_ERROR(settle());
        absl::StatusOr<EvalResult> eval = Evaluate();
        if (eval.ok()) {
          Log()->info("step {}: {}", result->steps, Describe(*eval));
          PS_RETURN_IF_ERROR(AppendMetrics(
              *eval, result->steps, result->examples,
              epoch_loss / std::max<uint64_t>(epoch_count, 1)));
        } else if (eval.status().code() != absl::StatusCode::kFailedPrecondition) {
          return eval.status();
        }
      }
    }
    if (next_loaded) {
      // Stopped with a prefetched step: let its pull finish (its buffers
      // are reused), it is simply not trained on.
      (void)FinishPull(next);
    }
    if (epoch_count > 0) {
      result->mean_loss = epoch_loss / epoch_count;
      Log()->info("shard {} epoch {} {}: mean training loss {:.4f}", at.shard(),
                  at.epoch(),
                  *end == ShardEnd::kDone
                      ? std::string("done")
                      : absl::StrCat("stopped before batch ", at.batch()),
                  result->mean_loss);
    }
    if (*end != ShardEnd::kDone) break;  // before the loop moves `at` on
  }
  PS_RETURN_IF_ERROR(settle());
  if (*end == ShardEnd::kDone) {
    at.set_epoch(tr.epochs());
    at.set_batch(0);
  }
  // max_steps ends this worker's part of the job where it stands.
  at.set_done(*end != ShardEnd::kStopped);
  return at;
}

absl::StatusOr<std::optional<ClaimShardResponse>> Trainer::Claim(
    const TrainerHooks& hooks, const DataPosition* finished, bool* stopped) {
  // A scheduler blip should not end a worker that only waits for work.
  constexpr int kMaxFailures = 30;
  // A WAIT answered sooner than this did not long-poll: pause before asking
  // again rather than spin.
  constexpr absl::Duration kMinAsk = absl::Milliseconds(100);
  constexpr absl::Duration kWaitLog = absl::Seconds(30);
  int failures = 0;
  absl::Time last_log = absl::InfinitePast();
  while (true) {
    if (hooks.stop && hooks.stop()) {
      Log()->info("stop requested while waiting for work");
      *stopped = true;
      return std::nullopt;
    }
    const absl::Time asked = absl::Now();
    absl::StatusOr<ClaimShardResponse> r = hooks.claim(finished);
    if (!r.ok()) {
      const absl::StatusCode code = r.status().code();
      if ((code == absl::StatusCode::kUnavailable ||
           code == absl::StatusCode::kDeadlineExceeded) &&
          ++failures < kMaxFailures) {
        Log()->warn("asking for work failed (attempt {} of {}): {}", failures,
                    kMaxFailures, r.status().message());
        absl::SleepFor(absl::Seconds(1));
        continue;
      }
      return Annotate(r.status(), "asking the scheduler for work");
    }
    failures = 0;
    finished = nullptr;  // reported
    switch (r->result()) {
      case ClaimShardResponse::WAIT:
        if (absl::Now() - last_log >= kWaitLog) {
          Log()->info("waiting for work: other workers still train shards");
          last_log = absl::Now();
        }
        if (absl::Now() - asked < kMinAsk) absl::SleepFor(kMinAsk);
        continue;
      case ClaimShardResponse::ALL_DONE:
        Log()->info("every shard of the job is done");
        return std::nullopt;
      case ClaimShardResponse::ASSIGNED:
        if (r->shard().shard() >= num_workers_) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the scheduler assigned shard ", r->shard().shard(),
              " but the job has ", num_workers_, " (cluster.num_workers)"));
        }
        if (r->start_clock() >= kFinishedClock) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the scheduler assigned shard ", r->shard().shard(),
              " at clock ", r->start_clock(), ", which is not below the "
              "finished clock 2^62"));
        }
        return std::optional<ClaimShardResponse>(*std::move(r));
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "the scheduler answered ClaimShard with result ",
            static_cast<int>(r->result())));
    }
  }
}

absl::StatusOr<TrainResult> Trainer::Train(const TrainerHooks& hooks) {
  DataPosition own;
  own.set_shard(rank_);
  return Train(hooks, own);
}

absl::StatusOr<TrainResult> Trainer::Train(const TrainerHooks& hooks,
                                           std::optional<DataPosition> start) {
  const TrainingConfig& tr = config_.training();
  Log()->info("training {} ({} dense parameters, sparse rows of {}) on {}, "
              "batch {}, {} epoch(s), {}",
              ModelConfig::Kind_Name(layout_.kind), layout_.dense_size,
              layout_.sparse_dim, compute_->name(), tr.batch_size(),
              tr.epochs(), ConsistencyMode_Name(config_.consistency().mode()));
  if (!why_cpu_.empty()) Log()->info("no GPU: {}", why_cpu_);
  if (start && start->shard() >= num_workers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("asked to train shard ", start->shard(), " but the job has ",
                     num_workers_, " (cluster.num_workers)"));
  }

  TrainResult result;
  result.start_clock = client_->clock();
  const absl::Time began = absl::Now();
  train_began_ = began;
  bool stopped = false;
  if (result.start_clock == 0) {
    absl::Status init = Initialize(hooks);
    if (!init.ok()) {
      if (!(hooks.stop && hooks.stop())) return init;
      Log()->info("stop requested while initialising ({})", init.message());
      stopped = true;
    }
  } else {
    // Writing initial values now would wipe out what the job learned.
    Log()->info("joining at clock {}: training from the servers' current "
                "parameters",
                result.start_clock);
  }

  std::optional<DataPosition> shard = std::move(start);
  bool capped = false;  // training.max_steps reached
  while (!stopped) {
    // The final position of the shard that just ended, reported with the
    // next request for work.
    std::optional<DataPosition> finished;
    if (shard) {
      DataPosition given = *std::move(shard);
      shard.reset();
      if (capped) {
        Log()->warn("training.max_steps reached: reporting shard {} done "
                    "untrained from epoch {} batch {}",
                    given.shard(), given.epoch(), given.batch());
        given.set_done(true);
        result.position = given;
      } else {
        result.shards.push_back(given.shard());
        ShardEnd end;
        PS_ASSIGN_OR_RETURN(DataPosition at,
                            TrainShard(hooks, given, &result, &end));
        result.position = at;
        // Idle from here until the next shard, if any: never hold back the
        // others' synchronous waits.
        PS_RETURN_IF_ERROR(client_->AdvanceClockTo(kFinishedClock).Wait());
        Report(hooks, kFinishedClock, at);
        if (end == ShardEnd::kStopped) {
          stopped = true;
          break;
        }
        capped = end == ShardEnd::kCapped;
      }
      finished = result.position;
    }
    if (!hooks.claim) break;
    if (client_->clock() != kFinishedClock) {
      // No shard of its own yet: wait for one as a finished worker.
      PS_RETURN_IF_ERROR(client_->AdvanceClockTo(kFinishedClock).Wait());
    }
    PS_ASSIGN_OR_RETURN(
        std::optional<ClaimShardResponse> claimed,
        Claim(hooks, finished ? &*finished : nullptr, &stopped));
    if (!claimed) break;  // every shard done, or stopped
    shard = claimed->shard();
    if (!capped) {
      Log()->info("took over shard {}; the clock restarts at {}",
                  shard->shard(), claimed->start_clock());
      PS_RETURN_IF_ERROR(client_->RestartClock(claimed->start_clock()).Wait());
    }
  }
  if (stopped) {
    result.preempted = true;
    // Stopped before it began the shard it held: it stands where it was
    // given.
    if (shard) result.position = *shard;
  }
  // Never hold back the others' synchronous waits from now on.
  PS_RETURN_IF_ERROR(client_->AdvanceClockTo(kFinishedClock).Wait());
  result.seconds = absl::ToDoubleSeconds(absl::Now() - began);
  result.read = earlier_read_;
  result.bad_lines = earlier_bad_lines_;
  if (train_data_ != nullptr) {
    const data::ReadStats r = train_data_->stats();
    result.read.lines += r.lines;
    result.read.examples += r.examples;
    result.read.bad_lines += r.bad_lines;
    result.read.bytes += r.bytes;
    for (std::string& line : train_data_->bad_line_reports()) {
      if (result.bad_lines.size() >= kMaxBadLineReports) break;
      result.bad_lines.push_back(std::move(line));
    }
  }
  if (result.read.bad_lines > 0) {
    Log()->warn("skipped {} malformed line(s) of {} read", result.read.bad_lines,
                result.read.lines);
  }
  return result;
}

absl::StatusOr<EvalResult> Trainer::Evaluate() {
  if (config_.data().has_files() && config_.data().files().test_files().empty()) {
    return absl::FailedPreconditionError("data.files.test_files is empty");
  }
  PS_ASSIGN_OR_RETURN(
      std::unique_ptr<data::Dataset> test,
      data::OpenDataset(config_.data(), data::Split::kTest, 0, 1, 8192, false));
  constexpr size_t kEvalBatch = 8192;
  EvalAccumulator scores(
      layout_.kind == ModelConfig::MLP ? static_cast<int>(layout_.top.back().out) : 1);
  Step& step = eval_step_;
  while (true) {
    PS_ASSIGN_OR_RETURN(bool loaded, Load(test.get(), kEvalBatch, &step));
    if (!loaded) break;
    PS_RETURN_IF_ERROR(FinishPull(&step));
    PS_RETURN_IF_ERROR(model_->Run(step.batch, step.sparse, step.rows.data(),
                                   step.dense.data(), /*backward=*/false,
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
      JsonNumber(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch())),
      ",\"seconds\":",
      JsonNumber(train_began_ == absl::InfinitePast()
                     ? 0.0
                     : absl::ToDoubleSeconds(absl::Now() - train_began_)),
      ",\"train_loss\":", JsonNumber(train_loss),
      ",\"test_examples\":", eval.examples, ",\"test_auc\":",
      JsonNumber(eval.auc), ",\"test_logloss\":", JsonNumber(eval.logloss),
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
      client_->PullDense(dense_table_, 0, saved.dense.size(), saved.dense.data())
          .Wait());
  if (layout_.sparse_dim > 0) {
    PS_RETURN_IF_ERROR(client_->ScanAll(sparse_table_, &saved.keys, &saved.rows));
  }
  PS_RETURN_IF_ERROR(SaveModel(path, saved));
  Log()->info("saved the model to {}: {} dense parameters, {} sparse rows",
              path, saved.dense.size(), saved.keys.size());
  return absl::OkStatus();
}

}  // namespace ps
