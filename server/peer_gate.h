// Who may open a data-plane connection to a server: a ZAP handler (ZeroMQ's
// authentication protocol, RFC 27) that every handshake on the serving
// socket goes through, plus a watch on that socket's connections.
//
// It enforces two rules:
//  - CURVE (JobConfig.security.curve, when keys are given): only clients
//    presenting the job public key are admitted. Why a ZAP handler: a CURVE
//    server socket without one admits any client that knows the server
//    public key, with any key pair of its own; the job public key is not a
//    secret (it is also every server's key), so only the check here makes
//    the job secret key the credential.
//  - max_connections (DataPlaneLimits): a handshake that would make more
//    connections open at once is refused with ZAP status 300 (temporary);
//    the client's ZeroMQ reconnects after its reconnect interval and is
//    admitted once others have closed. Connections are counted from the
//    socket monitor (accepted minus disconnected), which is drained before
//    each decision, so the count includes the connection being decided.
//
// Every refusal is logged (logger "peer_gate") and counted:
//   key refusals (ZAP), with the peer address, mechanism and key presented;
//   failed handshakes on the socket (a client without CURVE: a mechanism
//   mismatch; a wrong server key: the server cannot decrypt its HELLO),
//   with the local endpoint (libzmq 4.3's monitor does not give the peer
//   address of these);
//   connections over the limit, with the peer address.
// A refused client reconnects every 100 ms (libzmq's default), so lines of
// one kind come at most once per kLogInterval; the next line says how many
// were not logged. The counters count every refusal.
// Metrics (when a registry is given):
//   ps_server_auth_refusals_total{reason}   client_key or handshake (CURVE)
//   ps_server_connections_refused_total     over max_connections
//   ps_server_connections                   open data-plane connections
//
// Thread safety: Start() must run before the socket binds (a context
// without a bound ZAP handler lets clients in unchecked); the handler then
// runs on its own thread until destruction. The accessors may be called
// from any thread.
#ifndef PS_SERVER_PEER_GATE_H_
#define PS_SERVER_PEER_GATE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "common/curve_keys.h"
#include "common/metrics.h"
#include "common/status.h"
#include "zmq.hpp"

namespace ps {

class PeerGate {
 public:
  struct Options {
    // The job key pair: admit only CURVE clients presenting its public
    // key. nullopt: plaintext (NULL mechanism) clients, no key check.
    std::optional<CurveKeys> curve;
    // Most connections open at once; 0: no limit.
    uint32_t max_connections = 0;
    // Optional, not owned; must outlive the gate.
    metrics::Registry* metrics = nullptr;
  };

  // Binds the ZAP endpoint in `context` (not owned; must outlive this
  // object, and have no other ZAP handler), sets `socket`'s ZAP domain (so
  // plaintext handshakes go through the handler too) and monitors its
  // connections. Call before `socket` binds; `socket` must outlive the
  // gate. UNAVAILABLE if the ZAP endpoint is taken or the monitor cannot
  // start; INVALID_ARGUMENT for a malformed key.
  static absl::StatusOr<std::unique_ptr<PeerGate>> Start(zmq::context_t& context,
                                                         zmq::socket_t& socket,
                                                         Options options);

  // Stops and joins the handler thread.
  ~PeerGate();
  PeerGate(const PeerGate&) = delete;
  PeerGate& operator=(const PeerGate&) = delete;

  // Handshakes admitted; CURVE refusals (wrong key and failed handshakes);
  // refusals over max_connections; connections open now (as last seen).
  uint64_t admitted() const { return admitted_.load(); }
  uint64_t auth_refusals() const { return auth_refusals_.load(); }
  uint64_t connection_refusals() const { return connection_refusals_.load(); }
  int64_t open_connections() const { return open_.load(); }

 private:
  PeerGate() = default;
  void Run();
  void HandleZap();
  // Reads every queued monitor event.
  void DrainMonitor();
  void HandleMonitorEvent(std::vector<zmq::message_t>& frames);

  static constexpr absl::Duration kLogInterval = absl::Seconds(1);
  // Handler thread only.
  struct LogThrottle {
    absl::Time last = absl::InfinitePast();
    uint64_t suppressed = 0;
    // Whether to log now; *more notes the refusals not logged since.
    bool ShouldLog(std::string* more);
  };
  LogThrottle key_log_, handshake_log_, limit_log_;

  bool curve_ = false;
  std::string job_public_key_;  // 32 bytes, binary (as ZAP presents keys)
  uint32_t max_connections_ = 0;
  zmq::socket_t zap_;      // REP, inproc://zeromq.zap.01
  zmq::socket_t monitor_;  // PAIR to the socket's monitor
  metrics::Counter* refused_key_ = nullptr;
  metrics::Counter* refused_handshake_ = nullptr;
  metrics::Counter* refused_limit_ = nullptr;
  metrics::Gauge* connections_ = nullptr;
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> auth_refusals_{0};
  std::atomic<uint64_t> connection_refusals_{0};
  std::atomic<int64_t> open_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ps

#endif  // PS_SERVER_PEER_GATE_H_
