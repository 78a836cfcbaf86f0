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
// RebalanceCheckpointTest: the same job with checkpoint.dir, scaled to 4
// servers (and, in one case, back to 3 by removing rank 1, which leaves a
// rank hole); once the moves are done and the pushers stopped, `psctl
// status` and the scheduler's /metrics must agree with the view (every
// server with its slots, no spare, no move), and `psctl checkpoint` must
// commit a checkpoint that a fresh job with `restore: true` on 3 servers
// reads back bit-identically: every key minus the sum of its acknowledged
// gradients.
//
// Runs with replication 1 and 2. Flags (or environment variables):
//   --rebalance_seed=N  (REBALANCE_SEED)  default 1; 0 = from the time
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
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

// The elastic job of the pushers; `more` follows at the top level (e.g. a
// checkpoint block).
// `sparse` adds fields to the table's sparse block (a disk tier).
std::string ConfigText(int replication, const std::string& more = "",
                       const std::string& sparse = "") {
  return ::ps::testing::LedgerJobConfig(
             ::ps::testing::JobHead(
                 absl::StrCat("rebalance-r", replication), /*servers=*/2,
                 /*workers=*/kPushers, kSlots, /*heartbeat_timeout_ms=*/2000,
                 absl::StrCat("request_timeout_ms: 60000 failover_timeout_ms: "
                              "60000 replication: ",
                              replication, " elastic { max_servers: 4 }")),
             sparse) +
         more;
}

class RebalanceTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    StartJob(absl::StrCat(::testing::TempDir(), "/rebalance-r", GetParam()),
             ConfigText(GetParam()));
  }

  // Starts the job of `config` (2 servers, no trainer) in `dir` and waits
  // for both servers' ranks.
  void StartJob(const std::string& dir, const std::string& config) {
    dir_ = dir;
    mkdir(dir_.c_str(), 0755);
    rng_.seed(Seed());
    std::printf(
        "rebalance_seed=%llu (replay: --test_arg=--rebalance_seed=%llu)\n",
        static_cast<unsigned long long>(Seed()),
        static_cast<unsigned long long>(Seed()));
    JobHarness::Options options;
    options.dir = dir_;
    options.config = config;
    options.num_servers = 2;
    options.num_workers = 0;
    auto job = JobHarness::Start(options);
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *std::move(job);
    for (int i = 0; i < 2; ++i) {
      const auto rank =
          ::ps::testing::WaitForServerRank(*job_, i, absl::Seconds(20));
      ASSERT_TRUE(rank.has_value()) << ReadFile(job_->server(i).stderr_path());
      ranks_.push_back(*rank);
    }
  }

  // Runs psctl with `args` to completion; its output.
  std::string Psctl(std::vector<std::string> args, int* code) {
    JobHarness::ToolRun run = job_->RunPsctl(std::move(args));
    *code = run.code;
    return run.output;
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

  // Pushers to `keys` keys spanning every server; two spares join and
  // `psctl scale --servers=4` moves half the slots onto them, then
  // `--servers=3 --remove=1` empties server 1, which leaves; the ledger
  // holds and every process exits 0. The scaling begins `warm_up` after
  // the pushers.
  void ScaleOutThenIn(int keys, absl::Duration warm_up);

  std::string dir_;
  std::mt19937_64 rng_;
  std::unique_ptr<JobHarness> job_;
  // By server index: the rank each server process got.
  std::vector<uint32_t> ranks_;
};

TEST_P(RebalanceTest, ScaleOutThenInLosesNoAcknowledgedPush) {
  ScaleOutThenIn(4000, absl::ZeroDuration());
}

INSTANTIATE_TEST_SUITE_P(Replication, RebalanceTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("R", info.param);
                         });

// The same with most rows on disk tiers (a 1 MiB budget holds some 17 000
// of a server's rows): moves list, copy, digest and drop the cold rows too.
class TieredRebalanceTest : public RebalanceTest {
 protected:
  void SetUp() override {
    const std::string dir =
        absl::StrCat(::testing::TempDir(), "/rebalance-tiered-r", GetParam());
    StartJob(dir, ConfigText(GetParam(), "",
                             absl::StrCat("memory_budget_bytes: 1048576 "
                                          "eviction: EVICT_LRU disk_tier { "
                                          "dir: \"",
                                          dir, "/tier\" buffered_io: true }")));
  }
};

TEST_P(TieredRebalanceTest, ScaleOutThenInLosesNoAcknowledgedPush) {
  // 4 s of pushes first: the servers hold more rows than their RAM does.
  ScaleOutThenIn(100000, absl::Seconds(4));
  // The moves' copies read rows from disk.
  static const std::regex kCopied(
      "rows and blocks \\(([0-9]+) read from disk\\)");
  uint64_t cold = 0;
  for (int i = 0; i < job_->num_servers(); ++i) {
    const std::string log = ReadFile(job_->server(i).stderr_path());
    for (std::sregex_iterator it(log.begin(), log.end(), kCopied), end;
         it != end; ++it) {
      cold += std::stoull((*it)[1].str());
    }
  }
  std::printf("the moves copied %llu rows from disk\n",
              static_cast<unsigned long long>(cold));
  EXPECT_GT(cold, 1000u);
}

INSTANTIATE_TEST_SUITE_P(Replication, TieredRebalanceTest,
                         ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("R", info.param);
                         });

void RebalanceTest::ScaleOutThenIn(int keys, absl::Duration warm_up) {
  LedgerPushers::Options ledger = LedgerPushers::ForJob(*job_, Seed());
  ledger.pushers = kPushers;
  ledger.keys = keys;
  ledger.mixed = true;
  auto started = LedgerPushers::Start(ledger, absl::Seconds(30));
  ASSERT_TRUE(started.ok()) << started.status();
  LedgerPushers pushers = *std::move(started);
  absl::SleepFor(warm_up);

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

// The value of the sample `series` (name and labels, as printed) in the
// Prometheus text `text`; nullopt when absent.
std::optional<double> MetricValue(const std::string& text,
                                  const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, series + " ")) continue;
    double value;
    if (absl::SimpleAtod(line, &value)) return value;
  }
  return std::nullopt;
}

// The newest committed checkpoint (a ckpt-<clock> directory with a
// MANIFEST; the clock is zero-padded, so names sort by it) under `root`;
// "" when none.
std::string NewestCheckpoint(const std::string& root) {
  std::string newest;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ckpt-", 0) != 0 ||
        !std::filesystem::exists(entry.path() / "MANIFEST")) {
      continue;
    }
    if (newest.empty() || entry.path().string() > newest) {
      newest = entry.path().string();
    }
  }
  return newest;
}

// The ranks whose shard files (shard-<rank>.ckpt) checkpoint `dir` holds.
std::set<uint32_t> ShardRanks(const std::string& dir) {
  std::set<uint32_t> ranks;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string file = entry.path().filename().string();
    absl::string_view name = file;
    uint32_t rank;
    if (absl::ConsumePrefix(&name, "shard-") &&
        absl::ConsumeSuffix(&name, ".ckpt") && absl::SimpleAtoi(name, &rank)) {
      ranks.insert(rank);
    }
  }
  return ranks;
}

// The values kv_tool --op=pull printed (space-separated, "%.9g": exact
// for a float), or an error naming what is not a number.
absl::StatusOr<std::vector<float>> PulledValues(const std::string& printed) {
  std::vector<float> values;
  for (absl::string_view part : absl::StrSplit(
           absl::StripAsciiWhitespace(printed), ' ', absl::SkipEmpty())) {
    float value;
    if (!absl::SimpleAtof(part, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv_tool printed '", part, "'"));
    }
    values.push_back(value);
  }
  return values;
}

constexpr int kCheckpointKeys = 4000;

class RebalanceCheckpointTest : public RebalanceTest {
 protected:
  void SetUp() override {
    std::string name =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : name) {
      if (c == '/') c = '-';
    }
    const std::string dir =
        absl::StrCat(::testing::TempDir(), "/rebalance-ckpt-", name);
    ckpt_ = dir + "/ckpt";
    StartJob(dir, ConfigText(GetParam(), absl::StrCat("checkpoint { dir: \"",
                                                      ckpt_, "\" }\n")));
  }

  // Pushers push while two spares join and `psctl scale --servers=4`
  // moves slots onto them, then (`scale_in`) `psctl scale --servers=3
  // --remove=1` empties rank 1, which leaves; the pushers stop, `psctl
  // checkpoint` commits, status and metrics are checked, the job ends (the
  // ledger checked) and the checkpoint is restored onto 3 servers.
  void ScaleCheckpointAndRestore(bool scale_in) {
    LedgerPushers::Options ledger = LedgerPushers::ForJob(*job_, Seed());
    ledger.pushers = kPushers;
    ledger.keys = kCheckpointKeys;
    ledger.mixed = true;
    auto started = LedgerPushers::Start(ledger, absl::Seconds(30));
    ASSERT_TRUE(started.ok()) << started.status();
    LedgerPushers pushers = *std::move(started);
    for (int i = 0; i < 2; ++i) {
      auto index = job_->StartServer();
      ASSERT_TRUE(index.ok()) << index.status();
      const auto rank =
          ::ps::testing::WaitForServerRank(*job_, *index, absl::Seconds(20));
      ASSERT_TRUE(rank.has_value()) << job_->LogTails(20);
      ranks_.push_back(*rank);
    }
    Pause();
    int code = 0;
    std::string out = Psctl({"scale", "--servers=4", "--wait"}, &code);
    ASSERT_EQ(code, 0) << out << job_->LogTails(30);
    std::set<uint32_t> kept = {0, 1, 2, 3};
    if (scale_in) {
      Pause();
      out = Psctl({"scale", "--servers=3", "--remove=1", "--wait"}, &code);
      ASSERT_EQ(code, 0) << out << job_->LogTails(30);
      kept.erase(1);
      // The emptied server leaves and exits 0.
      int removed = -1;
      for (size_t i = 0; i < ranks_.size(); ++i) {
        if (ranks_[i] == 1) removed = static_cast<int>(i);
      }
      ASSERT_GE(removed, 0);
      auto exit = job_->server(removed).Wait(absl::Seconds(60));
      ASSERT_TRUE(exit.ok()) << exit.status() << job_->LogTails(20);
      EXPECT_EQ(*exit, 0) << ReadFile(job_->server(removed).stderr_path());
    }
    Pause();

    // No worker trains from here on: the checkpoint holds what the ledger
    // says.
    const absl::Status stopped = pushers.Stop();
    ASSERT_TRUE(stopped.ok()) << stopped;
    out = Psctl({"checkpoint", "--wait"}, &code);
    ASSERT_EQ(code, 0) << out << job_->LogTails(30);
    std::printf("%s", out.c_str());
    ExpectStatusAndMetricsAgree(kept);
    const std::string checkpoint = NewestCheckpoint(ckpt_);
    ASSERT_FALSE(checkpoint.empty()) << out;
    // One shard per rank that owns slots; a removed rank leaves a hole.
    EXPECT_EQ(ShardRanks(checkpoint), kept) << checkpoint;

    LedgerPushers::Verdict verdict = pushers.StopAndVerify();
    for (const std::string& p : verdict.problems) ADD_FAILURE() << p;
    EXPECT_GT(verdict.acknowledged, 0u);
    auto result = job_->Wait(absl::Seconds(60));
    ASSERT_TRUE(result.ok()) << result.status() << job_->LogTails(20);
    EXPECT_EQ(result->scheduler, 0) << job_->LogTails(20);
    for (size_t i = 0; i < result->servers.size(); ++i) {
      EXPECT_EQ(result->servers[i], 0)
          << "server " << i << ":\n"
          << ReadFile(job_->server(static_cast<int>(i)).stderr_path());
    }
    auto sums = ::ps::testing::LedgerSums(dir_, kPushers, kCheckpointKeys);
    ASSERT_TRUE(sums.ok()) << sums.status();
    ExpectRestoredOntoThree(*sums);
  }

  // `psctl status` lists exactly the servers `kept` with the slots the
  // view gives them, no spare and no move; the scheduler's /metrics counts
  // them alive (the removed ones left) and no move in progress.
  void ExpectStatusAndMetricsAgree(const std::set<uint32_t>& kept) {
    const std::map<uint32_t, int> slots = SlotsByServer();
    std::set<uint32_t> owners;
    for (const auto& [rank, n] : slots) owners.insert(rank);
    EXPECT_EQ(owners, kept);
    int code = 0;
    const std::string out = Psctl({"status"}, &code);
    ASSERT_EQ(code, 0) << out;
    std::map<uint32_t, int> listed;
    const std::regex server_re(R"(server rank (\d+)  ALIVE.*  slots (\d+))");
    for (const std::string& line :
         std::vector<std::string>(absl::StrSplit(out, '\n'))) {
      if (line.find("server rank") == std::string::npos ||
          line.find("ALIVE") == std::string::npos) {
        continue;
      }
      std::smatch m;
      if (!std::regex_search(line, m, server_re)) {
        ADD_FAILURE() << "a live server without slots: " << line;
        continue;
      }
      listed[std::stoul(m[1].str())] = std::stoi(m[2].str());
    }
    EXPECT_EQ(listed, slots) << out;
    EXPECT_EQ(out.find("spare"), std::string::npos) << out;
    EXPECT_EQ(out.find("slot moves:"), std::string::npos) << out;

    std::smatch url;
    const std::string log = ReadFile(dir_ + "/scheduler.log");
    const std::regex url_re(R"(http endpoint on (http://[^\s]+))");
    ASSERT_TRUE(std::regex_search(log, url, url_re)) << log;
    const std::string name = dir_ + "/metrics";
    auto curl = Subprocess::Start(
        {"curl", "-sSf", "--max-time", "10", url[1].str() + "/metrics"},
        name + ".out", name + ".err");
    ASSERT_TRUE(curl.ok()) << curl.status();
    auto curl_exit = curl->Wait(absl::Seconds(20));
    ASSERT_TRUE(curl_exit.ok() && *curl_exit == 0) << ReadFile(name + ".err");
    const std::string text = ReadFile(name + ".out");
    const auto expect_metric = [&](const std::string& series, double want) {
      EXPECT_EQ(MetricValue(text, series), std::optional<double>(want))
          << series << " in\n"
          << text;
    };
    expect_metric(R"(ps_scheduler_nodes{role="server",state="alive"})",
                  kept.size());
    expect_metric(R"(ps_scheduler_nodes{role="server",state="left"})",
                  4 - kept.size());
    expect_metric(R"(ps_scheduler_nodes{role="server",state="dead"})", 0);
    expect_metric(R"(ps_scheduler_nodes{role="worker",state="alive"})", 0);
    expect_metric(R"(ps_scheduler_slot_moves{phase="copying"})", 0);
    expect_metric(R"(ps_scheduler_slot_moves{phase="fencing"})", 0);
    expect_metric("ps_scheduler_slots_moving", 0);
  }

  // A fresh job on 3 servers with `restore: true` over the same checkpoint
  // directory resumes from its newest checkpoint; every key must be
  // bit-identical to minus `sums` (+0 for a key never pushed).
  void ExpectRestoredOntoThree(const std::vector<double>& sums) {
    const std::string newest = NewestCheckpoint(ckpt_);
    ASSERT_FALSE(newest.empty());
    JobHarness::Options options;
    options.dir = dir_ + "/restored";
    options.config =
        ::ps::testing::LedgerJobConfig(::ps::testing::JobHead(
            absl::StrCat("rebalance-r", GetParam()), /*servers=*/3,
            /*workers=*/1, kSlots, /*heartbeat_timeout_ms=*/2000,
            absl::StrCat("request_timeout_ms: 60000 replication: ",
                         GetParam()))) +
        absl::StrCat("checkpoint { dir: \"", ckpt_, "\" restore: true }\n");
    options.num_servers = 3;
    options.num_workers = 0;
    auto started = JobHarness::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    std::unique_ptr<JobHarness> job = *std::move(started);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(::ps::testing::WaitForServerRank(*job, i, absl::Seconds(20)))
          << job->LogTails(20);
    }
    const std::string name = options.dir + "/reader";
    auto reader = Subprocess::Start(
        {Runfile("worker/kv_tool"), "--config=" + options.dir + "/job.pbtxt",
         "--scheduler=" + job->address(), "--table=sgd", "--op=pull",
         absl::StrCat("--keys=0-", kCheckpointKeys - 1), "--finish"},
        name + ".out", name + ".log");
    ASSERT_TRUE(reader.ok()) << reader.status();
    auto code = reader->Wait(absl::Seconds(60));
    ASSERT_TRUE(code.ok() && *code == 0)
        << ReadFile(name + ".log") << job->LogTails(20);
    auto values = PulledValues(ReadFile(name + ".out"));
    ASSERT_TRUE(values.ok()) << values.status();
    ASSERT_EQ(values->size(), static_cast<size_t>(kCheckpointKeys));
    int wrong = 0;
    for (int k = 0; k < kCheckpointKeys; ++k) {
      const float want = static_cast<float>(0.0 - sums[k]);
      if (std::memcmp(&(*values)[k], &want, sizeof(float)) != 0 &&
          ++wrong <= 10) {
        ADD_FAILURE() << "key " << k << " restored as " << (*values)[k]
                      << "; its acknowledged pushes sum to " << sums[k];
      }
    }
    EXPECT_EQ(wrong, 0) << "keys restored otherwise than minus the sum of "
                           "their acknowledged pushes";
    auto result = job->Wait(absl::Seconds(60));
    ASSERT_TRUE(result.ok()) << result.status() << job->LogTails(20);
    EXPECT_EQ(result->scheduler, 0) << job->LogTails(20);
    for (size_t i = 0; i < result->servers.size(); ++i) {
      EXPECT_EQ(result->servers[i], 0) << job->LogTails(20);
    }
    const std::string resumed = ::ps::testing::LineWith(
        ReadFile(options.dir + "/scheduler.log"), "resumes from checkpoint");
    EXPECT_NE(resumed.find(std::filesystem::path(newest).filename().string()),
              std::string::npos)
        << "want " << newest << ", the scheduler logged: " << resumed;
  }

  std::string ckpt_;
};

TEST_P(RebalanceCheckpointTest, TakenAfterScaleOutRestoresOntoThreeServers) {
  ScaleCheckpointAndRestore(/*scale_in=*/false);
}

TEST_P(RebalanceCheckpointTest, WithARankHoleRestoresOntoThreeServers) {
  ScaleCheckpointAndRestore(/*scale_in=*/true);
}

INSTANTIATE_TEST_SUITE_P(Replication, RebalanceCheckpointTest,
                         ::testing::Values(1, 2),
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
