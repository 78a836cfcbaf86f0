// Starts real scheduler, server and worker processes on loopback and checks
// what the servers hold after known update sequences.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "tests/testing/job_harness.h"
#include "tests/testing/subprocess.h"

namespace ps {
namespace {

using ::ps::testing::JobHarness;
using ::ps::testing::ReadFile;
using ::ps::testing::Runfile;
using ::ps::testing::Subprocess;
using ::ps::testing::TimeoutScale;

// SGD with learning rate 0.5 and gradients that are small binary fractions:
// every intermediate sum is exact in float, so the final values do not
// depend on the order in which concurrent pushes are applied.
constexpr char kConfig[] = R"pb(
  name: "sgd-sequence"
  cluster {
    num_servers: 2
    num_workers: 2
    num_slots: 64
    heartbeat_interval_ms: 100
    heartbeat_timeout_ms: 2000
    request_timeout_ms: 10000
  }
  tables {
    id: 0
    name: "sparse"
    sparse { dim: 1 }
    optimizer { sgd { learning_rate: 0.5 } }
  }
  tables {
    id: 1
    name: "dense"
    dense { size: 40 block_size: 8 }
    optimizer { sgd { learning_rate: 0.5 } }
  }
  tables {
    id: 2
    name: "capped"
    sparse { dim: 256 memory_budget_bytes: 1048576 }
    optimizer { sgd { learning_rate: 0.5 } }
  }
)pb";

class MultiProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');  // parameterised names
    dir_ = absl::StrCat(::testing::TempDir(), "/", name);
    mkdir(dir_.c_str(), 0755);
    config_ = dir_ + "/job.pbtxt";
    std::ofstream(config_) << kConfig;
  }

  Subprocess Start(const std::string& name, std::vector<std::string> argv) {
    auto p = Subprocess::Start(argv, dir_ + "/" + name + ".out",
                               dir_ + "/" + name + ".log");
    EXPECT_TRUE(p.ok()) << p.status();
    return std::move(p).value();
  }

  // Starts the scheduler and two servers of the job `config` (written to
  // config_) through tests/testing/job_harness.h, with no workers (the
  // tests start their own), and sets processes_ and address_.
  void StartCluster(const std::string& config = kConfig) {
    JobHarness::Options options;
    options.dir = dir_;
    options.config = config;
    options.num_servers = 2;
    options.num_workers = 0;
    auto job = JobHarness::Start(options);
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *std::move(job);
    processes_ = {&job_->scheduler(), &job_->server(0), &job_->server(1)};
    address_ = job_->address();
  }

  std::vector<std::string> Tool(const std::string& address,
                                std::vector<std::string> args) {
    std::vector<std::string> argv = {Runfile("worker/kv_tool"),
                                     "--config=" + config_,
                                     "--scheduler=" + address};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // Runs kv_tool to completion and returns what it printed.
  std::string RunTool(const std::string& name, std::vector<std::string> argv) {
    Subprocess p = Start(name, std::move(argv));
    auto code = p.Wait(absl::Seconds(30));
    EXPECT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << ReadFile(p.stderr_path());
    return ReadFile(p.stdout_path());
  }

  static std::vector<float> ParseFloats(const std::string& line) {
    std::vector<float> values;
    for (absl::string_view part : absl::StrSplit(
             absl::StripAsciiWhitespace(line), ' ', absl::SkipEmpty())) {
      float v;
      EXPECT_TRUE(absl::SimpleAtof(part, &v)) << part;
      values.push_back(v);
    }
    return values;
  }

  std::string dir_;
  std::string config_;
  std::unique_ptr<JobHarness> job_;
  std::vector<Subprocess*> processes_;  // job_'s scheduler and servers
  std::string address_;
};

TEST_F(MultiProcessTest, ConcurrentSgdPushesLandExactlyOnTheOwningServers) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  const std::string& address = address_;

  // Two workers push at the same time, ten times each, to overlapping keys.
  // The barrier makes both register before either pushes: without it the
  // first could leave before the second registers, both would get rank 0,
  // and the job would never see its second worker (nor end).
  Subprocess a =
      Start("push_a",
            Tool(address, {"--table=sparse", "--op=push", "--keys=1-100",
                           "--values=0.25", "--repeat=10", "--barrier=go"}));
  Subprocess b = Start(
      "push_b", Tool(address, {"--table=sparse", "--op=push", "--keys=51-150",
                               "--values=0.5", "--repeat=10", "--barrier=go"}));
  for (Subprocess* p : {&a, &b}) {
    auto code = p->Wait(absl::Seconds(30));
    ASSERT_TRUE(code.ok()) << code.status();
    ASSERT_EQ(*code, 0) << ReadFile(p->stderr_path());
  }
  // Dense pushes span block boundaries (block_size 8), so both servers own
  // parts of them.
  std::vector<std::string> grads;
  for (int i = 0; i < 20; ++i) grads.push_back(absl::StrCat(0.125 * (i + 1)));
  RunTool(
      "push_dense",
      Tool(address, {"--table=dense", "--op=push_dense", "--begin=5",
                     "--values=" + absl::StrJoin(grads, ","), "--repeat=4"}));

  const std::vector<float> sparse = ParseFloats(
      RunTool("pull_sparse",
              Tool(address, {"--table=sparse", "--op=pull", "--keys=1-150"})));
  ASSERT_EQ(sparse.size(), 150u);
  for (int key = 1; key <= 150; ++key) {
    float expected = 0;
    if (key <= 100) expected -= 0.5f * 0.25f * 10;  // worker a
    if (key >= 51) expected -= 0.5f * 0.5f * 10;    // worker b
    EXPECT_EQ(sparse[key - 1], expected) << "key " << key;
  }

  const std::vector<float> dense = ParseFloats(RunTool(
      "pull_dense", Tool(address, {"--table=dense", "--op=pull_dense",
                                   "--begin=0", "--count=40", "--finish"})));
  ASSERT_EQ(dense.size(), 40u);
  for (int i = 0; i < 40; ++i) {
    const float expected =
        (i >= 5 && i < 25) ? -0.5f * 0.125f * (i - 4) * 4 : 0.0f;
    EXPECT_EQ(dense[i], expected) << "element " << i;
  }

  // The last tool left as a finished worker: the job ends and every process
  // exits cleanly by itself.
  for (Subprocess* p : processes_) {
    auto code = p->Wait(absl::Seconds(15));
    ASSERT_TRUE(code.ok()) << code.status() << "\n"
                           << ReadFile(p->stderr_path());
    EXPECT_EQ(*code, 0) << ReadFile(p->stderr_path());
  }
  // Both servers served a share of the keys (the slot map spreads them).
  // A server may have refused a first request while its view was a moment
  // behind the tools' (UNAVAILABLE, applied nothing, retried by the
  // client); the exact values above show nothing was lost or doubled.
  for (int i = 1; i <= 2; ++i) {
    const std::string log = ReadFile(processes_[i]->stderr_path());
    EXPECT_NE(log.find("keys pushed"), std::string::npos) << log;
    EXPECT_EQ(log.find(" 0 keys pushed"), std::string::npos) << log;
  }
}

TEST_F(MultiProcessTest, WrongRequestsFromAWorkerAreRefusedAndTheJobGoesOn) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  const std::string& address = address_;
  // A dense op on a sparse table, and a range past the end: the tool fails
  // with a clear message; the servers keep serving.
  Subprocess bad =
      Start("bad", Tool(address, {"--table=dense", "--op=pull_dense",
                                  "--begin=30", "--count=20"}));
  auto code = bad.Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1);
  EXPECT_NE(ReadFile(bad.stderr_path()).find("outside table 1 of size 40"),
            std::string::npos)
      << ReadFile(bad.stderr_path());
  Subprocess nan = Start("nan", Tool(address, {"--table=sparse", "--op=push",
                                               "--keys=7", "--values=nan"}));
  code = nan.Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1);
  EXPECT_NE(ReadFile(nan.stderr_path()).find("not finite"), std::string::npos)
      << ReadFile(nan.stderr_path());

  const std::vector<float> after = ParseFloats(RunTool(
      "pull", Tool(address, {"--table=sparse", "--op=pull", "--keys=7"})));
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0], 0.0f);  // the NaN push changed nothing
  // No worker finished, so the job is not over; SIGTERM ends each process
  // cleanly. Once server 1 left without a checkpoint its slots have no live
  // copy: the job has failed, and the others may end with exit 5 on their
  // own, saying so, before their SIGTERM.
  for (int i = 2; i >= 0; --i) {
    processes_[i]->Signal(SIGTERM);
    auto exit = processes_[i]->Wait(absl::Seconds(15));
    ASSERT_TRUE(exit.ok()) << exit.status();
    const std::string log = ReadFile(processes_[i]->stderr_path());
    if (i < 2 && *exit == 5) {
      EXPECT_TRUE(log.find("the job failed") != std::string::npos ||
                  log.find("the job cannot continue") != std::string::npos)
          << log;
      continue;
    }
    EXPECT_EQ(*exit, 0) << log;
  }
}

TEST_F(MultiProcessTest, MemoryBudgetRefusalReachesTheWorkerProcess) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  const std::string& address = address_;
  // 1 KiB rows and a 1 MiB budget per server: under a thousand rows fit on
  // each server, 5000 new keys do not. The push fails with the server's
  // reason; nothing is applied.
  Subprocess big = Start("big", Tool(address, {"--table=capped", "--op=push",
                                               "--keys=1-5000", "--values=1"}));
  auto code = big.Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1);
  const std::string err = ReadFile(big.stderr_path());
  EXPECT_NE(err.find("memory budget"), std::string::npos) << err;
  EXPECT_NE(err.find("capped"), std::string::npos) << err;

  // The servers keep serving: a push that fits is applied.
  RunTool("small", Tool(address, {"--table=capped", "--op=push", "--keys=1-3",
                                  "--values=1"}));
  const std::vector<float> after = ParseFloats(RunTool(
      "pull", Tool(address, {"--table=capped", "--op=pull", "--keys=2"})));
  ASSERT_EQ(after.size(), 256u);
  for (float v : after) EXPECT_EQ(v, -0.5f);

  // The refusals and the rows held show in the statistics, one JSON line
  // per server and table.
  const std::string stats = RunTool("stats", Tool(address, {"--op=stats"}));
  int capped_lines = 0;
  uint64_t rows = 0, refused = 0;
  for (absl::string_view line :
       absl::StrSplit(stats, '\n', absl::SkipEmpty())) {
    if (line.find("\"table\":\"capped\"") == absl::string_view::npos) continue;
    ++capped_lines;
    auto field = [&](absl::string_view name) {
      const std::string key = absl::StrCat("\"", name, "\":");
      const size_t at = line.find(key);
      EXPECT_NE(at, absl::string_view::npos) << line;
      uint64_t v = 0;
      absl::string_view rest = line.substr(at + key.size());
      EXPECT_TRUE(
          absl::SimpleAtoi(rest.substr(0, rest.find_first_of(",}")), &v))
          << line;
      return v;
    };
    rows += field("rows");
    refused += field("pushes_refused");
    EXPECT_LE(field("bytes"), 1048576u) << line;
    EXPECT_EQ(field("memory_budget_bytes"), 1048576u) << line;
  }
  EXPECT_EQ(capped_lines, 2) << stats;
  EXPECT_EQ(rows, 3u) << stats;
  EXPECT_GE(refused, 1u) << stats;
}

TEST_F(MultiProcessTest, BadConfigStopsEveryBinaryBeforeItStarts) {
  const std::string bad = dir_ + "/bad.pbtxt";
  std::ofstream(bad) << "cluster { num_servers: 0 num_workers: 1 }\n"
                        "tables { id: 0 name: \"t\" sparse { dim: 0 } }\n";
  for (const char* binary : {"scheduler/scheduler_main", "server/server_main",
                             "worker/trainer", "worker/kv_tool"}) {
    std::vector<std::string> argv = {Runfile(binary), "--config=" + bad};
    if (std::string(binary) != "scheduler/scheduler_main") {
      argv.push_back("--scheduler=127.0.0.1:1");
    }
    Subprocess p = Start("bad_config", argv);
    auto code = p.Wait(absl::Seconds(10));
    ASSERT_TRUE(code.ok()) << binary;
    EXPECT_EQ(*code, 2) << binary;
    const std::string err = ReadFile(p.stderr_path());
    EXPECT_NE(err.find("cluster.num_servers"), std::string::npos)
        << binary << err;
    EXPECT_NE(err.find("tables[0].sparse.dim"), std::string::npos)
        << binary << err;
  }
  const std::string syntax = dir_ + "/syntax.pbtxt";
  std::ofstream(syntax)
      << "cluster {\n  num_servers: 1\n  no_such_field: 3\n}\n";
  Subprocess p = Start(
      "syntax", {Runfile("scheduler/scheduler_main"), "--config=" + syntax});
  auto code = p.Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 2);
  EXPECT_NE(ReadFile(p.stderr_path()).find("syntax.pbtxt:3:"),
            std::string::npos)
      << ReadFile(p.stderr_path());
}

TEST_F(MultiProcessTest, SigtermStopsAServerCleanly) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  // Wait until the servers registered (the scheduler logs it), then stop
  // one with SIGTERM: it must leave the job and exit 0.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (ReadFile(processes_[0]->stderr_path()).find("job running") ==
             std::string::npos &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  processes_[1]->Signal(SIGTERM);
  auto code = processes_[1]->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  // The scheduler saw it leave rather than time out.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (ReadFile(processes_[0]->stderr_path()).find("server rank") ==
             std::string::npos ||
         ReadFile(processes_[0]->stderr_path()).find("left") ==
             std::string::npos) {
    ASSERT_LT(absl::Now(), until) << ReadFile(processes_[0]->stderr_path());
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// A worker killed with SIGKILL under BSP or SSP must not stall the others
// for longer than failure detection takes (heartbeat timeout 1 s here):
// without it their pulls would be held until the 60 s request timeout.
class KilledWorkerTest : public MultiProcessTest,
                         public ::testing::WithParamInterface<const char*> {};

TEST_P(KilledWorkerTest, OthersFinishSoonAfterTheFailureIsDetected) {
  const std::string config = absl::StrCat(
      R"pb(
        cluster {
          num_servers: 2
          num_workers: 3
          num_slots: 256
          heartbeat_interval_ms: 100
          heartbeat_timeout_ms: 1000
          request_timeout_ms: 60000
        }
        consistency {)pb",
      GetParam(), R"pb(}
                       tables { id: 0 name: "w" sparse { dim: 1 }
             optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } } }
    tables { id: 1 name: "d" dense { size: 14 }
             optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } } }
    data { synthetic_ctr { num_train: )pb",
      // Slower processes (TimeoutScale > 1, e.g. ThreadSanitizer) train less,
      // so the survivors' remaining work still fits the bound below.
      static_cast<int>(150000 / TimeoutScale()), R"pb(                                                                                                             num_test: 20000 }
                                                                                                                                                                   }
    training { batch_size: 256 epochs: 4 log_interval_s: 1
               sparse_table: "w" dense_table: "d" }
  )pb");
  ASSERT_NO_FATAL_FAILURE(StartCluster(config));
  const std::string& address = address_;
  std::vector<Subprocess> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(Start(absl::StrCat("worker", i),
                            {Runfile("worker/trainer"), "--config=" + config_,
                             "--scheduler=" + address}));
  }
  // Find the process that got rank 2 and kill it once it is training.
  int victim = -1;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (victim < 0 && absl::Now() < deadline) {
    for (int i = 0; i < 3; ++i) {
      const std::string log = ReadFile(workers[i].stderr_path());
      if (log.find("registered as worker 2") != std::string::npos &&
          log.find("trainer: training ") != std::string::npos) {
        victim = i;
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GE(victim, 0) << "rank 2 never started training";
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(workers[victim].running())
      << "trained too fast to be killed mid-way";
  const absl::Time killed = absl::Now();
  workers[victim].Signal(SIGKILL);

  for (int i = 0; i < 3; ++i) {
    if (i == victim) continue;
    auto code = workers[i].Wait(absl::Seconds(45));
    ASSERT_TRUE(code.ok()) << code.status() << "\n"
                           << ReadFile(workers[i].stderr_path());
    EXPECT_EQ(*code, 0) << ReadFile(workers[i].stderr_path());
  }
  const absl::Duration after_kill = absl::Now() - killed;
  // Detection (1 s) plus the rest of the survivors' training; a stall would
  // last the 60 s request timeout (so the bound stays below it when scaled).
  // ASan keeps the time scale at 1 but runs the trainers up to 1.5 times
  // slower (29 s seen on a loaded machine), hence its own slack.
  const double slack = std::getenv("PS_SANITIZER") != nullptr ? 1.6 : 1.0;
  EXPECT_LT(after_kill,
            absl::Seconds(25) * std::min(TimeoutScale() * slack, 2.2));
  const std::string scheduler_log = ReadFile(processes_[0]->stderr_path());
  EXPECT_NE(scheduler_log.find("worker rank 2 (node"), std::string::npos);
  EXPECT_NE(scheduler_log.find("declared dead"), std::string::npos)
      << scheduler_log;
  // Rank 0 evaluated the model trained by the survivors.
  bool summary = false;
  for (int i = 0; i < 3; ++i) {
    if (i != victim)
      summary |= ReadFile(workers[i].stdout_path()).find("\"test_auc\"") !=
                 std::string::npos;
  }
  EXPECT_TRUE(summary);
  std::printf("%s: survivors finished %.1f s after the kill\n", GetParam(),
              absl::ToDoubleSeconds(after_kill));
  for (Subprocess* p : processes_) {
    auto code = p->Wait(absl::Seconds(15));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, KilledWorkerTest,
                         ::testing::Values("mode: BSP",
                                           "mode: SSP staleness: 2"));

}  // namespace
}  // namespace ps
