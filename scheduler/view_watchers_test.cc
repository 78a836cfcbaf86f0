#include "scheduler/view_watchers.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/cluster_state.h"

namespace ps {
namespace {

constexpr char kConfig[] = R"pb(
  cluster {
    num_servers: 1
    num_workers: 64
    num_slots: 8
    heartbeat_interval_ms: 100
    heartbeat_timeout_ms: 1000
  }
)pb";

// Long enough never to expire on a loaded machine, short enough that a
// broken wake-up fails the test instead of hanging it.
constexpr absl::Duration kLongWait = absl::Seconds(20);

// One poll: its request, the answer and whether (and when) it came.
struct Poll {
  GetClusterViewRequest request;
  ClusterView response;
  absl::Notification done;
  absl::Time answered;
};

class ViewWatchersTest : public ::testing::Test {
 protected:
  ViewWatchersTest() {
    absl::StatusOr<JobConfig> config = ParseJobConfig(kConfig, "test");
    EXPECT_TRUE(config.ok()) << config.status();
    config_ = *config;
    state_ = std::make_unique<ClusterState>(config_, Clock::Real());
    watchers_ = std::make_unique<ViewWatchers>(state_.get());
  }
  ~ViewWatchersTest() override {
    watchers_.reset();
    state_.reset();
  }

  uint64_t Register(Role role) {
    RegisterRequest request;
    request.set_role(role);
    if (role == SERVER) request.set_data_endpoint("tcp://s:1");
    request.set_host("testhost");
    request.set_pid(1);
    request.set_config_fingerprint(ConfigFingerprint(config_));
    absl::StatusOr<RegisterResponse> r = state_->Register(request);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->node_id() : 0;
  }

  // The poll is owned by the fixture, which outlives the watchers: Close
  // (at the latest in the fixture's destructor) answers into it.
  Poll* Watch(uint64_t min_epoch, uint64_t known_epoch, int timeout_ms = 20000,
              bool wait_for_running = false) {
    polls_.push_back(std::make_unique<Poll>());
    Poll* poll = polls_.back().get();
    poll->request.set_min_epoch(min_epoch);
    poll->request.set_known_epoch(known_epoch);
    poll->request.set_timeout_ms(timeout_ms);
    poll->request.set_wait_for_running(wait_for_running);
    Poll* p = poll;
    watchers_->Watch(p->request, &p->response, [p] {
      p->answered = absl::Now();
      p->done.Notify();
    });
    return poll;
  }

  std::vector<std::unique_ptr<Poll>> polls_;
  JobConfig config_;
  std::unique_ptr<ClusterState> state_;
  std::unique_ptr<ViewWatchers> watchers_;
};

TEST_F(ViewWatchersTest, AReadyViewIsAnsweredAtOnceOnTheCallersThread) {
  Register(SERVER);
  const uint64_t epoch = state_->Head().epoch;
  Poll* poll = Watch(epoch, 0);
  EXPECT_TRUE(poll->done.HasBeenNotified());
  EXPECT_EQ(poll->response.epoch(), epoch);
  EXPECT_EQ(watchers_->Waiting(), 0u);
}

TEST_F(ViewWatchersTest, WaitingPollsAreAnsweredWithDeltasWhenTheEpochComes) {
  Register(SERVER);
  const uint64_t known = state_->Head().epoch;
  std::vector<Poll*> polls;
  for (int i = 0; i < 50; ++i) polls.push_back(Watch(known + 1, known));
  // Polls for a later epoch stay.
  Poll* later = Watch(known + 2, known);
  EXPECT_EQ(watchers_->Waiting(), 51u);
  for (const auto& p : polls) EXPECT_FALSE(p->done.HasBeenNotified());

  const uint64_t worker = Register(WORKER);
  for (const auto& p : polls) {
    ASSERT_TRUE(p->done.WaitForNotificationWithTimeout(kLongWait));
    EXPECT_EQ(p->response.epoch(), known + 1);
    EXPECT_EQ(p->response.delta_from(), known);
    ASSERT_EQ(p->response.nodes_size(), 1);
    EXPECT_EQ(p->response.nodes(0).node_id(), worker);
  }
  EXPECT_FALSE(later->done.HasBeenNotified());
  EXPECT_EQ(watchers_->Waiting(), 1u);
}

TEST_F(ViewWatchersTest, APollWhoseTimeoutPassesGetsTheCurrentView) {
  Register(SERVER);
  const uint64_t epoch = state_->Head().epoch;
  const absl::Time start = absl::Now();
  Poll* poll = Watch(epoch + 1, 0, /*timeout_ms=*/200);
  // A later poll with an earlier deadline wakes the dispatcher for it.
  Poll* soon = Watch(epoch + 1, 0, /*timeout_ms=*/50);
  ASSERT_TRUE(soon->done.WaitForNotificationWithTimeout(kLongWait));
  ASSERT_TRUE(poll->done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_EQ(poll->response.epoch(), epoch);
  EXPECT_GE(poll->answered - start, absl::Milliseconds(190));
  EXPECT_GE(soon->answered - start, absl::Milliseconds(40));
  EXPECT_LT(soon->answered, poll->answered);
}

TEST_F(ViewWatchersTest, WaitForRunningWaitsPastEpochsOfAStartingJob) {
  // 2 servers are needed for this one: the job stays STARTING with one.
  absl::StatusOr<JobConfig> config = ParseJobConfig(
      R"pb(cluster { num_servers: 2 num_workers: 1 num_slots: 8 })pb", "test");
  ASSERT_TRUE(config.ok());
  config_ = *config;
  watchers_.reset();
  state_ = std::make_unique<ClusterState>(config_, Clock::Real());
  watchers_ = std::make_unique<ViewWatchers>(state_.get());
  Register(SERVER);
  Poll* running = Watch(0, 0, 20000, /*wait_for_running=*/true);
  Poll* any = Watch(state_->Head().epoch + 1, 0);
  Register(WORKER);
  ASSERT_TRUE(any->done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_EQ(any->response.job_state(), STARTING);
  EXPECT_FALSE(running->done.HasBeenNotified());
  Register(SERVER);
  ASSERT_TRUE(running->done.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_EQ(running->response.job_state(), RUNNING);
}

TEST_F(ViewWatchersTest, CloseAnswersEveryWaitingPollAndLaterOnesAtOnce) {
  Register(SERVER);
  const uint64_t epoch = state_->Head().epoch;
  Poll* a = Watch(epoch + 5, 0);
  Poll* b = Watch(epoch + 9, epoch);
  watchers_->Close();
  EXPECT_TRUE(a->done.HasBeenNotified());
  EXPECT_TRUE(b->done.HasBeenNotified());
  EXPECT_EQ(a->response.epoch(), epoch);
  Poll* c = Watch(epoch + 5, 0);
  EXPECT_TRUE(c->done.HasBeenNotified());
  EXPECT_EQ(watchers_->Waiting(), 0u);
}

// Many changes while many polls wait: every poll is answered exactly once
// with an epoch at least the one it asked for, and re-polling nodes end at
// the last epoch (no change is lost between a poll's look and its record).
TEST_F(ViewWatchersTest, AStormOfChangesLosesNoPollAndAnswersEachOnce) {
  Register(SERVER);
  constexpr int kNodes = 40;
  constexpr int kChanges = 60;
  std::vector<std::atomic<uint64_t>> seen(kNodes);
  std::vector<std::atomic<int>> answers(kNodes);
  struct Node {
    GetClusterViewRequest request;
    ClusterView response;
  };
  std::vector<Node> nodes(kNodes);
  std::atomic<bool> closing{false};
  std::function<void(int)> poll = [&](int i) {
    nodes[i].request.set_min_epoch(seen[i].load() + 1);
    nodes[i].request.set_known_epoch(seen[i].load());
    nodes[i].request.set_timeout_ms(20000);
    watchers_->Watch(nodes[i].request, &nodes[i].response, [&, i] {
      // Close answers with the current view, whatever was asked.
      if (!closing.load()) {
        EXPECT_GE(nodes[i].response.epoch(), nodes[i].request.min_epoch());
      }
      seen[i].store(nodes[i].response.epoch());
      answers[i].fetch_add(1);
    });
  };
  // Each node re-polls from its own thread as the answer arrives.
  std::vector<std::thread> threads;
  std::atomic<bool> stop{false};
  for (int i = 0; i < kNodes; ++i) {
    threads.emplace_back([&, i] {
      while (!stop.load()) {
        const int before = answers[i].load();
        poll(i);
        while (answers[i].load() == before && !stop.load()) {
          absl::SleepFor(absl::Microseconds(200));
        }
      }
    });
  }
  for (int c = 0; c < kChanges; ++c) Register(WORKER);
  const uint64_t last = state_->Head().epoch;
  const absl::Time deadline = absl::Now() + kLongWait;
  for (int i = 0; i < kNodes; ++i) {
    while (seen[i].load() < last && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_EQ(seen[i].load(), last) << "node " << i;
  }
  stop.store(true);
  // The polls still waiting (for last + 1) are answered by Close.
  closing.store(true);
  watchers_->Close();
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace ps
