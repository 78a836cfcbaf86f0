// The metrics a KVServer exports (server/server_metrics.h), driven with
// raw data-plane requests against a standalone server.
#include "server/server_metrics.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/data_plane.pb.h"
#include "server/server.h"
#include "server/server_test_fixture.h"
#include "zmq.hpp"

namespace ps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// One sparse table; the fixture's (server_test_fixture.h) adds tables
// whose statistics would crowd the exposition.
constexpr char kMetricsConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 1 num_slots: 16 }
  tables {
    id: 0
    name: "emb"
    sparse { dim: 2 }
    optimizer { sgd { learning_rate: 0.5 } }
    init { kind: ZEROS }
  }
)pb";

zmq::message_t Frame(const void* data, size_t size) {
  return zmq::message_t(data, size);
}

// The fixture's standalone server over kMetricsConfig, exporting to
// registry_, which outlives it (the fixture's TearDown stops the server).
class ServerMetricsTest : public ServerTest {
 protected:
  void SetUp() override {
    StartServer(/*standalone=*/true, kMetricsConfig, /*clock=*/nullptr,
                &registry_);
  }

  // Sends the frames; returns the answer's header and the total size of
  // the frames sent.
  ResponseHeader Send(std::vector<zmq::message_t> frames,
                      uint64_t* sent_bytes) {
    for (const auto& f : frames) *sent_bytes += f.size();
    return ServerTest::Send(std::move(frames)).header;
  }

  std::vector<zmq::message_t> Request(Op op, uint32_t table,
                                      const std::vector<uint64_t>& keys,
                                      const std::vector<float>& values) {
    RequestHeader h;
    h.set_op(op);
    h.set_table_id(table);
    h.set_num_keys(keys.size());
    const std::string header = h.SerializeAsString();
    std::vector<zmq::message_t> frames;
    frames.push_back(Frame(header.data(), header.size()));
    frames.push_back(Frame(keys.data(), keys.size() * sizeof(uint64_t)));
    if (!values.empty())
      frames.push_back(Frame(values.data(), values.size() * sizeof(float)));
    return frames;
  }

  metrics::Registry registry_;
};

TEST_F(ServerMetricsTest, CountsRequestsBytesErrorsAndTables) {
  uint64_t sent = 0;
  EXPECT_EQ(Send(Request(PUSH, 0, {1, 2}, {1, 1, 1, 1}), &sent).code(), 0);
  EXPECT_EQ(Send(Request(PUSH, 0, {3}, {0.5f, 0.5f}), &sent).code(), 0);
  EXPECT_EQ(Send(Request(PULL, 0, {1, 2, 3}, {}), &sent).code(), 0);
  const float nan = std::nanf("");
  EXPECT_NE(Send(Request(PUSH, 0, {1}, {nan, 1}), &sent).code(), 0);
  EXPECT_NE(Send(Request(PUSH, 9, {1}, {1, 1}), &sent).code(), 0);
  std::vector<zmq::message_t> garbage;
  garbage.push_back(Frame("\xff\xff\xff", 3));
  EXPECT_NE(Send(std::move(garbage), &sent).code(), 0);

  std::string text = registry_.Expose();
  EXPECT_THAT(
      text,
      HasSubstr("ps_server_requests_total{op=\"push\",outcome=\"ok\"} 2\n"));
  EXPECT_THAT(
      text,
      HasSubstr("ps_server_requests_total{op=\"pull\",outcome=\"ok\"} 1\n"));
  EXPECT_THAT(
      text,
      HasSubstr("ps_server_requests_total{op=\"push\",outcome=\"error\"} 2\n"));
  EXPECT_THAT(
      text,
      HasSubstr(
          "ps_server_requests_total{op=\"invalid\",outcome=\"error\"} 1\n"));
  EXPECT_THAT(
      text,
      HasSubstr("ps_server_request_errors_total{reason=\"non_finite\"} 1\n"));
  EXPECT_THAT(
      text,
      HasSubstr(
          "ps_server_request_errors_total{reason=\"unknown_table\"} 1\n"));
  EXPECT_THAT(
      text,
      HasSubstr(
          "ps_server_request_errors_total{reason=\"invalid_request\"} 1\n"));
  EXPECT_THAT(
      text,
      HasSubstr("ps_server_request_errors_total{reason=\"misrouted\"} 0\n"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("ps_server_received_bytes_total ",
                                           sent, "\n")));
  // The pull's answer: 3 keys of dim 2.
  EXPECT_THAT(text, HasSubstr("ps_server_sent_bytes_total 24\n"));
  EXPECT_THAT(
      text,
      HasSubstr("ps_server_request_duration_seconds_count{op=\"push\"} 4\n"));
  EXPECT_THAT(
      text,
      HasSubstr("ps_server_request_duration_seconds_count{op=\"pull\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ps_server_keys_pushed_total 3\n"));
  EXPECT_THAT(text, HasSubstr("ps_server_keys_pulled_total 3\n"));
  // The serving thread ran: its CPU time is counted (a number, not 0).
  EXPECT_THAT(text, HasSubstr("ps_server_serving_cpu_seconds_total "));
  EXPECT_THAT(text, Not(HasSubstr("ps_server_serving_cpu_seconds_total 0\n")));

  // Table statistics are published every KVServer::kStatsPeriod.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline &&
         registry_.Expose().find("ps_server_table_rows{table=\"emb\"} 3\n") ==
             std::string::npos) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  text = registry_.Expose();
  EXPECT_THAT(text, HasSubstr("ps_server_table_rows{table=\"emb\"} 3\n"));
  EXPECT_THAT(
      text, HasSubstr("ps_server_table_keys_pushed_total{table=\"emb\"} 3\n"));
  EXPECT_THAT(
      text,
      HasSubstr(
          "ps_server_table_evictions_total{table=\"emb\",cause=\"ttl\"} 0\n"));
  EXPECT_THAT(text, Not(HasSubstr("ps_server_table_bytes{table=\"emb\"} 0\n")));
}

TEST_F(ServerMetricsTest, CountsLeaseAndFenceRefusals) {
  uint64_t sent = 0;
  // A lease that lapsed a second ago: refused, and counted as such.
  server_->SetLease(std::chrono::steady_clock::now() - std::chrono::seconds(1));
  EXPECT_NE(Send(Request(PUSH, 0, {1}, {1, 1}), &sent).code(), 0);
  EXPECT_NE(Send(Request(PULL, 0, {1}, {}), &sent).code(), 0);
  server_->SetLease(std::chrono::steady_clock::now() +
                    std::chrono::seconds(60));
  EXPECT_EQ(Send(Request(PULL, 0, {1}, {}), &sent).code(), 0);
  server_->Fence("dropped by the test");
  EXPECT_NE(Send(Request(PULL, 0, {1}, {}), &sent).code(), 0);
  const std::string text = registry_.Expose();
  EXPECT_THAT(text, HasSubstr("ps_server_lease_refusals_total 2\n"));
  EXPECT_THAT(text, HasSubstr("ps_server_fenced_refusals_total 1\n"));
}

TEST_F(ServerMetricsTest, ScrapingAfterTheServerIsGoneReadsNothing) {
  uint64_t sent = 0;
  EXPECT_EQ(Send(Request(PUSH, 0, {1}, {1, 1}), &sent).code(), 0);
  client_.reset();
  server_.reset();
  const std::string text = registry_.Expose();
  EXPECT_THAT(text, HasSubstr("ps_server_keys_pushed_total 0\n"));
  EXPECT_THAT(text, Not(HasSubstr("ps_server_table_rows{")));
  // What was counted on the serving thread stays.
  EXPECT_THAT(
      text,
      HasSubstr("ps_server_requests_total{op=\"push\",outcome=\"ok\"} 1\n"));
}

TEST(ServerInstrumentsTest, ClassifiesErrors) {
  ResponseHeader plain;
  ResponseHeader wrong_owner;
  wrong_owner.set_wrong_owner(true);
  using R = ServerInstruments::Reason;
  EXPECT_EQ(ServerInstruments::Classify(absl::FailedPreconditionError("slot 3"),
                                        wrong_owner),
            R::kMisrouted);
  EXPECT_EQ(
      ServerInstruments::Classify(
          absl::InvalidArgumentError("gradient 0 is not finite (nan)"), plain),
      R::kNonFinite);
  EXPECT_EQ(
      ServerInstruments::Classify(absl::UnavailableError("no view"), plain),
      R::kUnavailable);
  EXPECT_EQ(ServerInstruments::Classify(absl::ResourceExhaustedError("budget"),
                                        plain),
            R::kResourceExhausted);
  EXPECT_EQ(ServerInstruments::Classify(absl::AbortedError("too old"), plain),
            R::kStaleSequence);
  EXPECT_EQ(ServerInstruments::Classify(absl::InternalError("?"), plain),
            R::kOther);
}

}  // namespace
}  // namespace ps
