// KVServer over a real socket: sparse-table features (budgets, TTLs,
// staleness-aware steps, warm-up) and linear scaling with workers.
#include "server/server_test_fixture.h"

namespace ps {
namespace {

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
    optimizer {
      sgd { learning_rate: 0.5 }
      staleness_aware: true
    }
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
    optimizer {
      sgd { learning_rate: 0.5 }
      schedule { warmup_steps: 4 }
    }
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
    ASSERT_NO_FATAL_FAILURE(
        StartServer(/*standalone=*/true, kFeatureConfig, &clock_));
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

  Response PushAt(uint64_t clock, uint32_t table,
                  const std::vector<uint64_t>& keys,
                  const std::vector<float>& grads,
                  const SegmentList& segs = {}) {
    RequestHeader h = Header(PUSH, table, keys.size(), segs);
    h.set_clock(clock);
    h.set_sender_node_id(1);
    return SendValid(h, Frames(KeysFrame(keys), ValuesFrame(grads)));
  }

  static std::vector<float> Initial(uint32_t table,
                                    const std::vector<uint64_t>& keys) {
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
  ASSERT_EQ(PushAt(0, kWarm, {}, {8, 8}, {{1, 2}}).code(),
            absl::StatusCode::kOk);

  r = Stats();
  ASSERT_EQ(r.code(), absl::StatusCode::kOk) << r.header.message();
  EXPECT_EQ(r.header.num_values(), 0u);
  EXPECT_TRUE(r.values.empty());
  const auto& stats = r.header.table_stats();
  ASSERT_EQ(stats.size(), 6);
  const std::vector<std::pair<uint32_t, std::string>> want = {
      {0, "stale"}, {1, "plain"},       {2, "ttl_steps"},
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
  Response r =
      Push(kCapped, keys, std::vector<float>(keys.size() * kDim, 1.0f));
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
  r = Push(kCapped, {100, 101, 102}, std::vector<float>(3 * kDim, 2.0f),
           PUSH_PULL);
  EXPECT_EQ(r.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(r.values.empty());
  EXPECT_EQ(StatsOf(kCapped).pushes_refused(), 2u);

  // What fits is served: two new rows and a known key.
  r = Push(kCapped, {0, 100, 101}, std::vector<float>(3 * kDim, 2.0f),
           PUSH_PULL);
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
  EXPECT_TRUE(WaitForStats(kTtlSteps,
                           [](const TableStats& t) { return t.rows() == 1; }));
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
  EXPECT_TRUE(WaitForStats(kTtlSteps,
                           [](const TableStats& t) { return t.rows() == 0; }));
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
  EXPECT_TRUE(WaitForStats(kTtlSeconds,
                           [](const TableStats& t) { return t.rows() == 0; }));
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
  Response r =
      SendValid(Header(PULL, kWarm, 0, {{0, 4}}), Frames(KeysFrame({})));
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
    optimizer {
      sgd { learning_rate: 0.5 }
      scale_with_workers: true
    }
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

}  // namespace
}  // namespace ps
