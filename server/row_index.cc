#include "server/row_index.h"

#include <algorithm>

namespace ps {
namespace {

// A mix unrelated to the slot-routing hash (common/hash.h): a server holds
// only keys whose routing hash falls in its slots, so reusing that hash
// here would crowd its keys into part of the index.
inline uint64_t IndexHash(uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdULL;
  key ^= key >> 33;
  key *= 0xc4ceb9fe1a85ec53ULL;
  key ^= key >> 33;
  return key;
}

constexpr size_t kMinCapacity = 8;

}  // namespace

size_t RowIndex::CapacityFor(size_t n) {
  // Smallest c with n <= c * kLoadNum / kLoadDen.
  return std::max(kMinCapacity, (n * kLoadDen + kLoadNum - 1) / kLoadNum);
}

size_t RowIndex::Home(uint64_t key) const {
  return static_cast<size_t>(
      (static_cast<unsigned __int128>(IndexHash(key)) * capacity_) >> 64);
}

uint32_t RowIndex::Find(uint64_t key) const {
  if (size_ == 0) return kNotFound;
  size_t i = Home(key);
  while (rows_[i] != kNotFound) {
    if (keys_[i] == key) return rows_[i];
    if (++i == capacity_) i = 0;
  }
  return kNotFound;
}

void RowIndex::Prefetch(uint64_t key) const {
  if (capacity_ == 0) return;
  const size_t i = Home(key);
  __builtin_prefetch(&keys_[i]);
  __builtin_prefetch(&rows_[i]);
}

void RowIndex::Insert(uint64_t key, uint32_t row) {
  if ((size_ + 1) * kLoadDen > capacity_ * kLoadNum) {
    // Double, but never past what the largest allowed size needs: under a
    // memory budget the last growth lands exactly there.
    size_t grown = std::max(kMinCapacity, capacity_ * 2);
    if (max_entries_ != ~size_t{0}) {
      grown = std::min(grown, CapacityFor(max_entries_));
    }
    grown = std::max(grown, CapacityFor(size_ + 1));
    Rehash(grown);
  }
  size_t i = Home(key);
  while (rows_[i] != kNotFound) {
    if (++i == capacity_) i = 0;
  }
  keys_[i] = key;
  rows_[i] = row;
  ++size_;
}

bool RowIndex::Erase(uint64_t key) {
  if (size_ == 0) return false;
  size_t i = Home(key);
  while (true) {
    if (rows_[i] == kNotFound) return false;
    if (keys_[i] == key) break;
    if (++i == capacity_) i = 0;
  }
  // Backward shift: move later entries of the probe run into the hole when
  // their home does not lie cyclically in (hole, entry].
  size_t hole = i;
  size_t j = i;
  while (true) {
    if (++j == capacity_) j = 0;
    if (rows_[j] == kNotFound) break;
    const size_t home = Home(keys_[j]);
    const bool home_in_range =
        hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (home_in_range) continue;
    keys_[hole] = keys_[j];
    rows_[hole] = rows_[j];
    hole = j;
  }
  rows_[hole] = kNotFound;
  --size_;
  return true;
}

void RowIndex::Rehash(size_t new_capacity) {
  std::unique_ptr<uint64_t[]> old_keys = std::move(keys_);
  std::unique_ptr<uint32_t[]> old_rows = std::move(rows_);
  const size_t old_capacity = capacity_;
  keys_.reset(new uint64_t[new_capacity]);
  rows_.reset(new uint32_t[new_capacity]);
  std::fill(rows_.get(), rows_.get() + new_capacity, kNotFound);
  capacity_ = new_capacity;
  for (size_t k = 0; k < old_capacity; ++k) {
    if (old_rows[k] == kNotFound) continue;
    size_t i = Home(old_keys[k]);
    while (rows_[i] != kNotFound) {
      if (++i == capacity_) i = 0;
    }
    keys_[i] = old_keys[k];
    rows_[i] = old_rows[k];
  }
}

}  // namespace ps
