#include "worker/session.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/protocol.h"
#include "common/reasons.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/scheduler.h"
#include "tests/testing/cluster.h"

namespace ps {
namespace {

using ::ps::testing::InProcessCluster;
using ::testing::HasSubstr;

JobConfig Config(const std::string& mode, int workers,
                 const std::string& extra = "") {
  auto config = ParseJobConfig(
      absl::StrCat(
          R"pb(
            name: "session-test"
            cluster { num_servers: 2 num_workers:)pb",
          workers,
          R"pb(                                        num_slots: 64
                  heartbeat_interval_ms: 100 heartbeat_timeout_ms: 5000 }
                                                       consistency { mode: )pb",
          mode, R"pb(}
                     tables { id: 0 name: "emb" sparse { dim: 2 }
                 optimizer { sgd { learning_rate: 1 } } }
        tables { id: 1 name: "dense" dense { size: 3 }
                 optimizer { sgd { learning_rate: 1 } } }
      )pb",
          extra),
      "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// A job of Config(mode, workers) on an in-process cluster (or on a
// scheduler alone, whose servers never come), and its workers' sessions.
class WorkerSessionTest : public ::testing::Test {
 protected:
  void StartJob(const std::string& mode, int workers) {
    config_ = Config(mode, workers);
    auto cluster = InProcessCluster::Start(config_);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  // A scheduler of a one-worker ASYNC job to which no server ever
  // registers.
  void StartSchedulerAlone() {
    config_ = Config("ASYNC", 1);
    SchedulerServer::Options so;
    so.config = config_;
    auto scheduler = SchedulerServer::Start(so);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = *std::move(scheduler);
  }

  // The options of a worker of the started job.
  WorkerSession::Options SessionOptions() const {
    WorkerSession::Options o;
    o.config = config_;
    o.scheduler = cluster_ != nullptr ? cluster_->scheduler().address()
                                      : scheduler_->address();
    o.stop_check = absl::Milliseconds(100);
    return o;
  }

  void StartSession(WorkerSession::Options options,
                    std::unique_ptr<WorkerSession>* session) {
    auto s = WorkerSession::Start(std::move(options));
    ASSERT_TRUE(s.ok()) << s.status();
    *session = *std::move(s);
  }

  // StartJob(mode, 2), then workers a_ and b_; `tune_a`, when given,
  // adjusts a_'s options.
  void StartTwoWorkers(
      const std::string& mode,
      const std::function<void(WorkerSession::Options*)>& tune_a = nullptr) {
    ASSERT_NO_FATAL_FAILURE(StartJob(mode, 2));
    WorkerSession::Options a_options = SessionOptions();
    if (tune_a) tune_a(&a_options);
    ASSERT_NO_FATAL_FAILURE(StartSession(a_options, &a_));
    ASSERT_NO_FATAL_FAILURE(StartSession(SessionOptions(), &b_));
  }

  JobConfig config_;
  // What a test's should_stop may read; outlives the sessions.
  std::atomic<bool> stop_{false};
  std::unique_ptr<SchedulerServer> scheduler_;
  std::unique_ptr<InProcessCluster> cluster_;
  std::unique_ptr<WorkerSession> a_, b_;
};

TEST_F(WorkerSessionTest, JoinsKnowsItsPlaceAndFindsTables) {
  ASSERT_NO_FATAL_FAILURE(StartJob("ASYNC", 1));
  ASSERT_NO_FATAL_FAILURE(StartSession(SessionOptions(), &a_));
  WorkerSession& s = *a_;
  EXPECT_EQ(s.rank(), 0u);
  EXPECT_EQ(s.num_workers(), 1u);
  EXPECT_EQ(s.num_servers(), 2u);
  EXPECT_EQ(s.start_clock(), 0u);
  ASSERT_TRUE(s.initial_position().has_value());
  EXPECT_EQ(s.initial_position()->shard(), 0u);
  auto emb = s.FindTable("emb");
  ASSERT_TRUE(emb.ok());
  EXPECT_EQ((*emb)->id(), 0u);
  auto missing = s.FindTable("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("emb, dense"));
  EXPECT_EQ(s.RequestCheckpoint().status().code(),
            absl::StatusCode::kFailedPrecondition);

  // A step: push, end the step, pull what it wrote.
  std::vector<uint64_t> keys = {7, 9};
  std::vector<float> grads = {1, 2, 3, 4};
  ASSERT_TRUE(s.kv()->Push(0, keys, grads).Wait().ok());
  DataPosition next;
  next.set_batch(1);
  ASSERT_TRUE(s.EndStep(next).Wait().ok());
  EXPECT_EQ(s.clock(), 1u);
  std::vector<float> rows(4);
  ASSERT_TRUE(s.kv()->Pull(0, keys, rows.data()).Wait().ok());
  EXPECT_EQ(rows, (std::vector<float>{-1, -2, -3, -4}));

  auto evaluator = s.Finish(absl::Seconds(10));
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  EXPECT_TRUE(*evaluator);
  EXPECT_EQ(s.clock(), kFinishedClock);
  EXPECT_TRUE(s.Leave(true).ok());
  EXPECT_TRUE(s.left());
  EXPECT_TRUE(s.Leave(true).ok());  // a second time does nothing
}

// Two workers finish; the lowest rank evaluates, the other returns only once
// the evaluator said it is done.
TEST_F(WorkerSessionTest, FinishElectsOneEvaluatorAndTheOtherWaitsForIt) {
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers("BSP"));
  std::atomic<bool> evaluation_done{false};
  std::atomic<bool> b_returned_before_done{false};
  std::thread other([&] {
    // One BSP step each, then finish.
    std::vector<float> d(3, 1.0f);
    ASSERT_TRUE(b_->kv()->PushDense(1, 0, d).Wait().ok());
    ASSERT_TRUE(b_->EndStep().Wait().ok());
    auto e = b_->Finish(absl::Seconds(20));
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_FALSE(*e);
    b_returned_before_done = !evaluation_done.load();
    EXPECT_TRUE(b_->Leave(true).ok());
  });
  std::vector<float> d(3, 3.0f);
  ASSERT_TRUE(a_->kv()->PushDense(1, 0, d).Wait().ok());
  ASSERT_TRUE(a_->EndStep().Wait().ok());
  auto e = a_->Finish(absl::Seconds(20));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(*e);
  // BSP averaged the two pushes: -(1 + 3) / 2.
  std::vector<float> out(3);
  ASSERT_TRUE(a_->kv()->PullDense(1, 0, 3, out.data()).Wait().ok());
  EXPECT_EQ(out, (std::vector<float>{-2, -2, -2}));
  absl::SleepFor(absl::Milliseconds(300));
  evaluation_done = true;
  EXPECT_TRUE(a_->EvaluationDone().ok());
  other.join();
  EXPECT_FALSE(b_returned_before_done.load());
  EXPECT_TRUE(a_->Leave(true).ok());
}

// A stop request ends a barrier wait within a stop_check round, with
// CANCELLED, and stop_requested() says so.
TEST_F(WorkerSessionTest, AStopEndsABarrierWaitPromptly) {
  ASSERT_NO_FATAL_FAILURE(
      StartTwoWorkers("BSP", [this](WorkerSession::Options* o) {
        o->should_stop = [this] { return stop_.load(); };
      }));
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(300));
    stop_ = true;
  });
  const absl::Time start = absl::Now();
  absl::Status s = a_->Barrier("never-met", absl::Seconds(30));
  stopper.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_TRUE(a_->stop_requested());
  EXPECT_FALSE(b_->stop_requested());
  b_->RequestStop();
  EXPECT_TRUE(b_->stop_requested());
}

// A session whose servers never come notices a stop while it waits for
// them, leaves (handing its shard back), and returns CANCELLED.
TEST_F(WorkerSessionTest, AStopWhileWaitingForServersLeavesWithCancelled) {
  ASSERT_NO_FATAL_FAILURE(StartSchedulerAlone());
  WorkerSession::Options options = SessionOptions();
  const absl::Time start = absl::Now();
  options.should_stop = [start] {
    return absl::Now() - start > absl::Milliseconds(300);
  };
  auto s = WorkerSession::Start(options);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kCancelled) << s.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  int left = 0;
  const ClusterView view = scheduler_->state()->View();
  for (const NodeInfo& node : view.nodes()) {
    left += node.role() == WORKER && node.state() == LEFT;
  }
  EXPECT_EQ(left, 1);
}

// Without a stop, the wait for the servers ends at startup_timeout with
// DEADLINE_EXCEEDED.
TEST_F(WorkerSessionTest, ServersThatNeverComeAreADeadline) {
  ASSERT_NO_FATAL_FAILURE(StartSchedulerAlone());
  WorkerSession::Options options = SessionOptions();
  options.startup_timeout = absl::Milliseconds(400);
  auto s = WorkerSession::Start(options);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDeadlineExceeded)
      << s.status();
}

// A claim round with every shard still held by a live worker answers WAIT
// and sets this worker's clock to finished, so BSP never waits on it.
TEST_F(WorkerSessionTest, ClaimFinishesTheClockAndWaitsWhileOthersTrain) {
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers("BSP"));
  DataPosition done = *a_->initial_position();
  done.set_done(true);
  auto claim = a_->Claim(&done);
  ASSERT_TRUE(claim.ok()) << claim.status();
  EXPECT_EQ(claim->result(), ClaimShardResponse::WAIT);
  EXPECT_EQ(a_->clock(), kFinishedClock);
  // b trains a step alone: its pull is not held back by a.
  std::vector<float> d(3, 1.0f);
  ASSERT_TRUE(b_->kv()->PushDense(1, 0, d).Wait().ok());
  ASSERT_TRUE(b_->EndStep().Wait().ok());
  std::vector<float> out(3);
  absl::Status pulled;
  ASSERT_TRUE(b_->kv()
                  ->PullDense(1, 0, 3, out.data())
                  .WaitFor(absl::Seconds(10), &pulled));
  EXPECT_TRUE(pulled.ok()) << pulled;
  EXPECT_EQ(out, (std::vector<float>{-1, -1, -1}));
}

// The session's shard protocol through the real scheduler: both workers
// meet at the start barrier and get their own shards; one is preempted
// mid-shard and leaves with its position; the other finishes its own,
// takes over the rest of the preempted one from exactly there, and then
// learns that every shard is done.
TEST_F(WorkerSessionTest, ShardsRunTheJobsShardProtocol) {
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers("ASYNC"));
  absl::StatusOr<std::optional<DataPosition>> b_first;
  std::thread other([&] { b_first = b_->shards()->Next(); });
  auto a_first = a_->shards()->Next();
  other.join();
  ASSERT_TRUE(a_first.ok()) << a_first.status();
  ASSERT_TRUE(b_first.ok()) << b_first.status();
  ASSERT_TRUE(a_first->has_value() && b_first->has_value());
  EXPECT_EQ((*a_first)->shard(), a_->rank());
  EXPECT_EQ((*b_first)->shard(), b_->rank());

  // b is stopped before batch 3 and leaves with that position.
  DataPosition stopped_at = **b_first;
  stopped_at.set_epoch(0);
  stopped_at.set_batch(3);
  ShardCursor* b_shards = b_->shards();
  b_shards->Ended(stopped_at);
  auto b_next = b_shards->Next();
  ASSERT_TRUE(b_next.ok()) << b_next.status();
  EXPECT_FALSE(b_next->has_value());
  EXPECT_TRUE(b_shards->stopped());
  ASSERT_TRUE(b_shards->position().has_value());
  ASSERT_TRUE(b_->Leave(false, &*b_shards->position()).ok());

  // a finishes its own shard and is given the rest of b's.
  DataPosition done = **a_first;
  done.set_epoch(1);
  done.set_done(true);
  ShardCursor* a_shards = a_->shards();
  a_shards->Ended(done);
  auto taken = a_shards->Next();
  ASSERT_TRUE(taken.ok()) << taken.status();
  ASSERT_TRUE(taken->has_value());
  EXPECT_EQ((*taken)->shard(), stopped_at.shard());
  EXPECT_EQ((*taken)->epoch(), 0u);
  EXPECT_EQ((*taken)->batch(), 3u);
  EXPECT_NE(a_->clock(), kFinishedClock) << "restarted at the job's clock";
  DataPosition rest = **taken;
  rest.set_epoch(1);
  rest.set_batch(0);
  rest.set_done(true);
  a_shards->Ended(rest);
  auto last = a_shards->Next();
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_FALSE(last->has_value());
  EXPECT_TRUE(a_shards->all_done());
}

// An observer reads while a BSP job trains: answered at once with what the
// servers hold, never counted as a worker, refused the lifecycle calls.
TEST_F(WorkerSessionTest, AnObserverReadsWithoutHoldingBspBack) {
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers("BSP"));
  WorkerSession::Options observer_options = SessionOptions();
  observer_options.observer = true;
  auto o = WorkerSession::Start(observer_options);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE((*o)->observer());
  EXPECT_EQ((*o)->node_id(), 0u);
  EXPECT_FALSE((*o)->initial_position().has_value());

  // Step 0 of both workers: each pushes 1 and 3; the average is applied.
  std::vector<float> one(3, 1.0f), three(3, 3.0f);
  ASSERT_TRUE(a_->kv()->PushDense(1, 0, one).Wait().ok());
  ASSERT_TRUE(b_->kv()->PushDense(1, 0, three).Wait().ok());
  ASSERT_TRUE(a_->EndStep().Wait().ok());
  ASSERT_TRUE(b_->EndStep().Wait().ok());
  // Step 1: only a pushes and ends it; b is still computing.
  ASSERT_TRUE(a_->kv()->PushDense(1, 0, one).Wait().ok());
  ASSERT_TRUE(a_->EndStep().Wait().ok());
  // The observer is answered at once with step 0 applied, not step 1.
  std::vector<float> seen(3);
  absl::Status pulled;
  ASSERT_TRUE((*o)->kv()
                  ->PullDense(1, 0, 3, seen.data())
                  .WaitFor(absl::Seconds(5), &pulled));
  ASSERT_TRUE(pulled.ok()) << pulled;
  EXPECT_EQ(seen, (std::vector<float>{-2, -2, -2}));
  // A worker's pull at clock 2 waits for b, not for the observer.
  std::vector<float> a_view(3);
  Completion held = a_->kv()->PullDense(1, 0, 3, a_view.data());
  EXPECT_FALSE(held.WaitFor(absl::Milliseconds(300)));
  ASSERT_TRUE(b_->kv()->PushDense(1, 0, three).Wait().ok());
  ASSERT_TRUE(b_->EndStep().Wait().ok());
  ASSERT_TRUE(held.WaitFor(absl::Seconds(10), &pulled));
  ASSERT_TRUE(pulled.ok()) << pulled;
  EXPECT_EQ(a_view, (std::vector<float>{-4, -4, -4}));

  EXPECT_EQ((*o)->EndStep().Wait().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*o)->Barrier("x", absl::Seconds(1)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*o)->Finish().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*o)->Leave(false).ok());
  // The workers' job knows two workers only.
  int workers = 0;
  const ClusterView view = cluster_->scheduler().state()->View();
  for (const NodeInfo& node : view.nodes()) workers += node.role() == WORKER;
  EXPECT_EQ(workers, 2);
}

// The scheduler drops a worker (here: as if another process had left in
// its name; to the worker this is what being declared dead looks like, a
// heartbeat answered NOT_FOUND): every wait of its session ends within
// about a heartbeat with the dropped status, and later ones at once.
TEST_F(WorkerSessionTest, ADroppedWorkerEndsEveryWaitAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers("BSP", [](WorkerSession::Options* o) {
    o->stop_check = absl::Seconds(30);  // rounds never end the waits here
  }));
  WorkerSession& s = *a_;

  // A step, then a pull of the next step: under BSP it waits for b.
  std::vector<float> d(3, 1.0f);
  ASSERT_TRUE(s.kv()->PushDense(1, 0, d).Wait().ok());
  ASSERT_TRUE(s.EndStep().Wait().ok());
  std::vector<float> out(3);
  Completion pull = s.kv()->PullDense(1, 0, 3, out.data());
  // And a barrier b never reaches.
  absl::Status barrier;
  std::atomic<bool> barrier_done{false};
  std::thread waiter([&] {
    barrier = s.Barrier("never-met", absl::Seconds(60));
    barrier_done = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(pull.done());
  EXPECT_FALSE(barrier_done.load());

  auto channel = grpc::CreateChannel(cluster_->scheduler().address(),
                                     grpc::InsecureChannelCredentials());
  auto stub = Scheduler::NewStub(channel);
  LeaveRequest leave;
  leave.set_node_id(s.node_id());
  LeaveResponse left;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->Leave(&context, leave, &left).ok());
  const absl::Time dropped = absl::Now();

  const absl::Status pulled = pull.Wait();
  waiter.join();
  // A heartbeat is 100 ms; generous for a loaded machine, far below the
  // 60 s barrier.
  EXPECT_LT(absl::Now() - dropped, absl::Seconds(10));
  EXPECT_TRUE(IsDropped(pulled)) << pulled;
  EXPECT_TRUE(IsDropped(barrier)) << barrier;
  EXPECT_THAT(std::string(barrier.message()),
              HasSubstr("dropped by the scheduler"));
  EXPECT_TRUE(s.lost());
  EXPECT_TRUE(IsDropped(s.ended()));
  EXPECT_FALSE(s.stop_requested());
  // Later waits end at once; leaving has nothing to do.
  const absl::Time later = absl::Now();
  EXPECT_TRUE(IsDropped(s.kv()->PushDense(1, 0, d).Wait()));
  EXPECT_TRUE(IsDropped(s.Claim(nullptr).status()));
  EXPECT_TRUE(IsDropped(s.Finish(absl::Seconds(60)).status()));
  EXPECT_LT(absl::Now() - later, absl::Seconds(5));
  EXPECT_TRUE(s.Leave(false).ok());
  // The other worker is unaffected.
  EXPECT_FALSE(b_->lost());
  EXPECT_TRUE(b_->ended().ok());
}

TEST_F(WorkerSessionTest, AFailedJobEndsEveryWaitAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers("BSP", [](WorkerSession::Options* o) {
    o->stop_check = absl::Seconds(30);  // rounds never end the waits here
  }));
  WorkerSession& s = *a_;
  std::vector<float> d(3, 1.0f);
  ASSERT_TRUE(s.kv()->PushDense(1, 0, d).Wait().ok());
  ASSERT_TRUE(s.EndStep().Wait().ok());
  // A pull that waits for b under BSP, and a barrier b never reaches.
  std::vector<float> out(3);
  Completion pull = s.kv()->PullDense(1, 0, 3, out.data());
  absl::Status barrier;
  std::atomic<bool> barrier_done{false};
  std::thread waiter([&] {
    barrier = s.Barrier("never-met", absl::Seconds(60));
    barrier_done = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(pull.done());
  EXPECT_FALSE(barrier_done.load());

  // Server 1 leaves: without replication or a checkpoint its slots are
  // lost, and the job cannot continue.
  uint64_t server1 = 0;
  const ClusterView view = cluster_->scheduler().state()->View();
  for (const NodeInfo& n : view.nodes()) {
    if (n.role() == SERVER && n.rank() == 1) server1 = n.node_id();
  }
  ASSERT_NE(server1, 0u);
  auto stub = Scheduler::NewStub(grpc::CreateChannel(
      cluster_->scheduler().address(), grpc::InsecureChannelCredentials()));
  LeaveRequest leave;
  leave.set_node_id(server1);
  LeaveResponse left;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->Leave(&context, leave, &left).ok());
  const absl::Time failing = absl::Now();

  const absl::Status pulled = pull.Wait();
  waiter.join();
  // The failure detector sweeps every 25 ms; far below the 60 s barrier.
  EXPECT_LT(absl::Now() - failing, absl::Seconds(10));
  EXPECT_TRUE(IsJobFailed(pulled)) << pulled;
  EXPECT_TRUE(IsJobFailed(barrier)) << barrier;
  EXPECT_THAT(std::string(barrier.message()), HasSubstr("of server 1"));
  EXPECT_TRUE(IsJobFailed(s.ended())) << s.ended();
  // b hears of the failure on its own watch stream, a few ms after a may.
  const absl::Time b_deadline = absl::Now() + absl::Seconds(10);
  while (!IsJobFailed(b_->ended()) && absl::Now() < b_deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(IsJobFailed(b_->ended())) << b_->ended();
  // Later waits end at once; leaving has nothing to do.
  const absl::Time later = absl::Now();
  EXPECT_TRUE(IsJobFailed(s.kv()->PushDense(1, 0, d).Wait()));
  EXPECT_TRUE(IsJobFailed(s.Claim(nullptr).status()));
  EXPECT_LT(absl::Now() - later, absl::Seconds(5));
  EXPECT_TRUE(s.Leave(false).ok());
}

}  // namespace
}  // namespace ps
