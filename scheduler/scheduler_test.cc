// End-to-end tests of the scheduler service and its client over real gRPC on
// a loopback port.
#include "scheduler/scheduler.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/reasons.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/client.h"
#include "scheduler/cluster_state.h"

namespace ps {
namespace {

using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Heartbeats every 50 ms so servers learn of changes quickly; the timeout is
// long so that no node of these tests dies of a slow, loaded test machine.
// The liveness tests below use their own short timeout.
constexpr char kConfig[] = R"pb(
  cluster {
    num_servers: 2
    num_workers: 2
    num_slots: 8
    heartbeat_interval_ms: 50
    heartbeat_timeout_ms: 10000
  }
)pb";

constexpr absl::Duration kHeartbeat = absl::Milliseconds(50);
// Bound on waits that should end in milliseconds; generous so a loaded
// machine does not fail the test, while a real hang still does.
constexpr absl::Duration kPatience = absl::Seconds(10);

JobConfig ParseConfig(const std::string& text) {
  absl::StatusOr<JobConfig> config = ParseJobConfig(text, "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : JobConfig();
}

// Polls `done` until it holds or `timeout` passes; returns whether it held.
bool Eventually(const std::function<bool()>& done,
                absl::Duration timeout = kPatience) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

const NodeInfo* FindNode(const ClusterView& view, uint64_t node_id) {
  for (const NodeInfo& n : view.nodes()) {
    if (n.node_id() == node_id) return &n;
  }
  return nullptr;
}

NodeState StateOf(SchedulerServer* scheduler, uint64_t node_id) {
  const ClusterView view = scheduler->state()->View();
  const NodeInfo* node = FindNode(view, node_id);
  return node == nullptr ? NODE_STATE_UNSPECIFIED : node->state();
}

std::unique_ptr<SchedulerServer> StartScheduler(
    const JobConfig& config, Clock* clock = Clock::Real(),
    bool run_failure_detector = true) {
  SchedulerServer::Options options;
  options.config = config;
  options.listen_address = "127.0.0.1:0";
  options.clock = clock;
  options.run_failure_detector = run_failure_detector;
  absl::StatusOr<std::unique_ptr<SchedulerServer>> server =
      SchedulerServer::Start(std::move(options));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(server).value() : nullptr;
}

SchedulerClient::Options ClientOptions(const SchedulerServer& scheduler,
                                       const JobConfig& config, Role role,
                                       const std::string& endpoint = "") {
  SchedulerClient::Options options;
  options.address = scheduler.address();
  options.role = role;
  options.data_endpoint = endpoint;
  options.config_fingerprint = ConfigFingerprint(config);
  options.heartbeat_interval = kHeartbeat;
  options.rpc_timeout = absl::Seconds(5);
  options.connect_timeout = absl::Seconds(5);
  return options;
}

std::unique_ptr<SchedulerClient> MustConnect(SchedulerClient::Options options) {
  absl::StatusOr<std::unique_ptr<SchedulerClient>> client =
      SchedulerClient::Connect(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(client).value() : nullptr;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    scheduler_ = StartScheduler(config_);
    ASSERT_NE(scheduler_, nullptr);
  }

  SchedulerClient::Options Options(Role role, const std::string& endpoint = "") {
    return ClientOptions(*scheduler_, config_, role, endpoint);
  }
  std::unique_ptr<SchedulerClient> Server(const std::string& endpoint) {
    return MustConnect(Options(SERVER, endpoint));
  }
  std::unique_ptr<SchedulerClient> Worker() {
    return MustConnect(Options(WORKER));
  }

  const JobConfig config_ = ParseConfig(kConfig);
  std::unique_ptr<SchedulerServer> scheduler_;
};

TEST_F(SchedulerTest, ListensOnAPickedPort) {
  EXPECT_GT(scheduler_->port(), 0);
  EXPECT_EQ(scheduler_->address(), absl::StrCat("127.0.0.1:", scheduler_->port()));
}

TEST_F(SchedulerTest, NodesGetRanksAndTheRunningView) {
  std::unique_ptr<SchedulerClient> s0 = Server("tcp://127.0.0.1:7001");
  std::unique_ptr<SchedulerClient> w0 = Worker();
  std::unique_ptr<SchedulerClient> w1 = Worker();
  ASSERT_TRUE(s0 && w0 && w1);
  EXPECT_EQ(s0->rank(), 0u);
  EXPECT_EQ(w0->rank(), 0u);
  EXPECT_EQ(w1->rank(), 1u);
  EXPECT_EQ(w1->view().epoch(), 4u);  // Registering w1 made the 4th view.

  // One server is missing: the cluster cannot start yet.
  absl::StatusOr<ClusterView> early = w0->WaitForRunning(absl::Milliseconds(100));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded);

  std::unique_ptr<SchedulerClient> s1 = Server("tcp://127.0.0.1:7002");
  ASSERT_TRUE(s1);
  EXPECT_EQ(s1->rank(), 1u);

  absl::StatusOr<ClusterView> view = w0->WaitForRunning(kPatience);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->job_state(), RUNNING);
  EXPECT_EQ(view->epoch(), 5u);
  EXPECT_EQ(view->num_slots(), 8u);
  EXPECT_THAT(view->slot_owner(), ElementsAre(0, 0, 0, 0, 1, 1, 1, 1));
  const NodeInfo* server0 = FindNode(*view, s0->node_id());
  const NodeInfo* server1 = FindNode(*view, s1->node_id());
  ASSERT_NE(server0, nullptr);
  ASSERT_NE(server1, nullptr);
  EXPECT_EQ(server0->data_endpoint(), "tcp://127.0.0.1:7001");
  EXPECT_EQ(server1->data_endpoint(), "tcp://127.0.0.1:7002");
  EXPECT_EQ(server1->rank(), 1u);
  // A worker's view lists the servers and itself only; a server's, all.
  EXPECT_TRUE(view->servers_only());
  EXPECT_EQ(view->nodes_size(), 3);
  EXPECT_NE(FindNode(*view, w0->node_id()), nullptr);
  EXPECT_EQ(FindNode(*view, w1->node_id()), nullptr);
  absl::StatusOr<ClusterView> server_view = s1->WaitForRunning(kPatience);
  ASSERT_TRUE(server_view.ok()) << server_view.status();
  EXPECT_FALSE(server_view->servers_only());
  EXPECT_EQ(server_view->nodes_size(), 4);
  // WaitForRunning keeps what it learnt.
  EXPECT_EQ(w0->view().epoch(), 5u);
  EXPECT_EQ(w0->job_state(), RUNNING);
}

TEST_F(SchedulerTest, ViewCallbacksSeeEveryNewerViewInOrder) {
  struct Seen {
    uint64_t epoch;
    uint32_t rank;
    JobState state;
  };
  absl::Mutex mu;
  std::vector<Seen> s0_seen, w1_seen;
  auto recorder = [&mu](std::vector<Seen>* seen) {
    return [&mu, seen](const ClusterView& view, uint32_t rank) {
      absl::MutexLock lock(&mu);
      seen->push_back({view.epoch(), rank, view.job_state()});
    };
  };

  SchedulerClient::Options s0_options = Options(SERVER, "tcp://127.0.0.1:7001");
  s0_options.on_view = recorder(&s0_seen);
  std::unique_ptr<SchedulerClient> s0 = MustConnect(s0_options);
  ASSERT_TRUE(s0);
  {
    // Connect() delivers the registration's view before returning.
    absl::MutexLock lock(&mu);
    ASSERT_EQ(s0_seen.size(), 1u);
    EXPECT_EQ(s0_seen[0].epoch, 2u);
    EXPECT_EQ(s0_seen[0].state, STARTING);
  }
  std::unique_ptr<SchedulerClient> w0 = Worker();
  SchedulerClient::Options w1_options = Options(WORKER);
  w1_options.on_view = recorder(&w1_seen);
  std::unique_ptr<SchedulerClient> w1 = MustConnect(w1_options);
  std::unique_ptr<SchedulerClient> s1 = Server("tcp://127.0.0.1:7002");
  ASSERT_TRUE(w0 && w1 && s1);
  const uint64_t final_epoch = scheduler_->state()->View().epoch();
  ASSERT_EQ(final_epoch, 5u);

  // Views arrive in the background; wait for the newest.
  ASSERT_TRUE(Eventually([&] {
    absl::MutexLock lock(&mu);
    return !s0_seen.empty() && s0_seen.back().epoch == final_epoch &&
           !w1_seen.empty() && w1_seen.back().epoch == final_epoch;
  }));
  // Stopping the clients lets their pending long polls end with the
  // unchanged view, which must not be delivered again; it also ends the
  // callbacks before the vectors they write to go away.
  s0.reset();
  w1.reset();
  absl::MutexLock lock(&mu);
  for (size_t i = 1; i < s0_seen.size(); ++i) {
    EXPECT_GT(s0_seen[i].epoch, s0_seen[i - 1].epoch) << "callback " << i;
  }
  for (size_t i = 1; i < w1_seen.size(); ++i) {
    EXPECT_GT(w1_seen[i].epoch, w1_seen[i - 1].epoch) << "callback " << i;
  }
  for (const Seen& s : s0_seen) EXPECT_EQ(s.rank, 0u);
  for (const Seen& s : w1_seen) EXPECT_EQ(s.rank, 1u);
  EXPECT_EQ(w1_seen.front().epoch, 4u);
  EXPECT_EQ(s0_seen.back().state, RUNNING);
  EXPECT_EQ(w1_seen.back().state, RUNNING);
}

TEST_F(SchedulerTest, BarrierAcrossTwoWorkers) {
  std::unique_ptr<SchedulerClient> w0 = Worker();
  std::unique_ptr<SchedulerClient> w1 = Worker();
  ASSERT_TRUE(w0 && w1);

  absl::Status alone = w0->Barrier("alone", absl::Milliseconds(100));
  EXPECT_EQ(alone.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(alone.message()), HasSubstr("worker ranks 1"));

  auto first = std::async(std::launch::async,
                          [&] { return w0->Barrier("together", kPatience); });
  auto second = std::async(std::launch::async,
                           [&] { return w1->Barrier("together", kPatience); });
  const auto patience = std::chrono::seconds(15);
  ASSERT_EQ(first.wait_for(patience), std::future_status::ready);
  ASSERT_EQ(second.wait_for(patience), std::future_status::ready);
  EXPECT_TRUE(first.get().ok());
  EXPECT_TRUE(second.get().ok());

  // Asked again after the release: the same ranks, through the client (which
  // asks for runs) and raw, as runs or as the list.
  std::vector<uint32_t> ranks;
  ASSERT_TRUE(w1->Barrier("together", kPatience, &ranks).ok());
  EXPECT_THAT(ranks, ElementsAre(0, 1));
  std::unique_ptr<Scheduler::Stub> stub =
      Scheduler::NewStub(grpc::CreateChannel(
          scheduler_->address(), grpc::InsecureChannelCredentials()));
  BarrierRequest request;
  request.set_node_id(w0->node_id());
  request.set_name("together");
  request.set_timeout_ms(10000);
  for (bool runs : {true, false}) {
    request.set_rank_runs(runs);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    BarrierResponse response;
    ASSERT_TRUE(stub->Barrier(&context, request, &response).ok());
    if (runs) {
      EXPECT_THAT(response.rank_runs(), ElementsAre(0, 2));
      EXPECT_THAT(response.ranks(), IsEmpty());
    } else {
      EXPECT_THAT(response.ranks(), ElementsAre(0, 1));
      EXPECT_THAT(response.rank_runs(), IsEmpty());
    }
  }
}

TEST_F(SchedulerTest, ConnectWithAnotherConfigIsRefusedAtOnce) {
  JobConfig other = config_;
  other.set_name("another job");
  SchedulerClient::Options options =
      ClientOptions(*scheduler_, other, WORKER);
  options.connect_timeout = absl::Seconds(30);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<SchedulerClient>> client =
      SchedulerClient::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
  // Not retried like an unreachable scheduler would be.
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_THAT(scheduler_->state()->View().nodes(), IsEmpty());
}

TEST_F(SchedulerTest, JobFinishesWhenWorkersLeaveAndEndsWhenServersLeave) {
  std::unique_ptr<SchedulerClient> s0 = Server("tcp://127.0.0.1:7001");
  std::unique_ptr<SchedulerClient> s1 = Server("tcp://127.0.0.1:7002");
  std::unique_ptr<SchedulerClient> w0 = Worker();
  std::unique_ptr<SchedulerClient> w1 = Worker();
  ASSERT_TRUE(s0 && s1 && w0 && w1);
  ASSERT_TRUE(w0->WaitForRunning(kPatience).ok());

  ASSERT_TRUE(w0->Leave(/*finished=*/true).ok());
  EXPECT_EQ(scheduler_->state()->job_state(), RUNNING);
  ASSERT_TRUE(w1->Leave(/*finished=*/true).ok());
  EXPECT_EQ(scheduler_->state()->job_state(), FINISHED);

  // Servers learn it in the background and would then shut down.
  EXPECT_TRUE(Eventually([&] {
    return s0->job_state() == FINISHED && s1->job_state() == FINISHED;
  }));
  EXPECT_FALSE(scheduler_->WaitUntilDone(absl::Milliseconds(50)));

  ASSERT_TRUE(s0->Leave(false).ok());
  ASSERT_TRUE(s1->Leave(false).ok());
  EXPECT_TRUE(scheduler_->WaitUntilDone(kPatience));
}

// A worker joining after every worker finished (a dropped one joining again)
// learns so by the status's reason, carried over gRPC; its words alone
// would not do.
TEST_F(SchedulerTest, JoiningAFinishedJobIsRefusedWithTheJobFinishedReason) {
  std::unique_ptr<SchedulerClient> s0 = Server("tcp://127.0.0.1:7001");
  std::unique_ptr<SchedulerClient> s1 = Server("tcp://127.0.0.1:7002");
  std::unique_ptr<SchedulerClient> w0 = Worker();
  std::unique_ptr<SchedulerClient> w1 = Worker();
  ASSERT_TRUE(s0 && s1 && w0 && w1);
  ASSERT_TRUE(w0->Leave(/*finished=*/true).ok());
  ASSERT_TRUE(w1->Leave(/*finished=*/true).ok());
  ASSERT_EQ(scheduler_->state()->job_state(), FINISHED);

  const absl::StatusOr<std::unique_ptr<SchedulerClient>> late =
      SchedulerClient::Connect(Options(WORKER));
  ASSERT_FALSE(late.ok());
  EXPECT_TRUE(IsJobFinished(late.status())) << late.status();
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("has finished"));
  EXPECT_FALSE(IsJobFinished(
      absl::FailedPreconditionError("the job has finished, in words only")));
}

TEST_F(SchedulerTest, RawRequestsWithBadInputAreRejected) {
  std::unique_ptr<Scheduler::Stub> stub = Scheduler::NewStub(grpc::CreateChannel(
      scheduler_->address(), grpc::InsecureChannelCredentials()));
  auto context = [] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return c;
  };
  const uint64_t fingerprint = ConfigFingerprint(config_);

  RegisterRequest reg;
  reg.set_role(ROLE_UNSPECIFIED);
  reg.set_config_fingerprint(fingerprint);
  RegisterResponse reg_response;
  EXPECT_EQ(stub->Register(context().get(), reg, &reg_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  reg.set_role(SERVER);  // Without its data endpoint.
  EXPECT_EQ(stub->Register(context().get(), reg, &reg_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  reg.set_role(WORKER);
  reg.set_config_fingerprint(fingerprint ^ 1);
  EXPECT_EQ(stub->Register(context().get(), reg, &reg_response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  HeartbeatRequest heartbeat;
  heartbeat.set_node_id(12345);
  HeartbeatResponse heartbeat_response;
  EXPECT_EQ(
      stub->Heartbeat(context().get(), heartbeat, &heartbeat_response).error_code(),
      grpc::StatusCode::NOT_FOUND);

  LeaveRequest leave;
  leave.set_node_id(12345);
  LeaveResponse leave_response;
  EXPECT_EQ(stub->Leave(context().get(), leave, &leave_response).error_code(),
            grpc::StatusCode::NOT_FOUND);

  BarrierRequest barrier;
  barrier.set_node_id(12345);
  barrier.set_timeout_ms(10);
  BarrierResponse barrier_response;
  EXPECT_EQ(stub->Barrier(context().get(), barrier, &barrier_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);  // Empty name.
  barrier.set_name("b");
  EXPECT_EQ(stub->Barrier(context().get(), barrier, &barrier_response).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // None of that changed the cluster.
  GetClusterViewRequest get;
  ClusterView view;
  ASSERT_TRUE(stub->GetClusterView(context().get(), get, &view).ok());
  EXPECT_EQ(view.epoch(), 1u);
  EXPECT_EQ(view.job_state(), STARTING);
  EXPECT_THAT(view.nodes(), IsEmpty());

  // The same stub with a good request works.
  reg.set_config_fingerprint(fingerprint);
  ASSERT_TRUE(stub->Register(context().get(), reg, &reg_response).ok());
  EXPECT_EQ(reg_response.rank(), 0u);
  EXPECT_EQ(reg_response.view().epoch(), 2u);
}

// gRPC's Shutdown waits for handlers that are still running; a barrier or
// long poll must not hold the scheduler's exit for its whole timeout.
TEST_F(SchedulerTest, ShutdownDoesNotWaitForPendingBarriers) {
  std::unique_ptr<SchedulerClient> w0 = Worker();
  std::unique_ptr<SchedulerClient> w1 = Worker();
  ASSERT_TRUE(w0 && w1);
  // The waiter keeps trying while the scheduler is away (it may be
  // restarting) until its own timeout, then says it was unreachable.
  auto barrier = std::async(std::launch::async,
                            [&] { return w0->Barrier("b", absl::Seconds(2)); });
  ASSERT_EQ(barrier.wait_for(std::chrono::milliseconds(100)),
            std::future_status::timeout);

  const absl::Time start = absl::Now();
  scheduler_.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ASSERT_EQ(barrier.wait_for(std::chrono::seconds(15)), std::future_status::ready);
  EXPECT_EQ(barrier.get().code(), absl::StatusCode::kUnavailable);
}

TEST(SchedulerServerTest, ConnectToAnAddressWhereNothingListensGivesUp) {
  const JobConfig config = ParseConfig(kConfig);
  // A port that was free a moment ago: bind one, then close it.
  std::string address;
  {
    std::unique_ptr<SchedulerServer> gone = StartScheduler(config);
    ASSERT_NE(gone, nullptr);
    address = gone->address();
  }
  SchedulerClient::Options options;
  options.address = address;
  options.role = WORKER;
  options.config_fingerprint = ConfigFingerprint(config);
  options.connect_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<SchedulerClient>> client =
      SchedulerClient::Connect(options);
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(client.status().code(),
              AnyOf(absl::StatusCode::kUnavailable,
                    absl::StatusCode::kDeadlineExceeded))
      << client.status();
  // It keeps trying for the whole connect timeout (processes of a job start
  // in any order), and not much longer.
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(3));
}

TEST(SchedulerServerTest, ConnectWaitsForASchedulerThatStartsLater) {
  const JobConfig config = ParseConfig(kConfig);
  std::string address;
  {
    std::unique_ptr<SchedulerServer> earlier = StartScheduler(config);
    ASSERT_NE(earlier, nullptr);
    address = earlier->address();
  }
  SchedulerClient::Options options;
  options.address = address;
  options.role = WORKER;
  options.config_fingerprint = ConfigFingerprint(config);
  options.heartbeat_interval = kHeartbeat;
  options.connect_timeout = kPatience;
  auto client = std::async(std::launch::async,
                           [&] { return SchedulerClient::Connect(options); });
  ASSERT_EQ(client.wait_for(std::chrono::milliseconds(200)),
            std::future_status::timeout);

  SchedulerServer::Options server_options;
  server_options.config = config;
  server_options.listen_address = address;
  absl::StatusOr<std::unique_ptr<SchedulerServer>> scheduler =
      SchedulerServer::Start(server_options);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  ASSERT_EQ(client.wait_for(std::chrono::seconds(15)), std::future_status::ready);
  absl::StatusOr<std::unique_ptr<SchedulerClient>> connected = client.get();
  ASSERT_TRUE(connected.ok()) << connected.status();
  EXPECT_EQ((*connected)->rank(), 0u);
  EXPECT_EQ((*scheduler)->state()->View().nodes_size(), 1);
}

TEST(SchedulerLivenessTest, ClientDestroyedWithoutLeaveIsDeclaredDead) {
  const JobConfig config = ParseConfig(R"pb(
    cluster {
      num_servers: 1
      num_workers: 2
      heartbeat_interval_ms: 50
      heartbeat_timeout_ms: 500
    }
  )pb");
  std::unique_ptr<SchedulerServer> scheduler = StartScheduler(config);
  ASSERT_NE(scheduler, nullptr);
  std::unique_ptr<SchedulerClient> crashing =
      MustConnect(ClientOptions(*scheduler, config, WORKER));
  std::unique_ptr<SchedulerClient> healthy =
      MustConnect(ClientOptions(*scheduler, config, WORKER));
  ASSERT_TRUE(crashing && healthy);
  const uint64_t id = crashing->node_id();

  // Heartbeats stop as soon as destruction begins (which then waits for the
  // client's long poll to end), without Leave, like a crash.
  const absl::Time gone = absl::Now();
  crashing.reset();
  ASSERT_TRUE(Eventually([&] { return StateOf(scheduler.get(), id) == DEAD; }));
  // Not before its heartbeats could have lapsed (the last one was at most
  // one interval before the reset).
  EXPECT_GE(absl::Now() - gone, absl::Milliseconds(400));
  // Heartbeats keep the other node alive all that time.
  EXPECT_EQ(StateOf(scheduler.get(), healthy->node_id()), ALIVE);
  EXPECT_FALSE(healthy->lost());
}

TEST(SchedulerLivenessTest, ClientNoticesItWasDeclaredDead) {
  // A fake clock and no background detector: the test decides when the
  // scheduler's deadline passes.
  const JobConfig config = ParseConfig(kConfig);
  FakeClock clock;
  std::unique_ptr<SchedulerServer> scheduler =
      StartScheduler(config, &clock, /*run_failure_detector=*/false);
  ASSERT_NE(scheduler, nullptr);
  std::unique_ptr<SchedulerClient> worker =
      MustConnect(ClientOptions(*scheduler, config, WORKER));
  ASSERT_NE(worker, nullptr);
  // Real heartbeats flow, but the fake clock stands still.
  absl::SleepFor(4 * kHeartbeat);
  EXPECT_FALSE(worker->lost());

  // A heartbeat landing between Advance and the expiry check refreshes the
  // node at the new fake time; advancing again covers that (rare) case.
  ASSERT_TRUE(Eventually([&] {
    clock.Advance(absl::Milliseconds(10001));
    scheduler->state()->ExpireSilentNodes();
    return StateOf(scheduler.get(), worker->node_id()) == DEAD;
  }));
  EXPECT_TRUE(Eventually([&] { return worker->lost(); }));
}

}  // namespace
}  // namespace ps
