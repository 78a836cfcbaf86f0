// KVServer: slot moves between servers (cluster.elastic; proto/scheduler.proto
// SlotMove). The source copies a move's slots to its target as to a backup
// (server/replication_primary.h); this file holds the server's side of the
// view changes: reading the moves from the view, the flip at both ends, an
// abandoned copy, and the bytes per slot the scheduler plans moves with.
#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hash.h"
#include "server/server_impl.h"
#include "server/server_log.h"
#include "server/slot_digest.h"

namespace ps {

void KVServer::Impl::ReadMoves(const ClusterView& view, Ownership* own) const {
  if (view.moves().empty()) return;
  const uint32_t num_slots = static_cast<uint32_t>(own->slot_owner.size());
  const uint32_t max_ranks = MaxServerRanks(options_.config.cluster());
  own->slot_learner.assign(num_slots, kNoBackup);
  own->slot_promote_to.assign(num_slots, kNoBackup);
  own->slot_fenced.assign(num_slots, false);
  for (const SlotMove& m : view.moves()) {
    std::string bad;
    if (m.source() >= max_ranks || m.target() >= max_ranks ||
        m.source() == m.target()) {
      bad = "bad ranks";
    } else if (m.phase() != SlotMove::COPYING &&
               m.phase() != SlotMove::FENCING) {
      bad = "no phase";
    }
    for (uint32_t s : m.slots()) {
      if (!bad.empty()) break;
      if (s >= num_slots) {
        bad = absl::StrCat("slot ", s, " out of range");
      } else if (own->slot_owner[s] != m.source()) {
        bad = absl::StrCat("slot ", s, " is owned by server ",
                           own->slot_owner[s]);
      } else if (own->slot_learner[s] != kNoBackup ||
                 own->slot_promote_to[s] != kNoBackup) {
        bad = absl::StrCat("slot ", s, " is in two moves");
      } else if ((s < own->slot_backup.size() &&
                  own->slot_backup[s] == m.target()) != m.promote()) {
        bad = absl::StrCat("slot ", s,
                           m.promote() ? " is not backed by the target"
                                       : " is backed by the target");
      }
      if (bad.empty()) own->slot_learner[s] = kNoBackup - 1;  // claimed
    }
    if (!bad.empty() || m.slots().empty()) {
      ServerLog()->warn(
          "view {}: move of {} slots from server {} to server {} ignored: {}",
          view.epoch(), m.slots_size(), m.source(), m.target(),
          bad.empty() ? "no slots" : bad);
      // Slots claimed by this move before the check failed are released.
      for (uint32_t s : m.slots()) {
        if (s < num_slots && own->slot_learner[s] == kNoBackup - 1)
          own->slot_learner[s] = kNoBackup;
      }
      continue;
    }
    // The claims go; a promotion's slots name their target apart.
    for (uint32_t s : m.slots()) own->slot_learner[s] = kNoBackup;
    Ownership::Move move;
    move.source = m.source();
    move.target = m.target();
    move.slots.assign(m.slots().begin(), m.slots().end());
    std::sort(move.slots.begin(), move.slots.end());
    move.fencing = m.phase() == SlotMove::FENCING;
    move.promote = m.promote();
    move.copy_epoch = m.copy_epoch();
    move.fence_epoch = m.fence_epoch();
    for (uint32_t s : move.slots) {
      (move.promote ? own->slot_promote_to : own->slot_learner)[s] =
          move.target;
      own->slot_fenced[s] = move.fencing;
    }
    own->moves.push_back(std::move(move));
  }
  if (own->moves.empty()) {
    own->slot_learner.clear();
    own->slot_promote_to.clear();
    own->slot_fenced.clear();
  }
}

void KVServer::Impl::HandOver(const Ownership& prev, const Ownership& own) {
  const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
  if (own.node_id == 0 || prev.slot_owner.size() != num_slots) return;
  std::vector<bool> drop(num_slots, false);
  // New owner node -> the slots this server now backs for it.
  std::map<uint64_t, std::vector<uint32_t>> backed;
  std::map<uint32_t, uint32_t> count;  // target rank -> slots
  for (uint32_t s = 0; s < num_slots; ++s) {
    if (prev.slot_owner[s] != own.rank || own.slot_owner[s] == own.rank ||
        prev.moving_to(s) != own.slot_owner[s]) {
      continue;
    }
    const uint32_t target = own.slot_owner[s];
    ++count[target];
    if (own.slot_backup[s] == own.rank && target < own.server_node.size() &&
        own.server_node[target] != 0) {
      backed[own.server_node[target]].push_back(s);
    } else {
      drop[s] = true;
    }
  }
  if (count.empty()) return;
  const ReplicaStore::Dims dims = TableDims();
  // BSP sums of the slots: gone with replication 1; with 2 they are the
  // new owner's buffered steps, applied when it announces each step, so
  // this copy stays exact for a later failover back here.
  for (auto& [step, buffer] : bsp_.buffers)
    buffer.ExtractSlots(drop, num_slots, dims, nullptr);
  replicas_.SizeSlots(num_slots);
  for (const auto& [node, slots] : backed) {
    std::vector<bool> mask(num_slots, false);
    for (uint32_t s : slots) mask[s] = true;
    for (auto& [step, buffer] : bsp_.buffers) {
      StepBuffer part;
      buffer.ExtractSlots(mask, num_slots, dims, &part);
      if (!part.Empty()) {
        StepBuffer& theirs = replicas_.Buffer(node, step);
        part.ExtractSlots(std::vector<bool>(num_slots, true), num_slots, dims,
                          &theirs);
      }
    }
    replicas_.EndCatchUp(slots);
  }
  StartDrop(drop);
  uint32_t total = 0;
  for (const auto& [target, n] : count) {
    total += n;
    ServerLog()->info(
        "move of {} slots to server {}: flipped, it owns them now (epoch "
        "{}); this server {}",
        n, target, own.epoch,
        backed.empty() ? "dropped their rows" : "backs them");
  }
  counters_.move_slots_out.fetch_add(total, std::memory_order_relaxed);
  slot_bytes_at_ = absl::InfinitePast();
  slot_scan_.reset();  // counted before the flip
}

void KVServer::Impl::DropAbandonedCopies(const Ownership& prev,
                                         const Ownership& own) {
  const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
  if (prev.slot_owner.size() != num_slots || prev.slot_learner.empty()) return;
  auto holds = [&](uint32_t s) {
    return own.slot_owner[s] == own.rank || own.learner(s) == own.rank ||
           (s < own.slot_backup.size() && own.slot_backup[s] == own.rank);
  };
  std::vector<bool> drop(num_slots, false);
  // Old owner node -> its slots whose copy goes.
  std::map<uint64_t, std::vector<uint32_t>> from;
  size_t abandoned = 0, released = 0;
  for (uint32_t s = 0; s < num_slots; ++s) {
    const uint32_t learner = prev.learner(s);
    if (learner == kNoBackup) continue;
    if (learner == own.rank) {
      if (own.slot_owner[s] == own.rank || own.learner(s) == own.rank) continue;
      // This server's copy of a move that did not flip. Gone even when
      // this server backs the slots now: their new primary copies them.
      ++abandoned;
    } else if (s < prev.slot_backup.size() && prev.slot_backup[s] == own.rank &&
               own.slot_owner[s] == learner && !holds(s)) {
      ++released;  // backed here until the move flipped; the source backs it
    } else {
      continue;
    }
    drop[s] = true;
    const uint32_t source = prev.slot_owner[s];
    from[source < prev.server_node.size() ? prev.server_node[source] : 0]
        .push_back(s);
  }
  if (from.empty()) return;
  const ReplicaStore::Dims dims = TableDims();
  replicas_.SizeSlots(num_slots);
  for (const auto& [node, list] : from) replicas_.ForgetSlots(node, list, dims);
  FinishDrop();
  const uint64_t dropped = DropSlots(tables_, drop);
  ServerLog()->info(
      "dropped the copies of {} slots of an abandoned move to this server "
      "and of {} slots this server backed before their move flipped (epoch "
      "{}): {} rows and blocks",
      abandoned, released, own.epoch, dropped);
}

void KVServer::Impl::NoteMovedIn(const Ownership& prev, const Ownership& own,
                                 const std::vector<uint32_t>& slots,
                                 const std::vector<uint32_t>& sources) {
  if (slots.empty()) return;
  const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
  std::vector<bool> mask(num_slots, false);
  // Source node -> the slots it backs now: it holds what this server holds
  // (the fence compared them), so no catch-up is sent to it.
  std::map<uint64_t, std::vector<uint32_t>> backed_by_source;
  for (uint32_t s : slots) {
    mask[s] = true;
    const uint32_t source = prev.slot_owner[s];
    if (own.slot_backup[s] == source && source < own.server_node.size() &&
        own.server_node[source] != 0 &&
        own.server_node[source] == prev.server_node[source]) {
      backed_by_source[own.server_node[source]].push_back(s);
    }
  }
  for (const auto& [node, list] : backed_by_source)
    primary_.MarkPaired(list, node);
  // The moves' running digests when tracked (they are until
  // SyncMoveDigests forgets them): no pass over every row at the flip.
  SlotDigest held;
  bool tracked = true;
  for (const Ownership::Move& m : prev.moves) {
    if (m.target != own.rank || m.slots.empty() ||
        own.slot_owner[m.slots[0]] != own.rank) {
      continue;  // not flipped here (a move flips whole)
    }
    const std::optional<SlotDigest> d = move_digests_.Digest(m.slots);
    tracked &= d.has_value();
    if (!d.has_value()) break;
    held.rows += d->rows;
    held.bytes += d->bytes;
  }
  if (!tracked) held = DigestSlots(tables_, mask);
  counters_.move_slots_in.fetch_add(slots.size(), std::memory_order_relaxed);
  counters_.move_rows_in.fetch_add(held.rows, std::memory_order_relaxed);
  slot_bytes_at_ = absl::InfinitePast();
  slot_scan_.reset();  // counted before the flip
  ServerLog()->info(
      "move: serving {} slots of server(s) {} as their new owner (epoch {}; "
      "{} rows and blocks, {} bytes)",
      slots.size(), absl::StrJoin(sources, ", "), own.epoch, held.rows,
      held.bytes);
}

void KVServer::Impl::SyncMoveDigests(const Ownership& own) {
  std::map<MoveDigests::MoveKey, std::vector<uint32_t>> moves;
  if (own.node_id != 0) {
    for (const Ownership::Move& m : own.moves) {
      if (m.source == own.rank || m.target == own.rank)
        moves[{m.source, m.target, m.copy_epoch}] = m.slots;
    }
  }
  move_digests_.Sync(static_cast<uint32_t>(own.slot_owner.size()), moves);
}

bool KVServer::Impl::MoveWorkLeft() const {
  return primary_.copying() || pending_drop_.has_value() ||
         move_digests_.pending_initial() > 0;
}

std::chrono::milliseconds KVServer::Impl::MoveWorkPoll(
    std::chrono::milliseconds period) {
  if (move_digests_.pending_changed() > 0) return std::chrono::milliseconds(0);
  if (!MoveWorkLeft()) return period;
  const absl::Duration wait = move_work_.Wait();
  if (wait >= absl::FromChrono(period)) return period;
  // Rounded up: a poll that ends just before the credit does would spin.
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(
      wait + absl::Milliseconds(1) - absl::Nanoseconds(1)));
}

void KVServer::Impl::RunMoveWork(const Ownership& own, bool idle) {
  move_digests_.FoldChanged(kDigestFoldRows);
  if (!MoveWorkLeft() || (!idle && !move_work_.Allowed())) return;
  const absl::Time start = options_.clock->Now();
  move_digests_.FoldInitial(kDigestFoldRows);
  primary_.ContinueCopies(own, kCopyRowsPerTurn);
  StepDrop(options_.drop_positions_per_turn);
  if (!idle) move_work_.Spend(options_.clock->Now() - start);
}

void KVServer::Impl::MaybeMeasureSlots(const Ownership& own) {
  if (!options_.config.cluster().has_elastic() || own.slot_owner.empty() ||
      own.all) {
    return;
  }
  const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
  if (slot_scan_.has_value() && slot_scan_->num_slots() != num_slots)
    slot_scan_.reset();
  if (!slot_scan_.has_value()) {
    const absl::Time now = options_.clock->Now();
    if (now - slot_bytes_at_ < kSlotBytesPeriod) return;
    slot_bytes_at_ = now;
    slot_scan_.emplace(tables_, num_slots);
  }
  // A bounded step per serving-loop turn, not a pass over every key.
  if (!slot_scan_->Step(tables_, kSlotBytesPositionsPerTurn)) return;
  std::vector<uint64_t> bytes = slot_scan_->TakeBytes();
  slot_scan_.reset();
  for (uint32_t s = 0; s < num_slots; ++s) {
    if (own.slot_owner[s] != own.rank) bytes[s] = 0;
  }
  absl::MutexLock lock(&slot_bytes_mu_);
  slot_bytes_ = std::move(bytes);
}

void KVServer::Impl::StartDrop(const std::vector<bool>& mask) {
  if (std::find(mask.begin(), mask.end(), true) == mask.end()) return;
  if (pending_drop_.has_value() && pending_drop_->mask().size() != mask.size())
    FinishDrop();
  if (pending_drop_.has_value()) {
    pending_drop_->Add(tables_, mask);
  } else {
    pending_drop_.emplace(tables_, mask);
  }
}

void KVServer::Impl::StepDrop(size_t max_positions) {
  if (!pending_drop_.has_value() || max_positions == 0) return;
  if (!pending_drop_->Step(tables_, max_positions)) return;
  if (pending_drop_->dropped() > 0) {
    ServerLog()->info("dropped {} rows and blocks of slots moved away",
                      pending_drop_->dropped());
  }
  pending_drop_.reset();
}

void KVServer::Impl::FinishDrop() { StepDrop(~size_t{0}); }

void KVServer::Impl::FinishDropOfHeld(const Ownership& own) {
  if (!pending_drop_.has_value()) return;
  const std::vector<bool>& mask = pending_drop_->mask();
  const size_t num_slots = own.slot_owner.size();
  bool held = mask.size() != num_slots;
  for (size_t s = 0; s < num_slots && !held; ++s) {
    held = mask[s] &&
           (own.slot_owner[s] == own.rank ||
            own.learner(static_cast<uint32_t>(s)) == own.rank ||
            (s < own.slot_backup.size() && own.slot_backup[s] == own.rank));
  }
  if (held) FinishDrop();
}

std::vector<uint64_t> KVServer::Impl::slot_bytes() const {
  absl::MutexLock lock(&slot_bytes_mu_);
  return slot_bytes_;
}

}  // namespace ps
