// KVServer: replication (cluster.replication 2), both sides. See the
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

using replication::BackupLink;

// A catch-up is sent in messages of about this many bytes.
constexpr size_t kCatchUpBytes = size_t{8} << 20;
// A backup that refused a message is copied again at most this often.
constexpr absl::Duration kResyncPeriod = absl::Milliseconds(200);

bool InSlots(const std::vector<bool>& mask, uint32_t slot) {
  return slot < mask.size() && mask[slot];
}

// Moves (or, with `to` null, drops) the part of a BSP step buffer that
// belongs to the slots in `mask`. Templates, as the buffer type is private
// to KVServer.
template <typename Buffer>
void ExtractSlots(Buffer& from, const std::vector<bool>& mask, uint32_t num_slots,
                  const absl::flat_hash_map<uint32_t, uint32_t>& dims, Buffer* to) {
  for (auto& [table, b] : from.sparse) {
    const uint32_t dim = dims.at(table);
    decltype(b.keys) kept_keys;
    decltype(b.sums) kept_sums;
    decltype(b.index) kept_index;
    for (size_t i = 0; i < b.keys.size(); ++i) {
      const uint64_t key = b.keys[i];
      const double* sum = &b.sums[i * dim];
      if (InSlots(mask, SparseSlot(table, key, num_slots))) {
        if (to != nullptr) {
          auto& t = to->sparse[table];
          auto [it, inserted] =
              t.index.try_emplace(key, static_cast<uint32_t>(t.keys.size()));
          if (inserted) {
            t.keys.push_back(key);
            t.sums.resize(t.sums.size() + dim, 0.0);
          }
          double* into = &t.sums[size_t{it->second} * dim];
          for (uint32_t e = 0; e < dim; ++e) into[e] += sum[e];
        }
        continue;
      }
      kept_index.emplace(key, static_cast<uint32_t>(kept_keys.size()));
      kept_keys.push_back(key);
      kept_sums.insert(kept_sums.end(), sum, sum + dim);
    }
    b.keys = std::move(kept_keys);
    b.sums = std::move(kept_sums);
    b.index = std::move(kept_index);
  }
  for (auto& [table, b] : from.dense) {
    for (auto it = b.blocks.begin(); it != b.blocks.end();) {
      const uint64_t block = it->first;
      if (!InSlots(mask, DenseBlockSlot(table, block, num_slots))) {
        ++it;
        continue;
      }
      const auto range = b.touched[block];
      if (to != nullptr) {
        auto& t = to->dense[table];
        std::vector<double>& sums = t.blocks[block];
        if (sums.empty()) sums.assign(it->second.size(), 0.0);
        for (size_t e = 0; e < sums.size() && e < it->second.size(); ++e) {
          sums[e] += it->second[e];
        }
        auto [r, inserted] = t.touched.try_emplace(block, range);
        if (!inserted) {
          r->second.first = std::min(r->second.first, range.first);
          r->second.second = std::max(r->second.second, range.second);
        }
      }
      b.touched.erase(block);
      b.blocks.erase(it++);
    }
  }
  if (to != nullptr) to->pushers.insert(from.pushers.begin(), from.pushers.end());
}

template <typename Buffer>
bool BufferEmpty(const Buffer& b) {
  for (const auto& [table, s] : b.sparse) {
    if (!s.keys.empty()) return false;
  }
  for (const auto& [table, d] : b.dense) {
    if (!d.blocks.empty()) return false;
  }
  return true;
}

}  // namespace

// ------------------------------------------------------------ primary side

void KVServer::Impl::Forward(const Ownership& own, const RequestHeader& h,
                       ReplicaKind kind, float lr_scale, const Table& table,
                       absl::Span<const uint64_t> keys,
                       absl::Span<const float> values,
                       std::vector<zmq::message_t>& frames,
                       const std::vector<uint32_t>& slots) {
  if (slots.empty()) return;
  auto link_of = [&](uint32_t backup) -> BackupLink* {
    if (backup == kNoBackup || backup >= own.server_node.size()) return nullptr;
    auto it = links_.find(own.server_node[backup]);
    return it == links_.end() ? nullptr : it->second.get();
  };
  auto replica_header = [&]() {
    RequestHeader r = h;
    r.set_op(h.op() == ASSIGN ? ASSIGN : PUSH);
    // The frames forwarded are self-contained float32 ones (the primary
    // made them so), whatever the worker sent.
    r.clear_key_list_slot();
    r.clear_key_list_digest();
    r.clear_push_values();
    r.clear_pull_values();
    r.set_epoch(own.epoch);
    r.set_replica(true);
    ReplicaInfo* info = r.mutable_replica_info();
    info->set_kind(kind);
    info->set_primary_node_id(own.node_id);
    info->set_lr_scale(lr_scale);
    return r;
  };
  const uint32_t first = own.slot_backup[slots[0]];
  bool uniform = true;
  for (uint32_t slot : slots) uniform &= own.slot_backup[slot] == first;
  if (uniform) {
    // The usual case: every slot of the request has the same backup, which
    // gets the worker's own key and value frames (shared, not copied).
    BackupLink* link = link_of(first);
    if (link == nullptr) {
      counters_.unreplicated_pushes.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    RequestHeader r = replica_header();
    zmq::message_t k, v;
    k.copy(frames[1]);
    v.copy(frames[2]);
    needs_.emplace_back(link->node_id(), link->Send(r, std::move(k), std::move(v), true));
    counters_.forwards.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::map<uint32_t, std::vector<size_t>> groups;  // backup rank -> indices
  for (size_t i = 0; i < slots.size(); ++i) groups[own.slot_backup[slots[i]]].push_back(i);
  const SparseTable* sparse = table.AsSparse();
  // Value offset of every dense segment.
  std::vector<uint64_t> offsets;
  if (sparse == nullptr) {
    uint64_t offset = 0;
    for (const DenseSegment& s : h.segments()) {
      offsets.push_back(offset);
      offset += s.length();
    }
  }
  bool unreplicated = false;
  for (const auto& [backup, idx] : groups) {
    BackupLink* link = link_of(backup);
    if (link == nullptr) {
      unreplicated = true;
      continue;
    }
    RequestHeader r = replica_header();
    std::vector<float> v;
    zmq::message_t k;
    if (sparse != nullptr) {
      const uint32_t dim = sparse->dim();
      std::vector<uint64_t> subset;
      subset.reserve(idx.size());
      v.reserve(idx.size() * dim);
      for (size_t i : idx) {
        subset.push_back(keys[i]);
        v.insert(v.end(), values.begin() + i * dim, values.begin() + (i + 1) * dim);
      }
      r.set_num_keys(subset.size());
      k = FrameFromVector(std::move(subset));
    } else {
      r.clear_segments();
      for (size_t i : idx) {
        const DenseSegment& s = h.segments(static_cast<int>(i));
        *r.add_segments() = s;
        v.insert(v.end(), values.begin() + offsets[i],
                 values.begin() + offsets[i] + s.length());
      }
    }
    needs_.emplace_back(link->node_id(),
                        link->Send(r, std::move(k), FrameFromVector(std::move(v)), true));
    counters_.forwards.fetch_add(1, std::memory_order_relaxed);
  }
  if (unreplicated) counters_.unreplicated_pushes.fetch_add(1, std::memory_order_relaxed);
}

absl::Status KVServer::Impl::NeedsForDuplicate(const Ownership& own,
                                         const std::vector<uint32_t>& slots) {
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
    if (!link.all_acked()) needs_.emplace_back(link.node_id(), link.last_sent());
  }
  return absl::OkStatus();
}

void KVServer::Impl::SyncBackups(const Ownership& own) {
  const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
  if (paired_.size() != num_slots) paired_.assign(num_slots, 0);
  if (caught_up_.size() != num_slots) caught_up_.assign(num_slots, false);
  if (promoted_.size() != num_slots) promoted_.assign(num_slots, false);
  absl::flat_hash_map<uint64_t, std::string> endpoints;  // live server nodes
  for (size_t r = 0; r < own.server_node.size(); ++r) {
    if (own.server_node[r] != 0) endpoints[own.server_node[r]] = own.server_endpoint[r];
  }
  // The backup node each owned slot should have, and the slots whose
  // backup does not hold a copy yet.
  std::map<uint64_t, std::vector<uint32_t>> catch_up;
  absl::flat_hash_set<uint64_t> wanted;
  std::vector<uint64_t> desired(num_slots, 0);
  uint32_t unbacked = 0;
  for (uint32_t s = 0; s < num_slots; ++s) {
    if (own.slot_owner[s] != own.rank || own.node_id == 0) continue;
    const uint32_t b = own.slot_backup[s];
    if (b != kNoBackup && b != own.rank && b < own.server_node.size()) {
      desired[s] = own.server_node[b];
    }
    if (desired[s] == 0) {
      ++unbacked;
      continue;
    }
    wanted.insert(desired[s]);
  }
  // Links to servers that back nothing of this server any more go; what
  // waited for them waits for the catch-ups below instead.
  absl::flat_hash_map<uint64_t, int> orphaned;  // wait id -> needs dropped
  for (auto it = links_.begin(); it != links_.end();) {
    if (wanted.contains(it->first)) {
      ++it;
      continue;
    }
    for (const auto& [id, wait] : it->second->waiters()) ++orphaned[wait];
    Log()->info("server node {} ({}) no longer backs any slot of this server",
                it->first, it->second->endpoint());
    links_.erase(it++);
  }
  for (uint64_t node : wanted) {
    if (links_.contains(node)) continue;
    auto link = BackupLink::Connect(
        context_, node, endpoints[node],
        options_.curve.has_value() ? &*options_.curve : nullptr);
    if (!link.ok()) {
      Log()->error("{}", link.status().message());
      continue;
    }
    links_[node] = std::move(link).value();
  }
  for (uint32_t s = 0; s < num_slots; ++s) {
    const uint64_t node = links_.contains(desired[s]) ? desired[s] : 0;
    if (node != 0 && paired_[s] != node) catch_up[node].push_back(s);
    paired_[s] = node;
  }
  std::vector<Need> ends;
  for (const auto& [node, slots] : catch_up) {
    BackupLink& link = *links_[node];
    SendCatchUp(own, link, slots);
    ends.emplace_back(node, link.last_sent());
  }
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
  if (unbacked != unbacked_slots_) {
    if (unbacked > 0) {
      Log()->warn("{} of this server's slots have no backup (epoch {}): pushes to "
                  "them are acknowledged with a single copy",
                  unbacked, own.epoch);
    } else if (unbacked_slots_ > 0) {
      Log()->info("every slot of this server has a backup again (epoch {})", own.epoch);
    }
    unbacked_slots_ = unbacked;
  }
}

void KVServer::Impl::SendCatchUp(const Ownership& own, BackupLink& link,
                           const std::vector<uint32_t>& slots) {
  const absl::Time start = options_.clock->Now();
  const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
  std::vector<bool> mask(num_slots, false);
  for (uint32_t s : slots) mask[s] = true;
  auto header = [&](ReplicaKind kind) {
    RequestHeader h;
    h.set_replica(true);
    h.set_epoch(own.epoch);
    h.mutable_replica_info()->set_kind(kind);
    h.mutable_replica_info()->set_primary_node_id(own.node_id);
    return h;
  };
  RequestHeader begin = header(REPLICA_SNAPSHOT_BEGIN);
  for (uint32_t s : slots) begin.mutable_replica_info()->add_slots(s);
  RequestHeader end = begin;
  end.mutable_replica_info()->set_kind(REPLICA_SNAPSHOT_END);
  link.Send(begin, zmq::message_t(), zmq::message_t(), false);

  // Which (sender, seq) were applied: retries of pushes applied here must
  // be recognised by the backup once it is promoted.
  {
    constexpr size_t kPerMessage = 1000;
    std::vector<uint64_t> words;
    size_t senders = 0;
    auto flush = [&] {
      if (senders == 0) return;
      RequestHeader h = header(REPLICA_SEQS);
      h.set_num_keys(words.size());
      link.Send(h, FrameFromVector(std::move(words)), zmq::message_t(), false);
      words = std::vector<uint64_t>();
      senders = 0;
    };
    for (const auto& [sender, window] : seqs_) {
      words.push_back(sender);
      words.push_back(window.top());
      const std::vector<uint64_t> bits = window.Words();
      words.insert(words.end(), bits.begin(), bits.end());
      if (++senders == kPerMessage) flush();
    }
    flush();
  }

  // Rows and blocks with their optimizer state, read in one pass per table
  // while nothing else runs: a cursor over a table that changes in between
  // could miss rows.
  std::vector<uint32_t> ids;
  for (const auto& [id, table] : tables_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  uint64_t copied = 0;
  for (uint32_t id : ids) {
    std::vector<uint64_t> out_keys;
    std::vector<float> out_values;
    auto flush = [&](ReplicaKind kind) {
      if (out_keys.empty()) return;
      RequestHeader h = header(kind);
      h.set_table_id(id);
      h.set_num_keys(out_keys.size());
      copied += out_keys.size();
      link.Send(h, FrameFromVector(std::move(out_keys)),
                FrameFromVector(std::move(out_values)), true);
      out_keys = std::vector<uint64_t>();
      out_values = std::vector<float>();
    };
    if (const SparseTable* sparse = tables_[id]->AsSparse()) {
      const size_t stride = sparse->state_floats();
      std::vector<uint64_t> keys;
      std::vector<float> state;
      uint64_t cursor = 0;
      do {
        keys.clear();
        state.clear();
        cursor = sparse->ExportRows(cursor, 65536, &keys, &state);
        for (size_t i = 0; i < keys.size(); ++i) {
          if (!mask[SparseSlot(id, keys[i], num_slots)]) continue;
          out_keys.push_back(keys[i]);
          out_values.insert(out_values.end(), state.begin() + i * stride,
                            state.begin() + (i + 1) * stride);
          if (out_values.size() * sizeof(float) >= kCatchUpBytes) flush(REPLICA_ROWS);
        }
      } while (cursor != 0);
      flush(REPLICA_ROWS);
    } else {
      const DenseTable* dense = tables_[id]->AsDense();
      (void)dense->ForEachBlock([&](uint64_t block, absl::Span<const float> values,
                                    absl::Span<const float> state) {
        if (!mask[DenseBlockSlot(id, block, num_slots)]) return absl::OkStatus();
        out_keys.push_back(block);
        out_values.insert(out_values.end(), values.begin(), values.end());
        out_values.insert(out_values.end(), state.begin(), state.end());
        if (out_values.size() * sizeof(float) >= kCatchUpBytes) flush(REPLICA_BLOCKS);
        return absl::OkStatus();
      });
      flush(REPLICA_BLOCKS);
    }
  }

  // BSP steps buffered and not yet applied: the backup applies them with
  // this server when it is told the divisor.
  for (auto& [step, buffer] : buffers_) {
    std::vector<uint64_t> pushers(buffer.pushers.begin(), buffer.pushers.end());
    for (auto& [id, b] : buffer.sparse) {
      const uint32_t dim = tables_[id]->AsSparse()->dim();
      std::vector<uint64_t> keys;
      std::vector<double> sums;
      for (size_t i = 0; i < b.keys.size(); ++i) {
        if (!mask[SparseSlot(id, b.keys[i], num_slots)]) continue;
        keys.push_back(b.keys[i]);
        sums.insert(sums.end(), b.sums.begin() + i * dim, b.sums.begin() + (i + 1) * dim);
      }
      if (keys.empty()) continue;
      RequestHeader h = header(REPLICA_STEP_BUFFER);
      h.set_table_id(id);
      h.set_num_keys(keys.size());
      h.mutable_replica_info()->set_step(step);
      for (uint64_t p : pushers) h.mutable_replica_info()->add_pushers(p);
      link.Send(h, FrameFromVector(std::move(keys)), FrameFromVector(std::move(sums)), true);
    }
    for (auto& [id, b] : buffer.dense) {
      std::vector<uint64_t> triples;
      std::vector<double> sums;
      std::vector<uint64_t> blocks;
      for (const auto& [block, s] : b.blocks) blocks.push_back(block);
      std::sort(blocks.begin(), blocks.end());
      for (uint64_t block : blocks) {
        if (!mask[DenseBlockSlot(id, block, num_slots)]) continue;
        const auto range = b.touched[block];
        triples.insert(triples.end(), {block, range.first, range.second});
        const std::vector<double>& s = b.blocks[block];
        sums.insert(sums.end(), s.begin(), s.end());
      }
      if (triples.empty()) continue;
      RequestHeader h = header(REPLICA_STEP_BUFFER);
      h.set_table_id(id);
      h.set_num_keys(triples.size());
      h.mutable_replica_info()->set_step(step);
      for (uint64_t p : pushers) h.mutable_replica_info()->add_pushers(p);
      link.Send(h, FrameFromVector(std::move(triples)), FrameFromVector(std::move(sums)), true);
    }
  }
  link.Send(end, zmq::message_t(), zmq::message_t(), false);
  counters_.catchups_sent.fetch_add(1, std::memory_order_relaxed);
  counters_.rows_copied.fetch_add(copied, std::memory_order_relaxed);
  Log()->info("catch-up of {} slots to backup node {} ({}): {} rows and blocks, "
              "{} senders' sequence records, {} buffered steps, read in {:.1f} ms",
              slots.size(), link.node_id(), link.endpoint(), copied, seqs_.size(),
              buffers_.size(), absl::ToDoubleMilliseconds(options_.clock->Now() - start));
}

void KVServer::Impl::OnBackupAnswer(uint64_t node, std::vector<zmq::message_t>& frames) {
  auto it = links_.find(node);
  if (it == links_.end()) return;
  BackupLink& link = *it->second;
  DecodedResponse response;
  if (absl::Status s = DecodeResponse(frames, &response); !s.ok()) {
    Log()->error("bad answer from backup node {}: {}", node, s.message());
    return;
  }
  const uint64_t id = response.header.request_id();
  if (id == 0 || id > link.last_sent() || id <= link.acked()) {
    Log()->warn("backup node {} answered message {} out of order (sent {}, answered {})",
                node, id, link.last_sent(), link.acked());
    return;
  }
  const bool ok = response.header.code() == 0;
  if (!ok) {
    // The backup's copy may now lack an update: copy its slots again, and
    // let the workers concerned send again (as duplicates, answered once
    // the new copy is in).
    if (!link.resync) {
      Log()->warn("backup node {} refused replica message {}: {}; copying its "
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
}

void KVServer::Impl::ReleaseWait(uint64_t wait_id) {
  auto it = waits_.find(wait_id);
  if (it == waits_.end()) return;
  Wait w = std::move(it->second);
  waits_.erase(it);
  if (w.failed) {
    NotAcknowledged(&w.rh, &w.values, &w.keys,
                    absl::StrCat("the backup did not take its copy (", w.error, ")"));
  }
  Send(w.identity, w.rh, w.values, w.keys);
  if (!w.failed && w.first_promoted) LogFirstPromotedServed();
}

void KVServer::Impl::MaybeResync(const Ownership& own) {
  const absl::Time now = options_.clock->Now();
  for (auto& [node, link] : links_) {
    if (!link->resync || now - link->last_resync < kResyncPeriod) continue;
    std::vector<uint32_t> slots;
    for (uint32_t s = 0; s < paired_.size(); ++s) {
      if (paired_[s] == node) slots.push_back(s);
    }
    link->resync = false;
    link->last_resync = now;
    if (!slots.empty()) SendCatchUp(own, *link, slots);
  }
}

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
    const uint64_t bytes = FramesBytes(frames);
    if (!MayHold(bytes)) {
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
      if (h.seq() != 0) {
        SeqWindow& w = replica_seqs_[primary][h.sender_node_id()];
        if (w.Test(h.seq()) == SeqWindow::Check::kDuplicate) {
          rh->set_duplicate(true);
          return absl::OkStatus();
        }
        w.Record(h.seq());
      }
      if (r.kind() == REPLICA_APPLY && h.op() == PUSH && h.clock() < kFinishedClock) {
        max_replica_push_step_ = std::max(max_replica_push_step_, h.clock());
      }
      if (r.kind() == REPLICA_BUFFER) {
        BufferInto(replica_buffers_[primary][h.clock()], h.sender_node_id(), table,
                   m.keys, h.segments(), m.floats);
      } else if (h.op() == ASSIGN) {
        dense->Assign(h.segments(), m.floats.data());
      } else if (sparse != nullptr) {
        sparse->Push(m.keys, m.floats.data(), scale);
      } else {
        dense->Push(h.segments(), m.floats.data(), scale);
      }
      replica_keys_[h.table_id()] += sparse != nullptr ? m.keys.size() : n;
      return absl::OkStatus();
    }
    case REPLICA_APPLY_STEP: {
      if (r.divisor() == 0) return absl::InvalidArgumentError("divisor 0");
      auto buffers = replica_buffers_.find(primary);
      if (buffers == replica_buffers_.end()) return absl::OkStatus();
      auto step = buffers->second.find(r.step());
      if (step == buffers->second.end()) return absl::OkStatus();
      ApplyBuffered(r.step(), step->second, r.divisor());
      buffers->second.erase(step);
      return absl::OkStatus();
    }
    case REPLICA_SNAPSHOT_BEGIN:
    case REPLICA_SNAPSHOT_END: {
      for (uint32_t slot : r.slots()) PS_RETURN_IF_ERROR(check_slot(slot));
      if (caught_up_.size() != num_slots) caught_up_.assign(num_slots, false);
      const bool begin = r.kind() == REPLICA_SNAPSHOT_BEGIN;
      for (uint32_t slot : r.slots()) caught_up_[slot] = !begin;
      if (begin) {
        // What was buffered of these slots before is in the copy that follows.
        std::vector<bool> mask(num_slots, false);
        for (uint32_t slot : r.slots()) mask[slot] = true;
        absl::flat_hash_map<uint32_t, uint32_t> dims;
        for (const auto& [id, t] : tables_) dims[id] = t->AsSparse() ? t->AsSparse()->dim() : 1;
        auto buffers = replica_buffers_.find(primary);
        if (buffers != replica_buffers_.end()) {
          for (auto& [step, buffer] : buffers->second) {
            ExtractSlots(buffer, mask, num_slots, dims, static_cast<StepBuffer*>(nullptr));
          }
        }
      } else {
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
      auto& windows = replica_seqs_[primary];
      for (size_t i = 0; i < m.keys.size(); i += kEntry) {
        PS_ASSIGN_OR_RETURN(SeqWindow w,
                            SeqWindow::FromWords(m.keys[i + 1],
                                                 m.keys.subspan(i + 2, SeqWindow::kWords)));
        windows[m.keys[i]].Merge(w);
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
        StepBuffer& buffer = replica_buffers_[primary][r.step()];
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
      StepBuffer& buffer = replica_buffers_[primary][r.step()];
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
  if (caught_up_.size() != num_slots) caught_up_.assign(num_slots, false);
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
    incomplete += !caught_up_[s];
    promoted_[s] = true;
  }
  if (without_copy > 0) {
    Log()->warn("{} slots are now served here without a copy of them from their "
                "old primary (epoch {})",
                without_copy, own.epoch);
  }
  if (count == 0) return;
  absl::flat_hash_map<uint32_t, uint32_t> dims;
  for (const auto& [id, t] : tables_) dims[id] = t->AsSparse() ? t->AsSparse()->dim() : 1;
  uint64_t merged_steps = 0, applied_steps = 0;
  for (auto& [node, mask] : from) {
    // Retries of pushes the old primary applied and copied here must be
    // answered as duplicates.
    auto windows = replica_seqs_.find(node);
    if (windows != replica_seqs_.end()) {
      for (const auto& [sender, w] : windows->second) seqs_[sender].Merge(w);
    }
    auto buffers = replica_buffers_.find(node);
    if (buffers == replica_buffers_.end()) continue;
    for (auto& [step, buffer] : buffers->second) {
      StepBuffer moved;
      ExtractSlots(buffer, mask, num_slots, dims, &moved);
      if (BufferEmpty(moved)) continue;
      if (consistency_.ShouldBuffer(step)) {
        // Joins this server's own step, applied with it.
        consistency_.NoteBuffered(step);
        ExtractSlots(moved, std::vector<bool>(num_slots, true), num_slots, dims,
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
    }
  }
  // Checkpoints: the promoted rows hold pushes of steps up to this.
  if (max_replica_push_step_ > 0) {
    max_applied_push_step_ = std::max(max_applied_push_step_, max_replica_push_step_);
    any_push_applied_ = true;
  }
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

void KVServer::Impl::DropDeadPrimaries(const Ownership& own) {
  absl::flat_hash_set<uint64_t> live(own.server_node.begin(), own.server_node.end());
  auto drop = [&](auto& map) {
    for (auto it = map.begin(); it != map.end();) {
      if (!live.contains(it->first)) {
        map.erase(it++);
      } else {
        ++it;
      }
    }
  };
  // Held messages stay: they may come from a primary this view does not
  // know yet; ReleaseReplicas refuses those of dead ones.
  drop(replica_seqs_);
  drop(replica_buffers_);
}

}  // namespace ps
