// A server process: binds its data-plane socket, registers with the
// scheduler, serves its slots, and exits 0 when the job finishes or on
// SIGINT/SIGTERM (after leaving the job).
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/node_main.h"
#include "common/logging.h"
#include "common/signals.h"
#include "scheduler/client.h"
#include "server/server.h"

ABSL_FLAG(std::string, config, "", "Job config file (textproto). Required.");
ABSL_FLAG(std::string, scheduler, "", "Scheduler host:port. Required.");
ABSL_FLAG(std::string, bind, "tcp://127.0.0.1:*",
          "ZeroMQ endpoint for the data plane; port * picks a free one.");
ABSL_FLAG(std::string, advertise_host, "",
          "Host name workers should use to reach this server, when it differs "
          "from the bound address (e.g. binding 0.0.0.0).");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error");

int main(int argc, char** argv) {
  ps::TerminationSignals signals;
  absl::ParseCommandLine(argc, argv);
  auto log = ps::GetLogger("server");
  std::optional<ps::JobConfig> config =
      ps::StartNode(*log, absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_config),
                    {{"scheduler", absl::GetFlag(FLAGS_scheduler)}});
  if (!config) return 2;
  ps::KVServer::Options options;
  options.config = *config;
  options.bind_endpoint = absl::GetFlag(FLAGS_bind);
  auto server = ps::KVServer::Start(options);
  if (!server.ok()) {
    log->error("{}", server.status().message());
    return 1;
  }
  std::string endpoint = (*server)->endpoint();
  if (const std::string host = absl::GetFlag(FLAGS_advertise_host); !host.empty()) {
    endpoint = absl::StrCat("tcp://", host, ":", (*server)->port());
  }

  auto client_options = ps::SchedulerClient::Options::ForJob(
      *config, absl::GetFlag(FLAGS_scheduler), ps::SERVER);
  client_options.data_endpoint = endpoint;
  ps::KVServer* kv = server->get();
  client_options.on_view = [kv](const ps::ClusterView& view, uint32_t rank) {
    kv->UpdateView(view, rank);
  };
  auto client = ps::SchedulerClient::Connect(client_options);
  if (!client.ok()) {
    log->error("{}", client.status().message());
    return 1;
  }
  ps::SetLogTag(absl::StrCat("server/", (*client)->rank()));
  log->info("registered as server {} at {}", (*client)->rank(), endpoint);

  while (!signals.WaitFor(absl::Milliseconds(100))) {
    if ((*client)->job_state() == ps::FINISHED) break;
    if ((*client)->lost()) {
      log->error("lost membership; exiting");
      return 1;
    }
  }
  const ps::KVServer::Stats stats = (*server)->stats();
  log->info("stopping: {} requests ({} rejected), {} keys pushed, {} pulled",
            stats.requests, stats.errors, stats.keys_pushed, stats.keys_pulled);
  (*server)->Stop();
  for (const ps::TableStats& t : (*server)->table_stats()) {
    log->info(
        "table '{}': {} {}, {} bytes{}; keys pushed {}, pulled {}; admitted {}, "
        "filtered pushes {}; evicted {} by TTL, {} for room; refused pushes {}, "
        "dropped keys {}",
        t.name(), t.rows(), t.sparse() ? "rows" : "elements", t.bytes(),
        t.memory_budget_bytes() > 0 ? absl::StrCat(" (budget ", t.memory_budget_bytes(), ")")
                                    : std::string(),
        t.keys_pushed(), t.keys_pulled(), t.admissions(), t.pushes_filtered(),
        t.evictions_ttl(), t.evictions_budget(), t.pushes_refused(), t.keys_dropped());
  }
  if (auto s = (*client)->Leave(/*finished=*/true); !s.ok()) {
    log->warn("{}", s.message());
  }
  return 0;
}
