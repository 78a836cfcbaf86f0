#include "scheduler/claim_waiters.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/cluster_state.h"
#include "scheduler/loopback_server.h"

namespace ps {
namespace {

// A scheduler service that answers ClaimShard through ClaimWaiters (every
// other method is unimplemented).
class ClaimService final : public Scheduler::CallbackService {
 public:
  explicit ClaimService(ClaimWaiters* claims) : claims_(claims) {}
  grpc::ServerUnaryReactor* ClaimShard(grpc::CallbackServerContext* context,
                                       const ClaimShardRequest* request,
                                       ClaimShardResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    claims_->Claim(request, response, reactor);
    return reactor;
  }

 private:
  ClaimWaiters* const claims_;
};

// A claim's outcome, filled by its completion callback.
struct Outcome {
  grpc::ClientContext ctx;
  ClaimShardRequest request;
  ClaimShardResponse response;
  grpc::Status status;
  absl::Notification done;
};

class ClaimWaitersTest : public ::testing::Test {
 protected:
  void Start(uint32_t workers) {
    JobConfig config;
    config.mutable_cluster()->set_num_servers(1);
    config.mutable_cluster()->set_num_workers(workers);
    config.mutable_cluster()->set_num_slots(8);
    config.mutable_cluster()->set_heartbeat_interval_ms(100);
    config.mutable_cluster()->set_heartbeat_timeout_ms(1000);
    fingerprint_ = ConfigFingerprint(config);
    state_ = std::make_unique<ClusterState>(config, &clock_);
    claims_ = std::make_unique<ClaimWaiters>(state_.get());
    service_ = std::make_unique<ClaimService>(claims_.get());
    testing::LoopbackServer served = testing::ServeOnLoopback(service_.get());
    server_ = std::move(served.server);
    ASSERT_NE(server_, nullptr);
    stub_ = std::move(served.stub);
    RegisterRequest server;
    server.set_role(SERVER);
    server.set_data_endpoint("tcp://s:1");
    server.set_config_fingerprint(fingerprint_);
    ASSERT_TRUE(state_->Register(server).ok());
    for (uint32_t i = 0; i < workers; ++i) {
      RegisterRequest worker;
      worker.set_role(WORKER);
      worker.set_trains_shards(true);
      worker.set_config_fingerprint(fingerprint_);
      absl::StatusOr<RegisterResponse> r = state_->Register(worker);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_TRUE(r->has_shard());
      workers_.push_back(*r);
    }
  }

  void TearDown() override {
    if (claims_ != nullptr) claims_->Close();
    if (server_ != nullptr) server_->Shutdown();
  }

  // Starts a claim of worker `w` (finishing its own shard when `finish`).
  std::unique_ptr<Outcome> Claim(size_t w, bool finish, absl::Duration wait) {
    auto o = std::make_unique<Outcome>();
    o->request.set_node_id(workers_[w].node_id());
    if (finish) {
      *o->request.mutable_finished() = workers_[w].shard();
      o->request.mutable_finished()->set_done(true);
    }
    o->request.set_timeout_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(wait)));
    o->ctx.set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(60));
    Outcome* raw = o.get();
    stub_->async()->ClaimShard(&raw->ctx, &raw->request, &raw->response,
                               [raw](grpc::Status s) {
                                 raw->status = s;
                                 raw->done.Notify();
                               });
    return o;
  }

  FakeClock clock_;
  uint64_t fingerprint_ = 0;
  std::unique_ptr<ClusterState> state_;
  std::unique_ptr<ClaimWaiters> claims_;
  std::unique_ptr<ClaimService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Scheduler::Stub> stub_;
  std::vector<RegisterResponse> workers_;
};

constexpr absl::Duration kLongWait = absl::Seconds(20);

// A waiting claim gets an orphaned shard as soon as its worker leaves,
// and one with nothing to get is answered WAIT at its deadline.
TEST_F(ClaimWaitersTest, AWaitingClaimGetsAnOrphanAtOnceAndWaitAtItsDeadline) {
  ASSERT_NO_FATAL_FAILURE(Start(3));
  std::unique_ptr<Outcome> waiting = Claim(0, /*finish=*/true, kLongWait);
  EXPECT_FALSE(waiting->done.WaitForNotificationWithTimeout(
      absl::Milliseconds(200)));
  LeaveRequest preempted;
  preempted.set_node_id(workers_[1].node_id());
  *preempted.mutable_position() = workers_[1].shard();
  preempted.mutable_position()->set_batch(4);
  const absl::Time left = absl::Now();
  ASSERT_TRUE(state_->Leave(preempted).ok());
  ASSERT_TRUE(waiting->done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_LT(absl::Now() - left, kLongWait / 2);
  ASSERT_TRUE(waiting->status.ok()) << waiting->status.error_message();
  EXPECT_EQ(waiting->response.result(), ClaimShardResponse::ASSIGNED);
  EXPECT_EQ(waiting->response.shard().shard(), workers_[1].shard().shard());
  EXPECT_EQ(waiting->response.shard().batch(), 4u);

  // Worker 2 still trains: a short claim of worker 0 ends in WAIT.
  const absl::Time asked = absl::Now();
  std::unique_ptr<Outcome> short_wait =
      Claim(0, /*finish=*/false, absl::Milliseconds(300));
  ASSERT_TRUE(short_wait->done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_GE(absl::Now() - asked, absl::Milliseconds(290));
  ASSERT_TRUE(short_wait->status.ok());
  EXPECT_EQ(short_wait->response.result(), ClaimShardResponse::WAIT);
}

// Many workers wait at the end of training; the last shard done answers
// them all ALL_DONE, and a claim of an unknown node is NOT_FOUND.
TEST_F(ClaimWaitersTest, TheLastShardDoneReleasesEveryWaitingWorker) {
  constexpr size_t kWorkers = 64;
  ASSERT_NO_FATAL_FAILURE(Start(kWorkers));
  std::vector<std::unique_ptr<Outcome>> waiting;
  for (size_t w = 0; w + 1 < kWorkers; ++w) {
    waiting.push_back(Claim(w, /*finish=*/true, kLongWait));
  }
  absl::SleepFor(absl::Milliseconds(200));
  for (const auto& o : waiting) EXPECT_FALSE(o->done.HasBeenNotified());
  const absl::Time last = absl::Now();
  std::unique_ptr<Outcome> final = Claim(kWorkers - 1, true, kLongWait);
  waiting.push_back(std::move(final));
  for (const auto& o : waiting) {
    ASSERT_TRUE(o->done.WaitForNotificationWithTimeout(kLongWait));
    ASSERT_TRUE(o->status.ok()) << o->status.error_message();
    EXPECT_EQ(o->response.result(), ClaimShardResponse::ALL_DONE);
  }
  EXPECT_LT(absl::Now() - last, kLongWait / 2);

  ClaimShardRequest unknown;
  unknown.set_node_id(999);
  Outcome o;
  o.request = unknown;
  stub_->async()->ClaimShard(&o.ctx, &o.request, &o.response,
                             [&o](grpc::Status s) {
                               o.status = s;
                               o.done.Notify();
                             });
  ASSERT_TRUE(o.done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_EQ(o.status.error_code(), grpc::StatusCode::NOT_FOUND);
}

// Close answers the claims still waiting (as at their deadline) and
// refuses later ones.
TEST_F(ClaimWaitersTest, CloseAnswersWaitingClaims) {
  ASSERT_NO_FATAL_FAILURE(Start(2));
  std::unique_ptr<Outcome> waiting = Claim(0, /*finish=*/true, kLongWait);
  EXPECT_FALSE(waiting->done.WaitForNotificationWithTimeout(
      absl::Milliseconds(200)));
  claims_->Close();
  ASSERT_TRUE(waiting->done.WaitForNotificationWithTimeout(kLongWait));
  ASSERT_TRUE(waiting->status.ok()) << waiting->status.error_message();
  EXPECT_EQ(waiting->response.result(), ClaimShardResponse::WAIT);
  std::unique_ptr<Outcome> late = Claim(1, /*finish=*/false, kLongWait);
  ASSERT_TRUE(late->done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_EQ(late->status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace ps
