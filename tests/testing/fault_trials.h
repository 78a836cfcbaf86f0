// What the seeded fault-injection tests (tests/fault_test.cc,
// pause_test.cc, scheduler_restart_test.cc, network_fault_test.cc) share:
// settings read from a flag or the environment, the generator of a trial's
// choices, what a job's workers trained, lines of its logs, the ranks its
// processes registered as, and running a stalled job again.
//
// A job "stalls" when the scheduler declares dead a node that the test did
// not disturb: the machine held it up for longer than the heartbeat
// timeout, and the job proves nothing either way. Such a job is abandoned
// and run once more; a second stall fails the test.
//
// Thread-compatible: call from the test's thread.
#ifndef PS_TESTS_TESTING_FAULT_TRIALS_H_
#define PS_TESTS_TESTING_FAULT_TRIALS_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/testing/job_harness.h"

namespace ps::testing {

// How far a disturbed job's test AUC may be from an undisturbed one's.
inline constexpr double kAucTolerance = 0.005;

// `flag` when it was given (>= 0), else the environment variable `env`
// when it holds an integer, else `fallback`.
int64_t Setting(int64_t flag, const char* env, int64_t fallback);

// A seed: Setting(flag, env, 1), where 0 picks one from the clock (the
// tests print it, so the run can be replayed).
uint64_t SeedSetting(int64_t flag, const char* env);

// Whether the processes run under a sanitizer (.bazelrc's asan, ubsan and
// tsan configs set PS_SANITIZER=1): several times slower, so heartbeats
// fall silent for longer and the tests take fewer trials and longer
// heartbeat timeouts there.
bool Sanitizer();

// A generator whose draws depend only on `seed` and `words` (e.g. test,
// mode and trial), so one trial can be replayed alone. mt19937_64 and
// seed_seq are specified exactly by the standard; drawn with `rng() % n`
// rather than the library-defined distributions, a seed means the same
// choices everywhere.
std::mt19937_64 TrialRng(uint64_t seed, const std::vector<uint32_t>& words);

// A consistency mode a fault test's jobs run in: its name (also the test
// parameter's) and the body of the job's consistency block.
struct Mode {
  const char* name;
  const char* consistency;
};
inline constexpr Mode kAsyncMode = {"ASYNC", "mode: ASYNC"};
inline constexpr Mode kBspMode = {"BSP", "mode: BSP"};
inline constexpr Mode kSspMode = {"SSP", "mode: SSP staleness: 2"};
// The modes of the fault and scheduler-restart tests: test parameter i
// runs kModes[i].
inline constexpr Mode kModes[] = {kAsyncMode, kBspMode, kSspMode};

// The name generator of a test suite whose parameter i runs `modes[i]`
// (INSTANTIATE_TEST_SUITE_P's last argument): the mode's name. `modes`
// must outlive the suite (a namespace-scope array).
template <size_t N>
auto ModeNames(const Mode (&modes)[N]) {
  return [&modes](const ::testing::TestParamInfo<int>& info) {
    return std::string(modes[info.param].name);
  };
}

// The head of a job config (textproto): its name and its cluster block,
// with `servers` and `workers`, `slots` slots, heartbeats every 100 ms, a
// node silent for `heartbeat_timeout_ms` declared dead, and `more_cluster`
// (more fields of the cluster block, e.g. "request_timeout_ms: 60000").
std::string JobHead(const std::string& name, int servers, int workers,
                    int slots, int heartbeat_timeout_ms,
                    const std::string& more_cluster);

// The job the fault tests train, after `head` (JobHead): logistic
// regression on synthetic click data, a sparse table "w" (dim 1) and a
// dense one "d" (14 values), both Adagrad; `num_train` training examples
// (and 20000 test examples), 2 epochs of 256-example batches;
// `consistency` is the body of its consistency block ("mode: ASYNC") and
// `more` follows at the top level (e.g. a checkpoint block).
std::string CtrJobConfig(const std::string& head,
                         const std::string& consistency, int num_train,
                         const std::string& more = "");

// The job of tests/testing/ledger.h after `head` (JobHead): the sparse SGD
// table "sgd" (dim 1, learning rate 1, zeros) its pushers push integers to;
// `sparse` adds fields to its sparse block (e.g. a budget and a disk tier).
std::string LedgerJobConfig(const std::string& head,
                            const std::string& sparse = "");

// The sum of "trained N examples" over one worker's log (`log`, its
// text).
uint64_t ExamplesTrainedIn(const std::string& log);

// The sum of "trained N examples" over every worker process's log: what
// the workers trained together. A SIGKILLed worker prints nothing; one
// dropped by the scheduler prints nothing of what it trained before; one
// that rejoined prints only what it trained after.
uint64_t WorkersTrained(JobHarness& job);

// WorkersTrained plus the part of every orphaned shard that its dropped
// worker had reported done when the scheduler handed the rest on ("shard S
// orphaned at epoch E batch B" in scheduler.log: E epochs of
// `shard_epoch_examples` and B batches of `batch` examples). Whoever took
// the shard over counts the rest from there, so the total reaches an
// undisturbed run's only if nothing was skipped.
uint64_t ExamplesTrainedWithOrphans(JobHarness& job,
                                    uint64_t shard_epoch_examples,
                                    uint64_t batch);

// The lines of `text` that contain `needle`; the first of them, or "".
std::vector<std::string> LinesWith(const std::string& text,
                                   const std::string& needle);
std::string LineWith(const std::string& text, const std::string& needle);

// Every scheduler incarnation's log, concatenated (scheduler.log,
// scheduler.1.log, ...).
std::string SchedulerLogs(const JobHarness& job);

// The scheduler's "declared dead" line about node `id`, or "".
std::string DeclaredDeadLine(const JobHarness& job, uint64_t id);

// The rank server(i) registered as, once its log says so; nullopt when it
// exited first or `timeout` (scaled) passed.
std::optional<uint32_t> WaitForServerRank(JobHarness& job, int i,
                                          absl::Duration timeout);

// Waits for each of the first `workers` worker processes to register (up
// to `timeout` each) and returns the index of the one that got `rank`;
// NOT_FOUND when none did, the wait's error (ABORTED for a stall) when
// one did not register.
absl::StatusOr<int> WorkerWithRank(JobHarness& job, int workers, uint32_t rank,
                                   absl::Duration timeout);

// For a step of a trial that failed with `status`: its message when it is
// ABORTED (the job's abort check saw a stall), else "" after adding a test
// failure naming `what`, with the job's log tails.
std::string StallOrFail(const absl::Status& status, const std::string& what,
                        const JobHarness& job);

// StallOrFail as a Run (any type with a std::string `stall`, e.g.
// JobRun): its `stall` set, or a default Run after the failure was added.
template <typename Run>
Run FailedRun(const absl::Status& status, const std::string& what,
              const JobHarness& job) {
  Run run;
  run.stall = StallOrFail(status, what, job);
  return run;
}

// What a finished job reports.
struct Outcome {
  double auc = NAN;
  uint64_t steps = 0;     // the evaluator's steps (rank0_steps)
  uint64_t examples = 0;  // what the workers trained together
  std::string summary;
  absl::Duration elapsed;
};

// Adds a test failure naming `what` for the scheduler and for each server
// of `result` that did not exit 0, leaving out server `skip_server` (-1:
// none); whether none did.
bool ExpectSchedulerAndServersExitedZero(const JobHarness::Result& result,
                                         const std::string& what,
                                         int skip_server = -1);

// Adds a test failure naming `what` unless exactly one worker printed a
// summary; whether one did.
bool ExpectOneSummary(const JobHarness::Result& result,
                      const std::string& what);

// The outcome of a finished job whose other checks passed when `ok`: the
// summary's test_auc and rank0_steps, the result's summary and elapsed
// time, and `examples`. nullopt, with test failures added (and the job's
// log tails), when not `ok` or the summary has no test AUC.
std::optional<Outcome> CheckedOutcome(const JobHarness& job,
                                      const JobHarness::Result& result, bool ok,
                                      const std::string& what,
                                      uint64_t examples);

// How one job went: `outcome` when it passed every check; `stall` when it
// stalled (the "declared dead" line). Neither: a test failure was added.
struct JobRun {
  std::optional<Outcome> outcome;
  std::string stall;
};

// Prints a stall and whether the job is run again.
void PrintStall(const std::string& stall, bool again);
// Adds the test failure of a job that stalled twice; `hint` (may be empty)
// follows the message, e.g. the flag that sets the timeout.
void FailStalledTwice(const std::string& what, const std::string& stall,
                      int heartbeat_timeout_ms, const std::string& hint);

// Runs `attempt(0)`, and `attempt(1)` when the first stalled (its `stall`
// is not empty); a second stall adds a test failure (FailStalledTwice) and
// returns a default Run. `stalls`, when not null, counts the stalls. Run is
// any type with a std::string `stall` (JobRun).
template <typename Attempt>
auto RetryStalled(const std::string& what, int heartbeat_timeout_ms,
                  Attempt attempt, int* stalls = nullptr,
                  const std::string& hint = "") -> decltype(attempt(0)) {
  constexpr int kAttempts = 2;
  decltype(attempt(0)) run;
  for (int i = 0; i < kAttempts; ++i) {
    run = attempt(i);
    if (run.stall.empty()) return run;
    if (stalls != nullptr) ++*stalls;
    PrintStall(run.stall, i + 1 < kAttempts);
  }
  FailStalledTwice(what, run.stall, heartbeat_timeout_ms, hint);
  return decltype(attempt(0))();
}

// RUN_ALL_TESTS, then prints how long they took ("<name>: 12.3 s in all").
int RunAllTestsTimed(const char* name);

}  // namespace ps::testing

#endif  // PS_TESTS_TESTING_FAULT_TRIALS_H_
