// KVServer's implementation (server/server.h has the contract): the state
// the serving thread owns, and the parts (server/BUILD :server_parts) whose
// headers say which of their members other threads may use: the public,
// thread-safe methods reach the serving thread only through them and
// ServerCounters. Internal to //server:server.
#ifndef PS_SERVER_SERVER_IMPL_H_
#define PS_SERVER_SERVER_IMPL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/wire.h"
#include "proto/config.pb.h"
#include "proto/data_plane.pb.h"
#include "proto/scheduler.pb.h"
#include "server/bsp_steps.h"
#include "server/checkpoint_gate.h"
#include "server/consistency.h"
#include "server/data_socket.h"
#include "server/deferred_pulls.h"
#include "server/failover_timer.h"
#include "server/key_cache.h"
#include "server/lease_fence.h"
#include "server/move_digest.h"
#include "server/peer_gate.h"
#include "server/replica_store.h"
#include "server/replication.h"
#include "server/replication_primary.h"
#include "server/request_admission.h"
#include "server/response_code.h"
#include "server/server.h"
#include "server/server_counters.h"
#include "server/server_metrics.h"
#include "server/server_view.h"
#include "server/serving_thread.h"
#include "server/shard_write_thread.h"
#include "server/slot_digest.h"
#include "server/step_buffers.h"
#include "server/table.h"
#include "server/table_stats_publisher.h"
#include "server/tier_waits.h"
#include "server/view_inbox.h"
#include "server/work_budget.h"
#include "zmq.hpp"

namespace ps {

class KVServer::Impl {
 public:
  // The public methods of KVServer, with the same contracts.
  static absl::StatusOr<std::unique_ptr<Impl>> Start(Options options);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  const std::string& endpoint() const { return data_.endpoint(); }
  int port() const { return data_.port(); }
  void UpdateView(const ClusterView& view, uint32_t rank);
  Stats stats() const;
  void SetLease(std::chrono::steady_clock::time_point until);
  void Fence(std::string why);
  absl::Status storage_failure() const {
    absl::MutexLock lock(&storage_mu_);
    return storage_failure_;
  }
  std::vector<TableStats> table_stats() const;
  std::vector<uint64_t> slot_bytes() const;
  void Stop();
  std::vector<const Table*> StoppedTables() const;
  void StopAfterNextCheckpoint() { serving_.StopAfterNextCheckpoint(); }
  bool stopped() const { return serving_.stopped(); }

 private:
  using Ownership = ServerView;
  using SeqWindow = replication::SeqWindow;
  // A replica message put aside: from a view newer than this server's.
  // (Requests held for a checkpoint are the CheckpointGate's.)
  struct Held {
    zmq::message_t identity;
    std::vector<zmq::message_t> frames;
    uint64_t epoch = 0;  // replica messages: the primary's epoch
    // Counted in counters_.held_bytes while held.
    uint64_t bytes = 0;
  };
  // (backup node id, replica message id) an answer depends on.
  using Need = ReplicationPrimary::Need;
  enum class Outcome { kAnswer, kDefer, kHold };
  // What the stages of one request's pipeline tell each other and the
  // serving loop, besides the request itself. One per request processed.
  struct RequestContext {
    // The request's op once its header is decoded (0 before): metrics.
    int op = 0;
    // Replication: the backups' answers the request's answer waits for.
    std::vector<Need> needs;
    // The request touches slots promoted here (failover measurement).
    bool first_promoted = false;
    // An ADVANCE_CLOCK was handled: Progress runs before the next message.
    bool progress_due = false;
  };

  explicit Impl(Options options);
  void Serve();
  void ApplyView(const Ownership& own);
  // Handles one message of the data socket. Returns whether Progress is
  // due before the next message is read (an ADVANCE_CLOCK was handled).
  // `tier_checked`: the request waited for its cold rows already (or
  // never needed to), and is not put aside for them again.
  [[nodiscard]] bool HandleMessage(zmq::message_t identity,
                                   std::vector<zmq::message_t> frames,
                                   const Ownership& own,
                                   bool tier_checked = false);
  // Disk tiers (server/server_tier_waits.cc). Puts the request aside when
  // its sender has one waiting already, or when its cold rows must be read
  // first (the reads are started); true when it did.
  bool WaitForColdRows(zmq::message_t& identity,
                       std::vector<zmq::message_t>& frames);
  // The reader's batch a request must wait for before it is processed (0:
  // none), the reads it needs started, and its table. Requests that are
  // not a tiered table's PUSH, PULL or PUSH_PULL (or a replica message
  // applying an update or importing rows), or that do not decode, wait
  // for nothing (the pipeline answers the latter).
  uint64_t ColdWaitOf(std::vector<zmq::message_t>& frames, SparseTable** table);
  // Installs the readers' finished batches and handles, in each sender's
  // order, the requests whose rows are now staged.
  void ReleaseTierWaits(const Ownership& own);
  // Keeps (pin) or lets go the staged cold rows of a deferred pull's keys
  // (`frames`: a self-contained PULL of a tiered table; others: nothing).
  void PinColdRows(std::vector<zmq::message_t>& frames, bool pin);
  // Handles the waiting requests whose batch is installed.
  void HandleReadyTierWaits(const Ownership& own);
  // Processes one request. kDefer: the (pull) request is not answered yet;
  // the frames were rewritten into a plain PULL to run again later.
  // `keys` is filled by SCAN only; *ctx gets what the stages noted.
  Outcome Process(std::vector<zmq::message_t>& frames, const Ownership& own,
                  RequestContext* ctx, ResponseHeader* rh,
                  zmq::message_t* values, zmq::message_t* keys);

  // The request pipeline (server/request_pipeline.cc, whose file comment
  // states the invariant): Decode -> Admit -> Route -> Police -> Validate
  // -> Apply. Only Apply changes tables, sequence records, BSP buffers and
  // backups.
  absl::Status ProcessChecked(std::vector<zmq::message_t>& frames,
                              const Ownership& own, RequestContext* ctx,
                              ResponseHeader* rh, zmq::message_t* values,
                              zmq::message_t* keys, Outcome* outcome);
  // A decoded request: header, keys (from its frame or the sender's cached
  // key list) and values. Must not move while its spans are in use.
  struct Request {
    DecodedRequest req;
    // The cached key list the request uses or stores; null: none.
    KeyListCache::List* key_list = nullptr;
    // The frames carry the keys and float32 values themselves and name no
    // key-list slot (as kept and forwarded requests must).
    bool self_contained = false;
  };
  // What Validate established of an update (PUSH, PULL, PUSH_PULL,
  // ASSIGN), and what Apply is to do with it.
  struct ValidatedUpdate {
    Table* table = nullptr;
    SparseTable* sparse = nullptr;  // exactly one of sparse, dense
    DenseTable* dense = nullptr;
    uint64_t n = 0;  // values the request addresses
    // Replicated: the slot of every key (sparse) or segment (dense), for
    // forwarding to their backups.
    std::vector<uint32_t> slots;
    bool push = false, pull = false, assign = false;
    // The push's (sender, seq) was applied already: answered, not applied.
    bool duplicate = false;
    // BSP: the push is added to its step's buffer, not applied.
    bool buffer = false;
    // The push waits for a checkpoint in progress (held, run again later).
    bool hold = false;
    // The pull may not be answered yet (deferred, run again later).
    bool defer_pull = false;
    // Notes for the caller, set also when validation fails: the request
    // touches promoted slots; its key list passed the ownership check in
    // this view; it was refused by the table's budget.
    bool first_promoted = false;
    bool note_owned = false;
    bool over_budget = false;
    // Refused: it pushes to a slot a move fences.
    bool fenced = false;
  };
  absl::Status Decode(std::vector<zmq::message_t>& frames, RequestContext* ctx,
                      ResponseHeader* rh, Request* r);
  // Sender and message limits, then the key list (stored or looked up).
  absl::Status Admit(const std::vector<zmq::message_t>& frames,
                     const Ownership& own, ResponseHeader* rh, Request* r);
  // Rewrites `frames` to carry r's keys and float32 values, without a
  // key-list slot. Idempotent.
  static void MakeSelfContained(Request& r,
                                std::vector<zmq::message_t>& frames);
  // The server's clock and the sender's clock, from any request.
  void NoteClocks(const RequestHeader& h, const Ownership& own);
  // The request's table, once the server has a view.
  absl::StatusOr<Table*> Route(const RequestHeader& h,
                               const Ownership& own) const;
  // Pure: checks everything (shape, ownership, budget, checkpoint hold,
  // steps ahead, sequence window) and fills *v (v->slots when
  // replicated); `rh` only its wrong_owner and not_applied flags.
  absl::Status Validate(const Request& r, const Ownership& own,
                        ResponseHeader* rh, ValidatedUpdate* v) const;
  // Part of Validate: UNAVAILABLE (v->fenced set) for a push to a slot
  // whose move is fencing (v->slots filled).
  // (ResponseHeader.not_applied when the push's number was never
  // recorded here.)
  absl::Status CheckNotFenced(const RequestHeader& h, const Ownership& own,
                              ValidatedUpdate* v, ResponseHeader* rh) const;
  // Applies a validated push or assign (or answers a duplicate): records
  // the sequence number, applies or buffers, forwards to backups. Fails
  // only for a duplicate whose backup is being copied again (UNAVAILABLE;
  // a duplicate applies nothing).
  // What the answer waits for goes to ctx->needs.
  absl::Status Apply(const Request& r, const ValidatedUpdate& v,
                     std::vector<zmq::message_t>& frames, const Ownership& own,
                     RequestContext* ctx, ResponseHeader* rh);
  // Answers a validated pull that may be answered now.
  void AnswerPull(const Request& r, const ValidatedUpdate& v,
                  ResponseHeader* rh, zmq::message_t* values);
  // The SCAN op (server/server_scan.cc).
  // PREFETCH: starts reading the cold rows of the request's keys this
  // server owns; answered at once.
  absl::Status Prefetch(const Request& r, const Ownership& own);
  absl::Status ScanOp(std::vector<zmq::message_t>& frames, const Ownership& own,
                      const RequestHeader& h, ResponseHeader* rh,
                      zmq::message_t* values, zmq::message_t* keys,
                      Outcome* outcome);
  // Answers a validated SCAN request of `sparse` with one page.
  void Scan(const SparseTable& sparse, const RequestHeader& h,
            ResponseHeader* rh, zmq::message_t* values, zmq::message_t* keys);
  void Buffer(uint64_t step, uint64_t node_id, Table* table,
              absl::Span<const uint64_t> keys, const Segments& segments,
              absl::Span<const float> grads);
  void ApplyBuffered(uint64_t step, StepBuffer& buffer, uint32_t divisor);
  // A BSP step applied here: recorded, and (replication) announced to the
  // backups.
  void StepDone(uint64_t step, uint32_t divisor);
  // Checks a sparse or dense request's shape against its table (sizes,
  // segments, finiteness of pushed values); *n is the number of values it
  // addresses.
  absl::Status ValidateShape(const RequestHeader& h, const Table& table,
                             absl::Span<const uint64_t> keys,
                             absl::Span<const float> values, bool push,
                             uint64_t* n) const;

  // Replication (the primary side is primary_'s). Slot of every key
  // (sparse) or segment (dense) of a request.
  void SlotsOf(const RequestHeader& h, const Table& table,
               absl::Span<const uint64_t> keys, uint32_t num_slots,
               std::vector<uint32_t>* slots) const;

  // Replication, backup side.
  void HandleReplica(zmq::message_t identity,
                     std::vector<zmq::message_t> frames,
                     const RequestHeader& header, const Ownership& own);
  // A replica message passes Decode -> ValidateReplica -> ApplyReplica
  // (server/replication_backup.cc): refused, it changes nothing.
  absl::Status ProcessReplica(std::vector<zmq::message_t>& frames,
                              const Ownership& own, ResponseHeader* rh);
  // What ValidateReplica established of a replica message.
  struct ValidatedReplica {
    uint32_t primary_rank = 0;  // the sender's
    uint32_t num_slots = 0;     // of this server's view
    // The message's table (kinds that name one): exactly one of sparse,
    // dense.
    Table* table = nullptr;
    SparseTable* sparse = nullptr;
    DenseTable* dense = nullptr;
    uint64_t n = 0;  // REPLICA_APPLY, _BUFFER: values addressed
    // REPLICA_SEQS, decoded: (sender node id, window).
    std::vector<std::pair<uint64_t, SeqWindow>> seqs;
  };
  // Pure: checks the whole message (sender, slots, table, sizes,
  // finiteness, room) and fills *v; `rh` only its wrong_owner flag.
  absl::Status ValidateReplica(const replication::ReplicaMessage& m,
                               const Ownership& own, ResponseHeader* rh,
                               ValidatedReplica* v) const;
  // REPLICA_FENCE: this server's digest of the fenced slots must match
  // the source's; DATA_LOSS naming both otherwise.
  absl::Status CheckFenceDigest(const replication::ReplicaMessage& m,
                                const Ownership& own) const;
  // Applies a validated message; cannot fail. `rh` gets the duplicate flag.
  void ApplyReplica(const replication::ReplicaMessage& m,
                    const ValidatedReplica& v, ResponseHeader* rh);
  void ApplyReplicaUpdate(const replication::ReplicaMessage& m,
                          const ValidatedReplica& v, ResponseHeader* rh);
  // Replica messages held for a newer view that this view allows.
  void ReleaseReplicas(const Ownership& own);
  // Slots this server owns now and backed in `prev` (failover), or was
  // the target of a move of in `prev` (the move's flip): their primary's
  // sequence records and buffered steps become this server's.
  void Promote(const Ownership& prev, const Ownership& own);
  // Slot moves (server/server_moves.cc). Fills own->moves, slot_learner
  // and slot_fenced from the view's moves that pass the checks (the view
  // comes over the wire): others are logged and ignored.
  void ReadMoves(const ClusterView& view, Ownership* own) const;
  // The flip, source side: slots this server owned in `prev` and a move
  // handed to its target in `own`. Replication 1: their rows and BSP sums
  // are dropped. Replication 2 (this server is now their backup): the BSP
  // sums become the new owner's buffered steps and the slots count as
  // caught up.
  void HandOver(const Ownership& prev, const Ownership& own);
  // Copies this server no longer needs, their rows and replica state:
  // slots it was the target of a move of in `prev` and neither learns,
  // owns nor backs in `own` (the move was abandoned), and slots it backed
  // in `prev` whose move flipped without it as their backup (replication
  // 2: the move's source backs them).
  void DropAbandonedCopies(const Ownership& prev, const Ownership& own);
  // The move's flip, target side, for Promote: counts and logs the slots
  // taken over from `sources` (old primary ranks), and tells the primary
  // side which of them the source already backs.
  void NoteMovedIn(const Ownership& prev, const Ownership& own,
                   const std::vector<uint32_t>& slots,
                   const std::vector<uint32_t>& sources);
  // Computes the bytes each owned slot holds (at most every
  // kSlotBytesPeriod; serving thread) for slot_bytes().
  void MaybeMeasureSlots(const Ownership& own);
  // Drops the rows of the slots in `mask` in steps (StepDrop), after
  // those of an earlier drop still in progress.
  void StartDrop(const std::vector<bool>& mask);
  // One bounded step of the pending drop, if any.
  void StepDrop(size_t max_positions);
  // Runs the pending drop to the end: before reading whole tables.
  void FinishDrop();
  // FinishDrop when `own` makes this server hold (own, learn or back) a
  // slot still being dropped, or changes the number of slots.
  void FinishDropOfHeld(const Ownership& own);
  // Tracks the digests of own.moves this server is source or target of.
  void SyncMoveDigests(const Ownership& own);
  // One step of the moves' background work: a fold of the rows changed
  // since the digests started, always (its cost follows the updates
  // served, and a backlog would land in the fence pause); then, if
  // move_work_ allows it or the thread is `idle` (nothing was waiting for
  // it), a step of the work that grows with the table: hashing the rows
  // held at the start, the copy, the drop. Busy steps of that work are
  // charged to move_work_.
  void RunMoveWork(const Ownership& own, bool idle);
  // Whether paced work is left, and how long the serving loop may poll
  // before the next step is due.
  bool MoveWorkLeft() const;
  std::chrono::milliseconds MoveWorkPoll(std::chrono::milliseconds period);
  // Changed rows folded into the move digests per request served.
  static constexpr size_t kDigestFoldRows = 4096;
  // Rows and blocks of a move's copy sent per request served.
  static constexpr size_t kCopyRowsPerTurn = 4096;
  // Sparse table id -> row dim, dense -> 1 (StepBuffer::ExtractSlots).
  ReplicaStore::Dims TableDims() const;
  // Applies completed BSP steps and answers held pulls that may be answered.
  // Runs after each drain of the socket and, when a worker's ADVANCE_CLOCK
  // was handled (RequestContext::progress_due), before the next message is
  // read: a step that clock completed is applied before any later request (e.g.
  // STATS) is answered, so a worker that saw its ADVANCE_CLOCK acknowledged
  // reads the step applied when its clock was the last one missing.
  void Progress(const Ownership& own);
  void FlushBuffers();
  void Watchdog();
  // Moves the tables' step and time forward (TTL expiry).
  void AdvanceTables();
  // Notes a worker's clock for the server's clock (staleness, TTL steps).
  void NoteClock(uint64_t clock);
  // Answers a STATS request. With replication and `own`, separates the
  // backup copies (a pass over every table).
  void FillStats(ResponseHeader* rh, const Ownership* own = nullptr) const;
  // Whether a pull at `clock` may be answered: the consistency rule, and no
  // pull past a checkpoint in progress.
  bool PullAllowed(uint64_t clock) const;
  // Checkpoints: takes up the view's checkpoint clock, writes the shard
  // when the cut is reached, restores from the view's checkpoint once.
  void NoteCheckpointClock(const Ownership& own);
  // With a disk tier the cold rows are written off the serving thread
  // (ShardWriteInParts, shard_write_): the serving thread writes what is
  // in RAM and goes on; FinishCheckpointWrite reports the shard once it
  // is written (`wait`: waits for it; else only if it ended).
  void MaybeWriteCheckpoint(const Ownership& own);
  void FinishCheckpointWrite(bool wait);
  // Counts, logs and reports (Options::on_checkpoint) the shard written
  // for the checkpoint at `clock`, or its error.
  void ReportCheckpoint(uint64_t clock,
                        const absl::StatusOr<ShardFile>& written,
                        absl::Time start);
  void ReleaseHeld(const Ownership& own);
  void Restore(const Ownership& own);
  // (Re)creates every table of the config, empty: the tables with a disk
  // tier in this server's tier directory (claimed on first use). The old
  // table of an id goes before its new one opens.
  absl::Status CreateTables();

  void Send(zmq::message_t& identity, const ResponseHeader& rh,
            zmq::message_t& values, zmq::message_t& keys) {
    data_.Send(identity, rh, values, keys);
  }

  const Options options_;
  // The ZeroMQ context, the data socket and its gate.
  DataSocket data_;

  // The directories of the tables' disk tiers, one per DiskTierConfig.dir
  // named (declared before tables_, so they outlive the tiers in them).
  absl::flat_hash_map<std::string, std::unique_ptr<TierRoot>> tier_roots_;
  // Requests waiting for cold rows, and the eventfd the tables' readers
  // wake the serving thread with (declared before tables_: the readers
  // stop before it goes).
  TierWaits tier_waits_;
  // Owned by the serving thread once it runs.
  absl::flat_hash_map<uint32_t, std::unique_ptr<Table>> tables_;
  // The sparse tables of tables_ with a disk tier (CreateTables).
  std::vector<SparseTable*> tiered_;
  // A checkpoint's cold rows being written (declared after tables_: it
  // waits for the write, which reads their tiers, before they go).
  ShardWriteThread shard_write_;
  // Serving thread: whether a tiered table's tier failed; the first time,
  // records storage_failure_ and fences the server. Without tiers: false,
  // at no cost.
  bool StorageFailed();
  mutable absl::Mutex storage_mu_;
  absl::Status storage_failure_ ABSL_GUARDED_BY(storage_mu_);
  // The fence digests of the moves this server is source or target of,
  // kept up to date as rows change (SyncMoveDigests, the serving loop's
  // folds). Mutable: the fence check (const) folds what changed since.
  mutable MoveDigests move_digests_{&tables_};
  ConsistencyController consistency_;
  // BSP: buffered pushes by step, divisors of the steps applied last.
  BspSteps bsp_;
  // Pulls not answered yet (each counted in counters_.held_bytes), and
  // the watchdog's rate limit.
  DeferredPulls deferred_;
  // The largest clock any worker has reported (requests and ADVANCE_CLOCK;
  // the finished marker excluded): the server's clock.
  uint64_t server_clock_ = 0;
  // Sender node id -> applied sequence numbers.
  absl::flat_hash_map<uint64_t, SeqWindow> seqs_;
  // Workers' key lists (RequestHeader.key_list_slot).
  KeyListCache key_cache_;
  // Pull answers in a half-width encoding are gathered here first.
  std::vector<float> pull_scratch_;

  // Replication state, owned by the serving thread (see the file comment).
  const bool replicated_;
  // Backup side: the primaries' sequence records and buffered steps, the
  // slots caught up, keys applied to copies; and, by primary node id,
  // messages waiting for a newer view (I/O, so kept here).
  ReplicaStore replicas_;
  absl::flat_hash_map<uint64_t, std::deque<Held>> replica_held_;
  // Failover measurement: slots promoted here, and whether the first
  // request for one of them has been answered since.
  FailoverTimer failover_{options_.clock};
  // Every counter of Stats (server/server_counters.h); declared before
  // admission_, which keeps pointers to some of them.
  ServerCounters counters_;
  // Limits (Options comment), held bytes (counters_.held_bytes: the
  // requests the gate holds, deferred_ and replica_held_) and the gradient
  // policy.
  Admission admission_{
      options_.config.data_plane(),
      KVServer::kMaxStandaloneSenders,
      options_.clock,
      {&counters_.held_bytes, &counters_.limit_refusals,
       &counters_.unknown_sender_refusals, &counters_.nonfinite_values,
       &counters_.nonfinite_pushes_rejected}};
  // Replication, primary side: links to this server's backups, and the
  // answers that wait for them. Declared after data_ (its sockets close
  // first) and the state it reads.
  ReplicationPrimary primary_{ReplicationPrimaryDeps()};
  ReplicationPrimary::Deps ReplicationPrimaryDeps();
  // The checkpoint in progress, pushes held for it, and what was applied
  // (server/server_checkpoint.cc does the I/O).
  CheckpointGate checkpoint_gate_;

  // Metrics (server_metrics.cc): registers them in `registry`, and stops
  // the scrape-time ones from reading this server.
  struct MetricsSource;
  void RegisterMetrics(metrics::Registry* registry);
  void UnregisterMetrics();
  // Null without Options::metrics.
  std::unique_ptr<ServerInstruments> instruments_;
  std::shared_ptr<MetricsSource> metrics_source_;

  void PublishTableStats();
  // The replication counters, logged once when serving stops.
  void LogReplicationSummary() const;
  TableStatsPublisher table_stats_{kStatsPeriod};
  // Bytes per owned slot (MaybeMeasureSlots), and when last measured.
  static constexpr absl::Duration kSlotBytesPeriod = absl::Seconds(10);
  mutable absl::Mutex slot_bytes_mu_;
  std::vector<uint64_t> slot_bytes_ ABSL_GUARDED_BY(slot_bytes_mu_);
  absl::Time slot_bytes_at_ = absl::InfinitePast();  // serving thread
  // The measurement in progress (serving thread), and the index positions
  // it looks at per serving-loop turn.
  std::optional<SlotBytesScan> slot_scan_;
  static constexpr size_t kSlotBytesPositionsPerTurn = 131072;
  // The rows of slots moved away, dropped in steps between requests
  // (serving thread); empty when none are left. Not served (the slots are
  // not owned), but whatever reads whole tables or takes slots back calls
  // FinishDrop() first.
  std::optional<SlotDrop> pending_drop_;
  // Paces the background work of moves on a busy serving thread
  // (cluster.elastic.move_work_share; RunMoveWork).
  WorkBudget move_work_;

  // The newest view (UpdateView posts it and wakes the serving thread)
  // and the view applied last (promotions compare it with the next).
  ViewInbox views_;

  // The lease and the fence: any thread sets them, the serving thread
  // checks them before it acts on a request. After counters_, which it
  // counts refusals in.
  LeaseFence lease_fence_{&counters_.fenced_refusals,
                          &counters_.lease_refusals};
  // Answers a request (its header frame `header`) with a refusal of
  // LeaseFence::Check.
  void SendRefusal(zmq::message_t& identity, const zmq::message_t& header,
                   const absl::Status& status, ServerRefusal refusal,
                   uint64_t epoch);

  // The serving thread and its stop requests. Last: it stops first.
  ServingThread serving_;
};

}  // namespace ps

#endif  // PS_SERVER_SERVER_IMPL_H_
