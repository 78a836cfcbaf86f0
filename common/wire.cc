#include "common/wire.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/value_codec.h"

namespace ps {
namespace {

bool HasValues(Op op) { return op == PUSH || op == PUSH_PULL || op == ASSIGN; }

bool KnownEncoding(ValueEncoding e) {
  return e == VALUE_ENCODING_UNSPECIFIED || e == FLOAT32 || e == FLOAT16 || e == BFLOAT16;
}

// Views a values frame of `encoding` as floats: in place for FLOAT32
// (ViewFrame), decoded into *copy for the half-width encodings.
absl::Status ViewValues(const zmq::message_t& frame, ValueEncoding encoding, const char* what,
                        absl::Span<const float>* view, std::vector<float>* copy) {
  const size_t width = EncodedValueBytes(encoding);
  if (width == sizeof(float)) return ViewFrame(frame, what, view, copy);
  if (frame.size() % width != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " frame has ", frame.size(), " bytes, not a multiple of ", width,
        " (", ValueEncoding_Name(encoding), ")"));
  }
  copy->resize(frame.size() / width);
  DecodeValues(encoding, frame.data(), copy->size(), copy->data());
  *view = absl::MakeConstSpan(*copy);
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeRequest(std::vector<zmq::message_t>& frames,
                           DecodedRequest* out) {
  if (frames.size() < 2 || frames.size() > 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request has ", frames.size(),
        " frames; expected header, keys and, for pushes, values"));
  }
  if (!out->header.ParseFromArray(frames[0].data(),
                                  static_cast<int>(frames[0].size()))) {
    return absl::InvalidArgumentError("request header is not a valid RequestHeader");
  }
  const RequestHeader& h = out->header;
  if (h.op() != PUSH && h.op() != PULL && h.op() != PUSH_PULL &&
      h.op() != ADVANCE_CLOCK && h.op() != STATS && h.op() != SCAN &&
      h.op() != ASSIGN && h.op() != PREFETCH) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown op ", static_cast<int>(h.op())));
  }
  if (HasValues(h.op()) != (frames.size() == 3)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Op_Name(h.op()), " request must ",
        HasValues(h.op()) ? "carry" : "not carry", " a values frame"));
  }
  if (!KnownEncoding(h.push_values()) || !KnownEncoding(h.pull_values())) {
    return absl::InvalidArgumentError("unknown value encoding");
  }
  if (h.op() == ASSIGN && EncodedValueBytes(h.push_values()) != sizeof(float)) {
    return absl::InvalidArgumentError("ASSIGN values must be FLOAT32");
  }
  if (h.key_list_slot() != 0) {
    if (h.key_list_slot() > kKeyListSlots) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key_list_slot ", h.key_list_slot(), " is out of range 1..", kKeyListSlots));
    }
    if (h.op() != PUSH && h.op() != PULL && h.op() != PUSH_PULL) {
      return absl::InvalidArgumentError(
          absl::StrCat(Op_Name(h.op()), " cannot use a key list slot"));
    }
  }
  absl::Status s = ViewFrame(frames[1], "keys", &out->keys, &out->key_copy);
  if (!s.ok()) return s;
  out->keys_cached = h.key_list_slot() != 0 && out->keys.empty() && h.num_keys() > 0;
  if (out->keys.size() != h.num_keys() && !out->keys_cached) {
    return absl::InvalidArgumentError(
        absl::StrCat("header says ", h.num_keys(), " keys but the keys frame holds ",
                     out->keys.size()));
  }
  out->values = {};
  if (frames.size() == 3) {
    s = ViewValues(frames[2], h.push_values(), "values", &out->values, &out->value_copy);
    if (!s.ok()) return s;
  }
  if (h.op() == SCAN) {
    if (!out->keys.empty() || h.segments_size() != 0) {
      return absl::InvalidArgumentError(
          "SCAN carries no keys and no segments; it names a table and a cursor");
    }
    if (h.scan_max_rows() > kMaxScanRows) {
      return absl::InvalidArgumentError(
          absl::StrCat("SCAN asks for ", h.scan_max_rows(),
                       " rows per page; the limit is ", kMaxScanRows));
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeResponse(std::vector<zmq::message_t>& frames,
                            DecodedResponse* out) {
  if (frames.empty() || frames.size() > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("response has ", frames.size(), " frames"));
  }
  if (!out->header.ParseFromArray(frames[0].data(),
                                  static_cast<int>(frames[0].size()))) {
    return absl::InvalidArgumentError("response header is not a valid ResponseHeader");
  }
  if (!KnownEncoding(out->header.values_encoding())) {
    return absl::InvalidArgumentError("response values have an unknown encoding");
  }
  out->values = {};
  if (frames.size() >= 2) {
    absl::Status s = ViewValues(frames[1], out->header.values_encoding(), "values",
                                &out->values, &out->value_copy);
    if (!s.ok()) return s;
  }
  if (out->values.size() != out->header.num_values()) {
    return absl::InvalidArgumentError(
        absl::StrCat("response header says ", out->header.num_values(),
                     " values but the frame holds ", out->values.size()));
  }
  out->keys = {};
  if (frames.size() == 3) {
    absl::Status s = ViewFrame(frames[2], "keys", &out->keys, &out->key_copy);
    if (!s.ok()) return s;
  }
  if (out->keys.size() != out->header.num_keys()) {
    return absl::InvalidArgumentError(
        absl::StrCat("response header says ", out->header.num_keys(),
                     " keys but the frame holds ", out->keys.size()));
  }
  return absl::OkStatus();
}

zmq::message_t SerializeToFrame(const google::protobuf::MessageLite& message) {
  zmq::message_t frame(message.ByteSizeLong());
  message.SerializeWithCachedSizesToArray(static_cast<uint8_t*>(frame.data()));
  return frame;
}

}  // namespace ps
