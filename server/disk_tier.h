// The disk tier of a sparse table: the rows its memory budget does not
// hold ("cold" rows), each with its full state, in a RocksDB database on
// local disk.
//
// A cold row is stored under a 12-byte key, the big-endian slot of its key
// then the key itself, so one slot's cold rows are one contiguous range
// (slot moves, checkpoints and restore read or delete ranges). Its value is
// the row's full state (SparseTable::state_floats() floats) followed by its
// bookkeeping (ColdRowTag), so a row demoted and promoted again is the row
// it was, bit for bit.
//
// The tier is a cache, not a store: the write-ahead log is off, and the
// database lives in a directory that Open empties and the destructor
// removes. A server that restarts recovers its rows from a checkpoint (or
// its primary), never from a tier directory, so a torn or corrupted file is
// never read after a crash; within a run, RocksDB's block checksums detect
// a corrupted block, and the read fails with DATA_LOSS.
//
// Memory: memtables are charged to the block cache, which also holds the
// index and filter blocks (bloom filters, 10 bits per key, so a key never
// demoted costs no disk read), and the cache is capped at
// Options::memory_bytes. MemoryBytes() reports what the tier holds.
//
// Thread safety: Put, Get, MultiGet, Delete and the statistics may be
// called from several threads at once (RocksDB serialises what it must);
// the caller orders the operations on one key.
#ifndef PS_SERVER_DISK_TIER_H_
#define PS_SERVER_DISK_TIER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "common/status.h"

namespace rocksdb {
class Cache;
class DB;
class Snapshot;
class Statistics;
}  // namespace rocksdb

namespace ps {

class IoPool;

// A row's bookkeeping besides its floats (SparseTable's RowMeta without the
// links), kept with it on disk so eviction order and TTL survive demotion.
struct ColdRowTag {
  uint64_t last_step = 0;
  uint32_t last_second = 0;
  uint32_t touches = 0;
};

// Counters; see data_plane.proto TableStats for their meaning.
struct DiskTierCounters {
  uint64_t cold_rows = 0;
  uint64_t demotions = 0;
  uint64_t promotions = 0;
  uint64_t cold_reads = 0;         // rows read from the tier (found)
  uint64_t cold_misses = 0;        // lookups of keys the tier did not have
  uint64_t cold_rows_dropped = 0;  // demoted past max_disk_bytes
  uint64_t disk_reads = 0;         // blocks lookups read from files
  uint64_t read_micros = 0;        // time in lookups that found rows
  uint64_t bloom_useful = 0;       // lookups a filter answered "absent"
  uint64_t bytes_written = 0;      // by flushes and compactions
  uint64_t errors = 0;             // failed reads or writes (logged)
};

class DiskTier {
 public:
  class Snapshot {
   public:
    ~Snapshot();
    Snapshot(const Snapshot&) = delete;
    Snapshot& operator=(const Snapshot&) = delete;

   private:
    friend class DiskTier;
    Snapshot(rocksdb::DB* db, const rocksdb::Snapshot* snapshot)
        : db_(db), snapshot_(snapshot) {}
    rocksdb::DB* db_;
    const rocksdb::Snapshot* snapshot_;
  };

  // The least RAM a tier works in: two small memtables and a few blocks.
  static constexpr uint64_t kMinTierMemory = uint64_t{256} << 10;

  struct Options {
    // The database's directory; emptied (or created) by Open, removed by
    // the destructor. Its parent must exist or be creatable.
    std::string dir;
    // Floats of state per row; every row stored and read has exactly these.
    size_t state_floats = 0;
    // The slot of a key (the layout's prefix): SparseSlot(table_id, key,
    // num_slots).
    uint32_t table_id = 0;
    uint32_t num_slots = 4096;
    // Rows beyond max_disk_bytes / RowBytes() are refused (Put answers
    // false). 0: no cap.
    uint64_t max_disk_bytes = 0;
    // RAM for memtables and the block cache; at least kMinTierMemory.
    uint64_t memory_bytes = 8 << 20;
    // Page-cache I/O instead of O_DIRECT (see DiskTierConfig.buffered_io).
    bool buffered_io = false;
    // Threads besides the caller's that read a MultiGet's keys at once
    // (IoPool); 0 reads them one after another.
    int read_threads = 3;
  };

  // INVALID_ARGUMENT for bad options; the I/O error (with the directory)
  // when the directory cannot be emptied or the database not opened, e.g.
  // FAILED_PRECONDITION naming buffered_io when the file system refuses
  // direct I/O.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const Options& options);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Bytes one stored row takes before compression and overheads: key and
  // value. What max_disk_bytes counts per row.
  size_t RowBytes() const { return 12 + value_bytes_; }

  // Stores `key`'s row (state_floats() floats at `state`, and `tag`), which
  // the tier must not hold already (the table promotes before it demotes
  // again). false, storing nothing, when it would pass max_disk_bytes.
  // An I/O error is returned (and counted); the row is then not stored.
  absl::StatusOr<bool> Put(uint64_t key, const float* state,
                           const ColdRowTag& tag);
  // Reads `key`'s row into state (state_floats() floats) and *tag; false
  // when the tier does not hold it. DATA_LOSS for a corrupted block or a
  // stored row of the wrong size; other I/O errors as RocksDB reports them.
  absl::StatusOr<bool> Get(uint64_t key, float* state, ColdRowTag* tag);
  // Get for many keys at once (one batched lookup). found[i] says whether
  // keys[i]'s row was read into states[i * state_floats()] and tags[i].
  // Stops at the first error, which it returns.
  absl::Status MultiGet(absl::Span<const uint64_t> keys, float* states,
                        ColdRowTag* tags, std::vector<bool>* found);
  // Removes `key`'s row, which the tier holds (a promotion).
  absl::Status Delete(uint64_t key);
  // Removes every row of the slots `slots` selects (slots moved away);
  // returns how many rows it removed.
  absl::StatusOr<uint64_t> DeleteSlots(const std::vector<bool>& slots);

  // Calls fn(keys, states) for every row, up to `page_rows` at a time
  // (states: state_floats() floats per row), in stored-key order (slot,
  // then key), from a consistent view taken when the call starts: writes
  // made meanwhile are not seen. Stops at, and returns, fn's first error;
  // DATA_LOSS for a corrupted block or row. Counts nothing, caches nothing.
  // With `slots` (one entry per slot), only the rows of the slots it
  // selects, each slot's range read on its own (a catch-up or a digest of
  // some slots reads nothing of the others); a `slots` of another size than
  // Options::num_slots selects every row (the caller filters).
  // With `at`, the view is that snapshot's instead of the call's start.
  using RowPageFn = absl::FunctionRef<absl::Status(
      absl::Span<const uint64_t> keys, absl::Span<const float> states)>;
  absl::Status ForEachRow(size_t page_rows, RowPageFn fn,
                          const std::vector<bool>* slots = nullptr,
                          const Snapshot* at = nullptr) const;

  // The rows as they are now, for a ForEachRow later, while the tier
  // changes (a checkpoint's cut written off the serving thread). Destroy
  // it before the tier. Keeping one keeps the files of rows deleted or
  // replaced since from being compacted away: disk use grows with the
  // writes made while it lives.
  std::unique_ptr<Snapshot> TakeSnapshot() const;

  // Rows held.
  uint64_t rows() const { return rows_.load(std::memory_order_relaxed); }
  // The slot count of the layout (Options::num_slots), and the rows held of
  // slot `slot` (0 past it).
  uint32_t num_slots() const { return options_.num_slots; }
  uint64_t slot_rows(uint32_t slot) const;
  // RAM the tier holds now: memtables, cached blocks, table readers.
  size_t MemoryBytes() const;
  // Bytes of the database's files on disk.
  uint64_t DiskBytes() const;
  DiskTierCounters Counters() const;
  // Counts a promotion (the table took a row back into RAM).
  void CountPromotion() { promotions_.fetch_add(1, std::memory_order_relaxed); }

  // The 12-byte stored key of `key` (slot then key, big-endian): exposed
  // for tests of the layout.
  std::string StoredKey(uint64_t key) const;

 private:
  explicit DiskTier(const Options& options);
  // The 12-byte stored key of `key` into out.
  void EncodeStored(uint64_t key, char* out) const;
  uint32_t SlotOf(uint64_t key) const;
  // Counts a failed read or write, and logs the first, 10th, 100th, ...
  void NoteError(const char* what, const std::string& detail);

  const Options options_;
  const size_t value_bytes_;
  std::shared_ptr<rocksdb::Cache> cache_;
  std::shared_ptr<rocksdb::Statistics> statistics_;
  std::unique_ptr<rocksdb::DB> db_;
  std::unique_ptr<IoPool> pool_;  // MultiGet's readers
  std::atomic<uint64_t> rows_{0};
  // Rows held per slot (num_slots of them).
  std::unique_ptr<std::atomic<uint64_t>[]> slot_rows_;
  std::atomic<uint64_t> demotions_{0};
  std::atomic<uint64_t> promotions_{0};
  std::atomic<uint64_t> cold_reads_{0};
  std::atomic<uint64_t> cold_misses_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> read_micros_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> disk_reads_{0};  // blocks lookups read from files
};

// A server process's directory for its tables' disk tiers under one
// DiskTierConfig.dir: <base>/<job>/server-<pid>-<n>. The handle holds an
// exclusive lock (flock) on the directory's `owner.lock` for its life; Claim
// removes the directories of the same job whose lock no process holds (left
// by a crashed server), so disk space does not leak across restarts. The
// destructor removes the directory (after the tables in it are gone).
// Not thread-safe.
class TierRoot {
 public:
  // The I/O error (with the path) when the directory cannot be created or
  // locked. A stale directory that cannot be removed is only logged.
  static absl::StatusOr<std::unique_ptr<TierRoot>> Claim(
      const std::string& base, const std::string& job);
  ~TierRoot();
  TierRoot(const TierRoot&) = delete;
  TierRoot& operator=(const TierRoot&) = delete;

  const std::string& path() const { return path_; }

 private:
  TierRoot(std::string path, int lock_fd)
      : path_(std::move(path)), lock_fd_(lock_fd) {}
  const std::string path_;
  const int lock_fd_;
};

}  // namespace ps

#endif  // PS_SERVER_DISK_TIER_H_
