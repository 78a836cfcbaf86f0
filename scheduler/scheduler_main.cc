// The scheduler process. Exits 0 once the job has finished and every server
// has left, or on SIGINT/SIGTERM; 5 once the job has failed (it cannot
// continue: ClusterState::CheckCanContinue) and its nodes have had a
// heartbeat timeout to learn it.
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/http_endpoint.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/node_main.h"
#include "common/signals.h"
#include "scheduler/monitoring.h"
#include "scheduler/scheduler.h"
#include "scheduler/status_json.h"
#include "scheduler/web_assets.h"

ABSL_FLAG(std::string, config, "", "Job config file (textproto). Required.");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on.");
ABSL_FLAG(int, port, 0, "Port to listen on; 0 picks a free one.");
ABSL_FLAG(std::string, port_file, "",
          "If set, the bound port is written here once listening.");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error");
ABSL_FLAG(
    int64_t, num_servers, 0,
    "Overrides cluster.num_servers of --config (0 keeps it); launchers "
    "set it from the environment. Every process of a job needs the same.");
ABSL_FLAG(
    int64_t, num_workers, 0,
    "Overrides cluster.num_workers of --config (0 keeps it); launchers "
    "set it from the environment. Every process of a job needs the same.");
ABSL_FLAG(
    std::string, http_host, "127.0.0.1",
    "Address of the HTTP endpoint (/metrics, /healthz, /readyz, /status).");
ABSL_FLAG(
    int, http_port, 0,
    "Port of the HTTP endpoint; 0 picks a free one (logged), -1 turns it off.");
ABSL_FLAG(
    std::string, launch_id, "",
    "Which launch of the job this is: launchers pass a new one per launch "
    "and the same one to a scheduler restarted in place. A journal of "
    "another launch is never resumed.");
ABSL_FLAG(std::string, state_dir, "",
          "Where to keep the journal when the config names no "
          "cluster.scheduler_state_dir or checkpoint.dir (default "
          "$XDG_STATE_HOME/ps/<job name>, else ~/.local/state/ps/<job name>); "
          "'none' keeps none.");
ABSL_FLAG(bool, describe, false,
          "Validate --config, print 'servers=N workers=M mode=X "
          "log_interval_s=S' and exit; "
          "launchers use it to size a job without parsing the file.");

namespace {

// Writes `port` to `path` under a temporary name and renames it, so readers
// never see a partial number; whether it worked.
bool WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << port << "\n";
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// The /status page's scripts and style sheets, compiled into the binary
// (scheduler/web_assets.h), as pages of the endpoint.
void AddWebAssetPages(ps::HttpEndpoint::Options* http) {
  for (const ps::WebAsset& asset : ps::WebAssets()) {
    http->pages[std::string(asset.path)] = [asset] {
      return ps::HttpEndpoint::Page{std::string(asset.content_type),
                                    std::string(asset.body)};
    };
  }
}

// --describe: the job's size for the launchers, as shell assignments.
void Describe(const ps::JobConfig& config) {
  std::cout << "servers=" << config.cluster().num_servers()
            << " workers=" << config.cluster().num_workers()
            << " mode=" << ps::ConsistencyMode_Name(config.consistency().mode())
            << " log_interval_s=" << config.training().log_interval_s()
            << std::endl;
  // The launchers' worker command as a shell array (empty: the trainer).
  std::cout << "worker_command=(";
  for (const std::string& arg : config.launch().worker_command()) {
    std::string quoted = "'";
    for (char ch : arg)
      quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    std::cout << quoted << "' ";
  }
  std::cout << ")" << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  ps::TerminationSignals signals;
  absl::ParseCommandLine(argc, argv);
  auto log = ps::GetLogger("scheduler");
  ps::SetLogTag("scheduler");
  std::optional<ps::JobConfig> config = ps::StartNode(
      *log, absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_config), {},
      ps::ClusterSizeOverride{absl::GetFlag(FLAGS_num_servers),
                              absl::GetFlag(FLAGS_num_workers)});
  if (!config) return 2;
  if (absl::GetFlag(FLAGS_describe)) {
    Describe(*config);
    return 0;
  }
  ps::SchedulerServer::Options options;
  options.config = *config;
  options.listen_address =
      absl::StrCat(absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_port));
  options.launch_id = absl::GetFlag(FLAGS_launch_id);
  options.default_state_dir = absl::GetFlag(FLAGS_state_dir);
  if (options.default_state_dir == "none") {
    options.default_state_dir.clear();
  } else if (options.default_state_dir.empty()) {
    auto env = [](const char* name) -> std::string {
      const char* value = std::getenv(name);
      return value != nullptr ? value : "";
    };
    options.default_state_dir = ps::DefaultSchedulerStateDir(
        *config, env("XDG_STATE_HOME"), env("HOME"));
  }
  auto server = ps::SchedulerServer::Start(options);
  if (!server.ok()) {
    log->error("{}", server.status().message());
    return 1;
  }
  log->info("job '{}' listening on {} ({} servers, {} workers)", config->name(),
            (*server)->address(), config->cluster().num_servers(),
            config->cluster().num_workers());
  // Metrics and the status page, read from the cluster state when asked.
  // Declared after the server, so they go before it.
  ps::metrics::Registry registry;
  ps::metrics::AddProcessMetrics(&registry);
  ps::SchedulerMonitor monitor((*server)->state(), *config);
  monitor.RegisterMetrics(&registry);
  ps::HttpEndpoint::Options http;
  http.host = absl::GetFlag(FLAGS_http_host);
  http.port = absl::GetFlag(FLAGS_http_port);
  http.registry = &registry;
  // Not ready while the journal cannot be written (the scheduler then takes
  // no changes).
  http.readiness = [state = (*server)->state()] {
    return state->JournalError();
  };
  http.pages["/status"] = [&monitor] {
    return ps::HttpEndpoint::Page{"text/html; charset=utf-8",
                                  monitor.StatusPage()};
  };
  // What the page draws, for scripts too (scheduler/status_json.h).
  http.pages["/status.json"] = [state = (*server)->state(),
                                name = config->name()] {
    return ps::HttpEndpoint::Page{"application/json",
                                  ps::StatusJson(*state, name)};
  };
  AddWebAssetPages(&http);
  auto endpoint = ps::StartHttpEndpointForMain(*log, std::move(http));
  if (!endpoint.ok()) {
    log->error("{}", endpoint.status().message());
    return 1;
  }
  if (const std::string path = absl::GetFlag(FLAGS_port_file);
      !path.empty() && !WritePortFile(path, (*server)->port())) {
    log->error("cannot write --port_file {}", path);
    return 1;
  }
  while (!signals.requested()) {
    if ((*server)->WaitUntilDone(absl::Milliseconds(200))) {
      const ps::ClusterView view = (*server)->state()->View();
      if (view.job_state() == ps::FAILED) {
        // Exit code 5: the job cannot continue (docs/operations.md).
        log->error("job failed: {}; exiting", view.failure());
        return 5;
      }
      log->info("job finished; exiting");
      return 0;
    }
  }
  log->warn("signal {} received; shutting down", signals.signal());
  // A stopped job is over: a scheduler started later must not resume it
  // (only one that died, e.g. SIGKILL, is restarted in place).
  if (absl::Status s = (*server)->state()->MarkStopped(); !s.ok()) {
    log->warn("could not mark the journal stopped: {}", s.message());
  }
  (*server)->Shutdown();
  return 0;
}
