// Dense tables by ring all-reduce (DenseTableConfig.sync ALLREDUCE), as
// real scheduler, server and trainer processes on loopback:
//  - the same job with the dense table on the servers under BSP and
//    all-reduced ends with the same dense parameters (1 and 3 workers, SGD
//    and Adam, 200 steps);
//  - an all-reduced dense table with a worker SIGKILLed at a seeded step:
//    the job finishes without a hang, a replacement worker receives the
//    dense state by broadcast, and the test AUC stays near an undisturbed
//    run's (sparse under BSP and under ASYNC).
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "common/protocol.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/job_harness.h"
#include "tests/testing/subprocess.h"
#include "worker/model_file.h"

namespace ps::testing {
namespace {

// DLRM on synthetic CTR data: the embeddings on the servers, the MLPs in
// the dense table.
std::string Config(const std::string& mode, int workers,
                   const std::string& optimizer, const std::string& sync,
                   uint64_t num_train, uint64_t max_steps,
                   const std::string& export_path,
                   const std::string& extra = "") {
  return absl::StrCat(extra, R"(
name: "allreduce"
cluster {
  num_servers: 2
  num_workers: )",
                      workers, R"(
  heartbeat_interval_ms: 200
  heartbeat_timeout_ms: 2000
}
consistency { mode: )",
                      mode, R"( }
tables {
  id: 0
  name: "embeddings"
  sparse { dim: 8 }
  optimizer { adagrad { learning_rate: 0.3 initial_accumulator: 1e-6 } }
  init { kind: NORMAL scale: 0.1 }
}
tables {
  id: 1
  name: "mlp"
  dense { size: 0 sync: )",
                      sync, R"( }
  optimizer { )",
                      optimizer, R"( }
}
data {
  synthetic_ctr {
    num_train: )",
                      num_train, R"(
    num_test: 20000
    seed: 3
    num_categorical: 8
    num_numeric: 4
    interaction_rank: 4
    interaction_scale: 0.2
  }
}
training {
  batch_size: 128
  epochs: 1
  max_steps: )",
                      max_steps, R"(
  log_interval_s: 5
  sparse_table: "embeddings"
  dense_table: "mlp"
  export_path: ")",
                      export_path, R"("
  model { kind: DLRM embedding_dim: 8 bottom_mlp: 32 top_mlp: 32 }
}
)");
}

std::string Dir(const std::string& name) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/", name);
  mkdir(dir.c_str(), 0755);
  return dir;
}

// Runs a job to its end; its summary (empty on failure, with the logs
// added to the test's failure).
std::string RunJob(const std::string& dir, const std::string& config,
                   int workers) {
  JobHarness::Options options;
  options.dir = dir;
  options.config = config;
  options.num_servers = 2;
  options.num_workers = workers;
  auto job = JobHarness::Start(options);
  if (!job.ok()) {
    ADD_FAILURE() << job.status();
    return "";
  }
  auto result = (*job)->Wait(absl::Minutes(5) * TimeoutScale());
  if (!result.ok()) {
    ADD_FAILURE() << result.status() << "\n" << (*job)->LogTails(40);
    return "";
  }
  for (int code : result->workers) {
    EXPECT_EQ(code, 0) << (*job)->LogTails(40);
  }
  return result->summary;
}

struct EquivalenceCase {
  int workers;
  std::string optimizer;
};

class AllReduceEquivalenceTest
    : public ::testing::TestWithParam<EquivalenceCase> {};

TEST_P(AllReduceEquivalenceTest, SameDenseParametersAsBspOnTheServers) {
  const EquivalenceCase& c = GetParam();
  constexpr uint64_t kSteps = 200;
  const uint64_t num_train = kSteps * 128 * c.workers + 1000;
  std::vector<float> dense[2];
  const char* syncs[2] = {"SERVERS", "ALLREDUCE"};
  for (int i = 0; i < 2; ++i) {
    const std::string dir = Dir(absl::StrCat(
        "equiv-", c.workers, "-", c.optimizer.substr(0, 4), "-", syncs[i]));
    const std::string model = dir + "/model.psm";
    RunJob(dir,
           Config("BSP", c.workers, c.optimizer, syncs[i], num_train, kSteps,
                  model),
           c.workers);
    absl::StatusOr<SavedModel> saved = LoadModel(model);
    ASSERT_TRUE(saved.ok()) << saved.status();
    dense[i] = saved->dense;
  }
  ASSERT_EQ(dense[0].size(), dense[1].size());
  ASSERT_FALSE(dense[0].empty());
  double max_diff = 0, max_moved = 0;
  for (size_t e = 0; e < dense[0].size(); ++e) {
    max_diff = std::max<double>(max_diff, std::fabs(dense[0][e] - dense[1][e]));
    max_moved = std::max<double>(max_moved, std::fabs(dense[0][e]));
  }
  std::cout << "equivalence workers=" << c.workers << " " << c.optimizer
            << ": max |servers - allreduce| = " << max_diff << " over "
            << dense[0].size() << " dense parameters\n";
  EXPECT_LT(max_diff, 1e-5);
  EXPECT_GT(max_moved, 0.01);  // the parameters did train
}

INSTANTIATE_TEST_SUITE_P(
    WorkersAndOptimizers, AllReduceEquivalenceTest,
    ::testing::Values(EquivalenceCase{1, "sgd { learning_rate: 0.1 }"},
                      EquivalenceCase{1, "adam { learning_rate: 0.01 }"},
                      EquivalenceCase{3, "sgd { learning_rate: 0.1 }"},
                      EquivalenceCase{3, "adam { learning_rate: 0.01 }"}),
    [](const ::testing::TestParamInfo<EquivalenceCase>& info) {
      return absl::StrCat(info.param.workers, "Workers",
                          info.param.optimizer[0] == 's' ? "Sgd" : "Adam");
    });

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// How many steps behind the ring a replacement joined, from its log: from
// the batch it resumed the shard at to the ring step it joined at. It
// trains that many steps alone at the end. They are the steps the ring
// trained without the shard, and the batches the victim trained after its
// last heartbeat (trained again). nullopt when the lines are missing.
std::optional<int64_t> StepsBehind(const std::string& log) {
  std::smatch resumed, joined;
  if (!std::regex_search(log, resumed,
                         std::regex("to train shard [0-9]+ epoch [0-9]+ "
                                    "batch ([0-9]+)")) ||
      !std::regex_search(log, joined,
                         std::regex("as rank [0-9]+ of [0-9]+, at step "
                                    "([0-9]+)"))) {
    return std::nullopt;
  }
  return std::stoll(joined[1].str()) - std::stoll(resumed[1].str());
}

// What each dense ring generation's members logged as the state they
// started it from ("step S, digest D"), by generation, over `logs`.
std::map<uint64_t, std::vector<std::string>> StartStates(
    const std::vector<std::string>& logs) {
  const std::regex line(
      "in dense ring generation ([0-9]+) as rank [0-9]+ of [0-9]+, at step "
      "[0-9]+; the state it started from: (step [0-9]+, digest [0-9a-f]+)");
  std::map<uint64_t, std::vector<std::string>> states;
  for (const std::string& log : logs) {
    for (auto it = std::sregex_iterator(log.begin(), log.end(), line);
         it != std::sregex_iterator(); ++it) {
      states[std::stoull((*it)[1].str())].push_back((*it)[2].str());
    }
  }
  return states;
}

// Long enough that a replacement started once the victim is declared dead
// (2 s) still finds most of the job to do, also in the opt build.
constexpr uint64_t kFaultTrain = 3 * 1500 * 128;
const char* const kAdam = "adam { learning_rate: 0.01 }";

// Three seeded trials of `mode` (the sparse table's consistency mode):
// each kills a worker at a seeded step and starts a replacement; each
// trial's test AUC must stay within `tolerance` of an undisturbed run's,
// and their mean within `mean_tolerance`.
void KillTrials(const std::string& mode, double tolerance,
                double mean_tolerance) {
  const std::string undisturbed =
      RunJob(Dir(absl::StrCat("fault-baseline-", mode)),
             Config(mode, 3, kAdam, "ALLREDUCE", kFaultTrain, 0, ""), 3);
  const std::optional<double> base_auc = JsonNumber(undisturbed, "test_auc");
  ASSERT_TRUE(base_auc.has_value()) << undisturbed;
  std::vector<double> aucs;
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937 rng(seed);
    const uint64_t kill_at = 50 + rng() % 250;
    const int victim = 1 + static_cast<int>(rng() % 2);
    JobHarness::Options options;
    options.dir = Dir(absl::StrCat("fault-", mode, "-", seed));
    options.config = Config(mode, 3, kAdam, "ALLREDUCE", kFaultTrain, 0, "");
    options.num_servers = 2;
    options.num_workers = 3;
    auto job = JobHarness::Start(options);
    ASSERT_TRUE(job.ok()) << job.status();
    JobHarness& h = **job;
    ASSERT_TRUE(h.WaitForRegistration(victim, absl::Seconds(60)).ok());
    auto reached = h.WaitForStep(victim, kill_at, absl::Minutes(2));
    ASSERT_TRUE(reached.ok()) << reached.status() << h.LogTails(30);
    ASSERT_TRUE(h.Signal(victim, SIGKILL));
    // The survivors form a ring without it once it is declared dead; a
    // replacement then joins and receives the dense state.
    ASSERT_TRUE(h.WaitUntilGone(victim, absl::Seconds(30)).ok());
    absl::StatusOr<int> replacement = h.StartWorker();
    ASSERT_TRUE(replacement.ok()) << replacement.status();
    auto result = h.Wait(absl::Minutes(5) * TimeoutScale());
    ASSERT_TRUE(result.ok()) << result.status() << "\n" << h.LogTails(40);
    for (int i = 0; i < static_cast<int>(result->workers.size()); ++i) {
      if (i != victim) {
        EXPECT_EQ(result->workers[i], 0) << h.LogTails(40);
      }
    }
    const std::optional<double> auc = JsonNumber(result->summary, "test_auc");
    ASSERT_TRUE(auc.has_value()) << result->summary;
    std::vector<std::string> logs;
    for (int i = 0; i < static_cast<int>(result->workers.size()); ++i) {
      logs.push_back(ReadFile(
          absl::StrCat(h.dir(), "/", JobHarness::WorkerName(i), ".log")));
    }
    ASSERT_LT(*replacement, static_cast<int>(logs.size()));
    const std::string& log = logs[*replacement];
    const std::optional<int64_t> behind = StepsBehind(log);
    std::cout << mode << " seed " << seed << ": killed worker " << victim
              << " at step " << kill_at << "; the replacement joined "
              << (behind ? absl::StrCat(*behind) : "?")
              << " steps behind the ring; test AUC " << *auc
              << " vs undisturbed " << *base_auc << "\n";
    EXPECT_NEAR(*auc, *base_auc, tolerance);
    aucs.push_back(*auc);
    EXPECT_THAT(log, ::testing::ContainsRegex(
                         "took the dense state at step [1-9][0-9]* from ring"))
        << "the replacement did not receive the dense state";
    // Every member of a generation starts it from the same state, the
    // replacement's first one included.
    const auto states = StartStates(logs);
    for (const auto& [generation, started] : states) {
      EXPECT_THAT(started, ::testing::Each(started.front()))
          << "the members of dense ring generation " << generation
          << " started from different states";
    }
    const auto joined = StartStates({log});
    ASSERT_FALSE(joined.empty()) << "the replacement never joined a ring";
    EXPECT_GE(states.at(joined.begin()->first).size(), 2u)
        << "the replacement's first ring generation had no other member";
  }
  ASSERT_EQ(aucs.size(), 3u);
  const double mean = (aucs[0] + aucs[1] + aucs[2]) / 3;
  std::cout << mode << ": mean test AUC of the trials " << mean
            << " vs undisturbed " << *base_auc << "\n";
  EXPECT_NEAR(mean, *base_auc, mean_tolerance);
}

// (clock, digest) of each log line "... at clock C ... (digest D)" that
// contains `phrase`.
std::vector<std::pair<uint64_t, std::string>> Digests(
    const std::string& log, const std::string& phrase) {
  std::vector<std::pair<uint64_t, std::string>> found;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find(phrase);
    const size_t d = line.find("(digest ");
    const size_t end = line.find(')', d);
    if (at == std::string::npos || d == std::string::npos ||
        end == std::string::npos) {
      continue;
    }
    const uint64_t clock = std::strtoull(
        line.c_str() + line.find("at clock ", at) + 9, nullptr, 10);
    found.emplace_back(clock, line.substr(d + 8, end - d - 8));
  }
  return found;
}

// A checkpoint cut while the dense table is all-reduced holds its values
// and optimizer state once; a job restored from it with another worker
// count starts every replica from exactly that state.
TEST(AllReduceCheckpointTest, RestoresOntoAnotherWorkerCountBitForBit) {
  const std::string ckpt = Dir("ckpt-dir");
  const std::string block =
      absl::StrCat("checkpoint { dir: \"", ckpt,
                   "\" interval_steps: 400 keep: 10 restore: true }\n");
  std::map<uint64_t, std::string> written;  // cut clock -> digest
  {
    const std::string dir = Dir("ckpt-3-workers");
    RunJob(dir, Config("BSP", 3, kAdam, "ALLREDUCE", kFaultTrain, 0, "", block),
           3);
    for (int i = 0; i < 3; ++i) {
      const std::string log =
          ReadFile(absl::StrCat(dir, "/", JobHarness::WorkerName(i), ".log"));
      for (const auto& [clock, digest] :
           Digests(log, "for the checkpoint at clock")) {
        written[clock] = digest;
      }
      // A cut taken after training ended holds what the workers wrote on
      // leaving the ring, all at the same final step.
      for (const auto& [clock, digest] : Digests(log, "on leaving the ring")) {
        written[kFinishedClock] = digest;
      }
    }
  }
  ASSERT_FALSE(written.empty()) << "no worker wrote the dense state at a cut";
  // Two workers resume from the newest checkpoint and finish.
  const std::string dir = Dir("ckpt-2-workers");
  const std::string summary = RunJob(
      dir, Config("BSP", 2, kAdam, "ALLREDUCE", kFaultTrain, 0, "", block), 2);
  EXPECT_TRUE(JsonNumber(summary, "test_auc").has_value()) << summary;
  for (int i = 0; i < 2; ++i) {
    const auto read = Digests(
        ReadFile(absl::StrCat(dir, "/", JobHarness::WorkerName(i), ".log")),
        "read the dense state from the servers");
    ASSERT_EQ(read.size(), 1u) << "worker " << i;
    const uint64_t key =
        written.count(read[0].first) > 0 ? read[0].first : kFinishedClock;
    ASSERT_TRUE(written.count(key) > 0)
        << "worker " << i << " resumed at clock " << read[0].first
        << ", where no cut was written";
    EXPECT_EQ(read[0].second, written[key]) << "worker " << i;
    std::cout << "worker " << i << " of 2 resumed at clock " << read[0].first
              << " with digest " << read[0].second
              << " (written: " << written[key] << ")\n";
  }
}

// Sparse under BSP: the undisturbed run is deterministic, so the AUC
// difference is the fault's alone. A replacement must not deadlock with
// members whose pulls wait for its clock while it waits for them to join.
// What the fault costs grows with how far behind the ring the replacement
// joins (StepsBehind), as it trains those steps alone at the end: over
// 28 trials here (3 to 57 steps behind, median 19), the AUC difference was
// +0.0013 - 0.00011 per step, give or take 0.0007. Those steps are mostly
// the time a replacement takes to start (the orchestrator's part) times
// the ring's pace, so a slow start on a loaded machine can push one trial past
// 0.005: one trial is held to 0.0075, the mean of the three to 0.005.
TEST(AllReduceFaultTest, BspKilledWorkerAndAReplacement) {
  KillTrials("BSP", 0.0075, 0.005);
}

// "Sparse async, dense sync": ASYNC interleavings alone move this job's
// AUC between two undisturbed runs (0.7465-0.7513 seen; a loaded run's
// trial once 0.0106 below its baseline), so one trial is held to 0.02 and
// the mean of three, whose noise is smaller, to 0.01.
TEST(AllReduceFaultTest, AsyncKilledWorkerAndAReplacement) {
  KillTrials("ASYNC", 0.02, 0.01);
}

}  // namespace
}  // namespace ps::testing
