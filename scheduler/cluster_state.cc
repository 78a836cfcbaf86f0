#include "scheduler/cluster_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/protocol.h"
#include "common/reasons.h"
#include "scheduler/rank_runs.h"
#include "scheduler/scheduler_log.h"

namespace ps {
namespace {


const char* RoleName(Role r) { return r == SERVER ? "server" : "worker"; }

void LogNewBackups(const SlotMap::Assigned& assigned) {
  if (assigned.assigned > 0)
    SchedulerLog()->info("{} slots got a new backup", assigned.assigned);
  if (assigned.without > 0) {
    SchedulerLog()->warn(
        "{} slots have no backup: no other live server to hold one",
        assigned.without);
  }
}

}  // namespace

ClusterState::ClusterState(const JobConfig& config, Clock* clock,
                           CheckpointStore store)
    : config_(config),
      fingerprint_(ConfigFingerprint(config)),
      clock_(clock),
      store_(std::move(store)),
      shards_(config_.cluster().num_workers(), Reassign()),
      tracker_(config_.training(), config_.cluster().num_workers()),
      created_(clock->Now()) {
  view_.set_epoch(1);
  view_.set_job_state(STARTING);
  view_.set_num_slots(config_.cluster().num_slots());
  *view_.mutable_consistency() = config_.consistency();
  min_clock_since_ = clock_->Now();
}

uint32_t ClusterState::ExpectedCount(Role role) const {
  return role == SERVER ? config_.cluster().num_servers()
                        : config_.cluster().num_workers();
}

absl::Status ClusterState::ValidateRegister(
    const RegisterRequest& request) const {
  if (request.role() != SERVER && request.role() != WORKER) {
    return absl::InvalidArgumentError("role must be SERVER or WORKER");
  }
  if (request.role() == SERVER && request.data_endpoint().empty()) {
    return absl::InvalidArgumentError("a server must give its data_endpoint");
  }
  if (request.data_endpoint().size() > 1024 || request.host().size() > 1024) {
    return absl::InvalidArgumentError("data_endpoint or host is too long");
  }
  if (request.config_fingerprint() != fingerprint_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "config fingerprint ", request.config_fingerprint(),
        " differs from the scheduler's ", fingerprint_,
        ": every process of a job must load the same config file"));
  }
  return absl::OkStatus();
}

std::optional<CheckpointRef> ClusterState::ReplacementRestore(
    const RegisterRequest& request) const {
  if (request.role() != SERVER || !store_.latest || job_state() != RUNNING) {
    return std::nullopt;
  }
  auto latest = store_.latest();
  if (!latest.ok()) {
    SchedulerLog()->warn("replacement server: no checkpoint to restore ({})",
                         latest.status().message());
    return std::nullopt;
  }
  return *latest;
}

absl::StatusOr<uint32_t> ClusterState::FreeRankLocked(Role role) const {
  std::vector<bool> taken(role == SERVER ? MaxServers() : ExpectedCount(role),
                          false);
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() == role &&
        (node.info.state() == ALIVE || node.finished)) {
      taken[node.info.rank()] = true;
    }
  }
  // An elastic job's newcomer takes first a rank whose slots wait for a
  // replacement (no live copy), then the lowest free one.
  if (role == SERVER && Elastic() && view_.job_state() == RUNNING) {
    for (uint32_t owner : view_.slot_owner()) {
      if (owner < taken.size() && !taken[owner]) return owner;
    }
  }
  auto free_rank = std::find(taken.begin(), taken.end(), false);
  if (free_rank == taken.end()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("all ", taken.size(), " ", RoleName(role),
                     " ranks are held by live nodes or were finished"));
  }
  return static_cast<uint32_t>(free_rank - taken.begin());
}

NodeInfo ClusterState::AddNodeLocked(const RegisterRequest& request,
                                     uint32_t rank) {
  Node node;
  node.info.set_node_id(next_node_id_++);
  node.info.set_role(request.role());
  node.info.set_rank(rank);
  node.info.set_data_endpoint(request.data_endpoint());
  node.info.set_state(ALIVE);
  node.info.set_host(request.host());
  node.info.set_pid(request.pid());
  node.last_heartbeat = clock_->Now();
  node.trains_shards = request.trains_shards();
  if (request.role() == WORKER) {
    worker_ranks_ever_.insert(node.info.rank());
    // A worker joining a running job starts at the job's current clock, so
    // synchronous waits do not count it for steps it never took part in.
    const uint64_t start = JobClockLocked();
    node.info.set_start_clock(start);
    node.clock = start;
  }
  const NodeInfo info = node.info;
  nodes_[info.node_id()] = std::move(node);
  return info;
}

absl::StatusOr<RegisterResponse> ClusterState::Register(
    const RegisterRequest& request) {
  PS_RETURN_IF_ERROR(ValidateRegister(request));
  PendingRegistration me;
  me.request = &request;
  // A server joining a running job replaces a dead one: it restores its
  // slots from the newest valid checkpoint. Looked up before locking, as
  // verifying a checkpoint reads every byte of it.
  me.replacement_restore = ReplacementRestore(request);
  {
    absl::MutexLock queue(&register_mu_);
    register_queue_.push_back(&me);
  }
  // Whoever holds mu_ next registers everyone queued by then (one epoch and
  // one journal write for them all): a fleet registering at once costs a
  // few view changes, not one per node.
  {
    absl::MutexLock lock(&mu_);
    if (!me.done) {
      std::vector<PendingRegistration*> batch;
      {
        absl::MutexLock queue(&register_mu_);
        batch.swap(register_queue_);
      }
      RegisterBatchLocked(batch);
    }
  }
  // The whole view is copied into each answer outside the lock.
  if (me.result.ok() && me.whole_view != nullptr) {
    *me.result->mutable_view() = *me.whole_view;
  }
  return std::move(me.result);
}

void ClusterState::RegisterBatchLocked(
    const std::vector<PendingRegistration*>& batch) {
  JournalScope journal(this);
  const absl::Status admitted = journal.Admit();
  bool changed = false;
  for (PendingRegistration* p : batch) {
    p->done = true;
    p->result = admitted.ok()
                    ? RegisterOneLocked(*p->request, p->replacement_restore)
                    : absl::StatusOr<RegisterResponse>(admitted);
    changed |= p->result.ok();
  }
  if (!changed) return;
  BumpEpochLocked();
  const absl::Status committed = journal.Commit();
  std::shared_ptr<const ClusterView> whole;
  for (PendingRegistration* p : batch) {
    if (!p->result.ok()) continue;
    if (!committed.ok()) {
      p->result = committed;
    } else if (p->request->servers_only()) {
      *p->result->mutable_view() =
          ViewAgainstLocked({0, true, p->result->node_id()});
    } else {
      if (whole == nullptr) whole = std::make_shared<const ClusterView>(view_);
      p->whole_view = whole;
    }
  }
}

absl::StatusOr<RegisterResponse> ClusterState::RegisterOneLocked(
    const RegisterRequest& request,
    const std::optional<CheckpointRef>& replacement_restore) {
  if (view_.job_state() == FINISHED) {
    return JobFinishedError("the job has finished");
  }
  if (view_.job_state() == FAILED) {
    return JobFailedError(
        absl::StrCat("the job has failed: ", view_.failure()));
  }
  PS_ASSIGN_OR_RETURN(const uint32_t rank, FreeRankLocked(request.role()));
  const bool spare = request.role() == SERVER && IsSpareRankLocked(rank);
  const NodeInfo info = AddNodeLocked(request, rank);
  if (replacement_restore.has_value() && view_.job_state() == RUNNING &&
      !spare) {
    *view_.mutable_restore() = *replacement_restore;
  }
  RegisterResponse response;
  if (info.role() == WORKER) {
    // Its own shard if it is new or (REASSIGN) waits for a worker; else
    // any orphaned shard (REASSIGN); else none (it may claim one later).
    const uint32_t own = info.rank();
    if (shards_.Available(own)) {
      *response.mutable_shard() = shards_.Assign(own, info.node_id());
    } else if (int orphan = shards_.Orphan(); orphan >= 0) {
      *response.mutable_shard() = shards_.Assign(orphan, info.node_id());
    }
  }
  SchedulerLog()->info("{} rank {} registered{} (node {}, {} pid {}{}{})",
                       RoleName(info.role()), info.rank(),
                       spare ? " as a spare" : "", info.node_id(), info.host(),
                       info.pid(), info.data_endpoint().empty() ? "" : ", ",
                       info.data_endpoint());
  if (info.role() == SERVER && view_.job_state() == RUNNING && Replicated() &&
      !spare) {
    AdoptReplacementLocked(info.rank());
  }
  UpdateJobStateLocked();
  response.set_node_id(info.node_id());
  response.set_rank(info.rank());
  return response;
}

absl::StatusOr<HeartbeatResponse> ClusterState::Heartbeat(
    const HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(request.node_id());
  if (it == nodes_.end() || it->second.info.state() != ALIVE) {
    return absl::NotFoundError(
        absl::StrCat("node ", request.node_id(),
                     " is not a live member (unknown, left or declared dead); "
                     "register again"));
  }
  const absl::Time now = clock_->Now();
  Node& hb = it->second;
  hb.last_heartbeat = now;
  ++heartbeats_;
  // Clocks only grow, except that a worker that had finished (2^62) may
  // restart at the job's clock to take over a shard.
  if (hb.clock >= kFinishedClock && request.clock() < kFinishedClock &&
      request.clock() > 0) {
    hb.clock = request.clock();
  } else {
    hb.clock = std::max(hb.clock, request.clock());
  }
  if (hb.clock < kFinishedClock) {
    max_clock_ever_ = std::max(max_clock_ever_, hb.clock);
    hb.pace.Observe(hb.clock, now);
  }
  if (request.has_position())
    shards_.Report(request.node_id(), request.position());
  if (hb.info.role() == SERVER &&
      static_cast<uint32_t>(request.slot_bytes_size()) ==
          config_.cluster().num_slots()) {
    slot_bytes_[request.node_id()].assign(request.slot_bytes().begin(),
                                          request.slot_bytes().end());
  }
  if (hb.info.role() == SERVER && request.has_storage())
    storage_[request.node_id()] = request.storage();
  if (hb.info.role() == WORKER && request.has_training()) {
    tracker_.OnWorkerReport(request.node_id(), hb.info.rank(),
                            request.has_position()
                                ? static_cast<int>(request.position().shard())
                                : -1,
                            request.training(), now);
  }
  if (hb.info.role() == SERVER && request.has_serving())
    tracker_.OnServerReport(request.node_id(), hb.info.rank(),
                            request.serving());
  HeartbeatResponse response;
  response.set_epoch(view_.epoch());
  response.set_job_state(view_.job_state());
  response.set_drain(hb.info.draining());
  return response;
}

absl::Status ClusterState::Leave(const LeaveRequest& request) {
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  PS_RETURN_IF_ERROR(journal.Admit());
  auto it = nodes_.find(request.node_id());
  if (it == nodes_.end() || it->second.info.state() != ALIVE) {
    return absl::NotFoundError(
        absl::StrCat("node ", request.node_id(), " is not a live member"));
  }
  NodeInfo& info = it->second.info;
  info.set_state(LEFT);
  ++departures_;
  if (info.role() == WORKER && request.has_training()) {
    tracker_.OnWorkerReport(request.node_id(), info.rank(),
                            request.has_position()
                                ? static_cast<int>(request.position().shard())
                                : -1,
                            request.training(), clock_->Now());
  }
  tracker_.Forget(request.node_id());
  if (info.role() == WORKER && request.finished()) {
    some_worker_finished_ = true;
    it->second.finished = true;
  }
  if (info.role() == WORKER) {
    ReleaseShardLocked(request.node_id(), request.finished(),
                       request.has_position() ? &request.position() : nullptr);
  }
  // A server that wrote and reported its shard before leaving (a preempted
  // one does exactly that) leaves the checkpoint whole: it commits when the
  // others report, and is what the leaver's slots are restored from.
  if (info.role() == SERVER && checkpoint_.has_value() &&
      checkpoint_->reports.count(request.node_id()) == 0) {
    AbortCheckpointLocked(absl::StrCat("server ", info.rank(), " left"));
  }
  if (info.role() == SERVER && view_.job_state() == RUNNING && Replicated()) {
    FailServerLocked(info.rank());
  }
  if (info.role() == SERVER && view_.job_state() == RUNNING) {
    CancelMovesLocked(info.rank(),
                      absl::StrCat("server ", info.rank(), " left"));
  }
  SchedulerLog()->info("{} rank {} left{}", RoleName(info.role()), info.rank(),
                       request.finished() ? " (finished)" : "");
  UpdateJobStateLocked();
  BumpEpochLocked();
  return journal.Commit();
}

std::vector<uint64_t> ClusterState::ExpireSilentNodes() {
  const absl::Time now = clock_->Now();
  const absl::Time deadline =
      now - absl::Milliseconds(config_.cluster().heartbeat_timeout_ms());
  std::vector<uint64_t> dead;
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  const bool stalled = NoticeStallLocked(now);
  // Nobody is declared dead while the journal cannot record it.
  if (stalled || !journal.Admit().ok() || now < grace_until_) return dead;
  // Silent for longer than a healthy node ever is (about a heartbeat
  // interval), though maybe not yet past the timeout.
  const absl::Time quiet_since =
      now - absl::Milliseconds(config_.cluster().heartbeat_timeout_ms() +
                               config_.cluster().heartbeat_interval_ms()) /
                2;
  size_t live = 0, silent = 0;
  for (const auto& [id, node] : nodes_) {
    if (node.info.state() != ALIVE) continue;
    ++live;
    if (node.last_heartbeat < quiet_since) ++silent;
    if (node.last_heartbeat < deadline) dead.push_back(id);
  }
  if (HoldForIsolationLocked(now, dead.size(), silent, live)) return {};
  if (!dead.empty()) DeclareDeadLocked(dead, now);
  return dead;
}

void ClusterState::ExpectSweepsEvery(absl::Duration period) {
  const ClusterConfig& cl = config_.cluster();
  const absl::Duration margin = absl::Milliseconds(cl.heartbeat_timeout_ms() -
                                                   cl.heartbeat_interval_ms()) /
                                2;
  absl::MutexLock lock(&mu_);
  stall_gap_ = std::max(2 * period, margin);
}

void ClusterState::GrantGraceLocked(absl::Time now, absl::Duration extra) {
  grace_until_ = std::max(
      grace_until_,
      now + absl::Milliseconds(config_.cluster().heartbeat_timeout_ms()) +
          extra);
}

bool ClusterState::NoticeStallLocked(absl::Time now) {
  const absl::Duration gap = now - last_sweep_;
  last_sweep_ = now;
  if (gap <= stall_gap_ || gap == absl::InfiniteDuration()) return false;
  ++stalls_;
  GrantGraceLocked(now, absl::ZeroDuration());
  // No line but a death's says "declared dead": tools and tests count
  // deaths by it.
  SchedulerLog()->warn(
      "the failure detector did not run for {} (expected every {} at most): "
      "this scheduler was paused or starved; every node gets a fresh heartbeat "
      "timeout before any death is declared",
      absl::FormatDuration(absl::Trunc(gap, absl::Milliseconds(1))),
      absl::FormatDuration(stall_gap_));
  return true;
}

bool ClusterState::HoldForIsolationLocked(absl::Time now, size_t past_timeout,
                                          size_t silent, size_t live) {
  const absl::Duration hold =
      absl::Milliseconds(config_.cluster().isolation_hold_ms());
  const bool suspected = isolated_since_ != absl::InfiniteFuture();
  const bool mass = silent > 0 && 2 * silent > live;
  if (!suspected && past_timeout == 0) return false;
  if (suspected && !mass) {
    // Heartbeats are back from most nodes. The rest may be far behind: a
    // TCP connection that lost packets for a silence of D retransmits
    // with a backoff that doubles, so its next try may come up to about D
    // after the link is back. They get a fresh timeout plus that silence.
    const absl::Duration silence =
        now - isolated_since_ +
        absl::Milliseconds(config_.cluster().heartbeat_timeout_ms());
    SchedulerLog()->warn(
        "heartbeats are back ({} of {} live nodes still silent) after {} of "
        "suspected isolation: failure detection resumes, the silent ones "
        "get {} more",
        silent, live,
        absl::FormatDuration(
            absl::Trunc(now - isolated_since_, absl::Milliseconds(1))),
        absl::FormatDuration(absl::Trunc(
            silence +
                absl::Milliseconds(config_.cluster().heartbeat_timeout_ms()),
            absl::Milliseconds(1))));
    isolated_since_ = absl::InfiniteFuture();
    GrantGraceLocked(now, silence);
    return true;
  }
  if (!mass || hold <= absl::ZeroDuration()) return false;
  if (!suspected) {
    isolated_since_ = now;
    ++isolation_suspicions_;
    SchedulerLog()->warn(
        "{} of {} live nodes went silent within one heartbeat timeout: this "
        "scheduler is more likely cut off from them than they all died; no "
        "death is declared for up to {} (cluster.isolation_hold_ms) while "
        "heartbeats may come back",
        silent, live, absl::FormatDuration(hold));
    return true;
  }
  if (now - isolated_since_ < hold) return true;
  SchedulerLog()->warn(
      "{} of {} live nodes still silent after {} of suspected isolation "
      "(cluster.isolation_hold_ms): declaring them dead",
      silent, live,
      absl::FormatDuration(
          absl::Trunc(now - isolated_since_, absl::Milliseconds(1))));
  isolated_since_ = absl::InfiniteFuture();
  return false;
}

void ClusterState::DeclareDeadLocked(const std::vector<uint64_t>& dead,
                                     absl::Time now) {
  for (uint64_t id : dead) {
    Node& node = nodes_[id];
    node.info.set_state(DEAD);
    ++departures_;
    ++declared_dead_;
    tracker_.Forget(id);
    if (node.info.role() == WORKER) ReleaseShardLocked(id, false, nullptr);
    SchedulerLog()->warn(
        "{} rank {} (node {}) declared dead: no heartbeat for {}",
        RoleName(node.info.role()), node.info.rank(), id,
        absl::FormatDuration(now - node.last_heartbeat));
  }
  // Every death is recorded before any slot moves, so no slot is handed
  // to a server that died in the same sweep.
  if (view_.job_state() == RUNNING && Replicated()) {
    for (uint64_t id : dead) {
      if (nodes_[id].info.role() == SERVER) {
        FailServerLocked(nodes_[id].info.rank());
      }
    }
  }
  if (view_.job_state() == RUNNING) {
    for (uint64_t id : dead) {
      if (nodes_[id].info.role() == SERVER) {
        const uint32_t rank = nodes_[id].info.rank();
        CancelMovesLocked(rank, absl::StrCat("server ", rank, " died"));
      }
    }
  }
  if (checkpoint_.has_value()) {
    for (uint64_t id : dead) {
      if (nodes_[id].info.role() == SERVER) {
        AbortCheckpointLocked(
            absl::StrCat("server ", nodes_[id].info.rank(), " died"));
        break;
      }
    }
  }
  UpdateJobStateLocked();
  BumpEpochLocked();
}

void ClusterState::BumpEpochLocked() {
  journal_dirty_ = true;
  // What changes an epoch (a worker joining, leaving or dying; the job
  // failing) may release or end a barrier.
  CompleteBarriersLocked();
  if (view_.job_state() == FAILED) SignalBarriersLocked();
  WakeClaimsLocked();
  view_.set_epoch(view_.epoch() + 1);
  view_.clear_nodes();
  for (const auto& [id, node] : nodes_) *view_.add_nodes() = node.info;
  // Nodes change only here, so an epoch's list is fixed until the next.
  constexpr size_t kRecentEpochs = 8;
  recent_nodes_.push_back(
      {view_.epoch(),
       std::vector<NodeInfo>(view_.nodes().begin(), view_.nodes().end()),
       slots_version_});
  if (recent_nodes_.size() > kRecentEpochs) recent_nodes_.pop_front();
  changed_since_.clear();
  if (view_listener_) view_listener_();
}

void ClusterState::UpdateJobStateLocked() {
  if (view_.job_state() == STARTING) {
    // The ranks the job starts with (an elastic job's spares may register
    // early: they stay spares).
    uint32_t servers = 0;
    for (const auto& [id, node] : nodes_) {
      servers += node.info.role() == SERVER && node.info.state() == ALIVE &&
                 node.info.rank() < config_.cluster().num_servers();
    }
    if (servers == config_.cluster().num_servers()) {
      const uint32_t num_slots = config_.cluster().num_slots();
      const uint32_t num_servers = config_.cluster().num_servers();
      SetSlotsLocked(SlotMap::Initial(num_slots, num_servers, Replicated()));
      view_.set_job_state(RUNNING);
      SchedulerLog()->info("all {} servers registered; job running",
                           num_servers);
    }
  }
  if (view_.job_state() == RUNNING && some_worker_finished_ &&
      worker_ranks_ever_.size() >= config_.cluster().num_workers() &&
      shards_.AllDone()) {
    bool worker_alive = false;
    for (const auto& [id, node] : nodes_) {
      worker_alive |= node.info.role() == WORKER && node.info.state() == ALIVE;
    }
    if (!worker_alive) {
      view_.set_job_state(FINISHED);
      SchedulerLog()->info("every worker has left; job finished");
    }
  }
}

ClusterView ClusterState::AwaitView(uint64_t min_epoch, bool wait_for_running,
                                    absl::Duration timeout,
                                    uint64_t known_epoch) {
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || (view_.epoch() >= min_epoch &&
                       (!wait_for_running || view_.job_state() != STARTING));
  };
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&ready), std::min(timeout, kMaxWait));
  return ViewAgainstLocked({known_epoch, false, 0});
}

ClusterState::ViewHead ClusterState::Head() const {
  absl::MutexLock lock(&mu_);
  return {view_.epoch(), view_.job_state(), closed_};
}

std::vector<ClusterView> ClusterState::ViewsFor(
    const std::vector<ViewAsk>& asks) {
  std::vector<ClusterView> views;
  views.reserve(asks.size());
  // Asks for every node against the same epoch share one build.
  absl::flat_hash_map<uint64_t, size_t> first_whole;
  absl::MutexLock lock(&mu_);
  for (const ViewAsk& ask : asks) {
    if (!ask.servers_only) {
      auto [it, fresh] = first_whole.try_emplace(ask.known_epoch, views.size());
      if (!fresh) {
        views.push_back(views[it->second]);
        continue;
      }
    }
    views.push_back(ViewAgainstLocked(ask));
  }
  return views;
}

void ClusterState::SetViewListener(std::function<void()> listener) {
  absl::MutexLock lock(&mu_);
  view_listener_ = std::move(listener);
}

const ClusterState::RecentEpoch* ClusterState::RecentEpochLocked(
    uint64_t epoch) const {
  auto it = std::find_if(recent_nodes_.begin(), recent_nodes_.end(),
                         [&](const RecentEpoch& r) { return r.epoch == epoch; });
  return it == recent_nodes_.end() ? nullptr : &*it;
}

const std::vector<NodeInfo>* ClusterState::ChangedSinceLocked(
    uint64_t known_epoch) {
  auto changed = changed_since_.find(known_epoch);
  if (changed == changed_since_.end()) {
    const RecentEpoch* past = RecentEpochLocked(known_epoch);
    if (past == nullptr) return nullptr;
    absl::flat_hash_map<uint64_t, const NodeInfo*> before;
    for (const NodeInfo& n : past->nodes) before[n.node_id()] = &n;
    std::vector<NodeInfo> nodes;
    for (const NodeInfo& n : view_.nodes()) {
      auto it = before.find(n.node_id());
      if (it == before.end() ||
          it->second->SerializeAsString() != n.SerializeAsString()) {
        nodes.push_back(n);
      }
    }
    changed = changed_since_.emplace(known_epoch, std::move(nodes)).first;
  }
  return &changed->second;
}

ClusterView ClusterState::ViewAgainstLocked(const ViewAsk& ask) {
  const std::vector<NodeInfo>* changed =
      ask.known_epoch == 0 || ask.known_epoch >= view_.epoch()
          ? nullptr
          : ChangedSinceLocked(ask.known_epoch);
  if (changed == nullptr && !ask.servers_only) return view_;
  // The view without its node list (swapped out and back, not copied),
  // then the nodes the asker gets.
  google::protobuf::RepeatedPtrField<NodeInfo> all;
  all.Swap(view_.mutable_nodes());
  ClusterView answer = view_;
  all.Swap(view_.mutable_nodes());
  auto wanted = [&](const NodeInfo& n) {
    return !ask.servers_only || n.role() == SERVER ||
           n.node_id() == ask.node_id;
  };
  if (changed == nullptr) {
    for (const NodeInfo& n : view_.nodes()) {
      if (wanted(n)) *answer.add_nodes() = n;
    }
  } else {
    for (const NodeInfo& n : *changed) {
      if (wanted(n)) *answer.add_nodes() = n;
    }
    answer.set_delta_from(ask.known_epoch);
    const RecentEpoch* past = RecentEpochLocked(ask.known_epoch);
    if (past != nullptr && past->slots_version == slots_version_) {
      answer.clear_slot_owner();
      answer.clear_slot_backup();
      answer.set_slots_unchanged(true);
    }
  }
  answer.set_servers_only(ask.servers_only);
  return answer;
}

bool ClusterState::PresentAtBarrier(const Node& node) {
  return node.info.state() == ALIVE || node.finished;
}

const std::vector<uint64_t>& ClusterState::BarrierNodesLocked(
    const std::string& name) {
  auto [stored, first] = barrier_nodes_.try_emplace(name);
  if (first) {
    const auto& arrived = barriers_[name];
    for (const auto& [id, node] : nodes_) {
      if (node.info.role() == WORKER && PresentAtBarrier(node) &&
          arrived.contains(id)) {
        stored->second.push_back(id);
      }
    }
  }
  return stored->second;
}

void ClusterState::CompleteBarriersLocked() {
  bool released = false;
  for (const auto& [name, arrived] : barriers_) {
    if (completed_barriers_.contains(name) || !BarrierCompleteLocked(name)) {
      continue;
    }
    completed_barriers_.insert(name);
    journal_dirty_ = true;
    BarrierNodesLocked(name);  // who was there at the release
    released = true;
  }
  if (released) SignalBarriersLocked();
}

bool ClusterState::BarrierCompleteLocked(const std::string& name) const {
  if (completed_barriers_.contains(name)) return true;
  if (worker_ranks_ever_.size() < config_.cluster().num_workers()) return false;
  auto it = barriers_.find(name);
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() == WORKER && node.info.state() == ALIVE &&
        (it == barriers_.end() || !it->second.contains(id))) {
      return false;
    }
  }
  return true;
}

std::vector<uint32_t> ClusterState::MissingRanksLocked(
    const std::string& name) const {
  std::vector<uint32_t> missing;
  std::vector<bool> alive(config_.cluster().num_workers(), false);
  auto it = barriers_.find(name);
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() != WORKER || node.info.state() != ALIVE) continue;
    alive[node.info.rank()] = true;
    if (it == barriers_.end() || !it->second.contains(id)) {
      missing.push_back(node.info.rank());
    }
  }
  // Ranks never registered yet are missing too.
  for (uint32_t r = 0; r < alive.size(); ++r) {
    if (!alive[r] && !worker_ranks_ever_.contains(r)) missing.push_back(r);
  }
  std::sort(missing.begin(), missing.end());
  return missing;
}

bool ClusterState::IsLiveWorker(uint64_t node_id) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  return it != nodes_.end() && it->second.info.role() == WORKER &&
         it->second.info.state() == ALIVE;
}

size_t ClusterState::LiveWorkers() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() == WORKER && node.info.state() == ALIVE) ++n;
  }
  return n;
}

absl::StatusOr<std::vector<uint32_t>> ClusterState::AwaitBarrier(
    uint64_t node_id, const std::string& name, absl::Duration timeout) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<const BarrierRelease> release,
                      AwaitBarrierRelease(node_id, name, timeout));
  return release->ranks;
}

absl::StatusOr<std::shared_ptr<const ClusterState::BarrierRelease>>
ClusterState::AwaitBarrierRelease(uint64_t node_id, const std::string& name,
                                  absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  PS_RETURN_IF_ERROR(ArriveAtBarrierLocked(node_id, name, journal));
  CompleteBarriersLocked();
  // A condition variable, not a Condition on mu_: a Condition per waiting
  // worker would be evaluated at every unlock of mu_ (every heartbeat), and
  // a barrier of thousands of workers would tax them all. Completion is
  // found where it can change (arrivals, epoch changes) and signalled.
  const absl::Time deadline = absl::Now() + std::min(timeout, kMaxWait);
  while (!BarrierDecidedLocked(name)) {
    if (barrier_cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  BarrierAnswer answer = BarrierAnswerLocked(name, /*at_deadline=*/true);
  if (answer->ok()) PS_RETURN_IF_ERROR(journal.Commit());
  return *std::move(answer);
}

std::vector<absl::Status> ClusterState::ArriveAtBarriers(
    const std::vector<BarrierArrival>& arrivals) {
  std::vector<absl::Status> statuses;
  statuses.reserve(arrivals.size());
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  for (const BarrierArrival& a : arrivals) {
    statuses.push_back(ArriveAtBarrierLocked(a.node_id, *a.name, journal));
  }
  CompleteBarriersLocked();
  return statuses;
}

std::vector<ClusterState::BarrierAnswer> ClusterState::DecideBarriers(
    const std::vector<BarrierAsk>& asks) {
  std::vector<BarrierAnswer> answers;
  answers.reserve(asks.size());
  absl::MutexLock lock(&mu_);
  // A release is on record before anyone is told of it: one write for all
  // the asks of a round.
  absl::Status recorded = absl::OkStatus();
  bool flushed = false;
  for (const BarrierAsk& ask : asks) {
    answers.push_back(BarrierAnswerLocked(*ask.name, ask.at_deadline));
    auto& answer = answers.back();
    if (!answer.has_value() || !answer->ok()) continue;
    if (!flushed) {
      recorded = FlushJournalLocked();
      flushed = true;
    }
    if (!recorded.ok()) *answer = recorded;
  }
  return answers;
}

void ClusterState::SetBarrierListener(std::function<void()> listener) {
  absl::MutexLock lock(&mu_);
  barrier_listener_ = std::move(listener);
}

void ClusterState::SignalBarriersLocked() {
  barrier_cv_.SignalAll();
  if (barrier_listener_) barrier_listener_();
}

absl::Status ClusterState::ArriveAtBarrierLocked(uint64_t node_id,
                                                 const std::string& name,
                                                 const JournalScope& journal) {
  if (name.empty() || name.size() > 256) {
    return absl::InvalidArgumentError("barrier name must have 1..256 bytes");
  }
  PS_RETURN_IF_ERROR(journal.Admit());
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || it->second.info.state() != ALIVE) {
    return absl::NotFoundError(
        absl::StrCat("node ", node_id, " is not a live member"));
  }
  if (it->second.info.role() != WORKER) {
    return absl::InvalidArgumentError("only workers take part in barriers");
  }
  barriers_[name].insert(node_id);
  barrier_started_.try_emplace(name, clock_->Now());
  return absl::OkStatus();
}

bool ClusterState::BarrierDecidedLocked(const std::string& name) const {
  return closed_ || view_.job_state() == FAILED ||
         completed_barriers_.contains(name);
}

ClusterState::BarrierAnswer ClusterState::BarrierAnswerLocked(
    const std::string& name, bool at_deadline) {
  if (completed_barriers_.contains(name)) {
    // Every caller is told who was there at the release, also one arriving
    // after it (a late replacement must not think it is the only one), as
    // the ranks of those nodes still present: a replacement that took a
    // dead node's rank is not mistaken for it. A node that left after
    // finishing its work counts as present: a caller that wakes only after
    // the evaluator evaluated and left must not evaluate again.
    // Built once per barrier and epoch (what is present changes only with
    // an epoch): thousands of workers released at once share it, with no
    // scan of the fleet under the lock.
    auto& [epoch, release] = barrier_ranks_[name];
    if (epoch != view_.epoch() || release == nullptr) {
      epoch = view_.epoch();
      auto fresh = std::make_shared<BarrierRelease>();
      for (uint64_t id : BarrierNodesLocked(name)) {
        const Node& node = nodes_.at(id);
        if (PresentAtBarrier(node)) fresh->ranks.push_back(node.info.rank());
      }
      std::sort(fresh->ranks.begin(), fresh->ranks.end());
      fresh->rank_runs = ToRankRuns(fresh->ranks);
      release = std::move(fresh);
    }
    return absl::StatusOr<std::shared_ptr<const BarrierRelease>>(release);
  }
  if (view_.job_state() == FAILED) {
    return absl::StatusOr<std::shared_ptr<const BarrierRelease>>(
        JobFailedError(absl::StrCat("the job has failed: ", view_.failure())));
  }
  if (closed_) {
    return absl::StatusOr<std::shared_ptr<const BarrierRelease>>(
        absl::UnavailableError("the scheduler is shutting down"));
  }
  if (!at_deadline) return std::nullopt;
  return absl::StatusOr<std::shared_ptr<const BarrierRelease>>(
      absl::DeadlineExceededError(
          absl::StrCat("barrier '", name, "' still waits for worker ranks ",
                       absl::StrJoin(MissingRanksLocked(name), ", "))));
}

absl::StatusOr<uint64_t> ClusterState::SetConsistency(
    const ConsistencyConfig& consistency) {
  absl::Status valid = ValidateConsistency(consistency);
  if (!valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  PS_RETURN_IF_ERROR(journal.Admit());
  ConsistencyConfig* c = view_.mutable_consistency();
  c->set_mode(consistency.mode());
  c->set_staleness(consistency.staleness());
  SchedulerLog()->info(
      "consistency changed to {}{} by request", ConsistencyMode_Name(c->mode()),
      c->mode() == SSP ? absl::StrCat(" staleness ", c->staleness()) : "");
  BumpEpochLocked();
  PS_RETURN_IF_ERROR(journal.Commit());
  return view_.epoch();
}

GetStatusResponse ClusterState::Status() const {
  absl::MutexLock lock(&mu_);
  GetStatusResponse status;
  *status.mutable_view() = view_;
  *status.mutable_queued_moves() = {queued_moves_.begin(), queued_moves_.end()};
  const absl::Time now = clock_->Now();
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() != WORKER || node.info.state() != ALIVE) continue;
    WorkerClock* wc = status.add_clocks();
    wc->set_rank(node.info.rank());
    wc->set_clock(node.clock);
    wc->set_silent_ms(absl::ToInt64Milliseconds(now - node.last_heartbeat));
  }
  SchedulerFaults* faults = status.mutable_faults();
  if (isolated_since_ != absl::InfiniteFuture()) {
    const absl::Duration held =
        std::max(absl::ZeroDuration(), now - isolated_since_);
    const absl::Duration hold =
        absl::Milliseconds(config_.cluster().isolation_hold_ms());
    faults->set_isolation_suspected(true);
    faults->set_isolation_suspected_ms(absl::ToInt64Milliseconds(held));
    faults->set_isolation_hold_left_ms(
        absl::ToInt64Milliseconds(std::max(absl::ZeroDuration(), hold - held)));
  }
  faults->set_isolation_suspicions(isolation_suspicions_);
  faults->set_stalls(stalls_);
  *status.mutable_progress() = ProgressLocked(now);
  return status;
}

JobProgress ClusterState::ProgressLocked(absl::Time now) const {
  return tracker_.Progress(
      shards_,
      [this](uint64_t id)
          ABSL_NO_THREAD_SAFETY_ANALYSIS -> std::optional<JobTracker::Holder> {
            auto it = nodes_.find(id);
            if (it == nodes_.end() || it->second.info.state() != ALIVE)
              return std::nullopt;
            JobTracker::Holder h;
            h.rank = it->second.info.rank();
            if (it->second.pace.started())
              h.steps_per_second = it->second.pace.steps_per_second();
            return h;
          },
      now);
}

StatusReport ClusterState::Report() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  StatusReport report;
  report.set_state(JobState_Name(view_.job_state()));
  report.set_epoch(view_.epoch());
  *report.mutable_job() = ProgressLocked(now);
  tracker_.FillReport(&report);
  report.set_series_since(absl::ToDoubleSeconds(created_ - absl::UnixEpoch()));
  report.set_now(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  return report;
}

void ClusterState::SampleProgress() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  if (view_.job_state() == STARTING) return;
  tracker_.Started(now);
  tracker_.Sample(shards_, now);
}

ClusterState::Monitoring ClusterState::Monitor() const {
  absl::MutexLock lock(&mu_);
  Monitoring m;
  const absl::Time now = clock_->Now();
  for (const auto& [id, node] : nodes_) {
    if (node.info.state() != ALIVE) continue;
    NodeActivity& a = m.nodes[id];
    a.silent_seconds =
        std::max(0.0, absl::ToDoubleSeconds(now - node.last_heartbeat));
    // The pace is measured between heartbeats at least
    // PaceEstimator::kWindow apart; before the first such pair it is the
    // pace since the first heartbeat (0 until a second one).
    if (node.info.role() == WORKER && node.clock < kFinishedClock &&
        node.pace.started()) {
      a.steps_per_second = node.pace.steps_per_second();
    }
    if (auto it = storage_.find(id); it != storage_.end()) {
      a.has_storage = true;
      a.storage = it->second;
    }
  }
  m.heartbeats = heartbeats_;
  m.journal_writes = journal_writes_;
  m.journal_write_seconds = absl::ToDoubleSeconds(journal_write_time_);
  m.journal_bytes = journal_bytes_;
  m.barriers_completed = completed_barriers_.size();
  m.nodes_declared_dead = declared_dead_;
  m.isolation_suspected = isolated_since_ != absl::InfiniteFuture();
  if (m.isolation_suspected) {
    m.isolation_suspected_seconds =
        std::max(0.0, absl::ToDoubleSeconds(now - isolated_since_));
  }
  m.isolation_suspicions = isolation_suspicions_;
  m.stalls = stalls_;
  return m;
}

std::vector<std::string> ClusterState::CheckProgress() {
  std::vector<std::string> lines;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  const ConsistencyConfig& c = view_.consistency();
  const absl::Duration timeout = absl::Milliseconds(c.watchdog_timeout_ms());
  const absl::Duration interval = absl::Milliseconds(c.watchdog_interval_ms());

  // Workers that finished training report kFinishedClock (2^62); they hold
  // nobody back and are left out. The slowest clock is tracked on every
  // call, so a stall is timed from its last move even when that came during
  // the quiet interval after a log.
  uint64_t min_clock = UINT64_MAX, max_clock = 0;
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() != WORKER || node.info.state() != ALIVE) continue;
    if (node.clock >= kFinishedClock) continue;
    min_clock = std::min(min_clock, node.clock);
    max_clock = std::max(max_clock, node.clock);
  }
  if (min_clock != watched_min_clock_) {
    watched_min_clock_ = min_clock;
    min_clock_since_ = now;
  }
  if (now - last_watchdog_log_ < interval) return lines;
  if (c.mode() != ASYNC && min_clock != UINT64_MAX && max_clock > min_clock &&
      now - min_clock_since_ >= timeout) {
    std::vector<std::string> behind;
    for (const auto& [id, node] : nodes_) {
      if (node.info.role() == WORKER && node.info.state() == ALIVE &&
          node.clock == min_clock) {
        behind.push_back(absl::StrCat(
            node.info.rank(), " (clock ", node.clock, ", last heard ",
            absl::FormatDuration(
                absl::Trunc(now - node.last_heartbeat, absl::Milliseconds(1))),
            " ago)"));
      }
    }
    lines.push_back(absl::StrCat(
        "watchdog: ", ConsistencyMode_Name(c.mode()), " job held back for ",
        absl::FormatDuration(
            absl::Trunc(now - min_clock_since_, absl::Milliseconds(1))),
        " by worker ranks ", absl::StrJoin(behind, ", "),
        "; the fastest worker is at clock ", max_clock));
  }
  for (const auto& [name, started] : barrier_started_) {
    if (completed_barriers_.contains(name) || now - started < timeout) continue;
    std::vector<uint32_t> missing = MissingRanksLocked(name);
    if (missing.empty()) continue;
    lines.push_back(absl::StrCat(
        "watchdog: barrier '", name, "' has waited ",
        absl::FormatDuration(absl::Trunc(now - started, absl::Seconds(1))),
        " for worker ranks ", absl::StrJoin(missing, ", ")));
  }
  for (const std::string& line : lines) SchedulerLog()->warn("{}", line);
  if (!lines.empty()) last_watchdog_log_ = now;
  return lines;
}

bool ClusterState::Reassign() const {
  return config_.cluster().on_worker_loss() != SKIP_REST;
}

uint64_t ClusterState::JobClockLocked() const {
  // The fastest live worker's clock; with none training (all finished, or
  // gone), the furthest any worker got, so a worker restarting to take
  // over a shard never goes back to steps the job already took.
  const Training t = TrainingLocked();
  const uint64_t clock = std::max(base_clock_, t.fastest);
  return t.any ? clock : std::max(clock, max_clock_ever_);
}

ClusterState::Training ClusterState::TrainingLocked() const {
  Training t;
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() == WORKER && node.info.state() == ALIVE &&
        node.clock < kFinishedClock) {
      t.any = true;
      t.fastest = std::max(t.fastest, node.clock);
      t.rate = std::max(t.rate, node.pace.steps_per_second());
    }
  }
  return t;
}

void ClusterState::ReleaseShardLocked(uint64_t id, bool done,
                                      const DataPosition* position) {
  // A node that trains no shards (a tool) was handed one at registration
  // that it never trained: nobody resumes it.
  auto node = nodes_.find(id);
  shards_.Release(id,
                  done || node == nodes_.end() || !node->second.trains_shards,
                  position);
}

void ClusterState::WakeClaimsLocked() {
  if (claim_waiters_ == 0 && !claim_listener_) return;
  if (closed_ || view_.job_state() == FAILED || shards_.Orphan() >= 0 ||
      shards_.AllDone() || departures_ != departures_woken_) {
    departures_woken_ = departures_;
    claims_cv_.SignalAll();
    if (claim_listener_) claim_listener_();
  }
}

ClusterState::ClaimTicket ClusterState::FinishClaim(
    const ClaimShardRequest& request) {
  return FinishClaims({&request}).front();
}

// journal_file_mu_ is locked on one path before mu_ is released and handed
// to WriteJournalAfterLock (the analysis cannot follow it).
std::vector<ClusterState::ClaimTicket> ClusterState::FinishClaims(
    const std::vector<const ClaimShardRequest*>& requests)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  std::vector<ClaimTicket> tickets(requests.size());
  SchedulerJournal snapshot;
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    JournalScope journal(this);
    const absl::Status admitted = journal.Admit();
    bool finished = false;
    for (size_t i = 0; i < requests.size(); ++i) {
      const ClaimShardRequest& request = *requests[i];
      if (!admitted.ok()) {
        tickets[i].status = admitted;
        continue;
      }
      auto it = nodes_.find(request.node_id());
      if (it == nodes_.end() || it->second.info.state() != ALIVE ||
          it->second.info.role() != WORKER) {
        tickets[i].status = absl::NotFoundError(
            absl::StrCat("node ", request.node_id(), " is not a live worker"));
        continue;
      }
      if (request.has_finished() &&
          shards_.Finish(request.node_id(), request.finished())) {
        finished = true;
      }
    }
    if (finished) {
      // No view lists shards: a finish changes the view only when it
      // changes the job's state (and every node's view need not be resent
      // for each worker that ends). The journal holds it either way.
      const JobState before = view_.job_state();
      UpdateJobStateLocked();
      if (view_.job_state() != before) {
        BumpEpochLocked();
      } else {
        journal_dirty_ = true;
        WakeClaimsLocked();
        if (journal_ && journal_error_.ok()) {
          // Only the ledger changed: written after the lock, so heartbeats
          // and the next finishes need not wait for the disk. Each claim is
          // answered only once it is written (JournalWritten).
          seq = SnapshotForAfterLockLocked(&snapshot);
          for (ClaimTicket& t : tickets) t.seq = seq;
        }
      }
    }
    // A finished shard is on record before the wait, which may be long
    // (nothing is left to write when the snapshot above is taken).
    const absl::Status committed = journal.Commit();
    if (!committed.ok()) {
      for (ClaimTicket& t : tickets) {
        if (t.status.ok()) t.status = committed;
      }
    }
  }
  if (seq != 0) WriteJournalAfterLock(snapshot, seq).IgnoreError();
  return tickets;
}

absl::StatusOr<ClaimShardResponse> ClusterState::ClaimShard(
    const ClaimShardRequest& request, absl::Duration timeout) {
  const ClaimTicket ticket = FinishClaim(request);
  PS_RETURN_IF_ERROR(ticket.status);
  const absl::Time deadline = absl::Now() + std::min(timeout, kMaxWait);
  std::optional<absl::StatusOr<ClaimShardResponse>> answer;
  {
    absl::MutexLock lock(&mu_);
    answer = DecideClaimLocked({&request, /*first=*/true, /*expired=*/false});
    // A condition variable woken by WakeClaimsLocked, not a Condition on
    // mu_: thousands of waiting workers would each be asked on every
    // release of mu_.
    ++claim_waiters_;
    while (!answer.has_value()) {
      const bool expired = claims_cv_.WaitWithDeadline(&mu_, deadline);
      answer = DecideClaimLocked({&request, false, expired});
    }
    --claim_waiters_;
  }
  // The finish is on record before any answer (a failed write is retried
  // by the next; the worker retries meanwhile).
  if (answer->ok() && ticket.seq != 0 && !JournalWritten(ticket.seq)) {
    return absl::UnavailableError(
        "the scheduler could not record the finished shard yet; retry");
  }
  return *std::move(answer);
}

std::vector<std::optional<absl::StatusOr<ClaimShardResponse>>>
ClusterState::DecideClaims(const std::vector<ClaimAsk>& asks) {
  std::vector<std::optional<absl::StatusOr<ClaimShardResponse>>> answers;
  answers.reserve(asks.size());
  absl::MutexLock lock(&mu_);
  for (const ClaimAsk& ask : asks) answers.push_back(DecideClaimLocked(ask));
  return answers;
}

void ClusterState::SetClaimListener(std::function<void()> listener) {
  absl::MutexLock lock(&mu_);
  claim_listener_ = std::move(listener);
}

std::optional<absl::StatusOr<ClaimShardResponse>>
ClusterState::DecideClaimLocked(const ClaimAsk& ask) {
  const ClaimShardRequest& request = *ask.request;
  JournalScope journal(this);
  PS_RETURN_IF_ERROR(journal.Admit());
  const uint64_t id = request.node_id();
  auto node = nodes_.find(id);
  if (node == nodes_.end()) {
    return absl::NotFoundError(
        absl::StrCat("node ", id, " is not a live worker"));
  }
  if (ask.first && request.has_finished() &&
      node->second.info.state() == ALIVE) {
    // A retry of a claim whose answer was lost (the scheduler restarted
    // between assigning and answering): the worker still holds the shard it
    // was given; it gets that one again, not a second.
    if (int s = shards_.HeldBy(id, request.finished().shard()); s >= 0) {
      ClaimShardResponse again;
      again.set_result(ClaimShardResponse::ASSIGNED);
      again.set_start_clock(JobClockLocked());
      node->second.clock = again.start_clock();
      *again.mutable_shard() = shards_.shard(s).position;
      again.mutable_shard()->set_done(false);
      SchedulerLog()->info(
          "node {} asked again for work: shard {} is still its own", id, s);
      PS_RETURN_IF_ERROR(journal.Commit());
      return again;
    }
  }
  const bool decided = closed_ || view_.job_state() == FAILED ||
                       node->second.info.state() != ALIVE ||
                       shards_.Orphan() >= 0 || shards_.AllDone();
  if (!decided && !ask.expired) return std::nullopt;
  if (view_.job_state() == FAILED) {
    return JobFailedError(
        absl::StrCat("the job has failed: ", view_.failure()));
  }
  if (node->second.info.state() != ALIVE) {
    return absl::NotFoundError(
        absl::StrCat("node ", id, " is not a live worker"));
  }
  ClaimShardResponse response;
  if (int orphan = shards_.Orphan(); orphan >= 0) {
    response.set_result(ClaimShardResponse::ASSIGNED);
    response.set_start_clock(JobClockLocked());
    node->second.clock = response.start_clock();
    *response.mutable_shard() = shards_.Assign(orphan, id);
    // Journaled; the view lists no shards.
    journal_dirty_ = true;
  } else if (shards_.AllDone()) {
    response.set_result(ClaimShardResponse::ALL_DONE);
  } else {
    response.set_result(ClaimShardResponse::WAIT);
  }
  PS_RETURN_IF_ERROR(journal.Commit());
  return response;
}

void ClusterState::SetRestore(const std::string& path,
                              const CheckpointManifest& manifest) {
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  view_.mutable_restore()->set_path(path);
  view_.mutable_restore()->set_clock(manifest.clock());
  view_.set_last_checkpoint_clock(manifest.clock());
  base_clock_ = manifest.clock();
  last_checkpoint_ = manifest.clock();
  if (!shards_.Restore(manifest.positions())) {
    SchedulerLog()->warn(
        "checkpoint has data positions for {} workers, the job has {}: every "
        "shard starts from its beginning",
        manifest.positions_size(), shards_.size());
  }
  SchedulerLog()->info("job resumes from checkpoint {} at clock {}", path,
                       manifest.clock());
  BumpEpochLocked();
}

absl::StatusOr<uint64_t> ClusterState::StartCheckpoint(uint64_t after_clock) {
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  PS_RETURN_IF_ERROR(journal.Admit());
  if (checkpoint_.has_value()) {
    if (checkpoint_->clock > after_clock) return checkpoint_->clock;
    // The requester has passed it: the servers will refuse it anyway.
    AbortCheckpointLocked(
        absl::StrCat("a worker asked for one after clock ", after_clock));
  }
  auto clock = StartCheckpointLocked("on request", after_clock);
  if (clock.ok()) {
    checkpoint_wanted_ = true;
    PS_RETURN_IF_ERROR(journal.Commit());
  }
  return clock;
}

absl::StatusOr<uint64_t> ClusterState::StartCheckpointLocked(
    const char* why, uint64_t after_clock) {
  if (config_.checkpoint().dir().empty()) {
    return absl::FailedPreconditionError(
        "the job has no checkpoint.dir; checkpoints are off");
  }
  if (view_.job_state() != RUNNING) {
    return absl::FailedPreconditionError("the job is not running");
  }
  if (FencingLocked()) {
    // A fence moves slots between servers: a cut taken across it could
    // miss them or hold them twice.
    checkpoint_wanted_ = true;
    return absl::UnavailableError(
        "a slot move is in its fence; the checkpoint starts right after");
  }
  const Training t = TrainingLocked();
  // Heartbeat clocks lag by up to an interval, and the view takes a moment
  // to reach every node: leave three intervals of the fastest pace.
  const uint64_t ahead = std::max<uint64_t>(
      checkpoint_margin_,
      static_cast<uint64_t>(
          t.rate * 3 * config_.cluster().heartbeat_interval_ms() / 1000.0) +
          1);
  // With no worker training the parameters do not change: the next clock
  // is a consistent cut at once (e.g. a final checkpoint, or one of a job
  // restored onto other servers).
  PendingCheckpoint pending;
  pending.clock = std::max({t.fastest, base_clock_, last_checkpoint_,
                            after_clock, abandoned_checkpoint_}) +
                  (t.any ? ahead : 1);
  pending.started = clock_->Now();
  checkpoint_ = std::move(pending);
  view_.set_checkpoint_clock(checkpoint_->clock);
  SchedulerLog()->info("checkpoint at clock {} started ({})",
                       checkpoint_->clock, why);
  BumpEpochLocked();
  return checkpoint_->clock;
}

void ClusterState::AbortCheckpointLocked(const std::string& why) {
  if (!checkpoint_.has_value()) return;
  SchedulerLog()->warn("checkpoint at clock {} abandoned: {}",
                       checkpoint_->clock, why);
  abandoned_checkpoint_ = std::max(abandoned_checkpoint_, checkpoint_->clock);
  checkpoint_.reset();
  view_.set_checkpoint_clock(0);
  StartDeferredFencesLocked();
  BumpEpochLocked();
}

absl::Status ClusterState::ReportCheckpoint(
    const ReportCheckpointRequest& request) {
  return ReportCheckpoints({&request}).front();
}

// journal_file_mu_ is locked on one path before mu_ is released and handed
// to WriteJournalAfterLock (the analysis cannot follow it).
std::vector<absl::Status> ClusterState::ReportCheckpoints(
    const std::vector<const ReportCheckpointRequest*>& requests)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  std::vector<absl::Status> results;
  results.reserve(requests.size());
  auto fail_all = [&](const absl::Status& error) {
    for (absl::Status& r : results) {
      if (r.ok()) r = error;
    }
  };
  SchedulerJournal snapshot;
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    const absl::Status admitted = journal_error_;
    const uint64_t epoch = view_.epoch();
    bool recorded = false;
    for (const ReportCheckpointRequest* request : requests) {
      results.push_back(admitted.ok() ? ReportOneLocked(*request, &recorded)
                                      : admitted);
    }
    // Whether every part is in walks every node: once per batch, not once
    // per report (a fleet's nodes report together).
    if (recorded && checkpoint_.has_value()) TryCommitCheckpointLocked();
    if (journal_ && journal_dirty_) {
      if (view_.epoch() != epoch) {
        // The checkpoint committed or was abandoned: a new epoch, which
        // nodes may see as soon as the lock is released, is written first.
        const absl::Status committed = WriteJournalLocked(/*sync=*/false);
        if (!committed.ok()) fail_all(committed);
      } else {
        // Only reports changed: written after the lock, so heartbeats and
        // the next reports need not wait for the disk; answered once
        // written.
        seq = SnapshotForAfterLockLocked(&snapshot);
      }
    }
  }
  if (seq != 0) {
    const absl::Status written = WriteJournalAfterLock(snapshot, seq);
    if (!written.ok()) fail_all(written);
  }
  return results;
}

absl::Status ClusterState::ReportOneLocked(
    const ReportCheckpointRequest& request, bool* recorded) {
  auto it = nodes_.find(request.node_id());
  if (it == nodes_.end() || it->second.info.state() != ALIVE) {
    return absl::NotFoundError(
        absl::StrCat("node ", request.node_id(), " is not a live member"));
  }
  if (!checkpoint_.has_value() || checkpoint_->clock != request.clock()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no checkpoint at clock ", request.clock(), " is in progress"));
  }
  if (request.file().size() > 4096 || request.error().size() > 65536) {
    return absl::InvalidArgumentError("report fields too long");
  }
  if (!request.ok()) {
    // Too late for this node: the cut would not be consistent. Retry
    // further ahead.
    checkpoint_margin_ = std::min<uint64_t>(checkpoint_margin_ * 4, 1 << 20);
    checkpoint_wanted_ = true;
    AbortCheckpointLocked(
        absl::StrCat(it->second.info.role() == SERVER ? "server " : "worker ",
                     it->second.info.rank(), ": ", request.error()));
    return absl::OkStatus();
  }
  checkpoint_->reports[request.node_id()] = request;
  journal_dirty_ = true;
  *recorded = true;
  return absl::OkStatus();
}

void ClusterState::TryCommitCheckpointLocked() {
  const PendingCheckpoint& pending = *checkpoint_;
  CheckpointManifest manifest;
  manifest.set_clock(pending.clock);

  manifest.set_num_slots(config_.cluster().num_slots());
  manifest.set_created_unix_micros(absl::ToUnixMicros(clock_->Now()));
  std::vector<const DataPosition*> reported(shards_.size(), nullptr);
  absl::flat_hash_set<uint32_t> live_ranks;
  for (const auto& [id, node] : nodes_) {
    if (node.info.state() == ALIVE && node.info.role() == SERVER) {
      live_ranks.insert(node.info.rank());
    }
  }
  for (const auto& [id, node] : nodes_) {
    auto r = pending.reports.find(id);
    if (node.info.state() != ALIVE) {
      // A server that reported and then left: its shard is part of the cut
      // unless a live server has taken its rank since.
      if (node.info.role() != SERVER || r == pending.reports.end() ||
          live_ranks.contains(node.info.rank())) {
        continue;
      }
    }
    if (node.info.role() == SERVER) {
      if (r == pending.reports.end()) return;  // not written yet
      ShardFile* f = manifest.add_shards();
      f->set_rank(node.info.rank());
      f->set_file(r->second.file());
      f->set_bytes(r->second.bytes());
      f->set_checksum(r->second.checksum());
      continue;
    }
    // Workers training at the checkpoint's clock report where they are;
    // finished ones and those that joined after it train nothing of it.
    if (!node.trains_shards || node.clock >= kFinishedClock ||
        node.info.start_clock() >= pending.clock) {
      continue;
    }
    if (r == pending.reports.end()) return;
    if (r->second.has_position() &&
        r->second.position().shard() < shards_.size()) {
      reported[r->second.position().shard()] = &r->second.position();
    }
  }
  shards_.FillManifest(reported, &manifest);
  // The shards' ranks: 0..num_servers-1, or (elastic) any below MaxServers.
  manifest.set_num_servers(manifest.shards_size());
  std::sort(manifest.mutable_shards()->begin(),
            manifest.mutable_shards()->end(),
            [](const ShardFile& a, const ShardFile& b) {
              return a.rank() < b.rank();
            });
  const std::string dir =
      absl::StrCat(config_.checkpoint().dir(), "/",
                   absl::StrFormat("ckpt-%020d", pending.clock));
  const uint64_t clock = pending.clock;
  absl::Status committed =
      store_.commit ? store_.commit(dir, manifest)
                    : absl::FailedPreconditionError("no checkpoint store");
  checkpoint_.reset();
  view_.set_checkpoint_clock(0);
  if (committed.ok()) {
    last_checkpoint_ = clock;
    view_.set_last_checkpoint_clock(clock);
    checkpoint_wanted_ = false;
    checkpoint_margin_ = std::max<uint64_t>(2, checkpoint_margin_ / 2);
    SchedulerLog()->info(
        "checkpoint at clock {} committed: {} server shards in {}", clock,
        manifest.shards_size(), dir);
  } else {
    SchedulerLog()->error("checkpoint at clock {} not committed: {}", clock,
                          committed.ToString());
  }
  StartDeferredFencesLocked();
  BumpEpochLocked();
}

std::vector<std::string> ClusterState::CheckCheckpoints() {
  std::vector<std::string> lines;
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  if (!journal.Admit().ok() || config_.checkpoint().dir().empty() ||
      view_.job_state() != RUNNING) {
    return lines;
  }
  const absl::Time now = clock_->Now();
  if (checkpoint_.has_value()) {
    const absl::Duration limit = std::max(
        absl::Seconds(60),
        20 * absl::Milliseconds(config_.cluster().heartbeat_timeout_ms()));
    if (now - checkpoint_->started > limit) {
      lines.push_back(absl::StrCat("checkpoint at clock ", checkpoint_->clock,
                                   " took longer than ",
                                   absl::FormatDuration(limit)));
      checkpoint_wanted_ = true;
      AbortCheckpointLocked(lines.back());
    }
    return lines;
  }
  const uint64_t interval = config_.checkpoint().interval_steps();
  const bool due =
      interval > 0 && TrainingLocked().fastest >= last_checkpoint_ + interval;
  if (due || checkpoint_wanted_) {
    auto started = StartCheckpointLocked(due ? "periodic" : "retry");
    if (started.ok()) {
      lines.push_back(
          absl::StrCat("checkpoint at clock ", *started, " started"));
    } else if (checkpoint_wanted_ && !due) {
      checkpoint_wanted_ = false;  // e.g. training is over
    }
  }
  return lines;
}

SlotMap ClusterState::SlotsLocked() const {
  return SlotMap(MaxServers(),
                 {view_.slot_owner().begin(), view_.slot_owner().end()},
                 {view_.slot_backup().begin(), view_.slot_backup().end()});
}

void ClusterState::SetSlotsLocked(const SlotMap& slots) {
  // A backup given to a slot while the job runs holds a copy only once the
  // owner copied it the slot; the initial layout's are complete from the
  // start (every copy begins empty).
  const bool initial = view_.slot_backup_size() == 0;
  backup_since_.resize(slots.backup().size(), absl::InfinitePast());
  for (size_t s = 0; s < slots.backup().size(); ++s) {
    if (!initial && view_.slot_backup(s) != slots.backup()[s]) {
      backup_since_[s] = clock_->Now();
    }
  }
  ++slots_version_;
  view_.clear_slot_owner();
  view_.clear_slot_backup();
  for (uint32_t owner : slots.owner()) view_.add_slot_owner(owner);
  for (uint32_t backup : slots.backup()) view_.add_slot_backup(backup);
}

std::vector<bool> ClusterState::LiveServersLocked() const {
  std::vector<bool> live(MaxServers(), false);
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() == SERVER && node.info.state() == ALIVE &&
        node.info.rank() < live.size()) {
      live[node.info.rank()] = true;
    }
  }
  return live;
}

void ClusterState::FailServerLocked(uint32_t rank) {
  if (view_.slot_backup_size() != view_.slot_owner_size()) return;
  SlotMap slots = WithoutUncopiedBackupsLocked(rank);
  const std::vector<bool> live = LiveServersLocked();
  const SlotMap::Failed failed = slots.Fail(rank, live);
  SchedulerLog()->warn(
      "server {} is gone: {} of its slots promoted to their backups, {} "
      "slots lost their backup{}",
      rank, failed.promoted, failed.lost_backup,
      failed.orphaned > 0
          ? absl::StrCat(", ", failed.orphaned,
                         " slots have no live copy (a replacement "
                         "restores them from the newest checkpoint)")
          : std::string());
  LogNewBackups(slots.AssignBackups(live));
  SetSlotsLocked(slots);
}

SlotMap ClusterState::WithoutUncopiedBackupsLocked(uint32_t rank) const {
  // When server `rank` was last heard from (its newest record).
  absl::Time heard = absl::InfiniteFuture();
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() == SERVER && node.info.rank() == rank) {
      heard = node.last_heartbeat;
    }
  }
  std::vector<uint32_t> owner(view_.slot_owner().begin(),
                              view_.slot_owner().end());
  std::vector<uint32_t> backup(view_.slot_backup().begin(),
                               view_.slot_backup().end());
  // A live owner is heard from every heartbeat interval and learns of a new
  // backup within moments (long poll); one silent for half a heartbeat
  // timeout when the backup was given, and never heard from since, was
  // most likely dead already (the first of two servers killed together is
  // declared dead while the other has been silent nearly as long): it never
  // copied the slot there.
  const absl::Duration half_timeout =
      absl::Milliseconds(config_.cluster().heartbeat_timeout_ms()) / 2;
  uint32_t uncopied = 0;
  for (size_t s = 0; s < owner.size() && s < backup_since_.size(); ++s) {
    if (owner[s] == rank && backup[s] != kNoBackup &&
        backup_since_[s] > heard + half_timeout) {
      backup[s] = kNoBackup;
      ++uncopied;
    }
  }
  if (uncopied > 0) {
    SchedulerLog()->warn(
        "server {}: {} of its slots got their backup while it was silent "
        "(last heard from before), which therefore holds no copy of them",
        rank, uncopied);
  }
  return SlotMap(MaxServers(), std::move(owner), std::move(backup));
}

void ClusterState::AdoptReplacementLocked(uint32_t rank) {
  if (view_.slot_backup_size() != view_.slot_owner_size()) return;
  SlotMap slots = SlotsLocked();
  const std::vector<bool> live = LiveServersLocked();
  // An elastic job has no fixed layout to return to: the newcomer only
  // helps place backups that are missing.
  const uint32_t moved = Elastic() ? 0 : slots.Adopt(rank, live);
  SchedulerLog()->info("server {} (replacement) becomes the backup of {} slots",
                       rank, moved);
  LogNewBackups(slots.AssignBackups(live));
  SetSlotsLocked(slots);
}

void ClusterState::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  SignalBarriersLocked();
  claims_cv_.SignalAll();
  if (claim_listener_) claim_listener_();
  if (view_listener_) view_listener_();
}

ClusterView ClusterState::View() const {
  absl::MutexLock lock(&mu_);
  return view_;
}

JobState ClusterState::job_state() const {
  absl::MutexLock lock(&mu_);
  return view_.job_state();
}

bool ClusterState::AllDone() const {
  absl::MutexLock lock(&mu_);
  if (view_.job_state() == FAILED) {
    const absl::Duration timeout =
        absl::Milliseconds(config_.cluster().heartbeat_timeout_ms());
    if (clock_->Now() - failed_at_ >= timeout) return true;
    for (const auto& [id, node] : nodes_) {
      if (node.info.state() == ALIVE) return false;
    }
    return true;
  }
  if (view_.job_state() != FINISHED) return false;
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() == SERVER && node.info.state() == ALIVE) return false;
  }
  return true;
}

}  // namespace ps
