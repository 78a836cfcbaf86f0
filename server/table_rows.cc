#include "server/table_rows.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"

namespace ps {

absl::Status ForEachTableRow(
    const Table& table, size_t page_rows,
    absl::FunctionRef<void(uint64_t id, absl::Span<const float> values,
                           absl::Span<const float> state)>
        fn,
    const std::vector<bool>* slots) {
  const uint32_t id = table.id();
  const uint32_t num_slots =
      slots != nullptr ? static_cast<uint32_t>(slots->size()) : 0;
  if (slots != nullptr && num_slots == 0) return absl::OkStatus();
  if (const DenseTable* dense = table.AsDense()) {
    return dense->ForEachBlock([&](uint64_t block,
                                   absl::Span<const float> values,
                                   absl::Span<const float> state) {
      if (slots == nullptr || (*slots)[DenseBlockSlot(id, block, num_slots)])
        fn(block, values, state);
      return absl::OkStatus();
    });
  }
  const SparseTable& sparse = *table.AsSparse();
  const size_t stride = sparse.state_floats();
  auto visit = [&](absl::Span<const uint64_t> keys,
                   absl::Span<const float> state) -> absl::Status {
    if (state.size() != keys.size() * stride) {
      return absl::InternalError(absl::StrCat(
          "table ", id, ": a page of ", keys.size(), " rows carries ",
          state.size(), " floats of state, not ", keys.size() * stride));
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (slots == nullptr || (*slots)[SparseSlot(id, keys[i], num_slots)])
        fn(keys[i], state.subspan(i * stride, stride), {});
    }
    return absl::OkStatus();
  };
  // Reused across pages: ExportRows appends, so once grown they allocate
  // nothing more.
  std::vector<uint64_t> keys;
  std::vector<float> state;
  uint64_t cursor = 0;
  do {
    keys.clear();
    state.clear();
    cursor = sparse.ExportRows(cursor, page_rows, &keys, &state);
    PS_RETURN_IF_ERROR(visit(keys, state));
  } while (cursor != 0);
  // The tier's pages come in slot order and only from the selected slots.
  return sparse.ExportColdRows(page_rows, visit, slots);
}

}  // namespace ps
