// The job's progress and time left as the scheduler's /status.json shows
// them, on real jobs on loopback (1 scheduler, servers and trainer
// processes; tests/testing/job_harness.h). /status.json is read over HTTP
// every 100 ms and parsed into its proto (StatusReport).
//
// 1. SteadyJobEtaMatchesTheTimeItTook: an undisturbed ASYNC job of 2
//    workers. Progress stays in [0, 1], never goes back, and reaches 1.
//    At the first reading at or past 25 %, 50 % and 75 % the ETA shown is
//    within 25 % of the time the job then actually took to reach 100 %.
//    Prints each point and a JSON line.
// 2. EtaStaysSensibleThroughAWorkerKillAndASchedulerRestart: a worker is
//    SIGKILLed at 20 % (the other takes its shard over) and the scheduler
//    is SIGKILLed and restarted from its journal at 50 %. Every reading has
//    progress in [0, 1], never going back (across the restart by no more
//    than what the journal's last second missed), and every ETA shown is
//    finite, not
//    negative, and at most 5x the time actually left (or 60 s); within
//    15 s of the restart an ETA is shown again, the elapsed time carries
//    on, and progress reaches 1.
//
// Timeouts scale with PS_TIMEOUT_SCALE; the jobs are sized per build
// (StepsPerWorker), so that each lasts 20-40 s.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "proto/scheduler.pb.h"
#include "tests/testing/job_harness.h"
#include "tests/testing/subprocess.h"

namespace ps::testing {
namespace {

// Read only by builds without NDEBUG (StepsPerWorker).
[[maybe_unused]] bool Sanitized() {
  const char* s = std::getenv("PS_SANITIZER");
  return s != nullptr && std::string(s) == "1";
}

std::string ProgressJobConfig(const std::string& dir, uint64_t max_steps) {
  return absl::StrCat(R"pb(
                        name: "progress"
                        cluster { num_servers: 1 num_workers: 2 num_slots: 64
                                  heartbeat_interval_ms: 200
                                  heartbeat_timeout_ms: 3000
                                  on_worker_loss: REASSIGN
                                  scheduler_state_dir: ")pb",
                      dir, R"pb(                                                                                                                                                                /state"
    }
                                                                                                                                                                                                consistency { mode: ASYNC }
    tables {
      id: 0
      name: "w"
      sparse { dim: 1 }
      optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
    }
    tables {
      id: 1
      name: "d"
      dense { size: 14 }
      optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
    }
    data { synthetic_ctr { num_test: 2000 seed: 1 num_train: )pb",
                      // Enough for max_steps batches of 256 on each worker.
                      max_steps * 600, R"pb(}
                                            }
    training {
      batch_size: 256
      epochs: 1
      log_interval_s: 1
      sparse_table: "w"
      dense_table: "d"
      eval_interval_s: 5
      max_steps: )pb",
                      max_steps, "\n}\n");
}

// Steps per worker: about 20-40 s of training on a 2-core machine, in
// each build. An optimised build trains about 6 times as fast as the
// default one, and ASan's (-O1) about 1.8 times (9000 steps took 17 s,
// and the fault job then ended 4 s after the scheduler's restart: too
// soon, on a loaded machine, for the ETA to come back);
// ThreadSanitizer's (PS_TIMEOUT_SCALE above 1) runs several times slower.
uint64_t StepsPerWorker() {
  if (TimeoutScale() > 1) return 1500;
#ifdef NDEBUG
  return 36000;
#else
  return Sanitized() ? 18000 : 6000;
#endif
}

// The scheduler's HTTP port, from the newest incarnation's log.
std::optional<int> HttpPort(JobHarness& job) {
  const std::string log = ReadFile(job.scheduler().stderr_path());
  const std::string marker = "http endpoint on http://127.0.0.1:";
  const size_t at = log.rfind(marker);
  if (at == std::string::npos) return std::nullopt;
  return std::atoi(log.c_str() + at + marker.size());
}

absl::StatusOr<StatusReport> FetchStatus(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(1);
  client.set_read_timeout(2);
  auto response = client.Get("/status.json");
  if (!response) return absl::UnavailableError("no answer");
  if (response->status != 200)
    return absl::UnavailableError(absl::StrCat("HTTP ", response->status));
  StatusReport report;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(response->body, &report);
  if (!parsed.ok()) {
    return absl::DataLossError(
        absl::StrCat("not a StatusReport: ", parsed.ToString()));
  }
  return report;
}

struct Reading {
  absl::Time at;
  int incarnation = 0;
  StatusReport report;
};

// Reads /status.json every 100 ms until the job's processes exit (or
// `timeout`); `on_reading` may act on the job (kill, restart) between
// readings.
std::vector<Reading> Watch(
    JobHarness& job, absl::Duration timeout,
    const std::function<void(const Reading&)>& on_reading) {
  std::vector<Reading> readings;
  const absl::Time deadline = absl::Now() + timeout * TimeoutScale();
  std::optional<int> port;
  int incarnation = -1;
  while (absl::Now() < deadline) {
    if (incarnation != job.scheduler_restarts()) {
      port.reset();
      incarnation = job.scheduler_restarts();
    }
    if (!port.has_value()) port = HttpPort(job);
    if (port.has_value()) {
      absl::StatusOr<StatusReport> report = FetchStatus(*port);
      if (report.ok()) {
        readings.push_back({absl::Now(), incarnation, *std::move(report)});
        on_reading(readings.back());
        if (readings.back().report.state() == "FINISHED") break;
      }
    }
    bool running = false;
    for (int i = 0; i < job.num_worker_processes(); ++i)
      running = running || job.worker(i).running();
    if (!running && !readings.empty()) break;
    job.SleepFor(absl::Milliseconds(100));
  }
  return readings;
}

// When the job's training ended: progress first read 1, or, when the
// scheduler exited before a reading saw it (an optimised build ends a job
// within a few ms), when the last worker process was seen to exit (after
// its last step, the final evaluation and its leave: a little late).
std::optional<absl::Time> Finished(const std::vector<Reading>& readings,
                                   JobHarness& job) {
  for (const Reading& r : readings)
    if (r.report.job().progress() >= 1) return r.at;
  std::optional<absl::Time> last;
  for (int i = 0; i < job.num_worker_processes(); ++i) {
    const std::optional<absl::Time> at = job.worker(i).exited_at();
    if (at.has_value() && (!last.has_value() || *at > *last)) last = at;
  }
  return last;
}

std::unique_ptr<JobHarness> StartProgressJob(const std::string& name) {
  JobHarness::Options options;
  options.dir = absl::StrCat(::testing::TempDir(), "/", name);
  options.config = ProgressJobConfig(options.dir, StepsPerWorker());
  options.num_servers = 1;
  options.num_workers = 2;
  options.extra_args = [](const std::string& process) {
    return process.rfind("scheduler", 0) == 0
               ? std::vector<std::string>{"--http_port=0"}
               : std::vector<std::string>{};
  };
  absl::StatusOr<std::unique_ptr<JobHarness>> job = JobHarness::Start(options);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *std::move(job) : nullptr;
}

// How many times `c` occurs in `s`.
size_t Count(const std::string& s, char c) {
  return static_cast<size_t>(std::count(s.begin(), s.end(), c));
}

TEST(ProgressTest, SteadyJobEtaMatchesTheTimeItTook) {
  std::unique_ptr<JobHarness> job = StartProgressJob("steady");
  ASSERT_NE(job, nullptr);
  // psctl watch, piped (a line a second) and on a terminal (script(1)
  // gives it one: a line rewritten in place).
  absl::StatusOr<Subprocess> piped =
      job->StartPsctl({"watch", "--interval_s=1", "--give_up_s=3"});
  ASSERT_TRUE(piped.ok()) << piped.status();
  const std::string tty_out = absl::StrCat(job->dir(), "/watch-tty.out");
  absl::StatusOr<Subprocess> tty = Subprocess::Start(
      {"/usr/bin/script", "-qfec",
       absl::StrCat(Runfile("scheduler/psctl"), " --scheduler=", job->address(),
                    " watch --interval_s=0.2 --give_up_s=3"),
       "/dev/null"},
      tty_out, tty_out + ".err");
  ASSERT_TRUE(tty.ok()) << tty.status();
  const absl::Time watch_start = absl::Now();
  const std::vector<Reading> readings =
      Watch(*job, absl::Minutes(5), [](const Reading&) {});
  absl::StatusOr<JobHarness::Result> result = job->Wait(absl::Minutes(2));
  ASSERT_TRUE(result.ok()) << result.status() << job->LogTails(20);
  absl::StatusOr<int> piped_exit = piped->Wait(absl::Seconds(30));
  absl::StatusOr<int> tty_exit = tty->Wait(absl::Seconds(30));
  const double watched = absl::ToDoubleSeconds(absl::Now() - watch_start);
  // At the job's end psctl sees FINISHED, or every shard trained and then
  // the scheduler gone (exit 0); or, when the scheduler exited between two
  // looks, it gives up after --give_up_s (exit 1).
  EXPECT_TRUE(piped_exit.ok()) << piped_exit.status();
  EXPECT_TRUE(tty_exit.ok()) << tty_exit.status();
  const std::string lines = ReadFile(piped->stdout_path());
  std::printf("psctl watch, piped, over %.1f s: %zu lines; the last: %s",
              watched, Count(lines, '\n'),
              lines.substr(lines.rfind('\n', lines.size() - 2) + 1).c_str());
  EXPECT_GE(Count(lines, '\n'), 5u) << lines;
  EXPECT_LE(Count(lines, '\n'), watched + 2) << "more than a line a second";
  EXPECT_TRUE(lines.find("the job is over") != std::string::npos ||
              lines.find("FINISHED") != std::string::npos ||
              (*piped_exit == 1 &&
               lines.find("scheduler unreachable") != std::string::npos))
      << lines;
  EXPECT_EQ(lines.find('\r'), std::string::npos) << "in-place updates in a log";
  EXPECT_NE(lines.find("RUNNING"), std::string::npos) << lines;
  EXPECT_NE(lines.find("ETA "), std::string::npos) << lines;
  const std::string screen = ReadFile(tty_out);
  std::printf("psctl watch, on a terminal: %zu updates in place, %zu lines\n",
              Count(screen, '\r'), Count(screen, '\n'));
  EXPECT_GE(Count(screen, '\r'), 10u) << screen;
  EXPECT_NE(screen.find("\x1b[K"), std::string::npos);
  // The job's end (and, if the scheduler went first, one line saying so).
  EXPECT_LE(Count(screen, '\n'), 3u) << screen;
  ASSERT_GT(readings.size(), 20u) << job->LogTails(20);
  double last = 0;
  for (const Reading& r : readings) {
    const JobProgress& p = r.report.job();
    EXPECT_GE(p.progress(), last) << "progress went back";
    EXPECT_LE(p.progress(), 1.0);
    last = p.progress();
    if (p.has_eta_s()) {
      EXPECT_TRUE(std::isfinite(p.eta_s()));
      EXPECT_GE(p.eta_s(), 0);
    }
  }
  EXPECT_EQ(readings.front().report.job().progress(), 0) << "a late start";
  const std::optional<absl::Time> end = Finished(readings, *job);
  ASSERT_TRUE(end.has_value())
      << "progress never reached 1; last " << last << job->LogTails(20);
  std::string json = "{\"test\":\"steady_eta\"";
  for (const double mark : {0.25, 0.5, 0.75}) {
    const Reading* at = nullptr;
    for (const Reading& r : readings) {
      if (r.report.job().progress() >= mark) {
        at = &r;
        break;
      }
    }
    ASSERT_NE(at, nullptr);
    ASSERT_TRUE(at->report.job().has_eta_s())
        << "no ETA at " << at->report.job().progress();
    const double eta = at->report.job().eta_s();
    const double actual = absl::ToDoubleSeconds(*end - at->at);
    const double error = (eta - actual) / actual;
    std::printf(
        "at %.0f%% (progress %.3f): ETA %.2f s, took %.2f s, error %+.1f%%\n",
        100 * mark, at->report.job().progress(), eta, actual, 100 * error);
    EXPECT_LE(std::abs(error), 0.25)
        << "ETA " << eta << " s vs " << actual << " s at " << mark;
    absl::StrAppend(&json,
                    absl::StrFormat(",\"eta_%d\":%.3f,\"took_%d\":%.3f",
                                    static_cast<int>(100 * mark), eta,
                                    static_cast<int>(100 * mark), actual));
  }
  std::printf("%s}\n", json.c_str());
  // The job's curves were drawn from what the workers and servers said.
  const StatusReport& final_report = readings.back().report;
  std::vector<std::string> names;
  for (const Series& s : final_report.series())
    if (s.t_size() > 0) names.push_back(s.name());
  for (const char* want : {"loss/worker/0", "loss/worker/1", "examples_per_s",
                           "keys_per_s/server/0", "progress"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
}

TEST(ProgressTest, EtaStaysSensibleThroughAWorkerKillAndASchedulerRestart) {
  std::unique_ptr<JobHarness> job = StartProgressJob("faults");
  ASSERT_NE(job, nullptr);
  bool killed_worker = false;
  bool restarted = false;
  absl::Time restart_at = absl::InfiniteFuture();
  const std::vector<Reading> readings =
      Watch(*job, absl::Minutes(6), [&](const Reading& r) {
        const double p = r.report.job().progress();
        if (!killed_worker && p >= 0.2) {
          killed_worker = true;
          std::printf("SIGKILL worker 1 at progress %.3f\n", p);
          job->Signal(1, SIGKILL);
        }
        if (!restarted && p >= 0.5) {
          restarted = true;
          std::printf("SIGKILL the scheduler at progress %.3f\n", p);
          job->SignalScheduler(SIGKILL);
          job->SleepFor(absl::Milliseconds(500));
          const absl::Status s = job->RestartScheduler();
          EXPECT_TRUE(s.ok()) << s;
          restart_at = absl::Now();
        }
      });
  absl::StatusOr<JobHarness::Result> result = job->Wait(absl::Minutes(2));
  ASSERT_TRUE(result.ok()) << result.status() << job->LogTails(20);
  ASSERT_TRUE(killed_worker && restarted) << job->LogTails(20);
  const std::optional<absl::Time> end = Finished(readings, *job);
  ASSERT_TRUE(end.has_value())
      << "progress never reached 1" << job->LogTails(20);
  double last = 0;
  double last_elapsed = 0;
  int last_incarnation = 0;
  std::optional<absl::Time> eta_again;
  for (const Reading& r : readings) {
    const JobProgress& p = r.report.job();
    ASSERT_GE(p.progress(), 0);
    ASSERT_LE(p.progress(), 1);
    if (r.incarnation == last_incarnation) {
      EXPECT_GE(p.progress(), last);
      EXPECT_GE(p.elapsed_s() + 1e-6, last_elapsed);
    } else {
      // The journal holds positions up to about a second old.
      EXPECT_GE(p.progress(), last - 0.1) << "after the restart";
      EXPECT_GE(p.elapsed_s(), last_elapsed - 1) << "elapsed restarted";
    }
    last = p.progress();
    last_elapsed = p.elapsed_s();
    last_incarnation = r.incarnation;
    if (!p.has_eta_s()) continue;
    const double left = std::max(0.0, absl::ToDoubleSeconds(*end - r.at));
    EXPECT_TRUE(std::isfinite(p.eta_s()));
    EXPECT_GE(p.eta_s(), 0);
    EXPECT_LE(p.eta_s(), std::max(60.0, 5 * left))
        << "at progress " << p.progress() << " with " << left << " s left";
    if (r.incarnation > 0 && !eta_again.has_value()) eta_again = r.at;
  }
  ASSERT_TRUE(eta_again.has_value()) << "no ETA after the scheduler restart";
  const double gap = absl::ToDoubleSeconds(*eta_again - restart_at);
  std::printf("ETA shown again %.1f s after the scheduler restart\n", gap);
  EXPECT_LE(gap, 15 * TimeoutScale());
}

}  // namespace
}  // namespace ps::testing
