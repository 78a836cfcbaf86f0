// Parameter tables held by a server.
//
// SparseTable: rows of `dim` floats keyed by arbitrary uint64 ids, created
// with deterministic initial values the first time a key is pulled or
// pushed. DenseTable: a fixed-size float array split into blocks; a server
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
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/config.pb.h"
#include "proto/data_plane.pb.h"
#include "server/optimizer.h"

namespace ps {

// Dense requests address elements by segments, as they arrive on the wire.
using Segments = google::protobuf::RepeatedPtrField<DenseSegment>;

class SparseTable;
class DenseTable;

class Table {
 public:
  virtual ~Table() = default;

  // INVALID_ARGUMENT for a config that sets neither sparse nor dense, or a
  // bad optimizer.
  static absl::StatusOr<std::unique_ptr<Table>> Create(
      const TableConfig& config);

  const TableConfig& config() const { return config_; }
  uint32_t id() const { return config_.id(); }
  virtual SparseTable* AsSparse() { return nullptr; }
  virtual DenseTable* AsDense() { return nullptr; }

  // Bytes held by parameters and optimizer state.
  virtual size_t MemoryBytes() const = 0;

 protected:
  Table(const TableConfig& config, std::unique_ptr<Optimizer> optimizer)
      : config_(config), optimizer_(std::move(optimizer)) {}

  const TableConfig config_;
  const std::unique_ptr<Optimizer> optimizer_;
};

class SparseTable : public Table {
 public:
  SparseTable(const TableConfig& config, std::unique_ptr<Optimizer> optimizer);
  SparseTable* AsSparse() override { return this; }

  uint32_t dim() const { return dim_; }
  size_t num_rows() const { return index_.size(); }
  size_t MemoryBytes() const override;

  // out must hold keys.size() * dim() floats; row i goes to out[i * dim()].
  void Pull(absl::Span<const uint64_t> keys, float* out);

  // grads holds keys.size() * dim() floats. A key that appears twice is
  // updated twice, in order.
  void Push(absl::Span<const uint64_t> keys, const float* grads);

 private:
  // Rows live in fixed-size chunks so growth never moves existing rows and
  // never copies the whole table. A chunk holds up to 16384 rows and about
  // 4 MiB at most, so wide rows do not reserve gigabytes on first touch.
  static constexpr size_t kMaxChunkBytes = size_t{4} << 20;
  static constexpr int kMaxChunkShift = 14;

  float* Row(uint64_t key);  // finds or creates

  const uint32_t dim_;
  const size_t stride_;  // floats per row: dim * (1 + state_size)
  const int chunk_shift_;  // log2 of rows per chunk
  const uint32_t chunk_rows_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;
  std::vector<std::unique_ptr<float[]>> chunks_;
};

class DenseTable : public Table {
 public:
  DenseTable(const TableConfig& config, std::unique_ptr<Optimizer> optimizer);
  DenseTable* AsDense() override { return this; }

  uint64_t size() const { return size_; }
  uint64_t block_size() const { return block_size_; }
  size_t MemoryBytes() const override;

  // INVALID_ARGUMENT unless every segment is non-empty, inside the table
  // and inside one block.
  absl::Status ValidateSegments(
      const Segments& segments) const;

  // Segments must be valid. Values are laid out segment after segment.
  void Pull(const Segments& segments, float* out);
  void Push(const Segments& segments, const float* grads);

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
