// Live scale-out and scale-in lose no acknowledged push: real scheduler,
// server and worker processes of an elastic job (cluster.elastic) start
// with 2 servers; two pushers push integer gradients (SGD, learning rate 1,
// zero initial values: every sum is exact) whose keys span every server,
// keeping a ledger of what was acknowledged, while two spares join and
// `psctl scale --servers=4` moves half the slots onto them, then
// `psctl scale --servers=3 --remove=1` empties server 1 (not the last
// rank), which then leaves and exits 0. At the end every key must equal
// exactly minus the sum of its acknowledged gradients (none lost, none
// applied twice) and no push failed; the moves must be the planned ones
// (2 -> 4 moves half the slots, 4 -> 3 a quarter) and the slots balanced.
//
// Runs with replication 1 and 2. Flags (or environment variables):
//   --rebalance_seed=N  (REBALANCE_SEED)  default 1; 0 = from the time
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <map>
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
          "Seed of the pushers and of the pauses between steps; 0 = from "
          "the time. Default: $REBALANCE_SEED, else 1.");

namespace ps {
namespace {

using ::ps::testing::JobHarness;
using ::ps::testing::LedgerPushers;
using ::ps::testing::ReadFile;
using ::ps::testing::Runfile;
using ::ps::testing::Subprocess;

constexpr int kSlots = 256;
constexpr int kPushers = 2;

uint64_t Seed() {
  static const uint64_t seed = ::ps::testing::SeedSetting(
      absl::GetFlag(FLAGS_rebalance_seed), "REBALANCE_SEED");
  return seed;
}

std::string ConfigText(int replication) {
  return ::ps::testing::LedgerJobConfig(::ps::testing::JobHead(
      absl::StrCat("rebalance-r", replication), /*servers=*/2,
      /*workers=*/kPushers, kSlots, /*heartbeat_timeout_ms=*/2000,
      absl::StrCat("request_timeout_ms: 60000 failover_timeout_ms: 60000 "
                   "replication: ",
                   replication, " elastic { max_servers: 4 }")));
}

class RebalanceTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/rebalance-r", GetParam());
    mkdir(dir_.c_str(), 0755);
    rng_.seed(Seed());
    std::printf(
        "rebalance_seed=%llu (replay: --test_arg=--rebalance_seed=%llu)\n",
        static_cast<unsigned long long>(Seed()),
        static_cast<unsigned long long>(Seed()));
    JobHarness::Options options;
    options.dir = dir_;
    options.config = ConfigText(GetParam());
    options.num_servers = 2;
    options.num_workers = 0;
    auto job = JobHarness::Start(options);
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *std::move(job);
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(::ps::testing::WaitForServerRank(*job_, i, absl::Seconds(20)))
          << ReadFile(job_->server(i).stderr_path());
    }
  }

  // Runs psctl with `args` (after --scheduler) to completion; its output.
  std::string Psctl(std::vector<std::string> args, int* code) {
    args.insert(args.begin(),
                {Runfile("scheduler/psctl"), "--scheduler=" + job_->address(),
                 "--timeout_ms=120000"});
    const std::string name = absl::StrCat(dir_, "/psctl", ++psctl_runs_);
    auto p = Subprocess::Start(args, name + ".out", name + ".err");
    if (!p.ok()) {
      *code = -1;
      return p.status().ToString();
    }
    auto exit = p->Wait(absl::Seconds(180));
    *code = exit.value_or(-1);
    return ReadFile(name + ".out") + ReadFile(name + ".err");
  }

  // Slots each live server owns.
  std::map<uint32_t, int> SlotsByServer() {
    std::map<uint32_t, int> slots;
    auto status = job_->Status();
    EXPECT_TRUE(status.ok()) << status.status();
    if (!status.ok()) return slots;
    for (uint32_t owner : status->view().slot_owner()) ++slots[owner];
    return slots;
  }

  // Slots whose owner changed between `before` and now.
  int SlotsMovedSince(const std::vector<uint32_t>& before) {
    auto status = job_->Status();
    if (!status.ok() || before.size() != static_cast<size_t>(kSlots)) return -1;
    int moved = 0;
    for (int s = 0; s < kSlots; ++s) {
      moved += status->view().slot_owner(s) != before[s];
    }
    return moved;
  }

  std::vector<uint32_t> Owners() {
    auto status = job_->Status();
    if (!status.ok()) return {};
    return {status->view().slot_owner().begin(),
            status->view().slot_owner().end()};
  }

  void Pause() { absl::SleepFor(absl::Milliseconds(200 + rng_() % 600)); }

  std::string dir_;
  std::mt19937_64 rng_;
  std::unique_ptr<JobHarness> job_;
  int psctl_runs_ = 0;
};

TEST_P(RebalanceTest, ScaleOutThenInLosesNoAcknowledgedPush) {
  LedgerPushers::Options ledger = LedgerPushers::ForJob(*job_, Seed());
  ledger.pushers = kPushers;
  ledger.keys = 4000;
  ledger.mixed = true;
  auto started = LedgerPushers::Start(ledger, absl::Seconds(30));
  ASSERT_TRUE(started.ok()) << started.status();
  LedgerPushers pushers = *std::move(started);

  // Two spares join while the pushes go on.
  for (int i = 0; i < 2; ++i) {
    auto index = job_->StartServer();
    ASSERT_TRUE(index.ok()) << index.status();
    const auto rank =
        ::ps::testing::WaitForServerRank(*job_, *index, absl::Seconds(20));
    ASSERT_TRUE(rank.has_value());
    EXPECT_EQ(*rank, static_cast<uint32_t>(2 + i));
  }
  EXPECT_EQ(SlotsByServer().size(), 2u);  // spares own nothing
  Pause();

  std::vector<uint32_t> before = Owners();
  int code = 0;
  std::string out = Psctl({"scale", "--servers=4", "--wait"}, &code);
  ASSERT_EQ(code, 0) << out << job_->LogTails(30);
  EXPECT_EQ(SlotsMovedSince(before), kSlots / 2) << out;
  // Balanced by the bytes each slot holds (about 16 keys a slot, so slot
  // counts stay near even).
  EXPECT_NE(out.find("% of the bytes"), std::string::npos) << out;
  for (const auto& [rank, slots] : SlotsByServer()) {
    EXPECT_NEAR(slots, kSlots / 4.0, kSlots / 4.0 * 0.25) << "server " << rank;
  }
  Pause();

  before = Owners();
  out = Psctl({"scale", "--servers=3", "--remove=1", "--wait"}, &code);
  ASSERT_EQ(code, 0) << out << job_->LogTails(30);
  EXPECT_EQ(SlotsMovedSince(before), kSlots / 4) << out;
  const std::map<uint32_t, int> after = SlotsByServer();
  EXPECT_EQ(after.count(1), 0u);
  for (const auto& [rank, slots] : after) {
    EXPECT_NEAR(slots, kSlots / 3.0, kSlots / 3.0 * 0.25) << "server " << rank;
  }
  // With replication 2 the slots of server 1 that server 0 backs go to it
  // by promotion: nothing of them is copied.
  if (GetParam() == 2) {
    EXPECT_NE(ReadFile(job_->scheduler().stderr_path()).find("(their backup)"),
              std::string::npos);
  }
  Pause();

  LedgerPushers::Verdict verdict = pushers.StopAndVerify();
  for (const std::string& p : verdict.problems) ADD_FAILURE() << p;
  std::printf("%zu pushes acknowledged\n", verdict.acknowledged);
  EXPECT_GT(verdict.acknowledged, 0u);
  auto result = job_->Wait(absl::Seconds(60));
  ASSERT_TRUE(result.ok()) << result.status() << job_->LogTails(20);
  EXPECT_EQ(result->scheduler, 0) << job_->LogTails(20);
  for (size_t i = 0; i < result->servers.size(); ++i) {
    EXPECT_EQ(result->servers[i], 0)
        << "server " << i << ":\n"
        << ReadFile(job_->server(static_cast<int>(i)).stderr_path());
  }
}

INSTANTIATE_TEST_SUITE_P(Replication, RebalanceTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("R", info.param);
                         });

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);  // takes the --gtest_* flags
  absl::ParseCommandLine(argc, argv);
  return RUN_ALL_TESTS();
}
