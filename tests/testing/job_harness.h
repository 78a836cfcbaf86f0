// Runs a whole job as real processes on loopback, for fault-injection
// tests: one scheduler, the config's servers and workers (the trainer),
// each a Subprocess with its own log. The test can watch the job through
// the scheduler's GetStatus (ranks, workers' clocks, who is alive), signal
// a worker, start a replacement worker, and wait for every process to
// exit.
//
// Files in Options::dir: job.pbtxt, scheduler.port, and for every process
// NAME.out (stdout) and NAME.log (stderr), NAME being "scheduler",
// "server<i>" or "worker<i>" (i counts launches, not ranks: a replacement
// is worker<num_workers>, ...). A restarted scheduler (RestartScheduler)
// is "scheduler.<n>" for restart n = 1, 2, ... Workers write the summary
// to summary.json.
//
// Not thread-safe. Destroying the harness SIGKILLs every process still
// running.
#ifndef PS_TESTS_TESTING_JOB_HARNESS_H_
#define PS_TESTS_TESTING_JOB_HARNESS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/status.h"
#include "proto/scheduler.grpc.pb.h"
#include "tests/testing/subprocess.h"

namespace ps::testing {

class JobHarness {
 public:
  struct Options {
    // Created if missing; files of an earlier run there are overwritten.
    std::string dir;
    // The job config (textproto). Its cluster block must give num_servers
    // and num_workers, the counts below.
    std::string config;
    int num_servers = 1;
    int num_workers = 1;
    // Binaries, as Runfile() paths.
    std::string scheduler_binary = "scheduler/scheduler_main";
    std::string server_binary = "server/server_main";
    std::string worker_binary = "worker/trainer";
    // How long Start (and RestartScheduler) waits for the scheduler's port.
    absl::Duration startup_timeout = absl::Seconds(20);
    // An argv prefix for the process named `name` ("scheduler",
    // "server<i>", "worker<i>"), e.g. {"ip", "netns", "exec", "psnet-w1"}
    // to run it in a network namespace; unset or empty = none. A prefix's
    // first word without a '/' is looked up in PATH.
    std::function<std::vector<std::string>(const std::string& name)> wrap;
    // Extra flags for the process named `name` (after the harness's own),
    // e.g. a server's --bind / --advertise_host inside a namespace.
    std::function<std::vector<std::string>(const std::string& name)> extra_args;
    // The scheduler listens here (--host) and every process, and the
    // harness's own gRPC stub, reach it at scheduler_host:port.
    std::string scheduler_host = "127.0.0.1";
    // Extra flags for every worker (before extra_args' own).
    std::vector<std::string> worker_args;
  };

  // Exit codes (Subprocess::Wait: 128 + signal for a signal) and output of
  // a job whose processes all exited.
  struct Result {
    // The last scheduler incarnation's exit code (earlier ones were
    // killed by the test).
    int scheduler = -1;
    // Indexed like server(i): the initial servers, then replacements.
    std::vector<int> servers;
    // Indexed like worker(i): the initial workers, then replacements.
    std::vector<int> workers;
    // The JSON summary line, as printed on the evaluator's stdout; empty
    // if no worker printed one.
    std::string summary;
    // How many worker processes printed a summary (1 in a sound job).
    int summaries = 0;
    // Indexed like `workers`: each one's summary line, empty if none.
    std::vector<std::string> worker_summaries;
    // From Start to the last process's exit.
    absl::Duration elapsed;
  };

  // Starts the scheduler, then every server and worker, without waiting
  // for them to register.
  static absl::StatusOr<std::unique_ptr<JobHarness>> Start(Options options);

  JobHarness(const JobHarness&) = delete;
  JobHarness& operator=(const JobHarness&) = delete;
  ~JobHarness();

  const std::string& dir() const { return options_.dir; }
  // The scheduler's host:port (the same across RestartScheduler).
  const std::string& address() const { return address_; }
  int num_worker_processes() const { return static_cast<int>(workers_.size()); }
  Subprocess& worker(int i) { return workers_[i]; }
  // "worker<i>": the prefix of its files.
  static std::string WorkerName(int i);
  // Server processes started so far (initial ones, then replacements).
  int num_servers() const { return static_cast<int>(servers_.size()); }
  Subprocess& server(int i) { return servers_[i]; }
  // "server<i>": the prefix of its files.
  static std::string ServerName(int i);
  // The current scheduler incarnation, and how many restarts so far.
  Subprocess& scheduler() { return schedulers_.back(); }
  int scheduler_restarts() const {
    return static_cast<int>(schedulers_.size()) - 1;
  }

  // Every timeout below (and startup_timeout) is multiplied by
  // TimeoutScale() (tests/testing/subprocess.h): slower builds such as
  // ThreadSanitizer's get proportionally longer.

  // psctl against this job's scheduler: `psctl --scheduler=address()
  // --timeout_ms=<psctl_timeout> args...`, with its stdout and stderr in
  // dir()/psctl<N>.out and .err (N counts the runs). The test's data must
  // hold //scheduler:psctl. StartPsctl returns the running process;
  // RunPsctl waits up to psctl_timeout + 60 s (scaled) for it to exit.
  struct ToolRun {
    int code = -1;       // exit code; -1 when it did not start or exit
    std::string output;  // stdout, then stderr (or why it did not run)
  };
  absl::StatusOr<Subprocess> StartPsctl(
      std::vector<std::string> args,
      absl::Duration psctl_timeout = absl::Minutes(2));
  ToolRun RunPsctl(std::vector<std::string> args,
                   absl::Duration psctl_timeout = absl::Minutes(2));

  // The scheduler's snapshot (view and live workers' clocks).
  absl::StatusOr<GetStatusResponse> Status();

  // Waits until the scheduler counts worker(i) as a live member; its rank.
  absl::StatusOr<uint32_t> WaitForRegistration(int i, absl::Duration timeout);

  // Waits until live worker(i)'s clock, as last reported to the scheduler
  // (heartbeats, so up to a heartbeat interval behind), is at least `step`.
  // A worker waiting for work reports kFinishedClock, which counts as
  // reaching any step. Returns the clock seen; FAILED_PRECONDITION when
  // the worker is no longer a live member (finished or gone) or exited.
  absl::StatusOr<uint64_t> WaitForStep(int i, uint64_t step,
                                       absl::Duration timeout);

  // The scheduler's node id of worker(i), once WaitForRegistration saw it
  // registered; 0 before.
  uint64_t node_id(int i) const {
    return i < static_cast<int>(node_ids_.size()) ? node_ids_[i] : 0;
  }

  // Node ids the scheduler declared dead (missed heartbeats), from its log.
  std::vector<uint64_t> DeclaredDead() const;

  // The longest a live worker had been silent (no heartbeat) in any
  // Status() answer before the first Signal(), in ms: how close the job
  // came to a false death.
  uint64_t max_silent_ms() const { return max_silent_ms_; }

  // Sends `sig` to worker(i) if it is still running; false if it was not.
  bool Signal(int i, int sig);

  // Waits until the scheduler no longer counts worker(i) as alive (it left,
  // or was declared dead after the heartbeat timeout). OK also when the
  // scheduler has exited (the job is over).
  absl::Status WaitUntilGone(int i, absl::Duration timeout);

  // Starts one more worker process (a replacement); its index.
  absl::StatusOr<int> StartWorker();

  // Sends `sig` to server(i) / the current scheduler if it is still
  // running; false if it was not.
  bool SignalServer(int i, int sig);
  bool SignalScheduler(int sig);

  // Starts one more server process (a replacement); its index.
  absl::StatusOr<int> StartServer();

  // Starts a new scheduler process on the same host and port, with the
  // same config (the caller has stopped the previous one, e.g. SIGKILL;
  // FAILED_PRECONDITION if it still runs). Its files are
  // scheduler.<n>.out/.log for restart n. Retries the bind for up to
  // startup_timeout (a port the dead one held may be free only a moment
  // later). Wait, LogTails and DeclaredDead cover every incarnation.
  absl::Status RestartScheduler();

  // Sleeps for `d` (not scaled), looking at every process every 10 ms so
  // their Subprocess::exited_at() stay as precise while the test waits.
  void SleepFor(absl::Duration d);

  // Every wait below also calls `check` (at most every 50 ms) and ends
  // with ABORTED and its answer when that is not empty: a way to give up
  // at once on a job that can no longer pass.
  void set_abort_check(std::function<std::string()> check) {
    abort_check_ = std::move(check);
  }

  // Waits for every process to exit on its own. DEADLINE_EXCEEDED (with
  // what still runs) if the job does not end within `timeout`, ABORTED by
  // the abort check; the processes are then left running for the caller
  // to inspect, and killed by the destructor.
  absl::StatusOr<Result> Wait(absl::Duration timeout);

  // The last `lines` lines of every process's stderr (log) and stdout,
  // each headed by its file name: what a failure report should show.
  std::string LogTails(int lines) const;

 private:
  explicit JobHarness(Options options);

  // ABORTED when the abort check says so.
  absl::Status CheckAbort();
  // The live membership record of `pid`, if the scheduler has one.
  absl::StatusOr<std::optional<NodeInfo>> LiveNode(pid_t pid);
  // Starts `binary` as the process `name` with `args`, applying the
  // options' wrap and extra_args; files dir/<file_prefix>.out/.log.
  absl::StatusOr<Subprocess> Launch(const std::string& name,
                                    const std::string& file_prefix,
                                    const std::string& binary,
                                    std::vector<std::string> args);
  // Starts scheduler incarnation `n` (0 = first) with `port` (0 = any);
  // waits for its port file and sets address_.
  absl::Status LaunchScheduler(int n, int port);

  Options options_;
  std::string config_path_;
  std::string address_;
  std::unique_ptr<Scheduler::Stub> stub_;
  absl::Time started_;
  // Every scheduler incarnation, the current one last.
  std::vector<Subprocess> schedulers_;
  int port_ = 0;
  std::vector<Subprocess> servers_;
  std::vector<Subprocess> workers_;
  std::vector<uint64_t> node_ids_;  // by worker index; 0 = not seen yet
  int psctl_runs_ = 0;
  uint64_t max_silent_ms_ = 0;
  bool signalled_ = false;  // Signal() was called
  std::function<std::string()> abort_check_;
  absl::Time last_abort_check_ = absl::InfinitePast();
};

// The value of a numeric field of a one-line JSON object ("test_auc"), or
// nullopt if absent or not a number (null).
std::optional<double> JsonNumber(const std::string& json,
                                 const std::string& field);
// The raw text of a field's value ("[0,2]" for an array), or "".
std::string JsonRaw(const std::string& json, const std::string& field);

}  // namespace ps::testing

#endif  // PS_TESTS_TESTING_JOB_HARNESS_H_
