// psctl against a real scheduler process: status output, run-time mode
// changes, refused requests, usage errors and an unreachable scheduler;
// draining a worker of a real running job.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "common/status.h"
#include "proto/scheduler.grpc.pb.h"
#include "tests/testing/job_harness.h"
#include "tests/testing/subprocess.h"

namespace ps {
namespace {

using ::ps::testing::ReadFile;
using ::ps::testing::Runfile;
using ::ps::testing::Subprocess;
using ::testing::HasSubstr;
using ::testing::Not;

// One server and one worker, ASYNC. Nodes registered by the test itself
// never heartbeat on their own, so they must not be declared dead meanwhile.
constexpr char kConfig[] = R"pb(
  name: "psctl"
  cluster {
    num_servers: 1
    num_workers: 1
    num_slots: 16
    heartbeat_interval_ms: 100
    heartbeat_timeout_ms: 600000
  }
  consistency { mode: ASYNC }
)pb";

struct Result {
  int code = -1;
  std::string out, err;
  absl::Duration elapsed;
};

// A TCP socket on a free loopback port. With listen=false nothing accepts
// connections to it (they are refused); with listen=true the kernel
// completes connections but nobody ever answers them.
class Port {
 public:
  explicit Port(bool listen) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    if (listen) {
      EXPECT_EQ(::listen(fd_, 16), 0);
    }
  }
  ~Port() { close(fd_); }
  Port(const Port&) = delete;
  Port& operator=(const Port&) = delete;

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

class PsctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    mkdir(dir_.c_str(), 0755);
    config_path_ = dir_ + "/job.pbtxt";
    std::ofstream(config_path_) << kConfig;
  }

  void TearDown() override {
    if (scheduler_ != nullptr) {
      scheduler_->Signal(SIGTERM);
      auto code = scheduler_->Wait(absl::Seconds(10));
      EXPECT_TRUE(code.ok()) << code.status();
      EXPECT_EQ(code.value_or(-1), 0) << ReadFile(scheduler_->stderr_path());
    }
  }

  // Starts the scheduler; returns its address.
  std::string StartScheduler() {
    auto p = Subprocess::Start({Runfile("scheduler/scheduler_main"),
                                "--config=" + config_path_,
                                "--port_file=" + dir_ + "/port",
                                "--state_dir=" + dir_ + "/scheduler-state"},
                               dir_ + "/scheduler.out", dir_ + "/scheduler.log");
    EXPECT_TRUE(p.ok()) << p.status();
    scheduler_ = std::make_unique<Subprocess>(std::move(p).value());
    auto port = ps::testing::WaitForFile(dir_ + "/port", absl::Seconds(10));
    EXPECT_TRUE(port.ok()) << port.status();
    return absl::StrCat("127.0.0.1:", absl::StripAsciiWhitespace(port.value_or("")));
  }

  // Runs psctl with `args` to completion.
  Result Psctl(std::vector<std::string> args) {
    const std::string name = absl::StrCat("psctl", ++runs_);
    args.insert(args.begin(), Runfile("scheduler/psctl"));
    const absl::Time start = absl::Now();
    auto p = Subprocess::Start(args, dir_ + "/" + name + ".out",
                               dir_ + "/" + name + ".err");
    Result r;
    if (!p.ok()) {
      ADD_FAILURE() << p.status();
      return r;
    }
    auto code = p->Wait(absl::Seconds(30));
    r.elapsed = absl::Now() - start;
    EXPECT_TRUE(code.ok()) << code.status();
    r.code = code.value_or(-1);
    r.out = ReadFile(p->stdout_path());
    r.err = ReadFile(p->stderr_path());
    return r;
  }

  std::string dir_;
  std::string config_path_;
  std::unique_ptr<Subprocess> scheduler_;
  int runs_ = 0;
};

TEST_F(PsctlTest, ShowsAndChangesTheConsistencyMode) {
  const std::string address = StartScheduler();
  const std::string flag = "--scheduler=" + address;

  Result r = Psctl({flag, "status"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("job: STARTING\n"));
  EXPECT_THAT(r.out, HasSubstr("epoch: 1\n"));
  EXPECT_THAT(r.out, HasSubstr("consistency: ASYNC ("));
  EXPECT_THAT(r.out, HasSubstr("nodes: 0\n"));
  EXPECT_THAT(r.out, HasSubstr("worker clocks: 0 live\n"));

  // Flags may follow the command.
  r = Psctl({flag, "set-mode", "SSP", "--staleness=3"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "consistency set to SSP staleness 3 in epoch 2\n");

  r = Psctl({flag, "status"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("epoch: 2\n"));
  EXPECT_THAT(r.out, HasSubstr("consistency: SSP staleness 3 ("));

  // The scheduler refuses staleness outside SSP: exit 1 with its message,
  // and nothing changes.
  r = Psctl({flag, "set-mode", "BSP", "--staleness=1"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("staleness"));
  EXPECT_EQ(r.out, "");
  r = Psctl({flag, "status"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("epoch: 2\n"));
  EXPECT_THAT(r.out, HasSubstr("consistency: SSP staleness 3 ("));

  // Mode names are not case-sensitive.
  r = Psctl({flag, "set-mode", "bsp"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "consistency set to BSP in epoch 3\n");
  r = Psctl({flag, "status"});
  EXPECT_THAT(r.out, HasSubstr("consistency: BSP ("));
  EXPECT_THAT(r.out, Not(HasSubstr("staleness")));
}

TEST_F(PsctlTest, UsageErrorsExitWithTwoWithoutContactingTheScheduler) {
  const std::string address = StartScheduler();
  const std::string flag = "--scheduler=" + address;
  const std::vector<std::vector<std::string>> bad = {
      {flag, "set-mode", "FOO"},
      {flag, "set-mode"},
      {flag, "set-mode", "SSP", "extra"},
      {flag, "set-mode", "UNSPECIFIED"},
      {flag, "set-mode", "SSP", "--staleness=-1"},
      {flag, "frobnicate"},
      {flag},
      {"status"},  // No --scheduler.
      {flag, "--no_such_flag=1", "status"},
      {flag, "--timeout_ms=soon", "status"},
      {flag, "--timeout_ms=0", "status"},
      {flag, "drain"},
      {flag, "drain", "server"},
      {flag, "drain", "node:1"},
      {flag, "drain", "worker:-1"},
      {flag, "drain", "0"},
      {flag, "drain", "1", "2"},
      {flag, "scale"},
      {flag, "scale", "--servers=0"},
      {flag, "scale", "--servers=2", "--remove=x"},
      {flag, "scale", "4"},
  };
  for (const auto& args : bad) {
    const Result r = Psctl(args);
    EXPECT_EQ(r.code, 2) << args.back() << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("usage: psctl")) << args.back();
    EXPECT_EQ(r.out, "") << args.back();
  }
  EXPECT_THAT(Psctl({flag, "set-mode", "FOO"}).err, HasSubstr("unknown mode 'FOO'"));
  EXPECT_THAT(Psctl({flag, "frobnicate"}).err,
              HasSubstr("unknown command 'frobnicate'"));
  EXPECT_THAT(Psctl({flag, "drain", "node:1"}).err,
              HasSubstr("bad node 'node:1': give a node id, server:RANK or worker:RANK"));
  EXPECT_THAT(Psctl({flag, "scale"}).err,
              HasSubstr("scale needs --servers in 1..1024"));

  // None of them changed anything.
  const Result r = Psctl({flag, "status"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("epoch: 1\n"));
  EXPECT_THAT(r.out, HasSubstr("consistency: ASYNC ("));
}

// A job without cluster.elastic refuses to scale: exit 1 with its reason.
TEST_F(PsctlTest, ScaleIsRefusedForAJobThatIsNotElastic) {
  const std::string flag = "--scheduler=" + StartScheduler();
  const Result refused = Psctl({flag, "scale", "--servers=2"});
  EXPECT_EQ(refused.code, 1) << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("not elastic"));
  EXPECT_EQ(refused.out, "");
}

TEST_F(PsctlTest, StatusListsNodesAndWorkerClocks) {
  const std::string address = StartScheduler();
  absl::StatusOr<JobConfig> config = LoadJobConfig(config_path_);
  ASSERT_TRUE(config.ok()) << config.status();
  auto stub = Scheduler::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  auto call = [&](auto method, const auto& request, auto* response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    const grpc::Status s = ((*stub).*method)(&context, request, response);
    EXPECT_TRUE(s.ok()) << s.error_message();
  };
  auto register_node = [&](Role role, const std::string& endpoint,
                           const std::string& host, uint32_t pid) {
    RegisterRequest request;
    request.set_role(role);
    request.set_data_endpoint(endpoint);
    request.set_host(host);
    request.set_pid(pid);
    request.set_config_fingerprint(ConfigFingerprint(*config));
    RegisterResponse response;
    call(&Scheduler::Stub::Register, request, &response);
    return response.node_id();
  };
  register_node(SERVER, "tcp://10.0.0.5:7001", "hostA", 4242);
  const uint64_t worker = register_node(WORKER, "", "hostB", 77);
  HeartbeatRequest beat;
  beat.set_node_id(worker);
  beat.set_clock(17);
  HeartbeatResponse beat_response;
  call(&Scheduler::Stub::Heartbeat, beat, &beat_response);

  const std::string flag = "--scheduler=" + address;
  Result r = Psctl({flag, "status"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("job: RUNNING\n"));
  EXPECT_THAT(r.out, HasSubstr("epoch: 3\n"));
  EXPECT_THAT(r.out, HasSubstr("nodes: 2\n"));
  EXPECT_THAT(r.out, HasSubstr("  node 1  server rank 0  ALIVE  endpoint "
                               "tcp://10.0.0.5:7001  host hostA  pid 4242  "
                               "slots 16\n"));
  EXPECT_THAT(r.out, HasSubstr("  node 2  worker rank 0  ALIVE  host hostB  "
                               "pid 77  start_clock 0\n"));
  EXPECT_THAT(r.out, HasSubstr("worker clocks: 1 live\n"));
  EXPECT_THAT(r.out, HasSubstr("  worker rank 0  clock 17  silent "));
  // The scheduler's own faults come with every status (their counts vary
  // with how loaded the machine is: psctl_status_test checks the text).
  EXPECT_THAT(r.out, HasSubstr("scheduler faults: stalls noticed "));

  // A worker that finished training reports clock 2^62.
  beat.set_clock(uint64_t{1} << 62);
  call(&Scheduler::Stub::Heartbeat, beat, &beat_response);
  r = Psctl({flag, "status"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("  worker rank 0  clock finished  silent "));

  // Workers that left are still listed as nodes, without a clock.
  LeaveRequest leave;
  leave.set_node_id(worker);
  leave.set_finished(true);
  LeaveResponse leave_response;
  call(&Scheduler::Stub::Leave, leave, &leave_response);
  r = Psctl({flag, "status"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("job: FINISHED\n"));
  EXPECT_THAT(r.out, HasSubstr("  node 2  worker rank 0  LEFT  host hostB"));
  EXPECT_THAT(r.out, HasSubstr("worker clocks: 0 live\n"));
}

// Sum of "trained N examples" over the workers' logs: what they trained
// together.
uint64_t ExamplesTrained(ps::testing::JobHarness& job) {
  static const std::regex kTrained("trained ([0-9]+) examples");
  uint64_t total = 0;
  for (int i = 0; i < job.num_worker_processes(); ++i) {
    const std::string log = ReadFile(job.worker(i).stderr_path());
    for (std::sregex_iterator it(log.begin(), log.end(), kTrained), end; it != end;
         ++it) {
      total += std::stoull((*it)[1].str());
    }
  }
  return total;
}

// A real job (1 server, 2 trainers): a worker drained mid-training leaves
// with its position, the other trains the rest of its shard, and the job
// ends with every example trained exactly once and one summary. Draining
// what would be unsafe is refused with the scheduler's reason.
TEST_F(PsctlTest, DrainsAWorkerOfARunningJob) {
  // Enough data for about 4 s of training per worker: with 150000 examples
  // a worker on a loaded machine once finished its shard in the 0.7 s
  // between reaching step 20 and the drain (the refused drains run first).
  constexpr int kNumTrain = 600000;
  constexpr int kEpochs = 2;
  ps::testing::JobHarness::Options options;
  options.dir = dir_ + "/job";
  options.num_servers = 1;
  options.num_workers = 2;
  options.config = absl::StrCat(R"pb(
    name: "drain"
    cluster {
      num_servers: 1 num_workers: 2 num_slots: 64
      heartbeat_interval_ms: 100 heartbeat_timeout_ms: 5000
      request_timeout_ms: 10000 on_worker_loss: REASSIGN
    }
    consistency { mode: ASYNC }
    tables {
      id: 0 name: "w" sparse { dim: 1 }
      optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
    }
    tables {
      id: 1 name: "d" dense { size: 14 }
      optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
    }
    data { synthetic_ctr { num_train: )pb", kNumTrain, R"pb( num_test: 20000 seed: 1 } }
    training { batch_size: 256 epochs: )pb", kEpochs, R"pb( sparse_table: "w" dense_table: "d" }
  )pb");
  auto job = ps::testing::JobHarness::Start(options);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string flag =
      "--scheduler=127.0.0.1:" +
      std::string(absl::StripAsciiWhitespace(ReadFile(options.dir + "/scheduler.port")));
  auto rank = (*job)->WaitForRegistration(0, absl::Seconds(30));
  ASSERT_TRUE(rank.ok()) << rank.status() << (*job)->LogTails(20);
  auto step = (*job)->WaitForStep(0, 20, absl::Seconds(60));
  ASSERT_TRUE(step.ok()) << step.status() << (*job)->LogTails(20);
  ASSERT_LT(*step, uint64_t{1} << 62) << "worker 0 finished before the drain";

  // Refused: the scheduler, the only copy of the server's slots, an
  // unknown node. Exit 1 with the scheduler's reason; nothing changes.
  Result r = Psctl({flag, "drain", "scheduler"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(r.err, HasSubstr("the scheduler cannot be drained"));
  r = Psctl({flag, "drain", "server:0"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("would lose its parameters"));
  r = Psctl({flag, "drain", "999"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));

  r = Psctl({flag, "--timeout_ms=30000", "drain", absl::StrCat("worker:", *rank),
             "--wait"});
  ASSERT_EQ(r.code, 0) << r.err << (*job)->LogTails(20);
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("draining worker rank ", *rank, " (node ",
                                            (*job)->node_id(0), "): it stops after "
                                            "its current step; another worker resumes")));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("node ", (*job)->node_id(0), " LEFT\n")));

  auto result = (*job)->Wait(absl::Seconds(120));
  ASSERT_TRUE(result.ok()) << result.status() << (*job)->LogTails(30);
  EXPECT_EQ(result->scheduler, 0);
  EXPECT_EQ(result->servers, std::vector<int>({0}));
  EXPECT_EQ(result->workers, std::vector<int>({0, 0}));  // drained: exit 0
  EXPECT_EQ(result->summaries, 1) << (*job)->LogTails(30);
  EXPECT_THAT(result->summary, HasSubstr("\"test_auc\":0."));
  const std::string drained_log = ReadFile((*job)->worker(0).stderr_path());
  EXPECT_THAT(drained_log, HasSubstr("the scheduler is draining this node"));
  EXPECT_THAT(drained_log, HasSubstr("preempted: left at shard"));
  EXPECT_EQ(ExamplesTrained(**job), uint64_t{kNumTrain} * kEpochs)
      << (*job)->LogTails(30);
}

// A replicated job (2 servers, replication 2): server 1 drained mid-training
// leaves, its slots are promoted to their backups on server 0, and the job
// finishes with every example trained once. Server 0 then holds the only
// copy of every slot, so draining it too is refused.
TEST_F(PsctlTest, DrainsAReplicatedServerOfARunningJob) {
  ps::testing::JobHarness::Options options;
  options.dir = dir_ + "/job";
  options.num_servers = 2;
  options.num_workers = 2;
  options.config = R"pb(
    name: "drain-server"
    cluster {
      num_servers: 2 num_workers: 2 num_slots: 64 replication: 2
      heartbeat_interval_ms: 100 heartbeat_timeout_ms: 5000
      request_timeout_ms: 2000 failover_timeout_ms: 20000
    }
    consistency { mode: ASYNC }
    tables {
      id: 0 name: "w" sparse { dim: 1 }
      optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
    }
    tables {
      id: 1 name: "d" dense { size: 14 }
      optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
    }
    data { synthetic_ctr { num_train: 150000 num_test: 20000 seed: 1 } }
    training { batch_size: 256 epochs: 2 sparse_table: "w" dense_table: "d" }
  )pb";
  auto job = ps::testing::JobHarness::Start(options);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string flag =
      "--scheduler=127.0.0.1:" +
      std::string(absl::StripAsciiWhitespace(ReadFile(options.dir + "/scheduler.port")));
  auto rank = (*job)->WaitForRegistration(0, absl::Seconds(30));
  ASSERT_TRUE(rank.ok()) << rank.status() << (*job)->LogTails(20);
  auto step = (*job)->WaitForStep(0, 20, absl::Seconds(60));
  ASSERT_TRUE(step.ok()) << step.status() << (*job)->LogTails(20);
  ASSERT_LT(*step, uint64_t{1} << 62) << "worker 0 finished before the drain";

  Result r = Psctl({flag, "--timeout_ms=30000", "drain", "server:1", "--wait"});
  ASSERT_EQ(r.code, 0) << r.err << (*job)->LogTails(20);
  EXPECT_THAT(r.out, HasSubstr("draining server rank 1 (node "));
  EXPECT_THAT(r.out, HasSubstr("32 slots are promoted to their backups"));
  EXPECT_THAT(r.out, HasSubstr(" LEFT\n"));
  r = Psctl({flag, "drain", "server:0"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("holds the only live copy of slot"));

  auto result = (*job)->Wait(absl::Seconds(120));
  ASSERT_TRUE(result.ok()) << result.status() << (*job)->LogTails(30);
  EXPECT_EQ(result->scheduler, 0);
  EXPECT_EQ(result->servers, std::vector<int>({0, 0}));
  EXPECT_EQ(result->workers, std::vector<int>({0, 0}));
  EXPECT_EQ(result->summaries, 1) << (*job)->LogTails(30);
  EXPECT_EQ(ExamplesTrained(**job), uint64_t{150000} * 2) << (*job)->LogTails(30);
}

TEST_F(PsctlTest, NothingListeningFailsAtOnce) {
  const Port port(/*listen=*/false);
  const Result r =
      Psctl({"--scheduler=" + port.address(), "--timeout_ms=500", "status"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));
  EXPECT_EQ(r.out, "");
  EXPECT_LT(r.elapsed, absl::Seconds(5));
}

TEST_F(PsctlTest, ASchedulerThatNeverAnswersFailsAtTheDeadline) {
  // Connections are accepted by the kernel but never served: only the
  // deadline ends the call (gRPC alone would wait about 20 s).
  const Port port(/*listen=*/true);
  Result r = Psctl({"--scheduler=" + port.address(), "--timeout_ms=500", "status"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("DEADLINE_EXCEEDED"));
  EXPECT_GE(r.elapsed, absl::Milliseconds(500));
  EXPECT_LT(r.elapsed, absl::Seconds(5));

  r = Psctl({"--scheduler=" + port.address(), "--timeout_ms=500", "set-mode",
             "BSP"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("DEADLINE_EXCEEDED"));
  EXPECT_LT(r.elapsed, absl::Seconds(5));
}

}  // namespace
}  // namespace ps
