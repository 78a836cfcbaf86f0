#include "scheduler/psctl_status.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ps {
namespace {

// A worker at this clock has finished training (common/wire.h
// kFinishedClock; not included, it would pull ZeroMQ into this tool).
constexpr uint64_t kFinishedClock = uint64_t{1} << 62;

// The scheduler's own faults, as its /status page shows them. While
// isolation is suspected no node is declared dead, so an operator who
// sees nodes listed as alive must also see that they are only held.
void FormatFaults(const SchedulerFaults& faults, absl::Time now,
                  std::string* out) {
  if (faults.isolation_suspected()) {
    const absl::Time until =
        now + absl::Milliseconds(faults.isolation_hold_left_ms());
    absl::StrAppend(
        out, absl::StrFormat(
                 "isolation: SUSPECTED for %.1f s: most nodes went silent at "
                 "once; none is declared dead until heartbeats return or until "
                 "%s (in %.1f s, cluster.isolation_hold_ms)\n",
                 faults.isolation_suspected_ms() / 1000.0,
                 absl::FormatTime("%Y-%m-%d %H:%M:%E1S UTC", until,
                                  absl::UTCTimeZone()),
                 faults.isolation_hold_left_ms() / 1000.0));
  }
  absl::StrAppend(out, "scheduler faults: stalls noticed ", faults.stalls(),
                  ", isolation suspicions ", faults.isolation_suspicions(),
                  "\n");
}

}  // namespace

namespace {

// The slot moves in progress, one a line, then those queued.
void FormatMoves(const GetStatusResponse& status, absl::Time now,
                 std::string* out) {
  const ClusterView& view = status.view();
  for (const SlotMove& m : status.queued_moves()) {
    absl::StrAppend(
        out,
        absl::StrFormat("queued slot move: server %d -> server %d  %d slots",
                        m.source(), m.target(), m.slots_size()),
        m.attempt() > 1 ? absl::StrFormat("  try %d", m.attempt()) : "",
        m.not_before_unix_micros() != 0 &&
                absl::FromUnixMicros(m.not_before_unix_micros()) > now
            ? absl::StrFormat(
                  "  in %.1f s",
                  absl::ToDoubleSeconds(
                      absl::FromUnixMicros(m.not_before_unix_micros()) - now))
            : "",
        "\n");
  }
  if (view.moves_size() == 0) return;
  absl::StrAppend(out, "slot moves: ", view.moves_size(), "\n");
  for (const SlotMove& m : view.moves()) {
    const double age =
        m.started_unix_micros() == 0
            ? 0
            : absl::ToDoubleSeconds(
                  now - absl::FromUnixMicros(m.started_unix_micros()));
    absl::StrAppend(
        out,
        absl::StrFormat("  server %d -> server %d  %d slots  %s", m.source(),
                        m.target(), m.slots_size(),
                        m.phase() == SlotMove::FENCING ? "fencing"
                        : m.copied() ? "copied, fence waits for a checkpoint"
                                     : "copying"),
        m.attempt() > 1 ? absl::StrFormat("  try %d", m.attempt()) : "",
        m.rows_copied() > 0
            ? absl::StrFormat("  %d rows (%.1f MB) copied", m.rows_copied(),
                              m.bytes_copied() / 1e6)
            : std::string(),
        age > 0 ? absl::StrFormat("  for %.1f s", age) : std::string(), "\n");
  }
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case SERVER:
      return "server";
    case WORKER:
      return "worker";
    default:
      return "unknown";
  }
}

std::string ModeText(const ConsistencyConfig& c) {
  std::string text = ConsistencyMode_Name(c.mode());
  if (text.empty()) text = absl::StrCat("mode ", c.mode());
  if (c.mode() == SSP) absl::StrAppend(&text, " staleness ", c.staleness());
  return text;
}

namespace {

// The job's progress line, then one line per data shard.
void FormatProgress(const GetStatusResponse& status, std::string* out) {
  if (!status.has_progress()) return;
  absl::StrAppend(out, "progress: ", FormatProgressLine(status, 0), "\n");
  for (const ShardProgress& s : status.progress().shards()) {
    absl::StrAppend(
        out,
        absl::StrFormat("  shard %d  %s  epoch %d batch %d  %.1f%%", s.shard(),
                        s.state(), s.position().epoch(), s.position().batch(),
                        100 * s.progress()),
        s.steps_total() > 0
            ? absl::StrCat("  ", s.steps_done(), "/", s.steps_total(), " steps")
            : std::string("  size unknown"),
        s.has_worker_rank() ? absl::StrCat("  worker rank ", s.worker_rank())
                            : "",
        s.has_steps_per_second()
            ? absl::StrFormat("  %.1f steps/s", s.steps_per_second())
            : "",
        s.has_eta_s() ? absl::StrCat("  ETA ", HumanDuration(s.eta_s())) : "",
        s.has_loss() ? absl::StrFormat("  loss %.4f", s.loss()) : "", "\n");
  }
}

}  // namespace

std::string HumanDuration(double seconds) {
  if (!(seconds >= 0)) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%dm %02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh %02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd %02dh", s / 86400, s % 86400 / 3600);
}

std::string FormatProgressLine(const GetStatusResponse& status, int bar_width) {
  const JobProgress& p = status.progress();
  std::string out =
      absl::StrFormat("%s  %5.1f%%", JobState_Name(status.view().job_state()),
                      100 * p.progress());
  if (bar_width > 0) {
    const int filled = std::clamp(
        static_cast<int>(p.progress() * bar_width + 1e-9), 0, bar_width);
    absl::StrAppend(&out, " [", std::string(filled, '#'),
                    std::string(bar_width - filled, '.'), "]");
  }
  absl::StrAppend(&out, "  ", p.steps_done(), "/", p.total_known() ? "" : "~",
                  p.steps_total(), " steps");
  absl::StrAppend(
      &out, absl::StrFormat("  %.1f steps/s  %.0f ex/s", p.steps_per_second(),
                            p.examples_per_second()));
  absl::StrAppend(&out, "  ETA ",
                  p.has_eta_s() ? HumanDuration(p.eta_s()) : std::string("?"));
  absl::StrAppend(&out, "  elapsed ", HumanDuration(p.elapsed_s()));
  for (const MetricPoint& m : p.metrics()) {
    absl::StrAppend(&out, absl::StrFormat("  %s %.4f", m.name(), m.value()));
  }
  return out;
}

std::string FormatStatus(const GetStatusResponse& status,
                         absl::string_view journal_error, absl::Time now) {
  const ClusterView& view = status.view();
  std::string out;
  absl::StrAppend(
      &out, "job: ", JobState_Name(view.job_state()),
      view.failure().empty() ? "" : absl::StrCat(": ", view.failure()), "\n");
  absl::StrAppend(&out, "epoch: ", view.epoch(), "\n");
  if (!journal_error.empty()) {
    absl::StrAppend(&out, "journal: FAILING: ", journal_error, "\n");
  }
  if (view.scheduler_restarts() > 0) {
    absl::StrAppend(&out, "scheduler restarts: ", view.scheduler_restarts(),
                    " (the newest took the job back at epoch ",
                    view.recovered_epoch(), " with ", view.recovered_nodes(),
                    " live nodes)\n");
  }
  FormatFaults(status.faults(), now, &out);
  absl::StrAppend(&out, "consistency: ", ModeText(view.consistency()),
                  " (watchdog after ", view.consistency().watchdog_timeout_ms(),
                  " ms, every ", view.consistency().watchdog_interval_ms(),
                  " ms)\n");
  FormatMoves(status, now, &out);
  FormatProgress(status, &out);
  // Slots each live server owns (a spare owns none).
  std::map<uint32_t, uint32_t> owned;
  for (uint32_t owner : view.slot_owner()) ++owned[owner];
  absl::StrAppend(&out, "nodes: ", view.nodes_size(), "\n");
  for (const NodeInfo& n : view.nodes()) {
    absl::StrAppend(&out, absl::StrFormat("  node %d  %s rank %d  %s",
                                          n.node_id(), RoleName(n.role()),
                                          n.rank(), NodeState_Name(n.state())));
    if (!n.data_endpoint().empty()) {
      absl::StrAppend(&out, "  endpoint ", n.data_endpoint());
    }
    absl::StrAppend(&out, "  host ", n.host().empty() ? "-" : n.host(),
                    "  pid ", n.pid());
    if (n.role() == WORKER)
      absl::StrAppend(&out, "  start_clock ", n.start_clock());
    if (n.role() == SERVER && n.state() == ALIVE &&
        view.slot_owner_size() > 0) {
      const uint32_t slots = owned.count(n.rank()) ? owned[n.rank()] : 0;
      absl::StrAppend(&out, slots == 0 ? std::string("  spare (no slots)")
                                       : absl::StrCat("  slots ", slots));
    }
    if (n.draining() && n.state() == ALIVE) absl::StrAppend(&out, "  draining");
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, "worker clocks: ", status.clocks_size(), " live\n");
  for (const WorkerClock& wc : status.clocks()) {
    absl::StrAppend(&out, "  worker rank ", wc.rank(), "  clock ",
                    wc.clock() >= kFinishedClock ? std::string("finished")
                                                 : absl::StrCat(wc.clock()),
                    "  silent ", wc.silent_ms(), " ms\n");
  }
  return out;
}

}  // namespace ps
