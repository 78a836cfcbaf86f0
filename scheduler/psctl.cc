// psctl: operator's command line for a running job's scheduler.
//
//   psctl --scheduler=HOST:PORT status
//       The job state, epoch and consistency mode, the scheduler's own
//       faults (a suspected isolation, with how long and until when nodes
//       are held; the stalls it noticed), every node the scheduler knows
//       (live or not), and each live worker's last clock and how long the
//       scheduler has not heard from it; the job's progress (steps done of
//       the total, pace, time left, newest evaluation) and each data
//       shard's.
//   psctl --scheduler=HOST:PORT watch [--interval_s=S] [--give_up_s=S]
//       The job's progress line every S seconds (default 2) until the job
//       ends: on a terminal one line rewritten in place, otherwise one
//       timestamped line each time (a log gains a line per interval).
//       Waits out a restarting scheduler for up to --give_up_s (default
//       60). Exit 0 once the job FINISHED (or its scheduler exited after
//       every shard was trained), 1 when it FAILED or the scheduler stayed
//       away.
//   psctl --scheduler=HOST:PORT set-mode BSP|ASYNC|SSP [--staleness=N]
//       Changes the consistency mode of the running job (SetConsistency);
//       prints the epoch of the view that carries it. The scheduler
//       validates the mode (e.g. staleness is for SSP only).
//   psctl --scheduler=HOST:PORT checkpoint [--wait]
//       Starts a consistent checkpoint a few steps ahead of the fastest
//       worker and prints its clock; with --wait, waits (up to --timeout_ms)
//       until it is committed (MANIFEST written).
//   psctl --scheduler=HOST:PORT drain NODE [--wait]
//       Asks the scheduler to drain a node, named by its node id (as in
//       status) or as server:RANK / worker:RANK: it leaves gracefully as on
//       SIGTERM once its next heartbeat tells it (a worker after its current
//       step, its shard resumed by another worker; a server after handing
//       its slots to their backups or checkpointing them). Prints what
//       follows; with --wait, waits (up to --timeout_ms) until it has left.
//       Refused (exit 1) for the scheduler, the only live worker, or a
//       server whose parameters would be lost. With --migrate (elastic
//       jobs), a server's slots are first moved live to the others (as
//       scale does), then it leaves and exits 0.
//   psctl --scheduler=HOST:PORT scale --servers=K [--remove=R,...]
//         [--dry_run] [--wait]
//       Elastic jobs (cluster.elastic): moves slots live so that K servers
//       own them, balanced by bytes; more servers than own slots now
//       means spares take slots (start them first: a server_main that
//       registers while the job runs joins as a spare), fewer means the
//       servers in --remove (or those holding the least) are emptied, then
//       drained (exit 0). Prints the moves; with --wait, waits (up to
//       --timeout_ms) until every move is done and emptied servers left.
//
// A job with control-plane TLS (security.tls in its config) needs psctl to
// present the job's certificate: --config=JOB.pbtxt takes the files from
// the job config, or --tls_ca, --tls_cert and --tls_key name them.
//
// Every RPC has a deadline (--timeout_ms). Exit status: 0 on success, 1 when
// the scheduler cannot be reached or refuses the request (its message is
// printed), 2 for a usage error (unknown command or flag, bad mode name).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/grpc_security.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/psctl_status.h"

ABSL_FLAG(std::string, scheduler, "", "Scheduler host:port. Required.");
ABSL_FLAG(int64_t, timeout_ms, 5000, "Deadline of each RPC, in ms (> 0).");
ABSL_FLAG(int64_t, staleness, 0,
          "set-mode SSP: how many steps a worker may run ahead of the "
          "slowest one.");
ABSL_FLAG(std::string, config, "",
          "Job config file; its security.tls files are used to reach a "
          "scheduler that requires TLS.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle of the job (instead of --config's ca_cert_file).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate to present (instead of --config's cert_file).");
ABSL_FLAG(std::string, tls_key, "",
          "PEM private key of --tls_cert (instead of --config's key_file).");
ABSL_FLAG(bool, wait, false,
          "checkpoint: wait until the checkpoint is committed; drain: wait "
          "until the node has left; scale: wait until the moves are done "
          "(all up to --timeout_ms).");
ABSL_FLAG(int64_t, servers, 0, "scale: how many servers should own slots.");
ABSL_FLAG(std::vector<std::string>, remove, {},
          "scale: server ranks to empty and drain (comma-separated).");
ABSL_FLAG(double, interval_s, 2,
          "watch: seconds between two looks at the job (a non-terminal "
          "output gains one line each time).");
ABSL_FLAG(double, give_up_s, 60,
          "watch: how long a scheduler that cannot be reached (restarting) "
          "is waited for.");
ABSL_FLAG(bool, dry_run, false, "scale: print the moves, start none.");
ABSL_FLAG(bool, migrate, false,
          "drain server:R: move its slots live to the other servers first "
          "(elastic jobs).");

namespace ps {
namespace {

constexpr char kUsage[] =
    "usage: psctl --scheduler=HOST:PORT [--timeout_ms=MS]\n"
    "             [--config=JOB.pbtxt | --tls_ca=F --tls_cert=F --tls_key=F] "
    "COMMAND\n"
    "commands:\n"
    "  status                               job state, progress, faults, "
    "mode,\n"
    "                                       nodes, clocks\n"
    "  watch [--interval_s=S] [--give_up_s=S]\n"
    "                                       the job's progress and time left "
    "until\n"
    "                                       it ends (one line in place on a "
    "terminal,\n"
    "                                       a line every interval otherwise)\n"
    "  set-mode BSP|ASYNC|SSP [--staleness=N]\n"
    "                                       change the consistency mode\n"
    "  checkpoint [--wait]                  take a consistent checkpoint now\n"
    "  drain NODE [--wait] [--migrate]      make a node leave as on SIGTERM;\n"
    "                                       NODE: node id, server:R, worker:R\n"
    "  scale --servers=K [--remove=R,..] [--dry_run] [--wait]\n"
    "                                       move slots live onto K servers\n";

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

// Rejects unknown flags and bad flag values before absl parses the command
// line: absl would exit with status 1 for them, which here means "the
// scheduler failed". Checking a value sets the flag, as parsing does next.
absl::Status CheckFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    absl::ConsumePrefix(&arg, "-");
    absl::ConsumePrefix(&arg, "-");
    const size_t eq = arg.find('=');
    const absl::string_view name = arg.substr(0, eq);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      // "--nofoo" sets boolean flag "foo" to false.
      const absl::CommandLineFlag* negated =
          absl::StartsWith(name, "no")
              ? absl::FindCommandLineFlag(name.substr(2))
              : nullptr;
      if (negated != nullptr && negated->IsOfType<bool>() &&
          eq == absl::string_view::npos) {
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    absl::string_view value;
    if (eq != absl::string_view::npos) {
      value = arg.substr(eq + 1);
    } else if (flag->IsOfType<bool>()) {
      continue;
    } else if (i + 1 < argc) {
      value = argv[++i];  // "--flag value"
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", name, " needs a value"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", error));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ConsistencyMode> ParseMode(absl::string_view name) {
  ConsistencyMode mode;
  if (!ConsistencyMode_Parse(absl::AsciiStrToUpper(name), &mode) ||
      mode == CONSISTENCY_MODE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown mode '", name, "': use BSP, ASYNC or SSP"));
  }
  return mode;
}

// "7" (node id), "server:1", "worker:0" or "scheduler".
absl::StatusOr<DrainRequest> ParseDrainTarget(absl::string_view text) {
  DrainRequest request;
  uint64_t id = 0;
  if (text == "scheduler") {
    request.set_scheduler(true);
    return request;
  }
  if (absl::SimpleAtoi(text, &id)) {
    if (id == 0) return absl::InvalidArgumentError("node ids start at 1");
    request.set_node_id(id);
    return request;
  }
  const size_t colon = text.find(':');
  uint32_t rank = 0;
  if (colon != absl::string_view::npos &&
      absl::SimpleAtoi(text.substr(colon + 1), &rank)) {
    const absl::string_view role = text.substr(0, colon);
    if (role == "server" || role == "worker") {
      request.mutable_rank()->set_role(role == "server" ? SERVER : WORKER);
      request.mutable_rank()->set_rank(rank);
      return request;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "bad node '", text, "': give a node id, server:RANK or worker:RANK"));
}

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

absl::Status RunStatus(Scheduler::Stub& stub, absl::Duration timeout) {
  GetStatusResponse response;
  std::unique_ptr<grpc::ClientContext> context = Context(timeout);
  const grpc::Status s =
      stub.GetStatus(context.get(), GetStatusRequest(), &response);
  if (!s.ok()) return Annotate(FromGrpcStatus(s), "GetStatus");
  // scheduler/scheduler.h, kJournalErrorKey (not linked: this tool has no
  // gRPC server in it).
  std::string journal_error;
  const auto& trailers = context->GetServerTrailingMetadata();
  if (auto it = trailers.find("ps-journal-error-bin"); it != trailers.end()) {
    journal_error.assign(it->second.data(), it->second.size());
  }
  std::cout << FormatStatus(response, journal_error, absl::Now());
  return absl::OkStatus();
}

// Prints the job's progress line every `interval` until the job ends: on
// a terminal one line rewritten in place, otherwise a plain line each
// time, stamped with the time (a log gains one line per interval). A
// scheduler that cannot be reached (restarting) is waited for up to
// `give_up`. OK once the job FINISHED (or the scheduler exited after every
// shard was trained); FAILED_PRECONDITION with the failure when it FAILED.
absl::Status RunWatch(Scheduler::Stub& stub, absl::Duration timeout,
                      absl::Duration interval, absl::Duration give_up,
                      bool tty) {
  absl::Time unreachable_since = absl::InfiniteFuture();
  // Every shard was trained at the last look: the scheduler exits once
  // the job's servers have, maybe before a look sees FINISHED.
  bool trained = false;
  while (true) {
    GetStatusResponse response;
    const grpc::Status s =
        stub.GetStatus(Context(timeout).get(), GetStatusRequest(), &response);
    const absl::Time now = absl::Now();
    std::string line;
    if (!s.ok()) {
      if (trained) {
        std::cout << (tty ? "\n" : "")
                  << "every shard was trained and the scheduler has exited: "
                     "the job is over"
                  << std::endl;
        return absl::OkStatus();
      }
      if (unreachable_since == absl::InfiniteFuture()) unreachable_since = now;
      if (now - unreachable_since >= give_up) {
        if (tty) std::cout << "\n";
        return Annotate(FromGrpcStatus(s), "GetStatus");
      }
      line = absl::StrCat(
          "scheduler unreachable for ",
          HumanDuration(absl::ToDoubleSeconds(now - unreachable_since)),
          ", retrying: ", s.error_message());
    } else {
      unreachable_since = absl::InfiniteFuture();
      trained = response.progress().progress() >= 1;
      line = FormatProgressLine(response, tty ? 20 : 0);
    }
    if (tty) {
      // Back to the start of the line, and clear what a longer line left.
      std::cout << "\r" << line << "\x1b[K" << std::flush;
    } else {
      std::cout << absl::FormatTime("%Y-%m-%d %H:%M:%S ", now,
                                    absl::LocalTimeZone())
                << line << std::endl;
    }
    const JobState state = response.view().job_state();
    if (s.ok() && (state == FINISHED || state == FAILED)) {
      if (tty) std::cout << "\n";
      if (state == FAILED) {
        return absl::FailedPreconditionError(
            absl::StrCat("the job FAILED: ", response.view().failure()));
      }
      return absl::OkStatus();
    }
    absl::SleepFor(interval);
  }
}

absl::Status RunSetMode(Scheduler::Stub& stub, absl::Duration timeout,
                        ConsistencyMode mode, uint32_t staleness) {
  SetConsistencyRequest request;
  request.mutable_consistency()->set_mode(mode);
  request.mutable_consistency()->set_staleness(staleness);
  SetConsistencyResponse response;
  const grpc::Status s =
      stub.SetConsistency(Context(timeout).get(), request, &response);
  if (!s.ok()) return Annotate(FromGrpcStatus(s), "SetConsistency");
  std::cout << "consistency set to " << ModeText(request.consistency())
            << " in epoch " << response.epoch() << "\n";
  return absl::OkStatus();
}

absl::Status RunCheckpoint(Scheduler::Stub& stub, absl::Duration timeout,
                           bool wait) {
  CheckpointResponse response;
  const grpc::Status s =
      stub.Checkpoint(Context(timeout).get(), CheckpointRequest(), &response);
  if (!s.ok()) return Annotate(FromGrpcStatus(s), "Checkpoint");
  std::cout << "checkpoint started at clock " << response.clock() << "\n";
  if (!wait) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    GetStatusResponse status;
    const grpc::Status g =
        stub.GetStatus(Context(timeout).get(), GetStatusRequest(), &status);
    if (!g.ok()) return Annotate(FromGrpcStatus(g), "GetStatus");
    if (status.view().last_checkpoint_clock() >= response.clock()) {
      std::cout << "checkpoint at clock "
                << status.view().last_checkpoint_clock() << " committed\n";
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("checkpoint at clock ", response.clock(),
                   " not committed in time (it is "
                   "retried at a later clock if a node was too late; see the "
                   "scheduler log)"));
}

absl::Status RunDrain(Scheduler::Stub& stub, absl::Duration timeout,
                      const DrainRequest& request, bool wait) {
  DrainResponse response;
  const grpc::Status s = stub.Drain(Context(timeout).get(), request, &response);
  if (!s.ok()) return Annotate(FromGrpcStatus(s), "Drain");
  const NodeInfo& node = response.node();
  std::cout << "draining " << RoleName(node.role()) << " rank " << node.rank()
            << " (node " << node.node_id() << "): " << response.note() << "\n";
  if (!wait) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    GetStatusResponse status;
    const grpc::Status g =
        stub.GetStatus(Context(timeout).get(), GetStatusRequest(), &status);
    if (!g.ok()) return Annotate(FromGrpcStatus(g), "GetStatus");
    for (const NodeInfo& n : status.view().nodes()) {
      if (n.node_id() == node.node_id() && n.state() != ALIVE) {
        std::cout << "node " << n.node_id() << " " << NodeState_Name(n.state())
                  << "\n";
        return absl::OkStatus();
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("node ", node.node_id(),
                   " has not left yet (a worker leaves after its "
                   "current step, a server after its checkpoint)"));
}

// Waits until no slot move is left (in progress or queued) and the
// servers in `leaving` are gone; then checks that every move of `planned`
// happened (its target owns its slots). FAILED_PRECONDITION naming the
// moves that were dropped (after their tries ran out, or because one of
// their servers left): those slots stayed with their source.
absl::Status WaitForMoves(Scheduler::Stub& stub, absl::Duration timeout,
                          const std::vector<uint32_t>& leaving,
                          const std::vector<SlotMove>& planned) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    GetStatusResponse status;
    const grpc::Status g =
        stub.GetStatus(Context(timeout).get(), GetStatusRequest(), &status);
    if (!g.ok()) return Annotate(FromGrpcStatus(g), "GetStatus");
    bool done =
        status.view().moves_size() == 0 && status.queued_moves_size() == 0;
    // A server being emptied leaves once it owns no slot (it is drained);
    // one that still owns slots with no move left stays (its scale-in
    // stopped), which the check below reports.
    const auto& owners = status.view().slot_owner();
    for (const NodeInfo& n : status.view().nodes()) {
      if (n.role() == SERVER && n.state() == ALIVE &&
          std::find(leaving.begin(), leaving.end(), n.rank()) !=
              leaving.end() &&
          (n.draining() ||
           std::find(owners.begin(), owners.end(), n.rank()) == owners.end())) {
        done = false;
      }
    }
    if (!done) {
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    std::vector<std::string> dropped;
    for (const SlotMove& m : planned) {
      bool moved = true;
      for (uint32_t s : m.slots()) {
        moved &= static_cast<int>(s) < status.view().slot_owner_size() &&
                 status.view().slot_owner(s) == m.target();
      }
      if (!moved) {
        dropped.push_back(absl::StrCat("server ", m.source(), " -> server ",
                                       m.target(), " (", m.slots_size(),
                                       " slots)"));
      }
    }
    if (!dropped.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          dropped.size(), " of ", planned.size(),
          " moves were dropped and their slots stayed with their source: ",
          absl::StrJoin(dropped, ", "),
          " (the scheduler log says why; psctl scale may be asked again)"));
    }
    std::cout << "moves done (epoch " << status.view().epoch() << ")\n";
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError(
      "the moves are not done yet (psctl status shows them)");
}

absl::Status RunScale(Scheduler::Stub& stub, absl::Duration timeout,
                      const ScaleRequest& request, bool wait) {
  ScaleResponse response;
  const grpc::Status s = stub.Scale(Context(timeout).get(), request, &response);
  if (!s.ok()) return Annotate(FromGrpcStatus(s), "Scale");
  std::cout << (request.dry_run() ? "would scale to " : "scaling to ")
            << request.servers() << " servers: " << response.note() << "\n";
  for (const SlotMove& m : response.moves()) {
    std::cout << "  server " << m.source() << " -> server " << m.target()
              << "  " << m.slots_size() << " slots\n";
  }
  if (!wait || request.dry_run() || response.moves_size() == 0) {
    return absl::OkStatus();
  }
  return WaitForMoves(stub, timeout,
                      {response.emptied().begin(), response.emptied().end()},
                      {response.moves().begin(), response.moves().end()});
}

// `drain server:R --migrate`: a scale-in by one that empties R.
absl::Status RunMigrate(Scheduler::Stub& stub, absl::Duration timeout,
                        const DrainRequest& drain, bool wait) {
  if (!drain.has_rank() || drain.rank().role() != SERVER) {
    return absl::InvalidArgumentError("--migrate drains a server: server:R");
  }
  GetStatusResponse status;
  const grpc::Status g =
      stub.GetStatus(Context(timeout).get(), GetStatusRequest(), &status);
  if (!g.ok()) return Annotate(FromGrpcStatus(g), "GetStatus");
  std::map<uint32_t, int> owners;
  for (uint32_t owner : status.view().slot_owner()) owners[owner] = 1;
  if (owners.count(drain.rank().rank()) == 0) {
    // Nothing to move: an ordinary drain.
    return RunDrain(stub, timeout, drain, wait);
  }
  ScaleRequest request;
  request.set_servers(static_cast<uint32_t>(owners.size() - 1));
  request.add_remove(drain.rank().rank());
  return RunScale(stub, timeout, request, wait);
}

int UsageError(absl::string_view message) {
  std::cerr << "psctl: " << message << "\n" << kUsage;
  return kExitUsage;
}

// The TLS files to present: from the --tls_* flags (all three), else from
// the job config file, else none (plaintext). INVALID_ARGUMENT for a mix
// or an unreadable or invalid config.
absl::StatusOr<TlsConfig> TlsFromFlags(const std::string& config_path,
                                       const std::string& ca,
                                       const std::string& cert,
                                       const std::string& key) {
  TlsConfig tls;
  if (!ca.empty() || !cert.empty() || !key.empty()) {
    if (!config_path.empty()) {
      return absl::InvalidArgumentError("--config and --tls_* are exclusive");
    }
    if (ca.empty() || cert.empty() || key.empty()) {
      return absl::InvalidArgumentError(
          "--tls_ca, --tls_cert and --tls_key go together");
    }
    tls.set_ca_cert_file(ca);
    tls.set_cert_file(cert);
    tls.set_key_file(key);
    return tls;
  }
  if (config_path.empty()) return tls;
  PS_ASSIGN_OR_RETURN(JobConfig config, LoadJobConfig(config_path));
  return config.security().tls();
}

// A command line's command, parsed whole before the scheduler is
// contacted.
struct Command {
  std::string name;
  ConsistencyMode mode = CONSISTENCY_MODE_UNSPECIFIED;  // set-mode
  DrainRequest drain;                                   // drain
  ScaleRequest scale;                                   // scale
};

// INVALID_ARGUMENT (a usage error) naming what is wrong.
absl::StatusOr<Command> ParseCommand(const std::vector<char*>& args,
                                     int64_t staleness) {
  Command command;
  command.name = args[1];
  if (command.name == "status") {
    if (args.size() != 2)
      return absl::InvalidArgumentError("status takes no arguments");
  } else if (command.name == "watch") {
    if (args.size() != 2)
      return absl::InvalidArgumentError("watch takes flags only");
    if (!(absl::GetFlag(FLAGS_interval_s) >= 0.05)) {
      return absl::InvalidArgumentError("--interval_s must be at least 0.05");
    }
    if (!(absl::GetFlag(FLAGS_give_up_s) > 0)) {
      return absl::InvalidArgumentError("--give_up_s must be > 0");
    }
  } else if (command.name == "set-mode") {
    if (args.size() != 3)
      return absl::InvalidArgumentError("set-mode takes one mode");
    absl::StatusOr<ConsistencyMode> parsed = ParseMode(args[2]);
    if (!parsed.ok())
      return absl::InvalidArgumentError(parsed.status().message());
    command.mode = *parsed;
    if (staleness < 0 || staleness > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError("--staleness must be in 0..4294967295");
    }
  } else if (command.name == "checkpoint") {
    if (args.size() != 2)
      return absl::InvalidArgumentError("checkpoint takes no arguments");
  } else if (command.name == "drain") {
    if (args.size() != 3)
      return absl::InvalidArgumentError("drain takes one node");
    absl::StatusOr<DrainRequest> parsed = ParseDrainTarget(args[2]);
    if (!parsed.ok())
      return absl::InvalidArgumentError(parsed.status().message());
    command.drain = *std::move(parsed);
  } else if (command.name == "scale") {
    if (args.size() != 2)
      return absl::InvalidArgumentError("scale takes flags only");
    const int64_t servers = absl::GetFlag(FLAGS_servers);
    if (servers < 1 || servers > 1024) {
      return absl::InvalidArgumentError("scale needs --servers in 1..1024");
    }
    command.scale.set_servers(static_cast<uint32_t>(servers));
    for (const std::string& r : absl::GetFlag(FLAGS_remove)) {
      uint32_t rank = 0;
      if (!absl::SimpleAtoi(r, &rank)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--remove: '", r, "' is no rank"));
      }
      command.scale.add_remove(rank);
    }
    command.scale.set_dry_run(absl::GetFlag(FLAGS_dry_run));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown command '", command.name, "'"));
  }
  return command;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  if (absl::Status s = ps::CheckFlags(argc, argv); !s.ok()) {
    return ps::UsageError(s.message());
  }
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const std::string address = absl::GetFlag(FLAGS_scheduler);
  const int64_t timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  const int64_t staleness = absl::GetFlag(FLAGS_staleness);
  if (address.empty()) return ps::UsageError("--scheduler is required");
  if (timeout_ms <= 0) return ps::UsageError("--timeout_ms must be > 0");
  if (args.size() < 2) return ps::UsageError("no command given");
  absl::StatusOr<ps::Command> parsed_command =
      ps::ParseCommand(args, staleness);
  if (!parsed_command.ok())
    return ps::UsageError(parsed_command.status().message());
  const std::string& command = parsed_command->name;
  const ps::ConsistencyMode mode = parsed_command->mode;
  const ps::DrainRequest& drain = parsed_command->drain;
  const ps::ScaleRequest& scale = parsed_command->scale;

  absl::StatusOr<ps::TlsConfig> tls = ps::TlsFromFlags(
      absl::GetFlag(FLAGS_config), absl::GetFlag(FLAGS_tls_ca),
      absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key));
  if (!tls.ok()) return ps::UsageError(tls.status().message());
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      ps::MakeChannelCredentials(*tls);
  if (!creds.ok()) {
    std::cerr << "psctl: " << creds.status().message() << "\n";
    return ps::kExitFailed;
  }
  auto stub = ps::Scheduler::NewStub(grpc::CreateChannel(address, *creds));
  const absl::Duration timeout = absl::Milliseconds(timeout_ms);
  const absl::Status status =
      command == "status" ? ps::RunStatus(*stub, timeout)
      : command == "watch"
          ? ps::RunWatch(*stub, timeout,
                         absl::Seconds(absl::GetFlag(FLAGS_interval_s)),
                         absl::Seconds(absl::GetFlag(FLAGS_give_up_s)),
                         isatty(STDOUT_FILENO) == 1)
      : command == "checkpoint"
          ? ps::RunCheckpoint(*stub, timeout, absl::GetFlag(FLAGS_wait))
      : command == "drain" && absl::GetFlag(FLAGS_migrate)
          ? ps::RunMigrate(*stub, timeout, drain, absl::GetFlag(FLAGS_wait))
      : command == "drain"
          ? ps::RunDrain(*stub, timeout, drain, absl::GetFlag(FLAGS_wait))
      : command == "scale"
          ? ps::RunScale(*stub, timeout, scale, absl::GetFlag(FLAGS_wait))
          : ps::RunSetMode(*stub, timeout, mode,
                           static_cast<uint32_t>(staleness));
  if (!status.ok()) {
    std::cerr << "psctl: scheduler " << address << ": " << status.ToString()
              << "\n";
    if (status.code() == absl::StatusCode::kUnavailable ||
        status.code() == absl::StatusCode::kDeadlineExceeded ||
        status.code() == absl::StatusCode::kUnauthenticated) {
      std::cerr << (ps::TlsEnabled(*tls)
                        ? "psctl: if the scheduler is up, check that its TLS "
                          "certificate and psctl's come from the same job CA\n"
                        : "psctl: if the scheduler is up and its job uses TLS, "
                          "pass --config=JOB.pbtxt or "
                          "--tls_ca/--tls_cert/--tls_key\n");
    }
    return ps::kExitFailed;
  }
  return ps::kExitOk;
}
