#include "scheduler/client.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/grpc_security.h"
#include "common/logging.h"
#include "common/protocol.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"

namespace ps {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger =
      new std::shared_ptr<spdlog::logger>(GetLogger("membership"));
  return *logger;
}

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

SchedulerClient::Options SchedulerClient::Options::ForJob(const JobConfig& config,
                                                          std::string address,
                                                          Role role) {
  Options options;
  options.address = std::move(address);
  options.role = role;
  options.config_fingerprint = ConfigFingerprint(config);
  options.tls = config.security().tls();
  options.heartbeat_interval =
      absl::Milliseconds(config.cluster().heartbeat_interval_ms());
  return options;
}

SchedulerClient::SchedulerClient(Options options)
    : options_(std::move(options)) {}

std::unique_ptr<grpc::ClientContext> SchedulerClient::Context(
    absl::Duration timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

absl::StatusOr<std::unique_ptr<SchedulerClient>> SchedulerClient::Connect(
    Options options) {
  std::unique_ptr<SchedulerClient> c(new SchedulerClient(std::move(options)));
  if (TlsEnabled(c->options_.tls)) InstallGrpcLogging();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      MakeChannelCredentials(c->options_.tls);
  if (!creds.ok()) return Annotate(creds.status(), "scheduler client credentials");
  c->stub_ = Scheduler::NewStub(grpc::CreateChannel(c->options_.address, *creds));
  RegisterRequest request;
  request.set_role(c->options_.role);
  request.set_data_endpoint(c->options_.data_endpoint);
  request.set_host(HostName());
  request.set_pid(static_cast<uint32_t>(getpid()));
  request.set_config_fingerprint(c->options_.config_fingerprint);
  request.set_trains_shards(c->options_.trains_shards);
  const absl::Time give_up = absl::Now() + c->options_.connect_timeout;
  RegisterResponse response;
  bool warned_full = false;
  while (true) {
    auto context = c->Context(c->options_.rpc_timeout);
    // Wait for the channel to connect instead of failing fast, so nodes
    // started before the scheduler simply wait for it.
    context->set_wait_for_ready(true);
    context->set_deadline(absl::ToChronoTime(
        std::min(absl::Now() + c->options_.rpc_timeout, give_up)));
    grpc::Status status = c->stub_->Register(context.get(), request, &response);
    if (status.ok()) break;
    // Every rank taken: a replacement may start before the node it
    // replaces is declared dead (a heartbeat timeout), so wait for that.
    const bool full = status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    const bool retry = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                       status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                       full;
    if (!retry || absl::Now() >= give_up) {
      std::string why;
      if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        // Waiting for the channel hides why it never connected (no
        // listener, or a refused TLS handshake); one fail-fast call
        // without side effects (not Register: it could take a rank) tells.
        auto probe = c->Context(absl::Seconds(2));
        GetStatusResponse ignored;
        const grpc::Status last =
            c->stub_->GetStatus(probe.get(), GetStatusRequest(), &ignored);
        if (last.error_code() == grpc::StatusCode::UNAVAILABLE) {
          why = absl::StrCat("; the channel's last error: ", last.error_message(),
                             TlsEnabled(c->options_.tls)
                                 ? " (with TLS on, check that the scheduler's "
                                   "certificate and this one come from the same "
                                   "job CA)"
                                 : " (if the job uses TLS, this config has none)");
        }
      }
      absl::Status result = Annotate(
          FromGrpcStatus(status),
          absl::StrCat("register with scheduler ", c->options_.address, why));
      Log()->error("{}", result);
      return result;
    }
    if (full) {
      if (!warned_full) {
        Log()->warn("{}; waiting for a rank to become free", status.error_message());
        warned_full = true;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  c->node_id_ = response.node_id();
  c->rank_ = response.rank();
  c->has_initial_shard_ = response.has_shard();
  c->initial_shard_ = response.shard();
  for (const NodeInfo& n : response.view().nodes()) {
    if (n.node_id() == c->node_id_) c->start_clock_ = n.start_clock();
  }
  c->clock_.store(c->start_clock_);
  c->InstallView(response.view());
  c->heartbeat_ = std::thread([p = c.get()] { p->HeartbeatLoop(); });
  c->watcher_ = std::thread([p = c.get()] { p->WatchLoop(); });
  return c;
}

SchedulerClient::~SchedulerClient() { StopHeartbeats(); }

void SchedulerClient::StopHeartbeats() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  {
    absl::MutexLock lock(&watch_mu_);
    if (watch_context_ != nullptr) watch_context_->TryCancel();
  }
  if (heartbeat_.joinable()) heartbeat_.join();
  if (watcher_.joinable()) watcher_.join();
}

ClusterView SchedulerClient::view() const {
  absl::MutexLock lock(&mu_);
  return view_;
}

JobState SchedulerClient::job_state() const {
  absl::MutexLock lock(&mu_);
  return job_state_;
}

void SchedulerClient::InstallView(const ClusterView& view) {
  absl::MutexLock install(&install_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (view.epoch() <= view_.epoch()) return;
    view_ = view;
    job_state_ = view.job_state();
  }
  if (options_.on_view) options_.on_view(view, rank_);
  if (options_.role == WORKER && view.checkpoint_clock() != 0) {
    MaybeReportCheckpoint(view.checkpoint_clock());
  }
}

void SchedulerClient::set_progress(uint64_t clock, const DataPosition& position) {
  clock_.store(clock);
  uint64_t pending;
  {
    absl::MutexLock lock(&progress_mu_);
    has_position_ = true;
    position_ = position;
    history_.emplace_back(clock, position);
    if (history_.size() > kHistory) history_.pop_front();
  }
  {
    absl::MutexLock lock(&mu_);
    pending = view_.checkpoint_clock();
  }
  if (pending != 0) MaybeReportCheckpoint(pending);
}

void SchedulerClient::MaybeReportCheckpoint(uint64_t checkpoint_clock) {
  ReportCheckpointRequest request;
  request.set_node_id(node_id_);
  request.set_clock(checkpoint_clock);
  {
    absl::MutexLock lock(&progress_mu_);
    if (reported_checkpoint_ >= checkpoint_clock) return;
    const uint64_t now = clock_.load();
    if (now < checkpoint_clock) return;  // not there yet
    bool found = false;
    for (const auto& [c, p] : history_) {
      if (c == checkpoint_clock) {
        *request.mutable_position() = p;
        found = true;
      }
    }
    request.set_ok(found || now >= kFinishedClock);
    if (!found && now < kFinishedClock) {
      request.set_error(absl::StrCat("worker passed clock ", checkpoint_clock,
                                     " before it learnt of the checkpoint"));
    }
    reported_checkpoint_ = checkpoint_clock;
  }
  ReportCheckpointResponse response;
  auto context = Context(options_.rpc_timeout);
  grpc::Status status = stub_->ReportCheckpoint(context.get(), request, &response);
  if (!status.ok() && status.error_code() != grpc::StatusCode::FAILED_PRECONDITION) {
    Log()->warn("reporting checkpoint {}: {}", checkpoint_clock, status.error_message());
  }
}

absl::StatusOr<ClaimShardResponse> SchedulerClient::ClaimShard(
    const DataPosition* finished, absl::Duration timeout) {
  ClaimShardRequest request;
  request.set_node_id(node_id_);
  if (finished != nullptr) *request.mutable_finished() = *finished;
  request.set_timeout_ms(static_cast<uint32_t>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(timeout), 0, 30000)));
  if (finished != nullptr) {
    absl::MutexLock lock(&progress_mu_);
    has_position_ = false;  // it trains no shard until it gets one
  }
  ClaimShardResponse response;
  auto context = Context(timeout + options_.rpc_timeout);
  grpc::Status status = stub_->ClaimShard(context.get(), request, &response);
  if (!status.ok()) return Annotate(FromGrpcStatus(status), "claim a shard");
  return response;
}

absl::Status SchedulerClient::ReportCheckpoint(ReportCheckpointRequest request) {
  request.set_node_id(node_id_);
  ReportCheckpointResponse response;
  auto context = Context(options_.rpc_timeout);
  return Annotate(
      FromGrpcStatus(stub_->ReportCheckpoint(context.get(), request, &response)),
      absl::StrCat("report checkpoint ", request.clock()));
}

absl::StatusOr<GetStatusResponse> SchedulerClient::GetStatus() {
  GetStatusRequest request;
  GetStatusResponse response;
  auto context = Context(options_.rpc_timeout);
  grpc::Status status = stub_->GetStatus(context.get(), request, &response);
  if (!status.ok()) return Annotate(FromGrpcStatus(status), "status");
  return response;
}

absl::StatusOr<uint64_t> SchedulerClient::RequestCheckpoint(uint64_t after_clock) {
  CheckpointRequest request;
  request.set_after_clock(after_clock);
  CheckpointResponse response;
  auto context = Context(options_.rpc_timeout);
  grpc::Status status = stub_->Checkpoint(context.get(), request, &response);
  if (!status.ok()) return Annotate(FromGrpcStatus(status), "checkpoint");
  return response.clock();
}

void SchedulerClient::HeartbeatLoop() {
  while (!stop_.WaitForNotificationWithTimeout(options_.heartbeat_interval)) {
    HeartbeatRequest request;
    request.set_node_id(node_id_);
    request.set_known_epoch(view().epoch());
    request.set_clock(clock_.load());
    {
      absl::MutexLock lock(&progress_mu_);
      if (has_position_) *request.mutable_position() = position_;
    }
    HeartbeatResponse response;
    auto context = Context(options_.rpc_timeout);
    grpc::Status status = stub_->Heartbeat(context.get(), request, &response);
    if (!status.ok()) {
      if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
        if (!lost_.exchange(true)) {
          Log()->error("scheduler dropped this node: {}", status.error_message());
        }
      } else {
        Log()->warn("heartbeat failed: {}", status.error_message());
      }
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      job_state_ = response.job_state();
    }
    if (response.drain() && !drain_.exchange(true)) {
      Log()->info("the scheduler is draining this node: leaving as on SIGTERM");
      if (options_.on_drain) options_.on_drain();
    }
    if (response.epoch() > request.known_epoch()) {
      GetClusterViewRequest get;
      ClusterView fresh;
      auto ctx = Context(options_.rpc_timeout);
      if (stub_->GetClusterView(ctx.get(), get, &fresh).ok()) InstallView(fresh);
    }
  }
}

void SchedulerClient::WatchLoop() {
  // Stopping cancels the poll in flight, so polls can be long.
  constexpr absl::Duration kPoll = absl::Seconds(5);
  while (true) {
    GetClusterViewRequest request;
    request.set_min_epoch(view().epoch() + 1);
    request.set_timeout_ms(absl::ToInt64Milliseconds(kPoll));
    ClusterView fresh;
    auto context = Context(kPoll + options_.rpc_timeout);
    {
      // Checked under the lock StopHeartbeats() takes after notifying, so
      // either it sees this context and cancels it, or this sees the stop.
      absl::MutexLock lock(&watch_mu_);
      if (stop_.HasBeenNotified()) break;
      watch_context_ = context.get();
    }
    const grpc::Status status = stub_->GetClusterView(context.get(), request, &fresh);
    {
      absl::MutexLock lock(&watch_mu_);
      watch_context_ = nullptr;
    }
    if (status.ok()) {
      InstallView(fresh);
    } else {
      // Scheduler unreachable: the heartbeat thread reports it; back off.
      stop_.WaitForNotificationWithTimeout(options_.heartbeat_interval);
    }
  }
}

absl::StatusOr<ClusterView> SchedulerClient::WaitForRunning(
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    GetClusterViewRequest request;
    request.set_wait_for_running(true);
    request.set_timeout_ms(static_cast<uint32_t>(
        absl::ToInt64Milliseconds(std::min(left, absl::Seconds(10)))));
    ClusterView view;
    auto context = Context(std::min(left, absl::Seconds(10)) + options_.rpc_timeout);
    grpc::Status status = stub_->GetClusterView(context.get(), request, &view);
    if (!status.ok()) {
      return Annotate(FromGrpcStatus(status), "waiting for the cluster");
    }
    InstallView(view);
    if (view.job_state() != STARTING) return view;
    Log()->info("waiting for servers to register (epoch {})", view.epoch());
  }
  return absl::DeadlineExceededError(
      "the cluster did not start in time: not every server registered");
}

absl::Status SchedulerClient::Barrier(const std::string& name,
                                      absl::Duration timeout,
                                      std::vector<uint32_t>* ranks) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const absl::Duration chunk =
        std::min(deadline - absl::Now(), absl::Seconds(10));
    BarrierRequest request;
    request.set_node_id(node_id_);
    request.set_name(name);
    request.set_timeout_ms(static_cast<uint32_t>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(chunk))));
    BarrierResponse response;
    auto context = Context(chunk + options_.rpc_timeout);
    grpc::Status status = stub_->Barrier(context.get(), request, &response);
    if (status.ok()) {
      if (ranks != nullptr) ranks->assign(response.ranks().begin(), response.ranks().end());
      return absl::OkStatus();
    }
    // The scheduler waits whole milliseconds and may answer a moment before
    // the deadline: that is the deadline, not a round to log and repeat (a
    // caller waiting in short rounds, like a Python session, logged a
    // warning each round).
    if (status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED ||
        absl::Now() + absl::Milliseconds(5) >= deadline) {
      return Annotate(FromGrpcStatus(status), absl::StrCat("barrier ", name));
    }
    Log()->warn("{}", status.error_message());
  }
}

absl::Status SchedulerClient::Leave(bool finished, const DataPosition* position) {
  StopHeartbeats();
  LeaveRequest request;
  request.set_node_id(node_id_);
  request.set_finished(finished);
  if (position != nullptr) *request.mutable_position() = *position;
  LeaveResponse response;
  auto context = Context(options_.rpc_timeout);
  return Annotate(FromGrpcStatus(stub_->Leave(context.get(), request, &response)),
                  "leave");
}

}  // namespace ps
