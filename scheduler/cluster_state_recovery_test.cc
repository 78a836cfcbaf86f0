// ClusterState: data shards of lost workers (REASSIGN, SKIP_REST) and the
// coordination of consistent checkpoints, with a fake clock and a fake
// checkpoint store.
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/protocol.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/status.h"
#include "proto/checkpoint.pb.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/cluster_state.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

constexpr char kConfig[] = R"pb(
  cluster {
    num_servers: 2
    num_workers: 2
    num_slots: 8
    heartbeat_interval_ms: 100
    heartbeat_timeout_ms: 1000
  }
  checkpoint { dir: "/ckpt" interval_steps: 100 }
)pb";

DataPosition Position(uint32_t shard, uint64_t epoch, uint64_t batch) {
  DataPosition p;
  p.set_shard(shard);
  p.set_epoch(epoch);
  p.set_batch(batch);
  return p;
}

class RecoveryTest : public ::testing::Test {
 protected:
  void Start(WorkerLossPolicy policy = REASSIGN, uint32_t workers = 2) {
    auto config = ParseJobConfig(kConfig, "test");
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    config_.mutable_cluster()->set_on_worker_loss(policy);
    config_.mutable_cluster()->set_num_workers(workers);
    ClusterState::CheckpointStore store;
    store.commit = [this](const std::string& dir, const CheckpointManifest& m) {
      committed_dirs_.push_back(dir);
      committed_.push_back(m);
      return commit_status_;
    };
    state_ = std::make_unique<ClusterState>(config_, &clock_, store);
  }

  RegisterResponse Register(Role role, bool trains_shards = true) {
    RegisterRequest r;
    r.set_role(role);
    if (role == SERVER) r.set_data_endpoint(absl::StrCat("tcp://s:", ++port_));
    r.set_config_fingerprint(ConfigFingerprint(config_));
    r.set_trains_shards(trains_shards);
    auto response = state_->Register(r);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : RegisterResponse();
  }

  void Beat(uint64_t id, uint64_t clock, const DataPosition* position = nullptr) {
    HeartbeatRequest h;
    h.set_node_id(id);
    h.set_clock(clock);
    if (position != nullptr) *h.mutable_position() = *position;
    ASSERT_TRUE(state_->Heartbeat(h).ok());
  }

  absl::StatusOr<ClaimShardResponse> Claim(uint64_t id,
                                           const DataPosition* finished = nullptr) {
    ClaimShardRequest r;
    r.set_node_id(id);
    if (finished != nullptr) *r.mutable_finished() = *finished;
    return state_->ClaimShard(r, absl::ZeroDuration());
  }

  absl::Status Leave(uint64_t id, bool finished, const DataPosition* position = nullptr) {
    LeaveRequest r;
    r.set_node_id(id);
    r.set_finished(finished);
    if (position != nullptr) *r.mutable_position() = *position;
    return state_->Leave(r);
  }

  // Two servers and two shard-training workers; returns the ids.
  struct Job {
    uint64_t s0, s1, w0, w1;
  };
  Job StartJob() {
    Job j;
    j.s0 = Register(SERVER).node_id();
    j.s1 = Register(SERVER).node_id();
    RegisterResponse r0 = Register(WORKER);
    RegisterResponse r1 = Register(WORKER);
    EXPECT_TRUE(r0.has_shard());
    EXPECT_EQ(r0.shard().shard(), 0u);
    EXPECT_EQ(r1.shard().shard(), 1u);
    j.w0 = r0.node_id();
    j.w1 = r1.node_id();
    return j;
  }

  NodeInfo NodeInfoOf(uint64_t id) const {
    const ClusterView view = state_->View();
    for (const NodeInfo& n : view.nodes()) {
      if (n.node_id() == id) return n;
    }
    ADD_FAILURE() << "node " << id << " not in the view";
    return NodeInfo();
  }

  JobConfig config_;
  FakeClock clock_;
  std::unique_ptr<ClusterState> state_;
  int port_ = 0;
  std::vector<std::string> committed_dirs_;
  std::vector<CheckpointManifest> committed_;
  absl::Status commit_status_;
};

TEST_F(RecoveryTest, APreemptedWorkersShardGoesToTheNextWorkerThatAsks) {
  Start();
  const Job j = StartJob();
  const DataPosition at = Position(1, 0, 37);
  ASSERT_TRUE(Leave(j.w1, /*finished=*/false, &at).ok());
  EXPECT_EQ(state_->job_state(), RUNNING);
  // w0 finishes its own shard and is handed the rest of shard 1.
  const DataPosition done0 = Position(0, 1, 0);
  Beat(j.w0, 50);
  auto claim = Claim(j.w0, &done0);
  ASSERT_TRUE(claim.ok()) << claim.status();
  EXPECT_EQ(claim->result(), ClaimShardResponse::ASSIGNED);
  EXPECT_EQ(claim->shard().shard(), 1u);
  EXPECT_EQ(claim->shard().batch(), 37u);
  EXPECT_EQ(claim->start_clock(), 50u);
  // Nothing left to give, but shard 1 is still being trained (by w0).
  claim = Claim(j.w0);
  ASSERT_TRUE(claim.ok());
  EXPECT_EQ(claim->result(), ClaimShardResponse::WAIT);
}

TEST_F(RecoveryTest, AReplacementWorkerResumesTheShardOfTheRankItTakes) {
  Start();
  const Job j = StartJob();
  const DataPosition at = Position(1, 2, 5);
  Beat(j.w1, 20, &at);
  clock_.Advance(absl::Milliseconds(900));
  Beat(j.w0, 30);
  Beat(j.s0, 0);
  Beat(j.s1, 0);
  clock_.Advance(absl::Milliseconds(200));
  state_->ExpireSilentNodes();  // w1 is dead; its shard waits at epoch 2 batch 5
  const RegisterResponse r = Register(WORKER);
  EXPECT_EQ(r.rank(), 1u);
  ASSERT_TRUE(r.has_shard());
  EXPECT_EQ(r.shard().shard(), 1u);
  EXPECT_EQ(r.shard().epoch(), 2u);
  EXPECT_EQ(r.shard().batch(), 5u);
  EXPECT_EQ(NodeInfoOf(r.node_id()).start_clock(), 30u);
}

TEST_F(RecoveryTest, TheJobEndsOnlyWhenEveryShardIsDone) {
  Start();
  const Job j = StartJob();
  const DataPosition at = Position(1, 0, 3);
  ASSERT_TRUE(Leave(j.w1, false, &at).ok());
  ASSERT_TRUE(Leave(j.w0, true).ok());
  // Shard 1 is orphaned: no worker is left, but the job is not over.
  EXPECT_EQ(state_->job_state(), RUNNING);
  const RegisterResponse r = Register(WORKER);
  EXPECT_EQ(r.shard().shard(), 1u);
  EXPECT_EQ(r.shard().batch(), 3u);
  auto claim = Claim(r.node_id(), &r.shard());
  ASSERT_TRUE(claim.ok());
  EXPECT_EQ(claim->result(), ClaimShardResponse::ALL_DONE);
  ASSERT_TRUE(Leave(r.node_id(), true).ok());
  EXPECT_EQ(state_->job_state(), FINISHED);
}

TEST_F(RecoveryTest, SkipRestDropsTheRestOfALostShard) {
  Start(SKIP_REST);
  const Job j = StartJob();
  const DataPosition at = Position(1, 0, 3);
  ASSERT_TRUE(Leave(j.w1, false, &at).ok());
  const DataPosition done0 = Position(0, 1, 0);
  auto claim = Claim(j.w0, &done0);
  ASSERT_TRUE(claim.ok());
  EXPECT_EQ(claim->result(), ClaimShardResponse::ALL_DONE);
  ASSERT_TRUE(Leave(j.w0, true).ok());
  EXPECT_EQ(state_->job_state(), FINISHED);
}

TEST_F(RecoveryTest, ToolsThatTrainNoShardsEndTheJobAsBefore) {
  Start();
  Register(SERVER);
  Register(SERVER);
  const uint64_t a = Register(WORKER, /*trains_shards=*/false).node_id();
  const uint64_t b = Register(WORKER, /*trains_shards=*/false).node_id();
  ASSERT_TRUE(Leave(a, true).ok());
  ASSERT_TRUE(Leave(b, false).ok());
  EXPECT_EQ(state_->job_state(), FINISHED);
}

TEST_F(RecoveryTest, ARestartedWorkersClockCountsAgain) {
  Start();
  const Job j = StartJob();
  Beat(j.w1, 40);
  Beat(j.w0, kFinishedClock);
  ASSERT_TRUE(Leave(j.w1, false).ok());
  const DataPosition done0 = Position(0, 1, 0);
  auto claim = Claim(j.w0, &done0);
  ASSERT_TRUE(claim.ok());
  ASSERT_EQ(claim->result(), ClaimShardResponse::ASSIGNED);
  // Nobody is training: it restarts where the job got to, not at 0.
  EXPECT_EQ(claim->start_clock(), 40u);
  Beat(j.w0, 45);
  GetStatusResponse status = state_->Status();
  ASSERT_EQ(status.clocks_size(), 1);
  EXPECT_EQ(status.clocks(0).clock(), 45u);
}

TEST_F(RecoveryTest, ALateReplacementIsNotMistakenForTheDeadHolderOfItsRank) {
  Start();
  const Job j = StartJob();
  auto first = state_->AwaitBarrier(j.w1, "train_done", absl::ZeroDuration());
  auto released = state_->AwaitBarrier(j.w0, "train_done", absl::ZeroDuration());
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(*released, (std::vector<uint32_t>{0, 1}));
  (void)first;
  // Rank 0 dies (e.g. while evaluating); a replacement takes rank 0 and
  // arrives after the release: it is told only rank 1 was there.
  ASSERT_TRUE(Leave(j.w0, /*finished=*/false).ok());
  const RegisterResponse r = Register(WORKER);
  ASSERT_EQ(r.rank(), 0u);
  auto late = state_->AwaitBarrier(r.node_id(), "train_done", absl::ZeroDuration());
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(*late, (std::vector<uint32_t>{1}));
}

// The evaluator (rank 0) evaluates and leaves finished before another
// worker's barrier answer is computed (8-worker jobs did this): that worker
// must still be told rank 0 was there, or it evaluates a second time.
TEST_F(RecoveryTest, AWorkerThatLeftFinishedStillCountsAtTheBarrier) {
  Start();
  const Job j = StartJob();
  auto first = state_->AwaitBarrier(j.w1, "train_done", absl::ZeroDuration());
  auto released = state_->AwaitBarrier(j.w0, "train_done", absl::ZeroDuration());
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(*released, (std::vector<uint32_t>{0, 1}));
  (void)first;
  ASSERT_TRUE(Leave(j.w0, /*finished=*/true).ok());
  auto late = state_->AwaitBarrier(j.w1, "train_done", absl::ZeroDuration());
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(*late, (std::vector<uint32_t>{0, 1}));
}

// ------------------------------------------------------------ checkpoints

// A worker asking from its training loop is ahead of what its heartbeats
// said: the checkpoint goes after its own clock, and a pending one it has
// passed is replaced.
TEST_F(RecoveryTest, ACheckpointIsPlacedAfterTheRequestersClock) {
  Start();
  const Job j = StartJob();
  Beat(j.w0, 10);
  Beat(j.w1, 12);
  auto first = state_->StartCheckpoint();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_GT(*first, 12u);
  // Asked again by a worker that has not reached it: the same checkpoint.
  auto same = state_->StartCheckpoint(*first - 1);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(*same, *first);
  // Asked by a worker already at clock 40 (its heartbeat said 12).
  auto later = state_->StartCheckpoint(40);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_GT(*later, 40u);
  EXPECT_EQ(state_->View().checkpoint_clock(), *later);
}

TEST_F(RecoveryTest, ACheckpointCommitsOnceEveryServerAndTrainingWorkerReported) {
  Start();
  const Job j = StartJob();
  Beat(j.w0, 10);
  Beat(j.w1, 12);
  auto clock = state_->StartCheckpoint();
  ASSERT_TRUE(clock.ok()) << clock.status();
  EXPECT_GT(*clock, 12u);
  EXPECT_EQ(state_->View().checkpoint_clock(), *clock);

  auto report = [&](uint64_t id, bool server, const DataPosition* p = nullptr) {
    ReportCheckpointRequest r;
    r.set_node_id(id);
    r.set_clock(*clock);
    r.set_ok(true);
    if (server) {
      r.set_file(absl::StrCat("shard-", id == j.s0 ? 0 : 1, ".ckpt"));
      r.set_bytes(100);
      r.set_checksum(7);
    }
    if (p != nullptr) *r.mutable_position() = *p;
    return state_->ReportCheckpoint(r);
  };
  ASSERT_TRUE(report(j.s0, true).ok());
  ASSERT_TRUE(report(j.s1, true).ok());
  const DataPosition p0 = Position(0, 0, 20), p1 = Position(1, 0, 21);
  ASSERT_TRUE(report(j.w0, false, &p0).ok());
  EXPECT_TRUE(committed_.empty()) << "w1 has not reported";
  ASSERT_TRUE(report(j.w1, false, &p1).ok());
  ASSERT_EQ(committed_.size(), 1u);
  const CheckpointManifest& m = committed_[0];
  EXPECT_EQ(m.clock(), *clock);
  EXPECT_EQ(m.num_servers(), 2u);
  ASSERT_EQ(m.shards_size(), 2);
  EXPECT_EQ(m.shards(0).rank(), 0u);
  EXPECT_EQ(m.shards(1).file(), "shard-1.ckpt");
  ASSERT_EQ(m.positions_size(), 2);
  EXPECT_EQ(m.positions(0).batch(), 20u);
  EXPECT_EQ(m.positions(1).batch(), 21u);
  EXPECT_THAT(committed_dirs_[0], HasSubstr("/ckpt/ckpt-"));
  const ClusterView view = state_->View();
  EXPECT_EQ(view.checkpoint_clock(), 0u);
  EXPECT_EQ(view.last_checkpoint_clock(), *clock);
  // A late report for it is stale.
  EXPECT_EQ(report(j.s0, true).code(), absl::StatusCode::kFailedPrecondition);
}

// Reports arriving together (a fleet's nodes see the checkpoint in the
// same view) are all taken, and the checkpoint commits once, when the last
// is in.
TEST_F(RecoveryTest, ConcurrentReportsAllCountAndTheCheckpointCommitsOnce) {
  Start(REASSIGN, /*workers=*/16);
  const Job j = StartJob();
  std::vector<uint64_t> workers = {j.w0, j.w1};
  for (int i = 0; i < 14; ++i) workers.push_back(Register(WORKER).node_id());
  auto clock = state_->StartCheckpoint();
  ASSERT_TRUE(clock.ok()) << clock.status();
  std::vector<uint64_t> reporters = workers;
  reporters.push_back(j.s0);
  reporters.push_back(j.s1);
  std::vector<absl::Status> results(reporters.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reporters.size(); ++i) {
    threads.emplace_back([&, i] {
      const uint64_t id = reporters[i];
      ReportCheckpointRequest r;
      r.set_node_id(id);
      r.set_clock(*clock);
      r.set_ok(true);
      if (id == j.s0 || id == j.s1) {
        r.set_file(absl::StrCat("shard-", id == j.s0 ? 0 : 1, ".ckpt"));
        r.set_bytes(100);
      } else {
        // Workers registered in rank order, each with the shard of its rank.
        *r.mutable_position() = Position(static_cast<uint32_t>(i), 0, 30 + i);
      }
      results[i] = state_->ReportCheckpoint(r);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& r : results) EXPECT_TRUE(r.ok()) << r;
  ASSERT_EQ(committed_.size(), 1u);
  EXPECT_EQ(committed_[0].shards_size(), 2);
  ASSERT_EQ(committed_[0].positions_size(), 16);
  for (uint32_t k = 0; k < 16; ++k) {
    EXPECT_EQ(committed_[0].positions(k).batch(), 30u + k);
  }
  EXPECT_EQ(state_->View().last_checkpoint_clock(), *clock);
  EXPECT_EQ(state_->View().checkpoint_clock(), 0u);
}

TEST_F(RecoveryTest, ANodeTooLateAbandonsTheCheckpointAndItIsRetriedFurtherAhead) {
  Start();
  const Job j = StartJob();
  Beat(j.w0, 10);
  Beat(j.w1, 10);
  auto first = state_->StartCheckpoint();
  ASSERT_TRUE(first.ok());
  ReportCheckpointRequest late;
  late.set_node_id(j.s1);
  late.set_clock(*first);
  late.set_ok(false);
  late.set_error("already applied step 13");
  ASSERT_TRUE(state_->ReportCheckpoint(late).ok());
  EXPECT_EQ(state_->View().checkpoint_clock(), 0u);
  EXPECT_TRUE(committed_.empty());
  // The periodic check starts it again, with a larger margin.
  std::vector<std::string> lines = state_->CheckCheckpoints();
  ASSERT_EQ(lines.size(), 1u);
  const uint64_t second = state_->View().checkpoint_clock();
  EXPECT_GT(second - 10, *first - 10);
}

// The workers' pace, not the margin, sets how far ahead a fast job's
// checkpoint goes, and no heartbeat came between the refusal and the retry:
// the retry must still come after the abandoned clock. A server answers each
// checkpoint clock once and ignores it afterwards, so a retry at the same
// clock waited for reports that never came (seen in tests/checkpoint_test:
// the job ended before any checkpoint committed).
TEST_F(RecoveryTest, ARetryIsSetAfterTheAbandonedClockWhenThePaceSetsTheMargin) {
  Start();
  const Job j = StartJob();
  Beat(j.w0, 0);
  Beat(j.w1, 0);
  clock_.Advance(absl::Milliseconds(100));
  Beat(j.w0, 150);  // 1500 steps/s: 450 steps ahead, far above the margin
  Beat(j.w1, 150);
  auto first = state_->StartCheckpoint();
  ASSERT_TRUE(first.ok()) << first.status();
  ReportCheckpointRequest late;
  late.set_node_id(j.s0);
  late.set_clock(*first);
  late.set_ok(false);
  late.set_error("server 0 already applied pushes of step 99");
  ASSERT_TRUE(state_->ReportCheckpoint(late).ok());
  ASSERT_EQ(state_->CheckCheckpoints().size(), 1u);
  EXPECT_GT(state_->View().checkpoint_clock(), *first);
}

TEST_F(RecoveryTest, ADeadServerAbandonsTheCheckpoint) {
  Start();
  const Job j = StartJob();
  Beat(j.w0, 10);
  ASSERT_TRUE(state_->StartCheckpoint().ok());
  clock_.Advance(absl::Milliseconds(900));
  Beat(j.w0, 11);
  Beat(j.w1, 11);
  Beat(j.s0, 0);
  clock_.Advance(absl::Milliseconds(200));
  state_->ExpireSilentNodes();  // s1
  EXPECT_EQ(state_->View().checkpoint_clock(), 0u);
}

TEST_F(RecoveryTest, PeriodicCheckpointsFollowTheFastestWorker) {
  Start();
  const Job j = StartJob();
  Beat(j.w0, 50);
  EXPECT_TRUE(state_->CheckCheckpoints().empty()) << "interval is 100 steps";
  Beat(j.w0, 100);
  ASSERT_EQ(state_->CheckCheckpoints().size(), 1u);
  EXPECT_GT(state_->View().checkpoint_clock(), 100u);
  (void)j;
}

// A job that reaches its first interval within one pace window (200 ms)
// still sets the checkpoint ahead by its pace: three heartbeat intervals of
// steps. Set two steps ahead, the workers would pass it before the view
// reached them.
TEST_F(RecoveryTest, AFastJobsFirstCheckpointIsSetAheadByItsEarlyPace) {
  Start();
  const Job j = StartJob();
  Beat(j.w0, 0);
  Beat(j.w1, 0);
  clock_.Advance(absl::Milliseconds(100));
  Beat(j.w0, 150);  // 1500 steps/s
  Beat(j.w1, 140);
  ASSERT_EQ(state_->CheckCheckpoints().size(), 1u);
  // 150 + 1500 steps/s * 3 * 100 ms.
  EXPECT_GE(state_->View().checkpoint_clock(), 150u + 450u);
  EXPECT_DOUBLE_EQ(state_->Monitor().nodes[j.w0].steps_per_second, 1500);
  // A whole window later the measured pace replaces the early one.
  clock_.Advance(absl::Milliseconds(150));
  Beat(j.w0, 200);  // 200 steps in 250 ms
  EXPECT_DOUBLE_EQ(state_->Monitor().nodes[j.w0].steps_per_second, 800);
  clock_.Advance(absl::Milliseconds(200));
  Beat(j.w0, 300);  // 100 steps in the next 200 ms
  EXPECT_DOUBLE_EQ(state_->Monitor().nodes[j.w0].steps_per_second, 500);
}

TEST_F(RecoveryTest, ARestoredJobStartsAtTheCheckpointsClockAndPositions) {
  Start();
  CheckpointManifest m;
  m.set_clock(400);
  *m.add_positions() = Position(0, 1, 7);
  DataPosition done = Position(1, 2, 0);
  done.set_done(true);
  *m.add_positions() = done;
  state_->SetRestore("/ckpt/ckpt-00000000000000000400", m);
  Register(SERVER);
  Register(SERVER);
  const RegisterResponse r0 = Register(WORKER);
  EXPECT_EQ(r0.view().restore().clock(), 400u);
  ASSERT_TRUE(r0.has_shard());
  EXPECT_EQ(r0.shard().epoch(), 1u);
  EXPECT_EQ(r0.shard().batch(), 7u);
  EXPECT_EQ(NodeInfoOf(r0.node_id()).start_clock(), 400u);
  // Shard 1 was done at the checkpoint: rank 1 trains nothing.
  const RegisterResponse r1 = Register(WORKER);
  EXPECT_FALSE(r1.has_shard());
}

}  // namespace
}  // namespace ps
