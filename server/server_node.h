// A server node: one KVServer joined to its job, with everything a server
// process wires around it. Start() binds the data plane, starts the HTTP
// endpoint (/metrics, /healthz, /readyz), registers with the scheduler and
// forwards what the scheduler says to the server:
//   - every newer cluster view (KVServer::UpdateView) and the health the
//     HTTP endpoint reports (rank, slot map, lost membership);
//   - leases (KVServer::SetLease) from every acknowledged heartbeat, and the
//     fence (KVServer::Fence) once the scheduler dropped this server or
//     stayed unreachable past cluster.scheduler_unreachable_timeout_ms;
//   - the server's checkpoint reports to the scheduler, which go out from a
//     reporter thread of the node: KVServer::Options::on_checkpoint runs on
//     the serving thread and must not block, and a report is a gRPC call
//     that may take up to the RPC timeout while the scheduler is slow or
//     away. Reports go out one at a time, in the order they were written.
// Run() waits for the job to end, a stop (SIGTERM, psctl drain) or the end
// of the membership, and Leave() is the exit sequence: a preempted server
// of a running job with checkpoint.dir checkpoints first (so a replacement
// restores every update it acknowledged), then stops serving, logs its
// statistics and leaves. A node the scheduler dropped or gave up on does
// neither: it is fenced, stops serving and reports why (Exit), and main()
// exits with that code (server_main.cc lists them).
//
// The in-process test cluster (tests/testing/cluster.h) is made of these,
// so tests run the same wiring as the binary.
//
// Thread safety: the accessors, RequestStop() and stop_requested() are
// thread-safe; Run() and Leave() are for one thread (main's).
#ifndef PS_SERVER_SERVER_NODE_H_
#define PS_SERVER_SERVER_NODE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/curve_keys.h"
#include "common/http_endpoint.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/client.h"
#include "server/server.h"

namespace ps {

class ServerNode {
public:
  struct Options {
    // The validated job config (StartNode), the same every process loaded.
    JobConfig config;
    // Scheduler "host:port".
    std::string scheduler;
    // ZeroMQ endpoint of the data plane; port "*" picks a free one.
    std::string bind_endpoint = "tcp://127.0.0.1:*";
    // Host workers use to reach this server when it differs from the bound
    // address (binding 0.0.0.0); empty: the bound endpoint.
    std::string advertise_host;
    // The job's CURVE key pair (LoadCurveKeys); nullopt: plaintext.
    std::optional<CurveKeys> curve;
    // The HTTP endpoint: port 0 picks a free one (logged), -1 turns it off.
    std::string http_host = "127.0.0.1";
    int http_port = -1;
    // True when this node is the whole process (server_main): it adds the
    // process metrics to its registry and tags the process's log lines
    // with "server/<rank>". False for nodes sharing a process (tests).
    bool own_process = true;
    // Time source of Leave()'s wait for the preemption checkpoint. Not
    // owned; must outlive the node.
    Clock *clock = Clock::Real();
    // How long Leave() waits for the preemption checkpoint to be written.
    absl::Duration checkpoint_wait = absl::Seconds(60);
    // Called once, on the heartbeat thread, when the scheduler drains this
    // node (psctl drain), besides RequestStop(): main() turns it into its
    // SIGTERM, so both take one path. Must not block. Optional.
    std::function<void()> on_drain;
    // Test seam: called on the reporter thread before each checkpoint
    // report is sent (a test holds one back to show the serving thread
    // goes on meanwhile). Optional.
    std::function<void(const ReportCheckpointRequest &)> before_report;
  };

  // How the node ended; main() exits with the value.
  enum class Exit : int {
    // Left the job (it finished, or a stop was asked for).
    kLeft = 0,
    // The scheduler dropped this server (declared dead after a pause or a
    // partition): fenced, stopped, not left (there is nothing to leave).
    kDropped = 3,
    // The scheduler stayed unreachable past its timeout: fenced, stopped,
    // no checkpoint attempted (the newest committed one stays).
    kSchedulerGone = 4,
    // The scheduler says the job cannot continue (JobState FAILED):
    // stopped, not left, no checkpoint (its reason is logged).
    kJobFailed = 5,
    // A table's storage failed (KVServer::storage_failure: a disk tier's
    // I/O error or corrupted file): fenced, stopped, not left and no
    // checkpoint (what the tables hold can no longer be trusted), so the
    // scheduler declares the server dead and the job recovers it as a
    // crashed one.
    kStorageFailed = 6,
  };

  // Starts the server, the HTTP endpoint and the membership, in that order
  // (the membership advertises the bound endpoint). Errors: KVServer's
  // (INVALID_ARGUMENT for a bad table config, UNAVAILABLE when the endpoint
  // cannot be bound), the HTTP endpoint's, SchedulerClient::Connect's
  // (registration refused, scheduler unreachable).
  static absl::StatusOr<std::unique_ptr<ServerNode>> Start(Options options);

  // Stops the reporter, the HTTP endpoint, heartbeating and serving, in
  // that order. Does not leave: a node destroyed without Leave() is
  // declared dead after the heartbeat timeout. A report still queued is
  // dropped.
  ~ServerNode();
  ServerNode(const ServerNode &) = delete;
  ServerNode &operator=(const ServerNode &) = delete;

  KVServer &server() const { return *server_; }
  SchedulerClient &membership() const { return *membership_; }
  // Null when Options::http_port was -1.
  HttpEndpoint *http() const { return http_.get(); }
  metrics::Registry &registry() { return registry_; }
  uint32_t rank() const { return membership_->rank(); }
  // The data-plane endpoint workers are given (advertise_host applied).
  const std::string &endpoint() const { return endpoint_; }

  // Asks Run() to return through Leave(preempted = true), as SIGTERM does.
  void RequestStop() { stop_.Notify(); }
  bool stop_requested() const { return stop_.HasBeenNotified(); }

  // Blocks until the job finishes, a stop is requested (RequestStop, a
  // drain, or `wait_for_stop` returning true: it waits at most its
  // argument for the caller's own stop, e.g. TerminationSignals::WaitFor;
  // null: none) or the membership ends; then Leave(preempted = a stop was
  // requested) unless the membership ended.
  Exit Run(const std::function<bool(absl::Duration)> &wait_for_stop = nullptr);

  // The exit sequence. kDropped / kSchedulerGone when the membership ended
  // (then nothing else happens). Otherwise, when `preempted` and the job is
  // RUNNING with checkpoint.dir: the server stops right after writing its
  // shard of a checkpoint it asks the scheduler for, waiting at most
  // Options::checkpoint_wait (Options::clock), and its report is sent
  // before leaving. Then serving stops, statistics are logged and the node
  // leaves the job (finished). Returns kLeft then, also when the
  // checkpoint or leaving failed (logged).
  Exit Leave(bool preempted);

private:
  class Reporter;
  // What /healthz and /readyz report, set by the view callback and Ended().
  struct Health {
    std::atomic<int64_t> rank{-1};
    std::atomic<bool> has_slots{false};
    std::atomic<bool> lost{false};
  };

  explicit ServerNode(Options options);
  absl::Status Open();
  // Open's part: the HTTP endpoint (/metrics, /healthz, /readyz) over `kv`.
  absl::Status StartHttp(KVServer* kv);
  // Dropped or given up on the scheduler: fences health, stops serving,
  // logs why and returns the exit; nullopt while the membership holds.
  std::optional<Exit> Ended();

  const Options options_;
  std::shared_ptr<spdlog::logger> log_;
  std::shared_ptr<Health> health_ = std::make_shared<Health>();
  // Outlives the server, which reports to it.
  metrics::Registry registry_;
  std::unique_ptr<Reporter> reporter_;
  std::unique_ptr<KVServer> server_;
  std::unique_ptr<HttpEndpoint> http_;
  std::unique_ptr<SchedulerClient> membership_;
  std::string endpoint_;
  absl::Notification stop_;
};

} // namespace ps

#endif // PS_SERVER_SERVER_NODE_H_
