// The trainer through real in-process servers: prefetching trains as well
// as the plain loop, initial dense values reach every worker, and an export
// holds every trained row with the servers' values. Fault tolerance:
// training a shard from a position, taking over claimed shards,
// preemption at an exact position, initialising only a fresh job, and a
// preempted worker's shard finished by another through the real scheduler.
#include "worker/trainer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/config.h"
#include "common/protocol.h"
#include "common/status.h"
#include "common/logging.h"
#include "common/model_layout.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster.h"
#include "worker/model_file.h"
#include "worker/models/model.h"

namespace ps {
namespace {

using testing::InProcessCluster;
using testing::InProcessWorker;

JobConfig Config(const std::string& extra_training, const std::string& mode,
                 int workers, const std::string& model, int dim,
                 int num_train = 40000) {
  auto config = ParseJobConfig(absl::StrCat(R"pb(
    cluster { num_servers: 2 num_workers: )pb", workers, R"pb( num_slots: 64 }
    consistency { mode: )pb", mode, R"pb( }
    tables { id: 0 name: "s" sparse { dim: )pb", dim, R"pb( }
             optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
             init { kind: NORMAL scale: 0.05 } }
    tables { id: 1 name: "d" dense { size: 0 }
             optimizer { adam { learning_rate: 0.003 } } }
    data { synthetic_ctr { num_train: )pb", num_train, R"pb( num_test: 10000 seed: 3 } }
    training { batch_size: 256 epochs: 1 log_interval_s: 1000
               sparse_table: "s" dense_table: "d" model { )pb", model, R"pb( } )pb",
                                                extra_training, R"pb( }
  )pb"), "trainer_test");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

struct JobRun {
  std::vector<TrainResult> results;
  EvalResult eval;
  std::unique_ptr<InProcessCluster> cluster;
  std::unique_ptr<KVClient> reader;  // reads the final parameters
};

// Trains with every worker on its own thread; rank 0 evaluates (and
// exports when export_path is set).
JobRun Train(const JobConfig& config) {
  JobRun run;
  auto cluster = InProcessCluster::Start(config);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  const int n = config.cluster().num_workers();
  auto workers = (*cluster)->AddWorkers(n);
  EXPECT_TRUE(workers.ok()) << workers.status();
  run.results.resize(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      InProcessWorker& w = (*workers)[i];
      auto trainer = Trainer::Create(config, w.kv, w.member->rank(), n);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      TrainerHooks hooks;
      hooks.on_clock = [&w](uint64_t c) { w.member->set_clock(c); };
      hooks.barrier = [&w](absl::string_view name) {
        return w.member->Barrier(std::string(name), absl::Seconds(30));
      };
      auto result = (*trainer)->Train(hooks);
      ASSERT_TRUE(result.ok()) << result.status();
      run.results[i] = *result;
      ASSERT_TRUE(w.member->Barrier("done", absl::Seconds(30)).ok());
      if (w.member->rank() == 0) {
        auto eval = (*trainer)->Evaluate();
        ASSERT_TRUE(eval.ok()) << eval.status();
        run.eval = *eval;
        if (!config.training().export_path().empty()) {
          ASSERT_TRUE((*trainer)->Export(config.training().export_path()).ok());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  // Before the workers leave: once all have, the job is over.
  auto reader = (*cluster)->Reader();
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (reader.ok()) run.reader = std::move(*reader);
  for (auto& w : *workers) (void)w.member->Leave(true);
  run.cluster = std::move(*cluster);
  return run;
}

// One more step of staleness costs a little early on (on 40k examples
// about 0.03 AUC, measured) and next to nothing once training has run a
// while: on 300k examples the two stay within 0.01.
TEST(TrainerTest, PrefetchTrainsTheSameStepsAndAsWell) {
  const int n = 300000;
  const JobRun plain =
      Train(Config("", "ASYNC", 2, "kind: FM embedding_dim: 4", 5, n));
  const JobRun prefetch = Train(
      Config("prefetch: true", "ASYNC", 2, "kind: FM embedding_dim: 4", 5, n));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(plain.results[i].steps, prefetch.results[i].steps);
    EXPECT_EQ(plain.results[i].examples, prefetch.results[i].examples);
    EXPECT_EQ(prefetch.results[i].examples, n / 2u);
  }
  EXPECT_GT(plain.eval.auc, 0.8);
  EXPECT_NEAR(prefetch.eval.auc, plain.eval.auc, 0.01);
}

TEST(TrainerTest, PrefetchNeedsAsync) {
  auto config = ParseJobConfig(R"pb(
    cluster { num_servers: 1 num_workers: 1 }
    consistency { mode: BSP }
    training { prefetch: true }
  )pb", "j");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(config.status().message().find("training.prefetch"), std::string::npos);
}

// DLRM under BSP with 2 workers: rank 0's He-initialised dense values are
// what both start from (a worker starting from the servers' zeros would
// have all-zero hidden layers and learn nothing), and the model learns.
TEST(TrainerTest, DlrmLearnsFromSharedInitialValues) {
  const JobRun run = Train(Config("", "BSP", 2, "kind: DLRM embedding_dim: 8", 8));
  EXPECT_GT(run.eval.auc, 0.70) << "DLRM did not learn";
  EXPECT_EQ(run.results[0].steps, run.results[1].steps);
}

TEST(TrainerTest, ExportHoldsEveryTrainedRowWithTheServersValues) {
  const std::string path =
      absl::StrCat(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp",
                   "/export.model");
  JobConfig config = Config(absl::StrCat("export_path: \"", path, "\""), "ASYNC", 2,
                            "kind: FM embedding_dim: 4", 5);
  const JobRun run = Train(config);
  auto saved = LoadModel(path);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->sparse_dim, 5u);
  ASSERT_GT(saved->keys.size(), 100u);
  ASSERT_NE(run.reader, nullptr);
  KVClient* reader = run.reader.get();
  std::vector<float> pulled(saved->rows.size());
  ASSERT_TRUE(reader->Pull(0, saved->keys, pulled.data()).Wait().ok());
  EXPECT_EQ(pulled, saved->rows);
  std::vector<float> dense(saved->dense.size());
  ASSERT_TRUE(reader->PullDense(1, 0, dense.size(), dense.data()).Wait().ok());
  EXPECT_EQ(dense, saved->dense);
  // Every row the servers hold is in the file, once.
  std::vector<uint64_t> keys = saved->keys;
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<ServerTableStats> stats;
  ASSERT_TRUE(reader->TableStatistics(&stats).Wait().ok());
  uint64_t rows = 0;
  for (const ServerTableStats& t : stats) {
    if (t.stats.table_id() == 0) rows += t.stats.rows();
  }
  EXPECT_EQ(rows, saved->keys.size());
}

// --- Fault tolerance --------------------------------------------------------

// 5000 examples over 2 shards: 2500 each, 10 batches of 256 per epoch (the
// last one of 196).
constexpr uint64_t kShardExamples = 2500;
constexpr uint64_t kBatches = 10;
constexpr uint64_t kLastBatch = kShardExamples - (kBatches - 1) * 256;

JobConfig SmallConfig(uint32_t epochs, bool prefetch = false) {
  JobConfig config = Config(prefetch ? "prefetch: true" : "", "ASYNC", 2,
                            "kind: FM embedding_dim: 4", 5, 5000);
  config.mutable_training()->set_epochs(epochs);
  return config;
}

DataPosition Position(uint32_t shard, uint64_t epoch, uint64_t batch,
                      bool done = false) {
  DataPosition p;
  p.set_shard(shard);
  p.set_epoch(epoch);
  p.set_batch(batch);
  p.set_done(done);
  return p;
}

std::string Str(const DataPosition& p) { return p.ShortDebugString(); }

// One driven worker of a 2-worker job (ASYNC: nobody waits for the other).
struct OneWorker {
  std::unique_ptr<InProcessCluster> cluster;
  std::vector<InProcessWorker> workers;
  InProcessWorker& w() { return workers[0]; }

  static OneWorker Start(const JobConfig& config) {
    OneWorker o;
    auto cluster = InProcessCluster::Start(config);
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    o.cluster = std::move(*cluster);
    auto workers = o.cluster->AddWorkers(1);
    EXPECT_TRUE(workers.ok()) << workers.status();
    o.workers = std::move(*workers);
    return o;
  }
  ~OneWorker() {
    if (!workers.empty()) (void)w().member->Leave(true);
  }
  OneWorker() = default;
  OneWorker(OneWorker&&) = default;
};

// Records every progress report.
struct Reports {
  std::vector<std::pair<uint64_t, DataPosition>> all;
  void Attach(TrainerHooks* hooks) {
    hooks->on_step = [this](uint64_t clock, const DataPosition& p) {
      all.emplace_back(clock, p);
    };
  }
};

// A position mid-shard, to the end of the shard's epochs; then the claimed
// shards, each from its position, with the clock restarted at the
// scheduler's; progress reported step by step, in clock order.
TEST(TrainerFaultTest, TrainsFromAPositionThenTheShardsItClaims) {
  const JobConfig config = SmallConfig(2);
  OneWorker job = OneWorker::Start(config);
  auto trainer = Trainer::Create(config, job.w().kv, 0, 2);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  TrainerHooks hooks;
  Reports reports;
  reports.Attach(&hooks);
  std::vector<std::optional<DataPosition>> claims;
  hooks.claim = [&](const DataPosition* finished)
      -> absl::StatusOr<ClaimShardResponse> {
    claims.push_back(finished ? std::optional<DataPosition>(*finished)
                              : std::nullopt);
    ClaimShardResponse r;
    switch (claims.size()) {
      case 1:
        r.set_result(ClaimShardResponse::ASSIGNED);
        *r.mutable_shard() = Position(0, 1, 7);
        r.set_start_clock(100);
        break;
      case 2:
        r.set_result(ClaimShardResponse::WAIT);
        break;
      default:
        r.set_result(ClaimShardResponse::ALL_DONE);
    }
    return r;
  };
  auto result = (*trainer)->Train(hooks, Position(1, 0, 4));
  ASSERT_TRUE(result.ok()) << result.status();

  // Shard 1: batches 4..9 of epoch 0 and all of epoch 1; shard 0: batches
  // 7..9 of epoch 1.
  EXPECT_EQ(result->steps, (kBatches - 4) + kBatches + 3);
  EXPECT_EQ(result->examples,
            (kShardExamples - 4 * 256) + kShardExamples + (2 * 256 + kLastBatch));
  EXPECT_EQ(result->shards, (std::vector<uint32_t>{1, 0}));
  EXPECT_FALSE(result->preempted);
  EXPECT_EQ(result->start_clock, 0u);
  ASSERT_TRUE(result->position.has_value());
  EXPECT_EQ(Str(*result->position), Str(Position(0, 2, 0, true)));
  EXPECT_EQ(job.w().kv->clock(), kFinishedClock);

  ASSERT_EQ(claims.size(), 3u);
  ASSERT_TRUE(claims[0].has_value());
  EXPECT_EQ(Str(*claims[0]), Str(Position(1, 2, 0, true)));
  ASSERT_TRUE(claims[1].has_value());
  EXPECT_EQ(Str(*claims[1]), Str(Position(0, 2, 0, true)));
  EXPECT_FALSE(claims[2].has_value()) << "a WAIT is followed by a plain ask";

  // One report per step, then the shard's end at the finished clock.
  ASSERT_EQ(reports.all.size(), result->steps + 2);
  EXPECT_EQ(reports.all[0].first, 1u);
  EXPECT_EQ(Str(reports.all[0].second), Str(Position(1, 0, 5)));
  EXPECT_EQ(reports.all[5].first, 6u);
  EXPECT_EQ(Str(reports.all[5].second), Str(Position(1, 0, 10)));
  EXPECT_EQ(Str(reports.all[6].second), Str(Position(1, 1, 1)));
  EXPECT_EQ(reports.all[16].first, kFinishedClock);
  EXPECT_EQ(Str(reports.all[16].second), Str(Position(1, 2, 0, true)));
  EXPECT_EQ(reports.all[17].first, 101u);  // restarted at 100
  EXPECT_EQ(Str(reports.all[17].second), Str(Position(0, 1, 8)));
  EXPECT_EQ(reports.all[19].first, 103u);
  EXPECT_EQ(Str(reports.all[19].second), Str(Position(0, 1, 10)));
  EXPECT_EQ(reports.all[20].first, kFinishedClock);
}

// A stop ends training after the step in progress, at exactly the next
// batch; training again from there trains the rest: together exactly the
// shard's examples, with and without prefetching.
TEST(TrainerFaultTest, PreemptionStopsAtTheExactNextBatch) {
  for (bool prefetch : {false, true}) {
    SCOPED_TRACE(prefetch ? "prefetch" : "no prefetch");
    const JobConfig config = SmallConfig(2, prefetch);
    OneWorker job = OneWorker::Start(config);
    auto first = Trainer::Create(config, job.w().kv, 0, 2);
    ASSERT_TRUE(first.ok()) << first.status();
    TrainerHooks hooks;
    Reports reports;
    reports.Attach(&hooks);
    int polls = 0;
    // Polled before each step and at the end of epoch 0 (10 batches): 12
    // steps, then a stop.
    hooks.stop = [&] { return ++polls > 13; };
    auto stopped = (*first)->Train(hooks, Position(0, 0, 0));
    ASSERT_TRUE(stopped.ok()) << stopped.status();
    EXPECT_TRUE(stopped->preempted);
    EXPECT_EQ(stopped->steps, 12u);
    ASSERT_TRUE(stopped->position.has_value());
    EXPECT_EQ(Str(*stopped->position), Str(Position(0, 1, 2)));
    // The last step's report already said so, once its pushes were in.
    ASSERT_EQ(reports.all.size(), 13u);
    EXPECT_EQ(reports.all[11].first, 12u);
    EXPECT_EQ(Str(reports.all[11].second), Str(Position(0, 1, 2)));
    EXPECT_EQ(reports.all[12].first, kFinishedClock);
    EXPECT_EQ(job.w().kv->clock(), kFinishedClock);

    // A replacement resumes at the job's clock from that position.
    ASSERT_TRUE(job.w().kv->RestartClock(12).Wait().ok());
    auto second = Trainer::Create(config, job.w().kv, 0, 2);
    ASSERT_TRUE(second.ok()) << second.status();
    TrainerHooks plain;
    auto rest = (*second)->Train(plain, *stopped->position);
    ASSERT_TRUE(rest.ok()) << rest.status();
    EXPECT_FALSE(rest->preempted);
    EXPECT_EQ(rest->start_clock, 12u);
    EXPECT_EQ(stopped->steps + rest->steps, 2 * kBatches);
    EXPECT_EQ(stopped->examples + rest->examples, 2 * kShardExamples);
    EXPECT_EQ(Str(*rest->position), Str(Position(0, 2, 0, true)));
  }
}

// A stop while waiting for work ends training at once: the finished shard
// was reported, and the worker stands at its final position.
TEST(TrainerFaultTest, StopWhileWaitingForWork) {
  const JobConfig config = SmallConfig(1);
  OneWorker job = OneWorker::Start(config);
  auto trainer = Trainer::Create(config, job.w().kv, 0, 2);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::atomic<bool> stop{false};
  std::vector<bool> with_finished;
  TrainerHooks hooks;
  hooks.stop = [&] { return stop.load(); };
  hooks.claim = [&](const DataPosition* finished)
      -> absl::StatusOr<ClaimShardResponse> {
    with_finished.push_back(finished != nullptr);
    if (with_finished.size() == 2) stop = true;  // SIGTERM during the poll
    ClaimShardResponse r;
    r.set_result(ClaimShardResponse::WAIT);
    return r;
  };
  auto result = (*trainer)->Train(hooks, Position(1, 0, 0));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->preempted);
  EXPECT_EQ(result->steps, kBatches);
  EXPECT_EQ(with_finished, (std::vector<bool>{true, false}));
  ASSERT_TRUE(result->position.has_value());
  EXPECT_EQ(Str(*result->position), Str(Position(1, 1, 0, true)));
  EXPECT_EQ(job.w().kv->clock(), kFinishedClock);
}

// A worker without a shard of its own asks at once; transient claim errors
// are retried (with the finished shard again); nonsense is refused.
TEST(TrainerFaultTest, ClaimErrorsAndNoShardOfItsOwn) {
  const JobConfig config = SmallConfig(1);
  OneWorker job = OneWorker::Start(config);
  auto trainer = Trainer::Create(config, job.w().kv, 0, 2);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  int calls = 0;
  TrainerHooks hooks;
  hooks.claim = [&](const DataPosition* finished)
      -> absl::StatusOr<ClaimShardResponse> {
    ++calls;
    EXPECT_EQ(finished, nullptr);
    if (calls == 1) return absl::UnavailableError("scheduler restarting");
    ClaimShardResponse r;
    r.set_result(ClaimShardResponse::ASSIGNED);
    *r.mutable_shard() = Position(7, 0, 0);  // the job has 2 shards
    return r;
  };
  auto result = (*trainer)->Train(hooks, std::nullopt);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
      << result.status();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ((*trainer)->Train(TrainerHooks(), Position(2, 0, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// training.max_steps caps the worker over every shard: the shard being
// trained is reported done where it stands, a later assignment done
// untrained (and its clock is not restarted).
TEST(TrainerFaultTest, MaxStepsEndsTheWorkersPart) {
  JobConfig config = SmallConfig(1);
  config.mutable_training()->set_max_steps(3);
  OneWorker job = OneWorker::Start(config);
  auto trainer = Trainer::Create(config, job.w().kv, 0, 2);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::vector<DataPosition> finished;
  TrainerHooks hooks;
  hooks.claim = [&](const DataPosition* f) -> absl::StatusOr<ClaimShardResponse> {
    if (f != nullptr) finished.push_back(*f);
    ClaimShardResponse r;
    if (finished.size() == 1) {
      r.set_result(ClaimShardResponse::ASSIGNED);
      *r.mutable_shard() = Position(0, 0, 2);
      r.set_start_clock(3);
    } else {
      r.set_result(ClaimShardResponse::ALL_DONE);
    }
    return r;
  };
  auto result = (*trainer)->Train(hooks, Position(1, 0, 0));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->steps, 3u);
  EXPECT_FALSE(result->preempted);
  EXPECT_EQ(result->shards, (std::vector<uint32_t>{1}));
  ASSERT_EQ(finished.size(), 2u);
  EXPECT_EQ(Str(finished[0]), Str(Position(1, 0, 3, true)));
  EXPECT_EQ(Str(finished[1]), Str(Position(0, 0, 2, true)));
  EXPECT_EQ(job.w().kv->clock(), kFinishedClock);
}

// Only a fresh job (clock 0) writes initial values and meets at the
// barrier; a worker joining at a later clock keeps the servers' values.
TEST(TrainerFaultTest, InitialisesOnlyAFreshJob) {
  JobConfig config = Config("", "ASYNC", 2, "kind: DLRM embedding_dim: 8", 8, 5000);
  config.mutable_training()->set_max_steps(2);
  OneWorker job = OneWorker::Start(config);
  KVClient* kv = job.w().kv;
  auto layout = LayoutModel(config);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<std::string> barriers;
  TrainerHooks hooks;
  hooks.barrier = [&](absl::string_view name) {
    barriers.emplace_back(name);
    return absl::OkStatus();
  };
  auto fresh = Trainer::Create(config, kv, 0, 2);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_TRUE((*fresh)->Train(hooks, Position(0, 0, 0)).ok());
  EXPECT_EQ(barriers, (std::vector<std::string>{"ps-start"}));
  std::vector<float> trained(layout->dense_size);
  ASSERT_TRUE(kv->PullDense(1, 0, trained.size(), trained.data()).Wait().ok());

  // Joining at clock 5 and stopped before any step: nothing written.
  barriers.clear();
  ASSERT_TRUE(kv->RestartClock(5).Wait().ok());
  hooks.stop = [] { return true; };
  auto joiner = Trainer::Create(config, kv, 0, 2);
  ASSERT_TRUE(joiner.ok()) << joiner.status();
  auto result = (*joiner)->Train(hooks, Position(0, 0, 2));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(barriers.empty());
  EXPECT_TRUE(result->preempted);
  EXPECT_EQ(result->start_clock, 5u);
  EXPECT_EQ(Str(*result->position), Str(Position(0, 0, 2)));
  std::vector<float> after(layout->dense_size);
  ASSERT_TRUE(kv->PullDense(1, 0, after.size(), after.data()).Wait().ok());
  EXPECT_EQ(after, trained);
}

// Through the real scheduler: worker 1 is preempted after 10 steps and
// leaves with its position; worker 0 finishes its own shard, claims the
// rest of shard 1 and trains it. Every example is trained exactly once.
TEST(TrainerFaultTest, PreemptedShardIsFinishedByAnotherWorker) {
  JobConfig config = Config("", "ASYNC", 2, "kind: FM embedding_dim: 4", 5, 20000);
  auto cluster = InProcessCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto workers = (*cluster)->AddWorkers(2, /*trains_shards=*/true);
  ASSERT_TRUE(workers.ok()) << workers.status();
  std::vector<TrainResult> results(2);
  std::vector<std::vector<uint32_t>> ranks(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      InProcessWorker& w = (*workers)[i];
      const uint32_t rank = w.member->rank();
      ASSERT_TRUE(w.member->has_initial_shard());
      EXPECT_EQ(w.member->initial_shard().shard(), rank);
      auto trainer = Trainer::Create(config, w.kv, rank, 2);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      TrainerHooks hooks;
      int steps = 0;
      if (rank == 1) hooks.stop = [&steps] { return ++steps > 10; };
      hooks.on_step = [&w](uint64_t clock, const DataPosition& p) {
        w.member->set_progress(clock, p);
      };
      hooks.claim = [&w](const DataPosition* finished) {
        return w.member->ClaimShard(finished, absl::Seconds(1));
      };
      auto result = (*trainer)->Train(hooks, w.member->initial_shard());
      ASSERT_TRUE(result.ok()) << result.status();
      results[rank] = *result;
      if (result->preempted) {
        ASSERT_TRUE(result->position.has_value());
        ASSERT_TRUE(w.member->Leave(false, &*result->position).ok());
        return;
      }
      ASSERT_TRUE(w.member->Barrier("train_done", absl::Seconds(30), &ranks[rank]).ok());
      ASSERT_TRUE(w.member->Leave(true).ok());
    });
  }
  for (auto& t : threads) t.join();
  const uint64_t batches = (10000 + 255) / 256;  // 40, the last of 16
  EXPECT_TRUE(results[1].preempted);
  EXPECT_EQ(results[1].steps, 10u);
  EXPECT_EQ(Str(*results[1].position), Str(Position(1, 0, 10)));
  EXPECT_FALSE(results[0].preempted);
  EXPECT_EQ(results[0].shards, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(results[0].steps, batches + (batches - 10));
  EXPECT_EQ(results[0].examples + results[1].examples, 20000u);
  EXPECT_EQ(ranks[0], (std::vector<uint32_t>{0}));
  EXPECT_EQ((*cluster)->scheduler().state()->job_state(), FINISHED);
}

}  // namespace
}  // namespace ps
