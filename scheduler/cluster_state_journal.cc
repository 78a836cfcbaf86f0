// ClusterState's journal: the snapshot a restarted scheduler takes the job
// back from, and its validation (the journal is a file: not trusted).
#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "scheduler/cluster_state.h"
#include "scheduler/scheduler_log.h"

namespace ps {
absl::Status ClusterState::SetJournal(JournalWriter write) {
  absl::MutexLock lock(&mu_);
  journal_ = std::move(write);
  journal_error_ = absl::OkStatus();
  journal_dirty_ = true;
  return FlushJournalLocked();
}

void ClusterState::SyncJournal() {
  absl::MutexLock lock(&mu_);
  WriteJournalLocked(/*sync=*/true).IgnoreError();  // kept in journal_error_
}

absl::Status ClusterState::JournalError() const {
  absl::MutexLock lock(&mu_);
  return journal_error_;
}

void ClusterState::SetLaunch(const std::string& launch_id) {
  absl::MutexLock lock(&mu_);
  launch_id_ = launch_id;
  journal_dirty_ = true;
}

absl::Status ClusterState::MarkStopped() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  return WriteJournalLocked(/*sync=*/true);
}

uint32_t ClusterState::ListenPort() const {
  absl::MutexLock lock(&mu_);
  return listen_port_;
}

void ClusterState::SetListenPort(int port) {
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  listen_port_ = static_cast<uint32_t>(port);
  journal_dirty_ = true;
}

absl::Status ClusterState::FlushJournalLocked() {
  if (!journal_dirty_) return absl::OkStatus();
  return WriteJournalLocked(/*sync=*/false);
}

absl::Status ClusterState::WriteJournalLocked(bool sync) {
  if (!journal_) return absl::OkStatus();
  // Its cost is measured on the real clock: it is what a write takes, not
  // part of the job's logic.
  const absl::Time start = absl::Now();
  const SchedulerJournal snapshot = SnapshotLocked();
  const uint64_t seq = ++journal_seq_;
  absl::Status written;
  {
    absl::MutexLock file(&journal_file_mu_);
    written = journal_(snapshot, sync);
    if (written.ok()) journal_written_seq_ = seq;
  }
  if (written.ok()) journal_dirty_ = false;
  return RecordJournalWriteLocked(written, absl::Now() - start,
                                  snapshot.ByteSizeLong());
}

uint64_t ClusterState::SnapshotForAfterLockLocked(SchedulerJournal* snapshot) {
  *snapshot = SnapshotLocked();
  journal_dirty_ = false;  // set again if the write fails
  journal_file_mu_.Lock();  // WriteJournalAfterLock releases it
  return ++journal_seq_;
}

absl::Status ClusterState::WriteJournalAfterLock(
    const SchedulerJournal& snapshot, uint64_t seq) {
  const absl::Time start = absl::Now();
  // A later snapshot, which holds this one's changes, is on disk already.
  if (seq <= journal_written_seq_) {
    journal_file_mu_.Unlock();
    return absl::OkStatus();
  }
  const absl::Status written = journal_(snapshot, /*sync=*/false);
  if (written.ok()) journal_written_seq_ = seq;
  journal_file_mu_.Unlock();
  absl::MutexLock lock(&mu_);
  // The snapshot cleared journal_dirty_; changes since set it again.
  if (!written.ok()) journal_dirty_ = true;  // the next write tries again
  return RecordJournalWriteLocked(written, absl::Now() - start,
                                  snapshot.ByteSizeLong());
}

bool ClusterState::JournalWritten(uint64_t seq) {
  absl::MutexLock file(&journal_file_mu_);
  return journal_written_seq_ >= seq;
}

absl::Status ClusterState::RecordJournalWriteLocked(const absl::Status& written,
                                                    absl::Duration took,
                                                    size_t bytes) {
  ++journal_writes_;
  journal_write_time_ += took;
  journal_bytes_ = bytes;
  const absl::Time now = clock_->Now();
  if (written.ok()) {
    if (!journal_error_.ok()) {
      SchedulerLog()->info(
          "the scheduler journal can be written again: taking changes again");
      journal_error_ = absl::OkStatus();
    }
    return absl::OkStatus();
  }
  // Still dirty: the next call tries again.
  journal_error_ = absl::UnavailableError(
      absl::StrCat("the scheduler cannot write its journal, and takes no "
                   "changes until it can: ",
                   written.message()));
  if (now - last_journal_error_log_ >= absl::Seconds(10)) {
    last_journal_error_log_ = now;
    SchedulerLog()->error(
        "{} (a change it could not record is answered as failed)",
        journal_error_.message());
  }
  return journal_error_;
}

SchedulerJournal ClusterState::SnapshotLocked() const {
  SchedulerJournal j;
  j.set_config_fingerprint(fingerprint_);
  j.set_written_unix_ms(absl::ToUnixMillis(clock_->Now()));
  *j.mutable_view() = view_;
  j.set_next_node_id(next_node_id_);
  for (const auto& [id, node] : nodes_) {
    JournalNode* n = j.add_nodes();
    *n->mutable_info() = node.info;
    n->set_clock(node.clock);
    n->set_finished(node.finished);
    n->set_trains_shards(node.trains_shards);
  }
  std::vector<uint32_t> ever(worker_ranks_ever_.begin(), worker_ranks_ever_.end());
  std::sort(ever.begin(), ever.end());
  for (uint32_t r : ever) j.add_worker_ranks_ever(r);
  j.set_some_worker_finished(some_worker_finished_);
  shards_.ToJournal(&j);
  tracker_.ToJournal(&j);
  for (const auto& [name, arrived] : barriers_) {
    JournalBarrier* b = j.add_barriers();
    b->set_name(name);
    for (uint64_t id : arrived) b->add_arrived(id);
    b->set_completed(completed_barriers_.contains(name));
    if (auto it = barrier_nodes_.find(name); it != barrier_nodes_.end()) {
      for (uint64_t id : it->second) b->add_released(id);
    }
  }
  j.set_base_clock(base_clock_);
  j.set_max_clock_ever(max_clock_ever_);
  j.set_last_checkpoint(last_checkpoint_);
  j.set_checkpoint_margin(checkpoint_margin_);
  j.set_checkpoint_wanted(checkpoint_wanted_);
  j.set_abandoned_checkpoint(abandoned_checkpoint_);
  j.set_launch_id(launch_id_);
  j.set_listen_port(listen_port_);
  j.set_stopped(stopped_);
  for (const SlotMove& m : queued_moves_) *j.add_queued_moves() = m;
  for (uint32_t r : removing_) j.add_removing_servers(r);
  if (checkpoint_.has_value()) {
    j.mutable_checkpoint()->set_clock(checkpoint_->clock);
    for (const auto& [id, report] : checkpoint_->reports) {
      *j.mutable_checkpoint()->add_reports() = report;
    }
  }
  return j;
}

namespace {

// What is wrong with the journal's slot moves and scale-in, or "".
std::string BadMoves(const SchedulerJournal& j, uint32_t num_servers,
                     uint32_t num_slots) {
  auto bad_move = [&](const SlotMove& m) {
    if (m.source() >= num_servers || m.target() >= num_servers ||
        m.source() == m.target() || m.slots_size() == 0) {
      return true;
    }
    for (uint32_t s : m.slots()) {
      if (s >= num_slots) return true;
    }
    return false;
  };
  const ClusterView& v = j.view();
  for (const SlotMove& m : v.moves()) {
    if (bad_move(m)) return "a slot move names bad ranks or slots";
    for (uint32_t s : m.slots()) {
      if (static_cast<int>(s) >= v.slot_owner_size() ||
          v.slot_owner(s) != m.source()) {
        return absl::StrCat("a slot move's slot ", s, " is not its source's");
      }
    }
  }
  for (const SlotMove& m : j.queued_moves()) {
    if (bad_move(m)) return "a queued slot move names bad ranks or slots";
  }
  for (uint32_t r : j.removing_servers()) {
    if (r >= num_servers)
      return absl::StrCat("server rank ", r, " being removed");
  }
  return "";
}

}  // namespace

absl::Status ClusterState::ValidateJournal(const SchedulerJournal& j) const {
  if (j.config_fingerprint() != fingerprint_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the journal is of a job with config fingerprint ", j.config_fingerprint(),
        ", this scheduler's is ", fingerprint_));
  }
  auto bad = [](auto&&... what) {
    return absl::DataLossError(absl::StrCat("scheduler journal: ", what...));
  };
  const ClusterView& v = j.view();
  const uint32_t num_servers = MaxServers();
  const uint32_t num_workers = config_.cluster().num_workers();
  const uint32_t num_slots = config_.cluster().num_slots();
  if (v.epoch() == 0) return bad("view epoch 0");
  if (j.listen_port() > 65535) return bad("listen port ", j.listen_port());
  if (!JobState_IsValid(v.job_state()))
    return bad("unknown job state ", v.job_state());
  if (v.num_slots() != num_slots) {
    return bad("the view has ", v.num_slots(), " slots, the config ", num_slots);
  }
  if (v.slot_owner_size() != 0 && static_cast<uint32_t>(v.slot_owner_size()) != num_slots) {
    return bad("slot_owner has ", v.slot_owner_size(), " entries for ", num_slots, " slots");
  }
  for (uint32_t owner : v.slot_owner()) {
    if (owner >= num_servers) return bad("a slot is owned by server rank ", owner);
  }
  if (v.slot_backup_size() != 0 && v.slot_backup_size() != v.slot_owner_size()) {
    return bad("slot_backup has ", v.slot_backup_size(), " entries for ",
               v.slot_owner_size(), " owners");
  }
  for (uint32_t backup : v.slot_backup()) {
    if (backup >= num_servers && backup != kNoBackup) {
      return bad("a slot is backed by server rank ", backup);
    }
  }
  if (ValidateConsistency(v.consistency()) != absl::OkStatus()) {
    return bad("invalid consistency settings");
  }
  absl::flat_hash_set<uint64_t> ids;
  absl::flat_hash_set<std::pair<int, uint32_t>> live_ranks;
  for (const JournalNode& n : j.nodes()) {
    const NodeInfo& info = n.info();
    if (info.node_id() == 0 || info.node_id() >= j.next_node_id()) {
      return bad("node id ", info.node_id(), " outside 1..", j.next_node_id() - 1);
    }
    if (!ids.insert(info.node_id()).second) return bad("node ", info.node_id(), " twice");
    if (info.role() != SERVER && info.role() != WORKER) {
      return bad("node ", info.node_id(), " has no role");
    }
    if (info.rank() >=
        (info.role() == SERVER ? num_servers : ExpectedCount(info.role()))) {
      return bad("node ", info.node_id(), " has rank ", info.rank());
    }
    if (!NodeState_IsValid(info.state())) return bad("node ", info.node_id(), " bad state");
    if (info.state() == ALIVE && !live_ranks.insert({info.role(), info.rank()}).second) {
      return bad("two live nodes hold ", info.role() == SERVER ? "server" : "worker",
                 " rank ", info.rank());
    }
  }
  if (std::string why = BadMoves(j, num_servers, num_slots); !why.empty()) {
    return bad(why);
  }
  for (uint32_t r : j.worker_ranks_ever()) {
    if (r >= num_workers) return bad("worker rank ", r, " in worker_ranks_ever");
  }
  if (static_cast<uint32_t>(j.shards_size()) != num_workers) {
    return bad(j.shards_size(), " shards for ", num_workers, " workers");
  }
  for (int s = 0; s < j.shards_size(); ++s) {
    const JournalShard& shard = j.shards(s);
    if (!JournalShard::State_IsValid(shard.state())) return bad("shard ", s, " bad state");
    if (shard.position().shard() != static_cast<uint32_t>(s)) {
      return bad("shard ", s, " has the position of shard ", shard.position().shard());
    }
    if (shard.state() == JournalShard::ACTIVE && !ids.contains(shard.holder())) {
      return bad("shard ", s, " is held by unknown node ", shard.holder());
    }
  }
  for (const JournalBarrier& b : j.barriers()) {
    if (b.name().empty() || b.name().size() > 256) return bad("a barrier name");
    for (uint64_t id : b.released()) {
      if (!ids.contains(id)) return bad("barrier '", b.name(), "' lists unknown node ", id);
    }
  }
  // Checkpoint clocks are set above these; one at or past "finished" would
  // push every later checkpoint out of reach.
  for (const auto& [name, clock] :
       {std::pair<const char*, uint64_t>{"base_clock", j.base_clock()},
        {"max_clock_ever", j.max_clock_ever()},
        {"last_checkpoint", j.last_checkpoint()},
        {"abandoned_checkpoint", j.abandoned_checkpoint()},
        {"checkpoint.clock", j.checkpoint().clock()}}) {
    if (clock >= kFinishedClock) return bad(name, " ", clock, " is not a training clock");
  }
  for (const ReportCheckpointRequest& r : j.checkpoint().reports()) {
    if (!ids.contains(r.node_id())) return bad("a checkpoint report of unknown node ", r.node_id());
  }
  return absl::OkStatus();
}

absl::Status ClusterState::Recover(const SchedulerJournal& j) {
  if (absl::Status valid = ValidateJournal(j); !valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  const absl::Time now = clock_->Now();
  view_ = j.view();
  next_node_id_ = j.next_node_id();
  nodes_.clear();
  uint32_t alive = 0;
  for (const JournalNode& n : j.nodes()) {
    Node& node = nodes_[n.info().node_id()];
    node.info = n.info();
    node.clock = n.clock();
    node.finished = n.finished();
    node.trains_shards = n.trains_shards();
    // A whole heartbeat timeout to be heard from the new scheduler.
    node.last_heartbeat = now;
    alive += node.info.state() == ALIVE;
  }
  worker_ranks_ever_.clear();
  worker_ranks_ever_.insert(j.worker_ranks_ever().begin(), j.worker_ranks_ever().end());
  some_worker_finished_ = j.some_worker_finished();
  shards_.FromJournal(j);
  tracker_.FromJournal(j);
  barriers_.clear();
  completed_barriers_.clear();
  barrier_nodes_.clear();
  barrier_ranks_.clear();
  barrier_started_.clear();
  for (const JournalBarrier& b : j.barriers()) {
    auto& arrived = barriers_[b.name()];
    arrived.insert(b.arrived().begin(), b.arrived().end());
    barrier_started_[b.name()] = now;
    if (b.completed()) {
      completed_barriers_.insert(b.name());
      barrier_nodes_[b.name()].assign(b.released().begin(), b.released().end());
    }
  }
  launch_id_ = j.launch_id();
  listen_port_ = j.listen_port();
  base_clock_ = j.base_clock();
  max_clock_ever_ = j.max_clock_ever();
  last_checkpoint_ = j.last_checkpoint();
  checkpoint_margin_ = std::max<uint64_t>(2, j.checkpoint_margin());
  checkpoint_wanted_ = j.checkpoint_wanted();
  abandoned_checkpoint_ = j.abandoned_checkpoint();
  queued_moves_.assign(j.queued_moves().begin(), j.queued_moves().end());
  // A retry's wait is bounded as it was when journaled: a journal written
  // by a clock that ran ahead (or edited) must not hold a move back for
  // longer than the longest wait a retry gets.
  const int64_t latest =
      absl::ToUnixMicros(clock_->Now() + kMoveRetryWait * kMoveAttempts);
  for (SlotMove& m : queued_moves_) {
    if (m.not_before_unix_micros() > latest)
      m.set_not_before_unix_micros(latest);
  }
  removing_.assign(j.removing_servers().begin(), j.removing_servers().end());
  checkpoint_.reset();
  if (j.checkpoint().clock() != 0) {
    // The checkpoint in progress goes on: the nodes that reported keep
    // their reports, the others report when they get there (or a node that
    // died meanwhile abandons it, as usual).
    PendingCheckpoint pending;
    pending.clock = j.checkpoint().clock();
    pending.started = now;
    for (const ReportCheckpointRequest& r : j.checkpoint().reports()) {
      pending.reports[r.node_id()] = r;
    }
    checkpoint_ = std::move(pending);
    view_.set_checkpoint_clock(checkpoint_->clock);
  } else {
    view_.set_checkpoint_clock(0);
  }
  min_clock_since_ = now;
  GrantGraceLocked(now, kRecoveryGrace);
  view_.set_scheduler_restarts(view_.scheduler_restarts() + 1);
  view_.set_recovered_nodes(alive);
  view_.set_recovered_epoch(view_.epoch() + 1);
  BumpEpochLocked();
  const uint32_t done = shards_.CountDone();
  SchedulerLog()->info(
      "took the job back from its journal (restart {}): epoch {}, job {}, {} "
      "live nodes, "
      "{} of {} shards done{}",
      view_.scheduler_restarts(), view_.epoch(),
      JobState_Name(view_.job_state()), alive, done, shards_.size(),
      checkpoint_.has_value() ? absl::StrCat(", checkpoint at clock ",
                                             checkpoint_->clock, " in progress")
                              : std::string());
  return absl::OkStatus();
}

}  // namespace ps
