#include "scheduler/scheduler.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/catalog.h"
#include "common/config.h"
#include "common/grpc_security.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "grpcpp/server_builder.h"
#include "scheduler/barrier_waiters.h"
#include "scheduler/call_batcher.h"
#include "scheduler/claim_waiters.h"
#include "scheduler/journal.h"
#include "scheduler/ring_registry.h"
#include "scheduler/scheduler_log.h"
#include "scheduler/view_watchers.h"

namespace ps {

// Heartbeats and view long polls, the calls every node makes all the time,
// use gRPC's callback API: a heartbeat is answered on gRPC's own threads
// without a hand-off to the synchronous pool, and a waiting long poll is a
// record in ViewWatchers, not a blocked thread. Checkpoint reports, which
// every node sends at once, are answered in rounds (CallBatcher) with one
// journal write each, and shard claims, which every worker sends at the end
// of training and most of which wait, are records in ClaimWaiters, as are
// barriers, where all workers but the last wait, in BarrierWaiters. The
// rest stay synchronous.
using SchedulerBase = Scheduler::WithCallbackMethod_Heartbeat<
    Scheduler::WithCallbackMethod_GetClusterView<
        Scheduler::WithCallbackMethod_ReportCheckpoint<
            Scheduler::WithCallbackMethod_ClaimShard<
                Scheduler::WithCallbackMethod_Barrier<Scheduler::Service>>>>>;
using ReportBatcher =
    CallBatcher<ReportCheckpointRequest, ReportCheckpointResponse>;

class SchedulerServer::Service final : public SchedulerBase {
 public:
  explicit Service(ClusterState* state)
      : state_(state),
        watchers_(state),
        claims_(state),
        barriers_(state),
        reports_([state](const std::vector<ReportBatcher::Call>& calls) {
          std::vector<const ReportCheckpointRequest*> requests;
          for (const ReportBatcher::Call& c : calls) {
            requests.push_back(c.request);
          }
          std::vector<grpc::Status> statuses;
          for (const absl::Status& s : state->ReportCheckpoints(requests)) {
            statuses.push_back(ToGrpcStatus(s));
          }
          return statuses;
        }),
        ring_([state](uint64_t node) { return state->IsLiveWorker(node); },
              [state] { return state->LiveWorkers(); },
              static_cast<uint64_t>(absl::ToUnixMillis(absl::Now()))) {}

  void Close() {
    watchers_.Close();
    claims_.Close();
    barriers_.Close();
    reports_.Close();
    ring_.Close();
  }

  grpc::Status Register(grpc::ServerContext*, const RegisterRequest* request,
                        RegisterResponse* response) override {
    auto result = state_->Register(*request);
    if (!result.ok()) return ToGrpcStatus(result.status());
    *response = std::move(result).value();
    return grpc::Status::OK;
  }

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const HeartbeatRequest* request,
                                      HeartbeatResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    auto result = state_->Heartbeat(*request);
    if (!result.ok()) {
      reactor->Finish(ToGrpcStatus(result.status()));
      return reactor;
    }
    *response = std::move(result).value();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* GetClusterView(
      grpc::CallbackServerContext* context,
      const GetClusterViewRequest* request, ClusterView* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    watchers_.Watch(*request, response,
                    [reactor] { reactor->Finish(grpc::Status::OK); });
    return reactor;
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

  grpc::Status GetStatus(grpc::ServerContext* context, const GetStatusRequest*,
                         GetStatusResponse* response) override {
    *response = state_->Status();
    // Beside the answer rather than in it, so that its message stays as the
    // nodes know it.
    if (absl::Status journal = state_->JournalError(); !journal.ok()) {
      context->AddTrailingMetadata(std::string(kJournalErrorKey),
                                   std::string(journal.message()));
    }
    return grpc::Status::OK;
  }

  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* context,
                                    const BarrierRequest* request,
                                    BarrierResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    barriers_.Wait(request, response, reactor);
    return reactor;
  }

  grpc::ServerUnaryReactor* ClaimShard(grpc::CallbackServerContext* context,
                                       const ClaimShardRequest* request,
                                       ClaimShardResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    claims_.Claim(request, response, reactor);
    return reactor;
  }

  grpc::Status Checkpoint(grpc::ServerContext*,
                          const CheckpointRequest* request,
                          CheckpointResponse* response) override {
    auto clock = state_->StartCheckpoint(request->after_clock());
    if (!clock.ok()) return ToGrpcStatus(clock.status());
    response->set_clock(*clock);
    return grpc::Status::OK;
  }

  grpc::ServerUnaryReactor* ReportCheckpoint(
      grpc::CallbackServerContext* context,
      const ReportCheckpointRequest* request,
      ReportCheckpointResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reports_.Add({request, response, reactor});
    return reactor;
  }

  grpc::Status Drain(grpc::ServerContext*, const DrainRequest* request,
                     DrainResponse* response) override {
    absl::StatusOr<DrainResponse> result = state_->Drain(*request);
    if (!result.ok()) return ToGrpcStatus(result.status());
    *response = std::move(result).value();
    return grpc::Status::OK;
  }

  grpc::Status Scale(grpc::ServerContext*, const ScaleRequest* request,
                     ScaleResponse* response) override {
    absl::StatusOr<ScaleResponse> result = state_->Scale(*request);
    if (!result.ok()) return ToGrpcStatus(result.status());
    *response = std::move(result).value();
    return grpc::Status::OK;
  }

  grpc::Status ReportMove(grpc::ServerContext*,
                          const ReportMoveRequest* request,
                          ReportMoveResponse*) override {
    return ToGrpcStatus(state_->ReportMove(*request));
  }

  grpc::Status JoinRing(grpc::ServerContext*, const JoinRingRequest* request,
                        JoinRingResponse* response) override {
    auto result = ring_.Join(request->node_id(), request->min_members(),
                             request->after_generation(),
                             absl::Milliseconds(request->timeout_ms()));
    if (!result.ok()) return ToGrpcStatus(result.status());
    *response = std::move(result).value();
    return grpc::Status::OK;
  }

  grpc::Status LeaveRing(grpc::ServerContext*, const LeaveRingRequest* request,
                         LeaveRingResponse*) override {
    return ToGrpcStatus(ring_.Leave(request->node_id()));
  }

  grpc::Status WatchRing(grpc::ServerContext*, const WatchRingRequest* request,
                         WatchRingResponse* response) override {
    auto rejoin = ring_.Watch(request->node_id(), request->generation(),
                              absl::Milliseconds(request->timeout_ms()));
    if (!rejoin.ok()) return ToGrpcStatus(rejoin.status());
    response->set_rejoin(*rejoin);
    return grpc::Status::OK;
  }

  grpc::Status RingStore(grpc::ServerContext*, const RingStoreRequest* request,
                         RingStoreResponse* response) override {
    auto result =
        ring_.Store(*request, absl::Milliseconds(request->timeout_ms()));
    if (!result.ok()) return ToGrpcStatus(result.status());
    *response = std::move(result).value();
    return grpc::Status::OK;
  }

 private:
  ClusterState* const state_;
  ViewWatchers watchers_;
  ClaimWaiters claims_;
  BarrierWaiters barriers_;
  ReportBatcher reports_;
  RingRegistry ring_;
};

namespace {

// Checkpoints on the file system (checkpoint/catalog.h).
ClusterState::CheckpointStore FileStore(const JobConfig& config) {
  ClusterState::CheckpointStore store;
  const std::string root = config.checkpoint().dir();
  if (root.empty()) return store;
  const uint32_t keep =
      config.checkpoint().keep() > 0 ? config.checkpoint().keep() : 3;
  store.commit = [root, keep](const std::string& dir,
                              const CheckpointManifest& manifest) {
    PS_RETURN_IF_ERROR(WriteManifest(dir, manifest));
    auto pruned = PruneCheckpoints(root, keep);
    if (!pruned.ok()) {
      SchedulerLog()->warn("pruning old checkpoints: {}",
                           pruned.status().message());
    } else if (!pruned->empty()) {
      SchedulerLog()->info("deleted old checkpoints: {}",
                           absl::StrJoin(*pruned, ", "));
    }
    return absl::OkStatus();
  };
  store.latest = [root]() -> absl::StatusOr<CheckpointRef> {
    auto latest = FindLatestCheckpoint(root);
    if (!latest.ok()) return latest.status();
    for (const std::string& skipped : latest->skipped) {
      SchedulerLog()->warn("checkpoint {} is not usable; using {}", skipped,
                           latest->dir);
    }
    CheckpointRef ref;
    ref.set_path(latest->dir);
    ref.set_clock(latest->manifest.clock());
    return ref;
  };
  return store;
}

// How often the failure detector runs. A quarter of the heartbeat interval
// bounds detection latency to timeout + interval/4.
absl::Duration DetectorPeriod(const JobConfig& config) {
  return std::max(
      absl::Milliseconds(config.cluster().heartbeat_interval_ms()) / 4,
      absl::Milliseconds(10));
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
        SchedulerLog()->warn("checkpoint {} is not usable; using {}", skipped,
                             latest->dir);
      }
      s->state_->SetRestore(latest->dir, latest->manifest);
    } else if (latest.status().code() == absl::StatusCode::kNotFound) {
      SchedulerLog()->info(
          "no checkpoint to restore in {} ({}); starting fresh", ckpt.dir(),
          latest.status().message());
    } else {
      return Annotate(latest.status(), "looking for a checkpoint to restore");
    }
  }
  PS_RETURN_IF_ERROR(s->Listen(recovered ? s->state_->ListenPort() : 0));
  s->state_->SetListenPort(s->port_);
  if (s->options_.run_failure_detector) {
    s->state_->ExpectSweepsEvery(DetectorPeriod(s->options_.config));
    s->detector_ = std::thread([p = s.get()] { p->DetectFailures(); });
  }
  return s;
}

absl::Status SchedulerServer::Listen(uint32_t journaled_port) {
  // Mutual TLS when the job config names its files (see grpc_security.h).
  const TlsConfig& tls = options_.config.security().tls();
  if (TlsEnabled(tls)) InstallGrpcLogging();
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
      MakeServerCredentials(tls);
  if (!creds.ok()) return Annotate(creds.status(), "scheduler credentials");
  std::string address = options_.listen_address;
  const size_t colon = address.rfind(':');
  const bool any_port =
      colon != std::string::npos && address.substr(colon + 1) == "0";
  absl::Time deadline = absl::Now();
  if (any_port && journaled_port != 0) {
    address = absl::StrCat(address.substr(0, colon), ":", journaled_port);
    // The predecessor's sockets may take a moment to close.
    deadline += absl::Seconds(5);
    SchedulerLog()->info(
        "listening on port {} again, where the job's nodes look for the "
        "scheduler",
        journaled_port);
  }
  while (true) {
    grpc::ServerBuilder builder;
    // The nodes ping their connection every half heartbeat timeout, also
    // between calls, to notice a cut link (scheduler/client.cc): pings that
    // often are not abuse.
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    builder.AddChannelArgument(
        GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 50);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
    builder.AddListeningPort(address, *creds, &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    if (server_ != nullptr && port_ != 0) return absl::OkStatus();
    server_.reset();
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::UnavailableError(
      absl::StrCat("cannot listen on ", address,
                   any_port && journaled_port != 0
                       ? " (the port of the job's scheduler before its "
                         "restart, where its nodes look for "
                         "it: free it, or start the scheduler with --port)"
                       : ""));
}

std::string SchedulerStateDir(const JobConfig& config) {
  if (!config.cluster().scheduler_state_dir().empty()) {
    return config.cluster().scheduler_state_dir();
  }
  if (!config.checkpoint().dir().empty())
    return config.checkpoint().dir() + "/scheduler";
  return "";
}

std::string DefaultSchedulerStateDir(const JobConfig& config,
                                     absl::string_view xdg_state_home,
                                     absl::string_view home) {
  std::string base;
  if (!xdg_state_home.empty()) {
    base = std::string(xdg_state_home);
  } else if (!home.empty()) {
    base = absl::StrCat(home, "/.local/state");
  } else {
    return "";
  }
  // One path component: no separators, no "." or "..", nothing a shell
  // would trip on.
  std::string name = config.name();
  for (char& c : name) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.') c = '_';
  }
  if (name.empty() || name == "." || name == "..") name = "job";
  return absl::StrCat(base, "/ps/", name);
}

absl::StatusOr<bool> SchedulerServer::Resumable(
    JournalFile& file, const SchedulerJournal& journal) {
  const JobConfig& config = options_.config;
  const absl::Time now = options_.clock->Now();
  const absl::Duration age =
      now - absl::FromUnixMillis(journal.written_unix_ms());
  const absl::Duration bound =
      absl::Milliseconds(config.cluster().scheduler_unreachable_timeout_ms());
  std::string why;
  if (journal.config_fingerprint() != ConfigFingerprint(config)) {
    why = "is of a job with another config";
  } else if (journal.launch_id() != options_.launch_id) {
    why = absl::StrCat("is of launch '", journal.launch_id(),
                       "', this is launch '", options_.launch_id, "'");
  } else if (journal.view().job_state() == FINISHED) {
    why = "is of a finished job";
  } else if (journal.view().job_state() == FAILED) {
    why = absl::StrCat("is of a job that failed (", journal.view().failure(),
                       ")");
  } else if (journal.stopped()) {
    why = "is of a job whose scheduler was stopped (SIGTERM or SIGINT)";
  } else if (age > bound) {
    why = absl::StrCat(
        "was last written ",
        absl::FormatDuration(absl::Trunc(age, absl::Seconds(1))),
        " ago, longer than cluster.scheduler_unreachable_timeout_ms (",
        absl::FormatDuration(bound), "): its nodes have given up");
  } else {
    return true;
  }
  // Set aside rather than deleted: an operator may want to see it.
  const std::string aside = absl::StrCat("old-", absl::ToUnixSeconds(now));
  SchedulerLog()->info(
      "the journal {} {}; starting a new job (the old journal is kept as "
      "{}.{})",
      file.path(), why, file.path(), aside);
  PS_RETURN_IF_ERROR(file.SetAside(aside));
  return false;
}

absl::StatusOr<bool> SchedulerServer::TakeBackJob() {
  const JobConfig& config = options_.config;
  state_->SetLaunch(options_.launch_id);
  std::string dir = SchedulerStateDir(config);
  const bool configured = !dir.empty();
  if (!configured) dir = options_.default_state_dir;
  if (dir.empty()) {
    SchedulerLog()->warn(
        "no cluster.scheduler_state_dir, no checkpoint.dir and no default "
        "state "
        "directory ($XDG_STATE_HOME or $HOME): the scheduler keeps no journal, "
        "and "
        "a scheduler restart loses the job");
    return false;
  }
  // A directory named in the config must work; the default one is a
  // convenience that must not stop a job from running.
  auto unusable = [&](const absl::Status& error) -> absl::StatusOr<bool> {
    if (configured) return Annotate(error, "the scheduler's state directory");
    SchedulerLog()->warn(
        "cannot keep the journal in the default state directory {} ({}): a "
        "scheduler restart loses this job; set cluster.scheduler_state_dir",
        dir, error.message());
    return false;
  };
  auto file = std::make_shared<JournalFile>(dir);
  if (absl::Status locked = file->Lock(); !locked.ok()) return unusable(locked);
  absl::StatusOr<SchedulerJournal> journal = file->Read();
  bool recovered = false;
  if (journal.ok()) {
    PS_ASSIGN_OR_RETURN(const bool resume, Resumable(*file, *journal));
    if (resume) {
      absl::Status taken = state_->Recover(*journal);
      if (!taken.ok()) {
        return Annotate(taken,
                        absl::StrCat("taking the job back from ", file->path(),
                                     " (move it aside to start a new job)"));
      }
      recovered = true;
    }
  } else if (journal.status().code() != absl::StatusCode::kNotFound) {
    return Annotate(
        journal.status(),
        absl::StrCat("reading the scheduler journal (it was written less than ",
                     "a moment ago or is damaged; move it aside to start a "
                     "new job)"));
  }
  absl::Status first =
      state_->SetJournal([file](const SchedulerJournal& j, bool sync) {
        return file->Write(j, sync);
      });
  if (!first.ok() && !recovered) {
    state_->SetJournal(nullptr).IgnoreError();
    return unusable(first);
  }
  SchedulerLog()->info(
      "journal: {}{}", file->path(),
      options_.launch_id.empty()
          ? ""
          : absl::StrCat(" (launch ", options_.launch_id, ")"));
  return recovered;
}

SchedulerServer::~SchedulerServer() { Shutdown(); }

std::string SchedulerServer::address() const {
  const std::string& a = options_.listen_address;
  return absl::StrCat(a.substr(0, a.rfind(':')), ":", port_);
}

void SchedulerServer::DetectFailures() {
  const absl::Duration period = DetectorPeriod(options_.config);
  absl::Time last_sync = absl::Now();
  while (!stop_.WaitForNotificationWithTimeout(period)) {
    state_->ExpireSilentNodes();
    state_->CheckCanContinue();
    state_->CheckProgress();
    state_->CheckCheckpoints();
    state_->CheckMoves();
    // The workers' clocks and positions, which heartbeats change without a
    // journal write, and the journal's age (how a new scheduler tells a
    // live job from an abandoned one).
    if (absl::Now() - last_sync >= absl::Seconds(1)) {
      last_sync = absl::Now();
      state_->SampleProgress();
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
  service_->Close();
  if (server_ != nullptr) {
    // Calls still running get a moment to finish before gRPC cancels them.
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(200));
    server_->Wait();
    server_.reset();
  }
}

}  // namespace ps
