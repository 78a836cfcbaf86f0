// KVServer: replication (cluster.replication 2), the backup side. See the
// comment at the top of server/server.h for what it does; this file says
// why it is done so.
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hash.h"
#include "common/protocol.h"
#include "common/status.h"
#include "common/wire.h"
#include "server/server_impl.h"
#include "server/server_log.h"
#include "server/slot_digest.h"

namespace ps {

// ------------------------------------------------------------- backup side

void KVServer::Impl::HandleReplica(zmq::message_t identity,
                                   std::vector<zmq::message_t> frames,
                                   const RequestHeader& header,
                                   const Ownership& own) {
  const uint64_t primary = header.replica_info().primary_node_id();
  auto held = replica_held_.find(primary);
  if ((held != replica_held_.end() && !held->second.empty()) ||
      header.epoch() > own.epoch || own.slot_owner.empty()) {
    // Sent under a view this server has not seen yet (it may not know it
    // backs those slots): wait for it, keeping the primary's order. Within
    // the held-bytes budget: beyond it the primary is told to try again
    // (it tells its worker), so a flood of such messages cannot grow this
    // server without bound.
    const uint64_t bytes = Admission::FramesBytes(frames);
    if (!admission_.MayHold(bytes)) {
      counters_.limit_refusals.fetch_add(1, std::memory_order_relaxed);
      ResponseHeader rh;
      rh.set_request_id(header.request_id());
      rh.set_epoch(own.epoch);
      SetResponseStatus(absl::UnavailableError(absl::StrCat(
                            "backup busy: ", counters_.held_bytes.load(),
                            " bytes of messages wait for a newer view "
                            "(data_plane.limits.max_held_bytes); retry")),
                        &rh);
      zmq::message_t values, keys;
      Send(identity, rh, values, keys);
      return;
    }
    counters_.held_bytes += bytes;
    replica_held_[primary].push_back(
        {std::move(identity), std::move(frames), header.epoch(), bytes});
    return;
  }
  // A message held above is checked when it is taken up: the primary's
  // messages are answered in order.
  ServerRefusal refusal = REFUSAL_NONE;
  if (absl::Status serving = lease_fence_.Check(own.rank, &refusal);
      !serving.ok()) {
    // The primary marks the link for a new catch-up, sent once this
    // server serves again (or the view names another backup).
    SendRefusal(identity, frames[0], serving, refusal, own.epoch);
    return;
  }
  counters_.replica_messages.fetch_add(1, std::memory_order_relaxed);
  ResponseHeader rh;
  rh.set_request_id(header.request_id());
  rh.set_epoch(own.epoch);
  absl::Status status;
  try {
    status = ProcessReplica(frames, own, &rh);
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError(
        "backup out of memory for this replica message");
  }
  if (!status.ok()) {
    counters_.errors.fetch_add(1, std::memory_order_relaxed);
    SetResponseStatus(status, &rh);
    ServerLog()->warn("replica message {} from server node {} refused: {}",
                      header.request_id(), primary, status.ToString());
  }
  zmq::message_t values, keys;
  Send(identity, rh, values, keys);
}

void KVServer::Impl::ReleaseReplicas(const Ownership& own) {
  if (replica_held_.empty()) return;
  // HandleReplica holds again what still needs a newer view, and, behind
  // it, the rest of that primary's messages.
  auto held = std::move(replica_held_);
  replica_held_.clear();
  for (const auto& [primary, queue] : held) {
    for (const Held& h : queue) counters_.held_bytes -= h.bytes;
  }
  for (auto& [primary, queue] : held) {
    for (Held& h : queue) {
      RequestHeader header;
      if (!replication::IsReplica(h.frames, &header)) continue;
      HandleReplica(std::move(h.identity), std::move(h.frames), header, own);
    }
  }
}

absl::Status KVServer::Impl::ProcessReplica(std::vector<zmq::message_t>& frames,
                                            const Ownership& own,
                                            ResponseHeader* rh) {
  replication::ReplicaMessage m;
  PS_RETURN_IF_ERROR(replication::DecodeReplica(frames, &m));
  ValidatedReplica v;
  PS_RETURN_IF_ERROR(ValidateReplica(m, own, rh, &v));
  ApplyReplica(m, v, rh);
  return absl::OkStatus();
}

// ------------------------------------------------------ replica messages
//
// A replica message passes Decode -> ValidateReplica -> ApplyReplica, as a
// worker's push passes the request pipeline: ValidateReplica is const and
// checks everything (sender, slots, table, sizes, finiteness, room), so a
// refused message changes nothing; ApplyReplica cannot fail.

namespace {

// The sender of a replica message and the slots it may address: those it
// owns and this server backs, in this server's view.
struct ReplicaRoute {
  absl::Span<const uint32_t> slot_owner, slot_backup;
  // Per slot, the target of its move (empty: no moves).
  absl::Span<const uint32_t> slot_learner;
  uint32_t rank = 0;  // this server's
  uint32_t primary_rank =
      kNoBackup;         // the sender's; kNoBackup: not a live server
  uint64_t primary = 0;  // the sender's node id
  uint64_t epoch = 0;

  uint32_t num_slots() const {
    return static_cast<uint32_t>(slot_owner.size());
  }

  // FAILED_PRECONDITION with the wrong-owner flag: the sender may not send
  // this here (another view's routing).
  absl::Status Refuse(ResponseHeader* rh, const std::string& why) const {
    rh->set_wrong_owner(true);
    return absl::FailedPreconditionError(
        absl::StrCat("replica message from server node ", primary, ": ", why,
                     " (epoch ", epoch, ")"));
  }

  absl::Status CheckSlot(uint32_t slot, ResponseHeader* rh) const {
    if (slot >= num_slots()) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", slot, " out of range"));
    }
    if (slot_owner[slot] == primary_rank &&
        (slot_backup[slot] == rank || learner(slot) == rank)) {
      return absl::OkStatus();
    }
    return Refuse(
        rh,
        absl::StrCat("slot ", slot, " is owned by server ", slot_owner[slot],
                     " and backed by ",
                     slot_backup[slot] == kNoBackup
                         ? std::string("none")
                         : absl::StrCat("server ", slot_backup[slot]),
                     ", not sent by its primary to its backup or the target of "
                     "its move (this server is rank ",
                     rank, ")"));
  }

  uint32_t learner(uint32_t slot) const {
    return slot < slot_learner.size() ? slot_learner[slot] : kNoBackup;
  }
};

absl::Status CheckFinite(absl::Span<const double> values) {
  for (double d : values) {
    if (!std::isfinite(d))
      return absl::InvalidArgumentError("non-finite buffered sum");
  }
  return absl::OkStatus();
}

// REPLICA_APPLY, REPLICA_BUFFER: the values of a worker's push or assign
// the primary applied (or buffered); shape and slots are checked already.
absl::Status ValidateUpdateValues(const replication::ReplicaMessage& m,
                                  const SparseTable* sparse) {
  const RequestHeader& h = m.header;
  const ReplicaInfo& r = h.replica_info();
  if (!AllFinite(m.floats)) {
    return absl::InvalidArgumentError(
        "replica message carries a non-finite value");
  }
  const float scale = r.lr_scale();
  if (r.kind() == REPLICA_APPLY && h.op() == PUSH &&
      !(std::isfinite(scale) && scale > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad learning-rate multiplier ", scale));
  }
  // The primary applied it; a backup without room would fall behind.
  if (h.op() == PUSH && sparse != nullptr) return sparse->CheckPush(m.keys);
  return absl::OkStatus();
}

// REPLICA_ROWS: whole rows (weights and optimizer state) of `sparse`.
absl::Status ValidateRows(const replication::ReplicaMessage& m,
                          const ReplicaRoute& route, const SparseTable& sparse,
                          ResponseHeader* rh) {
  const size_t stride = sparse.state_floats();
  if (m.floats.size() != m.keys.size() * stride) {
    return absl::InvalidArgumentError(
        absl::StrCat(m.keys.size(), " rows need ", m.keys.size() * stride,
                     " floats, got ", m.floats.size()));
  }
  const uint32_t table_id = m.header.table_id();
  for (uint64_t key : m.keys) {
    PS_RETURN_IF_ERROR(
        route.CheckSlot(SparseSlot(table_id, key, route.num_slots()), rh));
  }
  if (!AllFinite(m.floats))
    return absl::InvalidArgumentError("non-finite row state");
  return sparse.CheckImport(m.keys);
}

// REPLICA_BLOCKS: whole blocks (values and optimizer state) of `dense`.
absl::Status ValidateBlocks(const replication::ReplicaMessage& m,
                            const ReplicaRoute& route, const DenseTable& dense,
                            ResponseHeader* rh) {
  const size_t state_size = static_cast<size_t>(dense.state_size());
  size_t total = 0;
  for (uint64_t block : m.keys) {
    if (block >= dense.num_blocks()) {
      return absl::InvalidArgumentError(absl::StrCat("no block ", block));
    }
    PS_RETURN_IF_ERROR(route.CheckSlot(
        DenseBlockSlot(m.header.table_id(), block, route.num_slots()), rh));
    total += dense.BlockLength(block) * (1 + state_size);
  }
  if (m.floats.size() != total) {
    return absl::InvalidArgumentError(
        absl::StrCat("blocks need ", total, " floats, got ", m.floats.size()));
  }
  if (!AllFinite(m.floats)) {
    return absl::InvalidArgumentError(
        "a block holds a non-finite value or state");
  }
  return absl::OkStatus();
}

// REPLICA_STEP_BUFFER: a primary's buffered sums of one BSP step (sparse:
// keys and dim() sums each; dense: (block, lo, hi) triples and each
// block's sums).
absl::Status ValidateStepSums(const replication::ReplicaMessage& m,
                              const ReplicaRoute& route, const Table& table,
                              ResponseHeader* rh) {
  PS_RETURN_IF_ERROR(CheckFinite(m.doubles));
  const uint32_t table_id = m.header.table_id();
  if (const SparseTable* sparse = table.AsSparse()) {
    if (m.doubles.size() != m.keys.size() * sparse->dim()) {
      return absl::InvalidArgumentError("buffered sums of the wrong size");
    }
    for (uint64_t key : m.keys) {
      PS_RETURN_IF_ERROR(
          route.CheckSlot(SparseSlot(table_id, key, route.num_slots()), rh));
    }
    return absl::OkStatus();
  }
  const DenseTable* dense = table.AsDense();
  if (m.keys.size() % 3 != 0) {
    return absl::InvalidArgumentError("buffered dense ranges are not triples");
  }
  size_t total = 0;
  for (size_t i = 0; i < m.keys.size(); i += 3) {
    const uint64_t block = m.keys[i], lo = m.keys[i + 1], hi = m.keys[i + 2];
    if (block >= dense->num_blocks() || lo >= hi ||
        hi > dense->BlockLength(block)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad buffered range of block ", block));
    }
    PS_RETURN_IF_ERROR(route.CheckSlot(
        DenseBlockSlot(table_id, block, route.num_slots()), rh));
    total += dense->BlockLength(block);
  }
  if (m.doubles.size() != total) {
    return absl::InvalidArgumentError("buffered dense sums of the wrong size");
  }
  return absl::OkStatus();
}

// REPLICA_SEQS: (sender, top, kWords words) records, decoded into *seqs.
absl::Status ValidateSeqs(
    const replication::ReplicaMessage& m,
    std::vector<std::pair<uint64_t, replication::SeqWindow>>* seqs) {
  using replication::SeqWindow;
  constexpr size_t kEntry = 2 + SeqWindow::kWords;
  if (m.keys.size() % kEntry != 0) {
    return absl::InvalidArgumentError("sequence records of the wrong size");
  }
  for (size_t i = 0; i < m.keys.size(); i += kEntry) {
    PS_ASSIGN_OR_RETURN(
        SeqWindow w,
        SeqWindow::FromWords(m.keys[i + 1],
                             m.keys.subspan(i + 2, SeqWindow::kWords)));
    seqs->emplace_back(m.keys[i], std::move(w));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status KVServer::Impl::ValidateReplica(
    const replication::ReplicaMessage& m, const Ownership& own,
    ResponseHeader* rh, ValidatedReplica* v) const {
  const RequestHeader& h = m.header;
  const ReplicaInfo& r = h.replica_info();
  ReplicaRoute route;
  route.slot_owner = own.slot_owner;
  route.slot_backup = own.slot_backup;
  route.slot_learner = own.slot_learner;
  route.rank = own.rank;
  route.primary = r.primary_node_id();
  route.epoch = own.epoch;
  for (uint32_t i = 0; i < own.server_node.size(); ++i) {
    if (route.primary != 0 && own.server_node[i] == route.primary)
      route.primary_rank = i;
  }
  if (route.primary_rank == kNoBackup)
    return route.Refuse(rh, "the sender is not a live server");
  if (own.node_id == 0)
    return route.Refuse(rh, "this server is not a live member");
  v->primary_rank = route.primary_rank;
  v->num_slots = route.num_slots();

  const ReplicaKind kind = r.kind();
  if (kind == REPLICA_APPLY_STEP) {
    if (r.divisor() == 0) return absl::InvalidArgumentError("divisor 0");
    return absl::OkStatus();
  }
  if (kind == REPLICA_SNAPSHOT_BEGIN || kind == REPLICA_SNAPSHOT_END) {
    for (uint32_t slot : r.slots())
      PS_RETURN_IF_ERROR(route.CheckSlot(slot, rh));
    return absl::OkStatus();
  }
  if (kind == REPLICA_SEQS) return ValidateSeqs(m, &v->seqs);
  if (kind == REPLICA_FENCE) {
    for (uint32_t slot : r.slots()) {
      PS_RETURN_IF_ERROR(route.CheckSlot(slot, rh));
      // The target of the slot's move: its learner, or its backup when the
      // move is a promotion.
      if (route.learner(slot) != own.rank && own.moving_to(slot) != own.rank) {
        return route.Refuse(
            rh, absl::StrCat("slot ", slot, " is not moving to this server"));
      }
    }
    return CheckFenceDigest(m, own);
  }

  auto table = tables_.find(h.table_id());
  if (table == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown table ", h.table_id()));
  }
  v->table = table->second.get();
  v->sparse = v->table->AsSparse();
  v->dense = v->table->AsDense();
  switch (kind) {
    case REPLICA_APPLY:
    case REPLICA_BUFFER: {
      PS_RETURN_IF_ERROR(
          ValidateShape(h, *v->table, m.keys, m.floats, true, &v->n));
      std::vector<uint32_t> slots;
      SlotsOf(h, *v->table, m.keys, route.num_slots(), &slots);
      for (uint32_t slot : slots) PS_RETURN_IF_ERROR(route.CheckSlot(slot, rh));
      return ValidateUpdateValues(m, v->sparse);
    }
    case REPLICA_ROWS:
      if (v->sparse == nullptr) {
        return absl::InvalidArgumentError("REPLICA_ROWS of a dense table");
      }
      return ValidateRows(m, route, *v->sparse, rh);
    case REPLICA_BLOCKS:
      if (v->dense == nullptr) {
        return absl::InvalidArgumentError("REPLICA_BLOCKS of a sparse table");
      }
      return ValidateBlocks(m, route, *v->dense, rh);
    case REPLICA_STEP_BUFFER:
      return ValidateStepSums(m, route, *v->table, rh);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown replica kind ", static_cast<int>(kind)));
  }
}

void KVServer::Impl::ApplyReplica(const replication::ReplicaMessage& m,
                                  const ValidatedReplica& v,
                                  ResponseHeader* rh) {
  const RequestHeader& h = m.header;
  const ReplicaInfo& r = h.replica_info();
  const uint64_t primary = r.primary_node_id();
  switch (r.kind()) {
    case REPLICA_APPLY:
    case REPLICA_BUFFER:
      ApplyReplicaUpdate(m, v, rh);
      return;
    case REPLICA_APPLY_STEP: {
      StepBuffer step;
      if (replicas_.TakeStep(primary, r.step(), &step)) {
        ApplyBuffered(r.step(), step, r.divisor());
      }
      return;
    }
    case REPLICA_SNAPSHOT_BEGIN:
      replicas_.SizeSlots(v.num_slots);
      replicas_.BeginCatchUp(primary, r.slots(), TableDims());
      return;
    case REPLICA_SNAPSHOT_END:
      replicas_.SizeSlots(v.num_slots);
      replicas_.EndCatchUp(r.slots());
      ServerLog()->info("caught up with {} slots of server {} (node {})",
                        r.slots_size(), v.primary_rank, primary);
      return;
    case REPLICA_FENCE:
      ServerLog()->info(
          "move of {} slots from server {} (node {}): holding every update "
          "of them ({} rows, digests match)",
          r.slots_size(), v.primary_rank, primary, r.rows());
      return;
    case REPLICA_SEQS:
      for (const auto& [sender, window] : v.seqs)
        replicas_.MergeSeqs(primary, sender, window);
      return;
    case REPLICA_ROWS: {
      const size_t stride = v.sparse->state_floats();
      for (size_t i = 0; i < m.keys.size(); ++i) {
        // Validated (sizes, finiteness, room): fails only when the disk
        // tier failed, which fences the server (StorageFailed).
        v.sparse->ImportRow(m.keys[i], m.floats.subspan(i * stride, stride))
            .IgnoreError();
      }
      return;
    }
    case REPLICA_BLOCKS: {
      const size_t state_size = static_cast<size_t>(v.dense->state_size());
      size_t offset = 0;
      for (uint64_t block : m.keys) {
        const size_t len = v.dense->BlockLength(block);
        // Validated (blocks, sizes, finiteness): cannot fail.
        v.dense
            ->ImportBlock(block, m.floats.subspan(offset, len),
                          m.floats.subspan(offset + len, len * state_size))
            .IgnoreError();
        offset += len * (1 + state_size);
      }
      return;
    }
    case REPLICA_STEP_BUFFER: {
      StepBuffer& buffer = replicas_.Buffer(primary, r.step());
      if (v.sparse != nullptr) {
        buffer.MergeSparseSums(h.table_id(), v.sparse->dim(), m.keys,
                               m.doubles);
      } else {
        buffer.MergeDenseSums(*v.dense, m.keys, m.doubles);
      }
      buffer.pushers.insert(r.pushers().begin(), r.pushers().end());
      return;
    }
    default:
      return;  // ValidateReplica refuses every other kind
  }
}

void KVServer::Impl::ApplyReplicaUpdate(const replication::ReplicaMessage& m,
                                        const ValidatedReplica& v,
                                        ResponseHeader* rh) {
  const RequestHeader& h = m.header;
  const ReplicaInfo& r = h.replica_info();
  const uint64_t primary = r.primary_node_id();
  if (replicas_.SeenOrRecord(primary, h.sender_node_id(), h.seq())) {
    rh->set_duplicate(true);
    return;
  }
  const float scale = r.lr_scale();
  if (r.kind() == REPLICA_APPLY && h.op() == PUSH) {
    checkpoint_gate_.NoteReplicaApplied(h.clock());
  }
  if (r.kind() == REPLICA_BUFFER) {
    replicas_.Buffer(primary, h.clock())
        .Add(h.sender_node_id(), v.table, m.keys, h.segments(), m.floats);
  } else if (h.op() == ASSIGN) {
    v.dense->Assign(h.segments(), m.floats.data());
  } else if (v.sparse != nullptr) {
    v.sparse->Push(m.keys, m.floats.data(), scale);
  } else {
    v.dense->Push(h.segments(), m.floats.data(), scale);
  }
  replicas_.CountApplied(h.table_id(),
                         v.sparse != nullptr ? m.keys.size() : v.n);
}

void KVServer::Impl::Promote(const Ownership& prev, const Ownership& own) {
  const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
  if (own.node_id == 0 || prev.slot_owner.size() != num_slots ||
      prev.slot_backup.size() != num_slots) {
    return;
  }
  replicas_.SizeSlots(num_slots);
  failover_.SizeSlots(num_slots);
  // Old primary node -> the slots this server takes over from it: as their
  // backup (failover) or as the target of their move (its flip).
  std::map<uint64_t, std::vector<bool>> from;
  std::vector<uint32_t> old_ranks, moved, move_sources;
  uint32_t count = 0, incomplete = 0, without_copy = 0;
  for (uint32_t s = 0; s < num_slots; ++s) {
    if (own.slot_owner[s] != own.rank || prev.slot_owner[s] == own.rank)
      continue;
    const uint32_t old = prev.slot_owner[s];
    const bool move = prev.moving_to(s) == own.rank;
    if ((prev.slot_backup[s] != own.rank && !move) ||
        old >= prev.server_node.size() || prev.server_node[old] == 0) {
      ++without_copy;
      continue;
    }
    std::vector<bool>& mask = from[prev.server_node[old]];
    if (mask.empty()) mask.assign(num_slots, false);
    mask[s] = true;
    std::vector<uint32_t>& ranks = move ? move_sources : old_ranks;
    if (std::find(ranks.begin(), ranks.end(), old) == ranks.end())
      ranks.push_back(old);
    incomplete += !replicas_.caught_up(s);
    if (move) {
      moved.push_back(s);
      continue;
    }
    ++count;
    failover_.MarkPromoted(s);
  }
  if (without_copy > 0) {
    ServerLog()->warn(
        "{} slots are now served here without a copy of them from their "
        "old primary (epoch {})",
        without_copy, own.epoch);
  }
  if (from.empty()) return;
  const ReplicaStore::Dims dims = TableDims();
  uint64_t merged_steps = 0, applied_steps = 0;
  for (const auto& [node, mask] : from) {
    replicas_.TakeOver(
        node, mask, num_slots, dims, &seqs_,
        [&](uint64_t step, StepBuffer&& moved) {
          if (consistency_.ShouldBuffer(step)) {
            // Joins this server's own step, applied with it.
            consistency_.NoteBuffered(step);
            moved.ExtractSlots(std::vector<bool>(num_slots, true), num_slots,
                               dims, &bsp_.buffers[step]);
            ++merged_steps;
          } else {
            // A step this server already applied for its own slots (or BSP was
            // left): the old primary did not get to tell the divisor.
            const uint32_t divisor =
                std::max<uint32_t>(bsp_.RecentDivisor(step, 1),
                                   static_cast<uint32_t>(moved.pushers.size()));
            ApplyBuffered(step, moved, std::max<uint32_t>(divisor, 1));
            ++applied_steps;
          }
        });
  }
  // Checkpoints: the promoted rows hold pushes of the steps applied to them.
  checkpoint_gate_.Promoted();
  NoteMovedIn(prev, own, moved, move_sources);
  if (count > 0) {
    counters_.slots_promoted.fetch_add(count, std::memory_order_relaxed);
    failover_.Start(own.epoch);
    ServerLog()->warn(
        "failover: serving {} slots of server(s) {} as their new primary "
        "(epoch {}; {} buffered steps joined, {} applied)",
        count, absl::StrJoin(old_ranks, ", "), own.epoch, merged_steps,
        applied_steps);
  } else {
    ServerLog()->info("move: {} buffered steps joined, {} applied",
                      merged_steps, applied_steps);
  }
  if (incomplete > 0) {
    ServerLog()->error(
        "{} of the promoted slots had not finished copying from their old "
        "primary: updates to them may be missing",
        incomplete);
  }
}

absl::Status KVServer::Impl::CheckFenceDigest(
    const replication::ReplicaMessage& m, const Ownership& own) const {
  const ReplicaInfo& r = m.header.replica_info();
  // The move's running digest: reads only the rows changed since the
  // last fold. A fence for other slots than the tracked move's (none
  // should come) is checked by a pass over every row.
  std::optional<SlotDigest> tracked = move_digests_.Digest(
      std::vector<uint32_t>(r.slots().begin(), r.slots().end()));
  std::vector<bool> mask(own.slot_owner.size(), false);
  for (uint32_t slot : r.slots()) mask[slot] = true;
  const SlotDigest mine =
      tracked.has_value() ? *tracked : DigestSlots(tables_, mask);
  if (mine.digest == r.digest() && mine.rows == r.rows())
    return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "the move's copy of ", r.slots_size(),
      " slots differs: the source holds ", r.rows(), " rows with digest ",
      absl::Hex(r.digest(), absl::kZeroPad16), ", the target ", mine.rows,
      " rows with digest ", absl::Hex(mine.digest, absl::kZeroPad16)));
}

ReplicaStore::Dims KVServer::Impl::TableDims() const {
  ReplicaStore::Dims dims;
  for (const auto& [id, t] : tables_)
    dims[id] = t->AsSparse() ? t->AsSparse()->dim() : 1;
  return dims;
}

}  // namespace ps
