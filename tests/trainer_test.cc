// The trainer through real in-process servers: prefetching trains as well
// as the plain loop, initial dense values reach every worker, and an export
// holds every trained row with the servers' values.
#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
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
      auto trainer = Trainer::Create(config, w.kv.get(), w.member->rank(), n);
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

}  // namespace
}  // namespace ps
