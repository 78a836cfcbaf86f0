#include "scheduler/job_tracker.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace ps {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

TrainingConfig Training(uint32_t epochs, uint64_t max_steps = 0) {
  TrainingConfig t;
  t.set_epochs(epochs);
  t.set_max_steps(max_steps);
  t.set_batch_size(10);
  return t;
}

DataPosition At(uint32_t shard, uint64_t epoch, uint64_t batch) {
  DataPosition p;
  p.set_shard(shard);
  p.set_epoch(epoch);
  p.set_batch(batch);
  return p;
}

TrainingReport Trained(uint64_t steps, uint64_t batches, double loss = 0.5) {
  TrainingReport r;
  r.set_steps(steps);
  r.set_examples(steps * 10);
  r.set_loss_sum(loss * steps * 10);
  r.set_loss_examples(steps * 10);
  r.set_shard_batches(batches);
  return r;
}

const Series* Find(const StatusReport& report, const std::string& name) {
  for (const Series& s : report.series())
    if (s.name() == name) return &s;
  return nullptr;
}

TEST(TimeSeriesTest, StaysBoundedAndKeepsTheNewestPointsExact) {
  TimeSeries series;
  for (int i = 0; i < 10000; ++i) series.Add(i, i * 2.0);
  EXPECT_LE(series.size(), TimeSeries::kMaxPoints);
  EXPECT_GT(series.size(), TimeSeries::kMaxPoints / 2);
  EXPECT_EQ(series.t().back(), 9999);
  EXPECT_EQ(series.v().back(), 19998);
  // Merged points average their pairs, so the shape holds: v = 2t.
  for (size_t i = 0; i < series.size(); ++i)
    EXPECT_DOUBLE_EQ(series.v()[i], 2 * series.t()[i]);
  for (size_t i = 1; i < series.size(); ++i)
    EXPECT_LT(series.t()[i - 1], series.t()[i]);
  series.Add(std::nan(""), 1);
  series.Add(1e9, std::numeric_limits<double>::infinity());
  EXPECT_EQ(series.t().back(), 9999);
}

TEST(JobTrackerTest, ProgressCountsEveryShardsPositionAgainstItsSize) {
  ShardLedger shards(2, /*reassign=*/true);
  JobTracker tracker(Training(/*epochs=*/2), 2);
  shards.Assign(0, 11);
  shards.Assign(1, 12);
  // Sizes unknown: nothing to say yet.
  JobProgress p = tracker.Progress(shards, nullptr, kT0);
  EXPECT_EQ(p.progress(), 0);
  EXPECT_FALSE(p.total_known());
  EXPECT_FALSE(p.has_eta_s());
  // Shard 0 has 50 batches an epoch, 2 epochs; shard 1 is not known yet
  // and counts as the same size.
  tracker.OnWorkerReport(11, 0, 0, Trained(0, 50), kT0);
  shards.Report(11, At(0, 1, 25));
  p = tracker.Progress(shards, nullptr, kT0);
  EXPECT_EQ(p.steps_done(), 75u);
  EXPECT_EQ(p.steps_total(), 200u);
  EXPECT_FALSE(p.total_known());
  EXPECT_DOUBLE_EQ(p.progress(), 0.375);
  tracker.OnWorkerReport(12, 1, 1, Trained(0, 30), kT0);
  shards.Report(12, At(1, 0, 30));
  p = tracker.Progress(shards, nullptr, kT0);
  EXPECT_TRUE(p.total_known());
  EXPECT_EQ(p.steps_total(), 160u);
  EXPECT_EQ(p.steps_done(), 105u);
  ASSERT_EQ(p.shards_size(), 2);
  EXPECT_EQ(p.shards(1).state(), "ACTIVE");
  EXPECT_DOUBLE_EQ(p.shards(1).progress(), 0.5);
  shards.Finish(11, [] {
    DataPosition d = At(0, 2, 0);
    d.set_done(true);
    return d;
  }());
  shards.Finish(12, [] {
    DataPosition d = At(1, 2, 0);
    d.set_done(true);
    return d;
  }());
  p = tracker.Progress(shards, nullptr, kT0);
  EXPECT_EQ(p.progress(), 1);
  EXPECT_EQ(p.eta_s(), 0);
}

TEST(JobTrackerTest, MaxStepsCapsAShardsTotal) {
  ShardLedger shards(1, true);
  JobTracker tracker(Training(3, /*max_steps=*/40), 1);
  shards.Assign(0, 1);
  // Unknown size: the cap alone is the total.
  shards.Report(1, At(0, 0, 10));
  EXPECT_DOUBLE_EQ(tracker.Progress(shards, nullptr, kT0).progress(), 0.25);
  tracker.OnWorkerReport(1, 0, 0, Trained(10, 100), kT0);
  JobProgress p = tracker.Progress(shards, nullptr, kT0);
  EXPECT_EQ(p.steps_total(), 40u);
  EXPECT_TRUE(p.total_known());
}

TEST(JobTrackerTest, ProgressNeverGoesBack) {
  ShardLedger shards(1, true);
  JobTracker tracker(Training(1), 1);
  shards.Assign(0, 1);
  tracker.OnWorkerReport(1, 0, 0, Trained(0, 100), kT0);
  shards.Report(1, At(0, 0, 60));
  EXPECT_DOUBLE_EQ(tracker.Progress(shards, nullptr, kT0).progress(), 0.6);
  // The shard's size grew (an estimate from bytes was refined).
  tracker.OnWorkerReport(1, 0, 0, Trained(0, 200), kT0);
  EXPECT_DOUBLE_EQ(tracker.Progress(shards, nullptr, kT0).progress(), 0.6);
  shards.Report(1, At(0, 0, 150));
  EXPECT_DOUBLE_EQ(tracker.Progress(shards, nullptr, kT0).progress(), 0.75);
}

TEST(JobTrackerTest, EtaFollowsThePaceOverTheRecentWindowOnly) {
  ShardLedger shards(1, true);
  JobTracker tracker(Training(1), 1);
  shards.Assign(0, 1);
  tracker.OnWorkerReport(1, 0, 0, Trained(0, 1000), kT0);
  // Ten seconds waiting for the job to start are not a slow pace.
  absl::Time t = kT0;
  for (int i = 0; i < 10; ++i) {
    if (i > 0) t += absl::Seconds(1);
    tracker.Sample(shards, t);
  }
  EXPECT_FALSE(tracker.Progress(shards, nullptr, t).has_eta_s());
  // Then 10 steps a second.
  uint64_t batch = 0;
  for (int i = 0; i < 20; ++i) {
    t += absl::Seconds(1);
    batch += 10;
    shards.Report(1, At(0, 0, batch));
    tracker.Sample(shards, t);
  }
  JobProgress p = tracker.Progress(shards, nullptr, t);
  EXPECT_NEAR(p.steps_per_second(), 10, 1e-9);
  ASSERT_TRUE(p.has_eta_s());
  EXPECT_NEAR(p.eta_s(), 80, 1e-6);
  // A stall: the pace over the window falls and the time left grows,
  // but stays finite and positive.
  for (int i = 0; i < 15; ++i) {
    t += absl::Seconds(1);
    tracker.Sample(shards, t);
  }
  p = tracker.Progress(shards, nullptr, t);
  ASSERT_TRUE(p.has_eta_s());
  EXPECT_GT(p.eta_s(), 80);
  EXPECT_TRUE(std::isfinite(p.eta_s()));
  // Once the whole window is stalled there is no pace to go by.
  for (int i = 0; i < 40; ++i) {
    t += absl::Seconds(1);
    tracker.Sample(shards, t);
  }
  p = tracker.Progress(shards, nullptr, t);
  EXPECT_FALSE(p.has_eta_s());
  EXPECT_EQ(p.steps_per_second(), 0);
}

TEST(JobTrackerTest, TheSlowestShardBoundsTheTimeLeft) {
  ShardLedger shards(2, true);
  JobTracker tracker(Training(1), 2);
  shards.Assign(0, 1);
  shards.Assign(1, 2);
  tracker.OnWorkerReport(1, 0, 0, Trained(0, 1000), kT0);
  tracker.OnWorkerReport(2, 1, 1, Trained(0, 1000), kT0);
  absl::Time t = kT0;
  tracker.Sample(shards, t);
  // Shard 0 at 30 steps/s, shard 1 at 10: 40 a second in all.
  for (int i = 1; i <= 10; ++i) {
    t += absl::Seconds(1);
    shards.Report(1, At(0, 0, 30 * i));
    shards.Report(2, At(1, 0, 10 * i));
    tracker.Sample(shards, t);
  }
  const JobProgress p = tracker.Progress(shards, nullptr, t);
  // 1600 steps left at 40/s would be 40 s; shard 1 alone needs 90 s.
  ASSERT_TRUE(p.has_eta_s());
  EXPECT_NEAR(p.eta_s(), 90, 1e-6);
  EXPECT_NEAR(p.shards(0).eta_s(), 700.0 / 30, 1e-6);
  EXPECT_NEAR(p.shards(1).steps_per_second(), 10, 1e-9);
}

TEST(JobTrackerTest, CurvesComeFromDifferencesOfReports) {
  ShardLedger shards(1, true);
  JobTracker tracker(Training(1), 1);
  shards.Assign(0, 1);
  absl::Time t = kT0;
  tracker.OnWorkerReport(1, 0, 0, Trained(0, 100), t);
  ServingReport serving;
  serving.set_keys(1000);
  serving.set_bytes(4096);
  tracker.OnServerReport(2, 0, serving);
  tracker.Sample(shards, t);
  t += absl::Seconds(2);
  TrainingReport r = Trained(20, 100, /*loss=*/0.25);
  r.set_wait_seconds(1);
  MetricPoint* auc = r.add_metrics();
  auc->set_name("test_auc");
  auc->set_value(0.75);
  auc->set_seq(1);
  MetricPoint* bad = r.add_metrics();
  bad->set_name("bad name<script>");
  bad->set_value(1);
  bad->set_seq(1);
  tracker.OnWorkerReport(1, 0, 0, r, t);
  serving.set_keys(5000);
  tracker.OnServerReport(2, 0, serving);
  tracker.Sample(shards, t);
  // The same metric again (same seq): no new point.
  tracker.OnWorkerReport(1, 0, 0, r, t + absl::Seconds(1));
  StatusReport report;
  tracker.FillReport(&report);
  const Series* loss = Find(report, "loss/worker/0");
  ASSERT_NE(loss, nullptr);
  ASSERT_EQ(loss->v_size(), 1);
  EXPECT_DOUBLE_EQ(loss->v(0), 0.25);
  const Series* examples = Find(report, "examples_per_s");
  ASSERT_NE(examples, nullptr);
  EXPECT_DOUBLE_EQ(examples->v(examples->v_size() - 1), 100);
  const Series* wait = Find(report, "wait/worker/0");
  ASSERT_NE(wait, nullptr);
  EXPECT_DOUBLE_EQ(wait->v(wait->v_size() - 1), 0.5);
  const Series* keys = Find(report, "keys_per_s/server/0");
  ASSERT_NE(keys, nullptr);
  EXPECT_DOUBLE_EQ(keys->v(0), 2000);
  const Series* metric = Find(report, "metric/test_auc");
  ASSERT_NE(metric, nullptr);
  EXPECT_EQ(metric->v_size(), 1);
  EXPECT_EQ(Find(report, "metric/bad name<script>"), nullptr);
  ASSERT_EQ(report.servers_size(), 1);
  EXPECT_EQ(report.servers(0).bytes(), 4096u);
  JobProgress p = tracker.Progress(shards, nullptr, t);
  ASSERT_EQ(p.metrics_size(), 1);
  EXPECT_EQ(p.metrics(0).name(), "test_auc");
  EXPECT_EQ(p.examples(), 200u);
}

TEST(JobTrackerTest, NonFiniteAndBackwardReportsLeaveNoMark) {
  ShardLedger shards(1, true);
  JobTracker tracker(Training(1), 1);
  absl::Time t = kT0;
  tracker.OnWorkerReport(1, 0, 0, Trained(10, 100), t);
  tracker.Sample(shards, t);
  TrainingReport r = Trained(20, 100);
  r.set_loss_sum(std::numeric_limits<double>::infinity());
  r.set_wait_seconds(std::nan(""));
  t += absl::Seconds(1);
  tracker.OnWorkerReport(1, 0, 0, r, t);
  tracker.Sample(shards, t);
  StatusReport report;
  tracker.FillReport(&report);
  for (const Series& s : report.series()) {
    for (double v : s.v()) {
      EXPECT_TRUE(std::isfinite(v)) << s.name();
      EXPECT_GE(v, 0) << s.name();
    }
  }
}

TEST(JobTrackerTest, TheJournalKeepsSizesStartExamplesAndMetrics) {
  ShardLedger shards(2, true);
  JobTracker tracker(Training(1), 2);
  tracker.Started(kT0);
  TrainingReport r = Trained(10, 100);
  for (int i = 1; i <= 100; ++i) {
    r.clear_metrics();
    MetricPoint* m = r.add_metrics();
    m->set_name("test_auc");
    m->set_value(0.5 + i / 1000.0);
    m->set_seq(i);
    tracker.OnWorkerReport(1, 0, 1, r, kT0 + absl::Seconds(i));
  }
  shards.Assign(0, 1);
  tracker.OnWorkerReport(1, 0, 0, Trained(10, 100), kT0);
  shards.Report(1, At(0, 0, 50));
  EXPECT_DOUBLE_EQ(tracker.Progress(shards, nullptr, kT0).progress(), 0.25);
  SchedulerJournal journal;
  shards.ToJournal(&journal);
  tracker.ToJournal(&journal);
  // The journal's positions may be older than the progress shown.
  journal.mutable_shards(0)->mutable_position()->set_batch(10);
  shards.FromJournal(journal);
  EXPECT_EQ(journal.metrics_size(), JobTracker::kJournalPointsPerMetric);
  JobTracker restored(Training(1), 2);
  restored.FromJournal(journal);
  EXPECT_EQ(restored.shard_batches(1), 100u);
  EXPECT_EQ(restored.shard_batches(0), 100u);
  JobProgress p = restored.Progress(shards, nullptr, kT0 + absl::Seconds(200));
  EXPECT_DOUBLE_EQ(p.progress(), 0.25) << "progress went back";
  EXPECT_DOUBLE_EQ(p.elapsed_s(), 200);
  EXPECT_EQ(p.examples(), 100u);
  ASSERT_EQ(p.metrics_size(), 1);
  EXPECT_DOUBLE_EQ(p.metrics(0).value(), 0.6);
  StatusReport report;
  restored.FillReport(&report);
  const Series* metric = Find(report, "metric/test_auc");
  ASSERT_NE(metric, nullptr);
  EXPECT_EQ(metric->v_size(), JobTracker::kJournalPointsPerMetric);
}

}  // namespace
}  // namespace ps
