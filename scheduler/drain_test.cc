// Drain (psctl drain): which nodes the scheduler agrees to drain, how the
// node learns it (heartbeat answers, the view), and the RPC over real gRPC
// with a real SchedulerClient calling its on_drain.
#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/reasons.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/client.h"
#include "scheduler/cluster_state.h"
#include "scheduler/scheduler.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

// `extra` goes inside the cluster block; `rest` after it.
JobConfig Config(uint32_t servers, uint32_t workers, const std::string& extra = "",
                 const std::string& rest = "") {
  auto config = ParseJobConfig(
      absl::StrCat("cluster { num_slots: 8 heartbeat_interval_ms: 50 "
                   "heartbeat_timeout_ms: 100000 num_servers: ",
                   servers, " num_workers: ", workers, " ", extra, " } ", rest),
      "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : JobConfig();
}

DrainRequest ById(uint64_t id) {
  DrainRequest r;
  r.set_node_id(id);
  return r;
}
DrainRequest ByRank(Role role, uint32_t rank) {
  DrainRequest r;
  r.mutable_rank()->set_role(role);
  r.mutable_rank()->set_rank(rank);
  return r;
}

class DrainTest : public ::testing::Test {
 protected:
  void Init(const JobConfig& config) {
    config_ = config;
    state_ = std::make_unique<ClusterState>(config_, &clock_);
  }
  uint64_t Add(Role role) {
    RegisterRequest r;
    r.set_role(role);
    if (role == SERVER) r.set_data_endpoint(absl::StrCat("tcp://s:", ++endpoints_));
    r.set_config_fingerprint(ConfigFingerprint(config_));
    r.set_trains_shards(role == WORKER);
    auto response = state_->Register(r);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->node_id() : 0;
  }
  bool DrainAnswered(uint64_t id) {
    HeartbeatRequest h;
    h.set_node_id(id);
    auto r = state_->Heartbeat(h);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() && r->drain();
  }
  // The error message of a refused drain, checking its code.
  std::string Refused(const DrainRequest& request, absl::StatusCode code) {
    auto r = state_->Drain(request);
    EXPECT_FALSE(r.ok());
    if (r.ok()) return "";
    EXPECT_EQ(r.status().code(), code) << r.status();
    return std::string(r.status().message());
  }

  JobConfig config_;
  FakeClock clock_;
  std::unique_ptr<ClusterState> state_;
  int endpoints_ = 0;
};

TEST_F(DrainTest, AWorkerIsToldToLeaveAtItsNextHeartbeat) {
  Init(Config(1, 2));
  Add(SERVER);
  const uint64_t w0 = Add(WORKER), w1 = Add(WORKER);
  EXPECT_FALSE(DrainAnswered(w0));
  const uint64_t epoch = state_->View().epoch();

  auto r = state_->Drain(ByRank(WORKER, 0));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->node().node_id(), w0);
  EXPECT_TRUE(r->node().draining());
  EXPECT_EQ(r->node().state(), ALIVE);
  EXPECT_THAT(r->note(), HasSubstr("another worker resumes the rest of its shard"));
  EXPECT_GT(state_->View().epoch(), epoch);  // the view shows it at once
  const ClusterView view = state_->View();
  for (const NodeInfo& n : view.nodes()) {
    EXPECT_EQ(n.draining(), n.node_id() == w0) << n.node_id();
  }
  EXPECT_TRUE(DrainAnswered(w0));
  EXPECT_TRUE(DrainAnswered(w0));  // every answer from then on
  EXPECT_FALSE(DrainAnswered(w1));

  // Again: the same answer, no second change.
  const uint64_t after = state_->View().epoch();
  auto again = state_->Drain(ById(w0));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->note(), "already draining");
  EXPECT_EQ(state_->View().epoch(), after);

  // w1 is now the only live worker not draining: refused.
  EXPECT_THAT(Refused(ById(w1), absl::StatusCode::kFailedPrecondition),
              HasSubstr("the only live worker not draining"));

  // Once w0 has left, draining it is NOT_FOUND.
  LeaveRequest leave;
  leave.set_node_id(w0);
  ASSERT_TRUE(state_->Leave(leave).ok());
  EXPECT_THAT(Refused(ById(w0), absl::StatusCode::kNotFound),
              HasSubstr("is not a live member"));
}

TEST_F(DrainTest, BadTargets) {
  Init(Config(1, 2));
  Add(SERVER);
  Add(WORKER);
  DrainRequest scheduler;
  scheduler.set_scheduler(true);
  EXPECT_THAT(Refused(scheduler, absl::StatusCode::kFailedPrecondition),
              HasSubstr("the scheduler cannot be drained"));
  EXPECT_THAT(Refused(DrainRequest(), absl::StatusCode::kInvalidArgument),
              HasSubstr("no node given"));
  EXPECT_THAT(Refused(ByRank(ROLE_UNSPECIFIED, 0), absl::StatusCode::kInvalidArgument),
              HasSubstr("rank.role"));
  EXPECT_THAT(Refused(ById(99), absl::StatusCode::kNotFound),
              HasSubstr("node 99 is not a live member"));
  EXPECT_THAT(Refused(ByRank(WORKER, 1), absl::StatusCode::kNotFound),
              HasSubstr("no live worker holds rank 1"));
  EXPECT_THAT(Refused(ByRank(SERVER, 5), absl::StatusCode::kNotFound),
              HasSubstr("no live server holds rank 5"));
}

TEST_F(DrainTest, AServerWithTheOnlyCopyOfItsSlotsIsRefused) {
  Init(Config(2, 1));
  const uint64_t s0 = Add(SERVER);
  // STARTING: no slots assigned yet.
  EXPECT_THAT(Refused(ById(s0), absl::StatusCode::kFailedPrecondition),
              HasSubstr("not running yet"));
  Add(SERVER);
  ASSERT_EQ(state_->job_state(), RUNNING);
  EXPECT_THAT(Refused(ById(s0), absl::StatusCode::kFailedPrecondition),
              HasSubstr("holds the only copy of its slots (cluster.replication 1) and "
                        "the job has no checkpoint.dir"));
  EXPECT_FALSE(DrainAnswered(s0));
}

TEST_F(DrainTest, AServerThatCheckpointsFirstMayBeDrained) {
  Init(Config(1, 1, "", "checkpoint { dir: '/tmp/drain_test_ckpt' }"));
  const uint64_t s0 = Add(SERVER);
  auto r = state_->Drain(ByRank(SERVER, 0));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->node().node_id(), s0);
  EXPECT_THAT(r->note(), HasSubstr("wait for a replacement server_main"));
  EXPECT_TRUE(DrainAnswered(s0));
}

TEST_F(DrainTest, ReplicatedServersDrainWhileAnotherHoldsTheirBackups) {
  Init(Config(2, 1, "replication: 2"));
  const uint64_t s0 = Add(SERVER), s1 = Add(SERVER);
  ASSERT_EQ(state_->job_state(), RUNNING);
  auto r = state_->Drain(ById(s1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->note(), HasSubstr("4 slots are promoted to their backups"));
  // s0's backups are on s1, which is draining: s0 would be the last copy.
  EXPECT_THAT(Refused(ById(s0), absl::StatusCode::kFailedPrecondition),
              HasSubstr("holds the only live copy of slot 0"));
  // s1 leaves: its slots are promoted to s0, which now has no backups.
  LeaveRequest leave;
  leave.set_node_id(s1);
  ASSERT_TRUE(state_->Leave(leave).ok());
  EXPECT_THAT(Refused(ById(s0), absl::StatusCode::kFailedPrecondition),
              HasSubstr("no live backup"));
}

TEST_F(DrainTest, NothingIsDrainedOnceTheJobFinished) {
  Init(Config(1, 2, "", "checkpoint { dir: '/tmp/drain_test_ckpt' }"));
  const uint64_t s0 = Add(SERVER);
  const uint64_t w0 = Add(WORKER), w1 = Add(WORKER);
  for (uint64_t w : {w0, w1}) {
    LeaveRequest leave;
    leave.set_node_id(w);
    leave.set_finished(true);
    ASSERT_TRUE(state_->Leave(leave).ok());
  }
  ASSERT_EQ(state_->job_state(), FINISHED);
  EXPECT_THAT(Refused(ById(s0), absl::StatusCode::kFailedPrecondition),
              HasSubstr("the job has finished"));
  // Told apart by its reason, as psctl and the workers do.
  const absl::Status refused = state_->Drain(ById(s0)).status();
  EXPECT_TRUE(IsJobFinished(refused)) << refused;
}

// Over gRPC: the status codes reach the caller, and a real client learns of
// the drain from its heartbeats and calls on_drain exactly once.
TEST(DrainRpcTest, TheDrainedClientIsTold) {
  const JobConfig config = Config(1, 2);
  SchedulerServer::Options options;
  options.config = config;
  auto scheduler = SchedulerServer::Start(options);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  auto connect = [&](Role role, std::atomic<int>* drained) {
    auto o = SchedulerClient::Options::ForJob(config, (*scheduler)->address(), role);
    if (role == SERVER) o.data_endpoint = "tcp://127.0.0.1:1";
    o.trains_shards = role == WORKER;
    o.on_drain = [drained] { ++*drained; };
    auto c = SchedulerClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(c).value();
  };
  std::atomic<int> server_drained{0}, w0_drained{0}, w1_drained{0};
  auto server = connect(SERVER, &server_drained);
  auto w0 = connect(WORKER, &w0_drained);
  auto w1 = connect(WORKER, &w1_drained);

  auto stub = Scheduler::NewStub(
      grpc::CreateChannel((*scheduler)->address(), grpc::InsecureChannelCredentials()));
  {
    DrainResponse response;
    grpc::ClientContext context;
    const grpc::Status s = stub->Drain(&context, ByRank(WORKER, w1->rank()), &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.node().node_id(), w1->node_id());
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (w1_drained.load() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(w1_drained.load(), 1);
  EXPECT_TRUE(w1->drain_requested());
  absl::SleepFor(absl::Milliseconds(200));  // several more heartbeats
  EXPECT_EQ(w1_drained.load(), 1);
  EXPECT_EQ(w0_drained.load(), 0);
  EXPECT_FALSE(w0->drain_requested());
  EXPECT_EQ(server_drained.load(), 0);

  for (const auto& [request, code] :
       {std::make_pair(ById(12345), grpc::StatusCode::NOT_FOUND),
        std::make_pair(ById(server->node_id()), grpc::StatusCode::FAILED_PRECONDITION),
        std::make_pair(DrainRequest(), grpc::StatusCode::INVALID_ARGUMENT)}) {
    DrainResponse response;
    grpc::ClientContext context;
    EXPECT_EQ(stub->Drain(&context, request, &response).error_code(), code);
  }
}

}  // namespace
}  // namespace ps
