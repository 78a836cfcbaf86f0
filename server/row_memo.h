// The rows a sparse table found for a key list, kept so that a later
// request with the same list (a cached key list, server/key_cache.h) skips
// the table's hash index.
//
// In training every step pulls a list of keys and then pushes gradients for
// the same list, so the push's index lookups (hash, probe, a cache miss on
// a large table) repeat the pull's. SparseTable::Pull and Push fill a memo
// as they look keys up and use it when it is current. A row number stays
// the row of its key until the table drops a row (eviction, TTL), and the
// table then moves to a new generation, which invalidates every memo at
// once; creating rows invalidates nothing, since a key the memo holds as
// absent is looked up again.
//
// Plain data, owned by its user (the key list cache); not thread-safe.
#ifndef PS_SERVER_ROW_MEMO_H_
#define PS_SERVER_ROW_MEMO_H_

#include <cstdint>
#include <vector>

namespace ps {

struct RowMemo {
  // The table generation (SparseTable::generation()) the rows were found
  // in; 0, which no table has, marks an empty memo.
  uint64_t generation = 0;
  // rows[i] is the row of the list's key i, or RowIndex::kNotFound when the
  // key had none (it may have one by now: it is looked up again).
  std::vector<uint32_t> rows;
};

}  // namespace ps

#endif  // PS_SERVER_ROW_MEMO_H_
