// The membership client while the scheduler is away: heartbeats and calls
// resume when a scheduler listens again on the same address, the node gives
// up after the unreachable timeout, a dropped node's waits end at once, and
// leases follow acknowledged heartbeats only.
//
// A scripted scheduler service stands in for the real one, so each test
// decides exactly what the scheduler answers and when it is away ("restart"
// = a new service on the same port, knowing the same node id, as a
// scheduler restarted from its journal does).
#include "common/grpc_status.h"
#include "common/status.h"
#include "scheduler/client.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "proto/scheduler.grpc.pb.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kHeartbeat = absl::Milliseconds(50);
// Bound on waits that should end far sooner; generous for a loaded machine.
constexpr absl::Duration kPatience = absl::Seconds(20);
constexpr uint64_t kNodeId = 7;

bool Eventually(const std::function<bool()>& done, absl::Duration timeout = kPatience) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// A scheduler that knows one node (kNodeId) and answers as each test says.
class ScriptedScheduler final : public Scheduler::Service {
 public:
  // Answer heartbeats NOT_FOUND (the node was declared dead).
  std::atomic<bool> drop{false};
  // Hold each heartbeat this long before answering (a partition that
  // swallows packets looks the same to the client: no answer).
  std::atomic<int64_t> heartbeat_stall_ms{0};
  // Leave: process the first one but answer it only after this long.
  std::atomic<int64_t> leave_stall_ms{0};
  std::atomic<int> heartbeats{0};
  std::atomic<int> claims{0};
  std::atomic<int> leaves{0};
  std::atomic<int> barriers{0};
  // Barriers complete once this is set; until then they wait (up to the
  // request's timeout, then DEADLINE_EXCEEDED as the real one answers).
  std::atomic<bool> release_barriers{false};
  // What a released barrier answers a caller that asks for rank runs (one
  // that does not gets rank 0 as a list).
  void SetBarrierRuns(std::vector<uint32_t> runs) {
    absl::MutexLock lock(&mu_);
    barrier_runs_ = std::move(runs);
  }

  grpc::Status Register(grpc::ServerContext*, const RegisterRequest*,
                        RegisterResponse* response) override {
    response->set_node_id(kNodeId);
    response->set_rank(0);
    *response->mutable_view() = View();
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* context, const HeartbeatRequest* request,
                         HeartbeatResponse* response) override {
    ++heartbeats;
    if (const int64_t stall = heartbeat_stall_ms.load(); stall > 0) {
      Wait(context, absl::Milliseconds(stall), [] { return false; });
    }
    if (drop.load() || request->node_id() != kNodeId) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("node ", request->node_id(), " is not a member"));
    }
    response->set_epoch(1);
    response->set_job_state(RUNNING);
    return grpc::Status::OK;
  }

  grpc::Status GetClusterView(grpc::ServerContext* context,
                              const GetClusterViewRequest* request,
                              ClusterView* response) override {
    // Nothing ever changes: hold the long poll for its whole timeout.
    if (request->min_epoch() > 1) {
      Wait(context, absl::Milliseconds(request->timeout_ms()), [] { return false; });
    }
    *response = View();
    return grpc::Status::OK;
  }

  grpc::Status Barrier(grpc::ServerContext* context, const BarrierRequest* request,
                       BarrierResponse* response) override {
    ++barriers;
    if (!Wait(context, absl::Milliseconds(request->timeout_ms()),
              [this] { return release_barriers.load(); })) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "barrier still waits for worker ranks 1");
    }
    if (request->rank_runs()) {
      absl::MutexLock lock(&mu_);
      response->mutable_rank_runs()->Add(barrier_runs_.begin(),
                                         barrier_runs_.end());
    } else {
      response->add_ranks(0);
    }
    return grpc::Status::OK;
  }

  grpc::Status ClaimShard(grpc::ServerContext*, const ClaimShardRequest*,
                          ClaimShardResponse* response) override {
    ++claims;
    response->set_result(ClaimShardResponse::WAIT);
    return grpc::Status::OK;
  }

  grpc::Status Leave(grpc::ServerContext* context, const LeaveRequest*,
                     LeaveResponse*) override {
    if (leaves++ > 0) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown node");
    }
    if (const int64_t stall = leave_stall_ms.load(); stall > 0) {
      Wait(context, absl::Milliseconds(stall), [] { return false; });
    }
    return grpc::Status::OK;
  }

 private:
  absl::Mutex mu_;
  std::vector<uint32_t> barrier_runs_ ABSL_GUARDED_BY(mu_) = {0, 1};

  static ClusterView View() {
    ClusterView view;
    view.set_epoch(1);
    view.set_job_state(RUNNING);
    return view;
  }
  // Waits up to `timeout` for `done`; false when it did not happen (or
  // the call was cancelled).
  static bool Wait(grpc::ServerContext* context, absl::Duration timeout,
                   const std::function<bool()>& done) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!done()) {
      if (absl::Now() >= deadline || context->IsCancelled()) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }
};

// The service listening on `address` ("127.0.0.1:0" picks a port).
class Listening {
 public:
  explicit Listening(const std::string& address) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~Listening() { Stop(); }
  void Stop() {
    if (server_ == nullptr) return;
    // Cancels the calls in flight (the scripted waits notice).
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    server_->Wait();
    server_.reset();
  }
  bool ok() const { return server_ != nullptr && port_ != 0; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  ScriptedScheduler& service() { return service_; }

 private:
  ScriptedScheduler service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// What the client's callbacks saw.
struct Seen {
  absl::Mutex mu;
  int leases ABSL_GUARDED_BY(mu) = 0;
  std::chrono::steady_clock::time_point last_lease ABSL_GUARDED_BY(mu);
  absl::Notification lost;
  absl::Notification gone;
  absl::Status gone_status ABSL_GUARDED_BY(mu);

  int lease_count() {
    absl::MutexLock lock(&mu);
    return leases;
  }
};

SchedulerClient::Options ClientOptions(const std::string& address, Seen* seen) {
  SchedulerClient::Options options;
  options.address = address;
  options.role = SERVER;
  options.data_endpoint = "tcp://127.0.0.1:1";
  options.heartbeat_interval = kHeartbeat;
  options.heartbeat_timeout = absl::Seconds(2);
  options.unreachable_timeout = absl::Seconds(60);
  options.connect_timeout = absl::Seconds(10);
  options.on_lease = [seen](std::chrono::steady_clock::time_point until) {
    absl::MutexLock lock(&seen->mu);
    ++seen->leases;
    seen->last_lease = until;
  };
  options.on_lost = [seen] { seen->lost.Notify(); };
  options.on_scheduler_gone = [seen](const absl::Status& s) {
    {
      absl::MutexLock lock(&seen->mu);
      seen->gone_status = s;
    }
    seen->gone.Notify();
  };
  return options;
}

std::unique_ptr<SchedulerClient> MustConnect(SchedulerClient::Options options) {
  absl::StatusOr<std::unique_ptr<SchedulerClient>> client =
      SchedulerClient::Connect(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(client).value() : nullptr;
}

TEST(SchedulerClientTest, ForJobTakesTheTimeoutsFromTheConfig) {
  JobConfig config;
  config.mutable_cluster()->set_heartbeat_interval_ms(100);
  config.mutable_cluster()->set_heartbeat_timeout_ms(700);
  config.mutable_cluster()->set_scheduler_unreachable_timeout_ms(9000);
  const SchedulerClient::Options o =
      SchedulerClient::Options::ForJob(config, "host:1", WORKER);
  EXPECT_EQ(o.heartbeat_interval, absl::Milliseconds(100));
  EXPECT_EQ(o.heartbeat_timeout, absl::Milliseconds(700));
  EXPECT_EQ(o.unreachable_timeout, absl::Seconds(9));
}

TEST(SchedulerClientTest, LeasesFollowAcknowledgedHeartbeatsAndEndBeforeTheTimeout) {
  Listening scheduler("127.0.0.1:0");
  ASSERT_TRUE(scheduler.ok());
  Seen seen;
  const auto before = std::chrono::steady_clock::now();
  std::unique_ptr<SchedulerClient> client = MustConnect(ClientOptions(scheduler.address(), &seen));
  ASSERT_NE(client, nullptr);
  // The registration grants the first one.
  EXPECT_GE(seen.lease_count(), 1);
  ASSERT_TRUE(Eventually([&] { return seen.lease_count() >= 4; }));
  const auto after = std::chrono::steady_clock::now();
  absl::MutexLock lock(&seen.mu);
  // Send time + 3/4 of the 2 s heartbeat timeout: after the first send,
  // never past now + 1.5 s.
  EXPECT_GT(seen.last_lease, before + std::chrono::milliseconds(1500));
  EXPECT_LE(seen.last_lease, after + std::chrono::milliseconds(1500));
}

TEST(SchedulerClientTest, HeartbeatsResumeWhenTheSchedulerComesBackOnTheSamePort) {
  auto first = std::make_unique<Listening>("127.0.0.1:0");
  ASSERT_TRUE(first->ok());
  const std::string address = first->address();
  Seen seen;
  std::unique_ptr<SchedulerClient> client = MustConnect(ClientOptions(address, &seen));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(Eventually([&] { return seen.lease_count() >= 3; }));

  first->Stop();
  const int leases_before = seen.lease_count();
  // Calls made while it is away keep trying (a claim with a long timeout,
  // a barrier).
  auto claim = std::async(std::launch::async, [&] {
    return client->ClaimShard(nullptr, absl::Seconds(30));
  });
  auto barrier = std::async(std::launch::async,
                            [&] { return client->Barrier("b", absl::Seconds(30)); });
  absl::SleepFor(absl::Seconds(1));
  // No lease without an acknowledged heartbeat (one in flight at the stop
  // may still have been answered).
  EXPECT_LE(seen.lease_count(), leases_before + 1);
  EXPECT_EQ(claim.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  EXPECT_EQ(barrier.wait_for(std::chrono::seconds(0)), std::future_status::timeout);

  Listening second(address);
  ASSERT_TRUE(second.ok()) << "port " << address << " taken meanwhile";
  second.service().release_barriers = true;
  ASSERT_TRUE(Eventually([&] { return second.service().heartbeats.load() >= 3; }));
  ASSERT_TRUE(Eventually([&] { return seen.lease_count() >= leases_before + 3; }));
  ASSERT_EQ(claim.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  absl::StatusOr<ClaimShardResponse> claimed = claim.get();
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  EXPECT_EQ(claimed->result(), ClaimShardResponse::WAIT);
  ASSERT_EQ(barrier.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_TRUE(barrier.get().ok());
  EXPECT_TRUE(client->scheduler_gone().ok());
  EXPECT_FALSE(client->lost());
  EXPECT_FALSE(seen.gone.HasBeenNotified());
}

TEST(SchedulerClientTest, GivesUpOnceUnreachableForTheTimeout) {
  auto scheduler = std::make_unique<Listening>("127.0.0.1:0");
  ASSERT_TRUE(scheduler->ok());
  const std::string address = scheduler->address();
  Seen seen;
  SchedulerClient::Options options = ClientOptions(address, &seen);
  options.heartbeat_timeout = absl::Milliseconds(500);
  options.unreachable_timeout = absl::Milliseconds(1500);
  std::unique_ptr<SchedulerClient> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(Eventually([&] { return seen.lease_count() >= 2; }));

  const absl::Time stopped = absl::Now();
  scheduler->Stop();
  // A claim waiting with a timeout longer than the bound ends with it.
  auto claim = std::async(std::launch::async, [&] {
    return client->ClaimShard(nullptr, absl::Seconds(60));
  });
  ASSERT_TRUE(seen.gone.WaitForNotificationWithTimeout(kPatience));
  // Not before the bound: the last acknowledgement came at most a
  // heartbeat before the stop.
  EXPECT_GE(absl::Now() - stopped, absl::Milliseconds(1400));
  const absl::Status gone = client->scheduler_gone();
  EXPECT_EQ(gone.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsSchedulerGone(gone)) << gone;
  EXPECT_THAT(gone.message(), HasSubstr(absl::StrCat("scheduler at ", address,
                                                     " unreachable for ")));
  EXPECT_THAT(gone.message(),
              HasSubstr("(cluster.scheduler_unreachable_timeout_ms 1500)"));
  {
    absl::MutexLock lock(&seen.mu);
    EXPECT_EQ(seen.gone_status, gone);
  }
  ASSERT_EQ(claim.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  absl::StatusOr<ClaimShardResponse> claimed = claim.get();
  EXPECT_TRUE(IsSchedulerGone(claimed.status())) << claimed.status();
  // Later calls end at once with it, and so does leaving.
  const absl::Time asked = absl::Now();
  EXPECT_TRUE(IsSchedulerGone(client->Barrier("b", absl::Seconds(30))));
  EXPECT_TRUE(IsSchedulerGone(client->Leave(false)));
  EXPECT_LT(absl::Now() - asked, absl::Seconds(5));
  EXPECT_FALSE(client->lost());
}

TEST(SchedulerClientTest, ADroppedNodeEndsItsWaitsAtOnce) {
  Listening scheduler("127.0.0.1:0");
  ASSERT_TRUE(scheduler.ok());
  Seen seen;
  std::unique_ptr<SchedulerClient> client = MustConnect(ClientOptions(scheduler.address(), &seen));
  ASSERT_NE(client, nullptr);
  // A barrier nobody else arrives at, with a long timeout.
  auto barrier = std::async(std::launch::async,
                            [&] { return client->Barrier("b", absl::Seconds(60)); });
  ASSERT_TRUE(Eventually([&] { return scheduler.service().barriers.load() >= 1; }));
  const int leases = seen.lease_count();

  scheduler.service().drop = true;
  ASSERT_TRUE(seen.lost.WaitForNotificationWithTimeout(kPatience));
  const absl::Time dropped = absl::Now();
  EXPECT_TRUE(client->lost());
  ASSERT_EQ(barrier.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_LT(absl::Now() - dropped, absl::Seconds(5));
  const absl::Status ended = barrier.get();
  EXPECT_EQ(ended.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(IsDropped(ended)) << ended;
  EXPECT_THAT(ended.message(), HasSubstr("dropped by the scheduler: node 7 is not a member"));
  EXPECT_TRUE(IsDropped(client->lost_status()));
  // No more leases, calls end at once, leaving is a no-op.
  absl::SleepFor(5 * kHeartbeat);
  EXPECT_LE(seen.lease_count(), leases + 1);
  EXPECT_TRUE(IsDropped(client->ClaimShard(nullptr, absl::Seconds(30)).status()));
  EXPECT_TRUE(client->Leave(false).ok());
  EXPECT_EQ(scheduler.service().leaves.load(), 0);
  EXPECT_TRUE(client->scheduler_gone().ok());
}

// A barrier's ranks arrive as runs and reach the caller as a list; runs
// that do not describe a set of ranks are refused, not expanded.
TEST(SchedulerClientTest, BarrierRanksArriveAsRunsAndMalformedRunsAreRefused) {
  Listening scheduler("127.0.0.1:0");
  ASSERT_TRUE(scheduler.ok());
  Seen seen;
  std::unique_ptr<SchedulerClient> client =
      MustConnect(ClientOptions(scheduler.address(), &seen));
  ASSERT_NE(client, nullptr);
  scheduler.service().release_barriers = true;
  scheduler.service().SetBarrierRuns({0, 3, 7, 2, 1000, 1});
  std::vector<uint32_t> ranks;
  ASSERT_TRUE(client->Barrier("b", absl::Seconds(30), &ranks).ok());
  EXPECT_THAT(ranks, ElementsAre(0, 1, 2, 7, 8, 1000));

  for (const std::vector<uint32_t>& bad :
       {std::vector<uint32_t>{0, 3, 5}, std::vector<uint32_t>{5, 1, 2, 1},
        std::vector<uint32_t>{0, 4000000000u}}) {
    scheduler.service().SetBarrierRuns(bad);
    ranks = {42};
    const absl::Status s = client->Barrier("b", absl::Seconds(30), &ranks);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), HasSubstr("rank runs"));
  }
}

TEST(SchedulerClientTest, AHeartbeatWithoutAnswerTimesOutWithinTheHeartbeatTimeout) {
  Listening scheduler("127.0.0.1:0");
  ASSERT_TRUE(scheduler.ok());
  Seen seen;
  SchedulerClient::Options options = ClientOptions(scheduler.address(), &seen);
  options.heartbeat_timeout = absl::Milliseconds(300);
  options.rpc_timeout = absl::Seconds(30);
  std::unique_ptr<SchedulerClient> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(Eventually([&] { return seen.lease_count() >= 2; }));

  // Heartbeats now go unanswered for 20 s each. With the RPC deadline at
  // the 30 s rpc_timeout the loop would send one and wait; bounded by the
  // heartbeat timeout it keeps sending.
  scheduler.service().heartbeat_stall_ms = 20000;
  const int sent = scheduler.service().heartbeats.load();
  EXPECT_TRUE(Eventually([&] { return scheduler.service().heartbeats.load() >= sent + 4; },
                         absl::Seconds(15)));
  const int leases = seen.lease_count();
  absl::SleepFor(absl::Seconds(1));
  EXPECT_EQ(seen.lease_count(), leases);
  scheduler.service().heartbeat_stall_ms = 0;
  EXPECT_TRUE(Eventually([&] { return seen.lease_count() > leases; }));
}

TEST(SchedulerClientTest, ALeaveRetriedAfterItArrivedIsDone) {
  Listening scheduler("127.0.0.1:0");
  ASSERT_TRUE(scheduler.ok());
  Seen seen;
  SchedulerClient::Options options = ClientOptions(scheduler.address(), &seen);
  options.rpc_timeout = absl::Milliseconds(300);
  std::unique_ptr<SchedulerClient> client = MustConnect(options);
  ASSERT_NE(client, nullptr);
  // The first Leave is processed but its answer comes too late; the retry
  // is answered NOT_FOUND (the node is gone already).
  scheduler.service().leave_stall_ms = 2000;
  const absl::Status left = client->Leave(true);
  EXPECT_TRUE(left.ok()) << left;
  EXPECT_EQ(scheduler.service().leaves.load(), 2);
}

TEST(SchedulerClientTest, DroppedAndGoneAreToldByTheirReasonNotTheirText) {
  EXPECT_FALSE(IsDropped(absl::AbortedError("dropped by the scheduler: in words only")));
  EXPECT_FALSE(IsSchedulerGone(
      absl::UnavailableError("cluster.scheduler_unreachable_timeout_ms, in words only")));
  const absl::Status dropped = Annotate(DroppedError("node 7"), "barrier b");
  EXPECT_TRUE(IsDropped(dropped)) << dropped;
  EXPECT_FALSE(IsSchedulerGone(dropped));
  EXPECT_THAT(std::string(dropped.message()),
              ::testing::HasSubstr("barrier b: dropped by the scheduler: node 7"));
  // The reason survives a gRPC round trip (the client's RPC paths).
  const absl::Status back = FromGrpcStatus(ToGrpcStatus(dropped));
  EXPECT_TRUE(IsDropped(back)) << back;
  EXPECT_EQ(back.message(), dropped.message());
  EXPECT_EQ(ReasonOf(absl::OkStatus()), "");
}

}  // namespace
}  // namespace ps
