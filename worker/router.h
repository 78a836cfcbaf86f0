// Internal to //worker:kv_client. Slot splitting of data-plane requests:
// which server owns each key of a sparse request or each block of a dense
// range, by the cluster view's slot map (common/hash.h SparseSlot,
// DenseBlockSlot). The same functions split a request when it is built
// (KVClient) and again when it is routed anew after a failover (IoLoop), so
// both agree by construction.
//
// Pure functions of their arguments: no sockets, no state, thread-safe.
// Callers guarantee that every slot_owner entry is below num_servers
// (KVClient checks views against the job's server count).
#ifndef PS_WORKER_ROUTER_H_
#define PS_WORKER_ROUTER_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace ps {
namespace kv_internal {

// The owning server of sparse key `key` of `table`. slot_owner must not be
// empty.
uint32_t SparseOwner(absl::Span<const uint32_t> slot_owner, uint32_t table,
                     uint64_t key);

// The owning server of element `pos` of dense table `table` cut in blocks
// of `block_size` (>= 1) elements. slot_owner must not be empty.
uint32_t DenseOwner(absl::Span<const uint32_t> slot_owner, uint32_t table,
                    uint64_t block_size, uint64_t pos);

// A sparse request's keys by owning server.
struct SparseSplit {
  // owners[i]: the server of key i. Empty when every key goes to one server
  // (SplitSparse's sole_owner): then no per-key routing was done.
  std::vector<uint32_t> owners;
  // counts[s]: how many keys go to server s; num_servers entries.
  std::vector<uint32_t> counts;

  // The servers that receive keys, in ascending rank.
  std::vector<uint32_t> Servers() const;
  // The indices of the keys of `server`, in request order (counts[server]
  // of them). Only when owners is not empty.
  std::vector<uint32_t> IndicesOf(uint32_t server) const;
};

// Routes `keys` of sparse table `table`. `sole_owner` >= 0 names the server
// that owns every slot (a one-server job): the keys are counted, not hashed.
// slot_owner must not be empty unless keys is.
SparseSplit SplitSparse(absl::Span<const uint32_t> slot_owner,
                        int64_t sole_owner, uint32_t num_servers,
                        uint32_t table, absl::Span<const uint64_t> keys);

// A run of a dense table's elements [begin, begin + length).
struct DenseRange {
  uint64_t begin = 0;
  uint64_t length = 0;
};

// One piece of a dense request: a range inside one block, so one slot.
struct DensePiece {
  uint64_t begin = 0;
  uint64_t length = 0;
  uint32_t owner = 0;
  // Which input range it was cut from, and where its first element lies in
  // the concatenation of the input ranges (the request's values).
  uint32_t source = 0;
  uint64_t offset = 0;
};

// A dense request's pieces by owning server.
struct DenseSplit {
  // In input order; each input range cut at block boundaries.
  std::vector<DensePiece> pieces;
  // By server rank (num_servers entries): how many elements it receives;
  // the offset of its first element (in the concatenation of the inputs);
  // whether its elements are one contiguous run of that concatenation.
  std::vector<uint64_t> totals;
  std::vector<uint64_t> first;
  std::vector<bool> contiguous;

  // The servers that receive elements, in ascending rank.
  std::vector<uint32_t> Servers() const;
};

// Cuts `ranges` of dense table `table` (blocks of `block_size` >= 1
// elements) at block boundaries and routes each piece. slot_owner must not
// be empty unless every range is empty.
DenseSplit SplitDense(absl::Span<const uint32_t> slot_owner,
                      uint32_t num_servers, uint32_t table, uint64_t block_size,
                      absl::Span<const DenseRange> ranges);

}  // namespace kv_internal
}  // namespace ps

#endif  // PS_WORKER_ROUTER_H_
