// Replication (cluster.replication 2) with real servers, an in-process
// scheduler and KVClient workers on loopback: primaries and backups hold
// bit-identical rows, a backup takes over its dead primary's slots without
// losing an acknowledged push, and a replacement server catches up.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/protocol.h"
#include "common/status.h"
#include "common/wire.h"
#include "gtest/gtest.h"
#include "proto/data_plane.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/client.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "server/table.h"
#include "server/table_rows.h"
#include "server/testing/raw_client.h"
#include "worker/kv_client.h"
#include "worker/session.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace ps {
namespace {

constexpr uint32_t kNone = 0xFFFFFFFF;
constexpr uint32_t kAdam = 0;   // sparse, dim 3
constexpr uint32_t kDense = 1;  // dense, Adagrad
constexpr uint32_t kSgd = 2;    // sparse, dim 1, SGD lr 1, zero init
// With a disk tier (ConfigText's tier_dir): sparse, dim 64, Adam, a 1 MiB
// budget that holds some 900 rows; the rest are on disk.
constexpr uint32_t kTiered = 3;
constexpr uint32_t kSlots = 32;

// A stopped server is declared dead after 2 s: long enough that no live
// process of a loaded test machine misses it (a worker declared dead by
// mistake would lose its duplicate detection on the servers).
std::string ConfigText(const std::string& mode, uint32_t servers,
                       uint32_t workers, uint32_t replication = 2,
                       const std::string& tier_dir = "") {
  const std::string tiered =
      tier_dir.empty()
          ? ""
          : absl::StrCat(
                "tables { id: 3 name: \"tiered\" sparse { dim: 64 "
                "memory_budget_bytes: 1048576 eviction: EVICT_LRU disk_tier { "
                "dir: \"",
                tier_dir,
                "\" buffered_io: true } } optimizer { adam { learning_rate: "
                "0.01 } } }");
  return absl::StrCat(R"pb(
                        cluster { num_slots: 32 heartbeat_interval_ms: 50
                                  heartbeat_timeout_ms: 2000
                                  request_timeout_ms: 30000
                                  failover_timeout_ms: 30000
                                  num_servers:)pb",
                      servers, " num_workers: ", workers,
                      " replication: ", replication, R"pb(
                        }
                        consistency { mode: )pb",
                      mode, R"pb(}
                                 tables {
      id: 0
      name: "adam"
      sparse { dim: 3 }
      optimizer { adam { learning_rate: 0.01 } }
    }
    tables {
      id: 1
      name: "dense"
      dense { size: 60 block_size: 4 }
      optimizer { adagrad { learning_rate: 0.1 } }
    }
    tables {
      id: 2
      name: "sgd"
      sparse { dim: 1 }
      optimizer { sgd { learning_rate: 1 } }
      init { kind: ZEROS }
    }
  )pb",
                      tiered);
}

// A server with its scheduler membership.
struct ServerNode {
  std::unique_ptr<KVServer> server;
  std::unique_ptr<SchedulerClient> member;
  uint32_t rank = 0;
};

// A worker: its session owns the membership and the client, which follows
// the views; `member` and `client` point into it.
struct WorkerNode {
  std::unique_ptr<WorkerSession> session;
  SchedulerClient* member = nullptr;
  KVClient* client = nullptr;
};

class ReplicationTest : public ::testing::Test {
 protected:
  void Start(const std::string& mode, uint32_t servers, uint32_t workers,
             uint32_t replication = 2, const std::string& tier_dir = "") {
    auto config = ParseJobConfig(
        ConfigText(mode, servers, workers, replication, tier_dir), "test");
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    SchedulerServer::Options so;
    so.config = config_;
    auto scheduler = SchedulerServer::Start(so);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = std::move(scheduler).value();
    for (uint32_t i = 0; i < servers; ++i) StartServer();
    for (uint32_t i = 0; i < workers; ++i) StartWorker();
  }

  void TearDown() override {
    for (auto& w : workers_) w->session.reset();
    for (auto& s : servers_) {
      s.member.reset();
      s.server.reset();
    }
  }

  // Starts a server; a replacement takes the rank of a dead one.
  ServerNode& StartServer() {
    KVServer::Options ko;
    ko.config = config_;
    auto server = KVServer::Start(ko);
    EXPECT_TRUE(server.ok()) << server.status();
    KVServer* kv = server->get();
    SchedulerClient::Options co = SchedulerClient::Options::ForJob(
        config_, scheduler_->address(), SERVER);
    co.data_endpoint = kv->endpoint();
    co.on_view = [kv](const ClusterView& v, uint32_t rank) {
      kv->UpdateView(v, rank);
    };
    auto member = SchedulerClient::Connect(co);
    EXPECT_TRUE(member.ok()) << member.status();
    ServerNode node;
    node.server = std::move(server).value();
    node.member = std::move(member).value();
    node.rank = node.member->rank();
    servers_.push_back(std::move(node));
    return servers_.back();
  }

  WorkerNode& StartWorker() {
    WorkerSession::Options o;
    o.config = config_;
    o.scheduler = scheduler_->address();
    o.trains_shards = false;
    o.startup_timeout = absl::Seconds(10);
    auto session = WorkerSession::Start(std::move(o));
    EXPECT_TRUE(session.ok()) << session.status();
    auto w = std::make_unique<WorkerNode>();
    w->session = std::move(session).value();
    w->member = w->session->membership();
    w->client = w->session->kv();
    workers_.push_back(std::move(w));
    return *workers_.back();
  }

  ServerNode& ServerWithRank(uint32_t rank) {
    for (ServerNode& s : servers_) {
      if (s.rank == rank && s.member != nullptr) return s;
    }
    ADD_FAILURE() << "no live server with rank " << rank;
    return servers_.front();
  }

  // Stops a server without leaving: the scheduler declares it dead after
  // the heartbeat timeout, as after a crash.
  void Kill(uint32_t rank) {
    ServerNode& s = ServerWithRank(rank);
    s.server->Stop();
    s.member.reset();
  }

  // Waits until the scheduler's view satisfies `done`.
  ClusterView WaitForView(const std::function<bool(const ClusterView&)>& done) {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    ClusterView view = scheduler_->state()->View();
    while (!done(view) && absl::Now() < give_up) {
      view = scheduler_->state()->AwaitView(view.epoch() + 1, false,
                                            absl::Seconds(1));
    }
    EXPECT_TRUE(done(view)) << view.DebugString();
    return view;
  }

  // Catch-ups (a primary's copy of its slots to a new backup) the live
  // servers have sent so far.
  uint64_t CatchupsSent() {
    uint64_t n = 0;
    for (ServerNode& s : servers_) {
      if (s.member != nullptr) n += s.server->stats().catchups_sent;
    }
    return n;
  }

  // Waits until the live servers have sent `n` catch-ups in all, or
  // `give_up` passed; the count then.
  uint64_t WaitForCatchups(uint64_t n, absl::Time give_up) {
    while (CatchupsSent() < n && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return CatchupsSent();
  }

  static bool Dead(const ClusterView& v, uint32_t rank) {
    for (const NodeInfo& n : v.nodes()) {
      if (n.role() == SERVER && n.rank() == rank && n.state() == ALIVE)
        return false;
    }
    return true;
  }

  // Every row (sparse: by key; dense: by block) of one server with its full
  // state, keyed by (table, key or block).
  using Rows = std::map<std::pair<uint32_t, uint64_t>, std::vector<float>>;
  static Rows RowsOf(const KVServer& server) {
    Rows rows;
    for (const Table* table : server.StoppedTables()) {
      const absl::Status read =
          ForEachTableRow(*table, 1 << 16,
                          [&](uint64_t id, absl::Span<const float> values,
                              absl::Span<const float> state) {
                            std::vector<float>& row = rows[{table->id(), id}];
                            row.assign(values.begin(), values.end());
                            row.insert(row.end(), state.begin(), state.end());
                          });
      EXPECT_TRUE(read.ok()) << read;
    }
    return rows;
  }

  static uint32_t SlotOf(const std::pair<uint32_t, uint64_t>& row) {
    return row.first == kDense ? DenseBlockSlot(row.first, row.second, kSlots)
                               : SparseSlot(row.first, row.second, kSlots);
  }

  // Stops every live server and checks, slot by slot, that the backup holds
  // exactly the primary's rows, bit for bit (values and optimizer state).
  // Returns the number of rows compared.
  size_t ExpectReplicasIdentical() {
    const ClusterView view = scheduler_->state()->View();
    std::map<uint32_t, Rows> by_rank;
    for (ServerNode& s : servers_) {
      if (s.member == nullptr) continue;
      s.server->Stop();
      by_rank[s.rank] = RowsOf(*s.server);
    }
    size_t compared = 0;
    for (const auto& [rank, rows] : by_rank) {
      for (const auto& [row, state] : rows) {
        const uint32_t slot = SlotOf(row);
        if (view.slot_owner(slot) != rank) continue;
        const uint32_t backup = view.slot_backup(slot);
        if (backup == kNone || by_rank.count(backup) == 0) continue;
        const Rows& copy = by_rank[backup];
        auto it = copy.find(row);
        if (it == copy.end()) {
          ADD_FAILURE() << "backup " << backup << " lacks table " << row.first
                        << " row " << row.second << " of slot " << slot;
          continue;
        }
        if (it->second.size() != state.size()) {
          ADD_FAILURE() << "table " << row.first << " row " << row.second
                        << ": sizes differ";
          continue;
        }
        EXPECT_EQ(std::memcmp(it->second.data(), state.data(),
                              state.size() * sizeof(float)),
                  0)
            << "table " << row.first << " row " << row.second
            << " differs between primary " << rank << " and backup " << backup;
        ++compared;
      }
    }
    // Nor does a backup hold rows its primary lacks.
    for (const auto& [rank, rows] : by_rank) {
      for (const auto& [row, state] : rows) {
        const uint32_t slot = SlotOf(row);
        if (view.slot_backup(slot) != rank) continue;
        const uint32_t owner = view.slot_owner(slot);
        if (by_rank.count(owner) != 0) {
          EXPECT_TRUE(by_rank[owner].count(row) != 0)
              << "backup " << rank << " holds table " << row.first << " row "
              << row.second << " that primary " << owner << " does not";
        }
      }
    }
    return compared;
  }

  JobConfig config_;
  std::unique_ptr<SchedulerServer> scheduler_;
  std::vector<ServerNode> servers_;
  std::vector<std::unique_ptr<WorkerNode>> workers_;
};

// Ends the client's step. Right after a server died, a clock message built
// with the old routing may be refused ("no live server with rank r") while
// the client switches to the new one; the same clock is simply sent again.
absl::Status Advance(KVClient& client) {
  const uint64_t next = client.clock() + 1;
  absl::Status s = client.AdvanceClockTo(next).Wait();
  for (int retry = 0; retry < 50 && absl::IsUnavailable(s); ++retry) {
    absl::SleepFor(absl::Milliseconds(20));
    s = client.AdvanceClockTo(next).Wait();
  }
  return s;
}

// Random pushes of all three tables by one worker: `steps` rounds.
void PushRandomly(KVClient& client, uint32_t seed, int rounds,
                  bool advance_clock) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> grad(-1, 1);
  for (int round = 0; round < rounds; ++round) {
    std::vector<uint64_t> keys(40);
    for (uint64_t& k : keys) k = rng() % 500;
    std::vector<float> g(keys.size() * 3);
    for (float& x : g) x = grad(rng);
    std::vector<Completion> done;
    if (round % 3 == 0) {
      std::vector<float> out(g.size());
      ASSERT_TRUE(client.PushPull(kAdam, keys, g, out.data()).Wait().ok());
    } else {
      done.push_back(client.Push(kAdam, keys, g));
    }
    const uint64_t begin = rng() % 50;
    std::vector<float> dg(1 + rng() % 10);
    for (float& x : dg) x = grad(rng);
    done.push_back(client.PushDense(kDense, begin, dg));
    std::vector<float> sg(keys.size());
    for (float& x : sg) x = static_cast<float>(static_cast<int>(rng() % 7) - 3);
    done.push_back(client.Push(kSgd, keys, sg));
    for (Completion& c : done) ASSERT_TRUE(c.Wait().ok()) << c.Wait();
    if (advance_clock) {
      ASSERT_TRUE(Advance(client).ok());
    }
  }
}

TEST_F(ReplicationTest, AsyncPrimaryAndBackupHoldIdenticalRows) {
  Start("ASYNC", 3, 2);
  ASSERT_TRUE(workers_[0]
                  ->client->AssignDense(kDense, 0, std::vector<float>(60, 0.5f))
                  .Wait()
                  .ok());
  std::thread other([&] { PushRandomly(*workers_[1]->client, 2, 150, false); });
  PushRandomly(*workers_[0]->client, 1, 150, false);
  other.join();

  // Exports and statistics count each row once, though two servers hold it.
  std::vector<uint64_t> keys;
  std::vector<float> values;
  ASSERT_TRUE(workers_[0]->client->ScanAll(kAdam, &keys, &values).ok());
  std::vector<uint64_t> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::vector<ServerTableStats> stats;
  ASSERT_TRUE(workers_[0]->client->TableStatistics(&stats).Wait().ok());
  uint64_t rows = 0, backup_rows = 0;
  for (const ServerTableStats& s : stats) {
    if (s.stats.table_id() != kAdam) continue;
    rows += s.stats.rows();
    backup_rows += s.stats.backup_rows();
  }
  EXPECT_EQ(rows, keys.size());
  EXPECT_EQ(backup_rows, keys.size());

  for (ServerNode& s : servers_) {
    const KVServer::Stats st = s.server->stats();
    EXPECT_GT(st.forwards, 0u) << "server " << s.rank;
    EXPECT_GT(st.replica_messages, 0u) << "server " << s.rank;
    EXPECT_EQ(st.unreplicated_pushes, 0u) << "server " << s.rank;
  }
  EXPECT_GT(ExpectReplicasIdentical(), 500u);
}

TEST_F(ReplicationTest, BspPrimaryAndBackupHoldIdenticalRows) {
  Start("BSP", 3, 2);
  std::thread other([&] { PushRandomly(*workers_[1]->client, 4, 25, true); });
  PushRandomly(*workers_[0]->client, 3, 25, true);
  other.join();
  for (auto& w : workers_)
    ASSERT_TRUE(w->client->AdvanceClockTo(kFinishedClock).Wait().ok());
  // A pull at the finished clock waits until every step is applied on its
  // primary; a push after it (buffered for the step 2^62, never applied)
  // reaches each backup after the primary's last "apply step" message, so
  // its answer means every backup applied every step too.
  std::vector<uint64_t> keys(200);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  std::vector<float> out(keys.size() * 3);
  ASSERT_TRUE(workers_[0]->client->Pull(kAdam, keys, out.data()).Wait().ok());
  std::vector<float> dense(60);
  ASSERT_TRUE(
      workers_[0]->client->PullDense(kDense, 0, 60, dense.data()).Wait().ok());
  ASSERT_TRUE(workers_[0]
                  ->client->Push(kSgd, keys, std::vector<float>(keys.size(), 0))
                  .Wait()
                  .ok());
  ASSERT_TRUE(workers_[0]
                  ->client->PushDense(kDense, 0, std::vector<float>(60, 0))
                  .Wait()
                  .ok());
  for (ServerNode& s : servers_)
    EXPECT_GT(s.server->stats().bsp_steps_applied, 0u);
  EXPECT_GT(ExpectReplicasIdentical(), 500u);
}

// Pushes integer gradients to keys 0..n-1 of the SGD table from a thread
// until stopped, counting each key's acknowledged sum.
class Pusher {
 public:
  Pusher(KVClient* client, uint64_t n, uint32_t seed)
      : client_(client), sums_(n, 0) {
    thread_ = std::thread([this, seed] { Run(seed); });
  }
  ~Pusher() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // sums() only after Stop(); pushes() and error() at any time.
  const std::vector<double>& sums() const { return sums_; }
  int pushes() const { return pushes_.load(); }
  absl::Status error() const {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  void Run(uint32_t seed) {
    std::mt19937 rng(seed);
    while (!stop_.load()) {
      // A few pushes in flight at a time, so some are under way when a
      // server dies.
      std::vector<std::vector<uint64_t>> keys(4);
      std::vector<std::vector<float>> grads(4);
      std::vector<Completion> done;
      for (int j = 0; j < 4; ++j) {
        for (int i = 0; i < 30; ++i) {
          keys[j].push_back(rng() % sums_.size());
          grads[j].push_back(
              static_cast<float>(static_cast<int>(rng() % 9) - 4));
        }
        done.push_back(client_->Push(kSgd, keys[j], grads[j]));
      }
      for (int j = 0; j < 4; ++j) {
        absl::Status s = done[j].Wait();
        if (!s.ok()) {
          absl::MutexLock lock(&mu_);
          error_ = s;
          return;
        }
        for (size_t i = 0; i < keys[j].size(); ++i)
          sums_[keys[j][i]] += grads[j][i];
        ++pushes_;
      }
    }
  }

  KVClient* const client_;
  std::vector<double> sums_;
  std::atomic<bool> stop_{false};
  std::atomic<int> pushes_{0};
  mutable absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

void ExpectSums(KVClient& client, const std::vector<double>& sums) {
  std::vector<uint64_t> keys(sums.size());
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  std::vector<float> out(keys.size());
  ASSERT_TRUE(client.Pull(kSgd, keys, out.data()).Wait().ok());
  int wrong = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (out[i] != static_cast<float>(-sums[i]) && ++wrong <= 10) {
      ADD_FAILURE() << "key " << i << ": " << out[i]
                    << ", acknowledged pushes sum to " << -sums[i];
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST_F(ReplicationTest, BackupTakesOverItsDeadPrimaryWithoutLosingAPush) {
  Start("ASYNC", 3, 1);
  KVClient& client = *workers_[0]->client;
  Pusher pusher(&client, 400, 7);
  absl::SleepFor(absl::Milliseconds(300));
  Kill(1);
  const ClusterView after =
      WaitForView([](const ClusterView& v) { return Dead(v, 1); });
  for (uint32_t owner : after.slot_owner()) EXPECT_NE(owner, 1u);
  // Pushes go on through the failover and after it.
  const int before = pusher.pushes();
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (pusher.pushes() < before + 50 && pusher.error().ok() &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  pusher.Stop();
  ASSERT_TRUE(pusher.error().ok()) << pusher.error();
  EXPECT_GE(pusher.pushes(), before + 50);
  ExpectSums(client, pusher.sums());
  EXPECT_GT(ServerWithRank(2).server->stats().slots_promoted, 0u);
  // The survivors back each other up again: their copies agree.
  EXPECT_GT(ExpectReplicasIdentical(), 0u);
}

TEST_F(ReplicationTest, BspStepBufferedByADeadPrimaryIsAppliedByItsBackup) {
  Start("BSP", 2, 1);
  KVClient& client = *workers_[0]->client;
  std::vector<uint64_t> keys(100);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  std::vector<float> grads(keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    grads[i] = static_cast<float>(i % 5) + 1;
  // Step 0: applied everywhere.
  ASSERT_TRUE(client.Push(kSgd, keys, grads).Wait().ok());
  ASSERT_TRUE(Advance(client).ok());
  // Step 1: buffered on the primaries (and their backups) when server 0
  // dies; server 1 takes over its slots and applies the step once.
  ASSERT_TRUE(client.Push(kSgd, keys, grads).Wait().ok());
  Kill(0);
  WaitForView([](const ClusterView& v) { return Dead(v, 0); });
  ASSERT_TRUE(Advance(client).ok());
  std::vector<float> out(keys.size());
  ASSERT_TRUE(client.Pull(kSgd, keys, out.data()).Wait().ok());
  for (size_t i = 0; i < keys.size(); ++i)
    EXPECT_EQ(out[i], -2 * grads[i]) << "key " << i;
  EXPECT_GT(ServerWithRank(1).server->stats().slots_promoted, 0u);
}

TEST_F(ReplicationTest, CatchUpCarriesBufferedBspSteps) {
  Start("BSP", 3, 1);
  KVClient& client = *workers_[0]->client;
  std::vector<uint64_t> keys(300);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> grad(-1, 1);
  auto push_step = [&] {
    std::vector<float> g(keys.size() * 3), s(keys.size()), d(60);
    for (float& x : g) x = grad(rng);
    for (float& x : s) x = static_cast<float>(static_cast<int>(rng() % 7) - 3);
    for (float& x : d) x = grad(rng);
    ASSERT_TRUE(client.Push(kAdam, keys, g).Wait().ok());
    ASSERT_TRUE(client.Push(kSgd, keys, s).Wait().ok());
    ASSERT_TRUE(client.PushDense(kDense, 0, d).Wait().ok());
  };
  push_step();
  ASSERT_TRUE(Advance(client).ok());
  // Step 1 is buffered (the worker has not finished it) when server 0
  // dies and a replacement joins: the copies it gets include the buffered
  // sums, and it applies them when its primaries apply the step.
  push_step();
  Kill(0);
  WaitForView([](const ClusterView& v) { return Dead(v, 0); });
  const uint64_t catchups = CatchupsSent();
  StartServer();
  ASSERT_GE(WaitForCatchups(catchups + 2, absl::Now() + absl::Seconds(30)),
            catchups + 2);
  ASSERT_TRUE(Advance(client).ok());
  // A pull at clock 2 waits for step 1 on every primary; pushes of step 2
  // (buffered) then reach each backup after the primary's "apply step 1".
  std::vector<float> out(keys.size() * 3);
  ASSERT_TRUE(client.Pull(kAdam, keys, out.data()).Wait().ok());
  ASSERT_TRUE(
      client.Push(kSgd, keys, std::vector<float>(keys.size(), 0)).Wait().ok());
  ASSERT_TRUE(
      client.PushDense(kDense, 0, std::vector<float>(60, 0)).Wait().ok());
  // The replacement backs some of these slots, so copies of these pushes
  // reach it. Once, with CI running tests side by side, the counter still
  // read 0 right after the answers (not reproduced in idle runs; the cause
  // is not understood yet), so the test gives it up to 10 s to arrive.
  const absl::Time replica_deadline = absl::Now() + absl::Seconds(10);
  while (servers_.back().server->stats().replica_messages == 0 &&
         absl::Now() < replica_deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GT(servers_.back().server->stats().replica_messages, 0u);
  EXPECT_GT(ExpectReplicasIdentical(), 300u);
}

TEST_F(ReplicationTest, ReplacementCatchesUpAndLaterTakesOver) {
  Start("ASYNC", 3, 1);
  KVClient& client = *workers_[0]->client;
  Pusher pusher(&client, 400, 11);
  absl::SleepFor(absl::Milliseconds(200));
  Kill(0);
  WaitForView([](const ClusterView& v) { return Dead(v, 0); });
  absl::SleepFor(absl::Milliseconds(200));
  const uint64_t catchups = CatchupsSent();
  // A replacement takes rank 0 and becomes a backup again: the primaries
  // copy it their slots while the pushes go on.
  StartServer();
  ASSERT_EQ(servers_.back().rank, 0u);
  WaitForView([](const ClusterView& v) {
    return std::find(v.slot_backup().begin(), v.slot_backup().end(), 0u) !=
           v.slot_backup().end();
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  // Servers 1 and 2 both copy to it.
  EXPECT_GE(WaitForCatchups(catchups + 2, give_up), catchups + 2);
  int before = pusher.pushes();
  while (pusher.pushes() < before + 30 && pusher.error().ok() &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  // Server 1 now serves rank 0's old slots, backed by the replacement: when
  // it dies the replacement serves them.
  Kill(1);
  WaitForView([](const ClusterView& v) { return Dead(v, 1); });
  before = pusher.pushes();
  while (pusher.pushes() < before + 30 && pusher.error().ok() &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  pusher.Stop();
  ASSERT_TRUE(pusher.error().ok()) << pusher.error();
  ExpectSums(client, pusher.sums());
  EXPECT_GT(servers_.back().server->stats().slots_promoted, 0u);
  EXPECT_GT(servers_.back().server->stats().replica_messages, 0u);
  EXPECT_GT(ExpectReplicasIdentical(), 0u);
}

// Pushes `rounds` rounds of 40 random keys of 0..range-1 to the tiered
// table (Adam, dim 64), and its pulls every third round.
void PushTiered(KVClient& client, uint32_t seed, int rounds, uint64_t range) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> grad(-1, 1);
  for (int round = 0; round < rounds; ++round) {
    std::vector<uint64_t> keys(40);
    for (uint64_t& k : keys) k = rng() % range;
    std::vector<float> g(keys.size() * 64);
    for (float& x : g) x = grad(rng);
    if (round % 3 == 0) {
      std::vector<float> out(g.size());
      ASSERT_TRUE(client.PushPull(kTiered, keys, g, out.data()).Wait().ok());
    } else {
      ASSERT_TRUE(client.Push(kTiered, keys, g).Wait().ok());
    }
  }
}

TEST_F(ReplicationTest, TieredTableBackupsAndCatchUpsCarryTheRowsOnDisk) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  Start("ASYNC", 3, 2, 2,
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/replication_tier_",
                     getpid()));
  // Some 9 000 keys: each server holds its own and its backups' rows,
  // about 6 000, of which some 900 fit in RAM.
  std::thread other([&] { PushTiered(*workers_[1]->client, 2, 120, 20000); });
  PushTiered(*workers_[0]->client, 1, 120, 20000);
  other.join();
  std::vector<ServerTableStats> stats;
  ASSERT_TRUE(workers_[0]->client->TableStatistics(&stats).Wait().ok());
  int tiered = 0;
  for (const ServerTableStats& s : stats) {
    if (s.stats.table_id() != kTiered) continue;
    ++tiered;
    EXPECT_GT(s.stats.cold_rows(), 2 * (s.stats.rows() + s.stats.backup_rows()))
        << "server " << s.server_rank;
  }
  EXPECT_EQ(tiered, 3);
  // A replacement of server 0 is copied the rows it backs, most of them
  // read from its primaries' disks, while the pushes go on.
  Kill(0);
  WaitForView([](const ClusterView& v) { return Dead(v, 0); });
  const uint64_t catchups = CatchupsSent();
  StartServer();
  ASSERT_EQ(servers_.back().rank, 0u);
  std::thread more([&] { PushTiered(*workers_[1]->client, 4, 60, 20000); });
  EXPECT_GE(WaitForCatchups(catchups + 2, absl::Now() + absl::Seconds(30)),
            catchups + 2);
  PushTiered(*workers_[0]->client, 3, 60, 20000);
  more.join();
  // Every row of the tiered table, in RAM or on disk, is on its backup
  // bit for bit, the replacement's copies included.
  EXPECT_GT(ExpectReplicasIdentical(), 5000u);
  for (const Table* table : servers_.back().server->StoppedTables()) {
    const SparseTable* t = table->AsSparse();
    if (table->id() != kTiered) continue;
    ASSERT_NE(t->disk_tier(), nullptr);
    // What it was copied did not fit in its RAM either.
    EXPECT_GT(t->disk_tier()->rows(), t->num_rows());
  }
}

// Sends one raw message to `endpoint` and returns the answer's header.
ResponseHeader RoundTrip(const std::string& endpoint, const RequestHeader& h,
                         const std::vector<uint64_t>& keys,
                         const std::vector<float>& values) {
  raw_client::RawClient client(endpoint, /*timeout_ms=*/10000);
  client.SendFrames(raw_client::Frames(raw_client::HeaderFrame(h),
                                       raw_client::KeysFrame(keys),
                                       raw_client::ValuesFrame(values)));
  return client.ReceiveHeader();
}

TEST_F(ReplicationTest, ReplicaMessagesFromAnyoneButTheSlotsPrimaryAreRefused) {
  Start("ASYNC", 2, 1);
  const ClusterView view = scheduler_->state()->View();
  uint64_t node0 = 0;
  for (const NodeInfo& n : view.nodes()) {
    if (n.role() == SERVER && n.rank() == 0) node0 = n.node_id();
  }
  // A key of a slot server 1 owns (and server 0 backs).
  uint64_t key = 0;
  while (view.slot_owner(SparseSlot(kSgd, key, kSlots)) != 1) ++key;
  RequestHeader h;
  h.set_op(PUSH);
  h.set_table_id(kSgd);
  h.set_num_keys(1);
  h.set_epoch(view.epoch());
  h.set_replica(true);
  h.mutable_replica_info()->set_kind(REPLICA_APPLY);
  h.mutable_replica_info()->set_lr_scale(1);
  h.mutable_replica_info()->set_primary_node_id(node0);  // not its primary
  ResponseHeader rh =
      RoundTrip(ServerWithRank(0).server->endpoint(), h, {key}, {5.0f});
  EXPECT_EQ(rh.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition))
      << rh.message();
  EXPECT_TRUE(rh.wrong_owner());
  // A node that is no server of the job.
  h.mutable_replica_info()->set_primary_node_id(987654);
  rh = RoundTrip(ServerWithRank(0).server->endpoint(), h, {key}, {5.0f});
  EXPECT_EQ(rh.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition))
      << rh.message();
  EXPECT_TRUE(rh.wrong_owner());
  // Nothing was applied, on either copy.
  float out = -1;
  ASSERT_TRUE(workers_[0]->client->Pull(kSgd, {key}, &out).Wait().ok());
  EXPECT_EQ(out, 0.0f);
  EXPECT_EQ(ExpectReplicasIdentical(), 0u);
}

// A catch-up message is taken whole or not at all: REPLICA_BLOCKS whose
// second block holds a non-finite value is refused, and its first block,
// valid on its own, is not imported either.
TEST_F(ReplicationTest, ReplicaBlocksWithALaterInvalidBlockChangeNothing) {
  Start("ASYNC", 2, 1);
  const ClusterView view = scheduler_->state()->View();
  uint64_t node1 = 0;
  for (const NodeInfo& n : view.nodes()) {
    if (n.role() == SERVER && n.rank() == 1) node1 = n.node_id();
  }
  // Two blocks of the dense table that server 1 owns and server 0 backs.
  std::vector<uint64_t> blocks;
  for (uint64_t b = 0; b < 15 && blocks.size() < 2; ++b) {
    const uint32_t slot = DenseBlockSlot(kDense, b, kSlots);
    if (view.slot_owner(slot) == 1 && view.slot_backup(slot) == 0)
      blocks.push_back(b);
  }
  ASSERT_EQ(blocks.size(), 2u);
  // Adagrad keeps one float of state per element; blocks hold 4 elements.
  std::vector<float> payload(2 * 4 * 2, 7.0f);
  payload[8] = std::nanf("");  // the second block's first value
  RequestHeader h;
  h.set_op(PUSH);
  h.set_table_id(kDense);
  h.set_num_keys(2);
  h.set_epoch(view.epoch());
  h.set_replica(true);
  h.mutable_replica_info()->set_kind(REPLICA_BLOCKS);
  h.mutable_replica_info()->set_primary_node_id(node1);
  const ResponseHeader rh =
      RoundTrip(ServerWithRank(0).server->endpoint(), h, blocks, payload);
  EXPECT_EQ(rh.code(), static_cast<int>(absl::StatusCode::kInvalidArgument))
      << rh.message();
  EXPECT_NE(rh.message().find("non-finite"), std::string::npos) << rh.message();
  // The backup holds no block its primary does not, and no block differs.
  ExpectReplicasIdentical();
  const Rows backup = RowsOf(*ServerWithRank(0).server);
  auto first = backup.find({kDense, blocks[0]});
  if (first != backup.end()) {
    EXPECT_NE(first->second[0], 7.0f)
        << "block " << blocks[0] << " was imported";
  }
}

// The header of a sparse push of one kSgd key, as worker `node` with
// `seq`, routed by view `epoch`.
RequestHeader RawPush(uint64_t node, uint64_t seq, uint64_t epoch) {
  RequestHeader h;
  h.set_op(PUSH);
  h.set_table_id(kSgd);
  h.set_num_keys(1);
  h.set_epoch(epoch);
  h.set_sender_node_id(node);
  h.set_seq(seq);
  return h;
}

// A primary declared dead that comes back (paused, partitioned) must not
// acknowledge a push for the slots its backup took over: with its old view
// the backup refuses its copy, and once its view shows the slots moved it
// refuses the push itself.
TEST_F(ReplicationTest, AResumedExPrimaryAcknowledgesNoPushForItsMovedSlots) {
  Start("ASYNC", 2, 1);
  const ClusterView before = scheduler_->state()->View();
  uint64_t key = 0;
  while (before.slot_owner(SparseSlot(kSgd, key, kSlots)) != 0) ++key;
  ASSERT_EQ(before.slot_backup(SparseSlot(kSgd, key, kSlots)), 1u);
  KVClient& client = *workers_[0]->client;
  const uint64_t worker = workers_[0]->member->node_id();
  const float one = 1;
  ASSERT_TRUE(
      client.Push(kSgd, {key}, absl::MakeConstSpan(&one, 1)).Wait().ok());

  // Server 0 stops heartbeating but keeps serving with the view it has.
  ServerNode& s0 = ServerWithRank(0);
  KVServer* ex = s0.server.get();
  s0.member.reset();
  const ClusterView after =
      WaitForView([](const ClusterView& v) { return Dead(v, 0); });
  ASSERT_EQ(after.slot_owner(SparseSlot(kSgd, key, kSlots)), 1u);
  // The backup took the view up (its own thread does): until then it
  // still is the backup and takes the copy.
  KVServer* promoted = ServerWithRank(1).server.get();
  const absl::Time promoted_by = absl::Now() + absl::Seconds(10);
  while (promoted->stats().slots_promoted == 0 && absl::Now() < promoted_by) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GT(promoted->stats().slots_promoted, 0u);

  uint64_t seq = uint64_t{1} << 40;
  ResponseHeader rh = RoundTrip(
      ex->endpoint(), RawPush(worker, ++seq, before.epoch()), {key}, {5.0f});
  EXPECT_EQ(rh.code(), static_cast<int>(absl::StatusCode::kUnavailable))
      << rh.message();
  EXPECT_NE(rh.message().find("not acknowledged"), std::string::npos)
      << rh.message();

  // Its view shows the slot moved: refused at once, applied nowhere.
  ex->UpdateView(after, 0);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  do {
    rh = RoundTrip(ex->endpoint(), RawPush(worker, ++seq, before.epoch()),
                   {key}, {5.0f});
  } while (!rh.wrong_owner() && absl::Now() < give_up);
  EXPECT_EQ(rh.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition))
      << rh.message();
  EXPECT_TRUE(rh.wrong_owner());
  EXPECT_EQ(rh.epoch(), after.epoch());

  // The new owner holds exactly the worker's push.
  float out = -1;
  ASSERT_TRUE(client.Pull(kSgd, {key}, &out).Wait().ok());
  EXPECT_EQ(out, -1.0f);
  ASSERT_TRUE(
      client.Push(kSgd, {key}, absl::MakeConstSpan(&one, 1)).Wait().ok());
  ASSERT_TRUE(client.Pull(kSgd, {key}, &out).Wait().ok());
  EXPECT_EQ(out, -2.0f);
  ex->Stop();
}

// A backup whose lease lapsed refuses its primary's copies (the push is
// not acknowledged meanwhile); once renewed it is copied again and the
// worker's retry completes, applied once on both.
TEST_F(ReplicationTest, ABackupWithALapsedLeaseRefusesCopiesUntilRenewed) {
  Start("ASYNC", 2, 1);
  const ClusterView view = scheduler_->state()->View();
  uint64_t key = 0;
  while (view.slot_owner(SparseSlot(kSgd, key, kSlots)) != 0) ++key;
  ASSERT_EQ(view.slot_backup(SparseSlot(kSgd, key, kSlots)), 1u);
  KVClient& client = *workers_[0]->client;
  KVServer& backup = *ServerWithRank(1).server;
  backup.SetLease(std::chrono::steady_clock::now() -
                  std::chrono::milliseconds(1));
  const float one = 1;
  Completion push = client.Push(kSgd, {key}, absl::MakeConstSpan(&one, 1));
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (backup.stats().lease_refusals == 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GT(backup.stats().lease_refusals, 0u);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(push.done());
  backup.SetLease(std::chrono::steady_clock::now() + std::chrono::seconds(600));
  ASSERT_TRUE(push.Wait().ok()) << push.Wait();
  float out = 0;
  ASSERT_TRUE(client.Pull(kSgd, {key}, &out).Wait().ok());
  EXPECT_EQ(out, -1.0f);
  EXPECT_GT(ExpectReplicasIdentical(), 0u);
}

TEST_F(ReplicationTest, WithoutReplicationReplicaMessagesAreRefused) {
  Start("ASYNC", 2, 1, /*replication=*/1);
  RequestHeader h;
  h.set_op(PUSH);
  h.set_table_id(kSgd);
  h.set_num_keys(1);
  h.set_epoch(scheduler_->state()->View().epoch());
  h.set_replica(true);
  h.mutable_replica_info()->set_kind(REPLICA_APPLY);
  const ResponseHeader rh =
      RoundTrip(ServerWithRank(0).server->endpoint(), h, {1}, {5.0f});
  EXPECT_EQ(rh.code(), static_cast<int>(absl::StatusCode::kInvalidArgument))
      << rh.message();
  EXPECT_TRUE(scheduler_->state()->View().slot_backup().empty());
}

}  // namespace
}  // namespace ps
