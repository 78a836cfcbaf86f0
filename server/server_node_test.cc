// In-process: a scheduler on port 0 and two ServerNodes, with a worker
// session where the job needs one.
#include "server/server_node.h"

#include <atomic>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/protocol.h"
#include "scheduler/scheduler.h"
#include "worker/session.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

std::string TempDir(const std::string &name) {
  const char *base = std::getenv("TEST_TMPDIR");
  return absl::StrCat(base != nullptr ? base : "/tmp", "/", name, "-",
                      absl::ToUnixNanos(absl::Now()));
}

// `elastic`: spares may join (cluster.elastic, up to 3 servers).
// `sparse`: more fields of the sparse table's block.
JobConfig Config(const std::string& checkpoint_dir, bool elastic = false,
                 const std::string& sparse = "") {
  auto config = ParseJobConfig(
      absl::StrCat(
          R"pb(
            name: "server-node-test"
            cluster { num_servers: 2 num_workers: 1 num_slots: 64
                      heartbeat_interval_ms: 100
                      heartbeat_timeout_ms: 5000)pb",
          elastic ? " elastic { max_servers: 3 }" : "",
          R"pb(}
               consistency { mode: ASYNC }
        tables { id: 0 name: "emb" sparse { dim: 2 )pb",
          sparse, R"pb(}
                       optimizer { sgd { learning_rate: 1 } } }
      )pb",
          checkpoint_dir.empty()
              ? std::string()
              : absl::StrCat("checkpoint { dir: \"", checkpoint_dir, "\" }")),
      "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

class ServerNodeTest : public ::testing::Test {
protected:
  void StartScheduler(const JobConfig &config, Clock *clock = Clock::Real(),
                      bool detect_failures = true) {
    config_ = config;
    SchedulerServer::Options o;
    o.config = config;
    o.clock = clock;
    o.run_failure_detector = detect_failures;
    auto s = SchedulerServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = *std::move(s);
  }

  ServerNode::Options NodeOptions() const {
    ServerNode::Options o;
    o.config = config_;
    o.scheduler = scheduler_->address();
    o.own_process = false;
    o.http_port = 0;
    return o;
  }

  std::unique_ptr<ServerNode> StartNode(ServerNode::Options o) {
    auto node = ServerNode::Start(std::move(o));
    EXPECT_TRUE(node.ok()) << node.status();
    return node.ok() ? *std::move(node) : nullptr;
  }

  std::unique_ptr<WorkerSession> StartWorker() {
    WorkerSession::Options o;
    o.config = config_;
    o.scheduler = scheduler_->address();
    o.trains_shards = false;
    o.stop_check = absl::Milliseconds(100);
    auto session = WorkerSession::Start(std::move(o));
    EXPECT_TRUE(session.ok()) << session.status();
    return session.ok() ? *std::move(session) : nullptr;
  }

  // Whether the scheduler counts the server of rank `rank` alive.
  bool ServerAlive(uint32_t rank) {
    const ClusterView view = scheduler_->state()->View();
    for (const NodeInfo &n : view.nodes()) {
      if (n.role() == SERVER && n.rank() == rank && n.state() == ALIVE)
        return true;
    }
    return false;
  }

  void TearDown() override {
    if (scheduler_ != nullptr)
      scheduler_->state()->Close();
  }

  JobConfig config_;
  std::unique_ptr<SchedulerServer> scheduler_;
};

// Pushes `value` to key `key` and reads it back through `s`.
absl::Status PushAndPull(WorkerSession &s, uint64_t key, float value,
                         float *read) {
  const std::vector<uint64_t> keys = {key};
  const std::vector<float> grads = {-value, -value};
  absl::Status status;
  if (!s.kv()->Push(0, keys, grads).WaitFor(absl::Seconds(10), &status)) {
    return absl::DeadlineExceededError("push unanswered within 10 s");
  }
  if (!status.ok())
    return status;
  std::vector<float> rows(2);
  if (!s.kv()->Pull(0, keys, rows.data()).WaitFor(absl::Seconds(10), &status)) {
    return absl::DeadlineExceededError("pull unanswered within 10 s");
  }
  *read = rows[0];
  return status;
}

TEST_F(ServerNodeTest, RegistersAndServesTheViewItIsGiven) {
  StartScheduler(Config(""));
  auto a = StartNode(NodeOptions());
  auto b = StartNode(NodeOptions());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a->rank(), b->rank());
  EXPECT_LT(a->rank(), 2u);
  EXPECT_LT(b->rank(), 2u);
  EXPECT_EQ(a->endpoint(), a->server().endpoint());
  ASSERT_NE(a->http(), nullptr);
  EXPECT_GT(a->http()->port(), 0);
  EXPECT_TRUE(ServerAlive(0));
  EXPECT_TRUE(ServerAlive(1));

  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  // Requests are answered only once the view with a slot map reached the
  // servers; keys of both servers' slots.
  for (uint64_t key = 0; key < 16; ++key) {
    float read = 0;
    ASSERT_TRUE(PushAndPull(*worker, key, 1.5f, &read).ok()) << key;
    EXPECT_FLOAT_EQ(read, 1.5f);
  }
  EXPECT_EQ(a->membership().job_state(), RUNNING);
  EXPECT_GT(a->server().stats().requests + b->server().stats().requests, 0u);
  EXPECT_FALSE(a->stop_requested());
}

// A server with a disk tier reports what it holds with its heartbeats,
// for the scheduler's status page.
TEST_F(ServerNodeTest, ATieredServerReportsItsTierToTheScheduler) {
  StartScheduler(
      Config("", false,
             absl::StrCat("memory_budget_bytes: 1048576 eviction: EVICT_LRU "
                          "disk_tier { dir: \"",
                          TempDir("tier"), "\" buffered_io: true }")));
  auto a = StartNode(NodeOptions());
  auto b = StartNode(NodeOptions());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  // Some 40 000 rows a server, for a budget that holds about 20 000.
  std::vector<uint64_t> keys(80000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  const std::vector<float> grads(keys.size() * 2, 0.5f);
  absl::Status pushed;
  ASSERT_TRUE(
      worker->kv()->Push(0, keys, grads).WaitFor(absl::Seconds(30), &pushed));
  ASSERT_TRUE(pushed.ok()) << pushed;
  auto reported = [&] {
    int servers = 0;
    for (const auto& [id, node] : scheduler_->state()->Monitor().nodes) {
      servers += node.has_storage && node.storage.cold_rows() > 0 &&
                 node.storage.rows_in_ram() > 0 &&
                 node.storage.tier_memory_bytes() > 0;
    }
    return servers;
  };
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (reported() < 2 && absl::Now() < give_up)
    absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(reported(), 2);
}

TEST_F(ServerNodeTest, AdvertiseHostNamesTheBoundPort) {
  StartScheduler(Config(""));
  ServerNode::Options o = NodeOptions();
  o.advertise_host = "localhost";
  o.http_port = -1;
  auto node = StartNode(o);
  ASSERT_NE(node, nullptr);
  EXPECT_EQ(node->endpoint(),
            absl::StrCat("tcp://localhost:", node->server().port()));
  EXPECT_EQ(node->http(), nullptr);
}

TEST_F(ServerNodeTest, CheckpointReportIsSentOffTheServingThread) {
  StartScheduler(Config(TempDir("report")));
  absl::Notification held, release;
  std::atomic<int> reports{0};
  ServerNode::Options o = NodeOptions();
  // Node a's report waits until the test has been served meanwhile.
  o.before_report = [&](const ReportCheckpointRequest &) {
    if (reports.fetch_add(1) == 0) {
      held.Notify();
      release.WaitForNotificationWithTimeout(absl::Seconds(60));
    }
  };
  auto a = StartNode(o);
  auto b = StartNode(NodeOptions());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  absl::StatusOr<uint64_t> clock = worker->RequestCheckpoint();
  ASSERT_TRUE(clock.ok()) << clock.status();
  // Step only once the worker's view names the checkpoint: a worker that
  // passes its clock first makes the scheduler abandon it and retry later
  // (seen on a loaded machine), and this test is about the first one.
  const absl::Time seen_by = absl::Now() + absl::Seconds(30);
  while (worker->membership()->view().checkpoint_clock() != *clock &&
         absl::Now() < seen_by) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(worker->membership()->view().checkpoint_clock(), *clock);
  while (worker->clock() <= *clock) {
    ASSERT_TRUE(worker->EndStep().WaitFor(absl::Seconds(10)));
  }
  ASSERT_TRUE(held.WaitForNotificationWithTimeout(absl::Seconds(30)));
  // The report is stuck in flight; the serving thread answers regardless,
  // and the checkpoint is not committed without it.
  for (uint64_t key = 0; key < 16; ++key) {
    float read = 0;
    ASSERT_TRUE(PushAndPull(*worker, key, 1.0f, &read).ok()) << key;
  }
  EXPECT_EQ(worker->EndStep().Wait(), absl::OkStatus());
  EXPECT_LT(scheduler_->state()->View().last_checkpoint_clock(), *clock);
  EXPECT_GT(a->server().stats().checkpoints_written, 0u);
  release.Notify();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (scheduler_->state()->View().last_checkpoint_clock() < *clock &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(scheduler_->state()->View().last_checkpoint_clock(), *clock);
}

TEST_F(ServerNodeTest, PreemptedNodeCheckpointsReportsAndLeaves) {
  StartScheduler(Config(TempDir("preempt")));
  auto a = StartNode(NodeOptions());
  auto b = StartNode(NodeOptions());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  // The worker steps on until told to stop, slowly enough that it learns
  // of the checkpoint before passing its clock (else the scheduler moves
  // it on); its steps past the checkpoint wait for node a, which stopped,
  // so every wait is bounded.
  std::atomic<bool> stop{false};
  std::thread steps([&] {
    while (!stop.load()) {
      absl::SleepFor(absl::Milliseconds(200));
      Completion step = worker->EndStep();
      while (!stop.load() && !step.WaitFor(absl::Milliseconds(50))) {
      }
    }
  });
  const uint32_t rank = a->rank();
  a->RequestStop();
  EXPECT_EQ(a->Run(), ServerNode::Exit::kLeft);
  stop.store(true);
  steps.join();
  EXPECT_TRUE(a->server().stopped());
  EXPECT_EQ(a->server().stats().checkpoints_written, 1u);
  // The report went out before the leave: the checkpoint was committed.
  EXPECT_GT(scheduler_->state()->View().last_checkpoint_clock(), 0u);
  EXPECT_FALSE(ServerAlive(rank));
}

// A spare owns no slot: stopped while the job runs, it leaves at once,
// without asking for a checkpoint.
TEST_F(ServerNodeTest, ASpareLeavesWithoutACheckpoint) {
  StartScheduler(Config(TempDir("spare"), /*elastic=*/true));
  auto a = StartNode(NodeOptions());
  auto b = StartNode(NodeOptions());
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  auto spare = StartNode(NodeOptions());
  ASSERT_NE(spare, nullptr);
  EXPECT_EQ(spare->rank(), 2u);
  spare->RequestStop();
  EXPECT_EQ(spare->Run(), ServerNode::Exit::kLeft);
  EXPECT_EQ(spare->server().stats().checkpoints_written, 0u);
  const ClusterView view = scheduler_->state()->View();
  EXPECT_EQ(view.checkpoint_clock(), 0u);
  EXPECT_EQ(view.last_checkpoint_clock(), 0u);
  EXPECT_FALSE(ServerAlive(2));
  EXPECT_EQ(view.job_state(), RUNNING);
}

TEST_F(ServerNodeTest, CheckpointWaitIsTimedByTheInjectedClock) {
  StartScheduler(Config(TempDir("timed")));
  FakeClock clock;
  ServerNode::Options o = NodeOptions();
  o.clock = &clock;
  auto a = StartNode(o);
  auto b = StartNode(NodeOptions());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // A worker that never steps: the checkpoint's clock is never reached.
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  const uint32_t rank = a->rank();
  auto left = std::async(std::launch::async,
                         [&] { return a->Leave(/*preempted=*/true); });
  const absl::Time start = absl::Now();
  while (left.wait_for(std::chrono::milliseconds(20)) !=
         std::future_status::ready) {
    clock.Advance(absl::Seconds(5));
  }
  EXPECT_EQ(left.get(), ServerNode::Exit::kLeft);
  // 60 s of the fake clock took far less of the real one.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_EQ(a->server().stats().checkpoints_written, 0u);
  EXPECT_TRUE(a->server().stopped());
  EXPECT_FALSE(ServerAlive(rank));
}

TEST_F(ServerNodeTest, FinishedJobIsLeftWithoutCheckpoint) {
  StartScheduler(Config(TempDir("finish")));
  auto a = StartNode(NodeOptions());
  auto b = StartNode(NodeOptions());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto worker = StartWorker();
  ASSERT_NE(worker, nullptr);
  ASSERT_TRUE(worker->Leave(/*finished=*/true).ok());
  auto run = std::async(std::launch::async, [&] { return a->Run(); });
  ASSERT_EQ(run.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(run.get(), ServerNode::Exit::kLeft);
  EXPECT_EQ(a->server().stats().checkpoints_written, 0u);
  EXPECT_TRUE(a->server().stopped());
}

TEST_F(ServerNodeTest, DroppedNodeIsFencedAndExitsThree) {
  FakeClock scheduler_clock(absl::Now());
  StartScheduler(Config(""), &scheduler_clock, /*detect_failures=*/false);
  auto a = StartNode(NodeOptions());
  ASSERT_NE(a, nullptr);
  // Past the heartbeat timeout on the scheduler's clock. a is the only
  // node, so its silence is first held as the scheduler's suspected
  // isolation (cluster.isolation_hold_ms, at most
  // scheduler_unreachable_timeout_ms); past that too, a is declared dead
  // and its next heartbeat is answered NOT_FOUND.
  scheduler_clock.Advance(absl::Seconds(10));
  scheduler_->state()->ExpireSilentNodes();
  scheduler_clock.Advance(absl::Hours(1));
  scheduler_->state()->ExpireSilentNodes();
  auto run = std::async(std::launch::async, [&] { return a->Run(); });
  ASSERT_EQ(run.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(run.get(), ServerNode::Exit::kDropped);
  EXPECT_TRUE(a->membership().lost());
  EXPECT_TRUE(a->server().stopped());
}

} // namespace
} // namespace ps
