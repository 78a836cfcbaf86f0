#include "common/status.h"
#include "scheduler/cluster_state.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"

namespace ps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// 2 servers and 2 workers; 8 slots so the slot map is small enough to spell
// out; a 1 s heartbeat timeout that the fake clock crosses explicitly.
constexpr char kConfig[] = R"pb(
  cluster {
    num_servers: 2
    num_workers: 2
    num_slots: 8
    heartbeat_interval_ms: 100
    heartbeat_timeout_ms: 1000
  }
)pb";

// Long enough never to expire on a loaded machine, short enough that a
// broken wake-up fails the test instead of hanging it.
constexpr absl::Duration kLongWait = absl::Seconds(20);

JobConfig TestConfig() {
  absl::StatusOr<JobConfig> config = ParseJobConfig(kConfig, "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : JobConfig();
}

class ClusterStateTest : public ::testing::Test {
 protected:
  ClusterStateTest()
      : config_(TestConfig()),
        fingerprint_(ConfigFingerprint(config_)),
        state_(std::make_unique<ClusterState>(config_, &clock_)) {}

  RegisterRequest Request(Role role, const std::string& endpoint = "") const {
    RegisterRequest request;
    request.set_role(role);
    request.set_data_endpoint(endpoint);
    request.set_host("testhost");
    request.set_pid(4242);
    request.set_config_fingerprint(fingerprint_);
    return request;
  }

  // Registers and returns the new node id; fails the test on error.
  RegisterResponse MustRegister(Role role, const std::string& endpoint = "") {
    absl::StatusOr<RegisterResponse> r = state_->Register(Request(role, endpoint));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : RegisterResponse();
  }
  uint64_t AddServer(const std::string& endpoint) {
    return MustRegister(SERVER, endpoint).node_id();
  }
  uint64_t AddWorker() { return MustRegister(WORKER).node_id(); }

  absl::Status Leave(uint64_t node_id, bool finished) {
    LeaveRequest request;
    request.set_node_id(node_id);
    request.set_finished(finished);
    return state_->Leave(request);
  }

  absl::Status Heartbeat(uint64_t node_id) {
    HeartbeatRequest request;
    request.set_node_id(node_id);
    return state_->Heartbeat(request).status();
  }

  // Most live nodes silent at once are first held as the scheduler's
  // suspected isolation (cluster.isolation_hold_ms): sweeps once to start
  // the hold, then again once it is over, and returns who was declared dead.
  std::vector<uint64_t> ExpireAfterIsolationHold() {
    EXPECT_THAT(state_->ExpireSilentNodes(), IsEmpty());
    clock_.Advance(absl::Milliseconds(config_.cluster().isolation_hold_ms()));
    return state_->ExpireSilentNodes();
  }

  NodeInfo NodeInView(uint64_t node_id) const {
    const ClusterView view = state_->View();
    for (const NodeInfo& n : view.nodes()) {
      if (n.node_id() == node_id) return n;
    }
    ADD_FAILURE() << "node " << node_id << " not in the view";
    return NodeInfo();
  }

  // Both servers and both workers registered: the job is RUNNING.
  struct Cluster {
    uint64_t s0, s1, w0, w1;
  };
  Cluster StartFullCluster() {
    Cluster c;
    c.s0 = AddServer("tcp://s0:1");
    c.s1 = AddServer("tcp://s1:1");
    c.w0 = AddWorker();
    c.w1 = AddWorker();
    EXPECT_EQ(state_->job_state(), RUNNING);
    return c;
  }

  const JobConfig config_;
  const uint64_t fingerprint_;
  FakeClock clock_;
  std::unique_ptr<ClusterState> state_;
};

TEST_F(ClusterStateTest, AssignsRanksPerRoleInRegistrationOrder) {
  RegisterResponse s0 = MustRegister(SERVER, "tcp://a:1");
  RegisterResponse w0 = MustRegister(WORKER);
  RegisterResponse s1 = MustRegister(SERVER, "tcp://b:1");
  RegisterResponse w1 = MustRegister(WORKER);
  EXPECT_EQ(s0.rank(), 0u);
  EXPECT_EQ(s1.rank(), 1u);
  EXPECT_EQ(w0.rank(), 0u);
  EXPECT_EQ(w1.rank(), 1u);
  // Node ids start at 1 and are shared across roles.
  EXPECT_EQ(s0.node_id(), 1u);
  EXPECT_EQ(w0.node_id(), 2u);
  EXPECT_EQ(s1.node_id(), 3u);
  EXPECT_EQ(w1.node_id(), 4u);
}

// Registrations that arrive while another holds the state (here: its
// journal write) are taken together: one epoch and one journal write for
// the lot, each with its own rank and a view that lists it.
TEST(ClusterStateBatchTest, RegistrationsArrivingTogetherShareOneEpoch) {
  absl::StatusOr<JobConfig> config = ParseJobConfig(
      R"pb(cluster { num_servers: 1 num_workers: 32 num_slots: 8 })pb", "test");
  ASSERT_TRUE(config.ok()) << config.status();
  auto state = std::make_unique<ClusterState>(*config, Clock::Real());
  auto Request = [&](Role role) {
    RegisterRequest request;
    request.set_role(role);
    if (role == SERVER) request.set_data_endpoint("tcp://s0:1");
    request.set_host("testhost");
    request.set_pid(1);
    request.set_config_fingerprint(ConfigFingerprint(*config));
    return request;
  };
  ASSERT_TRUE(state->Register(Request(SERVER)).ok());
  absl::Notification release;
  std::atomic<int> writes{0};
  ASSERT_TRUE(state
                  ->SetJournal([&](const SchedulerJournal&, bool) {
                    // The first registration's write holds the state until
                    // the others have queued.
                    if (writes.fetch_add(1) == 1) release.WaitForNotification();
                    return absl::OkStatus();
                  })
                  .ok());
  const uint64_t epoch0 = state->Head().epoch;
  constexpr int kLater = 20;
  std::vector<absl::StatusOr<RegisterResponse>> results(
      kLater + 1, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  threads.emplace_back([&] { results[0] = state->Register(Request(WORKER)); });
  while (writes.load() < 2) absl::SleepFor(absl::Milliseconds(1));
  for (int i = 1; i <= kLater; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = state->Register(Request(WORKER)); });
  }
  absl::SleepFor(absl::Seconds(1));  // they queue behind the held state
  release.Notify();
  for (auto& t : threads) t.join();

  std::set<uint32_t> ranks;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    ranks.insert(r->rank());
    bool listed = false;
    for (const NodeInfo& n : r->view().nodes()) {
      listed |= n.node_id() == r->node_id() && n.state() == ALIVE;
    }
    EXPECT_TRUE(listed) << "node " << r->node_id();
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(kLater + 1));
  // One epoch for the first, then far fewer than one each for the rest.
  const uint64_t epochs = state->Head().epoch - epoch0;
  EXPECT_LT(epochs, static_cast<uint64_t>(kLater)) << epochs;
  EXPECT_LT(writes.load(), kLater) << "journal writes";
}

TEST_F(ClusterStateTest, ServersOnlyViewsListTheServersAndTheAskerOnly) {
  const uint64_t s0 = AddServer("tcp://s0:1");
  const uint64_t s1 = AddServer("tcp://s1:1");
  const uint64_t w0 = AddWorker();
  RegisterRequest request = Request(WORKER);
  request.set_servers_only(true);
  absl::StatusOr<RegisterResponse> w1 = state_->Register(request);
  ASSERT_TRUE(w1.ok()) << w1.status();
  auto ids = [](const ClusterView& v) {
    std::vector<uint64_t> out;
    for (const NodeInfo& n : v.nodes()) out.push_back(n.node_id());
    return out;
  };
  EXPECT_TRUE(w1->view().servers_only());
  EXPECT_THAT(ids(w1->view()), ElementsAre(s0, s1, w1->node_id()));
  const uint64_t known = w1->view().epoch();

  // w0 leaves, a worker and a server change: the delta for w1 lists the
  // server only; a whole servers-only view lists both servers and w1.
  LeaveRequest leave;
  leave.set_node_id(w0);
  ASSERT_TRUE(state_->Leave(leave).ok());
  std::vector<ClusterView> views = state_->ViewsFor(
      {{known, true, w1->node_id()}, {0, true, w1->node_id()}, {known, false, 0}});
  ASSERT_EQ(views.size(), 3u);
  EXPECT_EQ(views[0].delta_from(), known);
  EXPECT_TRUE(views[0].servers_only());
  EXPECT_THAT(ids(views[0]), IsEmpty());
  EXPECT_THAT(ids(views[1]), ElementsAre(s0, s1, w1->node_id()));
  EXPECT_EQ(views[1].delta_from(), 0u);
  // Every node, as before, for an ask without servers_only.
  EXPECT_FALSE(views[2].servers_only());
  EXPECT_THAT(ids(views[2]), ElementsAre(w0));
  EXPECT_TRUE(views[0].slots_unchanged());
  EXPECT_TRUE(views[2].slots_unchanged());
}

TEST_F(ClusterStateTest, ADeltaAcrossASlotMapChangeCarriesTheSlotMap) {
  AddServer("tcp://s0:1");
  const ClusterView starting = state_->AwaitView(0, false, absl::ZeroDuration());
  ASSERT_EQ(starting.job_state(), STARTING);
  EXPECT_EQ(starting.slot_owner_size(), 0);
  AddServer("tcp://s1:1");  // the job runs: the first slot map
  const ClusterView delta = state_->AwaitView(0, false, absl::ZeroDuration(),
                                              starting.epoch());
  EXPECT_EQ(delta.delta_from(), starting.epoch());
  EXPECT_FALSE(delta.slots_unchanged());
  EXPECT_EQ(delta.slot_owner_size(), 8);
}

TEST_F(ClusterStateTest, ViewsAgainstAKnownEpochListOnlyTheChangedNodes) {
  AddServer("tcp://s0:1");
  AddServer("tcp://s1:1");
  const uint64_t w0 = AddWorker();
  const ClusterView before = state_->AwaitView(0, false, absl::ZeroDuration());
  ASSERT_EQ(before.nodes_size(), 3);
  const uint64_t w1 = AddWorker();
  LeaveRequest leave;
  leave.set_node_id(w0);
  ASSERT_TRUE(state_->Leave(leave).ok());
  const ClusterView whole = state_->AwaitView(0, false, absl::ZeroDuration());
  ASSERT_EQ(whole.nodes_size(), 4);
  EXPECT_EQ(whole.delta_from(), 0u);

  // Against the older view: the worker that left and the one that came.
  const ClusterView delta = state_->AwaitView(0, false, absl::ZeroDuration(),
                                              before.epoch());
  EXPECT_EQ(delta.delta_from(), before.epoch());
  EXPECT_EQ(delta.epoch(), whole.epoch());
  ASSERT_EQ(delta.nodes_size(), 2);
  EXPECT_EQ(delta.nodes(0).node_id(), w0);
  EXPECT_EQ(delta.nodes(0).state(), LEFT);
  EXPECT_EQ(delta.nodes(1).node_id(), w1);
  // Everything but the node list is whole, but for the slot map, which
  // did not change since.
  EXPECT_TRUE(delta.slots_unchanged());
  EXPECT_EQ(delta.slot_owner_size(), 0);
  EXPECT_GT(whole.slot_owner_size(), 0);
  EXPECT_FALSE(whole.slots_unchanged());
  EXPECT_EQ(delta.job_state(), whole.job_state());
  // Asked again (the cached delta), the same.
  EXPECT_EQ(state_->AwaitView(0, false, absl::ZeroDuration(), before.epoch())
                .SerializeAsString(),
            delta.SerializeAsString());

  // The current epoch, an unknown one and one older than the history all
  // get the whole view.
  for (const uint64_t known : {whole.epoch(), uint64_t{0}, uint64_t{1}}) {
    const ClusterView v =
        state_->AwaitView(0, false, absl::ZeroDuration(), known);
    EXPECT_EQ(v.delta_from(), 0u) << known;
    EXPECT_EQ(v.nodes_size(), 4) << known;
  }
}

// Workers that finished their shards wait in ClaimShard. A shard orphaned
// by a preempted worker goes to a waiting one at once; once every shard is
// done every waiting worker is answered together, long before its wait
// would end; neither changes the epoch (no view lists shards).
TEST_F(ClusterStateTest, WaitingClaimsAreAnsweredByAnOrphanAndByTheLastShard) {
  AddServer("tcp://s0:1");
  AddServer("tcp://s1:1");
  RegisterRequest worker = Request(WORKER);
  worker.set_trains_shards(true);
  const absl::StatusOr<RegisterResponse> w0 = state_->Register(worker);
  const absl::StatusOr<RegisterResponse> w1 = state_->Register(worker);
  ASSERT_TRUE(w0.ok() && w1.ok());
  ASSERT_TRUE(w0->has_shard() && w1->has_shard());
  auto finished = [](uint64_t node, const DataPosition& shard) {
    ClaimShardRequest claim;
    claim.set_node_id(node);
    *claim.mutable_finished() = shard;
    claim.mutable_finished()->set_done(true);
    return claim;
  };
  absl::StatusOr<ClaimShardResponse> first;
  std::thread waiter([&] {
    first = state_->ClaimShard(finished(w0->node_id(), w0->shard()), kLongWait);
  });
  absl::SleepFor(absl::Milliseconds(50));  // usually waiting by now
  LeaveRequest preempted;
  preempted.set_node_id(w1->node_id());
  *preempted.mutable_position() = w1->shard();
  preempted.mutable_position()->set_batch(3);
  const absl::Time left = absl::Now();
  ASSERT_TRUE(state_->Leave(preempted).ok());
  waiter.join();
  EXPECT_LT(absl::Now() - left, kLongWait / 2);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->result(), ClaimShardResponse::ASSIGNED);
  EXPECT_EQ(first->shard().shard(), w1->shard().shard());
  EXPECT_EQ(first->shard().batch(), 3u);

  // A replacement finds no shard to start and waits; w0 finishes the
  // orphan: both learn that every shard is done.
  const absl::StatusOr<RegisterResponse> w2 = state_->Register(worker);
  ASSERT_TRUE(w2.ok());
  EXPECT_FALSE(w2->has_shard());
  const uint64_t epoch = state_->View().epoch();
  absl::StatusOr<ClaimShardResponse> waiting;
  std::thread replacement([&] {
    ClaimShardRequest ask;
    ask.set_node_id(w2->node_id());
    waiting = state_->ClaimShard(ask, kLongWait);
  });
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time last = absl::Now();
  const absl::StatusOr<ClaimShardResponse> own =
      state_->ClaimShard(finished(w0->node_id(), first->shard()), kLongWait);
  replacement.join();
  EXPECT_LT(absl::Now() - last, kLongWait / 2);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->result(), ClaimShardResponse::ALL_DONE);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_EQ(waiting->result(), ClaimShardResponse::ALL_DONE);
  EXPECT_EQ(state_->View().epoch(), epoch);
}

TEST_F(ClusterStateTest, RejectsFingerprintMismatchWithoutChangingState) {
  RegisterRequest request = Request(WORKER);
  request.set_config_fingerprint(fingerprint_ + 1);
  absl::StatusOr<RegisterResponse> r = state_->Register(request);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  const ClusterView view = state_->View();
  EXPECT_EQ(view.epoch(), 1u);
  EXPECT_THAT(view.nodes(), IsEmpty());
}

TEST_F(ClusterStateTest, RejectsServerWithoutEndpoint) {
  EXPECT_EQ(state_->Register(Request(SERVER, "")).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Workers have no data plane endpoint, so none is required of them.
  EXPECT_TRUE(state_->Register(Request(WORKER, "")).ok());
}

TEST_F(ClusterStateTest, RejectsBadRole) {
  EXPECT_EQ(state_->Register(Request(ROLE_UNSPECIFIED)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // proto3 enums are open: a value no version defines arrives as is.
  EXPECT_EQ(state_->Register(Request(static_cast<Role>(7), "tcp://x:1"))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_->View().epoch(), 1u);
}

TEST_F(ClusterStateTest, RejectsOversizedStrings) {
  EXPECT_EQ(
      state_->Register(Request(SERVER, std::string(1025, 'x'))).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_F(ClusterStateTest, RejectsNodesBeyondTheConfiguredCount) {
  StartFullCluster();
  EXPECT_EQ(state_->Register(Request(SERVER, "tcp://s2:1")).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(state_->Register(Request(WORKER)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(ClusterStateTest, EveryChangeBumpsTheEpochByOne) {
  EXPECT_EQ(state_->View().epoch(), 1u);
  RegisterResponse s0 = MustRegister(SERVER, "tcp://s0:1");
  // The response carries the view that includes the new node.
  EXPECT_EQ(s0.view().epoch(), 2u);
  EXPECT_EQ(s0.view().nodes_size(), 1);
  RegisterResponse w0 = MustRegister(WORKER);
  EXPECT_EQ(w0.view().epoch(), 3u);
  EXPECT_EQ(state_->View().epoch(), 3u);

  // Heartbeats and refused requests change nothing.
  ASSERT_TRUE(Heartbeat(w0.node_id()).ok());
  EXPECT_FALSE(state_->Register(Request(SERVER, "")).ok());
  EXPECT_EQ(state_->View().epoch(), 3u);

  ASSERT_TRUE(Leave(w0.node_id(), false).ok());
  EXPECT_EQ(state_->View().epoch(), 4u);

  clock_.Advance(absl::Milliseconds(1001));
  EXPECT_THAT(ExpireAfterIsolationHold(), ElementsAre(s0.node_id()));
  EXPECT_EQ(state_->View().epoch(), 5u);
  // Nothing left to expire: no change, no bump.
  EXPECT_THAT(state_->ExpireSilentNodes(), IsEmpty());
  EXPECT_EQ(state_->View().epoch(), 5u);
}

TEST_F(ClusterStateTest, JobStartsRunningOnceEveryServerRegistered) {
  AddServer("tcp://s0:1");
  AddWorker();
  AddWorker();
  ClusterView view = state_->View();
  EXPECT_EQ(view.job_state(), STARTING);
  EXPECT_THAT(view.slot_owner(), IsEmpty());
  EXPECT_EQ(view.num_slots(), 8u);

  RegisterResponse s1 = MustRegister(SERVER, "tcp://s1:1");
  EXPECT_EQ(s1.view().job_state(), RUNNING);
  view = state_->View();
  EXPECT_EQ(view.job_state(), RUNNING);
  // Contiguous ranges: the first half of the slots to rank 0, the rest to 1.
  EXPECT_THAT(view.slot_owner(), ElementsAre(0, 0, 0, 0, 1, 1, 1, 1));
  EXPECT_EQ(s1.view().slot_owner_size(), 8);
}

TEST_F(ClusterStateTest, SlotRangesWithUnevenSplit) {
  JobConfig config = config_;
  config.mutable_cluster()->set_num_servers(3);
  config.mutable_cluster()->set_num_slots(8);
  ClusterState state(config, &clock_);
  for (int i = 0; i < 3; ++i) {
    RegisterRequest request = Request(SERVER, "tcp://s:1");
    request.set_config_fingerprint(ConfigFingerprint(config));
    ASSERT_TRUE(state.Register(request).ok());
  }
  EXPECT_THAT(state.View().slot_owner(), ElementsAre(0, 0, 0, 1, 1, 1, 2, 2));
}

TEST_F(ClusterStateTest, ViewListsNodesWithEndpoints) {
  const Cluster c = StartFullCluster();
  const ClusterView view = state_->View();
  ASSERT_EQ(view.nodes_size(), 4);
  // Ordered by node id.
  EXPECT_EQ(view.nodes(0).node_id(), c.s0);
  EXPECT_EQ(view.nodes(0).role(), SERVER);
  EXPECT_EQ(view.nodes(0).rank(), 0u);
  EXPECT_EQ(view.nodes(0).data_endpoint(), "tcp://s0:1");
  EXPECT_EQ(view.nodes(0).state(), ALIVE);
  EXPECT_EQ(view.nodes(0).host(), "testhost");
  EXPECT_EQ(view.nodes(0).pid(), 4242u);
  EXPECT_EQ(view.nodes(1).node_id(), c.s1);
  EXPECT_EQ(view.nodes(1).rank(), 1u);
  EXPECT_EQ(view.nodes(1).data_endpoint(), "tcp://s1:1");
  EXPECT_EQ(view.nodes(2).node_id(), c.w0);
  EXPECT_EQ(view.nodes(2).role(), WORKER);
  EXPECT_EQ(view.nodes(2).rank(), 0u);
  EXPECT_EQ(view.nodes(2).data_endpoint(), "");
  EXPECT_EQ(view.nodes(3).node_id(), c.w1);
  EXPECT_EQ(view.nodes(3).rank(), 1u);
}

TEST_F(ClusterStateTest, HeartbeatReportsEpochAndJobState) {
  const Cluster c = StartFullCluster();
  HeartbeatRequest request;
  request.set_node_id(c.w0);
  absl::StatusOr<HeartbeatResponse> r = state_->Heartbeat(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->epoch(), state_->View().epoch());
  EXPECT_EQ(r->job_state(), RUNNING);
}

TEST_F(ClusterStateTest, HeartbeatOfUnknownNodeIsNotFound) {
  EXPECT_EQ(Heartbeat(99).code(), absl::StatusCode::kNotFound);
}

TEST_F(ClusterStateTest, ExpiresOnlyNodesSilentForLongerThanTheTimeout) {
  const uint64_t quiet = AddWorker();
  const uint64_t chatty = AddWorker();
  const uint64_t epoch = state_->View().epoch();

  clock_.Advance(absl::Milliseconds(900));
  EXPECT_THAT(state_->ExpireSilentNodes(), IsEmpty());
  ASSERT_TRUE(Heartbeat(chatty).ok());
  clock_.Advance(absl::Milliseconds(200));  // quiet: 1100 ms, chatty: 200 ms.

  EXPECT_THAT(state_->ExpireSilentNodes(), ElementsAre(quiet));
  EXPECT_EQ(NodeInView(quiet).state(), DEAD);
  EXPECT_EQ(NodeInView(chatty).state(), ALIVE);
  EXPECT_EQ(state_->View().epoch(), epoch + 1);

  // A dead node must register again.
  EXPECT_EQ(Heartbeat(quiet).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Heartbeat(chatty).ok());
}

TEST_F(ClusterStateTest, ReplacementTakesTheDeadNodesRank) {
  const Cluster c = StartFullCluster();
  clock_.Advance(absl::Milliseconds(900));
  ASSERT_TRUE(Heartbeat(c.s0).ok());
  ASSERT_TRUE(Heartbeat(c.s1).ok());
  ASSERT_TRUE(Heartbeat(c.w1).ok());
  clock_.Advance(absl::Milliseconds(200));
  ASSERT_THAT(state_->ExpireSilentNodes(), ElementsAre(c.w0));

  RegisterResponse replacement = MustRegister(WORKER);
  EXPECT_EQ(replacement.rank(), 0u);
  // Ids are never reused, so the dead node's late messages stay refused.
  EXPECT_EQ(replacement.node_id(), 5u);
  EXPECT_EQ(Heartbeat(c.w0).code(), absl::StatusCode::kNotFound);
  // The dead record stays in the view.
  EXPECT_EQ(NodeInView(c.w0).state(), DEAD);
  EXPECT_EQ(NodeInView(c.w0).rank(), 0u);
}

TEST_F(ClusterStateTest, DeadServerReplacementKeepsTheJobRunning) {
  StartFullCluster();
  const ClusterView before = state_->View();
  clock_.Advance(absl::Milliseconds(1001));
  ASSERT_EQ(ExpireAfterIsolationHold().size(), 4u);
  // The slot map is by rank, so it survives the death of its servers.
  EXPECT_EQ(state_->job_state(), RUNNING);
  RegisterResponse s = MustRegister(SERVER, "tcp://new:1");
  EXPECT_EQ(s.rank(), 0u);
  EXPECT_THAT(s.view().slot_owner(), ElementsAre(0, 0, 0, 0, 1, 1, 1, 1));
  EXPECT_GT(s.view().epoch(), before.epoch());
}

TEST_F(ClusterStateTest, LeaveMarksLeftAndFreesTheRank) {
  const Cluster c = StartFullCluster();
  ASSERT_TRUE(Leave(c.s0, false).ok());
  EXPECT_EQ(NodeInView(c.s0).state(), LEFT);
  EXPECT_EQ(Heartbeat(c.s0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Leave(c.s0, false).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Leave(99, false).code(), absl::StatusCode::kNotFound);

  RegisterResponse s = MustRegister(SERVER, "tcp://again:1");
  EXPECT_EQ(s.rank(), 0u);
}

TEST_F(ClusterStateTest, JobFinishesWhenEveryWorkerLeftAndOneFinished) {
  const Cluster c = StartFullCluster();
  ASSERT_TRUE(Leave(c.w0, true).ok());
  // w1 is still working.
  EXPECT_EQ(state_->job_state(), RUNNING);
  const uint64_t epoch = state_->View().epoch();
  ASSERT_TRUE(Leave(c.w1, false).ok());
  EXPECT_EQ(state_->job_state(), FINISHED);
  EXPECT_EQ(state_->View().epoch(), epoch + 1);
}

TEST_F(ClusterStateTest, WorkersLeavingUnfinishedDoNotFinishTheJob) {
  const Cluster c = StartFullCluster();
  ASSERT_TRUE(Leave(c.w0, false).ok());
  ASSERT_TRUE(Leave(c.w1, false).ok());
  EXPECT_EQ(state_->job_state(), RUNNING);
}

TEST_F(ClusterStateTest, DeathOfTheLastWorkerAfterOneFinishedFinishesTheJob) {
  const Cluster c = StartFullCluster();
  ASSERT_TRUE(Leave(c.w0, true).ok());
  clock_.Advance(absl::Milliseconds(900));
  ASSERT_TRUE(Heartbeat(c.s0).ok());
  ASSERT_TRUE(Heartbeat(c.s1).ok());
  clock_.Advance(absl::Milliseconds(200));
  ASSERT_THAT(state_->ExpireSilentNodes(), ElementsAre(c.w1));
  EXPECT_EQ(state_->job_state(), FINISHED);
}

TEST_F(ClusterStateTest, JobDoesNotFinishBeforeEveryWorkerRankWasTaken) {
  AddServer("tcp://s0:1");
  AddServer("tcp://s1:1");
  const uint64_t early = AddWorker();  // rank 0; rank 1 never registered.
  ASSERT_TRUE(Leave(early, true).ok());
  // No worker alive and one finished, but rank 1's shard was never trained.
  EXPECT_EQ(state_->job_state(), RUNNING);

  // A finished rank is not handed out again: the next worker gets rank 1,
  // the shard still to do, and its finished leave ends the job.
  const uint64_t late = AddWorker();
  EXPECT_EQ(NodeInView(late).rank(), 1u);
  ASSERT_TRUE(Leave(late, true).ok());
  EXPECT_EQ(state_->job_state(), FINISHED);
}

TEST_F(ClusterStateTest, RanksOfWorkersThatLeftUnfinishedAreReused) {
  AddServer("tcp://s0:1");
  AddServer("tcp://s1:1");
  const uint64_t a = AddWorker();  // rank 0
  const uint64_t b = AddWorker();  // rank 1
  ASSERT_TRUE(Leave(a, /*finished=*/false).ok());
  const uint64_t c = AddWorker();
  EXPECT_EQ(NodeInView(c).rank(), 0u);
  ASSERT_TRUE(Leave(b, true).ok());
  // Rank 1 finished and rank 0 is held: no rank is left to give.
  RegisterRequest request;
  request.set_role(WORKER);
  request.set_config_fingerprint(ConfigFingerprint(config_));
  EXPECT_EQ(state_->Register(request).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(Leave(c, true).ok());
  EXPECT_EQ(state_->job_state(), FINISHED);
}

TEST_F(ClusterStateTest, AllDoneOnceFinishedAndEveryServerGone) {
  const Cluster c = StartFullCluster();
  EXPECT_FALSE(state_->AllDone());
  ASSERT_TRUE(Leave(c.w0, true).ok());
  ASSERT_TRUE(Leave(c.w1, true).ok());
  ASSERT_EQ(state_->job_state(), FINISHED);
  EXPECT_FALSE(state_->AllDone());  // Servers still alive.
  ASSERT_TRUE(Leave(c.s0, false).ok());
  EXPECT_FALSE(state_->AllDone());
  // A server that dies instead of leaving counts as gone too.
  clock_.Advance(absl::Milliseconds(1001));
  ASSERT_THAT(ExpireAfterIsolationHold(), ElementsAre(c.s1));
  EXPECT_TRUE(state_->AllDone());
  EXPECT_EQ(state_->job_state(), FINISHED);
}

TEST_F(ClusterStateTest, ServersLeavingBeforeTheJobFinishedIsNotDone) {
  const Cluster c = StartFullCluster();
  ASSERT_TRUE(Leave(c.s0, false).ok());
  ASSERT_TRUE(Leave(c.s1, false).ok());
  EXPECT_FALSE(state_->AllDone());
}

TEST_F(ClusterStateTest, RegisterAfterFinishedIsRefused) {
  const Cluster c = StartFullCluster();
  ASSERT_TRUE(Leave(c.w0, true).ok());
  ASSERT_TRUE(Leave(c.w1, true).ok());
  ASSERT_EQ(state_->job_state(), FINISHED);
  EXPECT_EQ(state_->Register(Request(WORKER)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(state_->Register(Request(SERVER, "tcp://late:1")).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// --- Barriers ---------------------------------------------------------------

TEST_F(ClusterStateTest, BarrierTimesOutNamingTheMissingRank) {
  const Cluster c = StartFullCluster();
  const absl::Time start = absl::Now();
  absl::Status s = state_->AwaitBarrier(c.w0, "epoch-1", absl::Milliseconds(50)).status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "barrier 'epoch-1' still waits for worker ranks 1");
}

TEST_F(ClusterStateTest, BarrierCountsRanksThatNeverRegisteredAsMissing) {
  const uint64_t w0 = AddWorker();
  absl::Status s = state_->AwaitBarrier(w0, "b", absl::Milliseconds(10)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "barrier 'b' still waits for worker ranks 1");
}

TEST_F(ClusterStateTest, BarrierReleasesEveryWorkerOnceAllArrived) {
  const Cluster c = StartFullCluster();
  auto first = std::async(std::launch::async, [&] {
    return state_->AwaitBarrier(c.w0, "b", kLongWait).status();
  });
  auto second = std::async(std::launch::async, [&] {
    return state_->AwaitBarrier(c.w1, "b", kLongWait).status();
  });
  ASSERT_EQ(first.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_EQ(second.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(first.get().ok());
  EXPECT_TRUE(second.get().ok());

  // A caller retrying after the barrier completed (e.g. its first call's
  // answer was lost) passes at once, even with no time to wait.
  EXPECT_TRUE(state_->AwaitBarrier(c.w0, "b", absl::ZeroDuration()).status().ok());
  // Other names are independent.
  EXPECT_EQ(state_->AwaitBarrier(c.w0, "c", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

// A worker whose successful answer was lost retries; by then membership may
// have changed (here a replacement that never arrived), yet the barrier
// already completed and must stay passed.
TEST_F(ClusterStateTest, CompletedBarrierStaysPassedAfterMembershipChanges) {
  const Cluster c = StartFullCluster();
  auto first = std::async(std::launch::async, [&] {
    return state_->AwaitBarrier(c.w0, "b", kLongWait).status();
  });
  ASSERT_TRUE(state_->AwaitBarrier(c.w1, "b", kLongWait).status().ok());
  ASSERT_TRUE(first.get().ok());

  ASSERT_TRUE(Leave(c.w1, false).ok());
  const uint64_t replacement = AddWorker();
  EXPECT_EQ(NodeInView(replacement).rank(), 1u);
  EXPECT_TRUE(state_->AwaitBarrier(c.w0, "b", absl::ZeroDuration()).status().ok());
}

TEST_F(ClusterStateTest, BarrierIsReleasedWhenTheMissingWorkerDies) {
  const Cluster c = StartFullCluster();
  auto waiter = std::async(std::launch::async, [&] {
    return state_->AwaitBarrier(c.w0, "b", kLongWait).status();
  });
  // w1 is alive and has not arrived: w0 must block.
  ASSERT_EQ(waiter.wait_for(std::chrono::milliseconds(100)),
            std::future_status::timeout);

  clock_.Advance(absl::Milliseconds(900));
  ASSERT_TRUE(Heartbeat(c.w0).ok());
  ASSERT_TRUE(Heartbeat(c.s0).ok());
  ASSERT_TRUE(Heartbeat(c.s1).ok());
  clock_.Advance(absl::Milliseconds(200));
  ASSERT_THAT(state_->ExpireSilentNodes(), ElementsAre(c.w1));

  ASSERT_EQ(waiter.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(waiter.get().ok());
}

TEST_F(ClusterStateTest, BarrierRejectsServersEmptyNamesAndNonMembers) {
  const Cluster c = StartFullCluster();
  EXPECT_EQ(state_->AwaitBarrier(c.s0, "b", absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_->AwaitBarrier(c.w0, "", absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_->AwaitBarrier(c.w0, std::string(257, 'n'),
                                 absl::Milliseconds(10)).status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_->AwaitBarrier(99, "b", absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(Leave(c.w1, false).ok());
  EXPECT_EQ(state_->AwaitBarrier(c.w1, "b", absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kNotFound);
}

// --- AwaitView ----------------------------------------------------------------

TEST_F(ClusterStateTest, AwaitViewAnswersAtOnceWhenAlreadySatisfied) {
  StartFullCluster();
  const absl::Time start = absl::Now();
  ClusterView view = state_->AwaitView(5, /*wait_for_running=*/true, kLongWait);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(view.epoch(), 5u);
  EXPECT_EQ(view.job_state(), RUNNING);
}

TEST_F(ClusterStateTest, AwaitViewReturnsTheCurrentViewAfterTheTimeout) {
  AddServer("tcp://s0:1");  // Epoch 2, still STARTING.
  absl::Time start = absl::Now();
  ClusterView view = state_->AwaitView(3, false, absl::Milliseconds(50));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_EQ(view.epoch(), 2u);

  start = absl::Now();
  view = state_->AwaitView(0, true, absl::Milliseconds(50));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_EQ(view.epoch(), 2u);
  EXPECT_EQ(view.job_state(), STARTING);
}

TEST_F(ClusterStateTest, AwaitViewWakesOnANewerEpoch) {
  auto poll = std::async(std::launch::async, [&] {
    return state_->AwaitView(2, false, kLongWait);
  });
  ASSERT_EQ(poll.wait_for(std::chrono::milliseconds(50)),
            std::future_status::timeout);
  AddWorker();
  ASSERT_EQ(poll.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(poll.get().epoch(), 2u);
}

TEST_F(ClusterStateTest, AwaitViewForRunningWakesWhenTheLastServerRegisters) {
  auto poll = std::async(std::launch::async, [&] {
    return state_->AwaitView(0, true, kLongWait);
  });
  AddServer("tcp://s0:1");
  AddWorker();
  // Newer epochs alone do not satisfy a wait for RUNNING.
  ASSERT_EQ(poll.wait_for(std::chrono::milliseconds(50)),
            std::future_status::timeout);
  AddServer("tcp://s1:1");
  ASSERT_EQ(poll.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const ClusterView view = poll.get();
  EXPECT_EQ(view.job_state(), RUNNING);
  EXPECT_EQ(view.epoch(), 4u);
  EXPECT_EQ(view.slot_owner_size(), 8);
}

TEST_F(ClusterStateTest, CloseWakesBlockedWaitersAndAnswersLaterOnesAtOnce) {
  const Cluster c = StartFullCluster();
  const uint64_t epoch = state_->View().epoch();
  auto barrier = std::async(std::launch::async, [&] {
    return state_->AwaitBarrier(c.w0, "b", kLongWait).status();
  });
  auto poll = std::async(std::launch::async, [&] {
    return state_->AwaitView(epoch + 1, false, kLongWait);
  });
  ASSERT_EQ(barrier.wait_for(std::chrono::milliseconds(50)),
            std::future_status::timeout);
  ASSERT_EQ(poll.wait_for(std::chrono::milliseconds(1)),
            std::future_status::timeout);

  state_->Close();
  ASSERT_EQ(barrier.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_EQ(poll.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(barrier.get().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(poll.get().epoch(), epoch);  // The current view, unchanged.

  const absl::Time start = absl::Now();
  EXPECT_EQ(state_->AwaitBarrier(c.w1, "other", kLongWait).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(state_->AwaitView(epoch + 1, true, kLongWait).epoch(), epoch);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // w1's arrival above completed barrier "b": it passes despite closing.
  EXPECT_TRUE(state_->AwaitBarrier(c.w1, "b", kLongWait).status().ok());
}

// --- Consistency, clocks and the watchdog -----------------------------------

TEST_F(ClusterStateTest, InitialViewCarriesTheDefaultConsistency) {
  // kConfig has no consistency block: the loader's defaults apply.
  const ConsistencyConfig c = state_->View().consistency();  // a copy: View() returns a temporary
  EXPECT_EQ(c.mode(), ASYNC);
  EXPECT_EQ(c.staleness(), 0u);
  EXPECT_EQ(c.watchdog_timeout_ms(), 10000u);
  EXPECT_EQ(c.watchdog_interval_ms(), 5000u);
}

// 1 server and 3 workers under BSP, with a watchdog the fake clock crosses
// explicitly (1 s timeout, repeated every 500 ms) and a heartbeat timeout
// nothing here reaches.
constexpr char kBspConfig[] = R"pb(
  cluster {
    num_servers: 1
    num_workers: 3
    num_slots: 8
    heartbeat_interval_ms: 100
    heartbeat_timeout_ms: 600000
  }
  consistency { mode: BSP watchdog_timeout_ms: 1000 watchdog_interval_ms: 500 }
)pb";

class ConsistencyStateTest : public ::testing::Test {
 protected:
  ConsistencyStateTest() { Init(BSP); }

  // Rebuilds the state from kBspConfig with `mode` instead of BSP.
  void Init(ConsistencyMode mode) {
    absl::StatusOr<JobConfig> config = ParseJobConfig(kBspConfig, "test");
    ASSERT_TRUE(config.ok()) << config.status();
    config->mutable_consistency()->set_mode(mode);
    fingerprint_ = ConfigFingerprint(*config);
    state_ = std::make_unique<ClusterState>(*config, &clock_);
  }

  RegisterResponse MustRegister(Role role) {
    RegisterRequest request;
    request.set_role(role);
    if (role == SERVER) request.set_data_endpoint("tcp://s:1");
    request.set_config_fingerprint(fingerprint_);
    absl::StatusOr<RegisterResponse> r = state_->Register(request);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : RegisterResponse();
  }
  uint64_t AddWorker() { return MustRegister(WORKER).node_id(); }

  void Beat(uint64_t node_id, uint64_t clock) {
    HeartbeatRequest request;
    request.set_node_id(node_id);
    request.set_clock(clock);
    ASSERT_TRUE(state_->Heartbeat(request).ok());
  }

  NodeInfo NodeInView(uint64_t node_id) const {
    const ClusterView view = state_->View();
    for (const NodeInfo& n : view.nodes()) {
      if (n.node_id() == node_id) return n;
    }
    ADD_FAILURE() << "node " << node_id << " not in the view";
    return NodeInfo();
  }

  static ConsistencyConfig Mode(ConsistencyMode mode, uint32_t staleness = 0) {
    ConsistencyConfig c;
    c.set_mode(mode);
    c.set_staleness(staleness);
    return c;
  }

  // One server and three workers (node ids 2, 3, 4; ranks 0, 1, 2).
  struct Workers {
    uint64_t w0, w1, w2;
  };
  Workers StartJob() {
    MustRegister(SERVER);
    Workers w;
    w.w0 = AddWorker();
    w.w1 = AddWorker();
    w.w2 = AddWorker();
    EXPECT_EQ(state_->job_state(), RUNNING);
    return w;
  }

  FakeClock clock_;
  uint64_t fingerprint_ = 0;
  std::unique_ptr<ClusterState> state_;
};

constexpr uint64_t kFinishedClock = uint64_t{1} << 62;

TEST_F(ConsistencyStateTest, InitialViewCarriesTheConfigsConsistency) {
  const ConsistencyConfig c = state_->View().consistency();  // a copy: View() returns a temporary
  EXPECT_EQ(c.mode(), BSP);
  EXPECT_EQ(c.staleness(), 0u);
  EXPECT_EQ(c.watchdog_timeout_ms(), 1000u);
  EXPECT_EQ(c.watchdog_interval_ms(), 500u);
  // Registration responses carry it too.
  EXPECT_EQ(MustRegister(WORKER).view().consistency().mode(), BSP);
}

TEST_F(ConsistencyStateTest, SetConsistencyChangesModeAndStalenessOnly) {
  StartJob();
  const uint64_t epoch = state_->View().epoch();
  ConsistencyConfig request = Mode(SSP, 3);
  // Watchdog settings in the request are not taken.
  request.set_watchdog_timeout_ms(7);
  request.set_watchdog_interval_ms(9);
  absl::StatusOr<uint64_t> new_epoch = state_->SetConsistency(request);
  ASSERT_TRUE(new_epoch.ok()) << new_epoch.status();
  EXPECT_EQ(*new_epoch, epoch + 1);
  ClusterView view = state_->View();
  EXPECT_EQ(view.epoch(), epoch + 1);
  EXPECT_EQ(view.consistency().mode(), SSP);
  EXPECT_EQ(view.consistency().staleness(), 3u);
  EXPECT_EQ(view.consistency().watchdog_timeout_ms(), 1000u);
  EXPECT_EQ(view.consistency().watchdog_interval_ms(), 500u);
  // Membership is untouched.
  EXPECT_EQ(view.nodes_size(), 4);
  EXPECT_EQ(view.job_state(), RUNNING);

  // Leaving SSP clears the staleness.
  new_epoch = state_->SetConsistency(Mode(ASYNC));
  ASSERT_TRUE(new_epoch.ok()) << new_epoch.status();
  EXPECT_EQ(*new_epoch, epoch + 2);
  view = state_->View();
  EXPECT_EQ(view.consistency().mode(), ASYNC);
  EXPECT_EQ(view.consistency().staleness(), 0u);
  EXPECT_EQ(view.consistency().watchdog_timeout_ms(), 1000u);
}

TEST_F(ConsistencyStateTest, SetConsistencyRejectsBadModesWithoutChanges) {
  StartJob();
  ASSERT_TRUE(state_->SetConsistency(Mode(SSP, 2)).ok());
  const ClusterView before = state_->View();

  absl::StatusOr<uint64_t> r = state_->SetConsistency(Mode(BSP, 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("staleness"));
  // proto3 enums are open: a number no version defines arrives as is.
  EXPECT_EQ(state_->SetConsistency(Mode(static_cast<ConsistencyMode>(9)))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_->SetConsistency(Mode(CONSISTENCY_MODE_UNSPECIFIED))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_->SetConsistency(Mode(SSP, 1000001)).status().code(),
            absl::StatusCode::kInvalidArgument);

  const ClusterView after = state_->View();
  EXPECT_EQ(after.epoch(), before.epoch());
  EXPECT_EQ(after.consistency().mode(), SSP);
  EXPECT_EQ(after.consistency().staleness(), 2u);
  EXPECT_EQ(after.consistency().watchdog_timeout_ms(), 1000u);
  EXPECT_EQ(after.consistency().watchdog_interval_ms(), 500u);
}

TEST_F(ConsistencyStateTest, StatusReportsLiveWorkersClocksAndSilence) {
  const Workers w = StartJob();
  Beat(w.w0, 5);
  clock_.Advance(absl::Milliseconds(300));
  Beat(w.w1, 7);
  clock_.Advance(absl::Milliseconds(200));

  GetStatusResponse status = state_->Status();
  EXPECT_EQ(status.view().epoch(), state_->View().epoch());
  EXPECT_EQ(status.view().nodes_size(), 4);
  // Workers only, by rank; w2 never sent a clock and is at its start clock.
  ASSERT_EQ(status.clocks_size(), 3);
  EXPECT_EQ(status.clocks(0).rank(), 0u);
  EXPECT_EQ(status.clocks(0).clock(), 5u);
  EXPECT_EQ(status.clocks(0).silent_ms(), 500u);
  EXPECT_EQ(status.clocks(1).rank(), 1u);
  EXPECT_EQ(status.clocks(1).clock(), 7u);
  EXPECT_EQ(status.clocks(1).silent_ms(), 200u);
  EXPECT_EQ(status.clocks(2).rank(), 2u);
  EXPECT_EQ(status.clocks(2).clock(), 0u);
  EXPECT_EQ(status.clocks(2).silent_ms(), 500u);

  // Clocks never go back; a heartbeat resets the silence.
  Beat(w.w1, 6);
  // Workers that left are not listed.
  LeaveRequest leave;
  leave.set_node_id(w.w0);
  ASSERT_TRUE(state_->Leave(leave).ok());
  status = state_->Status();
  ASSERT_EQ(status.clocks_size(), 2);
  EXPECT_EQ(status.clocks(0).rank(), 1u);
  EXPECT_EQ(status.clocks(0).clock(), 7u);
  EXPECT_EQ(status.clocks(0).silent_ms(), 0u);
  EXPECT_EQ(status.clocks(1).rank(), 2u);
}

TEST_F(ConsistencyStateTest, JoiningWorkerStartsAtTheMaxLiveClock) {
  const Workers w = [&] {
    MustRegister(SERVER);
    Workers w;
    w.w0 = AddWorker();
    w.w1 = AddWorker();
    return w;
  }();
  EXPECT_EQ(NodeInView(w.w0).start_clock(), 0u);
  Beat(w.w0, 4);
  // A finished worker's clock is not a step anyone could start at.
  Beat(w.w1, kFinishedClock);
  const RegisterResponse r2 = MustRegister(WORKER);
  EXPECT_EQ(r2.rank(), 2u);
  ASSERT_EQ(r2.view().nodes_size(), 4);
  EXPECT_EQ(r2.view().nodes(3).node_id(), r2.node_id());
  EXPECT_EQ(r2.view().nodes(3).start_clock(), 4u);
  EXPECT_EQ(NodeInView(r2.node_id()).start_clock(), 4u);
  // Until it reports, its clock is its start clock.
  GetStatusResponse status = state_->Status();
  ASSERT_EQ(status.clocks_size(), 3);
  EXPECT_EQ(status.clocks(2).clock(), 4u);

  // Workers no longer live do not count: w0 reached 9, then left.
  Beat(w.w0, 9);
  LeaveRequest leave;
  leave.set_node_id(w.w0);
  ASSERT_TRUE(state_->Leave(leave).ok());
  const RegisterResponse r0 = MustRegister(WORKER);
  EXPECT_EQ(r0.rank(), 0u);
  EXPECT_EQ(NodeInView(r0.node_id()).start_clock(), 4u);
}

TEST_F(ConsistencyStateTest, WatchdogIsQuietInAsync) {
  Init(ASYNC);
  const Workers w = StartJob();
  Beat(w.w0, 0);
  Beat(w.w1, 5);
  Beat(w.w2, 5);
  EXPECT_THAT(state_->CheckProgress(), IsEmpty());
  clock_.Advance(absl::Seconds(60));
  EXPECT_THAT(state_->CheckProgress(), IsEmpty());
  // The same stall is reported once the job becomes synchronous.
  ASSERT_TRUE(state_->SetConsistency(Mode(BSP)).ok());
  EXPECT_THAT(state_->CheckProgress(),
              ElementsAre(HasSubstr("by worker ranks 0 (clock 0,")));
}

TEST_F(ConsistencyStateTest, WatchdogNamesTheSlowRanksAndRepeatsEveryInterval) {
  const Workers w = StartJob();
  Beat(w.w0, 3);
  Beat(w.w1, 4);
  Beat(w.w2, 3);
  EXPECT_THAT(state_->CheckProgress(), IsEmpty());
  clock_.Advance(absl::Milliseconds(999));
  EXPECT_THAT(state_->CheckProgress(), IsEmpty());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_THAT(state_->CheckProgress(),
              ElementsAre("watchdog: BSP job held back for 1s by worker ranks "
                          "0 (clock 3, last heard 1s ago), 2 (clock 3, last "
                          "heard 1s ago); the fastest worker is at clock 4"));
  // Not again before the interval has passed.
  clock_.Advance(absl::Milliseconds(499));
  EXPECT_THAT(state_->CheckProgress(), IsEmpty());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_THAT(state_->CheckProgress(),
              ElementsAre("watchdog: BSP job held back for 1.5s by worker ranks "
                          "0 (clock 3, last heard 1.5s ago), 2 (clock 3, last "
                          "heard 1.5s ago); the fastest worker is at clock 4"));

  // Rank 2 catches up: only rank 0 holds the job back.
  Beat(w.w2, 4);
  clock_.Advance(absl::Milliseconds(500));
  EXPECT_THAT(state_->CheckProgress(),
              ElementsAre(HasSubstr("by worker ranks 0 (clock 3, last heard 2s ago);")));

  // Everyone level: nobody is held back, however long it lasts.
  Beat(w.w0, 4);
  EXPECT_THAT(state_->CheckProgress(), IsEmpty());
  clock_.Advance(absl::Seconds(5));
  EXPECT_THAT(state_->CheckProgress(), IsEmpty());

  // Once someone is ahead again, the slowest clock has not moved for 5 s:
  // that is reported at once.
  Beat(w.w1, 5);
  EXPECT_THAT(state_->CheckProgress(),
              ElementsAre(AllOf(HasSubstr("held back for 5s"),
                                HasSubstr("by worker ranks 0 (clock 4,"),
                                HasSubstr("2 (clock 4,"),
                                HasSubstr("the fastest worker is at clock 5"))));
}

TEST_F(ConsistencyStateTest, WatchdogTimesAStallFromTheLastMoveEvenBetweenLogs) {
  const Workers w = StartJob();
  Beat(w.w0, 3);
  Beat(w.w1, 4);
  Beat(w.w2, 4);
  EXPECT_THAT(state_->CheckProgress(), IsEmpty());
  clock_.Advance(absl::Milliseconds(1000));
  ASSERT_THAT(state_->CheckProgress(), ElementsAre(HasSubstr("for 1s")));
  // The slowest clock moves right after a log, inside the quiet interval,
  // and then stalls again.
  clock_.Advance(absl::Milliseconds(100));
  Beat(w.w0, 4);
  Beat(w.w1, 5);
  Beat(w.w2, 5);
  EXPECT_THAT(state_->CheckProgress(), IsEmpty());
  clock_.Advance(absl::Milliseconds(999));
  EXPECT_THAT(state_->CheckProgress(), IsEmpty());
  // One timeout after the move, not one timeout after the interval ended.
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_THAT(state_->CheckProgress(),
              ElementsAre("watchdog: BSP job held back for 1s by worker ranks "
                          "0 (clock 4, last heard 1s ago); the fastest worker "
                          "is at clock 5"));
}

TEST_F(ConsistencyStateTest, WatchdogIgnoresFinishedWorkers) {
  const Workers w = StartJob();
  Beat(w.w0, 3);
  Beat(w.w1, kFinishedClock);
  Beat(w.w2, 3);
  EXPECT_THAT(state_->CheckProgress(), IsEmpty());
  // A finished worker is not "ahead": nobody waits for the others.
  clock_.Advance(absl::Seconds(5));
  EXPECT_THAT(state_->CheckProgress(), IsEmpty());
  Beat(w.w2, 4);
  clock_.Advance(absl::Seconds(1));
  EXPECT_THAT(state_->CheckProgress(),
              ElementsAre(AllOf(HasSubstr("by worker ranks 0 (clock 3,"),
                                HasSubstr("the fastest worker is at clock 4"))));
}

TEST_F(ConsistencyStateTest, WatchdogNamesTheRanksABarrierWaitsFor) {
  const Workers w = StartJob();
  // Rank 0 waits at the barrier (in real time, for long) while the fake
  // clock runs past the watchdog timeout.
  auto waiter = std::async(std::launch::async, [&] {
    return state_->AwaitBarrier(w.w0, "epoch-1", kLongWait).status();
  });
  // The wait is timed from the arrival, which happens on the other thread:
  // step the fake clock past the timeout until the watchdog sees it.
  std::vector<std::string> lines;
  for (int i = 0; i < 1000 && lines.empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(5));
    clock_.Advance(absl::Milliseconds(1100));
    lines = state_->CheckProgress();
  }
  EXPECT_THAT(lines, ElementsAre("watchdog: barrier 'epoch-1' has waited 1s for "
                                 "worker ranks 1, 2"));
  ASSERT_EQ(waiter.wait_for(std::chrono::milliseconds(1)),
            std::future_status::timeout);

  // Rank 1 arrives (without waiting): only rank 2 is missing.
  EXPECT_EQ(state_->AwaitBarrier(w.w1, "epoch-1", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  clock_.Advance(absl::Milliseconds(500));
  EXPECT_THAT(state_->CheckProgress(),
              ElementsAre("watchdog: barrier 'epoch-1' has waited 1s for "
                          "worker ranks 2"));

  // Rank 2 completes it: the waiter passes and the watchdog falls silent.
  EXPECT_TRUE(state_->AwaitBarrier(w.w2, "epoch-1", kLongWait).status().ok());
  ASSERT_EQ(waiter.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(waiter.get().ok());
  clock_.Advance(absl::Seconds(5));
  EXPECT_THAT(state_->CheckProgress(), IsEmpty());
  // It stays complete when a replacement that never arrived at it joins.
  LeaveRequest leave;
  leave.set_node_id(w.w2);
  ASSERT_TRUE(state_->Leave(leave).ok());
  EXPECT_EQ(MustRegister(WORKER).rank(), 2u);
  clock_.Advance(absl::Seconds(5));
  EXPECT_THAT(state_->CheckProgress(), IsEmpty());
}

}  // namespace
}  // namespace ps
