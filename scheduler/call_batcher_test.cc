#include "scheduler/call_batcher.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/loopback_server.h"

namespace ps {
namespace {

using Batcher = CallBatcher<ReportCheckpointRequest, ReportCheckpointResponse>;

// A scheduler service that answers ReportCheckpoint through a batcher
// (every other method is unimplemented).
class ReportService final : public Scheduler::CallbackService {
 public:
  explicit ReportService(Batcher* batcher) : batcher_(batcher) {}
  grpc::ServerUnaryReactor* ReportCheckpoint(
      grpc::CallbackServerContext* context,
      const ReportCheckpointRequest* request,
      ReportCheckpointResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    batcher_->Add({request, response, reactor});
    ++queued;
    return reactor;
  }
  std::atomic<int> queued{0};

 private:
  Batcher* const batcher_;
};

class CallBatcherTest : public ::testing::Test {
 protected:
  // The handler answers node ids with odd numbers INVALID_ARGUMENT naming
  // the node, and holds its first round until `hold_until` calls queued.
  void Start(int hold_until) {
    batcher_ = std::make_unique<Batcher>(
        [this, hold_until](const std::vector<Batcher::Call>& calls) {
          {
            absl::MutexLock lock(&mu_);
            if (rounds_.empty()) {
              const absl::Time give_up = absl::Now() + absl::Seconds(20);
              while (service_->queued.load() < hold_until &&
                     absl::Now() < give_up) {
                mu_.Unlock();
                absl::SleepFor(absl::Milliseconds(1));
                mu_.Lock();
              }
            }
            rounds_.push_back(static_cast<int>(calls.size()));
          }
          std::vector<grpc::Status> statuses;
          for (const Batcher::Call& c : calls) {
            const uint64_t node = c.request->node_id();
            statuses.push_back(
                node % 2 == 0
                    ? grpc::Status::OK
                    : grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "node " + std::to_string(node)));
          }
          return statuses;
        });
    service_ = std::make_unique<ReportService>(batcher_.get());
    testing::LoopbackServer served = testing::ServeOnLoopback(service_.get());
    server_ = std::move(served.server);
    ASSERT_NE(server_, nullptr);
    stub_ = std::move(served.stub);
  }

  void TearDown() override {
    if (batcher_ != nullptr) batcher_->Close();
    if (server_ != nullptr) server_->Shutdown();
  }

  grpc::Status Report(uint64_t node) {
    ReportCheckpointRequest request;
    request.set_node_id(node);
    ReportCheckpointResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    return stub_->ReportCheckpoint(&ctx, request, &response);
  }

  std::vector<int> Rounds() {
    absl::MutexLock lock(&mu_);
    return rounds_;
  }

  absl::Mutex mu_;
  std::vector<int> rounds_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<ReportService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Scheduler::Stub> stub_;
};

// Calls that queue while a round runs are all handled by the next one,
// however few threads gRPC has; each caller gets its own status.
TEST_F(CallBatcherTest, CallsQueuedDuringARoundShareTheNextRound) {
  constexpr int kCalls = 50;
  ASSERT_NO_FATAL_FAILURE(Start(kCalls));
  std::vector<grpc::Status> results(kCalls);
  std::thread first([&] { results[0] = Report(0); });
  while (service_->queued.load() < 1) absl::SleepFor(absl::Milliseconds(1));
  std::vector<std::thread> rest;
  for (int i = 1; i < kCalls; ++i) {
    rest.emplace_back([&, i] { results[i] = Report(i); });
  }
  first.join();
  for (std::thread& t : rest) t.join();
  EXPECT_EQ(Rounds(), (std::vector<int>{1, kCalls - 1}));
  for (int i = 0; i < kCalls; ++i) {
    if (i % 2 == 0) {
      EXPECT_TRUE(results[i].ok()) << i << ": " << results[i].error_message();
    } else {
      EXPECT_EQ(results[i].error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_EQ(results[i].error_message(), "node " + std::to_string(i));
    }
  }
}

// After Close a call is answered at once, UNAVAILABLE, by no round.
TEST_F(CallBatcherTest, ACallAfterCloseIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Start(0));
  EXPECT_TRUE(Report(2).ok());
  batcher_->Close();
  const grpc::Status late = Report(4);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Rounds(), (std::vector<int>{1}));
}

}  // namespace
}  // namespace ps
