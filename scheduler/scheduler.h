// The scheduler: a gRPC server for membership, the cluster view and
// barriers (proto/scheduler.proto), plus a failure detector that declares
// silent nodes dead.
//
// Restart: a scheduler started with the config and launch id of a job
// whose scheduler died (not stopped by SIGTERM/SIGINT, which stop the job)
// takes the job back from the journal it left
// (SchedulerStateDir, scheduler/journal.h) when it was written within
// cluster.scheduler_unreachable_timeout_ms, before the job's nodes gave up,
// and the job had not finished. Told to pick any port, it listens on the
// port its predecessor had, where the job's nodes look for it. One
// scheduler at a time uses a state directory (a lock file in it).
//
// Start() returns a running handle; the destructor shuts it down. Thread-
// safe. Requests are validated and answered with gRPC status codes; a bad
// request never affects other nodes.
#ifndef PS_SCHEDULER_SCHEDULER_H_
#define PS_SCHEDULER_SCHEDULER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "grpcpp/server.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/cluster_state.h"
#include "scheduler/journal.h"

namespace ps {

// Where the scheduler of `config` journals: cluster.scheduler_state_dir,
// else <checkpoint.dir>/scheduler, else "" (the config names none).
std::string SchedulerStateDir(const JobConfig& config);

// A per-job state directory for a config that names none:
// <xdg_state_home>/ps/<job name>, else <home>/.local/state/ps/<job name>
// (the XDG base directory convention), "" when both are empty. The job
// name is made a single safe path component.
std::string DefaultSchedulerStateDir(const JobConfig& config,
                                     absl::string_view xdg_state_home,
                                     absl::string_view home);

// GetStatus's trailing metadata key with ClusterState::JournalError()'s
// message, when the scheduler takes no changes (psctl status shows it).
inline constexpr absl::string_view kJournalErrorKey = "ps-journal-error-bin";

class SchedulerServer {
 public:
  struct Options {
    // Validated job config.
    JobConfig config;
    // gRPC listen address; port 0 picks a free port.
    std::string listen_address = "127.0.0.1:0";
    // Time source for heartbeat expiry. Not owned; must outlive the server.
    Clock* clock = Clock::Real();
    // Run the failure detector thread (tests with a fake clock call
    // state()->ExpireSilentNodes() themselves).
    bool run_failure_detector = true;
    // Where to journal when the config names no directory
    // (SchedulerStateDir); "" keeps no journal. Unlike a configured
    // directory, one that cannot be used (another scheduler holds it, it
    // cannot be written) is logged and the job runs without a journal.
    std::string default_state_dir;
    // Which launch of the job this is (the launcher's choice, the same for
    // a scheduler restarted in place): a journal of another launch is set
    // aside, never resumed.
    std::string launch_id;
  };

  // UNAVAILABLE if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<SchedulerServer>> Start(
      Options options);
  ~SchedulerServer();

  int port() const { return port_; }
  // "host:port" to give to clients.
  std::string address() const;
  ClusterState* state() { return state_.get(); }

  // Blocks until the job is finished and every server has left or died, or
  // it failed and its nodes have had time to learn it (ClusterState::AllDone),
  // or until `timeout`. Returns whether the job is over (state()->View()
  // says which way).
  bool WaitUntilDone(absl::Duration timeout);

  void Shutdown();

 private:
  class Service;
  explicit SchedulerServer(Options options);
  void DetectFailures();
  // Takes a running job back from the journal in the job's scheduler state
  // dir when there is a live one of this launch (true), and starts
  // journaling there. Errors for a damaged or inconsistent journal of a
  // live job, and for a configured dir that cannot be locked or written.
  absl::StatusOr<bool> TakeBackJob();
  // Whether the journal `file` read (`journal`) is of this job and launch,
  // still live and unfinished; if not, says why and sets it aside.
  absl::StatusOr<bool> Resumable(JournalFile& file,
                                 const SchedulerJournal& journal);
  // Builds and starts the gRPC server on the listen address (on
  // `journaled_port` when that is set and the address asks for any port).
  absl::Status Listen(uint32_t journaled_port);

  const Options options_;
  std::unique_ptr<ClusterState> state_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Notification stop_;
  std::thread detector_;
};

}  // namespace ps

#endif  // PS_SCHEDULER_SCHEDULER_H_
