// The server side of CURVE authentication (JobConfig.security.curve): a
// ZAP handler (ZeroMQ's authentication protocol, RFC 27) that admits only
// clients presenting the job public key, and a watch on the serving
// socket's failed handshakes.
//
// Why a ZAP handler: a CURVE server socket without one admits any client
// that knows the server public key, with any key pair of its own; the job
// public key is not a secret (it is also every server's key), so only the
// check here makes the job secret key the credential.
//
// Every refusal is logged (logger "curve_auth") and counted:
//   ZAP refusals, with the peer address, mechanism and the key presented;
//   failed handshakes on the watched socket (a client without CURVE: a
//   mechanism mismatch; a client with a wrong server key: the server
//   cannot decrypt its HELLO), with the local endpoint (libzmq 4.3's
//   socket monitor does not give the peer address of these).
// A refused client reconnects every 100 ms (libzmq's default), so lines
// of one kind come at most once per kLogInterval; the next line says how
// many were not logged. The counters count every refusal.
// Metric (when a registry is given): ps_server_auth_refusals_total{reason}
// with reason client_key (ZAP) or handshake (a failed handshake).
//
// Thread safety: Start() must run before the watched socket binds (a
// context without a bound ZAP handler lets CURVE clients in unchecked);
// the handler then runs on its own thread until destruction. refusals()
// may be called from any thread.
#ifndef PS_SERVER_CURVE_AUTH_H_
#define PS_SERVER_CURVE_AUTH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/curve_keys.h"
#include "common/metrics.h"
#include "zmq.hpp"

namespace ps {

class CurveAuthenticator {
 public:
  // Binds the ZAP endpoint in `context` (not owned; must outlive this
  // object, and have no other ZAP handler) and, if `watched` is not null,
  // monitors that socket's failed handshakes (call before it binds).
  // `metrics` is optional, not owned, and must outlive this object.
  // UNAVAILABLE if the ZAP endpoint is taken or the monitor cannot start.
  static absl::StatusOr<std::unique_ptr<CurveAuthenticator>> Start(
      zmq::context_t& context, const CurveKeys& keys, zmq::socket_t* watched,
      metrics::Registry* metrics);

  // Stops and joins the handler thread.
  ~CurveAuthenticator();
  CurveAuthenticator(const CurveAuthenticator&) = delete;
  CurveAuthenticator& operator=(const CurveAuthenticator&) = delete;

  // Clients admitted and refusals (ZAP and failed handshakes) so far.
  uint64_t admitted() const { return admitted_.load(); }
  uint64_t refusals() const { return refusals_.load(); }

 private:
  CurveAuthenticator() = default;
  void Run();
  void HandleZap();
  void HandleMonitorEvent();

  static constexpr absl::Duration kLogInterval = absl::Seconds(1);
  // Handler thread only.
  struct LogThrottle {
    absl::Time last = absl::InfinitePast();
    uint64_t suppressed = 0;
    // Whether to log now; *more notes the refusals not logged since.
    bool ShouldLog(std::string* more);
  };
  LogThrottle zap_log_, handshake_log_;

  std::string job_public_key_;  // 32 bytes, binary (as ZAP presents keys)
  zmq::socket_t zap_;           // REP, inproc://zeromq.zap.01
  zmq::socket_t monitor_;       // PAIR to the watched socket's monitor
  bool watching_ = false;
  metrics::Counter* refused_key_ = nullptr;
  metrics::Counter* refused_handshake_ = nullptr;
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> refusals_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ps

#endif  // PS_SERVER_CURVE_AUTH_H_
