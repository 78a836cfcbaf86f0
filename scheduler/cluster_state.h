// The scheduler's membership state machine, independent of gRPC so it can
// be tested with a fake clock.
//
// Ranks: each role has ranks 0..count-1; a registering node gets the lowest
// rank not held by a live node of its role, so a replacement takes the rank
// of the node it replaces. A worker rank whose holder left as finished is
// not given out again: its share of the work is done. Slots are assigned to
// server ranks in contiguous ranges once every server rank is held (job
// RUNNING). Every change bumps the view's epoch.
//
// Replication (cluster.replication 2): every slot also has a backup, at
// first the next rank after its owner. When a server dies (or leaves) while
// the job runs, each slot it owned goes to its backup if that is alive (the
// backup is promoted; the slot has no backup for now), slots it backed lose
// their backup, and every slot with a live owner and no backup gets the
// least loaded other live server as its new backup. A replacement server
// (same rank) becomes the backup of the slots its rank owned or backed in
// the initial layout; it owns only slots that had no live copy, which it
// restores from the newest checkpoint. Backups copy their slots from the
// primaries (server/server.h); the scheduler only assigns them. Without
// replication slot_backup is empty and a replacement owns its old slots.
//
// The job is FINISHED once every worker rank has been taken at least once,
// no worker is alive, and at least one worker left saying it finished.
//
// The job is FAILED (final) when it cannot continue (CheckCanContinue):
// slots have no live copy and there is no checkpoint to restore them from,
// or a checkpoint exists but no replacement server registered for them
// within cluster.failover_timeout_ms, or no member was alive for
// cluster.scheduler_unreachable_timeout_ms. ClusterView.failure says why;
// registrations, drains, barriers and claims are then refused with
// JobFailedError (common/reasons.h) and every node exits 5.
//
// Thread-safe: all methods lock an internal mutex. The Await* methods block
// the calling thread (a gRPC handler thread) for at most their timeout.
//
// The rules that need no membership are value types kept under that mutex,
// each with its own test: slot placement (scheduler/slot_map.h), the data
// shards (scheduler/shard_ledger.h), a worker's pace
// (scheduler/pace_estimator.h).
#ifndef PS_SCHEDULER_CLUSTER_STATE_H_
#define PS_SCHEDULER_CLUSTER_STATE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/protocol.h"
#include "common/status.h"
#include "proto/checkpoint.pb.h"
#include "proto/config.pb.h"
#include "proto/journal.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/job_tracker.h"
#include "scheduler/pace_estimator.h"
#include "scheduler/shard_ledger.h"
#include "scheduler/slot_map.h"

namespace ps {

class ClusterState {
 public:
  // File system access for checkpoints, injectable for tests. Both may be
  // empty (no checkpoints are committed; replacements restore nothing).
  struct CheckpointStore {
    // Commits checkpoint `manifest` in directory `dir` (writes MANIFEST
    // and prunes old checkpoints).
    std::function<absl::Status(const std::string& dir,
                               const CheckpointManifest& manifest)>
        commit;
    // The newest valid checkpoint, for a server that replaces a dead one.
    std::function<absl::StatusOr<CheckpointRef>()> latest;
  };

  // The longest any call waits (a longer timeout asked for is cut to it).
  static constexpr absl::Duration kMaxWait = absl::Seconds(30);

  // ClusterView.slot_backup of a slot without a backup (common/protocol.h).
  static constexpr uint32_t kNoBackup = ::ps::kNoBackup;

  ClusterState(const JobConfig& config, Clock* clock,
               CheckpointStore store = {});

  // Journaling, so a restarted scheduler takes the job back
  // (scheduler/journal.h): `write` gets the whole state before any call
  // that changed it returns (sync false: durable against the scheduler
  // being killed), and from SyncJournal (sync true). Writes run one at a
  // time, under the state's lock, except those of checkpoint reports that
  // changed no epoch, which run just after it (nothing a node was told
  // depends on them until they are answered); a write older than one
  // already done is skipped.
  // Set before any node registers; no journal without it (null: none).
  // Returns the first write's error (the state then takes no changes, as
  // below, until a write succeeds or SetJournal is called again).
  //
  // A change the journal could not record is not acknowledged: the call
  // that made it answers UNAVAILABLE, as if its answer had been lost (the
  // change stays in memory and is recorded by the next write that
  // succeeds). From then until a write succeeds (SyncJournal retries about
  // once a second) the state takes no changes: every call that would
  // change it answers UNAVAILABLE, which nodes retry as for an unreachable
  // scheduler, no node is declared dead and no checkpoint starts.
  // Heartbeats are still answered, so no node is lost meanwhile.
  // JournalError() says why (the scheduler's /readyz, /status and psctl
  // status show it). Why not go on unrecorded: nodes would be told of
  // ranks, shards and barriers that a restarted scheduler knows nothing of.
  using JournalWriter =
      std::function<absl::Status(const SchedulerJournal& journal, bool sync)>;
  absl::Status SetJournal(JournalWriter write);
  // Writes the journal, synced, with the workers' newest clocks and data
  // positions (which heartbeats change without a journal write). Called
  // about once a second. (scheduler/cluster_state_journal.cc)
  void SyncJournal();
  // OK, or UNAVAILABLE with the journal's last write error while the state
  // takes no changes (see SetJournal).
  absl::Status JournalError() const;
  // Recorded in the journal: the launch this scheduler serves (a restarted
  // scheduler resumes only a journal of its own launch) and the port it
  // listens on (which a restarted one binds again, so the job's nodes find
  // it at the address they have). Call before serving.
  void SetLaunch(const std::string& launch_id);
  void SetListenPort(int port);
  // The port of SetListenPort, or of the journal Recover took (0: none).
  uint32_t ListenPort() const;
  // The job is being stopped on purpose (the scheduler's SIGTERM): the
  // journal says so, synced, and is not resumed by a later scheduler.
  absl::Status MarkStopped();
  // A restarted scheduler takes the running job back from `journal`, which
  // is validated against the job config first (it comes from a file):
  // FAILED_PRECONDITION for another job's journal, DATA_LOSS naming the
  // first inconsistency otherwise; the state is then unchanged. Every node
  // alive in the journal keeps its id, rank, role, slots and clock and has a
  // heartbeat timeout plus kRecoveryGrace from now to be heard from (the
  // nodes' reconnect backoff); the epoch goes up by
  // one and the view counts the restart (scheduler_restarts,
  // recovered_epoch, recovered_nodes). Call before serving.
  absl::Status Recover(const SchedulerJournal& journal);

  // The job starts from checkpoint `path` (its manifest): workers start at
  // its clock and resume their shards from its positions; servers restore
  // it. Call before any node registers.
  void SetRestore(const std::string& path, const CheckpointManifest& manifest);

  // Workers: reports a finished shard and waits up to `timeout` for an
  // orphaned one (see ClaimShardResponse). NOT_FOUND for unknown or dead
  // callers.
  absl::StatusOr<ClaimShardResponse> ClaimShard(
      const ClaimShardRequest& request, absl::Duration timeout);
  // ClaimShard in parts, for a caller that waits without a thread
  // (ClaimWaiters). FinishClaim records the finished shard (NOT_FOUND for
  // unknown or dead callers) and says which
  // journal snapshot must be written before the claim is answered
  // (JournalWritten; 0: none). DecideClaims then answers each ask that may
  // be answered now (`first`: its first decision; `expired`: its wait is
  // over, WAIT when nothing else), nullopt for the others; one lock for all.
  struct ClaimTicket {
    absl::Status status;
    uint64_t seq = 0;
  };
  ClaimTicket FinishClaim(const ClaimShardRequest& request);
  // FinishClaim for several claims at once (one ticket each, in order):
  // one lock and one journal write for them all.
  std::vector<ClaimTicket> FinishClaims(
      const std::vector<const ClaimShardRequest*>& requests);
  struct ClaimAsk {
    const ClaimShardRequest* request;
    bool first;
    bool expired;
  };
  std::vector<std::optional<absl::StatusOr<ClaimShardResponse>>> DecideClaims(
      const std::vector<ClaimAsk>& asks);
  // Called, under the state's lock (it must not call back), whenever a
  // waiting claim may have become answerable. Null: none.
  void SetClaimListener(std::function<void()> listener);
  // Whether journal snapshot `seq` (or a later one) is written; waits for
  // a write in progress.
  bool JournalWritten(uint64_t seq) ABSL_LOCKS_EXCLUDED(journal_file_mu_);

  // Starts a checkpoint a few steps ahead of the fastest worker (the next
  // clock when no worker trains). Returns its clock. FAILED_PRECONDITION
  // without checkpoint.dir or before the job runs.
  absl::StatusOr<uint64_t> StartCheckpoint(uint64_t after_clock = 0);
  // A server's or worker's part of the checkpoint in progress.
  // FAILED_PRECONDITION for a checkpoint not in progress (stale report).
  absl::Status ReportCheckpoint(const ReportCheckpointRequest& request);
  // Several reports at once (one status each, in order): one journal write
  // and one completeness check for them all (a fleet's nodes report
  // together; CallBatcher hands them over in rounds).
  std::vector<absl::Status> ReportCheckpoints(
      const std::vector<const ReportCheckpointRequest*>& requests);
  // Periodic: starts checkpoints every checkpoint.interval_steps (and
  // requested ones that had to be retried), abandons one that takes too
  // long. Returns log lines, for tests.
  std::vector<std::string> CheckCheckpoints();

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request);
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request);
  absl::Status Leave(const LeaveRequest& request);
  // Marks a live node as draining (psctl drain): its heartbeats are then
  // answered with drain set, and it leaves as on SIGTERM. Bumps the epoch
  // so the view shows it. Errors and what is refused as unsafe: see Drain
  // in scheduler.proto. (scheduler/cluster_state_drain.cc)
  absl::StatusOr<DrainResponse> Drain(const DrainRequest& request);

  // Live scale-out and scale-in (cluster.elastic;
  // scheduler/cluster_state_moves.cc). Elastic jobs start with
  // cluster.num_servers servers; a server registering while no rank that
  // owns slots is free joins as a spare (the lowest free rank below
  // elastic.max_servers, owning nothing). Scale plans slot moves
  // (scheduler/move_planner.h) so that `servers` servers own slots, and
  // starts them (at most elastic.max_concurrent_moves at once; the rest
  // wait). A move (ClusterView.moves, SlotMove) COPYs its slots from the
  // source to the target, FENCEs them once the source reports COPIED (not
  // while a checkpoint is in progress, and no checkpoint starts during a
  // fence; nor while the target still receives another move's copy, which
  // the target would import before it could confirm the fence), and flips
  // them once it reports FENCED: the target owns them,
  // and with replication 2 the source becomes their backup. A move whose
  // source or target dies or leaves is dropped (the slots stay with the
  // source, or fail over as usual). One whose source reports ABORTED (a
  // refused copy, a digest mismatch) while both servers stay live is
  // planned again from a fresh copy, kMoveRetryWait x its tries later, up
  // to kMoveAttempts tries; then it is dropped as well, and a scale-in
  // that needed it keeps its server. A
  // server emptied by a scale-in is drained once it holds no slot (its
  // backups go to other servers first) and leaves; it exits 0.
  //
  // Scale errors: FAILED_PRECONDITION without cluster.elastic, before the
  // job runs, while moves or a scale-in are in progress, or when the plan
  // cannot be met (PlanMoves); INVALID_ARGUMENT for a bad count or rank.
  absl::StatusOr<ScaleResponse> Scale(const ScaleRequest& request);
  // A move's source reports its progress. NOT_FOUND for unknown or dead
  // callers; FAILED_PRECONDITION for a report that matches no move in
  // progress (stale: the caller drops it).
  absl::Status ReportMove(const ReportMoveRequest& request);
  // Periodic: starts fences that waited for a checkpoint, queued moves,
  // and drains emptied servers. Returns log lines, for tests.
  std::vector<std::string> CheckMoves();

  // Returns the view once it satisfies the request or the timeout passes
  // (then the current view, which the caller may inspect). With
  // `known_epoch` (the caller's view) older than the current one and still
  // in the recent history, a delta against it (ClusterView.delta_from);
  // otherwise the whole view.
  ClusterView AwaitView(uint64_t min_epoch, bool wait_for_running,
                        absl::Duration timeout, uint64_t known_epoch = 0);

  // What a view long poll waits on, read without waiting (ViewWatchers
  // answers long polls without a thread each from this and ViewsFor).
  struct ViewHead {
    uint64_t epoch = 0;
    JobState job_state = STARTING;
    bool closed = false;
  };
  ViewHead Head() const;
  // How a node asks for the view: the epoch it holds (0: none) and whether
  // it wants the servers and itself (node_id) only
  // (GetClusterViewRequest.servers_only).
  struct ViewAsk {
    uint64_t known_epoch = 0;
    bool servers_only = false;
    uint64_t node_id = 0;
  };
  // AwaitView's answer to each ask, without the wait, built under one hold
  // of the lock, in the asks' order: a delta against the known epoch where
  // the recent history has it, else the whole view.
  std::vector<ClusterView> ViewsFor(const std::vector<ViewAsk>& asks);
  // `listener` runs after every epoch change and on Close, under this
  // object's lock: it must be quick and must not call into this object.
  void SetViewListener(std::function<void()> listener);

  // Blocks until every live worker has arrived at barrier `name`.
  // DEADLINE_EXCEEDED names the missing ranks; NOT_FOUND for unknown or
  // dead callers; INVALID_ARGUMENT for servers or an empty name.
  // On success returns the ranks of the workers that had arrived when the
  // barrier was released and are still alive, ascending (the same for a
  // caller arriving after the release).
  absl::StatusOr<std::vector<uint32_t>> AwaitBarrier(uint64_t node_id,
                                                     const std::string& name,
                                                     absl::Duration timeout);
  // What a released barrier answers: built once per barrier and epoch and
  // shared by every caller, so N workers released at once cost N pointer
  // copies under the lock, not N copies of N ranks.
  struct BarrierRelease {
    std::vector<uint32_t> ranks;      // ascending
    std::vector<uint32_t> rank_runs;  // the same (scheduler/rank_runs.h)
  };
  // AwaitBarrier, answering the shared release.
  absl::StatusOr<std::shared_ptr<const BarrierRelease>> AwaitBarrierRelease(
      uint64_t node_id, const std::string& name, absl::Duration timeout);

  // A barrier in two halves, for callers that wait without a thread
  // (scheduler/barrier_waiters.h). ArriveAtBarriers records arrivals, each
  // with AwaitBarrier's checks and errors (one status per arrival), under
  // one lock and with one check for released barriers. DecideBarriers answers
  // each ask as AwaitBarrier would now: the shared release once the barrier is
  // released (on record in the journal first), the job's failure, the
  // state's Close (UNAVAILABLE), or, for an ask `at_deadline`,
  // DEADLINE_EXCEEDED naming the missing ranks; nullopt while it waits.
  // `name` must outlive the call.
  struct BarrierArrival {
    uint64_t node_id;
    const std::string* name;
  };
  struct BarrierAsk {
    const std::string* name;
    bool at_deadline;
  };
  using BarrierAnswer =
      std::optional<absl::StatusOr<std::shared_ptr<const BarrierRelease>>>;
  std::vector<absl::Status> ArriveAtBarriers(
      const std::vector<BarrierArrival>& arrivals);
  std::vector<BarrierAnswer> DecideBarriers(
      const std::vector<BarrierAsk>& asks);
  // `listener` runs whenever a waiting barrier may be decided (a barrier
  // released, the job failed, Close), under this object's lock: it must be
  // quick and must not call into this object. nullptr: none.
  void SetBarrierListener(std::function<void()> listener);

  // Changes the consistency mode in the view (INVALID_ARGUMENT for a bad
  // one). Watchdog settings stay as configured. Returns the new epoch.
  absl::StatusOr<uint64_t> SetConsistency(const ConsistencyConfig& consistency);

  // The view plus live workers' last reported clocks and the job's
  // progress (scheduler/job_tracker.h).
  GetStatusResponse Status() const;
  // What /status.json shows: the state, the job's progress, the servers'
  // activity and the curves (job_name is left to the caller).
  StatusReport Report() const;
  // Records a point of every curve and of the job's pace; called about
  // once a second (the scheduler's failure detector loop).
  void SampleProgress();

  // For monitoring (scheduler/monitoring.h): what the view does not carry.
  struct NodeActivity {
    // Since the node's last heartbeat (or its registration).
    double silent_seconds = 0;
    // Workers still training: steps per second over recent heartbeats;
    // -1 when not known yet (or not a training worker).
    double steps_per_second = -1;
    // Servers with a disk tier: their last report (HeartbeatRequest.storage).
    bool has_storage = false;
    ServerStorage storage;
  };
  struct Monitoring {
    // Live nodes, by node id.
    std::map<uint64_t, NodeActivity> nodes;
    // Since the scheduler started: heartbeats accepted, distinct barriers
    // released, nodes declared dead by ExpireSilentNodes.
    uint64_t heartbeats = 0;
    uint64_t barriers_completed = 0;
    uint64_t nodes_declared_dead = 0;
    // Journal writes since the scheduler started, the time they took
    // (snapshot, serialisation and write; seconds) and the last one's size
    // (bytes).
    uint64_t journal_writes = 0;
    double journal_write_seconds = 0;
    uint64_t journal_bytes = 0;
    // The scheduler's own faults (see ExpireSilentNodes): whether it
    // suspects now that it is cut off from the cluster, and since when
    // (seconds); how many times it suspected so; how many of its own
    // stalls it noticed.
    bool isolation_suspected = false;
    double isolation_suspected_seconds = 0;
    uint64_t isolation_suspicions = 0;
    uint64_t stalls = 0;
  };
  Monitoring Monitor() const;

  // Watchdog, called periodically: when the job is synchronous and the
  // slowest live worker's clock has not moved for the watchdog timeout
  // while others are ahead, or a barrier has waited that long, logs the
  // ranks holding it up with their clocks (again every watchdog interval).
  // Returns the lines logged, for tests.
  std::vector<std::string> CheckProgress();

  // Declares nodes whose last heartbeat is older than the timeout dead.
  // Returns the ids declared dead now. Called periodically (see
  // ExpectSweepsEvery).
  //
  // The scheduler does not judge others across its own faults:
  // - A stall: when the time since the previous call is far longer than the
  //   sweep period (the scheduler was paused, or this thread starved; see
  //   ExpectSweepsEvery), every node gets a fresh heartbeat timeout before
  //   any death is declared, as after Recover. Heartbeats sent meanwhile
  //   are still queued, or on their way.
  // - Suspected isolation: when a node is silent past the timeout while
  //   more than half of the live nodes (or all of them) have been silent
  //   for longer than the midpoint of the heartbeat interval and timeout,
  //   the scheduler more likely cannot hear them than they all died. (Not
  //   "past the timeout" for all: nodes cut off at the same moment pass
  //   their timeouts up to a heartbeat interval apart, and the first would
  //   be declared alone.) It declares no one dead
  //   for up to cluster.isolation_hold_ms (the servers' leases keep a
  //   server it cannot see from serving, so safety does not hang on the
  //   declarations). Once at most half are silent, the suspicion ends and
  //   every node gets a fresh timeout plus the length of the silence (TCP
  //   retransmission backoff can delay a node's return by about that
  //   long); a silence that outlasts the hold is declared as deaths. A
  //   hold of 0 declares at once.
  std::vector<uint64_t> ExpireSilentNodes();
  // ExpireSilentNodes is called about every `period` (the scheduler's
  // monitor loop): a gap between two calls longer than
  // max(2 * period, (heartbeat_timeout - heartbeat_interval) / 2) is taken
  // as the scheduler's own stall. That bound is short enough that a node
  // heard from just before a shorter gap is still within its timeout.
  // Without this call no gap counts as a stall (a test moving a fake clock
  // in jumps). Call before serving.
  void ExpectSweepsEvery(absl::Duration period);

  // Whether the running job can continue (see the class comment); makes it
  // FAILED, logged at error level once, when it cannot. Called from the
  // failure detector's sweep after ExpireSilentNodes; a job it finds with
  // lost slots is FAILED by this very call when there is no checkpoint.
  // Looks for the newest checkpoint (CheckpointStore::latest, which may
  // read every byte of it) without holding the lock, once each time slots
  // are found lost. Returns the failure logged now, if any, for tests.
  std::vector<std::string> CheckCanContinue();

  // Wakes every blocked Await* call and makes later ones return at once
  // (AwaitBarrier with UNAVAILABLE), so a server shutting down does not wait
  // out their timeouts. Irreversible.
  void Close();

  // Whether `node_id` is a registered worker that is ALIVE (the dense
  // all-reduce ring's members, scheduler/ring_registry.h).
  bool IsLiveWorker(uint64_t node_id) const;
  // How many such workers there are.
  size_t LiveWorkers() const;

  ClusterView View() const;
  JobState job_state() const;
  // True when the job is FINISHED and no server is alive any more, or it is
  // FAILED and either no node is alive or a heartbeat timeout has passed
  // since (every node still heartbeating has learnt it by then).
  bool AllDone() const;

 private:
  struct PendingCheckpoint {
    uint64_t clock = 0;
    absl::Time started;
    // node id -> its report
    absl::flat_hash_map<uint64_t, ReportCheckpointRequest> reports;
  };

  struct Node {
    NodeInfo info;
    absl::Time last_heartbeat;
    uint64_t clock = 0;          // workers: last reported
    bool finished = false;       // workers: left after completing their work
    bool trains_shards = false;  // RegisterRequest.trains_shards
    // Workers: steps per second over recent heartbeats, so a checkpoint's
    // clock can be set far enough ahead for the view to reach everyone
    // before the fastest worker gets there.
    PaceEstimator pace;
  };
  // Whether `node` counts as there for a released barrier: alive, or a
  // worker that left after finishing its work (a caller waking after the
  // evaluator evaluated and left must not evaluate again).
  static bool PresentAtBarrier(const Node& node);
  // What a node taken back by a restarted scheduler gets on top of the
  // heartbeat timeout to be heard from: its scheduler client reconnects
  // with a backoff of up to 1 s (scheduler/client.cc), plus jitter.
  static constexpr absl::Duration kRecoveryGrace = absl::Seconds(2);
  // Tries of a slot move, and the wait before a retry (per try so far).
  static constexpr uint32_t kMoveAttempts = 3;
  static constexpr absl::Duration kMoveRetryWait = absl::Seconds(1);

  // A call that may change the state: Admit() first (nothing may change
  // while the journal cannot be written), Commit() before answering
  // success (a change the journal could not record is not acknowledged).
  // On other paths the destructor writes the journal, ignoring the error:
  // the call fails anyway and later calls are refused. Declared after the
  // call's MutexLock, so it runs under the lock.
  class JournalScope {
   public:
    explicit JournalScope(ClusterState* state) : state_(state) {}
    JournalScope(const JournalScope&) = delete;
    JournalScope& operator=(const JournalScope&) = delete;
    ~JournalScope() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (!committed_) state_->FlushJournalLocked().IgnoreError();
    }
    absl::Status Admit() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return state_->journal_error_;
    }
    absl::Status Commit() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      committed_ = true;
      return state_->FlushJournalLocked();
    }

   private:
    ClusterState* const state_;
    bool committed_ = false;
  };
  void BumpEpochLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The view as answered to a node that holds `known_epoch` (0: none).
  ClusterView ViewAgainstLocked(const ViewAsk& ask)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The nodes changed since `known_epoch` (cached per epoch); null when the
  // recent history does not reach back to it.
  const std::vector<NodeInfo>* ChangedSinceLocked(uint64_t known_epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // No node is declared dead before a heartbeat timeout plus `extra` from
  // `now` (a later grace already granted stays).
  void GrantGraceLocked(absl::Time now, absl::Duration extra)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ExpireSilentNodes' parts: whether this call comes after a stall (then
  // grants grace); whether the `past_timeout` nodes are to be held rather
  // than declared dead now, `silent` of the `live` nodes having been
  // silent for most of a timeout (see ExpireSilentNodes); declaring them.
  bool NoticeStallLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HoldForIsolationLocked(absl::Time now, size_t past_timeout,
                              size_t silent, size_t live)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DeclareDeadLocked(const std::vector<uint64_t>& dead, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the journal if the state changed since the last write; the
  // write's error (journal_error_ then holds it).
  absl::Status FlushJournalLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteJournalLocked(bool sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `snapshot` (taken under mu_ as number `seq`, with
  // journal_file_mu_ locked before mu_ was released, so that no one can
  // see the snapshot's changes as written before they are) without holding
  // mu_, unless a later one was written already; releases
  // journal_file_mu_, then records the outcome under mu_ as
  // WriteJournalLocked does.
  // Takes the snapshot WriteJournalAfterLock writes (clearing
  // journal_dirty_), locks journal_file_mu_ and returns its number.
  uint64_t SnapshotForAfterLockLocked(SchedulerJournal* snapshot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)
          ABSL_EXCLUSIVE_LOCK_FUNCTION(journal_file_mu_);
  absl::Status WriteJournalAfterLock(const SchedulerJournal& snapshot,
                                     uint64_t seq) ABSL_LOCKS_EXCLUDED(mu_)
      ABSL_UNLOCK_FUNCTION(journal_file_mu_);
  // The journal writer's outcome, recorded under mu_ (journal_dirty_ is
  // the caller's).
  absl::Status RecordJournalWriteLocked(const absl::Status& written,
                                        absl::Duration took, size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  SchedulerJournal SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recover's validation: the first thing in `journal` that does not fit
  // this job's config, or OK.
  absl::Status ValidateJournal(const SchedulerJournal& journal) const;
  bool Reassign() const;
  // The shard worker `id` holds, if any: orphaned (or dropped under
  // SKIP_REST) at `position` (null: its last reported one) or done
  // (ShardLedger::Release).
  void ReleaseShardLocked(uint64_t id, bool done, const DataPosition* position)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The clock a worker joining now starts at.
  uint64_t JobClockLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Live workers still training (clock short of finished): whether there
  // is any, the fastest one's clock and the fastest pace.
  struct Training {
    bool any = false;
    uint64_t fastest = 0;
    double rate = 0;
  };
  Training TrainingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint64_t> StartCheckpointLocked(const char* why,
                                                 uint64_t after_clock = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortCheckpointLocked(const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TryCommitCheckpointLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One report of a batch; sets `*recorded` when it was taken.
  absl::Status ReportOneLocked(const ReportCheckpointRequest& request,
                               bool* recorded)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One claim's answer if it may be answered now (see DecideClaims).
  std::optional<absl::StatusOr<ClaimShardResponse>> DecideClaimLocked(
      const ClaimAsk& ask) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the ClaimShard calls waiting if one of them may be answered: an
  // orphaned shard, every shard done, the job failed or closed, or a node
  // gone since the last wake (a waiting caller declared dead is answered).
  void WakeClaimsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateJobStateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool BarrierCompleteLocked(const std::string& name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks every barrier that is complete now as released (recording who
  // was there) and wakes its waiters.
  void CompleteBarriersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes AwaitBarrier's waits and tells the barrier listener.
  void SignalBarriersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the arrival; the caller then checks for released barriers
  // (CompleteBarriersLocked).
  absl::Status ArriveAtBarrierLocked(uint64_t node_id, const std::string& name,
                                     const JournalScope& journal)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Released, failed or closed: a waiter of `name` has its answer.
  bool BarrierDecidedLocked(const std::string& name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  BarrierAnswer BarrierAnswerLocked(const std::string& name, bool at_deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live (or finished) workers that had arrived at released barrier
  // `name` when it was released, by node id; found once, then kept.
  const std::vector<uint64_t>& BarrierNodesLocked(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<uint32_t> MissingRanksLocked(const std::string& name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t ExpectedCount(Role role) const;
  // Register's parts: the request's own checks; the checkpoint a server
  // replacing a dead one restores (read before locking: verifying it reads
  // every byte); the lowest rank of `role` no live or finished node holds
  // (RESOURCE_EXHAUSTED when none); the new node's entry.
  absl::Status ValidateRegister(const RegisterRequest& request) const;
  // A registration waiting for whoever holds mu_ next (Register batches
  // those that arrive together). `done` and `result` are written under mu_
  // by the holder and read under mu_ by the caller.
  struct PendingRegistration {
    const RegisterRequest* request = nullptr;
    std::optional<CheckpointRef> replacement_restore;
    bool done = false;
    absl::StatusOr<RegisterResponse> result = absl::UnknownError("pending");
    // The batch's whole view, shared, for the caller to copy into its
    // answer after the lock (unset for servers_only).
    std::shared_ptr<const ClusterView> whole_view;
  };
  void RegisterBatchLocked(const std::vector<PendingRegistration*>& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One registration of a batch: the node added, its response but for the
  // view (filled once the batch's epoch is out).
  absl::StatusOr<RegisterResponse> RegisterOneLocked(
      const RegisterRequest& request,
      const std::optional<CheckpointRef>& replacement_restore)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<CheckpointRef> ReplacementRestore(
      const RegisterRequest& request) const;
  absl::StatusOr<uint32_t> FreeRankLocked(Role role) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NodeInfo AddNodeLocked(const RegisterRequest& request, uint32_t rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's progress now (GetStatusResponse.progress).
  JobProgress ProgressLocked(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Replication (cluster.replication 2): see the class comment.
  bool Replicated() const { return config_.cluster().replication() >= 2; }
  // The view's slot placement (SlotMap) and which server ranks are alive.
  SlotMap SlotsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetSlotsLocked(const SlotMap& slots) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<bool> LiveServersLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Server `rank` died or left: its slots go to their live backups, slots
  // it backed lose their backup, then new backups are assigned.
  void FailServerLocked(uint32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The view's slot map less the backups of slots server `rank` owns that
  // were given when it had been silent for half a heartbeat timeout and
  // that it was not heard from after: it cannot have copied those slots
  // there (it was most likely dead already, only not yet declared), so they
  // are not promoted. Matters when two servers die within a
  // heartbeat timeout: the first death gives the other's slots new backups.
  SlotMap WithoutUncopiedBackupsLocked(uint32_t rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A replacement registered at `rank`: it becomes the backup of the slots
  // its rank holds (owns or backs) in the initial layout.
  void AdoptReplacementLocked(uint32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Job failure (scheduler/cluster_state_failure.cc). The slots whose
  // owner is not alive while the job runs, ascending.
  std::vector<uint32_t> LostSlotsLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every owner of `slots` reported its shard to the checkpoint in
  // progress (so they become restorable if it commits).
  bool PendingCheckpointHoldsLocked(const std::vector<uint32_t>& slots) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why the running job cannot continue now, or "" (CheckCanContinue);
  // `restorable`: whether a checkpoint exists, when the caller looked.
  std::string FailureLocked(absl::Time now, std::optional<bool> restorable)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the job FAILED for `why`, logged once.
  void FailJobLocked(const std::string& why, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Slot moves (scheduler/cluster_state_moves.cc).
  bool Elastic() const { return config_.cluster().has_elastic(); }
  // Server ranks a slot map may name (MaxServerRanks).
  uint32_t MaxServers() const { return MaxServerRanks(config_.cluster()); }
  // Per slot: bytes its owner reported, or 1 for every slot when an owner
  // has not reported yet. *by_bytes says which.
  std::vector<uint64_t> SlotWeightsLocked(bool* by_bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts `move` in the view, COPYING. The caller bumps the epoch.
  void StartMoveLocked(SlotMove move) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts queued moves while the concurrency limit allows.
  bool StartQueuedMovesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Another move copies into `move`'s target (not a promotion, which
  // copies nothing, and not yet copied): `move`'s fence waits for it.
  bool TargetReceivingCopyLocked(const SlotMove& move) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The aborted move view_.moves(index) is queued again (after
  // kMoveRetryWait times its tries so far) when both of its servers are
  // live members and it has tries left; false (nothing changed) otherwise.
  bool RetryMoveLocked(int index, const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves whose source reported COPIED during a checkpoint: fenced now
  // unless a checkpoint is (still) in progress. Whether any was.
  bool StartDeferredFencesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartFenceLocked(SlotMove* move) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FencingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes move `index` of the view's target the owner of its slots.
  void FlipMoveLocked(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops every move (in the view or queued) that server `rank` takes part
  // in, and moves the view no longer allows (a slot's owner is not the
  // move's source, or its backup is the target). Whether any was dropped.
  bool CancelMovesLocked(uint32_t rank, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Servers being emptied that hold no slot any more: their backups go to
  // other servers and they are drained. Whether any was.
  bool FinishScaleInLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elastic jobs: whether a server registering at `rank` now is a spare
  // (the job runs and the rank owns no slot).
  bool IsSpareRankLocked(uint32_t rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Drain (scheduler/cluster_state_drain.cc). The live node the request
  // names, or null.
  Node* FindDrainTargetLocked(const DrainRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why draining the live, not yet draining node `info` (described as `who`
  // in messages) is safe, as the note to answer; FailedPrecondition when it
  // is not. The server forms need a RUNNING job; the replicated one checks
  // that every slot server `rank` owns has a live backup not draining.
  absl::StatusOr<std::string> WorkerDrainNoteLocked(
      const NodeInfo& info, const std::string& who) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> ServerDrainNoteLocked(
      const NodeInfo& info, const std::string& who) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> ReplicatedDrainNoteLocked(
      uint32_t rank, const std::string& who) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JobConfig config_;
  const uint64_t fingerprint_;
  Clock* const clock_;

  mutable absl::Mutex mu_;
  uint64_t next_node_id_ ABSL_GUARDED_BY(mu_) = 1;
  ClusterView view_ ABSL_GUARDED_BY(mu_);
  // The node lists of the last few epochs (oldest first), and per older
  // epoch the nodes changed between it and the current one (built on first
  // use, dropped at each new epoch): what delta views are made of, so that
  // a change costs each node what changed, not the whole fleet's list.
  struct RecentEpoch {
    uint64_t epoch = 0;
    std::vector<NodeInfo> nodes;
    uint64_t slots_version = 0;  // slots_version_ when it was made
  };
  std::deque<RecentEpoch> recent_nodes_ ABSL_GUARDED_BY(mu_);
  // The recent epoch `epoch`, or null when the history no longer has it.
  const RecentEpoch* RecentEpochLocked(uint64_t epoch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts changes of the slot map (SetSlotsLocked), so a delta can leave
  // out a slot map the receiver already holds.
  uint64_t slots_version_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::vector<NodeInfo>> changed_since_
      ABSL_GUARDED_BY(mu_);
  // node id -> record; ordered so views list nodes by id.
  absl::btree_map<uint64_t, Node> nodes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint32_t> worker_ranks_ever_ ABSL_GUARDED_BY(mu_);
  bool some_worker_finished_ ABSL_GUARDED_BY(mu_) = false;
  // Barrier name -> node ids arrived. Completed names stay, so a caller that
  // retries after its deadline still passes.
  absl::flat_hash_map<std::string, absl::flat_hash_set<uint64_t>> barriers_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> completed_barriers_ ABSL_GUARDED_BY(mu_);
  // Completed barrier name -> the live workers (node ids) that had arrived
  // when it was released.
  absl::flat_hash_map<std::string, std::vector<uint64_t>> barrier_nodes_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Time> barrier_started_
      ABSL_GUARDED_BY(mu_);
  // Signalled when a barrier is released, the job fails or Close is called
  // (SignalBarriersLocked), as is the listener.
  absl::CondVar barrier_cv_;
  std::function<void()> barrier_listener_ ABSL_GUARDED_BY(mu_);
  // ClaimShard's waits (WakeClaimsLocked); nodes that left or died, and
  // how many of them the last wake saw.
  absl::CondVar claims_cv_;
  int claim_waiters_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> claim_listener_ ABSL_GUARDED_BY(mu_);
  uint64_t departures_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t departures_woken_ ABSL_GUARDED_BY(mu_) = 0;
  // Released barrier name -> (epoch, what AwaitBarrier answers then).
  absl::flat_hash_map<
      std::string, std::pair<uint64_t, std::shared_ptr<const BarrierRelease>>>
      barrier_ranks_ ABSL_GUARDED_BY(mu_);
  // Watchdog state: the slowest live clock and since when it has not moved.
  uint64_t watched_min_clock_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time min_clock_since_ ABSL_GUARDED_BY(mu_);
  absl::Time last_watchdog_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> view_listener_ ABSL_GUARDED_BY(mu_);
  // Registrations waiting for mu_ (see Register). Taken only briefly, and
  // never while waiting for mu_ (mu_ before it, when both are held).
  absl::Mutex register_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::vector<PendingRegistration*> register_queue_
      ABSL_GUARDED_BY(register_mu_);
  // Monitor(): heartbeats accepted and nodes declared dead.
  uint64_t heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t declared_dead_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t journal_writes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration journal_write_time_ ABSL_GUARDED_BY(mu_);
  uint64_t journal_bytes_ ABSL_GUARDED_BY(mu_) = 0;

  const CheckpointStore store_;
  ShardLedger shards_ ABSL_GUARDED_BY(mu_);
  // Progress and curves, fed by heartbeats (not journaled but for what
  // JobTracker::ToJournal keeps).
  JobTracker tracker_ ABSL_GUARDED_BY(mu_);
  // When this object was made: the curves start there.
  const absl::Time created_;
  // Clock the job started at (a restored checkpoint's).
  uint64_t base_clock_ ABSL_GUARDED_BY(mu_) = 0;
  // The largest clock short of finished any worker reported.
  uint64_t max_clock_ever_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<PendingCheckpoint> checkpoint_ ABSL_GUARDED_BY(mu_);
  uint64_t last_checkpoint_ ABSL_GUARDED_BY(mu_) = 0;
  // How far ahead of the fastest worker a checkpoint's clock is set;
  // doubled when a node reports it came too late.
  uint64_t checkpoint_margin_ ABSL_GUARDED_BY(mu_) = 2;
  // A requested checkpoint that was abandoned and must be taken again.
  bool checkpoint_wanted_ ABSL_GUARDED_BY(mu_) = false;
  // The largest clock of an abandoned checkpoint. Every later checkpoint is
  // set above it: a server answers a checkpoint clock once (a refusal as
  // "too late" included) and ignores it afterwards, so a retry at the same
  // clock would wait for reports that never come.
  uint64_t abandoned_checkpoint_ ABSL_GUARDED_BY(mu_) = 0;
  // Until then no node is declared dead: after Recover (see
  // kRecoveryGrace), after a stall, after a suspected isolation ends.
  absl::Time grace_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // ExpireSilentNodes' view of the scheduler's own faults: the gap taken
  // as a stall (InfiniteDuration: none, see ExpectSweepsEvery), the time of
  // the previous call, since when isolation is suspected (InfiniteFuture:
  // not suspected), and the counts Monitor() reports.
  absl::Duration stall_gap_ ABSL_GUARDED_BY(mu_) = absl::InfiniteDuration();
  absl::Time last_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time isolated_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  uint64_t isolation_suspicions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stalls_ ABSL_GUARDED_BY(mu_) = 0;

  JournalWriter journal_;  // set before serving, then only read
  // Snapshots taken (numbered under mu_), and the newest one written: one
  // writer at a time, mu_ first when both are held.
  uint64_t journal_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Mutex journal_file_mu_ ABSL_ACQUIRED_AFTER(mu_);
  uint64_t journal_written_seq_ ABSL_GUARDED_BY(journal_file_mu_) = 0;
  // The state changed since the journal was last written.
  bool journal_dirty_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_journal_error_log_ ABSL_GUARDED_BY(mu_) =
      absl::InfinitePast();
  // OK, or why the journal cannot be written (the state takes no changes).
  absl::Status journal_error_ ABSL_GUARDED_BY(mu_);
  std::string launch_id_ ABSL_GUARDED_BY(mu_);
  uint32_t listen_port_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Job failure (CheckCanContinue): since when slots have had no live copy
  // and whether a checkpoint exists to restore them (unknown until looked
  // up; both reset once no slot is lost); since when no member has been
  // alive (InfiniteFuture: some is); when the job became FAILED.
  absl::Time lost_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::optional<bool> lost_restorable_ ABSL_GUARDED_BY(mu_);
  absl::Time empty_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time failed_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Slot moves planned and not started (elastic.max_concurrent_moves), and
  // the server ranks a scale-in empties, to be drained once they hold no
  // slot.
  std::vector<SlotMove> queued_moves_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> removing_ ABSL_GUARDED_BY(mu_);
  // Server node id -> the bytes per slot it last reported
  // (HeartbeatRequest.slot_bytes); not journaled (reported again).
  // The servers' last HeartbeatRequest.storage, by node id; not journaled
  // (reported again).
  absl::flat_hash_map<uint64_t, ServerStorage> storage_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> slot_bytes_
      ABSL_GUARDED_BY(mu_);
  // By slot: when its backup last changed while the job ran (InfinitePast:
  // the initial layout's, or not known after Recover).
  std::vector<absl::Time> backup_since_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps

#endif  // PS_SCHEDULER_CLUSTER_STATE_H_
