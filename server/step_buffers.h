// BSP step buffers: the gradients of one step, summed per element until
// every live worker finished the step, then applied once, averaged
// (server/consistency.h decides when). The primary keeps one per step; a
// backup keeps its primaries' (replication), and moves them into its own
// when it takes over their slots. Not thread-safe: owned by the serving
// thread. Internal to //server:server.
#ifndef PS_SERVER_STEP_BUFFERS_H_
#define PS_SERVER_STEP_BUFFERS_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "proto/data_plane.pb.h"
#include "server/table.h"

namespace ps {

struct StepBuffer {
  // Sums are kept in double so the average does not depend on the order
  // in which workers' pushes arrive (to float precision).
  struct Sparse {
    absl::flat_hash_map<uint64_t, uint32_t> index;  // key -> row
    std::vector<uint64_t> keys;
    std::vector<double> sums;
    // The `dim` sums of `key`'s row, appended (zeroed) on first use.
    double* Row(uint64_t key, uint32_t dim);
  };
  struct Dense {
    // block -> sums over the block, and the touched element range.
    absl::flat_hash_map<uint64_t, std::vector<double>> blocks;
    absl::flat_hash_map<uint64_t, std::pair<uint64_t, uint64_t>> touched;
    // Widens `block`'s touched range to cover [lo, hi).
    void Touch(uint64_t block, uint64_t lo, uint64_t hi);
  };
  absl::flat_hash_map<uint32_t, Sparse> sparse;
  absl::flat_hash_map<uint32_t, Dense> dense;
  absl::flat_hash_set<uint64_t> pushers;  // node ids

  // Adds a validated push of `table` by `node_id` (keys for a sparse
  // table, segments for a dense one; grads as the push carried them).
  void Add(uint64_t node_id, Table* table, absl::Span<const uint64_t> keys,
           const Segments& segments, absl::Span<const float> grads);

  // Adds sums another buffer holds (a primary's, relayed to its backup)
  // of sparse table `table_id` with rows of `dim`: sums holds keys.size()
  // * dim values, in key order. The caller validated the sizes.
  void MergeSparseSums(uint32_t table_id, uint32_t dim,
                       absl::Span<const uint64_t> keys,
                       absl::Span<const double> sums);
  // As MergeSparseSums for dense `table`: ranges holds (block, lo, hi)
  // triples, each block's touched element range [lo, hi), and sums the
  // block's BlockLength(block) values for each triple in order. The caller
  // validated blocks, ranges and sizes.
  void MergeDenseSums(const DenseTable& table,
                      absl::Span<const uint64_t> ranges,
                      absl::Span<const double> sums);

  // Applies the sums divided by `divisor` to `tables` (by id; every table
  // buffered must be there) at the learning rate of `step` (no staleness
  // under BSP; num_workers for scale_with_workers). Only the touched range
  // of a dense block is updated.
  void ApplyTo(
      const absl::flat_hash_map<uint32_t, std::unique_ptr<Table>>& tables,
      uint64_t step, uint32_t divisor, uint32_t num_workers) const;

  // Moves (or, with `to` null, drops) the part that belongs to the slots
  // in `mask` (slot -> whether); `dims`: sparse table id -> dim.
  void ExtractSlots(const std::vector<bool>& mask, uint32_t num_slots,
                    const absl::flat_hash_map<uint32_t, uint32_t>& dims,
                    StepBuffer* to);

  // Whether no key or block is buffered (pushers aside).
  bool Empty() const;
};

}  // namespace ps

#endif  // PS_SERVER_STEP_BUFFERS_H_
