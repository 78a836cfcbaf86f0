// The failure detector across the scheduler's own faults (ClusterState::
// ExpireSilentNodes): a stall of the scheduler, and most nodes silent at once
// (the scheduler cut off), with a fake clock swept the way the scheduler's
// monitor loop sweeps it.
#include <cmath>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

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
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;

// 3 servers and 3 workers; heartbeats every 100 ms, a 1 s timeout, and
// isolation held for up to 5 s.
constexpr char kConfig[] = R"pb(
  cluster {
    num_servers: 3
    num_workers: 3
    num_slots: 12
    heartbeat_interval_ms: 100
    heartbeat_timeout_ms: 1000
    isolation_hold_ms: 5000
  }
)pb";
constexpr absl::Duration kTimeout = absl::Seconds(1);
constexpr absl::Duration kHold = absl::Seconds(5);
// The scheduler's monitor loop: a quarter of the heartbeat interval.
constexpr absl::Duration kSweep = absl::Milliseconds(25);
constexpr absl::Duration kBeat = absl::Milliseconds(100);

class IsolationTest : public ::testing::Test {
 protected:
  IsolationTest() {
    absl::StatusOr<JobConfig> config = ParseJobConfig(kConfig, "test");
    EXPECT_TRUE(config.ok()) << config.status();
    config_ = config.ok() ? *config : JobConfig();
    state_ = std::make_unique<ClusterState>(config_, &clock_);
    state_->ExpectSweepsEvery(kSweep);
    for (int i = 0; i < 6; ++i) {
      RegisterRequest request;
      request.set_role(i < 3 ? SERVER : WORKER);
      if (i < 3) {
        request.set_data_endpoint("tcp://s" + std::to_string(i) + ":1");
      }
      request.set_host("testhost");
      request.set_config_fingerprint(ConfigFingerprint(config_));
      absl::StatusOr<RegisterResponse> r = state_->Register(request);
      EXPECT_TRUE(r.ok()) << r.status();
      nodes_.push_back(r.ok() ? r->node_id() : 0);
    }
    EXPECT_EQ(state_->job_state(), RUNNING);
  }

  // Moves the clock on by `d` in sweeps of kSweep, as the monitor loop
  // would, with the nodes in `beating` heartbeating every kBeat, each in
  // its own phase (as real nodes do: the i-th node of nodes_ i sweeps
  // later), so nodes silenced at one moment pass their timeouts in
  // different sweeps. Returns the nodes declared dead meanwhile.
  std::vector<uint64_t> Run(absl::Duration d,
                            const std::set<uint64_t>& beating) {
    std::vector<uint64_t> dead;
    const int64_t sweeps_per_beat = kBeat / kSweep;
    for (int64_t s = 1; s * kSweep <= d; ++s) {
      clock_.Advance(kSweep);
      ++sweep_;
      for (size_t i = 0; i < nodes_.size(); ++i) {
        if (beating.count(nodes_[i]) == 0 ||
            (sweep_ + static_cast<int64_t>(i)) % sweeps_per_beat != 0) {
          continue;
        }
        HeartbeatRequest request;
        request.set_node_id(nodes_[i]);
        state_->Heartbeat(request).IgnoreError();
      }
      for (uint64_t id : state_->ExpireSilentNodes()) dead.push_back(id);
    }
    return dead;
  }
  std::set<uint64_t> All() const { return {nodes_.begin(), nodes_.end()}; }
  std::set<uint64_t> AllBut(const std::vector<uint64_t>& silent) const {
    std::set<uint64_t> beating = All();
    for (uint64_t id : silent) beating.erase(id);
    return beating;
  }
  size_t Alive() const {
    size_t alive = 0;
    const ClusterView view = state_->View();
    for (const NodeInfo& n : view.nodes()) alive += n.state() == ALIVE;
    return alive;
  }

  JobConfig config_;
  FakeClock clock_;
  std::unique_ptr<ClusterState> state_;
  std::vector<uint64_t> nodes_;  // s0, s1, s2, w0, w1, w2
  int64_t sweep_ = 0;            // sweeps so far, for the heartbeat phases
};

TEST_F(IsolationTest, OneSilentNodeAmongManyIsDeclaredDeadAfterTheTimeout) {
  const uint64_t s1 = nodes_[1];
  EXPECT_THAT(Run(kTimeout - kBeat, AllBut({s1})), IsEmpty());
  EXPECT_THAT(Run(2 * kBeat + kSweep, AllBut({s1})), ElementsAre(s1));
  EXPECT_EQ(Alive(), 5u);
  EXPECT_FALSE(state_->Monitor().isolation_suspected);
  EXPECT_EQ(state_->Monitor().isolation_suspicions, 0u);
}

TEST_F(IsolationTest, StallGivesEveryNodeAFreshTimeout) {
  ASSERT_THAT(Run(absl::Milliseconds(500), All()), IsEmpty());
  // The scheduler is paused for 3 timeouts: nobody was heard meanwhile.
  clock_.Advance(3 * kTimeout);
  EXPECT_THAT(state_->ExpireSilentNodes(), IsEmpty());
  EXPECT_EQ(Alive(), 6u);
  EXPECT_EQ(state_->Monitor().stalls, 1u);
  // Everyone but w2 heartbeats again; w2 gets a full timeout from the
  // stall's end, then is declared dead as usual.
  const uint64_t w2 = nodes_[5];
  EXPECT_THAT(Run(kTimeout - kBeat, AllBut({w2})), IsEmpty());
  EXPECT_THAT(Run(2 * kBeat, AllBut({w2})), ElementsAre(w2));
  EXPECT_EQ(Alive(), 5u);
}

TEST_F(IsolationTest, ShortGapsBetweenSweepsAreNoStall) {
  clock_.Advance(absl::Milliseconds(400));  // under (1000 - 100) / 2 ms
  state_->ExpireSilentNodes();
  EXPECT_EQ(state_->Monitor().stalls, 0u);
}

class MassSilenceTest : public IsolationTest,
                        public ::testing::WithParamInterface<int> {};

TEST_P(MassSilenceTest, AllNodesSilentDeclaresNothingAndResumes) {
  ASSERT_THAT(Run(absl::Milliseconds(300), All()), IsEmpty());
  EXPECT_THAT(Run(GetParam() * kTimeout, {}), IsEmpty());
  EXPECT_EQ(Alive(), 6u);
  ClusterState::Monitoring m = state_->Monitor();
  EXPECT_TRUE(m.isolation_suspected);
  EXPECT_EQ(m.isolation_suspicions, 1u);
  EXPECT_GT(m.isolation_suspected_seconds, 0);
  // The link is back: every node heartbeats again, past the grace the
  // silence earned stragglers.
  EXPECT_THAT(Run((GetParam() + 3) * kTimeout, All()), IsEmpty());
  m = state_->Monitor();
  EXPECT_FALSE(m.isolation_suspected);
  EXPECT_EQ(m.nodes_declared_dead, 0u);
  // Detection works as before: one silent node is declared dead.
  const uint64_t s0 = nodes_[0];
  EXPECT_THAT(Run(kTimeout + 2 * kBeat, AllBut({s0})), ElementsAre(s0));
  EXPECT_EQ(state_->Monitor().isolation_suspicions, 1u);
}

INSTANTIATE_TEST_SUITE_P(TwoAndFourTimeouts, MassSilenceTest,
                         ::testing::Values(2, 4));

TEST_F(IsolationTest, StragglersGetAFreshTimeoutWhenHeartbeatsReturn) {
  ASSERT_THAT(Run(absl::Milliseconds(300), All()), IsEmpty());
  ASSERT_THAT(Run(2 * kTimeout, {}), IsEmpty());
  // Most nodes are heard again; two are a little late.
  const uint64_t s2 = nodes_[2], w2 = nodes_[5];
  EXPECT_THAT(Run(absl::Milliseconds(300), AllBut({s2, w2})), IsEmpty());
  EXPECT_FALSE(state_->Monitor().isolation_suspected);
  EXPECT_THAT(Run(absl::Milliseconds(300), All()), IsEmpty());
  EXPECT_EQ(Alive(), 6u);
}

TEST_F(IsolationTest, StragglersGetAsLongAsTheSilenceLasted) {
  ASSERT_THAT(Run(absl::Milliseconds(300), All()), IsEmpty());
  // Cut off for 4 timeouts; most nodes are back at once, two only about
  // as long after as the silence lasted (their TCP connections retransmit
  // with a doubling backoff): nobody is declared dead.
  ASSERT_THAT(Run(4 * kTimeout, {}), IsEmpty());
  const uint64_t s2 = nodes_[2], w2 = nodes_[5];
  EXPECT_THAT(Run(4 * kTimeout, AllBut({s2, w2})), IsEmpty());
  EXPECT_THAT(Run(kTimeout, All()), IsEmpty());
  EXPECT_EQ(Alive(), 6u);
  // One that never comes back is declared dead once that grace is over.
  EXPECT_THAT(Run(4 * kTimeout, AllBut({w2})), ElementsAre(w2));
  EXPECT_EQ(Alive(), 5u);
}

TEST_F(IsolationTest, SilenceBeyondTheHoldIsDeclaredAsDeaths) {
  ASSERT_THAT(Run(absl::Milliseconds(300), All()), IsEmpty());
  // Silent past the timeout, then for the hold: held until the hold ends.
  EXPECT_THAT(Run(kTimeout + kHold - kBeat, {}), IsEmpty());
  EXPECT_THAT(Run(3 * kBeat, {}), UnorderedElementsAreArray(nodes_));
  EXPECT_EQ(Alive(), 0u);
  EXPECT_FALSE(state_->Monitor().isolation_suspected);
  EXPECT_EQ(state_->Monitor().nodes_declared_dead, 6u);
}

TEST_F(IsolationTest, MostNodesReallyDeadAreDeclaredAfterTheHold) {
  // Four of six die at once (a rack); the two left keep heartbeating, which
  // does not end the suspicion: the silent ones are still a majority.
  const std::vector<uint64_t> rack = {nodes_[0], nodes_[1], nodes_[3],
                                      nodes_[4]};
  const std::set<uint64_t> rest = AllBut(rack);
  ASSERT_THAT(Run(absl::Milliseconds(300), All()), IsEmpty());
  EXPECT_THAT(Run(kTimeout + kHold - kBeat, rest), IsEmpty());
  EXPECT_TRUE(state_->Monitor().isolation_suspected);
  EXPECT_THAT(Run(3 * kBeat, rest), UnorderedElementsAreArray(rack));
  EXPECT_EQ(Alive(), 2u);
}

TEST_F(IsolationTest, StatusCarriesTheSuspicionAndTheStalls) {
  ASSERT_THAT(Run(absl::Milliseconds(500), All()), IsEmpty());
  clock_.Advance(3 * kTimeout);  // A stall, then every node falls silent.
  ASSERT_THAT(state_->ExpireSilentNodes(), IsEmpty());
  ASSERT_THAT(Run(2 * kTimeout, {}), IsEmpty());
  const double seconds = state_->Monitor().isolation_suspected_seconds;
  ASSERT_GT(seconds, 0);
  SchedulerFaults faults = state_->Status().faults();
  EXPECT_TRUE(faults.isolation_suspected());
  EXPECT_EQ(faults.isolation_suspected_ms(), std::llround(seconds * 1000));
  EXPECT_EQ(faults.isolation_suspected_ms() + faults.isolation_hold_left_ms(),
            absl::ToInt64Milliseconds(kHold));
  EXPECT_EQ(faults.isolation_suspicions(), 1u);
  EXPECT_EQ(faults.stalls(), 1u);
  // Heartbeats are back: nothing is suspected, the counts stay.
  ASSERT_THAT(Run(3 * kTimeout, All()), IsEmpty());
  faults = state_->Status().faults();
  EXPECT_FALSE(faults.isolation_suspected());
  EXPECT_EQ(faults.isolation_suspected_ms(), 0u);
  EXPECT_EQ(faults.isolation_hold_left_ms(), 0u);
  EXPECT_EQ(faults.isolation_suspicions(), 1u);
  EXPECT_EQ(faults.stalls(), 1u);
}

}  // namespace
}  // namespace ps
