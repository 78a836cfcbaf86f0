// The checkpoint catalog: how checkpoints are named, committed, verified,
// found and pruned on the file system. Shared by the servers (which write
// shard files and restore), the scheduler (which commits, prunes and finds
// the latest checkpoint) and offline tools; it links no table.
//
// A checkpoint of job clock C lives in its own directory
//
//   <root>/ckpt-<C as 20 zero-padded digits>/shard-<rank>.ckpt   one per server
//   <root>/ckpt-<C as 20 zero-padded digits>/MANIFEST
//
// Every server writes its shard file (format.h WriteShardFile, through
// server/checkpoint.h WriteShard); once all of them are durable, one
// process (the scheduler) writes the MANIFEST (WriteManifest), which lists
// the shard files with their sizes and checksums. The MANIFEST is the
// commit point: a directory without a valid one is an incomplete
// checkpoint and is never restored. Every file is written to
// "<name>.tmp", fsync'd and renamed, and the directory fsync'd, so a crash
// leaves either the old state or the new file, never a torn one.
//
// Nothing read from disk is trusted: truncated or missing files, flipped
// bytes, wrong magic numbers and absurd sizes are reported as DATA_LOSS
// naming the file and what is wrong.
//
// Thread safety: the functions are thread-compatible and keep no state
// between calls.
#ifndef PS_CHECKPOINT_CATALOG_H_
#define PS_CHECKPOINT_CATALOG_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/status.h"
#include "proto/checkpoint.pb.h"

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

// A run of bytes for Checksum64Pieces.
struct BytePiece {
  const void* data;
  size_t size;
};
// Checksum64 of the concatenation of `pieces`, without copying them into
// one buffer.
uint64_t Checksum64Pieces(std::initializer_list<BytePiece> pieces,
                          uint64_t seed = 0);

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

// INVALID_ARGUMENT naming what is inconsistent in a manifest (as
// WriteManifest and ReadManifest check it); OK otherwise.
absl::Status ValidateManifest(const CheckpointManifest& manifest);

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

}  // namespace ps

#endif  // PS_CHECKPOINT_CATALOG_H_
