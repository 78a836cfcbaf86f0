// The fixture of the server's socket-level tests (server_*_test.cc): a
// KVServer on loopback with four tables, and a raw client (hand-built
// frames, //server:raw_client) that speaks to it as a worker would.
#ifndef PS_SERVER_SERVER_TEST_FIXTURE_H_
#define PS_SERVER_SERVER_TEST_FIXTURE_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/initializer.h"
#include "common/status.h"
#include "common/value_codec.h"
#include "common/wire.h"
#include "gtest/gtest.h"
#include "proto/data_plane.pb.h"
#include "proto/scheduler.pb.h"
#include "server/consistency.h"
#include "server/server.h"
#include "server/table.h"
#include "server/testing/raw_client.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace ps {

using raw_client::BytesFrame;
using raw_client::Frames;
using raw_client::Header;
using raw_client::HeaderFrame;
using raw_client::KeysFrame;
using raw_client::ScanHeader;
using raw_client::SegmentList;
using raw_client::ValuesFrame;

// Table 0: sparse, dim 2. Table 1: dense, 10 elements in blocks [0, 4),
// [4, 8), [8, 10). Tables 2 and 3: sparse with the largest allowed dim and
// dense with the largest allowed blocks (2^26 floats), for the response-size
// limit; their rows and blocks are never created. All SGD with lr 0.5 and zero
// init, so after pushes w = -0.5 * (sum of gradients), exact for the binary
// fractions used here.
constexpr char kConfig[] = R"pb(
  cluster { num_servers: 2 num_workers: 1 num_slots: 16 }
  tables {
    id: 0
    name: "emb"
    sparse { dim: 2 }
    optimizer { sgd { learning_rate: 0.5 } }
    init { kind: ZEROS }
  }
  tables {
    id: 1
    name: "dense"
    dense { size: 10 block_size: 4 }
    optimizer { sgd { learning_rate: 0.5 } }
  }
  tables {
    id: 2
    name: "huge"
    sparse { dim: 65536 }
    optimizer { sgd { learning_rate: 0.5 } }
  }
  tables {
    id: 3
    name: "huge_dense"
    dense { size: 1073741824 block_size: 67108864 }
    optimizer { sgd { learning_rate: 0.5 } }
  }
)pb";

constexpr uint32_t kSparse = 0;
constexpr uint32_t kDense = 1;
constexpr uint32_t kHuge = 2;
constexpr uint32_t kHugeDense = 3;
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

inline int64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      return std::stoll(line.substr(6)) * 1024;
    }
  }
  return -1;
}

// --------------------------------------------------------------- client

struct Response {
  // False when no reply came within the timeout; code() then reports
  // DEADLINE_EXCEEDED, which no test expects, so the test fails.
  bool received = false;
  ResponseHeader header;
  // Decoded by header.values_encoding (float32 unless the request asked
  // for a half-width encoding).
  std::vector<float> values;
  // The values frame as it came (empty when there was none).
  std::string value_bytes;
  absl::StatusCode code() const {
    return received ? static_cast<absl::StatusCode>(header.code())
                    : absl::StatusCode::kDeadlineExceeded;
  }
};

// A RUNNING view of `epoch` with 16 slots, all owned by server 0, and
// `workers` live workers: node r + 1 of rank r. In consistency `mode` when
// given.
inline ClusterView OwnerView(
    uint64_t epoch, uint32_t workers,
    std::optional<ConsistencyMode> mode = std::nullopt) {
  ClusterView view;
  view.set_epoch(epoch);
  view.set_job_state(RUNNING);
  view.set_num_slots(16);
  for (int s = 0; s < 16; ++s) view.add_slot_owner(0);
  for (uint32_t rank = 0; rank < workers; ++rank) {
    NodeInfo* worker = view.add_nodes();
    worker->set_node_id(rank + 1);
    worker->set_role(WORKER);
    worker->set_rank(rank);
    worker->set_state(ALIVE);
  }
  if (mode) view.mutable_consistency()->set_mode(*mode);
  return view;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(/*standalone=*/true); }

  // `clock`, when given, is the server's time source (Options::clock).
  // `metrics`, when given, gets the server's metrics; it must outlive the
  // server.
  void StartServer(bool standalone, const char* config_text = kConfig,
                   Clock* clock = nullptr,
                   metrics::Registry* metrics = nullptr) {
    auto config = ParseJobConfig(config_text, "server_test");
    ASSERT_TRUE(config.ok()) << config.status();
    KVServer::Options options;
    options.config = *config;
    options.bind_endpoint = "tcp://127.0.0.1:*";
    options.standalone = standalone;
    if (clock != nullptr) options.clock = clock;
    options.metrics = metrics;
    auto server = KVServer::Start(std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    EXPECT_GT(server_->port(), 0);
    // A lost reply fails the test (5 s), never hangs it.
    client_ = std::make_unique<raw_client::RawClient>(server_->endpoint());
  }

  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  // Sends one multipart request and waits for its response.
  Response Send(std::vector<zmq::message_t> frames) {
    client_->SendFrames(std::move(frames));
    return Receive();
  }

  // The next reply's frames, as they came; empty, with a test failure,
  // when none came within the receive timeout.
  std::vector<zmq::message_t> ReceiveFrames() {
    return client_->ReceiveFrames();
  }

  // The next response on the socket.
  Response Receive() {
    Response r;
    std::vector<zmq::message_t> reply = ReceiveFrames();
    if (reply.empty()) return r;
    r.received = true;
    // A response is [header] or [header, values].
    EXPECT_GE(reply.size(), 1u);
    EXPECT_LE(reply.size(), 2u);
    if (reply.empty()) return r;
    EXPECT_TRUE(r.header.ParseFromArray(reply[0].data(),
                                        static_cast<int>(reply[0].size())));
    if (reply.size() == 2) {
      r.value_bytes.assign(static_cast<const char*>(reply[1].data()),
                           reply[1].size());
    }
    if (reply.size() == 2 &&
        EncodedValueBytes(r.header.values_encoding()) == 2) {
      EXPECT_EQ(reply[1].size() % 2, 0u);
      r.values.resize(reply[1].size() / 2);
      DecodeValues(r.header.values_encoding(), reply[1].data(), r.values.size(),
                   r.values.data());
    } else if (reply.size() == 2) {
      EXPECT_EQ(reply[1].size() % 4, 0u);
      const auto* bytes = static_cast<const unsigned char*>(reply[1].data());
      for (size_t i = 0; i + 4 <= reply[1].size(); i += 4) {
        const uint32_t bits = bytes[i] | bytes[i + 1] << 8 |
                              bytes[i + 2] << 16 |
                              static_cast<uint32_t>(bytes[i + 3]) << 24;
        float v;
        std::memcpy(&v, &bits, sizeof(v));
        r.values.push_back(v);
      }
    }
    EXPECT_EQ(r.header.num_values(), r.values.size());
    return r;
  }

  // Sends a request without waiting for its answer; returns its request
  // id.
  uint64_t SendOnly(RequestHeader h, std::vector<zmq::message_t> rest) {
    client_->SendFrames(Numbered(std::move(h), std::move(rest)));
    return next_request_id_;
  }

  // Sends node `node`'s ADVANCE_CLOCK to `clock` without waiting for its
  // answer; returns its request id.
  uint64_t Advance(uint64_t node, uint64_t clock) {
    RequestHeader h = Header(ADVANCE_CLOCK, 0, 0);
    h.set_clock(clock);
    h.set_sender_node_id(node);
    return SendOnly(h, Frames(KeysFrame({})));
  }

  // Sends a well-formed request and checks that the request id is echoed.
  Response SendValid(RequestHeader h, std::vector<zmq::message_t> rest) {
    Response r = Send(Numbered(std::move(h), std::move(rest)));
    if (r.received) {
      EXPECT_EQ(r.header.request_id(), next_request_id_);
    }
    return r;
  }

  Response Pull(uint32_t table, const std::vector<uint64_t>& keys) {
    return SendValid(Header(PULL, table, keys.size()), Frames(KeysFrame(keys)));
  }
  Response Push(uint32_t table, const std::vector<uint64_t>& keys,
                const std::vector<float>& grads, Op op = PUSH) {
    return SendValid(Header(op, table, keys.size()),
                     Frames(KeysFrame(keys), ValuesFrame(grads)));
  }
  Response DensePull(const SegmentList& segs) {
    return SendValid(Header(PULL, kDense, 0, segs), Frames(KeysFrame({})));
  }
  Response DensePush(const SegmentList& segs, const std::vector<float>& grads,
                     Op op = PUSH) {
    return SendValid(Header(op, kDense, 0, segs),
                     Frames(KeysFrame({}), ValuesFrame(grads)));
  }

  // Values of sparse keys 7 and 42 and of the whole dense table, read with
  // valid pulls (so calling this also shows that the server still serves).
  std::vector<float> Snapshot() {
    Response s = Pull(kSparse, {7, 42});
    EXPECT_EQ(s.code(), absl::StatusCode::kOk) << s.header.message();
    Response d = DensePull({{0, 4}, {4, 4}, {8, 2}});
    EXPECT_EQ(d.code(), absl::StatusCode::kOk) << d.header.message();
    std::vector<float> all = s.values;
    all.insert(all.end(), d.values.begin(), d.values.end());
    return all;
  }

  // Checks a refused request's response: `code`, a message, no values; that
  // it counted as one more error than `*errors` (which it then holds); and
  // that the tables still hold `baseline` (Snapshot()). Call under
  // ASSERT_NO_FATAL_FAILURE: a response that never came ends the test.
  void ExpectRefusedWithoutEffect(const Response& r, absl::StatusCode code,
                                  uint64_t* errors,
                                  const std::vector<float>& baseline) {
    ASSERT_TRUE(r.received);
    EXPECT_EQ(r.code(), code) << r.header.message();
    EXPECT_FALSE(r.header.message().empty());
    EXPECT_TRUE(r.values.empty());
    EXPECT_EQ(server_->stats().errors, ++*errors);
    EXPECT_EQ(Snapshot(), baseline);
  }

  // Gives a non-standalone server `view` and waits until it serves a pull
  // (fails the test if it does not within 5 s).
  void InstallView(const ClusterView& view) {
    server_->UpdateView(view, 0);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (Pull(kSparse, {0}).code() != absl::StatusCode::kOk &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(Pull(kSparse, {0}).code(), absl::StatusCode::kOk);
  }

  // Gives a non-standalone server a RUNNING BSP view in which it owns
  // every slot, with workers node 1 (rank 0) and node 2 (rank 1), and waits
  // until it serves.
  void InstallBspView() {
    InstallView(OwnerView(/*epoch=*/1, /*workers=*/2, BSP));
  }

  // The header, with the next request id, then `rest`.
  std::vector<zmq::message_t> Numbered(RequestHeader h,
                                       std::vector<zmq::message_t> rest) {
    h.set_request_id(++next_request_id_);
    std::vector<zmq::message_t> frames;
    frames.push_back(HeaderFrame(h));
    for (auto& f : rest) frames.push_back(std::move(f));
    return frames;
  }

  // For tests' own extra sockets; the fixture's client has its own.
  zmq::context_t context_{1};
  std::unique_ptr<raw_client::RawClient> client_;
  std::unique_ptr<KVServer> server_;
  uint64_t next_request_id_ = 1000;
};

inline RequestHeader SeqHeader(Op op, uint32_t table, uint64_t num_keys,
                               uint64_t node, uint64_t seq) {
  RequestHeader h = Header(op, table, num_keys);
  h.set_sender_node_id(node);
  h.set_seq(seq);
  return h;
}

}  // namespace ps

#endif  // PS_SERVER_SERVER_TEST_FIXTURE_H_
