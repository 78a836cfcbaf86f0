// A worker process: registers with the scheduler, trains its shard of the
// job's data through the servers, and leaves. Rank 0 then evaluates the
// model on the test split and prints the job summary as one JSON line on
// stdout (and to --summary_out).
//
// SIGINT/SIGTERM stop training after the current step; the worker still
// leaves the job cleanly.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/node_main.h"
#include "common/logging.h"
#include "common/signals.h"
#include "scheduler/client.h"
#include "worker/kv_client.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, config, "", "Job config file (textproto). Required.");
ABSL_FLAG(std::string, scheduler, "", "Scheduler host:port. Required.");
ABSL_FLAG(std::string, summary_out, "",
          "Rank 0 writes the JSON summary line to this file too.");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error");

namespace {

// The KV client as seen by the membership thread's view callback. The lock
// makes unpublishing wait for a callback in progress, so the client can be
// destroyed right after.
struct PublishedClient {
  absl::Mutex mu;
  ps::KVClient* client ABSL_GUARDED_BY(mu) = nullptr;

  void Set(ps::KVClient* c) {
    absl::MutexLock lock(&mu);
    client = c;
  }
  void Update(const ps::ClusterView& view) {
    absl::MutexLock lock(&mu);
    if (client != nullptr) client->UpdateView(view);
  }
};

std::string Number(double v) {
  return std::isfinite(v) ? absl::StrFormat("%.5f", v) : std::string("null");
}

std::string SummaryJson(const ps::JobConfig& config, const ps::Trainer& trainer,
                        const ps::TrainResult& train,
                        const ps::EvalResult* eval, double seconds) {
  return absl::StrCat(
      "{\"model\":\"", ps::ModelConfig::Kind_Name(config.training().model().kind()),
      "\",\"mode\":\"", ps::ConsistencyMode_Name(config.consistency().mode()),
      "\",\"device\":\"", trainer.device_name(),
      "\",\"workers\":", config.cluster().num_workers(),
      ",\"servers\":", config.cluster().num_servers(),
      ",\"rank0_examples\":", train.examples, ",\"rank0_steps\":", train.steps,
      ",\"rank0_bad_lines\":", train.read.bad_lines,
      ",\"seconds\":", absl::StrFormat("%.2f", seconds),
      ",\"test_auc\":", Number(eval ? eval->auc : NAN),
      ",\"test_logloss\":", Number(eval ? eval->logloss : NAN),
      ",\"test_accuracy\":", Number(eval ? eval->accuracy : NAN),
      ",\"oracle_auc\":", Number(eval ? eval->oracle_auc : NAN),
      ",\"oracle_logloss\":", Number(eval ? eval->oracle_logloss : NAN),
      ",\"rank0_examples_per_s\":",
      absl::StrFormat("%.0f", train.seconds > 0 ? train.examples / train.seconds : 0.0),
      "}");
}

int TrainAndEvaluate(const ps::JobConfig& config,
                     ps::SchedulerClient* membership,
                     PublishedClient* kv,
                     const ps::TerminationSignals& signals, absl::Time start) {
  auto log = ps::GetLogger("worker");
  const uint32_t rank = membership->rank();
  auto view = membership->WaitForRunning(
      absl::Milliseconds(config.cluster().startup_timeout_ms()));
  if (!view.ok()) {
    log->error("{}", view.status().message());
    return 1;
  }
  auto client = ps::KVClient::Create(
      {config, rank, membership->node_id(), membership->start_clock()}, *view);
  if (!client.ok()) {
    log->error("{}", client.status().message());
    return 1;
  }
  kv->Set(client->get());
  // Unpublish before the client is destroyed, on every return path.
  auto unpublish = absl::MakeCleanup([kv] { kv->Set(nullptr); });
  (*client)->UpdateView(membership->view());

  auto trainer = ps::Trainer::Create(config, client->get(), rank,
                                     config.cluster().num_workers());
  if (!trainer.ok()) {
    log->error("{}", trainer.status().message());
    return 2;
  }
  const absl::Duration barrier_timeout = absl::Hours(24);
  ps::TrainerHooks hooks;
  hooks.stop = [&] { return signals.requested(); };
  hooks.on_clock = [membership](uint64_t clock) { membership->set_clock(clock); };
  hooks.barrier = [membership, barrier_timeout](absl::string_view name) {
    return membership->Barrier(std::string(name), barrier_timeout);
  };
  auto train = (*trainer)->Train(hooks);
  if (!train.ok()) {
    log->error("training failed: {}", train.status().message());
    return 1;
  }
  log->info("trained {} examples in {:.1f} s ({:.0f} examples/s)",
            train->examples, train->seconds,
            train->seconds > 0 ? train->examples / train->seconds : 0.0);
  if (train->read.bad_lines > 0) {
    log->warn("{} malformed line(s) skipped; the first: {}", train->read.bad_lines,
              absl::StrJoin(train->bad_lines.begin(),
                            train->bad_lines.begin() +
                                std::min<size_t>(train->bad_lines.size(), 5),
                            "; "));
  }
  if (signals.requested()) return 0;

  // Every worker's pushes are acknowledged before it arrives here, so the
  // evaluation below sees the fully trained model.
  absl::Status barrier = membership->Barrier("train_done", barrier_timeout);
  if (!barrier.ok()) {
    log->error("{}", barrier.message());
    return 1;
  }
  if (rank != 0) return 0;
  const double train_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  auto eval = (*trainer)->Evaluate();
  if (!eval.ok() && eval.status().code() != absl::StatusCode::kFailedPrecondition) {
    log->error("evaluation failed: {}", eval.status().message());
    return 1;
  }
  if (eval.ok()) {
    log->info("{}", ps::Describe(*eval));
    absl::Status m = (*trainer)->AppendMetrics(*eval, train->steps, train->mean_loss);
    if (!m.ok()) log->warn("{}", m.message());
  } else {
    log->info("no evaluation: {}", eval.status().message());
  }
  if (const std::string& path = config.training().export_path(); !path.empty()) {
    absl::Status saved = (*trainer)->Export(path);
    if (!saved.ok()) {
      log->error("export failed: {}", saved.message());
      return 1;
    }
  }
  const std::string json = SummaryJson(config, **trainer, *train,
                                       eval.ok() ? &*eval : nullptr, train_seconds);
  std::cout << json << std::endl;
  if (const std::string path = absl::GetFlag(FLAGS_summary_out); !path.empty()) {
    std::ofstream(path) << json << "\n";
  }
  return 0;
}

int Run(ps::TerminationSignals& signals, const ps::JobConfig* config) {
  auto log = ps::GetLogger("worker");
  const absl::Time start = absl::Now();

  // The view callback may fire before the KV client exists; it forwards
  // only once the client is published.
  PublishedClient kv;
  auto options = ps::SchedulerClient::Options::ForJob(
      *config, absl::GetFlag(FLAGS_scheduler), ps::WORKER);
  options.on_view = [&kv](const ps::ClusterView& view, uint32_t) {
    kv.Update(view);
  };
  auto membership = ps::SchedulerClient::Connect(options);
  if (!membership.ok()) {
    log->error("{}", membership.status().message());
    return 1;
  }
  const uint32_t rank = (*membership)->rank();
  ps::SetLogTag(absl::StrCat("worker/", rank));
  log->info("registered as worker {} of {}", rank,
            config->cluster().num_workers());
  const int exit_code = TrainAndEvaluate(*config, membership->get(), &kv,
                                         signals, start);
  // Leave on every path once registered, so the scheduler never waits for a
  // heartbeat timeout to learn this worker is gone.
  absl::Status left = (*membership)->Leave(/*finished=*/exit_code == 0 &&
                                           !signals.requested());
  if (!left.ok()) log->warn("{}", left.message());
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  ps::TerminationSignals signals;
  absl::ParseCommandLine(argc, argv);
  auto log = ps::GetLogger("worker");
  std::optional<ps::JobConfig> config =
      ps::StartNode(*log, absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_config),
                    {{"scheduler", absl::GetFlag(FLAGS_scheduler)}});
  if (!config) return 2;
  return Run(signals, &*config);
}
