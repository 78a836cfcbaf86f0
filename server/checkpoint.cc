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
// Sparse records hold pages of about kPageBytes, so writing and reading
// need a few MiB whatever the table's size; a dense record holds one block,
// which the table already holds whole.
//
// MANIFEST:
//   "PSCKMNFT", u32 version (1), u32 payload bytes, payload:
//   CheckpointManifest, u64 XXH64 of every byte before it.
#include "server/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/finite.h"
#include "common/hash.h"
#include "common/status.h"
#include "server/checkpoint_io.h"
#include "server/optimizer.h"

namespace ps {
namespace {

static_assert(sizeof(float) == 4, "checkpoint files hold binary32 floats");

namespace fs = std::filesystem;
using checkpoint_internal::Corrupt;
using checkpoint_internal::FileReader;
using checkpoint_internal::FileWriter;
using checkpoint_internal::IoError;
using checkpoint_internal::JoinPath;
using checkpoint_internal::Load32;
using checkpoint_internal::Load64;
using checkpoint_internal::MakeDirs;
using checkpoint_internal::Put32;
using checkpoint_internal::Put64;
using checkpoint_internal::SyncDir;
using checkpoint_internal::WriteFileAtomically;
using checkpoint_internal::Xxh64;

constexpr char kShardMagic[8] = {'P', 'S', 'C', 'K', 'S', 'H', 'R', 'D'};
constexpr char kManifestMagic[8] = {'P', 'S', 'C', 'K', 'M', 'N', 'F', 'T'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kPreambleBytes = 16;
constexpr size_t kRecordHeaderBytes = 24;
constexpr size_t kChecksumBytes = 8;
// Target payload of a sparse record.
constexpr size_t kPageBytes = size_t{4} << 20;
// The largest header or sparse record a reader accepts (a sparse record may
// hold one row larger than this). Files are not trusted: every size is
// checked against the file's size and this bound before it is allocated.
constexpr uint64_t kMaxRecordBytes = uint64_t{64} << 20;
constexpr uint64_t kMaxManifestBytes = uint64_t{64} << 20;
// Chunk size of Verify's reads.
constexpr size_t kVerifyChunkBytes = size_t{1} << 20;
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

absl::Status WriteSparse(FileWriter& out, uint32_t index,
                         const SparseTable& table, const RowFilter& keep) {
  const uint32_t id = table.id();
  const size_t stride = table.state_floats();
  const size_t page_rows =
      std::max<size_t>(1, kPageBytes / (sizeof(uint64_t) + stride * sizeof(float)));
  std::vector<uint64_t> keys;
  std::vector<float> state;
  keys.reserve(page_rows);
  state.reserve(page_rows * stride);
  uint64_t rows = 0;
  uint64_t cursor = 0;
  do {
    keys.clear();
    state.clear();
    cursor = table.ExportRows(cursor, page_rows, &keys, &state);
    if (keep.sparse) {
      size_t kept = 0;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!keep.sparse(id, keys[i])) continue;
        if (kept != i) {
          keys[kept] = keys[i];
          std::memmove(state.data() + kept * stride, state.data() + i * stride,
                       stride * sizeof(float));
        }
        ++kept;
      }
      keys.resize(kept);
      state.resize(kept * stride);
    }
    if (keys.empty()) continue;
    if (!AllFinite(state)) {
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!AllFinite(absl::MakeConstSpan(state).subspan(i * stride, stride))) {
          return absl::FailedPreconditionError(absl::StrCat(
              "table '", table.config().name(), "': the row of key ", keys[i],
              " holds a non-finite value and cannot be checkpointed"));
        }
      }
    }
    PS_RETURN_IF_ERROR(WriteRecord(
        out, kSparseRowsRecord, index, keys.size(),
        {{keys.data(), keys.size() * sizeof(uint64_t)},
         {state.data(), state.size() * sizeof(float)}}));
    rows += keys.size();
  } while (cursor != 0);
  return WriteRecord(out, kTableEndRecord, index, rows, {});
}

absl::Status WriteDense(FileWriter& out, uint32_t index,
                        const DenseTable& table, const RowFilter& keep) {
  const uint32_t id = table.id();
  uint64_t blocks = 0;
  PS_RETURN_IF_ERROR(table.ForEachBlock(
      [&](uint64_t block, absl::Span<const float> values,
          absl::Span<const float> state) -> absl::Status {
        if (keep.dense && !keep.dense(id, block)) return absl::OkStatus();
        if (!AllFinite(values) || !AllFinite(state)) {
          return absl::FailedPreconditionError(absl::StrCat(
              "dense table '", table.config().name(), "': block ", block,
              " holds a non-finite value and cannot be checkpointed"));
        }
        ++blocks;
        return WriteRecord(out, kDenseBlockRecord, index, block,
                           {{values.data(), values.size() * sizeof(float)},
                            {state.data(), state.size() * sizeof(float)}});
      }));
  return WriteRecord(out, kTableEndRecord, index, blocks, {});
}

// ---------------------------------------------------------------- reading

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

// What a reader needs to know of a table from a shard header.
struct TableLayout {
  uint32_t id = 0;
  bool sparse = false;
  int state_size = 0;
  uint32_t dim = 0;             // sparse
  size_t stride = 0;            // sparse: floats per row
  uint64_t size = 0;            // dense
  uint64_t block_size = 0;      // dense
  uint64_t num_blocks = 0;      // dense

  uint64_t BlockLength(uint64_t block) const {
    return std::min(block_size, size - block * block_size);
  }
};

// The layout of a table config read from a file, checked so that no size
// derived from it overflows or is absurd.
absl::StatusOr<TableLayout> LayoutOf(const TableConfig& c) {
  TableLayout l;
  l.id = c.id();
  auto optimizer = Optimizer::Create(c.optimizer());
  if (!optimizer.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", c.name(), "' (id ", c.id(), "): ", optimizer.status().message()));
  }
  l.state_size = (*optimizer)->state_size();
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

// Receives the content of a shard file as ShardReader::ReadAll checks it.
class ShardVisitor {
 public:
  virtual ~ShardVisitor() = default;
  // state holds keys.size() rows of layout.stride floats.
  virtual absl::Status Rows(size_t table_index, absl::Span<const uint64_t> keys,
                            absl::Span<const float> state) = 0;
  virtual absl::Status Block(size_t table_index, uint64_t block,
                             absl::Span<const float> values,
                             absl::Span<const float> state) = 0;
};

struct RecordHeader {
  uint32_t type = 0;
  uint32_t table = 0;
  uint64_t count = 0;
  uint64_t payload_bytes = 0;
  unsigned char raw[kRecordHeaderBytes];
};

// Reads one shard file of a checkpoint, checking everything against the
// manifest's entry and the format.
class ShardReader {
 public:
  // Opens the file, checks its size against the entry and reads its
  // preamble and header, which must name `clock` and the entry's rank.
  static absl::StatusOr<std::unique_ptr<ShardReader>> Open(
      const std::string& dir, const ShardFile& entry, uint64_t clock) {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<FileReader> file,
                        OpenListed(dir, entry.file()));
    std::unique_ptr<ShardReader> reader(new ShardReader(std::move(file), entry));
    PS_RETURN_IF_ERROR(reader->ReadHeader(clock));
    return reader;
  }

  const ShardHeader& header() const { return header_; }
  const std::vector<TableLayout>& layouts() const { return layouts_; }

  // Reads every record after the header into `visitor`, each checked
  // before it is passed on, then the end of the file and its checksum.
  absl::Status ReadAll(ShardVisitor& visitor) {
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

 private:
  ShardReader(std::unique_ptr<FileReader> file, const ShardFile& entry)
      : file_(std::move(file)), entry_(entry) {}

  absl::Status Fail(absl::string_view what) const {
    return Corrupt(file_->name(), absl::StrCat(what, " (at offset ",
                                                file_->position(), ")"));
  }

  absl::Status ReadHeader(uint64_t clock) {
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
      absl::StatusOr<TableLayout> layout = LayoutOf(config);
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

  absl::Status ReadRecordHeader(RecordHeader* h) {
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
  absl::Status ReadPayload(const RecordHeader& h) {
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

  std::unique_ptr<FileReader> file_;
  const ShardFile entry_;
  ShardHeader header_;
  std::vector<TableLayout> layouts_;
  // Payload of the last record; 16-byte aligned (new[]), so keys and
  // floats can be read in place.
  std::unique_ptr<unsigned char[]> buffer_;
  size_t capacity_ = 0;
};

// INVALID_ARGUMENT naming what is inconsistent in a manifest.
absl::Status ValidateManifest(const CheckpointManifest& m) {
  if (m.num_servers() == 0 ||
      m.shards_size() != static_cast<int64_t>(m.num_servers())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_servers is ", m.num_servers(), " but ", m.shards_size(),
        " shard files are listed"));
  }
  std::vector<bool> seen(m.num_servers(), false);
  for (const ShardFile& s : m.shards()) {
    if (s.rank() >= m.num_servers() || seen[s.rank()]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard rank ", s.rank(), " is repeated or not below num_servers ",
          m.num_servers()));
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

// Why a table of a checkpoint cannot be restored into `table`; OK if it can.
absl::Status CheckCompatible(const TableConfig& saved, const TableLayout& layout,
                             const Table& table) {
  const TableConfig& live = table.config();
  auto mismatch = [&](absl::string_view what, auto saved_value, auto live_value) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table '", live.name(), "' (id ", live.id(), "): the checkpoint's ", what,
        " is ", saved_value, ", the job's ", live_value));
  };
  if (layout.sparse != (table.AsSparse() != nullptr)) {
    return mismatch("kind", layout.sparse ? "sparse" : "dense",
                    layout.sparse ? "dense" : "sparse");
  }
  if (saved.optimizer().kind_case() != live.optimizer().kind_case()) {
    return mismatch("optimizer rule (field number)",
                    static_cast<int>(saved.optimizer().kind_case()),
                    static_cast<int>(live.optimizer().kind_case()));
  }
  if (layout.state_size != table.state_size()) {
    return mismatch("optimizer state size", layout.state_size, table.state_size());
  }
  if (const SparseTable* sparse = table.AsSparse(); sparse != nullptr) {
    if (layout.dim != sparse->dim()) return mismatch("dim", layout.dim, sparse->dim());
  } else {
    const DenseTable& dense = *table.AsDense();
    if (layout.size != dense.size()) return mismatch("size", layout.size, dense.size());
    if (layout.block_size != dense.block_size()) {
      return mismatch("block_size", layout.block_size, dense.block_size());
    }
  }
  return absl::OkStatus();
}

// Maps each table of a shard header to the job's table of that id; every
// table on either side must be on the other. FAILED_PRECONDITION otherwise.
absl::StatusOr<std::vector<Table*>> MatchTables(
    const ShardReader& reader,
    const absl::flat_hash_map<uint32_t, Table*>& tables) {
  std::vector<Table*> targets;
  for (size_t i = 0; i < reader.layouts().size(); ++i) {
    const TableConfig& saved = reader.header().tables(static_cast<int>(i));
    auto it = tables.find(saved.id());
    if (it == tables.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint has table '", saved.name(), "' (id ", saved.id(),
          "), which the job does not"));
    }
    PS_RETURN_IF_ERROR(CheckCompatible(saved, reader.layouts()[i], *it->second));
    targets.push_back(it->second);
  }
  if (targets.size() != tables.size()) {
    for (const auto& [id, table] : tables) {
      if (std::find(targets.begin(), targets.end(), table) == targets.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the job has table '", table->config().name(), "' (id ", id,
            "), which the checkpoint does not"));
      }
    }
  }
  return targets;
}

class ImportVisitor : public ShardVisitor {
 public:
  ImportVisitor(absl::string_view file, const std::vector<Table*>& targets,
                const std::vector<TableLayout>& layouts, const RowFilter& keep,
                RestoreStats* stats)
      : file_(file), targets_(targets), layouts_(layouts), keep_(keep), stats_(stats) {}

  absl::Status Rows(size_t t, absl::Span<const uint64_t> keys,
                    absl::Span<const float> state) override {
    SparseTable& table = *targets_[t]->AsSparse();
    const uint32_t id = table.id();
    const size_t stride = layouts_[t].stride;
    stats_->rows_read += keys.size();
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keep_.sparse && !keep_.sparse(id, keys[i])) continue;
      PS_RETURN_IF_ERROR(Imported(table.ImportRow(keys[i], state.subspan(i * stride, stride))));
      ++stats_->rows_restored;
    }
    return absl::OkStatus();
  }

  absl::Status Block(size_t t, uint64_t block, absl::Span<const float> values,
                     absl::Span<const float> state) override {
    DenseTable& table = *targets_[t]->AsDense();
    ++stats_->blocks_read;
    if (keep_.dense && !keep_.dense(table.id(), block)) return absl::OkStatus();
    PS_RETURN_IF_ERROR(Imported(table.ImportBlock(block, values, state)));
    ++stats_->blocks_restored;
    return absl::OkStatus();
  }

 private:
  // The tables accept every row a well-formed file holds (the configs
  // match, sizes were checked) but one with non-finite values, which only a
  // damaged file has (WriteShard refuses them).
  absl::Status Imported(const absl::Status& status) const {
    if (status.ok()) return status;
    if (absl::IsInvalidArgument(status)) return Corrupt(file_, status.message());
    return Annotate(status, file_);
  }

  const std::string file_;
  const std::vector<Table*>& targets_;
  const std::vector<TableLayout>& layouts_;
  const RowFilter& keep_;
  RestoreStats* stats_;
};

uint64_t RowDigest(uint32_t table_id, uint64_t key, absl::Span<const float> state) {
  return Checksum64(state.data(), state.size() * sizeof(float),
                    HashCombine(table_id, key));
}

uint64_t BlockDigest(uint32_t table_id, uint64_t block,
                     absl::Span<const float> values, absl::Span<const float> state) {
  Xxh64 hash(HashCombine(0x8000000000000000ULL | table_id, block));
  hash.Update(values.data(), values.size() * sizeof(float));
  hash.Update(state.data(), state.size() * sizeof(float));
  return hash.Digest();
}

class DigestVisitor : public ShardVisitor {
 public:
  DigestVisitor(const std::vector<TableLayout>& layouts, ParameterDigest* digest)
      : layouts_(layouts), digest_(digest) {}

  absl::Status Rows(size_t t, absl::Span<const uint64_t> keys,
                    absl::Span<const float> state) override {
    const size_t stride = layouts_[t].stride;
    for (size_t i = 0; i < keys.size(); ++i) {
      digest_->digest +=
          RowDigest(layouts_[t].id, keys[i], state.subspan(i * stride, stride));
    }
    digest_->sparse_rows += keys.size();
    return absl::OkStatus();
  }

  absl::Status Block(size_t t, uint64_t block, absl::Span<const float> values,
                     absl::Span<const float> state) override {
    digest_->digest += BlockDigest(layouts_[t].id, block, values, state);
    ++digest_->dense_blocks;
    return absl::OkStatus();
  }

 private:
  const std::vector<TableLayout>& layouts_;
  ParameterDigest* digest_;
};

}  // namespace

// ------------------------------------------------------------- public API

uint64_t Checksum64(const void* data, size_t n, uint64_t seed) {
  Xxh64 hash(seed);
  hash.Update(data, n);
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

RowFilter OwnedSlotsFilter(absl::Span<const uint32_t> slot_owner, uint32_t rank) {
  auto owner = std::make_shared<const std::vector<uint32_t>>(slot_owner.begin(),
                                                             slot_owner.end());
  const uint32_t num_slots = static_cast<uint32_t>(owner->size());
  RowFilter filter;
  if (num_slots == 0) {
    filter.sparse = [](uint32_t, uint64_t) { return false; };
    filter.dense = [](uint32_t, uint64_t) { return false; };
    return filter;
  }
  filter.sparse = [owner, num_slots, rank](uint32_t table_id, uint64_t key) {
    return (*owner)[SparseSlot(table_id, key, num_slots)] == rank;
  };
  filter.dense = [owner, num_slots, rank](uint32_t table_id, uint64_t block) {
    return (*owner)[DenseBlockSlot(table_id, block, num_slots)] == rank;
  };
  return filter;
}

absl::StatusOr<ShardFile> WriteShard(const std::string& checkpoint_dir,
                                     uint32_t rank, uint64_t clock,
                                     uint32_t num_slots,
                                     absl::Span<const Table* const> tables,
                                     const RowFilter& keep) {
  ShardHeader header;
  header.set_clock(clock);
  header.set_rank(rank);
  header.set_num_slots(num_slots);
  absl::flat_hash_set<uint32_t> ids;
  for (const Table* table : tables) {
    if (table == nullptr) return absl::InvalidArgumentError("null table");
    if (!ids.insert(table->id()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("table id ", table->id(), " is given twice"));
    }
    *header.add_tables() = table->config();
  }
  const std::string header_bytes = header.SerializeAsString();
  if (header_bytes.size() > kMaxRecordBytes) {
    return absl::InvalidArgumentError("the table configs exceed 64 MiB");
  }
  PS_RETURN_IF_ERROR(MakeDirs(checkpoint_dir));
  ShardFile shard;
  shard.set_rank(rank);
  shard.set_file(ShardFileName(rank));
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
            for (size_t i = 0; i < tables.size(); ++i) {
              const uint32_t index = static_cast<uint32_t>(i);
              if (const SparseTable* sparse = tables[i]->AsSparse()) {
                PS_RETURN_IF_ERROR(WriteSparse(out, index, *sparse, keep));
              } else {
                PS_RETURN_IF_ERROR(WriteDense(out, index, *tables[i]->AsDense(), keep));
              }
            }
            PS_RETURN_IF_ERROR(WriteRecord(out, kEndRecord, 0, tables.size(), {}));
            checksum = out.checksum();
            unsigned char trailer[kChecksumBytes];
            Put64(trailer, checksum);
            return out.Append(trailer, sizeof(trailer));
          }));
  shard.set_bytes(bytes);
  shard.set_checksum(checksum);
  return shard;
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

absl::StatusOr<RestoreStats> RestoreShards(const std::string& checkpoint_dir,
                                           const CheckpointManifest& manifest,
                                           absl::Span<Table* const> tables,
                                           const RowFilter& keep) {
  const std::string context = absl::StrCat("checkpoint ", checkpoint_dir);
  PS_RETURN_IF_ERROR(Annotate(ValidateManifest(manifest), context));
  absl::flat_hash_map<uint32_t, Table*> by_id;
  for (Table* table : tables) {
    if (table == nullptr) return absl::InvalidArgumentError("null table");
    if (!by_id.emplace(table->id(), table).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("table id ", table->id(), " is given twice"));
    }
  }
  // Every header first, so that a checkpoint of another model (or a file
  // damaged in its header) changes nothing.
  for (const ShardFile& entry : manifest.shards()) {
    auto reader = ShardReader::Open(checkpoint_dir, entry, manifest.clock());
    if (!reader.ok()) return Annotate(reader.status(), context);
    PS_RETURN_IF_ERROR(Annotate(MatchTables(**reader, by_id).status(), context));
  }
  RestoreStats stats;
  for (const ShardFile& entry : manifest.shards()) {
    auto reader = ShardReader::Open(checkpoint_dir, entry, manifest.clock());
    if (!reader.ok()) return Annotate(reader.status(), context);
    auto targets = MatchTables(**reader, by_id);
    if (!targets.ok()) {
      // It matched in the first pass: the file changed under us.
      return absl::DataLossError(absl::StrCat(context, ": ", entry.file(),
                                              " changed while restoring: ",
                                              targets.status().message()));
    }
    ImportVisitor visitor(entry.file(), *targets, (*reader)->layouts(), keep, &stats);
    PS_RETURN_IF_ERROR(Annotate((*reader)->ReadAll(visitor), context));
    ++stats.files;
    stats.bytes += entry.bytes();
  }
  return stats;
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

ParameterDigest& ParameterDigest::operator+=(const ParameterDigest& other) {
  digest += other.digest;
  sparse_rows += other.sparse_rows;
  dense_blocks += other.dense_blocks;
  return *this;
}

bool ParameterDigest::operator==(const ParameterDigest& other) const {
  return digest == other.digest && sparse_rows == other.sparse_rows &&
         dense_blocks == other.dense_blocks;
}

ParameterDigest DigestTables(absl::Span<const Table* const> tables) {
  ParameterDigest result;
  std::vector<uint64_t> keys;
  std::vector<float> state;
  for (const Table* table : tables) {
    const uint32_t id = table->id();
    if (const SparseTable* sparse = table->AsSparse()) {
      const size_t stride = sparse->state_floats();
      const size_t page_rows =
          std::max<size_t>(1, kPageBytes / (sizeof(uint64_t) + stride * sizeof(float)));
      uint64_t cursor = 0;
      do {
        keys.clear();
        state.clear();
        cursor = sparse->ExportRows(cursor, page_rows, &keys, &state);
        for (size_t i = 0; i < keys.size(); ++i) {
          result.digest += RowDigest(
              id, keys[i], absl::MakeConstSpan(state).subspan(i * stride, stride));
        }
        result.sparse_rows += keys.size();
      } while (cursor != 0);
    } else {
      // The callback never fails.
      table->AsDense()
          ->ForEachBlock([&](uint64_t block, absl::Span<const float> values,
                             absl::Span<const float> block_state) {
            result.digest += BlockDigest(id, block, values, block_state);
            ++result.dense_blocks;
            return absl::OkStatus();
          })
          .IgnoreError();
    }
  }
  return result;
}

absl::StatusOr<ParameterDigest> DigestCheckpoint(const std::string& checkpoint_dir) {
  const std::string context = absl::StrCat("checkpoint ", checkpoint_dir);
  absl::StatusOr<CheckpointManifest> manifest = ReadManifest(checkpoint_dir);
  if (!manifest.ok()) return Annotate(manifest.status(), context);
  ParameterDigest result;
  for (const ShardFile& entry : manifest->shards()) {
    auto reader = ShardReader::Open(checkpoint_dir, entry, manifest->clock());
    if (!reader.ok()) return Annotate(reader.status(), context);
    DigestVisitor visitor((*reader)->layouts(), &result);
    PS_RETURN_IF_ERROR(Annotate((*reader)->ReadAll(visitor), context));
  }
  return result;
}

}  // namespace ps
