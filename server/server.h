// A key-value server: owns the key slots the cluster view assigns to it and
// serves push and pull over ZeroMQ (proto/data_plane.proto), and SCAN of
// every row it holds, for exporting a trained model.
//
// Start() binds the data-plane socket and starts one serving thread, which
// owns every table: requests are applied one at a time, in arrival order,
// so each request is atomic with respect to the others. Every request is
// validated in full before any table is touched; a rejected request changes
// nothing and is answered with an error, and the server keeps serving.
//
// Consistency (server/consistency.h): under BSP, pushes are buffered per
// step and applied, averaged, once every live worker finished the step;
// under BSP and SSP, a pull (or scan) that may not be answered yet is held
// and answered as soon as it may. A pull held longer than the watchdog timeout
// is logged with the worker ranks it waits for and their clocks.
//
// Replication (cluster.replication 2): the view names a backup server for
// every slot (ClusterView.slot_backup). The primary applies (or, under BSP,
// buffers) each update of its slots, forwards exactly those keys or
// segments with the learning-rate multiplier it used to the slot's backup
// over a ZeroMQ DEALER it keeps to that server, and answers the worker only
// once every backup involved has answered: an acknowledged push is held by
// both copies. Under BSP it also tells its backups each step it applies,
// with the divisor, so both copies stay bit-identical. When the view gives
// this server a new backup for some slots (at the start, after a failure,
// or a replacement joining), it first copies those slots' rows with their
// optimizer state, its BSP buffers of them and its record of applied
// sequence numbers to the backup over the same ordered channel, then
// forwards the updates that follow. A backup checks every replica message
// against its own view (the sender must be the slot's primary and this
// server its backup; a message from a newer view waits for it) and applies
// it with the same code as a worker's. When a view makes a backup the owner
// of slots (its primary died) it serves them at once: its record of the
// primary's applied sequence numbers joins its own, so workers' retries of
// pushes the primary had copied are answered as duplicates, and what it
// buffered of the primary's BSP steps joins its own steps. A slot without a
// live backup is served without a copy (logged; counted in
// Stats::unreplicated_pushes). Pulls, SCAN and checkpoints see only the
// slots this server owns. With replication 1 none of this runs, unless
// the job is elastic (below).
//
// Slot moves (cluster.elastic; proto/scheduler.proto SlotMove). The view
// names a move's source (the slots' owner) and target. While it COPYs, the
// source copies the slots to the target the way it catches up a backup
// and forwards every later update of them, BSP sum and step announcement
// too, but does not make workers wait for the target (unless it falls too
// far behind); once the target holds the copy it reports COPIED
// (Options::on_move). While it FENCEs, the source refuses every push to
// the slots (UNAVAILABLE: the worker sends again) and sends the target a
// digest of the slots' rows after everything else; the target compares it
// with its own and the source reports FENCED, or ABORTED when they differ.
// The view that flips the move makes the target the owner, which takes
// over the source's sequence records and buffered steps as at a failover
// (counted as a move, not a failover); with replication 2 the source
// becomes the slots' backup with no copy back, with replication 1 it drops
// them. A view that drops the move unflipped makes the target drop its
// copy.
//
// Registration with the scheduler is the caller's business (ServerNode,
// server/server_node.h, does it); the server only needs the view through
// UpdateView().
//
// Fencing (a server declared dead that comes back must not act on a stale
// view). The scheduler moves a server's slots away (to their backup or a
// replacement) only heartbeat_timeout after the last heartbeat it received
// from it. ServerNode therefore grants the server a lease with every
// acknowledged heartbeat, SetLease(send time + 3/4 heartbeat_timeout), which
// always ends before that: a server paused (SIGSTOP) or cut off from the
// scheduler stops serving before anyone else may serve its slots. Once a
// lease has been set, every request is checked against it when the serving
// thread takes it up (not when it arrived: a process resumed from SIGSTOP
// refuses what queued while it was paused), and after the lease lapsed it
// is refused with UNAVAILABLE and ResponseHeader.refusal LEASE_LAPSED,
// changing nothing (nothing applied, no sequence number recorded, nothing
// buffered, no clock or key list noted; only Stats::lease_refusals counts
// it): the client sends it again, to whoever owns its slots by then. This
// covers workers' requests (also pushes held for a checkpoint and pulls
// held for consistency, when they are taken up again) and replica messages
// from primaries (a refused one makes the primary copy the slots again
// once this server serves). Fence() refuses everything for good
// (refusal NOT_MEMBER): the scheduler dropped this server. Without a lease
// (standalone servers, tests, tools) nothing of this applies. Independently,
// a request for a slot that the installed view gives another server is
// refused with wrong_owner at once, applied nowhere here.
#ifndef PS_SERVER_SERVER_H_
#define PS_SERVER_SERVER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/curve_keys.h"
#include "common/metrics.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "proto/data_plane.pb.h"
#include "proto/scheduler.pb.h"

namespace ps {

class Table;

// The public handle. Everything the serving thread owns lives in the
// private Impl (server/server_impl.h), so this header carries no ZeroMQ
// socket, table or consistency state.
class KVServer {
 public:
  struct Options {
    // Validated job config (common/config.h); tables and the initial
    // consistency mode come from it.
    JobConfig config;
    // ZeroMQ endpoint to bind. Port "*" picks a free port.
    std::string bind_endpoint = "tcp://127.0.0.1:*";
    // When true, the server owns every slot and needs no cluster view
    // (single-server tools and tests). Otherwise it answers UNAVAILABLE
    // until UpdateView() gives it a view with a slot map.
    bool standalone = false;
    // Time source for row TTLs in seconds and for the server's own timing
    // (watchdog, hold ages, stats publishing, checkpoint and catch-up
    // durations, replication resync, failover). Not owned; must outlive the
    // server. Leases (SetLease) use the steady clock.
    Clock* clock = Clock::Real();
    // Called on the serving thread when this server has written its shard
    // of a checkpoint (or failed to, or found it too late to take one at
    // the view's checkpoint_clock). ServerNode forwards it to the
    // scheduler. Must not block for long.
    std::function<void(const ReportCheckpointRequest&)> on_checkpoint;
    // Called on the serving thread when this server, the source of a slot
    // move (ClusterView.moves), has a report for the scheduler: COPIED,
    // FENCED or ABORTED (node_id left 0). ServerNode forwards it. Must not
    // block. Null: moves are not reported (they never finish).
    std::function<void(const ReportMoveRequest&)> on_move;
    // Where the server adds its metrics (server/server_metrics.h lists
    // them); null: none. Not owned; must outlive the server. Once the
    // server is destroyed its scrape-time metrics read as empty.
    metrics::Registry* metrics = nullptr;
    // Tests: runs on a disk tier's reader thread before each batch of cold
    // rows it reads (e.g. to hold a read in flight). Null: nothing.
    std::function<void()> before_tier_read;
    // The job's CURVE key pair (common/curve_keys.h LoadCurveKeys of
    // config.security.curve); nullopt: plaintext. With keys the socket
    // serves CURVE only, a ZAP handler (server/peer_gate.h) admits only
    // clients holding the job key pair and logs every refusal, and this
    // server's links to its backups are CURVE clients with the same pair.
    std::optional<CurveKeys> curve;
    // Index positions per serving-loop turn at which the rows of slots
    // moved away are dropped (server/slot_digest.h SlotDrop); 0: only when
    // something reads whole tables or takes the slots back (tests).
    size_t drop_positions_per_turn = 16384;
  };
  // Limits (config.data_plane.limits, proto/config.proto DataPlaneLimits)
  // apply to every peer, with or without CURVE: connections beyond
  // max_connections are refused at the handshake (server/peer_gate.h);
  // a request over max_message_bytes or max_keys_per_message is answered
  // RESOURCE_EXHAUSTED; a pull or held push that would take the bytes held
  // aside past max_held_bytes is answered UNAVAILABLE (workers retry).
  // Once the server has a cluster view, requests whose sender_node_id is
  // neither 0 (tools) nor a live worker of the view are answered
  // UNAVAILABLE before anything is kept for the sender (a worker that
  // joined retries until the server's view has it); standalone servers
  // keep state for at most kMaxStandaloneSenders senders.
  //
  // Gradients (config.data_plane.gradients): non-finite pushed values are
  // rejected (INVALID_ARGUMENT, nothing applied) or clipped; either way
  // counted by sending worker (Stats::nonfinite_values,
  // ps_server_nonfinite_gradients_total{worker,action}) and logged with
  // the worker's rank. ASSIGN values must always be finite.
  static constexpr size_t kMaxStandaloneSenders = 4096;

  struct Stats {
    uint64_t requests = 0;
    uint64_t errors = 0;
    uint64_t keys_pushed = 0;
    uint64_t keys_pulled = 0;
    // Pulls held until the consistency mode allowed an answer.
    uint64_t pulls_deferred = 0;
    // BSP steps applied (each an average over the workers of one step).
    uint64_t bsp_steps_applied = 0;
    // Pushes answered without being applied again: the same (sender, seq)
    // had been applied (a retry after a timeout or a failover).
    uint64_t duplicate_pushes = 0;
    // Checkpoint shards written, and rows restored from checkpoints.
    uint64_t checkpoints_written = 0;
    uint64_t rows_restored = 0;
    // Replication. Updates forwarded to backups (one per backup involved),
    // and replica messages applied here as a backup (updates, applied
    // steps, catch-up parts).
    uint64_t forwards = 0;
    uint64_t replica_messages = 0;
    // Catch-ups sent to backups, and the rows and dense blocks they copied.
    uint64_t catchups_sent = 0;
    uint64_t rows_copied = 0;
    // Slots this server took over as their backup when their primary died.
    uint64_t slots_promoted = 0;
    // Pushes applied to a slot that had no backup (nothing to copy to).
    uint64_t unreplicated_pushes = 0;
    // CURVE: data-plane connections refused (a key other than the job's,
    // no CURVE, a wrong server key); 0 without CURVE.
    uint64_t auth_refusals = 0;
    // Connections refused over max_connections; open now.
    uint64_t connection_refusals = 0;
    int64_t open_connections = 0;
    // Requests refused by a limit (message bytes, keys, held bytes,
    // standalone senders), and from senders not live in the view.
    uint64_t limit_refusals = 0;
    uint64_t unknown_sender_refusals = 0;
    // Non-finite gradient values received, and pushes rejected for them.
    uint64_t nonfinite_values = 0;
    uint64_t nonfinite_pushes_rejected = 0;
    // Bytes of requests held aside now (bounded by max_held_bytes).
    uint64_t held_bytes = 0;
    // CPU time the serving thread has used (user and system), in
    // microseconds: the server's own work, whatever else shares the cores.
    uint64_t serving_cpu_micros = 0;
    // Requests (worker requests and replica messages) refused because the
    // lease had lapsed, or because the server was fenced. Counted nowhere
    // else (not in requests or errors).
    uint64_t lease_refusals = 0;
    uint64_t fenced_refusals = 0;
    // Slot moves (cluster.elastic): slots and rows (and dense blocks)
    // taken over from a move's source here, and handed to a move's target
    // (rows: those the copy sent); fences this server completed as a
    // source (the target held everything), moves it abandoned (ABORTED
    // reports); pushes refused because their slot was fenced; and the
    // longest fence pause as a source, from applying the fence view to
    // reporting FENCED, in microseconds.
    uint64_t move_slots_in = 0;
    uint64_t move_slots_out = 0;
    uint64_t move_rows_in = 0;
    uint64_t move_rows_out = 0;
    uint64_t move_fences = 0;
    uint64_t move_aborts = 0;
    uint64_t move_fenced_refusals = 0;
    uint64_t move_fence_max_micros = 0;
    // Disk tiers: requests that waited for cold rows read off the serving
    // thread (or behind such a request of their sender), and the time they
    // waited in all, in microseconds.
    uint64_t tier_waits = 0;
    // Keys PREFETCH requests named for a tiered table (of slots owned).
    uint64_t keys_prefetched = 0;
    uint64_t tier_wait_micros = 0;
  };

  // Errors: INVALID_ARGUMENT for a bad table config, UNAVAILABLE if the
  // endpoint cannot be bound.
  static absl::StatusOr<std::unique_ptr<KVServer>> Start(Options options);

  // Stops serving and joins the thread.
  ~KVServer();
  KVServer(const KVServer&) = delete;
  KVServer& operator=(const KVServer&) = delete;

  // The endpoint actually bound, e.g. "tcp://127.0.0.1:41577".
  const std::string& endpoint() const;
  int port() const;

  // Installs a cluster view; `rank` is this server's rank in it. Its slot
  // map (present from RUNNING on), backups, live workers and consistency
  // mode take effect at once (the serving thread is woken). Thread-safe.
  void UpdateView(const ClusterView& view, uint32_t rank);

  // Thread-safe snapshot of the counters.
  Stats stats() const;

  // Fencing (file comment). SetLease: this server serves until `until`
  // (steady clock); the first call starts enforcement, later ones move the
  // end (earlier or later). Fence: from now on every request is refused,
  // for good; `why` is logged and sent to clients. Both thread-safe, from
  // any thread at any time, and cheap (the serving thread reads them per
  // request).
  void SetLease(std::chrono::steady_clock::time_point until);
  void Fence(std::string why);

  // Thread-safe: OK while every table's storage works. Once a sparse
  // table's disk tier failed a read, a write or a delete (an I/O error, a
  // corrupted file): that error, for good. The serving thread then fences
  // the server (every request refused, the one that met the error
  // included, so nothing it did is acknowledged), and the process is to
  // exit without leaving, to be recovered as a crashed server is (restore
  // from the checkpoint; the tier's directory is never read again).
  absl::Status storage_failure() const;

  // Thread-safe: every table's statistics (ordered by table id) as the
  // serving thread last published them, at most kStatsPeriod ago, and
  // exactly as they ended once Stop() returned. Clients get current ones
  // with the STATS op. With replication the rows counted here include the
  // backup copies of other servers' slots (the STATS op separates them:
  // TableStats.backup_rows).
  static constexpr absl::Duration kStatsPeriod = absl::Seconds(1);
  std::vector<TableStats> table_stats() const;

  // Thread-safe: the bytes each slot this server owns holds (index = slot;
  // 0 for the slots of others), as the serving thread last measured them
  // (elastic jobs only: with its first slot map, then at most every 10 s,
  // and soon after slots moved). Empty before the first measurement. For
  // HeartbeatRequest.slot_bytes.
  std::vector<uint64_t> slot_bytes() const;

  // Stops the serving thread. Idempotent.
  void Stop();

  // The tables, ordered by id, once the serving thread has stopped (after
  // Stop()), e.g. to compare a primary's rows with its backup's; empty
  // while it serves. Valid until the server is destroyed.
  std::vector<const Table*> StoppedTables() const;

  // Graceful exit without losing acknowledged updates (SIGTERM): the
  // serving thread stops right after it writes its shard of the next
  // checkpoint, before it applies or answers anything of later steps, so
  // every update it acknowledged is in the checkpoint a replacement
  // restores. Requests left unanswered are routed again by the workers
  // once this server leaves the view. stopped() tells when it happened.
  void StopAfterNextCheckpoint();
  bool stopped() const;

 private:
  class Impl;
  explicit KVServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ps

#endif  // PS_SERVER_SERVER_H_
