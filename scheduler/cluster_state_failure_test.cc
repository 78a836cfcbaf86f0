// A running job that cannot continue becomes FAILED (ClusterState::
// CheckCanContinue): slots with no live copy and no checkpoint, no
// replacement within the failover timeout, no member left; with a fake
// clock swept the way the scheduler's monitor loop sweeps it.
#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/reasons.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/cluster_state.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr absl::Duration kStep = absl::Milliseconds(100);
constexpr absl::Duration kTimeout = absl::Seconds(1);
constexpr absl::Duration kFailover = absl::Seconds(3);
constexpr absl::Duration kUnreachable = absl::Seconds(10);

// 3 servers and 2 workers, 12 slots (4 per server); heartbeats every 100 ms,
// a 1 s timeout, replacements awaited for 3 s, the scheduler unreachable
// bound 10 s.
JobConfig Config(uint32_t replication) {
  auto config = ParseJobConfig(
      absl::StrCat(R"pb(
                     cluster { num_servers: 3 num_workers: 2 num_slots: 12
                               heartbeat_interval_ms: 100
                               heartbeat_timeout_ms: 1000
                               isolation_hold_ms: 5000
                               failover_timeout_ms: 3000
                               scheduler_unreachable_timeout_ms: 10000
                               replication:)pb",
                   replication, "}"),
      "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : JobConfig();
}

class JobFailureTest : public ::testing::Test {
 protected:
  // A running job; `checkpoint`: whether the store has one to restore.
  // `checkpoint_dir`: the job checkpoints there, and what it commits is
  // kept in `committed_` and restorable from.
  void Start(uint32_t replication, bool checkpoint,
             absl::Duration failover = kFailover,
             const std::string& checkpoint_dir = "") {
    config_ = Config(replication);
    config_.mutable_cluster()->set_failover_timeout_ms(
        absl::ToInt64Milliseconds(failover));
    config_.mutable_checkpoint()->set_dir(checkpoint_dir);
    ClusterState::CheckpointStore store;
    store.commit = [this](const std::string& dir,
                          const CheckpointManifest& manifest) {
      committed_.push_back(manifest);
      return absl::OkStatus();
    };
    store.latest = [this, checkpoint]() -> absl::StatusOr<CheckpointRef> {
      if (!checkpoint && committed_.empty()) {
        return absl::NotFoundError("no checkpoint in /ckpt");
      }
      CheckpointRef ref;
      ref.set_path("/ckpt/ckpt-00000000000000000010");
      ref.set_clock(10);
      return ref;
    };
    state_ = std::make_unique<ClusterState>(config_, &clock_, std::move(store));
    for (int i = 0; i < 3; ++i) servers_.push_back(Add(SERVER));
    for (int i = 0; i < 2; ++i) workers_.push_back(Add(WORKER));
    ASSERT_EQ(state_->job_state(), RUNNING);
  }

  RegisterRequest Request(Role role) const {
    RegisterRequest request;
    request.set_role(role);
    if (role == SERVER) request.set_data_endpoint("tcp://s:1");
    request.set_config_fingerprint(ConfigFingerprint(config_));
    return request;
  }

  uint64_t Add(Role role) {
    absl::StatusOr<RegisterResponse> r = state_->Register(Request(role));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->node_id() : 0;
  }

  // Moves the clock on by `d` in steps of kStep, the nodes in `beating`
  // heartbeating, the failure detector sweeping as the scheduler's loop
  // does. Returns the failures logged meanwhile.
  std::vector<std::string> Run(absl::Duration d,
                               const std::set<uint64_t>& beating) {
    std::vector<std::string> failures;
    for (absl::Duration t = kStep; t <= d; t += kStep) {
      clock_.Advance(kStep);
      for (uint64_t id : beating) {
        HeartbeatRequest request;
        request.set_node_id(id);
        EXPECT_TRUE(state_->Heartbeat(request).ok());
      }
      state_->ExpireSilentNodes();
      for (std::string& f : state_->CheckCanContinue()) failures.push_back(f);
    }
    return failures;
  }

  std::set<uint64_t> AllBut(std::set<uint64_t> gone) const {
    std::set<uint64_t> out;
    for (uint64_t id : servers_) {
      if (gone.count(id) == 0) out.insert(id);
    }
    for (uint64_t id : workers_) {
      if (gone.count(id) == 0) out.insert(id);
    }
    return out;
  }

  JobConfig config_;
  std::vector<CheckpointManifest> committed_;
  FakeClock clock_;
  std::unique_ptr<ClusterState> state_;
  std::vector<uint64_t> servers_, workers_;
};

TEST_F(JobFailureTest,
       BothCopiesLostWithoutACheckpointFailAtOnceNamingTheSlots) {
  Start(/*replication=*/2, /*checkpoint=*/false);
  // Server 0's slots 0-3 are backed by server 1: both die. Server 1's
  // slots 4-7 have their backup on server 2, which is promoted.
  const std::set<uint64_t> rest = AllBut({servers_[0], servers_[1]});
  EXPECT_THAT(Run(kTimeout - kStep, rest), IsEmpty());
  EXPECT_EQ(state_->job_state(), RUNNING);
  const std::vector<std::string> failures = Run(2 * kStep, rest);
  ASSERT_THAT(
      failures,
      ElementsAre(AllOf(HasSubstr("slots 0-3 (of server 0) have no live copy"),
                        HasSubstr("no checkpoint"))));
  const ClusterView view = state_->View();
  EXPECT_EQ(view.job_state(), FAILED);
  EXPECT_EQ(view.failure(), failures[0]);
  // Logged once; heartbeats are still answered, saying so.
  EXPECT_THAT(Run(kStep, rest), IsEmpty());
  HeartbeatRequest beat;
  beat.set_node_id(servers_[2]);
  absl::StatusOr<HeartbeatResponse> answer = state_->Heartbeat(beat);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->job_state(), FAILED);
}

// Two servers killed together are heard from last a little apart, so they
// are declared dead in different sweeps: the first death gives the other's
// slots new backups, which it never copied there. Those are not promoted.
TEST_F(JobFailureTest, BackupsGivenAfterTheOwnerWentSilentAreNotPromoted) {
  for (const bool owner_first : {true, false}) {
    SCOPED_TRACE(owner_first ? "server 0 declared dead first"
                             : "server 1 declared dead first");
    servers_.clear();
    workers_.clear();
    Start(/*replication=*/2, /*checkpoint=*/false);
    const uint64_t first = owner_first ? servers_[0] : servers_[1];
    // The other one heartbeats once more, then both are silent.
    EXPECT_THAT(Run(kStep, AllBut({first})), IsEmpty());
    const std::vector<std::string> failures =
        Run(kTimeout + 2 * kStep, AllBut({servers_[0], servers_[1]}));
    // Slots 0-3 are owned by server 0 and backed by server 1 at first;
    // when server 0 goes first they are promoted to server 1.
    EXPECT_THAT(
        failures,
        ElementsAre(HasSubstr(
            owner_first ? "slots 0-3 (of server 1) have no live copy"
                        : "slots 0-3 (of server 0) have no live copy")));
    EXPECT_EQ(state_->job_state(), FAILED);
  }
}

TEST_F(JobFailureTest, AServerLostWithoutReplicationOrCheckpointFailsTheJob) {
  Start(/*replication=*/1, /*checkpoint=*/false);
  const std::vector<std::string> failures =
      Run(kTimeout + 2 * kStep, AllBut({servers_[1]}));
  EXPECT_THAT(failures, ElementsAre(HasSubstr("slots 4-7 (of server 1)")));
  EXPECT_EQ(state_->job_state(), FAILED);
}

TEST_F(JobFailureTest, AServerThatLeavesWithoutACheckpointFailsTheJob) {
  Start(/*replication=*/1, /*checkpoint=*/false);
  LeaveRequest leave;
  leave.set_node_id(servers_[2]);
  ASSERT_TRUE(state_->Leave(leave).ok());
  EXPECT_THAT(state_->CheckCanContinue(),
              ElementsAre(HasSubstr("slots 8-11 (of server 2)")));
}

// A preempted server writes its shard, reports it and leaves before the
// others report: the checkpoint still commits, holding its shard, and its
// slots are then awaiting a replacement, not lost.
TEST_F(JobFailureTest, AServerThatReportedItsShardThenLeftKeepsTheCheckpoint) {
  Start(/*replication=*/1, /*checkpoint=*/false, kFailover, "/ckpt");
  absl::StatusOr<uint64_t> clock = state_->StartCheckpoint();
  ASSERT_TRUE(clock.ok()) << clock.status();
  auto report = [&](uint64_t node, uint32_t rank) {
    ReportCheckpointRequest r;
    r.set_node_id(node);
    r.set_clock(*clock);
    r.set_ok(true);
    r.set_file(absl::StrCat("shard-", rank, ".ckpt"));
    return state_->ReportCheckpoint(r);
  };
  ASSERT_TRUE(report(servers_[2], 2).ok());
  LeaveRequest leave;
  leave.set_node_id(servers_[2]);
  ASSERT_TRUE(state_->Leave(leave).ok());
  // Not judged while the checkpoint that holds server 2's shard is pending.
  EXPECT_THAT(Run(3 * kStep, AllBut({servers_[2]})), IsEmpty());
  EXPECT_EQ(state_->job_state(), RUNNING);
  EXPECT_EQ(state_->View().checkpoint_clock(), *clock);
  ASSERT_TRUE(report(servers_[0], 0).ok());
  EXPECT_TRUE(committed_.empty());
  ASSERT_TRUE(report(servers_[1], 1).ok());
  ASSERT_EQ(committed_.size(), 1u);
  std::vector<std::string> files;
  for (const ShardFile& f : committed_[0].shards()) files.push_back(f.file());
  EXPECT_THAT(files,
              ElementsAre("shard-0.ckpt", "shard-1.ckpt", "shard-2.ckpt"));
  EXPECT_EQ(state_->View().last_checkpoint_clock(), *clock);
  // Restorable now: the job waits for a replacement, then gives up.
  EXPECT_THAT(Run(kFailover - kStep, AllBut({servers_[2]})), IsEmpty());
  EXPECT_THAT(Run(2 * kStep, AllBut({servers_[2]})),
              ElementsAre(HasSubstr("no replacement server registered")));
}

// One that leaves before reporting abandons it, as before.
TEST_F(JobFailureTest, AServerThatLeftBeforeReportingAbandonsTheCheckpoint) {
  Start(/*replication=*/1, /*checkpoint=*/false, kFailover, "/ckpt");
  absl::StatusOr<uint64_t> clock = state_->StartCheckpoint();
  ASSERT_TRUE(clock.ok()) << clock.status();
  LeaveRequest leave;
  leave.set_node_id(servers_[2]);
  ASSERT_TRUE(state_->Leave(leave).ok());
  EXPECT_EQ(state_->View().checkpoint_clock(), 0u);
  EXPECT_THAT(state_->CheckCanContinue(),
              ElementsAre(HasSubstr("slots 8-11 (of server 2)")));
  EXPECT_TRUE(committed_.empty());
}

TEST_F(JobFailureTest, AReplacementInTimeKeepsTheJobRunning) {
  Start(/*replication=*/1, /*checkpoint=*/true);
  EXPECT_THAT(Run(kTimeout + 2 * kStep, AllBut({servers_[1]})), IsEmpty());
  EXPECT_EQ(state_->job_state(), RUNNING);
  EXPECT_THAT(Run(kFailover - 2 * kTimeout, AllBut({servers_[1]})), IsEmpty());
  const uint64_t replacement = Add(SERVER);
  std::set<uint64_t> beating = AllBut({servers_[1]});
  beating.insert(replacement);
  EXPECT_THAT(Run(2 * kFailover, beating), IsEmpty());
  EXPECT_EQ(state_->job_state(), RUNNING);
  EXPECT_EQ(state_->View().restore().clock(), 10u);
}

TEST_F(JobFailureTest, NoReplacementWithinTheFailoverTimeoutFailsTheJob) {
  Start(/*replication=*/1, /*checkpoint=*/true);
  const std::set<uint64_t> rest = AllBut({servers_[1]});
  // Declared dead after the timeout; then the replacement has kFailover.
  EXPECT_THAT(Run(kTimeout + kFailover - kStep, rest), IsEmpty());
  EXPECT_EQ(state_->job_state(), RUNNING);
  EXPECT_THAT(Run(3 * kStep, rest),
              ElementsAre(AllOf(HasSubstr("slots 4-7 (of server 1)"),
                                HasSubstr("no replacement server"),
                                HasSubstr("failover_timeout_ms"))));
  EXPECT_EQ(state_->job_state(), FAILED);
}

TEST_F(JobFailureTest, AJobWithNoMemberLeftFails) {
  // A failover timeout longer than the unreachable bound, so only the
  // missing members can fail the job.
  Start(/*replication=*/1, /*checkpoint=*/true, absl::Minutes(10));
  for (uint64_t id : AllBut({})) {
    LeaveRequest leave;
    leave.set_node_id(id);
    ASSERT_TRUE(state_->Leave(leave).ok());
  }
  EXPECT_THAT(Run(kUnreachable - kStep, {}), IsEmpty());
  EXPECT_EQ(state_->job_state(), RUNNING);
  EXPECT_THAT(Run(2 * kStep, {}),
              ElementsAre(HasSubstr("no server or worker has been alive")));
  EXPECT_EQ(state_->job_state(), FAILED);
  // Nobody to tell: the scheduler is done at once.
  EXPECT_TRUE(state_->AllDone());
}

TEST_F(JobFailureTest, AFailedJobRefusesNodesAndEndsWaits) {
  Start(/*replication=*/1, /*checkpoint=*/false);
  // Worker 0 waits at a barrier worker 1 never reaches (real time: the
  // failure must wake it, not its timeout).
  std::atomic<bool> returned{false};
  absl::Status barrier;
  std::thread waiter([&] {
    barrier = state_->AwaitBarrier(workers_[0], "never-met", absl::Seconds(20))
                  .status();
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(returned.load());
  const absl::Time failing = absl::Now();
  ASSERT_THAT(Run(kTimeout + 2 * kStep, AllBut({servers_[0]})), Not(IsEmpty()));
  waiter.join();
  EXPECT_LT(absl::Now() - failing, absl::Seconds(10));
  EXPECT_TRUE(IsJobFailed(barrier)) << barrier;
  EXPECT_THAT(std::string(barrier.message()), HasSubstr("slots 0-3"));

  absl::StatusOr<RegisterResponse> late = state_->Register(Request(SERVER));
  EXPECT_TRUE(IsJobFailed(late.status())) << late.status();
  DrainRequest drain;
  drain.set_node_id(workers_[1]);
  EXPECT_TRUE(IsJobFailed(state_->Drain(drain).status()));
  ClaimShardRequest claim;
  claim.set_node_id(workers_[1]);
  EXPECT_TRUE(
      IsJobFailed(state_->ClaimShard(claim, absl::Seconds(20)).status()));
  // The remaining nodes get a heartbeat timeout to learn it.
  EXPECT_FALSE(state_->AllDone());
  clock_.Advance(kTimeout);
  EXPECT_TRUE(state_->AllDone());
}

}  // namespace
}  // namespace ps
