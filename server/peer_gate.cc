#include "server/peer_gate.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "zmq_addon.hpp"

namespace ps {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger = new std::shared_ptr<spdlog::logger>(GetLogger("peer_gate"));
  return *logger;
}

constexpr std::chrono::milliseconds kPollPeriod{100};
constexpr int kWatchedEvents = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL;
// Any non-empty domain makes libzmq ask the handler about NULL-mechanism
// (plaintext) handshakes too; without one it asks only for CURVE.
constexpr char kZapDomain[] = "ps-data-plane";

std::string Z85(absl::string_view key) {
  if (key.size() != 32) return absl::StrCat("(", key.size(), " bytes)");
  char text[kCurveKeyZ85Length + 1];
  if (zmq_z85_encode(text, reinterpret_cast<const uint8_t*>(key.data()), 32) == nullptr) {
    return "(unencodable)";
  }
  return text;
}

std::string ProtocolError(uint32_t value) {
  switch (value) {
    case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
      return "security mechanism mismatch (a client without CURVE?)";
    case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
      return "cryptographic error (a client expecting another server key?)";
    case ZMQ_PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE:
      return "key exchange failed";
    default:
      return absl::StrCat("ZMTP protocol error 0x", absl::Hex(value));
  }
}

std::atomic<uint64_t> next_monitor{0};

}  // namespace

absl::StatusOr<std::unique_ptr<PeerGate>> PeerGate::Start(zmq::context_t& context,
                                                         zmq::socket_t& socket,
                                                         Options options) {
  std::unique_ptr<PeerGate> gate(new PeerGate());
  gate->max_connections_ = options.max_connections;
  if (options.curve.has_value()) {
    uint8_t binary[32];
    if (options.curve->public_key.size() != kCurveKeyZ85Length ||
        zmq_z85_decode(binary, options.curve->public_key.c_str()) == nullptr) {
      return absl::InvalidArgumentError("the job CURVE public key is not valid Z85");
    }
    gate->curve_ = true;
    gate->job_public_key_.assign(reinterpret_cast<const char*>(binary), sizeof(binary));
  }
  try {
    gate->zap_ = zmq::socket_t(context, zmq::socket_type::rep);
    gate->zap_.set(zmq::sockopt::linger, 0);
    gate->zap_.bind("inproc://zeromq.zap.01");
    socket.set(zmq::sockopt::zap_domain, kZapDomain);
    const std::string endpoint =
        absl::StrCat("inproc://ps-peer-gate-monitor-", next_monitor.fetch_add(1));
    if (zmq_socket_monitor(socket.handle(), endpoint.c_str(), kWatchedEvents) != 0) {
      throw zmq::error_t();
    }
    gate->monitor_ = zmq::socket_t(context, zmq::socket_type::pair);
    gate->monitor_.set(zmq::sockopt::linger, 0);
    gate->monitor_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the data-plane gate (ZAP handler): ", e.what()));
  }
  if (options.metrics != nullptr) {
    metrics::Registry* m = options.metrics;
    if (gate->curve_) {
      metrics::CounterFamily* family = m->AddCounterFamily(
          "ps_server_auth_refusals_total",
          "Data-plane connections refused by CURVE authentication, by reason: client_key "
          "(a key other than the job's), handshake (no CURVE, or a wrong server key).",
          {"reason"});
      gate->refused_key_ = family->With({"client_key"});
      gate->refused_handshake_ = family->With({"handshake"});
    }
    gate->refused_limit_ = m->AddCounter(
        "ps_server_connections_refused_total",
        "Data-plane connections refused because max_connections were open.");
    gate->connections_ =
        m->AddGauge("ps_server_connections", "Data-plane connections open now.");
  }
  gate->thread_ = std::thread([g = gate.get()] { g->Run(); });
  return gate;
}

bool PeerGate::LogThrottle::ShouldLog(std::string* more) {
  const absl::Time now = absl::Now();
  if (now - last < kLogInterval) {
    ++suppressed;
    return false;
  }
  last = now;
  if (suppressed > 0) {
    *more = absl::StrCat(" (and ", suppressed, " similar refusals not logged before it)");
    suppressed = 0;
  }
  return true;
}

PeerGate::~PeerGate() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void PeerGate::Run() {
  std::vector<zmq::pollitem_t> items = {{zap_.handle(), 0, ZMQ_POLLIN, 0},
                                        {monitor_.handle(), 0, ZMQ_POLLIN, 0}};
  while (!stop_.load()) {
    try {
      zmq::poll(items, kPollPeriod);
      // Connection events first: the count must include the connection a
      // ZAP request is about (its ACCEPTED event precedes its handshake).
      if (items[1].revents & ZMQ_POLLIN) DrainMonitor();
      if (items[0].revents & ZMQ_POLLIN) {
        DrainMonitor();
        HandleZap();
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      Log()->error("data-plane gate: {}", e.what());
    }
  }
}

void PeerGate::HandleZap() {
  std::vector<zmq::message_t> request;
  if (!zmq::recv_multipart(zap_, std::back_inserter(request))) return;
  // version, request id, domain, address, routing id, mechanism, credentials...
  std::string request_id, address, mechanism, key;
  if (request.size() >= 6) {
    request_id = request[1].to_string();
    address = request[3].to_string();
    mechanism = request[5].to_string();
  }
  if (request.size() >= 7) key = request[6].to_string();
  if (address.empty()) address = "(unknown)";
  std::string status = "400", reason;
  if (request.size() < 6 || request[0].to_string_view() != "1.0") {
    reason = "malformed ZAP request";
  } else if (curve_ && mechanism != "CURVE") {
    reason = absl::StrCat("mechanism ", mechanism, " is not CURVE");
  } else if (!curve_ && mechanism != "NULL") {
    reason = absl::StrCat("mechanism ", mechanism, " is not NULL (security is off)");
  } else if (curve_ && key != job_public_key_) {
    reason = absl::StrCat("client key ", Z85(key), " is not the job key");
  } else if (max_connections_ != 0 && open_.load() > static_cast<int64_t>(max_connections_)) {
    status = "300";
    reason = absl::StrCat(max_connections_, " connections are open (max_connections)");
  } else {
    status = "200";
  }
  if (status == "200") {
    admitted_.fetch_add(1);
  } else if (status == "300") {
    // Logged before counted, here and below: whoever reads the count sees
    // the line (tests wait for the count, then read the log).
    if (std::string more; limit_log_.ShouldLog(&more)) {
      Log()->warn("refused a data-plane connection from {}: {}{}", address, reason, more);
    }
    connection_refusals_.fetch_add(1);
    if (refused_limit_ != nullptr) refused_limit_->Add();
  } else {
    if (std::string more; key_log_.ShouldLog(&more)) {
      Log()->warn("refused a data-plane connection from {} (mechanism {}): {}{}", address,
                  mechanism.empty() ? "(none)" : mechanism, reason, more);
    }
    auth_refusals_.fetch_add(1);
    if (refused_key_ != nullptr) refused_key_->Add();
  }
  // zmq::buffer keeps a pointer only: the text must outlive the send.
  const std::string text = status == "200" ? std::string("OK") : reason;
  std::vector<zmq::const_buffer> reply = {
      zmq::str_buffer("1.0"), zmq::buffer(request_id), zmq::buffer(status),
      zmq::buffer(text), zmq::str_buffer(""), zmq::str_buffer("")};
  // A REP socket must answer; sizes of str_buffer include no terminator.
  zmq::send_multipart(zap_, reply);
}

void PeerGate::DrainMonitor() {
  std::vector<zmq::message_t> frames;
  while (true) {
    frames.clear();
    if (!zmq::recv_multipart(monitor_, std::back_inserter(frames),
                             zmq::recv_flags::dontwait)) {
      return;
    }
    HandleMonitorEvent(frames);
  }
}

void PeerGate::HandleMonitorEvent(std::vector<zmq::message_t>& frames) {
  if (frames.size() < 2 || frames[0].size() < 6) return;
  uint16_t event = 0;
  uint32_t value = 0;
  std::memcpy(&event, frames[0].data(), sizeof(event));
  std::memcpy(&value, static_cast<const char*>(frames[0].data()) + 2, sizeof(value));
  if (event == ZMQ_EVENT_ACCEPTED || event == ZMQ_EVENT_DISCONNECTED) {
    const int64_t delta = event == ZMQ_EVENT_ACCEPTED ? 1 : -1;
    const int64_t open = open_.fetch_add(delta) + delta;
    if (connections_ != nullptr) connections_->Set(static_cast<double>(open));
    return;
  }
  std::string reason;
  if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
    reason = ProtocolError(value);
  } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
    reason = absl::StrCat("handshake failed (errno ", value, ")");
  } else {
    return;
  }
  // Plaintext: a handshake that failed is a peer speaking something other
  // than ZMTP (or a mechanism this server does not offer); counted with
  // the CURVE refusals only when CURVE is on, as before.
  if (!curve_) {
    if (std::string more; handshake_log_.ShouldLog(&more)) {
      Log()->warn("a data-plane handshake on {} failed: {}{}", frames[1].to_string(), reason,
                  more);
    }
    return;
  }
  // Logged before counted (see HandleZap).
  if (std::string more; handshake_log_.ShouldLog(&more)) {
    Log()->warn("refused a data-plane connection on {} (mechanism CURVE expected): {}{}",
                frames[1].to_string(), reason, more);
  }
  auth_refusals_.fetch_add(1);
  if (refused_handshake_ != nullptr) refused_handshake_->Add();
}

}  // namespace ps
