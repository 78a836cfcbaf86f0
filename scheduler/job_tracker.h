// Where a training job stands, for people watching it: its progress and
// time left, and the curves of the /status page (training loss, examples/s,
// time waited for pulls, servers' keys/s and bytes, evaluation metrics).
//
// Progress is counted in steps (batches) per data shard: a shard's total is
// training.epochs times the batches in an epoch of it, which its worker
// reports (TrainingReport.shard_batches), capped at training.max_steps;
// what is done comes from the shard ledger's positions. Paces are
// measured over the last kRateWindow of samples, so the time left follows
// what the cluster does now: it grows when a worker is lost or the job
// stalls, and shrinks again once a replacement trains. The job's time left
// is the longer of the steps left at the job's pace and the slowest
// shard's own time left at its pace: workers that run at different paces
// (the evaluating one, a slower machine) end the job with the slowest.
//
// A value type with no clock of its own: callers pass the time. Not
// thread-safe; ClusterState keeps one under its mutex. Every report is
// checked here (counters that go back, non-finite values and bad metric
// names are ignored), so nothing a node sends can make a curve or an
// estimate negative, non-finite or unbounded. Memory is bounded: at most
// kMaxSeries series of at most kMaxPoints points each.
#ifndef PS_SCHEDULER_JOB_TRACKER_H_
#define PS_SCHEDULER_JOB_TRACKER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "proto/journal.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/shard_ledger.h"

namespace ps {

// A bounded time series: once it holds kMaxPoints points, the older half is
// merged in pairs (time and value averaged), so old history keeps its shape
// at a coarser grain and the newest points stay exact.
class TimeSeries {
 public:
  static constexpr size_t kMaxPoints = 512;

  void Add(double t, double v);
  size_t size() const { return t_.size(); }
  const std::vector<double>& t() const { return t_; }
  const std::vector<double>& v() const { return v_; }

 private:
  std::vector<double> t_;
  std::vector<double> v_;
};

class JobTracker {
 public:
  // The job's pace (and so its time left) is measured over this window.
  static constexpr absl::Duration kRateWindow = absl::Seconds(30);
  static constexpr size_t kMaxSeries = 512;
  // Metric points the journal keeps, per name and in all.
  static constexpr int kJournalPointsPerMetric = 64;
  static constexpr int kJournalPoints = 512;

  // `num_shards` data shards (cluster.num_workers).
  JobTracker(const TrainingConfig& training, uint32_t num_shards);

  // A heartbeat of worker node `node` (rank `rank`), which trains shard
  // `shard` (-1: none), reported `report` at `now`.
  void OnWorkerReport(uint64_t node, uint32_t rank, int shard,
                      const TrainingReport& report, absl::Time now);
  // A heartbeat of server node `node` (rank `rank`).
  void OnServerReport(uint64_t node, uint32_t rank,
                      const ServingReport& report);
  // Node `node` is gone (died, left): its curves end.
  void Forget(uint64_t node);
  // The job started running at `now` (kept if it had already).
  void Started(absl::Time now);

  // What a shard's holder looks like to the progress computation.
  struct Holder {
    uint32_t rank = 0;
    // Steps per second; negative when not known.
    double steps_per_second = -1;
  };
  using HolderOf = std::function<std::optional<Holder>(uint64_t node)>;

  // About once a second: records a point of every curve and of the job's
  // pace, from what was reported since the previous call.
  void Sample(const ShardLedger& shards, absl::Time now);

  // The job's progress now (GetStatusResponse.progress).
  JobProgress Progress(const ShardLedger& shards, const HolderOf& holder,
                       absl::Time now) const;

  // The curves and the servers' activity (StatusReport).
  void FillReport(StatusReport* report) const;

  // Batches per epoch of shard `s` (0: unknown).
  uint64_t shard_batches(uint32_t s) const { return shard_batches_.at(s); }

  // The journal keeps when the job started, the examples trained, the
  // progress shown (so it does not go back across a restart), each
  // shard's size and the newest metric points; FromJournal takes them back
  // (from a journal ClusterState validated; sizes beyond the shards are
  // ignored).
  void ToJournal(SchedulerJournal* journal) const;
  void FromJournal(const SchedulerJournal& journal);

 private:
  struct WorkerCurves {
    uint32_t rank = 0;
    TrainingReport last;         // the newest report
    TrainingReport at;           // the report at the previous Sample
    bool sampled = false;        // `at` is set
    std::optional<double> loss;  // smoothed
    absl::flat_hash_map<std::string, uint64_t> metric_seq;
  };
  struct ServerCurves {
    uint32_t rank = 0;
    ServingReport last;
    ServingReport at;
    bool sampled = false;
    double keys_per_second = 0;
  };
  struct PaceSample {
    absl::Time time;
    uint64_t steps = 0;
    uint64_t examples = 0;
    // Steps done of each shard.
    std::vector<uint64_t> shard_steps;
  };
  struct Totals {
    uint64_t done = 0;
    uint64_t total = 0;
    bool known = true;
  };

  // Steps done and to do of shard `s`; total 0 when unknown.
  void ShardSteps(const ShardLedger& shards, uint32_t s, uint64_t* done,
                  uint64_t* total) const;
  Totals SumSteps(const ShardLedger& shards) const;
  // Shard `s`'s pace over the pace window (steps per second); nullopt
  // while the window is too short to tell.
  std::optional<double> ShardRate(uint32_t s) const;
  void AddPoint(const std::string& name, double t, double v);
  void AddMetric(const MetricPoint& point, uint32_t rank, absl::Time now);

  const uint32_t epochs_;
  const uint64_t max_steps_;
  const uint32_t batch_size_;
  std::vector<uint64_t> shard_batches_;
  absl::Time started_ = absl::InfinitePast();
  uint64_t examples_ = 0;
  std::map<uint64_t, WorkerCurves> workers_;
  std::map<uint64_t, ServerCurves> servers_;
  std::map<std::string, TimeSeries> series_;
  // The newest point of each metric name.
  std::map<std::string, MetricPoint> metrics_;
  // Recent (time, steps done, examples) samples spanning kRateWindow.
  std::deque<PaceSample> pace_;
  absl::Time last_sample_ = absl::InfinitePast();
  // The largest progress shown so far: progress never goes back.
  mutable double shown_progress_ = 0;
};

}  // namespace ps

#endif  // PS_SCHEDULER_JOB_TRACKER_H_
