// The primary side of server replication (server/replication_primary.h has
// the contract; server/replication_backup.cc is the backup side). See the
// comment at the top of server/server.h for what replication does; this
// file says why it is done so.
#include "server/replication_primary.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/protocol.h"
#include "common/status.h"
#include "common/wire.h"
#include "server/response_code.h"
#include "server/server_log.h"
#include "server/slot_digest.h"
#include "server/table_rows.h"
#include "zmq_addon.hpp"

namespace ps {

namespace {

using replication::BackupLink;

// A catch-up is sent in messages of about this many bytes.
constexpr size_t kCatchUpBytes = size_t{8} << 20;
// A backup that refused a message is copied again at most this often.
constexpr absl::Duration kResyncPeriod = absl::Milliseconds(200);

// The header of a replica message of a catch-up from `own`'s node.
RequestHeader CatchUpHeader(uint64_t epoch, uint64_t node_id,
                            ReplicaKind kind) {
  RequestHeader h;
  h.set_replica(true);
  h.set_epoch(epoch);
  h.mutable_replica_info()->set_kind(kind);
  h.mutable_replica_info()->set_primary_node_id(node_id);
  return h;
}

// The start or the end of a catch-up of `slots`: what the receiver
// replaces, then holds.
RequestHeader SnapshotMark(const ServerView& own, ReplicaKind kind,
                           const std::vector<uint32_t>& slots) {
  RequestHeader h = CatchUpHeader(own.epoch, own.node_id, kind);
  for (uint32_t s : slots) h.mutable_replica_info()->add_slots(s);
  return h;
}

// One entry per slot of `own`'s view, set for `slots`.
std::vector<bool> SlotMask(const ServerView& own,
                           const std::vector<uint32_t>& slots) {
  std::vector<bool> mask(own.slot_owner.size(), false);
  for (uint32_t s : slots) mask[s] = true;
  return mask;
}

}  // namespace

ReplicationPrimary::ReplicationPrimary(Deps deps) : deps_(std::move(deps)) {}

BackupLink* ReplicationPrimary::LinkOf(const ServerView& own, uint32_t backup) {
  if (backup == kNoBackup || backup >= own.server_node.size()) return nullptr;
  auto it = links_.find(own.server_node[backup]);
  return it == links_.end() ? nullptr : it->second.get();
}

void ReplicationPrimary::Forward(
    const ServerView& own, const RequestHeader& h, ReplicaKind kind,
    float lr_scale, const Table& table, absl::Span<const uint64_t> keys,
    absl::Span<const float> values, std::vector<zmq::message_t>& frames,
    const std::vector<uint32_t>& slots, std::vector<Need>* needs) {
  if (slots.empty()) return;
  RequestHeader replica = h;
  replica.set_op(h.op() == ASSIGN ? ASSIGN : PUSH);
  // The frames forwarded are self-contained float32 ones (the primary
  // made them so), whatever the worker sent.
  replica.clear_key_list_slot();
  replica.clear_key_list_digest();
  replica.clear_push_values();
  replica.clear_pull_values();
  replica.set_epoch(own.epoch);
  replica.set_replica(true);
  ReplicaInfo* info = replica.mutable_replica_info();
  info->set_kind(kind);
  info->set_primary_node_id(own.node_id);
  info->set_lr_scale(lr_scale);
  ForwardLearners(own, h, replica, table, keys, values, frames, slots, needs);
  const uint32_t first = own.slot_backup[slots[0]];
  bool uniform = true;
  for (uint32_t slot : slots) uniform &= own.slot_backup[slot] == first;
  if (!uniform) {
    ForwardSplit(own, h, replica, table, keys, values, slots, needs);
    return;
  }
  // The usual case: every slot of the request has the same backup, which
  // gets the worker's own key and value frames (shared, not copied).
  BackupLink* link = LinkOf(own, first);
  if (link == nullptr) {
    if (own.backups_required)
      deps_.unreplicated_pushes->fetch_add(1, std::memory_order_relaxed);
    return;
  }
  zmq::message_t k, v;
  k.copy(frames[1]);
  v.copy(frames[2]);
  needs->emplace_back(link->node_id(),
                      link->Send(replica, std::move(k), std::move(v), true));
  deps_.forwards->fetch_add(1, std::memory_order_relaxed);
}

uint64_t ReplicationPrimary::SendSubset(
    BackupLink& link, const RequestHeader& h, const RequestHeader& replica,
    const Table& table, absl::Span<const uint64_t> keys,
    absl::Span<const float> values, const std::vector<size_t>& idx) {
  RequestHeader r = replica;
  std::vector<float> v;
  zmq::message_t k;
  if (const SparseTable* sparse = table.AsSparse()) {
    const uint32_t dim = sparse->dim();
    std::vector<uint64_t> subset;
    subset.reserve(idx.size());
    v.reserve(idx.size() * dim);
    for (size_t i : idx) {
      subset.push_back(keys[i]);
      v.insert(v.end(), values.begin() + i * dim,
               values.begin() + (i + 1) * dim);
    }
    r.set_num_keys(subset.size());
    k = FrameFromVector(std::move(subset));
  } else {
    // Value offset of every dense segment.
    std::vector<uint64_t> offsets;
    uint64_t offset = 0;
    for (const DenseSegment& s : h.segments()) {
      offsets.push_back(offset);
      offset += s.length();
    }
    r.clear_segments();
    for (size_t i : idx) {
      const DenseSegment& s = h.segments(static_cast<int>(i));
      *r.add_segments() = s;
      v.insert(v.end(), values.begin() + offsets[i],
               values.begin() + offsets[i] + s.length());
    }
  }
  return link.Send(r, std::move(k), FrameFromVector(std::move(v)), true);
}

void ReplicationPrimary::ForwardSplit(
    const ServerView& own, const RequestHeader& h, const RequestHeader& replica,
    const Table& table, absl::Span<const uint64_t> keys,
    absl::Span<const float> values, const std::vector<uint32_t>& slots,
    std::vector<Need>* needs) {
  std::map<uint32_t, std::vector<size_t>> groups;  // backup rank -> indices
  for (size_t i = 0; i < slots.size(); ++i)
    groups[own.slot_backup[slots[i]]].push_back(i);
  bool unreplicated = false;
  for (const auto& [backup, idx] : groups) {
    BackupLink* link = LinkOf(own, backup);
    if (link == nullptr) {
      unreplicated = true;
      continue;
    }
    needs->emplace_back(link->node_id(), SendSubset(*link, h, replica, table,
                                                    keys, values, idx));
    deps_.forwards->fetch_add(1, std::memory_order_relaxed);
  }
  if (unreplicated && own.backups_required)
    deps_.unreplicated_pushes->fetch_add(1, std::memory_order_relaxed);
}

void ReplicationPrimary::ForwardLearners(
    const ServerView& own, const RequestHeader& h, const RequestHeader& replica,
    const Table& table, absl::Span<const uint64_t> keys,
    absl::Span<const float> values, std::vector<zmq::message_t>& frames,
    const std::vector<uint32_t>& slots, std::vector<Need>* needs) {
  if (own.slot_learner.empty()) return;
  std::map<uint32_t, std::vector<size_t>> groups;  // learner rank -> indices
  for (size_t i = 0; i < slots.size(); ++i) {
    const uint32_t learner = own.learner(slots[i]);
    if (learner != kNoBackup) groups[learner].push_back(i);
  }
  for (const auto& [learner, idx] : groups) {
    BackupLink* link = LinkOf(own, learner);
    if (link == nullptr) continue;
    uint64_t id;
    if (idx.size() == slots.size()) {
      zmq::message_t k, v;
      k.copy(frames[1]);
      v.copy(frames[2]);
      RequestHeader r = replica;
      id = link->Send(r, std::move(k), std::move(v), true);
    } else {
      id = SendSubset(*link, h, replica, table, keys, values, idx);
    }
    deps_.forwards->fetch_add(1, std::memory_order_relaxed);
    // Not acknowledged by the learner, unless it falls too far behind.
    if (link->messages_in_flight() > kLearnerMaxMessages ||
        link->bytes_in_flight() > kLearnerMaxBytes) {
      needs->emplace_back(link->node_id(), id);
    }
  }
}

absl::Status ReplicationPrimary::NeedsForDuplicate(
    const ServerView& own, const std::vector<uint32_t>& slots,
    std::vector<Need>* needs) {
  std::vector<uint32_t> backups;
  for (uint32_t slot : slots) {
    const uint32_t b = own.slot_backup[slot];
    if (b == kNoBackup || b >= own.server_node.size()) continue;
    if (std::find(backups.begin(), backups.end(), b) != backups.end()) continue;
    backups.push_back(b);
    auto it = links_.find(own.server_node[b]);
    if (it == links_.end()) continue;
    BackupLink& link = *it->second;
    if (link.resync) {
      return absl::UnavailableError(absl::StrCat(
          "server ", b, " is being copied this server's slots again; retry"));
    }
    // Everything sent to the backup so far covers the update, whether it
    // went as its own message or as part of a catch-up.
    if (!link.all_acked())
      needs->emplace_back(link.node_id(), link.last_sent());
  }
  return absl::OkStatus();
}

void ReplicationPrimary::SyncBackups(const ServerView& own) {
  const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
  if (paired_.size() != num_slots) paired_.assign(num_slots, 0);
  if (learned_.size() != num_slots) learned_.assign(num_slots, 0);
  absl::flat_hash_map<uint64_t, std::string> endpoints;  // live server nodes
  for (size_t r = 0; r < own.server_node.size(); ++r) {
    if (own.server_node[r] != 0)
      endpoints[own.server_node[r]] = own.server_endpoint[r];
  }
  auto node_of = [&](uint32_t rank) -> uint64_t {
    if (rank == kNoBackup || rank == own.rank ||
        rank >= own.server_node.size()) {
      return 0;
    }
    return own.server_node[rank];
  };
  // The backup and learner node each owned slot should have, and the
  // slots whose backup or learner does not hold a copy yet.
  absl::flat_hash_set<uint64_t> wanted;
  std::vector<uint64_t> desired(num_slots, 0), learner(num_slots, 0);
  uint32_t unbacked = 0;
  for (uint32_t s = 0; s < num_slots; ++s) {
    if (own.slot_owner[s] != own.rank || own.node_id == 0) continue;
    desired[s] = node_of(own.slot_backup[s]);
    learner[s] = node_of(own.learner(s));
    if (learner[s] != 0) wanted.insert(learner[s]);
    if (desired[s] == 0) {
      ++unbacked;
      continue;
    }
    wanted.insert(desired[s]);
  }
  // Links to servers that back or learn nothing of this server any more
  // go; what waited for them waits for the catch-ups below instead.
  absl::flat_hash_map<uint64_t, int> orphaned;  // wait id -> needs dropped
  for (auto it = links_.begin(); it != links_.end();) {
    if (wanted.contains(it->first)) {
      ++it;
      continue;
    }
    for (const auto& [id, wait] : it->second->waiters()) ++orphaned[wait];
    ServerLog()->info(
        "server node {} ({}) no longer backs or learns any slot of this "
        "server",
        it->first, it->second->endpoint());
    links_.erase(it++);
  }
  for (uint64_t node : wanted) {
    if (links_.contains(node)) continue;
    auto link =
        BackupLink::Connect(*deps_.context, node, endpoints[node], deps_.curve);
    if (!link.ok()) {
      ServerLog()->error("{}", link.status().message());
      continue;
    }
    links_[node] = std::move(link).value();
  }
  // Before the learners' catch-ups, which count toward the moves.
  SyncMoves(own);
  std::map<uint64_t, std::vector<uint32_t>> catch_up, learn;
  for (uint32_t s = 0; s < num_slots; ++s) {
    const uint64_t node = links_.contains(desired[s]) ? desired[s] : 0;
    if (node != 0 && paired_[s] != node) catch_up[node].push_back(s);
    paired_[s] = node;
    const uint64_t l = links_.contains(learner[s]) ? learner[s] : 0;
    if (l != 0 && learned_[s] != l) learn[l].push_back(s);
    learned_[s] = l;
  }
  std::vector<Need> ends;
  for (const auto& [node, slots] : catch_up) {
    BackupLink& link = *links_[node];
    SendCatchUp(own, link, slots);
    ends.emplace_back(node, link.last_sent());
  }
  RehomeWaits(own, orphaned, ends);
  NoteUnbacked(own, own.backups_required ? unbacked : 0);
  StartCopies(own, learn);
  NotePromotionsCopied(own);
  SendFences(own);
}

void ReplicationPrimary::StartCopies(
    const ServerView& own,
    const std::map<uint64_t, std::vector<uint32_t>>& learn) {
  // Copies to learners whose move is gone stop; new ones start, sent in
  // chunks between requests (ContinueCopies).
  for (auto it = copies_.begin(); it != copies_.end();) {
    bool running = false;
    for (const auto& [target, move] : moves_)
      running |= move.node == it->first && !move.done;
    it = running && links_.contains(it->first) ? std::next(it)
                                               : copies_.erase(it);
  }
  for (const auto& [node, slots] : learn) {
    StartCopy(own, *links_[node], slots);
    for (auto& [target, move] : moves_) {
      if (move.node == node) move.copy_end = 0;  // set by its end
    }
  }
}

void ReplicationPrimary::SendFences(const ServerView& own) {
  for (auto& [target, move] : moves_) {
    if (move.done || move.fence_epoch == 0 || move.fence_id != 0) continue;
    // The fence follows the whole copy. The scheduler fences a move only
    // once it was copied; a copy still in progress is finished first
    // rather than fenced without its rows.
    auto copy = copies_.find(move.node);
    BackupLink* link = LinkOf(own, move.target);
    if (copy != copies_.end() && link != nullptr) {
      size_t unlimited = ~size_t{0};
      ContinueCopy(own, *link, copy->second, &unlimited);
      EndCopy(own, *link, copy->second);
      copies_.erase(copy);
    }
    SendFence(own, move);
  }
}

void ReplicationPrimary::NotePromotionsCopied(const ServerView& own) {
  // A promotion copies nothing: the target holds the slots once it has
  // answered what was sent to it so far (their catch-up included).
  for (auto& [target, move] : moves_) {
    if (!move.promote || move.copied || move.done || move.copy_end != 0)
      continue;
    BackupLink* link = LinkOf(own, move.target);
    bool paired = link != nullptr;
    for (uint32_t s : move.slots) {
      paired &= s < paired_.size() && paired_[s] == move.node;
    }
    if (!paired) continue;  // its copy is not linked yet
    move.copy_end = link->last_sent();
    if (link->all_acked()) NoteCopied(move);
  }
}

void ReplicationPrimary::NoteCopied(MoveOut& move) {
  move.copied = true;
  ServerLog()->info(
      "move of {} slots to server {}: copied ({} rows, {} bytes{})",
      move.slots.size(), move.target, move.rows, move.bytes,
      move.promote ? "; it backs them already" : "");
  if (deps_.move_rows_out != nullptr)
    deps_.move_rows_out->fetch_add(move.rows, std::memory_order_relaxed);
  ReportMove(move, ReportMoveRequest::COPIED, move.copy_epoch, "");
}

void ReplicationPrimary::MarkPaired(const std::vector<uint32_t>& slots,
                                    uint64_t node) {
  for (uint32_t s : slots) {
    if (s < paired_.size()) paired_[s] = node;
  }
}

void ReplicationPrimary::SyncMoves(const ServerView& own) {
  // Moves that left the view: handed over (the target owns the slots) or
  // abandoned (the source kept them).
  for (auto it = moves_.begin(); it != moves_.end();) {
    const MoveOut& m = it->second;
    bool kept = false;
    for (const ServerView::Move& v : own.moves) {
      kept |= v.source == own.rank && v.target == m.target &&
              v.copy_epoch == m.copy_epoch;
    }
    if (kept && own.node_id != 0) {
      ++it;
      continue;
    }
    const bool handed = !m.slots.empty() &&
                        m.slots[0] < own.slot_owner.size() &&
                        own.slot_owner[m.slots[0]] == m.target;
    ServerLog()->info("move of {} slots to server {}: {} (epoch {})",
                      m.slots.size(), m.target,
                      handed ? "handed over, the target owns them"
                             : "abandoned, this server keeps them",
                      own.epoch);
    moves_.erase(it++);
  }
  if (own.node_id == 0) return;
  for (const ServerView::Move& v : own.moves) {
    if (v.source != own.rank) continue;
    auto it = moves_.find(v.target);
    if (it == moves_.end()) {
      MoveOut m;
      m.source = v.source;
      m.target = v.target;
      m.node =
          v.target < own.server_node.size() ? own.server_node[v.target] : 0;
      m.slots = v.slots;
      m.promote = v.promote;
      m.copy_epoch = v.copy_epoch;
      // A new move copies its slots afresh, even to a server that was
      // sent them for an earlier move this view replaced.
      for (uint32_t s : v.slots) {
        if (s < learned_.size()) learned_[s] = 0;
      }
      it = moves_.emplace(v.target, std::move(m)).first;
      ServerLog()->info(
          "move of {} slots to server {} (node {}): copying (epoch {})",
          v.slots.size(), v.target, it->second.node, own.epoch);
    }
    MoveOut& m = it->second;
    if (v.fencing && m.fence_epoch == 0) {
      m.fence_epoch = v.fence_epoch != 0 ? v.fence_epoch : own.epoch;
      m.fence_start = deps_.clock->Now();
    }
  }
}

void ReplicationPrimary::SendFence(const ServerView& own, MoveOut& move) {
  BackupLink* link = LinkOf(own, move.target);
  if (link == nullptr) {
    ServerLog()->warn(
        "move to server {}: no link to fence it on; waiting for the view "
        "to drop the move",
        move.target);
    return;
  }
  // After every update of the slots (none is applied from now on): the
  // target answers once it holds them all, then compares digests.
  std::optional<SlotDigest> tracked;
  size_t unfolded = 0;  // rows changed since the last fold, read now
  if (deps_.digests != nullptr) {
    unfolded = deps_.digests->pending();
    tracked = deps_.digests->Digest(move.slots);
  }
  const SlotDigest digest =
      tracked.has_value() ? *tracked
                          : DigestSlots(*deps_.tables, SlotMask(own, move.slots));
  RequestHeader h = CatchUpHeader(own.epoch, own.node_id, REPLICA_FENCE);
  ReplicaInfo* info = h.mutable_replica_info();
  for (uint32_t s : move.slots) info->add_slots(s);
  info->set_digest(digest.digest);
  info->set_rows(digest.rows);
  move.fence_id = link->Send(h, zmq::message_t(), zmq::message_t(), false);
  ServerLog()->info(
      "move of {} slots to server {}: fenced (epoch {}), {} rows, digest "
      "{:016x} ({}); waiting for the target",
      move.slots.size(), move.target, own.epoch, digest.rows, digest.digest,
      tracked.has_value()
          ? absl::StrCat("running digest, ", unfolded, " rows read now")
          : std::string("a pass over every row"));
}

void ReplicationPrimary::NoteMoveAnswers(uint64_t node, uint64_t id, bool ok,
                                         const std::string& error) {
  auto link = links_.find(node);
  if (link == links_.end()) return;
  const uint64_t acked = link->second->acked();
  for (auto& [target, move] : moves_) {
    if (move.node != node || move.done) continue;
    if (ok && !move.copied && move.copy_end != 0 && acked >= move.copy_end) {
      NoteCopied(move);
    }
    // A refusal on the target's link (the fence's, or any other: its copy
    // may now lack an update) abandons the move.
    if (!ok) {
      move.done = true;
      ServerLog()->error("move of {} slots to server {}: aborted: {}",
                         move.slots.size(), move.target, error);
      if (deps_.move_aborts != nullptr)
        deps_.move_aborts->fetch_add(1, std::memory_order_relaxed);
      ReportMove(move, ReportMoveRequest::ABORTED,
                 move.fence_epoch != 0 ? move.fence_epoch : move.copy_epoch,
                 error);
      continue;
    }
    if (move.fence_id == 0 || id != move.fence_id) continue;
    move.done = true;
    const int64_t pause =
        absl::ToInt64Microseconds(deps_.clock->Now() - move.fence_start);
    ServerLog()->info(
        "move of {} slots to server {}: the target holds every update "
        "(fence pause {:.1f} ms)",
        move.slots.size(), move.target, pause / 1000.0);
    if (deps_.move_fences != nullptr)
      deps_.move_fences->fetch_add(1, std::memory_order_relaxed);
    if (deps_.move_fence_max_micros != nullptr && pause > 0) {
      uint64_t prev = deps_.move_fence_max_micros->load();
      while (prev < static_cast<uint64_t>(pause) &&
             !deps_.move_fence_max_micros->compare_exchange_weak(
                 prev, static_cast<uint64_t>(pause))) {
      }
    }
    ReportMove(move, ReportMoveRequest::FENCED, move.fence_epoch, "");
  }
}

void ReplicationPrimary::ReportMove(const MoveOut& move,
                                    ReportMoveRequest::Stage stage,
                                    uint64_t epoch, const std::string& error) {
  if (!deps_.on_move) return;
  ReportMoveRequest r;
  r.set_source(move.source);
  r.set_target(move.target);
  r.set_epoch(epoch);
  r.set_stage(stage);
  r.set_rows_copied(move.rows);
  r.set_bytes_copied(move.bytes);
  r.set_error(error);
  deps_.on_move(r);
}

void ReplicationPrimary::RehomeWaits(
    const ServerView& own, const absl::flat_hash_map<uint64_t, int>& orphaned,
    const std::vector<Need>& ends) {
  for (const auto& [wait_id, dropped] : orphaned) {
    auto w = waits_.find(wait_id);
    if (w == waits_.end()) continue;
    w->second.remaining -= dropped;
    for (const Need& end : ends) {
      ++w->second.remaining;
      links_[end.first]->waiters().emplace(end.second, wait_id);
    }
    // With no catch-up to wait for, a live server answers with its single
    // copy (the slot has no backup now); one that is no longer a member
    // (its slots went to their backups) must not acknowledge what they may
    // not hold.
    if (ends.empty() && own.node_id == 0) {
      w->second.failed = true;
      w->second.error = "this server is no longer a live member";
    }
    if (w->second.remaining <= 0) ReleaseWait(wait_id);
  }
}

void ReplicationPrimary::NoteUnbacked(const ServerView& own,
                                      uint32_t unbacked) {
  if (unbacked == unbacked_slots_) return;
  if (unbacked > 0) {
    ServerLog()->warn(
        "{} of this server's slots have no backup (epoch {}): pushes to "
        "them are acknowledged with a single copy",
        unbacked, own.epoch);
  } else if (unbacked_slots_ > 0) {
    ServerLog()->info("every slot of this server has a backup again (epoch {})",
                      own.epoch);
  }
  unbacked_slots_ = unbacked;
}

ReplicationPrimary::Copied ReplicationPrimary::SendCatchUp(
    const ServerView& own, BackupLink& link,
    const std::vector<uint32_t>& slots) {
  const absl::Time start = deps_.clock->Now();
  const std::vector<bool> mask = SlotMask(own, slots);
  RequestHeader begin = SnapshotMark(own, REPLICA_SNAPSHOT_BEGIN, slots);
  link.Send(begin, zmq::message_t(), zmq::message_t(), false);
  SendSeqRecords(own, link);
  // Rows and blocks with their optimizer state (a disk tier's cold rows
  // too), read in one pass per table while nothing else runs: a cursor
  // over a table that changes in between (rows created, demoted or
  // promoted) could miss rows.
  std::vector<uint32_t> ids;
  for (const auto& [id, table] : *deps_.tables) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  Copied copied;
  for (uint32_t id : ids) {
    const Copied table = SendTableCopy(own, link, id, mask);
    copied.rows += table.rows;
    copied.bytes += table.bytes;
  }
  SendStepBuffers(own, link, mask);
  RequestHeader end = SnapshotMark(own, REPLICA_SNAPSHOT_END, slots);
  link.Send(end, zmq::message_t(), zmq::message_t(), false);
  deps_.catchups_sent->fetch_add(1, std::memory_order_relaxed);
  deps_.rows_copied->fetch_add(copied.rows, std::memory_order_relaxed);
  ServerLog()->info(
      "catch-up of {} slots to server node {} ({}): {} rows and blocks, "
      "{} senders' sequence records, {} buffered steps, read in {:.1f} ms",
      slots.size(), link.node_id(), link.endpoint(), copied.rows,
      deps_.seqs->size(), deps_.buffers->size(),
      absl::ToDoubleMilliseconds(deps_.clock->Now() - start));
  return copied;
}

void ReplicationPrimary::StartCopy(const ServerView& own, BackupLink& link,
                                   const std::vector<uint32_t>& slots) {
  const absl::Time start = deps_.clock->Now();
  std::vector<bool> mask = SlotMask(own, slots);
  RequestHeader begin = SnapshotMark(own, REPLICA_SNAPSHOT_BEGIN, slots);
  link.Send(begin, zmq::message_t(), zmq::message_t(), false);
  SendSeqRecords(own, link);
  // The BSP sums buffered now; pushes buffered later are forwarded after
  // them, and a step applied meanwhile is applied by the target to what it
  // holds then (the rows read later hold it already, and overwrite).
  SendStepBuffers(own, link, mask);
  CopyJob job;
  job.slots = slots;
  job.start = start;
  // The rows are listed between requests (ContinueCopy): a walk of the
  // whole index at once would hold requests up for as long as it takes.
  job.listing.emplace(*deps_.tables, std::move(mask));
  job.longest = deps_.clock->Now() - start;
  copies_[link.node_id()] = std::move(job);
}

bool ReplicationPrimary::ContinueCopies(const ServerView& own,
                                        size_t max_rows) {
  for (auto it = copies_.begin(); it != copies_.end() && max_rows > 0;) {
    auto link = links_.find(it->first);
    if (link == links_.end()) {
      it = copies_.erase(it);
    } else if (ContinueCopy(own, *link->second, it->second, &max_rows)) {
      EndCopy(own, *link->second, it->second);
      it = copies_.erase(it);
    } else {
      ++it;
    }
  }
  return !copies_.empty();
}

void ReplicationPrimary::ListCopy(CopyJob& job, size_t* max_rows) {
  SlotKeyWalk& walk = *job.listing;
  const size_t positions = SlotKeyWalk::PositionsFor(*max_rows);
  if (positions == ~size_t{0}) {
    walk.Finish(*deps_.tables);
  } else if (!walk.Step(*deps_.tables, positions)) {
    *max_rows = 0;  // a listing step that did not end spends the turn
    return;
  }
  for (SlotKeyWalk::Keys& k : walk.keys()) {
    CopyRows t;
    t.table = k.table;
    t.sparse = k.sparse;
    t.rows = std::move(k.keys);
    // The keys come in the index's hash order; the target inserting them
    // so would pile them into long probe runs (SparseTable::ExportRows
    // says why). A stride near the golden ratio, coprime to their number,
    // spreads every prefix over the hash range.
    const size_t n = t.rows.size();
    t.stride = std::max<size_t>(1, static_cast<size_t>(n * 0.6180339887));
    while (n > 0 && std::gcd(t.stride, n) != 1) ++t.stride;
    if (n > 0) job.tables.push_back(std::move(t));
  }
  job.restarts = walk.restarts();
  job.listing.reset();
}

bool ReplicationPrimary::ContinueCopy(const ServerView& own, BackupLink& link,
                                      CopyJob& job, size_t* max_rows) {
  const absl::Time start = deps_.clock->Now();
  if (job.listing.has_value()) {
    ListCopy(job, max_rows);
    if (job.listing.has_value() || *max_rows == 0) {
      job.longest = std::max(job.longest, deps_.clock->Now() - start);
      return false;
    }
  }
  std::vector<uint64_t> keys;
  std::vector<float> values;
  // Listed rows not in RAM now: on the table's disk tier, read together
  // (SparseTable::ReadColdRows) before the chunk goes.
  std::vector<uint64_t> cold;
  std::vector<float> cold_states;
  std::vector<bool> cold_found;
  auto read_cold = [&](const CopyRows& t) {
    if (cold.empty()) return;
    auto table = deps_.tables->find(t.table);
    if (table != deps_.tables->end()) {
      const SparseTable& sparse = *table->second->AsSparse();
      const size_t stride = sparse.state_floats();
      sparse.ReadColdRows(cold, &cold_states, &cold_found);
      for (size_t i = 0; i < cold.size(); ++i) {
        if (!cold_found[i]) continue;  // dropped since the listing
        ++job.copied.cold_rows;
        keys.push_back(cold[i]);
        values.insert(values.end(), cold_states.begin() + i * stride,
                      cold_states.begin() + (i + 1) * stride);
      }
    }
    cold.clear();
  };
  auto flush = [&](const CopyRows& t) {
    read_cold(t);
    if (keys.empty()) return;
    RequestHeader h = CatchUpHeader(own.epoch, own.node_id,
                                    t.sparse ? REPLICA_ROWS : REPLICA_BLOCKS);
    h.set_table_id(t.table);
    h.set_num_keys(keys.size());
    job.copied.rows += keys.size();
    job.copied.bytes +=
        keys.size() * sizeof(uint64_t) + values.size() * sizeof(float);
    link.Send(h, FrameFromVector(std::move(keys)),
              FrameFromVector(std::move(values)), true);
    keys = std::vector<uint64_t>();
    values = std::vector<float>();
  };
  while (*max_rows > 0 && job.table < job.tables.size()) {
    const CopyRows& t = job.tables[job.table];
    auto table = deps_.tables->find(t.table);
    if (job.next >= t.rows.size() || table == deps_.tables->end()) {
      flush(t);
      ++job.table;
      job.next = 0;
      continue;
    }
    const uint64_t row = t.rows[static_cast<size_t>(
        (static_cast<unsigned __int128>(job.next) * t.stride) % t.rows.size())];
    ++job.next;
    --*max_rows;
    // Read now, as it is now; a row dropped since the listing is not sent.
    if (t.sparse) {
      const SparseTable& sparse = *table->second->AsSparse();
      const absl::Span<const float> state = sparse.RowState(row);
      if (state.empty()) {
        if (sparse.disk_tier() != nullptr) cold.push_back(row);
        continue;
      }
      keys.push_back(row);
      values.insert(values.end(), state.begin(), state.end());
    } else {
      absl::Span<const float> v, s;
      if (!table->second->AsDense()->FindBlock(row, &v, &s)) continue;
      keys.push_back(row);
      values.insert(values.end(), v.begin(), v.end());
      values.insert(values.end(), s.begin(), s.end());
    }
    if (values.size() * sizeof(float) >= kCatchUpBytes) flush(t);
  }
  if (job.table < job.tables.size()) flush(job.tables[job.table]);
  ++job.chunks;
  job.longest = std::max(job.longest, deps_.clock->Now() - start);
  return job.table >= job.tables.size();
}

void ReplicationPrimary::EndCopy(const ServerView& own, BackupLink& link,
                                 CopyJob& job) {
  RequestHeader end = SnapshotMark(own, REPLICA_SNAPSHOT_END, job.slots);
  link.Send(end, zmq::message_t(), zmq::message_t(), false);
  deps_.catchups_sent->fetch_add(1, std::memory_order_relaxed);
  deps_.rows_copied->fetch_add(job.copied.rows, std::memory_order_relaxed);
  // "read in": the longest the serving thread spent on this copy at once
  // (the listing, or one chunk), what a push to this server waited.
  ServerLog()->info(
      "catch-up of {} slots to server node {} ({}): {} rows and blocks ({} "
      "read from disk) in {} chunks between requests ({} listing passes "
      "started over), {} senders' sequence records, {} buffered steps, read "
      "in {:.1f} ms at most at once, {:.1f} ms in all",
      job.slots.size(), link.node_id(), link.endpoint(), job.copied.rows,
      job.copied.cold_rows, job.chunks, job.restarts, deps_.seqs->size(),
      deps_.buffers->size(), absl::ToDoubleMilliseconds(job.longest),
      absl::ToDoubleMilliseconds(deps_.clock->Now() - job.start));
  for (auto& [target, move] : moves_) {
    if (move.node != link.node_id() || move.done) continue;
    move.copy_end = link.last_sent();
    move.rows += job.copied.rows;
    move.bytes += job.copied.bytes;
  }
}

void ReplicationPrimary::SendSeqRecords(const ServerView& own,
                                        BackupLink& link) {
  // Which (sender, seq) were applied: retries of pushes applied here must
  // be recognised by the backup once it is promoted.
  constexpr size_t kPerMessage = 1000;
  std::vector<uint64_t> words;
  size_t senders = 0;
  auto flush = [&] {
    if (senders == 0) return;
    RequestHeader h = CatchUpHeader(own.epoch, own.node_id, REPLICA_SEQS);
    h.set_num_keys(words.size());
    link.Send(h, FrameFromVector(std::move(words)), zmq::message_t(), false);
    words = std::vector<uint64_t>();
    senders = 0;
  };
  for (const auto& [sender, window] : *deps_.seqs) {
    words.push_back(sender);
    words.push_back(window.top());
    const std::vector<uint64_t> bits = window.Words();
    words.insert(words.end(), bits.begin(), bits.end());
    if (++senders == kPerMessage) flush();
  }
  flush();
}

ReplicationPrimary::Copied ReplicationPrimary::SendTableCopy(
    const ServerView& own, BackupLink& link, uint32_t id,
    const std::vector<bool>& mask) {
  Copied copied;
  std::vector<uint64_t> out_keys;
  std::vector<float> out_values;
  auto flush = [&](ReplicaKind kind) {
    if (out_keys.empty()) return;
    RequestHeader h = CatchUpHeader(own.epoch, own.node_id, kind);
    h.set_table_id(id);
    h.set_num_keys(out_keys.size());
    copied.rows += out_keys.size();
    copied.bytes +=
        out_keys.size() * sizeof(uint64_t) + out_values.size() * sizeof(float);
    link.Send(h, FrameFromVector(std::move(out_keys)),
              FrameFromVector(std::move(out_values)), true);
    out_keys = std::vector<uint64_t>();
    out_values = std::vector<float>();
  };
  const Table& table = *deps_.tables->at(id);
  const bool sparse = table.AsSparse() != nullptr;
  const ReplicaKind kind = sparse ? REPLICA_ROWS : REPLICA_BLOCKS;
  // A sparse row's state comes whole in `values` (`state` is empty); a
  // dense block's weights then its optimizer state.
  const absl::Status read = ForEachTableRow(
      table, 65536,
      [&](uint64_t row, absl::Span<const float> values,
          absl::Span<const float> state) {
        out_keys.push_back(row);
        out_values.insert(out_values.end(), values.begin(), values.end());
        out_values.insert(out_values.end(), state.begin(), state.end());
        if (out_values.size() * sizeof(float) >= kCatchUpBytes) flush(kind);
      },
      &mask);
  if (!read.ok()) {
    ServerLog()->error("catch-up of table {} stopped early: {}", id, read);
  }
  flush(kind);
  return copied;
}

void ReplicationPrimary::SendStepBuffers(const ServerView& own,
                                         BackupLink& link,
                                         const std::vector<bool>& mask) {
  // BSP steps buffered and not yet applied: the backup applies them with
  // this server when it is told the divisor.
  const uint32_t num_slots = static_cast<uint32_t>(mask.size());
  for (const auto& [step, buffer] : *deps_.buffers) {
    auto send = [&, step = step, &buffer = buffer](uint32_t id,
                                                   std::vector<uint64_t> keys,
                                                   std::vector<double> sums) {
      if (keys.empty()) return;
      RequestHeader h =
          CatchUpHeader(own.epoch, own.node_id, REPLICA_STEP_BUFFER);
      h.set_table_id(id);
      h.set_num_keys(keys.size());
      h.mutable_replica_info()->set_step(step);
      for (uint64_t p : buffer.pushers)
        h.mutable_replica_info()->add_pushers(p);
      link.Send(h, FrameFromVector(std::move(keys)),
                FrameFromVector(std::move(sums)), true);
    };
    for (const auto& [id, b] : buffer.sparse) {
      const uint32_t dim = deps_.tables->at(id)->AsSparse()->dim();
      std::vector<uint64_t> keys;
      std::vector<double> sums;
      for (size_t i = 0; i < b.keys.size(); ++i) {
        if (!mask[SparseSlot(id, b.keys[i], num_slots)]) continue;
        keys.push_back(b.keys[i]);
        sums.insert(sums.end(), b.sums.begin() + i * dim,
                    b.sums.begin() + (i + 1) * dim);
      }
      send(id, std::move(keys), std::move(sums));
    }
    for (const auto& [id, b] : buffer.dense) {
      std::vector<uint64_t> triples;
      std::vector<double> sums;
      std::vector<uint64_t> blocks;
      for (const auto& [block, s] : b.blocks) blocks.push_back(block);
      std::sort(blocks.begin(), blocks.end());
      for (uint64_t block : blocks) {
        if (!mask[DenseBlockSlot(id, block, num_slots)]) continue;
        const auto range = b.touched.at(block);
        triples.insert(triples.end(), {block, range.first, range.second});
        const std::vector<double>& s = b.blocks.at(block);
        sums.insert(sums.end(), s.begin(), s.end());
      }
      send(id, std::move(triples), std::move(sums));
    }
  }
}

void ReplicationPrimary::OnBackupAnswer(uint64_t node,
                                        std::vector<zmq::message_t>& frames) {
  auto it = links_.find(node);
  if (it == links_.end()) return;
  BackupLink& link = *it->second;
  DecodedResponse response;
  if (absl::Status s = DecodeResponse(frames, &response); !s.ok()) {
    ServerLog()->error("bad answer from backup node {}: {}", node, s.message());
    return;
  }
  const uint64_t id = response.header.request_id();
  if (id == 0 || id > link.last_sent() || id <= link.acked()) {
    ServerLog()->warn(
        "backup node {} answered message {} out of order (sent {}, answered "
        "{})",
        node, id, link.last_sent(), link.acked());
    return;
  }
  const bool ok = response.header.code() == 0;
  bool fence = false;
  for (const auto& [target, move] : moves_)
    fence |= move.node == node && move.fence_id == id;
  if (!ok && !fence) {
    // The backup's copy may now lack an update: copy its slots again, and
    // let the workers concerned send again (as duplicates, answered once
    // the new copy is in).
    if (!link.resync) {
      ServerLog()->warn(
          "backup node {} refused replica message {}: {}; copying its "
          "slots to it again",
          node, id, response.header.message());
    }
    link.resync = true;
  }
  link.set_acked(id);
  std::vector<uint64_t> ready;
  auto& waiters = link.waiters();
  while (!waiters.empty() && waiters.begin()->first <= link.acked()) {
    const auto [message, wait_id] = *waiters.begin();
    waiters.erase(waiters.begin());
    auto w = waits_.find(wait_id);
    if (w == waits_.end()) continue;
    if (!ok && message == id) {
      w->second.failed = true;
      w->second.error = response.header.message();
    }
    if (--w->second.remaining <= 0) ready.push_back(wait_id);
  }
  for (uint64_t wait_id : ready) ReleaseWait(wait_id);
  NoteMoveAnswers(node, id, ok, response.header.message());
}

void ReplicationPrimary::ReleaseWait(uint64_t wait_id) {
  auto it = waits_.find(wait_id);
  if (it == waits_.end()) return;
  Wait w = std::move(it->second);
  waits_.erase(it);
  if (w.failed) {
    NotAcknowledged(
        &w.rh, &w.values, &w.keys,
        absl::StrCat("the backup did not take its copy (", w.error, ")"));
  }
  deps_.send(w.identity, w.rh, w.values, w.keys);
  if (!w.failed && w.first_promoted) deps_.first_promoted_served();
}

void ReplicationPrimary::MaybeResync(const ServerView& own) {
  const absl::Time now = deps_.clock->Now();
  for (auto& [node, link] : links_) {
    if (!link->resync || now - link->last_resync < kResyncPeriod) continue;
    std::vector<uint32_t> slots, learned;
    for (uint32_t s = 0; s < paired_.size(); ++s) {
      if (paired_[s] == node) slots.push_back(s);
      if (s < learned_.size() && learned_[s] == node) learned.push_back(s);
    }
    link->resync = false;
    link->last_resync = now;
    if (!slots.empty()) SendCatchUp(own, *link, slots);
    bool running = false;  // a move to this node not abandoned yet
    for (const auto& [target, move] : moves_)
      running |= move.node == node && !move.done;
    if (learned.empty() || !running) continue;
    // In one pass: a copy in chunks in progress gives way to it.
    copies_.erase(node);
    SendCatchUp(own, *link, learned);
    for (auto& [target, move] : moves_) {
      if (move.node == node) move.copy_end = link->last_sent();
    }
  }
}

void ReplicationPrimary::Answer(const ServerView* applied,
                                zmq::message_t& identity, ResponseHeader& rh,
                                zmq::message_t& values, zmq::message_t& keys,
                                std::vector<Need> needs, bool first_promoted) {
  std::vector<Need> open;
  bool gone = false;
  for (const Need& need : needs) {
    auto link = links_.find(need.first);
    if (link == links_.end()) {
      gone = true;
    } else if (link->second->acked() < need.second) {
      open.push_back(need);
    }
  }
  if (gone && rh.code() == 0) {
    // A backup this answer waited for went away meanwhile (a deferred
    // pull's push half): the update is held by the current backups once
    // they have taken everything sent to them, catch-ups included.
    if (applied == nullptr || applied->node_id == 0) {
      NotAcknowledged(&rh, &values, &keys,
                      "this server is no longer a live member");
    } else {
      for (const auto& [node, link] : links_) {
        if (!link->all_acked()) open.emplace_back(node, link->last_sent());
      }
    }
  }
  if (open.empty() || rh.code() != 0) {
    deps_.send(identity, rh, values, keys);
    if (first_promoted && rh.code() == 0) deps_.first_promoted_served();
    return;
  }
  const uint64_t id = next_wait_++;
  Wait& w = waits_[id];
  w.identity = std::move(identity);
  w.rh = rh;
  w.values = std::move(values);
  w.keys = std::move(keys);
  w.remaining = static_cast<int>(open.size());
  w.first_promoted = first_promoted;
  for (const Need& need : open)
    links_[need.first]->waiters().emplace(need.second, id);
}

void ReplicationPrimary::NotAcknowledged(ResponseHeader* rh,
                                         zmq::message_t* values,
                                         zmq::message_t* keys,
                                         const std::string& why) {
  // Applied here, perhaps, but not held by a backup: the worker sends it
  // again with the same sequence number, and whoever owns its slots then
  // applies it or answers it as a duplicate.
  SetResponseStatus(absl::UnavailableError(
                        absl::StrCat(why, "; not acknowledged, send again")),
                    rh);
  rh->set_num_values(0);
  rh->set_num_keys(0);
  rh->set_duplicate(false);
  *values = zmq::message_t();
  *keys = zmq::message_t();
}

void ReplicationPrimary::AnnounceStep(const ServerView* applied, uint64_t step,
                                      uint32_t divisor) {
  // Backups apply what they buffered of the step with the same divisor.
  for (auto& [node, link] : links_) {
    RequestHeader h;
    h.set_replica(true);
    h.set_epoch(applied != nullptr ? applied->epoch : 0);
    ReplicaInfo* r = h.mutable_replica_info();
    r->set_kind(REPLICA_APPLY_STEP);
    r->set_primary_node_id(applied != nullptr ? applied->node_id : 0);
    r->set_step(step);
    r->set_divisor(divisor);
    link->Send(h, zmq::message_t(), zmq::message_t(), false);
  }
}

void ReplicationPrimary::AddPollItems(std::vector<zmq::pollitem_t>* items,
                                      std::vector<uint64_t>* nodes) {
  for (auto& [node, link] : links_) {
    items->push_back({link->socket().handle(), 0, ZMQ_POLLIN, 0});
    nodes->push_back(node);
  }
}

void ReplicationPrimary::ReadAnswers(uint64_t node) {
  // A link the view just dropped is gone from links_ (its socket with it).
  std::vector<zmq::message_t> frames;
  while (true) {
    auto link = links_.find(node);
    if (link == links_.end()) break;
    frames.clear();
    auto n =
        zmq::recv_multipart(link->second->socket(), std::back_inserter(frames),
                            zmq::recv_flags::dontwait);
    if (!n) break;
    OnBackupAnswer(node, frames);
  }
}

}  // namespace ps
