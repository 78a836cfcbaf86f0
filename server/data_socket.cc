#include "server/data_socket.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/wire.h"

namespace ps {
namespace {

// Data-plane handshakes must complete within this (see Open).
constexpr int kHandshakeTimeoutMs = 3000;

}  // namespace

absl::Status DataSocket::Open(const std::string& bind_endpoint,
                              const DataPlaneLimits& limits,
                              const std::optional<CurveKeys>& curve,
                              metrics::Registry* metrics) {
  try {
    socket_ = zmq::socket_t(context_, zmq::socket_type::router);
    // A frame over the limit makes ZeroMQ drop the connection as soon as
    // the frame's size is read: nothing of it is buffered.
    socket_.set(zmq::sockopt::maxmsgsize, limits.max_message_bytes());
    socket_.set(zmq::sockopt::rcvhwm,
                static_cast<int>(limits.receive_queue_messages()));
    socket_.set(zmq::sockopt::linger, 0);
    // A connection that has not finished its handshake within this is
    // dropped: idle or stalled peers cannot hold connection places for
    // libzmq's default 30 s, and a peer the gate told to wait (max_connections)
    // is dropped and reconnects within it.
    socket_.set(zmq::sockopt::handshake_ivl,
                static_cast<int>(kHandshakeTimeoutMs));
    // The gate (ZAP handler) must be bound before the first handshake.
    PeerGate::Options gate;
    gate.curve = curve;
    gate.max_connections = limits.max_connections();
    gate.metrics = metrics;
    auto started = PeerGate::Start(context_, socket_, std::move(gate));
    if (!started.ok()) return started.status();
    gate_ = std::move(started).value();
    if (curve.has_value())
      PS_RETURN_IF_ERROR(ApplyCurveServer(socket_, *curve));
    socket_.bind(bind_endpoint);
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind ", bind_endpoint, ": ", e.what()));
  }
  const size_t colon = endpoint_.rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(endpoint_.substr(colon + 1), &port_)) {
    return absl::InternalError(
        absl::StrCat("cannot parse bound endpoint ", endpoint_));
  }
  return absl::OkStatus();
}

void DataSocket::Send(zmq::message_t& identity, const ResponseHeader& rh,
                      zmq::message_t& values, zmq::message_t& keys) {
  // header, [values, [keys]]: a keys frame needs the values frame before
  // it, even if empty.
  const bool has_keys = keys.size() > 0;
  const bool has_values = has_keys || values.size() > 0;
  socket_.send(identity, zmq::send_flags::sndmore);
  socket_.send(SerializeToFrame(rh),
               has_values ? zmq::send_flags::sndmore : zmq::send_flags::none);
  if (has_values) {
    socket_.send(values,
                 has_keys ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  if (has_keys) socket_.send(keys, zmq::send_flags::none);
}

}  // namespace ps
