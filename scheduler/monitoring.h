// What the scheduler shows operators over HTTP (common/http_endpoint.h):
// its Prometheus metrics and the /status page of the cluster.
//
// Everything is computed from the ClusterState when asked (a scrape, a
// page load), from one snapshot taken at most kSnapshotMaxAge earlier, so
// monitoring costs the scheduler nothing between requests.
//
// Metrics (all gauges or counters computed at scrape time):
//   ps_scheduler_nodes{role,state}                 nodes ever registered
//   ps_scheduler_view_epoch                         the cluster view's epoch
//   ps_scheduler_job_state{state}                   1 for the current state
//   ps_scheduler_consistency_mode{mode}             1 for the mode in force
//   ps_scheduler_ssp_staleness                      SSP's bound (0 otherwise)
//   ps_scheduler_barriers_completed_total           distinct barriers released
//   ps_scheduler_heartbeats_received_total          heartbeats accepted
//   ps_scheduler_nodes_declared_dead_total          failures detected
//   ps_scheduler_worker_clock{rank}                 live training workers' clocks
//   ps_scheduler_worker_clock_spread                fastest minus slowest of them
//   ps_scheduler_worker_steps_per_second{rank}      their pace over recent heartbeats
//   ps_scheduler_node_heartbeat_age_seconds{role,rank}  live nodes' silence
//   ps_scheduler_last_checkpoint_clock              newest committed checkpoint
//
// Thread-safe. The ClusterState is not owned and must outlive this object,
// and this object must outlive every Expose() of a registry it was added
// to (destroy the HTTP endpoint first).
#ifndef PS_SCHEDULER_MONITORING_H_
#define PS_SCHEDULER_MONITORING_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/cluster_state.h"

namespace ps {

// The cluster at one moment, as the status page and metrics show it.
struct ClusterSnapshot {
  std::string job_name;
  // training.batch_size: a worker's examples/s is its steps/s times this.
  uint32_t batch_size = 0;
  GetStatusResponse status;
  ClusterState::Monitoring monitoring;
  // Empty, or why the scheduler takes no changes (ClusterState::JournalError).
  std::string journal_error;
  absl::Time taken;
};

// The HTML page: job state, mode, epoch, counters and a table of nodes
// (name "server/R" or "worker/R", role, rank, endpoint, host and pid,
// state, seconds since the last heartbeat, and for workers the clock and
// examples/s), then, when servers have disk tiers, what their tiers hold
// (rows in RAM and on disk, disk and tier RAM bytes, rows read from disk,
// requests that waited for it), all inside <div id="tables">. Around them
// the live parts of scheduler/status_page_charts.h: the progress section
// before, the curves after, which /static/status.js fills from
// /status.json, replacing #tables from a fresh page every 2 s (without
// JavaScript the page reloads itself every 2 s). Needs nothing from
// another host. Every string from the view is escaped.
std::string RenderStatusPage(const ClusterSnapshot& snapshot);

// `s` with & < > " ' replaced by character references.
std::string HtmlEscape(absl::string_view s);

class SchedulerMonitor {
 public:
  // A snapshot is reused for requests arriving within this long of it.
  static constexpr absl::Duration kSnapshotMaxAge = absl::Milliseconds(100);

  SchedulerMonitor(const ClusterState* state, const JobConfig& config,
                   Clock* clock = Clock::Real());

  ClusterSnapshot Snapshot() const;
  std::string StatusPage() const { return RenderStatusPage(Snapshot()); }
  // Adds the metrics listed in the file comment to `registry`.
  void RegisterMetrics(metrics::Registry* registry) const;

 private:
  const ClusterState* const state_;
  const std::string job_name_;
  const uint32_t batch_size_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  mutable ClusterSnapshot cached_ ABSL_GUARDED_BY(mu_);
  mutable bool has_cached_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ps

#endif  // PS_SCHEDULER_MONITORING_H_
