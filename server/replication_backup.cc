// KVServer: replication (cluster.replication 2), the backup side. See the
// comment at the top of server/server.h for what it does; this file says
// why it is done so.
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/protocol.h"
#include "common/status.h"
#include "common/wire.h"
#include "server/server_impl.h"

namespace ps {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger = new std::shared_ptr<spdlog::logger>(GetLogger("server"));
  return *logger;
}

}  // namespace

// ------------------------------------------------------------- backup side

void KVServer::Impl::HandleReplica(zmq::message_t identity,
                             std::vector<zmq::message_t> frames,
                             const RequestHeader& header, const Ownership& own) {
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
      rh.set_code(static_cast<int32_t>(absl::StatusCode::kUnavailable));
      rh.set_message(absl::StrCat("backup busy: ", counters_.held_bytes.load(),
                                  " bytes of messages wait for a newer view "
                                  "(data_plane.limits.max_held_bytes); retry"));
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
  if (absl::Status serving = CheckServing(own, &refusal); !serving.ok()) {
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
    status = ApplyReplica(frames, own, &rh);
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("backup out of memory for this replica message");
  }
  if (!status.ok()) {
    counters_.errors.fetch_add(1, std::memory_order_relaxed);
    rh.set_code(static_cast<int32_t>(status.code()));
    rh.set_message(std::string(status.message()));
    Log()->warn("replica message {} from server node {} refused: {}",
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

absl::Status KVServer::Impl::ApplyReplica(std::vector<zmq::message_t>& frames,
                                    const Ownership& own, ResponseHeader* rh) {
  replication::ReplicaMessage m;
  PS_RETURN_IF_ERROR(replication::DecodeReplica(frames, &m));
  const RequestHeader& h = m.header;
  const ReplicaInfo& r = h.replica_info();
  const uint64_t primary = r.primary_node_id();
  const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
  auto refuse = [&](const std::string& why) {
    rh->set_wrong_owner(true);
    return absl::FailedPreconditionError(absl::StrCat(
        "replica message from server node ", primary, ": ", why, " (epoch ",
        own.epoch, ")"));
  };
  uint32_t prank = kNoBackup;
  for (uint32_t i = 0; i < own.server_node.size(); ++i) {
    if (primary != 0 && own.server_node[i] == primary) prank = i;
  }
  if (prank == kNoBackup) return refuse("the sender is not a live server");
  if (own.node_id == 0) return refuse("this server is not a live member");
  auto check_slot = [&](uint32_t slot) -> absl::Status {
    if (slot >= num_slots) {
      return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " out of range"));
    }
    if (own.slot_owner[slot] != prank || own.slot_backup[slot] != own.rank) {
      return refuse(absl::StrCat(
          "slot ", slot, " is owned by server ", own.slot_owner[slot], " and backed by ",
          own.slot_backup[slot] == kNoBackup ? std::string("none")
                                             : absl::StrCat("server ", own.slot_backup[slot]),
          ", not sent by its primary to its backup (this server is rank ", own.rank, ")"));
    }
    return absl::OkStatus();
  };
  auto table_of = [&](uint32_t id) -> absl::StatusOr<Table*> {
    auto it = tables_.find(id);
    if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("unknown table ", id));
    return it->second.get();
  };

  switch (r.kind()) {
    case REPLICA_APPLY:
    case REPLICA_BUFFER: {
      PS_ASSIGN_OR_RETURN(Table * table, table_of(h.table_id()));
      SparseTable* sparse = table->AsSparse();
      DenseTable* dense = table->AsDense();
      uint64_t n = 0;
      PS_RETURN_IF_ERROR(ValidateShape(h, *table, m.keys, m.floats, true, &n));
      SlotsOf(h, *table, m.keys, num_slots, &slots_scratch_);
      for (uint32_t slot : slots_scratch_) PS_RETURN_IF_ERROR(check_slot(slot));
      if (!AllFinite(m.floats)) {
        return absl::InvalidArgumentError("replica message carries a non-finite value");
      }
      const float scale = r.lr_scale();
      if (r.kind() == REPLICA_APPLY && h.op() == PUSH && !(std::isfinite(scale) && scale > 0)) {
        return absl::InvalidArgumentError(absl::StrCat("bad learning-rate multiplier ", scale));
      }
      if (h.op() == PUSH && sparse != nullptr) {
        // The primary applied it; a backup without room would fall behind.
        PS_RETURN_IF_ERROR(sparse->CheckPush(m.keys));
      }
      if (replicas_.SeenOrRecord(primary, h.sender_node_id(), h.seq())) {
        rh->set_duplicate(true);
        return absl::OkStatus();
      }
      if (r.kind() == REPLICA_APPLY && h.op() == PUSH) {
        checkpoint_gate_.NoteReplicaApplied(h.clock());
      }
      if (r.kind() == REPLICA_BUFFER) {
        replicas_.Buffer(primary, h.clock())
            .Add(h.sender_node_id(), table, m.keys, h.segments(), m.floats);
      } else if (h.op() == ASSIGN) {
        dense->Assign(h.segments(), m.floats.data());
      } else if (sparse != nullptr) {
        sparse->Push(m.keys, m.floats.data(), scale);
      } else {
        dense->Push(h.segments(), m.floats.data(), scale);
      }
      replicas_.CountApplied(h.table_id(), sparse != nullptr ? m.keys.size() : n);
      return absl::OkStatus();
    }
    case REPLICA_APPLY_STEP: {
      if (r.divisor() == 0) return absl::InvalidArgumentError("divisor 0");
      StepBuffer step;
      if (replicas_.TakeStep(primary, r.step(), &step)) {
        ApplyBuffered(r.step(), step, r.divisor());
      }
      return absl::OkStatus();
    }
    case REPLICA_SNAPSHOT_BEGIN:
    case REPLICA_SNAPSHOT_END: {
      for (uint32_t slot : r.slots()) PS_RETURN_IF_ERROR(check_slot(slot));
      replicas_.SizeSlots(num_slots);
      if (r.kind() == REPLICA_SNAPSHOT_BEGIN) {
        replicas_.BeginCatchUp(primary, r.slots(), TableDims());
      } else {
        replicas_.EndCatchUp(r.slots());
        Log()->info("caught up with {} slots of server {} (node {})", r.slots_size(), prank,
                    primary);
      }
      return absl::OkStatus();
    }
    case REPLICA_SEQS: {
      constexpr size_t kEntry = 2 + SeqWindow::kWords;
      if (m.keys.size() % kEntry != 0) {
        return absl::InvalidArgumentError("sequence records of the wrong size");
      }
      for (size_t i = 0; i < m.keys.size(); i += kEntry) {
        PS_ASSIGN_OR_RETURN(SeqWindow w,
                            SeqWindow::FromWords(m.keys[i + 1],
                                                 m.keys.subspan(i + 2, SeqWindow::kWords)));
        replicas_.MergeSeqs(primary, m.keys[i], w);
      }
      return absl::OkStatus();
    }
    case REPLICA_ROWS: {
      PS_ASSIGN_OR_RETURN(Table * table, table_of(h.table_id()));
      SparseTable* sparse = table->AsSparse();
      if (sparse == nullptr) return absl::InvalidArgumentError("REPLICA_ROWS of a dense table");
      const size_t stride = sparse->state_floats();
      if (m.floats.size() != m.keys.size() * stride) {
        return absl::InvalidArgumentError(absl::StrCat(
            m.keys.size(), " rows need ", m.keys.size() * stride, " floats, got ",
            m.floats.size()));
      }
      for (uint64_t key : m.keys) {
        PS_RETURN_IF_ERROR(check_slot(SparseSlot(h.table_id(), key, num_slots)));
      }
      if (!AllFinite(m.floats)) return absl::InvalidArgumentError("non-finite row state");
      for (size_t i = 0; i < m.keys.size(); ++i) {
        PS_RETURN_IF_ERROR(sparse->ImportRow(m.keys[i], m.floats.subspan(i * stride, stride)));
      }
      return absl::OkStatus();
    }
    case REPLICA_BLOCKS: {
      PS_ASSIGN_OR_RETURN(Table * table, table_of(h.table_id()));
      DenseTable* dense = table->AsDense();
      if (dense == nullptr) return absl::InvalidArgumentError("REPLICA_BLOCKS of a sparse table");
      const size_t state_size = static_cast<size_t>(dense->state_size());
      size_t total = 0;
      for (uint64_t block : m.keys) {
        if (block >= dense->num_blocks()) {
          return absl::InvalidArgumentError(absl::StrCat("no block ", block));
        }
        PS_RETURN_IF_ERROR(check_slot(DenseBlockSlot(h.table_id(), block, num_slots)));
        total += dense->BlockLength(block) * (1 + state_size);
      }
      if (m.floats.size() != total) {
        return absl::InvalidArgumentError(absl::StrCat(
            "blocks need ", total, " floats, got ", m.floats.size()));
      }
      size_t offset = 0;
      for (uint64_t block : m.keys) {
        const size_t len = dense->BlockLength(block);
        PS_RETURN_IF_ERROR(dense->ImportBlock(block, m.floats.subspan(offset, len),
                                              m.floats.subspan(offset + len, len * state_size)));
        offset += len * (1 + state_size);
      }
      return absl::OkStatus();
    }
    case REPLICA_STEP_BUFFER: {
      PS_ASSIGN_OR_RETURN(Table * table, table_of(h.table_id()));
      for (double d : m.doubles) {
        if (!std::isfinite(d)) return absl::InvalidArgumentError("non-finite buffered sum");
      }
      if (const SparseTable* sparse = table->AsSparse()) {
        const uint32_t dim = sparse->dim();
        if (m.doubles.size() != m.keys.size() * dim) {
          return absl::InvalidArgumentError("buffered sums of the wrong size");
        }
        for (uint64_t key : m.keys) {
          PS_RETURN_IF_ERROR(check_slot(SparseSlot(h.table_id(), key, num_slots)));
        }
        StepBuffer& buffer = replicas_.Buffer(primary, r.step());
        auto& b = buffer.sparse[h.table_id()];
        for (size_t i = 0; i < m.keys.size(); ++i) {
          auto [it, inserted] =
              b.index.try_emplace(m.keys[i], static_cast<uint32_t>(b.keys.size()));
          if (inserted) {
            b.keys.push_back(m.keys[i]);
            b.sums.resize(b.sums.size() + dim, 0.0);
          }
          double* sum = &b.sums[size_t{it->second} * dim];
          for (uint32_t e = 0; e < dim; ++e) sum[e] += m.doubles[i * dim + e];
        }
        buffer.pushers.insert(r.pushers().begin(), r.pushers().end());
        return absl::OkStatus();
      }
      const DenseTable* dense = table->AsDense();
      if (m.keys.size() % 3 != 0) {
        return absl::InvalidArgumentError("buffered dense ranges are not triples");
      }
      size_t total = 0;
      for (size_t i = 0; i < m.keys.size(); i += 3) {
        const uint64_t block = m.keys[i], lo = m.keys[i + 1], hi = m.keys[i + 2];
        if (block >= dense->num_blocks() || lo >= hi || hi > dense->BlockLength(block)) {
          return absl::InvalidArgumentError(absl::StrCat("bad buffered range of block ", block));
        }
        PS_RETURN_IF_ERROR(check_slot(DenseBlockSlot(h.table_id(), block, num_slots)));
        total += dense->BlockLength(block);
      }
      if (m.doubles.size() != total) {
        return absl::InvalidArgumentError("buffered dense sums of the wrong size");
      }
      StepBuffer& buffer = replicas_.Buffer(primary, r.step());
      auto& b = buffer.dense[h.table_id()];
      size_t offset = 0;
      for (size_t i = 0; i < m.keys.size(); i += 3) {
        const uint64_t block = m.keys[i];
        const size_t len = dense->BlockLength(block);
        std::vector<double>& sums = b.blocks[block];
        if (sums.empty()) sums.assign(len, 0.0);
        for (size_t e = 0; e < len; ++e) sums[e] += m.doubles[offset + e];
        offset += len;
        auto [range, inserted] = b.touched.try_emplace(block, m.keys[i + 1], m.keys[i + 2]);
        if (!inserted) {
          range->second.first = std::min(range->second.first, m.keys[i + 1]);
          range->second.second = std::max(range->second.second, m.keys[i + 2]);
        }
      }
      buffer.pushers.insert(r.pushers().begin(), r.pushers().end());
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown replica kind ", static_cast<int>(r.kind())));
  }
}

void KVServer::Impl::Promote(const Ownership& prev, const Ownership& own) {
  const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
  if (own.node_id == 0 || prev.slot_owner.size() != num_slots ||
      prev.slot_backup.size() != num_slots) {
    return;
  }
  replicas_.SizeSlots(num_slots);
  if (promoted_.size() != num_slots) promoted_.assign(num_slots, false);
  // Old primary node -> the slots this server takes over from it.
  std::map<uint64_t, std::vector<bool>> from;
  std::vector<uint32_t> old_ranks;
  uint32_t count = 0, incomplete = 0, without_copy = 0;
  for (uint32_t s = 0; s < num_slots; ++s) {
    if (own.slot_owner[s] != own.rank || prev.slot_owner[s] == own.rank) continue;
    const uint32_t old = prev.slot_owner[s];
    if (prev.slot_backup[s] != own.rank || old >= prev.server_node.size() ||
        prev.server_node[old] == 0) {
      ++without_copy;
      continue;
    }
    std::vector<bool>& mask = from[prev.server_node[old]];
    if (mask.empty()) mask.assign(num_slots, false);
    mask[s] = true;
    if (std::find(old_ranks.begin(), old_ranks.end(), old) == old_ranks.end()) {
      old_ranks.push_back(old);
    }
    ++count;
    incomplete += !replicas_.caught_up(s);
    promoted_[s] = true;
  }
  if (without_copy > 0) {
    Log()->warn("{} slots are now served here without a copy of them from their "
                "old primary (epoch {})",
                without_copy, own.epoch);
  }
  if (count == 0) return;
  const ReplicaStore::Dims dims = TableDims();
  uint64_t merged_steps = 0, applied_steps = 0;
  for (const auto& [node, mask] : from) {
    replicas_.TakeOver(node, mask, num_slots, dims, &seqs_,
                       [&](uint64_t step, StepBuffer&& moved) {
      if (consistency_.ShouldBuffer(step)) {
        // Joins this server's own step, applied with it.
        consistency_.NoteBuffered(step);
        moved.ExtractSlots(std::vector<bool>(num_slots, true), num_slots, dims,
                           &buffers_[step]);
        ++merged_steps;
      } else {
        // A step this server already applied for its own slots (or BSP was
        // left): the old primary did not get to tell the divisor.
        auto d = recent_divisors_.find(step);
        const uint32_t divisor = std::max<uint32_t>(
            d != recent_divisors_.end() ? d->second : 1,
            static_cast<uint32_t>(moved.pushers.size()));
        ApplyBuffered(step, moved, std::max<uint32_t>(divisor, 1));
        ++applied_steps;
      }
    });
  }
  // Checkpoints: the promoted rows hold pushes of the steps applied to them.
  checkpoint_gate_.Promoted();
  counters_.slots_promoted.fetch_add(count, std::memory_order_relaxed);
  awaiting_first_promoted_ = true;
  promoted_at_ = options_.clock->Now();
  promoted_epoch_ = own.epoch;
  Log()->warn("failover: serving {} slots of server(s) {} as their new primary (epoch "
              "{}; {} buffered steps joined, {} applied)",
              count, absl::StrJoin(old_ranks, ", "), own.epoch, merged_steps,
              applied_steps);
  if (incomplete > 0) {
    Log()->error("{} of the promoted slots had not finished copying from their old "
                 "primary: updates to them may be missing",
                 incomplete);
  }
}

ReplicaStore::Dims KVServer::Impl::TableDims() const {
  ReplicaStore::Dims dims;
  for (const auto& [id, t] : tables_) dims[id] = t->AsSparse() ? t->AsSparse()->dim() : 1;
  return dims;
}

}  // namespace ps
