// KVServer over a real socket: idempotent pushes, pushes and pulls of
// sparse and dense tables, malformed requests, statistics, start-up.
#include "server/server_test_fixture.h"

namespace ps {
namespace {

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
  EXPECT_EQ(r.values,
            (std::vector<float>{0, 0, -0.5, -1, -1.5, -2, -2.5, 0, -3, -4}));

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
  ASSERT_EQ(Push(kSparse, {7, 42}, {1, 2, 3, 4}).code(), absl::StatusCode::kOk);
  ASSERT_EQ(DensePush({{0, 4}, {4, 4}, {8, 2}}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
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
      {"single empty frame", [] { return Frames(zmq::message_t()); }, kInvalid},
      {"header frame only",
       [] { return Frames(HeaderFrame(Header(PULL, kSparse, 0))); }, kInvalid},
      {"push without values frame",
       [&] {
         return Frames(push_header(kSparse, 2), KeysFrame({7, 42}));
       },
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
         return Frames(push_header(kDense, 0, {{0, 2}, {4, 1}}), KeysFrame({}),
                       ValuesFrame({1, 1}));
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
         return Frames(push_header(kDense, 0, {{0, 2}, {8, 2}}), KeysFrame({}),
                       ValuesFrame({1, 1, 1, kNaN}));
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

}  // namespace
}  // namespace ps
