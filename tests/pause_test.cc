// Pauses (loopback only): a node declared dead that comes back (SIGSTOP
// past the heartbeat timeout, then SIGCONT) never acts on a stale view,
// and a paused scheduler does not turn against its healthy job.
//
// 1. PausedServerAcknowledgesNoPushForSlotsItLost: 3 servers with
//    replication 2 and the ledger pushers of tests/replication_test.cc
//    (tests/testing/ledger.h). A server (seeded rank; every server is the
//    primary of its own slots) is SIGSTOPped until the scheduler declared
//    it dead and at least 2.5 heartbeat timeouts passed, then SIGCONTed
//    while the pushes go on. The resumed server must learn it was dropped
//    and exit with code 3 ("dropped by the scheduler"), and every key must
//    end equal to minus the sum of its acknowledged pushes: no push the
//    stale server acknowledged for slots it no longer owns (the backup
//    that took them over would not have it), none lost, none applied twice.
// 2. PausedWorkerStopsOrRejoins/{BSP,ASYNC}: 2 servers and 2 workers (the
//    trainer) train logistic regression; at a seeded step a seeded worker
//    is SIGSTOPped for 2.5 heartbeat timeouts (plus a seeded 0-0.5 s) and
//    SIGCONTed after the scheduler declared it dead. It must stop at once
//    (exit 3) or rejoin and train (exit 0); the job must finish with the
//    others exiting 0, one summary, every example trained at least once
//    (the workers' "trained N examples" plus what a dropped worker had
//    reported of its shard when the scheduler handed it on, together at
//    least the undisturbed run's), a test AUC within 0.005 of an undisturbed
//    run of the same mode (ASYNC: at least the spread of two undisturbed runs,
//    printed when larger), and no process outliving the job's end (the summary
//    printer's or the scheduler's exit, whichever is first) by more than
//    5 s (scaled by PS_TIMEOUT_SCALE); that time is printed. The victim is
//    paused early (by 35% of its steps) so the job normally still runs
//    when it resumes; if the job ended during the pause anyway, the victim
//    cannot learn anything from a scheduler that is gone: it may exit 4
//    after cluster.scheduler_unreachable_timeout_ms (5 heartbeat timeouts
//    here), and the 5 s bound counts from the SIGCONT plus that timeout.
// 3. PausedSchedulerTest/{ASYNC,BSP,SSP}: 3 servers (replication 2) and 2
//    workers; at a seeded step (10-35% of the job) the scheduler is
//    SIGSTOPped for 3 heartbeat timeouts, then SIGCONTed. It must notice
//    its own stall and declare no node dead: the job finishes as in 2 (one
//    summary, the undisturbed AUC, every example trained) with every
//    process exiting 0.
//
// A job in which a node that the test did not pause is declared dead (the
// machine stalled it past the timeout) proves nothing: it is abandoned,
// reported as STALLED and run again once; a second stall fails the test.
//
// Flags (tests/testing/fault_flags.h; --test_arg=--fault_seed=5 under
// bazel test), each also read from the environment when the flag is not
// given (--test_env=FAULT_SEED=5):
//   --fault_seed=N    (FAULT_SEED)    default 1; 0 picks one from the time
//   --fault_trials=N  (FAULT_TRIALS)  worker trials per mode, default 2 (1
//       under a sanitizer, PS_SANITIZER=1); server trials: 1
//   --fault_trial=I   (FAULT_TRIAL)   run only trial I (replaying a failure)
//   --fault_heartbeat_timeout_ms=N (FAULT_HEARTBEAT_TIMEOUT_MS) default
//       1000 (3000 under a sanitizer)
// Every trial's choices are printed with the command that replays it.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

constexpr absl::Duration kJobTimeout = absl::Seconds(120);
// How long a process may outlive the job's end.
constexpr absl::Duration kMaxOutlive = absl::Seconds(5);

// The pause: past the point where the scheduler declares the node dead.
absl::Duration Pause() {
  return absl::Milliseconds(FaultHeartbeatTimeoutMs() * 5 / 2);
}

// Choices depend only on (seed, test, mode, trial): one trial replays
// alone.
std::mt19937_64 TrialRng(uint32_t test, uint32_t mode, uint32_t trial) {
  return ::ps::testing::TrialRng(FaultSeed(), {test, mode, trial});
}

std::string ReplayCommand(const std::string& filter, int trial) {
  return FaultReplayCommand("pause_test", filter, trial);
}

// The scheduler's "declared dead" lines not about `paused` (a substring
// naming the paused node, e.g. "worker rank 1 (node 4)"), or "".
std::string FalseDeath(const JobHarness& job, const std::string& paused) {
  for (const std::string& line :
       LinesWith(ReadFile(job.dir() + "/scheduler.log"), "declared dead")) {
    if (paused.empty() || line.find(paused) == std::string::npos) return line;
  }
  return "";
}

struct JobRun {
  bool ok = false;
  std::string stall;
  double auc = NAN;
  uint64_t steps = 0, examples = 0;
  std::string summary;
  absl::Duration elapsed, outlived;
  bool ended_in_pause = false;  // the job ended before the victim resumed
};

// Runs `attempt_fn` until it does not stall (at most twice).
template <typename Attempt>
JobRun WithRetry(const std::string& what, Attempt attempt_fn) {
  return RetryStalled(what, FaultHeartbeatTimeoutMs(), attempt_fn, nullptr,
                      "(--fault_heartbeat_timeout_ms)");
}

std::string BaseDir(const std::string& test) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/", test);
  mkdir(dir.c_str(), 0755);
  return dir;
}

// ---- 1. A paused server ----

std::string LedgerConfig() {
  return LedgerJobConfig(
      JobHead("pause-ledger", 3, 2, 64, FaultHeartbeatTimeoutMs(),
              "request_timeout_ms: 60000 failover_timeout_ms: 60000 "
              "replication: 2"));
}

TEST(PauseTest, PausedServerAcknowledgesNoPushForSlotsItLost) {
  const int trial = 0;
  if (OnlyTrial() > 0) GTEST_SKIP() << "one server trial only";
  std::mt19937_64 rng = TrialRng(1, 0, trial);
  const uint32_t victim_rank = static_cast<uint32_t>(rng() % 3);
  const int stop_after_ms = static_cast<int>(rng() % 500);
  const std::string what = absl::StrFormat(
      "server trial %d: server rank %u SIGSTOPped %d ms into the pushes for %s",
      trial, victim_rank, stop_after_ms, absl::FormatDuration(Pause()));
  const std::string replay = ReplayCommand("*PausedServer*", trial);
  std::printf("%s; seed %" PRIu64 "\n", what.c_str(), FaultSeed());
  std::fflush(stdout);
  SCOPED_TRACE(absl::StrCat(what, "; replay: ", replay));
  std::string notes;
  const JobRun run = WithRetry(what, [&](int attempt) -> JobRun {
    JobRun r;
    const std::string dir =
        absl::StrCat(BaseDir("pause-server"), "/attempt-", attempt);
    JobHarness::Options options;
    options.dir = dir;
    options.config = LedgerConfig();
    options.num_servers = 3;
    options.num_workers = 0;
    auto started = JobHarness::Start(options);
    if (!started.ok()) {
      ADD_FAILURE() << started.status();
      return r;
    }
    JobHarness& job = **started;
    int victim = -1;
    for (int i = 0; i < job.num_servers(); ++i) {
      std::optional<uint32_t> rank =
          WaitForServerRank(job, i, absl::Seconds(20));
      if (!rank) {
        ADD_FAILURE() << what << ": server" << i << " did not register\n"
                      << job.LogTails(20);
        return r;
      }
      if (*rank == victim_rank) victim = i;
    }
    const std::string paused =
        absl::StrCat("server rank ", victim_rank, " (node");
    job.set_abort_check([&] { return FalseDeath(job, paused); });
    auto pushers = LedgerPushers::Start(
        LedgerPushers::ForJob(job, FaultSeed() * 100 + trial),
        absl::Seconds(30));
    if (!pushers.ok()) {
      r.stall = FalseDeath(job, "");
      if (r.stall.empty()) ADD_FAILURE() << what << ": " << pushers.status();
      return r;
    }
    absl::SleepFor(absl::Milliseconds(stop_after_ms));
    const absl::Time stopped = absl::Now();
    job.SignalServer(victim, SIGSTOP);
    // Paused until the scheduler gave up on it and the pause is over.
    auto declared_dead = [&] {
      for (const std::string& line :
           LinesWith(ReadFile(dir + "/scheduler.log"), "declared dead")) {
        if (line.find(paused) != std::string::npos) return true;
      }
      return false;
    };
    bool declared = false;
    while (absl::Now() < stopped + Scaled(absl::Seconds(20))) {
      declared = declared_dead();
      if (declared && absl::Now() >= stopped + Pause()) break;
      if (!(r.stall = FalseDeath(job, paused)).empty()) {
        job.server(victim).Signal(SIGCONT);
        return r;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    const absl::Time resumed = absl::Now();
    job.server(victim).Signal(SIGCONT);
    notes = absl::StrFormat("paused %.2f s, %s",
                            absl::ToDoubleSeconds(resumed - stopped),
                            declared ? "declared dead" : "NOT declared dead");
    if (!declared) {
      ADD_FAILURE()
          << what << ": the scheduler did not declare the paused server dead\n"
          << job.LogTails(20);
      return r;
    }
    // The resumed server learns it was dropped and exits; the pushes go on.
    auto code = job.server(victim).Wait(absl::Seconds(10));
    absl::SleepFor(absl::Seconds(1));
    LedgerPushers::Verdict verdict = pushers->StopAndVerify();
    auto result = job.Wait(absl::Seconds(60));
    if (!(r.stall = FalseDeath(job, paused)).empty()) return r;
    bool ok = true;
    for (const std::string& p : verdict.problems) {
      ok = false;
      ADD_FAILURE() << what << ": " << p;
    }
    absl::StrAppend(&notes, "; ", verdict.acknowledged, " pushes acknowledged");
    const std::string victim_log = ReadFile(job.server(victim).stderr_path());
    if (!code.ok()) {
      ok = false;
      ADD_FAILURE() << what
                    << ": the resumed server still ran 10 s after SIGCONT";
    } else {
      absl::StrAppendFormat(
          &notes, "; the resumed server exited with %d %.2f s after SIGCONT",
          *code,
          absl::ToDoubleSeconds(*job.server(victim).exited_at() - resumed));
      if (*code != 3 ||
          victim_log.find("dropped by the scheduler") == std::string::npos) {
        ok = false;
        ADD_FAILURE() << what << ": the resumed server exited with " << *code
                      << " (expected 3, 'dropped by the scheduler' in its log)";
      }
    }
    if (!result.ok()) {
      ok = false;
      ADD_FAILURE() << what << ": " << result.status();
    } else {
      ok &= ExpectSchedulerAndServersExitedZero(*result, what, victim);
    }
    if (!ok) {
      ADD_FAILURE() << what << ": logs of " << dir << "\n" << job.LogTails(30);
      return r;
    }
    r.ok = true;
    return r;
  });
  std::printf("  %s (%s)%s\n", run.ok ? "ok" : "FAILED", notes.c_str(),
              run.ok ? "" : absl::StrCat("; replay: ", replay).c_str());
  std::fflush(stdout);
}

// ---- 2. A paused worker ----

constexpr Mode kPauseModes[] = {kBspMode, kAsyncMode};
constexpr int kWorkers = 2;
// Enough that a survivor still trains when the pause ends (one worker of
// an ASYNC job alone trains about 300k examples/s here); a job takes about
// 5 s. Each worker's shard is kNumTrain / kWorkers examples per epoch.
constexpr int kNumTrain = 1500000;
constexpr uint64_t kBatch = 256;
// cluster.scheduler_unreachable_timeout_ms of the worker jobs: a victim
// resumed after the job ended (its scheduler gone) can learn nothing more
// and gives up after this long (exit 4).
int UnreachableMs() { return 5 * FaultHeartbeatTimeoutMs(); }

std::string JobConfig(const Mode& mode) {
  return CtrJobConfig(
      JobHead(absl::StrCat("pause-", mode.name), 2, kWorkers, 256,
              FaultHeartbeatTimeoutMs(),
              absl::StrCat("request_timeout_ms: 60000 on_worker_loss: REASSIGN "
                           "scheduler_unreachable_timeout_ms: ",
                           UnreachableMs())),
      mode.consistency, kNumTrain);
}

// Waits for the job's end and checks it; `victim` (or -1) may exit 0 or 3.
// `resumed`: when the victim was SIGCONTed (InfinitePast if none). A
// "declared dead" line not about `paused` is a stall.
JobRun Finish(JobHarness& job, int victim, const std::string& paused,
              const std::string& what,
              absl::Time resumed = absl::InfinitePast()) {
  JobRun run;
  auto result = job.Wait(kJobTimeout);
  if (!(run.stall = FalseDeath(job, paused)).empty()) return run;
  if (!result.ok()) {
    ADD_FAILURE() << what << ": " << result.status() << "\n"
                  << job.LogTails(40);
    return run;
  }
  bool ok = ExpectSchedulerAndServersExitedZero(*result, what);
  // Resumed after the job's end, the victim finds no scheduler: it gives
  // up after cluster.scheduler_unreachable_timeout_ms (exit 4).
  const bool ended_in_pause = *job.scheduler().exited_at() < resumed;
  for (size_t i = 0; i < result->workers.size(); ++i) {
    const int code = result->workers[i];
    if (code == 0 || (static_cast<int>(i) == victim && code == 3)) continue;
    if (static_cast<int>(i) == victim && code == 4 && ended_in_pause) continue;
    ok = false;
    ADD_FAILURE() << what << ": worker" << i << " exited with " << code
                  << ", expected 0"
                  << (static_cast<int>(i) == victim ? " or 3" : "");
  }
  ok &= ExpectOneSummary(*result, what);
  run.summary = result->summary;
  run.elapsed = result->elapsed;
  run.auc = JsonNumber(result->summary, "test_auc").value_or(NAN);
  run.steps = static_cast<uint64_t>(
      JsonNumber(result->summary, "rank0_steps").value_or(0));
  run.examples = ExamplesTrainedWithOrphans(job, kNumTrain / kWorkers, kBatch);
  if (!std::isfinite(run.auc)) {
    ok = false;
    ADD_FAILURE() << what << ": no test_auc in the summary '" << result->summary
                  << "'";
  }
  // The job's end: the summary printer's exit (it exits right after
  // printing) or the scheduler's, whichever came first.
  absl::Time end = *job.scheduler().exited_at(), last = end;
  for (int i = 0; i < job.num_worker_processes(); ++i) {
    const absl::Time t = *job.worker(i).exited_at();
    if (!result->worker_summaries[i].empty()) end = std::min(end, t);
    last = std::max(last, t);
  }
  for (int i = 0; i < job.num_servers(); ++i)
    last = std::max(last, *job.server(i).exited_at());
  run.outlived = last - end;
  run.ended_in_pause = ended_in_pause;
  if (ended_in_pause) {
    // Measured from the SIGCONT, less the victim's give-up time.
    run.outlived = last - resumed - absl::Milliseconds(UnreachableMs());
  }
  if (run.outlived > Scaled(kMaxOutlive)) {
    ok = false;
    ADD_FAILURE() << what << ": the last process exited "
                  << absl::FormatDuration(run.outlived)
                  << " after the job's end (bound "
                  << absl::FormatDuration(Scaled(kMaxOutlive)) << ")";
  }
  if (!ok) {
    ADD_FAILURE() << what << ": logs of " << job.dir() << "\n"
                  << job.LogTails(40);
    return run;
  }
  run.ok = true;
  return run;
}

// A job of `num_servers` servers and kWorkers trainers under
// BaseDir(`test`)/`run`; null (with a failure added) when it cannot start.
std::unique_ptr<JobHarness> StartJob(const std::string& test,
                                     const std::string& run,
                                     const std::string& config,
                                     int num_servers) {
  JobHarness::Options options;
  options.dir = absl::StrCat(BaseDir(test), "/", run);
  options.config = config;
  options.num_servers = num_servers;
  options.num_workers = kWorkers;
  auto job = JobHarness::Start(options);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *std::move(job) : nullptr;
}

// The undisturbed runs of a mode: one, two in ASYNC (whose runs differ by
// thread timing) to measure their spread. `start` starts the job of a run.
struct References {
  JobRun first;
  double auc = NAN;        // their mean test AUC
  double tolerance = NAN;  // kAucTolerance, or their spread when larger
};
template <typename Start>
std::optional<References> RunReferences(const Mode& mode, Start start) {
  std::vector<JobRun> runs;
  const int num_references = std::string_view(mode.name) == "ASYNC" ? 2 : 1;
  for (int k = 0; k < num_references; ++k) {
    const std::string what = absl::StrCat(mode.name, " reference ", k);
    JobRun ref = WithRetry(what, [&](int attempt) -> JobRun {
      std::unique_ptr<JobHarness> job =
          start(absl::StrCat("reference-", k, "-", attempt));
      if (job == nullptr) return JobRun();
      job->set_abort_check([&] { return FalseDeath(*job, ""); });
      return Finish(*job, -1, "", what);
    });
    if (!ref.ok) return std::nullopt;
    if (ref.steps == 0) {
      ADD_FAILURE() << what << ": no steps in " << ref.summary;
      return std::nullopt;
    }
    std::printf("%s: test AUC %.5f, %" PRIu64 " steps, %" PRIu64
                " examples, %.1f s\n",
                what.c_str(), ref.auc, ref.steps, ref.examples,
                absl::ToDoubleSeconds(ref.elapsed));
    runs.push_back(ref);
  }
  References refs;
  refs.first = runs[0];
  double lo = INFINITY, hi = -INFINITY, sum = 0;
  for (const JobRun& r : runs) {
    sum += r.auc;
    lo = std::min(lo, r.auc);
    hi = std::max(hi, r.auc);
  }
  refs.auc = sum / runs.size();
  refs.tolerance = std::max(kAucTolerance, hi - lo);
  if (refs.tolerance > kAucTolerance) {
    std::printf(
        "%s: the undisturbed runs alone spread %.5f (> %.3f): that is the "
        "tolerance\n",
        mode.name, hi - lo, kAucTolerance);
  }
  std::fflush(stdout);
  return refs;
}

// Adds failures unless `run` is within the references' AUC tolerance and
// trained at least their examples; whether it is.
bool ExpectLikeReference(const JobRun& run, const References& refs,
                         const std::string& what) {
  bool ok = true;
  if (std::fabs(run.auc - refs.auc) > refs.tolerance) {
    ok = false;
    ADD_FAILURE() << what << ": test AUC " << run.auc << " is more than "
                  << refs.tolerance << " from the undisturbed " << refs.auc
                  << "\n"
                  << run.summary;
  }
  if (run.examples < refs.first.examples) {
    ok = false;
    ADD_FAILURE() << what << ": the workers trained " << run.examples
                  << " examples together, the undisturbed run "
                  << refs.first.examples << ": some were never trained";
  }
  return ok;
}

class PausedWorkerTest : public ::testing::TestWithParam<int> {
 protected:
  const Mode& mode() const { return kPauseModes[GetParam()]; }

  std::unique_ptr<JobHarness> StartJob(const std::string& run) {
    return ::ps::testing::StartJob(absl::StrCat("pause-", mode().name), run,
                                   JobConfig(mode()), 2);
  }
};

TEST_P(PausedWorkerTest, PausedWorkerStopsOrRejoins) {
  const absl::Time start = absl::Now();
  std::printf("%s: fault seed %" PRIu64
              ", %d trials, heartbeat timeout %d ms, pause %s\n",
              mode().name, FaultSeed(), FaultTrials(),
              FaultHeartbeatTimeoutMs(), absl::FormatDuration(Pause()).c_str());
  const std::optional<References> refs = RunReferences(
      mode(), [&](const std::string& run) { return StartJob(run); });
  ASSERT_TRUE(refs.has_value());
  const JobRun& reference = refs->first;

  int failed = 0;
  for (int trial = 0; trial < FaultTrials(); ++trial) {
    if (SkipTrial(trial)) continue;
    std::mt19937_64 rng = TrialRng(2, GetParam(), trial);
    const uint32_t victim_rank = static_cast<uint32_t>(rng() % kWorkers);
    // Early enough that the survivor still trains when the pause ends.
    const uint64_t step = 1 + rng() % (reference.steps * 35 / 100);
    const absl::Duration pause = Pause() + absl::Milliseconds(rng() % 501);
    const std::string what = absl::StrFormat(
        "%s trial %d: worker rank %u SIGSTOPped at step %d for %s", mode().name,
        trial, victim_rank, step, absl::FormatDuration(pause));
    const std::string replay =
        ReplayCommand(absl::StrCat("*PausedWorker*/", mode().name), trial);
    SCOPED_TRACE(AnnounceTrial(what, replay));
    std::string notes;
    JobRun run = WithRetry(what, [&](int attempt) -> JobRun {
      notes.clear();
      std::unique_ptr<JobHarness> job =
          StartJob(absl::StrCat("trial-", trial, "-", attempt));
      if (job == nullptr) return JobRun();
      std::string paused =
          "(unset)";  // no node is paused yet: every death is false
      job->set_abort_check([&] { return FalseDeath(*job, paused); });
      auto fail = [&](const absl::Status& status) {
        return FailedRun<JobRun>(status, what, *job);
      };
      absl::StatusOr<int> victim_index =
          WorkerWithRank(*job, kWorkers, victim_rank, absl::Seconds(30));
      if (!victim_index.ok()) return fail(victim_index.status());
      const int victim = *victim_index;
      auto clock = job->WaitForStep(victim, step, absl::Seconds(60));
      if (absl::IsAborted(clock.status())) return fail(clock.status());
      if (!clock.ok() || *clock >= kFinishedClock) {
        notes = "not paused (it had finished its part)";
        return Finish(*job, -1, "", what);
      }
      paused = absl::StrCat("worker rank ", victim_rank, " (node ",
                            job->node_id(victim), ")");
      const absl::Time stopped = absl::Now();
      job->Signal(victim, SIGSTOP);
      absl::Status gone = job->WaitUntilGone(victim, absl::Seconds(20));
      const bool declared =
          gone.ok() && !LinesWith(ReadFile(job->dir() + "/scheduler.log"),
                                  paused + " declared dead")
                            .empty();
      job->SleepFor(stopped + pause - absl::Now());
      const absl::Time resumed = absl::Now();
      job->worker(victim).Signal(SIGCONT);
      if (!gone.ok()) return fail(gone);
      notes = absl::StrFormat(
          "paused at clock %d for %.2f s, %s", *clock,
          absl::ToDoubleSeconds(resumed - stopped),
          declared ? "declared dead" : "gone (finished) before the timeout");
      JobRun r = Finish(*job, victim, paused, what, resumed);
      if (r.ended_in_pause) {
        absl::StrAppend(
            &notes,
            "; the job ended during the pause (the last process's time "
            "is counted from the SIGCONT plus the unreachable timeout)");
      }
      if (!r.ok) return r;
      const std::string log = ReadFile(job->worker(victim).stderr_path());
      absl::StrAppendFormat(
          &notes, "; the victim exited with %d %.2f s after SIGCONT%s",
          *job->worker(victim).Wait(absl::ZeroDuration()),
          absl::ToDoubleSeconds(*job->worker(victim).exited_at() - resumed),
          log.find("dropped by the scheduler") != std::string::npos
              ? " (logged 'dropped by the scheduler')"
              : "");
      return r;
    });
    if (!run.ok) {
      ++failed;
      std::printf("  FAILED (%s); replay: %s\n", notes.c_str(), replay.c_str());
      std::fflush(stdout);
      continue;
    }
    const bool ok = ExpectLikeReference(run, *refs, what);
    failed += !ok;
    std::printf(
        "  %s: test AUC %.5f (%+.5f), %" PRIu64
        " examples, last process %.2f s after the job's end, %.1f s: %s%s\n",
        ok ? "ok" : "FAILED", run.auc, run.auc - refs->auc, run.examples,
        absl::ToDoubleSeconds(run.outlived), absl::ToDoubleSeconds(run.elapsed),
        notes.c_str(), ok ? "" : absl::StrCat("; replay: ", replay).c_str());
    std::fflush(stdout);
  }
  std::printf("SUMMARY %s: %d failed, seed %" PRIu64 ", %.1f s\n", mode().name,
              failed, FaultSeed(), absl::ToDoubleSeconds(absl::Now() - start));
  std::fflush(stdout);
}

INSTANTIATE_TEST_SUITE_P(Modes, PausedWorkerTest, ::testing::Values(0, 1),
                         ModeNames(kPauseModes));

// ---- 3. A paused scheduler ----

constexpr Mode kSchedulerPauseModes[] = {kAsyncMode, kBspMode, kSspMode};
constexpr int kReplicatedServers = 3;

// 3 servers with replication 2: a scheduler that declared healthy servers
// dead would leave slots with one copy or none.
std::string ReplicatedJobConfig(const Mode& mode) {
  return CtrJobConfig(
      JobHead(absl::StrCat("pause-scheduler-", mode.name), kReplicatedServers,
              kWorkers, 256, FaultHeartbeatTimeoutMs(),
              absl::StrCat("request_timeout_ms: 60000 on_worker_loss: REASSIGN "
                           "replication: 2 scheduler_unreachable_timeout_ms: ",
                           UnreachableMs())),
      mode.consistency, kNumTrain);
}

// The scheduler's pause: 3 heartbeat timeouts, well past the point where
// it would declare every node dead if it judged them across its own stall,
// and below cluster.scheduler_unreachable_timeout_ms (5 timeouts), where
// the nodes give up on it.
absl::Duration SchedulerPause() {
  return absl::Milliseconds(3 * FaultHeartbeatTimeoutMs());
}

class PausedSchedulerTest : public ::testing::TestWithParam<int> {
 protected:
  const Mode& mode() const { return kSchedulerPauseModes[GetParam()]; }

  std::unique_ptr<JobHarness> StartJob(const std::string& run) {
    return ::ps::testing::StartJob(
        absl::StrCat("pause-scheduler-", mode().name), run,
        ReplicatedJobConfig(mode()), kReplicatedServers);
  }
};

// The scheduler SIGSTOPped mid-job for 3 heartbeat timeouts, then
// SIGCONTed: it notices its own stall ("the failure detector did not run
// for") and declares no node dead; training pauses while the servers'
// leases are lapsed and resumes; the job finishes at the undisturbed AUC
// with every process exiting 0. A death declared before the pause is a
// stall of the machine (run again once); one after it fails the test.
TEST_P(PausedSchedulerTest, NoNodeIsDeclaredDeadAndTheJobFinishes) {
  const absl::Time start = absl::Now();
  std::printf("%s: fault seed %" PRIu64
              ", %d trials, heartbeat timeout %d ms, scheduler paused %s\n",
              mode().name, FaultSeed(), FaultTrials(),
              FaultHeartbeatTimeoutMs(),
              absl::FormatDuration(SchedulerPause()).c_str());
  const std::optional<References> refs = RunReferences(
      mode(), [&](const std::string& run) { return StartJob(run); });
  ASSERT_TRUE(refs.has_value());
  int failed = 0;
  for (int trial = 0; trial < FaultTrials(); ++trial) {
    if (SkipTrial(trial)) continue;
    std::mt19937_64 rng = TrialRng(3, GetParam(), trial);
    // Between 10% and 35% of the way: the job outlasts the pause.
    const uint64_t lo = refs->first.steps / 10;
    const uint64_t step = lo + 1 + rng() % (refs->first.steps * 25 / 100);
    const std::string what = absl::StrFormat(
        "%s trial %d: scheduler SIGSTOPped at worker rank 0's step %d for %s",
        mode().name, trial, step, absl::FormatDuration(SchedulerPause()));
    const std::string replay =
        ReplayCommand(absl::StrCat("*PausedScheduler*/", mode().name), trial);
    SCOPED_TRACE(AnnounceTrial(what, replay));
    std::string notes;
    JobRun run = WithRetry(what, [&](int attempt) -> JobRun {
      notes.clear();
      std::unique_ptr<JobHarness> job =
          StartJob(absl::StrCat("trial-", trial, "-", attempt));
      if (job == nullptr) return JobRun();
      job->set_abort_check([&] { return FalseDeath(*job, ""); });
      absl::StatusOr<int> watched =
          WorkerWithRank(*job, kWorkers, 0, absl::Seconds(30));
      if (!watched.ok()) return FailedRun<JobRun>(watched.status(), what, *job);
      auto clock = job->WaitForStep(*watched, step, absl::Seconds(60));
      if (!clock.ok() || *clock >= kFinishedClock) {
        return FailedRun<JobRun>(clock.ok()
                                     ? absl::FailedPreconditionError(
                                           "worker 0 finished before the pause")
                                     : clock.status(),
                                 what, *job);
      }
      const absl::Time stopped = absl::Now();
      if (!job->SignalScheduler(SIGSTOP)) {
        return FailedRun<JobRun>(
            absl::InternalError("the scheduler was not running"), what, *job);
      }
      job->SleepFor(stopped + SchedulerPause() - absl::Now());
      const absl::Time resumed = absl::Now();
      job->SignalScheduler(SIGCONT);
      notes = absl::StrFormat("paused at clock %d for %.2f s", *clock,
                              absl::ToDoubleSeconds(resumed - stopped));
      JobRun r = Finish(*job, -1, "", what, resumed);
      if (!r.stall.empty()) {
        // Declared after the pause began: the fault under test.
        ADD_FAILURE() << what << ": the scheduler declared a healthy node "
                      << "dead across its own pause: " << r.stall << "\n"
                      << job->LogTails(40);
        return JobRun();
      }
      const std::string noticed =
          LineWith(ReadFile(job->dir() + "/scheduler.log"),
                   "the failure detector did not run for");
      if (noticed.empty()) {
        ADD_FAILURE() << what << ": the scheduler did not notice its pause "
                      << "(no 'the failure detector did not run for' line)";
        r.ok = false;
      }
      absl::StrAppend(&notes, "; ",
                      noticed.empty() ? "(stall not noticed)" : noticed);
      return r;
    });
    bool ok = run.ok;
    if (ok) ok = ExpectLikeReference(run, *refs, what);
    failed += !ok;
    std::printf("  %s: test AUC %.5f (%+.5f), %" PRIu64
                " examples, %.1f s: %s%s\n",
                ok ? "ok" : "FAILED", run.auc, run.auc - refs->auc,
                run.examples, absl::ToDoubleSeconds(run.elapsed), notes.c_str(),
                ok ? "" : absl::StrCat("; replay: ", replay).c_str());
    std::fflush(stdout);
  }
  std::printf("SUMMARY scheduler paused, %s: %d failed, seed %" PRIu64
              ", %.1f s\n",
              mode().name, failed, FaultSeed(),
              absl::ToDoubleSeconds(absl::Now() - start));
  std::fflush(stdout);
}

INSTANTIATE_TEST_SUITE_P(Modes, PausedSchedulerTest, ::testing::Values(0, 1, 2),
                         ModeNames(kSchedulerPauseModes));

}  // namespace
}  // namespace ps::testing

int main(int argc, char** argv) {
  return ps::testing::FaultTestMain(argc, argv, "pause_test",
                                    {/*trials=*/2, /*sanitizer_trials=*/1,
                                     /*heartbeat_timeout_ms=*/1000,
                                     /*sanitizer_heartbeat_timeout_ms=*/3000});
}
