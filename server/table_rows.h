// Every row of a table with its full state, read page by page: what a
// replication catch-up sends, what a slot digest hashes, and what tests
// compare between servers.
#ifndef PS_SERVER_TABLE_ROWS_H_
#define PS_SERVER_TABLE_ROWS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "server/table.h"

namespace ps {

// Calls fn(id, values, state) for every row of `table`:
// - sparse: id is the key, `values` its full state (state_floats() floats,
//   weights and optimizer state as SparseTable::ExportRows gives them),
//   `state` empty; the rows in RAM, then those its disk tier holds (a key
//   is in one of the two), read `page_rows` (> 0) at a time, which bounds
//   the memory a page takes.
// - dense: id is the block, `values` and `state` as
//   DenseTable::ForEachBlock gives them.
// With `slots` (one entry per slot of the view), only the rows whose slot
// (common/hash.h SparseSlot, DenseBlockSlot) it selects; a disk tier reads
// only those slots' ranges.
// The spans are valid only during the call. Reads only: call while nothing
// writes the table (a row created, dropped, demoted or promoted in between
// may be missed or repeated). INTERNAL when a page's state does not match
// its keys; a disk tier's read error (then also the table's
// tier_failure()); the rows before it were visited. Else OK.
absl::Status ForEachTableRow(
    const Table& table, size_t page_rows,
    absl::FunctionRef<void(uint64_t id, absl::Span<const float> values,
                           absl::Span<const float> state)>
        fn,
    const std::vector<bool>* slots = nullptr);

}  // namespace ps

#endif  // PS_SERVER_TABLE_ROWS_H_
