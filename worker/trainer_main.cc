// A worker process: registers with the scheduler, trains the data shard
// the registration gave it (from the position given: a replacement resumes
// a dead or preempted worker's shard), then takes over shards orphaned by
// other workers until every shard is done (ClaimShard), and leaves. The
// lowest worker rank at the train_done barrier (rank 0 unless it died)
// then evaluates the model on the test split, exports it, and prints the
// job summary as one JSON line on stdout (and to --summary_out, by default
// $PS_SUMMARY_OUT, where the launchers look for it). The
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
// Dropped by the scheduler (declared dead after a pause or a partition,
// learnt from a heartbeat): training stops at once (every wait and request
// ends; nothing more is pushed), and the worker joins again as a new worker
// by re-executing itself (at most kMaxRejoins times, counted in
// $PS_TRAINER_REJOINS): it registers fresh, takes a free rank and the
// remaining work, or exits 0 if the job finished meanwhile or has no free
// rank. Exit codes besides 0, 1 (error) and 2 (bad flags or config):
//   3  dropped by the scheduler, and rejoining was not possible;
//   4  the scheduler unreachable for cluster.scheduler_unreachable_timeout_ms
//      (the last error line names its address and how long);
//   5  the job cannot continue (the scheduler made it FAILED, e.g. slots
//      lost every copy with no checkpoint): the last error line gives the
//      scheduler's reason.
//
// Log lines meant for tools (positions 0-based, as in DataPosition):
//   "training shard S from epoch E batch B at clock C"   (trainer)
//   "preempted: left at shard S epoch E batch B"         (+ " (done)")
//   "evaluator: rank R, the lowest of ranks [...] that finished training"
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/curve_keys.h"
#include "common/http_endpoint.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/node_main.h"
#include "common/reasons.h"
#include "common/signals.h"
#include "scheduler/client.h"
#include "worker/kv_client.h"
#include "worker/session.h"
#include "worker/telemetry.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, config, "", "Job config file (textproto). Required.");
ABSL_FLAG(std::string, scheduler, "", "Scheduler host:port. Required.");
ABSL_FLAG(std::string, summary_out, "",
          "Rank 0 writes the JSON summary line to this file too; default "
          "$PS_SUMMARY_OUT, where the launchers name it.");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error");
ABSL_FLAG(std::string, ring_host, "127.0.0.1",
          "Address the other workers reach this one's dense all-reduce ring "
          "at (dense tables with sync ALLREDUCE); gloo listens on a free port "
          "of it.");
ABSL_FLAG(std::string, http_host, "127.0.0.1",
          "Address of the HTTP endpoint (/metrics, /healthz, /readyz).");
ABSL_FLAG(
    int, http_port, 0,
    "Port of the HTTP endpoint; 0 picks a free one (logged), -1 turns it off.");
ABSL_FLAG(
    int64_t, num_servers, 0,
    "Overrides cluster.num_servers of --config (0 keeps it); launchers "
    "set it from the environment. Every process of a job needs the same.");
ABSL_FLAG(
    int64_t, num_workers, 0,
    "Overrides cluster.num_workers of --config (0 keeps it); launchers "
    "set it from the environment. Every process of a job needs the same.");

namespace {

std::string Number(double v) {
  return std::isfinite(v) ? absl::StrFormat("%.5f", v) : std::string("null");
}

// How long each wait for the scheduler (work, barriers, startup) may block
// before the stop flag is checked again: the worst-case delay between
// SIGTERM and leaving. Re-asking costs one RPC per interval.
constexpr absl::Duration kStopCheck = absl::Seconds(2);
constexpr absl::Duration kBarrierTimeout = absl::Hours(24);

// Run()'s answer for a worker the scheduler dropped: main re-executes it.
constexpr int kRejoin = -1;
constexpr int kExitDropped = 3;
constexpr int kExitSchedulerGone = 4;
constexpr int kExitJobFailed = 5;
// How often one process joins again after being dropped, counted across
// its re-executions in this environment variable.
constexpr int kMaxRejoins = 3;
constexpr char kRejoinsEnv[] = "PS_TRAINER_REJOINS";

int Rejoins() {
  int n = 0;
  const char* v = std::getenv(kRejoinsEnv);
  if (v == nullptr || !absl::SimpleAtoi(v, &n) || n < 0) return 0;
  return n;
}

// The exit for a session that ended (dropped: kRejoin; the scheduler gone:
// its status as the last error line, exit 4; the job failed: the same, exit
// 5), or nullopt while it goes on.
std::optional<int> Ended(const ps::WorkerSession& session) {
  const absl::Status ended = session.ended();
  if (ended.ok()) return std::nullopt;
  auto log = ps::GetLogger("worker");
  if (ps::IsDropped(ended)) {
    log->warn("{}: training stopped", ended.message());
    return kRejoin;
  }
  log->error("{}", ended.message());
  return ps::IsJobFailed(ended) ? kExitJobFailed : kExitSchedulerGone;
}

// Joins the job again as a new worker: re-executes this program with the
// same arguments (the new image starts from scratch: registration, a free
// rank, the remaining work). Returns only when that is not possible.
int Rejoin(const std::vector<std::string>& args) {
  auto log = ps::GetLogger("worker");
  const int done = Rejoins();
  if (done >= kMaxRejoins) {
    log->error(
        "dropped by the scheduler, and this worker already joined again {} "
        "times: giving up",
        done);
    return kExitDropped;
  }
  log->info(
      "dropped by the scheduler: joining the job again as a new worker ({} of "
      "at most {})",
      done + 1, kMaxRejoins);
  setenv(kRejoinsEnv, std::to_string(done + 1).c_str(), 1);
  spdlog::apply_all(
      [](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::vector<char*> argv;
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv("/proc/self/exe", argv.data());
  log->error("dropped by the scheduler, and joining again failed: execv: {}",
             std::strerror(errno));
  return kExitDropped;
}

// The rank0_* fields are the evaluating worker's (rank 0 in a job without
// failures; see evaluator_rank).
std::string SummaryJson(const ps::JobConfig& config, const ps::Trainer& trainer,
                        const ps::TrainResult& train,
                        const ps::EvalResult* eval, double seconds,
                        uint32_t evaluator) {
  return absl::StrCat(
      "{\"model\":\"",
      ps::ModelConfig::Kind_Name(config.training().model().kind()),
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
      absl::StrFormat("%.0f",
                      train.seconds > 0 ? train.examples / train.seconds : 0.0),
      ",\"evaluator_rank\":", evaluator, ",\"shards_trained\":[",
      absl::StrJoin(train.shards, ","), "]",
      ",\"start_clock\":", train.start_clock, "}");
}

// The evaluator's part: evaluate, export, print and write the summary.
int Evaluate(const ps::JobConfig& config, ps::Trainer& trainer,
             const ps::TrainResult& train, uint32_t evaluator, absl::Time start,
             const ps::TrainerHooks& hooks) {
  auto log = ps::GetLogger("worker");
  const double train_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  auto eval = trainer.Evaluate();
  if (!eval.ok() &&
      eval.status().code() != absl::StatusCode::kFailedPrecondition) {
    log->error("evaluation failed: {}", eval.status().message());
    return 1;
  }
  if (eval.ok()) {
    log->info("{}", ps::Describe(*eval));
    // The scheduler hears of it with the Leave that follows.
    ps::Trainer::ReportMetrics(hooks, *eval, train.start_clock + train.steps);
    absl::Status m = trainer.AppendMetrics(*eval, train.steps, train.examples,
                                           train.mean_loss);
    if (!m.ok()) log->warn("{}", m.message());
  } else {
    log->info("no evaluation: {}", eval.status().message());
  }
  if (const std::string& path = config.training().export_path();
      !path.empty()) {
    absl::Status saved = trainer.Export(path);
    if (!saved.ok()) {
      log->error("export failed: {}", saved.message());
      return 1;
    }
  }
  const std::string json =
      SummaryJson(config, trainer, train, eval.ok() ? &*eval : nullptr,
                  train_seconds, evaluator);
  std::cout << json << std::endl;
  if (const std::string path = absl::GetFlag(FLAGS_summary_out);
      !path.empty()) {
    std::ofstream out(path);
    out << json << "\n";
    out.close();
    // The summary is optional to the launchers: the job still succeeded.
    if (!out) {
      log->warn("could not write the summary to {} (--summary_out)", path);
    }
  }
  return 0;
}

// Joins the job as a training worker, stopping on SIGINT/SIGTERM or a
// drain.
absl::StatusOr<std::unique_ptr<ps::WorkerSession>> StartSession(
    ps::TerminationSignals& signals, const ps::JobConfig& config,
    ps::WorkerTelemetry* telemetry, std::optional<ps::CurveKeys> curve) {
  ps::WorkerSession::Options options;
  options.config = config;
  options.scheduler = absl::GetFlag(FLAGS_scheduler);
  // Its shard is resumed by another worker if it dies or is preempted.
  options.trains_shards = true;
  options.curve = std::move(curve);
  options.instruments = telemetry->instruments();
  // SIGINT/SIGTERM; a drain (psctl drain) stops the session the same way.
  options.should_stop = [&signals] { return signals.requested(); };
  options.stop_check = kStopCheck;
  options.on_client = [telemetry](ps::KVClient* c) { telemetry->SetClient(c); };
  options.on_membership = [telemetry](ps::SchedulerClient* m) {
    telemetry->SetMembership(m);
  };
  return ps::WorkerSession::Start(std::move(options));
}

// The exit code for a session that did not start.
int StartFailed(const absl::Status& s) {
  auto log = ps::GetLogger("worker");
  // Stopped while joining: the session left with its shard where it was
  // given (preempted before training).
  if (s.code() == absl::StatusCode::kCancelled) return 0;
  if (ps::IsDropped(s)) {
    log->warn("{}", s.message());
    return kRejoin;
  }
  if (ps::IsSchedulerGone(s)) {
    log->error("{}", s.message());
    return kExitSchedulerGone;
  }
  if (ps::IsJobFailed(s)) {
    log->error("{}", s.message());
    return kExitJobFailed;
  }
  // Joining again after a drop: a job that finished meanwhile, or whose
  // ranks are all taken (replacements took over), needs nothing more.
  if (Rejoins() > 0 && (s.code() == absl::StatusCode::kResourceExhausted ||
                        ps::IsJobFinished(s))) {
    log->info("not joining again: {}", s.message());
    return 0;
  }
  log->error("{}", s.message());
  return 1;
}

void LogTrained(const ps::TrainResult& train) {
  auto log = ps::GetLogger("worker");
  log->info("trained {} examples in {:.1f} s ({:.0f} examples/s), shards [{}]",
            train.examples, train.seconds,
            train.seconds > 0 ? train.examples / train.seconds : 0.0,
            absl::StrJoin(train.shards, ","));
  if (train.read.bad_lines > 0) {
    log->warn("{} malformed line(s) skipped; the first: {}",
              train.read.bad_lines,
              absl::StrJoin(train.bad_lines.begin(),
                            train.bad_lines.begin() +
                                std::min<size_t>(train.bad_lines.size(), 5),
                            "; "));
  }
}

// Every shard is done: meets the others at train_done and, on the
// evaluator, evaluates and exports; leaves. A stop from here on only cuts
// the wrap-up short. Every worker's pushes are acknowledged before it
// arrives at train_done, so the evaluation sees the fully trained model.
int Finish(ps::WorkerSession& session, const ps::JobConfig& config,
           ps::Trainer& trainer, const ps::TrainResult& train, absl::Time start,
           const ps::TrainerHooks& hooks) {
  auto log = ps::GetLogger("worker");
  int exit_code = 0;
  absl::StatusOr<bool> evaluator = session.Finish(kBarrierTimeout);
  if (std::optional<int> code = Ended(session)) return *code;
  if (ps::IsJobFailed(evaluator.status())) {
    log->error("{}", evaluator.status().message());
    return kExitJobFailed;
  }
  if (!evaluator.ok()) {
    if (evaluator.status().code() == absl::StatusCode::kCancelled) {
      log->info("stop requested at the end of training: leaving");
    } else {
      log->error("{}", evaluator.status().message());
      exit_code = 1;
    }
  } else if (*evaluator) {
    exit_code = Evaluate(config, trainer, train, session.rank(), start, hooks);
    if (std::optional<int> code = Ended(session)) return *code;
    // Tell the others, even when stopping (a SIGTERM during the
    // evaluation): without this arrival they would evaluate again.
    if (absl::Status told = session.EvaluationDone(); !told.ok()) {
      log->warn("{}", told.message());
    }
  }
  absl::Status left = session.Leave(/*finished=*/exit_code == 0);
  if (!left.ok()) log->warn("{}", left.message());
  return exit_code;
}

// Trains and, on the evaluator, evaluates; leaves the job on every path
// once registered (the session leaves itself if stopped while joining), so
// the scheduler never waits for a heartbeat timeout to learn this worker
// is gone.
int Run(ps::TerminationSignals& signals, const ps::JobConfig& config,
        ps::WorkerTelemetry* telemetry, std::optional<ps::CurveKeys> curve) {
  auto log = ps::GetLogger("worker");
  const absl::Time start = absl::Now();
  auto started = StartSession(signals, config, telemetry, std::move(curve));
  if (!started.ok()) return StartFailed(started.status());
  ps::WorkerSession& session = **started;

  auto trainer = ps::Trainer::Create(config, session.kv(), session.rank(),
                                     session.num_workers());
  if (!trainer.ok()) {
    log->error("{}", trainer.status().message());
    return 2;
  }
  if (absl::Status ring = (*trainer)->UseDenseRing(
          session.membership(), absl::GetFlag(FLAGS_ring_host));
      !ring.ok()) {
    log->error("{}", ring.message());
    return 2;
  }
  ps::TrainerHooks hooks;
  hooks.on_step = [&session](uint64_t clock, const ps::DataPosition& next) {
    session.ReportProgress(clock, next);
  };
  hooks.on_trained = [telemetry](uint64_t examples, absl::Duration t) {
    telemetry->OnTrained(examples, t);
  };
  // What the scheduler's progress, time left and curves are made of.
  ps::SchedulerClient* membership = session.membership();
  hooks.on_step_trained = [membership](uint64_t examples, double loss_sum,
                                       uint64_t loss_examples,
                                       absl::Duration wait) {
    membership->AddTrained(examples, loss_sum, loss_examples, wait);
  };
  hooks.on_shard_batches = [membership](uint64_t batches) {
    membership->SetShardBatches(batches);
  };
  hooks.on_metric = [membership, log](const std::string& name, double value,
                                      uint64_t step) {
    absl::Status s = membership->ReportMetric(name, value, step);
    if (!s.ok()) log->warn("{}", s.message());
  };
  if (!session.initial_position()) {
    log->info("no shard of its own (joined at clock {}): asking for work",
              session.start_clock());
  }
  // The session's shard protocol: the start barrier of a fresh or restored
  // job, this worker's shard, then claims; a stop, a drain, a drop or the
  // scheduler gone end it.
  auto train = (*trainer)->Train(session.shards(), hooks);
  if (std::optional<int> code = Ended(session)) return *code;
  if (ps::IsJobFailed(train.status())) {
    // The scheduler's answer came before its view.
    log->error("{}", train.status().message());
    return kExitJobFailed;
  }
  if (!train.ok()) {
    log->error("training failed: {}", train.status().message());
    absl::Status left = session.Leave(false);
    if (!left.ok()) log->warn("{}", left.message());
    return 1;
  }
  LogTrained(*train);
  if (train->preempted) {
    const ps::DataPosition* at = train->position ? &*train->position : nullptr;
    absl::Status left = session.Leave(/*finished=*/false, at);
    if (!left.ok()) log->warn("{}", left.message());
    return 0;
  }
  return Finish(session, config, **trainer, *train, start, hooks);
}

}  // namespace

int main(int argc, char** argv) {
  ps::TerminationSignals signals;
  const std::vector<std::string> args(argv, argv + argc);  // to rejoin with
  // The launchers name the summary's file in the environment (a worker
  // command of the user's own gets no extra flags); a flag given wins.
  if (const char* summary_out = std::getenv("PS_SUMMARY_OUT");
      summary_out != nullptr) {
    absl::SetFlag(&FLAGS_summary_out, summary_out);
  }
  absl::ParseCommandLine(argc, argv);
  auto log = ps::GetLogger("worker");
  std::optional<ps::JobConfig> config = ps::StartNode(
      *log, absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_config),
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
  const int code = Run(signals, *config, &telemetry, *std::move(curve));
  if (code != kRejoin) return code;
  // The session is closed; free the HTTP port (a fixed --http_port is
  // bound again by the new image) before re-executing.
  endpoint->reset();
  return Rejoin(args);
}
