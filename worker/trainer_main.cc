// A worker process: registers with the scheduler, trains the data shard
// the registration gave it (from the position given: a replacement resumes
// a dead or preempted worker's shard), then takes over shards orphaned by
// other workers until every shard is done (ClaimShard), and leaves. The
// lowest worker rank at the train_done barrier (rank 0 unless it died)
// then evaluates the model on the test split, exports it, and prints the
// job summary as one JSON line on stdout (and to --summary_out). The
// others wait for it at barrier "evaluated-0"; if it dies first, the lowest
// of them takes over (barrier "evaluated-1", ...).
//
// SIGINT/SIGTERM (preemption), or the scheduler draining this worker (psctl
// drain, learnt from a heartbeat): training stops after the current step, its
// pushes acknowledged, and the worker leaves with the exact position of its
// next untrained batch, so another worker trains the rest of the shard with
// nothing trained twice or skipped; it exits 0. A signal while waiting (for
// the servers, at a barrier, for work) is noticed within a few seconds.
// A worker killed outright is resumed from its last heartbeat's position
// instead (worker/trainer.h: the batches after it are trained twice).
//
// Log lines meant for tools (positions 0-based, as in DataPosition):
//   "training shard S from epoch E batch B at clock C"   (trainer)
//   "preempted: left at shard S epoch E batch B"         (+ " (done)")
//   "evaluator: rank R, the lowest of ranks [...] that finished training"
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/curve_keys.h"
#include "common/http_endpoint.h"
#include "common/metrics.h"
#include "common/node_main.h"
#include "common/logging.h"
#include "common/signals.h"
#include "scheduler/client.h"
#include "worker/kv_client.h"
#include "worker/telemetry.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, config, "", "Job config file (textproto). Required.");
ABSL_FLAG(std::string, scheduler, "", "Scheduler host:port. Required.");
ABSL_FLAG(std::string, summary_out, "",
          "Rank 0 writes the JSON summary line to this file too.");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error");
ABSL_FLAG(std::string, http_host, "127.0.0.1",
          "Address of the HTTP endpoint (/metrics, /healthz, /readyz).");
ABSL_FLAG(int, http_port, 0,
          "Port of the HTTP endpoint; 0 picks a free one (logged), -1 turns it off.");
ABSL_FLAG(int64_t, num_servers, 0,
          "Overrides cluster.num_servers of --config (0 keeps it); launchers "
          "set it from the environment. Every process of a job needs the same.");
ABSL_FLAG(int64_t, num_workers, 0,
          "Overrides cluster.num_workers of --config (0 keeps it); launchers "
          "set it from the environment. Every process of a job needs the same.");

namespace {

// The KV client as seen by the membership thread's view callback. The lock
// makes unpublishing wait for a callback in progress, so the client can be
// destroyed right after.
struct PublishedClient {
  absl::Mutex mu;
  ps::KVClient* client ABSL_GUARDED_BY(mu) = nullptr;
  // Metrics and health; set before any thread uses this, never null.
  ps::WorkerTelemetry* telemetry = nullptr;
  // The job's CURVE key pair for the client (loaded in main()); nullopt:
  // plaintext. Set before any thread uses this.
  std::optional<ps::CurveKeys> curve;

  void Set(ps::KVClient* c) {
    absl::MutexLock lock(&mu);
    client = c;
    telemetry->SetClient(c);
  }
  void Update(const ps::ClusterView& view) {
    absl::MutexLock lock(&mu);
    if (client != nullptr) client->UpdateView(view);
  }
};

std::string Number(double v) {
  return std::isfinite(v) ? absl::StrFormat("%.5f", v) : std::string("null");
}

// How long each wait for the scheduler (work, barriers, startup) may block
// before the stop flag is checked again: the worst-case delay between
// SIGTERM and leaving. Re-asking costs one RPC per interval.
constexpr absl::Duration kStopCheck = absl::Seconds(2);

// The rank0_* fields are the evaluating worker's (rank 0 in a job without
// failures; see evaluator_rank).
std::string SummaryJson(const ps::JobConfig& config, const ps::Trainer& trainer,
                        const ps::TrainResult& train,
                        const ps::EvalResult* eval, double seconds,
                        uint32_t evaluator) {
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
      ",\"evaluator_rank\":", evaluator,
      ",\"shards_trained\":[", absl::StrJoin(train.shards, ","), "]",
      ",\"start_clock\":", train.start_clock, "}");
}

// Barrier `name` in rounds of kStopCheck, so a stop request is noticed.
// CANCELLED once stopped; DEADLINE_EXCEEDED after `timeout`; `ranks` as
// SchedulerClient::Barrier.
absl::Status StoppableBarrier(ps::SchedulerClient* membership,
                              const ps::TerminationSignals& signals,
                              const std::string& name, absl::Duration timeout,
                              std::vector<uint32_t>* ranks) {
  constexpr absl::Duration kLogEvery = absl::Seconds(10);
  const absl::Time deadline = absl::Now() + timeout;
  absl::Time next_log = absl::Now() + kLogEvery;
  while (true) {
    if (signals.requested()) {
      return absl::CancelledError(
          absl::StrCat("barrier ", name, ": stop requested"));
    }
    const absl::Duration round = std::min(kStopCheck, deadline - absl::Now());
    absl::Status s = membership->Barrier(name, round, ranks);
    // Arriving again is harmless (scheduler.proto).
    if (s.code() != absl::StatusCode::kDeadlineExceeded ||
        absl::Now() >= deadline) {
      return s;
    }
    if (absl::Now() >= next_log) {
      ps::GetLogger("worker")->info("{}", s.message());  // the missing ranks
      next_log = absl::Now() + kLogEvery;
    }
  }
}

// What the worker tells the scheduler when it leaves.
struct Outcome {
  // Every shard is done and this worker's part is complete.
  bool finished = false;
  // Stopped by a signal with work left; `position` says where.
  bool preempted = false;
  std::optional<ps::DataPosition> position;
};

int Evaluate(const ps::JobConfig& config, std::unique_ptr<ps::Trainer>& trainer,
             const ps::TrainResult& train_result, const std::vector<uint32_t>& ranks,
             uint32_t evaluator, absl::Time start);

int TrainAndEvaluate(const ps::JobConfig& config,
                     ps::SchedulerClient* membership,
                     PublishedClient* kv,
                     const ps::TerminationSignals& signals, absl::Time start,
                     Outcome* outcome) {
  auto log = ps::GetLogger("worker");
  const uint32_t rank = membership->rank();
  std::optional<ps::DataPosition> initial;
  if (membership->has_initial_shard()) initial = membership->initial_shard();
  // Preempted before training: the shard stands where it was given.
  auto preempt_now = [&] {
    outcome->preempted = true;
    outcome->position = initial;
    return 0;
  };

  const absl::Time startup_deadline =
      absl::Now() + absl::Milliseconds(config.cluster().startup_timeout_ms());
  absl::StatusOr<ps::ClusterView> view;
  while (true) {
    if (signals.requested()) return preempt_now();
    view = membership->WaitForRunning(
        std::min(kStopCheck, startup_deadline - absl::Now()));
    if (view.ok() || view.status().code() != absl::StatusCode::kDeadlineExceeded ||
        absl::Now() >= startup_deadline) {
      break;
    }
  }
  if (!view.ok()) {
    log->error("{}", view.status().message());
    return 1;
  }
  ps::KVClient::Options client_options{config, rank, membership->node_id(),
                                       membership->start_clock()};
  client_options.instruments = kv->telemetry->instruments();
  client_options.curve = kv->curve;
  auto client = ps::KVClient::Create(client_options, *view);
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
  hooks.on_step = [membership](uint64_t clock, const ps::DataPosition& next) {
    membership->set_progress(clock, next);
  };
  hooks.on_trained = [telemetry = kv->telemetry](uint64_t examples, absl::Duration t) {
    telemetry->OnTrained(examples, t);
  };
  hooks.barrier = [&](absl::string_view name) {
    return StoppableBarrier(membership, signals, std::string(name),
                            barrier_timeout, nullptr);
  };
  hooks.claim = [membership](const ps::DataPosition* finished) {
    return membership->ClaimShard(finished, kStopCheck);
  };
  if (!initial) {
    log->info("no shard of its own (joined at clock {}): asking for work",
              membership->start_clock());
  }
  auto train = (*trainer)->Train(hooks, initial);
  if (!train.ok()) {
    log->error("training failed: {}", train.status().message());
    return 1;
  }
  log->info("trained {} examples in {:.1f} s ({:.0f} examples/s), shards [{}]",
            train->examples, train->seconds,
            train->seconds > 0 ? train->examples / train->seconds : 0.0,
            absl::StrJoin(train->shards, ","));
  if (train->read.bad_lines > 0) {
    log->warn("{} malformed line(s) skipped; the first: {}", train->read.bad_lines,
              absl::StrJoin(train->bad_lines.begin(),
                            train->bad_lines.begin() +
                                std::min<size_t>(train->bad_lines.size(), 5),
                            "; "));
  }
  if (train->preempted) {
    outcome->preempted = true;
    outcome->position = train->position;
    return 0;
  }
  // Every shard is done: a stop from here on only cuts the wrap-up short.
  outcome->finished = true;

  // Every worker's pushes are acknowledged before it arrives here, so the
  // evaluation below sees the fully trained model.
  std::vector<uint32_t> ranks;
  absl::Status barrier =
      StoppableBarrier(membership, signals, "train_done", barrier_timeout, &ranks);
  if (barrier.code() == absl::StatusCode::kCancelled) {
    log->info("stop requested at the train_done barrier: leaving");
    return 0;
  }
  if (!barrier.ok()) {
    log->error("{}", barrier.message());
    return 1;
  }
  // The lowest rank that arrived acts for the job: rank 0 may have died.
  // The others wait at "evaluated-K" until it is done; if it died
  // meanwhile (it is not among those arriving there), the lowest of them
  // evaluates instead, and so on, so the job never ends without a summary.
  uint32_t evaluator = ranks.empty() ? 0 : ranks.front();
  for (int round = 0;; ++round) {
    const std::string done_barrier = absl::StrCat("evaluated-", round);
    if (rank == evaluator) {
      if (int code = Evaluate(config, *trainer, *train, ranks, evaluator, start);
          code != 0) {
        return code;
      }
      // Tell the others, even when stopping (a SIGTERM during the
      // evaluation): without this arrival they would evaluate again.
      if (absl::Status told = membership->Barrier(done_barrier, absl::Seconds(30));
          !told.ok()) {
        log->warn("{}", told.message());
      }
      return 0;
    }
    std::vector<uint32_t> arrived;
    barrier = StoppableBarrier(membership, signals, done_barrier, barrier_timeout, &arrived);
    if (!barrier.ok()) return barrier.code() == absl::StatusCode::kCancelled ? 0 : 1;
    if (arrived.empty() ||
        std::find(arrived.begin(), arrived.end(), evaluator) != arrived.end()) {
      return 0;
    }
    log->warn("the evaluator (rank {}) left before it was done; ranks [{}] remain",
              evaluator, absl::StrJoin(arrived, ","));
    ranks = arrived;
    evaluator = arrived.front();
  }
}

// The evaluator's part: evaluate, export, print and write the summary.
int Evaluate(const ps::JobConfig& config, std::unique_ptr<ps::Trainer>& trainer,
             const ps::TrainResult& train_result, const std::vector<uint32_t>& ranks,
             uint32_t evaluator, absl::Time start) {
  auto log = ps::GetLogger("worker");
  const ps::TrainResult* train = &train_result;
  const uint32_t rank = evaluator;
  log->info("evaluator: rank {}, the lowest of ranks [{}] that finished training",
            rank, absl::StrJoin(ranks, ","));
  const double train_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  auto eval = trainer->Evaluate();
  if (!eval.ok() && eval.status().code() != absl::StatusCode::kFailedPrecondition) {
    log->error("evaluation failed: {}", eval.status().message());
    return 1;
  }
  if (eval.ok()) {
    log->info("{}", ps::Describe(*eval));
    absl::Status m = trainer->AppendMetrics(*eval, train->steps, train->examples,
                                              train->mean_loss);
    if (!m.ok()) log->warn("{}", m.message());
  } else {
    log->info("no evaluation: {}", eval.status().message());
  }
  if (const std::string& path = config.training().export_path(); !path.empty()) {
    absl::Status saved = trainer->Export(path);
    if (!saved.ok()) {
      log->error("export failed: {}", saved.message());
      return 1;
    }
  }
  const std::string json =
      SummaryJson(config, *trainer, *train, eval.ok() ? &*eval : nullptr,
                  train_seconds, evaluator);
  std::cout << json << std::endl;
  if (const std::string path = absl::GetFlag(FLAGS_summary_out); !path.empty()) {
    std::ofstream(path) << json << "\n";
  }
  return 0;
}

std::string DescribePosition(const ps::DataPosition& p) {
  return absl::StrCat("shard ", p.shard(), " epoch ", p.epoch(), " batch ",
                      p.batch(), p.done() ? " (done)" : "");
}

int Run(ps::TerminationSignals& signals, const ps::JobConfig* config,
        ps::WorkerTelemetry* telemetry, std::optional<ps::CurveKeys> curve) {
  auto log = ps::GetLogger("worker");
  const absl::Time start = absl::Now();

  // The view callback may fire before the KV client exists; it forwards
  // only once the client is published.
  PublishedClient kv;
  kv.telemetry = telemetry;
  kv.curve = std::move(curve);
  auto options = ps::SchedulerClient::Options::ForJob(
      *config, absl::GetFlag(FLAGS_scheduler), ps::WORKER);
  // Its shard is resumed by another worker if it dies or is preempted.
  options.trains_shards = true;
  // Drained (psctl drain): stop after the current step as on SIGTERM.
  options.on_drain = [&signals] { signals.RequestTermination(); };
  options.on_view = [&kv](const ps::ClusterView& view, uint32_t) {
    kv.Update(view);
  };
  auto membership = ps::SchedulerClient::Connect(options);
  if (!membership.ok()) {
    log->error("{}", membership.status().message());
    return 1;
  }
  telemetry->SetMembership(membership->get());
  auto unset = absl::MakeCleanup([telemetry] { telemetry->SetMembership(nullptr); });
  const uint32_t rank = (*membership)->rank();
  ps::SetLogTag(absl::StrCat("worker/", rank));
  log->info("registered as worker {} of {}{}", rank,
            config->cluster().num_workers(),
            (*membership)->has_initial_shard()
                ? absl::StrCat(", to train ",
                               DescribePosition((*membership)->initial_shard()))
                : std::string(", with no shard of its own"));
  Outcome outcome;
  const int exit_code = TrainAndEvaluate(*config, membership->get(), &kv,
                                         signals, start, &outcome);
  // Leave on every path once registered, so the scheduler never waits for a
  // heartbeat timeout to learn this worker is gone.
  if (outcome.preempted) {
    const ps::DataPosition* at = outcome.position ? &*outcome.position : nullptr;
    absl::Status left = (*membership)->Leave(/*finished=*/false, at);
    if (!left.ok()) {
      log->warn("{}", left.message());
    } else if (at != nullptr) {
      log->info("preempted: left at {}", DescribePosition(*at));
    } else {
      log->info("preempted: left holding no shard");
    }
    return exit_code;
  }
  absl::Status left =
      (*membership)->Leave(/*finished=*/exit_code == 0 && outcome.finished);
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
                    {{"scheduler", absl::GetFlag(FLAGS_scheduler)}},
                    ps::ClusterSizeOverride{absl::GetFlag(FLAGS_num_servers),
                                            absl::GetFlag(FLAGS_num_workers)});
  if (!config) return 2;
  absl::StatusOr<std::optional<ps::CurveKeys>> curve =
      ps::LoadCurveKeys(config->security().curve());
  if (!curve.ok()) {
    log->error("{}", curve.status().message());
    return 2;
  }
  ps::metrics::Registry registry;
  ps::metrics::AddProcessMetrics(&registry);
  ps::WorkerTelemetry telemetry(&registry);
  ps::HttpEndpoint::Options http;
  http.host = absl::GetFlag(FLAGS_http_host);
  http.port = absl::GetFlag(FLAGS_http_port);
  http.registry = &registry;
  http.health = [&telemetry] { return telemetry.Health(); };
  http.readiness = [&telemetry] { return telemetry.Readiness(); };
  auto endpoint = ps::StartHttpEndpointForMain(*log, std::move(http));
  if (!endpoint.ok()) {
    log->error("{}", endpoint.status().message());
    return 1;
  }
  return Run(signals, &*config, &telemetry, *std::move(curve));
}
