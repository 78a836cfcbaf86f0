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
// Not thread-safe; owned by one table.
#ifndef PS_SERVER_ROW_INDEX_H_
#define PS_SERVER_ROW_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <memory>

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
  RowIndex(const RowIndex&) = delete;
  RowIndex& operator=(const RowIndex&) = delete;

  // Slots needed to hold n entries at the maximal load.
  static size_t CapacityFor(size_t n);

  // Growth never goes past CapacityFor(max_entries). Inserting more than
  // max_entries is a caller bug (the table checks first). Default: no limit.
  void set_max_entries(size_t max_entries) { max_entries_ = max_entries; }

  // The row of `key`, or kNotFound.
  uint32_t Find(uint64_t key) const;

  // Adds key -> row. The key must be absent. May grow (rehash) the index.
  void Insert(uint64_t key, uint32_t row);

  // Removes `key`; false if it was absent.
  bool Erase(uint64_t key);

  // Hints the CPU to load the slot `key` starts probing at.
  void Prefetch(uint64_t key) const;

  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  size_t MemoryBytes() const { return capacity_ * kBytesPerSlot; }

  // Calls fn(key, row) for every entry, in slot order.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (size_t i = 0; i < capacity_; ++i) {
      if (rows_[i] != kNotFound) fn(keys_[i], rows_[i]);
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
      if (rows_[i] != kNotFound && !fn(keys_[i], rows_[i])) return i + 1;
    }
    return end;
  }

 private:
  size_t Home(uint64_t key) const;
  void Rehash(size_t new_capacity);

  size_t capacity_ = 0;
  size_t size_ = 0;
  size_t max_entries_ = ~size_t{0};
  // Parallel arrays; rows_[i] == kNotFound marks an empty slot, so every
  // uint64 key value is usable.
  std::unique_ptr<uint64_t[]> keys_;
  std::unique_ptr<uint32_t[]> rows_;
};

}  // namespace ps

#endif  // PS_SERVER_ROW_INDEX_H_
