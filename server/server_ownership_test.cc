// KVServer over a real socket: slot ownership in a job's view.
#include "server/server_test_fixture.h"

namespace ps {
namespace {

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

}  // namespace
}  // namespace ps
