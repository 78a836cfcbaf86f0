// Data-plane message codec (see proto/data_plane.proto for the layout).
//
// Decoding never trusts the peer: every frame count, size and field is
// checked, and errors come back as INVALID_ARGUMENT with a message fit to
// send back to the peer. Decoded spans point into the received frames when
// those are suitably aligned (libzmq may deliver a frame at any offset of
// its receive buffer), and into an owned copy otherwise.
// Thread-compatible.
#ifndef PS_COMMON_WIRE_H_
#define PS_COMMON_WIRE_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/finite.h"
#include "common/protocol.h"
#include "common/status.h"
#include "proto/data_plane.pb.h"
#include "zmq.hpp"

namespace ps {

// Views a frame as an array of T without copying when it is aligned (a
// copy in *copy otherwise). INVALID_ARGUMENT naming `what` when its size is
// not a multiple of sizeof(T). The view lives as long as the frame (or
// *copy).
template <typename T>
absl::Status ViewFrame(const zmq::message_t& frame, const char* what,
                       absl::Span<const T>* view, std::vector<T>* copy) {
  const size_t bytes = frame.size();
  if (bytes % sizeof(T) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " frame has ", bytes,
                     " bytes, not a multiple of ", sizeof(T)));
  }
  const size_t n = bytes / sizeof(T);
  const auto* data = static_cast<const char*>(frame.data());
  if (n == 0) {
    *view = {};
  } else if (reinterpret_cast<uintptr_t>(data) % alignof(T) == 0) {
    *view = absl::MakeConstSpan(reinterpret_cast<const T*>(data), n);
  } else {
    copy->resize(n);
    std::memcpy(copy->data(), data, bytes);
    *view = absl::MakeConstSpan(*copy);
  }
  return absl::OkStatus();
}

// Hard ceiling on any single data-plane message, checked before decoding.
inline constexpr int64_t kMaxMessageBytes = int64_t{1} << 30;

// SCAN page sizes (RequestHeader.scan_max_rows): the most rows a request
// may ask for, and the page size used when it asks for 0.
inline constexpr uint64_t kMaxScanRows = 1000000;
inline constexpr uint64_t kDefaultScanRows = 65536;

// Key-list caching (RequestHeader.key_list_slot): slots per sender on each
// server, numbered 1..kKeyListSlots.
inline constexpr uint32_t kKeyListSlots = 64;

// The digest of a key list that RequestHeader.key_list_digest carries: a
// 64-bit hash of the count and the keys in order. Four independent lanes
// keep it at about a nanosecond a key; never 0.
inline uint64_t KeyListDigest(absl::Span<const uint64_t> keys) {
  uint64_t lanes[4] = {0x9e3779b97f4a7c15ULL, 0xbf58476d1ce4e5b9ULL,
                       0x94d049bb133111ebULL, 0x2545f4914f6cdd1dULL};
  const size_t n = keys.size();
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j) {
      lanes[j] = (lanes[j] ^ keys[i + j]) * 0xff51afd7ed558ccdULL;
      lanes[j] ^= lanes[j] >> 29;
    }
  }
  for (; i < n; ++i) {
    lanes[0] = (lanes[0] ^ keys[i]) * 0xc4ceb9fe1a85ec53ULL;
    lanes[0] ^= lanes[0] >> 31;
  }
  uint64_t h = n;
  for (uint64_t lane : lanes) {
    h ^= lane;
    h *= 0x9fb21c651e98df25ULL;
    h ^= h >> 28;
  }
  return h == 0 ? 1 : h;
}

// A key-list slot (1..kKeyListSlots) for a list of this digest. Clients
// may choose slots as they like (KVClient picks the least recently used
// one when it sends the list); this is a default.
inline uint32_t KeyListSlotOf(uint64_t digest) {
  return 1 + static_cast<uint32_t>(digest % kKeyListSlots);
}

struct DecodedRequest {
  RequestHeader header;
  // Empty when keys_cached: the server then takes them from its key-list
  // cache (RequestHeader.key_list_slot) and points `keys` there.
  absl::Span<const uint64_t> keys;
  bool keys_cached = false;
  // Empty for PULL. Half-width push values (RequestHeader.push_values) are
  // decoded into value_copy.
  absl::Span<const float> values;

  // Backing storage for keys/values when the frames were misaligned.
  std::vector<uint64_t> key_copy;
  std::vector<float> value_copy;
};

// frames: header, keys, [values]. Also checks the key-list fields (slot
// range, ops that may use them) and the value encodings, and decodes
// half-width values. Checks structure only; table-specific
// sizes (dim, segment lengths) are checked by the server. For SCAN that
// means: no keys, no segments, no values frame, scan_max_rows <=
// kMaxScanRows (any cursor is structurally valid). `out` must not be
// moved while its spans are in use.
absl::Status DecodeRequest(std::vector<zmq::message_t>& frames,
                           DecodedRequest* out);

struct DecodedResponse {
  ResponseHeader header;
  // Half-width values (header.values_encoding) are decoded into value_copy.
  absl::Span<const float> values;
  // SCAN: the page's keys (header.num_keys of them); empty otherwise.
  absl::Span<const uint64_t> keys;
  std::vector<float> value_copy;
  std::vector<uint64_t> key_copy;
};

// frames: header, [values, [keys]]. Checks that the frames hold exactly
// header.num_values floats and header.num_keys keys. A non-OK code in the
// header is not a decode error: it is reported through header.code().
absl::Status DecodeResponse(std::vector<zmq::message_t>& frames,
                            DecodedResponse* out);

// Serialises a protobuf into a ZeroMQ frame.
zmq::message_t SerializeToFrame(const google::protobuf::MessageLite& message);

// A frame that owns `data` without copying it (libzmq frees it with the
// frame).
template <typename T>
zmq::message_t FrameFromVector(std::vector<T>&& data) {
  if (data.empty()) return zmq::message_t();
  auto* owned = new std::vector<T>(std::move(data));
  return zmq::message_t(
      owned->data(), owned->size() * sizeof(T),
      [](void*, void* hint) { delete static_cast<std::vector<T>*>(hint); },
      owned);
}

// A frame of `count` elements of `*data` from `offset` on, without copying:
// it holds a reference to `data` until libzmq is done with it (sends and
// retries included). `data` must not change meanwhile, and offset + count
// must lie within it.
template <typename T>
zmq::message_t FrameFromShared(std::shared_ptr<const std::vector<T>> data, size_t offset,
                               size_t count) {
  if (count == 0) return zmq::message_t();
  T* const start = const_cast<T*>(data->data() + offset);
  auto* hold = new std::shared_ptr<const std::vector<T>>(std::move(data));
  return zmq::message_t(
      start, count * sizeof(T),
      [](void*, void* hint) { delete static_cast<std::shared_ptr<const std::vector<T>>*>(hint); },
      hold);
}

}  // namespace ps

#endif  // PS_COMMON_WIRE_H_
