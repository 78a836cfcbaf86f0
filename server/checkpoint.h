// Consistent checkpoints of the servers' tables, restorable onto any number
// of servers: the server's side of //checkpoint, which holds the file format
// (checkpoint/format.h) and the catalog of checkpoints on disk
// (checkpoint/catalog.h: names, MANIFEST, verify, latest, prune; included
// here, so servers and tests see one API).
//
// A shard file holds a header (proto/checkpoint.proto ShardHeader: clock,
// rank, the TableConfig of every table) and then every row of every table
// with its full state (weights and optimizer state, bit for bit), in
// records that each carry a checksum, and ends with a checksum of the whole
// file. Rows are routed by key on restore, not by the slot map that wrote
// them, so a checkpoint written by N servers restores onto M: each new
// server reads every shard file and keeps the rows its slots own
// (RestoreShards with OwnedSlotsFilter).
//
// Nothing read from disk is trusted: truncated or missing files, flipped
// bytes, wrong magic numbers and absurd counts are reported as DATA_LOSS
// naming the file and what is wrong; nothing is allocated from a count that
// was not checked against the file's size and the table configs first.
//
// Thread safety: the functions are thread-compatible and keep no state
// between calls. Different processes may write different shard files of
// one checkpoint at the same time. The tables passed in are read (written,
// for RestoreShards) without locking: the caller must keep every other
// thread away from them for the duration of the call.
#ifndef PS_SERVER_CHECKPOINT_H_
#define PS_SERVER_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/catalog.h"
#include "common/status.h"
#include "proto/checkpoint.pb.h"
#include "server/table.h"

namespace ps {

// Selects the rows (by table id and key) and dense blocks (by table id and
// block index) a write or restore takes. An empty function selects all.
struct RowFilter {
  std::function<bool(uint32_t table_id, uint64_t key)> sparse;
  std::function<bool(uint32_t table_id, uint64_t block)> dense;
};

// The rows and blocks of the slots that `rank` owns in `slot_owner`
// (slot_owner[s] is the rank serving slot s; its size is num_slots), as
// common/hash.h routes them: SparseSlot and DenseBlockSlot. Copies
// slot_owner.
RowFilter OwnedSlotsFilter(absl::Span<const uint32_t> slot_owner,
                           uint32_t rank);

// Writes `checkpoint_dir`/ShardFileName(rank) with every row and block of
// `tables` that `keep` selects (a server that also holds backup copies of
// other servers' slots passes OwnedSlotsFilter), creating the directory
// (and its parents) if needed, and makes it durable (tmp file, fsync,
// rename, directory fsync). Streams: memory use is a few MiB, not
// proportional to the tables. Overwrites an existing file of that name.
// Returns the entry for the manifest. Errors: INVALID_ARGUMENT for a null
// table or two tables with the same id; FAILED_PRECONDITION if a value in a
// table is not finite (it could never be restored); the errno's code for
// an I/O error (e.g. RESOURCE_EXHAUSTED when the disk is full). On an error
// no file of that name is created and an existing one is left as it was
// (except when only the final directory fsync fails: the file is then in
// place but may not survive a crash).
absl::StatusOr<ShardFile> WriteShard(const std::string& checkpoint_dir,
                                     uint32_t rank, uint64_t clock,
                                     uint32_t num_slots,
                                     absl::Span<const Table* const> tables,
                                     const RowFilter& keep = {});

// A shard write that leaves the rows on disk tiers to another thread, so a
// server with tiered tables stops serving only while it writes what it
// holds in RAM (bounded by the memory budgets), not its whole tables.
//
// Begin runs where WriteShard would, with every other thread kept away
// from the tables: it writes every row in RAM and every dense block that
// `keep` selects to a spill shard in `spill_dir` (local scratch space,
// created if needed) and takes a snapshot of each table's disk tier
// (DiskTier::Snapshot). From then on the tables may change. Finish, on any
// thread and once, writes the shard file of `checkpoint_dir` that
// WriteShard would have written at Begin: for each table in order, its
// records from the spill, then the cold rows of its tier's snapshot that
// `keep` selects; then removes the spill. Finish touches no table, only
// the tiers, which must outlive this object.
//
// Errors: Begin and Finish as WriteShard (Begin's own I/O errors name the
// spill). A disk tier's read error during Finish fails it and is also
// tier_error(): the caller fences that table's server, as for any failed
// read of its tier.
class ShardWriteInParts {
 public:
  static absl::StatusOr<std::unique_ptr<ShardWriteInParts>> Begin(
      const std::string& checkpoint_dir, const std::string& spill_dir,
      uint32_t rank, uint64_t clock, uint32_t num_slots,
      absl::Span<const Table* const> tables, const RowFilter& keep = {});
  ~ShardWriteInParts();
  ShardWriteInParts(const ShardWriteInParts&) = delete;
  ShardWriteInParts& operator=(const ShardWriteInParts&) = delete;

  absl::StatusOr<ShardFile> Finish();
  // The first error a disk tier's read met in Finish; OK if none.
  const absl::Status& tier_error() const { return tier_error_; }
  // The id of the table whose tier failed (tier_error()).
  uint32_t tier_error_table() const { return tier_error_table_; }
  // Sparse rows in RAM when Begin ran (what it read, backup copies
  // included), and rows Finish wrote from the tiers.
  uint64_t spilled_rows() const { return spilled_rows_; }
  uint64_t cold_rows() const { return cold_rows_; }

 private:
  struct Cold;  // a tiered table's part of Finish
  ShardWriteInParts() = default;

  std::string checkpoint_dir_, spill_dir_;
  ShardHeader header_;
  ShardFile spill_;
  RowFilter keep_;
  std::vector<std::unique_ptr<Cold>> cold_;  // by table index; null: none
  absl::Status tier_error_;
  uint32_t tier_error_table_ = 0;
  uint64_t spilled_rows_ = 0, cold_rows_ = 0;
};

struct RestoreStats {
  uint64_t files = 0;         // shard files read
  uint64_t bytes = 0;         // bytes read
  uint64_t rows_read = 0;     // sparse rows in the files
  uint64_t rows_restored = 0; // sparse rows `keep` selected and imported
  uint64_t blocks_read = 0;
  uint64_t blocks_restored = 0;
};

// Reads every shard file of the checkpoint in `checkpoint_dir` (as
// `manifest`, from VerifyCheckpoint or FindLatestCheckpoint, lists them)
// and imports the rows and blocks `keep` selects into `tables`
// (SparseTable::ImportRow, DenseTable::ImportBlock: created or
// overwritten, bit for bit). Restoring a checkpoint of N servers onto M:
// each of the M servers passes OwnedSlotsFilter for its slots.
//
// Before importing anything, reads every file's header and checks that the
// checkpoint's tables and `tables` have the same ids, kinds, dims,
// optimizer rules and dense size and block size: FAILED_PRECONDITION
// naming the mismatch otherwise (the tables are then unchanged).
// Everything read is checked (record checksums before a record is
// imported, the whole-file checksum, sizes against the manifest):
// DATA_LOSS naming the file and what is wrong. RESOURCE_EXHAUSTED if a
// table's memory budget cannot hold its rows and it does not evict (one
// that evicts drops rows to make room, counted in its evictions_budget).
// No two shard files of a checkpoint hold the same row; if they did, the
// later file's copy would win.
// After an error other than FAILED_PRECONDITION the tables may hold part
// of the checkpoint: discard them (or restore again) rather than serve
// them. INVALID_ARGUMENT for a null table or repeated table id.
absl::StatusOr<RestoreStats> RestoreShards(const std::string& checkpoint_dir,
                                           const CheckpointManifest& manifest,
                                           absl::Span<Table* const> tables,
                                           const RowFilter& keep = {});

// A digest of parameters that does not depend on how rows are split into
// servers or shard files, nor on their order: the sum (mod 2^64) of a hash
// of (table id, key or block, full state bytes) per sparse row and dense
// block. Digests of disjoint parts add up (operator+=), so the digest of a
// checkpoint equals the sum of the digests of the tables restored from it
// on any number of servers. Dense blocks hash with their block index, so
// the digest depends on the block size.
struct ParameterDigest {
  uint64_t digest = 0;
  uint64_t sparse_rows = 0;
  uint64_t dense_blocks = 0;

  ParameterDigest& operator+=(const ParameterDigest& other);
  bool operator==(const ParameterDigest& other) const;
  bool operator!=(const ParameterDigest& other) const {
    return !(*this == other);
  }
};

// The digest of every row and block of `tables` (no table may be null).
ParameterDigest DigestTables(absl::Span<const Table* const> tables);

// The digest of the checkpoint in `checkpoint_dir`, reading (and checking,
// as RestoreShards does) every shard file its MANIFEST lists. Errors as
// ReadManifest and RestoreShards.
absl::StatusOr<ParameterDigest> DigestCheckpoint(
    const std::string& checkpoint_dir);

}  // namespace ps

#endif  // PS_SERVER_CHECKPOINT_H_
