// ClusterState with cluster.elastic: spares, Scale's moves through their
// phases (copy, fence, flip), what abandons them, scale-in, checkpoints
// and the journal.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/cluster_state.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint32_t kNone = ClusterState::kNoBackup;

// `servers` to start with, elastic up to 6, 12 slots, one worker.
JobConfig Config(uint32_t servers, uint32_t replication,
                 uint32_t concurrent = 0, bool elastic = true) {
  auto config = ParseJobConfig(
      absl::StrCat(R"pb(
                     checkpoint { dir: "/ckpt" }
                     cluster { num_workers: 1 num_slots: 12
                               heartbeat_interval_ms: 100
                               heartbeat_timeout_ms: 1000
                               num_servers:)pb",
                   servers, " replication: ", replication,
                   elastic ? absl::StrCat(" elastic { max_servers: 6 "
                                          "max_concurrent_moves: ",
                                          concurrent, " }")
                           : "",
                   "}"),
      "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : JobConfig();
}

class MovesTest : public ::testing::Test {
 protected:
  void Init(uint32_t servers, uint32_t replication, uint32_t concurrent = 0) {
    config_ = Config(servers, replication, concurrent);
    ClusterState::CheckpointStore store;
    store.commit = [](const std::string&, const CheckpointManifest&) {
      return absl::OkStatus();
    };
    state_ = std::make_unique<ClusterState>(config_, &clock_, store);
    ASSERT_TRUE(state_
                    ->SetJournal([this](const SchedulerJournal& j, bool) {
                      journal_ = j;
                      return absl::OkStatus();
                    })
                    .ok());
    for (uint32_t i = 0; i < servers; ++i) servers_.push_back(Add(SERVER));
    worker_ = Add(WORKER);
    ASSERT_EQ(state_->job_state(), RUNNING);
  }

  uint64_t Add(Role role) {
    RegisterRequest r;
    r.set_role(role);
    if (role == SERVER) r.set_data_endpoint(absl::StrCat("tcp://s:", ++port_));
    r.set_config_fingerprint(ConfigFingerprint(config_));
    auto response = state_->Register(r);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->node_id() : 0;
  }

  std::vector<uint32_t> Owners() const {
    const ClusterView v = state_->View();
    return {v.slot_owner().begin(), v.slot_owner().end()};
  }
  std::vector<uint32_t> Backups() const {
    const ClusterView v = state_->View();
    return {v.slot_backup().begin(), v.slot_backup().end()};
  }

  absl::Status Report(uint64_t node, const SlotMove& m,
                      ReportMoveRequest::Stage stage, uint64_t epoch) {
    ReportMoveRequest r;
    r.set_node_id(node);
    r.set_source(m.source());
    r.set_target(m.target());
    r.set_stage(stage);
    r.set_epoch(epoch);
    r.set_rows_copied(10);
    r.set_error("digests differ");
    return state_->ReportMove(r);
  }

  // The node id of live server `rank`.
  uint64_t Node(uint32_t rank) const {
    const ClusterView view1 = state_->View();
    for (const NodeInfo& n : view1.nodes()) {
      if (n.role() == SERVER && n.state() == ALIVE && n.rank() == rank) {
        return n.node_id();
      }
    }
    return 0;
  }

  // Reports COPIED then FENCED for every move in the view, as the sources
  // would.
  void FinishMoves() {
    for (int round = 0; round < 10 && state_->View().moves_size() > 0;
         ++round) {
      const ClusterView view2 = state_->View();
      for (const SlotMove& m : view2.moves()) {
        if (m.phase() == SlotMove::COPYING) {
          const absl::Status s = Report(
              Node(m.source()), m, ReportMoveRequest::COPIED, m.copy_epoch());
          ASSERT_TRUE(s.ok()) << s << state_->View().ShortDebugString();
        }
      }
      const ClusterView view3 = state_->View();
      for (const SlotMove& m : view3.moves()) {
        if (m.phase() == SlotMove::FENCING) {
          const absl::Status s = Report(
              Node(m.source()), m, ReportMoveRequest::FENCED, m.fence_epoch());
          ASSERT_TRUE(s.ok()) << s << state_->View().ShortDebugString();
        }
      }
    }
    EXPECT_EQ(state_->View().moves_size(), 0);
  }

  absl::StatusOr<ScaleResponse> Scale(uint32_t servers,
                                      std::vector<uint32_t> remove = {}) {
    ScaleRequest r;
    r.set_servers(servers);
    for (uint32_t rank : remove) r.add_remove(rank);
    return state_->Scale(r);
  }

  JobConfig config_;
  FakeClock clock_;
  std::unique_ptr<ClusterState> state_;
  SchedulerJournal journal_;
  std::vector<uint64_t> servers_;
  uint64_t worker_ = 0;
  int port_ = 0;
};

TEST_F(MovesTest, ServersBeyondTheStartingCountJoinAsSpares) {
  Init(2, 1);
  const uint64_t spare = Add(SERVER);
  const ClusterView v = state_->View();
  EXPECT_THAT(Owners(), ElementsAre(0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1));
  bool found = false;
  for (const NodeInfo& n : v.nodes()) {
    if (n.node_id() == spare) {
      EXPECT_EQ(n.rank(), 2u);
      found = true;
    }
  }
  EXPECT_TRUE(found);
  EXPECT_FALSE(v.has_restore());
  // Up to max_servers (6) in all.
  for (int i = 0; i < 3; ++i) Add(SERVER);
  RegisterRequest r;
  r.set_role(SERVER);
  r.set_data_endpoint("tcp://s:99");
  r.set_config_fingerprint(ConfigFingerprint(config_));
  EXPECT_EQ(state_->Register(r).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(MovesTest, AJobWithoutElasticRefusesScale) {
  config_ = Config(2, 1, 0, /*elastic=*/false);
  state_ = std::make_unique<ClusterState>(config_, &clock_);
  Add(SERVER);
  Add(SERVER);
  EXPECT_THAT(std::string(Scale(2).status().message()),
              HasSubstr("not elastic"));
}

TEST_F(MovesTest, AMoveCopiesFencesThenFlips) {
  Init(2, 1);
  Add(SERVER);
  Add(SERVER);
  absl::StatusOr<ScaleResponse> scale = Scale(4);
  ASSERT_TRUE(scale.ok()) << scale.status();
  // Runs of slots: 0 -> 2 and 1 -> 3.
  EXPECT_EQ(scale->moves_size(), 2);
  ClusterView v = state_->View();
  ASSERT_EQ(v.moves_size(), 2);
  const SlotMove m = v.moves(0);
  EXPECT_EQ(m.phase(), SlotMove::COPYING);
  EXPECT_EQ(m.copy_epoch(), v.epoch());
  EXPECT_EQ(scale->epoch(), v.epoch());
  // Only the source reports, and only for the phase the move is in.
  EXPECT_EQ(
      Report(Node(m.target()), m, ReportMoveRequest::COPIED, m.copy_epoch())
          .code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      Report(Node(m.source()), m, ReportMoveRequest::FENCED, m.copy_epoch())
          .code(),
      absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(
      Report(Node(m.source()), m, ReportMoveRequest::COPIED, m.copy_epoch())
          .ok());
  v = state_->View();
  EXPECT_EQ(v.moves(0).phase(), SlotMove::FENCING);
  EXPECT_EQ(v.moves(0).fence_epoch(), v.epoch());
  EXPECT_EQ(v.moves(0).rows_copied(), 10u);
  const std::vector<uint32_t> before = Owners();
  ASSERT_TRUE(Report(Node(m.source()), m, ReportMoveRequest::FENCED,
                     v.moves(0).fence_epoch())
                  .ok());
  const std::vector<uint32_t> after = Owners();
  for (uint32_t s : m.slots()) {
    EXPECT_EQ(before[s], m.source());
    EXPECT_EQ(after[s], m.target());
  }
  EXPECT_EQ(state_->View().moves_size(), 1);
  FinishMoves();
  EXPECT_THAT(Owners(), ElementsAre(0, 0, 0, 2, 2, 2, 1, 1, 1, 3, 3, 3));
  EXPECT_TRUE(Backups().empty());
}

TEST_F(MovesTest, WithReplicationTheSourceBecomesTheBackup) {
  Init(2, 2);
  Add(SERVER);
  ASSERT_TRUE(Scale(3).ok());
  const std::vector<uint32_t> owners_before = Owners();
  FinishMoves();
  const std::vector<uint32_t> owners = Owners();
  const std::vector<uint32_t> backups = Backups();
  uint32_t moved = 0;
  for (size_t s = 0; s < owners.size(); ++s) {
    EXPECT_NE(owners[s], backups[s]) << s;
    if (owners[s] == 2) {
      EXPECT_EQ(backups[s], owners_before[s]) << s;
      ++moved;
    }
  }
  EXPECT_EQ(moved, 4u);
}

TEST_F(MovesTest, ScaleInEmptiesThenDrainsTheServerAndRehomesItsBackups) {
  Init(3, 2);
  absl::StatusOr<ScaleResponse> scale = Scale(2, {1});
  ASSERT_TRUE(scale.ok()) << scale.status();
  EXPECT_THAT(scale->emptied(), ElementsAre(1));
  // A second scale waits for this one.
  EXPECT_EQ(Scale(3).status().code(), absl::StatusCode::kFailedPrecondition);
  FinishMoves();
  for (uint32_t owner : Owners()) EXPECT_NE(owner, 1u);
  for (uint32_t backup : Backups()) {
    EXPECT_NE(backup, 1u);
    EXPECT_NE(backup, kNone);
  }
  bool draining = false;
  const ClusterView view4 = state_->View();
  for (const NodeInfo& n : view4.nodes()) {
    if (n.rank() == 1 && n.role() == SERVER) draining = n.draining();
  }
  EXPECT_TRUE(draining);
  LeaveRequest leave;
  leave.set_node_id(Node(1));
  ASSERT_TRUE(state_->Leave(leave).ok());
  EXPECT_EQ(state_->job_state(), RUNNING);
  EXPECT_THAT(state_->CheckCanContinue(), IsEmpty());
}

TEST_F(MovesTest, AMoveWhoseTargetDiesIsAbandoned) {
  Init(2, 1);
  const uint64_t spare = Add(SERVER);
  ASSERT_TRUE(Scale(3).ok());
  ASSERT_GT(state_->View().moves_size(), 0);
  LeaveRequest leave;
  leave.set_node_id(spare);
  ASSERT_TRUE(state_->Leave(leave).ok());
  EXPECT_EQ(state_->View().moves_size(), 0);
  EXPECT_THAT(Owners(), ElementsAre(0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1));
  // And a new scale may start.
  Add(SERVER);
  EXPECT_TRUE(Scale(3).ok());
}

TEST_F(MovesTest, AnAbortedMoveIsRetriedFromAFreshCopyAndCompletes) {
  Init(2, 1);
  const uint64_t spare = Add(SERVER);
  ASSERT_TRUE(Scale(3).ok());
  const SlotMove m = state_->View().moves(0);
  ASSERT_TRUE(
      Report(Node(m.source()), m, ReportMoveRequest::ABORTED, m.copy_epoch())
          .ok());
  // Out of the view (the servers drop the copy), queued for a second try.
  const ClusterView aborted = state_->View();
  for (const SlotMove& left : aborted.moves()) {
    EXPECT_FALSE(left.source() == m.source() && left.target() == m.target());
  }
  GetStatusResponse status = state_->Status();
  ASSERT_EQ(status.queued_moves_size(), 1);
  EXPECT_EQ(status.queued_moves(0).attempt(), 2u);
  EXPECT_EQ(status.queued_moves(0).copy_epoch(), 0u);
  // Not before its wait is over.
  clock_.Advance(absl::Milliseconds(900));
  state_->CheckMoves();
  EXPECT_EQ(state_->Status().queued_moves_size(), 1);
  clock_.Advance(absl::Milliseconds(200));
  state_->CheckMoves();
  EXPECT_EQ(state_->Status().queued_moves_size(), 0);
  const ClusterView retried = state_->View();
  const SlotMove* again = nullptr;
  for (const SlotMove& x : retried.moves()) {
    if (x.source() == m.source() && x.target() == m.target()) again = &x;
  }
  ASSERT_NE(again, nullptr) << retried.ShortDebugString();
  EXPECT_EQ(again->phase(), SlotMove::COPYING);
  EXPECT_GT(again->copy_epoch(), m.copy_epoch());
  EXPECT_THAT(again->slots(), ::testing::ElementsAreArray(m.slots()));
  // A report of the first try is stale.
  EXPECT_EQ(
      Report(Node(m.source()), m, ReportMoveRequest::COPIED, m.copy_epoch())
          .code(),
      absl::StatusCode::kFailedPrecondition);
  FinishMoves();
  for (uint32_t s : m.slots()) EXPECT_EQ(Owners()[s], m.target());
  EXPECT_NE(Node(m.target()), 0u);
  EXPECT_EQ(Node(m.target()), spare);
}

TEST_F(MovesTest, AMoveAbortedOnEveryTryLeavesTheSlotsAndStopsTheScaleIn) {
  Init(3, 1);
  ASSERT_TRUE(Scale(2, {2}).ok());
  const SlotMove first = state_->View().moves(0);
  ASSERT_EQ(first.source(), 2u);
  for (uint32_t attempt = 1; attempt <= 3; ++attempt) {
    const ClusterView view = state_->View();
    const SlotMove* m = nullptr;
    for (const SlotMove& x : view.moves()) {
      if (x.source() == first.source() && x.target() == first.target()) m = &x;
    }
    ASSERT_NE(m, nullptr) << "try " << attempt << ": "
                          << view.ShortDebugString();
    ASSERT_TRUE(Report(Node(m->source()), *m, ReportMoveRequest::ABORTED,
                       m->copy_epoch())
                    .ok());
    clock_.Advance(absl::Seconds(attempt));
    state_->CheckMoves();
  }
  // Dropped after the third: the scale-in stops, server 2 keeps its
  // slots and stays.
  const ClusterView view5 = state_->View();
  for (const SlotMove& left : view5.moves()) {
    EXPECT_NE(left.source(), 2u);
  }
  EXPECT_EQ(state_->Status().queued_moves_size(), 0);
  FinishMoves();
  const ClusterView view6 = state_->View();
  for (const NodeInfo& n : view6.nodes()) EXPECT_FALSE(n.draining());
  for (uint32_t s : first.slots()) EXPECT_EQ(Owners()[s], 2u);
}

TEST_F(MovesTest, AFenceWaitsWhileItsTargetReceivesAnotherCopy) {
  Init(2, 1);
  Add(SERVER);
  ASSERT_TRUE(Scale(3).ok());
  // Both servers move slots to the spare, rank 2.
  const ClusterView started = state_->View();
  ASSERT_EQ(started.moves_size(), 2);
  const SlotMove a = started.moves(0);
  const SlotMove b = started.moves(1);
  ASSERT_EQ(a.target(), 2u);
  ASSERT_EQ(b.target(), 2u);
  ASSERT_TRUE(
      Report(Node(a.source()), a, ReportMoveRequest::COPIED, a.copy_epoch())
          .ok());
  // b still copies into rank 2: a's fence waits.
  ClusterView v = state_->View();
  EXPECT_EQ(v.moves(0).phase(), SlotMove::COPYING);
  EXPECT_TRUE(v.moves(0).copied());
  state_->CheckMoves();
  EXPECT_EQ(state_->View().moves(0).phase(), SlotMove::COPYING);
  // b's copy ends: both fence.
  ASSERT_TRUE(
      Report(Node(b.source()), b, ReportMoveRequest::COPIED, b.copy_epoch())
          .ok());
  v = state_->View();
  EXPECT_EQ(v.moves(0).phase(), SlotMove::FENCING);
  EXPECT_EQ(v.moves(1).phase(), SlotMove::FENCING);
  FinishMoves();
  EXPECT_THAT(Owners(), ::testing::Contains(2u));
}

TEST_F(MovesTest, AFenceWaitsForACheckpointAndBlocksTheNext) {
  Init(2, 1);
  Add(SERVER);
  ASSERT_TRUE(Scale(3).ok());
  absl::StatusOr<uint64_t> clock = state_->StartCheckpoint();
  ASSERT_TRUE(clock.ok()) << clock.status();
  // Both moves (to rank 2) copied.
  const ClusterView started = state_->View();
  ASSERT_EQ(started.moves_size(), 2);
  for (const SlotMove& m : started.moves()) {
    ASSERT_TRUE(
        Report(Node(m.source()), m, ReportMoveRequest::COPIED, m.copy_epoch())
            .ok());
  }
  EXPECT_EQ(state_->View().moves(0).phase(), SlotMove::COPYING);
  EXPECT_TRUE(state_->View().moves(0).copied());
  // The checkpoint commits: the fences start.
  for (uint32_t rank : {0u, 1u, 2u}) {
    ReportCheckpointRequest r;
    r.set_node_id(Node(rank));
    r.set_clock(*clock);
    r.set_ok(true);
    r.set_file("f");
    ASSERT_TRUE(state_->ReportCheckpoint(r).ok());
  }
  ClusterView v = state_->View();
  EXPECT_EQ(v.last_checkpoint_clock(), *clock);
  ASSERT_EQ(v.moves(0).phase(), SlotMove::FENCING);
  ASSERT_EQ(v.moves(1).phase(), SlotMove::FENCING);
  // No checkpoint starts during a fence; it is taken right after.
  EXPECT_EQ(state_->StartCheckpoint().status().code(),
            absl::StatusCode::kUnavailable);
  for (const SlotMove& m : v.moves()) {
    ASSERT_TRUE(Report(Node(m.source()), m, ReportMoveRequest::FENCED,
                       m.fence_epoch())
                    .ok());
  }
  EXPECT_THAT(state_->CheckCheckpoints(),
              ElementsAre(HasSubstr("checkpoint at clock")));
}

TEST_F(MovesTest, MovesBeyondTheLimitWaitTheirTurn) {
  Init(2, 1, /*concurrent=*/1);
  Add(SERVER);
  Add(SERVER);
  absl::StatusOr<ScaleResponse> scale = Scale(4);
  ASSERT_TRUE(scale.ok());
  EXPECT_EQ(scale->moves_size(), 2);
  EXPECT_EQ(state_->View().moves_size(), 1);
  FinishMoves();
  EXPECT_THAT(Owners(), ElementsAre(0, 0, 0, 2, 2, 2, 1, 1, 1, 3, 3, 3));
}

TEST_F(MovesTest, ARestartedSchedulerGoesOnWithTheMoves) {
  Init(3, 1, /*concurrent=*/1);
  ASSERT_TRUE(Scale(2, {2}).ok());
  const SlotMove m = state_->View().moves(0);
  ASSERT_TRUE(
      Report(Node(m.source()), m, ReportMoveRequest::COPIED, m.copy_epoch())
          .ok());
  const SchedulerJournal journal = journal_;
  ASSERT_EQ(journal.queued_moves_size(), 1);
  ASSERT_THAT(journal.removing_servers(), ElementsAre(2));
  state_ = std::make_unique<ClusterState>(config_, &clock_);
  ASSERT_TRUE(state_->Recover(journal).ok());
  const ClusterView v = state_->View();
  ASSERT_EQ(v.moves_size(), 1);
  EXPECT_EQ(v.moves(0).phase(), SlotMove::FENCING);
  FinishMoves();
  for (uint32_t owner : Owners()) EXPECT_NE(owner, 2u);
  bool draining = false;
  const ClusterView view7 = state_->View();
  for (const NodeInfo& n : view7.nodes()) {
    if (n.rank() == 2 && n.role() == SERVER) draining = n.draining();
  }
  EXPECT_TRUE(draining);
}

TEST_F(MovesTest, AJournaledRetryWaitsNoLongerThanARetryCan) {
  Init(2, 1);
  Add(SERVER);
  ASSERT_TRUE(Scale(3).ok());
  const SlotMove m = state_->View().moves(0);
  ASSERT_TRUE(
      Report(Node(m.source()), m, ReportMoveRequest::ABORTED, m.copy_epoch())
          .ok());
  SchedulerJournal journal = journal_;
  ASSERT_EQ(journal.queued_moves_size(), 1);
  // Written by a clock a day ahead.
  journal.mutable_queued_moves(0)->set_not_before_unix_micros(
      absl::ToUnixMicros(clock_.Now() + absl::Hours(24)));
  state_ = std::make_unique<ClusterState>(config_, &clock_);
  ASSERT_TRUE(state_->Recover(journal).ok());
  ASSERT_EQ(state_->Status().queued_moves_size(), 1);
  // The longest wait a retry gets: 1 s per try, three tries.
  clock_.Advance(absl::Seconds(3) + absl::Milliseconds(1));
  state_->CheckMoves();
  EXPECT_EQ(state_->Status().queued_moves_size(), 0);
  const ClusterView v = state_->View();
  bool retried = false;
  for (const SlotMove& x : v.moves()) {
    retried |= x.source() == m.source() && x.target() == m.target() &&
               x.phase() == SlotMove::COPYING;
  }
  EXPECT_TRUE(retried) << v.ShortDebugString();
}

TEST_F(MovesTest, ABadJournalMoveIsRefused) {
  Init(2, 1);
  Add(SERVER);
  ASSERT_TRUE(Scale(3).ok());
  SchedulerJournal journal = journal_;
  journal.mutable_view()->mutable_moves(0)->set_source(1);  // not the owner
  journal.mutable_view()->mutable_moves(0)->clear_slots();
  journal.mutable_view()->mutable_moves(0)->add_slots(0);
  state_ = std::make_unique<ClusterState>(config_, &clock_);
  EXPECT_EQ(state_->Recover(journal).code(), absl::StatusCode::kDataLoss);
}

TEST_F(MovesTest, ASpareMayBeDrainedButNotAServerInAMove) {
  Init(2, 1);
  const uint64_t spare = Add(SERVER);
  DrainRequest drain;
  drain.set_node_id(spare);
  absl::StatusOr<DrainResponse> d = state_->Drain(drain);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->note(), HasSubstr("spare"));
  Add(SERVER);
  ASSERT_TRUE(Scale(3).ok());
  drain.set_node_id(servers_[0]);
  EXPECT_THAT(std::string(state_->Drain(drain).status().message()),
              HasSubstr("slot move"));
}

TEST_F(MovesTest, SlotBytesFromHeartbeatsBalanceTheMoves) {
  Init(2, 1);
  Add(SERVER);
  // Server 0's slot 0 holds 1000 bytes, every other slot 10.
  for (uint32_t rank : {0u, 1u}) {
    HeartbeatRequest h;
    h.set_node_id(Node(rank));
    for (uint32_t s = 0; s < 12; ++s) {
      h.add_slot_bytes(Owners()[s] == rank ? (s == 0 ? 1000 : 10) : 0);
    }
    ASSERT_TRUE(state_->Heartbeat(h).ok());
  }
  ScaleRequest r;
  r.set_servers(3);
  r.set_dry_run(true);
  absl::StatusOr<ScaleResponse> plan = state_->Scale(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->note(), HasSubstr("of the bytes"));
  EXPECT_EQ(state_->View().moves_size(), 0);  // a dry run starts nothing
  // The big slot stays; the small ones of its server go to the spare,
  // server 1 (below the share) gives nothing.
  uint32_t moved = 0;
  for (const SlotMove& m : plan->moves()) {
    EXPECT_EQ(m.source(), 0u);
    EXPECT_EQ(m.target(), 2u);
    for (uint32_t s : m.slots()) EXPECT_NE(s, 0u);
    moved += m.slots_size();
  }
  EXPECT_EQ(moved, 5u);
}

}  // namespace
}  // namespace ps
