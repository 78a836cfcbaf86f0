// A node's link to the scheduler: registers, heartbeats in the background,
// keeps the newest cluster view, and offers barriers and leaving.
//
// While the scheduler is away (restarting, partitioned) the node goes on:
// heartbeats keep being sent (the first failure and then one line every 5 s
// are logged, and "scheduler reachable again after 2.3 s" when it is back),
// and the unary calls (claims, barriers, checkpoints, status, leaving, the
// polls of WaitForRunning) retry what the transport failed (UNAVAILABLE, a
// deadline that passed in flight) with backoff from 100 ms to 1 s, within
// the caller's bound. A scheduler restarted with the job's journal answers
// the same node ids again: nothing changes for the node. Two things end
// it:
//  - lost(): a heartbeat answered NOT_FOUND, the scheduler no longer counts
//    this node (declared dead after a pause or a partition, or it forgot it
//    on a restart without journal). on_lost runs once; every call in flight
//    and later ends with DroppedError (ABORTED "dropped by the scheduler:
//    ...").
//  - scheduler_gone(): nothing acknowledged for longer than
//    Options::unreachable_timeout. on_scheduler_gone runs once; every call
//    in flight and later ends with that status (UNAVAILABLE naming the
//    address, how long, cluster.scheduler_unreachable_timeout_ms and the last
//    gRPC error).
// Leases (servers' fencing, server/server.h): every acknowledged heartbeat
// (and the registration) calls on_lease(send time + 3/4 heartbeat_timeout).
// The scheduler declares a node dead heartbeat_timeout after the last
// heartbeat it received, which was sent after that send time, so a lease
// always lapses before anyone else may take over the node's slots.
//
// Thread-safe. The callbacks run on the heartbeat thread (on_scheduler_gone
// possibly on the thread of a call that noticed it first); they must not
// block for long or call back into this client's blocking methods.
#ifndef PS_SCHEDULER_CLIENT_H_
#define PS_SCHEDULER_CLIENT_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "proto/scheduler.grpc.pb.h"

namespace ps {

// The status of every wait of a node the scheduler dropped: ABORTED,
// "dropped by the scheduler: <detail>". IsDropped recognises it (also
// annotated, or after a gRPC round trip: it looks for the code and the
// reason the status carries, common/reasons.h WithReason, not its text).
absl::Status DroppedError(absl::string_view detail);
bool IsDropped(const absl::Status& status);
// True for the status of scheduler_gone() (also annotated; by its reason).
bool IsSchedulerGone(const absl::Status& status);

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
    // cluster.heartbeat_timeout_ms: after it the scheduler declares a silent
    // node dead. Bounds each heartbeat RPC (a partition that drops packets
    // must not stall the loop) and sets the lease.
    absl::Duration heartbeat_timeout = absl::Seconds(5);
    // cluster.scheduler_unreachable_timeout_ms: how long the node goes on
    // without any acknowledgement before scheduler_gone().
    absl::Duration unreachable_timeout = absl::Seconds(60);
    // Called after each acknowledged heartbeat (and at registration) with
    // send time + 3/4 heartbeat_timeout (steady clock): until then no other
    // node can have taken over this one's slots. Must not block.
    std::function<void(std::chrono::steady_clock::time_point until)> on_lease;
    // Called once when the scheduler answers that this node is no longer a
    // member (lost()). Must not block.
    std::function<void()> on_lost;
    // Called once with scheduler_gone(). Must not block.
    std::function<void(const absl::Status&)> on_scheduler_gone;
    // Called with every newer view and this node's rank, on the heartbeat
    // thread (and once from Connect()).
    std::function<void(const ClusterView&, uint32_t rank)> on_view;
    // Called once, on the heartbeat thread, when a heartbeat first says the
    // scheduler is draining this node (psctl drain): the node should leave
    // exactly as on SIGTERM. Must not block.
    std::function<void()> on_drain;
    // Called on the heartbeat thread before each heartbeat is sent, to add
    // what the node reports now and then (servers: slot_bytes). Must not
    // block, and must not set node_id, known_epoch, clock or position.
    std::function<void(HeartbeatRequest*)> fill_heartbeat;

    // Options for a node of the job `config` (fingerprint, heartbeat
    // interval and timeout, unreachable timeout and TLS taken from it)
    // reaching the scheduler at `address`.
    static Options ForJob(const JobConfig& config, std::string address,
                          Role role);
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
  // Workers: what the heartbeats tell of training (TrainingReport), for the
  // job's progress and curves. Thread-safe; all counters add up.
  // `loss_sum` is the summed per-example loss of `loss_examples` examples
  // (0 and 0 for a step whose loss was not finite); `wait` the time the
  // step waited for its pulls.
  void AddTrained(uint64_t examples, double loss_sum, uint64_t loss_examples,
                  absl::Duration wait);
  // Workers: batches in an epoch of the shard being trained (0: unknown).
  void SetShardBatches(uint64_t batches);
  // Workers: a new value of metric `name` (e.g. "test_auc") measured at
  // step `step`, shown as a curve on the scheduler's /status. The newest
  // value of each name goes with every heartbeat. INVALID_ARGUMENT for a
  // name that is not 1 to 64 characters of [A-Za-z0-9_./-] or a value that
  // is not finite; RESOURCE_EXHAUSTED for a name beyond kMaxMetricsPerWorker
  // (common/protocol.h).
  absl::Status ReportMetric(absl::string_view name, double value,
                            uint64_t step);
  // Workers: reports `finished` (if not null) as done and asks for an
  // orphaned shard, waiting up to `timeout` (see ClaimShardResponse).
  // Retried while the scheduler is away, with `finished` again (the
  // scheduler answers a repeated claim with the shard it assigned), until
  // `timeout`: UNAVAILABLE then.
  absl::StatusOr<ClaimShardResponse> ClaimShard(const DataPosition* finished,
                                                absl::Duration timeout);
  // Servers: reports this server's part of checkpoint `request.clock`
  // (node_id is filled in). This and the two below retry for at most
  // Options::rpc_timeout.
  absl::Status ReportCheckpoint(ReportCheckpointRequest request);
  // Servers: reports the progress of a slot move this server is the source
  // of (node_id is filled in). FAILED_PRECONDITION: the report is stale
  // (no such move in progress any more).
  absl::Status ReportMove(ReportMoveRequest request);
  // The scheduler's snapshot for operators (psctl status): the view and the
  // live workers' last reported clocks.
  absl::StatusOr<GetStatusResponse> GetStatus();
  // Asks the scheduler to start a checkpoint; returns its clock, which is
  // after `after_clock` (a worker's own clock, which heartbeats report late).
  absl::StatusOr<uint64_t> RequestCheckpoint(uint64_t after_clock = 0);

  // True once the scheduler said this node is no longer a member.
  bool lost() const { return lost_.load(); }
  // DroppedError with the scheduler's answer once lost(); OK before.
  absl::Status lost_status() const;
  // OK while the scheduler is reachable or was within unreachable_timeout;
  // for good after that (see the file comment).
  absl::Status scheduler_gone() const;
  // True once a heartbeat said the scheduler is draining this node.
  bool drain_requested() const { return drain_.load(); }

  // Waits until all servers have registered. DEADLINE_EXCEEDED on timeout
  // (UNAVAILABLE when the scheduler was away until then).
  absl::StatusOr<ClusterView> WaitForRunning(absl::Duration timeout);

  // Waits until every live worker reaches barrier `name`. Every 10 s of
  // waiting it logs which worker ranks are missing. DEADLINE_EXCEEDED after
  // `timeout`.
  // `ranks`, if not null, receives the live worker ranks that arrived,
  // ascending (the lowest acts for the job afterwards).
  absl::Status Barrier(const std::string& name, absl::Duration timeout,
                       std::vector<uint32_t>* ranks = nullptr);

  // The dense all-reduce ring (Scheduler.JoinRing and the rest; the
  // worker side is worker/dense_ring.h). Each call waits up to `wait` at
  // the scheduler (at most 30 s) and retries transport failures until
  // then; errors are the scheduler's, or UNAVAILABLE when it cannot be
  // reached.
  absl::StatusOr<JoinRingResponse> JoinRing(absl::Duration wait,
                                            uint32_t min_members = 0,
                                            uint64_t after_generation = 0);
  absl::Status LeaveRing();
  // Whether this worker must join the ring again (WatchRingResponse).
  absl::StatusOr<bool> WatchRing(uint64_t generation, absl::Duration wait);
  // request.node_id is filled in.
  absl::StatusOr<RingStoreResponse> RingStore(RingStoreRequest request,
                                              absl::Duration wait);

  // Leaves the job and stops heartbeating. `finished`: see LeaveRequest.
  // `position`: a worker leaving before its shard is done says where it
  // stands, so the rest is reassigned from exactly there. Retried while the
  // scheduler is away (until scheduler_gone()); a retry answered NOT_FOUND
  // (the first attempt had arrived) and a node already lost are done: OK.
  absl::Status Leave(bool finished, const DataPosition* position = nullptr);

 private:
  explicit SchedulerClient(Options options);
  void HeartbeatLoop();
  // Long-polls the scheduler for newer views so changes arrive within
  // milliseconds rather than at the next heartbeat.
  void WatchLoop();
  // Installs a newer view, or merges a delta (ClusterView.delta_from) into
  // the one held. False for a delta made against another view: the caller
  // asks for the whole view.
  bool InstallView(const ClusterView& view);
  // A worker asks for the servers and itself only (servers_only): that is
  // all it routes by, and it keeps views small however large the fleet.
  void AskAsThisNode(GetClusterViewRequest* request) const;
  // Workers: reports the position at `checkpoint_clock` once reached.
  void MaybeReportCheckpoint(uint64_t checkpoint_clock);
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) const;
  void StopHeartbeats();

  // One attempt of a unary call with a deadline of `timeout`. The context
  // is registered so that a drop or the scheduler being gone cancels it;
  // those end the call with lost_status() / scheduler_gone(). Sets
  // *transport when the transport failed (worth retrying) rather than the
  // scheduler answering; notes whether the scheduler was reached.
  grpc::Status Attempt(
      absl::Duration timeout,
      const std::function<grpc::Status(grpc::ClientContext*)>& rpc,
      bool* transport);
  // Calls `rpc` (Attempt), retrying transport failures with backoff until
  // `give_up`; each attempt's deadline is at most `timeout`.
  grpc::Status CallWithRetry(
      absl::Duration timeout, absl::Time give_up,
      const std::function<grpc::Status(grpc::ClientContext*)>& rpc);
  // CallWithRetry of a call the scheduler may hold up to `held_ms` (a long
  // poll): each attempt, and all of them, may take that plus rpc_timeout.
  grpc::Status CallHeld(
      int64_t held_ms,
      const std::function<grpc::Status(grpc::ClientContext*)>& rpc);
  // Sleeps the backoff `*delay` (then doubles it up to 1 s), at most until
  // `give_up`; false when retrying must stop instead (past `give_up`, lost,
  // gone).
  bool Backoff(absl::Duration* delay, absl::Time give_up);
  // The scheduler answered (anything but a transport failure).
  void NoteReached();
  // A call failed in transport with `status`: logs (rate-limited) and
  // declares the scheduler gone once unreachable for too long.
  void NoteUnreachable(const grpc::Status& status);
  // The heartbeat was answered NOT_FOUND.
  void MarkLost(const std::string& why);
  // Ends every call in flight (after lost or gone).
  void CancelCalls();
  // lost_status() or scheduler_gone() as a gRPC status, OK when neither.
  grpc::Status EndedStatus() const;

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
  TrainingReport training_ ABSL_GUARDED_BY(progress_mu_);
  bool has_training_ ABSL_GUARDED_BY(progress_mu_) = false;
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
  std::atomic<bool> gone_{false};
  std::atomic<bool> drain_{false};
  // Reachability of the scheduler (steady clock).
  mutable absl::Mutex reach_mu_;
  std::chrono::steady_clock::time_point last_ack_ ABSL_GUARDED_BY(reach_mu_);
  // Since when calls fail in transport (none while reachable).
  bool unreachable_ ABSL_GUARDED_BY(reach_mu_) = false;
  std::chrono::steady_clock::time_point unreachable_since_
      ABSL_GUARDED_BY(reach_mu_);
  std::chrono::steady_clock::time_point last_warning_
      ABSL_GUARDED_BY(reach_mu_);
  std::string last_error_ ABSL_GUARDED_BY(reach_mu_);
  absl::Status lost_status_ ABSL_GUARDED_BY(reach_mu_);
  absl::Status gone_status_ ABSL_GUARDED_BY(reach_mu_);
  // Unary calls in flight, cancelled when the node is dropped or the
  // scheduler is gone; `ended_` wakes their backoff sleeps.
  absl::Mutex calls_mu_;
  absl::flat_hash_set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(calls_mu_);
  bool ended_ ABSL_GUARDED_BY(calls_mu_) = false;
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
