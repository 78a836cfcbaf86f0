#include "scheduler/cluster_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/protocol.h"
#include "common/logging.h"

namespace ps {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger =
      new std::shared_ptr<spdlog::logger>(GetLogger("scheduler"));
  return *logger;
}

constexpr absl::Duration kMaxWait = absl::Seconds(30);

const char* RoleName(Role r) { return r == SERVER ? "server" : "worker"; }

}  // namespace

ClusterState::ClusterState(const JobConfig& config, Clock* clock)
    : config_(config), fingerprint_(ConfigFingerprint(config)), clock_(clock) {
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

absl::StatusOr<RegisterResponse> ClusterState::Register(
    const RegisterRequest& request) {
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
  absl::MutexLock lock(&mu_);
  if (view_.job_state() == FINISHED) {
    return absl::FailedPreconditionError("the job has finished");
  }
  std::vector<bool> taken(ExpectedCount(request.role()), false);
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() == request.role() &&
        (node.info.state() == ALIVE || node.finished)) {
      taken[node.info.rank()] = true;
    }
  }
  auto free_rank = std::find(taken.begin(), taken.end(), false);
  if (free_rank == taken.end()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "all ", taken.size(), " ", RoleName(request.role()),
        " ranks are held by live nodes or were finished"));
  }
  Node node;
  node.info.set_node_id(next_node_id_++);
  node.info.set_role(request.role());
  node.info.set_rank(static_cast<uint32_t>(free_rank - taken.begin()));
  node.info.set_data_endpoint(request.data_endpoint());
  node.info.set_state(ALIVE);
  node.info.set_host(request.host());
  node.info.set_pid(request.pid());
  node.last_heartbeat = clock_->Now();
  if (request.role() == WORKER) {
    worker_ranks_ever_.insert(node.info.rank());
    // A worker joining a running job starts at the job's current clock, so
    // synchronous waits do not count it for steps it never took part in.
    uint64_t start = 0;
    for (const auto& [id, other] : nodes_) {
      if (other.info.role() == WORKER && other.info.state() == ALIVE &&
          other.clock < kFinishedClock) {
        start = std::max(start, other.clock);
      }
    }
    node.info.set_start_clock(start);
    node.clock = start;
  }
  const NodeInfo info = node.info;
  nodes_[info.node_id()] = std::move(node);
  Log()->info("{} rank {} registered (node {}, {} pid {}{}{})",
              RoleName(info.role()), info.rank(), info.node_id(), info.host(),
              info.pid(), info.data_endpoint().empty() ? "" : ", ",
              info.data_endpoint());
  UpdateJobStateLocked();
  BumpEpochLocked();
  RegisterResponse response;
  response.set_node_id(info.node_id());
  response.set_rank(info.rank());
  *response.mutable_view() = view_;
  return response;
}

absl::StatusOr<HeartbeatResponse> ClusterState::Heartbeat(
    const HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(request.node_id());
  if (it == nodes_.end() || it->second.info.state() != ALIVE) {
    return absl::NotFoundError(absl::StrCat(
        "node ", request.node_id(),
        " is not a live member (unknown, left or declared dead); register again"));
  }
  it->second.last_heartbeat = clock_->Now();
  it->second.clock = std::max(it->second.clock, request.clock());
  HeartbeatResponse response;
  response.set_epoch(view_.epoch());
  response.set_job_state(view_.job_state());
  return response;
}

absl::Status ClusterState::Leave(const LeaveRequest& request) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(request.node_id());
  if (it == nodes_.end() || it->second.info.state() != ALIVE) {
    return absl::NotFoundError(
        absl::StrCat("node ", request.node_id(), " is not a live member"));
  }
  NodeInfo& info = it->second.info;
  info.set_state(LEFT);
  if (info.role() == WORKER && request.finished()) {
    some_worker_finished_ = true;
    it->second.finished = true;
  }
  Log()->info("{} rank {} left{}", RoleName(info.role()), info.rank(),
              request.finished() ? " (finished)" : "");
  UpdateJobStateLocked();
  BumpEpochLocked();
  return absl::OkStatus();
}

std::vector<uint64_t> ClusterState::ExpireSilentNodes() {
  const absl::Time deadline =
      clock_->Now() -
      absl::Milliseconds(config_.cluster().heartbeat_timeout_ms());
  std::vector<uint64_t> dead;
  absl::MutexLock lock(&mu_);
  for (auto& [id, node] : nodes_) {
    if (node.info.state() == ALIVE && node.last_heartbeat < deadline) {
      node.info.set_state(DEAD);
      dead.push_back(id);
      Log()->warn("{} rank {} (node {}) declared dead: no heartbeat for {}",
                  RoleName(node.info.role()), node.info.rank(), id,
                  absl::FormatDuration(clock_->Now() - node.last_heartbeat));
    }
  }
  if (!dead.empty()) {
    UpdateJobStateLocked();
    BumpEpochLocked();
  }
  return dead;
}

void ClusterState::BumpEpochLocked() {
  view_.set_epoch(view_.epoch() + 1);
  view_.clear_nodes();
  for (const auto& [id, node] : nodes_) *view_.add_nodes() = node.info;
}

void ClusterState::UpdateJobStateLocked() {
  if (view_.job_state() == STARTING) {
    uint32_t servers = 0;
    for (const auto& [id, node] : nodes_) {
      servers += node.info.role() == SERVER && node.info.state() == ALIVE;
    }
    if (servers == config_.cluster().num_servers()) {
      const uint32_t num_slots = config_.cluster().num_slots();
      const uint64_t num_servers = config_.cluster().num_servers();
      view_.clear_slot_owner();
      for (uint32_t s = 0; s < num_slots; ++s) {
        view_.add_slot_owner(static_cast<uint32_t>(s * num_servers / num_slots));
      }
      view_.set_job_state(RUNNING);
      Log()->info("all {} servers registered; job running", num_servers);
    }
  }
  if (view_.job_state() == RUNNING && some_worker_finished_ &&
      worker_ranks_ever_.size() >= config_.cluster().num_workers()) {
    bool worker_alive = false;
    for (const auto& [id, node] : nodes_) {
      worker_alive |= node.info.role() == WORKER && node.info.state() == ALIVE;
    }
    if (!worker_alive) {
      view_.set_job_state(FINISHED);
      Log()->info("every worker has left; job finished");
    }
  }
}

ClusterView ClusterState::AwaitView(uint64_t min_epoch, bool wait_for_running,
                                    absl::Duration timeout) {
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || (view_.epoch() >= min_epoch &&
                       (!wait_for_running || view_.job_state() != STARTING));
  };
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&ready), std::min(timeout, kMaxWait));
  return view_;
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

absl::Status ClusterState::AwaitBarrier(uint64_t node_id,
                                        const std::string& name,
                                        absl::Duration timeout) {
  if (name.empty() || name.size() > 256) {
    return absl::InvalidArgumentError("barrier name must have 1..256 bytes");
  }
  absl::MutexLock lock(&mu_);
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
  auto complete_or_closed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || BarrierCompleteLocked(name);
  };
  mu_.AwaitWithTimeout(absl::Condition(&complete_or_closed),
                       std::min(timeout, kMaxWait));
  if (BarrierCompleteLocked(name)) {
    completed_barriers_.insert(name);
    return absl::OkStatus();
  }
  if (closed_) {
    return absl::UnavailableError("the scheduler is shutting down");
  }
  return absl::DeadlineExceededError(
      absl::StrCat("barrier '", name, "' still waits for worker ranks ",
                   absl::StrJoin(MissingRanksLocked(name), ", ")));
}

absl::StatusOr<uint64_t> ClusterState::SetConsistency(
    const ConsistencyConfig& consistency) {
  absl::Status valid = ValidateConsistency(consistency);
  if (!valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  ConsistencyConfig* c = view_.mutable_consistency();
  c->set_mode(consistency.mode());
  c->set_staleness(consistency.staleness());
  Log()->info("consistency changed to {}{} by request",
              ConsistencyMode_Name(c->mode()),
              c->mode() == SSP ? absl::StrCat(" staleness ", c->staleness()) : "");
  BumpEpochLocked();
  return view_.epoch();
}

GetStatusResponse ClusterState::Status() const {
  absl::MutexLock lock(&mu_);
  GetStatusResponse status;
  *status.mutable_view() = view_;
  const absl::Time now = clock_->Now();
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() != WORKER || node.info.state() != ALIVE) continue;
    WorkerClock* wc = status.add_clocks();
    wc->set_rank(node.info.rank());
    wc->set_clock(node.clock);
    wc->set_silent_ms(absl::ToInt64Milliseconds(now - node.last_heartbeat));
  }
  return status;
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
            absl::FormatDuration(absl::Trunc(now - node.last_heartbeat, absl::Milliseconds(1))),
            " ago)"));
      }
    }
    lines.push_back(absl::StrCat(
        "watchdog: ", ConsistencyMode_Name(c.mode()), " job held back for ",
        absl::FormatDuration(absl::Trunc(now - min_clock_since_, absl::Milliseconds(1))),
        " by worker ranks ", absl::StrJoin(behind, ", "),
        "; the fastest worker is at clock ", max_clock));
  }
  for (const auto& [name, started] : barrier_started_) {
    if (completed_barriers_.contains(name) || now - started < timeout) continue;
    std::vector<uint32_t> missing = MissingRanksLocked(name);
    if (missing.empty()) continue;
    lines.push_back(absl::StrCat("watchdog: barrier '", name, "' has waited ",
                                 absl::FormatDuration(absl::Trunc(now - started, absl::Seconds(1))),
                                 " for worker ranks ", absl::StrJoin(missing, ", ")));
  }
  for (const std::string& line : lines) Log()->warn("{}", line);
  if (!lines.empty()) last_watchdog_log_ = now;
  return lines;
}

void ClusterState::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
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
  if (view_.job_state() != FINISHED) return false;
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() == SERVER && node.info.state() == ALIVE) return false;
  }
  return true;
}

}  // namespace ps
