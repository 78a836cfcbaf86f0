// Consistency models end to end, in one process: a real scheduler, real
// servers and worker threads, each with its own membership and sockets.
#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/wire.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster.h"
#include "tests/testing/subprocess.h"
#include "scheduler/client.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "spdlog/sinks/ostream_sink.h"
#include "worker/kv_client.h"
#include "worker/trainer.h"
#include "worker/data/synthetic_ctr.h"

namespace ps {
namespace {

using ::ps::testing::InProcessCluster;
using Worker = ::ps::testing::InProcessWorker;

std::unique_ptr<InProcessCluster> StartCluster(const JobConfig& config) {
  auto cluster = InProcessCluster::Start(config);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return std::move(cluster).value();
}

std::vector<Worker> StartWorkers(InProcessCluster& cluster, int n) {
  auto workers = cluster.AddWorkers(n);
  EXPECT_TRUE(workers.ok()) << workers.status();
  return std::move(workers).value();
}

JobConfig MustParse(const std::string& text) {
  auto config = ParseJobConfig(text, "test");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// ------------------------------------------------------ BSP equivalence

std::string CtrConfig(const std::string& mode, int workers, int batch,
                      const std::string& optimizer) {
  return absl::StrCat(R"pb(
    cluster { num_servers: 2 num_workers: )pb", workers, R"pb( num_slots: 64
              heartbeat_interval_ms: 100 heartbeat_timeout_ms: 5000 }
    consistency { mode: )pb", mode, R"pb( }
    tables { id: 0 name: "w" sparse { dim: 1 }
             optimizer { )pb", optimizer, R"pb( } }
    tables { id: 1 name: "d" dense { size: 14 }
             optimizer { )pb", optimizer, R"pb( } }
    data { synthetic_ctr { num_train: 6400 num_test: 100 seed: 7 } }
    training { batch_size: )pb", batch, R"pb( epochs: 1 max_steps: 50
               shard_by_batch: true log_interval_s: 1000
               sparse_table: "w" dense_table: "d" }
  )pb");
}

// Trains with `workers` workers and returns every parameter the data
// touches: the sparse weights of all keys in the training set, then the
// dense weights.
std::vector<float> TrainAndRead(const JobConfig& config) {
  auto cluster = StartCluster(config);
  const uint32_t n = config.cluster().num_workers();
  std::vector<Worker> workers = StartWorkers(*cluster, n);
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      Worker& w = workers[i];
      auto trainer = Trainer::Create(config, w.kv, w.member->rank(), n);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      TrainerHooks hooks;
      hooks.on_clock = [&w](uint64_t c) { w.member->set_clock(c); };
      auto result = (*trainer)->Train(hooks);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->steps, 50 * 128 / config.training().batch_size() / n);
    });
  }
  for (auto& t : threads) t.join();

  auto data = ctr::SyntheticCtr::Create(config.data().synthetic_ctr());
  EXPECT_TRUE(data.ok());
  ctr::Batch batch;
  EXPECT_TRUE(data->Fill(ctr::Split::kTrain, 0, 6400, &batch).ok());
  absl::flat_hash_set<uint64_t> seen;
  std::vector<uint64_t> keys;
  for (uint64_t k : batch.keys) {
    if (seen.insert(k).second) keys.push_back(k);
  }
  std::sort(keys.begin(), keys.end());
  auto reader = cluster->Reader();
  EXPECT_TRUE(reader.ok()) << reader.status();
  std::vector<float> values(keys.size() + 14);
  EXPECT_TRUE((*reader)->Pull(0, keys, values.data()).Wait().ok());
  EXPECT_TRUE((*reader)->PullDense(1, 0, 14, values.data() + keys.size()).Wait().ok());
  for (auto& w : workers) EXPECT_TRUE(w.member->Leave(true).ok());
  return values;
}

// Equal within 1e-5 relative, in two senses: the largest difference is at
// most 1e-5 of the largest parameter (normwise), and at least 99% of the
// parameters are each within 1e-5 of their own value. Why not all of them
// elementwise: each worker's batch sum is rounded to float on the wire, so
// where the workers' partial sums nearly cancel, a step's sum differs from
// the one-worker sum by about one float ulp of the partials. That is ~1e-7
// of the model's scale, but can exceed 1e-5 of a parameter whose own value
// is close to 0 (measured: about 0.3% of parameters, all below 1e-3).
void ExpectClose(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  double max_abs = 0, max_diff = 0;
  int moved = 0, within = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::fabs(double{a[i]} - b[i]);
    const double scale = std::max(std::fabs(double{a[i]}), std::fabs(double{b[i]}));
    max_abs = std::max(max_abs, scale);
    max_diff = std::max(max_diff, diff);
    moved += a[i] != 0;
    within += diff <= 1e-5 * scale;
  }
  // The comparison means something only if training moved the parameters.
  ASSERT_GT(max_abs, 0.01);
  EXPECT_GT(moved, static_cast<int>(a.size() * 9 / 10));
  EXPECT_LE(max_diff, 1e-5 * max_abs);
  EXPECT_GE(within, static_cast<int>(std::ceil(0.99 * a.size())));
  std::printf("%zu parameters: normwise relative difference %.3g; %d (%.2f%%) "
              "within 1e-5 of their own value\n",
              a.size(), max_diff / max_abs, within, 100.0 * within / a.size());
}

TEST(BspTest, FourWorkersOfBatch32MatchOneWorkerOfBatch128Sgd) {
  const std::string sgd = "sgd { learning_rate: 0.5 }";
  ExpectClose(TrainAndRead(MustParse(CtrConfig("BSP", 4, 32, sgd))),
              TrainAndRead(MustParse(CtrConfig("BSP", 1, 128, sgd))));
}

TEST(BspTest, FourWorkersOfBatch32MatchOneWorkerOfBatch128Adagrad) {
  const std::string adagrad = "adagrad { learning_rate: 0.1 initial_accumulator: 0.01 }";
  ExpectClose(TrainAndRead(MustParse(CtrConfig("BSP", 4, 32, adagrad))),
              TrainAndRead(MustParse(CtrConfig("BSP", 1, 128, adagrad))));
}

TEST(BspTest, AsyncWithFourWorkersDoesNotMatch) {
  // The same comparison under ASYNC fails: it is the BSP aggregation, not
  // the data order alone, that makes the runs agree.
  const std::string sgd = "sgd { learning_rate: 0.5 }";
  std::vector<float> a = TrainAndRead(MustParse(CtrConfig("ASYNC", 4, 32, sgd)));
  std::vector<float> b = TrainAndRead(MustParse(CtrConfig("BSP", 1, 128, sgd)));
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(std::fabs(a[i]), std::fabs(b[i]));
    if (scale > 0) worst = std::max(worst, std::fabs(a[i] - b[i]) / scale);
  }
  EXPECT_GT(worst, 1e-2);
}

// -------------------------------------------------------- SSP and ASYNC

std::string StepConfig(const std::string& consistency) {
  return absl::StrCat(R"pb(
    cluster { num_servers: 2 num_workers: 3 num_slots: 64
              heartbeat_interval_ms: 50 heartbeat_timeout_ms: 5000
              request_timeout_ms: 30000 }
    consistency { )pb", consistency, R"pb( watchdog_timeout_ms: 300 watchdog_interval_ms: 200 }
    tables { id: 0 name: "w" sparse { dim: 4 } optimizer { sgd { learning_rate: 0.1 } } }
  )pb");
}

struct Read {
  uint64_t clock;
  uint64_t min_clock;
  uint64_t applied_clock;
};

// Runs `steps` steps on 3 workers; worker 0 sleeps `slow` per step. Returns
// every pull's (clock, servers' min clock, applied clock) per worker, and
// each worker's wall time.
std::vector<std::vector<Read>> RunSteps(InProcessCluster& cluster, int steps, absl::Duration slow,
                                        std::vector<absl::Duration>* times,
                                        const std::function<void(int step)>& at_step = nullptr) {
  std::vector<Worker> workers = StartWorkers(cluster, 3);
  std::vector<std::vector<Read>> reads(3);
  times->assign(3, absl::ZeroDuration());
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      Worker& w = workers[i];
      const bool is_slow = w.member->rank() == 0;
      std::vector<uint64_t> keys = {1, 2, 3, 1000 + uint64_t(i)};
      std::vector<float> out(16), grads(16, 0.5f);
      const absl::Time start = absl::Now();
      for (int s = 0; s < steps; ++s) {
        if (at_step && i == 1) at_step(s);
        const uint64_t clock = w.kv->clock();
        Completion pull = w.kv->Pull(0, keys, out.data());
        ASSERT_TRUE(pull.Wait().ok());
        reads[i].push_back({clock, pull.min_clock(), pull.applied_clock()});
        if (is_slow) absl::SleepFor(slow);
        ASSERT_TRUE(w.kv->Push(0, keys, grads).Wait().ok());
        w.kv->AdvanceClock();
        w.member->set_clock(w.kv->clock());
      }
      (*times)[i] = absl::Now() - start;
      ASSERT_TRUE(w.kv->AdvanceClockTo(kFinishedClock).Wait().ok());
    });
  }
  for (auto& t : threads) t.join();
  for (auto& w : workers) EXPECT_TRUE(w.member->Leave(true).ok());
  // Order the results by rank so rank 0 (the slow one) is first.
  std::vector<std::vector<Read>> by_rank(3);
  for (int i = 0; i < 3; ++i) by_rank[workers[i].member->rank()] = std::move(reads[i]);
  return by_rank;
}

class SspBoundTest : public ::testing::TestWithParam<int> {};

TEST_P(SspBoundTest, ReadsNeverViolateTheStalenessBound) {
  const int s = GetParam();
  auto cluster = StartCluster(MustParse(StepConfig(absl::StrCat("mode: SSP staleness: ", s))));
  std::vector<absl::Duration> times;
  auto reads = RunSteps(*cluster, 30, absl::Milliseconds(10), &times);
  int checked = 0;
  for (int r = 0; r < 3; ++r) {
    for (const Read& read : reads[r]) {
      // A worker at clock c may read only parameters that include every
      // live worker's updates of steps < c - s.
      EXPECT_GE(read.min_clock + s, read.clock) << "rank " << r << " s " << s;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 90);
  // The bound was actually exercised: the fast workers had to wait.
  EXPECT_GT(cluster->TotalStats().pulls_deferred, 0u);
}

INSTANTIATE_TEST_SUITE_P(Staleness, SspBoundTest, ::testing::Values(0, 1, 3));

TEST(AsyncTest, FastWorkersNeverWait) {
  auto cluster = StartCluster(MustParse(StepConfig("mode: ASYNC")));
  std::vector<absl::Duration> times;
  // The slow worker's sleep grows with TimeoutScale (ThreadSanitizer slows
  // every step of the fast ones too).
  const absl::Duration slow = ::ps::testing::Scaled(absl::Milliseconds(10));
  auto reads = RunSteps(*cluster, 30, slow, &times);
  EXPECT_EQ(cluster->TotalStats().pulls_deferred, 0u);
  // The slow worker sleeps 30 times `slow` in all; the fast ones are not
  // held by it.
  EXPECT_GE(times[0], slow * 30);
  EXPECT_LT(times[1], times[0] / 2);
  EXPECT_LT(times[2], times[0] / 2);
}

// -------------------------------------------------------------- Watchdog

TEST(WatchdogTest, ServerNamesTheMissingRank) {
  auto stream = std::make_shared<std::ostringstream>();
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(*stream);
  GetLogger("server")->sinks().push_back(sink);
  auto cluster = StartCluster(MustParse(StepConfig("mode: BSP")));
  std::vector<Worker> workers = StartWorkers(*cluster, 3);
  Worker& a = workers[0];
  Worker& b = workers[1];
  Worker& c = workers[2];
  // All finish step 0 except the worker with rank 2, which stays silent.
  std::vector<uint64_t> keys = {5};
  std::vector<float> grads(4, 1.0f), out(4);
  uint32_t silent_rank = 2;
  std::vector<Worker*> active;
  for (Worker* w : {&a, &b, &c}) {
    if (w->member->rank() != silent_rank) active.push_back(w);
  }
  for (Worker* w : active) {
    ASSERT_TRUE(w->kv->Push(0, keys, grads).Wait().ok());
    ASSERT_TRUE(w->kv->AdvanceClock().Wait().ok());
  }
  Completion held = active[0]->kv->Pull(0, keys, out.data());
  absl::SleepFor(absl::Milliseconds(700));
  EXPECT_FALSE(held.done());
  GetLogger("server")->flush();
  const std::string log = stream->str();
  EXPECT_NE(log.find("watchdog"), std::string::npos) << log;
  EXPECT_NE(log.find("waiting for worker ranks: 2 (clock 0)"), std::string::npos) << log;
  // The silent worker catches up: the pull is answered with step 0 applied.
  Worker* silent = a.member->rank() == silent_rank ? &a
                            : b.member->rank() == silent_rank ? &b : &c;
  ASSERT_TRUE(silent->kv->AdvanceClock().Wait().ok());
  ASSERT_TRUE(held.Wait().ok());
  EXPECT_EQ(held.applied_clock(), 1u);
  // Two workers pushed gradient 1 for key 5; the average over the three
  // workers that finished the step is 2/3, applied once with lr 0.1.
  EXPECT_FLOAT_EQ(out[0], -0.1f * 2.0f / 3.0f);
  GetLogger("server")->sinks().pop_back();
  for (Worker* w : {&a, &b, &c}) EXPECT_TRUE(w->member->Leave(true).ok());
}

TEST(MembershipTest, AWorkerThatLeavesStopsCountingAtOnce) {
  auto cluster = StartCluster(MustParse(StepConfig("mode: BSP")));
  std::vector<Worker> workers = StartWorkers(*cluster, 3);
  Worker& a = workers[0];
  Worker& b = workers[1];
  Worker& c = workers[2];
  std::vector<uint64_t> keys = {9};
  std::vector<float> out(4);
  ASSERT_TRUE(a.kv->AdvanceClock().Wait().ok());
  Completion held = a.kv->Pull(0, keys, out.data());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(held.done());
  ASSERT_TRUE(b.kv->AdvanceClock().Wait().ok());
  const absl::Time left = absl::Now();
  ASSERT_TRUE(c.member->Leave(false).ok());
  ASSERT_TRUE(held.Wait().ok());
  // The view reaches the servers by long poll: well under a heartbeat.
  EXPECT_LT(absl::Now() - left, absl::Milliseconds(500));
  EXPECT_TRUE(a.member->Leave(true).ok());
  EXPECT_TRUE(b.member->Leave(true).ok());
}

// -------------------------------------------------------- Runtime switch

TEST(RuntimeSwitchTest, AsyncToBspMidJob) {
  auto cluster = StartCluster(MustParse(StepConfig("mode: ASYNC")));
  std::atomic<uint64_t> switched_at{UINT64_MAX};
  std::vector<absl::Duration> times;
  // 70 steps after the switch: under ASan on a loaded machine the view has
  // taken 30 steps (150 ms) to reach a server (one rank then had no
  // synchronous read left to count).
  auto reads = RunSteps(*cluster, 80, absl::Milliseconds(5), &times, [&](int step) {
    if (step == 10) {
      auto epoch = cluster->scheduler().state()->SetConsistency(
          MustParse(StepConfig("mode: BSP")).consistency());
      ASSERT_TRUE(epoch.ok()) << epoch.status();
      switched_at.store(step);
    }
  });
  ASSERT_NE(switched_at.load(), UINT64_MAX);
  EXPECT_GT(cluster->TotalStats().bsp_steps_applied, 0u);
  // Once the new mode has reached the servers, every read is synchronous:
  // it includes all steps before the reader's clock. When that happens is
  // not a fixed step: the fast workers may run ten ASYNC steps in the few
  // milliseconds the view takes to reach the servers (seen in CI: a read at
  // clock 20 answered before the switch), so each worker's reads must turn
  // synchronous at some point after the switch and stay so.
  for (int r = 0; r < 3; ++r) {
    bool synchronous = false;
    int count = 0;
    for (const Read& read : reads[r]) {
      if (read.clock <= switched_at.load()) continue;
      if (read.applied_clock >= read.clock) synchronous = true;
      if (synchronous) {
        EXPECT_GE(read.applied_clock, read.clock) << "rank " << r << ": back to ASYNC";
        ++count;
      }
    }
    EXPECT_GE(count, 5) << "rank " << r << ": too few synchronous reads after the switch";
  }
}

}  // namespace
}  // namespace ps
