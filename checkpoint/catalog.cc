// The catalog of checkpoints on the file system (catalog.h). The MANIFEST
// file:
//   "PSCKMNFT", u32 version (1), u32 payload bytes, payload:
//   CheckpointManifest, u64 XXH64 of every byte before it.
// All integers are little-endian (checkpoint_io.h).
#include "checkpoint/catalog.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint_io.h"
#include "checkpoint/format_internal.h"
#include "common/status.h"

namespace ps {
namespace {

namespace fs = std::filesystem;
using checkpoint_internal::Corrupt;
using checkpoint_internal::FileReader;
using checkpoint_internal::FileWriter;
using checkpoint_internal::IoError;
using checkpoint_internal::JoinPath;
using checkpoint_internal::kChecksumBytes;
using checkpoint_internal::kFormatVersion;
using checkpoint_internal::kManifestMagic;
using checkpoint_internal::kPreambleBytes;
using checkpoint_internal::kShardMagic;
using checkpoint_internal::OpenListed;
using checkpoint_internal::Put32;
using checkpoint_internal::Put64;
using checkpoint_internal::ReadPreamble;
using checkpoint_internal::ReadTrailer;
using checkpoint_internal::SyncDir;
using checkpoint_internal::WriteFileAtomically;
using checkpoint_internal::Xxh64;

constexpr uint64_t kMaxManifestBytes = uint64_t{64} << 20;
// Chunk size of Verify's reads.
constexpr size_t kVerifyChunkBytes = size_t{1} << 20;

std::string BaseName(absl::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  const size_t slash = path.rfind('/');
  return std::string(slash == absl::string_view::npos ? path : path.substr(slash + 1));
}

// VerifyCheckpoint without the checkpoint's name in front of errors.
absl::StatusOr<CheckpointManifest> Verify(const std::string& dir) {
  PS_ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadManifest(dir));
  for (const ShardFile& entry : manifest.shards()) {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<FileReader> file,
                        OpenListed(dir, entry.file()));
    if (file->size() != entry.bytes()) {
      return Corrupt(entry.file(), absl::StrCat("size is ", file->size(),
                                                " bytes, the MANIFEST says ",
                                                entry.bytes()));
    }
    PS_RETURN_IF_ERROR(ReadPreamble(*file, kShardMagic).status());
    std::unique_ptr<unsigned char[]> chunk(new unsigned char[kVerifyChunkBytes]);
    while (file->remaining() > kChecksumBytes) {
      const size_t n = static_cast<size_t>(
          std::min<uint64_t>(kVerifyChunkBytes, file->remaining() - kChecksumBytes));
      PS_RETURN_IF_ERROR(file->Read(chunk.get(), n));
    }
    PS_RETURN_IF_ERROR(ReadTrailer(*file, entry.checksum()));
  }
  return manifest;
}

}  // namespace

uint64_t Checksum64(const void* data, size_t n, uint64_t seed) {
  Xxh64 hash(seed);
  hash.Update(data, n);
  return hash.Digest();
}

uint64_t Checksum64Pieces(std::initializer_list<BytePiece> pieces, uint64_t seed) {
  Xxh64 hash(seed);
  for (const BytePiece& piece : pieces) hash.Update(piece.data, piece.size);
  return hash.Digest();
}

std::string CheckpointDirName(uint64_t clock) {
  return absl::StrFormat("ckpt-%020u", clock);
}

std::optional<uint64_t> ParseCheckpointDirName(absl::string_view name) {
  constexpr absl::string_view kPrefix = "ckpt-";
  if (name.size() != kPrefix.size() + 20 || name.substr(0, kPrefix.size()) != kPrefix) {
    return std::nullopt;
  }
  uint64_t clock = 0;
  for (char c : name.substr(kPrefix.size())) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (clock > (~uint64_t{0} - digit) / 10) return std::nullopt;
    clock = clock * 10 + digit;
  }
  return clock;
}

std::string CheckpointPath(absl::string_view root, uint64_t clock) {
  return JoinPath(root, CheckpointDirName(clock));
}

std::string ShardFileName(uint32_t rank) {
  return absl::StrCat("shard-", rank, ".ckpt");
}

// INVALID_ARGUMENT naming what is inconsistent in a manifest.
absl::Status ValidateManifest(const CheckpointManifest& m) {
  if (m.num_servers() == 0 ||
      m.shards_size() != static_cast<int64_t>(m.num_servers())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_servers is ", m.num_servers(), " but ", m.shards_size(),
        " shard files are listed"));
  }
  // Ranks are 0..num_servers-1, or for an elastic job (which adds and
  // removes servers) any distinct ranks below the most a job may have.
  constexpr uint32_t kMaxRanks = 1024;
  std::vector<bool> seen(kMaxRanks, false);
  for (const ShardFile& s : m.shards()) {
    if (s.rank() >= kMaxRanks || seen[s.rank()]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard rank ", s.rank(), " is repeated or not below ", kMaxRanks));
    }
    seen[s.rank()] = true;
    if (s.file() != ShardFileName(s.rank())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the shard of rank ", s.rank(), " is named '", absl::CHexEscape(s.file()),
          "', want ", ShardFileName(s.rank())));
    }
    if (s.bytes() < kPreambleBytes + kChecksumBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the shard of rank ", s.rank(), " is listed with ", s.bytes(),
          " bytes, too few for a shard file"));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteManifest(const std::string& checkpoint_dir,
                           const CheckpointManifest& manifest) {
  PS_RETURN_IF_ERROR(Annotate(ValidateManifest(manifest), "manifest"));
  for (const ShardFile& entry : manifest.shards()) {
    const std::string path = JoinPath(checkpoint_dir, entry.file());
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot commit the checkpoint: ", path, ": ", std::strerror(errno)));
    }
    if (static_cast<uint64_t>(st.st_size) != entry.bytes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot commit the checkpoint: ", path, " has ", st.st_size,
          " bytes, the manifest says ", entry.bytes()));
    }
  }
  const std::string payload = manifest.SerializeAsString();
  if (payload.size() > kMaxManifestBytes) {
    return absl::InvalidArgumentError("the manifest exceeds 64 MiB");
  }
  return WriteFileAtomically(checkpoint_dir, JoinPath(checkpoint_dir, kManifestFileName),
                          [&](FileWriter& out) -> absl::Status {
                            unsigned char preamble[kPreambleBytes];
                            std::memcpy(preamble, kManifestMagic, sizeof(kManifestMagic));
                            Put32(preamble + 8, kFormatVersion);
                            Put32(preamble + 12, static_cast<uint32_t>(payload.size()));
                            PS_RETURN_IF_ERROR(out.Append(preamble, sizeof(preamble)));
                            PS_RETURN_IF_ERROR(out.Append(payload.data(), payload.size()));
                            unsigned char trailer[kChecksumBytes];
                            Put64(trailer, out.checksum());
                            return out.Append(trailer, sizeof(trailer));
                          })
      .status();
}

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& checkpoint_dir) {
  const std::string name = kManifestFileName;
  auto opened = FileReader::Open(JoinPath(checkpoint_dir, name), name);
  if (!opened.ok()) {
    if (absl::IsNotFound(opened.status())) {
      std::error_code ec;
      if (!fs::is_directory(checkpoint_dir, ec)) {
        return absl::NotFoundError("no such checkpoint directory");
      }
      return absl::NotFoundError("incomplete: no MANIFEST");
    }
    return opened.status();
  }
  FileReader& file = **opened;
  if (file.size() > kMaxManifestBytes + kPreambleBytes + kChecksumBytes) {
    return Corrupt(name, absl::StrCat("absurd size of ", file.size(), " bytes"));
  }
  PS_ASSIGN_OR_RETURN(const uint32_t stored_bytes,
                      ReadPreamble(file, kManifestMagic));
  const uint64_t payload_bytes = file.size() - kPreambleBytes - kChecksumBytes;
  if (stored_bytes != payload_bytes) {
    return Corrupt(name, absl::StrCat("holds ", payload_bytes,
                                      " payload bytes, its preamble says ",
                                      stored_bytes));
  }
  std::string payload(static_cast<size_t>(payload_bytes), '\0');
  PS_RETURN_IF_ERROR(file.Read(payload.data(), payload.size()));
  PS_RETURN_IF_ERROR(ReadTrailer(file, file.checksum()));
  CheckpointManifest manifest;
  if (!manifest.ParseFromString(payload)) return Corrupt(name, "does not parse");
  if (absl::Status valid = ValidateManifest(manifest); !valid.ok()) {
    return Corrupt(name, valid.message());
  }
  const std::optional<uint64_t> dir_clock =
      ParseCheckpointDirName(BaseName(checkpoint_dir));
  if (dir_clock.has_value() && *dir_clock != manifest.clock()) {
    return Corrupt(name, absl::StrCat("is of clock ", manifest.clock(),
                                      ", the directory's name says ", *dir_clock));
  }
  return manifest;
}

absl::StatusOr<CheckpointManifest> VerifyCheckpoint(
    const std::string& checkpoint_dir) {
  absl::StatusOr<CheckpointManifest> manifest = Verify(checkpoint_dir);
  if (!manifest.ok()) {
    return Annotate(manifest.status(), absl::StrCat("checkpoint ", checkpoint_dir));
  }
  return manifest;
}

absl::StatusOr<std::vector<CheckpointDirEntry>> ListCheckpoints(
    const std::string& root) {
  std::error_code ec;
  fs::directory_iterator it(root, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint root ", root, " does not exist"));
    }
    return IoError(ec.value(), "cannot list", root);
  }
  std::vector<CheckpointDirEntry> entries;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::optional<uint64_t> clock = ParseCheckpointDirName(name);
    std::error_code type_ec;
    if (!clock.has_value() || !it->is_directory(type_ec)) continue;
    entries.push_back({*clock, JoinPath(root, name)});
  }
  if (ec) return IoError(ec.value(), "cannot list", root);
  std::sort(entries.begin(), entries.end(),
            [](const CheckpointDirEntry& a, const CheckpointDirEntry& b) {
              return a.clock > b.clock;
            });
  return entries;
}

absl::StatusOr<LatestCheckpoint> FindLatestCheckpoint(const std::string& root) {
  PS_ASSIGN_OR_RETURN(std::vector<CheckpointDirEntry> entries, ListCheckpoints(root));
  LatestCheckpoint latest;
  for (const CheckpointDirEntry& entry : entries) {
    absl::StatusOr<CheckpointManifest> manifest = Verify(entry.path);
    if (manifest.ok()) {
      latest.dir = entry.path;
      latest.manifest = *std::move(manifest);
      return latest;
    }
    latest.skipped.push_back(absl::StrCat(CheckpointDirName(entry.clock), ": ",
                                          manifest.status().message()));
  }
  std::string message = absl::StrCat("no valid checkpoint in ", root);
  if (!latest.skipped.empty()) {
    absl::StrAppend(&message, " (skipped ", absl::StrJoin(latest.skipped, "; "), ")");
  }
  return absl::NotFoundError(message);
}

absl::StatusOr<std::vector<std::string>> PruneCheckpoints(const std::string& root,
                                                          uint32_t keep) {
  if (keep == 0) return absl::InvalidArgumentError("keep must be at least 1");
  PS_ASSIGN_OR_RETURN(std::vector<CheckpointDirEntry> entries, ListCheckpoints(root));
  std::vector<const CheckpointDirEntry*> doomed;
  uint32_t complete_seen = 0;
  for (const CheckpointDirEntry& entry : entries) {  // newest first
    if (ReadManifest(entry.path).ok()) {
      if (++complete_seen > keep) doomed.push_back(&entry);
    } else if (complete_seen > 0) {
      // Older than the newest complete checkpoint: no writer will finish it.
      doomed.push_back(&entry);
    }
  }
  std::vector<std::string> removed;
  absl::Status first_error;
  for (const CheckpointDirEntry* entry : doomed) {
    const std::string manifest = JoinPath(entry->path, kManifestFileName);
    if (::unlink(manifest.c_str()) != 0 && errno != ENOENT) {
      first_error.Update(IoError(errno, "cannot delete", manifest));
      continue;
    }
    std::error_code ec;
    fs::remove_all(entry->path, ec);
    if (ec) {
      first_error.Update(IoError(ec.value(), "cannot delete", entry->path));
      continue;
    }
    removed.push_back(CheckpointDirName(entry->clock));
  }
  if (!doomed.empty()) first_error.Update(SyncDir(root));
  if (!first_error.ok()) return first_error;
  return removed;
}

}  // namespace ps
