// KVServer over a real socket: leases, fencing and the serving gate.
#include "server/server_test_fixture.h"

namespace ps {
namespace {

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
        absl::Condition(
            +[](int* waiting) { return *waiting > 0; }, &waiting_),
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
  EXPECT_TRUE(r.header.message().find("retry") != std::string::npos)
      << r.header.message();
  EXPECT_FALSE(r.header.duplicate());
  // Every other op too: pulls, dense pushes, assigns, clock messages, STATS.
  r = Pull(kSparse, {7});
  EXPECT_TRUE(LeaseLapsed(r)) << r.header.message();
  EXPECT_TRUE(r.values.empty());
  RequestHeader dense = Header(PUSH, kDense, 0, {{0, 2}});
  dense.set_sender_node_id(5);
  dense.set_seq(4);
  EXPECT_TRUE(LeaseLapsed(
      SendValid(dense, Frames(KeysFrame({}), ValuesFrame({2, 4})))));
  EXPECT_TRUE(LeaseLapsed(DensePush({{2, 1}}, {3}, ASSIGN)));
  RequestHeader clock = Header(ADVANCE_CLOCK, 0, 0);
  clock.set_sender_node_id(5);
  clock.set_clock(9);
  EXPECT_TRUE(LeaseLapsed(SendValid(clock, Frames(KeysFrame({})))));
  EXPECT_TRUE(
      LeaseLapsed(SendValid(Header(STATS, 0, 0), Frames(KeysFrame({})))));
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
    EXPECT_TRUE(r.header.message().find("no longer a member") !=
                std::string::npos)
        << r.header.message();
    EXPECT_TRUE(r.header.message().find("epoch 12") != std::string::npos)
        << r.header.message();
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
  const std::string config =
      std::string(kConfig) + "consistency { mode: BSP }\n";
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
  server_->UpdateView(OwnerView(/*epoch=*/2, /*workers=*/1, BSP), 0);
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

TEST_F(GatedServerTest,
       ARequestQueuedWhileTheLeaseHeldAndTakenUpAfterItLapsedIsRefused) {
  GateClock& gate = gate_;
  server_->SetLease(SteadyClock::now() + std::chrono::seconds(60));
  auto push_header = [](uint64_t seq) {
    return SeqHeader(PUSH, kSparse, 1, 5, seq);
  };
  ASSERT_EQ(
      SendValid(push_header(1), Frames(KeysFrame({7}), ValuesFrame({1, 2})))
          .code(),
      absl::StatusCode::kOk);

  // Stop the serving thread between two loops, queue a push while the
  // lease still holds, let the lease run out, resume.
  gate.Close();
  ASSERT_TRUE(gate.AwaitHeld());
  const SteadyClock::time_point end =
      SteadyClock::now() + std::chrono::milliseconds(200);
  server_->SetLease(end);
  const uint64_t id =
      SendOnly(push_header(2), Frames(KeysFrame({7}), ValuesFrame({1, 2})));
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
    const std::string config =
        std::string(kConfig) + "consistency { mode: BSP }\n";
    ASSERT_NO_FATAL_FAILURE(
        StartServer(/*standalone=*/false, config.c_str(), &gate_));
    ASSERT_NO_FATAL_FAILURE(InstallBspView());
  }
};

TEST_F(GatedBspServerTest,
       AStepCompletedByAnAdvanceIsAppliedBeforeTheNextRequest) {
  GateClock& gate = gate_;
  // Both workers push step 0: buffered (2 keys).
  for (uint64_t node : {1u, 2u}) {
    RequestHeader h = SeqHeader(PUSH, kSparse, 1, node, /*seq=*/1);
    h.set_clock(0);
    Response r = SendValid(
        h, Frames(KeysFrame({node == 1 ? 7u : 42u}), ValuesFrame({2, 4})));
    ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  }
  // Queue both workers' ADVANCE_CLOCK and a STATS while the server is
  // stopped between two loops, so that one drain reads all three.
  gate.Close();
  ASSERT_TRUE(gate.AwaitHeld());
  Advance(1, 1);
  Advance(2, 1);
  const uint64_t stats_id =
      SendOnly(Header(STATS, 0, 0), Frames(KeysFrame({})));
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
