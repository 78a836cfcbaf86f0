// A test's raw connection to a KVServer's data socket: the request frames
// built by hand (so tests can also send what no client would) and the
// answers read back as they came. For the server's own tests, which speak
// the wire protocol (common/wire.h) without a KVClient. Not thread-safe.
#ifndef PS_SERVER_TESTING_RAW_CLIENT_H_
#define PS_SERVER_TESTING_RAW_CLIENT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "proto/data_plane.pb.h"
#include "zmq.hpp"

namespace ps::raw_client {

// Frames of the wire format, encoded explicitly little-endian as it
// specifies rather than in the host's byte order.
zmq::message_t KeysFrame(const std::vector<uint64_t>& keys);
zmq::message_t ValuesFrame(const std::vector<float>& values);
zmq::message_t BytesFrame(const std::string& bytes);
zmq::message_t HeaderFrame(const RequestHeader& h);

// (begin, length) of dense segments.
using SegmentList = std::vector<std::pair<uint64_t, uint64_t>>;
// A request header of `op` for `table` with `num_keys` keys and the dense
// `segments`.
RequestHeader Header(Op op, uint32_t table, uint64_t num_keys,
                     const SegmentList& segments = {});
// A SCAN request header for `table`: the page after `cursor` (0: the
// first), at most `max_rows` rows (0: the server's default).
RequestHeader ScanHeader(uint32_t table, uint64_t cursor, uint64_t max_rows);

// The frames, in order, as one message.
template <typename... F>
std::vector<zmq::message_t> Frames(F&&... frames) {
  std::vector<zmq::message_t> f;
  (f.push_back(std::forward<F>(frames)), ...);
  return f;
}

// A DEALER socket connected to a server's data endpoint. A reply that does
// not come within `timeout_ms` fails the test (never hangs it).
class RawClient {
 public:
  explicit RawClient(const std::string& endpoint, int timeout_ms = 5000);
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  // Sends one multipart message.
  void SendFrames(std::vector<zmq::message_t> frames);
  // The next reply's frames (the header first); empty, with a test
  // failure, when none came within the timeout.
  std::vector<zmq::message_t> ReceiveFrames();
  // SendFrames then ReceiveFrames.
  std::vector<zmq::message_t> RoundTrip(std::vector<zmq::message_t> frames);
  // The header of the next reply (default when none came).
  ResponseHeader ReceiveHeader();

  void Close() { socket_.close(); }
  // The socket itself, e.g. to poll it.
  zmq::socket_t& socket() { return socket_; }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

}  // namespace ps::raw_client

#endif  // PS_SERVER_TESTING_RAW_CLIENT_H_
