#include "worker/session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_security.h"
#include "common/logging.h"
#include "common/protocol.h"
#include "common/reasons.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "proto/scheduler.grpc.pb.h"

namespace ps {
namespace {

std::shared_ptr<spdlog::logger> Log() { return GetLogger("session"); }

// What every wait of a job the scheduler made FAILED ends with.
absl::Status FailedJobError(const ClusterView& view) {
  return JobFailedError(absl::StrCat(
      "the job failed: ", view.failure().empty()
                              ? "the scheduler says it cannot continue"
                              : view.failure()));
}

std::string Describe(const DataPosition& p) {
  return absl::StrCat("shard ", p.shard(), " epoch ", p.epoch(), " batch ",
                      p.batch(), p.done() ? " (done)" : "");
}

// The scheduler did not answer (it is away, restarting): worth asking
// again, unlike its own answers, a drop, or its being gone for good.
bool SchedulerAway(const absl::Status& s) {
  return (s.code() == absl::StatusCode::kUnavailable ||
          s.code() == absl::StatusCode::kDeadlineExceeded) &&
         !IsSchedulerGone(s);
}

}  // namespace

// An observer's link to the scheduler: no registration, just the cluster
// view, by long poll (GetClusterView needs no membership), forwarded to
// the data-plane client.
class WorkerSession::ViewWatcher {
 public:
  static absl::StatusOr<std::unique_ptr<ViewWatcher>> Connect(
      const JobConfig& config, const std::string& address) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
        MakeChannelCredentials(config.security().tls());
    if (!creds.ok()) return creds.status();
    std::unique_ptr<ViewWatcher> w(new ViewWatcher);
    w->stub_ = Scheduler::NewStub(grpc::CreateChannel(address, *creds));
    return w;
  }
  ~ViewWatcher() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (poll_ != nullptr) poll_->TryCancel();
    }
    if (thread_.joinable()) thread_.join();
  }

  // One long poll of at most `timeout` for a view newer than `min_epoch`
  // (and RUNNING or FINISHED when `running`).
  absl::StatusOr<ClusterView> Poll(uint64_t min_epoch, bool running,
                                   absl::Duration timeout) {
    GetClusterViewRequest request;
    request.set_min_epoch(min_epoch);
    request.set_wait_for_running(running);
    request.set_timeout_ms(static_cast<uint32_t>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(timeout), 0, 30000)));
    grpc::ClientContext context;
    // gRPC deadlines are wall-clock times, whatever clock the session uses.
    context.set_deadline(
        absl::ToChronoTime(absl::Now() + timeout + absl::Seconds(5)));
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::CancelledError("observer closing");
      poll_ = &context;
    }
    ClusterView view;
    const grpc::Status status = stub_->GetClusterView(&context, request, &view);
    {
      absl::MutexLock lock(&mu_);
      poll_ = nullptr;
    }
    if (!status.ok()) {
      return absl::Status(
          static_cast<absl::StatusCode>(status.error_code()),
          absl::StrCat("cluster view: ", status.error_message()));
    }
    return view;
  }

  // The scheduler's status, one attempt bounded by `timeout` (GetStatus
  // needs no membership either).
  absl::StatusOr<GetStatusResponse> Status(absl::Duration timeout) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    GetStatusResponse response;
    const grpc::Status status =
        stub_->GetStatus(&context, GetStatusRequest(), &response);
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("status: ", status.error_message()));
    }
    return response;
  }

  // Follows the view from `epoch` on, calling `install` with each newer one.
  void Follow(uint64_t epoch, std::function<void(const ClusterView&)> install) {
    thread_ =
        std::thread([this, epoch, install = std::move(install)]() mutable {
          while (true) {
            {
              absl::MutexLock lock(&mu_);
              if (stopping_) return;
            }
            absl::StatusOr<ClusterView> v =
                Poll(epoch + 1, false, absl::Seconds(5));
            if (v.ok()) {
              if (v->epoch() > epoch) {
                epoch = v->epoch();
                install(*v);
              }
              continue;
            }
            if (v.status().code() == absl::StatusCode::kCancelled) return;
            // The scheduler is away: try again shortly.
            absl::MutexLock lock(&mu_);
            mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                                 absl::Milliseconds(200));
          }
        });
  }

 private:
  ViewWatcher() = default;
  std::unique_ptr<Scheduler::Stub> stub_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* poll_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

WorkerSession::WorkerSession(Options options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<WorkerSession>> WorkerSession::Start(
    Options options) {
  std::unique_ptr<WorkerSession> session(new WorkerSession(std::move(options)));
  if (absl::Status s = session->Open(); !s.ok()) {
    // Registered but stopped (or failed) before the data-plane client
    // existed: hand the shard back where it was given, so the scheduler
    // never waits for a heartbeat timeout to give it to someone else.
    if (session->membership_ != nullptr && !session->left_) {
      const std::optional<DataPosition> at = session->initial_position();
      absl::Status left = session->Leave(false, at ? &*at : nullptr);
      if (!left.ok()) Log()->warn("{}", left.message());
    }
    return s;
  }
  return session;
}

absl::Status WorkerSession::OpenObserver() {
  const JobConfig& config = options_.config;
  PS_ASSIGN_OR_RETURN(watcher_,
                      ViewWatcher::Connect(config, options_.scheduler));
  const absl::Duration startup = StartupTimeout();
  const absl::Time deadline = options_.clock->Now() + startup;
  absl::StatusOr<ClusterView> view;
  while (true) {
    if (StopNow()) {
      return absl::CancelledError(
          "stop requested while waiting for the servers");
    }
    view = watcher_->Poll(0, /*running=*/true,
                          std::max(absl::Milliseconds(1),
                                   std::min(options_.stop_check,
                                            deadline - options_.clock->Now())));
    if (view.ok() && view->job_state() == FINISHED) {
      return JobFinishedError(absl::StrCat(
          "job \"", config.name(), "\" has finished: its servers are leaving"));
    }
    if (view.ok() && view->job_state() == RUNNING) break;
    if (options_.clock->Now() >= deadline) {
      return view.ok()
                 ? absl::DeadlineExceededError(absl::StrCat(
                       "the servers of the job did not all register within ",
                       absl::FormatDuration(startup)))
                 : view.status();
    }
    if (!view.ok() &&
        view.status().code() != absl::StatusCode::kDeadlineExceeded &&
        view.status().code() != absl::StatusCode::kUnavailable) {
      return view.status();
    }
    if (!view.ok()) absl::SleepFor(absl::Milliseconds(100));
  }
  KVClient::Options kv_options;
  kv_options.config = config;
  kv_options.instruments = options_.instruments;
  kv_options.curve = options_.curve;
  // Node 0, clock 0: the servers treat its requests as a tool's, which move
  // no clock, and answer its pulls with what they hold.
  PS_ASSIGN_OR_RETURN(kv_, KVClient::Create(std::move(kv_options), *view));
  Publish(kv_.get());
  watcher_->Follow(view->epoch(),
                   [published = published_](const ClusterView& v) {
                     absl::MutexLock lock(&published->mu);
                     if (published->client != nullptr)
                       published->client->UpdateView(v);
                   });
  Log()->info("observing job \"{}\" (epoch {})", config.name(), view->epoch());
  if (options_.on_client) options_.on_client(kv_.get());
  return absl::OkStatus();
}

absl::Duration WorkerSession::StartupTimeout() const {
  return options_.startup_timeout > absl::ZeroDuration()
             ? options_.startup_timeout
             : absl::Milliseconds(
                   options_.config.cluster().startup_timeout_ms());
}

void WorkerSession::Publish(KVClient* client) {
  absl::MutexLock lock(&published_->mu);
  published_->client = client;
  if (client != nullptr && !published_->ended.ok())
    client->Abort(published_->ended);
}

void WorkerSession::End(Published* published, absl::Status why) {
  absl::MutexLock lock(&published->mu);
  if (!published->ended.ok()) return;
  published->ended = why;
  if (published->client != nullptr) published->client->Abort(std::move(why));
}

absl::Status WorkerSession::ended() const {
  if (membership_ == nullptr) return absl::OkStatus();
  if (membership_->lost()) return membership_->lost_status();
  PS_RETURN_IF_ERROR(membership_->scheduler_gone());
  absl::MutexLock lock(&published_->mu);
  if (IsJobFailed(published_->ended)) return published_->ended;
  return absl::OkStatus();
}

absl::Status WorkerSession::NotForObservers(absl::string_view what) const {
  if (!options_.observer) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what,
      ": this session is an observer (it has no worker rank and no clock; it "
      "only reads)"));
}

absl::Status WorkerSession::Open() {
  if (options_.observer) return OpenObserver();
  const JobConfig& config = options_.config;
  auto sched =
      SchedulerClient::Options::ForJob(config, options_.scheduler, WORKER);
  sched.trains_shards = options_.trains_shards;
  sched.on_drain = [this] { stop_.store(true); };
  // Dropped: nothing this worker sends may count any more; every request
  // ends at once (the caller stops training and may join again).
  // `membership` is read under the lock only once Connect returned.
  sched.on_lost = [published = published_] {
    End(published.get(),
        DroppedError("this worker was declared dead (no heartbeat within "
                     "cluster.heartbeat_timeout_ms) or is unknown to the "
                     "scheduler; it must join again as a new worker"));
  };
  sched.on_scheduler_gone = [published = published_](const absl::Status& why) {
    End(published.get(), why);
  };
  sched.on_view = [published = published_](const ClusterView& view, uint32_t) {
    // The job cannot continue: every wait and request ends at once, as
    // for a drop, and nothing more is sent.
    if (view.job_state() == FAILED) {
      End(published.get(), FailedJobError(view));
      return;
    }
    absl::MutexLock lock(&published->mu);
    if (published->client != nullptr) published->client->UpdateView(view);
  };
  auto membership = SchedulerClient::Connect(std::move(sched));
  if (!membership.ok()) return membership.status();
  membership_ = *std::move(membership);
  if (options_.on_membership) options_.on_membership(membership_.get());
  SetLogTag(absl::StrCat("worker/", rank()));
  Log()->info(
      "registered as worker {} of {}{}", rank(), num_workers(),
      membership_->has_initial_shard()
          ? absl::StrCat(", to train ", Describe(membership_->initial_shard()))
          : std::string(", with no shard of its own"));

  const absl::Duration startup = StartupTimeout();
  const absl::Time deadline = options_.clock->Now() + startup;
  absl::StatusOr<ClusterView> view;
  while (true) {
    if (StopNow()) {
      return absl::CancelledError(
          "stop requested while waiting for the servers");
    }
    if (absl::Status e = ended(); !e.ok()) return e;
    view = membership_->WaitForRunning(std::max(
        absl::ZeroDuration(),
        std::min(options_.stop_check, deadline - options_.clock->Now())));
    if (view.ok() || !SchedulerAway(view.status()) ||
        options_.clock->Now() >= deadline) {
      break;
    }
  }
  if (!view.ok()) return view.status();
  if (view->job_state() == FAILED) return FailedJobError(*view);

  KVClient::Options kv_options;
  kv_options.config = config;
  kv_options.rank = rank();
  kv_options.node_id = node_id();
  kv_options.start_clock = start_clock();
  kv_options.instruments = options_.instruments;
  kv_options.curve = options_.curve;
  auto kv = KVClient::Create(std::move(kv_options), *view);
  if (!kv.ok()) return kv.status();
  kv_ = *std::move(kv);
  Publish(kv_.get());
  // A view that arrived between WaitForRunning and publishing.
  kv_->UpdateView(membership_->view());
  if (options_.on_client) options_.on_client(kv_.get());
  return absl::OkStatus();
}

WorkerSession::~WorkerSession() {
  if (membership_ != nullptr && !left_) {
    absl::Status s = Leave(false);
    // After a drop or with the scheduler gone the caller has said why.
    if (!s.ok() && ended().ok()) Log()->warn("{}", s.message());
  }
  if (kv_ != nullptr) {
    if (options_.on_client) options_.on_client(nullptr);
    Publish(nullptr);
  }
  watcher_.reset();
  kv_.reset();
  if (membership_ != nullptr && options_.on_membership)
    options_.on_membership(nullptr);
  membership_.reset();
}

std::optional<DataPosition> WorkerSession::initial_position() const {
  if (membership_ == nullptr || !membership_->has_initial_shard())
    return std::nullopt;
  return membership_->initial_shard();
}

absl::StatusOr<const TableConfig*> WorkerSession::FindTable(
    absl::string_view name) const {
  std::vector<std::string> names;
  for (const TableConfig& t : options_.config.tables()) {
    if (t.name() == name) return &t;
    names.push_back(t.name());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no table \"", name, "\" in job \"", options_.config.name(),
                   "\" (its tables: ", absl::StrJoin(names, ", "), ")"));
}

bool WorkerSession::StopNow() const {
  if (stop_.load()) return true;
  return options_.should_stop && options_.should_stop();
}

bool WorkerSession::stop_requested() const {
  return StopNow() ||
         (membership_ != nullptr && membership_->drain_requested());
}

Completion WorkerSession::EndStep(std::optional<DataPosition> next) {
  if (absl::Status s = NotForObservers("end a step"); !s.ok()) {
    return Completion::Failed(std::move(s));
  }
  SchedulerClient* membership = membership_.get();
  const uint64_t clock = kv_->clock() + 1;
  DoneCallback on_ack;
  if (next) {
    on_ack = [membership, clock, pos = *next](const absl::Status& s) {
      if (s.ok()) membership->set_progress(clock, pos);
    };
  } else {
    on_ack = [membership, clock](const absl::Status& s) {
      if (s.ok()) membership->set_clock(clock);
    };
  }
  return kv_->AdvanceClock(std::move(on_ack));
}

void WorkerSession::ReportProgress(uint64_t clock, const DataPosition& next) {
  if (membership_ != nullptr) membership_->set_progress(clock, next);
}

absl::Status WorkerSession::Barrier(absl::string_view name,
                                    absl::Duration timeout,
                                    std::vector<uint32_t>* ranks) {
  PS_RETURN_IF_ERROR(NotForObservers("a barrier"));
  // First make sure every live server's view lists this worker: a server
  // answers a worker it does not know yet UNAVAILABLE and the client tries
  // again, so this returns once every server counts it. After the barrier,
  // every server then counts every worker that arrived: no BSP step is
  // applied without one that is still reaching the servers' views.
  if (absl::Status known = kv_->AdvanceClockTo(kv_->clock()).Wait();
      !known.ok()) {
    return known;
  }
  constexpr absl::Duration kLogEvery = absl::Seconds(10);
  const std::string barrier(name);
  const absl::Time deadline = options_.clock->Now() + timeout;
  absl::Time next_log = options_.clock->Now() + kLogEvery;
  while (true) {
    if (absl::Status e = ended(); !e.ok())
      return Annotate(e, absl::StrCat("barrier ", barrier));
    if (StopNow()) {
      return absl::CancelledError(
          absl::StrCat("barrier ", barrier, ": stop requested"));
    }
    const absl::Duration round = std::max(
        absl::ZeroDuration(),
        std::min(options_.stop_check, deadline - options_.clock->Now()));
    absl::Status s = membership_->Barrier(barrier, round, ranks);
    // Arriving again is harmless (scheduler.proto), also at a scheduler
    // that restarted meanwhile.
    if (!SchedulerAway(s) || options_.clock->Now() >= deadline) return s;
    if (options_.clock->Now() >= next_log) {
      Log()->info("{}", s.message());  // the missing ranks
      next_log = options_.clock->Now() + kLogEvery;
    }
  }
}

absl::StatusOr<ClaimShardResponse> WorkerSession::Claim(
    const DataPosition* finished) {
  PS_RETURN_IF_ERROR(NotForObservers("claim a shard"));
  if (kv_->clock() != kFinishedClock) {
    if (absl::Status s = kv_->AdvanceClockTo(kFinishedClock).Wait(); !s.ok())
      return s;
  }
  if (absl::Status e = ended(); !e.ok()) return Annotate(e, "claim");
  if (StopNow()) return absl::CancelledError("claim: stop requested");
  while (true) {
    absl::StatusOr<ClaimShardResponse> r =
        membership_->ClaimShard(finished, options_.stop_check);
    // Scheduler away for a whole round: ask again (with `finished` again:
    // the scheduler answers a repeated claim with what it assigned), unless
    // stopping, which the caller learns from stop_requested().
    if (r.ok() || !SchedulerAway(r.status()) || StopNow()) return r;
  }
}

ShardCursor* WorkerSession::shards() {
  if (shards_ != nullptr) return shards_.get();
  ShardCursor::Job job;
  // No deadline of its own: a start barrier waits for the slowest worker
  // to join, and a stop ends it.
  job.barrier = [this](absl::string_view name) {
    return Barrier(name, absl::InfiniteDuration());
  };
  job.claim = [this](const DataPosition* finished) { return Claim(finished); };
  job.restart = [this](uint64_t clock) { return Restart(clock); };
  job.stop = [this] { return stop_requested(); };
  job.ended = [this] { return ended(); };
  ShardCursor::Options options;
  options.num_shards = num_workers();
  options.start_clock = start_clock();
  options.restored_start = restored_start();
  options.initial = initial_position();
  options.clock = options_.clock;
  shards_ = std::make_unique<ShardCursor>(std::move(job), std::move(options));
  return shards_.get();
}

absl::Status WorkerSession::Restart(uint64_t clock) {
  PS_RETURN_IF_ERROR(NotForObservers("restart the clock"));
  return kv_->RestartClock(clock).Wait();
}

absl::StatusOr<bool> WorkerSession::Finish(absl::Duration wait) {
  PS_RETURN_IF_ERROR(NotForObservers("finish training"));
  if (kv_->clock() != kFinishedClock) {
    if (absl::Status s = kv_->AdvanceClockTo(kFinishedClock).Wait(); !s.ok())
      return s;
  }
  membership_->set_clock(kFinishedClock);
  std::vector<uint32_t> ranks;
  if (absl::Status s = Barrier("train_done", wait, &ranks); !s.ok()) return s;
  finished_ranks_ = ranks;
  // The lowest rank that arrived acts for the job (rank 0 may have died).
  // The others wait at "evaluated-K" until it is done; if it left first
  // (it is not among those arriving there), the lowest of them takes over
  // in round K + 1, so the job never ends without its evaluation.
  uint32_t evaluator = ranks.empty() ? rank() : ranks.front();
  for (evaluation_round_ = 0;; ++evaluation_round_) {
    if (rank() == evaluator) {
      Log()->info(
          "evaluator: rank {}, the lowest of ranks [{}] that finished training",
          rank(), absl::StrJoin(ranks, ","));
      evaluating_ = true;
      return true;
    }
    std::vector<uint32_t> arrived;
    if (absl::Status s = Barrier(absl::StrCat("evaluated-", evaluation_round_),
                                 wait, &arrived);
        !s.ok()) {
      return s;
    }
    if (arrived.empty() ||
        std::find(arrived.begin(), arrived.end(), evaluator) != arrived.end()) {
      return false;
    }
    Log()->warn(
        "the evaluator (rank {}) left before it was done; ranks [{}] remain",
        evaluator, absl::StrJoin(arrived, ","));
    ranks = arrived;
    evaluator = arrived.front();
  }
}

absl::Status WorkerSession::EvaluationDone() {
  if (!evaluating_) return absl::OkStatus();
  evaluating_ = false;
  // Arrive even when stopping: without it the others would evaluate again.
  return membership_->Barrier(absl::StrCat("evaluated-", evaluation_round_),
                              absl::Seconds(30));
}

absl::StatusOr<uint64_t> WorkerSession::RequestCheckpoint() {
  PS_RETURN_IF_ERROR(NotForObservers("request a checkpoint"));
  if (options_.config.checkpoint().dir().empty()) {
    return absl::FailedPreconditionError(
        "this job takes no checkpoints: its config sets no checkpoint.dir");
  }
  // After this worker's own clock: the heartbeats may not show it yet.
  const uint64_t clock = kv_->clock();
  return membership_->RequestCheckpoint(clock < kFinishedClock ? clock : 0);
}

std::string WorkerSession::DescribeSlowWorkers() {
  if (membership_ == nullptr || mode() == ASYNC ||
      mode() == CONSISTENCY_MODE_UNSPECIFIED) {
    return "";
  }
  absl::StatusOr<GetStatusResponse> status = membership_->GetStatus();
  if (!status.ok()) return "";
  const uint64_t mine = kv_->clock();
  // BSP answers a pull at clock c once everybody finished step c - 1; SSP
  // once the slowest is within the staleness bound.
  const uint64_t slack =
      mode() == SSP ? options_.config.consistency().staleness() : 0;
  std::vector<std::string> slow;
  for (const WorkerClock& w : status->clocks()) {
    if (w.rank() == rank() || w.clock() >= kFinishedClock) continue;
    if (w.clock() + slack < mine) {
      slow.push_back(absl::StrCat(w.rank(), " (clock ", w.clock(),
                                  ", last heard ", w.silent_ms(), " ms ago)"));
    }
  }
  if (slow.empty()) return "";
  return absl::StrCat("worker rank", slow.size() > 1 ? "s " : " ",
                      absl::StrJoin(slow, ", "));
}

absl::StatusOr<GetStatusResponse> WorkerSession::GetStatus() {
  if (membership_ != nullptr) return membership_->GetStatus();
  // An observer has no membership client: ask through its view's channel,
  // with the deadline of a member's status call.
  return watcher_->Status(SchedulerClient::Options().rpc_timeout);
}

uint64_t WorkerSession::last_checkpoint_clock() const {
  return membership_ ? membership_->view().last_checkpoint_clock() : 0;
}

bool WorkerSession::restored_start() const {
  if (membership_ == nullptr || start_clock() == 0) return false;
  const ClusterView view = membership_->view();
  return !view.restore().path().empty() &&
         view.restore().clock() == start_clock();
}

absl::Status WorkerSession::Leave(bool finished, const DataPosition* position) {
  if (left_) return absl::OkStatus();
  if (membership_ == nullptr) {  // an observer: nothing to leave
    left_ = true;
    return absl::OkStatus();
  }
  if (evaluating_) {
    if (absl::Status s = EvaluationDone(); !s.ok())
      Log()->warn("{}", s.message());
  }
  left_ = true;
  // A failed job has nothing to leave, and its scheduler exits a heartbeat
  // timeout after the failure: a Leave then would retry until
  // scheduler_unreachable_timeout_ms.
  if (IsJobFailed(ended())) return absl::OkStatus();
  // A dropped worker has nothing to leave (and must not say it left at a
  // position: the scheduler resumed its shard from its last heartbeat's).
  const bool dropped = lost();
  absl::Status s = membership_->Leave(finished, position);
  if (s.ok() && !finished && !dropped) {
    if (position != nullptr) {
      Log()->info("preempted: left at {}", Describe(*position));
    } else {
      Log()->info("left holding no shard");
    }
  }
  return s;
}

}  // namespace ps
