#include "scheduler/client.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/grpc_security.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/protocol.h"
#include "common/reasons.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "scheduler/rank_runs.h"

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

using SteadyClock = std::chrono::steady_clock;

constexpr char kDropped[] = "dropped by the scheduler";
constexpr char kUnreachableField[] = "cluster.scheduler_unreachable_timeout_ms";
// While the scheduler is away: the first failure is logged, then at most
// one line per kWarnEvery.
constexpr absl::Duration kWarnEvery = absl::Seconds(5);
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(100);
// The most ranks a barrier's answer may name: cluster.num_workers' limit
// (common/config.cc).
constexpr uint64_t kMaxBarrierRanks = 65536;
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);

double Seconds(SteadyClock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

absl::Status DroppedError(absl::string_view detail) {
  return WithReason(absl::AbortedError(absl::StrCat(kDropped, ": ", detail)),
                    reason::kDropped);
}

bool IsDropped(const absl::Status& status) {
  return status.code() == absl::StatusCode::kAborted &&
         ReasonOf(status) == reason::kDropped;
}

bool IsSchedulerGone(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable &&
         ReasonOf(status) == reason::kSchedulerUnreachable;
}

SchedulerClient::Options SchedulerClient::Options::ForJob(
    const JobConfig& config, std::string address, Role role) {
  Options options;
  options.address = std::move(address);
  options.role = role;
  options.config_fingerprint = ConfigFingerprint(config);
  options.tls = config.security().tls();
  options.heartbeat_interval =
      absl::Milliseconds(config.cluster().heartbeat_interval_ms());
  if (config.cluster().heartbeat_timeout_ms() > 0) {
    options.heartbeat_timeout =
        absl::Milliseconds(config.cluster().heartbeat_timeout_ms());
  }
  if (config.cluster().scheduler_unreachable_timeout_ms() > 0) {
    options.unreachable_timeout =
        absl::Milliseconds(config.cluster().scheduler_unreachable_timeout_ms());
  }
  return options;
}

SchedulerClient::SchedulerClient(Options options)
    : options_(std::move(options)) {}

std::unique_ptr<grpc::ClientContext> SchedulerClient::Context(
    absl::Duration timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  // Fail fast while the channel cannot connect: the error says why
  // (refused, no route...), and callers retry with backoff within their
  // bound. The watch loop's long poll waits for the connection instead,
  // which is what notices a restarted scheduler at once.
  return context;
}

namespace {

// The channel to the scheduler: how it reconnects and notices a cut link.
grpc::ChannelArguments ChannelArgs(absl::Duration heartbeat_timeout) {
  // Reconnect within a second of a restarted scheduler listening again
  // (gRPC's default backoff grows to two minutes over a long outage). The
  // "minimum backoff" is also the least time a connection attempt gets
  // (handshake included): a loaded scheduler must not be given up on too
  // soon, or attempts keep timing out while it is already back.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A connection that lost packets (a cut link) is not left to TCP: its
  // retransmissions back off, doubling, so after a cut of D the next one
  // may come about D after the link is back, and the scheduler would hear
  // nothing for that long. Pings unanswered for half a heartbeat timeout
  // close it instead, and the reconnection attempts above (a fresh
  // connection at most a second or two apart) find the link as soon as it
  // is back. The scheduler accepts pings this often (scheduler.cc).
  const int keepalive_ms = static_cast<int>(
      std::max<int64_t>(100, absl::ToInt64Milliseconds(heartbeat_timeout) / 2));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, keepalive_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return args;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SchedulerClient>> SchedulerClient::Connect(
    Options options) {
  std::unique_ptr<SchedulerClient> c(new SchedulerClient(std::move(options)));
  if (TlsEnabled(c->options_.tls)) InstallGrpcLogging();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      MakeChannelCredentials(c->options_.tls);
  if (!creds.ok())
    return Annotate(creds.status(), "scheduler client credentials");
  c->stub_ = Scheduler::NewStub(grpc::CreateCustomChannel(
      c->options_.address, *creds, ChannelArgs(c->options_.heartbeat_timeout)));
  RegisterRequest request;
  request.set_role(c->options_.role);
  request.set_data_endpoint(c->options_.data_endpoint);
  request.set_host(HostName());
  request.set_pid(static_cast<uint32_t>(getpid()));
  request.set_config_fingerprint(c->options_.config_fingerprint);
  request.set_trains_shards(c->options_.trains_shards);
  // A worker routes by the servers alone; the other workers would make its
  // view, and every node's fetch of one, grow with the fleet.
  request.set_servers_only(c->options_.role == WORKER);
  const absl::Time give_up = absl::Now() + c->options_.connect_timeout;
  RegisterResponse response;
  bool warned_full = false;
  SteadyClock::time_point sent;
  while (true) {
    sent = SteadyClock::now();
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
    const bool full =
        status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    const bool retry =
        status.error_code() == grpc::StatusCode::UNAVAILABLE ||
        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || full;
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
          why = absl::StrCat(
              "; the channel's last error: ", last.error_message(),
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
        Log()->warn("{}; waiting for a rank to become free",
                    status.error_message());
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
  {
    absl::MutexLock lock(&c->reach_mu_);
    c->last_ack_ = SteadyClock::now();
  }
  if (c->options_.on_lease) {
    c->options_.on_lease(sent + absl::ToChronoNanoseconds(
                                    c->options_.heartbeat_timeout * 3 / 4));
  }
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

void SchedulerClient::AskAsThisNode(GetClusterViewRequest* request) const {
  if (options_.role == WORKER) {
    request->set_servers_only(true);
    request->set_node_id(node_id_);
  }
}

bool SchedulerClient::InstallView(const ClusterView& received) {
  absl::MutexLock install(&install_mu_);
  ClusterView view;
  {
    absl::MutexLock lock(&mu_);
    if (received.epoch() <= view_.epoch()) return true;
    if (received.delta_from() == 0) {
      view = received;
    } else {
      // A delta: only against the view it was made for, of the same
      // scheduler incarnation (epochs go on across a restart, but a delta
      // is not worth trusting across one).
      if (received.delta_from() != view_.epoch() ||
          received.scheduler_restarts() != view_.scheduler_restarts()) {
        return false;
      }
      view = received;
      view.clear_nodes();
      view.set_delta_from(0);
      if (received.slots_unchanged()) {
        *view.mutable_slot_owner() = view_.slot_owner();
        *view.mutable_slot_backup() = view_.slot_backup();
        view.set_slots_unchanged(false);
      }
      absl::flat_hash_map<uint64_t, const NodeInfo*> changed;
      for (const NodeInfo& n : received.nodes()) changed[n.node_id()] = &n;
      for (const NodeInfo& n : view_.nodes()) {
        auto it = changed.find(n.node_id());
        if (it == changed.end()) {
          *view.add_nodes() = n;
        } else {
          *view.add_nodes() = *it->second;
          changed.erase(it);
        }
      }
      // New nodes, in the delta's order (by id, after every older one).
      for (const NodeInfo& n : received.nodes()) {
        if (changed.contains(n.node_id())) *view.add_nodes() = n;
      }
    }
    view_ = view;
    job_state_ = view.job_state();
  }
  if (options_.on_view) options_.on_view(view, rank_);
  if (options_.role == WORKER && view.checkpoint_clock() != 0) {
    MaybeReportCheckpoint(view.checkpoint_clock());
  }
  return true;
}

void SchedulerClient::set_progress(uint64_t clock,
                                   const DataPosition& position) {
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
  // One attempt (the heartbeat thread calls this): a checkpoint the
  // scheduler does not hear of in time is abandoned and retried later.
  bool transport = false;
  grpc::Status status = Attempt(
      options_.rpc_timeout,
      [&](grpc::ClientContext* c) {
        return stub_->ReportCheckpoint(c, request, &response);
      },
      &transport);
  if (!status.ok() &&
      status.error_code() != grpc::StatusCode::FAILED_PRECONDITION) {
    Log()->warn("reporting checkpoint {}: {}", checkpoint_clock,
                status.error_message());
  }
}

absl::Status SchedulerClient::lost_status() const {
  absl::MutexLock lock(&reach_mu_);
  return lost_status_;
}

absl::Status SchedulerClient::scheduler_gone() const {
  absl::MutexLock lock(&reach_mu_);
  return gone_status_;
}

grpc::Status SchedulerClient::EndedStatus() const {
  if (lost_.load()) return ToGrpcStatus(lost_status());
  if (gone_.load()) return ToGrpcStatus(scheduler_gone());
  return grpc::Status::OK;
}

void SchedulerClient::NoteReached() {
  absl::MutexLock lock(&reach_mu_);
  if (gone_.load()) return;  // for good
  const SteadyClock::time_point now = SteadyClock::now();
  if (unreachable_) {
    unreachable_ = false;
    Log()->info("scheduler reachable again after {:.1f} s",
                Seconds(now - last_ack_));
  }
  last_ack_ = now;
}

void SchedulerClient::NoteUnreachable(const grpc::Status& status) {
  absl::Status gone;
  {
    absl::MutexLock lock(&reach_mu_);
    if (gone_.load()) return;
    const SteadyClock::time_point now = SteadyClock::now();
    last_error_ = status.error_message().empty()
                      ? absl::StrCat("gRPC status ", status.error_code())
                      : status.error_message();
    const double silent = Seconds(now - last_ack_);
    if (!unreachable_) {
      unreachable_ = true;
      unreachable_since_ = now;
      last_warning_ = now;
      Log()->warn(
          "scheduler at {} unreachable ({}); retrying for up to {} ({})",
          options_.address, last_error_,
          absl::FormatDuration(options_.unreachable_timeout),
          kUnreachableField);
    } else if (now - last_warning_ >= absl::ToChronoNanoseconds(kWarnEvery)) {
      last_warning_ = now;
      Log()->warn("scheduler at {} unreachable for {:.1f} s: {}",
                  options_.address, silent, last_error_);
    }
    if (now - last_ack_ >
        absl::ToChronoNanoseconds(options_.unreachable_timeout)) {
      gone_status_ = WithReason(
          absl::UnavailableError(absl::StrFormat(
              "scheduler at %s unreachable for %.1f s (%s %d): %s",
              options_.address, silent, kUnreachableField,
              absl::ToInt64Milliseconds(options_.unreachable_timeout),
              last_error_)),
          reason::kSchedulerUnreachable);
      gone_.store(true);
      gone = gone_status_;
    }
  }
  if (!gone.ok()) {
    CancelCalls();
    if (options_.on_scheduler_gone) options_.on_scheduler_gone(gone);
  }
}

void SchedulerClient::MarkLost(const std::string& why) {
  absl::Status lost;
  {
    absl::MutexLock lock(&reach_mu_);
    if (lost_.load()) return;
    lost_status_ = DroppedError(why);
    lost_.store(true);
    lost = lost_status_;
  }
  Log()->error("{}", lost.message());
  CancelCalls();
  if (options_.on_lost) options_.on_lost();
}

void SchedulerClient::CancelCalls() {
  absl::MutexLock lock(&calls_mu_);
  ended_ = true;
  for (grpc::ClientContext* c : calls_) c->TryCancel();
}

grpc::Status SchedulerClient::Attempt(
    absl::Duration timeout,
    const std::function<grpc::Status(grpc::ClientContext*)>& rpc,
    bool* transport) {
  *transport = false;
  // Taken before the context's own, so "past it" below is never early.
  const absl::Time deadline = absl::Now() + timeout;
  auto context = Context(timeout);
  {
    absl::MutexLock lock(&calls_mu_);
    if (!ended_) calls_.insert(context.get());
  }
  if (grpc::Status ended = EndedStatus(); !ended.ok()) {
    absl::MutexLock lock(&calls_mu_);
    calls_.erase(context.get());
    return ended;
  }
  grpc::Status status = rpc(context.get());
  {
    absl::MutexLock lock(&calls_mu_);
    calls_.erase(context.get());
  }
  if (status.ok()) {
    NoteReached();
    return status;
  }
  if (grpc::Status ended = EndedStatus(); !ended.ok()) return ended;
  // UNAVAILABLE: no connection, or the scheduler shutting down (maybe to
  // restart); CANCELLED (not by this client): the scheduler shut down with
  // the call pending. DEADLINE_EXCEEDED once the deadline passed: no
  // connection or no answer in time (a partition). A DEADLINE_EXCEEDED
  // before it is the scheduler's own answer (a barrier's wait ended).
  const bool failed =
      status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::CANCELLED ||
      (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
       absl::Now() >= deadline - absl::Milliseconds(1));
  if (!failed) {
    NoteReached();
    return status;
  }
  *transport = true;
  NoteUnreachable(status);
  if (grpc::Status ended = EndedStatus(); !ended.ok()) {
    *transport = false;
    return ended;
  }
  // One code for "the scheduler did not answer", whatever the transport
  // said, so callers never take it for the scheduler's own answer.
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      absl::StrCat("scheduler at ", options_.address,
                                   " unreachable: ", status.error_message()));
}

bool SchedulerClient::Backoff(absl::Duration* delay, absl::Time give_up) {
  const absl::Duration left = give_up - absl::Now();
  if (left <= absl::ZeroDuration()) return false;
  const absl::Duration sleep = std::min(*delay, left);
  *delay = std::min(*delay * 2, kMaxBackoff);
  absl::MutexLock lock(&calls_mu_);
  calls_mu_.AwaitWithTimeout(absl::Condition(&ended_), sleep);
  return !ended_ && absl::Now() < give_up;
}

grpc::Status SchedulerClient::CallWithRetry(
    absl::Duration timeout, absl::Time give_up,
    const std::function<grpc::Status(grpc::ClientContext*)>& rpc) {
  absl::Duration delay = kFirstBackoff;
  while (true) {
    bool transport = false;
    grpc::Status status = Attempt(
        std::min(timeout, std::max(give_up - absl::Now(), kFirstBackoff)), rpc,
        &transport);
    if (!transport) return status;
    if (!Backoff(&delay, give_up)) {
      grpc::Status ended = EndedStatus();
      return ended.ok() ? status : ended;
    }
  }
}

absl::StatusOr<ClaimShardResponse> SchedulerClient::ClaimShard(
    const DataPosition* finished, absl::Duration timeout) {
  ClaimShardRequest request;
  request.set_node_id(node_id_);
  if (finished != nullptr) *request.mutable_finished() = *finished;
  if (finished != nullptr) {
    absl::MutexLock lock(&progress_mu_);
    has_position_ = false;  // it trains no shard until it gets one
  }
  const absl::Time give_up = absl::Now() + timeout;
  absl::Duration delay = kFirstBackoff;
  ClaimShardResponse response;
  while (true) {
    const absl::Duration left =
        std::max(absl::ZeroDuration(), give_up - absl::Now());
    request.set_timeout_ms(static_cast<uint32_t>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(left), 0, 30000)));
    bool transport = false;
    grpc::Status status = Attempt(
        left + options_.rpc_timeout,
        [&](grpc::ClientContext* c) {
          return stub_->ClaimShard(c, request, &response);
        },
        &transport);
    if (status.ok()) return response;
    // A retry repeats `finished`: the scheduler answers a worker that
    // still holds an assignment with that one again.
    if (transport && Backoff(&delay, give_up)) continue;
    grpc::Status ended = EndedStatus();
    return Annotate(FromGrpcStatus(ended.ok() ? status : ended),
                    "claim a shard");
  }
}

namespace {

// A ring call's wait at the scheduler, in whole ms (it caps them at 30 s).
uint32_t RingWaitMs(absl::Duration wait) {
  return static_cast<uint32_t>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(wait), 0, 30000));
}

}  // namespace

grpc::Status SchedulerClient::CallHeld(
    int64_t held_ms,
    const std::function<grpc::Status(grpc::ClientContext*)>& rpc) {
  const absl::Duration attempt =
      absl::Milliseconds(held_ms) + options_.rpc_timeout;
  return CallWithRetry(attempt, absl::Now() + attempt, rpc);
}

absl::StatusOr<JoinRingResponse> SchedulerClient::JoinRing(
    absl::Duration wait, uint32_t min_members, uint64_t after_generation) {
  JoinRingRequest request;
  request.set_node_id(node_id_);
  request.set_min_members(min_members);
  request.set_after_generation(after_generation);
  request.set_timeout_ms(RingWaitMs(wait));
  JoinRingResponse response;
  // Asking again is harmless: the scheduler keeps one request per node.
  grpc::Status status =
      CallHeld(request.timeout_ms(), [&](grpc::ClientContext* c) {
        return stub_->JoinRing(c, request, &response);
      });
  if (!status.ok()) {
    return Annotate(FromGrpcStatus(status), "join the dense all-reduce ring");
  }
  return response;
}

absl::Status SchedulerClient::LeaveRing() {
  LeaveRingRequest request;
  request.set_node_id(node_id_);
  LeaveRingResponse response;
  grpc::Status status =
      CallWithRetry(options_.rpc_timeout, absl::Now() + options_.rpc_timeout,
                    [&](grpc::ClientContext* c) {
                      return stub_->LeaveRing(c, request, &response);
                    });
  return Annotate(FromGrpcStatus(status), "leave the dense all-reduce ring");
}

absl::StatusOr<bool> SchedulerClient::WatchRing(uint64_t generation,
                                                absl::Duration wait) {
  WatchRingRequest request;
  request.set_node_id(node_id_);
  request.set_generation(generation);
  request.set_timeout_ms(RingWaitMs(wait));
  WatchRingResponse response;
  grpc::Status status =
      CallHeld(request.timeout_ms(), [&](grpc::ClientContext* c) {
        return stub_->WatchRing(c, request, &response);
      });
  if (!status.ok()) {
    return Annotate(FromGrpcStatus(status), "watch the dense all-reduce ring");
  }
  return response.rejoin();
}

absl::StatusOr<RingStoreResponse> SchedulerClient::RingStore(
    RingStoreRequest request, absl::Duration wait) {
  request.set_node_id(node_id_);
  request.set_timeout_ms(RingWaitMs(wait));
  RingStoreResponse response;
  grpc::Status status =
      CallHeld(request.timeout_ms(), [&](grpc::ClientContext* c) {
        return stub_->RingStore(c, request, &response);
      });
  if (!status.ok()) {
    return Annotate(FromGrpcStatus(status), "the dense ring's rendezvous");
  }
  return response;
}

absl::Status SchedulerClient::ReportCheckpoint(
    ReportCheckpointRequest request) {
  request.set_node_id(node_id_);
  ReportCheckpointResponse response;
  const grpc::Status status =
      CallWithRetry(options_.rpc_timeout, absl::Now() + options_.rpc_timeout,
                    [&](grpc::ClientContext* c) {
                      return stub_->ReportCheckpoint(c, request, &response);
                    });
  return Annotate(FromGrpcStatus(status),
                  absl::StrCat("report checkpoint ", request.clock()));
}

absl::Status SchedulerClient::ReportMove(ReportMoveRequest request) {
  request.set_node_id(node_id_);
  ReportMoveResponse response;
  const grpc::Status status =
      CallWithRetry(options_.rpc_timeout, absl::Now() + options_.rpc_timeout,
                    [&](grpc::ClientContext* c) {
                      return stub_->ReportMove(c, request, &response);
                    });
  return Annotate(
      FromGrpcStatus(status),
      absl::StrCat("report move ", request.source(), "->", request.target(),
                   " ", ReportMoveRequest::Stage_Name(request.stage()),
                   " (epoch ", request.epoch(), ")"));
}

absl::StatusOr<GetStatusResponse> SchedulerClient::GetStatus() {
  GetStatusRequest request;
  GetStatusResponse response;
  const grpc::Status status =
      CallWithRetry(options_.rpc_timeout, absl::Now() + options_.rpc_timeout,
                    [&](grpc::ClientContext* c) {
                      return stub_->GetStatus(c, request, &response);
                    });
  if (!status.ok()) return Annotate(FromGrpcStatus(status), "status");
  return response;
}

void SchedulerClient::AddTrained(uint64_t examples, double loss_sum,
                                 uint64_t loss_examples, absl::Duration wait) {
  absl::MutexLock lock(&progress_mu_);
  has_training_ = true;
  training_.set_examples(training_.examples() + examples);
  training_.set_steps(training_.steps() + 1);
  if (std::isfinite(loss_sum)) {
    training_.set_loss_sum(training_.loss_sum() + loss_sum);
    training_.set_loss_examples(training_.loss_examples() + loss_examples);
  }
  training_.set_wait_seconds(training_.wait_seconds() +
                             absl::ToDoubleSeconds(wait));
}

void SchedulerClient::SetShardBatches(uint64_t batches) {
  absl::MutexLock lock(&progress_mu_);
  has_training_ = true;
  training_.set_shard_batches(batches);
}

absl::Status SchedulerClient::ReportMetric(absl::string_view name, double value,
                                           uint64_t step) {
  if (!ValidMetricName(std::string_view(name.data(), name.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric name \"", absl::CHexEscape(name.substr(0, 80)),
                     "\" must be 1 to 64 characters of [A-Za-z0-9_./-]"));
  }
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric ", name, ": value ", value, " is not finite"));
  }
  absl::MutexLock lock(&progress_mu_);
  MetricPoint* point = nullptr;
  for (MetricPoint& m : *training_.mutable_metrics()) {
    if (m.name() == name) point = &m;
  }
  if (point == nullptr) {
    if (training_.metrics_size() >= kMaxMetricsPerWorker) {
      return absl::ResourceExhaustedError(
          absl::StrCat("metric ", name, ": a worker reports at most ",
                       kMaxMetricsPerWorker, " distinct metrics"));
    }
    point = training_.add_metrics();
    point->set_name(std::string(name));
  }
  has_training_ = true;
  point->set_value(value);
  point->set_step(step);
  point->set_seq(point->seq() + 1);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SchedulerClient::RequestCheckpoint(
    uint64_t after_clock) {
  CheckpointRequest request;
  request.set_after_clock(after_clock);
  CheckpointResponse response;
  const grpc::Status status =
      CallWithRetry(options_.rpc_timeout, absl::Now() + options_.rpc_timeout,
                    [&](grpc::ClientContext* c) {
                      return stub_->Checkpoint(c, request, &response);
                    });
  if (!status.ok()) return Annotate(FromGrpcStatus(status), "checkpoint");
  return response.clock();
}

void SchedulerClient::HeartbeatLoop() {
  // A heartbeat lost in a partition must not stall the loop past the point
  // where the scheduler would declare this node dead anyway.
  const absl::Duration rpc_deadline =
      std::min(options_.rpc_timeout, options_.heartbeat_timeout);
  absl::Duration wait = options_.heartbeat_interval;
  while (!stop_.WaitForNotificationWithTimeout(wait)) {
    wait = options_.heartbeat_interval;
    // Dropped or given up: nothing more to tell the scheduler.
    if (lost_.load() || gone_.load()) continue;
    HeartbeatRequest request;
    request.set_node_id(node_id_);
    request.set_known_epoch(view().epoch());
    request.set_clock(clock_.load());
    {
      absl::MutexLock lock(&progress_mu_);
      if (has_position_) *request.mutable_position() = position_;
      if (has_training_) *request.mutable_training() = training_;
    }
    if (options_.fill_heartbeat) options_.fill_heartbeat(&request);
    HeartbeatResponse response;
    // Before sending: the scheduler's deadline for this node starts later.
    const SteadyClock::time_point sent = SteadyClock::now();
    auto context = Context(rpc_deadline);
    grpc::Status status = stub_->Heartbeat(context.get(), request, &response);
    if (!status.ok()) {
      if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
        NoteReached();
        MarkLost(status.error_message());
        continue;
      }
      NoteUnreachable(status);
      // Try again no later than when the scheduler counts as gone, so
      // giving up is not late by a heartbeat interval.
      absl::MutexLock lock(&reach_mu_);
      const auto until_gone =
          last_ack_ + absl::ToChronoNanoseconds(options_.unreachable_timeout) -
          SteadyClock::now();
      wait = std::clamp(absl::FromChrono(until_gone) + absl::Milliseconds(1),
                        absl::Milliseconds(1), options_.heartbeat_interval);
      continue;
    }
    NoteReached();
    if (options_.on_lease) {
      options_.on_lease(
          sent + absl::ToChronoNanoseconds(options_.heartbeat_timeout * 3 / 4));
    }
    {
      // Not from an answer older than the view held: a heartbeat answered
      // before the job started running must not undo the view that says
      // it runs.
      absl::MutexLock lock(&mu_);
      if (response.epoch() >= view_.epoch()) job_state_ = response.job_state();
    }
    if (response.drain() && !drain_.exchange(true)) {
      Log()->info("the scheduler is draining this node: leaving as on SIGTERM");
      if (options_.on_drain) options_.on_drain();
    }
    if (response.epoch() > request.known_epoch()) {
      GetClusterViewRequest get;
      AskAsThisNode(&get);
      ClusterView fresh;
      auto ctx = Context(rpc_deadline);
      if (stub_->GetClusterView(ctx.get(), get, &fresh).ok())
        InstallView(fresh);
    }
  }
}

void SchedulerClient::WatchLoop() {
  // Stopping cancels the poll in flight, so polls can be long.
  constexpr absl::Duration kPoll = absl::Seconds(5);
  absl::Duration backoff = kFirstBackoff;
  bool want_whole_view = false;
  while (true) {
    GetClusterViewRequest request;
    const uint64_t held = view().epoch();
    request.set_min_epoch(held + 1);
    // A delta against the view held (the nodes that changed), unless the
    // last one could not be applied.
    if (!want_whole_view) request.set_known_epoch(held);
    AskAsThisNode(&request);
    request.set_timeout_ms(absl::ToInt64Milliseconds(kPoll));
    ClusterView fresh;
    auto context = Context(kPoll + options_.rpc_timeout);
    // Waits for the connection while the scheduler is away: a call waiting
    // for it is what notices the channel connecting again at once (a
    // reconnection seen by fail-fast calls alone is left to gRPC's backup
    // poller, up to 5 s later, and a restarted scheduler would wait that
    // long for this node's heartbeats).
    context->set_wait_for_ready(true);
    {
      // Checked under the lock StopHeartbeats() takes after notifying, so
      // either it sees this context and cancels it, or this sees the stop.
      absl::MutexLock lock(&watch_mu_);
      if (stop_.HasBeenNotified()) break;
      watch_context_ = context.get();
    }
    const grpc::Status status =
        stub_->GetClusterView(context.get(), request, &fresh);
    {
      absl::MutexLock lock(&watch_mu_);
      watch_context_ = nullptr;
    }
    if (status.ok()) {
      want_whole_view = !InstallView(fresh);
      backoff = kFirstBackoff;
    } else {
      // Scheduler unreachable (the heartbeat thread reports it) or
      // restarting: try again soon, then less often.
      stop_.WaitForNotificationWithTimeout(backoff);
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }
}

absl::StatusOr<ClusterView> SchedulerClient::WaitForRunning(
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration delay = kFirstBackoff;
  grpc::Status failed = grpc::Status::OK;
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    GetClusterViewRequest request;
    AskAsThisNode(&request);
    request.set_wait_for_running(true);
    request.set_timeout_ms(static_cast<uint32_t>(
        absl::ToInt64Milliseconds(std::min(left, absl::Seconds(10)))));
    ClusterView view;
    bool transport = false;
    grpc::Status status = Attempt(
        std::min(left, absl::Seconds(10)) + options_.rpc_timeout,
        [&](grpc::ClientContext* c) {
          return stub_->GetClusterView(c, request, &view);
        },
        &transport);
    if (!status.ok()) {
      if (transport) {
        failed = status;
        if (Backoff(&delay, deadline)) continue;
        if (grpc::Status ended = EndedStatus(); !ended.ok()) status = ended;
      }
      return Annotate(FromGrpcStatus(status), "waiting for the cluster");
    }
    failed = grpc::Status::OK;
    delay = kFirstBackoff;
    InstallView(view);
    if (view.job_state() != STARTING) return view;
    Log()->info("waiting for servers to register (epoch {})", view.epoch());
  }
  if (!failed.ok())
    return Annotate(FromGrpcStatus(failed), "waiting for the cluster");
  return absl::DeadlineExceededError(
      "the cluster did not start in time: not every server registered");
}

absl::Status SchedulerClient::Barrier(const std::string& name,
                                      absl::Duration timeout,
                                      std::vector<uint32_t>* ranks) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration delay = kFirstBackoff;
  while (true) {
    const absl::Duration chunk =
        std::max(absl::ZeroDuration(),
                 std::min(deadline - absl::Now(), absl::Seconds(10)));
    BarrierRequest request;
    request.set_node_id(node_id_);
    request.set_name(name);
    request.set_timeout_ms(static_cast<uint32_t>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(chunk))));
    request.set_rank_runs(true);
    BarrierResponse response;
    bool transport = false;
    grpc::Status status = Attempt(
        chunk + options_.rpc_timeout,
        [&](grpc::ClientContext* c) {
          return stub_->Barrier(c, request, &response);
        },
        &transport);
    if (status.ok()) {
      if (ranks == nullptr) return absl::OkStatus();
      if (response.rank_runs().empty()) {
        // A scheduler that answers the list itself (or nobody arrived).
        ranks->assign(response.ranks().begin(), response.ranks().end());
        return absl::OkStatus();
      }
      // No job has more workers than a rank can number; the bound keeps a
      // malformed answer from making this process allocate without end.
      absl::StatusOr<std::vector<uint32_t>> expanded =
          FromRankRuns(response.rank_runs(), kMaxBarrierRanks);
      if (!expanded.ok()) {
        return absl::DataLossError(absl::StrCat(
            "barrier ", name,
            ": the scheduler's answer: ", expanded.status().message()));
      }
      *ranks = std::move(expanded).value();
      return absl::OkStatus();
    }
    if (transport) {
      // Arriving again is harmless (scheduler.proto), also at a restarted
      // scheduler.
      if (Backoff(&delay, deadline)) continue;
      if (grpc::Status ended = EndedStatus(); !ended.ok()) status = ended;
      return Annotate(FromGrpcStatus(status), absl::StrCat("barrier ", name));
    }
    delay = kFirstBackoff;
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

absl::Status SchedulerClient::Leave(bool finished,
                                    const DataPosition* position) {
  StopHeartbeats();
  // Dropped: the scheduler already counts this node gone (and gave its
  // shard to others from its last heartbeat's position).
  if (lost_.load()) return absl::OkStatus();
  LeaveRequest request;
  request.set_node_id(node_id_);
  request.set_finished(finished);
  if (position != nullptr) *request.mutable_position() = *position;
  {
    absl::MutexLock lock(&progress_mu_);
    if (has_training_) *request.mutable_training() = training_;
  }
  LeaveResponse response;
  absl::Duration delay = kFirstBackoff;
  bool retried = false;
  while (true) {
    bool transport = false;
    // Until the scheduler counts as gone (Attempt then answers so).
    grpc::Status status = Attempt(
        options_.rpc_timeout,
        [&](grpc::ClientContext* c) {
          return stub_->Leave(c, request, &response);
        },
        &transport);
    // An earlier attempt arrived, only its answer was lost.
    if (retried && status.error_code() == grpc::StatusCode::NOT_FOUND) {
      return absl::OkStatus();
    }
    if (transport && Backoff(&delay, absl::InfiniteFuture())) {
      retried = true;
      continue;
    }
    if (grpc::Status ended = EndedStatus(); !ended.ok()) status = ended;
    return Annotate(FromGrpcStatus(status), "leave");
  }
}

}  // namespace ps
