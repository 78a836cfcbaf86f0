#include "server/replica_store.h"

#include <utility>

namespace ps {

using replication::SeqWindow;

namespace {

// Erases the entries of `map` whose key `keep` rejects.
template <typename Map, typename Keep> void EraseIfNot(Map &map, Keep keep) {
  for (auto it = map.begin(); it != map.end();) {
    if (!keep(it->first)) {
      map.erase(it++);
    } else {
      ++it;
    }
  }
}

} // namespace

void ReplicaStore::SizeSlots(uint32_t num_slots) {
  if (caught_up_.size() != num_slots)
    caught_up_.assign(num_slots, false);
}

bool ReplicaStore::SeenOrRecord(uint64_t primary, uint64_t sender,
                                uint64_t seq) {
  if (seq == 0)
    return false;
  SeqWindow &w = seqs_[primary][sender];
  if (w.Test(seq) == SeqWindow::Check::kDuplicate)
    return true;
  w.Record(seq);
  return false;
}

void ReplicaStore::MergeSeqs(uint64_t primary, uint64_t sender,
                             const SeqWindow &window) {
  seqs_[primary][sender].Merge(window);
}

StepBuffer &ReplicaStore::Buffer(uint64_t primary, uint64_t step) {
  return buffers_[primary][step];
}

bool ReplicaStore::TakeStep(uint64_t primary, uint64_t step, StepBuffer *out) {
  auto buffers = buffers_.find(primary);
  if (buffers == buffers_.end())
    return false;
  auto it = buffers->second.find(step);
  if (it == buffers->second.end())
    return false;
  *out = std::move(it->second);
  buffers->second.erase(it);
  return true;
}

size_t ReplicaStore::buffered_steps(uint64_t primary) const {
  auto it = buffers_.find(primary);
  return it == buffers_.end() ? 0 : it->second.size();
}

void ReplicaStore::BeginCatchUp(uint64_t primary,
                                absl::Span<const uint32_t> slots,
                                const Dims &dims) {
  const uint32_t num_slots = static_cast<uint32_t>(caught_up_.size());
  std::vector<bool> mask(num_slots, false);
  for (uint32_t slot : slots) {
    if (slot >= num_slots)
      continue;
    caught_up_[slot] = false;
    mask[slot] = true;
  }
  auto buffers = buffers_.find(primary);
  if (buffers == buffers_.end())
    return;
  for (auto &[step, buffer] : buffers->second) {
    buffer.ExtractSlots(mask, num_slots, dims, nullptr);
  }
}

void ReplicaStore::EndCatchUp(absl::Span<const uint32_t> slots) {
  for (uint32_t slot : slots) {
    if (slot < caught_up_.size())
      caught_up_[slot] = true;
  }
}

bool ReplicaStore::caught_up(uint32_t slot) const {
  return slot < caught_up_.size() && caught_up_[slot];
}

uint64_t ReplicaStore::applied(uint32_t table) const {
  auto it = applied_.find(table);
  return it == applied_.end() ? 0 : it->second;
}

void ReplicaStore::TakeOver(
    uint64_t primary, const std::vector<bool> &mask, uint32_t num_slots,
    const Dims &dims, Windows *seqs,
    absl::FunctionRef<void(uint64_t, StepBuffer &&)> each) {
  // Retries of pushes the old primary applied and copied here must be
  // answered as duplicates.
  auto windows = seqs_.find(primary);
  if (windows != seqs_.end()) {
    for (const auto &[sender, w] : windows->second)
      (*seqs)[sender].Merge(w);
  }
  auto buffers = buffers_.find(primary);
  if (buffers == buffers_.end())
    return;
  for (auto &[step, buffer] : buffers->second) {
    StepBuffer moved;
    buffer.ExtractSlots(mask, num_slots, dims, &moved);
    if (moved.Empty())
      continue;
    each(step, std::move(moved));
  }
}

void ReplicaStore::Retain(const absl::flat_hash_set<uint64_t> &live_servers,
                          const absl::flat_hash_set<uint64_t> &live_workers) {
  auto server_live = [&](uint64_t node) { return live_servers.contains(node); };
  EraseIfNot(seqs_, server_live);
  EraseIfNot(buffers_, server_live);
  for (auto &[primary, windows] : seqs_) {
    EraseIfNot(windows,
               [&](uint64_t node) { return live_workers.contains(node); });
  }
}

} // namespace ps
