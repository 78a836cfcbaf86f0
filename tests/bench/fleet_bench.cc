// Fleet benchmark: one real scheduler_main against thousands of simulated
// nodes, to see how the control plane grows with the number of nodes N.
//
// What is real: scheduler_main (a separate process, its gRPC server, its
// cluster state and failure detection) and the protocol every node speaks
// to it: Register, a Heartbeat every cluster.heartbeat_interval_ms, a
// GetClusterView long poll for the next epoch (5 s polls, as
// SchedulerClient::WatchLoop), Leave. Every simulated node has its own
// gRPC channel and TCP connection, as a node process has.
// What is simulated: the nodes themselves, --processes child processes of
// this binary holding N/--processes nodes each, driven by gRPC's callback
// API from a few threads instead of a process (and two threads) per node;
// no data plane (servers register an endpoint nobody connects to), no
// training; the nodes read the epoch and node id out of the answers'
// bytes rather than parse whole views (each real node parses its own view
// on its own machine). Registrations come --register_in_flight at a time
// per child, as a fleet's processes start together. What a real fleet adds that
// this cannot show: network round trips (here loopback, ~50 us), the
// scheduler's machine to itself (here the simulated nodes share its 2 cores),
// and nodes' clocks apart.
//
// Per N (--nodes), after every node has registered and seen a view:
//   1. steady: --steady_s seconds of heartbeats; the scheduler's CPU time
//      (/proc/PID/stat) over it, per second and per heartbeat, and the
//      heartbeat round trip p50/p99;
//   2. view changes: --changes workers leave, --change_gap_s apart; for
//      each, the time until every node has the new view (p50/p99/max over
//      nodes) and the bytes of views all nodes received for it;
//   3. a barrier: every live worker calls Barrier at once; the time from
//      the last call to each worker's release (p50/p99/max), and the bytes
//      of the answers, all workers together; (from here on, the most
//      threads the scheduler had, sampled with the parent's view polls);
//   4. a checkpoint (--checkpoint_s): the parent asks for one; every node
//      sees it in its view and reports its part (a server writes a 4 KiB
//      shard file first, since the scheduler commits only files that are
//      there); the time until the view says it committed, the reports'
//      round trips, and the journal writes it took;
//   5. churn (--churn_s, --churn_per_s): workers preempted (Leave with
//      their shard's position) and killed (silent), alternately, each
//      replaced at once by a new worker that registers (retrying, as a
//      restarted pod does); the replacements' waits and the scheduler's
//      CPU meanwhile;
//   6. a silent node: one worker stops heartbeating and polling; the time
//      until the scheduler's view shows it DEAD (heartbeat_timeout_ms is the
//      floor), and how many other nodes were declared dead (none should be
//      but it and the killed ones);
//   7. the end of training (--claims_s): every live worker reports its
//      shard done with ClaimShard and asks for more; orphaned shards (of
//      the workers that left, were preempted, killed or silenced) are
//      handed out and reported done at once; the others wait until every
//      shard is done. The time from the last shard reported done to each
//      worker's ALL_DONE.
// The parent long-polls the view (as deltas) from phase 4 on.
// Throughout, the scheduler's journal (its /metrics): writes while the
// fleet registered, the mean time of one write, and its size at the end.
// Prints one JSON line per N and a last line with the growth exponents
// (slope of log(value) against log(N) between the smallest and largest N).
//
//   tests/bench.sh fleet [-- --nodes=100,1000,3000 --processes=4]
//   (--view_deltas=false: every node gets the whole view at every change,
//   for the curve before deltas; --servers_only=false: workers' views list
//   every node, as before they listed the servers and the worker only;
//   --barrier_rank_runs=false: a barrier answers each worker the list of
//   ranks, as before it answered runs of ranks)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/catalog.h"
#include "common/config.h"
#include "common/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/config.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/subprocess.h"

ABSL_FLAG(std::string, nodes, "100,1000,3000",
          "Comma-separated fleet sizes N (servers and workers together).");
ABSL_FLAG(int, processes, 4, "Child processes that hold the simulated nodes.");
ABSL_FLAG(int, heartbeat_ms, 500, "cluster.heartbeat_interval_ms.");
ABSL_FLAG(int, heartbeat_timeout_ms, 5000, "cluster.heartbeat_timeout_ms.");
ABSL_FLAG(double, steady_s, 8, "Seconds of steady heartbeats measured.");
ABSL_FLAG(int, changes, 4, "View changes (a worker leaves) measured.");
ABSL_FLAG(double, change_gap_s, 2, "Seconds between view changes.");
ABSL_FLAG(int, register_in_flight, 64,
          "Registrations in flight at once per child process.");
ABSL_FLAG(double, barrier_s, 4,
          "Seconds allowed for the barrier before the silent node.");
ABSL_FLAG(double, checkpoint_s, 4,
          "Seconds for a checkpoint that every live node reports its part "
          "of (0: none).");
ABSL_FLAG(double, churn_s, 6,
          "Seconds of churn: workers preempted (they leave) and killed (they "
          "go silent), each replaced by a new worker that registers.");
ABSL_FLAG(double, churn_per_s, 0,
          "Churn events per second in all (0: one per second per 1,000 "
          "nodes, at least one).");
ABSL_FLAG(double, claims_s, 8,
          "Seconds for the end of training: every live worker reports its "
          "shard done (ClaimShard), trains what was orphaned, and waits "
          "for the others.");
ABSL_FLAG(std::string, dir, "", "Work directory (default: a new one in /tmp).");
ABSL_FLAG(bool, view_deltas, true,
          "Nodes ask for views as deltas against the epoch they hold, as "
          "SchedulerClient does (false: the whole view every time, as before "
          "deltas).");
ABSL_FLAG(bool, barrier_rank_runs, true,
          "Workers ask for a barrier's ranks as runs (BarrierRequest."
          "rank_runs), as SchedulerClient does (false: the list of ranks, as "
          "before runs).");
ABSL_FLAG(bool, servers_only, true,
          "Workers ask for views of the servers and themselves only, as "
          "SchedulerClient does (false: views of every node, as before).");
// Child mode (internal).
ABSL_FLAG(bool, child, false, "Run simulated nodes (internal).");
ABSL_FLAG(std::string, scheduler, "", "Child: scheduler host:port.");
ABSL_FLAG(std::string, config, "", "Child: the job config.");
ABSL_FLAG(int, count, 0, "Child: nodes to simulate.");
ABSL_FLAG(int, servers, 0, "Child: how many of them are servers.");
ABSL_FLAG(int, leaves, 0, "Child: workers that leave, one per change.");
ABSL_FLAG(bool, silence, false, "Child: silence one worker at the end.");
ABSL_FLAG(int, churn_events, 0, "Child: churn events it runs.");
ABSL_FLAG(std::string, ready_file, "", "Child: written once all are in.");
ABSL_FLAG(std::string, go_file, "", "Child: holds the start time (unix us).");
ABSL_FLAG(std::string, out, "", "Child: the results file.");

namespace ps {
namespace {

using ::ps::bench::FindRunfiles;
using ::ps::bench::Quantile;
using ::ps::bench::RunningCpuSeconds;
using ::ps::testing::ReadFile;
using ::ps::testing::Runfile;
using ::ps::testing::Subprocess;

int64_t NowUs() { return absl::ToUnixMicros(absl::Now()); }

// Threads of process `pid` now (/proc/PID/status), or -1.
int ThreadsOf(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "Threads:")) {
      int n = -1;
      return absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(8)), &n)
                 ? n
                 : -1;
    }
  }
  return -1;
}

// The times of one run, relative to the start time T0 the parent writes.
struct Schedule {
  double steady_s;
  int changes;
  double change_gap_s;
  double heartbeat_timeout_s;
  double barrier_s;
  double checkpoint_s;
  double churn_s;
  double claims_s;
  double ChangeAt(int i) const { return steady_s + i * change_gap_s; }
  double BarrierAt() const { return ChangeAt(changes) + 0.5; }
  double CheckpointAt() const { return BarrierAt() + barrier_s; }
  double ChurnAt() const { return CheckpointAt() + checkpoint_s; }
  double SilenceAt() const { return ChurnAt() + churn_s; }
  double ClaimsAt() const { return SilenceAt() + heartbeat_timeout_s + 3; }
  double End() const { return ClaimsAt() + claims_s; }
};

Schedule TheSchedule() {
  return {absl::GetFlag(FLAGS_steady_s),
          absl::GetFlag(FLAGS_changes),
          absl::GetFlag(FLAGS_change_gap_s),
          absl::GetFlag(FLAGS_heartbeat_timeout_ms) / 1000.0,
          absl::GetFlag(FLAGS_barrier_s),
          absl::GetFlag(FLAGS_checkpoint_s),
          absl::GetFlag(FLAGS_churn_s),
          absl::GetFlag(FLAGS_claims_s)};
}

// ---- the child: simulated nodes

// The answers to Register and GetClusterView are read raw: a simulated
// node takes the epoch and its node id from the bytes and skips the rest.
// A real node parses its own view on its own machine; thousands of them
// parsed here would measure this machine's two cores, not the scheduler.
grpc::ByteBuffer Serialized(const google::protobuf::Message& m) {
  const std::string bytes = m.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// What a simulated node reads of a view: ClusterView.epoch (field 1) and
// checkpoint_clock (field 8), 0 when absent.
struct ViewHead {
  uint64_t epoch = 0;
  uint64_t checkpoint_clock = 0;
};

ViewHead ScanView(const std::string& view) {
  ViewHead head;
  google::protobuf::io::CodedInputStream in(
      reinterpret_cast<const uint8_t*>(view.data()),
      static_cast<int>(view.size()));
  while (const uint32_t tag = in.ReadTag()) {
    if (tag == 8) {
      if (!in.ReadVarint64(&head.epoch)) return {};
    } else if (tag == 64) {
      if (!in.ReadVarint64(&head.checkpoint_clock)) return {};
    } else if (!google::protobuf::internal::WireFormatLite::SkipField(&in,
                                                                      tag)) {
      return {};
    }
  }
  return head;
}

// What a simulated node reads of RegisterResponse: node_id (field 1), rank
// (2), its view's head (3) and the shard to train (5; shard -1 if none).
struct Registered {
  uint64_t node_id = 0;
  uint64_t rank = 0;
  ViewHead view;
  int shard = -1;
};

Registered ScanRegistered(const std::string& response) {
  Registered r;
  google::protobuf::io::CodedInputStream in(
      reinterpret_cast<const uint8_t*>(response.data()),
      static_cast<int>(response.size()));
  while (const uint32_t tag = in.ReadTag()) {
    if (tag == 8) {
      if (!in.ReadVarint64(&r.node_id)) return {};
    } else if (tag == 16) {
      if (!in.ReadVarint64(&r.rank)) return {};
    } else if (tag == 26 || tag == 42) {
      uint32_t length = 0;
      std::string field;
      if (!in.ReadVarint32(&length) ||
          !in.ReadString(&field, static_cast<int>(length))) {
        return {};
      }
      if (tag == 26) {
        r.view = ScanView(field);
      } else {
        DataPosition shard;
        if (shard.ParseFromString(field)) r.shard = shard.shard();
      }
    } else if (!google::protobuf::internal::WireFormatLite::SkipField(&in,
                                                                      tag)) {
      return {};
    }
  }
  return r;
}

struct SimNode {
  uint64_t node_id = 0;
  uint64_t rank = 0;
  bool server = false;
  std::unique_ptr<Scheduler::Stub> stub;
  std::unique_ptr<grpc::GenericStub> raw;
  // Guarded by Fleet::mu.
  uint64_t known_epoch = 0;
  bool heartbeat_in_flight = false;
  bool silent = false;
  bool left = false;
  // The shard it trains (-1: none) and the checkpoint it reported.
  int shard = -1;
  uint64_t reported_checkpoint = 0;
};

// A killed or preempted worker's replacement, registering.
struct Replacement {
  int spare;
  bool preempted;
  int64_t since_us;
  int64_t next_try_us;
};

class Fleet {
 public:
  Fleet(std::string address, uint64_t fingerprint, int64_t interval_us,
        std::string checkpoint_dir)
      : address_(std::move(address)),
        fingerprint_(fingerprint),
        interval_us_(interval_us),
        checkpoint_dir_(std::move(checkpoint_dir)) {}

  // Sizes the fleet: `count` nodes registered at the start, the first
  // `servers` of them servers, and `spares` workers that register later as
  // replacements. Call before Run and Register.
  void Prepare(int count, int servers, int spares) {
    nodes_.resize(count + spares);
    initial_ = count;
    servers_ = servers;
    for (int i = 0; i < count + spares; ++i) {
      grpc::ChannelArguments args;
      // Its own connection, as a node process has (gRPC shares one between
      // channels of the same target and arguments otherwise).
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
          address_, grpc::InsecureChannelCredentials(), args);
      nodes_[i].stub = Scheduler::NewStub(channel);
      nodes_[i].raw = std::make_unique<grpc::GenericStub>(channel);
    }
  }

  // Registers the nodes Prepare sized, up to --register_in_flight at once
  // per child (a fleet's processes start together, not one after
  // another); each starts watching the view once registered.
  absl::Status Register() {
    const int window = std::max(1, absl::GetFlag(FLAGS_register_in_flight));
    for (int i = 0; i < initial_; ++i) {
      {
        absl::MutexLock lock(&mu_);
        auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return register_in_flight_ < window;
        };
        mu_.Await(absl::Condition(&room));
        ++register_in_flight_;
      }
      StartRegister(i, i < servers_, [this, i](const grpc::Status& s) {
        absl::MutexLock lock(&mu_);
        --register_in_flight_;
        if (!s.ok()) {
          register_failure_ =
              absl::StrCat("register node ", i, ": ", s.error_message());
        }
      });
    }
    absl::MutexLock lock(&mu_);
    auto all_back = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return register_in_flight_ == 0;
    };
    mu_.Await(absl::Condition(&all_back));
    if (!register_failure_.empty()) {
      return absl::UnavailableError(register_failure_);
    }
    return absl::OkStatus();
  }

  // Heartbeats every registered node every interval, spread evenly, from
  // now on: the first nodes must not be declared dead while the others
  // register. Once `t0_us` is set (the parent's start time) runs the
  // schedule's leaves and silence, and returns at its end.
  void Run(const std::atomic<int64_t>& t0_us, const Schedule& sched, int leaves,
           bool silence, int churn_events) {
    const int n = static_cast<int>(nodes_.size());
    std::vector<int64_t> next(n);
    const int64_t start = NowUs();
    for (int i = 0; i < n; ++i) next[i] = start + interval_us_ * i / n;
    int leaves_done = 0;
    bool silenced = false;
    bool barrier_called = false;
    bool claims_called = false;
    int churn_done = 0;
    // Workers from the end leave; the one before them goes silent; churn
    // takes workers from the first on, and its replacements are the spares.
    int next_leaver = initial_ - 1;
    int next_victim = servers_;
    int next_spare = initial_;
    while (true) {
      const int64_t now = NowUs();
      const int64_t t0 = t0_us.load();
      const int64_t end_us = t0 == 0
                                 ? now + interval_us_
                                 : t0 + static_cast<int64_t>(sched.End() * 1e6);
      if (now >= end_us) break;
      const double t = t0 == 0 ? -1 : (now - t0) / 1e6;
      if (t0 != 0 && leaves_done < leaves && t >= sched.ChangeAt(leaves_done)) {
        Leave(next_leaver--);
        ++leaves_done;
      }
      if (t0 != 0 && !barrier_called && t >= sched.BarrierAt()) {
        barrier_called = true;
        CallBarrier();
      }
      if (t0 != 0 && churn_done < churn_events &&
          t >= sched.ChurnAt() +
                   (churn_done + 0.5) * sched.churn_s / churn_events) {
        {
          absl::MutexLock lock(&mu_);
          while (next_victim < next_leaver &&
                 nodes_[next_victim].node_id == 0) {
            ++next_victim;
          }
        }
        if (next_victim < next_leaver && next_spare < n) {
          Churn(/*preempt=*/churn_done % 2 == 0, next_victim++, next_spare++);
        }
        ++churn_done;
      }
      RetryReplacements();
      if (t0 != 0 && !claims_called && t >= sched.ClaimsAt()) {
        claims_called = true;
        StartClaims();
      }
      if (t0 != 0 && silence && !silenced && t >= sched.SilenceAt() &&
          next_leaver >= 0 && !nodes_[next_leaver].server) {
        absl::MutexLock lock(&mu_);
        nodes_[next_leaver].silent = true;
        silenced_ = {nodes_[next_leaver].node_id, NowUs()};
        silenced = true;
      }
      int64_t wake = now + interval_us_;
      for (int i = 0; i < n; ++i) {
        if (next[i] <= now) {
          Heartbeat(i, t0, sched);
          next[i] += interval_us_;
          if (next[i] < now) next[i] = now + interval_us_;  // fell behind
        }
        wake = std::min(wake, next[i]);
      }
      const int64_t sleep_us = std::min(wake, end_us) - NowUs();
      if (sleep_us > 0) absl::SleepFor(absl::Microseconds(sleep_us));
    }
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }

  // Writes "hb <us>", "arr <epoch> <unix us>", "bytes <epoch> <n>",
  // "leave <unix us>", "silenced <node id> <unix us>" lines and the
  // checkpoint's, churn's and claims' (see below).
  void Write(const std::string& path) {
    absl::MutexLock lock(&mu_);
    std::ofstream out(path);
    for (int64_t us : report_us_) out << "ckpt_report " << us << "\n";
    out << "ckpt_report_failed " << report_failures_ << "\n";
    for (const auto& [id, us] : killed_) {
      out << "killed " << id << " " << us << "\n";
    }
    for (int64_t us : replaced_preempted_us_) out << "replaced_preempted " << us << "\n";
    for (int64_t us : replaced_killed_us_) out << "replaced_killed " << us << "\n";
    out << "replace_failed " << replace_failures_ << "\n";
    for (int64_t us : claim_finish_us_) out << "claim_finish " << us << "\n";
    for (int64_t us : claim_done_us_) out << "claim_done " << us << "\n";
    out << "claim_assigned " << claims_assigned_ << "\n";
    out << "claim_failed " << claim_failures_ << "\n";
    for (int64_t us : heartbeat_us_) out << "hb " << us << "\n";
    for (const auto& [epoch, times] : arrivals_)
      for (int64_t us : times) out << "arr " << epoch << " " << us << "\n";
    for (const auto& [epoch, bytes] : bytes_)
      out << "bytes " << epoch << " " << bytes << "\n";
    for (int64_t us : leave_us_) out << "leave " << us << "\n";
    if (silenced_.first != 0) {
      out << "silenced " << silenced_.first << " " << silenced_.second << "\n";
    }
    out << "heartbeats " << heartbeats_in_window_ << "\n";
    if (barrier_last_call_us_ != 0) {
      out << "barrier_call " << barrier_last_call_us_ << "\n";
    }
    for (int64_t us : barrier_release_us_) out << "barrier_done " << us << "\n";
    out << "barrier_bytes " << barrier_bytes_ << "\n";
    if (barrier_failures_ > 0) {
      out << "barrier_failed " << barrier_failures_ << "\n";
    }
  }

  // Waits (a while) for the calls in flight to end after Run: their
  // callbacks use this object.
  void Drain() {
    for (int i = 0; i < 100; ++i) {
      {
        absl::MutexLock lock(&mu_);
        if (in_flight_ == 0) return;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

 private:
  // Registers node i (a server or a worker) and, once in, starts its view
  // watch; `done` gets the outcome (a registration without a node id is an
  // error).
  void StartRegister(int i, bool server,
                     std::function<void(const grpc::Status&)> done) {
    struct Call {
      grpc::ClientContext ctx;
      grpc::ByteBuffer request_bytes;
      grpc::ByteBuffer response;
      std::function<void(const grpc::Status&)> done;
    };
    SimNode& n = nodes_[i];
    RegisterRequest request;
    request.set_role(server ? SERVER : WORKER);
    if (server) {
      request.set_data_endpoint(absl::StrCat(
          "tcp://127.0.0.1:", 20000 + (getpid() % 1000) * 40 + i % 40));
    }
    request.set_host("sim");
    request.set_pid(static_cast<uint32_t>(getpid()));
    request.set_config_fingerprint(fingerprint_);
    request.set_trains_shards(!server);
    // As SchedulerClient: a worker's views list the servers and itself.
    request.set_servers_only(!server && absl::GetFlag(FLAGS_servers_only));
    auto* call = new Call;
    call->done = std::move(done);
    call->ctx.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(120));
    call->ctx.set_wait_for_ready(true);
    call->request_bytes = Serialized(request);
    n.raw->UnaryCall(
        &call->ctx, "/ps.Scheduler/Register", grpc::StubOptions(),
        &call->request_bytes, &call->response,
        [this, i, server, call](grpc::Status s) {
          Registered r;
          size_t bytes = 0;
          if (s.ok()) {
            const std::string raw = Bytes(call->response);
            bytes = raw.size();
            r = ScanRegistered(raw);
            if (r.node_id == 0) {
              s = grpc::Status(grpc::StatusCode::INTERNAL, "no node id");
            }
          }
          if (s.ok()) {
            absl::MutexLock lock(&mu_);
            SimNode& n = nodes_[i];
            n.server = server;
            n.node_id = r.node_id;
            n.rank = r.rank;
            n.shard = r.shard;
            Seen(i, r.view.epoch, bytes);
          }
          call->done(s);
          delete call;
          if (s.ok()) Watch(i);
        });
  }

  void Seen(int i, uint64_t epoch, size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    SimNode& n = nodes_[i];
    if (epoch <= n.known_epoch) return;
    n.known_epoch = epoch;
    arrivals_[epoch].push_back(NowUs());
    bytes_[epoch] += bytes;
  }

  void Watch(int i) {
    struct Call {
      grpc::ClientContext ctx;
      GetClusterViewRequest request;
      grpc::ByteBuffer request_bytes;
      grpc::ByteBuffer response;
    };
    auto* call = new Call;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || nodes_[i].silent || nodes_[i].left) {
        delete call;
        return;
      }
      call->request.set_min_epoch(nodes_[i].known_epoch + 1);
      // As SchedulerClient::WatchLoop: a delta against the view held.
      if (absl::GetFlag(FLAGS_view_deltas)) {
        call->request.set_known_epoch(nodes_[i].known_epoch);
      }
      if (!nodes_[i].server && absl::GetFlag(FLAGS_servers_only)) {
        call->request.set_servers_only(true);
        call->request.set_node_id(nodes_[i].node_id);
      }
      ++in_flight_;
    }
    call->request.set_timeout_ms(5000);
    call->ctx.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(15));
    call->request_bytes = Serialized(call->request);
    nodes_[i].raw->UnaryCall(
        &call->ctx, "/ps.Scheduler/GetClusterView", grpc::StubOptions(),
        &call->request_bytes, &call->response,
        [this, i, call](grpc::Status s) {
          std::string raw;
          if (s.ok()) raw = Bytes(call->response);
          const ViewHead head = s.ok() ? ScanView(raw) : ViewHead{};
          bool report = false;
          {
            absl::MutexLock lock(&mu_);
            --in_flight_;
            if (s.ok()) Seen(i, head.epoch, raw.size());
            // A checkpoint in progress: each node writes its part (here:
            // nothing) and reports it, as servers and workers do.
            SimNode& n = nodes_[i];
            if (head.checkpoint_clock > n.reported_checkpoint) {
              n.reported_checkpoint = head.checkpoint_clock;
              report = true;
            }
          }
          delete call;
          if (report) Report(i, head.checkpoint_clock);
          if (!s.ok()) absl::SleepFor(absl::Milliseconds(100));
          Watch(i);
        });
  }

  void Heartbeat(int i, int64_t t0_us, const Schedule& sched) {
    struct Call {
      grpc::ClientContext ctx;
      HeartbeatRequest request;
      HeartbeatResponse response;
      int64_t start_us;
    };
    auto* call = new Call;
    {
      absl::MutexLock lock(&mu_);
      SimNode& n = nodes_[i];
      if (n.node_id == 0 || n.silent || n.left || n.heartbeat_in_flight) {
        delete call;
        return;
      }
      n.heartbeat_in_flight = true;
      ++in_flight_;
      call->request.set_node_id(n.node_id);
      call->request.set_known_epoch(n.known_epoch);
    }
    call->start_us = NowUs();
    const bool measured = t0_us != 0 && call->start_us >= t0_us + 500000 &&
                          call->start_us < t0_us + sched.steady_s * 1e6;
    call->ctx.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(5));
    nodes_[i].stub->async()->Heartbeat(
        &call->ctx, &call->request, &call->response,
        [this, i, call, measured](grpc::Status s) {
          const int64_t us = NowUs() - call->start_us;
          {
            absl::MutexLock lock(&mu_);
            nodes_[i].heartbeat_in_flight = false;
            --in_flight_;
            if (s.ok() && measured) {
              heartbeat_us_.push_back(us);
              ++heartbeats_in_window_;
            }
          }
          delete call;
        });
  }

  // Every live worker of this child arrives at the barrier "fleet" now;
  // records the last call's start and each release.
  void CallBarrier() {
    struct Call {
      grpc::ClientContext ctx;
      BarrierRequest request;
      BarrierResponse response;
    };
    std::vector<int> workers;
    {
      absl::MutexLock lock(&mu_);
      for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
        const SimNode& n = nodes_[i];
        if (!n.server && n.node_id != 0 && !n.left && !n.silent) {
          workers.push_back(i);
        }
      }
      in_flight_ += static_cast<int>(workers.size());
    }
    for (int i : workers) {
      auto* call = new Call;
      call->request.set_node_id(nodes_[i].node_id);
      call->request.set_name("fleet");
      call->request.set_timeout_ms(30000);
      call->request.set_rank_runs(absl::GetFlag(FLAGS_barrier_rank_runs));
      call->ctx.set_deadline(std::chrono::system_clock::now() +
                             std::chrono::seconds(35));
      nodes_[i].stub->async()->Barrier(
          &call->ctx, &call->request, &call->response,
          [this, call](grpc::Status s) {
            const int64_t now = NowUs();
            {
              absl::MutexLock lock(&mu_);
              --in_flight_;
              if (s.ok()) {
                barrier_release_us_.push_back(now);
                barrier_bytes_ += call->response.ByteSizeLong();
              } else {
                ++barrier_failures_;
              }
            }
            delete call;
          });
    }
    absl::MutexLock lock(&mu_);
    barrier_last_call_us_ = NowUs();
  }

  // Node i's part of checkpoint `clock`: a server's shard file, a
  // worker's data position.
  void Report(int i, uint64_t clock) {
    struct Call {
      grpc::ClientContext ctx;
      ReportCheckpointRequest request;
      ReportCheckpointResponse response;
      int64_t start_us;
    };
    auto* call = new Call;
    {
      absl::MutexLock lock(&mu_);
      const SimNode& n = nodes_[i];
      call->request.set_node_id(n.node_id);
      call->request.set_clock(clock);
      call->request.set_ok(true);
      if (n.server) {
        // The scheduler commits only shard files that are there, of the
        // size reported.
        const std::string name = ShardFileName(static_cast<uint32_t>(n.rank));
        const std::string dir =
            absl::StrCat(checkpoint_dir_, "/", CheckpointDirName(clock));
        mkdir(dir.c_str(), 0755);
        std::ofstream(dir + "/" + name) << std::string(4096, '\0');
        call->request.set_file(name);
        call->request.set_bytes(4096);
        call->request.set_checksum(n.rank + 1);
      } else if (n.shard >= 0) {
        DataPosition* p = call->request.mutable_position();
        p->set_shard(n.shard);
        p->set_batch(7);
      }
      ++in_flight_;
    }
    call->start_us = NowUs();
    call->ctx.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(30));
    nodes_[i].stub->async()->ReportCheckpoint(
        &call->ctx, &call->request, &call->response,
        [this, call](grpc::Status s) {
          const int64_t us = NowUs() - call->start_us;
          {
            absl::MutexLock lock(&mu_);
            --in_flight_;
            if (s.ok()) {
              report_us_.push_back(us);
            } else {
              ++report_failures_;
              if (report_failures_ == 1) {
                std::fprintf(stderr, "checkpoint report: %s\n",
                             s.error_message().c_str());
              }
            }
          }
          delete call;
        });
  }

  // A churn event: worker `victim` is preempted (it leaves, saying where
  // its shard stands, as on SIGTERM) or killed (it goes silent, to be
  // declared dead); the spare node registers as its replacement at once
  // and retries until the scheduler has a free rank for it.
  void Churn(bool preempt, int victim, int spare) {
    const int64_t now = NowUs();
    SimNode& n = nodes_[victim];
    if (preempt) {
      LeaveRequest request;
      {
        absl::MutexLock lock(&mu_);
        n.left = true;
        request.set_node_id(n.node_id);
        if (n.shard >= 0) {
          request.mutable_position()->set_shard(n.shard);
          request.mutable_position()->set_batch(7);
        }
      }
      LeaveResponse response;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
      const grpc::Status s = n.stub->Leave(&ctx, request, &response);
      if (!s.ok()) {
        std::fprintf(stderr, "preempted leave: %s\n",
                     s.error_message().c_str());
      }
    } else {
      absl::MutexLock lock(&mu_);
      n.silent = true;
      killed_.emplace_back(n.node_id, now);
    }
    absl::MutexLock lock(&mu_);
    replacements_.push_back({spare, preempt, now, now});
  }

  // Starts the replacements whose (next) try is due.
  void RetryReplacements() {
    std::vector<Replacement> due;
    {
      absl::MutexLock lock(&mu_);
      const int64_t now = NowUs();
      for (auto it = replacements_.begin(); it != replacements_.end();) {
        if (it->next_try_us <= now) {
          due.push_back(*it);
          it = replacements_.erase(it);
        } else {
          ++it;
        }
      }
      in_flight_ += static_cast<int>(due.size());
    }
    for (const Replacement& r : due) {
      StartRegister(r.spare, /*server=*/false, [this, r](const grpc::Status& s) {
        int claim = -2;  // -2: none
        {
          absl::MutexLock lock(&mu_);
          --in_flight_;
          const int64_t now = NowUs();
          if (s.ok()) {
            (r.preempted ? replaced_preempted_us_ : replaced_killed_us_)
                .push_back(now - r.since_us);
            // In after the end of training began: it reports its shard (if
            // it was given one) and waits with the others.
            if (claims_started_) claim = nodes_[r.spare].shard;
          } else {
            RetryLater(r, now, s);
          }
        }
        if (claim != -2) Claim(r.spare, claim);
      });
    }
  }

  // A replacement's registration failed: retried while there is time.
  void RetryLater(const Replacement& r, int64_t now, const grpc::Status& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!stopping_ && now - r.since_us < 60'000'000) {
      // No free rank until the scheduler declares the killed node dead
      // (RESOURCE_EXHAUSTED): retry, as a restarted pod does.
      Replacement again = r;
      again.next_try_us = now + 250'000;
      replacements_.push_back(again);
    } else {
      ++replace_failures_;
      std::fprintf(stderr, "replacement: %s\n", s.error_message().c_str());
    }
  }

  // The end of training: every live worker reports its shard done and
  // asks for more (ClaimShard): an orphaned shard is "trained" and
  // reported at once; otherwise it waits until every shard is done.
  void StartClaims() {
    std::vector<std::pair<int, int>> workers;
    {
      absl::MutexLock lock(&mu_);
      claims_started_ = true;
      for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
        const SimNode& n = nodes_[i];
        if (!n.server && n.node_id != 0 && !n.left && !n.silent) {
          workers.emplace_back(i, n.shard);
        }
      }
    }
    for (const auto& [i, shard] : workers) Claim(i, shard);
  }

  // One ClaimShard call of node i, reporting `finished` done (-1: none).
  void Claim(int i, int finished) {
    struct Call {
      grpc::ClientContext ctx;
      ClaimShardRequest request;
      ClaimShardResponse response;
    };
    auto* call = new Call;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        delete call;
        return;
      }
      ++in_flight_;
      call->request.set_node_id(nodes_[i].node_id);
      if (finished >= 0) {
        DataPosition* p = call->request.mutable_finished();
        p->set_shard(static_cast<uint32_t>(finished));
        p->set_epoch(1);
        p->set_done(true);
        claim_finish_us_.push_back(NowUs());
      }
    }
    call->request.set_timeout_ms(5000);
    call->ctx.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(15));
    nodes_[i].stub->async()->ClaimShard(
        &call->ctx, &call->request, &call->response,
        [this, i, call](grpc::Status s) {
          int next = -2;  // -2: no further call
          {
            absl::MutexLock lock(&mu_);
            --in_flight_;
            if (!s.ok()) {
              if (++claim_failures_ == 1) {
                std::fprintf(stderr, "claim: %s\n", s.error_message().c_str());
              }
            } else if (call->response.result() ==
                       ClaimShardResponse::ASSIGNED) {
              ++claims_assigned_;
              nodes_[i].shard = static_cast<int>(call->response.shard().shard());
              next = nodes_[i].shard;
            } else if (call->response.result() == ClaimShardResponse::WAIT) {
              next = -1;
            } else {
              claim_done_us_.push_back(NowUs());
            }
          }
          delete call;
          if (next != -2) Claim(i, next);
        });
  }

  void Leave(int i) {
    SimNode& n = nodes_[i];
    {
      absl::MutexLock lock(&mu_);
      n.left = true;
      leave_us_.push_back(NowUs());
    }
    LeaveRequest request;
    request.set_node_id(n.node_id);
    LeaveResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    const grpc::Status s = n.stub->Leave(&ctx, request, &response);
    if (!s.ok()) std::fprintf(stderr, "leave: %s\n", s.error_message().c_str());
  }

  const std::string address_;
  const uint64_t fingerprint_;
  const int64_t interval_us_;
  const std::string checkpoint_dir_;
  std::vector<SimNode> nodes_;
  // Set by Prepare, before the threads start.
  int initial_ = 0;
  int servers_ = 0;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> heartbeat_us_ ABSL_GUARDED_BY(mu_);
  uint64_t heartbeats_in_window_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::vector<int64_t>> arrivals_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint64_t> bytes_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> leave_us_ ABSL_GUARDED_BY(mu_);
  std::pair<uint64_t, int64_t> silenced_ ABSL_GUARDED_BY(mu_) = {0, 0};
  int register_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::string register_failure_ ABSL_GUARDED_BY(mu_);
  int64_t barrier_last_call_us_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> barrier_release_us_ ABSL_GUARDED_BY(mu_);
  int barrier_failures_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes of the barrier's answers (their messages, serialised).
  uint64_t barrier_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> report_us_ ABSL_GUARDED_BY(mu_);
  int report_failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<uint64_t, int64_t>> killed_ ABSL_GUARDED_BY(mu_);
  std::vector<Replacement> replacements_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> replaced_preempted_us_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> replaced_killed_us_ ABSL_GUARDED_BY(mu_);
  int replace_failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> claim_finish_us_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> claim_done_us_ ABSL_GUARDED_BY(mu_);
  bool claims_started_ ABSL_GUARDED_BY(mu_) = false;
  int claims_assigned_ ABSL_GUARDED_BY(mu_) = 0;
  int claim_failures_ ABSL_GUARDED_BY(mu_) = 0;
};

int ChildMain() {
  absl::StatusOr<JobConfig> config = LoadJobConfig(absl::GetFlag(FLAGS_config));
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 1;
  }
  Fleet fleet(absl::GetFlag(FLAGS_scheduler), ConfigFingerprint(*config),
              int64_t{config->cluster().heartbeat_interval_ms()} * 1000,
              config->checkpoint().dir());
  const int churn_events = absl::GetFlag(FLAGS_churn_events);
  fleet.Prepare(absl::GetFlag(FLAGS_count), absl::GetFlag(FLAGS_servers),
                churn_events);
  std::atomic<int64_t> t0{0};
  std::thread runner([&] {
    fleet.Run(t0, TheSchedule(), absl::GetFlag(FLAGS_leaves),
              absl::GetFlag(FLAGS_silence), churn_events);
  });
  const absl::Status registered = fleet.Register();
  if (!registered.ok()) {
    std::fprintf(stderr, "%s\n", registered.ToString().c_str());
    std::_Exit(1);
  }
  std::ofstream(absl::GetFlag(FLAGS_ready_file)) << NowUs() << "\n";
  while (t0.load() == 0) {
    int64_t go = 0;
    if (absl::SimpleAtoi(
            absl::StripAsciiWhitespace(ReadFile(absl::GetFlag(FLAGS_go_file))),
            &go) &&
        go > 0) {
      t0.store(go);
    } else {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  runner.join();
  fleet.Drain();
  fleet.Write(absl::GetFlag(FLAGS_out));
  // Calls still in flight after Drain's wait hold the fleet: no teardown.
  std::fflush(nullptr);
  std::_Exit(0);
}

// ---- the parent: the scheduler, the children, the figures

std::string JobConfigText(int servers, int workers,
                          const std::string& checkpoint_dir) {
  return absl::StrFormat(
      R"pb(name: "fleet"
           cluster {
             num_servers: %d
             num_workers: %d
             num_slots: %d
             heartbeat_interval_ms: %d
             heartbeat_timeout_ms: %d
           }
           consistency { mode: ASYNC }
           checkpoint { dir: "%s" }
           tables {
             id: 0
             name: "w"
             sparse { dim: 1 }
             optimizer { sgd { learning_rate: 0.1 } }
           }
           tables {
             id: 1
             name: "d"
             dense { size: 0 }
             optimizer { sgd { learning_rate: 0.1 } }
           }
           data { synthetic_ctr { num_train: 1000 num_test: 100 } }
           training { batch_size: 10 sparse_table: "w" dense_table: "d" }
      )pb",
      servers, workers, std::max(4096, servers),
      absl::GetFlag(FLAGS_heartbeat_ms),
      absl::GetFlag(FLAGS_heartbeat_timeout_ms), checkpoint_dir);
}

// A port free now on loopback (for the scheduler's HTTP endpoint, whose
// /metrics has the journal's figures).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// GET http://127.0.0.1:PORT/metrics; "" on any failure.
std::string Metrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  std::string body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, request.data(), request.size()) ==
        static_cast<ssize_t>(request.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) body.append(buf, n);
    }
  }
  close(fd);
  return body;
}

// The value of an unlabelled metric in /metrics text, or -1.
double MetricValue(const std::string& text, absl::string_view name) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, name) && absl::ConsumePrefix(&line, " ")) {
      double v;
      if (absl::SimpleAtod(line, &v)) return v;
    }
  }
  return -1;
}

struct Results {
  std::vector<double> heartbeat_ms;
  uint64_t heartbeats = 0;
  std::map<uint64_t, std::vector<int64_t>> arrivals;
  std::map<uint64_t, uint64_t> bytes;
  std::vector<int64_t> leaves;
  uint64_t silenced = 0;
  int64_t silenced_at = 0;
  int64_t barrier_last_call = 0;
  std::vector<int64_t> barrier_done;
  int barrier_failed = 0;
  int barrier_bytes = 0;
  std::vector<double> report_ms;
  int report_failed = 0;
  std::map<uint64_t, int64_t> killed;  // node id -> when
  std::vector<double> replaced_preempted_ms, replaced_killed_ms;
  int replace_failed = 0;
  int64_t claim_last_finish = 0;
  std::vector<int64_t> claim_done;
  int claims_assigned = 0, claim_failed = 0;
};

void ReadResults(const std::string& path, Results* r) {
  // Lines by their shape: a count added up, a time in us kept as ms, a
  // unix time kept, a unix time of which the latest is kept.
  const std::map<std::string, int Results::*> counts = {
      {"barrier_failed", &Results::barrier_failed},
      {"barrier_bytes", &Results::barrier_bytes},
      {"ckpt_report_failed", &Results::report_failed},
      {"replace_failed", &Results::replace_failed},
      {"claim_assigned", &Results::claims_assigned},
      {"claim_failed", &Results::claim_failed}};
  const std::map<std::string, std::vector<double> Results::*> durations = {
      {"hb", &Results::heartbeat_ms},
      {"ckpt_report", &Results::report_ms},
      {"replaced_preempted", &Results::replaced_preempted_ms},
      {"replaced_killed", &Results::replaced_killed_ms}};
  const std::map<std::string, std::vector<int64_t> Results::*> times = {
      {"leave", &Results::leaves},
      {"barrier_done", &Results::barrier_done},
      {"claim_done", &Results::claim_done}};
  const std::map<std::string, int64_t Results::*> latest = {
      {"barrier_call", &Results::barrier_last_call},
      {"claim_finish", &Results::claim_last_finish}};
  std::istringstream in(ReadFile(path));
  std::string kind;
  while (in >> kind) {
    if (auto c = counts.find(kind); c != counts.end()) {
      int n = 0;
      in >> n;
      r->*(c->second) += n;
    } else if (auto d = durations.find(kind); d != durations.end()) {
      int64_t us = 0;
      in >> us;
      (r->*(d->second)).push_back(us / 1000.0);
    } else if (auto t = times.find(kind); t != times.end()) {
      int64_t us = 0;
      in >> us;
      (r->*(t->second)).push_back(us);
    } else if (auto l = latest.find(kind); l != latest.end()) {
      int64_t us = 0;
      in >> us;
      r->*(l->second) = std::max(r->*(l->second), us);
    } else if (kind == "arr") {
      uint64_t epoch;
      int64_t us;
      in >> epoch >> us;
      r->arrivals[epoch].push_back(us);
    } else if (kind == "bytes") {
      uint64_t epoch, bytes;
      in >> epoch >> bytes;
      r->bytes[epoch] += bytes;
    } else if (kind == "silenced") {
      in >> r->silenced >> r->silenced_at;
    } else if (kind == "heartbeats") {
      uint64_t n;
      in >> n;
      r->heartbeats += n;
    } else if (kind == "killed") {
      uint64_t id;
      int64_t us;
      in >> id >> us;
      r->killed[id] = us;
    }
  }
}

struct Figures {
  int nodes = 0;
  double startup_s = 0;
  double cpu_per_s = 0;
  double sim_cpu_per_s = 0;  // the simulated nodes' processes together
  double cpu_us_per_heartbeat = 0;
  double heartbeats_per_s = 0;
  double hb_p50_ms = 0, hb_p99_ms = 0;
  double view_p50_ms = 0, view_p99_ms = 0, view_max_ms = 0;
  double bytes_per_change = 0;
  double view_bytes = 0;
  double nodes_reached = 0;  // fraction of live nodes that got each change
  double dead_after_ms = -1;
  int false_deaths = 0;
  double barrier_p50_ms = 0, barrier_p99_ms = 0, barrier_max_ms = 0;
  int barrier_released = 0, barrier_failed = 0;
  // The barrier's answers, in bytes, all workers together.
  double barrier_bytes = 0;
  double journal_writes_startup = 0;
  double journal_ms_per_write = 0;
  double journal_bytes = 0;
  // The checkpoint: from the request to the view saying it committed.
  double checkpoint_ms = -1;
  double checkpoint_report_p50_ms = 0, checkpoint_report_p99_ms = 0;
  int checkpoint_reports = 0, checkpoint_report_failed = 0;
  double checkpoint_journal_writes = 0;
  // Churn: events, the replacements' wait (from the preemption or kill to
  // the replacement's registration), the scheduler's CPU meanwhile.
  int churn_events = 0;
  double replace_preempted_p50_ms = 0, replace_preempted_p99_ms = 0;
  double replace_killed_p50_ms = 0, replace_killed_p99_ms = 0;
  int replaced = 0, replace_failed = 0;
  double churn_cpu_per_s = 0;
  double dead_after_max_ms = -1;  // over the silenced and killed nodes
  // Claims: from the last shard reported done to each worker's ALL_DONE.
  double claims_release_p50_ms = 0, claims_release_p99_ms = 0,
         claims_release_max_ms = 0;
  int claims_all_done = 0, claims_assigned = 0, claims_failed = 0;
  double claims_cpu_per_s = 0;
  // The scheduler's threads, most seen from the first view change on
  // (sampled with every view poll): a call that waits on a thread of
  // gRPC's synchronous pool shows here.
  int scheduler_threads_max = 0;
};

absl::StatusOr<Figures> RunFleet(int nodes, const std::string& root) {
  const Schedule sched = TheSchedule();
  const int processes = std::max(1, absl::GetFlag(FLAGS_processes));
  const int servers = std::max(1, nodes / 16);
  const int workers = nodes - servers;
  const double churn_rate = absl::GetFlag(FLAGS_churn_per_s) > 0
                                ? absl::GetFlag(FLAGS_churn_per_s)
                                : std::max(1.0, nodes / 1000.0);
  const int churn_events =
      sched.churn_s > 0
          ? std::max(1, static_cast<int>(std::lround(churn_rate * sched.churn_s)))
          : 0;
  if (workers < processes * (sched.changes + 2) + churn_events) {
    return absl::InvalidArgumentError(absl::StrCat(
        nodes, " nodes are too few for ", processes, " processes, ",
        sched.changes, " changes and ", churn_events, " churn events"));
  }
  const std::string dir = absl::StrCat(root, "/n", nodes);
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("mkdir ", dir, " failed"));
  }
  const std::string config = dir + "/job.pbtxt";
  std::ofstream(config) << JobConfigText(servers, workers, dir + "/ckpt");
  const std::string port_file = dir + "/scheduler.port";
  const int http_port = FreePort();
  PS_ASSIGN_OR_RETURN(
      Subprocess scheduler,
      Subprocess::Start(
          {Runfile("scheduler/scheduler_main"), "--config=" + config,
           "--port_file=" + port_file, "--log_level=warn",
           absl::StrCat("--http_port=", http_port),
           "--state_dir=" + dir + "/scheduler-state"},
          dir + "/scheduler.out", dir + "/scheduler.log"));
  int port = 0;
  for (int i = 0; i < 300 && port == 0 && scheduler.running(); ++i) {
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(port_file)),
                          &port)) {
      port = 0;
    }
    if (port == 0) absl::SleepFor(absl::Milliseconds(50));
  }
  if (port == 0) {
    return absl::UnavailableError("the scheduler wrote no port: " +
                                  ReadFile(dir + "/scheduler.log"));
  }
  const std::string address = absl::StrCat("127.0.0.1:", port);

  // The children: servers and workers spread evenly; the last child's
  // workers leave, the first child's last worker goes silent.
  const std::string go_file = dir + "/go";
  std::remove(go_file.c_str());
  std::vector<Subprocess> children;
  const absl::Time started = absl::Now();
  for (int c = 0; c < processes; ++c) {
    const int count = nodes / processes + (c < nodes % processes ? 1 : 0);
    const int child_servers =
        servers / processes + (c < servers % processes ? 1 : 0);
    PS_ASSIGN_OR_RETURN(
        Subprocess child,
        Subprocess::Start(
            {"/proc/self/exe",
             "--child",
             "--scheduler=" + address,
             "--config=" + config,
             absl::StrCat("--count=", count),
             absl::StrCat("--servers=", child_servers),
             absl::StrCat("--leaves=", c == processes - 1 ? sched.changes : 0),
             absl::StrCat("--churn_events=",
                          churn_events / processes +
                              (c < churn_events % processes ? 1 : 0)),
             absl::StrCat("--checkpoint_s=", sched.checkpoint_s),
             absl::StrCat("--churn_s=", sched.churn_s),
             absl::StrCat("--claims_s=", sched.claims_s),
             absl::StrCat("--silence=", c == 0 ? "true" : "false"),
             absl::StrCat("--steady_s=", sched.steady_s),
             absl::StrCat("--changes=", sched.changes),
             absl::StrCat("--change_gap_s=", sched.change_gap_s),
             absl::StrCat("--barrier_s=", sched.barrier_s),
             absl::StrCat("--register_in_flight=",
                          absl::GetFlag(FLAGS_register_in_flight)),
             absl::StrCat("--heartbeat_timeout_ms=",
                          absl::GetFlag(FLAGS_heartbeat_timeout_ms)),
             absl::StrCat("--view_deltas=",
                          absl::GetFlag(FLAGS_view_deltas) ? "true" : "false"),
             absl::StrCat(
                 "--barrier_rank_runs=",
                 absl::GetFlag(FLAGS_barrier_rank_runs) ? "true" : "false"),
             absl::StrCat("--servers_only=",
                          absl::GetFlag(FLAGS_servers_only) ? "true" : "false"),
             absl::StrCat("--ready_file=", dir, "/ready", c),
             "--go_file=" + go_file,
             absl::StrCat("--out=", dir, "/out", c)},
            absl::StrCat(dir, "/child", c, ".out"),
            absl::StrCat(dir, "/child", c, ".log")));
    children.push_back(std::move(child));
  }
  for (int c = 0; c < processes; ++c) {
    while (ReadFile(absl::StrCat(dir, "/ready", c)).empty()) {
      if (!children[c].running()) {
        return absl::InternalError(absl::StrCat(
            "child ", c,
            " exited: ", ReadFile(absl::StrCat(dir, "/child", c, ".log"))));
      }
      if (absl::Now() - started > absl::Minutes(10)) {
        return absl::DeadlineExceededError("the nodes did not register");
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  Figures f;
  f.nodes = nodes;
  f.startup_s = absl::ToDoubleSeconds(absl::Now() - started);
  f.journal_writes_startup =
      MetricValue(Metrics(http_port), "ps_scheduler_journal_writes_total");
  const int64_t t0 = NowUs() + 200000;
  std::ofstream(go_file) << t0 << "\n";

  // Steady: the scheduler's CPU over the measured window.
  absl::SleepFor(absl::Microseconds(t0 + 500000 - NowUs()));
  std::vector<pid_t> child_pids;
  for (const Subprocess& child : children) child_pids.push_back(child.pid());
  const double cpu0 = RunningCpuSeconds({scheduler.pid()});
  const double sim0 = RunningCpuSeconds(child_pids);
  const int64_t w0 = NowUs();
  absl::SleepFor(absl::Microseconds(
      t0 + static_cast<int64_t>(sched.steady_s * 1e6) - NowUs()));
  const double cpu1 = RunningCpuSeconds({scheduler.pid()});
  const double sim1 = RunningCpuSeconds(child_pids);
  const double window_s = (NowUs() - w0) / 1e6;
  f.cpu_per_s = (cpu1 - cpu0) / window_s;
  f.sim_cpu_per_s = (sim1 - sim0) / window_s;

  // From here to the end: the view, long-polled as deltas (nodes shown
  // DEAD, the checkpoint committed), the checkpoint started on time, and
  // the scheduler's CPU over the churn and the claims.
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = Scheduler::NewStub(channel);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    ClusterView view;
    if (stub->GetClusterView(&ctx, GetClusterViewRequest(), &view).ok()) {
      f.view_bytes = static_cast<double>(view.ByteSizeLong());
    }
  }
  std::map<uint64_t, int64_t> first_dead;
  uint64_t known = 0;
  bool checkpoint_started = false;
  uint64_t checkpoint_clock = 0;
  int64_t checkpoint_at = 0;
  double journal_before_checkpoint = -1;
  // CPU samples (scheduler seconds, unix us) at ChurnAt, SilenceAt, ClaimsAt.
  std::vector<std::pair<double, int64_t>> cpu_at;
  const double marks[] = {sched.ChurnAt(), sched.SilenceAt(), sched.ClaimsAt()};
  const int64_t end = t0 + static_cast<int64_t>(sched.End() * 1e6);
  while (NowUs() < end) {
    const double t = (NowUs() - t0) / 1e6;
    if (!checkpoint_started && sched.checkpoint_s > 0 &&
        t >= sched.CheckpointAt()) {
      checkpoint_started = true;
      journal_before_checkpoint =
          MetricValue(Metrics(http_port), "ps_scheduler_journal_writes_total");
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
      CheckpointResponse response;
      checkpoint_at = NowUs();
      const grpc::Status s =
          stub->Checkpoint(&ctx, CheckpointRequest(), &response);
      if (s.ok()) {
        checkpoint_clock = response.clock();
      } else {
        std::fprintf(stderr, "checkpoint: %s\n", s.error_message().c_str());
      }
    }
    if (cpu_at.size() < 3 && t >= marks[cpu_at.size()]) {
      if (cpu_at.size() == 0 && journal_before_checkpoint >= 0) {
        f.checkpoint_journal_writes =
            MetricValue(Metrics(http_port),
                        "ps_scheduler_journal_writes_total") -
            journal_before_checkpoint;
      }
      cpu_at.emplace_back(RunningCpuSeconds({scheduler.pid()}), NowUs());
    }
    f.scheduler_threads_max =
        std::max(f.scheduler_threads_max, ThreadsOf(scheduler.pid()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    GetClusterViewRequest request;
    request.set_min_epoch(known + 1);
    request.set_known_epoch(known);
    request.set_timeout_ms(200);
    ClusterView view;
    if (stub->GetClusterView(&ctx, request, &view).ok()) {
      const int64_t now = NowUs();
      known = std::max(known, view.epoch());
      for (const NodeInfo& n : view.nodes()) {
        if (n.state() == DEAD) first_dead.emplace(n.node_id(), now);
      }
      if (checkpoint_clock > 0 && f.checkpoint_ms < 0 &&
          view.last_checkpoint_clock() >= checkpoint_clock) {
        f.checkpoint_ms = (now - checkpoint_at) / 1000.0;
      }
    } else {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  const double cpu_end = RunningCpuSeconds({scheduler.pid()});
  const int64_t end_us = NowUs();
  if (cpu_at.size() == 3) {
    f.churn_cpu_per_s = (cpu_at[1].first - cpu_at[0].first) /
                        ((cpu_at[1].second - cpu_at[0].second) / 1e6);
    f.claims_cpu_per_s =
        (cpu_end - cpu_at[2].first) / ((end_us - cpu_at[2].second) / 1e6);
  }
  for (Subprocess& child : children) {
    absl::StatusOr<int> code = child.Wait(absl::Minutes(2));
    if (!code.ok() || *code != 0) {
      return absl::InternalError("a child failed; see " + dir);
    }
  }
  {
    const std::string metrics = Metrics(http_port);
    const double writes =
        MetricValue(metrics, "ps_scheduler_journal_writes_total");
    const double seconds =
        MetricValue(metrics, "ps_scheduler_journal_write_seconds_total");
    if (writes > 0) f.journal_ms_per_write = seconds / writes * 1000;
    f.journal_bytes = MetricValue(metrics, "ps_scheduler_journal_bytes");
  }
  scheduler.Signal(SIGTERM);
  (void)scheduler.Wait(absl::Seconds(10));

  Results r;
  for (int c = 0; c < processes; ++c) {
    ReadResults(absl::StrCat(dir, "/out", c), &r);
  }
  f.heartbeats_per_s = r.heartbeats / (sched.steady_s - 0.5);
  f.cpu_us_per_heartbeat = f.cpu_per_s / f.heartbeats_per_s * 1e6;
  f.hb_p50_ms = Quantile(r.heartbeat_ms, 0.5);
  f.hb_p99_ms = Quantile(r.heartbeat_ms, 0.99);
  // Each leave's epoch: the first epoch whose first arrival follows it.
  std::vector<double> view_ms;
  double bytes = 0;
  double reached = 0;
  int live = nodes;  // before this leave: the leaver may still get it
  for (int64_t leave : r.leaves) {
    for (auto& [epoch, times] : r.arrivals) {
      std::sort(times.begin(), times.end());
      if (times.front() <= leave) continue;
      for (int64_t t : times) view_ms.push_back((t - leave) / 1000.0);
      bytes += r.bytes[epoch];
      reached += static_cast<double>(times.size()) / live;
      break;
    }
    --live;
  }
  if (!r.leaves.empty()) {
    f.bytes_per_change = bytes / r.leaves.size();
    f.nodes_reached = reached / r.leaves.size();
  }
  f.view_p50_ms = Quantile(view_ms, 0.5);
  f.view_p99_ms = Quantile(view_ms, 0.99);
  f.view_max_ms = Quantile(view_ms, 1.0);
  std::vector<double> barrier_ms;
  for (int64_t done : r.barrier_done) {
    barrier_ms.push_back(std::max<int64_t>(0, done - r.barrier_last_call) /
                         1000.0);
  }
  f.barrier_released = static_cast<int>(r.barrier_done.size());
  f.barrier_failed = r.barrier_failed;
  f.barrier_bytes = r.barrier_bytes;
  f.barrier_p50_ms = Quantile(barrier_ms, 0.5);
  f.barrier_p99_ms = Quantile(barrier_ms, 0.99);
  f.barrier_max_ms = Quantile(barrier_ms, 1.0);
  for (const auto& [id, at] : first_dead) {
    if (id == r.silenced) {
      f.dead_after_ms = (at - r.silenced_at) / 1000.0;
      f.dead_after_max_ms = std::max(f.dead_after_max_ms, f.dead_after_ms);
    } else if (auto k = r.killed.find(id); k != r.killed.end()) {
      f.dead_after_max_ms =
          std::max(f.dead_after_max_ms, (at - k->second) / 1000.0);
    } else {
      ++f.false_deaths;
    }
  }
  f.checkpoint_reports = static_cast<int>(r.report_ms.size());
  f.checkpoint_report_failed = r.report_failed;
  f.checkpoint_report_p50_ms = Quantile(r.report_ms, 0.5);
  f.checkpoint_report_p99_ms = Quantile(r.report_ms, 0.99);
  f.churn_events = churn_events;
  f.replaced = static_cast<int>(r.replaced_preempted_ms.size() +
                                r.replaced_killed_ms.size());
  f.replace_failed = r.replace_failed;
  f.replace_preempted_p50_ms = Quantile(r.replaced_preempted_ms, 0.5);
  f.replace_preempted_p99_ms = Quantile(r.replaced_preempted_ms, 0.99);
  f.replace_killed_p50_ms = Quantile(r.replaced_killed_ms, 0.5);
  f.replace_killed_p99_ms = Quantile(r.replaced_killed_ms, 0.99);
  std::vector<double> release_ms;
  for (int64_t done : r.claim_done) {
    release_ms.push_back(std::max<int64_t>(0, done - r.claim_last_finish) /
                         1000.0);
  }
  f.claims_all_done = static_cast<int>(r.claim_done.size());
  f.claims_assigned = r.claims_assigned;
  f.claims_failed = r.claim_failed;
  f.claims_release_p50_ms = Quantile(release_ms, 0.5);
  f.claims_release_p99_ms = Quantile(release_ms, 0.99);
  f.claims_release_max_ms = Quantile(release_ms, 1.0);
  return f;
}

std::string Json(const Figures& f) {
  return absl::StrFormat(
      R"({"bench":"fleet","nodes":%d,"startup_s":%.2f,)"
      R"("scheduler_cpu_per_s":%.3f,"scheduler_cpu_us_per_heartbeat":%.1f,)"
      R"("simulator_cpu_per_s":%.3f,)"
      R"("heartbeats_per_s":%.0f,"heartbeat_p50_ms":%.2f,)"
      R"("heartbeat_p99_ms":%.2f,"view_change_p50_ms":%.1f,)"
      R"("view_change_p99_ms":%.1f,"view_change_max_ms":%.1f,)"
      R"("nodes_reached":%.3f,"view_bytes":%.0f,"bytes_per_view_change":%.0f,)"
      R"("dead_after_ms":%.0f,"false_deaths":%d,)"
      R"("barrier_release_p50_ms":%.1f,"barrier_release_p99_ms":%.1f,)"
      R"("barrier_release_max_ms":%.1f,"barrier_released":%d,)"
      R"("barrier_failed":%d,"barrier_bytes":%.0f,"journal_writes_startup":%.0f,)"
      R"("journal_ms_per_write":%.3f,"journal_bytes":%.0f,)"
      R"("checkpoint_ms":%.1f,"checkpoint_reports":%d,)"
      R"("checkpoint_report_failed":%d,"checkpoint_report_p50_ms":%.2f,)"
      R"("checkpoint_report_p99_ms":%.2f,"checkpoint_journal_writes":%.0f,)"
      R"("churn_events":%d,"churn_scheduler_cpu_per_s":%.3f,"replaced":%d,)"
      R"("replace_failed":%d,"replace_preempted_p50_ms":%.1f,)"
      R"("replace_preempted_p99_ms":%.1f,"replace_killed_p50_ms":%.1f,)"
      R"("replace_killed_p99_ms":%.1f,"dead_after_max_ms":%.0f,)"
      R"("claims_all_done":%d,"claims_assigned":%d,"claims_failed":%d,)"
      R"("claims_release_p50_ms":%.1f,"claims_release_p99_ms":%.1f,)"
      R"("claims_release_max_ms":%.1f,"claims_scheduler_cpu_per_s":%.3f,)"
      R"("scheduler_threads_max":%d})",
      f.nodes, f.startup_s, f.cpu_per_s, f.cpu_us_per_heartbeat,
      f.sim_cpu_per_s, f.heartbeats_per_s, f.hb_p50_ms, f.hb_p99_ms,
      f.view_p50_ms, f.view_p99_ms, f.view_max_ms, f.nodes_reached,
      f.view_bytes, f.bytes_per_change, f.dead_after_ms, f.false_deaths,
      f.barrier_p50_ms, f.barrier_p99_ms, f.barrier_max_ms, f.barrier_released,
      f.barrier_failed, f.barrier_bytes, f.journal_writes_startup,
      f.journal_ms_per_write, f.journal_bytes, f.checkpoint_ms,
      f.checkpoint_reports, f.checkpoint_report_failed,
      f.checkpoint_report_p50_ms, f.checkpoint_report_p99_ms,
      f.checkpoint_journal_writes, f.churn_events, f.churn_cpu_per_s,
      f.replaced, f.replace_failed, f.replace_preempted_p50_ms,
      f.replace_preempted_p99_ms, f.replace_killed_p50_ms,
      f.replace_killed_p99_ms, f.dead_after_max_ms, f.claims_all_done,
      f.claims_assigned, f.claims_failed, f.claims_release_p50_ms,
      f.claims_release_p99_ms, f.claims_release_max_ms, f.claims_cpu_per_s,
      f.scheduler_threads_max);
}

// The exponent k of value ~ N^k between two fleet sizes.
double Exponent(double n0, double v0, double n1, double v1) {
  if (v0 <= 0 || v1 <= 0 || n0 == n1) return 0;
  return std::log(v1 / v0) / std::log(n1 / n0);
}

int ParentMain(const char* argv0) {
  if (absl::Status s = FindRunfiles(argv0); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  rlimit files;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
    files.rlim_cur = files.rlim_max;  // a socket per node, on both sides
    setrlimit(RLIMIT_NOFILE, &files);
  }
  std::string root = absl::GetFlag(FLAGS_dir);
  if (root.empty()) {
    char tmpl[] = "/tmp/fleet_bench.XXXXXX";
    root = mkdtemp(tmpl);
  } else if (mkdir(root.c_str(), 0755) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "--dir: cannot make %s\n", root.c_str());
    return 2;
  }
  std::vector<Figures> all;
  for (absl::string_view n : absl::StrSplit(absl::GetFlag(FLAGS_nodes), ',')) {
    int nodes = 0;
    if (!absl::SimpleAtoi(n, &nodes) || nodes <= 0) {
      std::fprintf(stderr, "--nodes: bad size '%s'\n", std::string(n).c_str());
      return 2;
    }
    std::fprintf(stderr, "fleet of %d nodes (%s/n%d)...\n", nodes, root.c_str(),
                 nodes);
    absl::StatusOr<Figures> f = RunFleet(nodes, root);
    if (!f.ok()) {
      // Where one scheduler stops keeping up is a result too (e.g. a node
      // declared dead while the fleet registers fails the job): larger
      // fleets are not tried.
      std::string reason(f.status().message());
      absl::StrReplaceAll({{"\"", "'"}, {"\n", " "}}, &reason);
      std::printf("{\"bench\":\"fleet\",\"nodes\":%d,\"failed\":\"%s\"}\n",
                  nodes, reason.substr(0, 400).c_str());
      std::fflush(stdout);
      break;
    }
    std::printf("%s\n", Json(*f).c_str());
    std::fflush(stdout);
    all.push_back(*f);
  }
  if (all.size() >= 2) {
    const Figures& a = all.front();
    const Figures& b = all.back();
    auto k = [&](double Figures::*field) {
      return Exponent(a.nodes, a.*field, b.nodes, b.*field);
    };
    std::printf(R"({"bench":"fleet","exponents":{"from":%d,"to":%d,)"
                R"("scheduler_cpu_per_s":%.2f,"heartbeat_p99_ms":%.2f,)"
                R"("view_change_p99_ms":%.2f,"view_bytes":%.2f,)"
                R"("bytes_per_view_change":%.2f,"startup_s":%.2f,)"
                R"("barrier_release_p99_ms":%.2f,"journal_ms_per_write":%.2f,)"
                R"("journal_bytes":%.2f,"checkpoint_ms":%.2f,)"
                R"("claims_release_p99_ms":%.2f}})"
                "\n",
                a.nodes, b.nodes, k(&Figures::cpu_per_s),
                k(&Figures::hb_p99_ms), k(&Figures::view_p99_ms),
                k(&Figures::view_bytes), k(&Figures::bytes_per_change),
                k(&Figures::startup_s), k(&Figures::barrier_p99_ms),
                k(&Figures::journal_ms_per_write), k(&Figures::journal_bytes),
                k(&Figures::checkpoint_ms), k(&Figures::claims_release_p99_ms));
  }
  std::fprintf(stderr, "%s on a %d-core machine, load %s\n", "fleet bench done",
               ps::bench::Cores(), ps::bench::LoadAverage().c_str());
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_child)) return ps::ChildMain();
  return ps::ParentMain(argv[0]);
}
