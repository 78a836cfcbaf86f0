// The HTTP endpoint every process serves for operators and monitoring:
//   GET /metrics  the registry in the Prometheus text format (404 without one)
//   GET /healthz  200 "ok", or 503 with the reason the process is unhealthy
//   GET /readyz   200 "ready", or 503 with the reason it is not ready yet
//   GET <path>    any extra page the process adds (the scheduler's /status)
// HEAD is answered like GET; any other path is 404.
//
// Start() binds and starts serving on a small thread pool; the destructor
// stops serving and joins the threads (a request in progress is finished
// first). Handlers and callbacks run on those threads, possibly several at
// once, so they must be thread-safe and must not block for long. An
// exception from a handler is answered with 500 and logged.
#ifndef PS_COMMON_HTTP_ENDPOINT_H_
#define PS_COMMON_HTTP_ENDPOINT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/metrics.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace httplib {
class Server;
}

namespace ps {

class HttpEndpoint {
 public:
  // What an extra page answers: a 200 with this body.
  struct Page {
    std::string content_type = "text/plain; charset=utf-8";
    std::string body;
  };

  struct Options {
    // Address to listen on, e.g. "127.0.0.1" or "0.0.0.0".
    std::string host = "127.0.0.1";
    // 0 picks a free port (see port()).
    int port = 0;
    // Served at /metrics. Not owned; must outlive the endpoint. Null: no
    // /metrics.
    const metrics::Registry* registry = nullptr;
    // OK: healthy (200 "ok"); otherwise 503 with the status message. Null:
    // always healthy. Liveness: "restart me if this fails".
    std::function<absl::Status()> health;
    // OK: ready (200 "ready"); otherwise 503 with the status message (e.g.
    // not registered yet, no cluster view). Null: always ready.
    std::function<absl::Status()> readiness;
    // Extra GET pages by exact path ("/status"); they may not replace the
    // three above.
    std::map<std::string, std::function<Page()>> pages;
    // Threads answering requests (one connection each; connections are not
    // kept alive).
    int threads = 4;
  };

  // INVALID_ARGUMENT for a port outside 0..65535 or a page path that does
  // not start with '/' or names a built-in page; UNAVAILABLE when the
  // address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(Options options);

  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  // The port bound.
  int port() const { return port_; }
  // "http://HOST:PORT".
  std::string url() const;

 private:
  explicit HttpEndpoint(Options options);

  const Options options_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::thread thread_;
};

// main()'s start of the endpoint: options.port -1 leaves it off (returns
// null); otherwise as Start(), and logs "http endpoint on http://HOST:PORT"
// on `log`.
absl::StatusOr<std::unique_ptr<HttpEndpoint>> StartHttpEndpointForMain(
    spdlog::logger& log, HttpEndpoint::Options options);

}  // namespace ps

#endif  // PS_COMMON_HTTP_ENDPOINT_H_
