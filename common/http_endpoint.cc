#include "common/http_endpoint.h"

#include <sys/socket.h>

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "httplib.h"

namespace ps {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger = new std::shared_ptr<spdlog::logger>(GetLogger("http"));
  return *logger;
}

constexpr const char* kText = "text/plain; charset=utf-8";

// 200 with `ok_body`, or 503 with the check's reason.
void AnswerCheck(const std::function<absl::Status()>& check, const char* ok_body,
                 httplib::Response& res) {
  const absl::Status s = check ? check() : absl::OkStatus();
  if (s.ok()) {
    res.status = 200;
    res.set_content(ok_body, kText);
  } else {
    res.status = 503;
    res.set_content(absl::StrCat(s.message(), "\n"), kText);
  }
}

}  // namespace

HttpEndpoint::HttpEndpoint(Options options)
    : options_(std::move(options)), server_(std::make_unique<httplib::Server>()) {}

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(Options options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("http port ", options.port, " is outside 0..65535"));
  }
  for (const auto& [path, page] : options.pages) {
    if (path.empty() || path[0] != '/' || path == "/metrics" || path == "/healthz" ||
        path == "/readyz") {
      return absl::InvalidArgumentError(
          absl::StrCat("http page path '", path,
                       "' must start with '/' and not be /metrics, /healthz or /readyz"));
    }
    if (!page) return absl::InvalidArgumentError(absl::StrCat("http page ", path, " has no handler"));
  }
  std::unique_ptr<HttpEndpoint> e(new HttpEndpoint(std::move(options)));
  const Options& o = e->options_;
  httplib::Server& server = *e->server_;
  const int threads = std::max(1, o.threads);
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // One request per connection: a kept-alive connection holds a pool
  // thread until it times out, and a browser reloading /status could then
  // keep a liveness probe waiting. A client that connects and sends
  // nothing holds one for the read timeout at most.
  server.set_keep_alive_max_count(1);
  server.set_read_timeout(2, 0);
  server.set_write_timeout(5, 0);
  // httplib's default also sets SO_REUSEPORT, which lets a second process
  // bind the same port and take half the requests; a port in use must be
  // an error instead.
  server.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // One handler for every path, so page paths are matched exactly rather
  // than as regular expressions.
  server.Get(R"(/.*)", [ep = e.get()](const httplib::Request& req, httplib::Response& res) {
    const Options& o = ep->options_;
    if (req.path == "/metrics") {
      if (o.registry == nullptr) {
        res.status = 404;
        res.set_content("no metrics in this process\n", kText);
        return;
      }
      res.set_content(o.registry->Expose(), metrics::Registry::kContentType);
      return;
    }
    if (req.path == "/healthz") return AnswerCheck(o.health, "ok\n", res);
    if (req.path == "/readyz") return AnswerCheck(o.readiness, "ready\n", res);
    auto page = o.pages.find(req.path);
    if (page == o.pages.end()) {
      res.status = 404;
      res.set_content("not found\n", kText);
      return;
    }
    Page p = page->second();
    res.set_content(std::move(p.body), p.content_type);
  });
  server.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& ex) {
          what = ex.what();
        } catch (...) {
        }
        Log()->error("GET {}: {}", req.path, what);
        res.status = 500;
        res.set_content(absl::StrCat("internal error: ", what, "\n"), kText);
      });

  if (o.port == 0) {
    e->port_ = server.bind_to_any_port(o.host);
  } else {
    e->port_ = server.bind_to_port(o.host, o.port) ? o.port : -1;
  }
  if (e->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen for http on ", o.host, ":", o.port,
        o.port == 0 ? "" : " (port in use, or the host is not a local address?)"));
  }
  e->thread_ = std::thread([&server] { server.listen_after_bind(); });
  // stop() only takes effect once the server runs, so the destructor could
  // otherwise miss it.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!server.is_running() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  if (!server.is_running()) {
    // listen_after_bind() sets running first thing, so it has returned
    // (failed) already: the join is immediate.
    e->thread_.join();
    return absl::InternalError("http server did not start listening within 10 s");
  }
  return e;
}

HttpEndpoint::~HttpEndpoint() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string HttpEndpoint::url() const {
  return absl::StrCat("http://", options_.host, ":", port_);
}

absl::StatusOr<std::unique_ptr<HttpEndpoint>> StartHttpEndpointForMain(
    spdlog::logger& log, HttpEndpoint::Options options) {
  if (options.port == -1) {
    log.info("http endpoint off (--http_port=-1)");
    return std::unique_ptr<HttpEndpoint>();
  }
  auto endpoint = HttpEndpoint::Start(std::move(options));
  if (endpoint.ok()) log.info("http endpoint on {}", (*endpoint)->url());
  return endpoint;
}

}  // namespace ps
