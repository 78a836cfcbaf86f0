// The byte format of a checkpoint's shard files: a writer and a strict
// reader. The format itself is documented at the top of format.cc; what a
// checkpoint is and how its files are named and committed is in catalog.h.
//
// This layer knows records, not tables: the writer takes rows and blocks
// as flat arrays, and the reader hands them to a ShardVisitor. Matching
// them against live tables (server/checkpoint.h) is the server's business,
// so that the scheduler and offline tools can use //checkpoint without
// linking any table.
//
// Nothing read is trusted: every size is checked against the file's size,
// the record's type and the table layouts of the header before anything is
// allocated, and every record's checksum before its payload is passed on.
// Errors are DATA_LOSS "<file>: what is wrong (at offset N)".
//
// Thread safety: thread-compatible; a ShardWriter or ShardReader is used
// by one thread at a time. Different processes may write different shard
// files of one checkpoint at the same time.
#ifndef PS_CHECKPOINT_FORMAT_H_
#define PS_CHECKPOINT_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "proto/checkpoint.pb.h"
#include "proto/config.pb.h"

namespace ps {

namespace checkpoint_internal {
class FileReader;
class FileWriter;
}  // namespace checkpoint_internal

// Target payload of a sparse record: writers split a table's rows into
// pages of about this many bytes, so that writing and reading need a few
// MiB whatever the table's size.
inline constexpr size_t kShardPageBytes = size_t{4} << 20;

// The rows of one page for a sparse table whose rows hold `stride` floats.
inline size_t ShardPageRows(size_t stride) {
  const size_t row_bytes = sizeof(uint64_t) + stride * sizeof(float);
  return kShardPageBytes / row_bytes > 0 ? kShardPageBytes / row_bytes : 1;
}

// Floats of optimizer state per parameter element for an optimizer config;
// INVALID_ARGUMENT if the config is not valid. The format does not know
// the optimizer rules: the caller supplies them (server/checkpoint.cc uses
// common/optimizer.h).
using StateSizeFn =
    std::function<absl::StatusOr<int>(const OptimizerConfig& optimizer)>;

// What a reader needs to know of a table from a shard header.
struct TableLayout {
  uint32_t id = 0;
  bool sparse = false;
  int state_size = 0;
  uint32_t dim = 0;          // sparse
  size_t stride = 0;         // sparse: floats per row
  uint64_t size = 0;         // dense
  uint64_t block_size = 0;   // dense
  uint64_t num_blocks = 0;   // dense

  uint64_t BlockLength(uint64_t block) const {
    return block_size < size - block * block_size ? block_size
                                                  : size - block * block_size;
  }
};

// The layout of a table config read from a file, checked so that no size
// derived from it overflows or is absurd; INVALID_ARGUMENT otherwise.
absl::StatusOr<TableLayout> LayoutOf(const TableConfig& config,
                                     const StateSizeFn& state_size);

// Appends the records of one shard file. Made by WriteShardFile, which
// writes the preamble and the header record before and the end record and
// trailer after the caller's records.
class ShardWriter {
 public:
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // One SPARSE_ROWS record of table `index` (its position in the header):
  // keys.size() >= 1 rows, `state` holding the rows' full states one after
  // the other (state.size() a multiple of keys.size()).
  absl::Status Rows(uint32_t index, absl::Span<const uint64_t> keys,
                    absl::Span<const float> state);
  // One DENSE_BLOCK record of table `index`: the block's values, then its
  // optimizer state. Blocks of a table must come in increasing order.
  absl::Status Block(uint32_t index, uint64_t block,
                     absl::Span<const float> values,
                     absl::Span<const float> state);
  // The TABLE_END record of table `index`: `count` rows or blocks were
  // written for it. Every table of the header needs one, in order.
  absl::Status EndTable(uint32_t index, uint64_t count);

 private:
  friend absl::StatusOr<ShardFile> WriteShardFile(
      const std::string&, const ShardHeader&,
      const std::function<absl::Status(ShardWriter&)>&);
  explicit ShardWriter(checkpoint_internal::FileWriter* out) : out_(out) {}

  checkpoint_internal::FileWriter* out_;
};

// Writes `checkpoint_dir`/ShardFileName(header.rank()) durably (tmp file,
// fsync, rename, directory fsync), creating the directory and its parents
// if needed: the preamble and `header`, then whatever `write_tables` writes
// (for each table of the header in order, its rows or blocks and its
// TABLE_END), then the end record and the trailer. Returns the entry for
// the manifest. INVALID_ARGUMENT if the header exceeds 64 MiB; whatever
// write_tables returns; the errno's code for an I/O error. On an error no
// file of that name is created and an existing one is left as it was
// (except when only the final directory fsync fails).
absl::StatusOr<ShardFile> WriteShardFile(
    const std::string& checkpoint_dir, const ShardHeader& header,
    const std::function<absl::Status(ShardWriter&)>& write_tables);

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

// Reads one shard file of a checkpoint, checking everything against the
// manifest's entry and the format.
class ShardReader {
 public:
  // Opens `dir`/entry.file(), checks its size against the entry and reads
  // its preamble and header, which must name `clock` and the entry's rank.
  // DATA_LOSS naming what is wrong (a missing file included).
  static absl::StatusOr<std::unique_ptr<ShardReader>> Open(
      const std::string& dir, const ShardFile& entry, uint64_t clock,
      const StateSizeFn& state_size);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const ShardHeader& header() const { return header_; }
  // One per table of the header, in its order.
  const std::vector<TableLayout>& layouts() const { return layouts_; }

  // Reads every record after the header into `visitor`, each checked
  // before it is passed on, then the end of the file and its checksum
  // (against the file and the manifest's entry). Call once. Returns the
  // first error of the file or of the visitor.
  absl::Status ReadAll(ShardVisitor& visitor);

 private:
  struct RecordHeader;

  ShardReader(std::unique_ptr<checkpoint_internal::FileReader> file,
              const ShardFile& entry);
  absl::Status Fail(absl::string_view what) const;
  absl::Status ReadHeader(uint64_t clock, const StateSizeFn& state_size);
  absl::Status ReadRecordHeader(RecordHeader* h);
  absl::Status ReadPayload(const RecordHeader& h);

  std::unique_ptr<checkpoint_internal::FileReader> file_;
  const ShardFile entry_;
  ShardHeader header_;
  std::vector<TableLayout> layouts_;
  // Payload of the last record; 16-byte aligned (new[]), so keys and
  // floats can be read in place.
  std::unique_ptr<unsigned char[]> buffer_;
  size_t capacity_ = 0;
};

}  // namespace ps

#endif  // PS_CHECKPOINT_FORMAT_H_
