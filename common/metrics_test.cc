#include "common/metrics.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::metrics {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(CounterTest, Adds) {
  Counter c;
  c.Add();
  c.Add(41);
  EXPECT_EQ(c.value(), 42u);
}

TEST(GaugeTest, SetsAndAdds) {
  Gauge g;
  g.Set(2.5);
  g.Add(-4);
  EXPECT_DOUBLE_EQ(g.value(), -1.5);
}

TEST(HistogramTest, BucketsAreUpperBoundsInclusive) {
  Histogram h({1, 0.5, 2, 1});  // sorted, duplicates dropped
  EXPECT_THAT(h.bounds(), ElementsAre(0.5, 1, 2));
  h.Observe(0.5);   // <= 0.5
  h.Observe(0.75);  // <= 1
  h.Observe(1);     // <= 1
  h.Observe(7);     // +Inf
  h.Observe(std::nan(""));  // ignored
  EXPECT_THAT(h.BucketCounts(), ElementsAre(1, 2, 0, 1));
  EXPECT_EQ(h.count(), 4u);
  EXPECT_DOUBLE_EQ(h.sum(), 9.25);
}

TEST(HistogramTest, ExponentialBuckets) {
  EXPECT_THAT(ExponentialBuckets(1, 2, 4), ElementsAre(1, 2, 4, 8));
  EXPECT_TRUE(ExponentialBuckets(0, 2, 4).empty());
  EXPECT_TRUE(ExponentialBuckets(1, 1, 4).empty());
  const std::vector<double> latency = LatencyBuckets();
  EXPECT_TRUE(std::is_sorted(latency.begin(), latency.end()));
  EXPECT_EQ(latency.front(), 0.00005);
  EXPECT_EQ(latency.back(), 10);
}

TEST(FormatTest, Values) {
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(-12), "-12");
  EXPECT_EQ(FormatValue(0.005), "0.005");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatValue(1e20), "1e+20");
}

TEST(FormatTest, EscapesLabelValues) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
}

TEST(FormatTest, SanitizesNames) {
  EXPECT_EQ(SanitizeName("ps_ok:x_1", false), "ps_ok:x_1");
  EXPECT_EQ(SanitizeName("ps-bad name", false), "ps_bad_name");
  EXPECT_EQ(SanitizeName("1abc", false), "_abc");
  EXPECT_EQ(SanitizeName("a:b", true), "a_b");
  EXPECT_EQ(SanitizeName("", false), "_");
}

TEST(RegistryTest, ExposesTheTextFormat) {
  Registry r;
  r.AddCounter("ps_test_requests_total", "Requests.")->Add(3);
  r.AddGauge("ps_test_epoch", "The epoch.")->Set(7);
  Histogram* h = r.AddHistogram("ps_test_latency_seconds", "Latency.", {0.1, 1});
  h->Observe(0.05);
  h->Observe(0.5);
  h->Observe(2);
  EXPECT_EQ(r.Expose(),
            "# HELP ps_test_requests_total Requests.\n"
            "# TYPE ps_test_requests_total counter\n"
            "ps_test_requests_total 3\n"
            "# HELP ps_test_epoch The epoch.\n"
            "# TYPE ps_test_epoch gauge\n"
            "ps_test_epoch 7\n"
            "# HELP ps_test_latency_seconds Latency.\n"
            "# TYPE ps_test_latency_seconds histogram\n"
            "ps_test_latency_seconds_bucket{le=\"0.1\"} 1\n"
            "ps_test_latency_seconds_bucket{le=\"1\"} 2\n"
            "ps_test_latency_seconds_bucket{le=\"+Inf\"} 3\n"
            "ps_test_latency_seconds_sum 2.55\n"
            "ps_test_latency_seconds_count 3\n");
}

TEST(RegistryTest, LabelledFamilies) {
  Registry r;
  CounterFamily* requests =
      r.AddCounterFamily("ps_test_requests_total", "By op.", {"op", "outcome"});
  Counter* push_ok = requests->With({"push", "ok"});
  EXPECT_EQ(requests->With({"push", "ok"}), push_ok);  // the same child
  push_ok->Add(2);
  requests->With({"pull", "error"})->Add();
  // Too few values: the rest are empty; extra ones are dropped.
  requests->With({"stats"})->Add(5);
  requests->With({"scan", "ok", "extra"})->Add(1);
  HistogramFamily* latency = r.AddHistogramFamily("ps_test_seconds", "Latency by op.",
                                                  {"op"}, {1});
  latency->With({"push"})->Observe(0.5);
  GaugeFamily* rows = r.AddGaugeFamily("ps_test_rows", "Rows.", {"table"});
  rows->With({"emb \"x\"\n"})->Set(10);
  EXPECT_EQ(r.Expose(),
            "# HELP ps_test_requests_total By op.\n"
            "# TYPE ps_test_requests_total counter\n"
            "ps_test_requests_total{op=\"pull\",outcome=\"error\"} 1\n"
            "ps_test_requests_total{op=\"push\",outcome=\"ok\"} 2\n"
            "ps_test_requests_total{op=\"scan\",outcome=\"ok\"} 1\n"
            "ps_test_requests_total{op=\"stats\",outcome=\"\"} 5\n"
            "# HELP ps_test_seconds Latency by op.\n"
            "# TYPE ps_test_seconds histogram\n"
            "ps_test_seconds_bucket{op=\"push\",le=\"1\"} 1\n"
            "ps_test_seconds_bucket{op=\"push\",le=\"+Inf\"} 1\n"
            "ps_test_seconds_sum{op=\"push\"} 0.5\n"
            "ps_test_seconds_count{op=\"push\"} 1\n"
            "# HELP ps_test_rows Rows.\n"
            "# TYPE ps_test_rows gauge\n"
            "ps_test_rows{table=\"emb \\\"x\\\"\\n\"} 10\n");
}

TEST(RegistryTest, HelpIsEscaped) {
  Registry r;
  r.AddGauge("ps_test_g", "two\nlines \\ here");
  EXPECT_THAT(r.Expose(), HasSubstr("# HELP ps_test_g two\\nlines \\\\ here\n"));
}

TEST(RegistryTest, CallbacksRunAtEveryScrape) {
  Registry r;
  double value = 1;
  r.AddCallback("ps_test_value", "A value.", Type::kGauge, [&] { return value; });
  int calls = 0;
  r.AddCallbackFamily("ps_test_clock", "Clocks.", Type::kGauge, {"rank"}, [&] {
    ++calls;
    return std::vector<Sample>{{{"0"}, 5.0 + calls}, {{"1"}, 0.25}};
  });
  EXPECT_THAT(r.Expose(), HasSubstr("ps_test_value 1\n"));
  value = 2.5;
  const std::string text = r.Expose();
  EXPECT_THAT(text, HasSubstr("ps_test_value 2.5\n"));
  EXPECT_THAT(text, HasSubstr("ps_test_clock{rank=\"0\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("ps_test_clock{rank=\"1\"} 0.25\n"));
  EXPECT_EQ(calls, 2);
}

TEST(RegistryTest, RegisteringAgainReturnsTheSameMetric) {
  Registry r;
  Counter* a = r.AddCounter("ps_test_total", "A.");
  Counter* b = r.AddCounter("ps_test_total", "A again.");
  EXPECT_EQ(a, b);
  CounterFamily* f = r.AddCounterFamily("ps_test_f_total", "F.", {"x"});
  EXPECT_EQ(r.AddCounterFamily("ps_test_f_total", "F.", {"x"}), f);
}

TEST(RegistryTest, ConflictingRegistrationIsNotExposed) {
  Registry r;
  r.AddCounter("ps_test_x", "A counter.")->Add(1);
  Gauge* g = r.AddGauge("ps_test_x", "A gauge of the same name.");
  ASSERT_NE(g, nullptr);
  g->Set(99);  // works, but is not exported
  const std::string text = r.Expose();
  EXPECT_THAT(text, HasSubstr("# TYPE ps_test_x counter\nps_test_x 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("99")));
  EXPECT_THAT(text, Not(HasSubstr("gauge")));
}

TEST(RegistryTest, InvalidNamesAreSanitized) {
  Registry r;
  r.AddCounterFamily("ps-test total", "Bad name.", {"bad-label", "le"})->With({"a", "b"});
  r.AddHistogramFamily("ps_test_h", "Le is renamed.", {"le"}, {1})->With({"x"})->Observe(0);
  const std::string text = r.Expose();
  EXPECT_THAT(text, HasSubstr("ps_test_total{bad_label=\"a\",le=\"b\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("ps_test_h_bucket{le_=\"x\",le=\"1\"} 1\n"));
}

TEST(ProcessMetricsTest, ReadTheProcess) {
  Registry r;
  AddProcessMetrics(&r);
  const std::string text = r.Expose();
  EXPECT_THAT(text, HasSubstr("# TYPE ps_process_cpu_seconds_total counter\n"));
  EXPECT_THAT(text, HasSubstr("ps_process_start_time_seconds 1"));  // 2001..2033
  EXPECT_THAT(text, Not(HasSubstr("ps_process_resident_memory_bytes 0\n")));
}

TEST(RegistryTest, ConcurrentUpdatesAreAllCounted) {
  Registry r;
  Counter* c = r.AddCounter("ps_test_total", "C.");
  HistogramFamily* hf = r.AddHistogramFamily("ps_test_seconds", "H.", {"t"}, {0.5});
  constexpr int kThreads = 4;
  constexpr int kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Histogram* h = hf->With({t % 2 == 0 ? "even" : "odd"});
      for (int i = 0; i < kEach; ++i) {
        c->Add();
        h->Observe(i % 2 == 0 ? 0.25 : 1.0);
        if (i % 1000 == 0) (void)r.Expose();  // scrapes while updating
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->value(), uint64_t{kThreads} * kEach);
  Histogram* even = hf->With({"even"});
  EXPECT_EQ(even->count(), uint64_t{2} * kEach);
  EXPECT_THAT(even->BucketCounts(), ElementsAre(kEach, kEach));
  EXPECT_DOUBLE_EQ(even->sum(), 2 * (kEach / 2 * 0.25 + kEach / 2 * 1.0));
  EXPECT_THAT(r.Expose(), HasSubstr("ps_test_seconds_count{t=\"odd\"} 40000\n"));
}

}  // namespace
}  // namespace ps::metrics
