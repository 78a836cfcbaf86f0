#include "worker/telemetry.h"

#include <vector>

#include "common/protocol.h"

namespace ps {

WorkerTelemetry::WorkerTelemetry(metrics::Registry* r) {
  steps_ = r->AddCounter("ps_worker_steps_total", "Training steps computed.");
  examples_ = r->AddCounter("ps_worker_examples_total", "Examples trained.");
  step_seconds_ = r->AddHistogram("ps_worker_step_duration_seconds",
                                  "Wall time of a training step (data, pull "
                                  "wait, compute, sending pushes).",
                                  metrics::LatencyBuckets());
  metrics::HistogramFamily* requests = r->AddHistogramFamily(
      "ps_worker_request_duration_seconds",
      "Data-plane requests from the call to the last server's answer, by op.",
      {"op"}, metrics::LatencyBuckets());
  instruments_.push_seconds = requests->With({"push"});
  instruments_.pull_seconds = requests->With({"pull"});
  instruments_.push_pull_seconds = requests->With({"push_pull"});
  instruments_.staleness =
      r->AddHistogram("ps_worker_staleness_clocks",
                      "Per answered pull: how many clocks this worker was "
                      "ahead of the slowest live "
                      "worker.",
                      {0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128});
  r->AddCallback(
      "ps_worker_sent_bytes_total", "Data-plane bytes sent (all frames).",
      metrics::Type::kCounter, [this] {
        absl::MutexLock lock(&mu_);
        return double(sent_before_ +
                      (client_ != nullptr ? client_->stats().bytes_sent : 0));
      });
  r->AddCallback(
      "ps_worker_received_bytes_total",
      "Data-plane bytes received (all frames).", metrics::Type::kCounter,
      [this] {
        absl::MutexLock lock(&mu_);
        return double(received_before_ + (client_ != nullptr
                                              ? client_->stats().bytes_received
                                              : 0));
      });
  r->AddCallbackFamily(
      "ps_worker_clock", "Steps this worker has completed (its clock).",
      metrics::Type::kGauge, {}, [this] {
        std::vector<metrics::Sample> out;
        absl::MutexLock lock(&mu_);
        if (client_ != nullptr && client_->clock() < kFinishedClock) {
          out.push_back({{}, double(client_->clock())});
        }
        return out;
      });
  r->AddCallback("ps_worker_rank",
                 "This worker's rank (-1 before it registered).",
                 metrics::Type::kGauge, [this] {
                   absl::MutexLock lock(&mu_);
                   return double(rank_);
                 });
}

void WorkerTelemetry::OnTrained(uint64_t examples, absl::Duration step_time) {
  steps_->Add();
  examples_->Add(examples);
  step_seconds_->Observe(absl::ToDoubleSeconds(step_time));
}

void WorkerTelemetry::SetMembership(const SchedulerClient* membership) {
  absl::MutexLock lock(&mu_);
  membership_ = membership;
  if (membership != nullptr) {
    registered_ = true;
    rank_ = membership->rank();
  }
}

void WorkerTelemetry::SetClient(const KVClient* client) {
  absl::MutexLock lock(&mu_);
  if (client_ != nullptr) {
    const KVClient::Stats s = client_->stats();
    sent_before_ += s.bytes_sent;
    received_before_ += s.bytes_received;
  }
  client_ = client;
}

absl::Status WorkerTelemetry::Health() const {
  absl::MutexLock lock(&mu_);
  if (membership_ != nullptr && membership_->lost()) {
    return absl::UnavailableError(
        "lost membership: the scheduler dropped this worker");
  }
  return absl::OkStatus();
}

absl::Status WorkerTelemetry::Readiness() const {
  absl::MutexLock lock(&mu_);
  if (!registered_)
    return absl::UnavailableError("not registered with the scheduler yet");
  if (client_ == nullptr) {
    return absl::UnavailableError(
        "not training (waiting for the job to run, or done)");
  }
  return absl::OkStatus();
}

}  // namespace ps
