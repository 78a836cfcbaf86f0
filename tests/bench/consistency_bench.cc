// Consistency benchmark: what BSP and SSP cost compared with ASYNC.
//
// Everything runs in this process on loopback: a scheduler (gRPC, port 0),
// `--servers` KVServers registered through their own SchedulerClient, and
// worker threads, each with its own SchedulerClient (role WORKER) and its
// own KVClient, so every worker has its own node id, sockets and I/O thread
// exactly as a worker process would. Each configuration gets a fresh
// cluster, so clocks and BSP step counters start from zero every time.
//
// One worker step, shaped like worker/trainer.cc's:
//   PullDense(whole dense table) + Pull(sparse keys), wait for both and for
//   the previous step's pushes; simulated compute; Push(sparse gradients) +
//   PushDense(dense gradients) + AdvanceClock(), not waited for (servers
//   apply one sender's requests in order, so the next pull sees them).
//
// Compute is simulated by sleeping, not spinning: many worker threads
// share 2 cores here, and spinning would turn "compute" into CPU contention
// that starves the I/O threads being measured. Worker threads set their timer
// slack to 1 ns so a 1 ms sleep is not stretched by the default 50 us slack,
// and the time actually slept is measured and subtracted (a late wake-up on a
// busy CPU therefore counts as compute, not as overhead).
//
// Many workers: every simulated worker is a whole worker (its own node id,
// heartbeats, sockets and sequence numbers): 6 threads and 16 file
// descriptors each besides the thread that drives it, so 256 of them hold
// 4 096 descriptors (the bench raises its soft limit to the hard one, and
// says when that is too low).
// Heartbeats are spread out beyond 16 workers (the interval grows with N)
// so the scheduler's share of the 2 cores stays as at 16.
//
// Figures (one JSON object per line on stdout; notes go to stderr):
//   bookkeeping_us_per_step_<mode>_w<N>: one server's bookkeeping of N
//     workers per step (clocks, BSP/SSP gating, step buffers, sequence
//     windows, deferred pulls), timed in one thread without sockets
//     (tests/bench/consistency_bookkeeping.h), best of --bookkeeping_repeats;
//     bookkeeping_growth_<mode>: its growth exponent in N (1: linear, the
//     least any per-step figure can grow; baseline 1).
//   <mode>_step_overhead_us_w<N>, mode async, bsp or sspK (--overhead_modes):
//     mean per-step wall time minus the time slept in compute, over the
//     measured steps (--steps, fewer at large N: --worker_steps) after a
//     warm-up and a barrier. BSP's and SSP's baseline is ASYNC's figure for
//     the same N.
//   <mode>_server_cpu_us_per_step_w<N>: CPU time of a server's serving
//     thread per step (mean over the servers), from the first worker's
//     first measured step to the last one's last: the server's own cost
//     per step, which is not stretched by other threads waiting for the
//     cores.
//   <mode>_cpu_floor_us_w<N>: CPU time of the whole process per step over
//     the same span, divided by the cores: the shortest step (compute
//     included) this machine allows. A step (compute + overhead) close to
//     it means the cores, not the protocol, set the step time.
//   <mode>_step_overhead_growth, <mode>_server_cpu_growth: growth exponents
//     in N over the --workers given (least squares on log-log).
//   idle_fraction_<mode>: --idle_workers workers, worker 0 persistently 2x
//     slower; the share of the FAST workers' wall time over their
//     --idle_steps measured steps spent blocked in Wait() (pulls, and the
//     previous step's push acknowledgements, which are all but always done).
//   idle_fraction_random_<mode>: the same, but at every step one worker,
//     picked pseudo-randomly by step number, is the 2x slow one; measured
//     over every worker. Same mean speed for all, so bounded staleness can
//     absorb the jitter.
//   Both idle figures have ASYNC's value as baseline: what a pull costs when
//   nobody waits for anybody (the loopback round trip).
// A last line {"bench":"consistency","summary":{...},"settings":{...}}
// repeats every figure.
#include <dirent.h>
#include <sys/prctl.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/wire.h"
#include "proto/config.pb.h"
#include "scheduler/client.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "tests/bench/consistency_bookkeeping.h"
#include "tests/testing/cluster.h"
#include "worker/kv_client.h"

ABSL_FLAG(int32_t, servers, 2, "Servers in every configuration.");
ABSL_FLAG(std::vector<std::string>, workers, std::vector<std::string>({"1", "2", "4", "8", "16"}),
          "Worker counts for the step-overhead runs.");
ABSL_FLAG(std::vector<std::string>, overhead_modes,
          std::vector<std::string>({"async", "bsp", "ssp4"}),
          "Modes of the step-overhead runs: async, bsp, sspK (staleness K).");
ABSL_FLAG(int32_t, compute_us, 1000, "Simulated compute per step in the step-overhead runs.");
ABSL_FLAG(int32_t, steps, 200, "Measured steps per worker in the step-overhead runs (at most).");
ABSL_FLAG(int32_t, worker_steps, 6400,
          "Measured steps of all workers together per step-overhead run: each worker "
          "measures worker_steps / N steps, between --min_steps and --steps, so runs with "
          "many workers stay short.");
ABSL_FLAG(int32_t, min_steps, 10, "Fewest measured steps per worker in the step-overhead runs.");
ABSL_FLAG(int32_t, warmup, 20,
          "Unmeasured steps at equal speed before every measurement (connections, row "
          "creation, caches), followed by a barrier.");
ABSL_FLAG(int32_t, idle_workers, 4, "Workers in the idle-fraction runs; 0: no such runs.");
ABSL_FLAG(int32_t, idle_steps, 200, "Measured steps per worker in the idle-fraction runs.");
ABSL_FLAG(int32_t, idle_compute_us, 5000,
          "Compute per step of a normal worker in the idle-fraction runs; the slow one takes "
          "twice as long. Long enough that a pull's round trip (a few hundred us here) does "
          "not dominate the step.");
ABSL_FLAG(std::vector<std::string>, staleness, std::vector<std::string>({"1", "2", "4", "8"}),
          "SSP staleness bounds for the idle-fraction runs.");
ABSL_FLAG(int32_t, keys, 256, "Sparse keys pulled and pushed per step.");
ABSL_FLAG(int32_t, dim, 8, "Floats per sparse row.");
ABSL_FLAG(int32_t, dense, 1024, "Dense table size, pulled and pushed whole every step.");
ABSL_FLAG(std::string, log_level, "warn", "Log level of the servers, scheduler and clients.");
ABSL_FLAG(std::vector<std::string>, bookkeeping_workers,
          std::vector<std::string>({"16", "64", "256", "1024"}),
          "Worker counts of the single-thread bookkeeping measurement; empty: none.");
ABSL_FLAG(int32_t, bookkeeping_worker_steps, 200000,
          "Worker-steps per bookkeeping measurement (steps: this / N, at least 20).");
ABSL_FLAG(int32_t, bookkeeping_repeats, 3,
          "Bookkeeping measurements per (mode, N); the fastest counts (other load only "
          "slows a run down).");

namespace ps {
namespace {

constexpr uint32_t kSparseTable = 0;
constexpr uint32_t kDenseTable = 1;
// Sparse keys come from a pool this large, so after the warm-up most rows
// exist and steps measure steady state rather than row creation.
constexpr uint64_t kKeyPool = 16384;

// A note on stderr.
template <typename... Args>
void Note(const absl::FormatSpec<Args...>& format, const Args&... args) {
  std::fprintf(stderr, "# %s\n", absl::StrFormat(format, args...).c_str());
}

struct Mode {
  ConsistencyMode mode = ASYNC;
  uint32_t staleness = 0;

  std::string Name() const {
    switch (mode) {
      case BSP:
        return "bsp";
      case SSP:
        return absl::StrCat("ssp", staleness);
      default:
        return "async";
    }
  }
};

absl::StatusOr<Mode> ParseMode(absl::string_view name) {
  if (name == "async") return Mode{ASYNC, 0};
  if (name == "bsp") return Mode{BSP, 0};
  absl::string_view bound = name;
  uint32_t staleness;
  if (absl::ConsumePrefix(&bound, "ssp") && absl::SimpleAtoi(bound, &staleness)) {
    return Mode{SSP, staleness};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--overhead_modes: '", name, "' is none of async, bsp, sspK"));
}

std::string ConfigText(const Mode& mode, int workers, int servers) {
  // Default knobs except the heartbeat (faster failure detection is not
  // measured here: a 200 ms beat up to 16 workers, spread out beyond so
  // the scheduler takes no more of the cores than at 16) and a request
  // timeout long enough that a held BSP/SSP pull never times out.
  const int heartbeat_ms = 200 * std::max(1, workers / 16);
  std::string consistency = absl::StrCat("mode: ", ConsistencyMode_Name(mode.mode));
  if (mode.mode == SSP) absl::StrAppend(&consistency, " staleness: ", mode.staleness);
  return absl::StrFormat(
      R"pb(
        name: "consistency_bench"
        cluster {
          num_servers: %d
          num_workers: %d
          heartbeat_interval_ms: %d
          heartbeat_timeout_ms: %d
          request_timeout_ms: 120000
        }
        consistency { %s }
        tables {
          id: %d
          name: "emb"
          sparse { dim: %d }
          optimizer { sgd { learning_rate: 0.01 } }
        }
        tables {
          id: %d
          name: "dense"
          # 4 blocks, so the dense table is spread over the servers.
          dense { size: %d block_size: %d }
          optimizer { sgd { learning_rate: 0.01 } }
        }
      )pb",
      servers, workers, heartbeat_ms, std::max(5000, 4 * heartbeat_ms), consistency, kSparseTable,
      absl::GetFlag(FLAGS_dim), kDenseTable, absl::GetFlag(FLAGS_dense),
      std::max(1, absl::GetFlag(FLAGS_dense) / 4));
}

using Worker = ::ps::testing::InProcessWorker;
using Cluster = ::ps::testing::InProcessCluster;

// What one worker measured over its measured steps.
struct WorkerStats {
  absl::Duration window;   // wall time from the first measured step's start to the last's end
  absl::Duration compute;  // time actually slept in simulated compute
  absl::Duration blocked;  // time in Wait(): pulls and the previous step's pushes
  int steps = 0;
  // When the window began and ended, and the CPU time used so far then by
  // the whole process (every thread: workers, I/O threads, servers,
  // scheduler) and by the servers' serving threads (summed).
  absl::Time start, end;
  absl::Duration process_cpu_start, process_cpu_end;
  absl::Duration serving_cpu_start, serving_cpu_end;
  std::vector<absl::Duration> blocked_per_step;  // for the distribution in the notes
};

absl::Duration ProcessCpu() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return absl::DurationFromTimeval(u.ru_utime) + absl::DurationFromTimeval(u.ru_stime);
}

// Compute time of `rank` at measured step `step` (0-based).
using ComputeFn = std::function<absl::Duration(uint32_t rank, int step)>;
// CPU time of the servers' serving threads so far, summed.
using ServingCpuFn = std::function<absl::Duration()>;

// Runs one worker: warm-up, barrier, measured steps, and the final clock.
// Leaving is the caller's business.
absl::Status RunWorker(Worker& w, int warmup, int steps, absl::Duration warmup_compute,
                       const ComputeFn& compute, const ServingCpuFn& serving_cpu,
                       WorkerStats* stats) {
  // Keep simulated compute close to what was asked: under BSP every step
  // waits for the longest of all workers' sleeps, so the default 50 us timer
  // slack would show up as synchronisation overhead.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  KVClient& kv = *w.kv;
  const uint32_t rank = w.member->rank();
  const size_t num_keys = absl::GetFlag(FLAGS_keys);
  const size_t dim = absl::GetFlag(FLAGS_dim);
  const size_t dense = absl::GetFlag(FLAGS_dense);
  std::vector<uint64_t> keys(num_keys);
  std::vector<float> sparse_w(num_keys * dim), dense_w(dense);
  // Small finite gradients: the values are irrelevant, their size is not.
  const std::vector<float> sparse_g(num_keys * dim, 1e-3f);
  const std::vector<float> dense_g(dense, 1e-3f);
  std::vector<Completion> in_flight;

  auto step = [&](uint64_t global_step, absl::Duration work, WorkerStats* st) -> absl::Status {
    // A different, contiguous run of the key pool per worker and step;
    // workers overlap on keys as they would in a real model.
    const uint64_t base = HashCombine(rank, global_step) % kKeyPool;
    for (size_t i = 0; i < num_keys; ++i) keys[i] = (base + i) % kKeyPool;
    const absl::Time t0 = absl::Now();
    Completion d = kv.PullDense(kDenseTable, 0, dense, dense_w.data());
    Completion s = kv.Pull(kSparseTable, keys, sparse_w.data());
    PS_RETURN_IF_ERROR(d.Wait());
    PS_RETURN_IF_ERROR(s.Wait());
    for (const Completion& c : in_flight) PS_RETURN_IF_ERROR(c.Wait());
    in_flight.clear();
    const absl::Time t1 = absl::Now();
    absl::SleepFor(work);
    const absl::Time t2 = absl::Now();
    in_flight.push_back(kv.Push(kSparseTable, keys, sparse_g));
    in_flight.push_back(kv.PushDense(kDenseTable, 0, dense_g));
    in_flight.push_back(kv.AdvanceClock());
    w.member->set_clock(kv.clock());
    if (st != nullptr) {
      st->blocked += t1 - t0;
      st->blocked_per_step.push_back(t1 - t0);
      st->compute += t2 - t1;
      ++st->steps;
    }
    return absl::OkStatus();
  };

  for (int i = 0; i < warmup; ++i) PS_RETURN_IF_ERROR(step(i, warmup_compute, nullptr));
  for (const Completion& c : in_flight) PS_RETURN_IF_ERROR(c.Wait());
  in_flight.clear();
  // Every worker starts measuring at the same clock and time, so no one has
  // a head start or a backlog from the warm-up.
  PS_RETURN_IF_ERROR(w.member->Barrier("measure", absl::Seconds(60)));
  stats->start = absl::Now();
  stats->process_cpu_start = ProcessCpu();
  stats->serving_cpu_start = serving_cpu();
  for (int i = 0; i < steps; ++i) {
    PS_RETURN_IF_ERROR(step(warmup + i, compute(rank, i), stats));
  }
  stats->end = absl::Now();
  stats->process_cpu_end = ProcessCpu();
  stats->serving_cpu_end = serving_cpu();
  stats->window = stats->end - stats->start;
  for (const Completion& c : in_flight) PS_RETURN_IF_ERROR(c.Wait());
  // Never hold back the others' synchronous waits from now on.
  PS_RETURN_IF_ERROR(kv.AdvanceClockTo(kFinishedClock).Wait());
  w.member->set_clock(kFinishedClock);
  return absl::OkStatus();
}

// File descriptors a simulated worker holds (16: sockets to the servers
// and the scheduler, ZeroMQ's mailboxes and pollers), with room to spare.
constexpr int kFdsPerWorker = 20;

// Threads and open file descriptors of this process now.
std::pair<int, int> ThreadsAndFds() {
  int threads = 0, fds = 0;
  if (DIR* d = opendir("/proc/self/task"); d != nullptr) {
    while (dirent* e = readdir(d)) threads += e->d_name[0] != '.';
    closedir(d);
  }
  if (DIR* d = opendir("/proc/self/fd"); d != nullptr) {
    while (dirent* e = readdir(d)) fds += e->d_name[0] != '.';
    closedir(d);
  }
  return {threads, fds};
}

// Starts a cluster in `mode` with `n` workers, runs them (`warmup`
// unmeasured and `steps` measured steps each) and returns their stats by
// rank.
absl::StatusOr<std::vector<WorkerStats>> RunConfig(const Mode& mode, int n, int warmup, int steps,
                                                   absl::Duration base_compute,
                                                   const ComputeFn& compute) {
  PS_ASSIGN_OR_RETURN(JobConfig config,
                      ParseJobConfig(ConfigText(mode, n, absl::GetFlag(FLAGS_servers)),
                                     "consistency_bench"));
  // Fail with the cause rather than with whatever socket call runs out.
  if (rlimit limit; getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
                    limit.rlim_cur < uint64_t(n) * kFdsPerWorker + 256) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%d workers need about %d open files, the limit is %llu: raise ulimit -n", n,
        n * kFdsPerWorker + 256, static_cast<unsigned long long>(limit.rlim_cur)));
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> cluster, Cluster::Start(config));
  const absl::Time joining = absl::Now();
  const auto [threads_before, fds_before] = ThreadsAndFds();
  PS_ASSIGN_OR_RETURN(std::vector<Worker> workers, cluster->AddWorkers(n));
  const auto [threads_after, fds_after] = ThreadsAndFds();
  Note(
      "%s w%d: %d workers joined in %.1f s with %d threads and %d file descriptors "
      "(%.1f and %.1f per worker, and one thread each to drive it)",
      mode.Name(), n, n, absl::ToDoubleSeconds(absl::Now() - joining),
      threads_after - threads_before, fds_after - fds_before,
      double(threads_after - threads_before) / n, double(fds_after - fds_before) / n);
  const int servers = absl::GetFlag(FLAGS_servers);
  const ServingCpuFn serving_cpu = [&cluster, servers] {
    uint64_t micros = 0;
    for (int i = 0; i < servers; ++i) micros += cluster->server(i).stats().serving_cpu_micros;
    return absl::Microseconds(micros);
  };
  std::vector<WorkerStats> stats(n);
  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      const uint32_t rank = workers[i].member->rank();
      results[i] =
          RunWorker(workers[i], warmup, steps, base_compute, compute, serving_cpu, &stats[rank]);
      if (!results[i].ok()) {
        // A failed worker must not leave the others waiting for its clock
        // under BSP/SSP until the request timeout.
        (void)workers[i].kv->AdvanceClockTo(kFinishedClock).Wait();
      }
    });
  }
  for (auto& t : threads) t.join();
  cluster->CloseWaits();
  for (size_t i = 0; i < workers.size(); ++i) {
    // Through the session, which then does not leave again (and warn)
    // when it is destroyed.
    absl::Status left = workers[i].session->Leave(results[i].ok());
    if (results[i].ok()) results[i] = left;
  }
  for (const absl::Status& s : results) PS_RETURN_IF_ERROR(s);
  workers.clear();
  return stats;
}

// ----------------------------------------------------------------- output

struct Figure {
  std::string metric;
  double value = 0;
  std::string unit;
  std::optional<double> baseline;
};

std::string Number(double v) {
  // Enough digits for microseconds and fractions alike, no trailing noise.
  return absl::StrFormat("%.4g", v);
}

void Emit(const Figure& f, std::vector<Figure>* all) {
  std::string baseline = "null", ratio = "null";
  if (f.baseline.has_value()) {
    baseline = Number(*f.baseline);
    if (*f.baseline != 0) ratio = Number(f.value / *f.baseline);
  }
  std::printf(
      "{\"bench\":\"consistency\",\"metric\":\"%s\",\"value\":%s,\"unit\":\"%s\","
      "\"baseline\":%s,\"ratio\":%s}\n",
      f.metric.c_str(), Number(f.value).c_str(), f.unit.c_str(), baseline.c_str(), ratio.c_str());
  std::fflush(stdout);
  all->push_back(f);
}

double Us(absl::Duration d) { return absl::ToDoubleMicroseconds(d); }

// "p50/p99/max" of the per-step blocked times of all workers, in us.
std::string BlockedDistribution(const std::vector<WorkerStats>& stats) {
  std::vector<absl::Duration> all;
  for (const WorkerStats& s : stats) {
    all.insert(all.end(), s.blocked_per_step.begin(), s.blocked_per_step.end());
  }
  if (all.empty()) return "-";
  std::sort(all.begin(), all.end());
  auto at = [&](double q) { return Us(all[static_cast<size_t>(q * (all.size() - 1))]); };
  return absl::StrFormat("%.0f/%.0f/%.0f us", at(0.5), at(0.99), Us(all.back()));
}

absl::StatusOr<std::vector<int>> IntList(const std::vector<std::string>& items, const char* flag) {
  std::vector<int> out;
  for (const std::string& s : items) {
    int v;
    if (!absl::SimpleAtoi(s, &v) || v < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": bad number '", s, "'"));
    }
    out.push_back(v);
  }
  return out;
}

// --------------------------------------------------------------- the runs

// Mean over workers of (wall time per step - time slept per step).
double StepOverheadUs(const std::vector<WorkerStats>& stats) {
  double sum = 0;
  for (const WorkerStats& s : stats) sum += Us(s.window - s.compute) / s.steps;
  return sum / stats.size();
}

// The exponent k of value ~ n^k that fits the points best (least squares
// on log-log); nullopt with fewer than two distinct n or a value <= 0.
std::optional<double> GrowthExponent(const std::vector<std::pair<int, double>>& points) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [n, v] : points) {
    if (n <= 0 || v <= 0) return std::nullopt;
    const double x = std::log(n), y = std::log(v);
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double k = points.size();
  const double d = k * sxx - sx * sx;
  if (points.size() < 2 || d <= 1e-12) return std::nullopt;
  return (k * sxy - sx * sy) / d;
}

absl::StatusOr<std::vector<Mode>> OverheadModes() {
  std::vector<Mode> modes;
  for (const std::string& name : absl::GetFlag(FLAGS_overhead_modes)) {
    PS_ASSIGN_OR_RETURN(Mode m, ParseMode(name));
    modes.push_back(m);
  }
  return modes;
}

// A server's bookkeeping per step in one thread, for each mode and N.
absl::Status Bookkeeping(std::vector<Figure>* all) {
  PS_ASSIGN_OR_RETURN(std::vector<int> counts,
                      IntList(absl::GetFlag(FLAGS_bookkeeping_workers), "bookkeeping_workers"));
  if (counts.empty()) return absl::OkStatus();
  PS_ASSIGN_OR_RETURN(std::vector<Mode> modes, OverheadModes());
  for (const Mode& mode : modes) {
    std::vector<std::pair<int, double>> points;
    for (int n : counts) {
      bench::BookkeepingOptions o;
      o.mode = mode.mode;
      o.staleness = mode.staleness;
      o.workers = n;
      o.steps = std::max(20, absl::GetFlag(FLAGS_bookkeeping_worker_steps) / std::max(1, n));
      o.warmup = std::max(2, o.steps / 10);
      o.dim = absl::GetFlag(FLAGS_dim);
      std::optional<bench::BookkeepingResult> best;
      for (int r = 0; r < std::max(1, absl::GetFlag(FLAGS_bookkeeping_repeats)); ++r) {
        PS_ASSIGN_OR_RETURN(bench::BookkeepingResult got, bench::MeasureBookkeeping(o));
        if (!best || got.ns_per_step < best->ns_per_step) best = got;
      }
      Note(
          "bookkeeping %s w%d: %.2f us per step, %.0f ns per worker-step (%d steps; "
          "%.1f pulls deferred and %.2f BSP steps applied per step; sequence windows "
          "%.0f KiB)",
          mode.Name(), n, best->ns_per_step / 1000, best->ns_per_step / n, o.steps,
          double(best->deferred) / o.steps, double(best->steps_applied) / o.steps,
          best->seq_window_bytes / 1024.0);
      points.push_back({n, best->ns_per_step});
      Emit({absl::StrCat("bookkeeping_us_per_step_", mode.Name(), "_w", n),
            best->ns_per_step / 1000, "us", std::nullopt},
           all);
    }
    if (std::optional<double> k = GrowthExponent(points)) {
      Emit({absl::StrCat("bookkeeping_growth_", mode.Name()), *k, "exponent", 1.0}, all);
    }
  }
  return absl::OkStatus();
}

// Measured (and warm-up) steps per worker for a run with n workers.
std::pair<int, int> StepsFor(int n) {
  const int most = absl::GetFlag(FLAGS_steps);
  const int fewest = std::min(most, absl::GetFlag(FLAGS_min_steps));
  const int steps = std::clamp(absl::GetFlag(FLAGS_worker_steps) / std::max(1, n), fewest, most);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  return {steps, std::min(warmup, std::max(3, warmup * steps / std::max(1, most)))};
}

// Wall and CPU time from the earliest start of a worker's measured steps
// to the latest end.
struct RunTotals {
  absl::Duration wall, process_cpu, serving_cpu;
};
RunTotals Totals(const std::vector<WorkerStats>& stats) {
  absl::Time start = absl::InfiniteFuture(), end = absl::InfinitePast();
  absl::Duration process_start = absl::InfiniteDuration(), serving_start = process_start;
  absl::Duration process_end = -absl::InfiniteDuration(), serving_end = process_end;
  for (const WorkerStats& s : stats) {
    start = std::min(start, s.start);
    end = std::max(end, s.end);
    process_start = std::min(process_start, s.process_cpu_start);
    process_end = std::max(process_end, s.process_cpu_end);
    serving_start = std::min(serving_start, s.serving_cpu_start);
    serving_end = std::max(serving_end, s.serving_cpu_end);
  }
  return {end - start, process_end - process_start, serving_end - serving_start};
}

absl::Status StepOverhead(std::vector<Figure>* all) {
  PS_ASSIGN_OR_RETURN(std::vector<int> counts,
                      IntList(absl::GetFlag(FLAGS_workers), "workers"));
  PS_ASSIGN_OR_RETURN(std::vector<Mode> modes, OverheadModes());
  const absl::Duration compute = absl::Microseconds(absl::GetFlag(FLAGS_compute_us));
  const ComputeFn fixed = [compute](uint32_t, int) { return compute; };
  const int servers = absl::GetFlag(FLAGS_servers);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  // By mode: (N, overhead) and (N, server CPU per step), for the exponents.
  std::vector<std::vector<std::pair<int, double>>> overheads(modes.size()),
      server_cpus(modes.size());
  for (int n : counts) {
    const auto [steps, warmup] = StepsFor(n);
    std::optional<double> async_overhead;
    for (size_t m = 0; m < modes.size(); ++m) {
      const absl::Time begin = absl::Now();
      PS_ASSIGN_OR_RETURN(std::vector<WorkerStats> stats,
                          RunConfig(modes[m], n, warmup, steps, compute, fixed));
      const double overhead = StepOverheadUs(stats);
      double blocked = 0, slept = 0;
      for (const WorkerStats& s : stats) {
        blocked += Us(s.blocked) / s.steps / stats.size();
        slept += Us(s.compute) / s.steps / stats.size();
      }
      // CPU from the first worker's first measured step to the last one's
      // last: every worker's measured steps, and nothing else but the ends
      // of the warm-up (workers start together after a barrier).
      const RunTotals totals = Totals(stats);
      const double cpu_per_step = Us(totals.process_cpu) / steps;
      const double serving_per_step = Us(totals.serving_cpu) / steps / servers;
      const double busy = absl::FDivDuration(totals.process_cpu, totals.wall) / cores;
      Note(
          "%s w%d: step overhead %.0f us (blocked in Wait %.0f us/step, p50/p99/max %s; "
          "slept %.0f us/step for %.0f us asked); process CPU %.0f us per worker-step, "
          "cores %.0f%% busy, CPU floor %.0f us per step of %.0f us; a server's serving "
          "thread %.0f us CPU per step (%.2f us per worker-step); %d+%d steps; run took %.2f s",
          modes[m].Name(), n, overhead, blocked, BlockedDistribution(stats), slept, Us(compute),
          cpu_per_step / n, 100 * busy, cpu_per_step / cores, slept + overhead, serving_per_step,
          serving_per_step / n, warmup, steps, absl::ToDoubleSeconds(absl::Now() - begin));
      std::optional<double> baseline;
      if (modes[m].mode == ASYNC) {
        async_overhead = overhead;
      } else {
        baseline = async_overhead;
      }
      Emit({absl::StrCat(modes[m].Name(), "_step_overhead_us_w", n), overhead, "us", baseline},
           all);
      Emit({absl::StrCat(modes[m].Name(), "_server_cpu_us_per_step_w", n), serving_per_step, "us",
            std::nullopt},
           all);
      Emit({absl::StrCat(modes[m].Name(), "_cpu_floor_us_w", n), cpu_per_step / cores, "us",
            std::nullopt},
           all);
      overheads[m].push_back({n, overhead});
      server_cpus[m].push_back({n, serving_per_step});
    }
  }
  for (size_t m = 0; m < modes.size(); ++m) {
    if (std::optional<double> k = GrowthExponent(overheads[m])) {
      Emit({absl::StrCat(modes[m].Name(), "_step_overhead_growth"), *k, "exponent", std::nullopt},
           all);
    }
    if (std::optional<double> k = GrowthExponent(server_cpus[m])) {
      Emit({absl::StrCat(modes[m].Name(), "_server_cpu_growth"), *k, "exponent", std::nullopt},
           all);
    }
  }
  return absl::OkStatus();
}

// Blocked time over wall time, summed over the workers `include` selects.
double IdleFraction(const std::vector<WorkerStats>& stats,
                    const std::function<bool(uint32_t)>& include) {
  absl::Duration blocked, window;
  for (uint32_t r = 0; r < stats.size(); ++r) {
    if (!include(r)) continue;
    blocked += stats[r].blocked;
    window += stats[r].window;
  }
  return window > absl::ZeroDuration() ? absl::FDivDuration(blocked, window) : 0;
}

absl::Status Idle(std::vector<Figure>* all) {
  PS_ASSIGN_OR_RETURN(std::vector<int> bounds,
                      IntList(absl::GetFlag(FLAGS_staleness), "staleness"));
  const int n = absl::GetFlag(FLAGS_idle_workers);
  const int steps = absl::GetFlag(FLAGS_idle_steps);
  const absl::Duration fast = absl::Microseconds(absl::GetFlag(FLAGS_idle_compute_us));
  std::vector<Mode> modes = {{ASYNC, 0}, {BSP, 0}};
  for (int s : bounds) modes.push_back({SSP, static_cast<uint32_t>(s)});

  struct Scenario {
    std::string prefix;
    ComputeFn compute;
    std::function<bool(uint32_t)> measured;  // which ranks count
  };
  const std::vector<Scenario> scenarios = {
      // Worker 0 is slow at every step; only the fast workers can idle.
      {"idle_fraction_",
       [fast](uint32_t rank, int) { return rank == 0 ? 2 * fast : fast; },
       [](uint32_t rank) { return rank != 0; }},
      // At every step one worker, the same for everybody's step i, is slow.
      {"idle_fraction_random_",
       [fast, n](uint32_t rank, int step) {
         return Mix64(0x5eed + step) % n == rank ? 2 * fast : fast;
       },
       [](uint32_t) { return true; }},
  };
  for (const Scenario& sc : scenarios) {
    double async_idle = 0;
    for (const Mode& mode : modes) {
      const absl::Time begin = absl::Now();
      PS_ASSIGN_OR_RETURN(std::vector<WorkerStats> stats,
                          RunConfig(mode, n, absl::GetFlag(FLAGS_warmup), steps, fast, sc.compute));
      const double idle = IdleFraction(stats, sc.measured);
      std::vector<std::string> per_rank;
      for (const WorkerStats& st : stats) {
        per_rank.push_back(absl::StrFormat("%.0f/%.0f ms", absl::ToDoubleMilliseconds(st.blocked),
                                           absl::ToDoubleMilliseconds(st.window)));
      }
      Note("%s%s: idle %.4f; blocked/window by rank: %s; run took %.2f s", sc.prefix, mode.Name(),
           idle, absl::StrJoin(per_rank, ", "), absl::ToDoubleSeconds(absl::Now() - begin));
      if (&sc == &scenarios[0] && mode.mode != ASYNC) {
        // With worker 0 always 2x slower, a fast worker's pull at measured
        // step i waits until worker 0 finished step i - 1 - s, so its K
        // steps take at least 2T(K-1-s) + T: bounded staleness only buys a
        // head start of about 2s steps, whatever the implementation.
        const double k = steps;
        const double s = mode.mode == SSP ? mode.staleness : 0;
        Note("  floor for %s with a persistent 2x straggler over %d steps (zero-cost "
             "messaging): %.4f",
             mode.Name(), steps, std::max(0.0, 1 - k / (2 * (k - 1 - s) + 1)));
      }
      std::optional<double> baseline;
      if (mode.mode == ASYNC) {
        async_idle = idle;
      } else {
        baseline = async_idle;
      }
      Emit({absl::StrCat(sc.prefix, mode.Name()), idle, "fraction", baseline}, all);
    }
  }
  return absl::OkStatus();
}

// Raises this process's soft limit of open files to its hard limit: each
// simulated worker holds 16 descriptors, and the usual soft limit of 1 024
// is spent before 64 workers.
void RaiseFileLimit() {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &limit);
    getrlimit(RLIMIT_NOFILE, &limit);
  }
  Note("open files: at most %llu (ulimit -n); each worker takes 16",
       static_cast<unsigned long long>(limit.rlim_cur));
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = SetLogLevel(absl::GetFlag(FLAGS_log_level)); !s.ok()) {
    std::fprintf(stderr, "consistency_bench: %s\n", s.ToString().c_str());
    return 2;
  }
  const unsigned cores = std::thread::hardware_concurrency();
  Note(
      "consistency bench: %d servers, %d sparse keys x dim %d + %d dense floats per step; "
      "compute is simulated by sleeping (timer slack 1 ns), not spinning, so worker "
      "threads waiting for %u cores do not pass for compute",
      absl::GetFlag(FLAGS_servers), absl::GetFlag(FLAGS_keys), absl::GetFlag(FLAGS_dim),
      absl::GetFlag(FLAGS_dense), cores);
  RaiseFileLimit();
  const absl::Time begin = absl::Now();
  std::vector<Figure> all;
  absl::Status status = Bookkeeping(&all);
  if (status.ok()) status = StepOverhead(&all);
  if (status.ok() && absl::GetFlag(FLAGS_idle_workers) > 0) status = Idle(&all);
  if (!status.ok()) {
    std::fprintf(stderr, "consistency_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  std::vector<std::string> summary;
  for (const Figure& f : all) {
    summary.push_back(absl::StrCat("\"", f.metric, "\":", Number(f.value)));
  }
  std::printf(
      "{\"bench\":\"consistency\",\"summary\":{%s},\"settings\":{\"servers\":%d,"
      "\"compute_us\":%d,\"steps\":%d,\"worker_steps\":%d,\"min_steps\":%d,\"warmup\":%d,"
      "\"idle_workers\":%d,\"idle_steps\":%d,"
      "\"idle_compute_us\":%d,\"keys\":%d,\"dim\":%d,\"dense\":%d,\"cores\":%u,"
      "\"seconds\":%.1f}}\n",
      absl::StrJoin(summary, ",").c_str(), absl::GetFlag(FLAGS_servers),
      absl::GetFlag(FLAGS_compute_us), absl::GetFlag(FLAGS_steps),
      absl::GetFlag(FLAGS_worker_steps), absl::GetFlag(FLAGS_min_steps),
      absl::GetFlag(FLAGS_warmup), absl::GetFlag(FLAGS_idle_workers),
      absl::GetFlag(FLAGS_idle_steps), absl::GetFlag(FLAGS_idle_compute_us),
      absl::GetFlag(FLAGS_keys), absl::GetFlag(FLAGS_dim), absl::GetFlag(FLAGS_dense), cores,
      absl::ToDoubleSeconds(absl::Now() - begin));
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
