// Issue 6 acceptance: seeded fault injection on real processes.
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
// Flags (--test_arg=--fault_seed=5 under bazel test), each also read from
// the environment when the flag is not given (--test_env=FAULT_SEED=5):
//   --fault_seed=N    (FAULT_SEED)    default 1; 0 picks one from the time
//   --fault_trials=N  (FAULT_TRIALS)  trials per mode and signal, default 10
//       (3 under a sanitizer, PS_SANITIZER=1)
//   --fault_trial=I   (FAULT_TRIAL)   run only trial I (replaying a failure)
//   --fault_heartbeat_timeout_ms=N (FAULT_HEARTBEAT_TIMEOUT_MS) default 300
//       (2000 under a sanitizer)
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
#include <cstdlib>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/protocol.h"
#include "gtest/gtest.h"
#include "tests/testing/job_harness.h"

ABSL_FLAG(int64_t, fault_seed, -1,
          "Seed of the trials' choices; 0 picks one from the time. Default: "
          "$FAULT_SEED, else 1.");
ABSL_FLAG(int32_t, fault_trials, -1,
          "Trials per mode and signal. Default: $FAULT_TRIALS, else 10.");
ABSL_FLAG(int32_t, fault_heartbeat_timeout_ms, -1,
          "The jobs' cluster.heartbeat_timeout_ms. Default: "
          "$FAULT_HEARTBEAT_TIMEOUT_MS, else 300.");
ABSL_FLAG(int32_t, fault_max_step_percent, -1,
          "Victims are hit at a step up to this percentage of a worker's "
          "steps in the baseline (over 100: some after finishing their "
          "shard). Default: $FAULT_MAX_STEP_PERCENT, else 90.");
ABSL_FLAG(int32_t, fault_trial, -1,
          "Run only this trial (0-based) of each mode and signal. Default: "
          "$FAULT_TRIAL, else all.");

namespace ps {
namespace {

using ::ps::testing::JobHarness;
using ::ps::testing::JsonNumber;
using ::ps::testing::JsonRaw;
using ::ps::testing::ReadFile;

constexpr int kServers = 2;
constexpr int kWorkers = 3;
constexpr double kAucTolerance = 0.005;
// A job takes 2-4 s; one that runs this long has hung.
constexpr absl::Duration kJobTimeout = absl::Seconds(90);

// The flag, else the environment variable, else `fallback`.
int64_t Setting(int64_t flag, const char* env, int64_t fallback) {
  if (flag >= 0) return flag;
  int64_t v;
  if (const char* s = std::getenv(env);
      s != nullptr && absl::SimpleAtoi(s, &v)) {
    return v;
  }
  return fallback;
}

uint64_t Seed() {
  static const uint64_t seed = [] {
    int64_t s = Setting(absl::GetFlag(FLAGS_fault_seed), "FAULT_SEED", 1);
    if (s == 0) s = absl::ToUnixMicros(absl::Now()) & 0x7fffffff;
    return static_cast<uint64_t>(s);
  }();
  return seed;
}
// A sanitizer build (.bazelrc's asan/ubsan/tsan set PS_SANITIZER=1) runs
// every process several times slower: heartbeats fall silent for 300 ms and
// more on two cores, and ten trials would not fit the test's timeout. There
// the defaults are a 2 s heartbeat timeout and 3 trials.
bool Sanitizer() {
  const char* s = std::getenv("PS_SANITIZER");
  return s != nullptr && std::string_view(s) == "1";
}
int Trials() {
  return Setting(absl::GetFlag(FLAGS_fault_trials), "FAULT_TRIALS",
                 Sanitizer() ? 3 : 10);
}
int HeartbeatTimeoutMs() {
  return Setting(absl::GetFlag(FLAGS_fault_heartbeat_timeout_ms),
                 "FAULT_HEARTBEAT_TIMEOUT_MS", Sanitizer() ? 2000 : 300);
}
int MaxStepPercent() {
  return Setting(absl::GetFlag(FLAGS_fault_max_step_percent),
                 "FAULT_MAX_STEP_PERCENT", 130);
}
int OnlyTrial() {
  return Setting(absl::GetFlag(FLAGS_fault_trial), "FAULT_TRIAL", -1);
}

struct Mode {
  const char* name;
  const char* consistency;
};

// Small enough that a job takes 2-4 s on two cores; heartbeats fast enough
// that a death is noticed within 0.3 s.
std::string JobConfig(const Mode& mode) {
  return absl::StrFormat(
      R"pb(
        name: "fault-%s"
        cluster {
          num_servers: %d
          num_workers: %d
          num_slots: 256
          heartbeat_interval_ms: 100
          heartbeat_timeout_ms: %d
          request_timeout_ms: 10000
          on_worker_loss: REASSIGN
        }
        consistency { %s }
        tables {
          id: 0
          name: "w"
          sparse { dim: 1 }
          optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
        }
        tables {
          id: 1
          name: "d"
          dense { size: 14 }
          optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
        }
        data { synthetic_ctr { num_train: 150000 num_test: 20000 seed: 1 } }
        training {
          batch_size: 256
          epochs: 2
          log_interval_s: 1
          sparse_table: "w"
          dense_table: "d"
        }
      )pb",
      mode.name, kServers, kWorkers, HeartbeatTimeoutMs(), mode.consistency);
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
// one trial can be replayed alone. mt19937_64 and seed_seq are specified
// exactly by the standard, and the draws avoid the library-defined
// distributions, so a seed means the same choices everywhere.
Fault Choose(int mode_index, int sig, int trial, uint64_t steps_per_worker) {
  const uint64_t seed = Seed();
  std::seed_seq seq{static_cast<uint32_t>(seed),
                    static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(mode_index),
                    static_cast<uint32_t>(sig), static_cast<uint32_t>(trial)};
  std::mt19937_64 rng(seq);
  Fault f;
  f.signal = sig;
  f.victim = static_cast<uint32_t>(rng() % kWorkers);
  // Anywhere from before its first step to 90% through its own shard.
  f.step = rng() % (steps_per_worker * MaxStepPercent() / 100 + 1);
  f.replacement = rng() % 2 == 1;
  return f;
}

// Sum of "trained N examples" over every worker's log: what the workers
// trained together (a SIGKILLed worker prints nothing).
uint64_t ExamplesTrained(JobHarness& job) {
  static const std::regex kTrained("trained ([0-9]+) examples");
  uint64_t total = 0;
  for (int i = 0; i < job.num_worker_processes(); ++i) {
    const std::string log = ReadFile(job.worker(i).stderr_path());
    for (std::sregex_iterator it(log.begin(), log.end(), kTrained), end;
         it != end; ++it) {
      total += std::stoull((*it)[1].str());
    }
  }
  return total;
}

// What a finished job reports.
struct Outcome {
  double auc = NAN;
  uint64_t steps = 0;     // the evaluator's steps (rank0_steps)
  uint64_t examples = 0;  // ExamplesTrained
  std::string summary;
  absl::Duration elapsed;
};

// How one job went: `outcome` when it passed every check; `stall` when a
// node that nobody killed was declared dead (the machine stalled it for
// longer than the heartbeat timeout), which makes the job prove nothing
// either way: it is run again, once. Neither: a test failure was added.
struct JobRun {
  std::optional<Outcome> outcome;
  std::string stall;
};

constexpr Mode kModes[] = {
    {"ASYNC", "mode: ASYNC"},
    {"BSP", "mode: BSP"},
    {"SSP", "mode: SSP staleness: 2"},
};

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
      if (id == killed_node) continue;
      const std::string log = ReadFile(job.dir() + "/scheduler.log");
      const size_t at = log.find(absl::StrCat("(node ", id, ") declared dead"));
      const size_t begin = log.rfind('\n', at) + 1;
      return log.substr(begin, log.find('\n', at) - begin);
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
    std::string command = absl::StrCat(
        "bazel test --config=opt //tests:fault_test --test_filter='*/",
        mode().name, "' --test_arg=--fault_seed=", Seed(),
        " --test_arg=--fault_trial=", trial);
    if (MaxStepPercent() != 90) {
      absl::StrAppend(
          &command, " --test_arg=--fault_max_step_percent=", MaxStepPercent());
    }
    if (HeartbeatTimeoutMs() != 300) {
      absl::StrAppend(&command, " --test_arg=--fault_heartbeat_timeout_ms=",
                      HeartbeatTimeoutMs());
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
    } else if (result->summaries != 1) {
      ok = false;
      ADD_FAILURE() << what << ": " << result->summaries
                    << " workers printed a summary, expected 1";
    }
    Outcome out;
    out.summary = result->summary;
    out.elapsed = result->elapsed;
    out.auc = JsonNumber(result->summary, "test_auc").value_or(NAN);
    out.steps = static_cast<uint64_t>(
        JsonNumber(result->summary, "rank0_steps").value_or(0));
    out.examples = ExamplesTrained(job);
    if (!std::isfinite(out.auc)) {
      ok = false;
      ADD_FAILURE() << what << ": no test_auc in the summary '"
                    << result->summary << "'";
    }
    if (!ok) {
      ADD_FAILURE() << what << ": logs of " << job.dir() << "\n"
                    << job.LogTails(40);
      return run;
    }
    run.outcome = out;
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
    SCOPED_TRACE(absl::StrCat(what, "; seed ", Seed(),
                              "; replay: ", ReplayCommand(trial)));
    std::unique_ptr<JobHarness> job = StartJob(absl::StrCat(
        SignalName(fault.signal), "-", trial, attempt > 0 ? "-again" : ""));
    if (job == nullptr) return JobRun();
    // A node declared dead that nobody killed makes the job worthless:
    // give up on it at once instead of waiting for what it breaks.
    uint64_t killed_node = 0;
    job->set_abort_check([&] { return FalseDeath(*job, killed_node); });
    auto fail = [&](const absl::Status& status) {
      JobRun run;
      if (absl::IsAborted(status)) {
        run.stall = std::string(status.message());
      } else {
        ADD_FAILURE() << what << ": " << status << "\n" << job->LogTails(40);
      }
      return run;
    };
    // Which process got the victim's rank.
    int victim = -1;
    for (int i = 0; i < kWorkers; ++i) {
      auto rank = job->WaitForRegistration(i, absl::Seconds(30));
      if (!rank.ok()) return fail(rank.status());
      if (*rank == fault.victim) victim = i;
    }
    if (victim < 0) {
      return fail(absl::NotFoundError(
          absl::StrCat("no worker got rank ", fault.victim)));
    }
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

// A stalled job is run again once; a second stall fails the test.
constexpr int kAttempts = 2;

TEST_P(FaultTest, KilledOrPreemptedWorkersChangeNeitherTheEndNorTheAuc) {
  const absl::Time start = absl::Now();
  std::printf(
      "%s: fault seed %" PRIu64
      ", %d trials per signal, victims hit by %d%% "
      "of their steps, heartbeat timeout %d ms%s\n",
      mode().name, Seed(), Trials(), MaxStepPercent(), HeartbeatTimeoutMs(),
      OnlyTrial() >= 0 ? absl::StrCat(" (only trial ", OnlyTrial(), ")").c_str()
                       : "");
  int stalls = 0;
  auto stalled = [&](const JobRun& run, int attempt) {
    if (run.stall.empty()) return false;
    ++stalls;
    std::printf("  STALLED, a live node was declared dead: %s\n",
                run.stall.c_str());
    if (attempt + 1 < kAttempts) {
      std::printf("  running it again\n");
      return true;
    }
    ADD_FAILURE() << mode().name << ": stalled again (" << run.stall
                  << "): the machine is too busy for a heartbeat timeout of "
                  << HeartbeatTimeoutMs()
                  << " ms (--fault_heartbeat_timeout_ms)";
    return false;
  };
  JobRun baseline;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    baseline = RunBaseline(attempt);
    if (!stalled(baseline, attempt)) break;
  }
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
    for (int trial = 0; trial < Trials(); ++trial) {
      if (OnlyTrial() >= 0 && trial != OnlyTrial()) continue;
      const Fault fault = Choose(GetParam(), sig, trial, baseline_.steps);
      std::printf("%s trial %d %s: worker rank %u at step %" PRIu64 ", %s\n",
                  mode().name, trial, SignalName(sig).c_str(), fault.victim,
                  fault.step,
                  fault.replacement ? "replacement" : "no replacement");
      std::fflush(stdout);
      std::string notes;
      JobRun run;
      for (int attempt = 0; attempt < kAttempts; ++attempt) {
        notes.clear();
        run = RunTrial(fault, trial, attempt, &notes);
        ++jobs;
        std::fflush(stdout);
        if (!stalled(run, attempt)) break;
      }
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
      stalls, Seed(), absl::ToDoubleSeconds(absl::Now() - start));
  std::fflush(stdout);
}

INSTANTIATE_TEST_SUITE_P(Modes, FaultTest, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(kModes[info.param].name);
                         });

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);  // takes the --gtest_* flags
  absl::ParseCommandLine(argc, argv);
  return RUN_ALL_TESTS();
}
