// The server's data-plane socket: the ZeroMQ context, the ROUTER socket
// workers (and primaries, for replica messages) send to, and the gate
// (ZAP handler) that admits their connections. Internal to //server:server.
//
// Thread safety: Open before the serving thread starts; then the socket is
// the serving thread's alone (Send, socket()). endpoint(), port() and
// gate() may be read from any thread once Open returned.
#ifndef PS_SERVER_DATA_SOCKET_H_
#define PS_SERVER_DATA_SOCKET_H_

#include <memory>
#include <optional>
#include <string>

#include "common/curve_keys.h"
#include "common/metrics.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "proto/data_plane.pb.h"
#include "server/peer_gate.h"
#include "zmq.hpp"

namespace ps {

class DataSocket {
 public:
  DataSocket() = default;
  DataSocket(const DataSocket&) = delete;
  DataSocket& operator=(const DataSocket&) = delete;

  // Opens the ROUTER socket under `limits`, starts its gate (`curve`: the
  // job key pair, nullopt for plaintext; `metrics`: optional, not owned,
  // must outlive this), and binds `bind_endpoint`. UNAVAILABLE when it
  // cannot bind (or start the gate), INTERNAL when the bound endpoint has
  // no port. Call once.
  absl::Status Open(const std::string& bind_endpoint,
                    const DataPlaneLimits& limits,
                    const std::optional<CurveKeys>& curve,
                    metrics::Registry* metrics);

  // The context the socket (and the server's links to its backups) live
  // in; objects with sockets in it must be destroyed before this.
  zmq::context_t& context() { return context_; }
  // Serving thread only, once open.
  zmq::socket_t& socket() { return socket_; }
  // The bound endpoint and its port.
  const std::string& endpoint() const { return endpoint_; }
  int port() const { return port_; }
  // Null before Open succeeded. Its counters are safe from any thread.
  const PeerGate* gate() const { return gate_.get(); }

  // Serving thread only: sends `identity`'s answer, header then [values,
  // [keys]] (a keys frame needs the values frame before it, even if empty).
  void Send(zmq::message_t& identity, const ResponseHeader& rh,
            zmq::message_t& values, zmq::message_t& keys);

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
  // CURVE only; declared after socket_ and context_ so it stops first.
  std::unique_ptr<PeerGate> gate_;
  std::string endpoint_;
  int port_ = 0;
};

}  // namespace ps

#endif  // PS_SERVER_DATA_SOCKET_H_
