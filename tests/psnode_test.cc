// A whole job started purely through deploy/launch/psnode, once with ps-lite
// DMLC_* variables and once with a Kubeflow TFJob TF_CONFIG per process:
// 1 scheduler, 2 servers and 2 workers on loopback. The config file says
// 1 server and 1 worker, so the job only works if the sizes from the
// environment reach every process (--num_servers/--num_workers). The job
// must finish with its JSON summary and every example trained once. psnode
// is started as a cluster manager would (an exact environment, its own
// flags), so the launcher stays here rather than in tests/testing.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fault_trials.h"
#include "tests/testing/subprocess.h"

namespace ps {
namespace {

using ::ps::testing::CtrJobConfig;
using ::ps::testing::ExamplesTrainedIn;
using ::ps::testing::JobHead;
using ::ps::testing::ReadFile;
using ::ps::testing::Runfile;
using ::ps::testing::Subprocess;
using ::testing::HasSubstr;

constexpr int kNumTrain = 40000;
constexpr int kEpochs = 2;

// fault_trials' CTR job, 2 epochs of kNumTrain examples. Sizes
// deliberately differ from the launch environment's (2 and 2).
std::string Config() {
  return CtrJobConfig(JobHead("psnode", /*servers=*/1, /*workers=*/1,
                              /*slots=*/64, /*heartbeat_timeout_ms=*/5000,
                              "request_timeout_ms: 10000"),
                      "mode: ASYNC", kNumTrain);
}

// A loopback port nothing listens on right now (bound to port 0, read
// back, closed): the launch environment must name ports before any process
// starts.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

// The runfiles root, where the binaries are (DIR/PACKAGE/NAME).
std::string BinDir() {
  std::string root = Runfile("");
  if (!root.empty() && root.back() == '/') root.pop_back();
  return root;
}

class PsnodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    mkdir(dir_.c_str(), 0755);
    config_ = dir_ + "/job.pbtxt";
    std::ofstream(config_) << Config();
  }

  // The DMLC environment of a 2-server, 2-worker job for `role`.
  std::map<std::string, std::string> Dmlc(const char* role) {
    if (dmlc_port_ == 0) dmlc_port_ = FreePort();
    return {{"DMLC_ROLE", role},
            {"DMLC_PS_ROOT_URI", "127.0.0.1"},
            {"DMLC_PS_ROOT_PORT", absl::StrCat(dmlc_port_)},
            {"DMLC_NUM_SERVER", "2"},
            {"DMLC_NUM_WORKER", "2"},
            {"DMLC_NODE_HOST", "127.0.0.1"}};
  }

  // A 2-server, 2-worker job from DMLC environments, workers first (every
  // node waits for the scheduler). The cluster manager names the summary's
  // file in the workers' environment; the trainer reads it.
  void StartDmlcJob() {
    for (int i = 0; i < 2; ++i) {
      auto env = Dmlc("worker");
      env["PS_SUMMARY_OUT"] = dir_ + "/summary.json";
      ASSERT_NO_FATAL_FAILURE(Start(absl::StrCat("worker", i), env));
    }
    for (int i = 0; i < 2; ++i) {
      ASSERT_NO_FATAL_FAILURE(Start(absl::StrCat("server", i), Dmlc("server")));
    }
    ASSERT_NO_FATAL_FAILURE(Start("scheduler", Dmlc("scheduler")));
  }

  // Starts psnode under exactly `env` (plus PATH), as process `name`.
  void Start(const std::string& name, const std::map<std::string, std::string>& env,
             const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {"/usr/bin/env", "-i", "PATH=/usr/bin:/bin"};
    for (const auto& [k, v] : env) argv.push_back(k + "=" + v);
    argv.push_back(Runfile("deploy/launch/psnode"));
    argv.push_back("--config=" + config_);
    argv.push_back("--bin_dir=" + BinDir());
    argv.push_back("--listen_host=127.0.0.1");
    if (!extra.empty()) {
      argv.push_back("--");
      argv.insert(argv.end(), extra.begin(), extra.end());
    }
    auto p = Subprocess::Start(argv, dir_ + "/" + name + ".out", dir_ + "/" + name + ".log");
    ASSERT_TRUE(p.ok()) << p.status();
    names_.push_back(name);
    processes_.push_back(std::move(p).value());
  }

  std::string Logs() {
    std::string out;
    for (const std::string& name : names_) {
      const std::string log = ReadFile(dir_ + "/" + name + ".log");
      absl::StrAppend(&out, "=== ", name, ".log (last 2000 bytes)\n",
                      log.size() > 2000 ? log.substr(log.size() - 2000) : log);
    }
    return out;
  }

  // Waits for every process; expects each to exit 0.
  void ExpectAllExitZero() {
    for (size_t i = 0; i < processes_.size(); ++i) {
      auto code = processes_[i].Wait(absl::Seconds(120));
      ASSERT_TRUE(code.ok()) << names_[i] << ": " << code.status() << "\n" << Logs();
      EXPECT_EQ(*code, 0) << names_[i] << "\n" << Logs();
    }
  }

  // Waits for every process; checks the exits, the summary and that the
  // workers trained every example exactly once.
  void ExpectJobFinishes() {
    ExpectAllExitZero();
    if (HasFatalFailure()) return;
    const std::string summary = ReadFile(dir_ + "/summary.json");
    ASSERT_FALSE(summary.empty()) << Logs();
    EXPECT_THAT(summary, HasSubstr("\"workers\":2,"));
    EXPECT_THAT(summary, HasSubstr("\"servers\":2,"));
    EXPECT_THAT(summary, HasSubstr("\"test_auc\":0."));
    // Both workers' stdout: exactly one printed the summary line.
    int printed = 0;
    uint64_t trained = 0;
    for (const std::string& name : names_) {
      if (name.rfind("worker", 0) != 0) continue;
      if (ReadFile(dir_ + "/" + name + ".out").find("\"test_auc\"") != std::string::npos) {
        ++printed;
      }
      trained += ExamplesTrainedIn(ReadFile(dir_ + "/" + name + ".log"));
    }
    EXPECT_EQ(printed, 1) << Logs();
    EXPECT_EQ(trained, uint64_t{kNumTrain} * kEpochs) << Logs();
    // The servers registered as two distinct ranks of a 2-server job.
    const std::string scheduler_log = ReadFile(dir_ + "/scheduler.log");
    EXPECT_THAT(scheduler_log, HasSubstr("server rank 1 registered")) << Logs();
    EXPECT_THAT(scheduler_log, HasSubstr("worker rank 1 registered")) << Logs();
  }

  std::string dir_;
  std::string config_;
  std::vector<std::string> names_;
  std::vector<Subprocess> processes_;
  int dmlc_port_ = 0;
};

TEST_F(PsnodeTest, DmlcJobFinishes) {
  ASSERT_NO_FATAL_FAILURE(StartDmlcJob());
  ExpectJobFinishes();
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(ReadFile(absl::StrCat(dir_, "/server", i, ".log")),
                HasSubstr("at tcp://127.0.0.1:"));
  }
}

TEST_F(PsnodeTest, TfConfigJobFinishes) {
  const int chief = FreePort();
  const int ps0 = FreePort();
  const int ps1 = FreePort();
  const std::string cluster = absl::StrCat(
      R"({"cluster": {"chief": ["127.0.0.1:)", chief, R"("], "ps": ["127.0.0.1:)", ps0,
      R"(", "127.0.0.1:)", ps1,
      R"("], "worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": ")");
  auto tf = [&cluster](const char* type, int index) {
    return std::map<std::string, std::string>{
        {"TF_CONFIG", absl::StrCat(cluster, type, R"(", "index": )", index, "}}")}};
  };
  for (int i = 0; i < 2; ++i) {
    Start(absl::StrCat("worker", i), tf("worker", i),
          {"--summary_out=" + dir_ + "/summary.json"});
  }
  for (int i = 0; i < 2; ++i) Start(absl::StrCat("server", i), tf("ps", i));
  Start("scheduler", tf("chief", 0));
  ExpectJobFinishes();
  // Each ps task serves on the port its TF_CONFIG address names.
  EXPECT_THAT(ReadFile(dir_ + "/server0.log"),
              HasSubstr(absl::StrCat("at tcp://127.0.0.1:", ps0)));
  EXPECT_THAT(ReadFile(dir_ + "/server1.log"),
              HasSubstr(absl::StrCat("at tcp://127.0.0.1:", ps1)));
}

// The config's own worker command, strict about its arguments
// (argparse), gets --config and --scheduler and nothing else, and
// PS_SUMMARY_OUT from psnode's environment; it writes no summary and every
// process exits 0.
TEST_F(PsnodeTest, StrictWorkerCommandWithoutSummaryFinishes) {
  std::ofstream(config_, std::ios::app)
      << "launch { worker_command: [\"python3\", \""
      << Runfile("tests/testing/strict_worker.py") << "\", \"--trainer\", \""
      << BinDir() << "/worker/trainer\"] }\n";
  ASSERT_NO_FATAL_FAILURE(StartDmlcJob());
  ExpectAllExitZero();
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(ReadFile(absl::StrCat(dir_, "/worker", i, ".log")),
                HasSubstr(absl::StrCat(
                    "strict_worker: PS_SCHEDULER=127.0.0.1:", dmlc_port_,
                    " PS_SUMMARY_OUT=", dir_, "/summary.json")))
        << Logs();
  }
  EXPECT_EQ(ReadFile(dir_ + "/summary.json"), "");
  EXPECT_THAT(ReadFile(dir_ + "/scheduler.log"),
              HasSubstr("worker rank 1 registered"))
      << Logs();
}

TEST_F(PsnodeTest, PrintsTheCommandAndRefusesABadEnvironment) {
  std::vector<std::string> argv = {"/usr/bin/env", "-i", "DMLC_ROLE=worker",
                                   "DMLC_PS_ROOT_URI=10.1.2.3", "DMLC_PS_ROOT_PORT=9000",
                                   "DMLC_NUM_SERVER=3", "DMLC_NUM_WORKER=5",
                                   "DMLC_NODE_HOST=10.1.2.9",
                                   Runfile("deploy/launch/psnode"), "--config=" + config_,
                                   "--bin_dir=" + BinDir(), "--print", "--", "--x=a b"};
  auto p = Subprocess::Start(argv, dir_ + "/print.out", dir_ + "/print.log");
  ASSERT_TRUE(p.ok()) << p.status();
  auto code = p->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0) << ReadFile(dir_ + "/print.log");
  EXPECT_EQ(ReadFile(dir_ + "/print.out"),
            absl::StrCat(BinDir(), "/worker/trainer --config=", config_,
                         " --num_servers=3 --num_workers=5 --scheduler=10.1.2.3:9000 "
                         "--ring_host=10.1.2.9 '--x=a b'\n"));

  argv = {"/usr/bin/env", "-i", "DMLC_ROLE=worker", "TF_CONFIG={}",
          Runfile("deploy/launch/psnode"), "--config=" + config_, "--print"};
  p = Subprocess::Start(argv, dir_ + "/both.out", dir_ + "/both.log");
  ASSERT_TRUE(p.ok()) << p.status();
  code = p->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 2);
  EXPECT_THAT(ReadFile(dir_ + "/both.log"), HasSubstr("--launch_from"));
}

}  // namespace
}  // namespace ps
