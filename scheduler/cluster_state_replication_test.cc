// ClusterState with cluster.replication 2: backups in the slot map, their
// promotion when a server dies or leaves, new backups, and replacements.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/cluster_state.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr uint32_t kNone = ClusterState::kNoBackup;

JobConfig Config(uint32_t servers, uint32_t replication) {
  auto config = ParseJobConfig(absl::StrCat(R"pb(
    cluster {
      num_workers: 1
      num_slots: 9
      heartbeat_interval_ms: 100
      heartbeat_timeout_ms: 1000
      num_servers: )pb", servers, " replication: ", replication, "}"),
                               "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : JobConfig();
}

class ReplicatedClusterStateTest : public ::testing::Test {
 protected:
  void Init(uint32_t servers, uint32_t replication = 2) {
    config_ = Config(servers, replication);
    state_ = std::make_unique<ClusterState>(config_, &clock_);
  }

  uint64_t AddServer() {
    RegisterRequest r;
    r.set_role(SERVER);
    r.set_data_endpoint(absl::StrCat("tcp://s:", ++endpoints_));
    r.set_config_fingerprint(ConfigFingerprint(config_));
    auto response = state_->Register(r);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->node_id() : 0;
  }

  // Every node but `victim` heartbeats; then the victim's silence passes the
  // timeout and it is declared dead. The last live node going silent is
  // first held as the scheduler's suspected isolation
  // (cluster.isolation_hold_ms).
  void Kill(uint64_t victim, const std::vector<uint64_t>& others) {
    clock_.Advance(absl::Milliseconds(1001));
    for (uint64_t id : others) {
      HeartbeatRequest h;
      h.set_node_id(id);
      ASSERT_TRUE(state_->Heartbeat(h).ok());
    }
    std::vector<uint64_t> dead = state_->ExpireSilentNodes();
    if (others.empty()) {
      EXPECT_THAT(dead, IsEmpty());
      clock_.Advance(absl::Milliseconds(config_.cluster().isolation_hold_ms()));
      dead = state_->ExpireSilentNodes();
    }
    EXPECT_THAT(dead, ElementsAre(victim));
  }

  std::vector<uint32_t> Owners() const {
    const ClusterView v = state_->View();
    return {v.slot_owner().begin(), v.slot_owner().end()};
  }
  std::vector<uint32_t> Backups() const {
    const ClusterView v = state_->View();
    return {v.slot_backup().begin(), v.slot_backup().end()};
  }

  JobConfig config_;
  FakeClock clock_;
  std::unique_ptr<ClusterState> state_;
  int endpoints_ = 0;
};

TEST_F(ReplicatedClusterStateTest, ConfigAcceptsOneOrTwoCopies) {
  EXPECT_TRUE(ValidateJobConfig(Config(2, 2)).ok());
  EXPECT_TRUE(ValidateJobConfig(Config(1, 1)).ok());
  JobConfig three = Config(3, 2);
  three.mutable_cluster()->set_replication(3);
  EXPECT_EQ(ValidateJobConfig(three).code(), absl::StatusCode::kInvalidArgument);
  JobConfig alone = Config(2, 2);
  alone.mutable_cluster()->set_num_servers(1);
  EXPECT_EQ(ValidateJobConfig(alone).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ReplicatedClusterStateTest, WithoutReplicationThereAreNoBackups) {
  Init(3, 1);
  for (int i = 0; i < 3; ++i) AddServer();
  ASSERT_EQ(state_->job_state(), RUNNING);
  EXPECT_THAT(Owners(), ElementsAre(0, 0, 0, 1, 1, 1, 2, 2, 2));
  EXPECT_THAT(Backups(), IsEmpty());
}

TEST_F(ReplicatedClusterStateTest, EachSlotIsBackedByTheNextRank) {
  Init(3);
  AddServer();
  AddServer();
  EXPECT_THAT(Backups(), IsEmpty());  // STARTING: no slot map yet
  AddServer();
  ASSERT_EQ(state_->job_state(), RUNNING);
  EXPECT_THAT(Owners(), ElementsAre(0, 0, 0, 1, 1, 1, 2, 2, 2));
  EXPECT_THAT(Backups(), ElementsAre(1, 1, 1, 2, 2, 2, 0, 0, 0));
}

TEST_F(ReplicatedClusterStateTest, ADeadServersSlotsGoToTheirBackups) {
  Init(3);
  const uint64_t s0 = AddServer(), s1 = AddServer(), s2 = AddServer();
  const uint64_t epoch = state_->View().epoch();
  Kill(s1, {s0, s2});
  EXPECT_GT(state_->View().epoch(), epoch);
  // Server 1's slots are served by server 2, which backed them; every slot
  // gets a live backup again: the least loaded other server.
  EXPECT_THAT(Owners(), ElementsAre(0, 0, 0, 2, 2, 2, 2, 2, 2));
  EXPECT_THAT(Backups(), ElementsAre(2, 2, 2, 0, 0, 0, 0, 0, 0));
}

TEST_F(ReplicatedClusterStateTest, AServerLeavingIsTreatedLikeADeadOne) {
  Init(2);
  const uint64_t s0 = AddServer();
  AddServer();
  LeaveRequest leave;
  leave.set_node_id(s0);
  ASSERT_TRUE(state_->Leave(leave).ok());
  EXPECT_THAT(Owners(), ElementsAre(1, 1, 1, 1, 1, 1, 1, 1, 1));
  // No other live server: nothing can hold a backup.
  EXPECT_THAT(Backups(), ElementsAre(kNone, kNone, kNone, kNone, kNone, kNone, kNone,
                                     kNone, kNone));
}

TEST_F(ReplicatedClusterStateTest, AReplacementBacksWhatItsRankHeld) {
  Init(3);
  const uint64_t s0 = AddServer(), s1 = AddServer(), s2 = AddServer();
  Kill(s1, {s0, s2});
  const uint64_t epoch = state_->View().epoch();
  AddServer();  // takes rank 1
  EXPECT_GT(state_->View().epoch(), epoch);
  // It owns nothing (its old slots stay with server 2, which serves them)
  // and backs the slots rank 1 owned or backed at the start.
  EXPECT_THAT(Owners(), ElementsAre(0, 0, 0, 2, 2, 2, 2, 2, 2));
  EXPECT_THAT(Backups(), ElementsAre(1, 1, 1, 1, 1, 1, 0, 0, 0));
}

TEST_F(ReplicatedClusterStateTest, SlotsWithoutALiveCopyWaitForAReplacement) {
  Init(2);
  const uint64_t s0 = AddServer(), s1 = AddServer();
  Kill(s1, {s0});
  EXPECT_THAT(Owners(), ElementsAre(0, 0, 0, 0, 0, 0, 0, 0, 0));
  Kill(s0, {});
  // Both copies gone: the slots keep their dead owner.
  EXPECT_THAT(Owners(), ElementsAre(0, 0, 0, 0, 0, 0, 0, 0, 0));
  const uint64_t r0 = AddServer();  // rank 0: owns them (restoring a checkpoint)
  EXPECT_THAT(Owners(), ElementsAre(0, 0, 0, 0, 0, 0, 0, 0, 0));
  EXPECT_THAT(Backups(), ElementsAre(kNone, kNone, kNone, kNone, kNone, kNone, kNone,
                                     kNone, kNone));
  AddServer();  // rank 1: backs everything
  EXPECT_THAT(Backups(), ElementsAre(1, 1, 1, 1, 1, 1, 1, 1, 1));
  (void)r0;
}

}  // namespace
}  // namespace ps
