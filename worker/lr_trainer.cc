#include "worker/lr_trainer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/wire.h"
#include "worker/metrics.h"

namespace ps {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger =
      new std::shared_ptr<spdlog::logger>(GetLogger("trainer"));
  return *logger;
}

inline float Sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// Log loss of one example from its logit, stable for large |z|.
inline double LossFromLogit(float z, float y) {
  // log(1 + e^z) - y z, computed without overflow.
  const double softplus =
      z > 0 ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z));
  return softplus - y * z;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LrTrainer>> LrTrainer::Create(
    const JobConfig& config, KVClient* client, uint32_t rank,
    uint32_t num_workers) {
  if (!config.data().has_synthetic_ctr()) {
    return absl::InvalidArgumentError("data.synthetic_ctr is required");
  }
  PS_ASSIGN_OR_RETURN(const TableConfig* sparse,
                      FindTable(config, config.training().sparse_table()));
  PS_ASSIGN_OR_RETURN(const TableConfig* dense,
                      FindTable(config, config.training().dense_table()));
  PS_ASSIGN_OR_RETURN(ctr::SyntheticCtr data,
                      ctr::SyntheticCtr::Create(config.data().synthetic_ctr()));
  if (!sparse->has_sparse() || sparse->sparse().dim() != 1) {
    return absl::InvalidArgumentError(
        "training.sparse_table must be sparse with dim 1");
  }
  if (!dense->has_dense() || dense->dense().size() != data.num_numeric() + 1) {
    return absl::InvalidArgumentError(
        "training.dense_table must be dense with num_numeric + 1 elements");
  }
  std::unique_ptr<LrTrainer> t(
      new LrTrainer(config, client, std::move(data), rank, num_workers));
  t->sparse_table_ = sparse->id();
  t->dense_table_ = dense->id();
  return t;
}

LrTrainer::LrTrainer(const JobConfig& config, KVClient* client,
                     ctr::SyntheticCtr data, uint32_t rank,
                     uint32_t num_workers)
    : config_(config),
      client_(client),
      data_(std::move(data)),
      rank_(rank),
      num_workers_(num_workers),
      num_numeric_(data_.num_numeric()),
      dense_w_(data_.num_numeric() + 1),
      dense_g_(data_.num_numeric() + 1) {}

void LrTrainer::Dedup(const ctr::Batch& batch) {
  dedup_.clear();
  unique_keys_.clear();
  key_index_.resize(batch.keys.size());
  for (size_t i = 0; i < batch.keys.size(); ++i) {
    auto [it, inserted] = dedup_.try_emplace(
        batch.keys[i], static_cast<uint32_t>(unique_keys_.size()));
    if (inserted) unique_keys_.push_back(batch.keys[i]);
    key_index_[i] = it->second;
  }
}

absl::Status LrTrainer::PullWeights() {
  constexpr int kAttempts = 20;
  sparse_w_.resize(unique_keys_.size());
  for (int attempt = 1;; ++attempt) {
    Completion sparse =
        client_->Pull(sparse_table_, unique_keys_, sparse_w_.data());
    Completion dense =
        client_->PullDense(dense_table_, 0, dense_w_.size(), dense_w_.data());
    const absl::Status s = sparse.Wait();
    const absl::Status d = dense.Wait();
    if (s.ok() && d.ok()) return absl::OkStatus();
    const absl::Status& err = s.ok() ? d : s;
    if (err.code() != absl::StatusCode::kDeadlineExceeded || attempt == kAttempts) {
      return err;
    }
    // Pulls are idempotent. Under BSP/SSP the servers hold a pull until
    // slower workers catch up, and their watchdog names those workers.
    Log()->warn("pull at clock {} not answered in time (attempt {} of {}); asking again",
                client_->clock(), attempt, kAttempts);
  }
}

std::vector<std::pair<uint64_t, uint64_t>> LrTrainer::Batches() const {
  const uint64_t total = data_.size(ctr::Split::kTrain);
  const uint64_t b = config_.training().batch_size();
  std::vector<std::pair<uint64_t, uint64_t>> batches;
  if (config_.training().shard_by_batch()) {
    for (uint64_t pos = uint64_t{rank_} * b; pos < total;
         pos += uint64_t{num_workers_} * b) {
      batches.emplace_back(pos, std::min(b, total - pos));
    }
  } else {
    const auto [begin, end] = ctr::ShardRange(total, rank_, num_workers_);
    for (uint64_t pos = begin; pos < end; pos += b) {
      batches.emplace_back(pos, std::min(b, end - pos));
    }
  }
  return batches;
}

void LrTrainer::Forward(const ctr::Batch& batch,
                        std::vector<float>* logits) const {
  const uint32_t c = data_.num_categorical();
  logits->resize(batch.size);
  const float bias = dense_w_[num_numeric_];
  for (size_t i = 0; i < batch.size; ++i) {
    float z = bias;
    const uint32_t* idx = &key_index_[i * c];
    for (uint32_t f = 0; f < c; ++f) z += sparse_w_[idx[f]];
    const float* x = &batch.numeric[i * num_numeric_];
    for (uint32_t j = 0; j < num_numeric_; ++j) z += dense_w_[j] * x[j];
    (*logits)[i] = z;
  }
}

absl::StatusOr<TrainResult> LrTrainer::Train(
    const std::function<bool()>& stop,
    const std::function<void(uint64_t)>& on_clock) {
  const std::vector<std::pair<uint64_t, uint64_t>> batches = Batches();
  const uint64_t batch_size = config_.training().batch_size();
  const uint64_t max_steps = config_.training().max_steps();
  const uint32_t c = data_.num_categorical();
  const absl::Duration log_every =
      absl::Seconds(config_.training().log_interval_s());
  Log()->info("training on {} batches of {} per epoch ({}), {} epoch(s), {}",
              batches.size(), batch_size,
              config_.training().shard_by_batch() ? "every k-th batch"
                                                  : "a contiguous shard",
              config_.training().epochs(),
              ConsistencyMode_Name(config_.consistency().mode()));

  TrainResult result;
  const absl::Time start = absl::Now();
  absl::Time last_log = start;
  uint64_t examples_at_log = 0;
  // Loss over the examples since the last progress line.
  double window_loss = 0;
  uint64_t window_count = 0;
  ctr::Batch batch;
  std::vector<float> logits;
  // The previous step's pushes; waited for before the next push so at most
  // one step of updates is in flight per worker.
  std::vector<Completion> in_flight;

  bool stopped = false;
  for (uint32_t epoch = 0; epoch < config_.training().epochs() && !stopped;
       ++epoch) {
    double epoch_loss = 0;
    uint64_t epoch_count = 0;
    for (const auto& [pos, n] : batches) {
      if (stop() || (max_steps > 0 && result.steps >= max_steps)) {
        Log()->info("{} after {} steps",
                    stop() ? "stop requested" : "training.max_steps reached",
                    result.steps);
        stopped = true;
        break;
      }
      // Generating the batch overlaps with the previous step's push.
      PS_RETURN_IF_ERROR(data_.Fill(ctr::Split::kTrain, pos, n, &batch));
      Dedup(batch);
      // Requests to one server are applied in order, so this pull sees the
      // previous step's push without waiting for its acknowledgement first.
      PS_RETURN_IF_ERROR(PullWeights());
      for (const Completion& push : in_flight) PS_RETURN_IF_ERROR(push.Wait());
      in_flight.clear();

      Forward(batch, &logits);
      sparse_sum_.assign(unique_keys_.size(), 0.0);
      dense_sum_.assign(num_numeric_ + 1, 0.0);
      const double scale = 1.0 / static_cast<double>(n);
      double batch_loss = 0;
      for (size_t i = 0; i < n; ++i) {
        const float y = batch.labels[i];
        batch_loss += LossFromLogit(logits[i], y);
        const double err = (Sigmoid(logits[i]) - y) * scale;
        const uint32_t* idx = &key_index_[i * c];
        for (uint32_t f = 0; f < c; ++f) sparse_sum_[idx[f]] += err;
        const float* x = &batch.numeric[i * num_numeric_];
        for (uint32_t j = 0; j < num_numeric_; ++j) dense_sum_[j] += err * x[j];
        dense_sum_[num_numeric_] += err;
      }
      sparse_g_.assign(sparse_sum_.begin(), sparse_sum_.end());
      dense_g_.assign(dense_sum_.begin(), dense_sum_.end());
      in_flight.push_back(
          client_->Push(sparse_table_, unique_keys_, sparse_g_));
      in_flight.push_back(client_->PushDense(dense_table_, 0, dense_g_));
      // The step ends after its pushes; servers receive this after them.
      in_flight.push_back(client_->AdvanceClock());
      if (on_clock) on_clock(client_->clock());

      epoch_loss += batch_loss;
      window_loss += batch_loss;
      epoch_count += n;
      window_count += n;
      result.examples += n;
      ++result.steps;
      const absl::Time now = absl::Now();
      if (now - last_log >= log_every) {
        Log()->info(
            "epoch {} step {}: {} examples, {:.0f} examples/s, loss {:.4f}",
            epoch + 1, result.steps, result.examples,
            (result.examples - examples_at_log) /
                absl::ToDoubleSeconds(now - last_log),
            window_loss / window_count);
        last_log = now;
        examples_at_log = result.examples;
        window_loss = 0;
        window_count = 0;
      }
    }
    if (epoch_count > 0) {
      result.mean_loss = epoch_loss / epoch_count;
      Log()->info("epoch {} {}: mean training loss {:.4f}", epoch + 1,
                  stopped ? "stopped" : "done", result.mean_loss);
    }
  }
  for (const Completion& push : in_flight) PS_RETURN_IF_ERROR(push.Wait());
  // Never hold back the others' synchronous waits from now on.
  PS_RETURN_IF_ERROR(client_->AdvanceClockTo(kFinishedClock).Wait());
  if (on_clock) on_clock(kFinishedClock);
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

absl::StatusOr<EvalResult> LrTrainer::Evaluate() {
  const uint64_t total = data_.size(ctr::Split::kTest);
  constexpr uint64_t kEvalBatch = 8192;
  std::vector<float> probs, labels, oracle;
  probs.reserve(total);
  labels.reserve(total);
  oracle.reserve(total);
  ctr::Batch batch;
  std::vector<float> logits;
  EvalResult result;
  double loss = 0, oracle_loss = 0;
  for (uint64_t pos = 0; pos < total; pos += kEvalBatch) {
    const uint64_t n = std::min(kEvalBatch, total - pos);
    PS_RETURN_IF_ERROR(data_.Fill(ctr::Split::kTest, pos, n, &batch));
    Dedup(batch);
    PS_RETURN_IF_ERROR(PullWeights());
    Forward(batch, &logits);
    for (size_t i = 0; i < n; ++i) {
      probs.push_back(Sigmoid(logits[i]));
      labels.push_back(batch.labels[i]);
      oracle.push_back(batch.true_logits[i]);
      loss += LossFromLogit(logits[i], batch.labels[i]);
      oracle_loss += LossFromLogit(batch.true_logits[i], batch.labels[i]);
    }
  }
  result.examples = total;
  result.auc = Auc(probs, labels);
  result.logloss = total > 0 ? loss / total : 0;
  result.oracle_auc = Auc(oracle, labels);
  result.oracle_logloss = total > 0 ? oracle_loss / total : 0;
  return result;
}

}  // namespace ps
