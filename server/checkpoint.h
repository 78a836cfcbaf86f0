// Consistent checkpoints of the servers' tables, restorable onto any number
// of servers.
//
// A checkpoint of job clock C lives in its own directory
//
//   <root>/ckpt-<C as 20 zero-padded digits>/shard-<rank>.ckpt   one per server
//   <root>/ckpt-<C as 20 zero-padded digits>/MANIFEST
//
// Every server writes its shard file (WriteShard); once all of them are
// durable, one process (the scheduler) writes the MANIFEST
// (WriteManifest), which lists the shard files with their sizes and
// checksums. The MANIFEST is the commit point: a directory without a valid
// one is an incomplete checkpoint and is never restored. Every file is
// written to "<name>.tmp", fsync'd and renamed, and the directory fsync'd,
// so a crash leaves either the old state or the new file, never a torn one.
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
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/checkpoint.pb.h"
#include "server/table.h"

namespace ps {

inline constexpr char kManifestFileName[] = "MANIFEST";

// "ckpt-00000000000000000400" for clock 400.
std::string CheckpointDirName(uint64_t clock);
// The clock of a name CheckpointDirName made; nullopt for any other name.
std::optional<uint64_t> ParseCheckpointDirName(absl::string_view name);
// root + "/" + CheckpointDirName(clock).
std::string CheckpointPath(absl::string_view root, uint64_t clock);
// "shard-3.ckpt" for rank 3.
std::string ShardFileName(uint32_t rank);

// XXH64 of n bytes: the checksum used by every checkpoint file (and
// ShardFile.checksum).
uint64_t Checksum64(const void* data, size_t n, uint64_t seed = 0);

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

// Writes `checkpoint_dir`/MANIFEST durably (tmp file, fsync, rename,
// directory fsync), committing the checkpoint. INVALID_ARGUMENT if the
// manifest is inconsistent (num_servers is 0 or does not match the shards,
// a rank repeats or is out of range, a file is not ShardFileName(rank));
// FAILED_PRECONDITION if a listed shard file is missing or its size
// differs; the errno's code for an I/O error.
absl::Status WriteManifest(const std::string& checkpoint_dir,
                           const CheckpointManifest& manifest);

// Reads and checks `checkpoint_dir`/MANIFEST alone (magic, checksum,
// consistency as WriteManifest requires it, clock matching the directory's
// name when that is a CheckpointDirName). NOT_FOUND if there is no
// MANIFEST (an incomplete checkpoint) or no such directory; DATA_LOSS
// naming what is wrong.
absl::StatusOr<CheckpointManifest> ReadManifest(
    const std::string& checkpoint_dir);

// ReadManifest, then checks that every listed shard file exists with the
// listed size, starts with the right magic number and matches the listed
// whole-file checksum (this reads every byte). NOT_FOUND if there is no
// MANIFEST; DATA_LOSS naming the file and what is wrong otherwise.
absl::StatusOr<CheckpointManifest> VerifyCheckpoint(
    const std::string& checkpoint_dir);

// A checkpoint directory found under a root.
struct CheckpointDirEntry {
  uint64_t clock = 0;
  std::string path;  // root + "/" + CheckpointDirName(clock)
};

// The checkpoint directories under `root` (names CheckpointDirName makes;
// anything else is ignored), newest (largest clock) first, complete or
// not. NOT_FOUND if root does not exist; the errno's code if it cannot be
// read.
absl::StatusOr<std::vector<CheckpointDirEntry>> ListCheckpoints(
    const std::string& root);

struct LatestCheckpoint {
  std::string dir;  // the checkpoint's directory
  CheckpointManifest manifest;
  // Every newer checkpoint directory that was passed over, newest first,
  // as "ckpt-...: reason" (incomplete, or what VerifyCheckpoint found).
  // The caller should log them: "checkpoint X is corrupt (...); using Y".
  std::vector<std::string> skipped;
};

// The newest checkpoint under `root` that VerifyCheckpoint accepts.
// NOT_FOUND if there is none (the message lists what was skipped); the
// errno's code if root cannot be read.
absl::StatusOr<LatestCheckpoint> FindLatestCheckpoint(const std::string& root);

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

// Deletes all but the newest `keep` complete checkpoints under `root`
// (complete: ReadManifest succeeds), and every incomplete checkpoint
// directory older than the newest complete one (newer ones may be in the
// middle of being written). A MANIFEST is deleted first, so a deletion
// interrupted half way leaves an incomplete checkpoint, never a complete
// one with missing shards. Returns the names of the directories deleted.
// INVALID_ARGUMENT if keep is 0; NOT_FOUND if root does not exist; on an
// I/O error, goes on with the others and returns the first error.
absl::StatusOr<std::vector<std::string>> PruneCheckpoints(
    const std::string& root, uint32_t keep);

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
