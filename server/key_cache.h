// The key lists workers keep on a server (RequestHeader.key_list_slot, as in
// the OSDI'14 parameter server): a worker sends a sparse request's keys
// once, and later requests with the same list carry a digest instead.
//
// Each sender has kKeyListSlots slots; the sender decides what each slot
// holds (a request with keys and a slot stores them there), and keeps a
// record of its own, so a lookup can only fail when the two records
// disagree (this server replaced a dead one, or a misbehaving sender).
// Memory is bounded per sender by `bytes_per_sender` (8 bytes a key), the
// same rule the sender applies before it asks for a store. Senders that
// leave the cluster are forgotten (Retain). Each list also carries the
// rows a sparse table found for it (RowMemo: 4 bytes a key once used, so
// at most half the budget again), which the server passes to the table.
//
// Not thread-safe: the serving thread owns it.
#ifndef PS_SERVER_KEY_CACHE_H_
#define PS_SERVER_KEY_CACHE_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "common/wire.h"
#include "server/row_memo.h"

namespace ps {

class KeyListCache {
 public:
  // bytes_per_sender <= 0 disables the cache: every store is refused.
  explicit KeyListCache(int64_t bytes_per_sender) : budget_(bytes_per_sender) {}

  // Stores `keys` in `sender`'s slot `slot` (1..kKeyListSlots), replacing
  // its list. INVALID_ARGUMENT (nothing stored, the old list dropped) if
  // the slot is out of range, `digest` is not KeyListDigest(keys), or the
  // sender's lists would exceed the budget.
  absl::Status Store(uint64_t sender, uint32_t slot, uint64_t digest,
                     absl::Span<const uint64_t> keys);

  // A stored list. `owned_epoch` and `owned_table` are for the server:
  // the view epoch in which it last found every key's slot in that table
  // its own (kNever: not yet), so a repeated list is not checked key by key
  // again while the view stands. (Slots depend on the table.) `rows`: for
  // SparseTable::Pull and Push; emptied when the slot gets a new list.
  struct List {
    uint64_t digest = 0;
    std::vector<uint64_t> keys;
    uint64_t owned_epoch = kNever;
    uint32_t owned_table = 0;
    RowMemo rows;
  };
  static constexpr uint64_t kNever = ~uint64_t{0};

  // The list in `sender`'s slot if it holds `num_keys` keys with `digest`;
  // nullptr otherwise. Valid until the next Store or Retain.
  List* Find(uint64_t sender, uint32_t slot, uint64_t digest, uint64_t num_keys);

  // The list Store put in `sender`'s slot last, or nullptr if it refused
  // it. Valid until the next Store or Retain.
  List* Stored(uint64_t sender, uint32_t slot);

  // Forgets every sender not in `live` (node ids).
  void Retain(const absl::flat_hash_set<uint64_t>& live);

  // Bytes of keys held, over all senders (row memos not included).
  int64_t bytes() const { return total_bytes_; }

 private:
  struct Sender {
    std::array<List, kKeyListSlots> slots;
    int64_t bytes = 0;
  };

  const int64_t budget_;
  absl::flat_hash_map<uint64_t, Sender> senders_;
  int64_t total_bytes_ = 0;
};

}  // namespace ps

#endif  // PS_SERVER_KEY_CACHE_H_
