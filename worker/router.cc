#include "worker/router.h"

#include <algorithm>

#include "common/hash.h"

namespace ps {
namespace kv_internal {

uint32_t SparseOwner(absl::Span<const uint32_t> slot_owner, uint32_t table,
                     uint64_t key) {
  return slot_owner[SparseSlot(table, key,
                               static_cast<uint32_t>(slot_owner.size()))];
}

uint32_t DenseOwner(absl::Span<const uint32_t> slot_owner, uint32_t table,
                    uint64_t block_size, uint64_t pos) {
  return slot_owner[DenseBlockSlot(table, pos / block_size,
                                   static_cast<uint32_t>(slot_owner.size()))];
}

std::vector<uint32_t> SparseSplit::Servers() const {
  std::vector<uint32_t> servers;
  for (uint32_t s = 0; s < counts.size(); ++s) {
    if (counts[s] > 0) servers.push_back(s);
  }
  return servers;
}

std::vector<uint32_t> SparseSplit::IndicesOf(uint32_t server) const {
  std::vector<uint32_t> idx;
  idx.reserve(counts[server]);
  for (size_t i = 0; i < owners.size(); ++i) {
    if (owners[i] == server) idx.push_back(static_cast<uint32_t>(i));
  }
  return idx;
}

SparseSplit SplitSparse(absl::Span<const uint32_t> slot_owner,
                        int64_t sole_owner, uint32_t num_servers,
                        uint32_t table, absl::Span<const uint64_t> keys) {
  SparseSplit split;
  split.counts.assign(num_servers, 0);
  if (keys.empty()) return split;
  if (sole_owner >= 0 && static_cast<uint64_t>(sole_owner) < num_servers) {
    split.counts[sole_owner] = static_cast<uint32_t>(keys.size());
    return split;
  }
  // Four sets of counters, taken in turn: with one, consecutive keys of the
  // same server each waited for the previous increment of the same counter
  // in memory (the loop's cost, by perf).
  const uint32_t num_slots = static_cast<uint32_t>(slot_owner.size());
  split.owners.resize(keys.size());
  std::vector<uint32_t> counts4(4 * static_cast<size_t>(num_servers), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t owner = slot_owner[SparseSlot(table, keys[i], num_slots)];
    split.owners[i] = owner;
    ++counts4[(i & 3) * num_servers + owner];
  }
  for (size_t k = 0; k < 4; ++k) {
    for (size_t s = 0; s < num_servers; ++s)
      split.counts[s] += counts4[k * num_servers + s];
  }
  return split;
}

std::vector<uint32_t> DenseSplit::Servers() const {
  std::vector<uint32_t> servers;
  for (uint32_t s = 0; s < totals.size(); ++s) {
    if (totals[s] > 0) servers.push_back(s);
  }
  return servers;
}

DenseSplit SplitDense(absl::Span<const uint32_t> slot_owner,
                      uint32_t num_servers, uint32_t table, uint64_t block_size,
                      absl::Span<const DenseRange> ranges) {
  DenseSplit split;
  split.totals.assign(num_servers, 0);
  split.first.assign(num_servers, 0);
  split.contiguous.assign(num_servers, true);
  // Where each server's last piece ended, to tell whether the next one
  // follows it.
  std::vector<uint64_t> next(num_servers, 0);
  uint64_t offset = 0;
  for (uint32_t r = 0; r < ranges.size(); ++r) {
    const uint64_t begin = ranges[r].begin;
    const uint64_t end_of_range = begin + ranges[r].length;
    // Each block lives in one slot.
    for (uint64_t pos = begin; pos < end_of_range;) {
      const uint64_t block = pos / block_size;
      const uint64_t end = std::min(end_of_range, (block + 1) * block_size);
      DensePiece piece;
      piece.begin = pos;
      piece.length = end - pos;
      piece.owner = DenseOwner(slot_owner, table, block_size, pos);
      piece.source = r;
      piece.offset = offset;
      const uint32_t s = piece.owner;
      if (split.totals[s] == 0) {
        split.first[s] = offset;
      } else if (next[s] != offset) {
        split.contiguous[s] = false;
      }
      next[s] = offset + piece.length;
      split.totals[s] += piece.length;
      split.pieces.push_back(piece);
      offset += piece.length;
      pos = end;
    }
  }
  return split;
}

}  // namespace kv_internal
}  // namespace ps
