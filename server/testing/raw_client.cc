#include "server/testing/raw_client.h"

#include <cstring>
#include <iterator>

#include "gtest/gtest.h"
#include "zmq_addon.hpp"

namespace ps::raw_client {

zmq::message_t KeysFrame(const std::vector<uint64_t>& keys) {
  std::string bytes;
  for (uint64_t k : keys) {
    for (int b = 0; b < 8; ++b)
      bytes.push_back(static_cast<char>(k >> (8 * b)));
  }
  return zmq::message_t(bytes.data(), bytes.size());
}

zmq::message_t ValuesFrame(const std::vector<float>& values) {
  std::string bytes;
  for (float v : values) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    for (int b = 0; b < 4; ++b)
      bytes.push_back(static_cast<char>(bits >> (8 * b)));
  }
  return zmq::message_t(bytes.data(), bytes.size());
}

zmq::message_t BytesFrame(const std::string& bytes) {
  return zmq::message_t(bytes.data(), bytes.size());
}

zmq::message_t HeaderFrame(const RequestHeader& h) {
  return BytesFrame(h.SerializeAsString());
}

RequestHeader Header(Op op, uint32_t table, uint64_t num_keys,
                     const SegmentList& segments) {
  RequestHeader h;
  h.set_op(op);
  h.set_table_id(table);
  h.set_num_keys(num_keys);
  for (const auto& [begin, length] : segments) {
    DenseSegment* s = h.add_segments();
    s->set_begin(begin);
    s->set_length(length);
  }
  return h;
}

RequestHeader ScanHeader(uint32_t table, uint64_t cursor, uint64_t max_rows) {
  RequestHeader h = Header(SCAN, table, 0);
  h.set_scan_cursor(cursor);
  h.set_scan_max_rows(max_rows);
  return h;
}

RawClient::RawClient(const std::string& endpoint, int timeout_ms)
    : socket_(context_, zmq::socket_type::dealer) {
  socket_.set(zmq::sockopt::rcvtimeo, timeout_ms);
  socket_.set(zmq::sockopt::linger, 0);
  socket_.connect(endpoint);
}

void RawClient::SendFrames(std::vector<zmq::message_t> frames) {
  EXPECT_TRUE(zmq::send_multipart(socket_, frames).has_value());
}

std::vector<zmq::message_t> RawClient::ReceiveFrames() {
  std::vector<zmq::message_t> reply;
  if (!zmq::recv_multipart(socket_, std::back_inserter(reply))) {
    ADD_FAILURE() << "no response within the receive timeout";
    reply.clear();
  }
  return reply;
}

std::vector<zmq::message_t> RawClient::RoundTrip(
    std::vector<zmq::message_t> frames) {
  SendFrames(std::move(frames));
  return ReceiveFrames();
}

ResponseHeader RawClient::ReceiveHeader() {
  ResponseHeader rh;
  std::vector<zmq::message_t> reply = ReceiveFrames();
  if (!reply.empty()) {
    EXPECT_TRUE(
        rh.ParseFromArray(reply[0].data(), static_cast<int>(reply[0].size())));
  }
  return rh;
}

}  // namespace ps::raw_client
