// Every row of a table with its full state, for tests that compare what
// servers hold (replicas, checkpoints): a sparse table's rows read page by
// page through SparseTable::ExportRows, a dense table's created blocks
// through DenseTable::ForEachBlock. Reads only; call while nothing writes
// the table.
#ifndef PS_SERVER_TESTING_TABLE_ROWS_H_
#define PS_SERVER_TESTING_TABLE_ROWS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "server/table.h"

namespace ps::table_rows {

// Calls fn(id, values, state) for every row of `table`:
// - sparse: id is the key, `values` its full state (state_floats() floats,
//   weights and optimizer state as ExportRows gives them), `state` empty;
//   the rows are read `page_rows` at a time.
// - dense: id is the block, `values` and `state` as ForEachBlock gives
//   them.
// The spans are valid only during the call. INTERNAL when a page's state
// does not match its keys; else OK.
inline absl::Status ForEachRow(
    const Table& table, size_t page_rows,
    absl::FunctionRef<void(uint64_t id, absl::Span<const float> values,
                           absl::Span<const float> state)>
        fn) {
  if (const DenseTable* dense = table.AsDense()) {
    return dense->ForEachBlock([&](uint64_t block,
                                   absl::Span<const float> values,
                                   absl::Span<const float> state) {
      fn(block, values, state);
      return absl::OkStatus();
    });
  }
  const SparseTable& sparse = *table.AsSparse();
  const size_t stride = sparse.state_floats();
  std::vector<uint64_t> keys;
  std::vector<float> state;
  uint64_t cursor = 0;
  do {
    keys.clear();
    state.clear();
    cursor = sparse.ExportRows(cursor, page_rows, &keys, &state);
    if (state.size() != keys.size() * stride) {
      return absl::InternalError(absl::StrCat(
          "table ", table.id(), ": a page of ", keys.size(), " rows carries ",
          state.size(), " floats of state, not ", keys.size() * stride));
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      fn(keys[i], absl::MakeConstSpan(state).subspan(i * stride, stride), {});
    }
  } while (cursor != 0);
  return absl::OkStatus();
}

}  // namespace ps::table_rows

#endif  // PS_SERVER_TESTING_TABLE_ROWS_H_
