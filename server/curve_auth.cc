#include "server/curve_auth.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "zmq_addon.hpp"

namespace ps {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger = new std::shared_ptr<spdlog::logger>(GetLogger("curve_auth"));
  return *logger;
}

constexpr std::chrono::milliseconds kPollPeriod{100};
constexpr int kWatchedEvents = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL;

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

absl::StatusOr<std::unique_ptr<CurveAuthenticator>> CurveAuthenticator::Start(
    zmq::context_t& context, const CurveKeys& keys, zmq::socket_t* watched,
    metrics::Registry* metrics) {
  std::unique_ptr<CurveAuthenticator> auth(new CurveAuthenticator());
  uint8_t binary[32];
  if (zmq_z85_decode(binary, keys.public_key.c_str()) == nullptr) {
    return absl::InvalidArgumentError("the job CURVE public key is not valid Z85");
  }
  auth->job_public_key_.assign(reinterpret_cast<const char*>(binary), sizeof(binary));
  try {
    auth->zap_ = zmq::socket_t(context, zmq::socket_type::rep);
    auth->zap_.set(zmq::sockopt::linger, 0);
    auth->zap_.bind("inproc://zeromq.zap.01");
    if (watched != nullptr) {
      const std::string endpoint =
          absl::StrCat("inproc://ps-curve-monitor-", next_monitor.fetch_add(1));
      if (zmq_socket_monitor(watched->handle(), endpoint.c_str(), kWatchedEvents) != 0) {
        throw zmq::error_t();
      }
      auth->monitor_ = zmq::socket_t(context, zmq::socket_type::pair);
      auth->monitor_.set(zmq::sockopt::linger, 0);
      auth->monitor_.connect(endpoint);
      auth->watching_ = true;
    }
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the CURVE authenticator (ZAP handler): ", e.what()));
  }
  if (metrics != nullptr) {
    metrics::CounterFamily* family = metrics->AddCounterFamily(
        "ps_server_auth_refusals_total",
        "Data-plane connections refused by CURVE authentication, by reason: client_key "
        "(a key other than the job's), handshake (no CURVE, or a wrong server key).",
        {"reason"});
    auth->refused_key_ = family->With({"client_key"});
    auth->refused_handshake_ = family->With({"handshake"});
  }
  auth->thread_ = std::thread([a = auth.get()] { a->Run(); });
  return auth;
}

bool CurveAuthenticator::LogThrottle::ShouldLog(std::string* more) {
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

CurveAuthenticator::~CurveAuthenticator() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void CurveAuthenticator::Run() {
  std::vector<zmq::pollitem_t> items = {{zap_.handle(), 0, ZMQ_POLLIN, 0}};
  if (watching_) items.push_back({monitor_.handle(), 0, ZMQ_POLLIN, 0});
  while (!stop_.load()) {
    try {
      zmq::poll(items, kPollPeriod);
      if (items[0].revents & ZMQ_POLLIN) HandleZap();
      if (watching_ && (items[1].revents & ZMQ_POLLIN)) HandleMonitorEvent();
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      Log()->error("CURVE authenticator: {}", e.what());
    }
  }
}

void CurveAuthenticator::HandleZap() {
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
  std::string status = "400", reason;
  if (request.size() < 6 || request[0].to_string_view() != "1.0") {
    reason = "malformed ZAP request";
  } else if (mechanism != "CURVE") {
    reason = absl::StrCat("mechanism ", mechanism, " is not CURVE");
  } else if (key != job_public_key_) {
    reason = absl::StrCat("client key ", Z85(key), " is not the job key");
  } else {
    status = "200";
  }
  if (status == "200") {
    admitted_.fetch_add(1);
  } else {
    refusals_.fetch_add(1);
    if (refused_key_ != nullptr) refused_key_->Add();
    if (std::string more; zap_log_.ShouldLog(&more)) {
      Log()->warn("refused a data-plane connection from {} (mechanism {}): {}{}",
                  address.empty() ? "(unknown)" : address,
                  mechanism.empty() ? "(none)" : mechanism, reason, more);
    }
  }
  std::vector<zmq::const_buffer> reply = {
      zmq::str_buffer("1.0"), zmq::buffer(request_id), zmq::buffer(status),
      zmq::buffer(status == "200" ? std::string("OK") : reason),
      zmq::str_buffer(""), zmq::str_buffer("")};
  // A REP socket must answer; sizes of str_buffer include no terminator.
  zmq::send_multipart(zap_, reply);
}

void CurveAuthenticator::HandleMonitorEvent() {
  std::vector<zmq::message_t> frames;
  if (!zmq::recv_multipart(monitor_, std::back_inserter(frames))) return;
  if (frames.size() < 2 || frames[0].size() < 6) return;
  uint16_t event = 0;
  uint32_t value = 0;
  std::memcpy(&event, frames[0].data(), sizeof(event));
  std::memcpy(&value, static_cast<const char*>(frames[0].data()) + 2, sizeof(value));
  std::string reason;
  if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
    reason = ProtocolError(value);
  } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
    reason = absl::StrCat("handshake failed (errno ", value, ")");
  } else {
    return;
  }
  refusals_.fetch_add(1);
  if (refused_handshake_ != nullptr) refused_handshake_->Add();
  if (std::string more; handshake_log_.ShouldLog(&more)) {
    Log()->warn("refused a data-plane connection on {} (mechanism CURVE expected): {}{}",
                frames[1].to_string(), reason, more);
  }
}

}  // namespace ps
