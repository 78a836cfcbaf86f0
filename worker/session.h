// A worker's whole life in a job, in one object: joining (registration,
// waiting for the servers, the data-plane client), steps (clock and
// progress), barriers, taking over orphaned shards, finishing without
// holding the others back, the evaluator hand-off, checkpoints, and
// leaving with the exact data position. The trainer binary, kv_tool and the
// Python binding (python/native) are written on it, so the lifecycle exists
// once.
//
// Library mode: a session installs no signal handlers and does not touch
// the process's allocator. Every wait it does is bounded by
// Options::stop_check and polls Options::should_stop (and drain requests
// from the scheduler, and RequestStop()) between rounds, so the caller can
// react to its own signals: a stop ends the wait with CANCELLED.
//
// The lifecycle of a training worker:
//
//   Start ─ register ─ wait for the servers ─ KV client at start_clock()
//   [start_clock() == 0: rank 0 writes initial dense values, then everyone
//    meets at Barrier("ps-start"); a restored job at "ps-restored-<clock>"]
//   per step: pushes ─ EndStep(next position)  (progress reported on ack)
//   shard done: Claim(&final position) ─ ASSIGNED: Restart ─ train it
//                                      ─ ALL_DONE: Finish()
//   (shards() runs this protocol, start barrier included: a ShardCursor)
//   Finish() ─ true on the one worker that evaluates ─ EvaluationDone()
//   Leave(finished)   (the destructor leaves if nobody did)
//
// A worker asked to stop (should_stop, RequestStop, psctl drain) finishes
// its step, waits for its pushes, and calls Leave(false, &next position).
//
// The scheduler away: waits go on (the membership client retries) until it
// is back, or until cluster.scheduler_unreachable_timeout_ms: then every
// wait and every data-plane request ends with scheduler_gone() (UNAVAILABLE
// naming the scheduler's address; IsSchedulerGone). A worker the scheduler
// dropped (declared dead after a pause or a partition) must not train on:
// every wait and every data-plane request in flight or later ends at once
// with ABORTED "dropped by the scheduler: ..." (IsDropped, lost()); the
// caller stops and may join again as a new worker (trainer_main re-executes
// itself). A job the scheduler made FAILED (it cannot continue) ends the
// same way, at once, with FAILED_PRECONDITION "the job failed: <the
// scheduler's reason>" (IsJobFailed); the caller stops (trainer_main exits
// 5). All three are told by ended().
//
// Thread safety: the accessors, stop_requested(), RequestStop() and kv()
// are thread-safe. The step and lifecycle calls (EndStep, Barrier, Claim,
// Restart, Finish, EvaluationDone, Leave) are meant for one thread, the
// one that issues the step's pushes: a step's pushes and its clock advance
// must come from the same thread to keep their order (worker/kv_client.h).
#ifndef PS_WORKER_SESSION_H_
#define PS_WORKER_SESSION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/curve_keys.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/client.h"
#include "worker/kv_client.h"
#include "worker/shard_cursor.h"

namespace ps {

class WorkerSession {
 public:
  struct Options {
    // The validated job config (LoadJobConfig), the same file every process
    // of the job loaded.
    JobConfig config;
    // Scheduler "host:port".
    std::string scheduler;
    // An observer: joins no worker rank and has no clock, so it never
    // holds BSP/SSP back and never ends the job; it only reads (pulls,
    // scans, statistics), answered at once with what the servers hold
    // (under BSP: every step applied so far). For inspection, sidecar
    // evaluation and export while training runs. It follows the cluster
    // view by the scheduler's long poll; the step and lifecycle calls
    // fail with FAILED_PRECONDITION.
    bool observer = false;
    // A worker that trains data shards: its shard is resumed by another
    // worker if it dies or leaves early (RegisterRequest.trains_shards).
    // False for tools that only read or write parameters.
    bool trains_shards = true;
    // The job's CURVE key pair (LoadCurveKeys); nullopt: plaintext.
    std::optional<CurveKeys> curve;
    // Data-plane metrics (optional, not owned; must outlive the session).
    KVClient::Options::Instruments instruments;
    // Polled between the rounds of every wait; true stops the session (as
    // RequestStop). Called on the waiting thread. Optional.
    std::function<bool()> should_stop;
    // The longest a wait blocks before checking for a stop: the worst delay
    // between a stop request and the wait returning CANCELLED.
    absl::Duration stop_check = absl::Seconds(2);
    // How long Start waits for the servers; 0: cluster.startup_timeout_ms.
    absl::Duration startup_timeout = absl::ZeroDuration();
    // Called with the KV client once it exists and with nullptr before it
    // is destroyed (telemetry). On the thread calling Start / the
    // destructor. Optional.
    std::function<void(KVClient*)> on_client;
    // Called with the membership client once registered, and with nullptr
    // before it is destroyed. Optional.
    std::function<void(SchedulerClient*)> on_membership;
    // Time for deadlines, pacing and logs. Not owned; must outlive the
    // session.
    Clock* clock = Clock::Real();
  };

  // Registers with the scheduler as a worker, waits until every server has
  // registered, and creates the data-plane client at start_clock().
  // Errors: the scheduler's (registration refused: INVALID_ARGUMENT for a
  // config whose fingerprint differs, RESOURCE_EXHAUSTED when every worker
  // rank is taken...), UNAVAILABLE when it is unreachable,
  // DEADLINE_EXCEEDED when the servers do not all register in time,
  // CANCELLED when a stop was requested meanwhile (the session then left,
  // handing its shard back where it was given).
  static absl::StatusOr<std::unique_ptr<WorkerSession>> Start(Options options);

  // Leaves (Leave(false) with no position) unless Leave was called, then
  // closes the data-plane client and stops heartbeating.
  ~WorkerSession();
  WorkerSession(const WorkerSession&) = delete;
  WorkerSession& operator=(const WorkerSession&) = delete;

  const JobConfig& config() const { return options_.config; }
  bool observer() const { return options_.observer; }
  // Observers: rank 0, node id 0 (the servers' "tool" sender), clock 0.
  uint32_t rank() const { return membership_ ? membership_->rank() : 0; }
  uint64_t node_id() const { return membership_ ? membership_->node_id() : 0; }
  uint32_t num_workers() const {
    return options_.config.cluster().num_workers();
  }
  uint32_t num_servers() const {
    return options_.config.cluster().num_servers();
  }
  ConsistencyMode mode() const { return options_.config.consistency().mode(); }
  // The clock this worker started at: 0 in a fresh job; the job's clock for
  // a replacement or a restored job.
  uint64_t start_clock() const {
    return membership_ ? membership_->start_clock() : 0;
  }
  // The shard to train first and where in it; nullopt: no shard of its own
  // (a worker that joined a job whose shards are all taken asks Claim()).
  std::optional<DataPosition> initial_position() const;
  // The worker's clock: steps completed (kFinishedClock once finished).
  uint64_t clock() const { return kv_->clock(); }
  KVClient* kv() const { return kv_.get(); }
  SchedulerClient* membership() const { return membership_.get(); }

  // The table called `name`. INVALID_ARGUMENT naming the tables of the job
  // when there is none.
  absl::StatusOr<const TableConfig*> FindTable(absl::string_view name) const;

  // Ends a step: the clock goes up by one on every live server, after the
  // pushes this thread issued before it. Once every server has acknowledged
  // the step, `next` (the position of the next untrained batch, if given)
  // is reported to the scheduler with the new clock, so a replacement never
  // resumes past what the servers hold. Call exactly once per step in every
  // mode: under BSP/SSP the others' pulls wait for it.
  Completion EndStep(std::optional<DataPosition> next = std::nullopt);
  // Reports progress at once (for callers that track acknowledgements
  // themselves, like the trainer).
  void ReportProgress(uint64_t clock, const DataPosition& next);

  // Waits until every live worker reaches barrier `name`, in rounds of
  // stop_check. `ranks` (optional) receives the live ranks that arrived.
  // Every live server's view lists each worker that arrived, so a BSP step
  // after a barrier counts them all.
  // CANCELLED once a stop is requested; DEADLINE_EXCEEDED after `timeout`,
  // naming the missing ranks.
  absl::Status Barrier(absl::string_view name, absl::Duration timeout,
                       std::vector<uint32_t>* ranks = nullptr);

  // The job's shard protocol for this worker (worker/shard_cursor.h),
  // made on first use: this worker's initial shard, then claims; its
  // barriers, claims and restarts go through this session, its stop is
  // stop_requested() and its end ended(). Used by the lifecycle thread;
  // owned by the session.
  ShardCursor* shards();

  // Reports `finished` (the final position of the shard this worker just
  // ended; null when asking again) and asks for a shard to train: one round
  // of at most stop_check (while the scheduler is away, rounds are repeated
  // until it is back, a stop (then its UNAVAILABLE) or ended()). Sets the clock
  // to kFinishedClock first, so this worker never holds the others' BSP/SSP
  // waits back while it has no work. On ASSIGNED call
  // Restart(response.start_clock()) before training.
  absl::StatusOr<ClaimShardResponse> Claim(const DataPosition* finished);
  // Resumes training at `clock` after an assignment (KVClient::RestartClock).
  absl::Status Restart(uint64_t clock);

  // Ends this worker's training: the clock goes to kFinishedClock (BSP and
  // SSP never wait on it again), then every live worker meets at barrier
  // "train_done". Returns true on the one worker that should evaluate and
  // export for the job (the lowest rank that arrived), which calls
  // EvaluationDone() (or Leave) when it is done. The others return false
  // once the evaluator is done; if it leaves or dies first, the lowest of
  // them returns true instead. CANCELLED on a stop. `wait` bounds each
  // barrier.
  absl::StatusOr<bool> Finish(absl::Duration wait = absl::Hours(24));
  // The evaluator tells the others that the job's evaluation is done.
  absl::Status EvaluationDone();
  // The ranks that arrived at train_done (after Finish).
  const std::vector<uint32_t>& finished_ranks() const {
    return finished_ranks_;
  }

  // Asks the scheduler for a consistent checkpoint; returns the clock it
  // will be taken at (every server's state and every worker's position at
  // that clock), after this worker's clock. FAILED_PRECONDITION when the
  // job has no checkpoint.dir. The scheduler moves a checkpoint that a
  // worker has passed before it was taken to a later clock:
  // last_checkpoint_clock() says which one was committed.
  absl::StatusOr<uint64_t> RequestCheckpoint();
  // Who this worker's BSP/SSP waits are waiting for, for error messages:
  // "worker ranks 1 (clock 3), 4 (clock 2)" for the live workers whose last
  // reported clock is below this worker's; "" when none is (or in ASYNC,
  // or for an observer). Asks the scheduler (one RPC).
  std::string DescribeSlowWorkers();
  // The scheduler's status (GetStatusResponse: the view, the workers'
  // clocks, the job's progress): one RPC, observers included, bounded by
  // the control plane's RPC timeout (a worker retries transport failures
  // within it). Thread-safe.
  absl::StatusOr<GetStatusResponse> GetStatus();
  // The clock of the newest committed checkpoint (0: none yet).
  uint64_t last_checkpoint_clock() const;
  // This worker started a job restored from a checkpoint, at its clock
  // (not a replacement joining later): the workers of a restored job meet
  // at a barrier before their first step, as a fresh job's do, so that
  // under BSP none trains alone while the others are still joining.
  bool restored_start() const;

  // Asks every wait to end with CANCELLED and stop_requested() to say so.
  void RequestStop() { stop_.store(true); }
  // A stop was requested: RequestStop, should_stop, or psctl drain. (A
  // worker the scheduler dropped is told by lost(), not here: what it does
  // then is the caller's choice.)
  bool stop_requested() const;
  // The scheduler no longer counts this worker as a member (it was declared
  // dead after a pause, or the job ended).
  bool lost() const { return membership_ != nullptr && membership_->lost(); }
  // The scheduler stayed unreachable past its timeout.
  bool scheduler_gone() const {
    return membership_ != nullptr && !membership_->scheduler_gone().ok();
  }
  // Why this session can do nothing more: the dropped status (lost()), the
  // scheduler's being gone, or the job's failure (IsJobFailed); OK
  // otherwise.
  absl::Status ended() const;

  // Leaves the job. `finished`: this worker completed its part (see
  // LeaveRequest); `position`: where an unfinished worker's shard stands,
  // so the rest is trained by another worker from exactly there. An
  // evaluator that had not called EvaluationDone does so first. Later
  // calls do nothing and return OK, as does leaving a failed job (nothing
  // to leave).
  absl::Status Leave(bool finished, const DataPosition* position = nullptr);
  bool left() const { return left_; }

 private:
  explicit WorkerSession(Options options);
  // The client the view callback forwards to; the lock makes unpublishing
  // wait for a callback in progress.
  struct Published {
    absl::Mutex mu;
    KVClient* client ABSL_GUARDED_BY(mu) = nullptr;
    // Set when the scheduler dropped this worker or is gone, or the job
    // failed: the client (and one published later) is aborted with it.
    absl::Status ended ABSL_GUARDED_BY(mu);
  };
  class ViewWatcher;
  absl::Status Open();
  absl::Status OpenObserver();
  // Options::startup_timeout, or the config's when 0.
  absl::Duration StartupTimeout() const;
  // Makes the view callbacks forward to `client` (null: to nobody; waits
  // for a callback in progress). A client published after the session
  // ended is aborted at once.
  void Publish(KVClient* client);
  // Ends the data plane with `why` (dropped, the scheduler gone, the job
  // failed).
  static void End(Published* published, absl::Status why);
  bool StopNow() const;
  // FAILED_PRECONDITION naming `what` for an observer.
  absl::Status NotForObservers(absl::string_view what) const;

  const Options options_;
  std::shared_ptr<Published> published_ = std::make_shared<Published>();
  std::unique_ptr<SchedulerClient> membership_;  // null for observers
  std::unique_ptr<ViewWatcher> watcher_;         // observers only
  std::unique_ptr<KVClient> kv_;
  std::atomic<bool> stop_{false};
  bool left_ = false;
  // Finish() made this worker the evaluator of round `evaluation_round_`
  // and it has not said it is done.
  bool evaluating_ = false;
  int evaluation_round_ = 0;
  std::vector<uint32_t> finished_ranks_;
  std::unique_ptr<ShardCursor> shards_;
};

}  // namespace ps

#endif  // PS_WORKER_SESSION_H_
