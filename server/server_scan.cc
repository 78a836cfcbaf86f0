// KVServer's SCAN op: pages through every row of a sparse table, for
// exporting a trained model (proto/data_plane.proto). Part of the request
// pipeline (server/request_pipeline.cc): reached after Decode and Admit.
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/status.h"
#include "common/wire.h"
#include "server/server_impl.h"

namespace ps {

absl::Status KVServer::Impl::ScanOp(std::vector<zmq::message_t>& frames, const Ownership& own,
                                    const RequestHeader& h, ResponseHeader* rh,
                                    zmq::message_t* values, zmq::message_t* keys,
                                    Outcome* outcome) {
  FinishDrop();  // no row of a slot moved away is listed
  auto it = tables_.find(h.table_id());
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown table ", h.table_id()));
  }
  const SparseTable* sparse = it->second->AsSparse();
  if (sparse == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", h.table_id(), " is dense; SCAN reads sparse tables (read "
        "dense ones with PULL)"));
  }
  // Held like a pull, so an export sees every step the sender's clock
  // covers; Progress() runs the request again once it may be answered.
  if (!PullAllowed(h.clock())) {
    PS_RETURN_IF_ERROR(admission_.RoomToHold(frames, "requests wait for slower workers"));
    *outcome = Outcome::kDefer;
    return absl::OkStatus();
  }
  Scan(*sparse, h, rh, values, keys);
  if (own.replicated && !own.slot_owner.empty() && rh->num_keys() > 0) {
    // Backup copies of other servers' slots stay out of an export.
    const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
    const uint32_t dim = sparse->dim();
    const uint64_t* k = keys->data<uint64_t>();
    const float* v = values->data<float>();
    std::vector<uint64_t> kept_keys;
    std::vector<float> kept_values;
    for (uint64_t i = 0; i < rh->num_keys(); ++i) {
      if (own.slot_owner[SparseSlot(h.table_id(), k[i], num_slots)] != own.rank) continue;
      kept_keys.push_back(k[i]);
      kept_values.insert(kept_values.end(), v + i * dim, v + (i + 1) * dim);
    }
    rh->set_num_keys(kept_keys.size());
    rh->set_num_values(kept_values.size());
    *keys = FrameFromVector(std::move(kept_keys));
    *values = FrameFromVector(std::move(kept_values));
  }
  return absl::OkStatus();
}

void KVServer::Impl::Scan(const SparseTable& sparse, const RequestHeader& h,
                    ResponseHeader* rh, zmq::message_t* values,
                    zmq::message_t* keys) {
  // Slot ownership is not checked: an export wants every row this server
  // holds, including rows of slots it no longer owns.
  uint64_t max_rows = h.scan_max_rows() == 0 ? kDefaultScanRows : h.scan_max_rows();
  // Keep the page (keys and values) under the message limit for wide rows.
  const uint64_t row_bytes = uint64_t{sparse.dim()} * sizeof(float) + sizeof(uint64_t);
  max_rows = std::max<uint64_t>(
      1, std::min<uint64_t>(max_rows, kMaxMessageBytes / 2 / row_bytes));
  // Bounds the work of one page when the index is mostly empty (rows
  // dropped by TTL or eviction leave the index at its largest size), so a
  // scan never stalls the serving loop for long.
  const uint64_t max_slots = std::max<uint64_t>(max_rows * 8, 65536);
  std::vector<uint64_t> page_keys;
  std::vector<float> page_values;
  page_keys.reserve(std::min<uint64_t>(max_rows, sparse.num_rows()));
  page_values.reserve(page_keys.capacity() * sparse.dim());
  const uint64_t next =
      sparse.Scan(h.scan_cursor(), max_rows, max_slots, &page_keys, &page_values);
  rh->set_num_keys(page_keys.size());
  rh->set_num_values(page_values.size());
  rh->set_next_cursor(next);
  *keys = FrameFromVector(std::move(page_keys));
  *values = FrameFromVector(std::move(page_values));
}

}  // namespace ps
