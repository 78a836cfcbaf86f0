// What the whole-job benchmarks (scaling_bench, rebalance_bench) share:
// finding the binaries they start, reading the times in the processes'
// logs, and telling how busy the machine was while they measured.
//
// Thread compatible: plain functions; FindRunfiles sets an environment
// variable, so call it from main() before starting any thread.
#ifndef PS_TESTS_BENCH_BENCH_UTIL_H_
#define PS_TESTS_BENCH_BENCH_UTIL_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/status.h"

namespace ps::bench {

// Points TEST_SRCDIR (what testing::Runfile reads) at this binary's
// runfiles unless bazel test already did. NOT_FOUND, naming the places
// looked at, when none holds scheduler/scheduler_main.
absl::Status FindRunfiles(const char* argv0);

// "2026-11-23 12:34:56.789 I [server/0] ...": the line's time, or nullopt
// when it does not start with one. Every process logs in this machine's
// local zone, as this process reads it, so the times compare with
// absl::Now() as well as with each other.
std::optional<absl::Time> LineTime(absl::string_view line);

// The CPUs this process may run on (what nproc prints).
int Cores();

// CPU time, for telling how much of the machine other processes took
// during a run: on a 2-core VM a compiler running meanwhile moves every
// figure, and nothing else would show it.
struct CpuSample {
  absl::Time when;
  double machine_busy_s = 0;  // all CPUs, from /proc/stat
  double own_s = 0;           // this process and its reaped children
};
CpuSample SampleCpu();

// CPU seconds (utime + stime, /proc/PID/stat) of processes still running,
// summed: children count in RUSAGE_CHILDREN only once reaped, so a sample
// taken while they run reads them here. A pid that is gone counts 0.
double RunningCpuSeconds(const std::vector<pid_t>& pids);

// The 1, 5 and 15 minute load averages ("0.52 0.61 0.70"), or "unknown".
std::string LoadAverage();

// The q-quantile (0..1) of `v` by nearest rank; 0 when empty.
double Quantile(std::vector<double> v, double q);
double Median(std::vector<double> v);

// Reads or writes exactly n bytes of a blocking descriptor (a pipe or a
// socket between a bench and its children), going on after EINTR; false at
// end of file or on an error.
bool ReadFull(int fd, void* buf, size_t n);
bool WriteFull(int fd, const void* buf, size_t n);

}  // namespace ps::bench

#endif  // PS_TESTS_BENCH_BENCH_UTIL_H_
