// ckpt_tool: inspect checkpoints (checkpoint/catalog.h) offline.
//
//   ckpt_tool --root=DIR          one line per checkpoint directory under DIR,
//                                 newest first, with its validity
//   ckpt_tool --verify=CKPT_DIR   checks the manifest and every shard file
//   ckpt_tool --digest=CKPT_DIR   prints the checkpoint's parameter digest
//
// --root reads every byte of every checkpoint (VerifyCheckpoint) and prints
//   ckpt-00000000000000000400 valid clock=400 servers=3 bytes=123456 created=2024-...
//   ckpt-00000000000000000500 INVALID: shard-1.ckpt: file checksum mismatch (...)
//   ckpt-00000000000000000600 INCOMPLETE: no MANIFEST
// --verify prints "valid clock=... servers=... bytes=..." or the error.
// --digest prints 16 hex digits on stdout: the sum of per-row hashes of
// (table, key or block, full state), independent of how the rows are split
// into shard files and of their order (ParameterDigest), so checkpoints of
// the same parameters written by different numbers of servers print the
// same digest; the row and block counts go to stderr.
//
// Exit status: 0 when everything named is valid (for --root: the newest
// complete checkpoint is), 1 when something is not, 2 on a usage error.
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "checkpoint/catalog.h"
// DigestCheckpoint: the digest needs the optimizer rules' state sizes.
#include "common/status.h"
#include "server/checkpoint.h"

ABSL_FLAG(std::string, root, "", "List the checkpoints under this directory.");
ABSL_FLAG(std::string, verify, "", "Verify this checkpoint directory.");
ABSL_FLAG(std::string, digest, "",
          "Print the parameter digest of this checkpoint directory.");

namespace {

std::string Describe(const ps::CheckpointManifest& m) {
  uint64_t bytes = 0;
  for (const ps::ShardFile& s : m.shards()) bytes += s.bytes();
  const std::string created =
      m.created_unix_micros() == 0
          ? "unknown"
          : absl::FormatTime(absl::RFC3339_sec,
                             absl::FromUnixMicros(m.created_unix_micros()),
                             absl::UTCTimeZone());
  return absl::StrFormat("clock=%d servers=%d bytes=%d created=%s", m.clock(),
                         m.num_servers(), bytes, created);
}

int List(const std::string& root) {
  auto entries = ps::ListCheckpoints(root);
  if (!entries.ok()) {
    std::fprintf(stderr, "%s\n", entries.status().ToString().c_str());
    return 1;
  }
  bool newest_complete_valid = true;
  bool seen_complete = false;
  for (const ps::CheckpointDirEntry& entry : *entries) {
    const std::string name = ps::CheckpointDirName(entry.clock);
    auto manifest = ps::VerifyCheckpoint(entry.path);
    if (manifest.ok()) {
      std::printf("%s valid %s\n", name.c_str(), Describe(*manifest).c_str());
      seen_complete = true;
      continue;
    }
    if (absl::IsNotFound(manifest.status())) {
      std::printf("%s INCOMPLETE: no MANIFEST\n", name.c_str());
      continue;
    }
    // The message starts with the checkpoint's path, which the line's
    // first column already names.
    absl::string_view reason = manifest.status().message();
    absl::ConsumePrefix(&reason, absl::StrCat("checkpoint ", entry.path, ": "));
    std::printf("%s INVALID: %s\n", name.c_str(), std::string(reason).c_str());
    if (!seen_complete) newest_complete_valid = false;
    seen_complete = true;
  }
  return newest_complete_valid ? 0 : 1;
}

int Verify(const std::string& dir) {
  auto manifest = ps::VerifyCheckpoint(dir);
  if (!manifest.ok()) {
    std::printf("%s\n", manifest.status().ToString().c_str());
    return 1;
  }
  std::printf("valid %s\n", Describe(*manifest).c_str());
  return 0;
}

int Digest(const std::string& dir) {
  auto digest = ps::DigestCheckpoint(dir);
  if (!digest.ok()) {
    std::fprintf(stderr, "%s\n", digest.status().ToString().c_str());
    return 1;
  }
  std::printf("%016llx\n", static_cast<unsigned long long>(digest->digest));
  std::fprintf(stderr, "sparse_rows=%llu dense_blocks=%llu\n",
               static_cast<unsigned long long>(digest->sparse_rows),
               static_cast<unsigned long long>(digest->dense_blocks));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string root = absl::GetFlag(FLAGS_root);
  const std::string verify = absl::GetFlag(FLAGS_verify);
  const std::string digest = absl::GetFlag(FLAGS_digest);
  if (root.empty() + verify.empty() + digest.empty() != 2) {
    std::fprintf(stderr,
                 "usage: ckpt_tool (--root=DIR | --verify=CKPT_DIR | --digest=CKPT_DIR)\n");
    return 2;
  }
  if (!root.empty()) return List(root);
  if (!verify.empty()) return Verify(verify);
  return Digest(digest);
}
