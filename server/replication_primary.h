// The primary side of server replication (cluster.replication 2): a
// server's links to the backups of the slots it owns, the updates it
// forwards to them, the catch-ups that copy its slots to a backup that does
// not hold them yet, and the answers to workers that wait until the backups
// have taken the updates they acknowledge.
//
// Slot moves (cluster.elastic, ServerView::moves) as their source: the
// move's target is a second destination ("learner") of its slots, caught
// up (in chunks between requests: ContinueCopies) and forwarded every
// update, BSP push and step announcement of them like a backup, but
// outside the acknowledgement path, except as flow control (a learner link
// with more than kLearnerMaxMessages or kLearnerMaxBytes unanswered holds
// the answers of pushes to its slots until it catches up). When the
// learner answered the catch-up of every slot of the move, Deps::on_move
// gets COPIED; when the view fences the move, a REPLICA_FENCE with the
// digest of the slots' rows (server/slot_digest.h; Deps::digests keeps it
// up to date) follows everything else on the link, and its answer makes
// FENCED (OK) or ABORTED (an error). Any other refusal on the target's link
// while the move runs makes ABORTED too (epoch: the fence epoch once
// fenced, else the copy epoch); nothing more is reported of it. The
// comment at the top of server/server.h says what replication does;
// server/replication_backup.cc is the backup side. Internal to
// //server:server.
//
// Thread safety: not thread-safe. Every method is called by the server's
// serving thread (KVServer::Impl::Serve and what it calls); the counters it
// adds to are atomics other threads read.
//
// Ownership: owns the BackupLinks (their sockets) and the answers waiting
// for backups. Borrows, for its whole life, what Deps names: the ZeroMQ
// context the links' sockets are made in, the clock, the server's tables,
// sequence records and BSP step buffers (read, never changed, by
// catch-ups) and the counters; all must outlive it, and the sockets it
// owns must be closed before the context is (declare it after the
// context).
//
// Errors: nothing here fails the server. A backup that cannot be connected
// is logged and left unlinked (its slots' updates are acknowledged with a
// single copy); a malformed or out-of-order answer from a backup is logged
// and dropped; a backup that refuses a replica message is copied its slots
// again and the answers that depended on it tell their workers to send
// again (UNAVAILABLE).
#ifndef PS_SERVER_REPLICATION_PRIMARY_H_
#define PS_SERVER_REPLICATION_PRIMARY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/curve_keys.h"
#include "common/status.h"
#include "proto/data_plane.pb.h"
#include "proto/scheduler.pb.h"
#include "server/move_digest.h"
#include "server/replication.h"
#include "server/server_view.h"
#include "server/slot_digest.h"
#include "server/step_buffers.h"
#include "server/table.h"
#include "zmq.hpp"

namespace ps {

class ReplicationPrimary {
 public:
  // (backup node id, replica message id) an answer depends on.
  using Need = std::pair<uint64_t, uint64_t>;
  using Tables = absl::flat_hash_map<uint32_t, std::unique_ptr<Table>>;
  // Sender node id -> applied sequence numbers.
  using SeqRecords = absl::flat_hash_map<uint64_t, replication::SeqWindow>;
  // BSP step -> the sums buffered for it.
  using StepBuffers = std::map<uint64_t, StepBuffer>;

  // Sends an answer to the worker `identity` names (the server's data
  // socket): header, [values, [keys]].
  using SendAnswer =
      std::function<void(zmq::message_t& identity, const ResponseHeader& rh,
                         zmq::message_t& values, zmq::message_t& keys)>;

  // What the primary needs of its server. Every pointer is non-null and
  // outlives the ReplicationPrimary.
  struct Deps {
    zmq::context_t* context = nullptr;
    // The job's CURVE key pair (links are CURVE clients with it); null:
    // plaintext.
    const CurveKeys* curve = nullptr;
    const Clock* clock = nullptr;
    // The server's state a catch-up copies: tables, sequence records and
    // BSP step buffers. Read only.
    const Tables* tables = nullptr;
    const SeqRecords* seqs = nullptr;
    const StepBuffers* buffers = nullptr;
    // ServerCounters fields (KVServer::Stats documents them).
    std::atomic<uint64_t>* forwards = nullptr;
    std::atomic<uint64_t>* unreplicated_pushes = nullptr;
    std::atomic<uint64_t>* catchups_sent = nullptr;
    std::atomic<uint64_t>* rows_copied = nullptr;
    // Slot moves as the source (KVServer::Stats); each may be null.
    std::atomic<uint64_t>* move_rows_out = nullptr;
    std::atomic<uint64_t>* move_fences = nullptr;
    std::atomic<uint64_t>* move_aborts = nullptr;
    std::atomic<uint64_t>* move_fence_max_micros = nullptr;
    // The running digests of the moves out of this server (the fence
    // reads them); null, or a move not tracked: a pass over every row.
    MoveDigests* digests = nullptr;
    // A move's report for the scheduler (node_id 0); null: not reported.
    std::function<void(const ReportMoveRequest&)> on_move;
    SendAnswer send;
    // Called after an acknowledged answer that touched slots promoted here
    // went out (the server's failover measurement).
    std::function<void()> first_promoted_served;
  };

  explicit ReplicationPrimary(Deps deps);
  ReplicationPrimary(const ReplicationPrimary&) = delete;
  ReplicationPrimary& operator=(const ReplicationPrimary&) = delete;

  // Forwards an applied (or BSP-buffered) worker push or assign of `table`
  // (header h; frames: the request's self-contained float32 frames, keys
  // and values as spans of them) to the backups of `slots` (the slot of
  // every key or dense segment); adds what its answer waits for to *needs.
  // Counts a forward per message sent, and an unreplicated push when a
  // slot has no linked backup.
  void Forward(const ServerView& own, const RequestHeader& h, ReplicaKind kind,
               float lr_scale, const Table& table,
               absl::Span<const uint64_t> keys, absl::Span<const float> values,
               std::vector<zmq::message_t>& frames,
               const std::vector<uint32_t>& slots, std::vector<Need>* needs);
  // A duplicate push: its answer waits until the backups of its slots have
  // answered everything sent to them so far (added to *needs).
  // UNAVAILABLE while a backup is being copied again.
  absl::Status NeedsForDuplicate(const ServerView& own,
                                 const std::vector<uint32_t>& slots,
                                 std::vector<Need>* needs);
  // Answers a request (rh, values, keys) once the backups have answered
  // `needs`: at once when there is nothing to wait for or rh is an error,
  // later (ReadAnswers) otherwise. `applied`: the view applied last (null:
  // none); when a backup of `needs` is gone, an answer from a server that
  // is no longer live in it says "send again". `first_promoted`: the
  // request touched slots promoted here.
  void Answer(const ServerView* applied, zmq::message_t& identity,
              ResponseHeader& rh, zmq::message_t& values, zmq::message_t& keys,
              std::vector<Need> needs, bool first_promoted);

  // Links to the backups and learners `own` names, catch-ups of slots whose
  // backup or learner changed, the fences of moves that `own` fences;
  // answers waiting on a backup that is gone wait for the catch-ups
  // instead (or go out, when there is none).
  void SyncBackups(const ServerView& own);
  // `slots` (owned here now) are held by backup `node` already (a move's
  // source that became their backup): no catch-up is sent to it for them.
  // Call before SyncBackups with the view that names it their backup.
  void MarkPaired(const std::vector<uint32_t>& slots, uint64_t node);
  // Tells every backup to apply BSP step `step` with `divisor` (as the
  // primary did). `applied`: the view applied last (null: none), whose
  // epoch and node id the messages carry.
  void AnnounceStep(const ServerView* applied, uint64_t step, uint32_t divisor);
  // Copies again, at most every 200 ms per backup, the slots of a backup
  // that refused a message.
  void MaybeResync(const ServerView& own);

  // Appends a ZMQ_POLLIN item for every link's socket to *items, and the
  // link's backup node id to *nodes.
  void AddPollItems(std::vector<zmq::pollitem_t>* items,
                    std::vector<uint64_t>* nodes);
  // Reads every answer queued from backup `node` (nothing if it is not
  // linked any more) and releases the answers to workers they complete.
  void ReadAnswers(uint64_t node);

  // Sends at most `max_rows` rows and blocks of the learners' copies in
  // progress (a move's copy is sent in such chunks between requests, so
  // that pushes are served meanwhile), and the end of every copy whose
  // last row went. Returns whether a copy is still in progress.
  bool ContinueCopies(const ServerView& own, size_t max_rows);
  bool copying() const { return !copies_.empty(); }

  // Answers waiting for backups, and backups linked.
  size_t waiting() const { return waits_.size(); }
  size_t links() const { return links_.size(); }

  // A learner link with more unanswered than this holds the answers of
  // pushes to its slots (flow control).
  static constexpr uint64_t kLearnerMaxMessages = 256;
  static constexpr uint64_t kLearnerMaxBytes = uint64_t{64} << 20;

 private:
  // An answer that waits for backups to answer the replica messages it
  // depends on (BackupLink::waiters() point here).
  struct Wait {
    zmq::message_t identity;
    ResponseHeader rh;
    zmq::message_t values, keys;
    int remaining = 0;
    // A backup refused its copy: the worker is told to send again.
    bool failed = false;
    std::string error;
    bool first_promoted = false;
  };

  // A slot move out of this server, as SyncBackups follows it.
  struct MoveOut {
    uint32_t source = 0, target = 0;
    uint64_t node = 0;  // the target's
    std::vector<uint32_t> slots;
    // The target backs the slots (SlotMove.promote): nothing is copied;
    // COPIED once it acknowledged everything sent to it before the move.
    bool promote = false;
    uint64_t copy_epoch = 0, fence_epoch = 0;
    // The message id of the last catch-up end sent for its slots (0: none
    // yet), and what the catch-ups copied.
    uint64_t copy_end = 0;
    uint64_t rows = 0, bytes = 0;
    bool copied = false;  // COPIED reported
    // REPLICA_FENCE's message id (0: not sent), when the fence view was
    // applied, and whether FENCED or ABORTED was reported.
    uint64_t fence_id = 0;
    absl::Time fence_start;
    bool done = false;
  };
  struct Copied {
    uint64_t rows = 0, bytes = 0;
    uint64_t cold_rows = 0;  // of the rows, those read from a disk tier
  };
  // A learner's copy in progress (StartCopy, ContinueCopies). The rows and
  // blocks of its slots are listed when it starts and each is read when
  // its chunk goes: everything runs on the serving thread and the link is
  // FIFO, so a row read after its last update is current, updates after
  // the read are forwarded after it, and the target's import overwrites
  // whatever it made of a row from an update forwarded before the read.
  // A row created after the listing gets every update forwarded from its
  // creation (initial values are deterministic); one dropped since is not
  // sent.
  struct CopyRows {
    uint32_t table = 0;
    bool sparse = true;
    std::vector<uint64_t> rows;  // keys or blocks
    size_t stride = 1;           // visiting order, see ContinueCopy
  };
  struct CopyJob {
    std::vector<uint32_t> slots;
    // Lists the rows to send, in steps, before the first is sent; empty
    // once tables holds the list.
    std::optional<SlotKeyWalk> listing;
    std::vector<CopyRows> tables;
    size_t table = 0, next = 0;  // the next row: tables[table].rows order
    Copied copied;
    uint64_t chunks = 0;
    absl::Time start;
    absl::Duration longest;  // the longest stretch of reading
    int restarts = 0;        // listing passes started over (SlotKeyWalk)
  };

  replication::BackupLink* LinkOf(const ServerView& own, uint32_t backup);
  // The target holds the move's slots: COPIED is reported.
  void NoteCopied(MoveOut& move);
  // Promotions whose target has answered everything sent to it before
  // them: COPIED (SyncBackups' part).
  void NotePromotionsCopied(const ServerView& own);
  // Sends the subset `idx` of a forwarded update (keys or dense segments,
  // with their values) to `link`; returns its message id.
  uint64_t SendSubset(replication::BackupLink& link, const RequestHeader& h,
                      const RequestHeader& replica, const Table& table,
                      absl::Span<const uint64_t> keys,
                      absl::Span<const float> values,
                      const std::vector<size_t>& idx);
  // Forward's part for the learners of `slots`.
  void ForwardLearners(const ServerView& own, const RequestHeader& h,
                       const RequestHeader& replica, const Table& table,
                       absl::Span<const uint64_t> keys,
                       absl::Span<const float> values,
                       std::vector<zmq::message_t>& frames,
                       const std::vector<uint32_t>& slots,
                       std::vector<Need>* needs);
  // Follows own.moves whose source is this server: starts, forgets and
  // fences them (SyncBackups).
  void SyncMoves(const ServerView& own);
  void SendFence(const ServerView& own, MoveOut& move);
  // SyncBackups' parts: the learners' copies (stops those whose move is
  // gone, starts those of `learn`: node -> slots), and the fences due.
  void StartCopies(const ServerView& own,
                   const std::map<uint64_t, std::vector<uint32_t>>& learn);
  void SendFences(const ServerView& own);
  // Reports what the answers of `node` up to `id` complete of its moves.
  void NoteMoveAnswers(uint64_t node, uint64_t id, bool ok,
                       const std::string& error);
  void ReportMove(const MoveOut& move, ReportMoveRequest::Stage stage,
                  uint64_t epoch, const std::string& error);
  // Forward when the slots have different backups: one message per backup
  // with its keys or segments.
  void ForwardSplit(const ServerView& own, const RequestHeader& h,
                    const RequestHeader& replica, const Table& table,
                    absl::Span<const uint64_t> keys,
                    absl::Span<const float> values,
                    const std::vector<uint32_t>& slots,
                    std::vector<Need>* needs);
  // Answers that waited for dropped links (wait id -> needs dropped) wait
  // for the catch-ups `ends` instead.
  void RehomeWaits(const ServerView& own,
                   const absl::flat_hash_map<uint64_t, int>& orphaned,
                   const std::vector<Need>& ends);
  // Logs when the number of owned slots without a backup changes.
  void NoteUnbacked(const ServerView& own, uint32_t unbacked);
  // Copies the state of `slots` (owned here) to backup or learner `link`.
  Copied SendCatchUp(const ServerView& own, replication::BackupLink& link,
                     const std::vector<uint32_t>& slots);
  // A learner's copy in chunks: sends its start (sequence records, BSP
  // sums); ContinueCopies lists its rows, then sends them. Replaces a copy
  // to the same node in progress.
  void StartCopy(const ServerView& own, replication::BackupLink& link,
                 const std::vector<uint32_t>& slots);
  // Lists the rows of `job` (a step of at most
  // SlotKeyWalk::PositionsFor(`max_rows`) index positions) and, once
  // listed, sends at most `max_rows` of them to `link`; the copy's end once
  // every row went (returns true then).
  bool ContinueCopy(const ServerView& own, replication::BackupLink& link,
                    CopyJob& job, size_t* max_rows);
  // ContinueCopy's listing step: one that does not end the listing spends
  // the turn (sets *max_rows to 0); an unlimited one (~0) ends it.
  void ListCopy(CopyJob& job, size_t* max_rows);
  void EndCopy(const ServerView& own, replication::BackupLink& link,
               CopyJob& job);
  // The parts of a catch-up: the sequence records; the rows (sparse) or
  // blocks (dense) of table `id` in the slots of `mask` (returns how
  // many); the BSP sums buffered for those slots.
  void SendSeqRecords(const ServerView& own, replication::BackupLink& link);
  Copied SendTableCopy(const ServerView& own, replication::BackupLink& link,
                       uint32_t id, const std::vector<bool>& mask);
  void SendStepBuffers(const ServerView& own, replication::BackupLink& link,
                       const std::vector<bool>& mask);
  void OnBackupAnswer(uint64_t node, std::vector<zmq::message_t>& frames);
  void ReleaseWait(uint64_t wait_id);
  // Turns an answer into UNAVAILABLE "not acknowledged, send again".
  static void NotAcknowledged(ResponseHeader* rh, zmq::message_t* values,
                              zmq::message_t* keys, const std::string& why);

  const Deps deps_;
  // Backup node id -> link.
  absl::flat_hash_map<uint64_t, std::unique_ptr<replication::BackupLink>>
      links_;
  // Slot -> the backup node that holds a copy of it (0 = none), and the
  // learner node that was sent one (0 = none).
  std::vector<uint64_t> paired_;
  std::vector<uint64_t> learned_;
  // Moves out of this server, by target rank.
  std::map<uint32_t, MoveOut> moves_;
  // Learners' copies in progress, by learner node id.
  std::map<uint64_t, CopyJob> copies_;
  uint32_t unbacked_slots_ = 0;  // owned slots without a backup, last logged
  // Answers waiting for backups, by id (BackupLink::waiters() values).
  std::map<uint64_t, Wait> waits_;
  uint64_t next_wait_ = 1;
};

}  // namespace ps

#endif  // PS_SERVER_REPLICATION_PRIMARY_H_
