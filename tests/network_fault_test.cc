// Network faults: real processes of a job, each in
// its own network namespace of a NetworkLab (tests/testing/netns.h), with
// links cut (nftables) or slowed (tc tbf) while the job trains.
//
// The job: 1 scheduler, 3 servers (replication 2), 2 workers training
// logistic regression on synthetic click data in ASYNC mode, heartbeats
// every 100 ms, a node silent for 1000 ms declared dead (3000 ms under
// sanitizers), request_timeout_ms 5000 (10000 under sanitizers) and
// failover_timeout_ms 8000 (small, so "never hangs" is checked within test
// time). Every scenario first needs an
// undisturbed run of the same job in the same lab topology (the
// reference, once per test process) for its test AUC and examples.
//
// Scenarios (each a TEST; seeded choices printed with a replay command):
//  ServerCutFromScheduler: a server (every server is the primary of some
//    slots) cut from the scheduler both ways, workers still reaching it,
//    until the scheduler declared it dead, then healed. The job finishes at the
//    reference AUC (within 0.005); the cut-off server exits 3 (dropped) once it
//    learns it was dropped, every other process 0.
//  NetworkFaultLedger.LedgerSurvivesServerCutFromScheduler (the exact
//    form of the case above; no reference run): instead of trainers, the
//    ledger pushers of pause_test's server case (tests/testing/ledger.h:
//    integer SGD pushes, a ledger of what was acknowledged), each in a
//    worker's namespace, push to 3 servers (replication 2); a seeded server
//    rank is cut from the scheduler both ways 0-0.5 s into the pushes until
//    declared dead and a seeded 0-1 s more, the pushers still reaching
//    it, then healed. Every key ends at exactly minus the sum of its
//    acknowledged pushes (none lost, none applied twice: a server that
//    lost its slots acknowledged no push it did not keep); the pushers
//    wrote to its slots across the cut; it refused requests once its
//    lease lapsed ("lease lapsed" in its log) and exited 3 after the heal
//    (the job cannot end before the ledger's reader finishes it, so exit
//    4 is no outcome); every other process exits 0. About 5 s.
//  WorkerCutFromScheduler / WorkerCutFromEverything: a worker cut from
//    the scheduler (or from every node) until declared
//    dead, then healed. It stops or rejoins (exit 0 or 3); the job
//    finishes, the workers trained together at least the reference's
//    examples, AUC within the bound, and no process runs on longer than
//    kOutlive after the job's summary.
//  WorkerServerCut.OneWayHealed / BothWaysHealed: a worker and a server
//    cut one way (seeded direction) or both ways, healed after a seeded
//    time up to 1.5 x request_timeout_ms. WorkerServerCut.BothWaysNeverHealed:
//    cut both ways until the job ends. SlowWorkerLink: a worker's link
//    limited to 2 mbit each way for a seeded 2-4 s (the whole job at that
//    rate would take minutes). Each must end within
//    its bound (the reference's time + the cut + request and failover
//    timeouts + slack); either finishing (every process 0, AUC within the
//    bound) or with the affected worker failed with one of kExpectedErrors
//    in its log (the other processes still end, the job's summary still
//    printed).
//  SchedulerCut.{TwoHeartbeatTimeouts,FourHeartbeatTimeouts}/{ASYNC,BSP,SSP}:
//    the scheduler cut off both ways from every node for 2 or 4 heartbeat
//    timeouts at a seeded step (15-35% of the job), then healed. Every node
//    is healthy: the scheduler suspects its own isolation and declares no
//    node dead (one declared dead during the cut fails the test); the job
//    finishes at the undisturbed AUC of its mode with every process 0.
//
// A node that the test did not cut declared dead (the machine stalled it
// past the timeout) makes a job prove nothing: it is run again once.
//
// Flags (--test_arg=--net_seed=5), each also read from the environment:
//   --net_seed=N   (NET_SEED)   default 1; 0 picks one from the time
//   --net_trials=N (NET_TRIALS) trials per scenario, default 1
// Needs root, ip, nft and tc: skips with the reason otherwise.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/fault_trials.h"
#include "tests/testing/job_harness.h"
#include "tests/testing/ledger.h"
#include "tests/testing/netns.h"
#include "tests/testing/subprocess.h"

ABSL_FLAG(int64_t, net_seed, -1,
          "Seed of the scenarios' choices; 0 picks one from the time. Default: "
          "$NET_SEED, else 1.");
ABSL_FLAG(int32_t, net_trials, -1,
          "Trials per scenario. Default: $NET_TRIALS, else 1.");

namespace ps::testing {
namespace {

constexpr int kServers = 3;
constexpr int kWorkers = 2;
constexpr int kFailoverTimeoutMs = 8000;
// A node cut from the scheduler gives up (exit 4) after this long (the
// same as kFailoverTimeoutMs in JobConfig()).
constexpr int kSchedulerUnreachableMs = kFailoverTimeoutMs;
// Exit code of a node the scheduler dropped (declared dead) that did not
// rejoin.
constexpr int kExitDropped = 3;
// How long a process may run on after the job's summary was printed.
constexpr absl::Duration kOutlive = absl::Seconds(10);
// Errors a worker may fail with when a server stays unreachable to it
// (worker/kv_client.cc): a request unanswered past request_timeout_ms,
// or no live owner of a slot past failover_timeout_ms.
const char* const kExpectedErrors[] = {"did not answer request",
                                       "no live server owns"};

uint64_t Seed() {
  static const uint64_t seed =
      SeedSetting(absl::GetFlag(FLAGS_net_seed), "NET_SEED");
  return seed;
}
int Trials() {
  return Setting(absl::GetFlag(FLAGS_net_trials), "NET_TRIALS", 1);
}
// A sanitizer build runs every process several times slower: a 1 s
// timeout would declare live nodes dead.
int HeartbeatTimeoutMs() { return Sanitizer() ? 3000 : 1000; }
// Kept 2.5 times the heartbeat timeout: WorkerCutFromEverything heals its
// cut up to 1 s after the worker is declared dead, and a request sent at
// the cut must still be answered in time (after TCP's retransmission
// backoff) so the worker learns it was dropped (exit 3) instead of failing
// the request (exit 1). With 5000 ms under TSan (a 3.7 s cut) the request
// timed out first.
int RequestTimeoutMs() { return Sanitizer() ? 10000 : 5000; }

// The job in `mode` (ASYNC by default); `timeouts_ms` is its
// failover_timeout_ms and scheduler_unreachable_timeout_ms.
std::string JobConfig(const Mode& mode = kAsyncMode,
                      int timeouts_ms = kFailoverTimeoutMs) {
  return CtrJobConfig(
      JobHead("netfault", kServers, kWorkers, 256, HeartbeatTimeoutMs(),
              absl::StrCat("request_timeout_ms: ", RequestTimeoutMs(),
                           " failover_timeout_ms: ", timeouts_ms,
                           " scheduler_unreachable_timeout_ms: ", timeouts_ms,
                           " replication: 2 on_worker_loss: REASSIGN")),
      mode.consistency, 1200000);
}

std::vector<std::string> NodeNames() {
  std::vector<std::string> names = {"scheduler"};
  for (int i = 0; i < kServers; ++i) names.push_back(JobHarness::ServerName(i));
  for (int i = 0; i < kWorkers; ++i) names.push_back(JobHarness::WorkerName(i));
  return names;
}

constexpr uint64_t kBatch = 256;

// The reference: the undisturbed job, once per process.
struct Reference {
  double auc = NAN;
  uint64_t examples = 0;
  uint64_t steps = 0;  // the evaluator's steps
  absl::Duration elapsed;
};

// What a scenario does to a running job, between registration and the end.
struct Disturbance {
  std::string what;  // for messages
  // Processes the disturbance may get declared dead ("server1",
  // "worker0"): their deaths are not stalls.
  std::set<std::string> victims;
  // Acts on the job; returns an error to fail the trial. Called once
  // every node has registered.
  std::function<absl::Status(JobHarness&, NetworkLab&)> act;
  // How much longer than the reference the job may take.
  absl::Duration extra;
  // How long a process may run on after the job's summary was written.
  absl::Duration outlive = kOutlive;
  // When not null and true: the fault has begun, and a node declared dead
  // that is not a victim fails the test (the fault caused it) instead of
  // counting as a stall of the machine.
  const bool* fault_begun = nullptr;
};

class NetworkFaultTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {}

  void SetUp() override {
    if (std::string why = NetworkLab::Unavailable(); !why.empty()) {
      GTEST_SKIP() << "no network lab here: " << why;
    }
    if (!NetworkLab::InPrivateNetwork()) {
      GTEST_SKIP()
          << "this process could not enter a private network namespace";
    }
    start_ = absl::Now();
  }

  void TearDown() override {
    std::printf("%s: %.1f s\n",
                ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                absl::ToDoubleSeconds(absl::Now() - start_));
    std::fflush(stdout);
  }

  static std::string TestName() {
    return ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  static std::string ReplayCommand() {
    return absl::StrCat(
        "bazel test --config=opt //tests:network_fault_test "
        "--test_filter=",
        ::testing::UnitTest::GetInstance()
            ->current_test_info()
            ->test_suite_name(),
        ".", TestName(), " --test_arg=--net_seed=", Seed());
  }

  // The generator of trial `trial` of this test: its choices depend only
  // on (seed, test name, trial).
  static std::mt19937_64 Rng(int trial) {
    std::vector<uint32_t> words = {static_cast<uint32_t>(trial)};
    for (char c : TestName()) words.push_back(static_cast<unsigned char>(c));
    return ::ps::testing::TrialRng(Seed(), words);
  }

  // A lab with a namespace per process and a harness running the job in
  // it (`config`, JobConfig() by default, with `num_workers` trainers);
  // null (with a failure added) when either cannot start. The lab has
  // namespaces "worker0".."worker<kWorkers-1>" even for fewer trainers.
  struct Job {
    std::unique_ptr<NetworkLab> lab;
    std::unique_ptr<JobHarness> harness;
  };
  Job StartJob(const std::string& run, const std::string& config = JobConfig(),
               int num_workers = kWorkers) {
    Job job;
    auto lab = NetworkLab::Create(NodeNames());
    if (!lab.ok()) {
      ADD_FAILURE() << lab.status();
      return job;
    }
    job.lab = *std::move(lab);
    NetworkLab* l = job.lab.get();
    JobHarness::Options options;
    const std::string dir = absl::StrCat(::testing::TempDir(), "/netfault");
    mkdir(dir.c_str(), 0755);
    options.dir = absl::StrCat(dir, "/", run);
    options.config = config;
    options.num_servers = kServers;
    options.num_workers = num_workers;
    options.scheduler_host = l->Address("scheduler");
    // A process the lab has no namespace for (a replacement) runs on the
    // hub, which reaches every node.
    options.wrap = [l](const std::string& name) { return l->ExecPrefix(name); };
    options.extra_args = [l](const std::string& name) {
      std::vector<std::string> args;
      if (absl::StartsWith(name, "server") && !l->Address(name).empty()) {
        // Bound to its namespace's address, which it advertises.
        args.push_back(absl::StrCat("--bind=tcp://", l->Address(name), ":*"));
      }
      return args;
    };
    auto harness = JobHarness::Start(options);
    if (!harness.ok()) {
      ADD_FAILURE() << run << ": " << harness.status();
      return job;
    }
    job.harness = *std::move(harness);
    return job;
  }

  // Waits until every server and worker is a live member; their node ids
  // by process name.
  static absl::StatusOr<std::map<std::string, uint64_t>> WaitForMembers(
      JobHarness& job) {
    const absl::Time deadline = absl::Now() + Scaled(absl::Seconds(60));
    while (true) {
      auto status = job.Status();
      if (status.ok()) {
        std::map<std::string, uint64_t> ids;
        for (const NodeInfo& node : status->view().nodes()) {
          if (node.state() != ALIVE) continue;
          for (int i = 0; i < job.num_servers(); ++i) {
            if (node.role() == SERVER &&
                node.pid() == static_cast<uint32_t>(job.server(i).pid())) {
              ids[JobHarness::ServerName(i)] = node.node_id();
            }
          }
          for (int i = 0; i < job.num_worker_processes(); ++i) {
            if (node.role() == WORKER &&
                node.pid() == static_cast<uint32_t>(job.worker(i).pid())) {
              ids[JobHarness::WorkerName(i)] = node.node_id();
            }
          }
        }
        if (ids.size() == static_cast<size_t>(kServers + kWorkers)) return ids;
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            "not every server and worker registered in 60 s");
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  // The scheduler's "declared dead" line of a node that is not one of
  // `victims`, or "".
  static std::string FalseDeath(JobHarness& job,
                                const std::map<std::string, uint64_t>& ids,
                                const std::set<std::string>& victims) {
    const std::vector<uint64_t> dead = job.DeclaredDead();
    for (const auto& [name, id] : ids) {
      if (victims.count(name) > 0) continue;
      if (std::find(dead.begin(), dead.end(), id) == dead.end()) continue;
      return DeclaredDeadLine(job, id);
    }
    return "";
  }

  // Waits until the scheduler declared `name` dead.
  static absl::Status WaitDeclaredDead(JobHarness& job, uint64_t id,
                                       absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + Scaled(timeout);
    while (absl::Now() < deadline) {
      const std::vector<uint64_t> dead = job.DeclaredDead();
      if (std::find(dead.begin(), dead.end(), id) != dead.end())
        return absl::OkStatus();
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("node ", id, " not declared dead within ",
                     absl::FormatDuration(timeout)));
  }

  // What a job ended with.
  struct Ended {
    std::optional<JobHarness::Result> result;  // nullopt: it did not end
    std::string stall;                         // a false death: run again
    std::string problem;                       // why it did not end
    uint64_t examples = 0;
  };

  // Runs `d` on a fresh job and waits for its end: every process must exit
  // within the bound, and none more than kOutlive after the summary.
  Ended RunJob(const std::string& run, const Disturbance& d) {
    Ended ended;
    Job job = StartJob(run, config_);
    if (job.harness == nullptr) {
      ended.problem = "the job did not start";
      return ended;
    }
    JobHarness& h = *job.harness;
    auto ids = WaitForMembers(h);
    if (!ids.ok()) {
      ended.problem =
          absl::StrCat(ids.status().ToString(), "\n", h.LogTails(30));
      return ended;
    }
    h.set_abort_check([&] { return FalseDeath(h, *ids, d.victims); });
    if (d.act) {
      absl::Status acted = d.act(h, *job.lab);
      if (absl::IsAborted(acted)) {
        ended.stall = std::string(acted.message());
        return Blamed(ended, d, h);
      }
      if (!acted.ok()) {
        ended.problem = absl::StrCat(acted.ToString(), "\n", h.LogTails(30));
        return ended;
      }
    }
    // The bound: the reference's time three times over (a loaded machine,
    // a rejoin), plus the scenario's own, plus request and failover
    // timeouts and slack. Past it the job hangs.
    const absl::Duration bound =
        Scaled(reference_.elapsed * 3 + d.extra +
               absl::Milliseconds(RequestTimeoutMs() + kFailoverTimeoutMs) +
               absl::Seconds(30));
    const absl::Time deadline = absl::Now() + bound;
    const std::string summary_path = h.dir() + "/summary.json";
    absl::Time summary_at = absl::InfiniteFuture();
    while (true) {
      std::vector<std::string> running;
      if (h.scheduler().running()) running.push_back("scheduler");
      for (int i = 0; i < h.num_servers(); ++i) {
        if (h.server(i).running()) running.push_back(JobHarness::ServerName(i));
      }
      for (int i = 0; i < h.num_worker_processes(); ++i) {
        if (h.worker(i).running()) running.push_back(JobHarness::WorkerName(i));
      }
      if (running.empty()) break;
      if (std::string stall = FalseDeath(h, *ids, d.victims); !stall.empty()) {
        ended.stall = stall;
        return Blamed(ended, d, h);
      }
      struct stat st;
      if (summary_at == absl::InfiniteFuture() &&
          stat(summary_path.c_str(), &st) == 0) {
        summary_at = absl::Now();
      }
      if (absl::Now() > summary_at + Scaled(d.outlive)) {
        ended.problem = absl::StrCat(
            absl::StrJoin(running, ", "), " still running ",
            absl::FormatDuration(d.outlive),
            " after the job's summary was written\n", h.LogTails(30));
        return ended;
      }
      if (absl::Now() > deadline) {
        ended.problem = absl::StrCat(
            "HANG: ", absl::StrJoin(running, ", "), " still running after ",
            absl::FormatDuration(bound), "\n", h.LogTails(40));
        return ended;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    auto result = h.Wait(absl::Seconds(5));
    if (!result.ok()) {
      ended.problem =
          absl::StrCat(result.status().ToString(), "\n", h.LogTails(30));
      return ended;
    }
    ended.result = *result;
    // The reference trains 2 epochs of kWorkers shards.
    ended.examples = ExamplesTrainedWithOrphans(
        h, have_reference_ ? reference_.examples / kWorkers / 2 : 0, kBatch);
    last_logs_ = h.LogTails(40);
    last_dir_ = h.dir();
    return ended;
  }

  // `ended` with its stall turned into a problem when `d`'s fault had
  // begun: a death the fault caused is no stall of the machine.
  static Ended Blamed(Ended ended, const Disturbance& d, JobHarness& h) {
    if (d.fault_begun != nullptr && *d.fault_begun && !ended.stall.empty()) {
      ended.problem = absl::StrCat(
          "a node the test did not cut was declared dead during the fault: ",
          ended.stall, "\n", h.LogTails(40));
      ended.stall.clear();
    }
    return ended;
  }

  // Runs `d` (again once after a stall); the job's end, or nullopt with a
  // failure added.
  std::optional<Ended> Run(const std::string& run, const Disturbance& d) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      Ended ended = RunJob(attempt == 0 ? run : run + "-again", d);
      if (!ended.stall.empty()) {
        std::printf(
            "  STALLED, a node the test did not cut was declared dead: %s%s\n",
            ended.stall.c_str(), attempt == 0 ? "; running it again" : "");
        std::fflush(stdout);
        continue;
      }
      if (!ended.result.has_value()) {
        ADD_FAILURE() << d.what << ": " << ended.problem;
        return std::nullopt;
      }
      return ended;
    }
    ADD_FAILURE() << d.what << ": stalled twice: the machine is too busy for a "
                  << HeartbeatTimeoutMs() << " ms heartbeat timeout";
    return std::nullopt;
  }

  // The reference run, once per process.
  bool EnsureReference() {
    if (have_reference_) return true;
    Disturbance none;
    none.what = "reference (undisturbed)";
    reference_.elapsed = absl::Seconds(60);  // its own bound
    auto ended = Run("reference", none);
    if (!ended) return false;
    const JobHarness::Result& r = *ended->result;
    bool ok = r.scheduler == 0 && r.summaries == 1;
    for (int c : r.servers) ok &= c == 0;
    for (int c : r.workers) ok &= c == 0;
    const std::optional<double> auc = JsonNumber(r.summary, "test_auc");
    if (!ok || !auc.has_value()) {
      ADD_FAILURE() << "the undisturbed reference job failed in the lab: "
                    << r.summary << "\n"
                    << last_logs_;
      return false;
    }
    reference_.auc = *auc;
    reference_.examples = ended->examples;
    reference_.steps =
        static_cast<uint64_t>(JsonNumber(r.summary, "rank0_steps").value_or(0));
    reference_.elapsed = r.elapsed;
    have_reference_ = true;
    std::printf("reference: test AUC %.5f, %" PRIu64 " examples, %" PRIu64
                " steps per worker, %.1f s\n",
                reference_.auc, reference_.examples, reference_.steps,
                absl::ToDoubleSeconds(reference_.elapsed));
    std::fflush(stdout);
    return true;
  }

  // Waits until worker(i)'s clock reaches `step` (or it finished).
  static absl::Status AtStep(JobHarness& job, int i, uint64_t step) {
    auto clock = job.WaitForStep(i, step, absl::Seconds(60));
    return clock.status();
  }

  // Checks a finished job: exit codes per `allowed` (name -> set of
  // codes; others must be 0), one summary, AUC within the bound, and at
  // least the reference's examples.
  void CheckFinished(const Ended& e, const std::string& what,
                     const std::map<std::string, std::set<int>>& allowed) {
    const JobHarness::Result& r = *e.result;
    auto check_code = [&](const std::string& name, int code) {
      auto it = allowed.find(name);
      const std::set<int> ok =
          it != allowed.end() ? it->second : std::set<int>{0};
      EXPECT_TRUE(ok.count(code) > 0)
          << what << ": " << name << " exited with " << code
          << ", expected one of {" << absl::StrJoin(ok, ",") << "}\n"
          << last_logs_;
    };
    check_code("scheduler", r.scheduler);
    for (size_t i = 0; i < r.servers.size(); ++i) {
      check_code(JobHarness::ServerName(i), r.servers[i]);
    }
    for (size_t i = 0; i < r.workers.size(); ++i) {
      check_code(JobHarness::WorkerName(i), r.workers[i]);
    }
    EXPECT_EQ(r.summaries, 1) << what << ": workers printing a summary\n"
                              << last_logs_;
    const std::optional<double> auc = JsonNumber(r.summary, "test_auc");
    ASSERT_TRUE(auc.has_value())
        << what << ": no test AUC in '" << r.summary << "'\n"
        << last_logs_;
    EXPECT_NEAR(*auc, reference_.auc, kAucTolerance)
        << what << ": test AUC against the undisturbed reference\n"
        << last_logs_;
    EXPECT_GE(e.examples, reference_.examples)
        << what
        << ": the workers trained fewer examples than the reference: some of "
        << "the data was never trained\n"
        << last_logs_;
    std::printf(
        "  finished: test AUC %.5f (%+.5f), %" PRIu64
        " examples (reference %" PRIu64
        "), %.1f s; exit codes scheduler %d servers [%s] workers [%s]\n",
        *auc, *auc - reference_.auc, e.examples, reference_.examples,
        absl::ToDoubleSeconds(r.elapsed), r.scheduler,
        absl::StrJoin(r.servers, ",").c_str(),
        absl::StrJoin(r.workers, ",").c_str());
    std::fflush(stdout);
  }

  // A step of a worker a seeded fraction into its part of the reference.
  uint64_t StepAt(std::mt19937_64& rng, int lo_percent, int hi_percent) const {
    const uint64_t percent = lo_percent + rng() % (hi_percent - lo_percent + 1);
    return reference_.steps * percent / 100;
  }

  // Partitions `a` and `b` once worker(`watch`) reaches `step`, waits
  // until the scheduler declared `victim` dead when given (the cut
  // outlasted the timeout), holds the cut for `hold` more, then heals it.
  static absl::Status CutAndHeal(
      JobHarness& job, NetworkLab& lab, int watch, uint64_t step,
      const std::vector<std::pair<std::string, std::string>>& cuts,
      NetworkLab::Direction direction, uint64_t victim_id, absl::Duration hold,
      std::string* notes) {
    absl::Status at = AtStep(job, watch, step);
    if (absl::IsAborted(at)) return at;
    absl::StrAppend(notes, at.ok()
                               ? absl::StrCat("cut at step >= ", step)
                               : absl::StrCat("cut late (", at.message(), ")"));
    for (const auto& [a, b] : cuts) {
      if (auto s = lab.Partition(a, b, direction); !s.ok()) return s;
    }
    const absl::Time cut_at = absl::Now();
    if (victim_id != 0) {
      absl::Status dead = WaitDeclaredDead(
          job, victim_id,
          absl::Milliseconds(HeartbeatTimeoutMs()) + absl::Seconds(10));
      if (!dead.ok()) return dead;
      absl::StrAppend(
          notes, absl::StrFormat("; declared dead %.2f s after the cut",
                                 absl::ToDoubleSeconds(absl::Now() - cut_at)));
    }
    absl::SleepFor(hold);
    absl::StrAppend(
        notes, absl::StrFormat("; healed %.2f s after the cut",
                               absl::ToDoubleSeconds(absl::Now() - cut_at)));
    return lab.HealAll();
  }

  // The job every run of the test starts.
  std::string config_ = JobConfig();
  Reference reference_;
  bool have_reference_ = false;
  std::string last_logs_;
  std::string last_dir_;
  absl::Time start_;
};

// Shared across the tests of one process (the gtest fixture is not).
Reference* shared_reference = nullptr;

class NetworkFault : public NetworkFaultTest {
 protected:
  void SetUp() override {
    NetworkFaultTest::SetUp();
    if (IsSkipped()) return;
    if (shared_reference != nullptr) {
      reference_ = *shared_reference;
      have_reference_ = true;
      return;
    }
    ASSERT_TRUE(EnsureReference());
    shared_reference = new Reference(reference_);
  }

  // What RunNodeCut cuts off.
  enum class Cut {
    kServerFromScheduler,
    kWorkerFromScheduler,
    kWorkerFromEverything
  };

  // A seeded server or worker cut from the scheduler (or a worker from
  // every node) at a seeded step until the scheduler declared it dead,
  // held a seeded 0-1 s more, then healed. The server must exit 3 once it
  // learns it was dropped (or 4 when healed only after the job's end: it
  // cannot learn it then, and gives up on the scheduler after
  // kSchedulerUnreachableMs); the worker stops (dropped: 3) or rejoins and
  // finishes (0).
  void RunNodeCut(const std::string& kind, Cut cut) {
    const bool server = cut == Cut::kServerFromScheduler;
    const bool everything = cut == Cut::kWorkerFromEverything;
    for (int trial = 0; trial < Trials(); ++trial) {
      std::mt19937_64 rng = Rng(trial);
      const int index =
          static_cast<int>(rng() % (server ? kServers : kWorkers));
      // Early, and healed soon: the job must outlast the cut by enough for
      // the node to reach the scheduler again and learn it was dropped
      // (after the job's end the scheduler is gone; the node would give up
      // only after kSchedulerUnreachableMs, exit 4).
      const uint64_t step = StepAt(rng, 10, 25);
      const absl::Duration hold = absl::Milliseconds(rng() % 1000);
      const std::string name = server ? JobHarness::ServerName(index)
                                      : JobHarness::WorkerName(index);
      Disturbance d;
      d.what = absl::StrFormat(
          "trial %d: %s cut from %s at step %d, healed %d ms after declared "
          "dead; replay: %s",
          trial, name, everything ? "every node" : "the scheduler", step,
          absl::ToInt64Milliseconds(hold), ReplayCommand());
      std::printf("%s\n", d.what.c_str());
      d.victims = {name};
      d.extra = hold + absl::Seconds(15);
      if (server)
        d.outlive = absl::Milliseconds(kSchedulerUnreachableMs) + kOutlive;
      std::string notes;
      bool healed_after_end = false;
      d.act = [&](JobHarness& job, NetworkLab& lab) {
        auto ids = WaitForMembers(job);
        if (!ids.ok()) return ids.status();
        std::vector<std::pair<std::string, std::string>> cuts;
        for (const std::string& other : NodeNames()) {
          if (other == "scheduler" || (everything && other != name)) {
            cuts.emplace_back(name, other);
          }
        }
        // A server's step is worker 0's.
        absl::Status s = CutAndHeal(job, lab, server ? 0 : index, step, cuts,
                                    NetworkLab::Direction::kBoth, (*ids)[name],
                                    hold, &notes);
        struct stat st;
        healed_after_end =
            stat((job.dir() + "/summary.json").c_str(), &st) == 0;
        if (healed_after_end)
          absl::StrAppend(&notes, "; healed after the job's end");
        return s;
      };
      auto ended = Run(absl::StrCat(kind, "-", trial), d);
      std::printf("  %s\n", notes.c_str());
      if (!ended) continue;
      std::set<int> codes = {kExitDropped};
      if (!server) codes.insert(0);
      if (server && healed_after_end) codes.insert(4);
      CheckFinished(*ended, d.what, {{name, codes}});
      if (!server) continue;
      // Whether it refused requests on a lapsed lease before the workers
      // moved on (a window of about a heartbeat; not asserted).
      const std::string lapsed = LineWith(
          ReadFile(absl::StrCat(last_dir_, "/", name, ".log")), "lease");
      std::printf("  %s's lease: %s\n", name.c_str(),
                  lapsed.empty() ? "(no line)" : lapsed.c_str());
    }
  }
};

TEST_F(NetworkFault, ServerCutFromScheduler) {
  RunNodeCut("server-cut", Cut::kServerFromScheduler);
}

// ---- The push ledger under a server cut: exactly once ----

// The ledger job (tests/testing/ledger.h): a sparse SGD table of integer
// sums, kWorkers pushers as the workers. Request and failover timeouts are
// long, so a push fails only on a lost view, never on a slow machine.
std::string LedgerConfig() {
  return LedgerJobConfig(JobHead(
      "netfault-ledger", kServers, kWorkers, 64, HeartbeatTimeoutMs(),
      absl::StrCat("request_timeout_ms: 60000 failover_timeout_ms: 60000 "
                   "scheduler_unreachable_timeout_ms: ",
                   kSchedulerUnreachableMs, " replication: 2")));
}

// Acknowledged pushes in the pushers' ledgers (dir/ledger<i>) whose keys
// belonged to server rank `group` when the pushers started: all of them,
// and those acknowledged at or after `since`.
struct GroupAcks {
  uint64_t all = 0;
  uint64_t since = 0;
};
GroupAcks AcksOfGroup(const std::string& dir, uint32_t group,
                      absl::Time since) {
  GroupAcks acks;
  const int64_t since_us = absl::ToUnixMicros(since);
  for (int i = 0; i < kWorkers; ++i) {
    for (const std::string& line :
         LinesWith(ReadFile(absl::StrCat(dir, "/ledger", i)), "ack ")) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      uint32_t g;
      int64_t ack_us;
      if (f.size() != 4 || f[0] != "ack" || !absl::SimpleAtoi(f[1], &g) ||
          !absl::SimpleAtoi(f[3], &ack_us) || g != group) {
        continue;
      }
      ++acks.all;
      if (ack_us >= since_us) ++acks.since;
    }
  }
  return acks;
}

// ServerCutFromScheduler with the exact check of pause_test's server
// case, for a partition instead of a pause: the pushers (each in its own
// namespace, reaching every server) push while a primary is cut from the
// scheduler both ways until declared dead and a seeded hold more, then healed.
// No reference run is needed.
class NetworkFaultLedger : public NetworkFaultTest {
 protected:
  // One attempt; the "declared dead" line of a node the test did not cut
  // when the machine stalled one (run again), else "" (failures added).
  std::string LedgerCut(const std::string& run, int trial, uint32_t victim_rank,
                        absl::Duration cut_after, absl::Duration hold,
                        const std::string& what, std::string* notes) {
    Job job = StartJob(run, LedgerConfig(), /*num_workers=*/0);
    if (job.harness == nullptr) return "";
    JobHarness& h = *job.harness;
    NetworkLab& lab = *job.lab;
    int victim = -1;
    for (int i = 0; i < h.num_servers(); ++i) {
      std::optional<uint32_t> rank = WaitForServerRank(h, i, absl::Seconds(20));
      if (!rank) {
        ADD_FAILURE() << what << ": server" << i << " did not register\n"
                      << h.LogTails(20);
        return "";
      }
      if (*rank == victim_rank) victim = i;
    }
    if (victim < 0) {
      ADD_FAILURE() << what << ": no server registered as rank " << victim_rank
                    << "\n"
                    << h.LogTails(20);
      return "";
    }
    const std::string name = JobHarness::ServerName(victim);
    // The scheduler names nodes "server rank R (node N)".
    const std::string victim_tag =
        absl::StrCat("server rank ", victim_rank, " (node");
    const std::string scheduler_log = h.dir() + "/scheduler.log";
    auto false_death = [&]() -> std::string {
      for (const std::string& line :
           LinesWith(ReadFile(scheduler_log), "declared dead")) {
        if (!absl::StrContains(line, victim_tag)) return line;
      }
      return "";
    };
    auto victim_dead = [&] {
      for (const std::string& line :
           LinesWith(ReadFile(scheduler_log), "declared dead")) {
        if (absl::StrContains(line, victim_tag)) return true;
      }
      return false;
    };
    h.set_abort_check(false_death);

    LedgerPushers::Options ledger =
        LedgerPushers::ForJob(h, Seed() * 100 + trial);
    ledger.pushers = kWorkers;
    // Pusher i in worker<i>'s namespace; the reader (after the heal) on
    // the hub, which reaches every node.
    ledger.wrap = [&lab](const std::string& process) {
      return absl::StartsWith(process, "pusher")
                 ? lab.ExecPrefix(absl::StrCat("worker", process.substr(6)))
                 : std::vector<std::string>{};
    };
    auto pushers = LedgerPushers::Start(ledger, absl::Seconds(30));
    if (!pushers.ok()) {
      std::string stall = false_death();
      if (stall.empty())
        ADD_FAILURE() << what << ": " << pushers.status() << "\n"
                      << h.LogTails(20);
      return stall;
    }

    absl::SleepFor(cut_after);
    if (absl::Status s =
            lab.Partition(name, "scheduler", NetworkLab::Direction::kBoth);
        !s.ok()) {
      ADD_FAILURE() << what << ": " << s;
      return "";
    }
    const absl::Time cut_at = absl::Now();
    bool declared = false;
    while (absl::Now() < cut_at + Scaled(absl::Seconds(20))) {
      if (std::string stall = false_death(); !stall.empty()) return stall;
      if ((declared = victim_dead())) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    const absl::Time declared_at = absl::Now();
    absl::SleepFor(hold);
    if (absl::Status s = lab.HealAll(); !s.ok()) {
      ADD_FAILURE() << what << ": " << s;
      return "";
    }
    const absl::Time healed_at = absl::Now();
    *notes = absl::StrFormat("%s %.2f s after the cut, healed %.2f s after it",
                             declared ? "declared dead" : "NOT declared dead",
                             absl::ToDoubleSeconds(declared_at - cut_at),
                             absl::ToDoubleSeconds(healed_at - cut_at));
    if (!declared) {
      ADD_FAILURE() << what << ": the scheduler did not declare " << name
                    << " dead within 20 s of the cut\n"
                    << h.LogTails(20);
      return "";
    }
    // Healed, it reaches the scheduler, learns it was dropped and exits;
    // the job cannot end before StopAndVerify's reader finishes it, so
    // exit 4 (the scheduler gone) is no outcome here. The pushes go on
    // through the backups that took its slots over.
    auto code = h.server(victim).Wait(absl::Seconds(15));
    absl::SleepFor(absl::Seconds(1));
    LedgerPushers::Verdict verdict = pushers->StopAndVerify();
    auto result = h.Wait(absl::Seconds(60));
    if (std::string stall = false_death(); !stall.empty()) return stall;

    bool ok = true;
    for (const std::string& p : verdict.problems) {
      ok = false;
      ADD_FAILURE() << what << ": " << p;
    }
    const GroupAcks acks = AcksOfGroup(h.dir(), victim_rank, cut_at);
    absl::StrAppendFormat(
        notes,
        "; %d pushes acknowledged, %d of them to rank %u's slots (%d after "
        "the cut)",
        verdict.acknowledged, acks.all, victim_rank, acks.since);
    // A primary of what the pushers write, and written to across the cut.
    if (acks.all == 0 || acks.since == 0) {
      ok = false;
      ADD_FAILURE()
          << what << ": " << acks.all << " pushes to rank " << victim_rank
          << "'s slots acknowledged (" << acks.since
          << " after the cut): the cut server was no primary the pushers used";
    }
    const std::string log = ReadFile(h.server(victim).stderr_path());
    // The lease (3/4 of the heartbeat timeout from the last acknowledged
    // heartbeat) lapses before the scheduler declares the server dead,
    // and the pushers, which reach it, keep sending until they get the
    // view without it: it must refuse them.
    const std::vector<std::string> lapsed = LinesWith(log, "lease lapsed");
    const std::vector<std::string> fenced =
        LinesWith(log, "no longer a member");
    absl::StrAppendFormat(notes, "; %s refused on its lapsed lease: %s", name,
                          lapsed.empty() ? "NO" : lapsed.front());
    if (!fenced.empty())
      absl::StrAppendFormat(notes, "; refused as dropped: %s", fenced.front());
    if (lapsed.empty()) {
      ok = false;
      ADD_FAILURE() << what << ": " << name
                    << " never refused a request on its lapsed lease (no "
                       "'lease lapsed' in "
                       "its log) though the pushers reached it";
    }
    if (!code.ok()) {
      ok = false;
      ADD_FAILURE() << what << ": " << name << " still ran 15 s after the heal";
    } else {
      absl::StrAppendFormat(
          notes, "; %s exited with %d %.2f s after the heal", name, *code,
          absl::ToDoubleSeconds(*h.server(victim).exited_at() - healed_at));
      if (*code != kExitDropped ||
          !absl::StrContains(log, "dropped by the scheduler")) {
        ok = false;
        ADD_FAILURE() << what << ": " << name << " exited with " << *code
                      << " (expected " << kExitDropped
                      << ", 'dropped by the scheduler' in its log)";
      }
    }
    if (!result.ok()) {
      ok = false;
      ADD_FAILURE() << what << ": " << result.status();
    } else {
      ok &= ExpectSchedulerAndServersExitedZero(*result, what, victim);
    }
    if (!ok)
      ADD_FAILURE() << what << ": logs of " << h.dir() << "\n"
                    << h.LogTails(30);
    return "";
  }
};

TEST_F(NetworkFaultLedger, LedgerSurvivesServerCutFromScheduler) {
  for (int trial = 0; trial < Trials(); ++trial) {
    std::mt19937_64 rng = Rng(trial);
    const uint32_t victim_rank = static_cast<uint32_t>(rng() % kServers);
    const absl::Duration cut_after = absl::Milliseconds(rng() % 500);
    const absl::Duration hold = absl::Milliseconds(rng() % 1000);
    const std::string what = absl::StrFormat(
        "trial %d: server rank %u cut from the scheduler %d ms into the "
        "pushes, healed %d ms "
        "after declared dead; replay: %s",
        trial, victim_rank, absl::ToInt64Milliseconds(cut_after),
        absl::ToInt64Milliseconds(hold), ReplayCommand());
    std::printf("%s\n", what.c_str());
    std::fflush(stdout);
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::string notes;
      const std::string stall = LedgerCut(
          absl::StrCat("ledger-cut-", trial, attempt == 0 ? "" : "-again"),
          trial, victim_rank, cut_after, hold, what, &notes);
      std::printf("  %s\n", notes.c_str());
      if (stall.empty()) break;
      std::printf(
          "  STALLED, a node the test did not cut was declared dead: %s%s\n",
          stall.c_str(), attempt == 0 ? "; running it again" : "");
      std::fflush(stdout);
      if (attempt == 1) {
        ADD_FAILURE() << what
                      << ": stalled twice: the machine is too busy for a "
                      << HeartbeatTimeoutMs() << " ms heartbeat timeout";
      }
    }
    std::fflush(stdout);
  }
}

TEST_F(NetworkFault, WorkerCutFromScheduler) {
  RunNodeCut("worker-cut", Cut::kWorkerFromScheduler);
}
TEST_F(NetworkFault, WorkerCutFromEverything) {
  RunNodeCut("worker-isolated", Cut::kWorkerFromEverything);
}

// A worker and a server cut from each other while both still
// reach the scheduler. The job finishes, or the worker fails with one of
// kExpectedErrors (and the job still ends, with its summary, at the
// reference's AUC: its shard goes to the other worker).
class WorkerServerCut : public NetworkFault {
 protected:
  void RunCut(const std::string& kind, bool heal,
              std::optional<NetworkLab::Direction> fixed) {
    for (int trial = 0; trial < Trials(); ++trial) {
      std::mt19937_64 rng = Rng(trial);
      const int worker = static_cast<int>(rng() % kWorkers);
      const int server = static_cast<int>(rng() % kServers);
      const uint64_t step = StepAt(rng, 10, 50);
      const absl::Duration hold =
          absl::Milliseconds(rng() % (RequestTimeoutMs() * 3 / 2 + 1));
      const NetworkLab::Direction direction =
          fixed.has_value() ? *fixed
                            : (rng() % 2 == 0 ? NetworkLab::Direction::kAtoB
                                              : NetworkLab::Direction::kBtoA);
      const std::string w = JobHarness::WorkerName(worker);
      const std::string s = JobHarness::ServerName(server);
      const std::string how =
          direction == NetworkLab::Direction::kBoth ? "both ways"
          : direction == NetworkLab::Direction::kAtoB
              ? absl::StrCat("one way (", w, " -> ", s, " dropped)")
              : absl::StrCat("one way (", s, " -> ", w, " dropped)");
      Disturbance d;
      d.what = absl::StrFormat(
          "trial %d: %s and %s cut %s at step %d, %s; replay: %s", trial, w, s,
          how, step,
          heal ? absl::StrCat("healed after ", absl::ToInt64Milliseconds(hold),
                              " ms")
               : "never healed",
          ReplayCommand());
      std::printf("%s\n", d.what.c_str());
      // The worker may fail (and then be declared dead if it did not
      // leave); the server must not.
      d.victims = {w};
      d.extra = hold;
      std::string notes;
      d.act = [&](JobHarness& job, NetworkLab& lab) -> absl::Status {
        absl::Status at = AtStep(job, worker, step);
        if (absl::IsAborted(at)) return at;
        notes = at.ok() ? absl::StrCat("cut at step >= ", step)
                        : absl::StrCat("cut late (", at.message(), ")");
        if (auto st = lab.Partition(w, s, direction); !st.ok()) return st;
        if (!heal) return absl::OkStatus();
        absl::SleepFor(hold);
        return lab.HealAll();
      };
      auto ended = Run(absl::StrCat(kind, "-", trial), d);
      std::printf("  %s\n", notes.c_str());
      if (!ended) continue;
      const JobHarness::Result& r = *ended->result;
      const int code = r.workers[worker];
      if (code != 0) {
        const std::string log =
            ReadFile(absl::StrCat(last_dir_, "/", w, ".log"));
        std::string line;
        for (const char* e : kExpectedErrors) {
          if (line.empty()) line = LineWith(log, e);
        }
        EXPECT_FALSE(line.empty())
            << d.what << ": " << w << " exited with " << code
            << " without any of the documented errors ('"
            << absl::StrJoin(kExpectedErrors, "', '") << "')\n"
            << last_logs_;
        std::printf("  %s failed as documented (exit %d): %s\n", w.c_str(),
                    code, line.c_str());
      }
      CheckFinished(*ended, d.what, {{w, {0, 1}}});
    }
  }
};

TEST_F(WorkerServerCut, OneWayHealed) { RunCut("oneway", true, std::nullopt); }
TEST_F(WorkerServerCut, BothWaysHealed) {
  RunCut("bothways", true, NetworkLab::Direction::kBoth);
}
TEST_F(WorkerServerCut, BothWaysNeverHealed) {
  RunCut("never", false, NetworkLab::Direction::kBoth);
}

TEST_F(NetworkFault, SlowWorkerLink) {
  for (int trial = 0; trial < Trials(); ++trial) {
    std::mt19937_64 rng = Rng(trial);
    const int worker = static_cast<int>(rng() % kWorkers);
    const uint64_t step = StepAt(rng, 10, 40);
    // The whole job at 2 mbit would take minutes: a seeded window.
    const absl::Duration window = absl::Milliseconds(2000 + rng() % 2000);
    const std::string w = JobHarness::WorkerName(worker);
    Disturbance d;
    d.what = absl::StrFormat(
        "trial %d: %s's link limited to 2 mbit each way from step %d "
        "for %d ms; replay: %s",
        trial, w, step, absl::ToInt64Milliseconds(window), ReplayCommand());
    std::printf("%s\n", d.what.c_str());
    d.victims = {w};
    d.extra = window + absl::Seconds(30);
    std::string notes;
    d.act = [&](JobHarness& job, NetworkLab& lab) -> absl::Status {
      absl::Status at = AtStep(job, worker, step);
      if (absl::IsAborted(at)) return at;
      if (auto s = lab.LimitBandwidth(w, "2mbit", "64kbit", "200ms"); !s.ok())
        return s;
      absl::SleepFor(window);
      auto drops = lab.LimitDrops(w);
      notes = absl::StrCat(
          "packets dropped by the limit: ",
          drops.ok() ? absl::StrCat(*drops) : drops.status().ToString());
      return lab.ClearLimits(w);
    };
    auto ended = Run(absl::StrCat("slow-", trial), d);
    std::printf("  %s\n", notes.c_str());
    if (!ended) continue;
    const JobHarness::Result& r = *ended->result;
    if (r.workers[worker] != 0) {
      const std::string log = ReadFile(absl::StrCat(last_dir_, "/", w, ".log"));
      std::string line;
      for (const char* e : kExpectedErrors) {
        if (line.empty()) line = LineWith(log, e);
      }
      EXPECT_FALSE(line.empty())
          << d.what << ": " << w << " exited with " << r.workers[worker]
          << " without a documented error\n"
          << last_logs_;
    }
    CheckFinished(*ended, d.what, {{w, {0, 1}}});
  }
}

// ---- The scheduler cut off from every node ----

// Failover and scheduler-unreachable timeouts of the scheduler-cut jobs:
// above the longest cut (4 heartbeat timeouts) with room to spare, so no
// node gives up on the scheduler, or a worker on a slot, during the cut.
int SchedulerCutTimeoutsMs() {
  return std::max(kFailoverTimeoutMs, 8 * HeartbeatTimeoutMs());
}

// The scheduler cut off both ways from every server and worker for `n`
// heartbeat timeouts at a seeded step, then healed, in ASYNC, BSP and SSP.
// Every node is healthy: the scheduler must suspect its own isolation
// ("went silent within one heartbeat timeout" in its log) and declare no
// node dead; the job finishes at the undisturbed AUC (of the same mode,
// run once per process) with every process exiting 0.
class SchedulerCut : public NetworkFaultTest,
                     public ::testing::WithParamInterface<int> {
 protected:
  const Mode& mode() const { return kModes[GetParam()]; }

  void SetUp() override {
    NetworkFaultTest::SetUp();
    if (IsSkipped()) return;
    config_ = JobConfig(mode(), SchedulerCutTimeoutsMs());
    static auto* references = new std::map<std::string, Reference>();
    auto it = references->find(mode().name);
    if (it != references->end()) {
      reference_ = it->second;
      have_reference_ = true;
      return;
    }
    ASSERT_TRUE(EnsureReference());
    (*references)[mode().name] = reference_;
  }

  void RunSchedulerCut(int timeouts) {
    for (int trial = 0; trial < Trials(); ++trial) {
      std::mt19937_64 rng = Rng(trial);
      const uint64_t step = StepAt(rng, 15, 35);
      const absl::Duration cut =
          absl::Milliseconds(timeouts * HeartbeatTimeoutMs());
      Disturbance d;
      d.what = absl::StrFormat(
          "trial %d, %s: the scheduler cut off from every node at worker 0's "
          "step %d for %s; replay: %s",
          trial, mode().name, step, absl::FormatDuration(cut), ReplayCommand());
      std::printf("%s\n", d.what.c_str());
      d.extra = cut + absl::Seconds(10);
      bool begun = false;
      d.fault_begun = &begun;
      std::string notes;
      d.act = [&](JobHarness& job, NetworkLab& lab) -> absl::Status {
        absl::Status at = AtStep(job, 0, step);
        if (absl::IsAborted(at)) return at;
        notes = at.ok() ? absl::StrCat("cut at step >= ", step)
                        : absl::StrCat("cut late (", at.message(), ")");
        begun = true;
        if (auto s = lab.Isolate("scheduler"); !s.ok()) return s;
        const absl::Time cut_at = absl::Now();
        absl::SleepFor(cut);
        absl::StrAppend(
            &notes,
            absl::StrFormat("; healed %.2f s after the cut",
                            absl::ToDoubleSeconds(absl::Now() - cut_at)));
        return lab.HealAll();
      };
      auto ended = Run(absl::StrCat("scheduler-cut-", timeouts, "-", trial), d);
      std::printf("  %s\n", notes.c_str());
      if (!ended) continue;
      CheckFinished(*ended, d.what, {});
      const std::string scheduler_log =
          ReadFile(absl::StrCat(last_dir_, "/scheduler.log"));
      const std::string suspected =
          LineWith(scheduler_log, "went silent within one heartbeat timeout");
      EXPECT_FALSE(suspected.empty())
          << d.what << ": the scheduler did not suspect its own isolation\n"
          << last_logs_;
      std::printf("  scheduler: %s\n  %s\n",
                  suspected.empty() ? "(no isolation line)" : suspected.c_str(),
                  LineWith(scheduler_log, "heartbeats are back").c_str());
    }
  }
};

TEST_P(SchedulerCut, TwoHeartbeatTimeouts) { RunSchedulerCut(2); }
TEST_P(SchedulerCut, FourHeartbeatTimeouts) { RunSchedulerCut(4); }

INSTANTIATE_TEST_SUITE_P(Modes, SchedulerCut, ::testing::Values(0, 1, 2),
                         ModeNames(kModes));

}  // namespace
}  // namespace ps::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  absl::ParseCommandLine(argc, argv);
  // Before any thread: this process becomes the hub of the labs, so the
  // harness's gRPC stub reaches the scheduler in its namespace.
  if (ps::testing::NetworkLab::Unavailable().empty()) {
    if (absl::Status s = ps::testing::NetworkLab::EnterPrivateNetwork();
        !s.ok()) {
      std::fprintf(stderr, "EnterPrivateNetwork: %s\n",
                   std::string(s.message()).c_str());
      return 1;
    }
  }
  std::printf("network fault seed %" PRIu64
              ", %d trial(s) per scenario, heartbeat timeout "
              "%d ms\n",
              ps::testing::Seed(), ps::testing::Trials(),
              ps::testing::HeartbeatTimeoutMs());
  return ps::testing::RunAllTestsTimed("network_fault_test");
}
