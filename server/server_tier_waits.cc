// KVServer's waits for disk-tier reads: a request whose keys have rows on
// disk is put aside while the table's ColdReader reads them, and handled
// once they are staged, so the serving thread never waits for the disk on
// its behalf. A sender's later messages wait behind it, in order: under
// BSP its ADVANCE_CLOCK must not complete a step its push belongs to.
#include <algorithm>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "common/wire.h"
#include "server/server_impl.h"

namespace ps {

namespace {

bool IsPrefetch(const std::vector<zmq::message_t>& frames) {
  RequestHeader h;
  return !frames.empty() &&
         h.ParseFromArray(frames[0].data(),
                          static_cast<int>(frames[0].size())) &&
         h.op() == PREFETCH;
}

}  // namespace

uint64_t KVServer::Impl::ColdWaitOf(std::vector<zmq::message_t>& frames,
                                    SparseTable** table) {
  if (frames.empty()) return 0;
  RequestHeader h;
  if (!h.ParseFromArray(frames[0].data(), static_cast<int>(frames[0].size())))
    return 0;
  // A primary's update forwarded to this backup, or a catch-up's rows,
  // waits for its cold rows like a worker's push (behind it, the
  // primary's later messages).
  const ReplicaKind kind =
      h.replica() ? h.replica_info().kind() : REPLICA_KIND_UNSPECIFIED;
  if (h.replica() ? kind != REPLICA_APPLY && kind != REPLICA_ROWS
                  : h.op() != PUSH && h.op() != PULL && h.op() != PUSH_PULL) {
    return 0;
  }
  const auto it = tables_.find(h.table_id());
  if (it == tables_.end()) return 0;
  SparseTable* sparse = it->second->AsSparse();
  if (sparse == nullptr || sparse->cold_reader() == nullptr) return 0;
  if (h.replica()) {
    replication::ReplicaMessage m;
    if (!replication::DecodeReplica(frames, &m).ok()) return 0;
    *table = sparse;
    return sparse->ColdWait(m.keys);
  }
  // Decoded in full only now (values included): requests of other tables
  // pay for the header alone.
  DecodedRequest req;
  if (!DecodeRequest(frames, &req).ok()) return 0;
  absl::Span<const uint64_t> keys = req.keys;
  if (req.keys_cached) {
    // Looked up only: Admit stores and finds lists when the request runs.
    const KeyListCache::List* list =
        key_cache_.Find(h.sender_node_id(), h.key_list_slot(),
                        h.key_list_digest(), h.num_keys());
    if (list == nullptr) return 0;
    keys = absl::MakeConstSpan(list->keys);
  }
  *table = sparse;
  return sparse->ColdWait(keys);
}

bool KVServer::Impl::WaitForColdRows(zmq::message_t& identity,
                                     std::vector<zmq::message_t>& frames) {
  std::string sender(identity.data<char>(), identity.size());
  const auto waiting = tier_waits_.senders.find(sender);
  SparseTable* table = nullptr;
  uint64_t batch = 0;
  if (waiting == tier_waits_.senders.end()) {
    batch = ColdWaitOf(frames, &table);
    if (batch == 0) return false;
  } else if (IsPrefetch(frames)) {
    return false;  // a hint need not wait for the sender's requests
  }
  TierWait wait;
  wait.table = table;
  wait.batch = batch;
  wait.since = options_.clock->Now();
  wait.bytes = Admission::FramesBytes(frames);
  wait.identity = std::move(identity);
  wait.frames = std::move(frames);
  counters_.held_bytes += wait.bytes;
  counters_.tier_waits.fetch_add(1, std::memory_order_relaxed);
  tier_waits_.senders[sender].push_back(std::move(wait));
  return true;
}

void KVServer::Impl::PinColdRows(std::vector<zmq::message_t>& frames,
                                 bool pin) {
  DecodedRequest req;
  if (!DecodeRequest(frames, &req).ok()) return;
  const auto it = tables_.find(req.header.table_id());
  if (it == tables_.end()) return;
  SparseTable* sparse = it->second->AsSparse();
  if (sparse == nullptr) return;
  if (pin) {
    sparse->PinColdReads(req.keys);
  } else {
    sparse->UnpinColdReads(req.keys);
  }
}

void KVServer::Impl::ReleaseTierWaits(const Ownership& own) {
  tier_waits_.wake.Clear();
  // One batch at a time, its requests handled before the next is staged:
  // staging a later batch may drop an earlier one's rows (the cap).
  for (SparseTable* table : tiered_) {
    while (table->InstallColdReads()) {
      HandleReadyTierWaits(own);
      table->TrimColdReads();
    }
  }
}

void KVServer::Impl::HandleReadyTierWaits(const Ownership& own) {
  // Handling a request can add waits: Progress may write a checkpoint and
  // run again the requests its gate held, and one whose rows went back to
  // disk meanwhile waits in WaitForColdRows, which may grow the map and
  // move every queue. So no iterator or reference into the map is kept
  // across a request: each sender's queue is looked up afresh.
  std::vector<std::string> senders;
  senders.reserve(tier_waits_.senders.size());
  for (const auto& [sender, queue] : tier_waits_.senders) {
    senders.push_back(sender);
  }
  for (const std::string& sender : senders) {
    for (;;) {
      const auto it = tier_waits_.senders.find(sender);
      if (it == tier_waits_.senders.end()) break;
      std::deque<TierWait>& queue = it->second;
      if (queue.empty()) {
        tier_waits_.senders.erase(it);
        break;
      }
      TierWait& first = queue.front();
      if (first.table == nullptr) {
        // It waited behind its sender's earlier request: its own rows may
        // have to be read now.
        first.batch = ColdWaitOf(first.frames, &first.table);
        if (first.batch != 0) break;
      } else if (first.table->cold_reader()->installed() < first.batch) {
        break;
      }
      TierWait ready = std::move(first);
      queue.pop_front();
      counters_.held_bytes -= ready.bytes;
      const absl::Duration waited = options_.clock->Now() - ready.since;
      counters_.tier_wait_micros.fetch_add(
          static_cast<uint64_t>(
              std::max<int64_t>(0, absl::ToInt64Microseconds(waited))),
          std::memory_order_relaxed);
      // The sender's (possibly empty) queue stays while its request is
      // handled, so what it sends meanwhile queues behind it.
      if (HandleMessage(std::move(ready.identity), std::move(ready.frames), own,
                        /*tier_checked=*/true)) {
        Progress(own);
      }
    }
  }
}

}  // namespace ps
