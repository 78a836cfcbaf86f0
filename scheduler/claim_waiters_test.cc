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
#include "scheduler/waiters_testing.h"

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

using Outcome = testing::CallOutcome<ClaimShardRequest, ClaimShardResponse>;

class ClaimWaitersTest : public ::testing::Test {
 protected:
  void Start(uint32_t workers) {
    absl::StatusOr<testing::SmallJob> job =
        testing::StartSmallJob(&clock_, workers, /*trains_shards=*/true);
    ASSERT_TRUE(job.ok()) << job.status();
    state_ = std::move(job->state);
    workers_ = std::move(job->workers);
    claims_ = std::make_unique<ClaimWaiters>(state_.get());
    service_ = std::make_unique<ClaimService>(claims_.get());
    testing::LoopbackServer served = testing::ServeOnLoopback(service_.get());
    server_ = std::move(served.server);
    ASSERT_NE(server_, nullptr);
    stub_ = std::move(served.stub);
  }

  void TearDown() override {
    if (claims_ != nullptr) claims_->Close();
    if (server_ != nullptr) server_->Shutdown();
    EXPECT_TRUE(outcomes_.Drain(kCallbackWait));
  }

  // Starts a claim of node `node_id` (finishing `finished` when set). The
  // outcome lives until the test's end (TearDown).
  Outcome* Call(uint64_t node_id, const DataPosition* finished,
                absl::Duration wait) {
    Outcome* o = outcomes_.Add();
    o->request.set_node_id(node_id);
    if (finished != nullptr) {
      *o->request.mutable_finished() = *finished;
      o->request.mutable_finished()->set_done(true);
    }
    o->request.set_timeout_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(wait)));
    stub_->async()->ClaimShard(&o->ctx, &o->request, &o->response,
                               o->Callback());
    return o;
  }
  // A claim of worker `w` (finishing its own shard when `finish`).
  Outcome* Claim(size_t w, bool finish, absl::Duration wait) {
    return Call(workers_[w].node_id(), finish ? &workers_[w].shard() : nullptr,
                wait);
  }

  static constexpr absl::Duration kCallbackWait = absl::Seconds(30);

  FakeClock clock_;
  std::unique_ptr<ClusterState> state_;
  std::unique_ptr<ClaimWaiters> claims_;
  std::unique_ptr<ClaimService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Scheduler::Stub> stub_;
  std::vector<RegisterResponse> workers_;
  testing::OutcomeList<Outcome> outcomes_;
};

constexpr absl::Duration kLongWait = absl::Seconds(20);

// A waiting claim gets an orphaned shard as soon as its worker leaves,
// and one with nothing to get is answered WAIT at its deadline.
TEST_F(ClaimWaitersTest, AWaitingClaimGetsAnOrphanAtOnceAndWaitAtItsDeadline) {
  ASSERT_NO_FATAL_FAILURE(Start(3));
  Outcome* waiting = Claim(0, /*finish=*/true, kLongWait);
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
  Outcome* short_wait = Claim(0, /*finish=*/false, absl::Milliseconds(300));
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
  std::vector<Outcome*> waiting;
  for (size_t w = 0; w + 1 < kWorkers; ++w) {
    waiting.push_back(Claim(w, /*finish=*/true, kLongWait));
  }
  absl::SleepFor(absl::Milliseconds(200));
  for (const auto& o : waiting) EXPECT_FALSE(o->done.HasBeenNotified());
  const absl::Time last = absl::Now();
  waiting.push_back(Claim(kWorkers - 1, /*finish=*/true, kLongWait));
  for (const auto& o : waiting) {
    ASSERT_TRUE(o->done.WaitForNotificationWithTimeout(kLongWait));
    ASSERT_TRUE(o->status.ok()) << o->status.error_message();
    EXPECT_EQ(o->response.result(), ClaimShardResponse::ALL_DONE);
  }
  EXPECT_LT(absl::Now() - last, kLongWait / 2);

  Outcome* unknown = Call(999, nullptr, kLongWait);
  ASSERT_TRUE(unknown->done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_EQ(unknown->status.error_code(), grpc::StatusCode::NOT_FOUND);
}

// Close answers the claims still waiting (as at their deadline) and
// refuses later ones.
TEST_F(ClaimWaitersTest, CloseAnswersWaitingClaims) {
  ASSERT_NO_FATAL_FAILURE(Start(2));
  Outcome* waiting = Claim(0, /*finish=*/true, kLongWait);
  EXPECT_FALSE(waiting->done.WaitForNotificationWithTimeout(
      absl::Milliseconds(200)));
  claims_->Close();
  ASSERT_TRUE(waiting->done.WaitForNotificationWithTimeout(kLongWait));
  ASSERT_TRUE(waiting->status.ok()) << waiting->status.error_message();
  EXPECT_EQ(waiting->response.result(), ClaimShardResponse::WAIT);
  Outcome* late = Claim(1, /*finish=*/false, kLongWait);
  ASSERT_TRUE(late->done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_EQ(late->status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace ps
