// Parameter tables held by a server.
//
// SparseTable: rows of `dim` floats keyed by arbitrary uint64 ids, created
// with deterministic initial values when a key is pushed (see the class for
// admission, TTL and memory budget). DenseTable: a fixed-size float array split into blocks; a server
// holds only the blocks in its slots, created on first touch.
//
// Tables do not check key ownership or finiteness of gradients; the server
// validates a whole request before it touches a table, so a rejected
// request changes nothing. Not thread-safe: the owning server serialises
// access.
#ifndef PS_SERVER_TABLE_H_
#define PS_SERVER_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "proto/data_plane.pb.h"
#include "server/admission.h"
#include "server/cold_reader.h"
#include "server/disk_tier.h"
#include "common/optimizer.h"
#include "server/row_index.h"
#include "server/row_memo.h"

namespace ps {

// Dense requests address elements by segments, as they arrive on the wire.
using Segments = google::protobuf::RepeatedPtrField<DenseSegment>;

class SparseTable;
class DenseTable;

// Told of every row whose state (weights or optimizer state) may have
// changed, been created or been dropped: a sparse row by its key, a dense
// block by its number. Called on the table's thread in the middle of the
// change (before or after it), so it must neither read nor change the
// table: it notes the row and reads it once the call that changed it
// returned. A row may be reported though unchanged (a dense block read by
// a pull); no change is left unreported. A sparse row that moves between
// RAM and a disk tier as it is (demoted, promoted) is not a change: the
// watch reads it wherever it is (SparseTable::ReadColdRows).
class RowWatch {
 public:
  virtual ~RowWatch() = default;
  virtual void RowChanged(uint32_t table, bool sparse, uint64_t row) = 0;
};

// Counters every table keeps; see data_plane.proto TableStats.
struct TableCounters {
  uint64_t keys_pushed = 0;
  uint64_t keys_pulled = 0;
  uint64_t admissions = 0;
  uint64_t pushes_filtered = 0;
  uint64_t evictions_ttl = 0;
  uint64_t evictions_budget = 0;
  uint64_t pushes_refused = 0;
  uint64_t keys_dropped = 0;
};

// What a table needs from the process that holds it beyond its config.
struct TableEnv {
  // Where a sparse table with a disk tier keeps it: <tier_root>/table-<id>
  // (the server's directory under disk_tier.dir; see TierRoot). Empty: a
  // directory of the table's own under disk_tier.dir, unique in the
  // machine (tools and tests).
  std::string tier_root;
  // The job's cluster.num_slots: the disk tier stores rows by slot.
  uint32_t num_slots = 4096;
};

class Table {
 public:
  virtual ~Table() = default;

  // INVALID_ARGUMENT for a config that sets neither sparse nor dense, or a
  // bad optimizer or sparse block; a disk tier's error when it cannot be
  // opened (DiskTier::Open).
  static absl::StatusOr<std::unique_ptr<Table>> Create(
      const TableConfig& config, const TableEnv& env = {});

  const TableConfig& config() const { return config_; }
  uint32_t id() const { return config_.id(); }
  virtual SparseTable* AsSparse() { return nullptr; }
  virtual DenseTable* AsDense() { return nullptr; }
  virtual const SparseTable* AsSparse() const { return nullptr; }
  virtual const DenseTable* AsDense() const { return nullptr; }

  // Bytes held by parameters, optimizer state and bookkeeping.
  virtual size_t MemoryBytes() const = 0;

  // Statistics for the STATS op.
  virtual TableStats Stats() const = 0;

  // The learning-rate multiplier for a push of step `step` by a worker
  // `staleness` steps behind, in a cluster of `num_workers` workers
  // (config.proto LearningRateSchedule and scale_with_workers; see
  // RateMultiplier).
  float RateScale(uint64_t step, uint64_t staleness,
                  uint32_t num_workers) const {
    return RateMultiplier(config_.optimizer(), step, staleness, num_workers);
  }

  // Counts a push refused before it reached the table (e.g. by the
  // server's validation against CheckPush).
  void CountRefusedPush() { ++counters_.pushes_refused; }

  // Floats of optimizer state per parameter element (Optimizer::state_size).
  int state_size() const { return optimizer_->state_size(); }

  // Reports every row change to `watch` (null: to nobody) from now on.
  // Borrowed: it must outlive the table or be unset first.
  void set_row_watch(RowWatch* watch) { watch_ = watch; }

 protected:
  Table(const TableConfig& config, std::unique_ptr<Optimizer> optimizer)
      : config_(config), optimizer_(std::move(optimizer)) {}
  TableStats BaseStats() const;

  const TableConfig config_;
  const std::unique_ptr<Optimizer> optimizer_;
  TableCounters counters_;
  RowWatch* watch_ = nullptr;
};

// Rows of `dim` floats for arbitrary uint64 keys.
//
// Rows are created by pushes (at the first, or with an admission threshold
// the admit_after_pushes-th push of a key); a pull of a key without a row
// answers the initial values, which depend only on (seed, table, key), and
// creates nothing. Under a memory budget the table holds at most
// max_rows() rows, computed once so that everything it allocates (row
// chunks, index, bookkeeping, sketch) stays within the budget; at that
// size a new row evicts one (LRU or LFU) or, without eviction, the push is
// refused. TTLs drop rows not touched (pushed or pulled) for a number of
// steps or seconds; Advance() applies them.
//
// With a disk tier (config.sparse().disk_tier, attached by Table::Create)
// the evicted row is demoted instead: its full state and bookkeeping go to
// disk (DiskTier), and a push of its key takes it back into RAM (promotes
// it) exactly as it was, so eviction changes no parameter. A pull of a
// cold key reads it from disk and promotes it too (the push of the pulled
// keys usually follows). A cold row
// whose TTL expired reads as absent (and is deleted when found). Rows
// demoted past the tier's max_disk_bytes are dropped as without a tier.
// The tier's RAM is part of memory_budget_bytes: the rows in RAM get what
// is left (max_rows()).
class SparseTable : public Table {
 public:
  SparseTable(const TableConfig& config, std::unique_ptr<Optimizer> optimizer);
  SparseTable* AsSparse() override { return this; }
  const SparseTable* AsSparse() const override { return this; }

  // Attaches the disk tier (before any row is created); Table::Create does.
  void AttachDiskTier(std::unique_ptr<DiskTier> tier) {
    tier_ = std::move(tier);
  }
  // The tier, or null without one.
  const DiskTier* disk_tier() const { return tier_.get(); }
  // OK while the disk tier works. After its first failed read, write or
  // delete: that error, naming the table, for good. The table can no
  // longer be trusted (a row was read as absent, or lost on its way to
  // disk), so its server stops serving and is recovered as a crashed one
  // (KVServer::storage_failure). Same thread as the table's other calls.
  const absl::Status& tier_failure() const { return tier_failure_; }
  // Records the tier's first failure (see tier_failure()) and logs it.
  // Const: a failed read found by a pass that changes nothing (a
  // checkpoint, a catch-up) is the tier's failure as much as any other.
  // Same thread as the table's other calls.
  void NoteTierFailure(const absl::Status& error) const;
  // Bytes of the budget the disk tier takes (DiskTierConfig.memory_bytes or
  // its default); 0 without a tier.
  static uint64_t TierMemoryBytes(const SparseTableConfig& config);

  // With a disk tier: starts reading cold rows off the table's thread
  // (ColdReader); `done` runs on the reader's thread after each batch, and
  // `before_read` (tests; may be null) before each. Without a tier,
  // nothing. Once, before ColdWait.
  void StartColdReader(std::function<void()> done,
                       std::function<void()> before_read = nullptr);
  // The reader, or null (no tier, or not started).
  ColdReader* cold_reader() { return reader_.get(); }
  // With a started reader: starts reading the rows of `keys` that may be on
  // disk and are neither in RAM nor read already, and returns the reader's
  // batch number the caller waits for before using the keys without a
  // disk read on its thread (ColdReader::installed()); 0 when none is
  // needed. Costs one index lookup per key, and nothing while the tier
  // holds no row and reads nothing.
  // `promote`: no request waits; the rows are promoted into RAM once read
  // (PREFETCH; ColdReader::Submit), those of the first keys up to half of
  // max_rows() (the rest of such a hint is not read).
  uint64_t ColdWait(absl::Span<const uint64_t> keys, bool promote = false);
  // Installs the reader's oldest finished batch (ColdReader::InstallOne);
  // a failed read is the tier's failure (tier_failure()). true when a batch
  // was installed.
  bool InstallColdReads();
  // Keep (and let go) the reader's staged rows of `keys` for a request
  // kept to run again (ColdReader::Pin).
  void PinColdReads(absl::Span<const uint64_t> keys) {
    if (reader_ != nullptr) reader_->Pin(keys);
  }
  void UnpinColdReads(absl::Span<const uint64_t> keys) {
    if (reader_ != nullptr) reader_->Unpin(keys);
  }
  // Drops the oldest rows the reader staged past its cap (after the
  // requests waiting for the batch installed last were handled).
  void TrimColdReads() {
    if (reader_ != nullptr) reader_->Trim();
  }
  // Bytes of the budget the reader's staged rows may take: a quarter of
  // TierMemoryBytes; 0 without a tier.
  static uint64_t StagingBytes(const SparseTableConfig& config) {
    return TierMemoryBytes(config) / 4;
  }

  // Calls fn(keys, state) for every cold row, a page of up to `page_rows`
  // rows at a time (state: state_floats() floats per row, as ExportRows),
  // in slot-then-key order, from a consistent view of the tier taken when
  // the call starts. Nothing without a tier. The error of a failed read
  // (DATA_LOSS for a corrupted block), which is then tier_failure() too
  // (fn's own errors are not). Touches no row and no counter.
  // With `slots`, only the rows of the slots it selects (DiskTier::ForEachRow).
  absl::Status ExportColdRows(size_t page_rows, DiskTier::RowPageFn fn,
                              const std::vector<bool>* slots = nullptr) const;

  uint32_t dim() const { return dim_; }
  // Rows in RAM (with a disk tier, the hot rows only).
  size_t num_rows() const { return index_.size(); }
  // Most rows the budget allows; SIZE_MAX without a budget.
  size_t max_rows() const { return max_rows_; }
  size_t MemoryBytes() const override;
  TableStats Stats() const override;
  const TableCounters& counters() const { return counters_; }

  // Sets the table's step (the server's clock) and time, which pushes and
  // pulls record as a row's last touch, and drops rows whose TTL expired.
  // Steps and time should not go backwards; if they do, rows are kept.
  void Advance(uint64_t step, absl::Time now);

  // Whether a push of `keys` may proceed: RESOURCE_EXHAUSTED when the table
  // does not evict and the rows the push would create do not fit in the
  // budget. Changes nothing (not even the admission counts). `memo` as for
  // Pull (read only): a current one spares the lookups of keys it found.
  absl::Status CheckPush(absl::Span<const uint64_t> keys,
                         const RowMemo* memo = nullptr) const;

  // Changes whenever a row is dropped (eviction, TTL), i.e. whenever a row
  // number may stop naming the key it named; never 0, and never the same in
  // two tables of a process. A RowMemo made in this generation is current.
  uint64_t generation() const { return generation_; }

  // out must hold keys.size() * dim() floats; row i goes to out[i * dim()].
  // With a memo (the rows an earlier Pull or Push of the same `keys` found;
  // see RowMemo), a current one replaces the index lookups, and any other
  // is refilled with the rows found; the result is the same either way.
  void Pull(absl::Span<const uint64_t> keys, float* out, RowMemo* memo = nullptr);

  // grads holds keys.size() * dim() floats. A key that appears twice is
  // updated twice, in order. lr_scale multiplies the learning rate
  // (RateScale). A key without a row is counted by the admission filter
  // and gets a row once admitted; a row that does not fit (no eviction,
  // budget full: CheckPush was not consulted or the table filled since) is
  // not created, and that key's gradient is dropped and counted in
  // keys_dropped. `memo` as for Pull; it is left current unless the push
  // dropped a row (eviction).
  void Push(absl::Span<const uint64_t> keys, const float* grads,
            float lr_scale = 1.0f, RowMemo* memo = nullptr);

  // One page of a scan over every row (the SCAN op). Appends to *keys the
  // keys of at most `max_rows` rows, and to *values their weights (dim()
  // floats per row, optimizer state excluded), looking at at most
  // `max_slots` index positions from `cursor` on. Returns the cursor of
  // the next page, always greater than `cursor`, or 0 once the scan is
  // done. Starting at 0 and following the returned cursors visits every
  // row exactly once provided no row is created or dropped in between;
  // otherwise rows may be missed or repeated. Any cursor is safe: one
  // past the end appends nothing and returns 0. Touches no row (recency,
  // TTL) and no counter.
  uint64_t Scan(uint64_t cursor, size_t max_rows, size_t max_slots,
                std::vector<uint64_t>* keys, std::vector<float>* values) const;

  // Floats of full state per row: dim() weights followed by the optimizer
  // state, dim() * state_size() floats interleaved per element as
  // Optimizer describes. This is what ExportRows and ImportRow exchange.
  size_t state_floats() const { return stride_; }

  // One page of an export of every row with its full state (checkpoints).
  // Like Scan, but appends state_floats() floats per row to *state, bounds
  // only the rows (it looks at as many index positions as it takes to find
  // `max_rows` rows), and visits rows in an order spread over the key hash
  // range, so that importing them in export order into another table
  // (ImportRow) takes time linear in the rows. Returns the cursor of the
  // next page (not comparable with Scan's), or 0 once done; the same
  // guarantees as Scan hold: every row exactly once while the table is not
  // modified in between, and any cursor is safe. Touches no row and no
  // counter.
  // Appends to the vectors without clearing them, so a caller that reuses
  // them across pages allocates nothing once they have grown.
  uint64_t ExportRows(uint64_t cursor, size_t max_rows,
                      std::vector<uint64_t>* keys,
                      std::vector<float>* state) const;

  // The full state of `key`'s row (state_floats() floats, as ExportRows
  // gives it), or an empty span when it has no row. Valid until the table
  // changes. Touches no row and no counter.
  absl::Span<const float> RowState(uint64_t key) const;

  // The full state (state_floats() floats each, into *states) of the rows
  // of `keys` on the disk tier, read from disk now in one batch: (*found)[i]
  // says whether keys[i] has one (a TTL-expired one reads as absent; keys
  // with a row in RAM are not looked at: false). For copies and digests of
  // slots, which read rows wherever they are: touches no row (nothing is
  // promoted) and no counter but the tier's reads. A failed read is
  // tier_failure() too, and finds nothing. Without a tier, nothing found.
  void ReadColdRows(absl::Span<const uint64_t> keys, std::vector<float>* states,
                    std::vector<bool>* found) const;

  // Sets the full state of `key`'s row to `state` (state_floats() floats),
  // creating the row if absent, bit for bit: restoring a checkpoint.
  // Bypasses the admission filter. A created row counts as touched now
  // (recency, TTL: restored rows start a fresh TTL); an overwritten row's
  // recency is left alone. Counts no push, pull or admission.
  // INVALID_ARGUMENT if state has the wrong size or a non-finite value;
  // RESOURCE_EXHAUSTED if the row is absent and the table is at its budget
  // without eviction (an evicting table evicts a row to make room, counted
  // in evictions_budget); tier_failure() once the disk tier failed. On error
  // the table is unchanged.
  absl::Status ImportRow(uint64_t key, absl::Span<const float> state);
  // Whether ImportRow of every key in `keys` would find room: RESOURCE_EXHAUSTED
  // when the table does not evict and the absent keys (each counted once)
  // do not fit in its budget. Changes nothing.
  absl::Status CheckImport(absl::Span<const uint64_t> keys) const;

  // Drops every row whose key `drop` selects (a slot moved to another
  // server): they read as initial values again and no longer count. A table
  // without eviction or TTL keeps its rows dense, so the last rows move into
  // the holes and whole chunks past the end are freed; an evictable one
  // puts them on its free list. Renews generation(). Returns how many rows
  // were dropped. Counts no eviction.
  size_t DropRows(absl::FunctionRef<bool(uint64_t key)> drop);
  // With a disk tier: deletes its rows of the slots `slots` selects (one
  // entry per slot; a slot moved away), a range each, and returns how many
  // it deleted; the reader's copies of them go too. A failed delete is
  // tier_failure(). Without a tier: 0.
  uint64_t DropColdSlots(const std::vector<bool>& slots);
  // DropRows in steps: drops the rows at index positions
  // [begin, begin + max_positions) that `drop` selects, sets *dropped to
  // how many. `key_of` is the caller's memo of every row's key, for a
  // table that neither evicts nor expires rows: kept between steps, reset
  // (emptied) whenever generation() changed since the last step, refilled
  // by a pass when rows were created since. Returns the position to go on from,
  // or 0 once the end was reached. Dropping moves other rows' positions
  // (backward shifts, the last rows refilling holes), so one pass may miss
  // rows: a caller repeats passes until one drops nothing while generation()
  // and the index capacity stay the same (only drops renew the first, only
  // growth changes the second).
  size_t DropRowsFrom(size_t begin, size_t max_positions,
                      absl::FunctionRef<bool(uint64_t key)> drop,
                      std::vector<uint64_t>* key_of, size_t* dropped);
  size_t index_capacity() const { return index_.capacity(); }
  // Calls fn(key) for every row, in no particular order; reads only the
  // index (no row). The table must not change during the call.
  void ForEachKey(absl::FunctionRef<void(uint64_t key)> fn) const {
    index_.ForEach([&](uint64_t key, uint32_t) { fn(key); });
  }
  // ForEachKey in steps: calls fn(key) for the rows at index positions
  // [begin, begin + max_positions). Returns the position to go on from, or
  // 0 once the end was reached. Positions hold only while no row is
  // created or dropped: in between, rows may be missed or repeated.
  size_t ForEachKeyFrom(size_t begin, size_t max_positions,
                        absl::FunctionRef<void(uint64_t key)> fn) const {
    const size_t next =
        index_.ForEachFrom(begin, max_positions, [&](uint64_t key, uint32_t) {
          fn(key);
          return true;
        });
    return next >= index_.capacity() ? 0 : next;
  }

 private:
  // Drops the rows of `keys` (all present): DropRows' work once selected.
  size_t DropKeys(const std::vector<uint64_t>& keys,
                  std::vector<uint64_t>* key_of);

  // Bookkeeping in front of each row's floats when rows can be dropped.
  struct RowMeta {
    uint64_t key;
    uint64_t last_step;
    uint32_t prev;  // recency list: towards the most recent
    uint32_t next;  // towards the least recent; free list link
    uint32_t last_second;  // since the table was created
    uint32_t touches;  // saturating
  };
  static constexpr uint32_t kNil = ~uint32_t{0};
  // Rows live in fixed-size chunks so growth never moves existing rows and
  // never copies the whole table. A chunk holds up to 16384 rows and about
  // 4 MiB at most (under a budget, at most 1/64 of it), so wide rows do not
  // reserve gigabytes on first touch.

  unsigned char* RowBytes(uint32_t r) const {
    return chunks_[r >> chunk_shift_].get() +
           static_cast<size_t>(r & (chunk_rows_ - 1)) * row_bytes_;
  }
  float* Values(uint32_t r) const {
    return reinterpret_cast<float*>(RowBytes(r) + meta_bytes_);
  }
  RowMeta& Meta(uint32_t r) const {
    return *reinterpret_cast<RowMeta*>(RowBytes(r));
  }
  // Pull and Push work in blocks of kLookupBlock keys, so the cache misses
  // of many keys overlap instead of following one another. LookUpBlock
  // finds the rows of keys[begin, end) (end - begin <= kLookupBlock) into
  // rows[0..], the addresses of the found rows' values into values[0..],
  // and prefetches each row's bookkeeping and the first value_bytes of its
  // floats (for writing if for_write); meanwhile it hashes the keys one
  // block ahead and prefetches their index slots. `hashes` is a ring of kHashRing hashes,
  // indexed by key position modulo kHashRing: on entry it holds those of
  // keys[begin, begin + kLookupBlock) (StartLookUps fills the first block),
  // and on return also those of the next block, so each key is hashed once
  // and a block's hashes stay valid until the next LookUpBlock.
  static constexpr size_t kLookupBlock = 32;
  static constexpr size_t kHashRing = 2 * kLookupBlock;
  // Both are inlined into Pull and Push, where the ring and the rows are
  // local arrays: the compiler then knows that writing them changes no
  // member, and keeps the index and chunk pointers in registers.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void StartLookUps(const RowIndex::View& index,
                                                 absl::Span<const uint64_t> keys,
                                                 uint64_t* hashes) const;
  struct RowLocator;
  ABSL_ATTRIBUTE_ALWAYS_INLINE void LookUpBlock(const RowIndex::View& index,
                                                const RowLocator& locate,
                                                absl::Span<const uint64_t> keys,
                                                size_t begin, size_t end,
                                                size_t value_bytes, bool for_write,
                                                uint64_t* hashes, uint32_t* rows,
                                                float** values) const;
  // Whether `memo` holds rows found in this generation for a list of n keys.
  bool MemoCurrent(const RowMemo* memo, size_t n) const {
    return memo != nullptr && memo->generation == generation_ && memo->rows.size() == n;
  }
  // Pull and Push by index lookups; `found`, when not null, receives each
  // key's row (kNotFound: none).
  void PullLookingUp(absl::Span<const uint64_t> keys, float* out, uint32_t* found);
  void PushLookingUp(absl::Span<const uint64_t> keys, const float* grads, float lr_scale,
                     uint32_t* found);
  // Pull and Push by the rows of a current memo (memo->generation ==
  // generation_), looking up only the keys it holds as absent; they update
  // it. A push whose row creation drops a row marks the memo stale and
  // looks up the rest of its keys.
  void PullRemembered(absl::Span<const uint64_t> keys, float* out, RowMemo* memo);
  void PushRemembered(absl::Span<const uint64_t> keys, const float* grads, float lr_scale,
                      RowMemo* memo);
  // Bytes allocated when holding `rows` rows (index grown for them).
  size_t BytesFor(size_t rows) const;
  // Creates the row of `key` (absent), evicting if needed; kNil if it
  // cannot fit. Its values are the initial ones, or a copy of the
  // state_floats() floats at `state` when that is not null.
  uint32_t CreateRow(uint64_t key, const float* state = nullptr);
  // The row of `key`, which has none in RAM, for a push: promoted from the
  // disk tier (touched), else created once the admission filter lets it
  // in. kNil, counted, when the filter only counted the push
  // (pushes_filtered) or the row does not fit (keys_dropped).
  uint32_t RowForPush(uint64_t key);
  // With a disk tier: writes row r's full state and bookkeeping to disk
  // (the caller then drops it). When the tier refuses (max_disk_bytes) the
  // row is lost, as without a tier; the tier counts it. When the tier
  // fails, tier_failure() says so. Whether the row is on disk now.
  bool Demote(uint32_t r);
  // With a disk tier: takes `key`'s row (absent from RAM) back from disk,
  // creating its RAM row (which may demote another) with the state and
  // bookkeeping it had; kNil when the tier has no live row of it.
  uint32_t Promote(uint64_t key);
  // Promote's second half: creates `key`'s RAM row (absent) from the cold
  // `state` and `tag` read from the tier, and deletes the cold row.
  uint32_t PromoteRead(uint64_t key, const float* state, const ColdRowTag& tag);
  // With a disk tier: reads the rows of cold_keys_ in one batch into
  // cold_states_, cold_tags_ and cold_found_; false, the failure noted
  // (tier_failure()), when the read failed.
  bool ReadColdKeys();
  // Push's work, between its setting up and its counting.
  void PushRows(absl::Span<const uint64_t> keys, const float* grads,
                float lr_scale, RowMemo* memo);
  // With a disk tier, during a push: reads the rows of push_keys_ absent
  // from RAM from the tier in one batch, into cold_ready_.
  void PrefetchPushRows();
  // With a disk tier: `key`'s cold row for a promotion, from what the push
  // read ahead or else from disk; *state is valid until the next tier read.
  // false when the tier has no live row of it (TTL-expired ones are
  // deleted) or failed.
  bool TakeCold(uint64_t key, const float** state, ColdRowTag* tag);
  // With a disk tier: answers the pulled keys of cold_pulls_ (absent from
  // RAM) into out (dim() floats at each one's position), in one batched
  // read: the cold row's weights, or the initial values when the tier has
  // no live row of the key (TTL-expired ones are deleted). The rows found
  // are promoted (after every value is copied). Empties cold_pulls_.
  void ReadColdPulls(float* out);
  // Reads `key`'s cold row into cold_state_ and *tag; false when the tier
  // has none, or its TTL expired (then it is deleted), or failed (then
  // tier_failure() says so).
  bool FetchCold(uint64_t key, ColdRowTag* tag);
  // Deletes `key`'s cold row, found past its TTL, and counts it as a TTL
  // eviction.
  void DropExpiredCold(uint64_t key);
  // Deletes `key`'s cold row (it is promoted, replaced or expired); the
  // reader's copies of it go too.
  void DeleteCold(uint64_t key);
  // Whether a row last touched at (step, second) has outlived a TTL.
  bool Expired(uint64_t last_step, uint32_t last_second) const {
    return (ttl_steps_ > 0 && step_ - last_step > ttl_steps_ &&
            step_ > last_step) ||
           (ttl_seconds_ > 0 && now_second_ > last_second &&
            now_second_ - last_second > ttl_seconds_);
  }
  void Touch(uint32_t r);
  void Unlink(uint32_t r);
  void PushFront(uint32_t r);
  // Frees row r. `changed`: the row watch hears of it (not for a row that
  // went to disk as it was: its value did not change).
  void Drop(uint32_t r, bool changed = true);
  uint32_t PickVictim();

  const uint32_t dim_;
  const size_t stride_;      // floats per row: dim * (1 + state_size)
  const bool evictable_;     // rows carry RowMeta and may be dropped
  const size_t meta_bytes_;  // sizeof(RowMeta) or 0
  const size_t row_bytes_;   // meta_bytes_ + stride_ floats (+ alignment)
  const int chunk_shift_;    // log2 of rows per chunk
  const uint32_t chunk_rows_;
  const uint32_t admit_after_;  // <= 1: no filter
  const uint64_t ttl_steps_;
  const uint64_t ttl_seconds_;
  const EvictionPolicy eviction_;
  std::unique_ptr<AdmissionSketch> sketch_;  // only with a filter
  size_t max_rows_ = ~size_t{0};

  RowIndex index_;
  // Chunks come from malloc (possibly aligned_alloc), hence free().
  struct FreeChunk {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<unsigned char[], FreeChunk>> chunks_;
  // Values(r) from locals, for the loops of Pull and Push (as
  // RowIndex::View). Valid until a chunk is added.
  struct RowLocator {
    const std::unique_ptr<unsigned char[], FreeChunk>* chunks;
    int shift;
    uint32_t mask;
    size_t row_bytes;
    size_t meta_bytes;
    unsigned char* Bytes(uint32_t r) const {
      return chunks[r >> shift].get() + static_cast<size_t>(r & mask) * row_bytes;
    }
    float* Values(uint32_t r) const {
      return reinterpret_cast<float*>(Bytes(r) + meta_bytes);
    }
  };
  RowLocator Locator() const {
    return {chunks_.data(), chunk_shift_, chunk_rows_ - 1, row_bytes_, meta_bytes_};
  }
  uint32_t high_water_ = 0;   // rows ever handed out (free ones included)
  uint32_t free_head_ = kNil;
  uint32_t mru_ = kNil;       // recency list ends
  uint32_t lru_ = kNil;
  uint64_t step_ = 0;
  bool started_ = false;  // created_ is set by the first Advance()
  absl::Time created_;
  uint32_t now_second_ = 0;
  uint64_t rng_;              // victim sampling (LFU), deterministic
  uint64_t generation_;       // see generation(); renewed by Drop
  std::unique_ptr<DiskTier> tier_;  // null without a disk tier
  // Declared after tier_: destroyed (its thread joined) before the tier.
  std::unique_ptr<ColdReader> reader_;
  std::vector<float> cold_state_;   // one row read from the tier
  // A pull's keys absent from RAM, and their positions in the pull, read
  // from the tier together once the rows in RAM are copied; and the
  // buffers of that read (kept to spare allocations).
  struct ColdPull {
    uint64_t key;
    size_t at;
  };
  std::vector<ColdPull> cold_pulls_;
  std::vector<uint64_t> cold_keys_;
  std::vector<float> cold_states_;
  std::vector<ColdRowTag> cold_tags_;
  std::vector<bool> cold_found_;
  // The push under way (tiered tables), whether its cold keys were read
  // ahead, and those found: key -> position in cold_states_ / cold_tags_.
  absl::Span<const uint64_t> push_keys_;
  bool push_prefetched_ = false;
  absl::flat_hash_map<uint64_t, size_t> cold_ready_;
  mutable absl::Status tier_failure_;  // see tier_failure()
};

class DenseTable : public Table {
 public:
  DenseTable(const TableConfig& config, std::unique_ptr<Optimizer> optimizer);
  DenseTable* AsDense() override { return this; }
  const DenseTable* AsDense() const override { return this; }
  TableStats Stats() const override;

  uint64_t size() const { return size_; }
  uint64_t block_size() const { return block_size_; }
  size_t MemoryBytes() const override;

  // INVALID_ARGUMENT unless every segment is non-empty, inside the table
  // and inside one block.
  absl::Status ValidateSegments(
      const Segments& segments) const;

  // Segments must be valid. Values are laid out segment after segment.
  void Pull(const Segments& segments, float* out);
  void Push(const Segments& segments, const float* grads,
            float lr_scale = 1.0f);
  // Overwrites the values (not the optimizer state) of the segments.
  void Assign(const Segments& segments, const float* values);

  // Number of blocks: ceil(size() / block_size()).
  uint64_t num_blocks() const {
    return size_ / block_size_ + (size_ % block_size_ != 0 ? 1 : 0);
  }
  // Elements in block `block` (< num_blocks()): block_size(), or fewer for
  // the last block.
  size_t BlockLength(uint64_t block) const;
  // Blocks created so far (by a push, pull, assign or import).
  size_t num_created_blocks() const { return blocks_.size(); }

  // Calls fn(block, values, state) for every created block in increasing
  // block order (checkpoints); values holds BlockLength(block) floats and
  // state BlockLength(block) * state_size(), interleaved per element. The
  // spans point into the table and are valid only during the call. Stops
  // at, and returns, the first non-OK status fn returns. Touches nothing.
  absl::Status ForEachBlock(
      absl::FunctionRef<absl::Status(uint64_t block,
                                     absl::Span<const float> values,
                                     absl::Span<const float> state)>
          fn) const;

  // Block `block`'s values and state (as ForEachBlock gives them) in
  // *values and *state; false, leaving them alone, if it is not created.
  // Valid until the table changes. Touches nothing.
  bool FindBlock(uint64_t block, absl::Span<const float>* values,
                 absl::Span<const float>* state) const;

  // Sets block `block`'s values and optimizer state, creating it if
  // absent, bit for bit: restoring a checkpoint. INVALID_ARGUMENT, with
  // the table unchanged, if block >= num_blocks(), the sizes are not
  // BlockLength(block) and BlockLength(block) * state_size(), or a value
  // is not finite.
  absl::Status ImportBlock(uint64_t block, absl::Span<const float> values,
                           absl::Span<const float> state);

  // Drops every created block that `drop` selects (a slot moved to another
  // server), freeing its memory; it is created again, with initial values,
  // when next used. Returns how many blocks were dropped.
  size_t DropBlocks(absl::FunctionRef<bool(uint64_t block)> drop);

 private:
  struct Block {
    std::vector<float> values;
    std::vector<float> state;
  };
  Block& GetBlock(uint64_t block);

  const uint64_t size_;
  const uint64_t block_size_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Block>> blocks_;
};

}  // namespace ps

#endif  // PS_SERVER_TABLE_H_
