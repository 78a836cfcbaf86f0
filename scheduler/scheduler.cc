#include "scheduler/scheduler.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/catalog.h"
#include "common/config.h"
#include "common/grpc_security.h"
#include "common/logging.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "scheduler/journal.h"
#include "grpcpp/server_builder.h"

namespace ps {

class SchedulerServer::Service final : public Scheduler::Service {
 public:
  explicit Service(ClusterState* state) : state_(state) {}

  grpc::Status Register(grpc::ServerContext*, const RegisterRequest* request,
                        RegisterResponse* response) override {
    auto result = state_->Register(*request);
    if (!result.ok()) return ToGrpcStatus(result.status());
    *response = std::move(result).value();
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const HeartbeatRequest* request,
                         HeartbeatResponse* response) override {
    auto result = state_->Heartbeat(*request);
    if (!result.ok()) return ToGrpcStatus(result.status());
    *response = std::move(result).value();
    return grpc::Status::OK;
  }

  grpc::Status GetClusterView(grpc::ServerContext*,
                              const GetClusterViewRequest* request,
                              ClusterView* response) override {
    *response =
        state_->AwaitView(request->min_epoch(), request->wait_for_running(),
                          absl::Milliseconds(request->timeout_ms()));
    return grpc::Status::OK;
  }

  grpc::Status Leave(grpc::ServerContext*, const LeaveRequest* request,
                     LeaveResponse*) override {
    return ToGrpcStatus(state_->Leave(*request));
  }

  grpc::Status SetConsistency(grpc::ServerContext*,
                              const SetConsistencyRequest* request,
                              SetConsistencyResponse* response) override {
    auto epoch = state_->SetConsistency(request->consistency());
    if (!epoch.ok()) return ToGrpcStatus(epoch.status());
    response->set_epoch(*epoch);
    return grpc::Status::OK;
  }

  grpc::Status GetStatus(grpc::ServerContext*, const GetStatusRequest*,
                         GetStatusResponse* response) override {
    *response = state_->Status();
    return grpc::Status::OK;
  }

  grpc::Status Barrier(grpc::ServerContext*, const BarrierRequest* request,
                       BarrierResponse* response) override {
    auto ranks = state_->AwaitBarrier(request->node_id(), request->name(),
                                      absl::Milliseconds(request->timeout_ms()));
    if (!ranks.ok()) return ToGrpcStatus(ranks.status());
    for (uint32_t r : *ranks) response->add_ranks(r);
    return grpc::Status::OK;
  }

  grpc::Status ClaimShard(grpc::ServerContext*, const ClaimShardRequest* request,
                          ClaimShardResponse* response) override {
    auto result =
        state_->ClaimShard(*request, absl::Milliseconds(request->timeout_ms()));
    if (!result.ok()) return ToGrpcStatus(result.status());
    *response = std::move(result).value();
    return grpc::Status::OK;
  }

  grpc::Status Checkpoint(grpc::ServerContext*, const CheckpointRequest* request,
                          CheckpointResponse* response) override {
    auto clock = state_->StartCheckpoint(request->after_clock());
    if (!clock.ok()) return ToGrpcStatus(clock.status());
    response->set_clock(*clock);
    return grpc::Status::OK;
  }

  grpc::Status ReportCheckpoint(grpc::ServerContext*,
                                const ReportCheckpointRequest* request,
                                ReportCheckpointResponse*) override {
    return ToGrpcStatus(state_->ReportCheckpoint(*request));
  }

  grpc::Status Drain(grpc::ServerContext*, const DrainRequest* request,
                     DrainResponse* response) override {
    absl::StatusOr<DrainResponse> result = state_->Drain(*request);
    if (!result.ok()) return ToGrpcStatus(result.status());
    *response = std::move(result).value();
    return grpc::Status::OK;
  }

 private:
  ClusterState* const state_;
};

namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger =
      new std::shared_ptr<spdlog::logger>(GetLogger("scheduler"));
  return *logger;
}

// Checkpoints on the file system (checkpoint/catalog.h).
ClusterState::CheckpointStore FileStore(const JobConfig& config) {
  ClusterState::CheckpointStore store;
  const std::string root = config.checkpoint().dir();
  if (root.empty()) return store;
  const uint32_t keep = config.checkpoint().keep() > 0 ? config.checkpoint().keep() : 3;
  store.commit = [root, keep](const std::string& dir,
                              const CheckpointManifest& manifest) {
    PS_RETURN_IF_ERROR(WriteManifest(dir, manifest));
    auto pruned = PruneCheckpoints(root, keep);
    if (!pruned.ok()) {
      Log()->warn("pruning old checkpoints: {}", pruned.status().message());
    } else if (!pruned->empty()) {
      Log()->info("deleted old checkpoints: {}", absl::StrJoin(*pruned, ", "));
    }
    return absl::OkStatus();
  };
  store.latest = [root]() -> absl::StatusOr<CheckpointRef> {
    auto latest = FindLatestCheckpoint(root);
    if (!latest.ok()) return latest.status();
    for (const std::string& skipped : latest->skipped) {
      Log()->warn("checkpoint {} is not usable; using {}", skipped, latest->dir);
    }
    CheckpointRef ref;
    ref.set_path(latest->dir);
    ref.set_clock(latest->manifest.clock());
    return ref;
  };
  return store;
}

}  // namespace

SchedulerServer::SchedulerServer(Options options)
    : options_(std::move(options)),
      state_(std::make_unique<ClusterState>(options_.config, options_.clock,
                                            FileStore(options_.config))),
      service_(std::make_unique<Service>(state_.get())) {}

absl::StatusOr<std::unique_ptr<SchedulerServer>> SchedulerServer::Start(
    Options options) {
  std::unique_ptr<SchedulerServer> s(new SchedulerServer(std::move(options)));
  const CheckpointConfig& ckpt = s->options_.config.checkpoint();
  PS_ASSIGN_OR_RETURN(const bool recovered, s->TakeBackJob());
  if (!recovered && ckpt.restore() && !ckpt.dir().empty()) {
    auto latest = FindLatestCheckpoint(ckpt.dir());
    if (latest.ok()) {
      for (const std::string& skipped : latest->skipped) {
        Log()->warn("checkpoint {} is not usable; using {}", skipped, latest->dir);
      }
      s->state_->SetRestore(latest->dir, latest->manifest);
    } else if (latest.status().code() == absl::StatusCode::kNotFound) {
      Log()->info("no checkpoint to restore in {} ({}); starting fresh", ckpt.dir(),
                  latest.status().message());
    } else {
      return Annotate(latest.status(), "looking for a checkpoint to restore");
    }
  }
  // Mutual TLS when the job config names its files (see grpc_security.h).
  const TlsConfig& tls = s->options_.config.security().tls();
  if (TlsEnabled(tls)) InstallGrpcLogging();
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
      MakeServerCredentials(tls);
  if (!creds.ok()) return Annotate(creds.status(), "scheduler credentials");
  grpc::ServerBuilder builder;
  builder.AddListeningPort(s->options_.listen_address, *creds, &s->port_);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", s->options_.listen_address));
  }
  if (s->options_.run_failure_detector) {
    s->detector_ = std::thread([p = s.get()] { p->DetectFailures(); });
  }
  return s;
}

std::string SchedulerStateDir(const JobConfig& config) {
  if (!config.cluster().scheduler_state_dir().empty()) {
    return config.cluster().scheduler_state_dir();
  }
  if (!config.checkpoint().dir().empty()) return config.checkpoint().dir() + "/scheduler";
  return "";
}

absl::StatusOr<bool> SchedulerServer::TakeBackJob() {
  const JobConfig& config = options_.config;
  const std::string dir = SchedulerStateDir(config);
  if (dir.empty()) {
    Log()->warn("no cluster.scheduler_state_dir and no checkpoint.dir: the scheduler "
                "keeps no journal, and a scheduler restart loses the job");
    return false;
  }
  auto file = std::make_shared<JournalFile>(dir);
  absl::StatusOr<SchedulerJournal> journal = file->Read();
  bool recovered = false;
  const absl::Time now = options_.clock->Now();
  const absl::Duration bound =
      absl::Milliseconds(config.cluster().scheduler_unreachable_timeout_ms());
  if (journal.ok()) {
    const absl::Duration age = now - absl::FromUnixMillis(journal->written_unix_ms());
    // Set aside rather than deleted: an operator may want to see it.
    const std::string aside = absl::StrCat("old-", absl::ToUnixSeconds(now));
    if (journal->config_fingerprint() != ConfigFingerprint(config)) {
      Log()->warn("the journal {} is of a job with another config; starting a new job "
                  "(the old journal is kept as {}.{})",
                  file->path(), file->path(), aside);
      PS_RETURN_IF_ERROR(file->SetAside(aside));
    } else if (journal->view().job_state() == FINISHED) {
      Log()->info("the journal {} is of a finished job; starting a new job", file->path());
    } else if (age > bound) {
      Log()->warn("the journal {} was last written {} ago, longer than "
                  "cluster.scheduler_unreachable_timeout_ms ({}): its nodes have given "
                  "up; starting a new job (the old journal is kept as {}.{})",
                  file->path(), absl::FormatDuration(absl::Trunc(age, absl::Seconds(1))),
                  absl::FormatDuration(bound), file->path(), aside);
      PS_RETURN_IF_ERROR(file->SetAside(aside));
    } else {
      absl::Status taken = state_->Recover(*journal);
      if (!taken.ok()) {
        return Annotate(taken, absl::StrCat("taking the job back from ", file->path(),
                                            " (move it aside to start a new job)"));
      }
      recovered = true;
    }
  } else if (journal.status().code() != absl::StatusCode::kNotFound) {
    return Annotate(journal.status(),
                    absl::StrCat("reading the scheduler journal (it was written less than ",
                                 "a moment ago or is damaged; move it aside to start a "
                                 "new job)"));
  }
  state_->SetJournal([file](const SchedulerJournal& j, bool sync) {
    return file->Write(j, sync);
  });
  Log()->info("journal: {}", file->path());
  return recovered;
}

SchedulerServer::~SchedulerServer() { Shutdown(); }

std::string SchedulerServer::address() const {
  const std::string& a = options_.listen_address;
  return absl::StrCat(a.substr(0, a.rfind(':')), ":", port_);
}

void SchedulerServer::DetectFailures() {
  // Checking at a quarter of the heartbeat interval bounds detection latency
  // to timeout + interval/4.
  const absl::Duration period = std::max(
      absl::Milliseconds(options_.config.cluster().heartbeat_interval_ms()) / 4,
      absl::Milliseconds(10));
  absl::Time last_sync = absl::Now();
  while (!stop_.WaitForNotificationWithTimeout(period)) {
    state_->ExpireSilentNodes();
    state_->CheckProgress();
    state_->CheckCheckpoints();
    // The workers' clocks and positions, which heartbeats change without a
    // journal write, and the journal's age (how a new scheduler tells a
    // live job from an abandoned one).
    if (absl::Now() - last_sync >= absl::Seconds(1)) {
      last_sync = absl::Now();
      state_->SyncJournal();
    }
  }
}

bool SchedulerServer::WaitUntilDone(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!state_->AllDone()) {
    if (absl::Now() >= deadline || stop_.HasBeenNotified()) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

void SchedulerServer::Shutdown() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (detector_.joinable()) detector_.join();
  // gRPC's Shutdown waits for running handlers, and long polls and barriers
  // would otherwise block theirs for up to 30 s: wake them first.
  state_->Close();
  if (server_ != nullptr) {
    // Calls still running get a moment to finish before gRPC cancels them.
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(200));
    server_->Wait();
    server_.reset();
  }
}

}  // namespace ps
