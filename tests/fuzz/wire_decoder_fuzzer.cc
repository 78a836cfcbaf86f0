// Fuzz target: the data-plane decoders (common/wire.h DecodeRequest, what a
// server does first with every multipart message, and DecodeResponse, what
// a worker does with every reply).
//
// Input: [u8 flags][u32 frame count][u32 length][bytes]... (little-endian).
// flags bit 0: decode as a response instead of a request; bits 1-3: how
// many bytes off an 8-byte boundary the frames after the header start
// (libzmq may deliver a frame at any offset, which takes the copying
// path). At most 4 frames; a truncated input is dropped.
//
// A decoded request's dense segments then go through the server's table
// check (DenseTable::ValidateSegments, against a table of 100 elements in
// blocks of 16), and segments it accepts are pulled, pushed or assigned
// with exactly-sized buffers, so an accepted segment outside the table is
// a heap overflow.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/wire.h"
#include "proto/config.pb.h"
#include "server/table.h"
#include "tests/fuzz/fuzz_input.h"
#include "zmq.hpp"

namespace {

// Sums values as bits so that every element is read (ASan sees a span that
// runs past its frame) and the loop is not optimised away.
template <typename T>
uint64_t Touch(absl::Span<const T> span) {
  uint64_t sum = 0;
  for (const T& v : span) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    sum += bits;
  }
  return sum;
}

ps::DenseTable& Dense() {
  static ps::DenseTable* table = [] {
    ps::TableConfig config;
    config.set_id(2);
    config.set_name("dense");
    config.mutable_dense()->set_size(100);
    config.mutable_dense()->set_block_size(16);
    config.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
    auto created = ps::Table::Create(config);
    if (!created.ok()) ps::fuzz::Fail(created.status().ToString());
    return created->release()->AsDense();
  }();
  return *table;
}

// What the server does next with a dense request (server/server.cc
// ValidateShape, then the table operation).
void ApplyToDense(const ps::DecodedRequest& req) {
  const ps::RequestHeader& h = req.header;
  if (!req.keys.empty() || h.segments_size() == 0) return;
  ps::DenseTable& dense = Dense();
  if (!dense.ValidateSegments(h.segments()).ok()) return;
  uint64_t n = 0;
  for (const ps::DenseSegment& seg : h.segments()) {
    PS_FUZZ_CHECK(seg.length() > 0 && seg.begin() < dense.size() &&
                      seg.length() <= dense.size() - seg.begin(),
                  absl::StrCat("accepted segment [", seg.begin(), ", +", seg.length(), ")"));
    n += seg.length();
  }
  if (n > (1u << 20)) return;  // the server refuses these (CheckResponseSize)
  std::vector<float> buffer(n);
  if (h.op() == ps::PULL || h.op() == ps::PUSH_PULL) dense.Pull(h.segments(), buffer.data());
  if (req.values.size() != n || !ps::AllFinite(req.values)) return;
  std::copy(req.values.begin(), req.values.end(), buffer.begin());
  if (h.op() == ps::PUSH || h.op() == ps::PUSH_PULL) dense.Push(h.segments(), buffer.data());
  if (h.op() == ps::ASSIGN) dense.Assign(h.segments(), buffer.data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ps::fuzz::Input in(data, size);
  uint8_t flags = 0;
  uint32_t count = 0;
  if (!in.U8(&flags) || !in.U32(&count) || count > 4) return 0;
  const bool response = (flags & 1) != 0;
  const size_t misalign = (flags >> 1) & 7;

  // Each frame's bytes live in a buffer of exactly misalign + length bytes
  // (the header frame's at offset 0), so a read past a frame is a heap
  // overflow. The frames do not own them.
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
  std::vector<zmq::message_t> frames;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t length = 0;
    const uint8_t* bytes = nullptr;
    if (!in.U32(&length) || !in.Bytes(length, &bytes)) return 0;
    const size_t offset = i == 0 ? 0 : misalign;
    buffers.emplace_back(new uint8_t[offset + length + (offset + length == 0)]);
    uint8_t* frame = buffers.back().get() + offset;
    if (length > 0) std::memcpy(frame, bytes, length);
    frames.emplace_back(frame, length, [](void*, void*) {}, nullptr);
  }

  if (response) {
    ps::DecodedResponse out;
    if (!ps::DecodeResponse(frames, &out).ok()) return 0;
    PS_FUZZ_CHECK(out.values.size() == out.header.num_values(),
                  absl::StrCat(out.values.size(), " values"));
    PS_FUZZ_CHECK(out.keys.size() == out.header.num_keys(),
                  absl::StrCat(out.keys.size(), " keys"));
    volatile uint64_t sink = Touch(out.values) + Touch(out.keys);
    (void)sink;
    return 0;
  }

  ps::DecodedRequest out;
  if (!ps::DecodeRequest(frames, &out).ok()) return 0;
  const ps::RequestHeader& h = out.header;
  const bool has_values = h.op() == ps::PUSH || h.op() == ps::PUSH_PULL ||
                          h.op() == ps::ASSIGN;
  PS_FUZZ_CHECK(frames.size() == (has_values ? 3u : 2u), ps::Op_Name(h.op()));
  if (out.keys_cached) {
    PS_FUZZ_CHECK(h.key_list_slot() >= 1 && h.key_list_slot() <= ps::kKeyListSlots,
                  absl::StrCat("slot ", h.key_list_slot()));
    PS_FUZZ_CHECK(out.keys.empty(), "cached keys with a keys frame");
  } else {
    PS_FUZZ_CHECK(out.keys.size() == h.num_keys(),
                  absl::StrCat(out.keys.size(), " keys, header says ", h.num_keys()));
  }
  if (!has_values) PS_FUZZ_CHECK(out.values.empty(), "values without a values frame");
  if (h.op() == ps::SCAN) {
    PS_FUZZ_CHECK(out.keys.empty() && h.segments_size() == 0, "SCAN with keys");
    PS_FUZZ_CHECK(h.scan_max_rows() <= ps::kMaxScanRows, "SCAN page too large");
  }
  volatile uint64_t sink = Touch(out.keys) + Touch(out.values);
  (void)sink;
  ApplyToDense(out);
  return 0;
}
