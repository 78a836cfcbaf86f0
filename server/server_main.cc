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
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/synchronization/mutex.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/curve_keys.h"
#include "common/http_endpoint.h"
#include "common/metrics.h"
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
ABSL_FLAG(std::string, http_host, "127.0.0.1",
          "Address of the HTTP endpoint (/metrics, /healthz, /readyz).");
ABSL_FLAG(int, http_port, 0,
          "Port of the HTTP endpoint; 0 picks a free one (logged), -1 turns it off.");
ABSL_FLAG(int64_t, num_servers, 0,
          "Overrides cluster.num_servers of --config (0 keeps it); launchers "
          "set it from the environment. Every process of a job needs the same.");
ABSL_FLAG(int64_t, num_workers, 0,
          "Overrides cluster.num_workers of --config (0 keeps it); launchers "
          "set it from the environment. Every process of a job needs the same.");

int main(int argc, char** argv) {
  ps::TerminationSignals signals;
  absl::ParseCommandLine(argc, argv);
  auto log = ps::GetLogger("server");
  std::optional<ps::JobConfig> config =
      ps::StartNode(*log, absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_config),
                    {{"scheduler", absl::GetFlag(FLAGS_scheduler)}},
                    ps::ClusterSizeOverride{absl::GetFlag(FLAGS_num_servers),
                                            absl::GetFlag(FLAGS_num_workers)});
  if (!config) return 2;
  // The scheduler client exists only after the server is bound (it
  // advertises the endpoint); checkpoint reports wait for it.
  struct Reporter {
    absl::Mutex mu;
    ps::SchedulerClient* client ABSL_GUARDED_BY(mu) = nullptr;
  };
  auto reporter = std::make_shared<Reporter>();
  // What /healthz and /readyz report, set by the view callback and the
  // loop below.
  struct Health {
    std::atomic<int64_t> rank{-1};
    std::atomic<bool> has_slots{false};
    std::atomic<bool> lost{false};
  };
  auto health = std::make_shared<Health>();
  ps::metrics::Registry registry;  // outlives the server, which reports to it
  ps::metrics::AddProcessMetrics(&registry);
  registry.AddCallback("ps_server_rank", "This server's rank (-1 before it registered).",
                       ps::metrics::Type::kGauge, [health] { return double(health->rank); });
  absl::StatusOr<std::optional<ps::CurveKeys>> curve =
      ps::LoadCurveKeys(config->security().curve());
  if (!curve.ok()) {
    log->error("{}", curve.status().message());
    return 2;
  }
  ps::KVServer::Options options;
  options.config = *config;
  options.curve = *std::move(curve);
  options.metrics = &registry;
  options.bind_endpoint = absl::GetFlag(FLAGS_bind);
  options.on_checkpoint = [reporter, log](const ps::ReportCheckpointRequest& r) {
    absl::MutexLock lock(&reporter->mu);
    if (reporter->client == nullptr) return;
    if (absl::Status s = reporter->client->ReportCheckpoint(r); !s.ok()) {
      log->warn("{}", s.message());
    }
  };
  auto server = ps::KVServer::Start(options);
  if (!server.ok()) {
    log->error("{}", server.status().message());
    return 1;
  }
  ps::HttpEndpoint::Options http;
  http.host = absl::GetFlag(FLAGS_http_host);
  http.port = absl::GetFlag(FLAGS_http_port);
  http.registry = &registry;
  http.health = [health, kv = server->get()]() -> absl::Status {
    if (health->lost) return absl::UnavailableError("lost membership");
    if (kv->stopped()) return absl::UnavailableError("the serving thread has stopped");
    return absl::OkStatus();
  };
  http.readiness = [health]() -> absl::Status {
    if (health->rank < 0) return absl::UnavailableError("not registered with the scheduler yet");
    if (!health->has_slots) {
      return absl::UnavailableError("no cluster view with a slot map yet (job starting)");
    }
    return absl::OkStatus();
  };
  auto http_endpoint = ps::StartHttpEndpointForMain(*log, std::move(http));
  if (!http_endpoint.ok()) {
    log->error("{}", http_endpoint.status().message());
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
  // Drained (psctl drain): leave exactly as on SIGTERM.
  client_options.on_drain = [&signals] { signals.RequestTermination(); };
  // Leases, the drop and the scheduler's being gone arrive on the heartbeat
  // thread; the fence takes effect before the next request is taken up.
  client_options.on_lease = [kv](std::chrono::steady_clock::time_point until) {
    kv->SetLease(until);
  };
  client_options.on_lost = [kv, health] {
    health->lost = true;
    kv->Fence("dropped by the scheduler (declared dead: no heartbeat within "
              "cluster.heartbeat_timeout_ms); this server no longer owns slots");
  };
  client_options.on_scheduler_gone = [kv](const absl::Status& why) {
    kv->Fence(std::string(why.message()));
  };
  client_options.on_view = [kv, health](const ps::ClusterView& view, uint32_t rank) {
    kv->UpdateView(view, rank);
    health->rank = rank;
    health->has_slots = view.slot_owner_size() > 0;
  };
  auto client = ps::SchedulerClient::Connect(client_options);
  if (!client.ok()) {
    log->error("{}", client.status().message());
    return 1;
  }
  ps::SetLogTag(absl::StrCat("server/", (*client)->rank()));
  log->info("registered as server {} at {}", (*client)->rank(), endpoint);
  {
    absl::MutexLock lock(&reporter->mu);
    reporter->client = client->get();
  }
  auto unpublish = absl::MakeCleanup([reporter] {
    absl::MutexLock lock(&reporter->mu);
    reporter->client = nullptr;
  });

  // Dropped or given up on the scheduler: exit at once (already fenced),
  // without leaving (there is nothing to leave) or checkpointing (this
  // server's view may be stale; the newest committed checkpoint stays).
  auto ended = [&]() -> std::optional<int> {
    if ((*client)->lost()) {
      health->lost = true;
      (*server)->Stop();
      log->error("{}; exiting", (*client)->lost_status().message());
      return 3;
    }
    if (absl::Status gone = (*client)->scheduler_gone(); !gone.ok()) {
      health->lost = true;
      (*server)->Stop();
      log->error("{}", gone.message());
      return 4;
    }
    return std::nullopt;
  };
  while (!signals.WaitFor(absl::Milliseconds(100))) {
    if ((*client)->job_state() == ps::FINISHED) break;
    if (std::optional<int> code = ended()) return *code;
  }
  if (std::optional<int> code = ended()) return *code;
  if (signals.requested() && (*client)->job_state() == ps::RUNNING &&
      !config->checkpoint().dir().empty()) {
    // Preempted: checkpoint first, so a replacement restores every update
    // this server acknowledged; stop serving right after the shard is
    // written.
    (*server)->StopAfterNextCheckpoint();
    auto clock = (*client)->RequestCheckpoint();
    if (!clock.ok()) {
      log->warn("preempted, and no checkpoint could be started ({}); updates "
                "since the last checkpoint are lost",
                clock.status().message());
    } else {
      log->info("preempted: checkpointing at clock {} before leaving", *clock);
      const absl::Time give_up = absl::Now() + absl::Seconds(60);
      while (!(*server)->stopped() && absl::Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(20));
      }
      if (!(*server)->stopped()) {
        log->warn("checkpoint at clock {} not written within 60 s", *clock);
      }
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
