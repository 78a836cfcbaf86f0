// Rebalance: what a live scale-out (psctl scale --servers=4, copy -> fence
// -> flip) costs the pushes of a running job, and how long it takes, for
// tables of two sizes.
//
// Every run is a fresh elastic job on loopback started by
// tests/testing/job_harness (`cluster { num_servers: 2 elastic {
// max_servers: 4 } }`, 256 slots, one sparse SGD table "sgd" of dim 1):
// scheduler_main, two server_main owning the slots and two spares. The
// table is prefilled with each of --sizes rows (keys 0..size-1) by one kv_tool
// push of zero gradients, which creates every row and changes no value, and the
// servers' row counts (kv_tool --op=stats) are checked to add up to the
// size. Then --pushers tests/replication_pusher processes
// (tests/testing/ledger.h, --mixed: each push carries 16 random keys of
// the whole table, so it spans every server and nearly every push touches
// a slot that moves) push as fast as they can with 8 pushes in flight,
// each keeping a ledger of (issue, acknowledgement) times. After a second
// to settle (longer when needed so that the scale starts 11 s after the
// prefill: the servers report their slots' bytes to the planner every
// 10 s), a window of --window_s seconds is the baseline; then `psctl
// scale --servers=4 --wait` moves half of the slots onto the spares while
// the pushes go on; then another window. At the end the ledger check of
// LedgerPushers::StopAndVerify reads every key back: none of the
// acknowledged pushes lost, none applied twice.
//
// The move's window is the scheduler's: from its "scale to 4 servers" log
// line to its last "move of ... done" line (log times, to the
// millisecond). Figures, per size:
//   push latency (acknowledgement - issue) p50 / p99 / max of the pushes
//     issued during the move, against those issued in the baseline window:
//     the max is the longest a push to a moving slot waited;
//   the longest gap between two acknowledgements (all pushers) during the
//     move, against the baseline window's: how long the job stood still;
//   the fence pauses the sources logged ("fence pause X ms": from applying
//     the fence view to the target's confirmation; pushes to the fenced
//     slots are refused and sent again meanwhile), p50 and max;
//   the sources' snapshot read ("catch-up ... read in X ms"): the longest
//     stretch the source's serving thread spent on the copy at once (the
//     listing of the moving keys, or one chunk of rows sent between
//     requests), which a push to that server waits out; the fence reads
//     the moves' running digests (server/move_digest.h), so neither should
//     grow much with the table;
//   acknowledged pushes/s in the baseline window, over the move, in the
//     worst 100 ms window starting during the move, and after it, against
//     the baseline;
//   rows and MB copied (the sources' "copied (R rows, B bytes)"), the
//     move's duration, and the copy rate: bytes over the copy phase (the
//     scheduler's "copying" to its last "...; fencing" line);
// and across sizes the fence pause and the snapshot read of the largest
// size against the smallest.
//
// With --repeats=R each size runs R times: value and baseline are the
// medians over the runs, ratio the median of the runs' ratios.
//
// Exits 1 when a job failed (a process exited non-zero, the move did not
// complete, the prefill fell short) or the ledger check failed; job files
// are then kept. Nothing here judges speed.
//
// The binaries come from the runfiles tree (the `data` of this target), as
// for scaling_bench.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/job_harness.h"
#include "tests/testing/ledger.h"
#include "tests/testing/subprocess.h"

ABSL_FLAG(std::string, sizes, "200000,1000000",
          "Table sizes (rows, prefilled) to run, comma-separated.");
ABSL_FLAG(int32_t, repeats, 3,
          "Runs per size; medians are reported. Odd counts avoid picking "
          "between two.");
ABSL_FLAG(double, window_s, 4,
          "Seconds of the baseline window before the scale and of the "
          "window after it.");
ABSL_FLAG(int32_t, pushers, 2, "Pusher processes (the job's workers).");
ABSL_FLAG(int32_t, replication, 1, "cluster.replication of the job: 1 or 2.");
ABSL_FLAG(std::string, dir, "",
          "Directory for the jobs' files (configs, logs, ledgers), kept. "
          "Default: a temporary directory, removed at the end unless a job "
          "failed.");

namespace ps {
namespace {

using ::ps::bench::Cores;
using ::ps::bench::CpuSample;
using ::ps::bench::FindRunfiles;
using ::ps::bench::LineTime;
using ::ps::bench::Median;
using ::ps::bench::Quantile;
using ::ps::bench::RunningCpuSeconds;
using ::ps::bench::SampleCpu;
using ::ps::testing::JobHarness;
using ::ps::testing::LedgerPushers;
using ::ps::testing::ReadFile;
using ::ps::testing::Runfile;
using ::ps::testing::Subprocess;

constexpr int kSlots = 256;
constexpr int kInitialServers = 2;
constexpr int kScaledServers = 4;
// Settling time after the pushers reached 100 acknowledgements each,
// before the baseline window opens.
constexpr absl::Duration kSettle = absl::Seconds(1);
// The scale starts at least this long after the prefill: servers measure
// the bytes of their slots every 10 s (KVServer::Impl::kSlotBytesPeriod)
// and the planner balances by their newest reports, so a scale sooner
// after a bulk load plans with one server's table still empty.
constexpr absl::Duration kBytesReportAge = absl::Seconds(11);
// The worst-window figure's width.
constexpr absl::Duration kWorstWindow = absl::Milliseconds(100);
constexpr absl::Duration kWorstStep = absl::Milliseconds(5);
// Generous: a 1M-row move takes seconds on two loaded cores.
constexpr absl::Duration kScaleTimeout = absl::Minutes(3);
constexpr double kDisturbed = 0.05;

// A figure of one run: value, and the same run's baseline when it has one.
struct Metric {
  std::string name;  // without the size suffix
  double value = 0;
  std::optional<double> baseline;
  std::string unit;
};

// What one run of one size produced.
struct Run {
  std::vector<Metric> metrics;
  std::vector<std::string> notes;
  size_t acknowledged = 0;
  double other_load = 0;
};

std::string JobText(uint64_t size, int pushers, int replication) {
  return absl::StrFormat(R"pb(
                           name: "rebalance-bench-%d"
                           cluster {
                             num_servers: %d
                             num_workers: %d
                             num_slots: %d
                             heartbeat_interval_ms: 100
                             heartbeat_timeout_ms: 5000
                             request_timeout_ms: 60000
                             failover_timeout_ms: 60000
                             replication: %d
                             elastic { max_servers: %d }
                           }
                           tables {
                             id: 0
                             name: "sgd"
                             sparse { dim: 1 }
                             optimizer { sgd { learning_rate: 1 } }
                             init { kind: ZEROS }
                           }
                         )pb",
                         size, kInitialServers, pushers, kSlots, replication,
                         kScaledServers);
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

// The number right after `marker` in `line` (e.g. "fence pause " ->
// 26.3), or nullopt.
std::optional<double> NumberAfter(absl::string_view line,
                                  absl::string_view marker) {
  const size_t at = line.find(marker);
  if (at == absl::string_view::npos) return std::nullopt;
  absl::string_view rest = line.substr(at + marker.size());
  size_t end = 0;
  while (end < rest.size() &&
         (absl::ascii_isdigit(rest[end]) || rest[end] == '.')) {
    ++end;
  }
  double v = 0;
  if (!absl::SimpleAtod(rest.substr(0, end), &v)) return std::nullopt;
  return v;
}

// Runs `argv` to completion with its output in dir/name.out and .log;
// its stdout, or an error with both.
absl::StatusOr<std::string> RunTool(const std::vector<std::string>& argv,
                                    const std::string& dir,
                                    const std::string& name,
                                    absl::Duration timeout) {
  const std::string out = absl::StrCat(dir, "/", name, ".out");
  const std::string log = absl::StrCat(dir, "/", name, ".log");
  auto p = Subprocess::Start(argv, out, log);
  if (!p.ok()) return p.status();
  auto code = p->Wait(timeout);
  if (!code.ok() || *code != 0) {
    return absl::InternalError(absl::StrCat(
        name, " failed (",
        code.ok() ? absl::StrCat("exit ", *code) : code.status().ToString(),
        "):\n", ReadFile(out), ReadFile(log)));
  }
  return ReadFile(out);
}

// The rank server(i) registered as, once its log says so.
absl::StatusOr<uint32_t> WaitForServerRank(JobHarness& job, int i,
                                           absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (absl::Now() < give_up) {
    const std::string log = ReadFile(job.server(i).stderr_path());
    if (std::optional<double> rank =
            NumberAfter(log, "registered as server ")) {
      return static_cast<uint32_t>(*rank);
    }
    if (!job.server(i).running()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(JobHarness::ServerName(i), " did not register:\n",
                   ReadFile(job.server(i).stderr_path())));
}

// Fills keys 0..size-1 with one push of zero gradients through kv_tool
// (a worker that leaves when done) and checks that the servers' row
// counts of "sgd" add up to `size`. Its duration.
absl::StatusOr<absl::Duration> Prefill(JobHarness& job, uint64_t size) {
  const std::string config = job.dir() + "/job.pbtxt";
  const std::string scheduler = "--scheduler=" + job.address();
  const absl::Time start = absl::Now();
  PS_ASSIGN_OR_RETURN(
      std::string pushed,
      RunTool({Runfile("worker/kv_tool"), "--config=" + config, scheduler,
               "--table=sgd", "--op=push", absl::StrCat("--keys=0-", size - 1),
               "--values=0"},
              job.dir(), "prefill", absl::Minutes(2)));
  const absl::Duration took = absl::Now() - start;
  PS_ASSIGN_OR_RETURN(std::string stats,
                      RunTool({Runfile("worker/kv_tool"), "--config=" + config,
                               scheduler, "--op=stats"},
                              job.dir(), "stats", absl::Seconds(60)));
  uint64_t rows = 0;
  for (const std::string& line : Lines(stats)) {
    if (!absl::StrContains(line, "\"table\":\"sgd\"")) continue;
    rows += static_cast<uint64_t>(NumberAfter(line, "\"rows\":").value_or(0));
  }
  if (rows != size) {
    return absl::InternalError(
        absl::StrCat("after the prefill the servers "
                     "hold ",
                     rows, " rows, not ", size, ":\n", stats));
  }
  return took;
}

// The acknowledged pushes of `acks` issued in [from, to): their latencies
// in ms.
std::vector<double> LatenciesMs(const std::vector<LedgerPushers::Ack>& acks,
                                absl::Time from, absl::Time to) {
  const int64_t a = absl::ToUnixMicros(from), b = absl::ToUnixMicros(to);
  std::vector<double> ms;
  for (const LedgerPushers::Ack& k : acks) {
    if (k.issue_us >= a && k.issue_us < b) {
      ms.push_back((k.ack_us - k.issue_us) / 1000.0);
    }
  }
  return ms;
}

// Acknowledgement times (Unix us) of every push, sorted.
std::vector<int64_t> AckTimes(const std::vector<LedgerPushers::Ack>& acks) {
  std::vector<int64_t> t;
  t.reserve(acks.size());
  for (const LedgerPushers::Ack& k : acks) t.push_back(k.ack_us);
  std::sort(t.begin(), t.end());
  return t;
}

// Acknowledgements per second in [from, to).
double Rate(const std::vector<int64_t>& acks, absl::Time from, absl::Time to) {
  const double s = absl::ToDoubleSeconds(to - from);
  if (s <= 0) return 0;
  const auto lo =
      std::lower_bound(acks.begin(), acks.end(), absl::ToUnixMicros(from));
  const auto hi =
      std::lower_bound(acks.begin(), acks.end(), absl::ToUnixMicros(to));
  return (hi - lo) / s;
}

// The lowest rate of any kWorstWindow that starts in [from, to), the
// start sliding in steps of kWorstStep. A move can take less than a
// window, and its effects (pushes retried after a fence) outlast it by a
// little, so the windows may end after `to`.
double WorstWindowRate(const std::vector<int64_t>& acks, absl::Time from,
                       absl::Time to) {
  double worst = -1;
  for (absl::Time t = from; t < to; t += kWorstStep) {
    const double r = Rate(acks, t, t + kWorstWindow);
    if (worst < 0 || r < worst) worst = r;
  }
  return std::max(worst, 0.0);
}

// The longest time in [from, to) without an acknowledgement, in ms (the
// window's edges count as acknowledgements).
double LongestGapMs(const std::vector<int64_t>& acks, absl::Time from,
                    absl::Time to) {
  int64_t prev = absl::ToUnixMicros(from);
  const int64_t end = absl::ToUnixMicros(to);
  int64_t gap = 0;
  for (auto it = std::lower_bound(acks.begin(), acks.end(), prev);
       it != acks.end() && *it < end; ++it) {
    gap = std::max(gap, *it - prev);
    prev = *it;
  }
  return std::max(gap, end - prev) / 1000.0;
}

// What the scheduler's and the servers' logs say about the moves.
struct MoveLog {
  std::optional<absl::Time> scale;        // "scale to 4 servers"
  std::optional<absl::Time> first_copy;   // first "...: copying"
  std::optional<absl::Time> last_copied;  // last "copied (...); fencing"
  std::optional<absl::Time> last_done;    // last "... done in"
  int moves = 0;                          // "done in" lines
  int abandoned = 0;
  uint64_t slots = 0;  // slots of the finished moves
  uint64_t rows = 0;   // sources' "copied (R rows, B bytes)"
  uint64_t bytes = 0;
  std::vector<double> fence_ms;     // sources' "fence pause X ms"
  std::vector<double> snapshot_ms;  // sources' "catch-up ... read in X ms"
                                    // (the longest chunk or listing)
};

void ParseSchedulerLog(const std::string& log, MoveLog* m) {
  for (const std::string& line : Lines(log)) {
    if (!absl::StrContains(line, "move of ") &&
        !absl::StrContains(line, "scale to ")) {
      continue;
    }
    std::optional<absl::Time> t = LineTime(line);
    if (!t) continue;
    if (absl::StrContains(line, "scale to ") && !m->scale) {
      m->scale = t;
    } else if (absl::StrContains(line, ": copying")) {
      if (!m->first_copy) m->first_copy = t;
    } else if (absl::StrContains(line, "; fencing")) {
      m->last_copied = t;
    } else if (absl::StrContains(line, " done in ")) {
      m->last_done = t;
      ++m->moves;
      m->slots +=
          static_cast<uint64_t>(NumberAfter(line, "move of ").value_or(0));
    } else if (absl::StrContains(line, " abandoned")) {
      ++m->abandoned;
    }
  }
}

void ParseServerLog(const std::string& log, MoveLog* m) {
  for (const std::string& line : Lines(log)) {
    if (absl::StrContains(line, "(fence pause ")) {
      if (auto ms = NumberAfter(line, "(fence pause "))
        m->fence_ms.push_back(*ms);
    } else if (absl::StrContains(line, "catch-up of ") &&
               absl::StrContains(line, " read in ")) {
      if (auto ms = NumberAfter(line, " read in "))
        m->snapshot_ms.push_back(*ms);
    } else if (absl::StrContains(line, ": copied (") &&
               absl::StrContains(line, " bytes)")) {
      m->rows +=
          static_cast<uint64_t>(NumberAfter(line, ": copied (").value_or(0));
      m->bytes +=
          static_cast<uint64_t>(NumberAfter(line, " rows, ").value_or(0));
    }
  }
}

// Runs `psctl scale --servers=4 --wait` against `job`; its output.
absl::StatusOr<std::string> Scale(JobHarness& job) {
  return RunTool(
      {Runfile("scheduler/psctl"), "--scheduler=" + job.address(),
       absl::StrCat("--timeout_ms=", absl::ToInt64Milliseconds(kScaleTimeout)),
       "scale", absl::StrCat("--servers=", kScaledServers), "--wait"},
      job.dir(), "psctl_scale", kScaleTimeout + absl::Seconds(30));
}

// Starts the job (2 servers owning the slots, 2 spares), prefills it and
// starts the pushers.
struct StartedJob {
  std::unique_ptr<JobHarness> job;
  std::optional<LedgerPushers> pushers;
  absl::Duration prefill;
  absl::Time prefilled;  // when the prefill ended
};

absl::StatusOr<StartedJob> StartJob(uint64_t size, const std::string& dir) {
  StartedJob s;
  JobHarness::Options options;
  options.dir = dir;
  options.config = JobText(size, absl::GetFlag(FLAGS_pushers),
                           absl::GetFlag(FLAGS_replication));
  options.num_servers = kInitialServers;
  options.num_workers = 0;  // the pushers are the workers
  PS_ASSIGN_OR_RETURN(s.job, JobHarness::Start(options));
  for (int i = 0; i < kInitialServers; ++i) {
    PS_RETURN_IF_ERROR(
        WaitForServerRank(*s.job, i, absl::Seconds(30)).status());
  }
  // The spares join before the prefill: they own nothing until the scale.
  for (int i = kInitialServers; i < kScaledServers; ++i) {
    PS_ASSIGN_OR_RETURN(int index, s.job->StartServer());
    PS_RETURN_IF_ERROR(
        WaitForServerRank(*s.job, index, absl::Seconds(30)).status());
  }
  PS_ASSIGN_OR_RETURN(s.prefill, Prefill(*s.job, size));
  s.prefilled = absl::Now();
  LedgerPushers::Options ledger = LedgerPushers::ForJob(*s.job, /*seed=*/1);
  ledger.pushers = absl::GetFlag(FLAGS_pushers);
  ledger.keys = static_cast<int>(size);
  ledger.mixed = true;
  PS_ASSIGN_OR_RETURN(LedgerPushers pushers,
                      LedgerPushers::Start(ledger, absl::Seconds(60)));
  s.pushers.emplace(std::move(pushers));
  return s;
}

// The processes of the job and its pushers, all running until the end of
// the windows.
std::vector<pid_t> JobPids(StartedJob& s) {
  std::vector<pid_t> pids = {s.job->scheduler().pid()};
  for (int i = 0; i < s.job->num_servers(); ++i) {
    pids.push_back(s.job->server(i).pid());
  }
  for (int i = 0; i < absl::GetFlag(FLAGS_pushers); ++i) {
    pids.push_back(s.pushers->pusher(i).pid());
  }
  return pids;
}

// Checks that every process of the job exited 0 once the reader finished
// it.
absl::Status WaitForJobEnd(JobHarness& job) {
  auto result = job.Wait(absl::Seconds(60));
  if (!result.ok()) {
    return absl::Status(
        result.status().code(),
        absl::StrCat(result.status().message(), "\n", job.LogTails(20)));
  }
  std::vector<int> codes = result->servers;
  codes.push_back(result->scheduler);
  if (std::any_of(codes.begin(), codes.end(), [](int c) { return c != 0; })) {
    return absl::InternalError(
        absl::StrCat("the job did not end cleanly: servers exited [",
                     absl::StrJoin(result->servers, ","), "], scheduler ",
                     result->scheduler, "\n", job.LogTails(20)));
  }
  return absl::OkStatus();
}

// The figures of the pushes, from the ledger, against the baseline window.
void PushFigures(const std::vector<LedgerPushers::Ack>& acks,
                 absl::Time before_from, absl::Time before_to,
                 absl::Time move_from, absl::Time move_to,
                 absl::Time after_from, absl::Time after_to, Run* run) {
  const std::vector<double> before = LatenciesMs(acks, before_from, before_to);
  const std::vector<double> during = LatenciesMs(acks, move_from, move_to);
  auto& m = run->metrics;
  const size_t first = m.size();
  for (const auto& [name, q] : std::vector<std::pair<std::string, double>>{
           {"push_latency_p50_ms", 0.5},
           {"push_latency_p99_ms", 0.99},
           {"push_latency_max_ms", 1.0}}) {
    m.push_back({name, Quantile(during, q), Quantile(before, q), "ms"});
  }
  const std::vector<int64_t> times = AckTimes(acks);
  m.push_back({"ack_gap_max_ms", LongestGapMs(times, move_from, move_to),
               LongestGapMs(times, before_from, before_to), "ms"});
  const double base = Rate(times, before_from, before_to);
  m.push_back({"pushes_per_s_before", base, std::nullopt, "pushes/s"});
  m.push_back({"pushes_per_s_during", Rate(times, move_from, move_to), base,
               "pushes/s"});
  m.push_back({"pushes_per_s_worst_100ms",
               WorstWindowRate(times, move_from, move_to), base, "pushes/s"});
  m.push_back({"pushes_per_s_after", Rate(times, after_from, after_to), base,
               "pushes/s"});
  run->notes.push_back(absl::StrFormat(
      "%zu pushes issued in the baseline window, %zu during the move; "
      "latency p50/p99/max %.1f/%.1f/%.1f ms during (%.1f/%.1f/%.1f "
      "before); longest gap between acknowledgements %.1f ms (%.1f "
      "before); pushes/s %.0f before, %.0f during, %.0f in the worst "
      "100 ms, %.0f after",
      before.size(), during.size(), m[first].value, m[first + 1].value,
      m[first + 2].value, *m[first].baseline, *m[first + 1].baseline,
      *m[first + 2].baseline, m[first + 3].value, *m[first + 3].baseline, base,
      m[first + 5].value, m[first + 6].value, m[first + 7].value));
}

// The figures of the moves themselves, from the logs; an error when the
// logs do not show every move done.
absl::Status MoveFigures(JobHarness& job, Run* run) {
  MoveLog m;
  ParseSchedulerLog(ReadFile(job.scheduler().stderr_path()), &m);
  for (int i = 0; i < job.num_servers(); ++i) {
    ParseServerLog(ReadFile(job.server(i).stderr_path()), &m);
  }
  if (!m.scale || !m.first_copy || !m.last_copied || !m.last_done ||
      m.moves == 0 || m.abandoned > 0 || m.fence_ms.empty()) {
    return absl::InternalError(absl::StrCat(
        "the logs do not show the moves done (", m.moves, " done, ",
        m.abandoned, " abandoned, ", m.fence_ms.size(), " fences)"));
  }
  auto& out = run->metrics;
  out.push_back({"fence_pause_p50_ms", Median(m.fence_ms), std::nullopt, "ms"});
  out.push_back(
      {"fence_pause_max_ms", Quantile(m.fence_ms, 1), std::nullopt, "ms"});
  out.push_back(
      {"snapshot_read_max_ms", Quantile(m.snapshot_ms, 1), std::nullopt, "ms"});
  out.push_back(
      {"rows_copied", static_cast<double>(m.rows), std::nullopt, "rows"});
  out.push_back({"mb_copied", m.bytes / 1e6, std::nullopt, "MB"});
  const double move_s = absl::ToDoubleSeconds(*m.last_done - *m.scale);
  out.push_back({"move_s", move_s, std::nullopt, "s"});
  const double copy_s = absl::ToDoubleSeconds(*m.last_copied - *m.first_copy);
  out.push_back({"copy_mb_per_s", copy_s > 0 ? m.bytes / 1e6 / copy_s : 0,
                 std::nullopt, "MB/s"});
  run->notes.push_back(absl::StrFormat(
      "%d moves of %lu slots in all: %lu rows, %.1f MB copied in %.3f s "
      "(first copy to last copied), whole scale %.3f s; fence pauses [%s] "
      "ms; snapshot reads [%s] ms",
      m.moves, static_cast<unsigned long>(m.slots),
      static_cast<unsigned long>(m.rows), m.bytes / 1e6, copy_s, move_s,
      absl::StrJoin(m.fence_ms, ", "), absl::StrJoin(m.snapshot_ms, ", ")));
  return absl::OkStatus();
}

// One job: prefill, baseline window, scale, after window, ledger check.
absl::StatusOr<Run> RunOnce(uint64_t size, const std::string& dir) {
  const absl::Duration window = absl::Seconds(absl::GetFlag(FLAGS_window_s));
  PS_ASSIGN_OR_RETURN(StartedJob s, StartJob(size, dir));
  JobHarness& job = *s.job;
  Run run;
  run.notes.push_back(absl::StrFormat(
      "prefill of %lu rows (one kv_tool push of zero gradients) took %.2f s",
      static_cast<unsigned long>(size), absl::ToDoubleSeconds(s.prefill)));

  job.SleepFor(
      std::max(kSettle, s.prefilled + kBytesReportAge - window - absl::Now()));
  const CpuSample cpu_before = SampleCpu();
  const double job_cpu_before = RunningCpuSeconds(JobPids(s));
  const absl::Time before_from = absl::Now();
  job.SleepFor(window);
  const absl::Time before_to = absl::Now();
  const absl::Time psctl_start = absl::Now();
  absl::StatusOr<std::string> scaled = Scale(job);
  const absl::Time psctl_end = absl::Now();
  if (!scaled.ok()) return scaled.status();
  const absl::Time after_from = absl::Now();
  job.SleepFor(window);
  const absl::Time after_to = absl::Now();
  const double job_cpu_after = RunningCpuSeconds(JobPids(s));
  const CpuSample cpu_after = SampleCpu();
  std::vector<std::string> plan = Lines(*scaled);
  run.notes.push_back(
      absl::StrFormat("psctl scale ran %.3f s: %s",
                      absl::ToDoubleSeconds(psctl_end - psctl_start),
                      plan.empty() ? "" : plan.front().c_str()));

  LedgerPushers::Verdict verdict = s.pushers->StopAndVerify();
  if (!verdict.problems.empty()) {
    return absl::DataLossError(absl::StrCat(
        "the ledger check failed:\n", absl::StrJoin(verdict.problems, "\n")));
  }
  run.acknowledged = verdict.acknowledged;
  PS_RETURN_IF_ERROR(WaitForJobEnd(job));

  PS_RETURN_IF_ERROR(MoveFigures(job, &run));
  // The move's window, from the scheduler's log.
  MoveLog m;
  ParseSchedulerLog(ReadFile(job.scheduler().stderr_path()), &m);
  PushFigures(verdict.acks, before_from, before_to, *m.scale, *m.last_done,
              after_from, after_to, &run);

  const double capacity =
      absl::ToDoubleSeconds(cpu_after.when - cpu_before.when) * Cores();
  const double own =
      (cpu_after.own_s - cpu_before.own_s) + (job_cpu_after - job_cpu_before);
  if (capacity > 0) {
    // psctl, exited meanwhile, is in own_s; the job's processes, running,
    // in their /proc counts.
    run.other_load = std::max(
        0.0, ((cpu_after.machine_busy_s - cpu_before.machine_busy_s) - own) /
                 capacity);
  }
  return run;
}

std::string SizeLabel(uint64_t size) {
  if (size % 1000000 == 0) return absl::StrCat(size / 1000000, "m");
  if (size % 1000 == 0) return absl::StrCat(size / 1000, "k");
  return absl::StrCat(size);
}

std::string Num(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.4g", v);
}

void PrintMetric(const std::string& name, double value,
                 std::optional<double> baseline, std::optional<double> ratio,
                 const std::string& unit) {
  std::printf(
      "{\"bench\":\"rebalance\",\"metric\":\"%s\",\"value\":%s,\"unit\":\"%s\","
      "\"baseline\":%s,\"ratio\":%s}\n",
      name.c_str(), Num(value).c_str(), unit.c_str(),
      baseline ? Num(*baseline).c_str() : "null",
      ratio ? absl::StrFormat("%.3f", *ratio).c_str() : "null");
  std::fflush(stdout);
}

// The medians over `runs` (all of one size), printed with the size's
// suffix; the values by metric name.
std::map<std::string, double> PrintSize(uint64_t size,
                                        const std::vector<Run>& runs) {
  std::map<std::string, double> medians;
  const std::string label = SizeLabel(size);
  for (size_t i = 0; i < runs.front().metrics.size(); ++i) {
    const Metric& first = runs.front().metrics[i];
    std::vector<double> values, baselines, ratios;
    for (const Run& r : runs) {
      const Metric& x = r.metrics[i];
      values.push_back(x.value);
      if (x.baseline) {
        baselines.push_back(*x.baseline);
        if (*x.baseline > 0) ratios.push_back(x.value / *x.baseline);
      }
    }
    const double value = Median(values);
    medians[first.name] = value;
    PrintMetric(
        absl::StrCat(first.name, "_", label), value,
        baselines.empty() ? std::nullopt
                          : std::optional<double>(Median(baselines)),
        ratios.empty() ? std::nullopt : std::optional<double>(Median(ratios)),
        first.unit);
  }
  return medians;
}

absl::StatusOr<std::vector<uint64_t>> Sizes() {
  std::vector<uint64_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    uint64_t n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 1000 || n > 100000000) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad size '", s, "' (1000..100000000 rows)"));
    }
    sizes.push_back(n);
  }
  return sizes;
}

// What every run of every size adds up to.
struct Totals {
  bool failed = false;
  double max_other_load = 0;
  size_t acknowledged = 0;
};

// Runs `size` --repeats times in jobs under `base`; the runs that
// completed, their notes printed.
std::vector<Run> RunRepeats(uint64_t size, const std::string& base,
                            Totals* totals) {
  const int repeats = absl::GetFlag(FLAGS_repeats);
  std::vector<Run> runs;
  for (int r = 0; r < repeats; ++r) {
    const std::string name =
        absl::StrCat(SizeLabel(size), repeats > 1 ? absl::StrCat("_r", r) : "");
    absl::StatusOr<Run> run = RunOnce(size, absl::StrCat(base, "/", name));
    if (!run.ok()) {
      std::fprintf(stderr, "# rebalance: %s failed: %s\n", name.c_str(),
                   run.status().ToString().c_str());
      totals->failed = true;
      continue;
    }
    for (const std::string& note : run->notes) {
      std::fprintf(stderr, "# %s: %s\n", name.c_str(), note.c_str());
    }
    std::fprintf(stderr,
                 "# %s: ledger exact: %zu acknowledged pushes, lost 0, "
                 "applied twice 0; other processes used %.0f%% of the CPUs\n",
                 name.c_str(), run->acknowledged, 100 * run->other_load);
    if (run->other_load > kDisturbed) {
      std::fprintf(stderr,
                   "# rebalance: WARNING: %s ran while other processes used "
                   "%.0f%% of the CPUs\n",
                   name.c_str(), 100 * run->other_load);
    }
    totals->max_other_load = std::max(totals->max_other_load, run->other_load);
    totals->acknowledged += run->acknowledged;
    runs.push_back(*std::move(run));
  }
  return runs;
}

// Does the pause grow with the table? The largest size's figures against
// the smallest's.
void PrintGrowth(
    const std::map<uint64_t, std::map<std::string, double>>& by_size) {
  if (by_size.size() < 2) return;
  const auto& [small, s] = *by_size.begin();
  const auto& [large, l] = *by_size.rbegin();
  for (const char* key :
       {"fence_pause_max_ms", "fence_pause_p50_ms", "snapshot_read_max_ms"}) {
    const double b = s.at(key), v = l.at(key);
    PrintMetric(
        absl::StrCat(key, "_", SizeLabel(large), "_vs_", SizeLabel(small)), v,
        b, b > 0 ? std::optional<double>(v / b) : std::nullopt, "ms");
  }
}

// --dir, created, or a new temporary directory.
absl::StatusOr<std::string> JobsDir() {
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return absl::InternalError(absl::StrCat(dir, ": ", ec.message()));
    return dir;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmp ? tmp : "/tmp", "/rebalance_bench.XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
  }
  return pattern;
}

int Main(const char* argv0) {
  absl::StatusOr<std::vector<uint64_t>> sizes = Sizes();
  const int repeats = absl::GetFlag(FLAGS_repeats);
  const int pushers = absl::GetFlag(FLAGS_pushers);
  const int replication = absl::GetFlag(FLAGS_replication);
  const double window_s = absl::GetFlag(FLAGS_window_s);
  if (!sizes.ok() || repeats < 1 || pushers < 1 || pushers > 16 ||
      (replication != 1 && replication != 2) || window_s < 0.5) {
    std::fprintf(stderr,
                 "rebalance_bench: %s; --repeats >= 1, --pushers 1..16, "
                 "--replication 1 or 2, --window_s >= 0.5\n",
                 sizes.ok() ? "bad flags" : sizes.status().ToString().c_str());
    return 2;
  }
  absl::StatusOr<std::string> base = JobsDir();
  absl::Status found = FindRunfiles(argv0);
  if (!found.ok() || !base.ok()) {
    std::fprintf(stderr, "rebalance_bench: %s\n",
                 (found.ok() ? base.status() : found).ToString().c_str());
    return 1;
  }
  const int cores = Cores();
  std::fprintf(stderr,
               "# rebalance: nproc = %d: the scheduler, 4 servers, %d pushers "
               "and this bench share these cores, so the move's copy and the "
               "pushes compete for them; judge the ratios against the same "
               "run's baseline window.\n",
               cores, pushers);

  Totals totals;
  std::vector<std::string> summary;
  std::map<uint64_t, std::map<std::string, double>> by_size;
  for (uint64_t size : *sizes) {
    std::vector<Run> runs = RunRepeats(size, *base, &totals);
    if (runs.empty()) continue;
    by_size[size] = PrintSize(size, runs);
    for (const char* key : {"fence_pause_max_ms", "push_latency_max_ms",
                            "pushes_per_s_worst_100ms", "copy_mb_per_s"}) {
      summary.push_back(absl::StrFormat("\"%s_%s\":%s", key, SizeLabel(size),
                                        Num(by_size[size][key])));
    }
  }
  PrintGrowth(by_size);
  // lost and duplicated are 0 when every ledger check passed; a failed
  // run (which may have failed its check) makes them unknown.
  const char* lost = totals.failed ? "null" : "0";
  std::printf(
      "{\"bench\":\"rebalance\",\"summary\":{%s%s\"lost\":%s,\"duplicated\":%s,"
      "\"acknowledged\":%zu},\"settings\":{\"nproc\":%d,\"sizes\":\"%s\","
      "\"repeats\":%d,\"window_s\":%g,\"pushers\":%d,\"replication\":%d,"
      "\"slots\":%d,\"max_other_load\":%.2f}}\n",
      absl::StrJoin(summary, ",").c_str(), summary.empty() ? "" : ",", lost,
      lost, totals.acknowledged, cores, absl::GetFlag(FLAGS_sizes).c_str(),
      repeats, window_s, pushers, replication, kSlots, totals.max_other_load);
  if (totals.failed) {
    std::fprintf(stderr, "# rebalance: a job failed; job files kept in %s\n",
                 base->c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_dir).empty()) {
    std::error_code ec;
    std::filesystem::remove_all(*base, ec);
  }
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ps::Main(argv[0]);
}
