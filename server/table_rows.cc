#include "server/table_rows.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace ps {

absl::Status ForEachTableRow(
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
  // Reused across pages: ExportRows appends, so once grown they allocate
  // nothing more.
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

}  // namespace ps
