// Scaling: aggregate training examples/s of a whole job as real processes
// with 1, 2, 4 and 8 workers, for LR and DLRM-lite, under ASYNC and BSP.
//
// Every configuration is a fresh job on loopback started by
// tests/testing/job_harness: scheduler_main, --servers server_main and N
// trainer processes, training synthetic click data that each worker
// generates for its own shard (as the demo and fault_test do). The models
// and optimizers are those of examples/ctr/async.pbtxt (LR, batch 1024)
// and examples/ctr/dlrm.pbtxt (DLRM-lite, batch 512), on the CPU with one
// compute thread per worker. Scaling is weak: every worker trains --steps
// batches (one epoch of a shard of steps x batch examples), so the job
// with N workers trains N times the examples of the job with one.
//
// Examples/s is measured over training alone, from the worker logs: the
// job's examples (the sum of the workers' "trained N examples") divided by
// the time from the first worker's first step ("training shard ..." line,
// logged after registration, the wait for every worker and the initial
// dense barrier) to the last worker's last step (its "epoch ... done"
// line, before the final barrier and the evaluation). The log timestamps
// have millisecond resolution, all processes share one clock, and the
// window lasts seconds. Process start, registration and evaluation, which
// the harness's wall time includes, are left out; that wall time is in the
// notes.
//
// With --repeats=R every configuration runs R times and the median counts.
// On a machine this small any other load lowers the figures, so each job's
// note says what share of the CPUs other processes used meanwhile (from
// /proc/stat minus this process's and its children's CPU time), with a
// warning above 5 %, and the summary's settings give the largest share.
//
// Exits 1 when a job failed, or trained everything but did not end soundly
// (more than one worker printed a summary: its figure is still printed);
// the job files are then kept.
//
// One line per configuration:
//   {"bench":"scaling","metric":"<model>_<mode>_w<N>_examples_per_s",...}
// with baseline = the same model and mode with one worker in this run
// (null when --workers has no 1) and ratio = the speed-up. A table with
// speed-ups and efficiency (speed-up / N) goes to stderr, with the
// machine's core count: every process of a job shares those cores, so more
// workers than cores cannot speed training up here.
//
// The binaries come from the runfiles tree (the `data` of this target):
// TEST_SRCDIR when set (bazel test), else RUNFILES_DIR, else the
// .runfiles directory next to this binary, so it also runs straight from
// bazel-bin as tests/bench.sh does.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
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
#include "absl/time/time.h"
#include "common/status.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/job_harness.h"
#include "tests/testing/subprocess.h"

ABSL_FLAG(std::string, workers, "1,2,4,8", "Worker counts to run.");
ABSL_FLAG(std::string, models, "lr,dlrm", "Models: lr, dlrm.");
ABSL_FLAG(std::string, modes, "async,bsp", "Consistency modes: async, bsp.");
ABSL_FLAG(int32_t, servers, 2, "Server processes per job.");
ABSL_FLAG(int64_t, steps, 0,
          "Steps (batches) per worker; 0: the model's default (lr 800 of "
          "1024 examples, dlrm 300 of 512): about 2 s of training with one "
          "worker on the 2-core VM, 10-15 s with 8.");
ABSL_FLAG(int32_t, repeats, 1,
          "Jobs per configuration; the median is reported. Odd counts "
          "avoid picking between two.");
ABSL_FLAG(std::string, dir, "",
          "Directory for the jobs' files (configs, logs), kept. Default: a "
          "temporary directory, removed at the end unless a job failed.");

namespace ps {
namespace {

using ::ps::bench::Cores;
using ::ps::bench::CpuSample;
using ::ps::bench::FindRunfiles;
using ::ps::bench::LineTime;
using ::ps::bench::LoadAverage;
using ::ps::bench::SampleCpu;
using ::ps::testing::JobHarness;
using ::ps::testing::ReadFile;

// A job trains for seconds; one that runs this long has hung.
constexpr absl::Duration kJobTimeout = absl::Minutes(3);
// Above this share of the CPUs taken by other processes during a job, its
// figure is flagged as disturbed. The bench's own polling and the kernel
// stay well below it on an idle machine.
constexpr double kDisturbed = 0.05;

struct Model {
  std::string name;  // flag value and metric prefix
  uint32_t batch;
  int64_t default_steps;
};

// Tables, data and training blocks of examples/ctr/async.pbtxt and
// examples/ctr/dlrm.pbtxt, with a small test set: the evaluation is not
// measured, so it only has to be quick.
std::string ModelBlocks(const Model& model, uint64_t num_train) {
  if (model.name == "lr") {
    return absl::StrFormat(R"pb(
      tables {
        id: 0 name: "ctr_sparse" sparse { dim: 1 }
        optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
        init { kind: ZEROS }
      }
      tables {
        id: 1 name: "ctr_dense" dense { size: 14 }
        optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
        init { kind: ZEROS }
      }
      data { synthetic_ctr { num_train: %d num_test: 8192 seed: 1 } }
      training {
        batch_size: %d epochs: 1 log_interval_s: 1 device: CPU
        sparse_table: "ctr_sparse" dense_table: "ctr_dense"
      }
    )pb", num_train, model.batch);
  }
  return absl::StrFormat(R"pb(
    tables {
      id: 0 name: "embeddings" sparse { dim: 16 }
      optimizer { adagrad { learning_rate: 0.3 initial_accumulator: 1e-6 } }
      init { kind: NORMAL scale: 0.1 }
    }
    tables {
      id: 1 name: "mlp" dense { size: 0 }
      optimizer { adam { learning_rate: 0.01 } }
    }
    data {
      synthetic_ctr {
        num_train: %d num_test: 8192 seed: 1
        interaction_rank: 8 interaction_scale: 0.2
      }
    }
    training {
      batch_size: %d epochs: 1 log_interval_s: 1 device: CPU
      sparse_table: "embeddings" dense_table: "mlp"
      model { kind: DLRM embedding_dim: 16 bottom_mlp: 64 top_mlp: 64 }
    }
  )pb", num_train, model.batch);
}

std::string JobText(const Model& model, const std::string& mode, int servers,
                      int workers, uint64_t steps) {
  // The default heartbeat timeout (5 s) leaves room for up to 11 processes
  // sharing two cores; a false death would end the measurement.
  return absl::StrCat(
      absl::StrFormat(R"pb(
        name: "scaling-%s-%s-w%d"
        cluster { num_servers: %d num_workers: %d }
        consistency { mode: %s }
      )pb", model.name, mode, workers, servers, workers,
                      absl::AsciiStrToUpper(mode)),
      ModelBlocks(model, steps * model.batch * workers));
}

// What one worker's log says about its training.
struct WorkerTimes {
  std::optional<absl::Time> first_step;  // its first "training shard" line
  std::optional<absl::Time> last_step;   // its last "epoch ... done" line
  uint64_t examples = 0;                 // "trained N examples"
};

WorkerTimes ParseWorkerLog(const std::string& log) {
  WorkerTimes w;
  for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
    if (absl::StrContains(line, "trainer: training shard ")) {
      if (!w.first_step) w.first_step = LineTime(line);
    } else if (absl::StrContains(line, " done: mean training loss")) {
      w.last_step = LineTime(line);
    } else if (const size_t at = line.find("worker: trained ");
               at != absl::string_view::npos) {
      absl::string_view rest = line.substr(at + 16);
      uint64_t n = 0;
      if (absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &n)) w.examples += n;
    }
  }
  return w;
}

struct Figure {
  double examples_per_s = 0;
  uint64_t examples = 0;
  double train_s = 0;         // first step to last step
  double start_spread_s = 0;  // first worker's first step to the last's
  double end_spread_s = 0;    // first worker done to last worker done
  double job_s = 0;           // the harness's start to every process's exit
  // Share of the machine's CPU time that processes other than this bench
  // and its job used while the job ran (0..1).
  double other_load = 0;
  // Why the job, although it trained every example, was not sound; "" if
  // it was.
  std::string anomaly;
};

absl::StatusOr<Figure> RunJob(const Model& model, const std::string& mode,
                              int servers, int workers, uint64_t steps,
                              const std::string& dir) {
  JobHarness::Options options;
  options.dir = dir;
  options.config = JobText(model, mode, servers, workers, steps);
  options.num_servers = servers;
  options.num_workers = workers;
  const CpuSample before = SampleCpu();
  auto job = JobHarness::Start(options);
  if (!job.ok()) return job.status();
  auto result = (*job)->Wait(kJobTimeout);
  const CpuSample after = SampleCpu();
  if (!result.ok()) {
    return absl::Status(result.status().code(),
                        absl::StrCat(result.status().message(), "\n",
                                     (*job)->LogTails(15)));
  }
  std::vector<int> codes = result->workers;
  codes.insert(codes.end(), result->servers.begin(), result->servers.end());
  codes.push_back(result->scheduler);
  if (std::any_of(codes.begin(), codes.end(), [](int c) { return c != 0; })) {
    return absl::InternalError(absl::StrCat(
        "the job did not end cleanly: workers exited [",
        absl::StrJoin(result->workers, ","), "], servers [",
        absl::StrJoin(result->servers, ","), "], scheduler ", result->scheduler,
        "\n", (*job)->LogTails(15)));
  }
  Figure f;
  // Training is over by the time summaries are printed, so the figure
  // stands; the caller still reports the job as not sound.
  if (result->summaries != 1) {
    f.anomaly = absl::StrCat(result->summaries,
                             " workers printed a summary (one evaluates in a "
                             "sound job); see the worker logs in ",
                             dir);
  }
  std::optional<absl::Time> first, last, last_start, first_done;
  for (int i = 0; i < (*job)->num_worker_processes(); ++i) {
    const WorkerTimes w = ParseWorkerLog(ReadFile((*job)->worker(i).stderr_path()));
    if (!w.first_step || !w.last_step) {
      return absl::InternalError(absl::StrCat(
          JobHarness::WorkerName(i), " logged no first or last step in ",
          (*job)->worker(i).stderr_path()));
    }
    f.examples += w.examples;
    first = first ? std::min(*first, *w.first_step) : *w.first_step;
    last = last ? std::max(*last, *w.last_step) : *w.last_step;
    last_start = last_start ? std::max(*last_start, *w.first_step) : *w.first_step;
    first_done = first_done ? std::min(*first_done, *w.last_step) : *w.last_step;
  }
  const uint64_t expected = steps * model.batch * workers;
  if (f.examples != expected) {
    return absl::InternalError(absl::StrCat("the workers trained ", f.examples,
                                            " examples, not ", expected));
  }
  f.train_s = absl::ToDoubleSeconds(*last - *first);
  if (f.train_s <= 0) return absl::InternalError("no training time measured");
  f.examples_per_s = f.examples / f.train_s;
  f.start_spread_s = absl::ToDoubleSeconds(*last_start - *first);
  f.end_spread_s = absl::ToDoubleSeconds(*last - *first_done);
  f.job_s = absl::ToDoubleSeconds(result->elapsed);
  const double capacity = absl::ToDoubleSeconds(after.when - before.when) * Cores();
  if (capacity > 0) {
    f.other_load = std::max(0.0, ((after.machine_busy_s - before.machine_busy_s) -
                                  (after.own_s - before.own_s)) /
                                     capacity);
  }
  return f;
}

std::string Thousands(double v) {
  std::string digits = absl::StrFormat("%.0f", v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

int Main(const char* argv0) {
  const std::map<std::string, Model> known = {
      {"lr", {"lr", 1024, 800}}, {"dlrm", {"dlrm", 512, 300}}};
  std::vector<Model> models;
  for (absl::string_view m : absl::StrSplit(absl::GetFlag(FLAGS_models), ',')) {
    auto it = known.find(std::string(m));
    if (it == known.end()) {
      std::fprintf(stderr, "scaling_bench: unknown model '%s' (lr, dlrm)\n",
                   std::string(m).c_str());
      return 2;
    }
    models.push_back(it->second);
  }
  std::vector<std::string> modes;
  for (absl::string_view m : absl::StrSplit(absl::GetFlag(FLAGS_modes), ',')) {
    if (m != "async" && m != "bsp") {
      std::fprintf(stderr, "scaling_bench: unknown mode '%s' (async, bsp)\n",
                   std::string(m).c_str());
      return 2;
    }
    modes.emplace_back(m);
  }
  std::vector<int> worker_counts;
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_workers), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(w, &n) || n < 1 || n > 64) {
      std::fprintf(stderr, "scaling_bench: bad worker count '%s' (1..64)\n",
                   std::string(w).c_str());
      return 2;
    }
    worker_counts.push_back(n);
  }
  const int servers = absl::GetFlag(FLAGS_servers);
  const int64_t steps_flag = absl::GetFlag(FLAGS_steps);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (servers < 1 || steps_flag < 0 || repeats < 1) {
    std::fprintf(stderr,
                 "scaling_bench: --servers and --repeats must be >= 1, "
                 "--steps >= 0\n");
    return 2;
  }
  if (absl::Status s = FindRunfiles(argv0); !s.ok()) {
    std::fprintf(stderr, "scaling_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  std::string base = absl::GetFlag(FLAGS_dir);
  const bool keep = !base.empty();
  if (keep) {
    std::filesystem::create_directories(base);
  } else {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp ? tmp : "/tmp", "/scaling_bench.XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("scaling_bench: mkdtemp");
      return 1;
    }
    base = pattern;
  }

  const int cores = Cores();
  std::fprintf(stderr,
               "# scaling: nproc = %d. Every process of a job (scheduler, %d "
               "servers, N workers) shares these %d core(s): more than %d "
               "worker(s) cannot speed training up on this machine (and even "
               "%d share the cores with the servers), so speed-ups beyond "
               "that measure contention, not what the system does with a "
               "core (or machine) per worker. Load average before: %s.\n",
               cores, servers, cores, cores, cores, LoadAverage().c_str());

  // by column (model, mode), then worker count
  std::map<std::pair<std::string, std::string>, std::map<int, Figure>> figures;
  std::vector<std::string> summary;
  bool failed = false;
  double max_other_load = 0;
  for (const Model& model : models) {
    const uint64_t steps = steps_flag > 0 ? steps_flag : model.default_steps;
    for (const std::string& mode : modes) {
      auto& column = figures[{model.name, mode}];
      for (int n : worker_counts) {
        const std::string name = absl::StrCat(model.name, "_", mode, "_w", n);
        // Repeats are measured one after another; the median is reported.
        std::vector<Figure> runs;
        for (int r = 0; r < repeats; ++r) {
          const std::string run_name =
              repeats > 1 ? absl::StrCat(name, "_r", r) : name;
          auto f = RunJob(model, mode, servers, n, steps,
                          absl::StrCat(base, "/", run_name));
          if (!f.ok()) {
            std::fprintf(stderr, "# scaling: %s failed: %s\n", run_name.c_str(),
                         f.status().ToString().c_str());
            failed = true;
            continue;
          }
          std::fprintf(stderr,
                       "# %s: %d x %d steps of %u = %lu examples in %.2f s of "
                       "training (first to last step; workers started within "
                       "%.2f s and finished within %.2f s of each other): %.0f "
                       "examples/s; whole job %.1f s; other processes used "
                       "%.0f%% of the CPUs meanwhile\n",
                       run_name.c_str(), n, static_cast<int>(steps), model.batch,
                       static_cast<unsigned long>(f->examples), f->train_s,
                       f->start_spread_s, f->end_spread_s, f->examples_per_s,
                       f->job_s, 100 * f->other_load);
          max_other_load = std::max(max_other_load, f->other_load);
          if (f->other_load > kDisturbed) {
            std::fprintf(stderr,
                         "# scaling: WARNING: %s ran while other processes used "
                         "%.0f%% of the CPUs: its figure is low by about that "
                         "much or more\n",
                         run_name.c_str(), 100 * f->other_load);
          }
          if (!f->anomaly.empty()) {
            std::fprintf(stderr, "# scaling: WARNING: %s: %s\n", run_name.c_str(),
                         f->anomaly.c_str());
            failed = true;
          }
          runs.push_back(*f);
        }
        if (runs.empty()) continue;
        std::sort(runs.begin(), runs.end(), [](const Figure& a, const Figure& b) {
          return a.examples_per_s < b.examples_per_s;
        });
        const Figure* f = &runs[(runs.size() - 1) / 2];
        column[n] = *f;
        auto one = column.find(1);
        const double baseline = one == column.end() ? 0 : one->second.examples_per_s;
        std::printf(
            "{\"bench\":\"scaling\",\"metric\":\"%s_examples_per_s\",\"value\":"
            "%.0f,\"unit\":\"examples/s\",\"baseline\":%s,\"ratio\":%s}\n",
            name.c_str(), f->examples_per_s,
            baseline > 0 ? absl::StrFormat("%.0f", baseline).c_str() : "null",
            baseline > 0 ? absl::StrFormat("%.2f", f->examples_per_s / baseline).c_str()
                         : "null");
        std::fflush(stdout);
        summary.push_back(absl::StrFormat("\"%s\":%.0f", name, f->examples_per_s));
      }
    }
  }

  // The table: one row per worker count, one column per (model, mode).
  std::string header = absl::StrFormat("# %7s", "workers");
  for (const Model& model : models) {
    for (const std::string& mode : modes) {
      absl::StrAppend(&header, absl::StrFormat(" | %-28s",
                                               absl::StrCat(model.name, " ", mode)));
    }
  }
  std::fprintf(stderr,
               "# scaling: aggregate examples/s (speed-up over 1 worker, "
               "efficiency = speed-up / workers)\n%s\n",
               header.c_str());
  for (int n : worker_counts) {
    std::string row = absl::StrFormat("# %7d", n);
    for (const Model& model : models) {
      for (const std::string& mode : modes) {
        const auto& column = figures[{model.name, mode}];
        auto it = column.find(n);
        auto one = column.find(1);
        std::string cell = "failed";
        if (it != column.end()) {
          cell = Thousands(it->second.examples_per_s);
          if (one != column.end()) {
            const double speedup =
                it->second.examples_per_s / one->second.examples_per_s;
            absl::StrAppend(&cell, absl::StrFormat(" (%.2fx, %.2f)", speedup,
                                                   speedup / n));
          }
        }
        absl::StrAppend(&row, absl::StrFormat(" | %-28s", cell));
      }
    }
    std::fprintf(stderr, "%s\n", row.c_str());
  }
  std::fprintf(stderr, "# nproc = %d%s; load average after: %s\n", cores,
               cores < *std::max_element(worker_counts.begin(), worker_counts.end())
                   ? ": rows with more workers than cores show CPU contention, "
                     "not scaling"
                   : "",
               LoadAverage().c_str());

  std::printf(
      "{\"bench\":\"scaling\",\"summary\":{%s},\"settings\":{\"nproc\":%d,"
      "\"max_other_load\":%.2f,\"servers\":%d,\"lr_steps\":%ld,"
      "\"dlrm_steps\":%ld,\"lr_batch\":1024,\"dlrm_batch\":512}}\n",
      absl::StrJoin(summary, ",").c_str(), cores, max_other_load, servers,
      static_cast<long>(steps_flag > 0 ? steps_flag : known.at("lr").default_steps),
      static_cast<long>(steps_flag > 0 ? steps_flag : known.at("dlrm").default_steps));
  if (failed) {
    std::fprintf(stderr, "# scaling: a job failed or was not sound; job files "
                         "kept in %s\n", base.c_str());
    return 1;
  }
  if (!keep) {
    std::error_code ec;
    std::filesystem::remove_all(base, ec);
  }
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ps::Main(argv[0]);
}
