// Hash index from a sparse key to the row that holds it.
//
// Open addressing with linear probing and backward-shift deletion, so
// erasing leaves no tombstones and lookups stay short under constant churn
// (eviction erases as often as admission inserts). The capacity need not be
// a power of two (slots are picked by multiply-high range reduction): a
// table under a memory budget grows its index to exactly what its largest
// row count needs, and the index's memory is exactly
// capacity() * kBytesPerSlot, which is what MemoryBytes() reports.
//
// Each slot holds its row and key side by side (12 bytes, packed), so a
// lookup usually touches one cache line rather than one per array. Batched
// callers (SparseTable::Pull and Push) hash a key once with Hash(),
// prefetch its home slot some keys ahead with PrefetchHashed() and look it
// up later with FindHashed(); those are inline, as they run once per key.
// An index of 2 MiB or more is placed on 2 MiB boundaries and advised onto
// transparent huge pages.
//
// Not thread-safe; owned by one table.
#ifndef PS_SERVER_ROW_INDEX_H_
#define PS_SERVER_ROW_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/base/attributes.h"

namespace ps {

class RowIndex {
 public:
  static constexpr uint32_t kNotFound = ~uint32_t{0};
  static constexpr size_t kBytesPerSlot = sizeof(uint64_t) + sizeof(uint32_t);
  // Most entries per slot before the index grows: 4/5. Linear probing stays
  // at about 3 probes per miss at this load.
  static constexpr size_t kLoadNum = 4;
  static constexpr size_t kLoadDen = 5;

  RowIndex() = default;
  ~RowIndex();
  RowIndex(const RowIndex&) = delete;
  RowIndex& operator=(const RowIndex&) = delete;

  // Slots needed to hold n entries at the maximal load.
  static size_t CapacityFor(size_t n);

  // Growth never goes past CapacityFor(max_entries). Inserting more than
  // max_entries is a caller bug (the table checks first). Default: no limit.
  void set_max_entries(size_t max_entries) { max_entries_ = max_entries; }

  // The hash that picks `key`'s slots (by its high bits: see HomeIn). It
  // does not depend on the capacity, so it stays valid across growth. One
  // multiply (Fibonacci hashing), after folding the high half of the key
  // into the low one: every key bit then reaches the high bits of the
  // product, and consecutive keys land evenly spread. It is unrelated to
  // the slot-routing hash (common/hash.h): a server holds only keys whose
  // routing hash falls in its slots, so reusing that hash here would crowd
  // its keys into part of the index.
  static uint64_t Hash(uint64_t key) {
    return (key ^ (key >> 32)) * 0x9e3779b97f4a7c15ULL;
  }

  // Where the slots are, for lookup loops: a copy in locals lets the
  // compiler keep it in registers across a loop whose stores it cannot
  // otherwise tell apart from the index's members. Valid until the next
  // Insert or Erase (which may move or grow the slots); default: empty.
  class View;
  View view() const;

  // The row of `key`, or kNotFound.
  uint32_t Find(uint64_t key) const { return FindHashed(key, Hash(key)); }
  // Same, with hash == Hash(key) computed by the caller.
  uint32_t FindHashed(uint64_t key, uint64_t hash) const;

  // Adds key -> row. The key must be absent. May grow (rehash) the index.
  void Insert(uint64_t key, uint32_t row);

  // Removes `key`; false if it was absent.
  bool Erase(uint64_t key);

  // Hints the CPU to load the slot a lookup of `key` starts probing at.
  void Prefetch(uint64_t key) const;
  // Same, with hash == Hash(key).
  void PrefetchHashed(uint64_t hash) const;

  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  size_t MemoryBytes() const { return capacity_ * kBytesPerSlot; }

  // Calls fn(key, row) for every entry, in slot order.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].row != kNotFound) fn(slots_[i].key(), slots_[i].row);
    }
  }

  // Resumable ForEach: calls fn(key, row) for the entries in slots
  // [begin, capacity()), in slot order, until fn returns false or
  // `max_slots` slots were looked at. Returns the first slot not looked at:
  // capacity() (or `begin`, if larger) when the end was reached. Positions
  // are stable only while no entry is inserted or erased (both may move
  // entries); any `begin` is safe.
  template <typename Fn>
  size_t ForEachFrom(size_t begin, size_t max_slots, Fn fn) const {
    if (begin >= capacity_) return begin;
    const size_t end = capacity_ - begin > max_slots ? begin + max_slots : capacity_;
    for (size_t i = begin; i < end; ++i) {
      if (slots_[i].row != kNotFound && !fn(slots_[i].key(), slots_[i].row)) {
        return i + 1;
      }
    }
    return end;
  }

 private:
  // row == kNotFound marks an empty slot, so every uint64 key value is
  // usable. The key is two 32-bit words so that a slot packs into 12 bytes
  // (4-byte aligned), which the memory accounting counts on.
  struct Slot {
    uint32_t row;
    uint32_t key_words[2];
    uint64_t key() const {
      uint64_t k;
      std::memcpy(&k, key_words, sizeof(k));
      return k;
    }
    void set_key(uint64_t k) { std::memcpy(key_words, &k, sizeof(k)); }
  };
  static_assert(sizeof(Slot) == kBytesPerSlot, "slots must stay packed");

  // The slot a key with this hash starts probing at: multiply-high range
  // reduction, so any capacity works.
  static size_t HomeIn(uint64_t hash, size_t capacity) {
    return static_cast<size_t>(
        (static_cast<unsigned __int128>(hash) * capacity) >> 64);
  }
  size_t Home(uint64_t hash) const { return HomeIn(hash, capacity_); }
  void Rehash(size_t new_capacity);

  size_t capacity_ = 0;
  size_t size_ = 0;
  size_t max_entries_ = ~size_t{0};
  Slot* slots_ = nullptr;  // capacity_ slots from AllocateSlots
};

class RowIndex::View {
 public:
  View() = default;

  uint32_t FindHashed(uint64_t key, uint64_t hash) const {
    // An index that never held a key has no slots; one emptied since has
    // only empty ones, where the probe stops at once.
    if (capacity_ == 0) return kNotFound;
    size_t i = HomeIn(hash, capacity_);
    while (true) {
      const Slot& s = slots_[i];
      if (s.row == kNotFound) return kNotFound;
      if (s.key() == key) return s.row;
      if (++i == capacity_) i = 0;
    }
  }

  // Always inlined: GCC may delete a call to an out-of-line function that
  // only prefetches (it has no side effects). Without slots it prefetches
  // address 0, which is harmless, so there is no branch.
  //
  // Two lines when the home slot and the two after it do not share one: a
  // 12-byte slot straddles a line boundary at 2 of every 16 positions, and
  // at the loads the index runs at (up to 4/5) a probe often reads the next
  // slots. A lookup that reaches a line not prefetched waits a whole memory
  // latency; on a 16-core Xeon VM such waits held a 4 GiB table's pull to
  // 0.33-0.47 of the raw gather. Covering the next slot raised the pull on
  // an EPYC VM; covering two (this) raised it again, from 0.54 to 0.57 of
  // the gather limit on average over nine alternating pairs, though more
  // lookups fetch a line they do not read. The second prefetch is a no-op
  // when both addresses fall in one line.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void PrefetchHashed(uint64_t hash) const {
    const uintptr_t home =
        reinterpret_cast<uintptr_t>(slots_) + HomeIn(hash, capacity_) * sizeof(Slot);
    __builtin_prefetch(reinterpret_cast<const void*>(home));
    __builtin_prefetch(reinterpret_cast<const void*>(home + 3 * sizeof(Slot) - 1));
  }

 private:
  friend class RowIndex;
  View(const Slot* slots, size_t capacity) : slots_(slots), capacity_(capacity) {}

  const Slot* slots_ = nullptr;
  size_t capacity_ = 0;
};

inline RowIndex::View RowIndex::view() const { return View(slots_, capacity_); }

inline uint32_t RowIndex::FindHashed(uint64_t key, uint64_t hash) const {
  return view().FindHashed(key, hash);
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void RowIndex::PrefetchHashed(uint64_t hash) const {
  view().PrefetchHashed(hash);
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void RowIndex::Prefetch(uint64_t key) const {
  PrefetchHashed(Hash(key));
}

}  // namespace ps

#endif  // PS_SERVER_ROW_INDEX_H_
