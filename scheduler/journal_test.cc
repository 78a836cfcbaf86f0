// The scheduler's journal: the file format refuses damage, and a state
// rebuilt from a journal serves the same job (ids, ranks, slots, shards,
// barriers, checkpoint) to the nodes that were already there.
#include "common/status.h"
#include "scheduler/journal.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/cluster_state.h"
#include "scheduler/scheduler.h"

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
    scheduler_unreachable_timeout_ms: 5000
  }
)pb";

JobConfig TestConfig() {
  absl::StatusOr<JobConfig> config = ParseJobConfig(kConfig, "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : JobConfig();
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
}

TEST(JournalFileTest, RoundTripsAndRefusesDamage) {
  JournalFile file(TempDir("journal-file/nested"));
  EXPECT_EQ(file.Read().status().code(), absl::StatusCode::kNotFound);
  SchedulerJournal j;
  j.set_config_fingerprint(42);
  j.set_next_node_id(7);
  j.mutable_view()->set_epoch(9);
  ASSERT_TRUE(file.Write(j, /*sync=*/true).ok());
  absl::StatusOr<SchedulerJournal> back = file.Read();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->next_node_id(), 7u);
  EXPECT_EQ(back->view().epoch(), 9u);

  // One flipped payload byte: a checksum mismatch, not a different state.
  std::string data;
  {
    std::ifstream in(file.path(), std::ios::binary);
    data.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string flipped = data;
  flipped.back() ^= 0x40;
  std::ofstream(file.path(), std::ios::binary | std::ios::trunc) << flipped;
  EXPECT_EQ(file.Read().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(file.Read().status().message(), HasSubstr("checksum"));
  // Truncated.
  std::ofstream(file.path(), std::ios::binary | std::ios::trunc) << data.substr(0, data.size() - 3);
  EXPECT_EQ(file.Read().status().code(), absl::StatusCode::kDataLoss);
  // Not a journal at all.
  std::ofstream(file.path(), std::ios::binary | std::ios::trunc) << "hello";
  EXPECT_EQ(file.Read().status().code(), absl::StatusCode::kDataLoss);
  // Set aside: gone under its name, kept under the other.
  ASSERT_TRUE(file.SetAside("old").ok());
  EXPECT_EQ(file.Read().status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(std::ifstream(file.path() + ".old").good());
}

// Past the heartbeat timeout plus the grace a restarted scheduler gives.
absl::Duration ClusterStateGrace() { return absl::Seconds(2); }

class RecoveryTest : public ::testing::Test {
 protected:
  RecoveryTest() : config_(TestConfig()), state_(Make()) {}

  std::unique_ptr<ClusterState> Make() {
    auto state = std::make_unique<ClusterState>(config_, &clock_);
    EXPECT_TRUE(state
                    ->SetJournal([this](const SchedulerJournal& j, bool) {
                      if (!disk_error_.ok()) return disk_error_;
                      journal_ = j;
                      ++writes_;
                      return absl::OkStatus();
                    })
                    .ok());
    return state;
  }

  RegisterRequest Request(Role role, const std::string& endpoint = "") const {
    RegisterRequest r;
    r.set_role(role);
    r.set_data_endpoint(endpoint);
    r.set_config_fingerprint(ConfigFingerprint(config_));
    r.set_trains_shards(role == WORKER);
    return r;
  }

  absl::Status Beat(ClusterState* state, uint64_t id, uint64_t clock = 0) {
    HeartbeatRequest hb;
    hb.set_node_id(id);
    hb.set_clock(clock);
    return state->Heartbeat(hb).status();
  }

  FakeClock clock_{absl::FromUnixSeconds(1700000000)};
  JobConfig config_;
  std::optional<SchedulerJournal> journal_;
  int writes_ = 0;
  // What the journal's writes answer.
  absl::Status disk_error_;
  std::unique_ptr<ClusterState> state_;
};

TEST_F(RecoveryTest, EveryAnsweredChangeIsJournaledFirst) {
  const int before = writes_;
  auto server = state_->Register(Request(SERVER, "tcp://a:1"));
  ASSERT_TRUE(server.ok());
  // The registration's answer carries an epoch the journal already has.
  ASSERT_TRUE(journal_.has_value());
  EXPECT_GT(writes_, before);
  EXPECT_EQ(journal_->view().epoch(), server->view().epoch());
  EXPECT_EQ(journal_->next_node_id(), server->node_id() + 1);
  // Heartbeats change no journaled state: no write per heartbeat.
  const int after_register = writes_;
  ASSERT_TRUE(Beat(state_.get(), server->node_id()).ok());
  EXPECT_EQ(writes_, after_register);
}

TEST_F(RecoveryTest, AChangeTheJournalCouldNotRecordIsNotAcknowledged) {
  auto server = state_->Register(Request(SERVER, "tcp://a:1"));
  ASSERT_TRUE(server.ok());
  disk_error_ = absl::ResourceExhaustedError("no space left on device");
  const absl::StatusOr<RegisterResponse> unrecorded =
      state_->Register(Request(SERVER, "tcp://b:1"));
  ASSERT_FALSE(unrecorded.ok())
      << "a change the journal could not record was acknowledged";
  EXPECT_EQ(unrecorded.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(unrecorded.status().message(),
              HasSubstr("no space left on device"));
  EXPECT_THAT(unrecorded.status().message(), HasSubstr("journal"));
  // Until the journal can be written, nothing changes: requests are
  // refused, nobody is declared dead; heartbeats are still answered.
  EXPECT_EQ(state_->JournalError().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(state_->JournalError().message(),
              HasSubstr("no space left on device"));
  const uint64_t epoch = state_->View().epoch();
  EXPECT_EQ(state_->Register(Request(WORKER)).status().code(),
            absl::StatusCode::kUnavailable);
  LeaveRequest leave;
  leave.set_node_id(server->node_id());
  EXPECT_EQ(state_->Leave(leave).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(state_->SetConsistency(config_.consistency()).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Beat(state_.get(), server->node_id()).ok());
  clock_.Advance(absl::Seconds(30));
  EXPECT_TRUE(state_->ExpireSilentNodes().empty());
  EXPECT_EQ(state_->View().epoch(), epoch);
  // The disk is back: the periodic sync records the state, changes are
  // taken again.
  disk_error_ = absl::OkStatus();
  ASSERT_TRUE(Beat(state_.get(), server->node_id()).ok());
  state_->SyncJournal();
  EXPECT_TRUE(state_->JournalError().ok());
  ASSERT_TRUE(journal_.has_value());
  EXPECT_EQ(journal_->view().epoch(), state_->View().epoch());
  EXPECT_TRUE(state_->Register(Request(WORKER)).ok());
}

TEST_F(RecoveryTest, ARestartedStateServesTheSameJob) {
  auto s0 = state_->Register(Request(SERVER, "tcp://a:1"));
  auto s1 = state_->Register(Request(SERVER, "tcp://b:1"));
  auto w0 = state_->Register(Request(WORKER));
  auto w1 = state_->Register(Request(WORKER));
  ASSERT_TRUE(s0.ok() && s1.ok() && w0.ok() && w1.ok());
  ASSERT_EQ(state_->job_state(), RUNNING);
  // Worker 0 finishes its shard; a barrier completes; a clock is reported.
  ClaimShardRequest claim;
  claim.set_node_id(w0->node_id());
  *claim.mutable_finished() = w0->shard();
  ASSERT_TRUE(state_->ClaimShard(claim, absl::ZeroDuration()).ok());
  ASSERT_TRUE(Beat(state_.get(), w1->node_id(), 17).ok());
  state_->SyncJournal();
  std::thread other([&] {
    EXPECT_TRUE(state_->AwaitBarrier(w1->node_id(), "start", absl::Seconds(20)).ok());
  });
  EXPECT_TRUE(state_->AwaitBarrier(w0->node_id(), "start", absl::Seconds(20)).ok());
  other.join();
  const ClusterView before = state_->View();
  ASSERT_TRUE(journal_.has_value());
  const SchedulerJournal saved = *journal_;

  // The scheduler dies; a new one takes the job back.
  clock_.Advance(absl::Seconds(3));
  auto restarted = Make();
  ASSERT_TRUE(restarted->Recover(saved).ok());
  const ClusterView after = restarted->View();
  EXPECT_GT(after.epoch(), before.epoch());
  EXPECT_EQ(after.scheduler_restarts(), 1u);
  EXPECT_EQ(after.recovered_nodes(), 4u);
  EXPECT_EQ(after.job_state(), RUNNING);
  EXPECT_EQ(after.slot_owner_size(), before.slot_owner_size());
  for (int s = 0; s < before.slot_owner_size(); ++s) {
    EXPECT_EQ(after.slot_owner(s), before.slot_owner(s));
  }
  // Every node keeps its id: heartbeats go on as if nothing happened,
  // though 3 s passed (beyond the 1 s timeout) while no scheduler ran.
  for (uint64_t id : {s0->node_id(), s1->node_id(), w0->node_id(), w1->node_id()}) {
    EXPECT_TRUE(Beat(restarted.get(), id).ok()) << id;
  }
  EXPECT_TRUE(restarted->ExpireSilentNodes().empty());
  // The worker's clock came back: a newcomer would start there.
  GetStatusResponse status = restarted->Status();
  bool saw = false;
  for (const WorkerClock& c : status.clocks()) saw |= c.rank() == w1->rank() && c.clock() == 17;
  EXPECT_TRUE(saw);
  // The completed barrier stays completed; the done shard stays done.
  EXPECT_TRUE(restarted->AwaitBarrier(w0->node_id(), "start", absl::ZeroDuration()).ok());
  auto again = restarted->ClaimShard(claim, absl::ZeroDuration());
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->result(), ClaimShardResponse::ASSIGNED);
  // A new node gets a fresh id, never one of the old ones.
  auto extra = restarted->Register(Request(SERVER, "tcp://c:1"));
  EXPECT_FALSE(extra.ok());  // both server ranks are held
  EXPECT_EQ(extra.status().code(), absl::StatusCode::kResourceExhausted);
  // Silence after the restart is still detected, once the nodes had the
  // reconnect grace on top of the timeout.
  clock_.Advance(absl::Milliseconds(1500));
  EXPECT_TRUE(restarted->ExpireSilentNodes().empty());
  clock_.Advance(ClusterStateGrace());
  // Every node silent at once is first held as the scheduler's suspected
  // isolation (cluster.isolation_hold_ms), then declared dead.
  EXPECT_TRUE(restarted->ExpireSilentNodes().empty());
  clock_.Advance(absl::Milliseconds(config_.cluster().isolation_hold_ms()));
  EXPECT_EQ(restarted->ExpireSilentNodes().size(), 4u);
}

TEST_F(RecoveryTest, AClaimRetriedAfterALostAnswerGetsTheSameShard) {
  ASSERT_TRUE(state_->Register(Request(SERVER, "tcp://a:1")).ok());
  ASSERT_TRUE(state_->Register(Request(SERVER, "tcp://b:1")).ok());
  auto w0 = state_->Register(Request(WORKER));
  auto w1 = state_->Register(Request(WORKER));
  ASSERT_TRUE(w0.ok() && w1.ok());
  // Worker 1 dies: its shard is orphaned. The others heartbeat on.
  const ClusterView view = state_->View();
  for (int beat = 0; beat < 12; ++beat) {
    clock_.Advance(absl::Milliseconds(100));
    for (const NodeInfo& n : view.nodes()) {
      if (n.node_id() != w1->node_id()) {
        ASSERT_TRUE(Beat(state_.get(), n.node_id()).ok());
      }
    }
  }
  ASSERT_EQ(state_->ExpireSilentNodes().size(), 1u);
  ClaimShardRequest claim;
  claim.set_node_id(w0->node_id());
  *claim.mutable_finished() = w0->shard();
  auto first = state_->ClaimShard(claim, absl::ZeroDuration());
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->result(), ClaimShardResponse::ASSIGNED);
  EXPECT_EQ(first->shard().shard(), w1->shard().shard());
  // The answer is lost with the scheduler; the worker asks again.
  const SchedulerJournal saved = *journal_;
  auto restarted = Make();
  ASSERT_TRUE(restarted->Recover(saved).ok());
  auto second = restarted->ClaimShard(claim, absl::ZeroDuration());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->result(), ClaimShardResponse::ASSIGNED);
  EXPECT_EQ(second->shard().shard(), first->shard().shard());
}

TEST_F(RecoveryTest, AJournalThatDoesNotFitIsRefusedAndChangesNothing) {
  ASSERT_TRUE(state_->Register(Request(SERVER, "tcp://a:1")).ok());
  ASSERT_TRUE(journal_.has_value());
  const SchedulerJournal saved = *journal_;
  auto fresh = Make();
  const ClusterView before = fresh->View();
  SchedulerJournal bad_rank = saved;
  bad_rank.mutable_nodes(0)->mutable_info()->set_rank(5);
  absl::Status s = fresh->Recover(bad_rank);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("rank 5"));
  SchedulerJournal bad_slots = saved;
  bad_slots.mutable_view()->set_num_slots(9);
  EXPECT_EQ(fresh->Recover(bad_slots).code(), absl::StatusCode::kDataLoss);
  SchedulerJournal bad_shards = saved;
  bad_shards.mutable_shards()->RemoveLast();
  EXPECT_EQ(fresh->Recover(bad_shards).code(), absl::StatusCode::kDataLoss);
  SchedulerJournal bad_clock = saved;
  bad_clock.set_abandoned_checkpoint(kFinishedClock);
  s = fresh->Recover(bad_clock);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("abandoned_checkpoint"));
  SchedulerJournal other_job = saved;
  other_job.set_config_fingerprint(saved.config_fingerprint() + 1);
  EXPECT_EQ(fresh->Recover(other_job).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fresh->View().epoch(), before.epoch());
  EXPECT_EQ(fresh->View().nodes_size(), 0);
}

// The whole server: a scheduler started again in the same state dir takes
// the job back; one started after the nodes' unreachable bound does not.
TEST(SchedulerRestartTest, TakesBackALiveJobButNotAnAbandonedOne) {
  const std::string dir = TempDir("scheduler-restart");
  JobConfig config = TestConfig();
  config.mutable_cluster()->set_scheduler_state_dir(dir);
  ASSERT_EQ(config.cluster().scheduler_state_dir(), dir);
  FakeClock clock(absl::FromUnixSeconds(1700000000));
  SchedulerServer::Options options;
  options.config = config;
  options.clock = &clock;
  options.run_failure_detector = false;
  uint64_t server_id = 0;
  {
    auto first = SchedulerServer::Start(options);
    ASSERT_TRUE(first.ok()) << first.status();
    RegisterRequest r;
    r.set_role(SERVER);
    r.set_data_endpoint("tcp://a:1");
    r.set_config_fingerprint(ConfigFingerprint(config));
    auto reg = (*first)->state()->Register(r);
    ASSERT_TRUE(reg.ok());
    server_id = reg->node_id();
  }
  {
    auto second = SchedulerServer::Start(options);
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ((*second)->state()->View().scheduler_restarts(), 1u);
    HeartbeatRequest hb;
    hb.set_node_id(server_id);
    EXPECT_TRUE((*second)->state()->Heartbeat(hb).ok());
  }
  // Past the unreachable bound every node has given up: a new job.
  clock.Advance(absl::Seconds(6));
  auto third = SchedulerServer::Start(options);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ((*third)->state()->View().scheduler_restarts(), 0u);
  EXPECT_EQ((*third)->state()->View().nodes_size(), 0);
}

// A directory fsync that fails is an error of a synced write: the rename
// may not survive a crash.
TEST(JournalFileTest, AFailedDirectorySyncIsAnError) {
  class NoDirSync final : public FileEnv {
   public:
    absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
        const std::string& path) override {
      return FileEnv::Default()->NewWritableFile(path);
    }
    absl::Status RenameFile(const std::string& from,
                            const std::string& to) override {
      return FileEnv::Default()->RenameFile(from, to);
    }
    absl::Status RemoveFile(const std::string& path) override {
      return FileEnv::Default()->RemoveFile(path);
    }
    absl::Status SyncDir(const std::string& dir) override {
      return absl::InternalError("cannot fsync directory " + dir +
                                 ": Input/output error");
    }
    absl::Status CreateDirs(const std::string& dir) override {
      return FileEnv::Default()->CreateDirs(dir);
    }
  };
  NoDirSync env;
  JournalFile file(TempDir("journal-dirsync"), &env);
  SchedulerJournal j;
  j.set_next_node_id(3);
  EXPECT_TRUE(file.Write(j, /*sync=*/false).ok())
      << "an unsynced write syncs nothing";
  const absl::Status synced = file.Write(j, /*sync=*/true);
  EXPECT_FALSE(synced.ok());
  EXPECT_THAT(synced.message(), HasSubstr("fsync directory"));
}

TEST(JournalFileTest, OneSchedulerAtATimeHoldsTheDirectory) {
  const std::string dir = TempDir("journal-lock");
  auto first = std::make_unique<JournalFile>(dir);
  ASSERT_TRUE(first->Lock().ok());
  JournalFile second(dir);
  const absl::Status refused = second.Lock();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("pid ", ::getpid())));
  first.reset();  // as when its process ends, also by SIGKILL
  EXPECT_TRUE(second.Lock().ok());
}

TEST(SchedulerStateDirTest, ADefaultPerJobDirectoryUnderTheXdgStateHome) {
  JobConfig config = TestConfig();
  config.set_name("ctr-async");
  EXPECT_EQ(DefaultSchedulerStateDir(config, "/state", "/home/u"),
            "/state/ps/ctr-async");
  EXPECT_EQ(DefaultSchedulerStateDir(config, "", "/home/u"),
            "/home/u/.local/state/ps/ctr-async");
  EXPECT_EQ(DefaultSchedulerStateDir(config, "", ""), "");
  config.set_name("../a b/c");
  EXPECT_EQ(DefaultSchedulerStateDir(config, "/s", ""), "/s/ps/.._a_b_c");
  config.set_name("..");
  EXPECT_EQ(DefaultSchedulerStateDir(config, "/s", ""), "/s/ps/job");
}

class LaunchTest : public ::testing::Test {
 protected:
  LaunchTest() {
    options_.config = TestConfig();
    options_.clock = &clock_;
    options_.run_failure_detector = false;
    options_.default_state_dir = TempDir(absl::StrCat(
        "launch-",
        ::testing::UnitTest::GetInstance()->current_test_info()->name()));
  }

  // A scheduler of launch `launch` with one server registered; its port.
  int RunFirst(const std::string& launch) {
    options_.launch_id = launch;
    auto first = SchedulerServer::Start(options_);
    EXPECT_TRUE(first.ok()) << first.status();
    if (!first.ok()) return 0;
    RegisterRequest r;
    r.set_role(SERVER);
    r.set_data_endpoint("tcp://a:1");
    r.set_config_fingerprint(ConfigFingerprint(options_.config));
    EXPECT_TRUE((*first)->state()->Register(r).ok());
    return (*first)->port();
  }

  FakeClock clock_{absl::FromUnixSeconds(1700000000)};
  SchedulerServer::Options options_;
};

TEST_F(LaunchTest, TheSameLaunchIsTakenBackOnThePortItsNodesKnow) {
  const int port = RunFirst("run-1");
  ASSERT_NE(port, 0);
  // Started again with the same command: any port, the same launch.
  auto again = SchedulerServer::Start(options_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->state()->View().scheduler_restarts(), 1u);
  EXPECT_EQ((*again)->port(), port);
}

TEST_F(LaunchTest, ANewLaunchOfTheSameJobStartsAfresh) {
  ASSERT_NE(RunFirst("run-1"), 0);
  options_.launch_id = "run-2";
  auto fresh = SchedulerServer::Start(options_);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ((*fresh)->state()->View().scheduler_restarts(), 0u);
  EXPECT_EQ((*fresh)->state()->View().nodes_size(), 0);
}

TEST_F(LaunchTest, AFinishedJobIsNotResumed) {
  options_.launch_id = "run-1";
  {
    auto first = SchedulerServer::Start(options_);
    ASSERT_TRUE(first.ok()) << first.status();
    ClusterState* state = (*first)->state();
    const uint64_t fingerprint = ConfigFingerprint(options_.config);
    std::vector<uint64_t> workers;
    for (Role role : {SERVER, SERVER, WORKER, WORKER}) {
      RegisterRequest r;
      r.set_role(role);
      if (role == SERVER)
        r.set_data_endpoint(absl::StrCat("tcp://a:", workers.size() + 1));
      r.set_config_fingerprint(fingerprint);
      auto reg = state->Register(r);
      ASSERT_TRUE(reg.ok()) << reg.status();
      if (role == WORKER) workers.push_back(reg->node_id());
      if (role == SERVER) workers.push_back(0);
    }
    for (uint64_t id : workers) {
      if (id == 0) continue;
      LeaveRequest leave;
      leave.set_node_id(id);
      leave.set_finished(true);
      ASSERT_TRUE(state->Leave(leave).ok());
    }
    ASSERT_EQ(state->job_state(), FINISHED);
  }
  auto next = SchedulerServer::Start(options_);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*next)->state()->View().scheduler_restarts(), 0u);
  EXPECT_EQ((*next)->state()->job_state(), STARTING);
}

TEST_F(LaunchTest, ADefaultDirectoryInUseLeavesTheSecondJobWithoutAJournal) {
  options_.launch_id = "a";
  auto first = SchedulerServer::Start(options_);
  ASSERT_TRUE(first.ok()) << first.status();
  options_.launch_id = "b";
  auto second = SchedulerServer::Start(options_);
  ASSERT_TRUE(second.ok()) << "a default directory in use must not stop a job: "
                           << second.status();
  EXPECT_TRUE((*second)->state()->JournalError().ok());
  // A directory the config names must be the scheduler's own.
  options_.config.mutable_cluster()->set_scheduler_state_dir(
      options_.default_state_dir);
  auto third = SchedulerServer::Start(options_);
  ASSERT_FALSE(third.ok());
  EXPECT_THAT(third.status().message(), HasSubstr("another scheduler"));
}

}  // namespace
}  // namespace ps
