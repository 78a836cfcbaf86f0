// Seeded fault injection on real processes: workers killed or preempted.
//
// For each consistency mode (ASYNC, BSP, SSP with staleness 2) a job of one
// scheduler, 2 servers and 3 workers trains logistic regression on
// synthetic click data, once undisturbed (the baseline), then `trials`
// times with one worker SIGKILLed and `trials` times with one SIGTERMed.
// A seeded generator picks, per trial, the victim's rank, the step at
// which it is hit (its clock as the scheduler last heard it, so the moment
// does not depend on the machine's speed) and whether a replacement worker
// is started once the scheduler has seen the victim go; without one the
// survivors train the orphaned rest of its shard (on_worker_loss
// REASSIGN). Every disturbed job must end on its own (every process exits,
// each with code 0 except the SIGKILLed one), print one summary, and reach
// the baseline's test AUC within 0.005; after a SIGTERM the workers
// together must have trained exactly the baseline's number of examples
// (the victim left with its exact position: nothing twice, nothing
// skipped).
//
// A job in which a node that nobody killed is declared dead (the machine
// stalled it for longer than the heartbeat timeout) proves nothing: it is
// abandoned at once, reported as STALLED, and run again once.
//
// Flags (tests/testing/fault_flags.h; --test_arg=--fault_seed=5 under
// bazel test), each also read from the environment when the flag is not
// given (--test_env=FAULT_SEED=5):
//   --fault_seed=N    (FAULT_SEED)    default 1; 0 picks one from the time
//   --fault_trials=N  (FAULT_TRIALS)  trials per mode and signal, default 10
//       (3 under a sanitizer, PS_SANITIZER=1: every process runs several
//       times slower, and ten trials would not fit the test's timeout)
//   --fault_trial=I   (FAULT_TRIAL)   run only trial I (replaying a failure)
//   --fault_heartbeat_timeout_ms=N (FAULT_HEARTBEAT_TIMEOUT_MS) default 300
//       (2000 under a sanitizer: heartbeats there fall silent for 300 ms
//       and more on two cores)
//   --fault_max_step_percent=P (FAULT_MAX_STEP_PERCENT) default 130: the
//       latest step a victim is hit at, in percent of a worker's steps in
//       the baseline; above 100 some victims are hit after training (at
//       the final barrier, while evaluating).
// Every trial's choices are printed with the command that replays it.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/protocol.h"
#include "gtest/gtest.h"
#include "tests/testing/fault_flags.h"
#include "tests/testing/fault_trials.h"
#include "tests/testing/job_harness.h"

ABSL_FLAG(int32_t, fault_max_step_percent, -1,
          "Victims are hit at a step up to this percentage of a worker's "
          "steps in the baseline (over 100: some after finishing their "
          "shard). Default: $FAULT_MAX_STEP_PERCENT, else 130.");

namespace ps::testing {
namespace {

constexpr int kServers = 2;
constexpr int kWorkers = 3;
// A job takes 2-4 s; one that runs this long has hung.
constexpr absl::Duration kJobTimeout = absl::Seconds(90);

constexpr int kDefaultMaxStepPercent = 130;
int MaxStepPercent() {
  return Setting(absl::GetFlag(FLAGS_fault_max_step_percent),
                 "FAULT_MAX_STEP_PERCENT", kDefaultMaxStepPercent);
}

// Small enough that a job takes 2-4 s on two cores; heartbeats fast enough
// that a death is noticed within 0.3 s.
std::string JobConfig(const Mode& mode) {
  return CtrJobConfig(
      JobHead(absl::StrCat("fault-", mode.name), kServers, kWorkers, 256,
              FaultHeartbeatTimeoutMs(),
              "request_timeout_ms: 10000 on_worker_loss: REASSIGN"),
      mode.consistency, 150000);
}

// One trial's choices, all from the seeded generator.
struct Fault {
  int signal = 0;            // SIGKILL or SIGTERM
  uint32_t victim = 0;       // worker rank
  uint64_t step = 0;         // hit once its reported clock reaches this
  bool replacement = false;  // start a new worker once the victim is gone
};

std::string SignalName(int sig) {
  return sig == SIGKILL ? "SIGKILL" : "SIGTERM";
}

// Trial `trial`'s choices depend only on (seed, mode, signal, trial), so
// one trial can be replayed alone.
Fault Choose(int mode_index, int sig, int trial, uint64_t steps_per_worker) {
  std::mt19937_64 rng = TrialRng(
      FaultSeed(), {static_cast<uint32_t>(mode_index),
                    static_cast<uint32_t>(sig), static_cast<uint32_t>(trial)});
  Fault f;
  f.signal = sig;
  f.victim = static_cast<uint32_t>(rng() % kWorkers);
  // Anywhere from before its first step to MaxStepPercent() of its steps.
  f.step = rng() % (steps_per_worker * MaxStepPercent() / 100 + 1);
  f.replacement = rng() % 2 == 1;
  return f;
}

class FaultTest : public ::testing::TestWithParam<int> {
 protected:
  const Mode& mode() const { return kModes[GetParam()]; }

  std::unique_ptr<JobHarness> StartJob(const std::string& run) {
    const std::string dir =
        absl::StrCat(::testing::TempDir(), "/fault-", mode().name);
    mkdir(dir.c_str(), 0755);
    JobHarness::Options options;
    options.dir = absl::StrCat(dir, "/", run);
    options.config = JobConfig(mode());
    options.num_servers = kServers;
    options.num_workers = kWorkers;
    auto job = JobHarness::Start(options);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *std::move(job) : nullptr;
  }

  // The scheduler's line declaring a node other than `killed_node` dead,
  // or "".
  static std::string FalseDeath(const JobHarness& job, uint64_t killed_node) {
    for (uint64_t id : job.DeclaredDead()) {
      if (id != killed_node) return DeclaredDeadLine(job, id);
    }
    return "";
  }

  // Worker i never registered, and the scheduler had ended the job.
  static bool TooLate(JobHarness& job, int i) {
    return ReadFile(job.worker(i).stderr_path())
                   .find("register with scheduler") != std::string::npos &&
           ReadFile(job.dir() + "/scheduler.log").find("job finished") !=
               std::string::npos;
  }

  std::string ReplayCommand(int trial) const {
    std::string command = FaultReplayCommand(
        "fault_test", absl::StrCat("*/", mode().name), trial);
    if (MaxStepPercent() != kDefaultMaxStepPercent) {
      absl::StrAppend(
          &command, " --test_arg=--fault_max_step_percent=", MaxStepPercent());
    }
    return command;
  }

  // Waits for the job's end and checks what every job must satisfy: all
  // processes exited, with 0 except worker `killed` (SIGKILL: 137), and
  // one summary with a test AUC (two equal ones when the killed worker
  // printed its own before dying). A replacement that could not register
  // because the job had finished meanwhile is let off (a note says so).
  JobRun Finish(JobHarness& job, int killed, const std::string& what,
                std::string* notes) {
    JobRun run;
    auto result = job.Wait(kJobTimeout);
    run.stall = FalseDeath(job, killed >= 0 ? job.node_id(killed) : 0);
    if (!run.stall.empty()) return run;
    if (!result.ok()) {
      ADD_FAILURE() << what << ": " << result.status() << "\n"
                    << job.LogTails(40);
      return run;
    }
    bool ok = true;
    auto expect_code = [&](int code, int expected, const std::string& name) {
      if (code == expected) return;
      ok = false;
      ADD_FAILURE() << what << ": " << name << " exited with " << code
                    << ", expected " << expected;
    };
    expect_code(result->scheduler, 0, "scheduler");
    for (size_t i = 0; i < result->servers.size(); ++i) {
      expect_code(result->servers[i], 0, absl::StrCat("server", i));
    }
    for (size_t i = 0; i < result->workers.size(); ++i) {
      if (static_cast<int>(i) >= kWorkers && result->workers[i] != 0 &&
          TooLate(job, i)) {
        absl::StrAppend(notes,
                        "; the replacement came after the job had finished");
        continue;
      }
      expect_code(result->workers[i],
                  static_cast<int>(i) == killed ? 128 + SIGKILL : 0,
                  JobHarness::WorkerName(i));
    }
    // The evaluator killed after it printed its summary and before it left
    // the job looks to the others like one that died evaluating: a survivor
    // evaluates again (at least once, never none). Both evaluated the same
    // final model, so they must agree.
    const bool killed_after_summary =
        killed >= 0 &&
        static_cast<size_t>(killed) < result->worker_summaries.size() &&
        !result->worker_summaries[killed].empty();
    if (result->summaries == 2 && killed_after_summary) {
      const std::string& first = result->worker_summaries[killed];
      std::string second;
      for (size_t i = 0; i < result->worker_summaries.size(); ++i) {
        if (static_cast<int>(i) != killed &&
            !result->worker_summaries[i].empty()) {
          second = result->worker_summaries[i];
        }
      }
      const auto first_auc = JsonNumber(first, "test_auc");
      if (!first_auc.has_value() ||
          first_auc != JsonNumber(second, "test_auc")) {
        ok = false;
        ADD_FAILURE() << what << ": the killed evaluator's summary '" << first
                      << "' and the survivor's '" << second << "' disagree";
      }
      absl::StrAppend(notes,
                      "; killed after its summary, a survivor evaluated again");
    } else {
      ok &= ExpectOneSummary(*result, what);
    }
    run.outcome = CheckedOutcome(job, *result, ok, what, WorkersTrained(job));
    return run;
  }

  JobRun RunBaseline(int attempt) {
    const std::string what = absl::StrCat(mode().name, " baseline");
    std::unique_ptr<JobHarness> job =
        StartJob(absl::StrCat("baseline-", attempt));
    if (job == nullptr) return JobRun();
    job->set_abort_check([&] { return FalseDeath(*job, 0); });
    std::string notes;
    return Finish(*job, -1, what, &notes);
  }

  // Runs one disturbed job.
  JobRun RunTrial(const Fault& fault, int trial, int attempt,
                  std::string* notes) {
    const std::string what = absl::StrFormat(
        "%s trial %d %s (worker rank %u at step %d, %s)", mode().name, trial,
        SignalName(fault.signal), fault.victim, fault.step,
        fault.replacement ? "replacement" : "no replacement");
    SCOPED_TRACE(absl::StrCat(what, "; seed ", FaultSeed(),
                              "; replay: ", ReplayCommand(trial)));
    std::unique_ptr<JobHarness> job = StartJob(absl::StrCat(
        SignalName(fault.signal), "-", trial, attempt > 0 ? "-again" : ""));
    if (job == nullptr) return JobRun();
    // A node declared dead that nobody killed makes the job worthless:
    // give up on it at once instead of waiting for what it breaks.
    uint64_t killed_node = 0;
    job->set_abort_check([&] { return FalseDeath(*job, killed_node); });
    auto fail = [&](const absl::Status& status) {
      return FailedRun<JobRun>(status, what, *job);
    };
    // Which process got the victim's rank.
    absl::StatusOr<int> victim_index =
        WorkerWithRank(*job, kWorkers, fault.victim, absl::Seconds(30));
    if (!victim_index.ok()) return fail(victim_index.status());
    const int victim = *victim_index;
    const absl::Time start = absl::Now();
    auto clock = job->WaitForStep(victim, fault.step, absl::Seconds(60));
    if (absl::IsAborted(clock.status())) return fail(clock.status());
    int killed = -1;
    if (clock.ok() && fault.signal == SIGKILL)
      killed_node = job->node_id(victim);
    const bool hit = clock.ok() && job->Signal(victim, fault.signal);
    if (hit) {
      if (fault.signal == SIGKILL) killed = victim;
      *notes = *clock >= kFinishedClock ? "hit after training its shards"
                                        : absl::StrCat("hit at clock ", *clock);
    } else {
      // It finished its part before reaching the step: an undisturbed job.
      killed_node = 0;
      *notes = absl::StrCat(
          "not hit (", clock.ok() ? "exited" : clock.status().message(), ")");
    }
    absl::StrAppendFormat(notes, " %.2f s after registering",
                          absl::ToDoubleSeconds(absl::Now() - start));
    if (fault.replacement && hit) {
      // Like an orchestrator restarting the process: once the scheduler
      // counts the victim as gone (it left, or missed heartbeats for the
      // timeout), so the replacement can take its rank; after a SIGTERM
      // only if the victim left preempted, not finished.
      absl::Status gone = job->WaitUntilGone(victim, absl::Seconds(10));
      if (!gone.ok()) return fail(gone);
      bool replace = true;
      if (fault.signal == SIGTERM) {
        (void)job->worker(victim).Wait(absl::Seconds(10));  // checked by Finish
        if (ReadFile(job->worker(victim).stderr_path())
                .find("preempted: left") == std::string::npos) {
          replace = false;
          absl::StrAppend(notes, "; the victim had finished: no replacement");
        }
      }
      auto status = job->Status();
      if (replace && (!status.ok() || status->view().job_state() == FINISHED)) {
        replace = false;
        absl::StrAppend(notes, "; the job was over: no replacement");
      }
      if (replace) {
        auto replacement = job->StartWorker();
        if (!replacement.ok()) return fail(replacement.status());
        absl::StrAppend(notes, "; replacement started");
      }
    }
    JobRun run = Finish(*job, killed, what, notes);
    absl::StrAppend(notes, "; longest heartbeat silence seen ",
                    job->max_silent_ms(), " ms");
    if (!run.outcome) return run;
    const Outcome& out = *run.outcome;
    if (std::fabs(out.auc - baseline_.auc) > kAucTolerance) {
      ADD_FAILURE() << what << ": test AUC " << out.auc << " is more than "
                    << kAucTolerance << " from the baseline's " << baseline_.auc
                    << "\n"
                    << out.summary << "\n"
                    << job->LogTails(40);
      return JobRun();
    }
    if (fault.signal == SIGTERM && out.examples != baseline_.examples) {
      ADD_FAILURE() << what << ": the workers trained " << out.examples
                    << " examples together, the baseline " << baseline_.examples
                    << ": a preempted worker's shard was "
                    << (out.examples > baseline_.examples
                            ? "partly trained twice"
                            : "not finished")
                    << "\n"
                    << job->LogTails(40);
      return JobRun();
    }
    absl::StrAppend(notes, "; evaluator rank ",
                    JsonRaw(out.summary, "evaluator_rank"), " shards ",
                    JsonRaw(out.summary, "shards_trained"));
    return run;
  }

  Outcome baseline_;
};

TEST_P(FaultTest, KilledOrPreemptedWorkersChangeNeitherTheEndNorTheAuc) {
  const absl::Time start = absl::Now();
  std::printf("%s: fault seed %" PRIu64
              ", %d trials per signal, victims hit by %d%% "
              "of their steps, heartbeat timeout %d ms%s\n",
              mode().name, FaultSeed(), FaultTrials(), MaxStepPercent(),
              FaultHeartbeatTimeoutMs(),
              OnlyTrial() >= 0
                  ? absl::StrCat(" (only trial ", OnlyTrial(), ")").c_str()
                  : "");
  int stalls = 0;
  auto retry_stalled = [&](const std::string& what, auto attempt) {
    return RetryStalled(what, FaultHeartbeatTimeoutMs(), attempt, &stalls,
                        "(--fault_heartbeat_timeout_ms)");
  };
  const JobRun baseline =
      retry_stalled(absl::StrCat(mode().name, " baseline"),
                    [&](int attempt) { return RunBaseline(attempt); });
  ASSERT_TRUE(baseline.outcome.has_value());
  baseline_ = *baseline.outcome;
  ASSERT_GT(baseline_.steps, 0u) << baseline_.summary;
  std::printf("%s baseline: test AUC %.5f, %" PRIu64
              " steps per worker, %" PRIu64 " examples, %.1f s\n",
              mode().name, baseline_.auc, baseline_.steps, baseline_.examples,
              absl::ToDoubleSeconds(baseline_.elapsed));
  std::fflush(stdout);

  double min_auc = INFINITY, max_auc = -INFINITY;
  int jobs = 1, failed = 0, replaced = 0;
  for (int sig : {SIGKILL, SIGTERM}) {
    for (int trial = 0; trial < FaultTrials(); ++trial) {
      if (SkipTrial(trial)) continue;
      const Fault fault = Choose(GetParam(), sig, trial, baseline_.steps);
      std::printf("%s trial %d %s: worker rank %u at step %" PRIu64 ", %s\n",
                  mode().name, trial, SignalName(sig).c_str(), fault.victim,
                  fault.step,
                  fault.replacement ? "replacement" : "no replacement");
      std::fflush(stdout);
      std::string notes;
      const JobRun run = retry_stalled(
          absl::StrCat(mode().name, " trial ", trial), [&](int attempt) {
            notes.clear();
            ++jobs;
            return RunTrial(fault, trial, attempt, &notes);
          });
      replaced += fault.replacement;
      if (!run.outcome) {
        ++failed;
        std::printf("  FAILED (%s); replay: %s\n", notes.c_str(),
                    ReplayCommand(trial).c_str());
      } else {
        min_auc = std::min(min_auc, run.outcome->auc);
        max_auc = std::max(max_auc, run.outcome->auc);
        std::printf("  test AUC %.5f (%+.5f), %" PRIu64
                    " examples, %.1f s: %s\n",
                    run.outcome->auc, run.outcome->auc - baseline_.auc,
                    run.outcome->examples,
                    absl::ToDoubleSeconds(run.outcome->elapsed), notes.c_str());
      }
      std::fflush(stdout);
    }
  }
  std::printf(
      "SUMMARY %s: baseline AUC %.5f, disturbed AUC min %.5f max %.5f, %d jobs "
      "(%d with a replacement chosen, %d failed, %d stalled and run again), "
      "seed %" PRIu64 ", %.1f s\n",
      mode().name, baseline_.auc, min_auc, max_auc, jobs, replaced, failed,
      stalls, FaultSeed(), absl::ToDoubleSeconds(absl::Now() - start));
  std::fflush(stdout);
}

INSTANTIATE_TEST_SUITE_P(Modes, FaultTest, ::testing::Values(0, 1, 2),
                         ModeNames(kModes));

}  // namespace
}  // namespace ps::testing

int main(int argc, char** argv) {
  return ps::testing::FaultTestMain(argc, argv, "fault_test",
                                    {/*trials=*/10, /*sanitizer_trials=*/3,
                                     /*heartbeat_timeout_ms=*/300,
                                     /*sanitizer_heartbeat_timeout_ms=*/2000});
}
