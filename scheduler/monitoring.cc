#include "scheduler/monitoring.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/protocol.h"
#include "scheduler/status_page_charts.h"

namespace ps {
namespace {

std::string Lower(absl::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

const char* RoleWord(Role r) {
  switch (r) {
    case SERVER:
      return "server";
    case WORKER:
      return "worker";
    default:
      return "unknown";
  }
}

const char* StateWord(NodeState s) {
  switch (s) {
    case ALIVE:
      return "alive";
    case LEFT:
      return "left";
    case DEAD:
      return "dead";
    default:
      return "unknown";
  }
}

std::string ModeText(const ConsistencyConfig& c) {
  const ConsistencyMode mode = c.mode() == CONSISTENCY_MODE_UNSPECIFIED ? ASYNC : c.mode();
  std::string text = ConsistencyMode_Name(mode);
  if (mode == SSP) absl::StrAppend(&text, " (staleness ", c.staleness(), ")");
  return text;
}

// Live workers still training: clock by rank (finished ones report
// kFinishedClock and are left out).
std::map<uint32_t, uint64_t> TrainingClocks(const GetStatusResponse& status) {
  std::map<uint32_t, uint64_t> clocks;
  for (const WorkerClock& wc : status.clocks()) {
    if (wc.clock() < kFinishedClock) clocks[wc.rank()] = wc.clock();
  }
  return clocks;
}

// The live node of `role` and `rank` in the view, if any.
const NodeInfo* LiveNode(const ClusterView& view, Role role, uint32_t rank) {
  for (const NodeInfo& n : view.nodes()) {
    if (n.role() == role && n.rank() == rank && n.state() == ALIVE) return &n;
  }
  return nullptr;
}

}  // namespace

std::string HtmlEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

// Slowest and fastest clock of `clocks` (which must not be empty).
std::pair<uint64_t, uint64_t> ClockBounds(
    const std::map<uint32_t, uint64_t>& clocks) {
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const auto& [rank, c] : clocks) {
    lo = std::min(lo, c);
    hi = std::max(hi, c);
  }
  return {lo, hi};
}

// The document head: title, auto-refresh and the page's style sheet.
void AppendPageHead(const std::string& job_name, const std::string& job_state,
                    std::string* html) {
  absl::StrAppend(
      html,
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n",
      StatusPageHeadLinks(), "<title>ps: ", HtmlEscape(job_name), " (",
      job_state, ")</title>\n",
      "<style>\n"
      "body{font-family:sans-serif;margin:24px;color:#222;background:#fff}\n"
      "h1{font-size:22px;margin:0 0 12px}h2{font-size:17px;margin:20px 0 6px}\n"
      "table{border-collapse:collapse}\n"
      "table.nodes th,table.nodes td{border:1px solid #ccc;padding:4px 10px;"
      "text-align:left;font-size:14px}\n"
      "table.nodes th{background:#eef1f5}\n"
      "table.nodes td.num{text-align:right;font-variant-numeric:tabular-nums}\n"
      "table.summary td{padding:2px 16px 2px 0;font-size:14px}\n"
      "table.summary td:first-child{color:#555}\n"
      ".alive{color:#17823b;font-weight:bold}.dead{color:#c62828;font-weight:"
      "bold}"
      ".left{color:#777}.draining{color:#b26a00;font-weight:bold}\n"
      ".state-RUNNING{color:#17823b}.state-STARTING{color:#b26a00}"
      ".state-FINISHED{color:#1f5fa8}.state-FAILED{color:#c62828}\n"
      "footer{margin-top:16px;color:#777;font-size:12px}\n"
      "</style></head>\n<body>\n");
}

// The heading and the job summary table (left open for the caller to close).
void AppendSummary(const ClusterSnapshot& snap, const std::string& job_state,
                   std::string* html) {
  const ClusterView& view = snap.status.view();
  const ClusterState::Monitoring& mon = snap.monitoring;
  std::map<std::pair<int, int>, int> counts;  // (role, state) -> nodes
  for (const NodeInfo& n : view.nodes()) ++counts[{n.role(), n.state()}];
  auto role_summary = [&](Role role) {
    return absl::StrCat(counts[{role, ALIVE}], " alive, ", counts[{role, LEFT}],
                        " left, ", counts[{role, DEAD}], " dead");
  };
  const std::map<uint32_t, uint64_t> training = TrainingClocks(snap.status);
  std::string clocks = "&mdash;";
  if (!training.empty()) {
    const auto [lo, hi] = ClockBounds(training);
    clocks = absl::StrCat(lo, " / ", hi);
  }
  absl::StrAppend(html, "<h1>Job ", HtmlEscape(snap.job_name),
                  ": <span class=\"state-", job_state, "\">", job_state,
                  "</span></h1>\n<table class=\"summary\">\n");
  auto row = [&](absl::string_view name, const std::string& value_html) {
    absl::StrAppend(html, "<tr><td>", name, "</td><td>", value_html,
                    "</td></tr>\n");
  };
  if (!view.failure().empty()) {
    row("Failure", absl::StrCat("<span class=\"dead\">", HtmlEscape(view.failure()),
                                "</span>"));
  }
  if (!snap.journal_error.empty()) {
    row("Journal", absl::StrCat("<span class=\"dead\">", HtmlEscape(snap.journal_error),
                                "</span>"));
  }
  row("Consistency", HtmlEscape(ModeText(view.consistency())));
  row("View epoch", absl::StrCat(view.epoch()));
  row("Scheduler restarts",
      view.scheduler_restarts() == 0
          ? std::string("none")
          : absl::StrCat(view.scheduler_restarts(), " (the newest took the job back at epoch ",
                         view.recovered_epoch(), " with ", view.recovered_nodes(),
                         " live nodes)"));
  row("Servers", role_summary(SERVER));
  row("Workers", role_summary(WORKER));
  row("Slowest / fastest clock", clocks);
  row("Slots", absl::StrCat(view.num_slots(),
                            view.recovering_slots_size() > 0
                                ? absl::StrCat(" (", view.recovering_slots_size(), " recovering)")
                                : ""));
  for (const SlotMove& m : view.moves()) {
    const double age =
        m.started_unix_micros() == 0
            ? 0
            : absl::ToDoubleSeconds(
                  snap.taken - absl::FromUnixMicros(m.started_unix_micros()));
    row(absl::StrCat("Slot move server ", m.source(), " &rarr; ", m.target()),
        absl::StrFormat(
            "%d slots, %s, %.1f s; %d rows (%.1f MB) copied", m.slots_size(),
            m.phase() == SlotMove::FENCING ? "fencing"
            : m.copied() ? "copied, the fence waits for a checkpoint"
                         : "copying",
            age, m.rows_copied(), m.bytes_copied() / 1e6));
  }
  row("Last checkpoint", view.last_checkpoint_clock() > 0
                             ? absl::StrCat("clock ", view.last_checkpoint_clock())
                             : std::string("none"));
  if (view.checkpoint_clock() > 0) {
    row("Checkpoint in progress", absl::StrCat("clock ", view.checkpoint_clock()));
  }
  row("Heartbeats received", absl::StrCat(mon.heartbeats));
  row("Barriers completed", absl::StrCat(mon.barriers_completed));
  row("Nodes declared dead", absl::StrCat(mon.nodes_declared_dead));
  if (mon.isolation_suspected) {
    row("Isolation",
        absl::StrFormat(
            "<span class=\"dead\">suspected for %.1f s</span>: most nodes are "
            "silent at once; none is declared dead while heartbeats may come "
            "back (cluster.isolation_hold_ms)",
            mon.isolation_suspected_seconds));
  }
  row("Suspected isolations", absl::StrCat(mon.isolation_suspicions));
  row("Scheduler stalls noticed", absl::StrCat(mon.stalls));
}

// One row of the nodes table. `worker_clocks` maps a worker rank to its
// last heartbeated clock.
std::string NodeRow(
    const NodeInfo& n, const ClusterSnapshot& snap,
    const std::map<uint32_t, const WorkerClock*>& worker_clocks) {
  const ClusterState::Monitoring& mon = snap.monitoring;
  const std::string role = RoleWord(n.role());
  const std::string state = StateWord(n.state());
  const bool alive = n.state() == ALIVE;
  std::string heartbeat = "&mdash;";
  std::string clock = "&mdash;";
  std::string rate = "&mdash;";
  auto activity = mon.nodes.find(n.node_id());
  if (alive && activity != mon.nodes.end()) {
    heartbeat = absl::StrFormat("%.1f s ago", activity->second.silent_seconds);
  }
  if (n.role() == WORKER && alive) {
    auto wc = worker_clocks.find(n.rank());
    if (wc != worker_clocks.end()) {
      if (wc->second->clock() >= kFinishedClock) {
        clock = "finished";
      } else {
        clock = absl::StrCat(wc->second->clock());
        if (activity != mon.nodes.end() &&
            activity->second.steps_per_second >= 0) {
          rate =
              absl::StrFormat("%.0f", activity->second.steps_per_second *
                                          static_cast<double>(snap.batch_size));
        }
      }
    }
  }
  std::string state_html =
      absl::StrCat("<span class=\"", state, "\">", state, "</span>");
  if (alive && n.draining()) {
    absl::StrAppend(&state_html, " <span class=\"draining\">draining</span>");
  }
  return absl::StrCat("<tr><td>", role, "/", n.rank(),
                      "</td><td class=\"num\">", n.node_id(), "</td><td>", role,
                      "</td><td class=\"num\">", n.rank(), "</td><td>",
                      n.data_endpoint().empty() ? std::string("&mdash;")
                                                : HtmlEscape(n.data_endpoint()),
                      "</td><td>", HtmlEscape(n.host()),
                      n.pid() > 0 ? absl::StrCat(" (", n.pid(), ")") : "",
                      "</td><td>", state_html, "</td><td class=\"num\">",
                      heartbeat, "</td><td class=\"num\">", clock,
                      "</td><td class=\"num\">", rate, "</td></tr>\n");
}

// The nodes table, from its heading to its closing tag.
void AppendNodesTable(const ClusterSnapshot& snap, std::string* html) {
  const ClusterView& view = snap.status.view();
  absl::StrAppend(
      html, "<h2>Nodes</h2>\n<table class=\"nodes\">\n",
      "<tr><th>Node</th><th>Id</th><th>Role</th><th>Rank</th><th>Endpoint</th>"
      "<th>Host (pid)</th><th>State</th><th>Last heartbeat</th><th>Clock</th>"
      "<th>Examples/s</th></tr>\n");
  std::map<uint32_t, const WorkerClock*> worker_clocks;
  for (const WorkerClock& wc : snap.status.clocks()) worker_clocks[wc.rank()] = &wc;
  for (const NodeInfo& n : view.nodes()) {
    absl::StrAppend(html, NodeRow(n, snap, worker_clocks));
  }
  if (view.nodes_size() == 0) {
    absl::StrAppend(
        html, "<tr><td colspan=\"10\">no node has registered yet</td></tr>\n");
  }
  absl::StrAppend(html, "</table>\n");
}

// The disk tiers' table: one row per live server that reported what its
// tiered tables hold; nothing when none did.
void AppendStorageTable(const ClusterSnapshot& snap, std::string* html) {
  std::map<uint32_t, const ServerStorage*> by_rank;
  for (const NodeInfo& n : snap.status.view().nodes()) {
    if (n.role() != SERVER || n.state() != ALIVE) continue;
    auto it = snap.monitoring.nodes.find(n.node_id());
    if (it != snap.monitoring.nodes.end() && it->second.has_storage)
      by_rank[n.rank()] = &it->second.storage;
  }
  if (by_rank.empty()) return;
  absl::StrAppend(
      html, "<h2>Disk tiers</h2>\n<table class=\"nodes tiers\">\n",
      "<tr><th>Server</th><th>Rows in RAM</th><th>Rows on disk</th>"
      "<th>On disk</th><th>Tier RAM</th><th>Rows read from disk</th>"
      "<th>Requests that waited for the disk</th></tr>\n");
  for (const auto& [rank, st] : by_rank) {
    const double cold_share =
        st->rows_in_ram() + st->cold_rows() == 0
            ? 0
            : 100.0 * st->cold_rows() / (st->rows_in_ram() + st->cold_rows());
    absl::StrAppend(
        html, "<tr><td>server/", rank, "</td><td class=\"num\">",
        st->rows_in_ram(), "</td><td class=\"num\">", st->cold_rows(),
        absl::StrFormat(" (%.0f%%)", cold_share), "</td><td class=\"num\">",
        absl::StrFormat("%.1f MB", st->disk_bytes() / 1e6),
        "</td><td class=\"num\">",
        absl::StrFormat("%.1f MB", st->tier_memory_bytes() / 1e6),
        "</td><td class=\"num\">", st->cold_reads(), "</td><td class=\"num\">",
        st->tier_waits(),
        absl::StrFormat(" (%.1f s waiting)", st->tier_wait_seconds()),
        "</td></tr>\n");
  }
  absl::StrAppend(html, "</table>\n");
}

}  // namespace

std::string RenderStatusPage(const ClusterSnapshot& snap) {
  const ClusterView& view = snap.status.view();
  const std::string job_state = JobState_Name(view.job_state()).empty()
                                    ? "UNKNOWN"
                                    : JobState_Name(view.job_state());
  std::string html;
  AppendPageHead(snap.job_name, job_state, &html);
  // status.js fills the progress and the curves, and replaces #tables from
  // a fresh page every 2 s.
  absl::StrAppend(&html, RenderProgressSection(), "<div id=\"tables\">\n");
  AppendSummary(snap, job_state, &html);
  absl::StrAppend(&html, "</table>\n");
  AppendNodesTable(snap, &html);
  AppendStorageTable(snap, &html);
  absl::StrAppend(
      &html, "<footer>Taken ",
      HtmlEscape(absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", snap.taken,
                                  absl::UTCTimeZone())),
      "; reloads every 2 s. Examples/s: steps/s over recent heartbeats &times; "
      "batch size ",
      snap.batch_size,
      ". Metrics: <a href=\"/metrics\">/metrics</a>.</footer>\n</div>\n",
      RenderChartsSection(), "</body></html>\n");
  return html;
}

SchedulerMonitor::SchedulerMonitor(const ClusterState* state, const JobConfig& config,
                                   Clock* clock)
    : state_(state),
      job_name_(config.name()),
      batch_size_(config.training().batch_size()),
      clock_(clock) {}

ClusterSnapshot SchedulerMonitor::Snapshot() const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  if (has_cached_ && now - cached_.taken < kSnapshotMaxAge && now >= cached_.taken) {
    return cached_;
  }
  ClusterSnapshot s;
  s.job_name = job_name_;
  s.batch_size = batch_size_;
  s.status = state_->Status();
  s.monitoring = state_->Monitor();
  s.journal_error = std::string(state_->JournalError().message());
  s.taken = now;
  cached_ = s;
  has_cached_ = true;
  return s;
}

namespace {

// Membership, job state and consistency gauges.
void RegisterJobMetrics(const SchedulerMonitor* monitor, metrics::Registry* r) {
  using metrics::Sample;
  using metrics::Type;
  r->AddCallbackFamily(
      "ps_scheduler_nodes",
      "Nodes that ever registered, by role and state (left and dead ones stay "
      "counted).",
      Type::kGauge, {"role", "state"}, [monitor] {
        std::map<std::pair<std::string, std::string>, int> counts;
        for (Role role : {SERVER, WORKER}) {
          for (NodeState state : {ALIVE, LEFT, DEAD}) {
            counts[{RoleWord(role), StateWord(state)}] = 0;
          }
        }
        const ClusterSnapshot s = monitor->Snapshot();
        for (const NodeInfo& n : s.status.view().nodes()) {
          ++counts[{RoleWord(n.role()), StateWord(n.state())}];
        }
        std::vector<Sample> out;
        for (const auto& [key, n] : counts) {
          out.push_back({{key.first, key.second}, double(n)});
        }
        return out;
      });
  r->AddCallback("ps_scheduler_view_epoch",
                 "Epoch of the cluster view; every membership or slot change "
                 "increments it.",
                 Type::kGauge, [monitor] {
                   return double(monitor->Snapshot().status.view().epoch());
                 });
  r->AddCallback(
      "ps_scheduler_restarts",
      "How many times a restarted scheduler took this job back from its "
      "journal.",
      Type::kGauge, [monitor] {
        return double(monitor->Snapshot().status.view().scheduler_restarts());
      });
  r->AddCallbackFamily(
      "ps_scheduler_job_state",
      "1 for the job's current state, 0 for the others.", Type::kGauge,
      {"state"}, [monitor] {
        const JobState current = monitor->Snapshot().status.view().job_state();
        std::vector<Sample> out;
        for (JobState s : {STARTING, RUNNING, FINISHED, FAILED}) {
          out.push_back({{Lower(JobState_Name(s))}, s == current ? 1.0 : 0.0});
        }
        return out;
      });
  r->AddCallbackFamily(
      "ps_scheduler_consistency_mode",
      "1 for the consistency mode in force, 0 for the others.", Type::kGauge,
      {"mode"}, [monitor] {
        ConsistencyMode current =
            monitor->Snapshot().status.view().consistency().mode();
        if (current == CONSISTENCY_MODE_UNSPECIFIED) current = ASYNC;
        std::vector<Sample> out;
        for (ConsistencyMode m : {ASYNC, BSP, SSP}) {
          out.push_back({{Lower(ConsistencyMode_Name(m))}, m == current ? 1.0 : 0.0});
        }
        return out;
      });
  r->AddCallback("ps_scheduler_ssp_staleness",
                 "The SSP staleness bound in force (0 unless the mode is SSP).",
                 Type::kGauge, [monitor] {
                   const ClusterSnapshot s = monitor->Snapshot();
                   const ConsistencyConfig& c = s.status.view().consistency();
                   return c.mode() == SSP ? double(c.staleness()) : 0.0;
                 });
}

// Counters of heartbeats, barriers and failures.
void RegisterEventCounters(const SchedulerMonitor* monitor,
                           metrics::Registry* r) {
  using metrics::Type;
  r->AddCallback(
      "ps_scheduler_barriers_completed_total",
      "Distinct barriers that released their workers.", Type::kCounter,
      [monitor] {
        return double(monitor->Snapshot().monitoring.barriers_completed);
      });
  r->AddCallback(
      "ps_scheduler_heartbeats_received_total",
      "Heartbeats accepted from live nodes.", Type::kCounter,
      [monitor] { return double(monitor->Snapshot().monitoring.heartbeats); });
  r->AddCallback(
      "ps_scheduler_journal_writes_total",
      "Journal writes (each a whole snapshot of the job's state).",
      Type::kCounter, [monitor] {
        return double(monitor->Snapshot().monitoring.journal_writes);
      });
  r->AddCallback(
      "ps_scheduler_journal_write_seconds_total",
      "Time spent writing the journal (snapshot, serialisation, write), "
      "during which the scheduler takes no other change.",
      Type::kCounter, [monitor] {
        return monitor->Snapshot().monitoring.journal_write_seconds;
      });
  r->AddCallback("ps_scheduler_journal_bytes",
                 "Size of the last journal written, in bytes.", Type::kGauge,
                 [monitor] {
                   return double(monitor->Snapshot().monitoring.journal_bytes);
                 });
  r->AddCallback(
      "ps_scheduler_nodes_declared_dead_total",
      "Nodes the failure detector declared dead (missed heartbeats).",
      Type::kCounter, [monitor] {
        return double(monitor->Snapshot().monitoring.nodes_declared_dead);
      });
  r->AddCallback(
      "ps_scheduler_isolation_suspected",
      "1 while the scheduler suspects it is cut off (most nodes silent at "
      "once) and declares no node dead (cluster.isolation_hold_ms), else 0.",
      Type::kGauge, [monitor] {
        return monitor->Snapshot().monitoring.isolation_suspected ? 1.0 : 0.0;
      });
  r->AddCallback(
      "ps_scheduler_isolation_suspicions_total",
      "Times most nodes went silent at once and the scheduler suspected its "
      "own isolation.",
      Type::kCounter, [monitor] {
        return double(monitor->Snapshot().monitoring.isolation_suspicions);
      });
  r->AddCallback(
      "ps_scheduler_stalls_total",
      "Times the scheduler noticed its own stall (its failure detector did not "
      "run for long) and gave every node a fresh heartbeat timeout.",
      Type::kCounter,
      [monitor] { return double(monitor->Snapshot().monitoring.stalls); });
}

// Per-worker clocks and pace, and per-node heartbeat age.
void RegisterPaceMetrics(const SchedulerMonitor* monitor,
                         metrics::Registry* r) {
  using metrics::Sample;
  using metrics::Type;
  r->AddCallbackFamily(
      "ps_scheduler_worker_clock",
      "Steps completed by each live worker still training, as last "
      "heartbeated.",
      Type::kGauge, {"rank"}, [monitor] {
        std::vector<Sample> out;
        for (const auto& [rank, c] :
             TrainingClocks(monitor->Snapshot().status)) {
          out.push_back({{absl::StrCat(rank)}, double(c)});
        }
        return out;
      });
  r->AddCallback(
      "ps_scheduler_worker_clock_spread",
      "Fastest minus slowest clock of the live workers still training.",
      Type::kGauge, [monitor] {
        const auto clocks = TrainingClocks(monitor->Snapshot().status);
        if (clocks.empty()) return 0.0;
        const auto [lo, hi] = ClockBounds(clocks);
        return double(hi - lo);
      });
  r->AddCallbackFamily(
      "ps_scheduler_worker_steps_per_second",
      "Each live worker's pace over its recent heartbeats (multiply by the "
      "batch size for examples/s).",
      Type::kGauge, {"rank"}, [monitor] {
        const ClusterSnapshot s = monitor->Snapshot();
        const auto clocks = TrainingClocks(s.status);
        std::vector<Sample> out;
        for (const auto& [rank, c] : clocks) {
          const NodeInfo* n = LiveNode(s.status.view(), WORKER, rank);
          if (n == nullptr) continue;
          auto a = s.monitoring.nodes.find(n->node_id());
          if (a == s.monitoring.nodes.end() || a->second.steps_per_second < 0) {
            continue;
          }
          out.push_back({{absl::StrCat(rank)}, a->second.steps_per_second});
        }
        return out;
      });
  r->AddCallbackFamily(
      "ps_scheduler_node_heartbeat_age_seconds",
      "Seconds since each live node's last heartbeat (or registration).",
      Type::kGauge, {"role", "rank"}, [monitor] {
        const ClusterSnapshot s = monitor->Snapshot();
        std::vector<Sample> out;
        for (const NodeInfo& n : s.status.view().nodes()) {
          if (n.state() != ALIVE) continue;
          auto a = s.monitoring.nodes.find(n.node_id());
          if (a == s.monitoring.nodes.end()) continue;
          out.push_back({{RoleWord(n.role()), absl::StrCat(n.rank())}, a->second.silent_seconds});
        }
        return out;
      });
}

}  // namespace

void SchedulerMonitor::RegisterMetrics(metrics::Registry* r) const {
  using metrics::Type;
  RegisterJobMetrics(this, r);
  RegisterEventCounters(this, r);
  RegisterPaceMetrics(this, r);
  r->AddCallbackFamily(
      "ps_scheduler_slot_moves",
      "Slot moves in progress (live scale-out and scale-in), by phase.",
      Type::kGauge, {"phase"}, [this] {
        double copying = 0, fencing = 0;
        const ClusterSnapshot s = Snapshot();
        for (const SlotMove& m : s.status.view().moves()) {
          (m.phase() == SlotMove::FENCING ? fencing : copying) += 1;
        }
        return std::vector<metrics::Sample>{{{"copying"}, copying},
                                            {{"fencing"}, fencing}};
      });
  r->AddCallback("ps_scheduler_slots_moving",
                 "Slots in the slot moves in progress.", Type::kGauge, [this] {
                   double slots = 0;
                   const ClusterSnapshot s = Snapshot();
                   for (const SlotMove& m : s.status.view().moves()) {
                     slots += m.slots_size();
                   }
                   return slots;
                 });
  r->AddCallback("ps_scheduler_last_checkpoint_clock",
                 "Clock of the newest committed checkpoint (0: none).", Type::kGauge,
                 [this] { return double(Snapshot().status.view().last_checkpoint_clock()); });
  r->AddCallback("ps_job_progress_ratio",
                 "Steps trained over steps to train, all data shards, in [0, 1].",
                 Type::kGauge,
                 [this] { return Snapshot().status.progress().progress(); });
  // No sample while the time left is not known (no pace measured yet).
  r->AddCallbackFamily(
      "ps_job_eta_seconds",
      "Seconds the job has left at its pace over the last 30 s.", Type::kGauge,
      {}, [this] {
        const JobProgress p = Snapshot().status.progress();
        std::vector<metrics::Sample> samples;
        if (p.has_eta_s()) samples.push_back({{}, p.eta_s()});
        return samples;
      });
  r->AddCallback("ps_job_examples_per_second",
                 "Examples trained per second by every worker together, over "
                 "the last 30 s.",
                 Type::kGauge, [this] {
                   return Snapshot().status.progress().examples_per_second();
                 });
}

}  // namespace ps
