// Fuzz target: the checkpoint reader (server/checkpoint.h ReadManifest,
// VerifyCheckpoint, RestoreShards, DigestCheckpoint) on a corrupt shard
// file or MANIFEST.
//
// Input: [u8 flags][u64 clock][file bytes].
//   flags bit 0: the bytes are a MANIFEST's payload (a CheckpointManifest)
//                instead of a whole shard file;
//   flags bit 1: leave the checksums as they are. Otherwise the harness
//                makes them right before writing the file (every record's
//                checksum where the record sizes allow, and the whole-file
//                trailer; for a MANIFEST the preamble, size and trailer),
//                so that mutations reach the parsing behind the checksums;
//   flags bit 2: restore only even keys and blocks (a RowFilter).
// A shard file is restored into tables made from the ShardHeader it
// carries (when its first record parses as one), with a MANIFEST of
// `clock` that lists it; the reader must refuse bad input with an error,
// never crash, hang or allocate from an unchecked count.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "proto/checkpoint.pb.h"
#include "proto/config.pb.h"
#include "server/checkpoint.h"
#include "server/table.h"
#include "tests/fuzz/fuzz_files.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

constexpr size_t kPreamble = 16;
constexpr size_t kRecordHeader = 24;
constexpr size_t kChecksum = 8;
constexpr char kManifestMagic[8] = {'P', 'S', 'C', 'K', 'M', 'N', 'F', 'T'};

uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
void Put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
void Put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// Rewrites every record checksum the record sizes let it find, then the
// trailer, as the writer (server/checkpoint.cc WriteRecord) computes them.
void FixShardChecksums(std::vector<uint8_t>& f) {
  if (f.size() < kPreamble + kChecksum) return;
  const size_t end = f.size() - kChecksum;
  size_t pos = kPreamble;
  while (end - pos >= kRecordHeader + kChecksum) {
    const uint64_t payload = Load64(&f[pos + 16]);
    if (payload > end - pos - kRecordHeader - kChecksum) break;
    const size_t n = kRecordHeader + static_cast<size_t>(payload);
    Put64(&f[pos + n], ps::Checksum64(&f[pos], n));
    pos += n + kChecksum;
  }
  Put64(&f[end], ps::Checksum64(f.data(), end));
}

// Tables for the configs of the shard's header record, if it has one;
// configs the servers would refuse (or too large to allocate here) are
// left out, which the restore must report as a mismatch.
std::vector<std::unique_ptr<ps::Table>> TablesOf(const std::vector<uint8_t>& f) {
  std::vector<std::unique_ptr<ps::Table>> tables;
  if (f.size() < kPreamble + kRecordHeader) return tables;
  uint32_t type;
  std::memcpy(&type, &f[kPreamble], 4);
  const uint64_t payload = Load64(&f[kPreamble + 16]);
  if (type != 1 || payload > f.size() - kPreamble - kRecordHeader) return tables;
  ps::ShardHeader header;
  if (!header.ParseFromArray(&f[kPreamble + kRecordHeader], static_cast<int>(payload))) {
    return tables;
  }
  for (const ps::TableConfig& config : header.tables()) {
    if (config.has_dense() && config.dense().size() > (1u << 16)) continue;
    if (config.has_sparse() && config.sparse().dim() > 1024) continue;
    auto table = ps::Table::Create(config);
    if (table.ok()) tables.push_back(std::move(*table));
  }
  return tables;
}

void WriteManifestFile(const std::string& dir, const std::string& payload) {
  std::vector<uint8_t> f(kPreamble + payload.size() + kChecksum);
  std::memcpy(f.data(), kManifestMagic, 8);
  Put32(&f[8], 1);
  Put32(&f[12], static_cast<uint32_t>(payload.size()));
  if (!payload.empty()) std::memcpy(&f[kPreamble], payload.data(), payload.size());
  Put64(&f[kPreamble + payload.size()], ps::Checksum64(f.data(), kPreamble + payload.size()));
  ps::fuzz::WriteFileOrDie(dir + "/MANIFEST", f.data(), f.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ps::fuzz::Input in(data, size);
  uint8_t flags = 0;
  uint64_t clock = 0;
  if (!in.U8(&flags) || !in.U64(&clock)) return 0;
  const bool manifest_only = (flags & 1) != 0;
  const bool keep_checksums = (flags & 2) != 0;
  const bool filtered = (flags & 4) != 0;
  std::vector<uint8_t> file(in.rest(), in.rest() + in.remaining());
  const std::string& dir = ps::fuzz::ScratchDir();
  const std::string shard_path = dir + "/" + ps::ShardFileName(0);

  if (manifest_only) {
    std::remove(shard_path.c_str());
    if (keep_checksums) {
      ps::fuzz::WriteFileOrDie(dir + "/MANIFEST", file.data(), file.size());
    } else {
      WriteManifestFile(dir, std::string(file.begin(), file.end()));
    }
    (void)ps::ReadManifest(dir);
    (void)ps::VerifyCheckpoint(dir);
    return 0;
  }

  if (!keep_checksums) FixShardChecksums(file);
  ps::fuzz::WriteFileOrDie(shard_path, file.data(), file.size());
  ps::CheckpointManifest manifest;
  manifest.set_clock(clock);
  manifest.set_num_servers(1);
  manifest.set_num_slots(64);
  ps::ShardFile* shard = manifest.add_shards();
  shard->set_rank(0);
  shard->set_file(ps::ShardFileName(0));
  shard->set_bytes(file.size());
  shard->set_checksum(file.size() >= kChecksum ? Load64(&file[file.size() - kChecksum]) : 0);
  WriteManifestFile(dir, manifest.SerializeAsString());

  (void)ps::VerifyCheckpoint(dir);
  std::vector<std::unique_ptr<ps::Table>> tables = TablesOf(file);
  std::vector<ps::Table*> ptrs;
  for (auto& t : tables) ptrs.push_back(t.get());
  ps::RowFilter keep;
  if (filtered) {
    keep.sparse = [](uint32_t, uint64_t key) { return key % 2 == 0; };
    keep.dense = [](uint32_t, uint64_t block) { return block % 2 == 0; };
  }
  (void)ps::RestoreShards(dir, manifest, absl::MakeSpan(ptrs), keep);
  (void)ps::DigestCheckpoint(dir);
  return 0;
}
