// All-reduce bench: the bytes each machine sends and receives per step, and
// the time a step takes, when P workers synchronise N floats of dense
// parameters in the three ways of the cost table in the lectures this
// project grew from, each measurement beside its formula (N in bytes: 4 per
// float):
//
//   ps_single     (a) one KVServer holds the whole dense table. Each worker
//                 pushes N and pulls N a step; the server receives P*N and
//                 sends P*N (fan-in P).
//   ps_sharded    (b) the table in P equal blocks on P KVServers, each server
//                 on a machine (namespace) of its own, apart from the
//                 workers: a worker sends N and receives N a step, N/P to and
//                 from each server; a server receives P*N/P = N and sends N.
//   ps_colocated  (b) the same P servers, server i on worker i's machine
//                 (the usual layout): the local 1/P of each push and pull
//                 stays on the machine's loopback, so 2*(P-1)*N/P leaves and
//                 2*(P-1)*N/P enters each machine a step.
//   ring          (c) gloo's AllreduceRingChunked (reduce-scatter, then
//                 all-gather, around a ring of P processes, in 2*P chunks):
//                 each sends and receives 2*(P-1)*N/P a step.
//
// A parameter-server step is synchronous, as an all-reduce step is: BSP. A
// worker pushes its gradient, advances its clock and pulls; the pull is
// answered once every worker's push of the step has been applied (averaged,
// SGD). A ring step is the all-reduce of the gradient, then SGD on the
// worker's own replica. Every process does nothing else.
//
// Bytes are counted, not computed. Every process runs in a network namespace
// (tests/testing/netns.h) joined to the others by a veth pair to a bridge,
// every veth's MTU raised to --mtu (65535) so that TCP/IP headers are a
// small share, and receive packet steering on the bridge's ends so that no
// flow is reordered between the two CPUs (--steer_flows, SteerHubFlows: a
// reordered segment is sent again though never lost). A figure is the eth0
// counters of a namespace (/proc/<pid>/net/dev of a process in it) over the
// timed steps, divided by the steps: Ethernet, IP and TCP headers, ACKs,
// retransmissions, ZeroMQ framing, the data plane's request headers, BSP
// clock messages and gloo's notifications included. Each line also carries
// "payload_bytes": that less 66 bytes a packet (Ethernet 14, IPv4 20, TCP
// with timestamps 32), the bytes TCP carried.
//
// Each run forks its processes from this one, which first moves into a
// network namespace of its own (the bridge's side) and starts no thread:
// servers first, then workers. The workers run --warmup steps, wait while
// the counters are read, run the timed steps (--steps, or more where those
// would take less than --min_seconds: CPU time is counted in 10 ms ticks)
// and wait again while the counters are read, so only the timed steps fall
// between the two readings.
//
// Needs root (namespaces), ip, nft and tc; without them it says why and
// skips. Not for a Bazel sandbox: tests/bench.sh runs it from bazel-bin.
//
// Output (tests/bench.sh): one JSON line per (arch, N, P, role, metric):
//   bytes_{sent,received}_per_step_{worker,server,machine}: the mean over
//     the role's namespaces; baseline and formula_bytes: the formula;
//     ratio = value / formula; worst_ratio: the namespace farthest from the
//     formula; payload_bytes and packets (per step), and over the whole
//     run the TCP segments the namespaces sent again (retransmits), their
//     tail loss probes (loss_probes: new data or old), retransmission
//     timeouts (rto_timeouts) and eth0's drops;
//   step_ms: the median over the timed steps of the slowest worker's step;
//     baseline: the ring's step_ms at the same N and P;
// then a summary line; on stderr a table and, per N, which architecture was
// fastest and whether the CPU or the network limited it.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/allocator.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/status.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"
#include "server/server.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/netns.h"
#include "worker/kv_client.h"

ABSL_FLAG(std::vector<std::string>, sizes,
          std::vector<std::string>({"64Ki", "1Mi", "4Mi"}),
          "Dense sizes N, in floats: numbers, optionally with a Ki or Mi "
          "suffix (1024, 1048576).");
ABSL_FLAG(std::vector<std::string>, workers,
          std::vector<std::string>({"2", "3", "4"}),
          "Worker counts P (2..16).");
ABSL_FLAG(int32_t, steps, 10,
          "Timed steps per run, at least (see --min_seconds).");
ABSL_FLAG(double, min_seconds, 0.5,
          "More timed steps where --steps would take less than this at the "
          "pace of the last warm-up step (at most 5000): the CPU figures "
          "need a window of many 10 ms ticks. 0: exactly --steps.");
ABSL_FLAG(int32_t, warmup, 3,
          "Untimed steps before them (connections, first buffers).");
ABSL_FLAG(std::vector<std::string>, archs,
          std::vector<std::string>({"ps_single", "ps_sharded", "ps_colocated",
                                    "ring"}),
          "Architectures to run: ps_single, ps_sharded, ps_colocated, ring.");
ABSL_FLAG(int32_t, mtu, 65535,
          "MTU of every veth and the bridge (1280..65535).");
ABSL_FLAG(double, tolerance, 0.05,
          "Band around the formula that a byte figure should fall in (0.05: "
          "within 5 %); figures outside are flagged on stderr and counted in "
          "the summary.");
ABSL_FLAG(
    bool, steer_flows, true,
    "Receive packet steering on the bridge's veth ends, so that no flow "
    "is reordered between the CPUs (SteerHubFlows); false: the "
    "kernel's default, and up to about 1 % more bytes from retransmissions "
    "of reordered segments.");
ABSL_FLAG(std::string, log_level, "warn", "Log level of servers and clients.");

namespace ps {
namespace {

using bench::ReadFull;
using bench::WriteFull;
using testing::NetworkLab;

constexpr uint32_t kNumSlots = 4096;
constexpr uint64_t kWorkerNodeIdBase = 1000;
constexpr int kFirstPort = 20000;
// Ethernet (14) + IPv4 (20) + TCP with timestamps (32): one packet's headers.
constexpr double kHeaderBytes = 66;
constexpr float kLearningRate = 0.01f;

// ---------------------------------------------------------------------------
// Architectures and their formulas.

enum class Arch { kSingle, kSharded, kColocated, kRing };

constexpr std::pair<Arch, const char*> kArchNames[] = {
    {Arch::kSingle, "ps_single"},
    {Arch::kSharded, "ps_sharded"},
    {Arch::kColocated, "ps_colocated"},
    {Arch::kRing, "ring"},
};

const char* Name(Arch arch) {
  for (const auto& [a, name] : kArchNames) {
    if (a == arch) return name;
  }
  return "?";
}

absl::StatusOr<Arch> ParseArch(absl::string_view text) {
  for (const auto& [a, name] : kArchNames) {
    if (text == name) return a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--archs: unknown architecture '", text,
                   "' (ps_single, ps_sharded, ps_colocated, ring)"));
}

// Lab nodes: workers (and the co-located servers) on "w<i>", the servers of
// ps_single and ps_sharded on "s<i>".
std::string WorkerNode(int i) { return absl::StrCat("w", i); }
std::string ServerNode(int i) { return absl::StrCat("s", i); }

// What a namespace is in `arch`: "worker", "server" or "machine" (a worker
// and a server).
std::string RoleOf(Arch arch, const std::string& node) {
  if (node[0] == 's') return "server";
  return arch == Arch::kColocated ? "machine" : "worker";
}

// Payload bytes a namespace of `role` sends per step, and receives (the same
// in every layout here).
double FormulaBytes(Arch arch, const std::string& role, uint64_t n, int p) {
  const double bytes = 4.0 * static_cast<double>(n);
  switch (arch) {
    case Arch::kSingle:
      return role == "server" ? p * bytes : bytes;
    case Arch::kSharded:
      return bytes;
    case Arch::kColocated:
    case Arch::kRing:
      return 2.0 * (p - 1) * bytes / p;
  }
  return 0;
}

const char* FormulaText(Arch arch, const std::string& role) {
  switch (arch) {
    case Arch::kSingle:
      return role == "server" ? "P*N" : "N";
    case Arch::kSharded:
      return role == "server" ? "P*N/P" : "N";
    case Arch::kColocated:
    case Arch::kRing:
      return "2*(P-1)*N/P";
  }
  return "?";
}

struct RunSpec {
  Arch arch = Arch::kRing;
  uint64_t n = 0;  // floats
  int p = 0;       // workers
  int warmup = 0;
  int steps = 0;           // at least this many timed steps
  double min_seconds = 0;  // and at least about this long
  int port = 0;  // the servers' data-plane port, each in its namespace
};

// ---------------------------------------------------------------------------
// Small helpers.

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// "65536", "64Ki", "4Mi" -> floats.
absl::StatusOr<uint64_t> ParseCount(absl::string_view text) {
  uint64_t unit = 1;
  if (absl::ConsumeSuffix(&text, "Ki")) unit = uint64_t{1} << 10;
  if (absl::ConsumeSuffix(&text, "Mi")) unit = uint64_t{1} << 20;
  uint64_t v = 0;
  if (!absl::SimpleAtoi(text, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sizes: not a count: '", text, "'"));
  }
  return v * unit;
}

// "64Ki", "4Mi" or the number, for the table.
std::string CountText(uint64_t n) {
  if (n % (uint64_t{1} << 20) == 0) return absl::StrCat(n >> 20, "Mi");
  if (n % (uint64_t{1} << 10) == 0) return absl::StrCat(n >> 10, "Ki");
  return absl::StrCat(n);
}

// ---------------------------------------------------------------------------
// The processes of one run, and the pipes the parent drives them with.

// One report from a child to the parent, written in one write(2): far below
// PIPE_BUF, so reports from many children never interleave.
struct Report {
  enum Kind : int32_t { kReady = 1, kStep = 2, kDone = 3, kFailed = 4 };
  int32_t child = 0;
  int32_t kind = 0;
  int32_t step = 0;
  int32_t unused = 0;
  double value = 0;  // kStep: the step's milliseconds
};

// A child's side of the pipes.
class ChildIo {
 public:
  ChildIo(int index, int report_fd, int go_fd, int stop_fd)
      : index_(index),
        report_fd_(report_fd),
        go_fd_(go_fd),
        stop_fd_(stop_fd) {}

  absl::Status Send(Report::Kind kind, int step = 0, double value = 0) {
    Report r;
    r.child = index_;
    r.kind = kind;
    r.step = step;
    r.value = value;
    if (!WriteFull(report_fd_, &r, sizeof(r))) {
      return absl::UnavailableError("the report pipe is closed");
    }
    return absl::OkStatus();
  }
  // Blocks until the parent lets one worker go on; returns the word it
  // sent with it.
  absl::StatusOr<int32_t> AwaitGo() {
    int32_t word = 0;
    if (!ReadFull(go_fd_, &word, sizeof(word))) {
      return absl::UnavailableError("the parent closed the go pipe");
    }
    return word;
  }
  // Blocks until the parent closes the stop pipe (servers).
  void AwaitStop() {
    char c;
    while (ReadFull(stop_fd_, &c, 1)) {
    }
  }

 private:
  const int index_, report_fd_, go_fd_, stop_fd_;
};

absl::Status EnterNamespace(const std::string& ns) {
  const std::string path = absl::StrCat("/run/netns/", ns);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("open ", path, ": ", std::strerror(errno)));
  }
  const int rc = setns(fd, CLONE_NEWNET);
  const int err = errno;
  close(fd);
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("setns ", ns, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

// Children forked from this single-threaded process, each in a lab
// namespace. Every child reports on one shared pipe; workers wait for a
// word of the go pipe at each of their two pauses (the first: how many
// timed steps to run); servers serve until the stop pipe closes. Destroying
// it kills and reaps what is left.
class Processes {
 public:
  using Body = std::function<absl::Status(ChildIo&)>;

  static absl::StatusOr<std::unique_ptr<Processes>> Create() {
    std::unique_ptr<Processes> p(new Processes());
    for (int* fds : {p->report_, p->go_, p->stop_}) {
      if (pipe2(fds, O_CLOEXEC) != 0) {
        return absl::InternalError(
            absl::StrCat("pipe: ", std::strerror(errno)));
      }
    }
    return p;
  }
  ~Processes();

  // Forks a child that enters namespace `ns`, runs `body` and exits (1 when
  // it fails, after printing the error as `name` and reporting kFailed).
  // `body` runs in the child's copy of this process: references into the
  // caller's frame stay valid there. Returns the child's index.
  absl::StatusOr<int> Spawn(const std::string& name, const std::string& ns,
                            const Body& body);
  pid_t pid(int child) const { return children_[child].pid; }
  // CPU time (user and system, every thread) the children running now have
  // used so far, in seconds.
  double CpuSeconds() const;

  // Reads reports until `count` of `kind` came, passing each to `each`.
  // An error for a kFailed report, a child that exited, or `timeout`.
  absl::Status Await(int count, Report::Kind kind, absl::Duration timeout,
                     const std::function<void(const Report&)>& each = {});
  // Lets `count` waiting workers go on, each with `word`.
  absl::Status Release(int count, int32_t word = 0);
  // Lets the `workers` exit, stops the servers, reaps every child: an error
  // when one failed or had to be killed.
  absl::Status Finish(int workers);

 private:
  struct Child {
    std::string name;
    pid_t pid = -1;
    bool reaped = false;
  };
  Processes() = default;
  // An error when a child exited (they exit only after Finish).
  absl::Status CheckChildren();

  std::vector<Child> children_;
  int report_[2] = {-1, -1};
  int go_[2] = {-1, -1};
  int stop_[2] = {-1, -1};
};

Processes::~Processes() {
  for (Child& c : children_) {
    if (c.reaped) continue;
    kill(c.pid, SIGKILL);
    waitpid(c.pid, nullptr, 0);
  }
  for (int* fds : {report_, go_, stop_}) {
    for (int i : {0, 1}) {
      if (fds[i] >= 0) close(fds[i]);
    }
  }
}

absl::StatusOr<int> Processes::Spawn(const std::string& name,
                                     const std::string& ns, const Body& body) {
  // Nothing buffered may be written twice.
  std::fflush(stdout);
  std::fflush(stderr);
  const int index = static_cast<int>(children_.size());
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // A child never outlives the bench, even when it is killed.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    close(report_[0]);
    close(go_[1]);
    close(stop_[1]);
    ChildIo io(index, report_[1], go_[0], stop_[0]);
    absl::Status s = EnterNamespace(ns);
    if (s.ok()) s = body(io);
    if (!s.ok()) {
      std::fprintf(stderr, "allreduce_bench: %s: %s\n", name.c_str(),
                   s.ToString().c_str());
      (void)io.Send(Report::kFailed);
      _exit(1);
    }
    _exit(0);
  }
  children_.push_back({name, pid, false});
  return index;
}

double Processes::CpuSeconds() const {
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  double total = 0;
  for (const Child& c : children_) {
    if (c.reaped) continue;
    absl::StatusOr<std::string> stat =
        ReadFile(absl::StrCat("/proc/", c.pid, "/stat"));
    if (!stat.ok()) continue;
    // "pid (comm) state ppid ...": utime and stime are the 12th and 13th
    // fields after the command, which may hold spaces.
    const size_t close = stat->rfind(')');
    if (close == std::string::npos) continue;
    std::vector<absl::string_view> f = absl::StrSplit(
        absl::string_view(*stat).substr(close + 1), ' ', absl::SkipEmpty());
    uint64_t utime = 0, stime = 0;
    if (f.size() > 12 && absl::SimpleAtoi(f[11], &utime) &&
        absl::SimpleAtoi(f[12], &stime)) {
      total += (utime + stime) / tick;
    }
  }
  return total;
}

absl::Status Processes::CheckChildren() {
  for (Child& c : children_) {
    int status = 0;
    if (c.reaped || waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
    c.reaped = true;
    return absl::InternalError(absl::StrCat(
        c.name, " exited early (",
        WIFEXITED(status) ? absl::StrCat("status ", WEXITSTATUS(status))
                          : absl::StrCat("signal ", WTERMSIG(status)),
        ")"));
  }
  return absl::OkStatus();
}

absl::Status Processes::Await(int count, Report::Kind kind,
                              absl::Duration timeout,
                              const std::function<void(const Report&)>& each) {
  const absl::Time deadline = absl::Now() + timeout;
  int got = 0;
  while (got < count) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "only ", got, " of ", count, " children reported within ",
          absl::FormatDuration(timeout)));
    }
    pollfd pfd{report_[0], POLLIN, 0};
    const int ready = poll(&pfd, 1, 200);
    if (ready < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
    if (ready <= 0) {
      PS_RETURN_IF_ERROR(CheckChildren());
      continue;
    }
    Report r;
    if (!ReadFull(report_[0], &r, sizeof(r))) {
      return absl::InternalError("the report pipe closed");
    }
    if (r.kind == Report::kFailed) {
      return absl::InternalError(
          absl::StrCat(children_.at(r.child).name, " failed (see above)"));
    }
    if (each) each(r);
    got += r.kind == kind;
  }
  return absl::OkStatus();
}

absl::Status Processes::Release(int count, int32_t word) {
  // One write: the words of all workers at once (far below PIPE_BUF).
  const std::vector<int32_t> words(count, word);
  if (!WriteFull(go_[1], words.data(), words.size() * sizeof(word))) {
    return absl::InternalError("cannot write to the go pipe");
  }
  return absl::OkStatus();
}

absl::Status Processes::Finish(int workers) {
  absl::Status result = Release(workers);
  close(stop_[1]);
  stop_[1] = -1;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (Child& c : children_) {
    int status = 0;
    while (!c.reaped) {
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.reaped = true;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          result.Update(absl::InternalError(
              absl::StrCat(c.name, " did not exit cleanly")));
        }
      } else if (absl::Now() > deadline) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &status, 0);
        c.reaped = true;
        result.Update(absl::DeadlineExceededError(
            absl::StrCat(c.name, " did not exit within 60 s; killed")));
      } else {
        absl::SleepFor(absl::Milliseconds(5));
      }
    }
  }
  return result;
}

// ---------------------------------------------------------------------------
// The steps, shared by every worker.

// `warmup` untimed steps; kReady (with the last warm-up step's
// milliseconds) and a pause while the parent reads the counters; as many
// timed steps as the parent says, each reported (kStep: milliseconds) and
// preceded by `prepare` (not timed); kDone and a pause while the parent
// reads the counters again.
absl::Status RunSteps(const RunSpec& spec, ChildIo& io,
                      const std::function<absl::Status()>& step,
                      const std::function<void()>& prepare = {}) {
  using Ms = std::chrono::duration<double, std::milli>;
  Ms last{0};
  for (int i = 0; i < spec.warmup; ++i) {
    if (prepare) prepare();
    const auto start = std::chrono::steady_clock::now();
    PS_RETURN_IF_ERROR(step());
    last = std::chrono::steady_clock::now() - start;
  }
  PS_RETURN_IF_ERROR(io.Send(Report::kReady, 0, last.count()));
  PS_ASSIGN_OR_RETURN(const int32_t steps, io.AwaitGo());
  for (int i = 0; i < steps; ++i) {
    if (prepare) prepare();
    const auto start = std::chrono::steady_clock::now();
    PS_RETURN_IF_ERROR(step());
    const Ms ms = std::chrono::steady_clock::now() - start;
    PS_RETURN_IF_ERROR(io.Send(Report::kStep, i, ms.count()));
  }
  PS_RETURN_IF_ERROR(io.Send(Report::kDone));
  return io.AwaitGo().status();
}

// ---------------------------------------------------------------------------
// (a) and (b): KVServers and KVClients.

// Where the dense table's blocks live: `servers` blocks of block_size
// floats (the last one shorter), block b on server b. Blocks map to slots by
// hash (common/hash.h DenseBlockSlot), so the table id is picked among those
// whose blocks fall in distinct slots, and each block's slot is given to its
// server.
struct DensePlacement {
  uint32_t table = 0;
  uint32_t block_size = 0;
  std::vector<uint32_t> slot_owner;  // by slot
};

absl::StatusOr<DensePlacement> PlaceDense(uint64_t n, uint32_t servers) {
  DensePlacement d;
  d.block_size = static_cast<uint32_t>((n + servers - 1) / servers);
  if ((n + d.block_size - 1) / d.block_size != servers) {
    return absl::InvalidArgumentError(absl::StrCat(
        n, " floats cannot be cut into ", servers, " non-empty blocks"));
  }
  for (uint32_t table = 1; table < 65536; ++table) {
    std::set<uint32_t> slots;
    for (uint32_t b = 0; b < servers; ++b) {
      slots.insert(DenseBlockSlot(table, b, kNumSlots));
    }
    if (slots.size() != servers) continue;
    d.table = table;
    d.slot_owner.assign(kNumSlots, 0);
    for (uint32_t b = 0; b < servers; ++b) {
      d.slot_owner[DenseBlockSlot(table, b, kNumSlots)] = b;
    }
    return d;
  }
  return absl::InternalError("no table id puts every block in its own slot");
}

// A job as the scheduler would describe it, without one: the config, and
// the RUNNING view every server and worker is given.
struct PsLayout {
  JobConfig config;
  ClusterView view;
  uint32_t table = 0;
  std::vector<std::string> server_nodes;  // by rank
  std::vector<std::string> worker_nodes;  // by rank
  std::vector<std::string> endpoints;     // the servers', by rank
};

ClusterView MakeView(const PsLayout& l,
                     const std::vector<uint32_t>& slot_owner) {
  ClusterView view;
  view.set_epoch(1);
  view.set_job_state(RUNNING);
  view.set_num_slots(kNumSlots);
  for (uint32_t owner : slot_owner) view.add_slot_owner(owner);
  *view.mutable_consistency() = l.config.consistency();
  for (size_t s = 0; s < l.endpoints.size(); ++s) {
    NodeInfo* node = view.add_nodes();
    node->set_role(SERVER);
    node->set_state(ALIVE);
    node->set_rank(static_cast<uint32_t>(s));
    node->set_node_id(1 + s);
    node->set_data_endpoint(l.endpoints[s]);
  }
  for (size_t w = 0; w < l.worker_nodes.size(); ++w) {
    NodeInfo* node = view.add_nodes();
    node->set_role(WORKER);
    node->set_state(ALIVE);
    node->set_rank(static_cast<uint32_t>(w));
    node->set_node_id(kWorkerNodeIdBase + w);
  }
  return view;
}

absl::StatusOr<PsLayout> MakePsLayout(const NetworkLab& lab,
                                      const RunSpec& spec) {
  PsLayout l;
  const uint32_t servers = spec.arch == Arch::kSingle ? 1 : spec.p;
  for (int w = 0; w < spec.p; ++w) l.worker_nodes.push_back(WorkerNode(w));
  for (uint32_t s = 0; s < servers; ++s) {
    l.server_nodes.push_back(spec.arch == Arch::kColocated ? WorkerNode(s)
                                                           : ServerNode(s));
    l.endpoints.push_back(absl::StrCat(
        "tcp://", lab.Address(l.server_nodes.back()), ":", spec.port));
  }
  PS_ASSIGN_OR_RETURN(DensePlacement placement, PlaceDense(spec.n, servers));
  l.table = placement.table;
  // A request timeout far beyond a step: a slow step is a figure, not an
  // error.
  const std::string text = absl::StrFormat(
      R"pb(
        name: "allreduce_bench"
        cluster {
          num_servers: %d
          num_workers: %d
          num_slots: %d
          request_timeout_ms: 300000
        }
        consistency { mode: BSP }
        tables {
          id: %d
          name: "dense"
          dense { size: %d block_size: %d }
          optimizer { sgd { learning_rate: %f } }
        }
      )pb",
      servers, spec.p, kNumSlots, placement.table, spec.n, placement.block_size,
      kLearningRate);
  PS_ASSIGN_OR_RETURN(l.config, ParseJobConfig(text, "allreduce_bench"));
  l.view = MakeView(l, placement.slot_owner);
  return l;
}

absl::Status Serve(const PsLayout& l, uint32_t rank, ChildIo& io) {
  KVServer::Options so;
  so.config = l.config;
  so.bind_endpoint = l.endpoints[rank];
  PS_ASSIGN_OR_RETURN(std::unique_ptr<KVServer> server, KVServer::Start(so));
  server->UpdateView(l.view, rank);
  PS_RETURN_IF_ERROR(io.Send(Report::kReady));
  io.AwaitStop();
  return absl::OkStatus();
}

// One BSP step: push the gradient, end the step, pull the values (answered
// once every worker's push of the step is applied). Requests to a server
// keep their order, so all three go out at once.
absl::Status PsWorker(const PsLayout& l, const RunSpec& spec, uint32_t rank,
                      ChildIo& io) {
  KVClient::Options co;
  co.config = l.config;
  co.rank = rank;
  co.node_id = kWorkerNodeIdBase + rank;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<KVClient> client,
                      KVClient::Create(co, l.view));
  auto grads = std::make_shared<const std::vector<float>>(spec.n, 1e-3f);
  std::vector<float> values(spec.n);
  auto step = [&]() -> absl::Status {
    Completion push = client->PushDense(l.table, 0, grads);
    Completion clock = client->AdvanceClock();
    Completion pull = client->PullDense(l.table, 0, spec.n, values.data());
    PS_RETURN_IF_ERROR(push.Wait());
    PS_RETURN_IF_ERROR(clock.Wait());
    return pull.Wait();
  };
  return RunSteps(spec, io, step);
}

// Starts the servers (and waits until they serve), then the workers. Adds
// each namespace with a child in it to `measured`.
absl::Status StartPs(const NetworkLab& lab, const RunSpec& spec,
                     Processes& procs, std::map<std::string, int>* measured) {
  PS_ASSIGN_OR_RETURN(PsLayout l, MakePsLayout(lab, spec));
  for (uint32_t s = 0; s < l.server_nodes.size(); ++s) {
    PS_ASSIGN_OR_RETURN(int child, procs.Spawn(absl::StrCat("server ", s),
                                               lab.Namespace(l.server_nodes[s]),
                                               [&l, s](ChildIo& io) {
                                                 return Serve(l, s, io);
                                               }));
    measured->emplace(l.server_nodes[s], child);
  }
  PS_RETURN_IF_ERROR(procs.Await(static_cast<int>(l.server_nodes.size()),
                                 Report::kReady, absl::Seconds(60)));
  for (uint32_t w = 0; w < l.worker_nodes.size(); ++w) {
    PS_ASSIGN_OR_RETURN(
        int child,
        procs.Spawn(
            absl::StrCat("worker ", w), lab.Namespace(l.worker_nodes[w]),
            [&l, &spec, w](ChildIo& io) { return PsWorker(l, spec, w, io); }));
    measured->emplace(l.worker_nodes[w], child);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// (c): the ring, with gloo.

// One all-reduce step: sum the gradients around the ring, then SGD on this
// worker's replica with their mean. The gradient is copied back into the
// buffer (which the all-reduce overwrites) before the timer starts.
absl::Status RingWorkerSteps(const RunSpec& spec, int rank,
                             const std::string& address,
                             const std::string& store_dir, ChildIo& io) {
  gloo::transport::tcp::attr attr;
  attr.hostname = address;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(store_dir);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, spec.p);
  context->setTimeout(std::chrono::seconds(300));
  context->connectFullMesh(store, device);
  const std::vector<float> grads(spec.n, 1e-3f);
  std::vector<float> buffer(spec.n), weights(spec.n);
  gloo::AllreduceRingChunked<float> ring(context, {buffer.data()},
                                         static_cast<int>(spec.n));
  auto prepare = [&] { std::copy(grads.begin(), grads.end(), buffer.begin()); };
  auto step = [&]() -> absl::Status {
    ring.run();
    const float scale = kLearningRate / static_cast<float>(spec.p);
    for (size_t i = 0; i < weights.size(); ++i) weights[i] -= scale * buffer[i];
    return absl::OkStatus();
  };
  return RunSteps(spec, io, step, prepare);
}

// gloo reports errors (a peer gone, a timeout, a failed connect) by
// throwing; here they become a status.
absl::Status RingWorker(const RunSpec& spec, int rank,
                        const std::string& address,
                        const std::string& store_dir, ChildIo& io) {
  try {
    return RingWorkerSteps(spec, rank, address, store_dir, io);
  } catch (const gloo::Exception& e) {
    return absl::InternalError(absl::StrCat("gloo: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("gloo (", e.what(), ")"));
  }
}

absl::Status StartRing(const NetworkLab& lab, const RunSpec& spec,
                       const std::string& store_dir, Processes& procs,
                       std::map<std::string, int>* measured) {
  for (int w = 0; w < spec.p; ++w) {
    const std::string node = WorkerNode(w);
    const std::string address = lab.Address(node);
    PS_ASSIGN_OR_RETURN(
        int child,
        procs.Spawn(absl::StrCat("ring rank ", w), lab.Namespace(node),
                    [&spec, &store_dir, w, address](ChildIo& io) {
                      return RingWorker(spec, w, address, store_dir, io);
                    }));
    measured->emplace(node, child);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Counting and one run.

// The machine's CPU time so far (/proc/stat's first line), in seconds.
struct MachineCpu {
  absl::Time when;
  double busy = 0;      // user, nice, system, irq, softirq
  double softirq = 0;   // irq and softirq: much of a veth's work
  double children = 0;  // the run's processes (Processes::CpuSeconds)
};

MachineCpu SampleMachine(const Processes& procs) {
  MachineCpu c;
  c.when = absl::Now();
  c.children = procs.CpuSeconds();
  absl::StatusOr<std::string> stat = ReadFile("/proc/stat");
  if (!stat.ok()) return c;
  // "cpu  user nice system idle iowait irq softirq steal ...", in ticks.
  std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(*stat).substr(0, stat->find('\n')), ' ',
                     absl::SkipEmpty());
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  for (int i : {1, 2, 3, 6, 7}) {
    double v = 0;
    if (static_cast<int>(f.size()) > i && absl::SimpleAtod(f[i], &v)) {
      c.busy += v / tick;
      if (i >= 6) c.softirq += v / tick;
    }
  }
  return c;
}

// What TCP did beyond sending each byte once, in a namespace: where the
// bytes beyond the formula's come from, besides headers and ACKs.
struct TcpEvents {
  uint64_t retransmits = 0;  // segments sent again (Tcp RetransSegs)
  uint64_t loss_probes = 0;  // tail loss probes, new data or old
  uint64_t timeouts = 0;     // retransmission timeouts (TCPTimeouts)
  uint64_t drops = 0;        // packets eth0 dropped, either way

  TcpEvents& operator+=(const TcpEvents& o) {
    retransmits += o.retransmits;
    loss_probes += o.loss_probes;
    timeouts += o.timeouts;
    drops += o.drops;
    return *this;
  }
  TcpEvents operator-(const TcpEvents& o) const {
    return {retransmits - o.retransmits, loss_probes - o.loss_probes,
            timeouts - o.timeouts, drops - o.drops};
  }
};

struct Counters {
  uint64_t rx_bytes = 0, rx_packets = 0, tx_bytes = 0, tx_packets = 0;
  TcpEvents tcp;
};

// The counters of a /proc/net/snmp-style file whose lines start with
// `prefix` ("Tcp:"): a line of names, then a line of values.
std::map<std::string, uint64_t> ProtocolCounters(absl::string_view text,
                                                 absl::string_view prefix) {
  std::vector<std::vector<absl::string_view>> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, prefix)) {
      lines.push_back(absl::StrSplit(line, ' ', absl::SkipEmpty()));
    }
  }
  std::map<std::string, uint64_t> out;
  for (size_t i = 1; lines.size() == 2 && i < lines[0].size(); ++i) {
    uint64_t v = 0;
    if (i < lines[1].size() && absl::SimpleAtoi(lines[1][i], &v)) {
      out[std::string(lines[0][i])] = v;
    }
  }
  return out;
}

// eth0's counters, and TCP's, of the namespace `pid` is in.
absl::StatusOr<Counters> ReadCounters(pid_t pid) {
  Counters c;
  PS_ASSIGN_OR_RETURN(std::string dev,
                      ReadFile(absl::StrCat("/proc/", pid, "/net/dev")));
  bool found = false;
  for (absl::string_view line : absl::StrSplit(dev, '\n')) {
    line = absl::StripLeadingAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "eth0:")) continue;
    // Receive: bytes packets errs drop fifo frame compressed multicast;
    // transmit: bytes packets errs drop ...
    std::vector<absl::string_view> f =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint64_t rx_drop = 0, tx_drop = 0;
    found = f.size() >= 12 && absl::SimpleAtoi(f[0], &c.rx_bytes) &&
            absl::SimpleAtoi(f[1], &c.rx_packets) &&
            absl::SimpleAtoi(f[3], &rx_drop) &&
            absl::SimpleAtoi(f[8], &c.tx_bytes) &&
            absl::SimpleAtoi(f[9], &c.tx_packets) &&
            absl::SimpleAtoi(f[11], &tx_drop);
    c.tcp.drops = rx_drop + tx_drop;
  }
  if (!found) {
    return absl::InternalError(
        absl::StrCat("no eth0 in /proc/", pid, "/net/dev"));
  }
  PS_ASSIGN_OR_RETURN(std::string snmp,
                      ReadFile(absl::StrCat("/proc/", pid, "/net/snmp")));
  PS_ASSIGN_OR_RETURN(std::string netstat,
                      ReadFile(absl::StrCat("/proc/", pid, "/net/netstat")));
  auto tcp = ProtocolCounters(snmp, "Tcp:");
  auto ext = ProtocolCounters(netstat, "TcpExt:");
  c.tcp.retransmits = tcp["RetransSegs"];
  c.tcp.loss_probes = ext["TCPLossProbes"];
  c.tcp.timeouts = ext["TCPTimeouts"];
  return c;
}

// One namespace's traffic per timed step.
struct Traffic {
  std::string node, role;
  double sent = 0, received = 0;  // bytes on eth0, headers included
  double packets_sent = 0, packets_received = 0;
  TcpEvents tcp;  // over all the timed steps
};

struct RunResult {
  RunSpec spec;
  int steps = 0;  // timed
  std::vector<Traffic> traffic;
  double step_ms = 0;  // median over the steps of the slowest worker's step
  // Shares of the machine's CPUs over the timed steps: busy (whoever used
  // them), the run's processes' own, interrupts and softirqs (which the
  // kernel may not charge to any process).
  double cpu_busy = 0, cpu_own = 0, cpu_softirq = 0;
  double seconds = 0;  // wall time of the timed steps
};

absl::StatusOr<std::map<std::string, Counters>> ReadAll(
    const Processes& procs, const std::map<std::string, int>& measured) {
  std::map<std::string, Counters> out;
  for (const auto& [node, child] : measured) {
    PS_ASSIGN_OR_RETURN(out[node], ReadCounters(procs.pid(child)));
  }
  return out;
}

std::vector<Traffic> Deltas(Arch arch, int steps,
                            const std::map<std::string, Counters>& before,
                            const std::map<std::string, Counters>& after) {
  std::vector<Traffic> out;
  for (const auto& [node, a] : after) {
    const Counters& b = before.at(node);
    Traffic t;
    t.node = node;
    t.role = RoleOf(arch, node);
    t.sent = static_cast<double>(a.tx_bytes - b.tx_bytes) / steps;
    t.received = static_cast<double>(a.rx_bytes - b.rx_bytes) / steps;
    t.packets_sent = static_cast<double>(a.tx_packets - b.tx_packets) / steps;
    t.packets_received =
        static_cast<double>(a.rx_packets - b.rx_packets) / steps;
    t.tcp = a.tcp - b.tcp;
    out.push_back(t);
  }
  return out;
}

// --steps, or more when they would take less than --min_seconds at the
// pace of the last warm-up step: /proc/stat counts CPU time in 10 ms ticks,
// and a window of a few milliseconds says nothing about it.
int TimedSteps(const RunSpec& spec, double warm_ms) {
  constexpr int kMaxSteps = 5000;
  const double wanted = spec.min_seconds * 1e3 / std::max(warm_ms, 1e-3);
  return std::max(spec.steps, static_cast<int>(std::min<double>(
                                  kMaxSteps, std::ceil(wanted))));
}

// Starts the run's processes, lets the workers through their timed steps
// between two readings of every namespace's counters, and stops them.
absl::StatusOr<RunResult> Measure(const NetworkLab& lab, const RunSpec& spec,
                                  const std::string& store_dir) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Processes> procs, Processes::Create());
  std::map<std::string, int> measured;  // namespace -> a child in it
  if (spec.arch == Arch::kRing) {
    PS_RETURN_IF_ERROR(StartRing(lab, spec, store_dir, *procs, &measured));
  } else {
    PS_RETURN_IF_ERROR(StartPs(lab, spec, *procs, &measured));
  }
  double warm_ms = 0;  // the slowest worker's last warm-up step
  PS_RETURN_IF_ERROR(procs->Await(
      spec.p, Report::kReady, absl::Seconds(300),
      [&](const Report& r) { warm_ms = std::max(warm_ms, r.value); }));
  const int steps = TimedSteps(spec, warm_ms);
  PS_ASSIGN_OR_RETURN(auto before, ReadAll(*procs, measured));
  const MachineCpu cpu_before = SampleMachine(*procs);
  PS_RETURN_IF_ERROR(procs->Release(spec.p, steps));
  std::vector<double> slowest(steps, 0.0);
  PS_RETURN_IF_ERROR(procs->Await(
      spec.p, Report::kDone, absl::Seconds(600), [&](const Report& r) {
        if (r.kind == Report::kStep && r.step >= 0 && r.step < steps) {
          slowest[r.step] = std::max(slowest[r.step], r.value);
        }
      }));
  const MachineCpu cpu_after = SampleMachine(*procs);
  PS_ASSIGN_OR_RETURN(auto after, ReadAll(*procs, measured));
  PS_RETURN_IF_ERROR(procs->Finish(spec.p));
  RunResult result;
  result.spec = spec;
  result.steps = steps;
  result.traffic = Deltas(spec.arch, steps, before, after);
  result.step_ms = bench::Median(slowest);
  result.seconds = absl::ToDoubleSeconds(cpu_after.when - cpu_before.when);
  const double capacity = std::max(result.seconds, 1e-9) * bench::Cores();
  result.cpu_busy = (cpu_after.busy - cpu_before.busy) / capacity;
  result.cpu_own = (cpu_after.children - cpu_before.children) / capacity;
  result.cpu_softirq = (cpu_after.softirq - cpu_before.softirq) / capacity;
  return result;
}

// A fresh directory for gloo's FileStore, removed at the end of the run.
absl::StatusOr<RunResult> MeasureWithStore(const NetworkLab& lab,
                                           const RunSpec& spec) {
  std::string dir = "/tmp/allreduce_bench.XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
  }
  absl::StatusOr<RunResult> result = Measure(lab, spec, dir);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return result;
}

// ---------------------------------------------------------------------------
// The lab.

// The hub's links (this process's namespace holds nothing else but lo):
// the veths' ends ("7: pn0v1@if2: <...> master pnbr0 ...") and the bridge
// ("3: pnbr0: <...>").
struct HubLinks {
  std::vector<std::string> veths, bridges;
};

absl::StatusOr<HubLinks> ListHubLinks() {
  PS_ASSIGN_OR_RETURN(std::string links,
                      NetworkLab::Run({"ip", "-o", "link", "show"}));
  HubLinks hub;
  for (absl::string_view line :
       absl::StrSplit(links, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ": ");
    if (f.size() < 2 || f[1] == "lo") continue;
    const size_t at = f[1].find('@');
    (at != absl::string_view::npos ? hub.veths : hub.bridges)
        .emplace_back(f[1].substr(0, at));
  }
  return hub;
}

// Every veth and the bridge at `mtu` (ports first: a bridge follows its
// ports), and no IPv6 in the nodes: its chatter (router solicitations, MLD
// reports) would land on the counters, and nothing here uses it.
absl::Status SetMtu(const NetworkLab& lab, const HubLinks& hub,
                    const std::vector<std::string>& nodes, int mtu) {
  const std::string m = absl::StrCat(mtu);
  for (const auto* links : {&hub.veths, &hub.bridges}) {
    for (const std::string& link : *links) {
      PS_RETURN_IF_ERROR(
          NetworkLab::Run({"ip", "link", "set", link, "mtu", m}).status());
    }
  }
  for (const std::string& node : nodes) {
    const std::string ns = lab.Namespace(node);
    PS_RETURN_IF_ERROR(
        NetworkLab::Run({"ip", "-n", ns, "link", "set", "eth0", "mtu", m})
            .status());
    // A kernel without IPv6 has nothing to turn off.
    (void)NetworkLab::Run({"ip", "netns", "exec", ns, "sysctl", "-qw",
                           "net.ipv6.conf.all.disable_ipv6=1"});
  }
  return absl::OkStatus();
}

// "3" for 2 CPUs; comma-separated groups of 32 as sysfs wants beyond.
std::string CpuMask(int cpus) {
  std::vector<std::string> groups;
  for (int first = 0; first < cpus; first += 32) {
    const int n = std::min(32, cpus - first);
    const uint32_t bits = n == 32 ? ~uint32_t{0} : (uint32_t{1} << n) - 1;
    groups.insert(groups.begin(), absl::StrFormat("%x", bits));
  }
  return absl::StrJoin(groups, ",");
}

// Receive packet steering (RPS) on the hub's end of every veth, to every
// CPU: each flow's packets are then queued on the CPU its hash picks, not
// on whichever CPU sent them. Without it a sender whose segments leave from
// both CPUs (its thread, and the softirq that handles its ACKs) has them
// queued in two per-CPU backlogs and reordered on the way, and the
// receiver's SACKs make it send again segments that were never lost: with
// no drop anywhere, TcpExt counts TCPSACKReorder, TCPOFOQueue and DSACKs,
// and the retransmissions add up to about 1 % to the bytes. A NIC keeps a flow
// on one queue. The hub's sysfs is reached from a child that mounts one in
// a mount namespace of its own (sysfs shows its mounter's network
// namespace).
absl::Status SteerHubFlows(const HubLinks& hub) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("sysfs", "/sys", "sysfs", 0, nullptr) != 0) {
      _exit(3);
    }
    const std::string mask =
        CpuMask(static_cast<int>(sysconf(_SC_NPROCESSORS_CONF)));
    bool ok = true;
    for (const std::string& link : hub.veths) {
      for (int q = 0;; ++q) {
        const std::string path = absl::StrCat("/sys/class/net/", link,
                                              "/queues/rx-", q, "/rps_cpus");
        if (access(path.c_str(), F_OK) != 0) break;
        std::ofstream out(path);
        out << mask << std::flush;
        ok = ok && static_cast<bool>(out);
      }
    }
    _exit(ok ? 0 : 4);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(
        absl::StrCat("RPS on the hub's veths: ",
                     WIFEXITED(status) && WEXITSTATUS(status) == 3
                         ? "cannot mount a sysfs of this namespace"
                         : "cannot write rps_cpus"));
  }
  return absl::OkStatus();
}

// Nodes w0.. and s0.. for up to `max_workers` workers, in this process's
// own network namespace (entered first: this process is the hub).
absl::StatusOr<std::unique_ptr<NetworkLab>> MakeLab(int max_workers, int mtu,
                                                    bool steer_flows) {
  PS_RETURN_IF_ERROR(NetworkLab::EnterPrivateNetwork());
  std::vector<std::string> nodes;
  for (int i = 0; i < max_workers; ++i) nodes.push_back(WorkerNode(i));
  for (int i = 0; i < max_workers; ++i) nodes.push_back(ServerNode(i));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<NetworkLab> lab,
                      NetworkLab::Create(nodes));
  PS_ASSIGN_OR_RETURN(HubLinks hub, ListHubLinks());
  PS_RETURN_IF_ERROR(SetMtu(*lab, hub, nodes, mtu));
  if (steer_flows) PS_RETURN_IF_ERROR(SteerHubFlows(hub));
  return lab;
}

// ---------------------------------------------------------------------------
// Output.

// The role's namespaces of one run, summed up.
struct RoleFigures {
  std::string role;
  double formula = 0;
  double sent = 0, received = 0;  // means
  double packets_sent = 0, packets_received = 0;
  double worst_sent = 1, worst_received = 1;  // ratios farthest from 1
  TcpEvents tcp;                              // summed
};

std::vector<RoleFigures> ByRole(const RunResult& r) {
  std::map<std::string, std::vector<const Traffic*>> roles;
  for (const Traffic& t : r.traffic) roles[t.role].push_back(&t);
  std::vector<RoleFigures> out;
  // Workers (or machines) first, then servers.
  for (const char* role : {"worker", "machine", "server"}) {
    auto it = roles.find(role);
    if (it == roles.end()) continue;
    RoleFigures f;
    f.role = role;
    f.formula = FormulaBytes(r.spec.arch, role, r.spec.n, r.spec.p);
    const double k = static_cast<double>(it->second.size());
    auto farther = [&](double worst, double bytes) {
      const double ratio = bytes / f.formula;
      return std::abs(ratio - 1) > std::abs(worst - 1) ? ratio : worst;
    };
    for (const Traffic* t : it->second) {
      f.sent += t->sent / k;
      f.received += t->received / k;
      f.packets_sent += t->packets_sent / k;
      f.packets_received += t->packets_received / k;
      f.worst_sent = farther(f.worst_sent, t->sent);
      f.worst_received = farther(f.worst_received, t->received);
      f.tcp += t->tcp;
    }
    out.push_back(f);
  }
  return out;
}

std::string Number(std::optional<double> v, int decimals = 4) {
  if (!v.has_value() || !std::isfinite(*v)) return "null";
  return absl::StrFormat("%.*f", decimals, *v);
}

void EmitLine(const RunResult& r, const std::string& metric, double value,
              const char* unit, std::optional<double> baseline,
              const std::string& role, const std::string& extra) {
  const bool bytes = std::string(unit) == "bytes";
  const std::optional<double> ratio =
      baseline.has_value() && *baseline > 0
          ? std::optional<double>(value / *baseline)
          : std::nullopt;
  std::printf(
      "{\"bench\":\"allreduce\",\"metric\":\"%s\",\"value\":%s,\"unit\":\"%s\","
      "\"baseline\":%s,\"ratio\":%s,\"formula_bytes\":%s,\"n_floats\":%llu,"
      "\"workers\":%d,\"arch\":\"%s\",\"role\":\"%s\"%s}\n",
      metric.c_str(), Number(value, bytes ? 1 : 3).c_str(), unit,
      Number(baseline, bytes ? 1 : 3).c_str(), Number(ratio).c_str(),
      bytes ? Number(baseline, 1).c_str() : "null",
      static_cast<unsigned long long>(r.spec.n), r.spec.p, Name(r.spec.arch),
      role.c_str(), extra.c_str());
}

// The fields a byte figure carries beyond the common ones.
std::string ByteExtras(const char* formula, double worst, double bytes,
                       double packets, const TcpEvents& tcp) {
  return absl::StrFormat(
      ",\"formula\":\"%s\",\"worst_ratio\":%.4f,\"payload_bytes\":%.1f,"
      "\"packets\":%.1f,\"retransmits\":%d,\"loss_probes\":%d,"
      "\"rto_timeouts\":%d,\"drops\":%d",
      formula, worst, bytes - kHeaderBytes * packets, packets, tcp.retransmits,
      tcp.loss_probes, tcp.timeouts, tcp.drops);
}

// The lines of one run. `ring_ms`: the ring's step time at the same N and
// P, when it ran.
void EmitRun(const RunResult& r, std::optional<double> ring_ms) {
  for (const RoleFigures& f : ByRole(r)) {
    const char* formula = FormulaText(r.spec.arch, f.role);
    EmitLine(r, "bytes_sent_per_step_" + f.role, f.sent, "bytes", f.formula,
             f.role,
             ByteExtras(formula, f.worst_sent, f.sent, f.packets_sent, f.tcp));
    EmitLine(r, "bytes_received_per_step_" + f.role, f.received, "bytes",
             f.formula, f.role,
             ByteExtras(formula, f.worst_received, f.received,
                        f.packets_received, f.tcp));
  }
  EmitLine(r, "step_ms", r.step_ms, "ms",
           r.spec.arch == Arch::kRing ? std::nullopt : ring_ms, "worker",
           absl::StrFormat(",\"steps\":%d,\"cpu_busy\":%.3f,\"cpu_own\":%.3f,"
                           "\"cpu_softirq\":%.3f",
                           r.steps, r.cpu_busy, r.cpu_own, r.cpu_softirq));
}

// The human table, on stderr: one row per (N, P, arch, role).
void PrintTable(const std::vector<RunResult>& results, double tolerance) {
  std::fprintf(stderr,
               "# allreduce: bytes per namespace per step on its eth0 (mean "
               "over the role's namespaces; headers, ACKs and control "
               "messages included) against the formula's payload\n"
               "# %5s %2s %-13s %-8s %-11s %13s %13s %13s %7s %7s %7s %9s "
               "%9s %12s\n",
               "N", "P", "arch", "role", "formula", "payload B", "sent B",
               "received B", "sent/f", "recv/f", "worst", "retx/tlp", "step ms",
               "cpu% all/own/irq");
  for (const RunResult& r : results) {
    for (const RoleFigures& f : ByRole(r)) {
      const bool off = std::abs(f.worst_sent - 1) > tolerance ||
                       std::abs(f.worst_received - 1) > tolerance;
      const double worst =
          std::abs(f.worst_sent - 1) > std::abs(f.worst_received - 1)
              ? f.worst_sent
              : f.worst_received;
      std::fprintf(
          stderr,
          "# %5s %2d %-13s %-8s %-11s %13.0f %13.0f %13.0f %7.4f %7.4f %7.4f "
          "%9s %9.2f %12s%s\n",
          CountText(r.spec.n).c_str(), r.spec.p, Name(r.spec.arch),
          f.role.c_str(), FormulaText(r.spec.arch, f.role), f.formula, f.sent,
          f.received, f.sent / f.formula, f.received / f.formula, worst,
          absl::StrCat(f.tcp.retransmits, "/", f.tcp.loss_probes).c_str(),
          r.step_ms,
          absl::StrFormat("%.0f/%.0f/%.0f", 100 * r.cpu_busy, 100 * r.cpu_own,
                          100 * r.cpu_softirq)
              .c_str(),
          off ? "  OUTSIDE THE BAND" : "");
    }
  }
}

// "P=2 ring (4.16 ms; ps_single 1.71x, ...); P=3 ...": the fastest
// architecture at each P, and how much slower the others were.
std::string FastestAt(
    const std::map<int, std::vector<const RunResult*>>& by_p) {
  std::vector<std::string> parts;
  for (const auto& [p, runs] : by_p) {
    const RunResult* best = runs[0];
    for (const RunResult* r : runs) {
      if (r->step_ms < best->step_ms) best = r;
    }
    std::vector<std::string> others;
    for (const RunResult* r : runs) {
      if (r == best) continue;
      others.push_back(absl::StrFormat("%s %.2fx", Name(r->spec.arch),
                                       r->step_ms / best->step_ms));
    }
    parts.push_back(absl::StrFormat(
        "P=%d %s (%.2f ms%s%s)", p, Name(best->spec.arch), best->step_ms,
        others.empty() ? "" : "; ", absl::StrJoin(others, ", ")));
  }
  return absl::StrJoin(parts, "; ");
}

// What limited `runs`: the CPUs, where they were saturated over the timed
// steps, or also waiting; and whether other processes took a share.
std::string Limits(const std::vector<const RunResult*>& runs) {
  double busy_lo = 100, busy_hi = 0, own_lo = 100, own_hi = 0, other = 0;
  double gbps = 0;
  std::vector<std::string> idle;  // runs whose CPUs were not saturated
  for (const RunResult* r : runs) {
    // Tick counts can overshoot the window a little.
    const double busy = 100 * std::min(1.0, r->cpu_busy);
    const double own = 100 * std::min(1.0, r->cpu_own);
    busy_lo = std::min(busy_lo, busy);
    busy_hi = std::max(busy_hi, busy);
    own_lo = std::min(own_lo, own);
    own_hi = std::max(own_hi, own);
    // ksoftirqd's share is in here too: an upper bound.
    other = std::max(other, busy - own);
    double sent = 0;
    for (const Traffic& t : r->traffic) sent += t.sent;
    gbps = std::max(gbps, sent / (r->step_ms * 1e-3) / 1e9);
    if (busy < 85) {
      idle.push_back(absl::StrFormat("%s P=%d %.0f %%", Name(r->spec.arch),
                                     r->spec.p, busy));
    }
  }
  std::string text = absl::StrFormat(
      "During the timed steps the %d vCPUs were %.0f-%.0f %% busy, %.0f-%.0f "
      "%% in the run's processes, while all veths together carried at most "
      "%.2f GB/s. ",
      bench::Cores(), busy_lo, busy_hi, own_lo, own_hi, gbps);
  if (other > 25) {
    // The claim below would be about someone else's load.
    absl::StrAppend(&text,
                    absl::StrFormat("Other processes took up to %.0f %% of the "
                                    "CPUs: these step times are disturbed (the "
                                    "bytes are not); compare them on an idle "
                                    "machine.",
                                    other));
  } else if (idle.empty()) {
    absl::StrAppend(&text,
                    "A veth has no bandwidth of its own (the CPU copies every "
                    "byte): the CPU, not the network, limits every "
                    "architecture here.");
  } else if (idle.size() < runs.size()) {
    absl::StrAppend(
        &text,
        "A veth has no bandwidth of its own (the CPU copies every byte): the "
        "CPU, not the network, limits the runs that saturated it; where it "
        "was not (",
        absl::StrJoin(idle, ", "),
        ") the processes also wait for each other (round trips, the "
        "hand-offs between the steps' phases).");
  } else {
    absl::StrAppend(&text,
                    "The CPUs were never saturated: waiting (round trips, the "
                    "hand-offs between the processes) limits the steps as "
                    "much as the CPU does.");
  }
  return text;
}

// One paragraph per N: the fastest architecture at each P, and what limited
// the steps.
void PrintVerdicts(const std::vector<RunResult>& results) {
  std::map<uint64_t, std::map<int, std::vector<const RunResult*>>> by_size;
  for (const RunResult& r : results) by_size[r.spec.n][r.spec.p].push_back(&r);
  for (const auto& [n, by_p] : by_size) {
    std::vector<const RunResult*> all;
    for (const auto& [p, runs] : by_p) {
      all.insert(all.end(), runs.begin(), runs.end());
    }
    std::fprintf(stderr,
                 "# allreduce N=%s floats (%.1f MiB): fastest at %s. %s\n",
                 CountText(n).c_str(), 4.0 * n / (1 << 20),
                 FastestAt(by_p).c_str(), Limits(all).c_str());
  }
}

void EmitSummary(const std::vector<RunResult>& results, int failed,
                 double tolerance, double seconds) {
  int figures = 0, within = 0;
  double worst = 1;
  std::string worst_what = "none";
  std::map<uint64_t, std::map<int, const RunResult*>> fastest;
  for (const RunResult& r : results) {
    const RunResult*& best = fastest[r.spec.n][r.spec.p];
    if (best == nullptr || r.step_ms < best->step_ms) best = &r;
    for (const RoleFigures& f : ByRole(r)) {
      for (const auto& [ratio, way] :
           {std::pair<double, const char*>{f.worst_sent, "sent"},
            {f.worst_received, "received"}}) {
        ++figures;
        within += std::abs(ratio - 1) <= tolerance;
        if (std::abs(ratio - 1) < std::abs(worst - 1)) continue;
        worst = ratio;
        worst_what = absl::StrFormat("%s N=%d P=%d %s %s", Name(r.spec.arch),
                                     r.spec.n, r.spec.p, f.role, way);
      }
    }
  }
  std::vector<std::string> sizes;
  for (const auto& [n, by_p] : fastest) {
    std::vector<std::string> ps;
    for (const auto& [p, r] : by_p) {
      ps.push_back(absl::StrFormat("\"%d\":\"%s\"", p, Name(r->spec.arch)));
    }
    sizes.push_back(absl::StrFormat("\"%d\":{%s}", n, absl::StrJoin(ps, ",")));
  }
  std::printf(
      "{\"bench\":\"allreduce\",\"summary\":{\"runs\":%d,\"failed_runs\":%d,"
      "\"byte_figures\":%d,\"within_tolerance\":%d,\"tolerance\":%.3f,"
      "\"worst_ratio\":%.4f,\"worst\":\"%s\",\"fastest\":{%s},"
      "\"seconds\":%.0f}}\n",
      static_cast<int>(results.size()), failed, figures, within, tolerance,
      worst, worst_what.c_str(), absl::StrJoin(sizes, ",").c_str(), seconds);
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------
// Flags and main.

struct Plan {
  std::vector<uint64_t> sizes;
  std::vector<int> workers;
  std::vector<Arch> archs;
  int warmup = 0, steps = 0, mtu = 0;
  double min_seconds = 0, tolerance = 0;
  bool steer_flows = false;
};

absl::StatusOr<Plan> ReadFlags() {
  Plan plan;
  for (const std::string& s : absl::GetFlag(FLAGS_sizes)) {
    PS_ASSIGN_OR_RETURN(uint64_t n, ParseCount(s));
    // A dense block holds at most 2^26 floats (ps_single: one block).
    if (n < 1024 || n > (uint64_t{1} << 26)) {
      return absl::InvalidArgumentError("--sizes: each in 1024..2^26 floats");
    }
    plan.sizes.push_back(n);
  }
  for (const std::string& s : absl::GetFlag(FLAGS_workers)) {
    int p = 0;
    if (!absl::SimpleAtoi(s, &p) || p < 2 || p > 16) {
      return absl::InvalidArgumentError("--workers: each in 2..16");
    }
    plan.workers.push_back(p);
  }
  for (const std::string& s : absl::GetFlag(FLAGS_archs)) {
    PS_ASSIGN_OR_RETURN(Arch a, ParseArch(s));
    plan.archs.push_back(a);
  }
  plan.warmup = absl::GetFlag(FLAGS_warmup);
  plan.steps = absl::GetFlag(FLAGS_steps);
  plan.min_seconds = absl::GetFlag(FLAGS_min_seconds);
  plan.mtu = absl::GetFlag(FLAGS_mtu);
  plan.tolerance = absl::GetFlag(FLAGS_tolerance);
  plan.steer_flows = absl::GetFlag(FLAGS_steer_flows);
  if (plan.sizes.empty() || plan.workers.empty() || plan.archs.empty() ||
      plan.steps < 1 || plan.warmup < 0 || plan.mtu < 1280 ||
      plan.mtu > 65535 || plan.min_seconds < 0) {
    return absl::InvalidArgumentError(
        "need sizes, workers and archs, --steps >= 1, --warmup >= 0, "
        "--min_seconds >= 0, --mtu in 1280..65535");
  }
  return plan;
}

// Runs every architecture at every (N, P), emitting each (N, P)'s lines as
// soon as its runs are done. Returns the number of runs that failed.
int RunAll(const Plan& plan, const NetworkLab& lab,
           std::vector<RunResult>* results) {
  int failed = 0;
  int port = kFirstPort;
  for (uint64_t n : plan.sizes) {
    for (int p : plan.workers) {
      std::vector<RunResult> group;
      for (Arch arch : plan.archs) {
        const RunSpec spec{
            arch, n, p, plan.warmup, plan.steps, plan.min_seconds, port++};
        absl::StatusOr<RunResult> r = MeasureWithStore(lab, spec);
        if (!r.ok()) {
          std::fprintf(stderr, "# allreduce %s N=%s P=%d failed: %s\n",
                       Name(arch), CountText(n).c_str(), p,
                       r.status().ToString().c_str());
          ++failed;
          continue;
        }
        std::fprintf(stderr, "# allreduce %s N=%s P=%d: %.2f ms a step\n",
                     Name(arch), CountText(n).c_str(), p, r->step_ms);
        group.push_back(*std::move(r));
      }
      std::optional<double> ring_ms;
      for (const RunResult& r : group) {
        if (r.spec.arch == Arch::kRing) ring_ms = r.step_ms;
      }
      for (RunResult& r : group) {
        EmitRun(r, ring_ms);
        results->push_back(std::move(r));
      }
    }
  }
  return failed;
}

int Main() {
  absl::StatusOr<Plan> plan = ReadFlags();
  if (!plan.ok()) {
    std::fprintf(stderr, "allreduce_bench: %s\n",
                 plan.status().ToString().c_str());
    return 2;
  }
  if (std::string why = NetworkLab::Unavailable(); !why.empty()) {
    std::fprintf(stderr,
                 "# allreduce: skipped: it counts bytes on network "
                 "namespaces, which need root, ip, nft and tc: %s\n",
                 why.c_str());
    std::printf("{\"bench\":\"allreduce\",\"summary\":{\"skipped\":\"%s\"}}\n",
                why.c_str());
    return 0;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<NetworkLab>> lab =
      MakeLab(*std::max_element(plan->workers.begin(), plan->workers.end()),
              plan->mtu, plan->steer_flows);
  if (!lab.ok()) {
    std::fprintf(stderr, "allreduce_bench: the network lab: %s\n",
                 lab.status().ToString().c_str());
    return 1;
  }
  std::fprintf(
      stderr,
      "# allreduce: at least %d timed steps (and %.1f s) after %d warm-up "
      "steps per run; veth MTU %d; flows steered (RPS): %s; PS steps are BSP "
      "(push, clock, pull); %d CPUs; load average %s\n",
      plan->steps, plan->min_seconds, plan->warmup, plan->mtu,
      plan->steer_flows ? "yes" : "no", bench::Cores(),
      bench::LoadAverage().c_str());
  std::vector<RunResult> results;
  const int failed = RunAll(*plan, **lab, &results);
  PrintTable(results, plan->tolerance);
  PrintVerdicts(results);
  // Other processes (a compiler, tests) move the step times, not the bytes.
  std::fprintf(stderr, "# allreduce: load average at the end %s\n",
               bench::LoadAverage().c_str());
  EmitSummary(results, failed, plan->tolerance,
              absl::ToDoubleSeconds(absl::Now() - start));
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As every node's main() does (common/node_main.cc); the children inherit
  // it.
  ps::KeepLargeBuffers();
  if (absl::Status s = ps::SetLogLevel(absl::GetFlag(FLAGS_log_level));
      !s.ok()) {
    std::fprintf(stderr, "allreduce_bench: %s\n", s.ToString().c_str());
    return 2;
  }
  return ps::Main();
}
