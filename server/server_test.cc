#include "common/status.h"
#include "server/server.h"

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
#include "common/value_codec.h"
#include "common/wire.h"
#include "gtest/gtest.h"
#include "proto/data_plane.pb.h"
#include "proto/scheduler.pb.h"
#include "server/consistency.h"
#include "server/table.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace ps {
namespace {

// Table 0: sparse, dim 2. Table 1: dense, 10 elements in blocks [0, 4),
// [4, 8), [8, 10). Tables 2 and 3: sparse with the largest allowed dim and
// dense with the largest allowed blocks (2^26 floats), for the response-size
// limit; their rows and blocks are never created. All SGD with lr 0.5 and zero init, so after pushes
// w = -0.5 * (sum of gradients), exact for the binary fractions used here.
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

using SegmentList = std::vector<std::pair<uint64_t, uint64_t>>;

// ------------------------------------------------------- frame building

// Encodes explicitly little-endian, as the wire format specifies, rather
// than relying on the host's byte order.
zmq::message_t KeysFrame(const std::vector<uint64_t>& keys) {
  std::string bytes;
  for (uint64_t k : keys) {
    for (int b = 0; b < 8; ++b) bytes.push_back(static_cast<char>(k >> (8 * b)));
  }
  return zmq::message_t(bytes.data(), bytes.size());
}

zmq::message_t ValuesFrame(const std::vector<float>& values) {
  std::string bytes;
  for (float v : values) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>(bits >> (8 * b)));
  }
  return zmq::message_t(bytes.data(), bytes.size());
}

zmq::message_t BytesFrame(const std::string& bytes) {
  return zmq::message_t(bytes.data(), bytes.size());
}

zmq::message_t HeaderFrame(const RequestHeader& h) {
  return BytesFrame(h.SerializeAsString());
}

RequestHeader Header(Op op, uint32_t table, uint64_t num_keys,
                     const SegmentList& segments = {}) {
  RequestHeader h;
  h.set_op(op);
  h.set_table_id(table);
  h.set_num_keys(num_keys);
  for (const auto& [begin, length] : segments) {
    DenseSegment* s = h.add_segments();
    s->set_begin(begin);
    s->set_length(length);
  }
  return h;
}

std::vector<zmq::message_t> Frames(zmq::message_t a) {
  std::vector<zmq::message_t> f;
  f.push_back(std::move(a));
  return f;
}
std::vector<zmq::message_t> Frames(zmq::message_t a, zmq::message_t b) {
  std::vector<zmq::message_t> f = Frames(std::move(a));
  f.push_back(std::move(b));
  return f;
}
std::vector<zmq::message_t> Frames(zmq::message_t a, zmq::message_t b,
                                   zmq::message_t c) {
  std::vector<zmq::message_t> f = Frames(std::move(a), std::move(b));
  f.push_back(std::move(c));
  return f;
}
std::vector<zmq::message_t> Frames(zmq::message_t a, zmq::message_t b,
                                   zmq::message_t c, zmq::message_t d) {
  std::vector<zmq::message_t> f =
      Frames(std::move(a), std::move(b), std::move(c));
  f.push_back(std::move(d));
  return f;
}

// Current resident set of this process (server included), in bytes.
int64_t ResidentBytes() {
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

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(/*standalone=*/true); }

  // `clock`, when given, is the server's time source (Options::clock).
  // `metrics`, when given, gets the server's metrics; it must outlive the
  // server.
  void StartServer(bool standalone, const char* config_text = kConfig,
                   Clock* clock = nullptr, metrics::Registry* metrics = nullptr) {
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
    socket_ = zmq::socket_t(context_, zmq::socket_type::dealer);
    // A lost reply must fail the test, not hang it.
    socket_.set(zmq::sockopt::rcvtimeo, 5000);
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(server_->endpoint());
  }

  void TearDown() override {
    socket_.close();
    server_.reset();
  }

  // Sends one multipart request and waits for its response.
  Response Send(std::vector<zmq::message_t> frames) {
    zmq::send_multipart(socket_, frames);
    return Receive();
  }

  // The next response on the socket.
  Response Receive() {
    Response r;
    std::vector<zmq::message_t> reply;
    if (!zmq::recv_multipart(socket_, std::back_inserter(reply))) {
      ADD_FAILURE() << "no response within the receive timeout";
      return r;
    }
    r.received = true;
    // A response is [header] or [header, values].
    EXPECT_GE(reply.size(), 1u);
    EXPECT_LE(reply.size(), 2u);
    if (reply.empty()) return r;
    EXPECT_TRUE(r.header.ParseFromArray(reply[0].data(),
                                        static_cast<int>(reply[0].size())));
    if (reply.size() == 2) {
      r.value_bytes.assign(static_cast<const char*>(reply[1].data()), reply[1].size());
    }
    if (reply.size() == 2 && EncodedValueBytes(r.header.values_encoding()) == 2) {
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
    h.set_request_id(++next_request_id_);
    std::vector<zmq::message_t> frames;
    frames.push_back(HeaderFrame(h));
    for (auto& f : rest) frames.push_back(std::move(f));
    zmq::send_multipart(socket_, frames);
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
    h.set_request_id(++next_request_id_);
    std::vector<zmq::message_t> frames;
    frames.push_back(HeaderFrame(h));
    for (auto& f : rest) frames.push_back(std::move(f));
    Response r = Send(std::move(frames));
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

  // Gives a non-standalone server a RUNNING BSP view in which it owns
  // every slot, with workers node 1 (rank 0) and node 2 (rank 1), and waits
  // until it serves.
  void InstallBspView() {
    ClusterView view;
    view.set_epoch(1);
    view.set_job_state(RUNNING);
    view.set_num_slots(16);
    for (int s = 0; s < 16; ++s) view.add_slot_owner(0);
    for (uint32_t rank : {0u, 1u}) {
      NodeInfo* worker = view.add_nodes();
      worker->set_node_id(rank + 1);
      worker->set_role(WORKER);
      worker->set_rank(rank);
      worker->set_state(ALIVE);
    }
    view.mutable_consistency()->set_mode(BSP);
    server_->UpdateView(view, 0);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (Pull(kSparse, {0}).code() != absl::StatusCode::kOk && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(Pull(kSparse, {0}).code(), absl::StatusCode::kOk);
  }

  zmq::context_t context_{1};
  zmq::socket_t socket_;
  std::unique_ptr<KVServer> server_;
  uint64_t next_request_id_ = 1000;
};

// ------------------------------------------------- idempotent pushes

RequestHeader SeqHeader(Op op, uint32_t table, uint64_t num_keys, uint64_t node,
                        uint64_t seq) {
  RequestHeader h = Header(op, table, num_keys);
  h.set_sender_node_id(node);
  h.set_seq(seq);
  return h;
}

TEST_F(ServerTest, APushResentWithTheSameSequenceNumberIsAppliedOnce) {
  auto push = [&](uint64_t node, uint64_t seq, Op op = PUSH) {
    return SendValid(SeqHeader(op, kSparse, 1, node, seq),
                     Frames(KeysFrame({7}), ValuesFrame({1, 2})));
  };
  Response r = push(5, 1);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk);
  EXPECT_FALSE(r.header.duplicate());
  r = push(5, 1);  // a retry after a lost answer
  ASSERT_EQ(r.code(), absl::StatusCode::kOk);
  EXPECT_TRUE(r.header.duplicate());
  // A PUSH_PULL duplicate still answers the current values.
  r = push(5, 1, PUSH_PULL);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk);
  EXPECT_TRUE(r.header.duplicate());
  EXPECT_EQ(r.values, (std::vector<float>{-0.5f, -1.0f}));
  // Another sender's seq 1, and later seqs, are new; an older unseen seq
  // (arriving out of order) is new too.
  EXPECT_FALSE(push(6, 1).header.duplicate());
  EXPECT_FALSE(push(5, 9).header.duplicate());
  EXPECT_FALSE(push(5, 4).header.duplicate());
  EXPECT_TRUE(push(5, 4).header.duplicate());
  EXPECT_TRUE(push(5, 9).header.duplicate());
  // 1 + 1 + 1 + 1 applied pushes of (1, 2) at lr 0.5.
  r = Pull(kSparse, {7});
  EXPECT_EQ(r.values, (std::vector<float>{-2.0f, -4.0f}));
  EXPECT_EQ(server_->stats().duplicate_pushes, 4u);
  // Far behind the window: refused, not guessed.
  EXPECT_FALSE(push(5, 9 + (uint64_t{1} << 16)).header.duplicate());
  r = push(5, 2);
  EXPECT_EQ(r.code(), absl::StatusCode::kAborted) << r.header.message();
  r = Pull(kSparse, {7});
  EXPECT_EQ(r.values, (std::vector<float>{-2.5f, -5.0f}));
}

TEST_F(ServerTest, DuplicateDensePushIsAppliedOnce) {
  RequestHeader h = Header(PUSH, kDense, 0, {{0, 2}});
  h.set_sender_node_id(3);
  h.set_seq(77);
  for (int i = 0; i < 3; ++i) {
    Response r = SendValid(h, Frames(KeysFrame({}), ValuesFrame({2, 4})));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk);
    EXPECT_EQ(r.header.duplicate(), i > 0);
  }
  Response r = DensePull({{0, 2}});
  EXPECT_EQ(r.values, (std::vector<float>{-1.0f, -2.0f}));
}

// ----------------------------------------------------------- happy path

TEST_F(ServerTest, SparsePushPullAndPushPull) {
  Response r = Push(kSparse, {7, 42}, {1, 2, 3, 4});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_TRUE(r.header.message().empty());
  EXPECT_TRUE(r.values.empty());  // a plain push answers with no values

  // w = -0.5 g; key 99 is new and reads as its zero init.
  r = Pull(kSparse, {42, 7, 99});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1.5, -2, -0.5, -1, 0, 0}));

  // PUSH_PULL returns the values after its own push.
  r = Push(kSparse, {7}, {2, -2}, PUSH_PULL);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1.5, 0}));

  // A key repeated in one push is updated twice.
  r = Push(kSparse, {99, 99}, {1, 1, 1, 1}, PUSH_PULL);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1, -1, -1, -1}));

  r = Pull(kSparse, {7, 42});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1.5, 0, -1.5, -2}));
  // Standalone servers answer with epoch 0.
  EXPECT_EQ(r.header.epoch(), 0u);
}

TEST_F(ServerTest, DensePushPullAcrossBlocksAndShortLastBlock) {
  // Segments in blocks 0, 1 and the short last block [8, 10).
  Response r = DensePush({{2, 2}, {4, 3}, {8, 2}}, {1, 2, 3, 4, 5, 6, 8});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_TRUE(r.values.empty());

  r = DensePull({{0, 4}, {4, 4}, {8, 2}});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{0, 0, -0.5, -1, -1.5, -2, -2.5, 0,
                                          -3, -4}));

  // Values come back in segment order.
  r = DensePush({{9, 1}, {0, 1}}, {2, -4}, PUSH_PULL);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-5, 2}));

  r = DensePull({{8, 2}, {3, 1}});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-3, -5, -1}));
}

TEST_F(ServerTest, FramesAtAnyOffsetDecode) {
  // libzmq packs small frames back to back in its receive buffer, so the
  // keys and values frames start at offsets that depend on the header's
  // length. Request ids of 1..10 varint bytes shift the header length one
  // byte at a time, so both aligned and misaligned frames get decoded.
  const std::vector<uint64_t> keys = {1000, 1001, 1002, 1003, 1004};
  for (int i = 0; i < 10; ++i) {
    SCOPED_TRACE(testing::Message() << "header shift " << i);
    const uint64_t id = i == 9 ? (1ULL << 63) : (1ULL << (7 * i));
    RequestHeader h = Header(PUSH_PULL, kSparse, keys.size());
    h.set_request_id(id);
    Response r = Send(Frames(HeaderFrame(h), KeysFrame(keys),
                             ValuesFrame({1, 2, 3, 4, 5, 6, 7, 8, 9, 10})));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.header.request_id(), id);
    std::vector<float> want;
    for (int v = 1; v <= 10; ++v) want.push_back(-0.5f * v * (i + 1));
    EXPECT_EQ(r.values, want);
  }
}

// ------------------------------------------------------------ malformed

// Every malformed request gets an error of the expected code, changes no
// parameter, and leaves the server serving.
TEST_F(ServerTest, MalformedRequestsAreRejectedWithoutEffect) {
  ASSERT_EQ(Push(kSparse, {7, 42}, {1, 2, 3, 4}).code(),
            absl::StatusCode::kOk);
  ASSERT_EQ(DensePush({{0, 4}, {4, 4}, {8, 2}},
                      {1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
                .code(),
            absl::StatusCode::kOk);
  const std::vector<float> baseline = Snapshot();
  ASSERT_EQ(baseline, (std::vector<float>{-0.5, -1, -1.5, -2, -0.5, -1, -1.5,
                                          -2, -2.5, -3, -3.5, -4, -4.5, -5}));

  // Deterministic "random" bytes that are not a valid RequestHeader.
  std::string garbage(64, '\0');
  std::mt19937 rng(1234);
  for (char& c : garbage) c = static_cast<char>(rng());
  ASSERT_FALSE(RequestHeader().ParseFromString(garbage))
      << "the garbage happens to parse; pick another seed";

  using Code = absl::StatusCode;
  const Code kInvalid = Code::kInvalidArgument;
  auto push_header = [](uint32_t table, uint64_t num_keys,
                        const SegmentList& segs = {}) {
    return HeaderFrame(Header(PUSH, table, num_keys, segs));
  };
  struct Case {
    const char* name;
    std::function<std::vector<zmq::message_t>()> frames;
    Code code;
  };
  const Case cases[] = {
      {"garbage header",
       [&] { return Frames(BytesFrame(garbage), KeysFrame({7})); }, kInvalid},
      {"single empty frame", [] { return Frames(zmq::message_t()); },
       kInvalid},
      {"header frame only",
       [] { return Frames(HeaderFrame(Header(PULL, kSparse, 0))); }, kInvalid},
      {"push without values frame",
       [&] { return Frames(push_header(kSparse, 2), KeysFrame({7, 42})); },
       kInvalid},
      {"pull with a values frame",
       [] {
         return Frames(HeaderFrame(Header(PULL, kSparse, 1)), KeysFrame({7}),
                       ValuesFrame({1, 1}));
       },
       kInvalid},
      {"four frames",
       [&] {
         return Frames(push_header(kSparse, 2), KeysFrame({7, 42}),
                       ValuesFrame({1, 1, 1, 1}), ValuesFrame({1, 1, 1, 1}));
       },
       kInvalid},
      {"four frames on a pull",
       [] {
         return Frames(HeaderFrame(Header(PULL, kSparse, 1)), KeysFrame({7}),
                       ValuesFrame({1, 1}), ValuesFrame({1, 1}));
       },
       kInvalid},
      {"keys frame not a multiple of 8",
       [] {
         return Frames(HeaderFrame(Header(PULL, kSparse, 1)),
                       BytesFrame(std::string(12, '\1')));
       },
       kInvalid},
      {"header claims more keys than sent",
       [&] {
         return Frames(push_header(kSparse, 3), KeysFrame({7, 42}),
                       ValuesFrame({1, 1, 1, 1}));
       },
       kInvalid},
      {"header claims fewer keys than sent",
       [&] {
         return Frames(push_header(kSparse, 1), KeysFrame({7, 42}),
                       ValuesFrame({1, 1}));
       },
       kInvalid},
      {"too few values for dim",
       [&] {
         return Frames(push_header(kSparse, 2), KeysFrame({7, 42}),
                       ValuesFrame({1, 1, 1}));
       },
       kInvalid},
      {"too many values for dim",
       [&] {
         return Frames(push_header(kSparse, 2), KeysFrame({7, 42}),
                       ValuesFrame({1, 1, 1, 1, 1}));
       },
       kInvalid},
      {"empty values frame for a push",
       [&] {
         return Frames(push_header(kSparse, 2), KeysFrame({7, 42}),
                       ValuesFrame({}));
       },
       kInvalid},
      {"values frame not a multiple of 4",
       [&] {
         return Frames(push_header(kSparse, 2), KeysFrame({7, 42}),
                       BytesFrame(std::string(17, '\0')));
       },
       kInvalid},
      {"unknown table",
       [&] {
         return Frames(push_header(9, 1), KeysFrame({7}), ValuesFrame({1, 1}));
       },
       Code::kNotFound},
      {"op unspecified",
       [] {
         return Frames(HeaderFrame(Header(OP_UNSPECIFIED, kSparse, 1)),
                       KeysFrame({7}), ValuesFrame({1, 1}));
       },
       kInvalid},
      {"op unspecified without values",
       [] {
         return Frames(HeaderFrame(Header(OP_UNSPECIFIED, kSparse, 1)),
                       KeysFrame({7}));
       },
       kInvalid},
      {"op out of range without values",
       [] {
         return Frames(HeaderFrame(Header(static_cast<Op>(42), kSparse, 1)),
                       KeysFrame({7}));
       },
       kInvalid},
      {"op out of range",
       [] {
         return Frames(HeaderFrame(Header(static_cast<Op>(42), kSparse, 1)),
                       KeysFrame({7}), ValuesFrame({1, 1}));
       },
       kInvalid},
      {"dense push carrying keys",
       [&] {
         return Frames(push_header(kDense, 1, {{0, 1}}), KeysFrame({0}),
                       ValuesFrame({1}));
       },
       kInvalid},
      {"dense pull carrying keys",
       [] {
         return Frames(HeaderFrame(Header(PULL, kDense, 1, {{0, 1}})),
                       KeysFrame({0}));
       },
       kInvalid},
      {"sparse push carrying segments",
       [&] {
         return Frames(push_header(kSparse, 1, {{0, 1}}), KeysFrame({7}),
                       ValuesFrame({1, 1}));
       },
       kInvalid},
      {"dense segment begins at the end",
       [&] {
         return Frames(push_header(kDense, 0, {{10, 1}}), KeysFrame({}),
                       ValuesFrame({1}));
       },
       kInvalid},
      {"dense segment runs past the end",
       [&] {
         return Frames(push_header(kDense, 0, {{8, 3}}), KeysFrame({}),
                       ValuesFrame({1, 1, 1}));
       },
       kInvalid},
      {"dense segment length overflows",
       [&] {
         return Frames(push_header(kDense, 0, {{9, kU64Max}}), KeysFrame({}),
                       ValuesFrame({1}));
       },
       kInvalid},
      {"dense segment crosses a block",
       [&] {
         return Frames(push_header(kDense, 0, {{3, 2}}), KeysFrame({}),
                       ValuesFrame({1, 1}));
       },
       kInvalid},
      {"dense empty segment",
       [&] {
         return Frames(push_header(kDense, 0, {{0, 1}, {2, 0}}), KeysFrame({}),
                       ValuesFrame({1}));
       },
       kInvalid},
      {"dense push with too few values",
       [&] {
         return Frames(push_header(kDense, 0, {{0, 2}, {4, 1}}),
                       KeysFrame({}), ValuesFrame({1, 1}));
       },
       kInvalid},
      {"dense push with too many values",
       [&] {
         return Frames(push_header(kDense, 0, {{0, 2}}), KeysFrame({}),
                       ValuesFrame({1, 1, 1}));
       },
       kInvalid},
      {"sparse NaN gradient after finite ones",
       [&] {
         return Frames(push_header(kSparse, 2), KeysFrame({7, 42}),
                       ValuesFrame({1, 1, kNaN, 1}));
       },
       kInvalid},
      {"sparse +Inf gradient",
       [&] {
         return Frames(push_header(kSparse, 2), KeysFrame({7, 42}),
                       ValuesFrame({1, 1, 1, kInf}));
       },
       kInvalid},
      {"sparse -Inf gradient in a push-pull",
       [] {
         return Frames(HeaderFrame(Header(PUSH_PULL, kSparse, 2)),
                       KeysFrame({42, 7}), ValuesFrame({-kInf, 1, 1, 1}));
       },
       kInvalid},
      {"dense NaN gradient",
       [&] {
         return Frames(push_header(kDense, 0, {{0, 2}, {8, 2}}),
                       KeysFrame({}), ValuesFrame({1, 1, 1, kNaN}));
       },
       kInvalid},
      {"dense Inf gradient in a push-pull",
       [] {
         return Frames(HeaderFrame(Header(PUSH_PULL, kDense, 0, {{4, 2}})),
                       KeysFrame({}), ValuesFrame({kInf, 1}));
       },
       kInvalid},
  };

  uint64_t errors = server_->stats().errors;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Response r = Send(c.frames());
    ASSERT_TRUE(r.received);
    EXPECT_EQ(r.code(), c.code) << r.header.message();
    EXPECT_FALSE(r.header.message().empty());
    EXPECT_EQ(r.header.num_values(), 0u);
    EXPECT_TRUE(r.values.empty());
    EXPECT_EQ(server_->stats().errors, ++errors);
    // The server still answers valid requests, and nothing was applied.
    EXPECT_EQ(Snapshot(), baseline);
  }
}

TEST_F(ServerTest, PullLargerThanTheMessageLimitIsRefusedBeforeAllocating) {
  // 4097 rows of 65536 floats is 1 GiB + 256 KiB of response, just over
  // kMaxMessageBytes (1 GiB). Serving it would allocate over 2 GiB (rows
  // plus response), which the resident-set check below would see.
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 4097; ++k) keys.push_back(k);
  const int64_t rss_before = ResidentBytes();
  ASSERT_GT(rss_before, 0);
  Response r = Pull(kHuge, keys);
  EXPECT_EQ(r.code(), absl::StatusCode::kResourceExhausted)
      << r.header.message();
  EXPECT_FALSE(r.header.message().empty());
  EXPECT_TRUE(r.values.empty());
  EXPECT_LT(ResidentBytes() - rss_before, int64_t{64} << 20);
  EXPECT_EQ(server_->stats().errors, 1u);
  EXPECT_EQ(server_->stats().keys_pulled, 0u);

  // The same for a dense pull: five whole blocks of 2^26 floats are
  // 1.25 GiB.
  SegmentList segs;
  for (uint64_t b = 0; b < 5; ++b) segs.push_back({b << 26, 1ULL << 26});
  r = SendValid(Header(PULL, kHugeDense, 0, segs), Frames(KeysFrame({})));
  EXPECT_EQ(r.code(), absl::StatusCode::kResourceExhausted)
      << r.header.message();
  EXPECT_TRUE(r.values.empty());
  EXPECT_LT(ResidentBytes() - rss_before, int64_t{64} << 20);
  EXPECT_EQ(server_->stats().errors, 2u);
  EXPECT_EQ(server_->stats().keys_pulled, 0u);

  // Still serving.
  r = Push(kSparse, {5}, {2, 4}, PUSH_PULL);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1, -2}));
}

// ---------------------------------------------------------------- stats

TEST_F(ServerTest, StatsCountRequestsErrorsAndKeys) {
  ASSERT_EQ(Push(kSparse, {1, 2}, {1, 1, 1, 1}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(Pull(kSparse, {1, 2, 3}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(Push(kSparse, {4}, {1, 1}, PUSH_PULL).code(),
            absl::StatusCode::kOk);
  // Dense requests count elements.
  ASSERT_EQ(DensePush({{0, 2}, {4, 3}}, {1, 1, 1, 1, 1}).code(),
            absl::StatusCode::kOk);
  ASSERT_EQ(DensePull({{8, 2}}).code(), absl::StatusCode::kOk);
  // Rejected requests count as requests and errors, never as keys.
  ASSERT_EQ(Push(kSparse, {1, 2}, {1, kNaN, 1, 1}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(Pull(9, {1}).code(), absl::StatusCode::kNotFound);

  const KVServer::Stats s = server_->stats();
  EXPECT_EQ(s.requests, 7u);
  EXPECT_EQ(s.errors, 2u);
  EXPECT_EQ(s.keys_pushed, 2u + 1u + 5u);
  EXPECT_EQ(s.keys_pulled, 3u + 1u + 2u);
}

TEST_F(ServerTest, StandaloneServerIgnoresViews) {
  // A view in which this server owns no slot at all.
  ClusterView view;
  view.set_epoch(5);
  view.set_job_state(RUNNING);
  view.set_num_slots(16);
  for (int s = 0; s < 16; ++s) view.add_slot_owner(1);
  server_->UpdateView(view, 0);
  Response r = Push(kSparse, {1, 2, 3}, {2, 2, 2, 2, 2, 2}, PUSH_PULL);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, std::vector<float>(6, -1.0f));
  EXPECT_EQ(r.header.epoch(), 0u);
}

TEST_F(ServerTest, StartReportsBadConfigAndBusyEndpoint) {
  auto config = ParseJobConfig(kConfig, "server_test");
  ASSERT_TRUE(config.ok()) << config.status();

  // The endpoint the fixture's server holds cannot be bound twice.
  KVServer::Options busy;
  busy.config = *config;
  busy.bind_endpoint = server_->endpoint();
  busy.standalone = true;
  auto second = KVServer::Start(std::move(busy));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);

  // Start gets configs from code too; a table that is neither sparse nor
  // dense is refused, not served.
  KVServer::Options bad;
  bad.config = *config;
  bad.config.mutable_tables(1)->clear_dense();
  bad.standalone = true;
  auto third = KVServer::Start(std::move(bad));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kInvalidArgument);

  // The first server is unaffected.
  Response r = Push(kSparse, {3}, {2, 2}, PUSH_PULL);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1, -1}));
}

// ------------------------------------------------------- slot ownership

class NonStandaloneServerTest : public ServerTest {
 protected:
  void SetUp() override { StartServer(/*standalone=*/false); }

  // Rank 0 of 2 servers; slot s belongs to server s % 2.
  static ClusterView TwoServerView(JobState state) {
    ClusterView view;
    view.set_epoch(3);
    view.set_job_state(state);
    view.set_num_slots(16);
    // Filled in for STARTING too: the server must wait for RUNNING even if
    // a tentative slot map is present.
    for (uint32_t s = 0; s < 16; ++s) view.add_slot_owner(s % 2);
    return view;
  }

  // Waits until the server answers a pull of a key it will own with
  // `epoch` and, for a RUNNING view, serves it. A new view takes effect
  // within one poll period (server.h): a request that arrives while the
  // server is still draining earlier ones is answered with the old view.
  // Pulls change no parameter, so the retries do not disturb the tests.
  void AwaitView(uint64_t epoch, bool running) {
    const uint64_t key = KeyOwnedBy(0);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline) {
      Response r = Pull(kSparse, {key});
      if (r.header.epoch() == epoch &&
          (r.code() == absl::StatusCode::kOk) == running) {
        return;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    ADD_FAILURE() << "the server never answered with view epoch " << epoch;
  }

  // The first key >= `from` whose slot belongs to server `rank`.
  static uint64_t KeyOwnedBy(uint32_t rank, uint64_t from = 0) {
    uint64_t k = from;
    while (SparseSlot(kSparse, k, 16) % 2 != rank) ++k;
    return k;
  }
};

TEST_F(NonStandaloneServerTest, UnavailableUntilRunningView) {
  // A key and a dense block (block 0) this server will own once it has a
  // view.
  const uint64_t mine = KeyOwnedBy(0);
  ASSERT_EQ(DenseBlockSlot(kDense, 0, 16) % 2, 0u);

  Response r = Pull(kSparse, {mine});
  EXPECT_EQ(r.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(r.header.message().empty());
  r = Push(kSparse, {mine}, {2, 2});
  EXPECT_EQ(r.code(), absl::StatusCode::kUnavailable);
  r = DensePush({{0, 1}}, {2});
  EXPECT_EQ(r.code(), absl::StatusCode::kUnavailable);

  // A STARTING view: still unavailable.
  server_->UpdateView(TwoServerView(STARTING), 0);
  AwaitView(3, /*running=*/false);
  r = Push(kSparse, {mine}, {2, 2});
  EXPECT_EQ(r.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r.header.epoch(), 3u);

  server_->UpdateView(TwoServerView(RUNNING), 0);
  AwaitView(3, /*running=*/true);
  r = Pull(kSparse, {mine});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  // The pushes refused above were not applied: zero init.
  EXPECT_EQ(r.values, (std::vector<float>{0, 0}));
  EXPECT_EQ(r.header.epoch(), 3u);
  r = DensePull({{0, 1}});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{0}));
}

TEST_F(NonStandaloneServerTest, KeysOfOtherServersAreRefused) {
  server_->UpdateView(TwoServerView(RUNNING), 0);
  AwaitView(3, /*running=*/true);
  const uint64_t mine = KeyOwnedBy(0);
  const uint64_t mine2 = KeyOwnedBy(0, mine + 1);
  const uint64_t theirs = KeyOwnedBy(1);

  Response r = Pull(kSparse, {theirs});
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(r.header.message().empty());
  EXPECT_EQ(r.header.epoch(), 3u);

  r = Push(kSparse, {mine, mine2}, {1, 2, 3, 4}, PUSH_PULL);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-0.5, -1, -1.5, -2}));

  // One foreign key fails the whole push: the owned key is not updated.
  r = Push(kSparse, {mine, theirs}, {8, 8, 8, 8});
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  r = Pull(kSparse, {mine});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-0.5, -1}));

  // Dense blocks are routed by DenseBlockSlot; with this slot map block 2
  // belongs to server 1 and blocks 0 and 1 to this server.
  ASSERT_EQ(DenseBlockSlot(kDense, 0, 16) % 2, 0u);
  ASSERT_EQ(DenseBlockSlot(kDense, 1, 16) % 2, 0u);
  ASSERT_EQ(DenseBlockSlot(kDense, 2, 16) % 2, 1u);
  r = DensePush({{0, 2}, {5, 1}}, {2, 4, 6}, PUSH_PULL);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1, -2, -3}));
  r = DensePush({{0, 1}, {8, 1}}, {2, 2});
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  r = DensePull({{8, 2}});
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  r = DensePull({{0, 2}});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1, -2}));
}

// ------------------------------------- sparse table features over the wire

// Tables listed out of id order, so STATS order is by id, not by config.
// "capped": 16 KiB rows under a 1 MiB budget without eviction (63 rows).
// "ttl_steps" and "ttl_seconds": TTLs. "stale" and "plain": SGD with and
// without staleness-aware scaling. "warm": a dense table with a 4-step
// warm-up. All SGD with lr 0.5.
constexpr char kFeatureConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 1 num_slots: 16 }
  tables {
    id: 7
    name: "capped"
    sparse { dim: 4096 memory_budget_bytes: 1048576 eviction: EVICT_NONE }
    optimizer { sgd { learning_rate: 0.5 } }
    init { kind: CONSTANT value: 1 }
  }
  tables {
    id: 2
    name: "ttl_steps"
    sparse { dim: 2 ttl_steps: 2 }
    optimizer { sgd { learning_rate: 0.5 } }
    init { kind: UNIFORM scale: 1 seed: 5 }
  }
  tables {
    id: 4
    name: "ttl_seconds"
    sparse { dim: 2 ttl_seconds: 10 }
    optimizer { sgd { learning_rate: 0.5 } }
    init { kind: UNIFORM scale: 1 seed: 5 }
  }
  tables {
    id: 0
    name: "stale"
    sparse { dim: 1 }
    optimizer { sgd { learning_rate: 0.5 } staleness_aware: true }
  }
  tables {
    id: 1
    name: "plain"
    sparse { dim: 1 }
    optimizer { sgd { learning_rate: 0.5 } }
  }
  tables {
    id: 3
    name: "warm"
    dense { size: 4 block_size: 4 }
    optimizer { sgd { learning_rate: 0.5 } schedule { warmup_steps: 4 } }
  }
)pb";

constexpr uint32_t kStale = 0;
constexpr uint32_t kPlain = 1;
constexpr uint32_t kTtlSteps = 2;
constexpr uint32_t kWarm = 3;
constexpr uint32_t kTtlSeconds = 4;
constexpr uint32_t kCapped = 7;

class SparseFeaturesServerTest : public ServerTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/true, kFeatureConfig, &clock_));
  }

  Response Stats() {
    return SendValid(Header(STATS, 0, 0), Frames(KeysFrame({})));
  }

  // Statistics of one table from a STATS request.
  TableStats StatsOf(uint32_t table) {
    Response r = Stats();
    EXPECT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    for (const TableStats& s : r.header.table_stats()) {
      if (s.table_id() == table) return s;
    }
    ADD_FAILURE() << "no statistics for table " << table;
    return TableStats();
  }

  // Polls STATS until `done` holds for the table: the serving loop applies
  // TTLs after the requests it drained, once per poll period (50 ms).
  bool WaitForStats(uint32_t table,
                    const std::function<bool(const TableStats&)>& done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline) {
      if (done(StatsOf(table))) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  // Worker node 1 finished `clock` steps.
  Response AdvanceClock(uint64_t clock) {
    RequestHeader h = Header(ADVANCE_CLOCK, 0, 0);
    h.set_clock(clock);
    h.set_sender_node_id(1);
    return SendValid(h, Frames(KeysFrame({})));
  }

  Response PushAt(uint64_t clock, uint32_t table, const std::vector<uint64_t>& keys,
                  const std::vector<float>& grads, const SegmentList& segs = {}) {
    RequestHeader h = Header(PUSH, table, keys.size(), segs);
    h.set_clock(clock);
    h.set_sender_node_id(1);
    return SendValid(h, Frames(KeysFrame(keys), ValuesFrame(grads)));
  }

  static std::vector<float> Initial(uint32_t table, const std::vector<uint64_t>& keys) {
    auto config = ParseJobConfig(kFeatureConfig, "server_test");
    EXPECT_TRUE(config.ok());
    const TableConfig* tc = nullptr;
    for (const TableConfig& t : config->tables()) {
      if (t.id() == table) tc = &t;
    }
    std::vector<float> v(keys.size() * tc->sparse().dim());
    for (size_t i = 0; i < keys.size(); ++i) {
      InitializeValues(tc->init(), table, keys[i], 0, tc->sparse().dim(),
                       &v[i * tc->sparse().dim()]);
    }
    return v;
  }

  FakeClock clock_;
};

TEST_F(SparseFeaturesServerTest, StatsOpAnswersEveryTableInIdOrder) {
  ASSERT_EQ(Push(kPlain, {1, 2}, {2, 2}).code(), absl::StatusCode::kOk);
  Response r = Pull(kPlain, {1, 2, 3});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1, -1, 0}));
  ASSERT_EQ(PushAt(0, kWarm, {}, {8, 8}, {{1, 2}}).code(), absl::StatusCode::kOk);

  r = Stats();
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.header.num_values(), 0u);
  EXPECT_TRUE(r.values.empty());
  const auto& stats = r.header.table_stats();
  ASSERT_EQ(stats.size(), 6);
  const std::vector<std::pair<uint32_t, std::string>> want = {
      {0, "stale"}, {1, "plain"}, {2, "ttl_steps"},
      {3, "warm"},  {4, "ttl_seconds"}, {7, "capped"}};
  for (int i = 0; i < stats.size(); ++i) {
    EXPECT_EQ(stats[i].table_id(), want[i].first);
    EXPECT_EQ(stats[i].name(), want[i].second);
    EXPECT_EQ(stats[i].sparse(), want[i].first != kWarm);
  }
  const TableStats& plain = stats[1];
  EXPECT_EQ(plain.keys_pushed(), 2u);
  EXPECT_EQ(plain.keys_pulled(), 3u);
  EXPECT_EQ(plain.rows(), 2u);  // the pull of key 3 created nothing
  EXPECT_EQ(plain.admissions(), 2u);
  EXPECT_GT(plain.bytes(), 0u);
  EXPECT_EQ(plain.memory_budget_bytes(), 0u);
  const TableStats& warm = stats[3];
  EXPECT_EQ(warm.keys_pushed(), 2u);
  EXPECT_EQ(warm.keys_pulled(), 0u);
  EXPECT_EQ(warm.rows(), 4u);  // the one block of 4 elements
  EXPECT_EQ(warm.bytes(), 4 * sizeof(float));
  const TableStats& capped = stats[5];
  EXPECT_EQ(capped.memory_budget_bytes(), 1048576u);
  EXPECT_LE(capped.bytes(), 1048576u);
  for (const TableStats& s : {stats[0], stats[2], stats[4], stats[5]}) {
    SCOPED_TRACE(s.name());
    EXPECT_EQ(s.rows(), 0u);
    EXPECT_EQ(s.keys_pushed(), 0u);
    EXPECT_EQ(s.keys_pulled(), 0u);
  }

  // STATS carries no keys.
  r = SendValid(Header(STATS, 0, 1), Frames(KeysFrame({5})));
  EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(r.header.table_stats().empty());

  // Once stopped, the server's published statistics are the final ones.
  r = Stats();
  ASSERT_EQ(r.code(), absl::StatusCode::kOk);
  server_->Stop();
  const std::vector<TableStats> published = server_->table_stats();
  ASSERT_EQ(published.size(), 6u);
  for (size_t i = 0; i < published.size(); ++i) {
    EXPECT_EQ(published[i].SerializeAsString(),
              r.header.table_stats(static_cast<int>(i)).SerializeAsString())
        << published[i].ShortDebugString();
  }
}

TEST_F(SparseFeaturesServerTest, PushOverTheBudgetIsRefusedAndChangesNothing) {
  // The same table built here tells how many rows the budget holds.
  auto config = ParseJobConfig(kFeatureConfig, "server_test");
  ASSERT_TRUE(config.ok());
  auto tc = FindTable(*config, "capped");
  ASSERT_TRUE(tc.ok());
  auto probe = Table::Create(**tc);
  ASSERT_TRUE(probe.ok()) << probe.status();
  const size_t m = (*probe)->AsSparse()->max_rows();
  ASSERT_GT(m, 4u);
  constexpr size_t kDim = 4096;

  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k + 2 < m; ++k) keys.push_back(k);
  Response r = Push(kCapped, keys, std::vector<float>(keys.size() * kDim, 1.0f));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  TableStats before = StatsOf(kCapped);
  EXPECT_EQ(before.rows(), m - 2);
  EXPECT_EQ(before.keys_pushed(), m - 2);
  EXPECT_LE(before.bytes(), 1048576u);

  // Three new rows do not fit in the two left.
  const uint64_t errors = server_->stats().errors;
  r = Push(kCapped, {0, 100, 101, 102}, std::vector<float>(4 * kDim, 2.0f));
  EXPECT_EQ(r.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(r.header.message().find("'capped'"), std::string::npos)
      << r.header.message();
  EXPECT_NE(r.header.message().find("1048576"), std::string::npos)
      << r.header.message();
  EXPECT_EQ(server_->stats().errors, errors + 1);
  TableStats after = StatsOf(kCapped);
  EXPECT_EQ(after.rows(), m - 2);
  EXPECT_EQ(after.keys_pushed(), m - 2);
  EXPECT_EQ(after.admissions(), m - 2);
  EXPECT_EQ(after.bytes(), before.bytes());
  EXPECT_EQ(after.pushes_refused(), 1u);
  // Key 0 was not updated (w = 1 - 0.5), key 100 has no row.
  r = Pull(kCapped, {0, 100});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  std::vector<float> want(kDim, 0.5f);
  want.resize(2 * kDim, 1.0f);
  EXPECT_EQ(r.values, want);

  // A push-pull is refused the same way, with no values.
  r = Push(kCapped, {100, 101, 102}, std::vector<float>(3 * kDim, 2.0f), PUSH_PULL);
  EXPECT_EQ(r.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(r.values.empty());
  EXPECT_EQ(StatsOf(kCapped).pushes_refused(), 2u);

  // What fits is served: two new rows and a known key.
  r = Push(kCapped, {0, 100, 101}, std::vector<float>(3 * kDim, 2.0f), PUSH_PULL);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  want.assign(kDim, -0.5f);
  want.resize(3 * kDim, 0.0f);
  EXPECT_EQ(r.values, want);
  after = StatsOf(kCapped);
  EXPECT_EQ(after.rows(), m);
  EXPECT_EQ(after.pushes_refused(), 2u);
  EXPECT_LE(after.bytes(), 1048576u);
  // Full now: one more new key is refused, known keys are not.
  EXPECT_EQ(Push(kCapped, {102}, std::vector<float>(kDim, 1.0f)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Push(kCapped, {1}, std::vector<float>(kDim, 1.0f)).code(),
            absl::StatusCode::kOk);
  EXPECT_EQ(StatsOf(kCapped).pushes_refused(), 3u);
  // Other tables are unaffected.
  EXPECT_EQ(Push(kPlain, {5}, {2}, PUSH_PULL).values, (std::vector<float>{-1}));
}

TEST_F(SparseFeaturesServerTest, TtlInStepsFollowsTheWorkersClocks) {
  const std::vector<float> g = {1, 1, 1, 1};
  ASSERT_EQ(PushAt(0, kTtlSteps, {5, 6}, g).code(), absl::StatusCode::kOk);
  EXPECT_EQ(StatsOf(kTtlSteps).rows(), 2u);
  // Clock 2: 2 - 0 is not more than ttl_steps 2.
  ASSERT_EQ(AdvanceClock(2).code(), absl::StatusCode::kOk);
  absl::SleepFor(absl::Milliseconds(200));  // several serving-loop passes
  TableStats s = StatsOf(kTtlSteps);
  EXPECT_EQ(s.rows(), 2u);
  EXPECT_EQ(s.evictions_ttl(), 0u);
  // A pull refreshes key 6 at step 2.
  ASSERT_EQ(Pull(kTtlSteps, {6}).code(), absl::StatusCode::kOk);

  ASSERT_EQ(AdvanceClock(3).code(), absl::StatusCode::kOk);
  EXPECT_TRUE(WaitForStats(kTtlSteps, [](const TableStats& t) { return t.rows() == 1; }));
  s = StatsOf(kTtlSteps);
  EXPECT_EQ(s.rows(), 1u);
  EXPECT_EQ(s.evictions_ttl(), 1u);
  Response r = Pull(kTtlSteps, {5, 6});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk);
  std::vector<float> want = Initial(kTtlSteps, {5, 6});
  want[2] -= 0.5f;
  want[3] -= 0.5f;
  EXPECT_EQ(r.values, want);

  // Key 6 was pulled again at step 3 just above; 6 - 3 > 2.
  ASSERT_EQ(AdvanceClock(6).code(), absl::StatusCode::kOk);
  EXPECT_TRUE(WaitForStats(kTtlSteps, [](const TableStats& t) { return t.rows() == 0; }));
  EXPECT_EQ(StatsOf(kTtlSteps).evictions_ttl(), 2u);
  r = Pull(kTtlSteps, {5, 6});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk);
  EXPECT_EQ(r.values, Initial(kTtlSteps, {5, 6}));
  // Seconds do not matter for this table, steps do not for the other.
  EXPECT_EQ(StatsOf(kTtlSeconds).evictions_ttl(), 0u);
}

TEST_F(SparseFeaturesServerTest, TtlInSecondsUsesTheInjectedClock) {
  // Let the serving loop take its first time reading (the TTL's origin)
  // before the fake clock moves.
  ASSERT_EQ(Stats().code(), absl::StatusCode::kOk);
  absl::SleepFor(absl::Milliseconds(150));
  const std::vector<float> g = {2, 2};
  ASSERT_EQ(Push(kTtlSeconds, {9}, g).code(), absl::StatusCode::kOk);
  EXPECT_EQ(StatsOf(kTtlSeconds).rows(), 1u);

  clock_.Advance(absl::Seconds(10));  // 10 s is not more than 10
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(StatsOf(kTtlSeconds).rows(), 1u);
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(
      WaitForStats(kTtlSeconds, [](const TableStats& t) { return t.rows() == 0; }));
  EXPECT_EQ(StatsOf(kTtlSeconds).evictions_ttl(), 1u);
  Response r = Pull(kTtlSeconds, {9});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk);
  EXPECT_EQ(r.values, Initial(kTtlSeconds, {9}));
  // A new push re-creates the row from its initial value.
  r = Push(kTtlSeconds, {9}, g, PUSH_PULL);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk);
  std::vector<float> want = Initial(kTtlSeconds, {9});
  for (float& w : want) w -= 1.0f;
  EXPECT_EQ(r.values, want);
}

TEST_F(SparseFeaturesServerTest, StalenessAwareSgdAndWarmUp) {
  // A request at clock 5 sets the server's clock.
  ASSERT_EQ(AdvanceClock(5).code(), absl::StatusCode::kOk);
  // A push of step 2 is 3 steps stale: lr / (1 + 3) on the staleness-aware
  // table, the full lr on the other.
  ASSERT_EQ(PushAt(2, kStale, {1}, {8}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(PushAt(2, kPlain, {1}, {8}).code(), absl::StatusCode::kOk);
  EXPECT_EQ(Pull(kStale, {1}).values, (std::vector<float>{-0.5f * 0.25f * 8}));
  EXPECT_EQ(Pull(kPlain, {1}).values, (std::vector<float>{-0.5f * 8}));
  // Not stale: full lr.
  ASSERT_EQ(PushAt(5, kStale, {2}, {8}).code(), absl::StatusCode::kOk);
  EXPECT_EQ(Pull(kStale, {2}).values, (std::vector<float>{-4}));
  // A push from ahead moves the server's clock first, so it is not stale;
  // the next push of step 5 is then 4 behind.
  ASSERT_EQ(PushAt(9, kStale, {3}, {8}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(PushAt(5, kStale, {3}, {8}).code(), absl::StatusCode::kOk);
  const float lr_over_5 = 0.5f * static_cast<float>(1.0 / 5);
  EXPECT_EQ(Pull(kStale, {3}).values, (std::vector<float>{-4 - lr_over_5 * 8}));

  // Warm-up over 4 steps: step t runs at (t + 1) / 4 of the lr, whatever
  // the server's clock (this table is not staleness-aware).
  ASSERT_EQ(PushAt(0, kWarm, {}, {8}, {{0, 1}}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(PushAt(1, kWarm, {}, {8}, {{1, 1}}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(PushAt(3, kWarm, {}, {8}, {{2, 1}}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(PushAt(4, kWarm, {}, {8}, {{3, 1}}).code(), absl::StatusCode::kOk);
  Response r = SendValid(Header(PULL, kWarm, 0, {{0, 4}}), Frames(KeysFrame({})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1, -2, -4, -4}));
}

// ------------------------------------------------------ linear scaling

// Four workers, ASYNC (so a push is applied at once). Tables 0 and 1: the
// same SGD (lr 0.5) with and without scale_with_workers, sparse and dense
// alike. Table 2: scaled with a 2-step warm-up.
constexpr char kScalingConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 4 num_slots: 16 }
  tables {
    id: 0
    name: "plain"
    sparse { dim: 1 }
    optimizer { sgd { learning_rate: 0.5 } }
  }
  tables {
    id: 1
    name: "scaled"
    sparse { dim: 1 }
    optimizer { sgd { learning_rate: 0.5 } scale_with_workers: true }
  }
  tables {
    id: 2
    name: "scaled_warm"
    dense { size: 3 block_size: 4 }
    optimizer {
      sgd { learning_rate: 0.5 }
      scale_with_workers: true
      schedule { warmup_steps: 2 }
    }
  }
)pb";

class ScalingServerTest : public SparseFeaturesServerTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(
        StartServer(/*standalone=*/true, kScalingConfig, &clock_));
  }
};

TEST_F(ScalingServerTest, ScaleWithWorkersMultipliesTheStepByNumWorkers) {
  // The same push moves the scaled weight 4 times as far: -0.5 * 8 and
  // -4 * 0.5 * 8.
  ASSERT_EQ(PushAt(7, 0, {1}, {8}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(PushAt(7, 1, {1}, {8}).code(), absl::StatusCode::kOk);
  const std::vector<float> plain = Pull(0, {1}).values;
  const std::vector<float> scaled = Pull(1, {1}).values;
  ASSERT_EQ(plain.size(), 1u);
  ASSERT_EQ(scaled.size(), 1u);
  EXPECT_EQ(plain[0], -4.0f);
  EXPECT_EQ(scaled[0], 4 * plain[0]);

  // With a 2-step warm-up the server ramps from 1x at step -1 to 4x:
  // step 0 runs at 2.5x, step 1 and later at 4x, so with gradient 8 and
  // lr 0.5 the elements move by -10, -16, -16.
  const uint32_t kScaledWarm = 2;
  ASSERT_EQ(PushAt(0, kScaledWarm, {}, {8}, {{0, 1}}).code(),
            absl::StatusCode::kOk);
  ASSERT_EQ(PushAt(1, kScaledWarm, {}, {8}, {{1, 1}}).code(),
            absl::StatusCode::kOk);
  ASSERT_EQ(PushAt(9, kScaledWarm, {}, {8}, {{2, 1}}).code(),
            absl::StatusCode::kOk);
  Response r =
      SendValid(Header(PULL, kScaledWarm, 0, {{0, 3}}), Frames(KeysFrame({})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-10, -16, -16}));
}

// ---------------------------------------------------- key-list caching

// A request of worker node `node` naming key-list slot `slot` with `digest`
// (RequestHeader.key_list_slot and key_list_digest).
RequestHeader ListHeader(Op op, uint32_t table, uint64_t num_keys, uint32_t slot,
                         uint64_t digest, uint64_t node = 1) {
  RequestHeader h = Header(op, table, num_keys);
  h.set_key_list_slot(slot);
  h.set_key_list_digest(digest);
  h.set_sender_node_id(node);
  return h;
}

uint64_t DigestOf(const std::vector<uint64_t>& keys) { return KeyListDigest(keys); }

// `values` in a 2-byte encoding, as a values frame.
zmq::message_t HalfFrame(ValueEncoding encoding, const std::vector<float>& values) {
  std::string bytes(values.size() * 2, '\0');
  EncodeValues(encoding, values.data(), values.size(), bytes.data());
  return BytesFrame(bytes);
}

// What `values` become after a trip through `encoding`.
std::vector<float> RoundTrip(ValueEncoding encoding, const std::vector<float>& values) {
  std::string bytes(values.size() * EncodedValueBytes(encoding), '\0');
  EncodeValues(encoding, values.data(), values.size(), bytes.data());
  std::vector<float> out(values.size());
  DecodeValues(encoding, bytes.data(), out.size(), out.data());
  return out;
}

std::vector<float> Scaled(float factor, const std::vector<float>& values) {
  std::vector<float> out;
  for (float v : values) out.push_back(factor * v);
  return out;
}

TEST_F(ServerTest, KeyListStoredByAPullServesLaterRequestsWithoutKeys) {
  const std::vector<uint64_t> keys = {42, 7, 99};
  const uint64_t digest = DigestOf(keys);
  Response r = SendValid(ListHeader(PULL, kSparse, 3, 5, digest), Frames(KeysFrame(keys)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, std::vector<float>(6, 0.0f));
  EXPECT_FALSE(r.header.key_list_unknown());

  // A push with an empty keys frame (num_keys set) applies to exactly the
  // stored keys, in their stored order; key 5 is untouched.
  r = SendValid(ListHeader(PUSH, kSparse, 3, 5, digest),
                Frames(KeysFrame({}), ValuesFrame({1, 2, 3, 4, 5, 6})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = Pull(kSparse, {7, 42, 99, 5});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1.5, -2, -0.5, -1, -2.5, -3, 0, 0}));

  // PUSH_PULL and PULL through the list answer in the list's order.
  r = SendValid(ListHeader(PUSH_PULL, kSparse, 3, 5, digest),
                Frames(KeysFrame({}), ValuesFrame({2, 2, 2, 2, 2, 2})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1.5, -2, -2.5, -3, -3.5, -4}));
  r = SendValid(ListHeader(PULL, kSparse, 3, 5, digest), Frames(KeysFrame({})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1.5, -2, -2.5, -3, -3.5, -4}));
  // Keys taken from the cache count like keys sent.
  EXPECT_EQ(server_->stats().keys_pushed, 6u);
  EXPECT_EQ(server_->stats().keys_pulled, 3u + 4u + 3u + 3u);
  EXPECT_EQ(server_->stats().errors, 0u);

  // Slots belong to their sender: node 2's slot 5 holds nothing.
  r = SendValid(ListHeader(PULL, kSparse, 3, 5, digest, /*node=*/2), Frames(KeysFrame({})));
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(r.header.key_list_unknown());

  // A push stores its list too, here in the last slot, for node 2; node
  // 1's slot 5 is unaffected.
  const std::vector<uint64_t> other = {1000, 1001};
  r = SendValid(ListHeader(PUSH, kSparse, 2, kKeyListSlots, DigestOf(other), 2),
                Frames(KeysFrame(other), ValuesFrame({1, 1, 1, 1})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = SendValid(ListHeader(PUSH_PULL, kSparse, 2, kKeyListSlots, DigestOf(other), 2),
                Frames(KeysFrame({}), ValuesFrame({1, 1, 1, 1})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, std::vector<float>(4, -1.0f));
  r = SendValid(ListHeader(PULL, kSparse, 3, 5, digest), Frames(KeysFrame({})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1.5, -2, -2.5, -3, -3.5, -4}));

  // Storing another list in a slot replaces the old one.
  const std::vector<uint64_t> third = {7};
  r = SendValid(ListHeader(PULL, kSparse, 1, 5, DigestOf(third)), Frames(KeysFrame(third)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = SendValid(ListHeader(PULL, kSparse, 3, 5, digest), Frames(KeysFrame({})));
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(r.header.key_list_unknown());
  r = SendValid(ListHeader(PULL, kSparse, 1, 5, DigestOf(third)), Frames(KeysFrame({})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-2.5, -3}));
}

TEST_F(ServerTest, UnknownKeyListIsRefusedAsKeyListUnknownAndChangesNothing) {
  ASSERT_EQ(Push(kSparse, {7, 42}, {1, 2, 3, 4}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(DensePush({{0, 4}, {4, 4}, {8, 2}}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}).code(),
            absl::StatusCode::kOk);
  const std::vector<float> baseline = Snapshot();
  const std::vector<uint64_t> keys = {7, 42};
  const uint64_t digest = DigestOf(keys);
  Response r = SendValid(ListHeader(PULL, kSparse, 2, 3, digest), Frames(KeysFrame(keys)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();

  struct Case {
    const char* name;
    RequestHeader header;
    std::vector<float> values;  // empty: no values frame (a PULL)
  };
  const std::vector<float> two_keys = {8, 8, 8, 8};
  const Case cases[] = {
      {"slot never stored", ListHeader(PUSH, kSparse, 2, 4, digest), two_keys},
      {"slot of another sender", ListHeader(PUSH, kSparse, 2, 3, digest, 2), two_keys},
      {"digest of another list", ListHeader(PUSH, kSparse, 2, 3, DigestOf({7, 43})),
       two_keys},
      {"digest of the keys reordered", ListHeader(PUSH, kSparse, 2, 3, DigestOf({42, 7})),
       two_keys},
      {"digest 0", ListHeader(PUSH, kSparse, 2, 3, 0), two_keys},
      {"more keys than stored", ListHeader(PUSH, kSparse, 3, 3, digest),
       std::vector<float>(6, 8)},
      {"fewer keys than stored", ListHeader(PUSH, kSparse, 1, 3, digest), {8, 8}},
      {"push-pull", ListHeader(PUSH_PULL, kSparse, 2, 4, digest), two_keys},
      {"pull", ListHeader(PULL, kSparse, 2, 4, digest), {}},
      {"pull with a wrong count", ListHeader(PULL, kSparse, 1, 3, digest), {}},
      {"slot 64 never stored", ListHeader(PULL, kSparse, 2, kKeyListSlots, digest), {}},
  };
  uint64_t errors = server_->stats().errors;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<zmq::message_t> rest = Frames(KeysFrame({}));
    if (!c.values.empty()) rest.push_back(ValuesFrame(c.values));
    r = SendValid(c.header, std::move(rest));
    ASSERT_TRUE(r.received);
    EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition) << r.header.message();
    EXPECT_TRUE(r.header.key_list_unknown());
    EXPECT_FALSE(r.header.message().empty());
    EXPECT_TRUE(r.values.empty());
    EXPECT_EQ(server_->stats().errors, ++errors);
    EXPECT_EQ(Snapshot(), baseline);
  }
  // The failed look-ups left the stored list in place.
  r = SendValid(ListHeader(PUSH_PULL, kSparse, 2, 3, digest),
                Frames(KeysFrame({}), ValuesFrame({2, 2, 2, 2})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_FALSE(r.header.key_list_unknown());
  EXPECT_EQ(r.values, (std::vector<float>{-1.5, -2, -2.5, -3}));
}

TEST_F(ServerTest, KeyListStoresAndSlotsAreChecked) {
  ASSERT_EQ(Push(kSparse, {7, 42}, {1, 2, 3, 4}).code(), absl::StatusCode::kOk);
  const std::vector<float> baseline = Snapshot();
  const std::vector<uint64_t> keys = {7, 42};
  const uint64_t digest = DigestOf(keys);
  auto with_digest = [](RequestHeader h, uint64_t d) {
    h.set_key_list_digest(d);
    return h;
  };
  RequestHeader assign = Header(ASSIGN, kDense, 0, {{0, 2}});
  assign.set_key_list_slot(1);
  RequestHeader advance = Header(ADVANCE_CLOCK, 0, 0);
  advance.set_key_list_slot(1);
  advance.set_clock(1);
  RequestHeader stats = Header(STATS, 0, 0);
  stats.set_key_list_slot(1);
  struct Case {
    const char* name;
    std::function<std::vector<zmq::message_t>()> frames;
  };
  const Case cases[] = {
      {"store whose digest is another list's",
       [&] {
         return Frames(HeaderFrame(ListHeader(PUSH, kSparse, 2, 3, DigestOf({7, 43}))),
                       KeysFrame(keys), ValuesFrame({8, 8, 8, 8}));
       }},
      {"store whose digest is of the keys reordered",
       [&] {
         return Frames(HeaderFrame(ListHeader(PUSH_PULL, kSparse, 2, 3, DigestOf({42, 7}))),
                       KeysFrame(keys), ValuesFrame({8, 8, 8, 8}));
       }},
      {"pull storing with digest 0",
       [&] { return Frames(HeaderFrame(ListHeader(PULL, kSparse, 2, 3, 0)), KeysFrame(keys)); }},
      {"slot 0 with an empty keys frame",
       [&] {
         return Frames(HeaderFrame(with_digest(Header(PUSH, kSparse, 2), digest)),
                       KeysFrame({}), ValuesFrame({8, 8, 8, 8}));
       }},
      {"slot 0 pull with an empty keys frame",
       [&] {
         return Frames(HeaderFrame(with_digest(Header(PULL, kSparse, 2), digest)),
                       KeysFrame({}));
       }},
      {"slot 65 with keys",
       [&] {
         return Frames(HeaderFrame(ListHeader(PULL, kSparse, 2, kKeyListSlots + 1, digest)),
                       KeysFrame(keys));
       }},
      {"slot 65 without keys",
       [&] {
         return Frames(HeaderFrame(ListHeader(PUSH, kSparse, 2, kKeyListSlots + 1, digest)),
                       KeysFrame({}), ValuesFrame({8, 8, 8, 8}));
       }},
      {"slot 2^32 - 1",
       [&] {
         return Frames(HeaderFrame(ListHeader(PULL, kSparse, 2, 0xffffffffu, digest)),
                       KeysFrame(keys));
       }},
      {"slot on an ASSIGN",
       [&] { return Frames(HeaderFrame(assign), KeysFrame({}), ValuesFrame({8, 8})); }},
      {"slot on an ADVANCE_CLOCK",
       [&] { return Frames(HeaderFrame(advance), KeysFrame({})); }},
      {"slot on a STATS", [&] { return Frames(HeaderFrame(stats), KeysFrame({})); }},
  };
  uint64_t errors = server_->stats().errors;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Response r = Send(c.frames());
    ASSERT_TRUE(r.received);
    EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument) << r.header.message();
    EXPECT_FALSE(r.header.key_list_unknown());
    EXPECT_FALSE(r.header.message().empty());
    EXPECT_TRUE(r.values.empty());
    EXPECT_EQ(server_->stats().errors, ++errors);
    EXPECT_EQ(Snapshot(), baseline);
  }
  // The refused stores stored nothing in slot 3.
  for (uint64_t d : {digest, DigestOf({7, 43}), DigestOf({42, 7})}) {
    Response r = SendValid(ListHeader(PULL, kSparse, 2, 3, d), Frames(KeysFrame({})));
    EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(r.header.key_list_unknown());
  }
  // A refused store drops what the slot held (the sender's record of the
  // slot names the new list).
  Response r = SendValid(ListHeader(PULL, kSparse, 2, 6, digest), Frames(KeysFrame(keys)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = SendValid(ListHeader(PULL, kSparse, 2, 6, DigestOf({1, 2})), Frames(KeysFrame(keys)));
  EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument);
  r = SendValid(ListHeader(PULL, kSparse, 2, 6, digest), Frames(KeysFrame({})));
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(r.header.key_list_unknown());
  // Slots 1 and 64 are both usable.
  for (uint32_t slot : {1u, kKeyListSlots}) {
    SCOPED_TRACE(slot);
    r = SendValid(ListHeader(PULL, kSparse, 2, slot, digest), Frames(KeysFrame(keys)));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    r = SendValid(ListHeader(PULL, kSparse, 2, slot, digest), Frames(KeysFrame({})));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.values, (std::vector<float>{-0.5, -1, -1.5, -2}));
  }
}

// Two identical tables whose budget holds fewer rows than the keys pushed,
// so pushes evict (LRU): one used through cached key lists, whose rows the
// server remembers (server/row_memo.h), the other with keys in every
// request. Random initial values would differ between them (they depend on
// the table id); each row's gradients make its values its own.
constexpr char kMemoConfig[] = R"pb(
  cluster { num_servers: 1 num_workers: 1 num_slots: 16 }
  tables {
    id: 1
    name: "cached"
    sparse { dim: 128 memory_budget_bytes: 1048576 eviction: EVICT_LRU }
    optimizer { adagrad { learning_rate: 0.1 } }
    init { kind: CONSTANT value: 0.5 }
  }
  tables {
    id: 2
    name: "plain"
    sparse { dim: 128 memory_budget_bytes: 1048576 eviction: EVICT_LRU }
    optimizer { adagrad { learning_rate: 0.1 } }
    init { kind: CONSTANT value: 0.5 }
  }
)pb";

class RowMemoServerTest : public ServerTest {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(StartServer(true, kMemoConfig)); }
};

// Steps through cached lists (pull, then push of the same list, as a
// worker's step does; sometimes a second push or a PUSH_PULL) answer and
// evict exactly as the same steps with keys do, while other lists' pushes
// evict rows the cached lists' memos name.
TEST_F(RowMemoServerTest, CachedListsAnswerAsKeysDoWhileRowsAreEvicted) {
  constexpr size_t kLists = 4, kKeys = 600, kDim = 128;
  std::vector<std::vector<uint64_t>> lists(kLists, std::vector<uint64_t>(kKeys));
  uint64_t s = 11;
  for (auto& list : lists) {
    for (size_t i = 0; i < kKeys; ++i) {
      s = Mix64(s);
      list[i] = i % 9 == 8 ? list[i - 1] : s % 4000;
    }
  }
  std::vector<bool> stored(kLists, false);
  for (int round = 0; round < 24; ++round) {
    SCOPED_TRACE(round);
    const size_t l = (round * 3 + round / 5) % kLists;
    const uint32_t slot = static_cast<uint32_t>(l) + 1;
    const uint64_t digest = DigestOf(lists[l]);
    // The first use of a list stores it (keys sent); later ones name it.
    auto keys_or_none = [&] { return KeysFrame(stored[l] ? std::vector<uint64_t>{} : lists[l]); };
    Response cached = SendValid(ListHeader(PULL, 1, kKeys, slot, digest), Frames(keys_or_none()));
    stored[l] = true;
    Response plain = Pull(2, lists[l]);
    ASSERT_EQ(cached.code(), absl::StatusCode::kOk) << cached.header.message();
    ASSERT_EQ(plain.code(), absl::StatusCode::kOk) << plain.header.message();
    EXPECT_EQ(cached.values, plain.values);
    std::vector<float> grads(kKeys * kDim);
    for (size_t i = 0; i < grads.size(); ++i) {
      grads[i] = static_cast<float>(static_cast<int>((i * 7 + round) % 13) - 6) * 0.01f;
    }
    const Op op = round % 4 == 3 ? PUSH_PULL : PUSH;
    cached = SendValid(ListHeader(op, 1, kKeys, slot, digest),
                       Frames(KeysFrame({}), ValuesFrame(grads)));
    plain = Push(2, lists[l], grads, op);
    ASSERT_EQ(cached.code(), absl::StatusCode::kOk) << cached.header.message();
    ASSERT_EQ(plain.code(), absl::StatusCode::kOk) << plain.header.message();
    EXPECT_EQ(cached.values, plain.values);
  }
  // Both tables evicted, and the same rows.
  Response stats = SendValid(Header(STATS, 0, 0), Frames(KeysFrame({})));
  ASSERT_EQ(stats.code(), absl::StatusCode::kOk) << stats.header.message();
  std::map<uint32_t, TableStats> by_table;
  for (const TableStats& t : stats.header.table_stats()) by_table[t.table_id()] = t;
  ASSERT_EQ(by_table.size(), 2u);
  EXPECT_GT(by_table[1].evictions_budget(), 0u);
  EXPECT_EQ(by_table[1].evictions_budget(), by_table[2].evictions_budget());
  EXPECT_EQ(by_table[1].rows(), by_table[2].rows());
  std::vector<uint64_t> every(4000);
  for (uint64_t k = 0; k < every.size(); ++k) every[k] = k;
  EXPECT_EQ(Pull(1, every).values, Pull(2, every).values);
  EXPECT_EQ(server_->stats().errors, 0u);
}

TEST_F(ServerTest, KeyListStoresStayWithinTheSendersBudget) {
  // 32 bytes: four keys a sender.
  const std::string config = std::string(kConfig) + "data_plane { key_cache_bytes: 32 }";
  ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/true, config.c_str()));
  auto store = [&](uint32_t slot, const std::vector<uint64_t>& keys, uint64_t node = 1) {
    return SendValid(ListHeader(PUSH, kSparse, keys.size(), slot, DigestOf(keys), node),
                     Frames(KeysFrame(keys), ValuesFrame(std::vector<float>(2 * keys.size(), 2))));
  };
  auto cached = [&](uint32_t slot, const std::vector<uint64_t>& keys, uint64_t node = 1) {
    return SendValid(ListHeader(PULL, kSparse, keys.size(), slot, DigestOf(keys), node),
                     Frames(KeysFrame({})));
  };
  ASSERT_EQ(store(1, {1, 2, 3}).code(), absl::StatusCode::kOk);
  // 3 + 2 keys do not fit: refused, nothing applied.
  Response r = store(2, {4, 5});
  EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.header.message().find("key_cache_bytes"), std::string::npos)
      << r.header.message();
  EXPECT_EQ(Pull(kSparse, {4, 5}).values, std::vector<float>(4, 0.0f));
  ASSERT_EQ(store(2, {4}).code(), absl::StatusCode::kOk);
  // Another sender has a budget of its own.
  ASSERT_EQ(store(1, {11, 12, 13, 14}, 2).code(), absl::StatusCode::kOk);
  // Replacing a slot's list frees the old one first.
  ASSERT_EQ(store(1, {6, 7, 8}).code(), absl::StatusCode::kOk);
  EXPECT_EQ(store(3, {9, 10}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cached(1, {1, 2, 3}).code(), absl::StatusCode::kFailedPrecondition);
  r = cached(1, {6, 7, 8});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, std::vector<float>(6, -1.0f));
  r = cached(2, {4});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = cached(1, {11, 12, 13, 14}, 2);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, std::vector<float>(8, -1.0f));
  // A list larger than the whole budget is refused whatever it replaces.
  EXPECT_EQ(store(1, {21, 22, 23, 24, 25}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Pull(kSparse, {21, 25, 9}).values, std::vector<float>(6, 0.0f));

  // key_cache_bytes -1: every store is refused; requests without a slot
  // are served as usual.
  const std::string off = std::string(kConfig) + "data_plane { key_cache_bytes: -1 }";
  ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/true, off.c_str()));
  EXPECT_EQ(store(1, {1}).code(), absl::StatusCode::kInvalidArgument);
  r = cached(1, {1});
  EXPECT_EQ(r.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(r.header.key_list_unknown());
  EXPECT_EQ(Pull(kSparse, {1}).values, std::vector<float>(2, 0.0f));
  ASSERT_EQ(Push(kSparse, {1}, {2, 2}).code(), absl::StatusCode::kOk);
  EXPECT_EQ(Pull(kSparse, {1}).values, std::vector<float>(2, -1.0f));
}

// ------------------------------------------------------ half-width values

TEST_F(ServerTest, HalfWidthPushesAreAppliedAsTheirDecodedFloats) {
  // Not all representable in 16 bits, so the decoded values differ from
  // these; the server computes with what it decoded.
  const std::vector<float> grads = {1.5f, -2.2f, 0.3333f, 1000.7f};
  const std::vector<std::pair<ValueEncoding, std::vector<uint64_t>>> runs = {
      {FLOAT16, {100, 101}}, {BFLOAT16, {200, 201}}};
  for (const auto& [encoding, keys] : runs) {
    SCOPED_TRACE(ValueEncoding_Name(encoding));
    const std::vector<float> sent = RoundTrip(encoding, grads);
    ASSERT_NE(sent, grads);
    RequestHeader h = Header(PUSH, kSparse, keys.size());
    h.set_push_values(encoding);
    Response r = SendValid(h, Frames(KeysFrame(keys), HalfFrame(encoding, grads)));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    r = Pull(kSparse, keys);
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.values, Scaled(-0.5f, sent));
    // The same through a cached key list, as a PUSH_PULL answered in
    // float32.
    RequestHeader store = ListHeader(PULL, kSparse, keys.size(), 9, DigestOf(keys));
    ASSERT_EQ(SendValid(store, Frames(KeysFrame(keys))).code(), absl::StatusCode::kOk);
    h = ListHeader(PUSH_PULL, kSparse, keys.size(), 9, DigestOf(keys));
    h.set_push_values(encoding);
    r = SendValid(h, Frames(KeysFrame({}), HalfFrame(encoding, grads)));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.value_bytes.size(), 4 * grads.size());
    EXPECT_EQ(r.values, Scaled(-1.0f, sent));
  }

  // Dense, across two blocks; FLOAT16 saturates at 65504, which arrives
  // as a finite gradient.
  const std::vector<float> dense = {0.1f, 0.2f, 1e6f};
  RequestHeader h = Header(PUSH, kDense, 0, {{2, 2}, {4, 1}});
  h.set_push_values(FLOAT16);
  Response r = SendValid(h, Frames(KeysFrame({}), HalfFrame(FLOAT16, dense)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = DensePull({{2, 2}, {4, 1}});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  const std::vector<float> sent = RoundTrip(FLOAT16, dense);
  EXPECT_EQ(sent[2], 65504.0f);
  EXPECT_EQ(r.values, Scaled(-0.5f, sent));

  // A PUSH_PULL with FLOAT16 gradients answered in BFLOAT16.
  h = Header(PUSH_PULL, kSparse, 1);
  h.set_push_values(FLOAT16);
  h.set_pull_values(BFLOAT16);
  r = SendValid(h, Frames(KeysFrame({300}), HalfFrame(FLOAT16, {0.7f, -3.1f})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.header.values_encoding(), BFLOAT16);
  EXPECT_EQ(r.value_bytes.size(), 4u);
  const std::vector<float> w = Pull(kSparse, {300}).values;
  EXPECT_EQ(w, Scaled(-0.5f, RoundTrip(FLOAT16, {0.7f, -3.1f})));
  EXPECT_EQ(r.values, RoundTrip(BFLOAT16, w));
}

TEST_F(ServerTest, PullsAnswerInTheRequestedEncoding) {
  ASSERT_EQ(Push(kSparse, {7, 42}, {0.1f, -3.3f, 700.7f, 1e-3f}).code(), absl::StatusCode::kOk);
  // Beyond half's range: answered saturated in FLOAT16, finite.
  ASSERT_EQ(Push(kSparse, {9}, {-2e5f, 2e5f}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(DensePush({{0, 4}, {4, 4}, {8, 2}}, {1.1f, 2, 3, 4, 5, 6, 7, 8, 9, 10.3f}).code(),
            absl::StatusCode::kOk);
  const std::vector<float> sparse = Pull(kSparse, {7, 42, 9}).values;
  const std::vector<float> dense = DensePull({{0, 4}, {4, 4}, {8, 2}}).values;
  ASSERT_EQ(sparse.size(), 6u);
  ASSERT_EQ(dense.size(), 10u);
  for (ValueEncoding encoding : {FLOAT16, BFLOAT16}) {
    SCOPED_TRACE(ValueEncoding_Name(encoding));
    RequestHeader h = Header(PULL, kSparse, 3);
    h.set_pull_values(encoding);
    Response r = SendValid(h, Frames(KeysFrame({7, 42, 9})));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.header.values_encoding(), encoding);
    EXPECT_EQ(r.header.num_values(), 6u);
    std::string want(12, '\0');
    EncodeValues(encoding, sparse.data(), sparse.size(), want.data());
    EXPECT_EQ(r.value_bytes, want);
    EXPECT_EQ(r.values, RoundTrip(encoding, sparse));
    for (float v : r.values) EXPECT_TRUE(std::isfinite(v));

    h = Header(PULL, kDense, 0, {{0, 4}, {4, 4}, {8, 2}});
    h.set_pull_values(encoding);
    r = SendValid(h, Frames(KeysFrame({})));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.header.values_encoding(), encoding);
    EXPECT_EQ(r.value_bytes.size(), 20u);
    EXPECT_EQ(r.values, RoundTrip(encoding, dense));

    // Through a cached key list.
    const std::vector<uint64_t> keys = {7, 42, 9};
    ASSERT_EQ(SendValid(ListHeader(PULL, kSparse, 3, 2, DigestOf(keys)), Frames(KeysFrame(keys)))
                  .code(),
              absl::StatusCode::kOk);
    h = ListHeader(PULL, kSparse, 3, 2, DigestOf(keys));
    h.set_pull_values(encoding);
    r = SendValid(h, Frames(KeysFrame({})));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.value_bytes, want);
  }
  EXPECT_EQ(RoundTrip(FLOAT16, sparse)[4], 65504.0f);
  EXPECT_EQ(RoundTrip(FLOAT16, sparse)[5], -65504.0f);
  // FLOAT32 asked for explicitly: 4 bytes a value, bit for bit.
  RequestHeader h = Header(PULL, kSparse, 3);
  h.set_pull_values(FLOAT32);
  Response r = SendValid(h, Frames(KeysFrame({7, 42, 9})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.value_bytes.size(), 24u);
  EXPECT_EQ(r.values, sparse);
}

TEST_F(ServerTest, MalformedHalfWidthRequestsAreRejectedWithoutEffect) {
  ASSERT_EQ(Push(kSparse, {7, 42}, {1, 2, 3, 4}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(DensePush({{0, 4}, {4, 4}, {8, 2}}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}).code(),
            absl::StatusCode::kOk);
  const std::vector<float> baseline = Snapshot();
  auto push = [](Op op, uint32_t table, uint64_t num_keys, ValueEncoding encoding,
                 const SegmentList& segs = {}) {
    RequestHeader h = Header(op, table, num_keys, segs);
    h.set_push_values(encoding);
    return HeaderFrame(h);
  };
  auto half_bits = [](std::vector<uint16_t> bits) {
    return BytesFrame(std::string(reinterpret_cast<const char*>(bits.data()), bits.size() * 2));
  };
  RequestHeader bad_pull = Header(PULL, kSparse, 1);
  bad_pull.set_pull_values(static_cast<ValueEncoding>(9));
  struct Case {
    const char* name;
    std::function<std::vector<zmq::message_t>()> frames;
  };
  const Case cases[] = {
      {"FLOAT16 frame of odd length",
       [&] {
         return Frames(push(PUSH, kSparse, 1, FLOAT16), KeysFrame({7}),
                       BytesFrame(std::string(3, '\0')));
       }},
      {"BFLOAT16 frame of odd length",
       [&] {
         return Frames(push(PUSH_PULL, kSparse, 2, BFLOAT16), KeysFrame({7, 42}),
                       BytesFrame(std::string(7, '\0')));
       }},
      {"FLOAT16 dense frame of odd length",
       [&] {
         return Frames(push(PUSH, kDense, 0, FLOAT16, {{0, 2}}), KeysFrame({}),
                       BytesFrame(std::string(5, '\0')));
       }},
      {"float32 values labelled FLOAT16",
       [&] {
         return Frames(push(PUSH, kSparse, 1, FLOAT16), KeysFrame({7}), ValuesFrame({1, 1}));
       }},
      {"too few halves for dim",
       [&] {
         return Frames(push(PUSH, kSparse, 1, FLOAT16), KeysFrame({7}), HalfFrame(FLOAT16, {1}));
       }},
      {"ASSIGN with FLOAT16 values",
       [&] {
         return Frames(push(ASSIGN, kDense, 0, FLOAT16, {{0, 2}}), KeysFrame({}),
                       HalfFrame(FLOAT16, {1, 1}));
       }},
      {"ASSIGN with float32 values labelled FLOAT16",
       [&] {
         return Frames(push(ASSIGN, kDense, 0, FLOAT16, {{0, 2}}), KeysFrame({}),
                       ValuesFrame({1, 1}));
       }},
      {"ASSIGN with BFLOAT16 values",
       [&] {
         return Frames(push(ASSIGN, kDense, 0, BFLOAT16, {{0, 2}}), KeysFrame({}),
                       HalfFrame(BFLOAT16, {1, 1}));
       }},
      {"push_values out of the enum",
       [&] {
         return Frames(push(PUSH, kSparse, 1, static_cast<ValueEncoding>(9)), KeysFrame({7}),
                       ValuesFrame({1, 1}));
       }},
      {"pull_values out of the enum",
       [&] { return Frames(HeaderFrame(bad_pull), KeysFrame({7})); }},
      {"FLOAT16 infinity",
       [&] {
         return Frames(push(PUSH, kSparse, 2, FLOAT16), KeysFrame({7, 42}),
                       half_bits({0x3c00, 0x3c00, 0x3c00, 0x7c00}));
       }},
      {"FLOAT16 NaN in a dense push",
       [&] {
         return Frames(push(PUSH, kDense, 0, FLOAT16, {{0, 2}}), KeysFrame({}),
                       half_bits({0x7e00, 0x3c00}));
       }},
      {"BFLOAT16 -infinity",
       [&] {
         return Frames(push(PUSH, kSparse, 1, BFLOAT16), KeysFrame({42}),
                       half_bits({0x3f80, 0xff80}));
       }},
  };
  uint64_t errors = server_->stats().errors;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Response r = Send(c.frames());
    ASSERT_TRUE(r.received);
    EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument) << r.header.message();
    EXPECT_FALSE(r.header.message().empty());
    EXPECT_TRUE(r.values.empty());
    EXPECT_EQ(server_->stats().errors, ++errors);
    EXPECT_EQ(Snapshot(), baseline);
  }
}

// ------------------------------------ key lists of held (deferred) requests

// BSP with two workers (nodes 1 and 2) and key lists of 48 bytes (six keys)
// a sender; this server owns every slot.
class BspKeyListServerTest : public ServerTest {
 protected:
  void SetUp() override {
    const std::string config = std::string(kConfig) +
                               "consistency { mode: BSP }\n"
                               "data_plane { key_cache_bytes: 48 }\n";
    ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/false, config.c_str()));
    ASSERT_NO_FATAL_FAILURE(InstallBspView());
  }

  static RequestHeader At(RequestHeader h, uint64_t clock) {
    h.set_clock(clock);
    return h;
  }

  // Waits until `n` pulls have been deferred in all.
  void AwaitDeferred(uint64_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (server_->stats().pulls_deferred < n && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    ASSERT_EQ(server_->stats().pulls_deferred, n);
  }

  // The next `n` responses, by request id.
  std::map<uint64_t, Response> ReceiveAll(int n) {
    std::map<uint64_t, Response> replies;
    for (int i = 0; i < n; ++i) {
      Response r = Receive();
      if (!r.received) break;
      replies[r.header.request_id()] = r;
    }
    return replies;
  }
};

// Requests kept until BSP allows their pulls keep the keys they named
// (the server materializes a cached list when it defers), whatever the
// sender stores in those slots meanwhile.
TEST_F(BspKeyListServerTest, DeferredRequestsKeepTheirKeysWhenTheSlotChanges) {
  const std::vector<uint64_t> a = {7, 42}, b = {99}, c = {5, 6}, d = {8};
  // Node 1 stores A in slot 5 with a pull of step 0 (answered at once),
  // then pushes step 0's gradients through the cached list: buffered until
  // both workers finish step 0.
  Response r = SendValid(At(ListHeader(PULL, kSparse, 2, 5, DigestOf(a)), 0), Frames(KeysFrame(a)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = SendValid(At(ListHeader(PUSH, kSparse, 2, 5, DigestOf(a)), 0),
                Frames(KeysFrame({}), ValuesFrame({2, 4, 6, 8})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();

  // Two requests of step 1 wait for step 0 (node 2 has not finished it): a
  // pull through cached list A, answered in FLOAT16, and a PUSH_PULL with
  // FLOAT16 gradients storing C in slot 6 (its push is buffered for step 1).
  RequestHeader pull_a = At(ListHeader(PULL, kSparse, 2, 5, DigestOf(a)), 1);
  pull_a.set_pull_values(FLOAT16);
  const uint64_t pull_a_id = SendOnly(pull_a, Frames(KeysFrame({})));
  RequestHeader push_pull_c = At(ListHeader(PUSH_PULL, kSparse, 2, 6, DigestOf(c)), 1);
  push_pull_c.set_push_values(FLOAT16);
  const uint64_t push_pull_c_id =
      SendOnly(push_pull_c, Frames(KeysFrame(c), HalfFrame(FLOAT16, {1, 1, 1, 1})));
  ASSERT_NO_FATAL_FAILURE(AwaitDeferred(2));

  // Meanwhile node 1 puts other lists in both slots, with pulls of step 0
  // (answered at once).
  r = SendValid(At(ListHeader(PULL, kSparse, 1, 5, DigestOf(b)), 0), Frames(KeysFrame(b)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = SendValid(At(ListHeader(PULL, kSparse, 1, 6, DigestOf(d)), 0), Frames(KeysFrame(d)));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();

  // Node 2 finishes step 0: it is applied (the average of one push over two
  // workers) and both pulls are answered, each with its own keys.
  const uint64_t advance_id = Advance(2, 1);
  std::map<uint64_t, Response> replies = ReceiveAll(3);
  ASSERT_EQ(replies.count(advance_id), 1u);
  EXPECT_EQ(replies[advance_id].code(), absl::StatusCode::kOk);
  ASSERT_EQ(replies.count(pull_a_id), 1u);
  const Response& got_a = replies[pull_a_id];
  EXPECT_EQ(got_a.code(), absl::StatusCode::kOk) << got_a.header.message();
  EXPECT_FALSE(got_a.header.key_list_unknown());
  EXPECT_EQ(got_a.header.values_encoding(), FLOAT16);
  EXPECT_EQ(got_a.value_bytes.size(), 8u);
  EXPECT_EQ(got_a.values, (std::vector<float>{-0.5, -1, -1.5, -2}));
  ASSERT_EQ(replies.count(push_pull_c_id), 1u);
  const Response& got_c = replies[push_pull_c_id];
  EXPECT_EQ(got_c.code(), absl::StatusCode::kOk) << got_c.header.message();
  EXPECT_EQ(got_c.values, std::vector<float>(4, 0.0f));  // its step 1 is not applied yet

  // The slots hold what node 1 stored last.
  for (const auto& [slot, keys] :
       std::vector<std::pair<uint32_t, std::vector<uint64_t>>>{{5, b}, {6, d}}) {
    SCOPED_TRACE(slot);
    r = SendValid(At(ListHeader(PULL, kSparse, keys.size(), slot, DigestOf(keys)), 1),
                  Frames(KeysFrame({})));
    EXPECT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_EQ(r.values.size(), 2 * keys.size());
  }

  // Step 1, the PUSH_PULL's push on C (decoded FLOAT16 ones), is applied
  // once both workers finish it; a pull of step 2 waits for that.
  Advance(1, 2);
  Advance(2, 2);
  ReceiveAll(2);
  r = SendValid(At(Header(PULL, kSparse, 4), 2), Frames(KeysFrame({5, 6, 7, 42})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-0.25, -0.25, -0.25, -0.25, -0.5, -1, -1.5, -2}));
}

// A kept (deferred) request that carried its keys under a slot keeps them
// as its own (MakeSelfContained strips the slot): answering it later
// (Progress -> Process) does not store its list in that slot again, which
// would overwrite what the sender stored there since and could put the
// sender over key_cache_bytes. Held pushes (checkpoints) take the same path.
TEST_F(BspKeyListServerTest, AKeptRequestDoesNotStoreItsListAgain) {
  const std::vector<uint64_t> e = {11, 12}, f = {13}, g = {14, 15, 16}, h = {17, 18};
  // A float32 pull of step 1 storing E in slot 7 waits for step 0.
  const uint64_t pull_e_id =
      SendOnly(At(ListHeader(PULL, kSparse, 2, 7, DigestOf(e)), 1), Frames(KeysFrame(e)));
  ASSERT_NO_FATAL_FAILURE(AwaitDeferred(1));
  // Node 1 then stores F in slot 7, and fills its 6-key budget (1 + 3 + 2).
  for (const auto& [slot, keys] : std::vector<std::pair<uint32_t, std::vector<uint64_t>>>{
           {7, f}, {8, g}, {9, h}}) {
    SCOPED_TRACE(slot);
    Response r = SendValid(At(ListHeader(PULL, kSparse, keys.size(), slot, DigestOf(keys)), 0),
                           Frames(KeysFrame(keys)));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  }
  const uint64_t advance_id = Advance(2, 1);
  std::map<uint64_t, Response> replies = ReceiveAll(2);
  ASSERT_EQ(replies.count(advance_id), 1u);
  ASSERT_EQ(replies.count(pull_e_id), 1u);
  const Response& got_e = replies[pull_e_id];
  EXPECT_EQ(got_e.code(), absl::StatusCode::kOk) << got_e.header.message();
  EXPECT_EQ(got_e.values, std::vector<float>(4, 0.0f));
  // The slots hold what node 1 stored last.
  for (const auto& [slot, keys] : std::vector<std::pair<uint32_t, std::vector<uint64_t>>>{
           {7, f}, {8, g}, {9, h}}) {
    SCOPED_TRACE(slot);
    Response r = SendValid(At(ListHeader(PULL, kSparse, keys.size(), slot, DigestOf(keys)), 1),
                           Frames(KeysFrame({})));
    EXPECT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    EXPECT_FALSE(r.header.key_list_unknown());
  }
}

// "A rejected request changes nothing" includes the record of applied
// sequence numbers: a push refused as too far ahead of the applied BSP step
// must not be remembered as applied, or the worker's next push with that
// sequence number (a valid one) would be answered as a duplicate and lost.
TEST_F(BspKeyListServerTest, APushRefusedAsTooFarAheadIsNotRememberedAsApplied) {
  const uint64_t too_far = ConsistencyController::kMaxStepsAhead + 1;
  RequestHeader far = At(SeqHeader(PUSH, kSparse, 1, /*node=*/1, /*seq=*/5), too_far);
  Response r = SendValid(far, Frames(KeysFrame({7}), ValuesFrame({2, 4})));
  ASSERT_EQ(r.code(), absl::StatusCode::kInvalidArgument) << r.header.message();
  EXPECT_FALSE(r.header.duplicate());

  // The same sequence number on a valid push of step 0: new, buffered.
  r = SendValid(At(SeqHeader(PUSH, kSparse, 1, 1, 5), 0),
                Frames(KeysFrame({7}), ValuesFrame({2, 4})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_FALSE(r.header.duplicate());
  EXPECT_EQ(server_->stats().duplicate_pushes, 0u);

  // Node 2 finishes step 0: the push is applied, averaged over both workers.
  const uint64_t advance_id = Advance(2, 1);
  std::map<uint64_t, Response> replies = ReceiveAll(1);
  ASSERT_EQ(replies.count(advance_id), 1u);
  r = SendValid(At(Header(PULL, kSparse, 1), 1), Frames(KeysFrame({7})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-0.5f, -1.0f}));
}

// ------------------------------------------------ limits and gradients

// A server with small limits: 1 MiB messages, 1000 keys a message, two
// connections, 64 KiB of requests held aside; BSP with workers node 1
// (rank 0) and node 2 (rank 1). It owns every slot.
class LimitsServerTest : public ServerTest {
 protected:
  void SetUp() override {
    const std::string config = std::string(kConfig) +
                               "consistency { mode: BSP }\n"
                               "data_plane { limits { max_message_bytes: 1048576 "
                               "max_keys_per_message: 1000 max_connections: 2 "
                               "max_held_bytes: 1048576 } " +
                               gradients_ + " }\n";
    ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/false, config.c_str()));
    ASSERT_NO_FATAL_FAILURE(InstallBspView());
  }

  static RequestHeader From(RequestHeader h, uint64_t node, uint64_t clock) {
    h.set_sender_node_id(node);
    h.set_clock(clock);
    return h;
  }

  std::string gradients_;
};

TEST_F(LimitsServerTest, OversizedRequestsAreRefusedAndTheServerKeepsServing) {
  // 80,000 keys of dim 2: each frame is under the 1 MiB limit (640,000
  // bytes), the message is not.
  std::vector<uint64_t> many(80000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = i;
  Response r = SendValid(From(Header(PUSH, kSparse, many.size()), 1, 0),
                         Frames(KeysFrame(many), ValuesFrame(std::vector<float>(160000, 1))));
  EXPECT_EQ(r.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(r.header.message().find("max_message_bytes"), std::string::npos)
      << r.header.message();

  // 1001 keys: over max_keys_per_message.
  many.resize(1001);
  r = SendValid(From(Header(PULL, kSparse, many.size()), 1, 0), Frames(KeysFrame(many)));
  EXPECT_EQ(r.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(r.header.message().find("max_keys_per_message"), std::string::npos)
      << r.header.message();

  // One frame over the limit: ZeroMQ drops that connection unanswered,
  // and nothing else is affected.
  {
    zmq::socket_t big(context_, zmq::socket_type::dealer);
    big.set(zmq::sockopt::rcvtimeo, 500);
    big.set(zmq::sockopt::linger, 0);
    big.connect(server_->endpoint());
    RequestHeader h = From(Header(PULL, kSparse, 0), 1, 0);
    std::vector<zmq::message_t> frames;
    frames.push_back(HeaderFrame(h));
    frames.emplace_back(size_t{2} << 20);
    std::memset(frames.back().data(), 0, frames.back().size());
    zmq::send_multipart(big, frames);
    std::vector<zmq::message_t> reply;
    EXPECT_FALSE(zmq::recv_multipart(big, std::back_inserter(reply)));
  }
  EXPECT_EQ(server_->stats().limit_refusals, 2u);
  // Nothing of the refused push was applied.
  r = SendValid(From(Header(PULL, kSparse, 2), 1, 0), Frames(KeysFrame({0, 79999})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, std::vector<float>(4, 0.0f));
}

TEST_F(LimitsServerTest, SendersNotLiveInTheViewAreRefusedBeforeAnythingIsKept) {
  Response r = SendValid(SeqHeader(PUSH, kSparse, 1, /*node=*/9, /*seq=*/1),
                         Frames(KeysFrame({7}), ValuesFrame({2, 2})));
  EXPECT_EQ(r.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.header.message().find("not a live worker"), std::string::npos)
      << r.header.message();
  RequestHeader advance = From(Header(ADVANCE_CLOCK, 0, 0), 9, 5);
  EXPECT_EQ(SendValid(advance, Frames(KeysFrame({}))).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(server_->stats().unknown_sender_refusals, 2u);
  // Live workers and tools (node 0) are served; node 9's push changed
  // nothing and did not move BSP on (node 1's step 0 push is buffered
  // until node 2 finishes step 0).
  r = SendValid(From(SeqHeader(PUSH, kSparse, 1, 1, 1), 1, 0),
                Frames(KeysFrame({7}), ValuesFrame({2, 2})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  r = Pull(kSparse, {7});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, std::vector<float>(2, 0.0f));
}

TEST_F(LimitsServerTest, PullsHeldBeyondTheBudgetAreRefusedUntilItFrees) {
  // Node 1 pulls step 1 while node 2 has not finished step 0: each pull of
  // 1000 keys (8 KB) is held. 1 MiB holds 130 of them.
  std::vector<uint64_t> keys(1000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  int held = 0;
  Response refused;
  for (int i = 0; i < 200; ++i) {
    SendOnly(From(Header(PULL, kSparse, keys.size()), 1, 1), Frames(KeysFrame(keys)));
    // Refusals are answered at once; held pulls are not.
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(20)) > 0) {
      refused = Receive();
      break;
    }
    ++held;
  }
  ASSERT_TRUE(refused.received);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.header.message().find("max_held_bytes"), std::string::npos)
      << refused.header.message();
  EXPECT_GE(held, 100);
  EXPECT_LE(held, 131);
  EXPECT_GT(server_->stats().held_bytes, (uint64_t{1} << 20) - 9000);
  EXPECT_LE(server_->stats().held_bytes, uint64_t{1} << 20);
  EXPECT_EQ(server_->stats().limit_refusals, 1u);
  // Node 2 finishes step 0: every held pull is answered, and the budget is
  // free again.
  RequestHeader advance = From(Header(ADVANCE_CLOCK, 0, 0), 2, 1);
  SendOnly(advance, Frames(KeysFrame({})));
  int answered = 0;
  for (int i = 0; i < held + 1; ++i) {
    Response r = Receive();
    if (!r.received) break;
    if (r.header.num_values() == 2000) ++answered;
  }
  EXPECT_EQ(answered, held);
  // The serving thread frees a pull's bytes just after sending its answer.
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (server_->stats().held_bytes != 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(server_->stats().held_bytes, 0u);
  Response r = SendValid(From(Header(PULL, kSparse, keys.size()), 1, 1), Frames(KeysFrame(keys)));
  EXPECT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
}

TEST_F(LimitsServerTest, ConnectionsBeyondTheLimitWaitUntilOneCloses) {
  // The fixture's socket is one connection; a second is admitted.
  auto open = [&] {
    zmq::socket_t s(context_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::rcvtimeo, 1000);
    s.set(zmq::sockopt::linger, 0);
    s.connect(server_->endpoint());
    return s;
  };
  auto ask = [&](zmq::socket_t& s) {
    RequestHeader h = From(Header(PULL, kSparse, 1), 1, 0);
    h.set_request_id(77);
    std::vector<zmq::message_t> frames;
    frames.push_back(HeaderFrame(h));
    frames.push_back(KeysFrame({3}));
    zmq::send_multipart(s, frames);
  };
  auto answered = [&](zmq::socket_t& s) {
    std::vector<zmq::message_t> reply;
    return zmq::recv_multipart(s, std::back_inserter(reply)).has_value();
  };
  zmq::socket_t second = open();
  ask(second);
  ASSERT_TRUE(answered(second));
  zmq::socket_t third = open();
  ask(third);
  EXPECT_FALSE(answered(third));
  EXPECT_GE(server_->stats().connection_refusals, 1u);
  // Two admitted, and the third while it waits for its refusal to end.
  EXPECT_GE(server_->stats().open_connections, 2);
  EXPECT_LE(server_->stats().open_connections, 3);
  // Once the second closes, the third gets in (the server drops its
  // waiting connection within the 3 s handshake limit, and ZeroMQ
  // reconnects) and its queued request is answered.
  second.close();
  third.set(zmq::sockopt::rcvtimeo, 8000);
  EXPECT_TRUE(answered(third));
  // The fixture's connection was never affected.
  EXPECT_EQ(Pull(kSparse, {3}).code(), absl::StatusCode::kOk);
}

TEST_F(ServerTest, NonFiniteGradientsAreRejectedAndCountedByWorker) {
  // Restarted with metrics (the registry must outlive the server: it is
  // stopped at the end of the test).
  metrics::Registry registry;
  socket_.close();
  server_.reset();
  ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/true, kConfig, nullptr, &registry));

  RequestHeader h = Header(PUSH, kSparse, 2);
  h.set_sender_node_id(4);
  h.set_sender_rank(3);
  Response r = SendValid(h, Frames(KeysFrame({7, 8}), ValuesFrame({1, kNaN, kInf, 1})));
  EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.header.message().find("2 of 4 values"), std::string::npos) << r.header.message();
  const KVServer::Stats s = server_->stats();
  EXPECT_EQ(s.nonfinite_values, 2u);
  EXPECT_EQ(s.nonfinite_pushes_rejected, 1u);
  EXPECT_NE(registry.Expose().find(
                "ps_server_nonfinite_gradients_total{worker=\"3\",action=\"rejected\"} 2"),
            std::string::npos)
      << registry.Expose();
  r = Pull(kSparse, {7, 8});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk);
  EXPECT_EQ(r.values, std::vector<float>(4, 0.0f));
  socket_.close();
  server_.reset();
}

class ClipServerTest : public LimitsServerTest {
 protected:
  void SetUp() override {
    gradients_ = "gradients { nonfinite: CLIP clip_value: 4 }";
    LimitsServerTest::SetUp();
  }
};

TEST_F(ClipServerTest, NonFiniteGradientsAreClippedAndCounted) {
  // Buffered for BSP step 0, then applied averaged over the two workers:
  // NaN -> 0, +Inf -> 4, -Inf -> -4, 10 -> 4 (clipped by value), 1 stays.
  Response r = SendValid(From(Header(PUSH, kSparse, 3), 1, 0),
                         Frames(KeysFrame({7, 8, 9}), ValuesFrame({kNaN, kInf, -kInf, 10, 1, -1})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(server_->stats().nonfinite_values, 3u);
  EXPECT_EQ(server_->stats().nonfinite_pushes_rejected, 0u);
  SendValid(From(Header(ADVANCE_CLOCK, 0, 0), 1, 1), Frames(KeysFrame({})));
  SendValid(From(Header(ADVANCE_CLOCK, 0, 0), 2, 1), Frames(KeysFrame({})));
  r = SendValid(From(Header(PULL, kSparse, 3), 1, 1), Frames(KeysFrame({7, 8, 9})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  // SGD lr 0.5, averaged over 2 workers: w = -0.25 * g.
  EXPECT_EQ(r.values, (std::vector<float>{0, -1, 1, -1, -0.25, 0.25}));
  // ASSIGN values are never clipped: non-finite ones are refused.
  RequestHeader assign = From(Header(ASSIGN, kDense, 0, {{0, 2}}), 1, 1);
  r = SendValid(assign, Frames(KeysFrame({}), ValuesFrame({kNaN, 1})));
  EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ServerTest, AStandaloneServerKeepsStateForBoundedSenders) {
  // In batches: the answers to requests sent without reading any pile up
  // in the server's and this socket's queues (1000 messages each) and the
  // kernel's socket buffers, and a ROUTER drops what finds its queue full.
  // 4096 unread answers fit on some machines and not on others (a fresh
  // Debian root timed out here).
  constexpr uint64_t kBatch = 256;
  int ok = 0;
  for (uint64_t first = 1; first <= KVServer::kMaxStandaloneSenders; first += kBatch) {
    const uint64_t last = std::min<uint64_t>(first + kBatch - 1, KVServer::kMaxStandaloneSenders);
    for (uint64_t node = first; node <= last; ++node) {
      RequestHeader h = SeqHeader(PUSH, kSparse, 1, node, 1);
      h.set_request_id(node);
      SendOnly(h, Frames(KeysFrame({7}), ValuesFrame({0, 0})));
    }
    for (uint64_t node = first; node <= last; ++node) {
      Response r = Receive();
      if (!r.received) return;  // reported by Receive
      if (r.code() == absl::StatusCode::kOk) ++ok;
    }
  }
  EXPECT_EQ(ok, static_cast<int>(KVServer::kMaxStandaloneSenders));
  Response r = SendValid(SeqHeader(PUSH, kSparse, 1, 999999, 1),
                         Frames(KeysFrame({7}), ValuesFrame({0, 0})));
  EXPECT_EQ(r.code(), absl::StatusCode::kResourceExhausted);
  // A sender already known is still served.
  r = SendValid(SeqHeader(PUSH, kSparse, 1, 5, 2), Frames(KeysFrame({7}), ValuesFrame({0, 0})));
  EXPECT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
}

// ------------------------------------------------------------ fencing

using SteadyClock = std::chrono::steady_clock;

// A clock that blocks whoever reads it while closed: the serving thread
// reads the server's clock once per loop (TTL), so closing it stops the
// server between two loops, with requests queuing in its socket, as a
// process stopped by SIGSTOP would.
class GateClock : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    ++waiting_;
    mu_.Await(absl::Condition(&open_));
    --waiting_;
    return absl::Now();
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  // Waits until a reader is held (true), at most 10 s.
  bool AwaitHeld() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        absl::Condition(+[](int* waiting) { return *waiting > 0; }, &waiting_),
        absl::Seconds(10));
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }

 private:
  mutable absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  mutable int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

bool LeaseLapsed(const Response& r) {
  return r.code() == absl::StatusCode::kUnavailable &&
         r.header.refusal() == LEASE_LAPSED &&
         r.header.message().find("lease lapsed") != std::string::npos;
}

TEST_F(ServerTest, WithALapsedLeaseEveryRequestIsRefusedAndNothingIsRecorded) {
  auto push = [&](uint64_t seq) {
    return SendValid(SeqHeader(PUSH, kSparse, 1, 5, seq),
                     Frames(KeysFrame({7}), ValuesFrame({1, 2})));
  };
  // No lease yet: nothing is enforced.
  ASSERT_EQ(push(1).code(), absl::StatusCode::kOk);
  server_->SetLease(SteadyClock::now() + std::chrono::seconds(60));
  ASSERT_EQ(push(2).code(), absl::StatusCode::kOk);
  const KVServer::Stats before = server_->stats();

  server_->SetLease(SteadyClock::now() - std::chrono::milliseconds(1));
  Response r = push(3);
  EXPECT_TRUE(LeaseLapsed(r)) << r.header.message();
  EXPECT_TRUE(r.header.message().find("retry") != std::string::npos) << r.header.message();
  EXPECT_FALSE(r.header.duplicate());
  // Every other op too: pulls, dense pushes, assigns, clock messages, STATS.
  r = Pull(kSparse, {7});
  EXPECT_TRUE(LeaseLapsed(r)) << r.header.message();
  EXPECT_TRUE(r.values.empty());
  RequestHeader dense = Header(PUSH, kDense, 0, {{0, 2}});
  dense.set_sender_node_id(5);
  dense.set_seq(4);
  EXPECT_TRUE(LeaseLapsed(SendValid(dense, Frames(KeysFrame({}), ValuesFrame({2, 4})))));
  EXPECT_TRUE(LeaseLapsed(DensePush({{2, 1}}, {3}, ASSIGN)));
  RequestHeader clock = Header(ADVANCE_CLOCK, 0, 0);
  clock.set_sender_node_id(5);
  clock.set_clock(9);
  EXPECT_TRUE(LeaseLapsed(SendValid(clock, Frames(KeysFrame({})))));
  EXPECT_TRUE(LeaseLapsed(SendValid(Header(STATS, 0, 0), Frames(KeysFrame({})))));
  RequestHeader scan = Header(SCAN, kSparse, 0);
  EXPECT_TRUE(LeaseLapsed(SendValid(scan, Frames(KeysFrame({})))));

  // Only the refusal counter moved.
  const KVServer::Stats during = server_->stats();
  EXPECT_EQ(during.lease_refusals, 7u);
  EXPECT_EQ(during.fenced_refusals, 0u);
  EXPECT_EQ(during.requests, before.requests);
  EXPECT_EQ(during.errors, before.errors);
  EXPECT_EQ(during.keys_pushed, before.keys_pushed);
  EXPECT_EQ(during.duplicate_pushes, before.duplicate_pushes);

  // Renewed: nothing of the refused requests was applied, and their
  // sequence numbers were not recorded: the same pushes, sent again, are
  // applied once.
  server_->SetLease(SteadyClock::now() + std::chrono::seconds(60));
  r = Pull(kSparse, {7});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-1.0f, -2.0f}));  // seqs 1 and 2
  r = DensePull({{0, 4}});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{0, 0, 0, 0}));
  r = push(3);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_FALSE(r.header.duplicate());
  r = SendValid(dense, Frames(KeysFrame({}), ValuesFrame({2, 4})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_FALSE(r.header.duplicate());
  r = push(3);
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_TRUE(r.header.duplicate());
  r = Pull(kSparse, {7});
  EXPECT_EQ(r.values, (std::vector<float>{-1.5f, -3.0f}));
  r = DensePull({{0, 2}});
  EXPECT_EQ(r.values, (std::vector<float>{-1.0f, -2.0f}));
  EXPECT_EQ(server_->stats().lease_refusals, 7u);
}

TEST_F(ServerTest, AFencedServerRefusesEverythingForGood) {
  auto push = [&](uint64_t seq) {
    return SendValid(SeqHeader(PUSH, kSparse, 1, 5, seq),
                     Frames(KeysFrame({7}), ValuesFrame({1, 2})));
  };
  server_->SetLease(SteadyClock::now() + std::chrono::seconds(60));
  ASSERT_EQ(push(1).code(), absl::StatusCode::kOk);
  server_->Fence("declared dead by the scheduler at epoch 12");
  for (int i = 0; i < 2; ++i) {
    Response r = push(2);
    EXPECT_EQ(r.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(r.header.refusal(), NOT_MEMBER);
    EXPECT_TRUE(r.header.message().find("no longer a member") != std::string::npos)
        << r.header.message();
    EXPECT_TRUE(r.header.message().find("epoch 12") != std::string::npos) << r.header.message();
    r = Pull(kSparse, {7});
    EXPECT_EQ(r.header.refusal(), NOT_MEMBER);
    EXPECT_TRUE(r.values.empty());
    // A renewed lease does not undo it, nor does a later Fence change why.
    server_->SetLease(SteadyClock::now() + std::chrono::seconds(120));
    server_->Fence("another reason");
  }
  EXPECT_EQ(server_->stats().fenced_refusals, 4u);
  EXPECT_EQ(server_->stats().lease_refusals, 0u);
  // Nothing was applied after the fence.
  const std::vector<const Table*> none = server_->StoppedTables();
  EXPECT_TRUE(none.empty());
  server_->Stop();
  const std::vector<const Table*> tables = server_->StoppedTables();
  ASSERT_FALSE(tables.empty());
  const SparseTable* sparse = tables[kSparse]->AsSparse();
  ASSERT_NE(sparse, nullptr);
  std::vector<uint64_t> keys;
  std::vector<float> state;
  sparse->ExportRows(0, 100, &keys, &state);
  ASSERT_EQ(keys, (std::vector<uint64_t>{7}));
  EXPECT_EQ(state[0], -0.5f);
  EXPECT_EQ(state[1], -1.0f);
}

// The lease is checked when the serving thread takes a request up, not
// when it arrived: what queued while the server was stopped is refused if
// the lease lapsed meanwhile.
// A pull held for consistency is answered only if the lease still holds
// when it may be answered.
TEST_F(ServerTest, AHeldPullTakenUpAfterTheLeaseLapsedIsRefused) {
  TearDown();
  const std::string config = std::string(kConfig) + "consistency { mode: BSP }\n";
  ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/false, config.c_str()));
  ASSERT_NO_FATAL_FAILURE(InstallBspView());
  server_->SetLease(SteadyClock::now() + std::chrono::seconds(60));
  // Node 1's pull of step 1 waits for node 2 to finish step 0.
  RequestHeader pull = Header(PULL, kSparse, 1);
  pull.set_sender_node_id(1);
  pull.set_clock(1);
  const uint64_t id = SendOnly(pull, Frames(KeysFrame({7})));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server_->stats().pulls_deferred < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_EQ(server_->stats().pulls_deferred, 1u);
  server_->SetLease(SteadyClock::now() - std::chrono::milliseconds(1));
  // Node 2 leaves the view: the pull may be answered now, but not by a
  // server whose lease lapsed.
  ClusterView view;
  view.set_epoch(2);
  view.set_job_state(RUNNING);
  view.set_num_slots(16);
  for (int s = 0; s < 16; ++s) view.add_slot_owner(0);
  NodeInfo* worker = view.add_nodes();
  worker->set_node_id(1);
  worker->set_role(WORKER);
  worker->set_rank(0);
  worker->set_state(ALIVE);
  view.mutable_consistency()->set_mode(BSP);
  server_->UpdateView(view, 0);
  Response r = Receive();
  EXPECT_EQ(r.header.request_id(), id);
  EXPECT_TRUE(LeaseLapsed(r)) << r.header.message();
  EXPECT_TRUE(r.values.empty());
  EXPECT_EQ(server_->stats().held_bytes, 0u);
  // Renewed, the same pull is answered.
  server_->SetLease(SteadyClock::now() + std::chrono::seconds(60));
  r = SendValid(pull, Frames(KeysFrame({7})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{0, 0}));
}

class GatedServerTest : public ServerTest {
 protected:
  void SetUp() override { StartServer(/*standalone=*/true, kConfig, &gate_); }
  void TearDown() override {
    gate_.Open();  // a failed test may leave it closed
    ServerTest::TearDown();
  }
  // Outlives the server (TearDown destroys it).
  GateClock gate_;
};

TEST_F(GatedServerTest, ARequestQueuedWhileTheLeaseHeldAndTakenUpAfterItLapsedIsRefused) {
  GateClock& gate = gate_;
  server_->SetLease(SteadyClock::now() + std::chrono::seconds(60));
  auto push_header = [](uint64_t seq) { return SeqHeader(PUSH, kSparse, 1, 5, seq); };
  ASSERT_EQ(SendValid(push_header(1), Frames(KeysFrame({7}), ValuesFrame({1, 2}))).code(),
            absl::StatusCode::kOk);

  // Stop the serving thread between two loops, queue a push while the
  // lease still holds, let the lease run out, resume.
  gate.Close();
  ASSERT_TRUE(gate.AwaitHeld());
  const SteadyClock::time_point end = SteadyClock::now() + std::chrono::milliseconds(200);
  server_->SetLease(end);
  const uint64_t id = SendOnly(push_header(2), Frames(KeysFrame({7}), ValuesFrame({1, 2})));
  while (SteadyClock::now() <= end + std::chrono::milliseconds(20)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  gate.Open();
  Response r = Receive();
  EXPECT_EQ(r.header.request_id(), id);
  EXPECT_TRUE(LeaseLapsed(r)) << r.header.message();
  EXPECT_EQ(server_->stats().lease_refusals, 1u);

  // Not applied, seq 2 not recorded.
  server_->SetLease(SteadyClock::now() + std::chrono::seconds(60));
  r = Pull(kSparse, {7});
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.values, (std::vector<float>{-0.5f, -1.0f}));
  r = SendValid(push_header(2), Frames(KeysFrame({7}), ValuesFrame({1, 2})));
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_FALSE(r.header.duplicate());
  r = Pull(kSparse, {7});
  EXPECT_EQ(r.values, (std::vector<float>{-1.0f, -2.0f}));
}

// The serving thread reads a worker's ADVANCE_CLOCK and, queued behind
// it, a STATS request. When that clock was the last one a BSP step waited
// for, the step is applied before the STATS is answered: a worker that saw
// its ADVANCE_CLOCK acknowledged reads its pushes applied (the Python
// Trainer.wait() relies on it). Before the fix the step was applied only
// once the whole queue was drained, and STATS counted nothing pushed.
class GatedBspServerTest : public GatedServerTest {
 protected:
  void SetUp() override {
    const std::string config = std::string(kConfig) + "consistency { mode: BSP }\n";
    ASSERT_NO_FATAL_FAILURE(StartServer(/*standalone=*/false, config.c_str(), &gate_));
    ASSERT_NO_FATAL_FAILURE(InstallBspView());
  }
};

TEST_F(GatedBspServerTest, AStepCompletedByAnAdvanceIsAppliedBeforeTheNextRequest) {
  GateClock& gate = gate_;
  // Both workers push step 0: buffered (2 keys).
  for (uint64_t node : {1u, 2u}) {
    RequestHeader h = SeqHeader(PUSH, kSparse, 1, node, /*seq=*/1);
    h.set_clock(0);
    Response r = SendValid(h, Frames(KeysFrame({node == 1 ? 7u : 42u}), ValuesFrame({2, 4})));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  }
  // Queue both workers' ADVANCE_CLOCK and a STATS while the server is
  // stopped between two loops, so that one drain reads all three.
  gate.Close();
  ASSERT_TRUE(gate.AwaitHeld());
  Advance(1, 1);
  Advance(2, 1);
  const uint64_t stats_id = SendOnly(Header(STATS, 0, 0), Frames(KeysFrame({})));
  absl::SleepFor(absl::Milliseconds(100));  // let the socket take them in
  gate.Open();
  Response stats;
  for (int i = 0; i < 3; ++i) {
    Response r = Receive();
    ASSERT_TRUE(r.received);
    EXPECT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
    if (r.header.request_id() == stats_id) stats = r;
  }
  ASSERT_TRUE(stats.received);
  uint64_t pushed = 0;
  for (const TableStats& t : stats.header.table_stats()) {
    if (t.table_id() == kSparse) pushed = t.keys_pushed();
  }
  EXPECT_EQ(pushed, 2u);
}

}  // namespace
}  // namespace ps
