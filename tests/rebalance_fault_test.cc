// Faults during live slot moves lose no acknowledged push: an elastic job
// with replication 2 (3 servers, one spare) scales to 4 servers while two
// pushers push keys that span every server; at a seeded moment after the
// scheduler planned the moves (0-100 ms: during or after the copy and the
// fence)
// the test SIGKILLs a move's source, its target (the spare) or the
// scheduler (then starts it again: it takes the job and its moves back
// from its journal). Every move then completes (an aborted try is retried
// while both of its servers live) or is abandoned, never half-applied: at the
// end every key equals exactly minus the sum of its acknowledged gradients
// (tests/testing/ledger.h), no push failed, and every process the test did not
// kill exits 0.
//
// Each case runs `trials` seeded trials, each a fresh job; every trial
// prints its choices, the phase the moves were in when the victim died,
// and the command that replays it.
//
// Flags (or environment variables):
//   --rebalance_seed=N    (REBALANCE_SEED)    default 1; 0 = from the time
//   --rebalance_trials=N  (REBALANCE_TRIALS)  per case, default 10 (3 under
//                                             a sanitizer)
//   --rebalance_trial=I   (REBALANCE_TRIAL)   run only trial I
#include <signal.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/fault_trials.h"
#include "tests/testing/job_harness.h"
#include "tests/testing/ledger.h"
#include "tests/testing/subprocess.h"

ABSL_FLAG(int64_t, rebalance_seed, -1,
          "Seed of the trials; 0 = from the time. Default: $REBALANCE_SEED, "
          "else 1.");
ABSL_FLAG(int64_t, rebalance_trials, -1,
          "Trials per case. Default: $REBALANCE_TRIALS, else 10 (3 under a "
          "sanitizer).");
ABSL_FLAG(int64_t, rebalance_trial, -1,
          "Run only this trial. Default: $REBALANCE_TRIAL, else all.");

namespace ps {
namespace {

using ::ps::testing::JobHarness;
using ::ps::testing::LedgerPushers;
using ::ps::testing::LinesWith;
using ::ps::testing::ReadFile;
using ::ps::testing::Runfile;
using ::ps::testing::Subprocess;

constexpr int kSlots = 256;
constexpr int kPushers = 2;
constexpr int kHeartbeatTimeoutMs = 1000;

enum class Victim { kSource, kTarget, kScheduler };
const char* Name(Victim v) {
  return v == Victim::kSource   ? "Source"
         : v == Victim::kTarget ? "Target"
                                : "Scheduler";
}

uint64_t Seed() {
  static const uint64_t seed = ::ps::testing::SeedSetting(
      absl::GetFlag(FLAGS_rebalance_seed), "REBALANCE_SEED");
  return seed;
}

int Trials() {
  return static_cast<int>(::ps::testing::Setting(
      absl::GetFlag(FLAGS_rebalance_trials), "REBALANCE_TRIALS",
      ::ps::testing::Sanitizer() ? 3 : 10));
}

std::string ConfigText() {
  return ::ps::testing::LedgerJobConfig(::ps::testing::JobHead(
      "rebalance-fault", /*servers=*/3, /*workers=*/kPushers, kSlots,
      kHeartbeatTimeoutMs,
      "request_timeout_ms: 60000 failover_timeout_ms: 60000 replication: 2 "
      "elastic { max_servers: 4 }"));
}

class RebalanceFaultTest : public ::testing::TestWithParam<Victim> {
 protected:
  // One trial: a fresh job, the scale, the kill, the ledger. Failures are
  // added with `what` in front.
  void Trial(int trial) {
    const Victim victim = GetParam();
    std::mt19937_64 rng = ::ps::testing::TrialRng(
        Seed(), {static_cast<uint32_t>(victim), static_cast<uint32_t>(trial)});
    const int delay_ms = static_cast<int>(rng() % 101);
    const uint32_t source = static_cast<uint32_t>(rng() % 3);
    const std::string what = absl::StrCat(
        Name(victim), " trial ", trial, " (kill ",
        victim == Victim::kSource   ? absl::StrCat("server ", source)
        : victim == Victim::kTarget ? std::string("the spare, server 3")
                                    : std::string("the scheduler"),
        " ", delay_ms, " ms after the moves were planned)");
    std::printf(
        "%s; replay: --test_arg=--rebalance_seed=%llu "
        "--test_arg=--rebalance_trial=%d --test_filter=*/%s\n",
        what.c_str(), static_cast<unsigned long long>(Seed()), trial,
        Name(victim));
    const std::string dir = absl::StrCat(::testing::TempDir(), "/rebalance-",
                                         Name(victim), "-", trial);
    mkdir(dir.c_str(), 0755);
    JobHarness::Options options;
    options.dir = dir;
    options.config = ConfigText();
    options.num_servers = 3;
    options.num_workers = 0;
    auto started = JobHarness::Start(options);
    ASSERT_TRUE(started.ok()) << what << ": " << started.status();
    std::unique_ptr<JobHarness> job = *std::move(started);
    std::vector<uint32_t> ranks;
    for (int i = 0; i < 3; ++i) {
      auto rank = ::ps::testing::WaitForServerRank(*job, i, absl::Seconds(20));
      ASSERT_TRUE(rank.has_value()) << what;
      ranks.push_back(*rank);
    }
    LedgerPushers::Options ledger = LedgerPushers::ForJob(*job, Seed() + trial);
    ledger.pushers = kPushers;
    ledger.keys = 20000;
    ledger.mixed = true;
    auto pushers = LedgerPushers::Start(ledger, absl::Seconds(30));
    ASSERT_TRUE(pushers.ok()) << what << ": " << pushers.status();
    auto spare = job->StartServer();
    ASSERT_TRUE(spare.ok()) << what;
    ASSERT_EQ(::ps::testing::WaitForServerRank(*job, *spare, absl::Seconds(20)),
              3u)
        << what;
    ranks.push_back(3);
    absl::SleepFor(absl::Milliseconds(300));  // rows on every server

    auto scale = job->StartPsctl({"scale", "--servers=4"}, absl::Minutes(1));
    ASSERT_TRUE(scale.ok()) << what;
    // The moment counts from the scheduler's plan, not from psctl's start.
    const absl::Time plan_deadline = absl::Now() + absl::Seconds(20);
    while (LinesWith(::ps::testing::SchedulerLogs(*job), "scale to 4 servers")
               .empty() &&
           absl::Now() < plan_deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    job->SleepFor(absl::Milliseconds(delay_ms));
    const std::string at_kill = ::ps::testing::SchedulerLogs(*job);
    std::printf("  at the kill: %zu moves copied, %zu flipped\n",
                LinesWith(at_kill, "fencing").size(),
                LinesWith(at_kill, "owns them").size());
    int killed = -1;  // server index, or -1 for the scheduler
    if (victim == Victim::kScheduler) {
      ASSERT_TRUE(job->SignalScheduler(SIGKILL)) << what;
      (void)job->scheduler().Wait(absl::Seconds(10));
      job->SleepFor(absl::Milliseconds(100));
      const absl::Status restarted = job->RestartScheduler();
      ASSERT_TRUE(restarted.ok()) << what << ": " << restarted;
    } else {
      const uint32_t rank = victim == Victim::kSource ? source : 3;
      for (int i = 0; i < static_cast<int>(ranks.size()); ++i) {
        if (ranks[i] == rank) killed = i;
      }
      ASSERT_TRUE(job->SignalServer(killed, SIGKILL)) << what;
    }
    (void)scale->Wait(absl::Seconds(60));  // refused or not: judged below

    // Every move completes or is abandoned; the pushes go on meanwhile.
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    bool settled = false;
    while (!settled && absl::Now() < give_up) {
      auto status = job->Status();
      settled = status.ok() && status->view().moves_size() == 0 &&
                status->queued_moves_size() == 0;
      if (!settled) job->SleepFor(absl::Milliseconds(50));
    }
    ASSERT_TRUE(settled) << what << ": moves still in progress\n"
                         << job->LogTails(30);
    job->SleepFor(absl::Milliseconds(500));
    const std::string sched = ::ps::testing::SchedulerLogs(*job);
    std::printf("  %zu moves flipped, %zu abandoned, %zu tries retried\n",
                LinesWith(sched, "owns them").size(),
                LinesWith(sched, "abandoned").size(),
                LinesWith(sched, "trying again").size());

    LedgerPushers::Verdict verdict = pushers->StopAndVerify();
    for (const std::string& p : verdict.problems) {
      ADD_FAILURE() << what << ": " << p << "\n" << job->LogTails(20);
    }
    auto result = job->Wait(absl::Seconds(60));
    ASSERT_TRUE(result.ok()) << what << ": " << result.status() << "\n"
                             << job->LogTails(20);
    EXPECT_EQ(result->scheduler, 0) << what << "\n" << job->LogTails(20);
    for (int i = 0; i < static_cast<int>(result->servers.size()); ++i) {
      if (i == killed) continue;
      EXPECT_EQ(result->servers[i], 0)
          << what << ": server" << i << "\n"
          << ReadFile(job->server(i).stderr_path());
    }
  }
};

TEST_P(RebalanceFaultTest, TheLedgerHoldsWhenAMoveIsInterrupted) {
  const int64_t only = ::ps::testing::Setting(
      absl::GetFlag(FLAGS_rebalance_trial), "REBALANCE_TRIAL", -1);
  for (int trial = 0; trial < Trials(); ++trial) {
    if (only >= 0 && trial != only) continue;
    Trial(trial);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Kill, RebalanceFaultTest,
                         ::testing::Values(Victim::kSource, Victim::kTarget,
                                           Victim::kScheduler),
                         [](const ::testing::TestParamInfo<Victim>& info) {
                           return std::string(Name(info.param));
                         });

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);  // takes the --gtest_* flags
  absl::ParseCommandLine(argc, argv);
  return RUN_ALL_TESTS();
}
