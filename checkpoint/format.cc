// File formats. All integers are little-endian; floats are IEEE-754 binary32
// as the tables hold them (checkpoint_io.h refuses to build on a big-endian
// host rather than write files another machine misreads).
//
// Shard file:
//   preamble   "PSCKSHRD", u32 version (1), u32 0
//   records    each: u32 type, u32 table index, u64 count, u64 payload bytes,
//              the payload, then u64 XXH64 of the record's header and payload
//   trailer    u64 XXH64 of every byte before it
// The records come in a fixed order, which the reader enforces, so a file
// cut at a record boundary is as detectable as one cut anywhere else:
//   HEADER       (count 0) payload: ShardHeader
//   for each table t of the header, in order:
//     SPARSE_ROWS  (t, rows >= 1) payload: the rows' keys (u64 each), then
//                  their full states (state_floats() floats each)
//     or DENSE_BLOCK (t, block index, increasing) payload: the block's
//                  values, then its optimizer state
//     TABLE_END    (t, rows or blocks written for the table)
//   END          (count: number of tables)
// Sparse records hold pages of about kShardPageBytes, so writing and reading
// need a few MiB whatever the table's size; a dense record holds one block,
// which the table already holds whole.
//
// MANIFEST:
//   "PSCKMNFT", u32 version (1), u32 payload bytes, payload:
//   CheckpointManifest, u64 XXH64 of every byte before it.
#include "checkpoint/format.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/catalog.h"
#include "checkpoint/checkpoint_io.h"
#include "checkpoint/format_internal.h"
#include "common/status.h"

namespace ps {

static_assert(sizeof(float) == 4, "checkpoint files hold binary32 floats");

namespace checkpoint_internal {

// Reads a file's preamble, checking the magic number and version; returns
// its last field (0 in shard files, the payload size in a MANIFEST).
absl::StatusOr<uint32_t> ReadPreamble(FileReader& file, const char (&magic)[8]) {
  unsigned char raw[kPreambleBytes];
  if (file.size() < kPreambleBytes + kChecksumBytes) {
    return Corrupt(file.name(), absl::StrCat("truncated: ", file.size(), " bytes"));
  }
  PS_RETURN_IF_ERROR(file.Read(raw, sizeof(raw)));
  if (std::memcmp(raw, magic, sizeof(magic)) != 0) {
    return Corrupt(file.name(), "wrong magic number");
  }
  if (Load32(raw + 8) != kFormatVersion) {
    return Corrupt(file.name(), absl::StrCat("format version ", Load32(raw + 8),
                                             ", this build reads ", kFormatVersion));
  }
  return Load32(raw + 12);
}

// Checks the whole-file checksum in the last kChecksumBytes bytes, which
// must be all that is left to read, against the bytes read and `listed`
// (the MANIFEST's value).
absl::Status ReadTrailer(FileReader& file, uint64_t listed) {
  if (file.remaining() != kChecksumBytes) {
    return Corrupt(file.name(), absl::StrCat(file.remaining(), " bytes left at offset ",
                                             file.position(),
                                             " where the 8-byte trailer belongs"));
  }
  const uint64_t computed = file.checksum();
  unsigned char raw[kChecksumBytes];
  PS_RETURN_IF_ERROR(file.Read(raw, sizeof(raw)));
  const uint64_t stored = Load64(raw);
  if (stored != computed) {
    return Corrupt(file.name(), absl::StrFormat("file checksum mismatch (stored %016x, "
                                                "computed %016x)",
                                                stored, computed));
  }
  if (stored != listed) {
    return Corrupt(file.name(),
                   absl::StrFormat("checksum %016x differs from the MANIFEST's %016x "
                                   "(a file of another attempt?)",
                                   stored, listed));
  }
  return absl::OkStatus();
}

// Opens a file a manifest lists: a missing file is lost data.
absl::StatusOr<std::unique_ptr<FileReader>> OpenListed(const std::string& dir,
                                                       const std::string& file) {
  auto reader = FileReader::Open(JoinPath(dir, file), file);
  if (!reader.ok() && absl::IsNotFound(reader.status())) {
    return Corrupt(file, "listed in the MANIFEST but missing");
  }
  return reader;
}

}  // namespace checkpoint_internal

namespace {

using checkpoint_internal::Corrupt;
using checkpoint_internal::FileReader;
using checkpoint_internal::FileWriter;
using checkpoint_internal::JoinPath;
using checkpoint_internal::kChecksumBytes;
using checkpoint_internal::kFormatVersion;
using checkpoint_internal::kPreambleBytes;
using checkpoint_internal::kRecordHeaderBytes;
using checkpoint_internal::kShardMagic;
using checkpoint_internal::Load32;
using checkpoint_internal::Load64;
using checkpoint_internal::MakeDirs;
using checkpoint_internal::OpenListed;
using checkpoint_internal::Put32;
using checkpoint_internal::Put64;
using checkpoint_internal::ReadPreamble;
using checkpoint_internal::ReadTrailer;
using checkpoint_internal::WriteFileAtomically;
using checkpoint_internal::Xxh64;

// The largest header or sparse record a reader accepts (a sparse record may
// hold one row larger than this). Files are not trusted: every size is
// checked against the file's size and this bound before it is allocated.
constexpr uint64_t kMaxRecordBytes = uint64_t{64} << 20;
// Limits of TableConfig that the loader (common/config.cc) enforces; a
// header outside them is corrupt.
constexpr uint32_t kMaxSparseDim = 65536;
constexpr uint64_t kMaxDenseBlockSize = uint64_t{1} << 26;

enum RecordType : uint32_t {
  kHeaderRecord = 1,
  kSparseRowsRecord = 2,
  kDenseBlockRecord = 3,
  kTableEndRecord = 4,
  kEndRecord = 5,
};

// A slice of a record's payload.
struct Piece {
  const void* data;
  size_t size;
};

absl::Status WriteRecord(FileWriter& out, RecordType type, uint32_t table,
                         uint64_t count, std::initializer_list<Piece> payload) {
  unsigned char header[kRecordHeaderBytes];
  uint64_t payload_bytes = 0;
  for (const Piece& p : payload) payload_bytes += p.size;
  Put32(header, type);
  Put32(header + 4, table);
  Put64(header + 8, count);
  Put64(header + 16, payload_bytes);
  Xxh64 hash;
  hash.Update(header, sizeof(header));
  PS_RETURN_IF_ERROR(out.Append(header, sizeof(header)));
  for (const Piece& p : payload) {
    hash.Update(p.data, p.size);
    PS_RETURN_IF_ERROR(out.Append(p.data, p.size));
  }
  unsigned char checksum[kChecksumBytes];
  Put64(checksum, hash.Digest());
  return out.Append(checksum, sizeof(checksum));
}

}  // namespace

// ---------------------------------------------------------------- writing

absl::Status ShardWriter::Rows(uint32_t index, absl::Span<const uint64_t> keys,
                               absl::Span<const float> state) {
  return WriteRecord(*out_, kSparseRowsRecord, index, keys.size(),
                     {{keys.data(), keys.size() * sizeof(uint64_t)},
                      {state.data(), state.size() * sizeof(float)}});
}

absl::Status ShardWriter::Block(uint32_t index, uint64_t block,
                                absl::Span<const float> values,
                                absl::Span<const float> state) {
  return WriteRecord(*out_, kDenseBlockRecord, index, block,
                     {{values.data(), values.size() * sizeof(float)},
                      {state.data(), state.size() * sizeof(float)}});
}

absl::Status ShardWriter::EndTable(uint32_t index, uint64_t count) {
  return WriteRecord(*out_, kTableEndRecord, index, count, {});
}

absl::StatusOr<ShardFile> WriteShardFile(
    const std::string& checkpoint_dir, const ShardHeader& header,
    const std::function<absl::Status(ShardWriter&)>& write_tables) {
  const std::string header_bytes = header.SerializeAsString();
  if (header_bytes.size() > kMaxRecordBytes) {
    return absl::InvalidArgumentError("the table configs exceed 64 MiB");
  }
  PS_RETURN_IF_ERROR(MakeDirs(checkpoint_dir));
  ShardFile shard;
  shard.set_rank(header.rank());
  shard.set_file(ShardFileName(header.rank()));
  uint64_t checksum = 0;
  PS_ASSIGN_OR_RETURN(
      const uint64_t bytes,
      WriteFileAtomically(
          checkpoint_dir, JoinPath(checkpoint_dir, shard.file()),
          [&](FileWriter& out) -> absl::Status {
            unsigned char preamble[kPreambleBytes] = {};
            std::memcpy(preamble, kShardMagic, sizeof(kShardMagic));
            Put32(preamble + 8, kFormatVersion);
            PS_RETURN_IF_ERROR(out.Append(preamble, sizeof(preamble)));
            PS_RETURN_IF_ERROR(WriteRecord(out, kHeaderRecord, 0, 0,
                                           {{header_bytes.data(), header_bytes.size()}}));
            ShardWriter writer(&out);
            PS_RETURN_IF_ERROR(write_tables(writer));
            PS_RETURN_IF_ERROR(
                WriteRecord(out, kEndRecord, 0, header.tables_size(), {}));
            checksum = out.checksum();
            unsigned char trailer[kChecksumBytes];
            Put64(trailer, checksum);
            return out.Append(trailer, sizeof(trailer));
          }));
  shard.set_bytes(bytes);
  shard.set_checksum(checksum);
  return shard;
}

// ---------------------------------------------------------------- reading

absl::StatusOr<TableLayout> LayoutOf(const TableConfig& c,
                                     const StateSizeFn& state_size) {
  TableLayout l;
  l.id = c.id();
  absl::StatusOr<int> state_floats = state_size(c.optimizer());
  if (!state_floats.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", c.name(), "' (id ", c.id(), "): ", state_floats.status().message()));
  }
  l.state_size = *state_floats;
  switch (c.kind_case()) {
    case TableConfig::kSparse:
      l.sparse = true;
      l.dim = c.sparse().dim();
      if (l.dim < 1 || l.dim > kMaxSparseDim) {
        return absl::InvalidArgumentError(
            absl::StrCat("table '", c.name(), "': sparse dim ", l.dim));
      }
      l.stride = static_cast<size_t>(l.dim) * (1 + l.state_size);
      return l;
    case TableConfig::kDense:
      l.size = c.dense().size();
      l.block_size = c.dense().block_size();
      if (l.size == 0 || l.block_size == 0 || l.block_size > kMaxDenseBlockSize) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", c.name(), "': dense size ", l.size, ", block_size ",
            l.block_size));
      }
      l.num_blocks = l.size / l.block_size + (l.size % l.block_size != 0 ? 1 : 0);
      return l;
    case TableConfig::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("table '", c.name(), "' is neither sparse nor dense"));
}

struct ShardReader::RecordHeader {
  uint32_t type = 0;
  uint32_t table = 0;
  uint64_t count = 0;
  uint64_t payload_bytes = 0;
  unsigned char raw[kRecordHeaderBytes];
};

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Open(
    const std::string& dir, const ShardFile& entry, uint64_t clock,
    const StateSizeFn& state_size) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<FileReader> file,
                      OpenListed(dir, entry.file()));
  std::unique_ptr<ShardReader> reader(new ShardReader(std::move(file), entry));
  PS_RETURN_IF_ERROR(reader->ReadHeader(clock, state_size));
  return reader;
}

ShardReader::ShardReader(std::unique_ptr<FileReader> file, const ShardFile& entry)
    : file_(std::move(file)), entry_(entry) {}

ShardReader::~ShardReader() = default;

absl::Status ShardReader::ReadAll(ShardVisitor& visitor) {
  for (size_t t = 0; t < layouts_.size(); ++t) {
    const TableLayout& layout = layouts_[t];
    const RecordType data_type = layout.sparse ? kSparseRowsRecord : kDenseBlockRecord;
    uint64_t items = 0;
    uint64_t next_block = 0;  // blocks come in increasing order
    for (;;) {
      RecordHeader h;
      PS_RETURN_IF_ERROR(ReadRecordHeader(&h));
      if (h.table != t || (h.type != data_type && h.type != kTableEndRecord)) {
        return Fail(absl::StrCat("record of type ", h.type, " for table ",
                                 h.table, " where table ", t,
                                 "'s records or its end belong"));
      }
      if (h.type == kTableEndRecord) {
        if (h.count != items || h.payload_bytes != 0) {
          return Fail(absl::StrCat("table ", t, " ends after ", items,
                                   " rows or blocks, but its end record says ",
                                   h.count));
        }
        PS_RETURN_IF_ERROR(ReadPayload(h));
        break;
      }
      if (layout.sparse) {
        const uint64_t row_bytes = sizeof(uint64_t) + layout.stride * sizeof(float);
        if (h.count == 0 || h.payload_bytes % row_bytes != 0 ||
            h.payload_bytes / row_bytes != h.count ||
            h.payload_bytes > std::max(kMaxRecordBytes, row_bytes)) {
          return Fail(absl::StrCat("sparse record of ", h.count, " rows has ",
                                   h.payload_bytes, " payload bytes (",
                                   row_bytes, " per row)"));
        }
        PS_RETURN_IF_ERROR(ReadPayload(h));
        const size_t rows = static_cast<size_t>(h.count);
        const auto* keys = reinterpret_cast<const uint64_t*>(buffer_.get());
        const auto* state =
            reinterpret_cast<const float*>(buffer_.get() + rows * sizeof(uint64_t));
        PS_RETURN_IF_ERROR(visitor.Rows(t, absl::MakeConstSpan(keys, rows),
                                        absl::MakeConstSpan(state, rows * layout.stride)));
        items += rows;
      } else {
        const uint64_t block = h.count;
        if (block >= layout.num_blocks || block < next_block) {
          return Fail(absl::StrCat("dense block ", block, " of table ", t,
                                   " is out of order or past its ",
                                   layout.num_blocks, " blocks"));
        }
        const uint64_t n = layout.BlockLength(block);
        const uint64_t state_n = n * layout.state_size;
        if (h.payload_bytes != (n + state_n) * sizeof(float)) {
          return Fail(absl::StrCat("dense block ", block, " has ", h.payload_bytes,
                                   " payload bytes, want ",
                                   (n + state_n) * sizeof(float)));
        }
        PS_RETURN_IF_ERROR(ReadPayload(h));
        const auto* values = reinterpret_cast<const float*>(buffer_.get());
        PS_RETURN_IF_ERROR(visitor.Block(
            t, block, absl::MakeConstSpan(values, n),
            absl::MakeConstSpan(values + n, state_n)));
        next_block = block + 1;
        ++items;
      }
    }
  }
  RecordHeader h;
  PS_RETURN_IF_ERROR(ReadRecordHeader(&h));
  if (h.type != kEndRecord || h.count != layouts_.size() || h.payload_bytes != 0) {
    return Fail(absl::StrCat("record of type ", h.type,
                             " where the end record belongs"));
  }
  PS_RETURN_IF_ERROR(ReadPayload(h));
  return ReadTrailer(*file_, entry_.checksum());
}

absl::Status ShardReader::Fail(absl::string_view what) const {
  return Corrupt(file_->name(), absl::StrCat(what, " (at offset ",
                                              file_->position(), ")"));
}

absl::Status ShardReader::ReadHeader(uint64_t clock,
                                      const StateSizeFn& state_size) {
  if (file_->size() != entry_.bytes()) {
    return Corrupt(file_->name(), absl::StrCat("size is ", file_->size(),
                                                " bytes, the MANIFEST says ",
                                                entry_.bytes()));
  }
  PS_RETURN_IF_ERROR(ReadPreamble(*file_, kShardMagic).status());
  RecordHeader h;
  PS_RETURN_IF_ERROR(ReadRecordHeader(&h));
  if (h.type != kHeaderRecord || h.table != 0 || h.count != 0 ||
      h.payload_bytes > kMaxRecordBytes) {
    return Fail("the first record is not a valid header record");
  }
  PS_RETURN_IF_ERROR(ReadPayload(h));
  if (!header_.ParseFromArray(buffer_.get(), static_cast<int>(h.payload_bytes))) {
    return Fail("the header does not parse");
  }
  if (header_.clock() != clock || header_.rank() != entry_.rank()) {
    return Fail(absl::StrCat("the header is of clock ", header_.clock(),
                             " and rank ", header_.rank(), ", the MANIFEST's "
                             "entry of clock ", clock, " and rank ",
                             entry_.rank()));
  }
  absl::flat_hash_set<uint32_t> ids;
  layouts_.reserve(header_.tables_size());
  for (const TableConfig& config : header_.tables()) {
    absl::StatusOr<TableLayout> layout = LayoutOf(config, state_size);
    if (!layout.ok()) {
      return Fail(absl::StrCat("header: ", layout.status().message()));
    }
    if (!ids.insert(config.id()).second) {
      return Fail(absl::StrCat("header: table id ", config.id(), " repeats"));
    }
    layouts_.push_back(*layout);
  }
  return absl::OkStatus();
}

absl::Status ShardReader::ReadRecordHeader(RecordHeader* h) {
  // A record header, its checksum and the trailer must still fit.
  if (file_->remaining() < kRecordHeaderBytes + 2 * kChecksumBytes) {
    return Fail("truncated: the file ends where a record belongs");
  }
  PS_RETURN_IF_ERROR(file_->Read(h->raw, kRecordHeaderBytes));
  h->type = Load32(h->raw);
  h->table = Load32(h->raw + 4);
  h->count = Load64(h->raw + 8);
  h->payload_bytes = Load64(h->raw + 16);
  return absl::OkStatus();
}

// Reads h's payload (whose size the caller has checked for its type)
// into buffer_ and its checksum, and checks it.
absl::Status ShardReader::ReadPayload(const RecordHeader& h) {
  if (h.payload_bytes > file_->remaining() - 2 * kChecksumBytes) {
    return Fail(absl::StrCat("truncated: a record of ", h.payload_bytes,
                             " payload bytes with ", file_->remaining(),
                             " bytes left"));
  }
  const size_t n = static_cast<size_t>(h.payload_bytes);
  if (n > capacity_) {
    buffer_.reset();  // before allocating the larger one
    buffer_.reset(new unsigned char[n]);
    capacity_ = n;
  }
  PS_RETURN_IF_ERROR(file_->Read(buffer_.get(), n));
  unsigned char raw[kChecksumBytes];
  PS_RETURN_IF_ERROR(file_->Read(raw, sizeof(raw)));
  Xxh64 hash;
  hash.Update(h.raw, kRecordHeaderBytes);
  hash.Update(buffer_.get(), n);
  if (hash.Digest() != Load64(raw)) {
    return Corrupt(file_->name(),
                   absl::StrCat("checksum mismatch in the record of type ", h.type,
                                " ending at offset ", file_->position()));
  }
  return absl::OkStatus();
}

}  // namespace ps
