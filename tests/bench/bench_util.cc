#include "tests/bench/bench_util.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/testing/subprocess.h"

namespace ps::bench {

using ::ps::testing::ReadFile;

absl::Status FindRunfiles(const char* argv0) {
  if (std::getenv("TEST_SRCDIR") != nullptr) return absl::OkStatus();
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("RUNFILES_DIR")) candidates.push_back(dir);
  std::error_code ec;
  const std::filesystem::path exe =
      std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.string() + ".runfiles");
  candidates.push_back(std::string(argv0) + ".runfiles");
  for (const std::string& dir : candidates) {
    struct stat st;
    if (stat((dir + "/ps/scheduler/scheduler_main").c_str(), &st) == 0) {
      setenv("TEST_SRCDIR", dir.c_str(), 1);
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "no runfiles with scheduler/scheduler_main among: ",
      absl::StrJoin(candidates, ", "),
      " (build with bazel and run the binary from bazel-bin, or via bazel "
      "run)"));
}

std::optional<absl::Time> LineTime(absl::string_view line) {
  if (line.size() < 23) return std::nullopt;
  absl::Time t;
  std::string err;
  if (!absl::ParseTime("%Y-%m-%d %H:%M:%E3S", std::string(line.substr(0, 23)),
                       absl::LocalTimeZone(), &t, &err)) {
    return std::nullopt;
  }
  return t;
}

int Cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

CpuSample SampleCpu() {
  CpuSample c;
  c.when = absl::Now();
  // "cpu  user nice system idle iowait irq softirq steal ...", in ticks.
  std::vector<std::string> fields =
      absl::StrSplit(ReadFile("/proc/stat").substr(0, 200),
                     absl::ByAnyChar(" \n"), absl::SkipEmpty());
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  for (int i : {1, 2, 3, 6, 7}) {  // user nice system irq softirq
    double v = 0;
    if (static_cast<int>(fields.size()) > i &&
        absl::SimpleAtod(fields[i], &v)) {
      c.machine_busy_s += v / tick;
    }
  }
  for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
    struct rusage u;
    if (getrusage(who, &u) == 0) {
      c.own_s += u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 +
                 u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
    }
  }
  return c;
}

double RunningCpuSeconds(const std::vector<pid_t>& pids) {
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  double total = 0;
  for (pid_t pid : pids) {
    const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::vector<std::string> f =
        absl::StrSplit(stat.substr(paren + 2), ' ', absl::SkipEmpty());
    double u = 0, s = 0;
    // Fields 14 and 15 of the line; 3 is the first after the name.
    if (f.size() > 12 && absl::SimpleAtod(f[11], &u) &&
        absl::SimpleAtod(f[12], &s)) {
      total += (u + s) / tick;
    }
  }
  return total;
}

std::string LoadAverage() {
  std::vector<std::string> fields =
      absl::StrSplit(ReadFile("/proc/loadavg"), ' ', absl::SkipEmpty());
  if (fields.size() < 3) return "unknown";
  return absl::StrCat(fields[0], " ", fields[1], " ", fields[2]);
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * v.size()));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

double Median(std::vector<double> v) { return Quantile(std::move(v), 0.5); }

bool ReadFull(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteFull(int fd, const void* buf, size_t n) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t r = write(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace ps::bench
