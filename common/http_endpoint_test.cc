#include "common/http_endpoint.h"

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace ps {
namespace {

using ::testing::HasSubstr;

struct Got {
  int status = -1;  // -1: no answer
  std::string body;
  std::string content_type;
};

Got Get(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(5, 0);
  Got got;
  if (auto res = client.Get(path.c_str())) {
    got.status = res->status;
    got.body = res->body;
    got.content_type = res->get_header_value("Content-Type");
  }
  return got;
}

TEST(HttpEndpointTest, ServesMetricsHealthReadinessAndPages) {
  metrics::Registry registry;
  registry.AddCounter("ps_test_requests_total", "Requests.")->Add(5);
  std::atomic<bool> ready{false};
  std::atomic<bool> healthy{true};
  HttpEndpoint::Options options;
  options.registry = &registry;
  options.health = [&]() -> absl::Status {
    return healthy ? absl::OkStatus() : absl::UnavailableError("serving thread stopped");
  };
  options.readiness = [&]() -> absl::Status {
    return ready ? absl::OkStatus() : absl::UnavailableError("not registered yet");
  };
  options.pages["/status"] = [] {
    return HttpEndpoint::Page{"text/html; charset=utf-8", "<p>hello</p>"};
  };
  auto endpoint = HttpEndpoint::Start(options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  ASSERT_GT(port, 0);
  EXPECT_EQ((*endpoint)->url(), "http://127.0.0.1:" + std::to_string(port));

  Got m = Get(port, "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_EQ(m.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_THAT(m.body, HasSubstr("# TYPE ps_test_requests_total counter\n"
                                "ps_test_requests_total 5\n"));

  Got h = Get(port, "/healthz");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body, "ok\n");
  healthy = false;
  h = Get(port, "/healthz");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.body, "serving thread stopped\n");

  Got r = Get(port, "/readyz");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body, "not registered yet\n");
  ready = true;
  r = Get(port, "/readyz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ready\n");

  Got s = Get(port, "/status");
  EXPECT_EQ(s.status, 200);
  EXPECT_EQ(s.body, "<p>hello</p>");
  EXPECT_EQ(s.content_type, "text/html; charset=utf-8");

  EXPECT_EQ(Get(port, "/nothing").status, 404);
  EXPECT_EQ(Get(port, "/status/").status, 404);  // paths match exactly
}

TEST(HttpEndpointTest, DefaultsAreHealthyAndReadyWithoutMetrics) {
  auto endpoint = HttpEndpoint::Start({});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  EXPECT_EQ(Get(port, "/healthz").status, 200);
  EXPECT_EQ(Get(port, "/readyz").status, 200);
  EXPECT_EQ(Get(port, "/metrics").status, 404);
}

TEST(HttpEndpointTest, MetricsReflectUpdatesBetweenScrapes) {
  metrics::Registry registry;
  metrics::Counter* c = registry.AddCounter("ps_test_total", "C.");
  HttpEndpoint::Options options;
  options.registry = &registry;
  auto endpoint = HttpEndpoint::Start(options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  EXPECT_THAT(Get((*endpoint)->port(), "/metrics").body, HasSubstr("ps_test_total 0\n"));
  c->Add(12);
  EXPECT_THAT(Get((*endpoint)->port(), "/metrics").body, HasSubstr("ps_test_total 12\n"));
}

TEST(HttpEndpointTest, AThrowingPageIsA500AndTheServerGoesOn) {
  HttpEndpoint::Options options;
  options.pages["/boom"] = []() -> HttpEndpoint::Page {
    throw std::runtime_error("page failed");
  };
  auto endpoint = HttpEndpoint::Start(options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  Got b = Get((*endpoint)->port(), "/boom");
  EXPECT_EQ(b.status, 500);
  EXPECT_THAT(b.body, HasSubstr("page failed"));
  EXPECT_EQ(Get((*endpoint)->port(), "/healthz").status, 200);
}

TEST(HttpEndpointTest, ConcurrentScrapes) {
  metrics::Registry registry;
  registry.AddGauge("ps_test_g", "G.")->Set(1);
  HttpEndpoint::Options options;
  options.registry = &registry;
  auto endpoint = HttpEndpoint::Start(options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        if (Get(port, "/metrics").status == 200) ++ok;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 60);
}

TEST(HttpEndpointTest, IdleConnectionsDoNotBlockOthers) {
  HttpEndpoint::Options options;
  options.threads = 2;
  auto endpoint = HttpEndpoint::Start(options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  // More clients than threads that asked once and would keep their
  // connection open.
  std::vector<std::unique_ptr<httplib::Client>> kept;
  for (int i = 0; i < 3; ++i) {
    kept.push_back(std::make_unique<httplib::Client>("127.0.0.1", port));
    kept.back()->set_keep_alive(true);
    auto res = kept.back()->Get("/healthz");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->get_header_value("Connection"), "close");
  }
  const absl::Time start = absl::Now();
  EXPECT_EQ(Get(port, "/healthz").status, 200);
  // Not waiting for a kept connection to time out.
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST(HttpEndpointTest, StopsWhenDestroyed) {
  auto endpoint = HttpEndpoint::Start({});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  ASSERT_EQ(Get(port, "/healthz").status, 200);
  endpoint->reset();
  EXPECT_EQ(Get(port, "/healthz").status, -1);
}

TEST(HttpEndpointTest, RefusesBadOptions) {
  HttpEndpoint::Options bad_port;
  bad_port.port = 70000;
  EXPECT_EQ(HttpEndpoint::Start(bad_port).status().code(),
            absl::StatusCode::kInvalidArgument);
  HttpEndpoint::Options negative;
  negative.port = -1;
  EXPECT_EQ(HttpEndpoint::Start(negative).status().code(),
            absl::StatusCode::kInvalidArgument);
  HttpEndpoint::Options builtin;
  builtin.pages["/metrics"] = [] { return HttpEndpoint::Page{}; };
  EXPECT_EQ(HttpEndpoint::Start(builtin).status().code(),
            absl::StatusCode::kInvalidArgument);
  HttpEndpoint::Options no_slash;
  no_slash.pages["status"] = [] { return HttpEndpoint::Page{}; };
  EXPECT_EQ(HttpEndpoint::Start(no_slash).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HttpEndpointTest, PortInUseIsUnavailable) {
  auto first = HttpEndpoint::Start({});
  ASSERT_TRUE(first.ok()) << first.status();
  HttpEndpoint::Options same;
  same.port = (*first)->port();
  auto second = HttpEndpoint::Start(same);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr(std::to_string(same.port)));
  // The first one still serves.
  EXPECT_EQ(Get((*first)->port(), "/healthz").status, 200);
}

TEST(StartHttpEndpointForMainTest, MinusOneIsOffOtherwiseStarts) {
  auto log = spdlog::default_logger();
  HttpEndpoint::Options off;
  off.port = -1;
  auto none = StartHttpEndpointForMain(*log, off);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);
  auto on = StartHttpEndpointForMain(*log, {});
  ASSERT_TRUE(on.ok()) << on.status();
  ASSERT_NE(*on, nullptr);
  EXPECT_EQ(Get((*on)->port(), "/healthz").status, 200);
  HttpEndpoint::Options bad;
  bad.port = -2;
  EXPECT_EQ(StartHttpEndpointForMain(*log, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
