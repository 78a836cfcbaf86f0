#include "server/server_node.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ps {

namespace {

// What `kv`'s tiered tables hold, for the scheduler's status page: from
// the statistics the serving thread last published (at most
// KVServer::kStatsPeriod old). Nothing without a disk tier.
void FillStorage(const KVServer& kv, HeartbeatRequest* request) {
  ServerStorage storage;
  bool tiered = false;
  for (const TableStats& t : kv.table_stats()) {
    if (t.tier_memory_bytes() == 0) continue;
    tiered = true;
    storage.set_rows_in_ram(storage.rows_in_ram() + t.rows());
    storage.set_cold_rows(storage.cold_rows() + t.cold_rows());
    storage.set_disk_bytes(storage.disk_bytes() + t.disk_bytes());
    storage.set_tier_memory_bytes(storage.tier_memory_bytes() +
                                  t.tier_memory_bytes());
    storage.set_cold_reads(storage.cold_reads() + t.cold_reads());
  }
  if (!tiered) return;
  const KVServer::Stats stats = kv.stats();
  storage.set_tier_waits(stats.tier_waits);
  storage.set_tier_wait_seconds(stats.tier_wait_micros / 1e6);
  *request->mutable_storage() = storage;
}

// What `kv` serves, for the scheduler's curves: keys pushed and pulled
// since it started and bytes its tables hold, from the statistics the
// serving thread last published.
void FillServing(const KVServer& kv, HeartbeatRequest* request) {
  ServingReport serving;
  for (const TableStats& t : kv.table_stats()) {
    serving.set_keys(serving.keys() + t.keys_pushed() + t.keys_pulled());
    serving.set_bytes(serving.bytes() + t.bytes());
  }
  *request->mutable_serving() = serving;
}

}  // namespace

// Sends the server's checkpoint and slot-move reports to the scheduler
// from its own thread, so the serving thread only queues them. A report is
// kept until the membership exists (the server is bound, and could in
// principle write a shard, before it registered).
class ServerNode::Reporter {
public:
  Reporter(std::shared_ptr<spdlog::logger> log,
           std::function<void(const ReportCheckpointRequest &)> before_report)
      : log_(std::move(log)), before_report_(std::move(before_report)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Reporter() { Stop(); }

  // Serving thread: never blocks beyond the queue's lock.
  void Enqueue(const ReportCheckpointRequest &request) {
    absl::MutexLock lock(&mu_);
    queue_.push_back({request, 0});
  }
  void Enqueue(const ReportMoveRequest &request) {
    absl::MutexLock lock(&mu_);
    queue_.push_back({request, 0});
  }
  void SetMembership(SchedulerClient *membership) {
    absl::MutexLock lock(&mu_);
    membership_ = membership;
  }
  // Waits until every queued report has been sent (answered or failed),
  // at most `timeout`; false when some are still queued or in flight.
  bool Flush(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || (queue_.empty() && !sending_);
    };
    return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout) &&
           queue_.empty() && !sending_;
  }
  // Ends the thread after the report in flight (bounded by the membership's
  // RPC timeout); queued reports are dropped. Idempotent.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    if (thread_.joinable())
      thread_.join();
  }

private:
  // A move report that found the scheduler unreachable (after the
  // membership's own retries) is sent again this many times more: the
  // scheduler waits for it to go on with the move.
  static constexpr int kMoveAttempts = 4;
  struct Queued {
    std::variant<ReportCheckpointRequest, ReportMoveRequest> report;
    int attempts = 0;
  };

  void Loop() {
    while (true) {
      Queued queued;
      SchedulerClient *membership;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || (membership_ != nullptr && !queue_.empty());
        };
        mu_.Await(absl::Condition(&ready));
        if (stopping_)
          return;
        queued = std::move(queue_.front());
        queue_.pop_front();
        membership = membership_;
        sending_ = true;
      }
      bool again = false;
      if (const auto *checkpoint =
              std::get_if<ReportCheckpointRequest>(&queued.report)) {
        if (before_report_)
          before_report_(*checkpoint);
        if (absl::Status s = membership->ReportCheckpoint(*checkpoint);
            !s.ok()) {
          log_->warn("{}", s.message());
        }
      } else {
        again = SendMove(*membership,
                         std::get<ReportMoveRequest>(queued.report),
                         ++queued.attempts);
      }
      absl::MutexLock lock(&mu_);
      if (again)
        queue_.push_back(std::move(queued));
      sending_ = false;
    }
  }

  // Sends a move report; true when it should be sent again.
  bool SendMove(SchedulerClient &membership, const ReportMoveRequest &report,
                int attempts) {
    const absl::Status s = membership.ReportMove(report);
    if (s.ok())
      return false;
    if (s.code() == absl::StatusCode::kFailedPrecondition) {
      // The scheduler no longer runs that move (stale): nothing to do.
      log_->info("{} (stale; dropped)", s.message());
      return false;
    }
    const bool transient = s.code() == absl::StatusCode::kUnavailable ||
                           s.code() == absl::StatusCode::kDeadlineExceeded;
    log_->warn("{}{}", s.message(),
               transient && attempts < kMoveAttempts ? "; sending it again"
                                                     : "");
    return transient && attempts < kMoveAttempts;
  }

  const std::shared_ptr<spdlog::logger> log_;
  const std::function<void(const ReportCheckpointRequest &)> before_report_;
  absl::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  SchedulerClient *membership_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool sending_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

ServerNode::ServerNode(Options options)
    : options_(std::move(options)), log_(GetLogger("server")) {}

absl::StatusOr<std::unique_ptr<ServerNode>> ServerNode::Start(Options options) {
  std::unique_ptr<ServerNode> node(new ServerNode(std::move(options)));
  if (absl::Status s = node->Open(); !s.ok())
    return s;
  return node;
}

absl::Status ServerNode::StartHttp(KVServer* kv) {
  HttpEndpoint::Options http;
  http.host = options_.http_host;
  http.port = options_.http_port;
  http.registry = &registry_;
  http.health = [health = health_, kv]() -> absl::Status {
    if (health->lost) return absl::UnavailableError("lost membership");
    if (kv->stopped())
      return absl::UnavailableError("the serving thread has stopped");
    return absl::OkStatus();
  };
  http.readiness = [health = health_]() -> absl::Status {
    if (health->rank < 0)
      return absl::UnavailableError("not registered with the scheduler yet");
    if (!health->has_slots) {
      return absl::UnavailableError(
          "no cluster view with a slot map yet (job starting)");
    }
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> endpoint =
      StartHttpEndpointForMain(*log_, std::move(http));
  if (!endpoint.ok()) return endpoint.status();
  http_ = *std::move(endpoint);
  return absl::OkStatus();
}

absl::Status ServerNode::Open() {
  if (options_.own_process)
    metrics::AddProcessMetrics(&registry_);
  registry_.AddCallback("ps_server_rank",
                        "This server's rank (-1 before it registered).",
                        metrics::Type::kGauge,
                        [health = health_] { return double(health->rank); });
  reporter_ = std::make_unique<Reporter>(log_, options_.before_report);

  KVServer::Options server_options;
  server_options.config = options_.config;
  server_options.curve = options_.curve;
  server_options.metrics = &registry_;
  server_options.bind_endpoint = options_.bind_endpoint;
  server_options.on_checkpoint =
      [reporter = reporter_.get()](const ReportCheckpointRequest &r) {
        reporter->Enqueue(r);
      };
  server_options.on_move =
      [reporter = reporter_.get()](const ReportMoveRequest &r) {
        reporter->Enqueue(r);
      };
  absl::StatusOr<std::unique_ptr<KVServer>> server =
      KVServer::Start(std::move(server_options));
  if (!server.ok())
    return server.status();
  server_ = *std::move(server);
  KVServer *kv = server_.get();

  PS_RETURN_IF_ERROR(StartHttp(kv));

  endpoint_ = kv->endpoint();
  if (!options_.advertise_host.empty()) {
    endpoint_ =
        absl::StrCat("tcp://", options_.advertise_host, ":", kv->port());
  }
  auto client_options = SchedulerClient::Options::ForJob(
      options_.config, options_.scheduler, SERVER);
  client_options.data_endpoint = endpoint_;
  // Drained (psctl drain): leave exactly as on SIGTERM.
  client_options.on_drain = [this] {
    stop_.Notify();
    if (options_.on_drain)
      options_.on_drain();
  };
  // Leases, the drop and the scheduler's being gone arrive on the heartbeat
  // thread; the fence takes effect before the next request is taken up.
  client_options.on_lease = [kv](std::chrono::steady_clock::time_point until) {
    kv->SetLease(until);
  };
  client_options.on_lost = [kv, health = health_] {
    health->lost = true;
    kv->Fence(
        "dropped by the scheduler (declared dead: no heartbeat within "
        "cluster.heartbeat_timeout_ms); this server no longer owns slots");
  };
  client_options.on_scheduler_gone = [kv](const absl::Status &why) {
    kv->Fence(std::string(why.message()));
  };
  // Bytes per slot (elastic jobs), for the scheduler's planner: sent when
  // they changed, and with every 20th heartbeat in case one was lost.
  client_options.fill_heartbeat =
      [kv, last = std::make_shared<std::vector<uint64_t>>(),
       beats = std::make_shared<uint64_t>(0)](HeartbeatRequest* request) {
        FillStorage(*kv, request);
        FillServing(*kv, request);
        std::vector<uint64_t> bytes = kv->slot_bytes();
        if (bytes.empty() || (bytes == *last && ++*beats % 20 != 0))
          return;
        request->mutable_slot_bytes()->Add(bytes.begin(), bytes.end());
        *last = std::move(bytes);
      };
  client_options.on_view = [kv, health = health_](const ClusterView &view,
                                                  uint32_t rank) {
    kv->UpdateView(view, rank);
    health->rank = rank;
    health->has_slots = view.slot_owner_size() > 0;
  };
  absl::StatusOr<std::unique_ptr<SchedulerClient>> membership =
      SchedulerClient::Connect(std::move(client_options));
  if (!membership.ok())
    return membership.status();
  membership_ = *std::move(membership);
  if (options_.own_process)
    SetLogTag(absl::StrCat("server/", membership_->rank()));
  log_->info("registered as server {} at {}", membership_->rank(), endpoint_);
  reporter_->SetMembership(membership_.get());
  return absl::OkStatus();
}

ServerNode::~ServerNode() {
  // The reporter calls into the membership, the HTTP endpoint and the
  // membership's callbacks into the server: each goes before what it uses.
  if (reporter_ != nullptr)
    reporter_->Stop();
  http_.reset();
  membership_.reset();
  server_.reset();
  reporter_.reset();
}

std::optional<ServerNode::Exit> ServerNode::Ended() {
  // Dropped or given up on the scheduler: exit at once (already fenced),
  // without leaving (there is nothing to leave) or checkpointing (this
  // server's view may be stale; the newest committed checkpoint stays).
  if (membership_->lost()) {
    health_->lost = true;
    server_->Stop();
    log_->error("{}; exiting", membership_->lost_status().message());
    return Exit::kDropped;
  }
  if (absl::Status gone = membership_->scheduler_gone(); !gone.ok()) {
    health_->lost = true;
    server_->Stop();
    log_->error("{}", gone.message());
    return Exit::kSchedulerGone;
  }
  if (absl::Status failed = server_->storage_failure(); !failed.ok()) {
    health_->lost = true;
    server_->Stop();
    log_->error(
        "{}; exiting without leaving, to be recovered as a crashed "
        "server",
        failed.message());
    return Exit::kStorageFailed;
  }
  // The job cannot continue: nothing to serve, leave or checkpoint for.
  // Told by the view (which carries the reason), fetched right after the
  // heartbeat that says so.
  if (membership_->job_state() == FAILED) {
    const ClusterView view = membership_->view();
    if (view.job_state() == FAILED) {
      server_->Stop();
      log_->error("the job failed: {}; exiting", view.failure());
      return Exit::kJobFailed;
    }
  }
  return std::nullopt;
}

ServerNode::Exit
ServerNode::Run(const std::function<bool(absl::Duration)> &wait_for_stop) {
  constexpr absl::Duration kPoll = absl::Milliseconds(100);
  bool stop = false;
  while (true) {
    stop = wait_for_stop ? wait_for_stop(kPoll)
                         : stop_.WaitForNotificationWithTimeout(kPoll);
    stop = stop || stop_.HasBeenNotified();
    if (stop)
      break;
    if (membership_->job_state() == FINISHED)
      break;
    if (std::optional<Exit> exit = Ended())
      return *exit;
  }
  return Leave(/*preempted=*/stop);
}

ServerNode::Exit ServerNode::Leave(bool preempted) {
  if (std::optional<Exit> exit = Ended())
    return *exit;
  // A server that owns no slot (a spare, or one a scale-in emptied) has
  // nothing of its own to checkpoint.
  const ClusterView view = membership_->view();
  const bool owns_slots =
      std::count(view.slot_owner().begin(), view.slot_owner().end(),
                 membership_->rank()) > 0;
  if (preempted && !owns_slots && view.job_state() == RUNNING) {
    log_->info("leaving: this server owns no slot, so nothing to checkpoint");
  }
  if (preempted && owns_slots && membership_->job_state() == RUNNING &&
      !options_.config.checkpoint().dir().empty()) {
    // Preempted: checkpoint first, so a replacement restores every update
    // this server acknowledged; stop serving right after the shard is
    // written.
    server_->StopAfterNextCheckpoint();
    absl::StatusOr<uint64_t> clock = membership_->RequestCheckpoint();
    if (!clock.ok()) {
      log_->warn("preempted, and no checkpoint could be started ({}); updates "
                 "since the last checkpoint are lost",
                 clock.status().message());
    } else {
      log_->info("preempted: checkpointing at clock {} before leaving", *clock);
      const absl::Time give_up =
          options_.clock->Now() + options_.checkpoint_wait;
      while (!server_->stopped() && options_.clock->Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(20));
      }
      if (!server_->stopped()) {
        log_->warn("checkpoint at clock {} not written within {} s", *clock,
                   absl::ToInt64Seconds(options_.checkpoint_wait));
      }
    }
  }
  const KVServer::Stats stats = server_->stats();
  log_->info("stopping: {} requests ({} rejected), {} keys pushed, {} pulled",
             stats.requests, stats.errors, stats.keys_pushed,
             stats.keys_pulled);
  server_->Stop();
  // A shard written but not yet reported would be abandoned by leaving
  // first (the serving thread only queued its report). Each report is
  // bounded by the membership's RPC timeout.
  if (!reporter_->Flush(absl::Seconds(15))) {
    log_->warn(
        "checkpoint reports still unsent after 15 s; leaving without them");
  }
  for (const TableStats &t : server_->table_stats()) {
    log_->info("table '{}': {} {}, {} bytes{}; keys pushed {}, pulled {}; "
               "admitted {}, "
               "filtered pushes {}; evicted {} by TTL, {} for room; refused "
               "pushes {}, "
               "dropped keys {}",
               t.name(), t.rows(), t.sparse() ? "rows" : "elements", t.bytes(),
               t.memory_budget_bytes() > 0
                   ? absl::StrCat(" (budget ", t.memory_budget_bytes(), ")")
                   : std::string(),
               t.keys_pushed(), t.keys_pulled(), t.admissions(),
               t.pushes_filtered(), t.evictions_ttl(), t.evictions_budget(),
               t.pushes_refused(), t.keys_dropped());
    if (t.tier_memory_bytes() > 0) {
      log_->info(
          "table '{}' disk tier: {} cold rows, {} bytes on disk, {} demoted, "
          "{} promoted, {} cold reads ({} disk reads), {} dropped at "
          "max_disk_bytes, {} errors",
          t.name(), t.cold_rows(), t.disk_bytes(), t.demotions(),
          t.promotions(), t.cold_reads(), t.disk_reads(), t.cold_rows_dropped(),
          t.tier_errors());
    }
  }
  if (absl::Status s = membership_->Leave(/*finished=*/true); !s.ok()) {
    log_->warn("{}", s.message());
  }
  return Exit::kLeft;
}

} // namespace ps
