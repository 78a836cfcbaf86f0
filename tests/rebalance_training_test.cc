// A training job scaled live keeps its quality: for each consistency mode
// (ASYNC, BSP, SSP with staleness 2) an elastic job of one scheduler, 2
// servers and 2 workers trains logistic regression on synthetic click data
// once undisturbed (the baseline), then again while two spares join and
// psctl scales it to 4 servers, then to 3 (emptying server 1), each at a
// step the workers reached (so the moment does not depend on the
// machine's speed). The scaled job must end on its own with every process
// exiting 0 (a worker whose request failed would not: the trainer treats
// a failed request as an error), the emptied server included, and reach
// the baseline's test AUC within 0.005.
//
// A job in which a node that nobody killed is declared dead (the machine
// stalled it past the heartbeat timeout) proves nothing: it is run again
// once (tests/testing/fault_trials.h RetryStalled).
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/fault_trials.h"
#include "tests/testing/job_harness.h"
#include "tests/testing/subprocess.h"

namespace ps::testing {
namespace {

constexpr int kWorkers = 2;
constexpr int kNumTrain = 600000;
constexpr int kHeartbeatTimeoutMs = 2000;
constexpr double kAucTolerance = 0.005;
constexpr absl::Duration kJobTimeout = absl::Seconds(240);

std::string Config(const Mode& mode) {
  return CtrJobConfig(
      JobHead(absl::StrCat("rebalance-", mode.name), 2, kWorkers, 256,
              kHeartbeatTimeoutMs,
              "request_timeout_ms: 60000 elastic { max_servers: 4 }"),
      mode.consistency, kNumTrain);
}

class RebalanceTrainingTest : public ::testing::TestWithParam<int> {
 protected:
  const Mode& mode() const { return kModes[GetParam()]; }

  std::unique_ptr<JobHarness> StartJob(const std::string& name) {
    const std::string dir = absl::StrCat(::testing::TempDir(), "/rebalance-",
                                         mode().name, "-", name);
    mkdir(dir.c_str(), 0755);
    JobHarness::Options options;
    options.dir = dir;
    options.config = Config(mode());
    options.num_servers = 2;
    options.num_workers = kWorkers;
    auto job = JobHarness::Start(options);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *std::move(job) : nullptr;
  }

  // Runs psctl `args` against `job`'s scheduler; whether it exited 0 (a
  // test failure with its output otherwise).
  bool Psctl(JobHarness& job, std::vector<std::string> args) {
    const std::string what = args[0];
    const JobHarness::ToolRun run = job.RunPsctl(std::move(args));
    const std::string& out = run.output;
    std::printf("%s", out.c_str());
    if (run.code != 0) {
      ADD_FAILURE() << "psctl " << what << " failed:\n"
                    << out << job.LogTails(30);
      return false;
    }
    return true;
  }

  // Waits for the job's end and checks it: every process exited 0, one
  // summary. The outcome, or a stall / failure.
  JobRun Finish(JobHarness& job, const std::string& what) {
    JobRun run;
    auto result = job.Wait(kJobTimeout);
    if (const std::vector<uint64_t> dead = job.DeclaredDead(); !dead.empty()) {
      run.stall = DeclaredDeadLine(job, dead[0]);
      return run;
    }
    if (!result.ok()) return FailedRun<JobRun>(result.status(), what, job);
    bool ok = ExpectSchedulerAndServersExitedZero(*result, what);
    for (size_t i = 0; i < result->workers.size(); ++i) {
      if (result->workers[i] != 0) {
        ok = false;
        ADD_FAILURE() << what << ": worker" << i << " exited with "
                      << result->workers[i];
      }
    }
    run.outcome = CheckedOutcome(job, *result, ok, what, 0);
    return run;
  }

  JobRun Baseline(int attempt) {
    auto job = StartJob(absl::StrCat("baseline-", attempt));
    if (job == nullptr) return {};
    return Finish(*job, absl::StrCat(mode().name, " baseline"));
  }

  JobRun Scaled(int attempt, uint64_t baseline_steps) {
    const std::string what = absl::StrCat(mode().name, " scaled 2 -> 4 -> 3");
    auto job = StartJob(absl::StrCat("scaled-", attempt));
    if (job == nullptr) return {};
    for (int i = 0; i < 2; ++i) {
      auto index = job->StartServer();
      if (!index.ok()) return FailedRun<JobRun>(index.status(), what, *job);
    }
    if (auto rank = job->WaitForRegistration(0, absl::Seconds(60));
        !rank.ok()) {
      return FailedRun<JobRun>(rank.status(), what, *job);
    }
    // Scale out at a tenth of the training, in at two fifths.
    auto step = job->WaitForStep(0, baseline_steps / 10, absl::Seconds(60));
    if (!step.ok()) return FailedRun<JobRun>(step.status(), what, *job);
    if (!Psctl(*job, {"scale", "--servers=4", "--wait"})) return {};
    step = job->WaitForStep(0, baseline_steps * 2 / 5, absl::Seconds(60));
    if (!step.ok()) return FailedRun<JobRun>(step.status(), what, *job);
    if (!Psctl(*job, {"scale", "--servers=3", "--remove=1", "--wait"})) {
      return {};
    }
    return Finish(*job, what);
  }
};

TEST_P(RebalanceTrainingTest, ScaledJobFinishesWithTheBaselinesAuc) {
  const JobRun baseline =
      RetryStalled(absl::StrCat(mode().name, " baseline"), kHeartbeatTimeoutMs,
                   [&](int attempt) { return Baseline(attempt); });
  ASSERT_TRUE(baseline.outcome.has_value());
  ASSERT_GT(baseline.outcome->steps, 0u);
  std::printf("%s baseline: test AUC %.5f, %llu steps, %.1f s\n", mode().name,
              baseline.outcome->auc,
              static_cast<unsigned long long>(baseline.outcome->steps),
              absl::ToDoubleSeconds(baseline.outcome->elapsed));
  const JobRun scaled = RetryStalled(
      absl::StrCat(mode().name, " scaled"), kHeartbeatTimeoutMs,
      [&](int attempt) { return Scaled(attempt, baseline.outcome->steps); });
  ASSERT_TRUE(scaled.outcome.has_value());
  std::printf("%s scaled 2 -> 4 -> 3: test AUC %.5f, %.1f s\n", mode().name,
              scaled.outcome->auc,
              absl::ToDoubleSeconds(scaled.outcome->elapsed));
  EXPECT_LE(std::fabs(scaled.outcome->auc - baseline.outcome->auc),
            kAucTolerance)
      << "baseline " << baseline.outcome->auc << ", scaled "
      << scaled.outcome->auc;
}

INSTANTIATE_TEST_SUITE_P(Modes, RebalanceTrainingTest,
                         ::testing::Values(0, 1, 2), ModeNames(kModes));

}  // namespace
}  // namespace ps::testing
