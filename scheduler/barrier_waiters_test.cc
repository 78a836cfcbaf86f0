#include "scheduler/barrier_waiters.h"

#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/cluster_state.h"
#include "scheduler/loopback_server.h"
#include "scheduler/waiters_testing.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A scheduler service that answers Barrier through BarrierWaiters (every
// other method is unimplemented).
class BarrierService final : public Scheduler::CallbackService {
 public:
  explicit BarrierService(BarrierWaiters* barriers) : barriers_(barriers) {}
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* context,
                                    const BarrierRequest* request,
                                    BarrierResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    barriers_->Wait(request, response, reactor);
    return reactor;
  }

 private:
  BarrierWaiters* const barriers_;
};

using Outcome = testing::CallOutcome<BarrierRequest, BarrierResponse>;

// This process's threads (/proc/self/status).
int Threads() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

class BarrierWaitersTest : public ::testing::Test {
 protected:
  void Start(uint32_t workers) {
    absl::StatusOr<testing::SmallJob> job =
        testing::StartSmallJob(&clock_, workers, /*trains_shards=*/false);
    ASSERT_TRUE(job.ok()) << job.status();
    state_ = std::move(job->state);
    workers_ = std::move(job->workers);
    barriers_ = std::make_unique<BarrierWaiters>(state_.get());
    service_ = std::make_unique<BarrierService>(barriers_.get());
    testing::LoopbackServer served = testing::ServeOnLoopback(service_.get());
    server_ = std::move(served.server);
    ASSERT_NE(server_, nullptr);
    stub_ = std::move(served.stub);
  }

  void TearDown() override {
    if (barriers_ != nullptr) barriers_->Close();
    if (server_ != nullptr) server_->Shutdown();
    EXPECT_TRUE(outcomes_.Drain(kCallbackWait));
  }

  // Worker `w` arrives at barrier `name` and waits up to `wait`. The
  // outcome lives until the test's end (TearDown).
  Outcome* Arrive(size_t w, const std::string& name, absl::Duration wait,
                  bool runs = true) {
    return Call(workers_[w].node_id(), name, wait, runs);
  }
  Outcome* Call(uint64_t node_id, const std::string& name, absl::Duration wait,
                bool runs = true) {
    Outcome* o = outcomes_.Add();
    o->request.set_node_id(node_id);
    o->request.set_name(name);
    o->request.set_rank_runs(runs);
    o->request.set_timeout_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(wait)));
    stub_->async()->Barrier(&o->ctx, &o->request, &o->response, o->Callback());
    return o;
  }

  static constexpr absl::Duration kCallbackWait = absl::Seconds(30);

  FakeClock clock_;
  std::unique_ptr<ClusterState> state_;
  std::unique_ptr<BarrierWaiters> barriers_;
  std::unique_ptr<BarrierService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Scheduler::Stub> stub_;
  std::vector<RegisterResponse> workers_;
  testing::OutcomeList<Outcome> outcomes_;
};

constexpr absl::Duration kLongWait = absl::Seconds(20);

// Hundreds of workers wait at a barrier as records, not threads; the last
// arrival releases them all, each told the ranks there as runs or as the
// list, as it asked.
TEST_F(BarrierWaitersTest, WaitingWorkersHoldNoThreadAndTheLastReleasesAll) {
  constexpr size_t kWorkers = 400;
  ASSERT_NO_FATAL_FAILURE(Start(kWorkers));
  const int threads_before = Threads();
  std::vector<Outcome*> waiting;
  for (size_t w = 0; w + 1 < kWorkers; ++w) {
    waiting.push_back(Arrive(w, "end", kLongWait, /*runs=*/w % 2 == 0));
  }
  const absl::Time give_up = absl::Now() + kLongWait;
  while (barriers_->waiting() < kWorkers - 1 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(barriers_->waiting(), kWorkers - 1);
  // A thread per waiting call would be 399 more.
  EXPECT_LT(Threads() - threads_before, 40);
  for (const auto& o : waiting) EXPECT_FALSE(o->done.HasBeenNotified());

  const absl::Time last = absl::Now();
  waiting.push_back(Arrive(kWorkers - 1, "end", kLongWait));
  for (size_t w = 0; w < waiting.size(); ++w) {
    const Outcome& o = *waiting[w];
    ASSERT_TRUE(o.done.WaitForNotificationWithTimeout(kLongWait)) << w;
    ASSERT_TRUE(o.status.ok()) << o.status.error_message();
    if (o.request.rank_runs()) {
      EXPECT_THAT(o.response.rank_runs(), ElementsAre(0, kWorkers));
      EXPECT_THAT(o.response.ranks(), IsEmpty());
    } else {
      ASSERT_EQ(o.response.ranks_size(), static_cast<int>(kWorkers));
      EXPECT_EQ(o.response.ranks(kWorkers - 1), kWorkers - 1);
    }
  }
  EXPECT_LT(absl::Now() - last, kLongWait / 2);
  EXPECT_EQ(barriers_->waiting(), 0u);

  // A released barrier answers a late caller at once.
  Outcome* late = Arrive(3, "end", kLongWait);
  ASSERT_TRUE(late->done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_TRUE(late->status.ok());
  EXPECT_THAT(late->response.rank_runs(), ElementsAre(0, kWorkers));
}

// A wait ends at its deadline naming the missing ranks; bad calls are
// answered at once with AwaitBarrier's errors.
TEST_F(BarrierWaitersTest, DeadlinesAndBadCallsAreAnsweredAsAwaitBarrierWould) {
  ASSERT_NO_FATAL_FAILURE(Start(3));
  const absl::Time asked = absl::Now();
  Outcome* alone = Arrive(0, "b", absl::Milliseconds(300));
  Outcome* long_wait = Arrive(1, "b", kLongWait);
  ASSERT_TRUE(alone->done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_GE(absl::Now() - asked, absl::Milliseconds(290));
  EXPECT_EQ(alone->status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(alone->status.error_message(), HasSubstr("worker ranks 2"));
  EXPECT_FALSE(long_wait->done.HasBeenNotified());

  Outcome* unnamed = Arrive(0, "", kLongWait);
  ASSERT_TRUE(unnamed->done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_EQ(unnamed->status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  Outcome* unknown = Call(999, "b", kLongWait);
  ASSERT_TRUE(unknown->done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_EQ(unknown->status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_FALSE(long_wait->done.HasBeenNotified());
}

// The state's listener decides waits: the missing worker leaving releases
// the barrier for the others (no arrival, no deadline involved).
TEST_F(BarrierWaitersTest, TheMissingWorkerLeavingReleasesTheOthers) {
  ASSERT_NO_FATAL_FAILURE(Start(3));
  Outcome* w0 = Arrive(0, "b", kLongWait);
  Outcome* w1 = Arrive(1, "b", kLongWait);
  EXPECT_FALSE(
      w1->done.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  LeaveRequest leave;
  leave.set_node_id(workers_[2].node_id());
  const absl::Time left = absl::Now();
  ASSERT_TRUE(state_->Leave(leave).ok());
  for (Outcome* o : {w0, w1}) {
    ASSERT_TRUE(o->done.WaitForNotificationWithTimeout(kLongWait));
    ASSERT_TRUE(o->status.ok()) << o->status.error_message();
    EXPECT_THAT(o->response.rank_runs(), ElementsAre(0, 2));
  }
  EXPECT_LT(absl::Now() - left, kLongWait / 2);
}

// Close answers the waits still open and refuses later calls.
TEST_F(BarrierWaitersTest, CloseAnswersWaitingCalls) {
  ASSERT_NO_FATAL_FAILURE(Start(2));
  Outcome* waiting = Arrive(0, "b", kLongWait);
  EXPECT_FALSE(
      waiting->done.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  state_->Close();  // as the scheduler shuts down: the state first
  barriers_->Close();
  ASSERT_TRUE(waiting->done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_EQ(waiting->status.error_code(), grpc::StatusCode::UNAVAILABLE);
  Outcome* late = Arrive(1, "b", kLongWait);
  ASSERT_TRUE(late->done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_EQ(late->status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace ps
