#include "server/row_index.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>

namespace ps {
namespace {

constexpr size_t kMinCapacity = 8;
constexpr size_t kHugePage = size_t{2} << 20;

// Slot arrays of 2 MiB or more sit on 2 MiB boundaries, their whole huge
// pages advised onto transparent huge pages (as the table's row chunks): a
// random lookup in a large index then misses the TLB far less often. Only
// whole huge pages inside the array are advised, so no more than its bytes
// (what MemoryBytes reports) can become resident. Smaller arrays are
// aligned to a cache line. Throws std::bad_alloc like new[].
// aligned_alloc wants a size that is a multiple of the alignment (C11;
// sanitizers check it): the rounding reserves address space, and only the
// bytes the index writes become resident.
void* AllocateSlots(size_t bytes) {
  void* p = nullptr;
  if (bytes >= kHugePage) {
    p = std::aligned_alloc(kHugePage, (bytes + kHugePage - 1) / kHugePage * kHugePage);
    if (p != nullptr) madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);
  } else {
    p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

RowIndex::~RowIndex() { std::free(slots_); }

size_t RowIndex::CapacityFor(size_t n) {
  // Smallest c with n <= c * kLoadNum / kLoadDen.
  return std::max(kMinCapacity, (n * kLoadDen + kLoadNum - 1) / kLoadNum);
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
  size_t i = Home(Hash(key));
  while (slots_[i].row != kNotFound) {
    if (++i == capacity_) i = 0;
  }
  slots_[i].row = row;
  slots_[i].set_key(key);
  ++size_;
}

bool RowIndex::Erase(uint64_t key) {
  if (size_ == 0) return false;
  size_t i = Home(Hash(key));
  while (true) {
    if (slots_[i].row == kNotFound) return false;
    if (slots_[i].key() == key) break;
    if (++i == capacity_) i = 0;
  }
  // Backward shift: move later entries of the probe run into the hole when
  // their home does not lie cyclically in (hole, entry].
  size_t hole = i;
  size_t j = i;
  while (true) {
    if (++j == capacity_) j = 0;
    if (slots_[j].row == kNotFound) break;
    const size_t home = Home(Hash(slots_[j].key()));
    const bool home_in_range =
        hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (home_in_range) continue;
    slots_[hole] = slots_[j];
    hole = j;
  }
  slots_[hole].row = kNotFound;
  --size_;
  return true;
}

void RowIndex::Rehash(size_t new_capacity) {
  Slot* const old_slots = slots_;
  const size_t old_capacity = capacity_;
  slots_ = static_cast<Slot*>(AllocateSlots(new_capacity * sizeof(Slot)));
  for (size_t i = 0; i < new_capacity; ++i) new (&slots_[i]) Slot{kNotFound, {0, 0}};
  capacity_ = new_capacity;
  for (size_t k = 0; k < old_capacity; ++k) {
    if (old_slots[k].row == kNotFound) continue;
    size_t i = Home(Hash(old_slots[k].key()));
    while (slots_[i].row != kNotFound) {
      if (++i == capacity_) i = 0;
    }
    slots_[i] = old_slots[k];
  }
  std::free(old_slots);
}

}  // namespace ps
