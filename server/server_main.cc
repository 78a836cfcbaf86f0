// A server process: binds its data-plane socket, registers with the
// scheduler, serves its slots, and exits 0 when the job finishes or on
// SIGINT/SIGTERM (after leaving the job); the scheduler draining it (psctl
// drain) takes the SIGTERM path.
//
// Fencing: each acknowledged heartbeat grants the server a lease (send time
// + 3/4 cluster.heartbeat_timeout_ms, server/server.h); while the scheduler
// is away it serves until the lease lapses and then refuses requests until
// a heartbeat is acknowledged again. Exit codes besides 0, 1 (error) and 2
// (bad flags or config):
//   3  the scheduler dropped this server (declared it dead after a pause or
//      a partition): it is fenced at once (refuses every request; its slots
//      belong to a backup or a replacement now) and exits.
//   4  the scheduler stayed unreachable for
//      cluster.scheduler_unreachable_timeout_ms; the last error line names
//      its address and how long. No checkpoint is attempted: the newest
//      committed one stays as it is.
//   5  the job cannot continue (the scheduler made it FAILED, e.g. slots
//      lost every copy with no checkpoint to restore): the server stops
//      serving and exits, its last error line giving the scheduler's
//      reason; also when it is refused registration for that.
//   6  a table's disk tier failed (an I/O error or a corrupted file): the
//      server fenced itself, refused the request that met the error and
//      every later one, and exits without leaving or checkpointing; the
//      last error line names the table and the error. The job recovers it
//      as a crashed server (its tier directory is never read again).
// The wiring itself is server/server_node.h; this file reads the flags.
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/config.h"
#include "common/curve_keys.h"
#include "common/logging.h"
#include "common/node_main.h"
#include "common/reasons.h"
#include "common/signals.h"
#include "server/server_log.h"
#include "server/server_node.h"

ABSL_FLAG(std::string, config, "", "Job config file (textproto). Required.");
ABSL_FLAG(std::string, scheduler, "", "Scheduler host:port. Required.");
ABSL_FLAG(std::string, bind, "tcp://127.0.0.1:*",
          "ZeroMQ endpoint for the data plane; port * picks a free one.");
ABSL_FLAG(std::string, advertise_host, "",
          "Host name workers should use to reach this server, when it differs "
          "from the bound address (e.g. binding 0.0.0.0).");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error");
ABSL_FLAG(std::string, http_host, "127.0.0.1",
          "Address of the HTTP endpoint (/metrics, /healthz, /readyz).");
ABSL_FLAG(
    int, http_port, 0,
    "Port of the HTTP endpoint; 0 picks a free one (logged), -1 turns it off.");
ABSL_FLAG(
    int64_t, num_servers, 0,
    "Overrides cluster.num_servers of --config (0 keeps it); launchers "
    "set it from the environment. Every process of a job needs the same.");
ABSL_FLAG(
    int64_t, num_workers, 0,
    "Overrides cluster.num_workers of --config (0 keeps it); launchers "
    "set it from the environment. Every process of a job needs the same.");

int main(int argc, char **argv) {
  ps::TerminationSignals signals;
  absl::ParseCommandLine(argc, argv);
  const auto& log = ps::ServerLog();
  std::optional<ps::JobConfig> config = ps::StartNode(
      *log, absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_config),
      {{"scheduler", absl::GetFlag(FLAGS_scheduler)}},
      ps::ClusterSizeOverride{absl::GetFlag(FLAGS_num_servers),
                              absl::GetFlag(FLAGS_num_workers)});
  if (!config)
    return 2;
  absl::StatusOr<std::optional<ps::CurveKeys>> curve =
      ps::LoadCurveKeys(config->security().curve());
  if (!curve.ok()) {
    log->error("{}", curve.status().message());
    return 2;
  }
  ps::ServerNode::Options options;
  options.config = *std::move(config);
  options.scheduler = absl::GetFlag(FLAGS_scheduler);
  options.bind_endpoint = absl::GetFlag(FLAGS_bind);
  options.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  options.curve = *std::move(curve);
  options.http_host = absl::GetFlag(FLAGS_http_host);
  options.http_port = absl::GetFlag(FLAGS_http_port);
  // Drained (psctl drain): leave exactly as on SIGTERM.
  options.on_drain = [&signals] { signals.RequestTermination(); };
  auto node = ps::ServerNode::Start(std::move(options));
  if (!node.ok()) {
    log->error("{}", node.status().message());
    return ps::IsJobFailed(node.status())
               ? static_cast<int>(ps::ServerNode::Exit::kJobFailed)
               : 1;
  }
  return static_cast<int>((*node)->Run(
      [&signals](absl::Duration d) { return signals.WaitFor(d); }));
}
