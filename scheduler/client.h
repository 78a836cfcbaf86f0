// A node's link to the scheduler: registers, heartbeats in the background,
// keeps the newest cluster view, and offers barriers and leaving.
//
// Thread-safe. The view callback runs on the heartbeat thread; it must not
// block for long or call back into this client's blocking methods.
#ifndef PS_SCHEDULER_CLIENT_H_
#define PS_SCHEDULER_CLIENT_H_

#include <atomic>
#include <deque>
#include <utility>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "proto/scheduler.grpc.pb.h"

namespace ps {

class SchedulerClient {
 public:
  struct Options {
    // Scheduler "host:port".
    std::string address;
    Role role = ROLE_UNSPECIFIED;
    // Servers: the data-plane endpoint to advertise.
    std::string data_endpoint;
    // ConfigFingerprint() of the loaded job config.
    uint64_t config_fingerprint = 0;
    // Workers that train data shards (RegisterRequest.trains_shards).
    bool trains_shards = false;
    absl::Duration heartbeat_interval = absl::Milliseconds(500);
    // Control-plane TLS files (all empty: plaintext). ForJob copies the
    // job's; Connect fails with their error if they are unusable.
    TlsConfig tls;
    // Deadline of each unary RPC.
    absl::Duration rpc_timeout = absl::Seconds(5);
    // How long to keep retrying registration while the scheduler is
    // unreachable (processes of a job may start in any order).
    absl::Duration connect_timeout = absl::Seconds(30);
    // Called with every newer view and this node's rank, on the heartbeat
    // thread (and once from Connect()).
    std::function<void(const ClusterView&, uint32_t rank)> on_view;
    // Called once, on the heartbeat thread, when a heartbeat first says the
    // scheduler is draining this node (psctl drain): the node should leave
    // exactly as on SIGTERM. Must not block.
    std::function<void()> on_drain;

    // Options for a node of the job `config` (fingerprint and heartbeat
    // interval taken from it) reaching the scheduler at `address`.
    static Options ForJob(const JobConfig& config, std::string address, Role role);
  };

  // Registers and starts heartbeating. Errors: those of Register (see
  // scheduler.proto), or UNAVAILABLE when the scheduler stayed unreachable.
  static absl::StatusOr<std::unique_ptr<SchedulerClient>> Connect(
      Options options);

  // Stops heartbeating. Does not leave: a node that exits without Leave()
  // is declared dead after the heartbeat timeout.
  ~SchedulerClient();

  uint64_t node_id() const { return node_id_; }
  uint32_t rank() const { return rank_; }
  ClusterView view() const;
  JobState job_state() const;
  // Workers: the clock to report with the next heartbeats. Thread-safe.
  void set_clock(uint64_t clock) { clock_.store(clock); }
  // This worker's start clock as the scheduler assigned it.
  uint64_t start_clock() const { return start_clock_; }
  // Workers: the shard to train first and where in it (RegisterResponse);
  // without one, ask with ClaimShard().
  bool has_initial_shard() const { return has_initial_shard_; }
  const DataPosition& initial_shard() const { return initial_shard_; }
  // Workers: the clock and data position reached after a step, reported
  // with the next heartbeats (a replacement resumes the shard from there).
  // When a checkpoint is pending at exactly `clock`, the position is also
  // reported for it (ReportCheckpoint) from the heartbeat thread.
  // Thread-safe.
  void set_progress(uint64_t clock, const DataPosition& position);
  // Workers: reports `finished` (if not null) as done and asks for an
  // orphaned shard, waiting up to `timeout` (see ClaimShardResponse).
  absl::StatusOr<ClaimShardResponse> ClaimShard(const DataPosition* finished,
                                                absl::Duration timeout);
  // Servers: reports this server's part of checkpoint `request.clock`
  // (node_id is filled in).
  absl::Status ReportCheckpoint(ReportCheckpointRequest request);
  // The scheduler's snapshot for operators (psctl status): the view and the
  // live workers' last reported clocks.
  absl::StatusOr<GetStatusResponse> GetStatus();
  // Asks the scheduler to start a checkpoint; returns its clock, which is
  // after `after_clock` (a worker's own clock, which heartbeats report late).
  absl::StatusOr<uint64_t> RequestCheckpoint(uint64_t after_clock = 0);

  // True once the scheduler said this node is no longer a member.
  bool lost() const { return lost_.load(); }
  // True once a heartbeat said the scheduler is draining this node.
  bool drain_requested() const { return drain_.load(); }

  // Waits until all servers have registered. DEADLINE_EXCEEDED on timeout.
  absl::StatusOr<ClusterView> WaitForRunning(absl::Duration timeout);

  // Waits until every live worker reaches barrier `name`. Every 10 s of
  // waiting it logs which worker ranks are missing. DEADLINE_EXCEEDED after
  // `timeout`.
  // `ranks`, if not null, receives the live worker ranks that arrived,
  // ascending (the lowest acts for the job afterwards).
  absl::Status Barrier(const std::string& name, absl::Duration timeout,
                       std::vector<uint32_t>* ranks = nullptr);

  // Leaves the job and stops heartbeating. `finished`: see LeaveRequest.
  // `position`: a worker leaving before its shard is done says where it
  // stands, so the rest is reassigned from exactly there.
  absl::Status Leave(bool finished, const DataPosition* position = nullptr);

 private:
  explicit SchedulerClient(Options options);
  void HeartbeatLoop();
  // Long-polls the scheduler for newer views so changes arrive within
  // milliseconds rather than at the next heartbeat.
  void WatchLoop();
  void InstallView(const ClusterView& view);
  // Workers: reports the position at `checkpoint_clock` once reached.
  void MaybeReportCheckpoint(uint64_t checkpoint_clock);
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) const;
  void StopHeartbeats();

  const Options options_;
  std::unique_ptr<Scheduler::Stub> stub_;
  uint64_t node_id_ = 0;
  uint32_t rank_ = 0;
  uint64_t start_clock_ = 0;
  bool has_initial_shard_ = false;
  DataPosition initial_shard_;
  std::atomic<uint64_t> clock_{0};
  absl::Mutex progress_mu_;
  bool has_position_ ABSL_GUARDED_BY(progress_mu_) = false;
  DataPosition position_ ABSL_GUARDED_BY(progress_mu_);
  // The checkpoint clock this worker last reported its position for.
  uint64_t reported_checkpoint_ ABSL_GUARDED_BY(progress_mu_) = 0;
  // The last kHistory (clock, position) pairs, so a checkpoint learnt of a
  // few steps late still gets the position at its clock.
  static constexpr size_t kHistory = 64;
  std::deque<std::pair<uint64_t, DataPosition>> history_
      ABSL_GUARDED_BY(progress_mu_);

  // Held while a view is installed and its callback runs, so callbacks
  // never see views out of order. Acquired before mu_.
  absl::Mutex install_mu_;
  mutable absl::Mutex mu_;
  ClusterView view_ ABSL_GUARDED_BY(mu_);
  JobState job_state_ ABSL_GUARDED_BY(mu_) = STARTING;

  std::atomic<bool> lost_{false};
  std::atomic<bool> drain_{false};
  absl::Notification stop_;
  // The watch loop's long poll in flight, so stopping can cancel it rather
  // than wait for it to time out.
  absl::Mutex watch_mu_;
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(watch_mu_) = nullptr;
  std::thread heartbeat_;
  std::thread watcher_;
};

}  // namespace ps

#endif  // PS_SCHEDULER_CLIENT_H_
