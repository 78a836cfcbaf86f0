#include "scheduler/ring_registry.h"

#include <atomic>
#include <string>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::ElementsAre;

constexpr uint64_t kBase = 1000;

// Live workers the registry asks about, changed by the test.
class Fleet {
 public:
  explicit Fleet(std::initializer_list<uint64_t> live) : live_(live) {}
  bool Live(uint64_t n) const {
    absl::MutexLock lock(&mu_);
    return live_.contains(n);
  }
  size_t Count() const {
    absl::MutexLock lock(&mu_);
    return live_.size();
  }
  void Kill(uint64_t n) {
    absl::MutexLock lock(&mu_);
    live_.erase(n);
  }
  RingRegistry Registry() {
    return RingRegistry([this](uint64_t n) { return Live(n); },
                        [this] { return Count(); }, kBase);
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_set<uint64_t> live_ ABSL_GUARDED_BY(mu_);
};

TEST(RingRegistryTest, FirstRingWaitsForTheMinimumAndRanksByNodeId) {
  Fleet fleet({7, 3});
  RingRegistry ring = fleet.Registry();
  absl::StatusOr<JoinRingResponse> a;
  std::thread t([&] { a = ring.Join(7, 2, 0, absl::Seconds(10)); });
  absl::StatusOr<JoinRingResponse> b = ring.Join(3, 2, 0, absl::Seconds(10));
  t.join();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->generation(), kBase + 1);
  EXPECT_EQ(b->generation(), kBase + 1);
  EXPECT_EQ(a->size(), 2u);
  EXPECT_TRUE(a->formed());
  EXPECT_EQ(b->rank(), 0u);  // node 3 sorts first
  EXPECT_EQ(a->rank(), 1u);
  EXPECT_THAT(a->members(), ElementsAre(3, 7));
}

TEST(RingRegistryTest, MinimumIsCappedAtTheLiveWorkers) {
  Fleet fleet({1});
  RingRegistry ring = fleet.Registry();
  absl::StatusOr<JoinRingResponse> a = ring.Join(1, 4, 0, absl::Seconds(5));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->size(), 1u);
}

TEST(RingRegistryTest, UnknownCallerIsRefused) {
  Fleet fleet({1});
  RingRegistry ring = fleet.Registry();
  EXPECT_EQ(ring.Join(9, 0, 0, absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound);
  RingStoreRequest r;
  r.set_node_id(9);
  EXPECT_EQ(ring.Store(r, absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(RingRegistryTest, JoinerMakesMembersRejoinAndWaitsForThem) {
  Fleet fleet({1, 2});
  RingRegistry ring = fleet.Registry();
  absl::StatusOr<JoinRingResponse> first = ring.Join(1, 0, 0, absl::Seconds(5));
  ASSERT_TRUE(first.ok());
  const uint64_t g = first->generation();
  EXPECT_THAT(ring.Watch(1, g, absl::Milliseconds(10)), false);
  absl::StatusOr<JoinRingResponse> second;
  std::thread joiner([&] { second = ring.Join(2, 0, 0, absl::Seconds(10)); });
  // Node 1 is told, and the new generation waits for it.
  EXPECT_THAT(ring.Watch(1, g, absl::Seconds(5)), true);
  EXPECT_EQ(ring.generation(), g);
  absl::StatusOr<JoinRingResponse> again = ring.Join(1, 0, 0, absl::Seconds(5));
  joiner.join();
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(again->generation(), g + 1);
  EXPECT_EQ(second->generation(), g + 1);
  EXPECT_EQ(again->size(), 2u);
}

TEST(RingRegistryTest, DeadMemberIsDroppedOnceDeclaredDead) {
  Fleet fleet({1, 2});
  RingRegistry ring = fleet.Registry();
  std::thread t([&] { (void)ring.Join(2, 2, 0, absl::Seconds(5)); });
  ASSERT_TRUE(ring.Join(1, 2, 0, absl::Seconds(5)).ok());
  t.join();
  // Node 1's collective failed; node 2 hangs. The formation waits for it.
  absl::StatusOr<JoinRingResponse> waited =
      ring.Join(1, 0, 0, absl::Milliseconds(300));
  ASSERT_TRUE(waited.ok());
  EXPECT_FALSE(waited->formed());
  EXPECT_THAT(waited->waiting_for(), ElementsAre(2));
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(200));
    fleet.Kill(2);
  });
  absl::StatusOr<JoinRingResponse> alone = ring.Join(1, 0, 0, absl::Seconds(5));
  killer.join();
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_THAT(alone->members(), ElementsAre(1));
}

TEST(RingRegistryTest, CallerThatDidNotWaitLearnsOfItsFormation) {
  Fleet fleet({1, 2});
  RingRegistry ring = fleet.Registry();
  ASSERT_TRUE(ring.Join(1, 0, 0, absl::Seconds(5)).ok());
  // Node 2 asks without waiting; node 1 joins later, which forms it.
  absl::StatusOr<JoinRingResponse> asked =
      ring.Join(2, 0, 0, absl::ZeroDuration());
  ASSERT_TRUE(asked.ok());
  EXPECT_FALSE(asked->formed());
  absl::StatusOr<JoinRingResponse> one = ring.Join(1, 0, 0, absl::Seconds(5));
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->formed());
  absl::StatusOr<JoinRingResponse> two =
      ring.Join(2, 0, asked->generation(), absl::ZeroDuration());
  ASSERT_TRUE(two.ok());
  EXPECT_TRUE(two->formed());
  EXPECT_EQ(two->generation(), one->generation());
  EXPECT_EQ(two->size(), 2u);
}

TEST(RingRegistryTest, LeaveFormsARingOfTheOthers) {
  Fleet fleet({1, 2});
  RingRegistry ring = fleet.Registry();
  std::thread t([&] { (void)ring.Join(2, 2, 0, absl::Seconds(5)); });
  absl::StatusOr<JoinRingResponse> g = ring.Join(1, 2, 0, absl::Seconds(5));
  t.join();
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(ring.Leave(2).ok());
  EXPECT_THAT(ring.Watch(1, g->generation(), absl::Seconds(1)), true);
  absl::StatusOr<JoinRingResponse> alone = ring.Join(1, 0, 0, absl::Seconds(5));
  ASSERT_TRUE(alone.ok());
  EXPECT_THAT(alone->members(), ElementsAre(1));
  EXPECT_TRUE(ring.Leave(2).ok());  // twice is fine
}

TEST(RingRegistryTest, StoreKeysBelongToTheCurrentGeneration) {
  Fleet fleet({1});
  RingRegistry ring = fleet.Registry();
  absl::StatusOr<JoinRingResponse> g = ring.Join(1, 0, 0, absl::Seconds(5));
  ASSERT_TRUE(g.ok());
  const std::string key = absl::StrCat(g->generation(), "/0");
  RingStoreRequest get;
  get.set_node_id(1);
  get.add_get_keys(key);
  absl::StatusOr<RingStoreResponse> missing =
      ring.Store(get, absl::Milliseconds(50));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  absl::StatusOr<RingStoreResponse> got;
  std::thread waiter([&] { got = ring.Store(get, absl::Seconds(5)); });
  RingStoreRequest set;
  set.set_node_id(1);
  set.set_set_key(key);
  set.set_set_value("address");
  ASSERT_TRUE(ring.Store(set, absl::ZeroDuration()).ok());
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->values(), ElementsAre("address"));

  RingStoreRequest stale = set;
  stale.set_set_key(absl::StrCat(g->generation() - 1, "/0"));
  EXPECT_EQ(ring.Store(stale, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  RingStoreRequest bad = set;
  bad.set_set_key("no-generation");
  EXPECT_EQ(ring.Store(bad, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  RingStoreRequest big = set;
  big.set_set_value(std::string(RingRegistry::kMaxValueBytes + 1, 'x'));
  EXPECT_EQ(ring.Store(big, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RingRegistryTest, StoreRefusesToGrowPastItsLimit) {
  Fleet fleet({1});
  RingRegistry ring = fleet.Registry();
  absl::StatusOr<JoinRingResponse> g = ring.Join(1, 0, 0, absl::Seconds(5));
  ASSERT_TRUE(g.ok());
  RingStoreRequest set;
  set.set_node_id(1);
  set.set_set_value(std::string(RingRegistry::kMaxValueBytes, 'x'));
  absl::Status last;
  for (int i = 0; i < 200 && last.ok(); ++i) {
    set.set_set_key(absl::StrCat(g->generation(), "/", i));
    last = ring.Store(set, absl::ZeroDuration()).status();
  }
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted);
}

TEST(RingRegistryTest, CloseWakesWaiters) {
  Fleet fleet({1, 2});
  RingRegistry ring = fleet.Registry();
  absl::StatusOr<JoinRingResponse> waiting;
  std::thread t([&] { waiting = ring.Join(1, 2, 0, absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  ring.Close();
  t.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ps
