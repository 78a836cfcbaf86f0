// The scheduler is no single point of failure.
//
// 1. KilledSchedulerIsRestartedAndTakesTheJobBack/{ASYNC,BSP,SSP}: a job of
//    one scheduler, 3 servers and 2 workers (the trainer) trains logistic
//    regression on synthetic click data with a 100 ms heartbeat and a 1 s
//    heartbeat timeout. Per trial a seeded generator picks a worker rank
//    and a step: once that worker's clock (as the scheduler last heard it)
//    reaches the step, the scheduler is SIGKILLed; after a seeded delay of
//    0-3 s a new scheduler is started on the same port with the same
//    config, and must take the job back from its journal. The trials of a
//    mode alternate between replication 1 and 2 (odd trials replicate) and
//    between no checkpoints (the config names cluster.scheduler_state_dir)
//    and checkpoints (trials 2, 3, 6, 7, ...: checkpoint.dir with
//    interval_steps and no scheduler_state_dir, so the journal goes to the
//    default <checkpoint.dir>/scheduler). Every trial must end on its own
//    with every process exiting 0, exactly one summary, a test AUC within
//    0.005 of an undisturbed run of the same variant (taken in the same
//    test run), the restarted scheduler's log saying it "took the job back
//    from its journal" and its ClusterView counting scheduler_restarts >= 1.
// 2. LedgerHoldsAcrossASchedulerRestart: with replication 2 and the ledger
//    pushers of tests/replication_test.cc (tests/testing/ledger.h), the
//    scheduler is SIGKILLed mid-run and restarted after a seeded delay:
//    every key ends equal to minus the sum of its acknowledged pushes
//    (nothing acknowledged lost, nothing applied twice), and pushes are
//    acknowledged after the restart.
// 3. SchedulerGoneForGoodEndsEveryProcessThenARestoreResumes: the scheduler
//    is SIGKILLed after the first committed checkpoint and not restarted
//    (cluster.scheduler_unreachable_timeout_ms 3000): every server and
//    worker exits with code 4 within that bound plus one heartbeat timeout
//    (plus 10 s of slack for a loaded two-core machine; scaled by
//    PS_TIMEOUT_SCALE), and each one's last error line names the
//    scheduler's address. A new job with checkpoint.restore over the same
//    directory then restores the newest checkpoint whose MANIFEST existed
//    (its servers log that clock) and finishes with every process exiting 0.
//
// A job in which a node is declared dead (nobody kills a node here: the
// machine stalled it for longer than the heartbeat timeout, or a restarted
// scheduler did not take its nodes back) is abandoned at once, reported as
// STALLED with the scheduler's line, and run again once; a second stall
// fails the test.
//
// Flags (tests/testing/fault_flags.h; --test_arg=--fault_seed=5 under
// bazel test), each also read from the environment when the flag is not
// given (--test_env=FAULT_SEED=5):
//   --fault_seed=N    (FAULT_SEED)    default 1; 0 picks one from the time
//   --fault_trials=N  (FAULT_TRIALS)  trials per mode, default 10 (3 under
//       a sanitizer, PS_SANITIZER=1); also the ledger test's trials / 5
//       (at least 1)
//   --fault_trial=I   (FAULT_TRIAL)   run only trial I (replaying a failure)
//   --fault_heartbeat_timeout_ms=N (FAULT_HEARTBEAT_TIMEOUT_MS) default
//       1000 (3000 under a sanitizer)
// Every trial's choices are printed with the command that replays it.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/protocol.h"
#include "gtest/gtest.h"
#include "tests/testing/fault_flags.h"
#include "tests/testing/fault_trials.h"
#include "tests/testing/job_harness.h"
#include "tests/testing/ledger.h"

namespace ps::testing {
namespace {

constexpr int kServers = 3;
constexpr int kWorkers = 2;
// A job takes a few seconds, plus up to 3 s without a scheduler; one that
// runs this long has hung.
constexpr absl::Duration kJobTimeout = absl::Seconds(120);
// The longest a scheduler stays dead before its restart.
constexpr int kMaxRestartDelayMs = 3000;
// SchedulerGoneForGood...'s cluster.scheduler_unreachable_timeout_ms, and
// its job's training set.
constexpr int kUnreachableMs = 3000;
constexpr int kGoneNumTrain = 1000000;

// A generator for one trial: its choices depend only on (seed, test,
// mode, trial), so one trial can be replayed alone.
std::mt19937_64 TrialRng(uint32_t test, uint32_t mode, uint32_t trial) {
  return ::ps::testing::TrialRng(FaultSeed(), {test, mode, trial});
}

// What a trial's job is made of besides its mode.
struct Variant {
  bool replication = false;  // cluster.replication 2
  bool checkpoints = false;  // checkpoint.dir (journal in <dir>/scheduler)
  std::string Name() const {
    return absl::StrCat(replication ? "repl2" : "repl1",
                        checkpoints ? "-ckpt" : "-state_dir");
  }
  bool operator<(const Variant& o) const {
    return std::tie(replication, checkpoints) <
           std::tie(o.replication, o.checkpoints);
  }
};
Variant VariantOf(int trial) { return {trial % 2 == 1, (trial / 2) % 2 == 1}; }

// A checkpoint every this many steps of the job's clock: a few per job.
constexpr int kCheckpointInterval = 100;

// Small enough that a job takes about 3 s on two cores (1 s of it
// training: the scheduler is killed while the workers train).
// `dir` holds the job's scheduler state or checkpoints.
std::string JobConfig(const Mode& mode, const Variant& variant,
                      const std::string& dir,
                      const std::string& extra_cluster = "",
                      const std::string& checkpoint_extra = "",
                      int num_train = 300000) {
  const std::string cluster = absl::StrCat(
      "request_timeout_ms: 60000 failover_timeout_ms: 60000 on_worker_loss: "
      "REASSIGN ",
      variant.replication ? "replication: 2 " : "",
      variant.checkpoints
          ? ""
          : absl::StrCat("scheduler_state_dir: \"", dir, "/state\" "),
      extra_cluster);
  const std::string checkpoint =
      variant.checkpoints
          ? absl::StrCat("checkpoint { dir: \"", dir,
                         "/ckpt\" interval_steps: ", kCheckpointInterval,
                         " keep: 3 ", checkpoint_extra, " }")
          : "";
  return CtrJobConfig(
      JobHead(absl::StrCat("restart-", mode.name), kServers, kWorkers, 256,
              FaultHeartbeatTimeoutMs(), cluster),
      mode.consistency, num_train, checkpoint);
}

// The first "declared dead" line of any scheduler incarnation, or "": no
// node is killed in these tests, so any is a stall (or a scheduler that
// did not take its nodes back).
std::string FalseDeath(const JobHarness& job) {
  if (job.DeclaredDead().empty()) return "";
  std::vector<std::string> lines =
      LinesWith(SchedulerLogs(job), "declared dead");
  return lines.empty() ? "a node was declared dead" : lines[0];
}

// The clocks of the checkpoints under `dir` (ckpt-<clock>) whose MANIFEST
// exists, ascending.
std::vector<uint64_t> CommittedCheckpoints(const std::string& dir) {
  std::vector<uint64_t> clocks;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return clocks;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    uint64_t clock;
    if (!absl::StartsWith(name, "ckpt-") ||
        !absl::SimpleAtoi(name.substr(5), &clock)) {
      continue;
    }
    struct stat st;
    if (stat((dir + "/" + name + "/MANIFEST").c_str(), &st) == 0)
      clocks.push_back(clock);
  }
  closedir(d);
  std::sort(clocks.begin(), clocks.end());
  return clocks;
}

// The last error line ("... E [...") of a log, or "".
std::string LastErrorLine(const std::string& log) {
  static const std::regex kError("^\\S+ \\S+ E \\[");
  std::string last;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    const std::string l(line);
    if (std::regex_search(l, kError)) last = l;
  }
  return last;
}

class SchedulerRestartTest : public ::testing::TestWithParam<int> {
 protected:
  std::string BaseDir(const std::string& test) {
    const std::string dir = absl::StrCat(::testing::TempDir(), "/", test);
    mkdir(dir.c_str(), 0755);
    return dir;
  }

  // A fresh job in `dir` (created; files of an earlier run are
  // overwritten, but not its checkpoints: each run has its own dir).
  std::unique_ptr<JobHarness> StartJob(const std::string& dir,
                                       const std::string& config,
                                       int workers = kWorkers) {
    JobHarness::Options options;
    options.dir = dir;
    options.config = config;
    options.num_servers = kServers;
    options.num_workers = workers;
    auto job = JobHarness::Start(options);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *std::move(job) : nullptr;
  }

  // Waits for the job's end; every process must exit 0 (every scheduler
  // incarnation but the last was killed by the test) and exactly one
  // worker print a summary with a test AUC.
  JobRun Finish(JobHarness& job, const std::string& what) {
    JobRun run;
    auto result = job.Wait(kJobTimeout);
    run.stall = FalseDeath(job);
    if (!run.stall.empty()) return run;
    if (!result.ok()) {
      ADD_FAILURE() << what << ": " << result.status() << "\n"
                    << job.LogTails(40);
      return run;
    }
    bool ok = true;
    auto expect_code = [&](int code, const std::string& name) {
      if (code == 0) return;
      ok = false;
      ADD_FAILURE() << what << ": " << name << " exited with " << code
                    << ", expected 0";
    };
    expect_code(result->scheduler, "the (last) scheduler");
    for (size_t i = 0; i < result->servers.size(); ++i) {
      expect_code(result->servers[i], JobHarness::ServerName(i));
    }
    for (size_t i = 0; i < result->workers.size(); ++i) {
      expect_code(result->workers[i], JobHarness::WorkerName(i));
    }
    ok &= ExpectOneSummary(*result, what);
    run.outcome = CheckedOutcome(job, *result, ok, what, WorkersTrained(job));
    return run;
  }

  // Runs `attempt_fn(attempt)` until it does not stall, at most twice; a
  // second stall fails the test.
  template <typename Attempt>
  JobRun WithRetry(const std::string& what, Attempt attempt_fn) {
    return RetryStalled(what, FaultHeartbeatTimeoutMs(), attempt_fn, &stalls_,
                        "(--fault_heartbeat_timeout_ms), or a restarted "
                        "scheduler declares its recovered "
                        "nodes dead");
  }

  std::string ReplayCommand(const std::string& filter, int trial) const {
    return FaultReplayCommand("scheduler_restart_test", filter, trial);
  }

  // The undisturbed run of `variant` in this mode (run once per test run).
  const Outcome* Reference(const Variant& variant) {
    if (auto it = references_.find(variant); it != references_.end())
      return &it->second;
    const Mode& mode = kModes[GetParam()];
    const std::string what =
        absl::StrCat(mode.name, " reference ", variant.Name());
    JobRun run = WithRetry(what, [&](int attempt) {
      const std::string dir =
          absl::StrCat(BaseDir(absl::StrCat("restart-", mode.name)),
                       "/reference-", variant.Name(), "-", attempt);
      mkdir(dir.c_str(), 0755);
      std::unique_ptr<JobHarness> job =
          StartJob(dir, JobConfig(mode, variant, dir));
      if (job == nullptr) return JobRun();
      job->set_abort_check([&] { return FalseDeath(*job); });
      return Finish(*job, what);
    });
    if (!run.outcome) return nullptr;
    std::printf("%s: test AUC %.5f, %" PRIu64 " steps per worker, %" PRIu64
                " examples, %.1f s\n",
                what.c_str(), run.outcome->auc, run.outcome->steps,
                run.outcome->examples,
                absl::ToDoubleSeconds(run.outcome->elapsed));
    std::fflush(stdout);
    return &references_.emplace(variant, *run.outcome).first->second;
  }

  // How far a disturbed run's AUC may be from its reference: 0.005; in
  // ASYNC (whose runs differ by thread timing) at least the spread of the
  // undisturbed references of this test run (one per variant; the variant
  // does not change what is learnt), printed when it is the larger.
  double Tolerance() {
    if (std::string_view(kModes[GetParam()].name) != "ASYNC" ||
        references_.size() < 2) {
      return kAucTolerance;
    }
    double lo = INFINITY, hi = -INFINITY;
    for (const auto& [v, out] : references_) {
      lo = std::min(lo, out.auc);
      hi = std::max(hi, out.auc);
    }
    if (hi - lo > kAucTolerance) {
      std::printf(
          "  ASYNC: the undisturbed runs alone spread %.5f (> %.3f): that is "
          "the "
          "tolerance\n",
          hi - lo, kAucTolerance);
    }
    return std::max(kAucTolerance, hi - lo);
  }

  // Waits (up to 10 s) for the restarted scheduler's GetStatus and checks
  // it counts the restart; OK too when it already exited (the job ended
  // meanwhile: its log is checked instead). Returns what it saw, for the
  // notes.
  std::string CheckRestartCounted(JobHarness& job, const std::string& what) {
    const absl::Time give_up = absl::Now() + Scaled(absl::Seconds(10));
    while (absl::Now() < give_up) {
      auto status = job.Status();
      if (status.ok()) {
        const ClusterView& view = status->view();
        if (view.scheduler_restarts() < 1) {
          ADD_FAILURE() << what << ": the restarted scheduler's view counts "
                        << view.scheduler_restarts() << " scheduler restarts";
        }
        return absl::StrCat("view: scheduler_restarts ",
                            view.scheduler_restarts(), ", recovered epoch ",
                            view.recovered_epoch(), ", ",
                            view.recovered_nodes(), " nodes recovered");
      }
      if (!job.scheduler().running())
        return "the restarted scheduler ended before asked";
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE()
        << what << ": the restarted scheduler did not answer GetStatus in 10 s";
    return "no status";
  }

  std::map<Variant, Outcome> references_;
  int stalls_ = 0;
};

TEST_P(SchedulerRestartTest, KilledSchedulerIsRestartedAndTakesTheJobBack) {
  const Mode& mode = kModes[GetParam()];
  const absl::Time start = absl::Now();
  std::printf(
      "%s: fault seed %" PRIu64 ", %d trials, heartbeat timeout %d ms%s\n",
      mode.name, FaultSeed(), FaultTrials(), FaultHeartbeatTimeoutMs(),
      OnlyTrial() >= 0 ? absl::StrCat(" (only trial ", OnlyTrial(), ")").c_str()
                       : "");
  std::fflush(stdout);
  double min_delta = INFINITY, max_delta = -INFINITY;
  int jobs = 0, failed = 0;
  for (int trial = 0; trial < FaultTrials(); ++trial) {
    if (SkipTrial(trial)) continue;
    const Variant variant = VariantOf(trial);
    const Outcome* reference = Reference(variant);
    ASSERT_NE(reference, nullptr) << "no reference run for " << variant.Name();
    ASSERT_GT(reference->steps, 0u) << reference->summary;
    std::mt19937_64 rng = TrialRng(1, GetParam(), trial);
    const uint32_t victim_rank = static_cast<uint32_t>(rng() % kWorkers);
    // From its first step to 80% through its shard: the job still runs.
    const uint64_t step = 1 + rng() % (reference->steps * 8 / 10);
    const int delay_ms = static_cast<int>(rng() % (kMaxRestartDelayMs + 1));
    const std::string what = absl::StrFormat(
        "%s trial %d (%s): scheduler killed at worker rank %u's step %d, "
        "restarted %d ms later",
        mode.name, trial, variant.Name(), victim_rank, step, delay_ms);
    const std::string replay =
        ReplayCommand(absl::StrCat("*/", mode.name), trial);
    SCOPED_TRACE(AnnounceTrial(what, replay));
    std::string notes;
    JobRun run = WithRetry(what, [&](int attempt) -> JobRun {
      notes.clear();
      ++jobs;
      const std::string dir =
          absl::StrCat(BaseDir(absl::StrCat("restart-", mode.name)), "/trial-",
                       trial, "-", attempt);
      mkdir(dir.c_str(), 0755);
      std::unique_ptr<JobHarness> job =
          StartJob(dir, JobConfig(mode, variant, dir));
      if (job == nullptr) return JobRun();
      job->set_abort_check([&] { return FalseDeath(*job); });
      auto fail = [&](const absl::Status& status) {
        return FailedRun<JobRun>(status, what, *job);
      };
      absl::StatusOr<int> victim =
          WorkerWithRank(*job, kWorkers, victim_rank, absl::Seconds(30));
      if (!victim.ok()) return fail(victim.status());
      auto clock = job->WaitForStep(*victim, step, absl::Seconds(60));
      if (absl::IsAborted(clock.status())) return fail(clock.status());
      if (!clock.ok() || *clock >= kFinishedClock) {
        // The worker finished before the step: the job may be over.
        notes = absl::StrCat("the worker did not reach the step (",
                             clock.ok() ? "finished" : clock.status().message(),
                             ")");
      } else {
        notes = absl::StrCat("killed at clock ", *clock);
      }
      if (!job->SignalScheduler(SIGKILL)) {
        absl::StrAppend(&notes,
                        "; the scheduler had ended: nothing to restart");
        return Finish(*job, what);
      }
      (void)job->scheduler().Wait(absl::Seconds(10));
      job->SleepFor(absl::Milliseconds(delay_ms));
      if (absl::Status s = job->RestartScheduler(); !s.ok()) return fail(s);
      absl::StrAppend(&notes, "; ", CheckRestartCounted(*job, what));
      JobRun r = Finish(*job, what);
      if (!r.outcome) return r;
      const std::vector<std::string> took = LinesWith(
          ReadFile(job->scheduler().stderr_path()), "took the job back");
      if (took.empty()) {
        ADD_FAILURE()
            << what
            << ": the restarted scheduler's log does not say it took the "
            << "job back\n"
            << job->LogTails(40);
        return JobRun();
      }
      return r;
    });
    if (!run.outcome) {
      ++failed;
      std::printf("  FAILED (%s); replay: %s\n", notes.c_str(), replay.c_str());
      std::fflush(stdout);
      continue;
    }
    const double tolerance = Tolerance();
    const double delta = run.outcome->auc - reference->auc;
    min_delta = std::min(min_delta, delta);
    max_delta = std::max(max_delta, delta);
    if (std::fabs(delta) > tolerance) {
      ++failed;
      ADD_FAILURE() << what << ": test AUC " << run.outcome->auc
                    << " is more than " << tolerance << " from the undisturbed "
                    << variant.Name() << " run's " << reference->auc << "\n"
                    << run.outcome->summary;
      std::printf("  FAILED (AUC); replay: %s\n", replay.c_str());
    } else {
      std::printf("  test AUC %.5f (%+.5f), %" PRIu64 " examples, %.1f s: %s\n",
                  run.outcome->auc, delta, run.outcome->examples,
                  absl::ToDoubleSeconds(run.outcome->elapsed), notes.c_str());
    }
    std::fflush(stdout);
  }
  std::printf(
      "SUMMARY %s: AUC minus reference min %+.5f max %+.5f, %d disturbed jobs "
      "(%d failed, %d stalled and run again), %zu references, seed %" PRIu64
      ", %.1f s\n",
      mode.name, min_delta, max_delta, jobs, failed, stalls_,
      references_.size(), FaultSeed(),
      absl::ToDoubleSeconds(absl::Now() - start));
  std::fflush(stdout);
}

INSTANTIATE_TEST_SUITE_P(Modes, SchedulerRestartTest,
                         ::testing::Values(0, 1, 2), ModeNames(kModes));

// The ledger job of tests/replication_test.cc: 3 servers, replication 2,
// an SGD table the pushers push integers to.
std::string LedgerConfig(const std::string& dir) {
  return LedgerJobConfig(
      JobHead("restart-ledger", 3, 2, 64, FaultHeartbeatTimeoutMs(),
              absl::StrCat("request_timeout_ms: 60000 failover_timeout_ms: "
                           "60000 replication: 2 scheduler_state_dir: \"",
                           dir, "/state\"")));
}

using SchedulerRestartLedgerTest = SchedulerRestartTest;

TEST_F(SchedulerRestartLedgerTest, LedgerHoldsAcrossASchedulerRestart) {
  const int trials = std::max(1, FaultTrials() / 5);
  std::printf("ledger: fault seed %" PRIu64 ", %d trials\n", FaultSeed(),
              trials);
  for (int trial = 0; trial < trials; ++trial) {
    if (SkipTrial(trial)) continue;
    std::mt19937_64 rng = TrialRng(2, 0, trial);
    const int kill_after_ms = static_cast<int>(rng() % 500);
    const int delay_ms = static_cast<int>(rng() % (kMaxRestartDelayMs + 1));
    const std::string what = absl::StrFormat(
        "ledger trial %d: scheduler killed %d ms into the pushes, restarted %d "
        "ms later",
        trial, kill_after_ms, delay_ms);
    const std::string replay = ReplayCommand("*LedgerHolds*", trial);
    SCOPED_TRACE(AnnounceTrial(what, replay));
    std::string notes;
    JobRun run = WithRetry(what, [&](int attempt) -> JobRun {
      const std::string dir = absl::StrCat(BaseDir("restart-ledger"), "/trial-",
                                           trial, "-", attempt);
      mkdir(dir.c_str(), 0755);
      std::unique_ptr<JobHarness> job =
          StartJob(dir, LedgerConfig(dir), /*workers=*/0);
      if (job == nullptr) return JobRun();
      job->set_abort_check([&] { return FalseDeath(*job); });
      JobRun r;
      auto pushers = LedgerPushers::Start(
          LedgerPushers::ForJob(*job, FaultSeed() * 100 + trial),
          absl::Seconds(30));
      if (!pushers.ok()) {
        r.stall = FalseDeath(*job);
        if (r.stall.empty()) ADD_FAILURE() << what << ": " << pushers.status();
        return r;
      }
      absl::SleepFor(absl::Milliseconds(kill_after_ms));
      job->SignalScheduler(SIGKILL);
      (void)job->scheduler().Wait(absl::Seconds(10));
      absl::SleepFor(absl::Milliseconds(delay_ms));
      if (absl::Status s = job->RestartScheduler(); !s.ok()) {
        ADD_FAILURE() << what << ": " << s;
        return r;
      }
      const int64_t restarted_us = absl::ToUnixMicros(absl::Now());
      notes = CheckRestartCounted(*job, what);
      // Pushes go on with the restarted scheduler for a while.
      absl::SleepFor(absl::Seconds(1));
      LedgerPushers::Verdict verdict = pushers->StopAndVerify();
      auto result = job->Wait(absl::Seconds(60));
      r.stall = FalseDeath(*job);
      if (!r.stall.empty()) return r;
      for (const std::string& p : verdict.problems)
        ADD_FAILURE() << what << ": " << p;
      const size_t after = std::count_if(
          verdict.acks.begin(), verdict.acks.end(),
          [&](const LedgerPushers::Ack& a) {
            return a.ack_us > restarted_us;
          });
      absl::StrAppend(&notes, "; ", verdict.acknowledged,
                      " pushes acknowledged, ", after, " after the restart");
      if (after == 0 && verdict.problems.empty()) {
        ADD_FAILURE() << what << ": no push was acknowledged after the restart";
      }
      if (!result.ok()) {
        ADD_FAILURE() << what << ": " << result.status() << "\n"
                      << job->LogTails(40);
        return r;
      }
      bool ok = verdict.problems.empty() && after > 0;
      ok &= ExpectSchedulerAndServersExitedZero(*result, what);
      if (LinesWith(ReadFile(job->scheduler().stderr_path()),
                    "took the job back")
              .empty()) {
        ok = false;
        ADD_FAILURE()
            << what
            << ": the restarted scheduler's log does not say it took the "
            << "job back";
      }
      if (!ok) {
        ADD_FAILURE() << what << ": logs of " << dir << "\n"
                      << job->LogTails(30);
        return r;
      }
      r.outcome = Outcome();
      return r;
    });
    std::printf("  %s (%s)%s\n", run.outcome ? "ok" : "FAILED", notes.c_str(),
                run.outcome ? "" : absl::StrCat("; replay: ", replay).c_str());
    std::fflush(stdout);
  }
}

TEST_F(SchedulerRestartLedgerTest,
       SchedulerGoneForGoodEndsEveryProcessThenARestoreResumes) {
  const Mode& mode = kModes[1];  // BSP
  const Variant variant{false, true};
  std::mt19937_64 rng = TrialRng(3, 0, 0);
  const int kill_after_ms = static_cast<int>(rng() % 500);
  const std::string what = absl::StrFormat(
      "gone for good: scheduler killed %d ms after the first committed "
      "checkpoint, "
      "not restarted (unreachable timeout %d ms)",
      kill_after_ms, kUnreachableMs);
  std::printf("%s; seed %" PRIu64 "\n", what.c_str(), FaultSeed());
  std::fflush(stdout);
  SCOPED_TRACE(what);
  const std::string unreachable =
      absl::StrCat("scheduler_unreachable_timeout_ms: ", kUnreachableMs);
  // The nodes give up kUnreachableMs after their last acknowledged
  // heartbeat (at most a heartbeat timeout before the kill); 10 s more for
  // a loaded two-core machine.
  const absl::Duration bound =
      Scaled(absl::Milliseconds(kUnreachableMs + FaultHeartbeatTimeoutMs()) +
             absl::Seconds(10));
  std::string ckpt_dir;
  uint64_t newest = 0;
  JobRun killed = WithRetry(what, [&](int attempt) -> JobRun {
    const std::string dir =
        absl::StrCat(BaseDir("restart-gone"), "/attempt-", attempt);
    mkdir(dir.c_str(), 0755);
    ckpt_dir = dir + "/ckpt";
    // Long enough (about 4 s of training) that the kill comes mid-training.
    std::unique_ptr<JobHarness> job =
        StartJob(dir + "/first",
                 JobConfig(mode, variant, dir, unreachable, "", kGoneNumTrain));
    if (job == nullptr) return JobRun();
    job->set_abort_check([&] { return FalseDeath(*job); });
    JobRun r;
    const absl::Time give_up = absl::Now() + Scaled(absl::Seconds(60));
    while (CommittedCheckpoints(ckpt_dir).empty() && absl::Now() < give_up &&
           job->scheduler().running()) {
      if (!(r.stall = FalseDeath(*job)).empty()) return r;
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (CommittedCheckpoints(ckpt_dir).empty()) {
      ADD_FAILURE() << what << ": no checkpoint committed\n"
                    << job->LogTails(30);
      return r;
    }
    absl::SleepFor(absl::Milliseconds(kill_after_ms));
    if (!(r.stall = FalseDeath(*job)).empty()) return r;
    const absl::Time killed_at = absl::Now();
    if (!job->SignalScheduler(SIGKILL)) {
      ADD_FAILURE() << what
                    << ": the job was over before the kill (make it longer)\n"
                    << job->LogTails(30);
      return r;
    }
    (void)job->scheduler().Wait(absl::Seconds(10));
    bool ok = true;
    std::vector<std::pair<std::string, Subprocess*>> nodes;
    for (int i = 0; i < job->num_servers(); ++i) {
      nodes.emplace_back(JobHarness::ServerName(i), &job->server(i));
    }
    for (int i = 0; i < job->num_worker_processes(); ++i) {
      nodes.emplace_back(JobHarness::WorkerName(i), &job->worker(i));
    }
    for (auto& [name, p] : nodes) {
      // Polled every 10 ms: exited_at is that precise.
      auto code = p->Wait(bound - (absl::Now() - killed_at));
      if (!code.ok()) {
        ok = false;
        ADD_FAILURE() << what << ": " << name << " still runs "
                      << absl::FormatDuration(absl::Now() - killed_at)
                      << " after the scheduler was killed (bound "
                      << absl::FormatDuration(bound) << ")";
        continue;
      }
      const absl::Duration took = *p->exited_at() - killed_at;
      const std::string last_error = LastErrorLine(ReadFile(p->stderr_path()));
      std::printf("  %s exited with %d %.1f s after the kill; last error: %s\n",
                  name.c_str(), *code, absl::ToDoubleSeconds(took),
                  last_error.c_str());
      if (*code != 4) {
        ok = false;
        ADD_FAILURE() << what << ": " << name << " exited with " << *code
                      << ", expected 4";
      }
      if (last_error.find(job->address()) == std::string::npos) {
        ok = false;
        ADD_FAILURE() << what << ": " << name
                      << "'s last error line does not name " << job->address()
                      << ": '" << last_error << "'";
      }
    }
    if (!(r.stall = FalseDeath(*job)).empty()) return r;
    if (!ok) {
      ADD_FAILURE() << what << ": logs\n" << job->LogTails(20);
      return r;
    }
    r.outcome = Outcome();
    return r;
  });
  if (!killed.outcome) return;
  const std::vector<uint64_t> committed = CommittedCheckpoints(ckpt_dir);
  ASSERT_FALSE(committed.empty());
  newest = committed.back();
  std::printf("  newest committed checkpoint: clock %" PRIu64
              " (%zu committed)\n",
              newest, committed.size());
  std::fflush(stdout);

  // A new job over the same checkpoints resumes from the newest one.
  const std::string restore_what =
      absl::StrCat("restore after the scheduler was gone");
  const std::string run_dir =
      ckpt_dir.substr(0, ckpt_dir.size() - 5);  // strip "/ckpt"
  JobRun restored = WithRetry(restore_what, [&](int attempt) -> JobRun {
    const std::string dir = absl::StrCat(run_dir, "/restored-", attempt);
    if (attempt > 0) {
      // The stalled try's journal (<ckpt>/scheduler) must be too old to be
      // taken back, and its checkpoints count.
      absl::SleepFor(absl::Milliseconds(kUnreachableMs + 1000));
      newest = CommittedCheckpoints(ckpt_dir).back();
    }
    std::unique_ptr<JobHarness> job =
        StartJob(dir, JobConfig(mode, variant, run_dir, unreachable,
                                "restore: true", kGoneNumTrain));
    if (job == nullptr) return JobRun();
    job->set_abort_check([&] { return FalseDeath(*job); });
    JobRun r = Finish(*job, restore_what);
    if (!r.outcome) return r;
    int restored_servers = 0;
    for (int i = 0; i < job->num_servers(); ++i) {
      for (const std::string& line :
           LinesWith(ReadFile(job->server(i).stderr_path()), "restored ")) {
        static const std::regex kClock("\\(clock ([0-9]+)");
        std::smatch m;
        if (!std::regex_search(line, m, kClock)) continue;
        ++restored_servers;
        if (std::stoull(m[1].str()) != newest) {
          ADD_FAILURE() << restore_what << ": server" << i << " restored clock "
                        << m[1] << ", the newest committed checkpoint is "
                        << newest << ": " << line;
          return JobRun();
        }
      }
    }
    std::printf("  restored job: %d servers restored clock %" PRIu64
                ", summary start_clock %s, test AUC %.5f\n",
                restored_servers, newest,
                JsonRaw(r.outcome->summary, "start_clock").c_str(),
                r.outcome->auc);
    if (restored_servers == 0) {
      ADD_FAILURE() << restore_what << ": no server logged a restore\n"
                    << job->LogTails(30);
      return JobRun();
    }
    return r;
  });
  EXPECT_TRUE(restored.outcome.has_value());
}

}  // namespace
}  // namespace ps::testing

int main(int argc, char** argv) {
  return ps::testing::FaultTestMain(argc, argv, "scheduler_restart_test",
                                    {/*trials=*/10, /*sanitizer_trials=*/3,
                                     /*heartbeat_timeout_ms=*/1000,
                                     /*sanitizer_heartbeat_timeout_ms=*/3000});
}
