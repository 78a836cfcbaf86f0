#include "server/slot_digest.h"

#include <algorithm>
#include <cstring>

#include "common/hash.h"
#include "server/server_log.h"
#include "server/table_rows.h"

namespace ps {

// Every float's bits in order, after the table and key.
uint64_t RowHash(uint32_t table, uint64_t key, absl::Span<const float> values,
                 absl::Span<const float> state) {
  uint64_t h = HashCombine(Mix64(table), key);
  auto add = [&h](absl::Span<const float> floats) {
    for (float f : floats) {
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof(bits));
      h = Mix64(h ^ bits);
    }
  };
  add(values);
  add(state);
  return h;
}

SlotDigest DigestSlots(const TableMap& tables, const std::vector<bool>& mask) {
  SlotDigest d;
  if (mask.empty()) return d;
  for (const auto& [id, table] : tables) {
    const bool sparse = table->AsSparse() != nullptr;
    const absl::Status read = ForEachTableRow(
        *table, 4096,
        [&, id = id](uint64_t row, absl::Span<const float> values,
                     absl::Span<const float> state) {
          d.digest += RowHash(id, row, values, state);
          ++d.rows;
          d.bytes += (values.size() + state.size()) * sizeof(float) +
                     (sparse ? sizeof(uint64_t) : 0);
        },
        &mask);
    if (!read.ok()) ServerLog()->error("digest of table {}: {}", id, read);
  }
  return d;
}

std::vector<uint64_t> SlotBytes(const TableMap& tables, uint32_t num_slots) {
  SlotBytesScan scan(tables, num_slots);
  while (!scan.Step(tables, ~size_t{0})) {
  }
  return scan.TakeBytes();
}

SlotBytesScan::SlotBytesScan(const TableMap& tables, uint32_t num_slots)
    : num_slots_(num_slots), bytes_(num_slots, 0) {
  for (const auto& [id, table] : tables) ids_.push_back(id);
  std::sort(ids_.begin(), ids_.end());
}

bool SlotBytesScan::Step(const TableMap& tables, size_t max_positions) {
  if (num_slots_ == 0) return true;
  while (table_ < ids_.size()) {
    const uint32_t id = ids_[table_];
    auto it = tables.find(id);
    if (it == tables.end()) {  // gone since the scan began
      ++table_;
      continue;
    }
    if (const SparseTable* sparse = it->second->AsSparse()) {
      const uint64_t row =
          sparse->state_floats() * sizeof(float) + sizeof(uint64_t);
      cursor_ =
          sparse->ForEachKeyFrom(cursor_, max_positions, [&](uint64_t key) {
            bytes_[SparseSlot(id, key, num_slots_)] += row;
          });
      if (cursor_ == 0) {
        // A disk tier counts its rows per slot as it goes.
        const DiskTier* tier = sparse->disk_tier();
        if (tier != nullptr && tier->num_slots() == num_slots_) {
          for (uint32_t s = 0; s < num_slots_; ++s)
            bytes_[s] += tier->slot_rows(s) * row;
        }
        ++table_;
      }
      return table_ >= ids_.size();
    }
    const DenseTable* dense = it->second->AsDense();
    const uint64_t per_element =
        (1 + static_cast<uint64_t>(dense->state_size())) * sizeof(float);
    dense
        ->ForEachBlock([&](uint64_t block, absl::Span<const float>,
                           absl::Span<const float>) {
          bytes_[DenseBlockSlot(id, block, num_slots_)] +=
              dense->BlockLength(block) * per_element;
          return absl::OkStatus();
        })
        .IgnoreError();
    ++table_;
    return table_ >= ids_.size();
  }
  return true;
}

SlotKeyWalk::SlotKeyWalk(const TableMap& tables, std::vector<bool> mask)
    : mask_(std::move(mask)) {
  for (const auto& [id, table] : tables) {
    Keys k;
    k.table = id;
    k.sparse = table->AsSparse() != nullptr;
    keys_.push_back(std::move(k));
  }
  std::sort(keys_.begin(), keys_.end(),
            [](const Keys& a, const Keys& b) { return a.table < b.table; });
}

bool SlotKeyWalk::Step(const TableMap& tables, size_t max_positions) {
  const uint32_t num_slots = static_cast<uint32_t>(mask_.size());
  while (max_positions > 0 && !done()) {
    Keys& out = keys_[table_];
    auto it = tables.find(out.table);
    if (it == tables.end() || num_slots == 0) {  // gone since the walk began
      out.keys.clear();
      ++table_;
      continue;
    }
    const uint32_t id = out.table;
    if (const SparseTable* sparse = it->second->AsSparse()) {
      const bool moved = passes_ > 0 &&
                         (sparse->index_capacity() != capacity_ ||
                          sparse->generation() != generation_);
      if (passes_ == 0 || moved) {
        if (moved) ++restarts_;
        out.keys.clear();
        cursor_ = 0;
        ++passes_;
        capacity_ = sparse->index_capacity();
        generation_ = sparse->generation();
      }
      auto take = [&, id](uint64_t key) {
        if (mask_[SparseSlot(id, key, num_slots)]) out.keys.push_back(key);
      };
      // A table with a disk tier is listed in one go: a row promoted from
      // disk into a position the pass went by would be in neither list.
      if (passes_ > kMaxPasses || sparse->disk_tier() != nullptr) {
        sparse->ForEachKey(take);
        max_positions = 0;
      } else {
        const size_t from = cursor_;
        cursor_ = sparse->ForEachKeyFrom(cursor_, max_positions, take);
        if (cursor_ != 0) return false;  // this step's positions are spent
        max_positions -= std::min(max_positions, capacity_ - from);
      }
      // The rows on its disk tier, at the same moment: a key is in one of
      // the two lists. A failed read is the table's tier failure, which
      // stops the server.
      sparse
          ->ExportColdRows(
              4096,
              [&](absl::Span<const uint64_t> keys, absl::Span<const float>) {
                for (uint64_t key : keys) take(key);
                return absl::OkStatus();
              },
              &mask_)
          .IgnoreError();
    } else {
      it->second->AsDense()
          ->ForEachBlock([&](uint64_t block, absl::Span<const float>,
                             absl::Span<const float>) {
            if (mask_[DenseBlockSlot(id, block, num_slots)])
              out.keys.push_back(block);
            return absl::OkStatus();
          })
          .IgnoreError();
    }
    ++table_;
    passes_ = 0;
  }
  return done();
}

void SlotKeyWalk::Finish(const TableMap& tables) {
  while (!Step(tables, ~size_t{0})) {
  }
}

uint64_t DropSlots(TableMap& tables, const std::vector<bool>& mask) {
  const uint32_t num_slots = static_cast<uint32_t>(mask.size());
  uint64_t dropped = 0;
  if (num_slots == 0) return dropped;
  for (auto& [id, table] : tables) {
    if (SparseTable* sparse = table->AsSparse()) {
      dropped += sparse->DropRows([&, id = id](uint64_t key) {
        return mask[SparseSlot(id, key, num_slots)];
      });
      dropped += sparse->DropColdSlots(mask);
    } else {
      dropped += table->AsDense()->DropBlocks([&, id = id](uint64_t block) {
        return mask[DenseBlockSlot(id, block, num_slots)];
      });
    }
  }
  return dropped;
}

SlotDrop::SlotDrop(const TableMap& tables, std::vector<bool> mask)
    : mask_(std::move(mask)) {
  Restart(tables);
}

void SlotDrop::Restart(const TableMap& tables) {
  ids_.clear();
  for (const auto& [id, table] : tables) ids_.push_back(id);
  std::sort(ids_.begin(), ids_.end());
  table_ = 0;
  current_ = nullptr;
}

void SlotDrop::Add(const TableMap& tables, const std::vector<bool>& mask) {
  for (size_t s = 0; s < mask.size() && s < mask_.size(); ++s) {
    if (mask[s]) mask_[s] = true;
  }
  // Every table again, the one in progress included: the tables done so
  // far may hold rows of the added slots.
  Restart(tables);
}

bool SlotDrop::StepSparse(uint32_t id, SparseTable* sparse,
                          size_t max_positions) {
  const uint32_t num_slots = static_cast<uint32_t>(mask_.size());
  if (current_ != sparse || capacity_ != sparse->index_capacity()) {
    // A new table, or its index grew (every position moved): a fresh pass.
    current_ = sparse;
    cursor_ = 0;
    passes_ = 0;
    clean_ = true;
    key_of_.clear();
  } else if (generation_ != sparse->generation()) {
    clean_ = false;  // rows dropped in between may have shifted positions
    key_of_.clear();
  }
  if (passes_ >= kMaxPasses) {
    dropped_ += sparse->DropRows(
        [&](uint64_t key) { return mask_[SparseSlot(id, key, num_slots)]; });
    dropped_ += sparse->DropColdSlots(mask_);
    current_ = nullptr;
    key_of_ = std::vector<uint64_t>();
    return true;
  }
  size_t dropped = 0;
  cursor_ = sparse->DropRowsFrom(
      cursor_, max_positions,
      [&](uint64_t key) { return mask_[SparseSlot(id, key, num_slots)]; },
      &key_of_, &dropped);
  dropped_ += dropped;
  if (dropped > 0) clean_ = false;
  generation_ = sparse->generation();
  capacity_ = sparse->index_capacity();
  if (cursor_ != 0) return false;
  if (clean_) {
    // Last, the rows on disk: rows of these slots evicted from RAM during
    // the passes went there.
    dropped_ += sparse->DropColdSlots(mask_);
    current_ = nullptr;
    key_of_ = std::vector<uint64_t>();
    return true;
  }
  ++passes_;
  clean_ = true;
  return false;
}

bool SlotDrop::Step(TableMap& tables, size_t max_positions) {
  // No position looked at must not read as a pass that dropped nothing.
  if (max_positions == 0) return Done();
  const uint32_t num_slots = static_cast<uint32_t>(mask_.size());
  while (table_ < ids_.size()) {
    auto it = tables.find(ids_[table_]);
    if (it == tables.end() || num_slots == 0) {  // gone since the drop began
      ++table_;
      continue;
    }
    const uint32_t id = it->first;
    if (SparseTable* sparse = it->second->AsSparse()) {
      if (StepSparse(id, sparse, max_positions)) ++table_;
      return Done();
    }
    dropped_ += it->second->AsDense()->DropBlocks([&](uint64_t block) {
      return mask_[DenseBlockSlot(id, block, num_slots)];
    });
    ++table_;
    return Done();
  }
  return true;
}

}  // namespace ps
