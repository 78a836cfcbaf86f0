#include "server/key_cache.h"

#include "absl/strings/str_cat.h"

namespace ps {

absl::Status KeyListCache::Store(uint64_t sender, uint32_t slot, uint64_t digest,
                                 absl::Span<const uint64_t> keys) {
  if (slot < 1 || slot > kKeyListSlots) {
    return absl::InvalidArgumentError(absl::StrCat("key list slot ", slot, " is out of range"));
  }
  if (budget_ <= 0) {
    return absl::InvalidArgumentError("key-list caching is off (data_plane.key_cache_bytes)");
  }
  Sender& s = senders_[sender];
  List& e = s.slots[slot - 1];
  // The old list goes whatever happens: the sender's record of the slot
  // now names the new one.
  const int64_t old_bytes = static_cast<int64_t>(e.keys.size() * sizeof(uint64_t));
  s.bytes -= old_bytes;
  total_bytes_ -= old_bytes;
  e.digest = 0;
  e.keys = std::vector<uint64_t>();
  e.owned_epoch = kNever;
  e.rows = RowMemo();
  if (KeyListDigest(keys) != digest) {
    return absl::InvalidArgumentError("key_list_digest does not match the keys");
  }
  const int64_t new_bytes = static_cast<int64_t>(keys.size() * sizeof(uint64_t));
  if (s.bytes + new_bytes > budget_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "storing ", keys.size(), " keys in slot ", slot, " would put node ", sender,
        "'s key lists over data_plane.key_cache_bytes (", budget_, ")"));
  }
  e.keys.assign(keys.begin(), keys.end());
  e.digest = digest;
  s.bytes += new_bytes;
  total_bytes_ += new_bytes;
  return absl::OkStatus();
}

KeyListCache::List* KeyListCache::Find(uint64_t sender, uint32_t slot, uint64_t digest,
                                       uint64_t num_keys) {
  if (slot < 1 || slot > kKeyListSlots) return nullptr;
  auto it = senders_.find(sender);
  if (it == senders_.end()) return nullptr;
  List& e = it->second.slots[slot - 1];
  if (e.digest != digest || e.keys.size() != num_keys || e.keys.empty()) return nullptr;
  return &e;
}

KeyListCache::List* KeyListCache::Stored(uint64_t sender, uint32_t slot) {
  if (slot < 1 || slot > kKeyListSlots) return nullptr;
  auto it = senders_.find(sender);
  if (it == senders_.end()) return nullptr;
  List& e = it->second.slots[slot - 1];
  return e.digest == 0 ? nullptr : &e;
}

void KeyListCache::Retain(const absl::flat_hash_set<uint64_t>& live) {
  for (auto it = senders_.begin(); it != senders_.end();) {
    if (live.contains(it->first)) {
      ++it;
      continue;
    }
    total_bytes_ -= it->second.bytes;
    senders_.erase(it++);
  }
}

}  // namespace ps
