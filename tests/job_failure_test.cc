// A job that cannot continue ends promptly: real scheduler, server and
// worker processes (3 servers with cluster.replication 2, 2 trainers, BSP,
// no checkpoint). Mid-training the servers of rank 0 and 1 are SIGKILLed
// together: the slots owned by 0 are backed by 1, so they have no live copy
// and nothing to restore them from. Every remaining process (the
// scheduler, the third server, both workers) must exit 5 within a
// heartbeat timeout plus 10 s (scaled for slower builds), the scheduler's
// log must name the lost slots, and nothing may keep running.
//
// Flags (tests/testing/fault_flags.h): --fault_heartbeat_timeout_ms=N
// (FAULT_HEARTBEAT_TIMEOUT_MS), default 1000 (3000 under a sanitizer).
#include <signal.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/fault_flags.h"
#include "tests/testing/fault_trials.h"
#include "tests/testing/job_harness.h"
#include "tests/testing/subprocess.h"

namespace ps::testing {
namespace {

constexpr int kServers = 3;
constexpr int kWorkers = 2;
// Exit code of a process killed by SIGKILL (Subprocess::Wait) and of one
// whose job failed (docs/operations.md, Exit codes).
constexpr int kKilled = 128 + SIGKILL;
constexpr int kJobFailed = 5;

// Enough examples that training lasts well past the kill.
std::string Config() {
  return CtrJobConfig(
      JobHead("job-failure", kServers, kWorkers, 512, FaultHeartbeatTimeoutMs(),
              "replication: 2 request_timeout_ms: 10000"),
      "mode: BSP", 2000000);
}

TEST(JobFailureTest, LosingBothCopiesWithoutACheckpointEndsEveryProcess) {
  JobHarness::Options options;
  options.dir = absl::StrCat(::testing::TempDir(), "/job-failure");
  mkdir(options.dir.c_str(), 0755);
  options.config = Config();
  options.num_servers = kServers;
  options.num_workers = kWorkers;
  auto started = JobHarness::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  JobHarness& job = **started;

  // Which process holds which server rank.
  std::vector<int> index_of_rank(kServers, -1);
  for (int i = 0; i < kServers; ++i) {
    const std::optional<uint32_t> rank =
        WaitForServerRank(job, i, absl::Seconds(20));
    ASSERT_TRUE(rank.has_value()) << job.LogTails(20);
    ASSERT_LT(*rank, static_cast<uint32_t>(kServers));
    index_of_rank[*rank] = i;
  }
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(job.WaitForRegistration(w, absl::Seconds(30)).ok())
        << job.LogTails(20);
  }
  ASSERT_TRUE(job.WaitForStep(0, 3, absl::Seconds(60)).ok())
      << job.LogTails(20);

  ASSERT_TRUE(job.SignalServer(index_of_rank[0], SIGKILL));
  ASSERT_TRUE(job.SignalServer(index_of_rank[1], SIGKILL));
  const absl::Time killed = absl::Now();
  const absl::Duration bound =
      absl::Milliseconds(FaultHeartbeatTimeoutMs()) + absl::Seconds(10);

  // Wait scales its timeout itself; DEADLINE_EXCEEDED names what still runs.
  absl::StatusOr<JobHarness::Result> result = job.Wait(bound);
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << job.LogTails(20);
  EXPECT_LT(absl::Now() - killed, Scaled(bound));
  EXPECT_EQ(result->scheduler, kJobFailed) << job.LogTails(20);
  for (int i = 0; i < kServers; ++i) {
    const bool victim = i == index_of_rank[0] || i == index_of_rank[1];
    EXPECT_EQ(result->servers[i], victim ? kKilled : kJobFailed)
        << JobHarness::ServerName(i) << "\n"
        << job.LogTails(20);
  }
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(result->workers[w], kJobFailed)
        << JobHarness::WorkerName(w) << "\n"
        << job.LogTails(20);
  }
  // Slots 0-170 are server 0's, backed by server 1: whichever of the two
  // the scheduler declared dead first, they end with no live copy.
  const std::string failure =
      LineWith(SchedulerLogs(job), "the job cannot continue");
  EXPECT_NE(failure.find("slots 0-170 (of server "), std::string::npos)
      << failure << "\n"
      << job.LogTails(30);
  EXPECT_NE(failure.find("no checkpoint"), std::string::npos) << failure;
  // Every survivor's last error line gives that reason.
  const std::string third = ReadFile(
      job.dir() + "/" + JobHarness::ServerName(index_of_rank[2]) + ".log");
  EXPECT_NE(LineWith(third, "the job failed: slots 0-170"), "") << third;
}

}  // namespace
}  // namespace ps::testing

int main(int argc, char** argv) {
  return ps::testing::FaultTestMain(argc, argv, "job_failure_test",
                                    {/*trials=*/1, /*sanitizer_trials=*/1,
                                     /*heartbeat_timeout_ms=*/1000,
                                     /*sanitizer_heartbeat_timeout_ms=*/3000});
}
