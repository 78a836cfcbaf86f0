#include "common/wire.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {


bool HasValues(Op op) { return op == PUSH || op == PUSH_PULL || op == ASSIGN; }

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
      h.op() != ASSIGN) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown op ", static_cast<int>(h.op())));
  }
  if (HasValues(h.op()) != (frames.size() == 3)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Op_Name(h.op()), " request must ",
        HasValues(h.op()) ? "carry" : "not carry", " a values frame"));
  }
  absl::Status s = ViewFrame(frames[1], "keys", &out->keys, &out->key_copy);
  if (!s.ok()) return s;
  if (out->keys.size() != h.num_keys()) {
    return absl::InvalidArgumentError(
        absl::StrCat("header says ", h.num_keys(), " keys but the keys frame holds ",
                     out->keys.size()));
  }
  out->values = {};
  if (frames.size() == 3) {
    s = ViewFrame(frames[2], "values", &out->values, &out->value_copy);
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
  out->values = {};
  if (frames.size() >= 2) {
    absl::Status s =
        ViewFrame(frames[1], "values", &out->values, &out->value_copy);
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
