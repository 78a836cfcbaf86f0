#include "scheduler/job_tracker.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/protocol.h"

namespace ps {

namespace {

double UnixSeconds(absl::Time t) {
  return absl::ToDoubleSeconds(t - absl::UnixEpoch());
}

const char* ShardStateName(ShardLedger::State state) {
  switch (state) {
    case ShardLedger::State::kUnstarted:
      return "UNSTARTED";
    case ShardLedger::State::kActive:
      return "ACTIVE";
    case ShardLedger::State::kOrphaned:
      return "ORPHANED";
    case ShardLedger::State::kDone:
      return "DONE";
  }
  return "UNKNOWN";
}

// A counter of a report that went back (it cannot, from one process) is
// taken as starting again from zero.
uint64_t Delta(uint64_t now, uint64_t before) {
  return now >= before ? now - before : now;
}

double Delta(double now, double before) {
  if (!std::isfinite(now) || !std::isfinite(before)) return 0;
  return now >= before ? now - before : std::max(0.0, now);
}

// Batches per epoch beyond this are taken as this many, so that epochs
// times batches cannot overflow.
constexpr uint64_t kMaxBatches = uint64_t{1} << 40;

// The longest time left shown: beyond it the pace is too slow to say.
constexpr double kMaxEtaSeconds = 366.0 * 24 * 3600;

}  // namespace

void TimeSeries::Add(double t, double v) {
  if (!std::isfinite(t) || !std::isfinite(v)) return;
  if (t_.size() >= kMaxPoints) {
    // Merge the older half in pairs; the newer half stays as it was.
    const size_t half = t_.size() / 2;
    size_t out = 0;
    for (size_t i = 0; i + 1 < half; i += 2, ++out) {
      t_[out] = (t_[i] + t_[i + 1]) / 2;
      v_[out] = (v_[i] + v_[i + 1]) / 2;
    }
    for (size_t i = out * 2; i < t_.size(); ++i, ++out) {
      t_[out] = t_[i];
      v_[out] = v_[i];
    }
    t_.resize(out);
    v_.resize(out);
  }
  t_.push_back(t);
  v_.push_back(v);
}

JobTracker::JobTracker(const TrainingConfig& training, uint32_t num_shards)
    : epochs_(std::max<uint32_t>(training.epochs(), 1)),
      max_steps_(training.max_steps()),
      batch_size_(training.batch_size()),
      shard_batches_(num_shards, 0) {}

void JobTracker::OnWorkerReport(uint64_t node, uint32_t rank, int shard,
                                const TrainingReport& report, absl::Time now) {
  WorkerCurves& w = workers_[node];
  w.rank = rank;
  examples_ += Delta(report.examples(), w.last.examples());
  if (shard >= 0 && static_cast<size_t>(shard) < shard_batches_.size() &&
      report.shard_batches() > 0) {
    shard_batches_[shard] = std::min(report.shard_batches(), kMaxBatches);
  }
  int seen = 0;
  for (const MetricPoint& m : report.metrics()) {
    if (++seen > kMaxMetricsPerWorker) break;
    if (!ValidMetricName(m.name()) || !std::isfinite(m.value())) continue;
    uint64_t& seq = w.metric_seq[m.name()];
    if (m.seq() <= seq) continue;
    seq = m.seq();
    AddMetric(m, rank, now);
  }
  w.last = report;
  w.last.clear_metrics();
}

void JobTracker::OnServerReport(uint64_t node, uint32_t rank,
                                const ServingReport& report) {
  ServerCurves& s = servers_[node];
  s.rank = rank;
  s.last = report;
}

void JobTracker::Forget(uint64_t node) {
  workers_.erase(node);
  servers_.erase(node);
}

void JobTracker::Started(absl::Time now) {
  if (started_ == absl::InfinitePast()) started_ = now;
}

void JobTracker::AddPoint(const std::string& name, double t, double v) {
  auto it = series_.find(name);
  if (it == series_.end()) {
    if (series_.size() >= kMaxSeries) return;
    it = series_.emplace(name, TimeSeries()).first;
  }
  it->second.Add(t, v);
}

void JobTracker::AddMetric(const MetricPoint& point, uint32_t rank,
                           absl::Time now) {
  MetricPoint& newest = metrics_[point.name()];
  newest = point;
  newest.set_unix_s(UnixSeconds(now));
  newest.set_rank(rank);
  AddPoint(absl::StrCat("metric/", point.name()), newest.unix_s(),
           point.value());
}

void JobTracker::Sample(const ShardLedger& shards, absl::Time now) {
  const double t = UnixSeconds(now);
  const double dt = last_sample_ == absl::InfinitePast()
                        ? 0
                        : absl::ToDoubleSeconds(now - last_sample_);
  last_sample_ = now;
  uint64_t examples = 0;
  for (auto& [node, w] : workers_) {
    if (w.sampled) {
      examples += Delta(w.last.examples(), w.at.examples());
      const uint64_t n = Delta(w.last.loss_examples(), w.at.loss_examples());
      const double loss = Delta(w.last.loss_sum(), w.at.loss_sum());
      if (n > 0 && std::isfinite(loss / n)) {
        // Smoothed over a few samples: one window's mean is noisy.
        const double mean = loss / n;
        w.loss = w.loss.has_value() ? 0.7 * *w.loss + 0.3 * mean : mean;
        AddPoint(absl::StrCat("loss/worker/", w.rank), t, *w.loss);
      }
      if (dt > 0) {
        const double wait =
            Delta(w.last.wait_seconds(), w.at.wait_seconds()) / dt;
        AddPoint(absl::StrCat("wait/worker/", w.rank), t, std::min(wait, 1e3));
      }
    }
    w.at = w.last;
    w.sampled = true;
  }
  if (dt > 0) AddPoint("examples_per_s", t, examples / dt);
  for (auto& [node, s] : servers_) {
    if (s.sampled && dt > 0) {
      s.keys_per_second = Delta(s.last.keys(), s.at.keys()) / dt;
      AddPoint(absl::StrCat("keys_per_s/server/", s.rank), t,
               s.keys_per_second);
    }
    AddPoint(absl::StrCat("bytes/server/", s.rank), t,
             static_cast<double>(s.last.bytes()));
    s.at = s.last;
    s.sampled = true;
  }
  const Totals totals = SumSteps(shards);
  AddPoint("progress", t,
           std::max(shown_progress_,
                    totals.total > 0
                        ? std::min(1.0, static_cast<double>(totals.done) /
                                            totals.total)
                        : 0.0));
  // The pace window starts at the last sample before training moved, so
  // the wait for the job to start does not count as a slow pace.
  if (pace_.size() == 1 && pace_.front().steps == totals.done) pace_.clear();
  PaceSample sample{now, totals.done, examples_, {}};
  for (uint32_t s = 0; s < shards.size(); ++s) {
    uint64_t done = 0;
    uint64_t total = 0;
    ShardSteps(shards, s, &done, &total);
    sample.shard_steps.push_back(done);
  }
  pace_.push_back(std::move(sample));
  while (pace_.size() > 2 && now - pace_[1].time >= kRateWindow)
    pace_.pop_front();
}

void JobTracker::ShardSteps(const ShardLedger& shards, uint32_t s,
                            uint64_t* done, uint64_t* total) const {
  const ShardLedger::Shard& shard = shards.shard(s);
  const uint64_t batches = shard_batches_[s];
  const DataPosition& at = shard.position;
  *total = 0;
  uint64_t trained = at.batch();
  if (batches > 0) {
    *total = epochs_ * batches;
    trained = std::min(at.epoch(), uint64_t{epochs_}) * batches +
              std::min(at.batch(), batches);
  }
  if (max_steps_ > 0) {
    *total = *total == 0 ? max_steps_ : std::min(*total, max_steps_);
  }
  *done = std::min(trained, *total);
  if (shard.state == ShardLedger::State::kDone || at.done()) *done = *total;
}

JobTracker::Totals JobTracker::SumSteps(const ShardLedger& shards) const {
  Totals totals;
  uint64_t known = 0;
  uint64_t known_total = 0;
  for (uint32_t s = 0; s < shards.size(); ++s) {
    uint64_t done = 0;
    uint64_t total = 0;
    ShardSteps(shards, s, &done, &total);
    if (total == 0) continue;
    ++known;
    known_total += total;
    totals.done += done;
  }
  totals.known = known == shards.size();
  if (known == 0) {
    totals.known = shards.size() == 0;
    return totals;
  }
  // A shard whose size is unknown yet counts as the mean of those known.
  const uint64_t mean = known_total / known;
  totals.total = known_total;
  for (uint32_t s = 0; s < shards.size(); ++s) {
    uint64_t done = 0;
    uint64_t total = 0;
    ShardSteps(shards, s, &done, &total);
    if (total != 0) continue;
    totals.total += mean;
    if (shards.shard(s).state == ShardLedger::State::kDone) totals.done += mean;
  }
  return totals;
}

std::optional<double> JobTracker::ShardRate(uint32_t s) const {
  if (pace_.size() < 2) return std::nullopt;
  const PaceSample& first = pace_.front();
  const PaceSample& last = pace_.back();
  const double span = absl::ToDoubleSeconds(last.time - first.time);
  if (span < 1 || s >= first.shard_steps.size() ||
      s >= last.shard_steps.size()) {
    return std::nullopt;
  }
  return Delta(last.shard_steps[s], first.shard_steps[s]) / span;
}

JobProgress JobTracker::Progress(const ShardLedger& shards,
                                 const HolderOf& holder, absl::Time now) const {
  JobProgress p;
  const Totals totals = SumSteps(shards);
  double progress =
      totals.total > 0 ? static_cast<double>(totals.done) / totals.total : 0;
  const bool all_done = shards.size() > 0 && shards.AllDone();
  if (all_done) progress = 1;
  shown_progress_ = std::max(shown_progress_, std::clamp(progress, 0.0, 1.0));
  p.set_progress(shown_progress_);
  p.set_steps_done(totals.done);
  p.set_steps_total(totals.total);
  p.set_total_known(totals.known);
  p.set_examples(examples_);
  if (started_ != absl::InfinitePast()) {
    p.set_elapsed_s(std::max(0.0, absl::ToDoubleSeconds(now - started_)));
  }
  if (pace_.size() >= 2) {
    const double span =
        absl::ToDoubleSeconds(pace_.back().time - pace_.front().time);
    if (span >= 1) {
      p.set_steps_per_second(Delta(pace_.back().steps, pace_.front().steps) /
                             span);
      p.set_examples_per_second(
          Delta(pace_.back().examples, pace_.front().examples) / span);
    }
  }
  // The slowest shard still training, at its own pace.
  double slowest = 0;
  for (uint32_t s = 0; s < shards.size(); ++s) {
    const ShardLedger::Shard& shard = shards.shard(s);
    ShardProgress* sp = p.add_shards();
    sp->set_shard(s);
    sp->set_state(ShardStateName(shard.state));
    *sp->mutable_position() = shard.position;
    uint64_t done = 0;
    uint64_t total = 0;
    ShardSteps(shards, s, &done, &total);
    sp->set_steps_done(done);
    sp->set_steps_total(total);
    if (total > 0) sp->set_progress(static_cast<double>(done) / total);
    if (shard.state == ShardLedger::State::kDone) sp->set_progress(1);
    if (shard.state != ShardLedger::State::kActive) continue;
    // Its pace over the window; before the window is long enough, its
    // worker's pace over its last heartbeats.
    const std::optional<Holder> h =
        holder ? holder(shard.holder) : std::nullopt;
    if (h.has_value()) sp->set_worker_rank(h->rank);
    std::optional<double> rate = ShardRate(s);
    if (!rate.has_value() && h.has_value() && h->steps_per_second >= 0)
      rate = h->steps_per_second;
    if (rate.has_value()) {
      sp->set_steps_per_second(*rate);
      if (*rate > 0 && total > 0) {
        sp->set_eta_s(std::min((total - done) / *rate, kMaxEtaSeconds));
        slowest = std::max(slowest, sp->eta_s());
      }
    }
    auto w = workers_.find(shard.holder);
    if (w != workers_.end() && w->second.loss.has_value())
      sp->set_loss(*w->second.loss);
  }
  if (all_done) {
    p.set_eta_s(0);
  } else if (p.steps_per_second() > 0 && totals.total > 0) {
    const double left = (totals.total - std::min(totals.done, totals.total)) /
                        p.steps_per_second();
    p.set_eta_s(std::min(std::max(left, slowest), kMaxEtaSeconds));
  }
  for (const auto& [name, point] : metrics_) *p.add_metrics() = point;
  return p;
}

void JobTracker::FillReport(StatusReport* report) const {
  for (const auto& [node, s] : servers_) {
    ServerActivity* a = report->add_servers();
    a->set_rank(s.rank);
    a->set_keys_per_second(s.keys_per_second);
    a->set_bytes(s.last.bytes());
  }
  std::sort(report->mutable_servers()->begin(),
            report->mutable_servers()->end(),
            [](const ServerActivity& a, const ServerActivity& b) {
              return a.rank() < b.rank();
            });
  for (const auto& [name, series] : series_) {
    Series* out = report->add_series();
    out->set_name(name);
    out->mutable_t()->Add(series.t().begin(), series.t().end());
    out->mutable_v()->Add(series.v().begin(), series.v().end());
  }
}

void JobTracker::ToJournal(SchedulerJournal* journal) const {
  if (started_ != absl::InfinitePast())
    journal->set_started_unix_ms(absl::ToUnixMillis(started_));
  journal->set_examples(examples_);
  journal->set_progress_shown(shown_progress_);
  for (int s = 0; s < journal->shards_size(); ++s) {
    if (static_cast<size_t>(s) < shard_batches_.size())
      journal->mutable_shards(s)->set_shard_batches(shard_batches_[s]);
  }
  int kept = 0;
  for (const auto& [name, newest] : metrics_) {
    auto it = series_.find(absl::StrCat("metric/", name));
    if (it == series_.end()) continue;
    const TimeSeries& series = it->second;
    const size_t n = std::min<size_t>(
        series.size(),
        std::min(kJournalPointsPerMetric, kJournalPoints - kept));
    for (size_t i = series.size() - n; i < series.size(); ++i) {
      MetricPoint* point = journal->add_metrics();
      *point = newest;
      point->set_value(series.v()[i]);
      point->set_unix_s(series.t()[i]);
      ++kept;
    }
  }
}

void JobTracker::FromJournal(const SchedulerJournal& journal) {
  if (journal.started_unix_ms() > 0)
    started_ = absl::FromUnixMillis(journal.started_unix_ms());
  examples_ = journal.examples();
  if (std::isfinite(journal.progress_shown()))
    shown_progress_ = std::clamp(journal.progress_shown(), 0.0, 1.0);
  for (int s = 0; s < journal.shards_size(); ++s) {
    if (static_cast<size_t>(s) < shard_batches_.size())
      shard_batches_[s] =
          std::min(journal.shards(s).shard_batches(), kMaxBatches);
  }
  for (const MetricPoint& point : journal.metrics()) {
    if (!ValidMetricName(point.name()) || !std::isfinite(point.value()) ||
        !std::isfinite(point.unix_s())) {
      continue;
    }
    metrics_[point.name()] = point;
    AddPoint(absl::StrCat("metric/", point.name()), point.unix_s(),
             point.value());
  }
}

}  // namespace ps
