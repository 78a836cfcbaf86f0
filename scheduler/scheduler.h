// The scheduler: a gRPC server for membership, the cluster view and
// barriers (proto/scheduler.proto), plus a failure detector that declares
// silent nodes dead.
//
// Restart: a scheduler started with the config of a job whose scheduler
// died takes the job back from the journal it left (SchedulerStateDir,
// scheduler/journal.h) when it was written within
// cluster.scheduler_unreachable_timeout_ms, before the job's nodes gave up.
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

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "grpcpp/server.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/cluster_state.h"

namespace ps {

// Where the scheduler of `config` journals: cluster.scheduler_state_dir,
// else <checkpoint.dir>/scheduler, else "" (no journal).
std::string SchedulerStateDir(const JobConfig& config);

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
  // until `timeout`. Returns whether the job is done.
  bool WaitUntilDone(absl::Duration timeout);

  void Shutdown();

 private:
  class Service;
  explicit SchedulerServer(Options options);
  void DetectFailures();
  // Takes a running job back from the journal in the job's scheduler state
  // dir when there is a live one (true), and starts journaling there.
  // Errors for a damaged or inconsistent journal of a live job.
  absl::StatusOr<bool> TakeBackJob();

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
