// ClusterState::Drain: which nodes may be asked to leave, and how.
//
// A drained node runs its own SIGTERM path, so what is safe to drain is
// what is safe to preempt: a worker whose shard another live worker can
// take over (REASSIGN resumes it from the exact position the worker leaves
// with), and a server whose parameters survive its leaving, either as live
// backups (replication 2: they are promoted as when a server leaves) or as
// the preemption checkpoint it writes before leaving (checkpoint.dir; the
// slots then wait for a replacement server_main to restore them).
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/reasons.h"
#include "scheduler/cluster_state.h"
#include "scheduler/scheduler_log.h"

namespace ps {
namespace {

const char* RoleName(Role r) { return r == SERVER ? "server" : "worker"; }

// Checks the request's own fields, before anything is looked up.
absl::Status CheckDrainRequest(const DrainRequest& request) {
  if (request.target_case() == DrainRequest::kScheduler) {
    return absl::FailedPreconditionError(
        "the scheduler cannot be drained: it runs the job rather than taking "
        "part in it, and exits by itself once the job is finished (or on "
        "SIGTERM, which stops the job)");
  }
  if (request.target_case() == DrainRequest::TARGET_NOT_SET) {
    return absl::InvalidArgumentError(
        "no node given: set node_id, or rank (role and rank)");
  }
  if (request.target_case() == DrainRequest::kRank &&
      request.rank().role() != SERVER && request.rank().role() != WORKER) {
    return absl::InvalidArgumentError("rank.role must be SERVER or WORKER");
  }
  return absl::OkStatus();
}

// The error for a request whose target is not a live member.
absl::Status DrainTargetNotFound(const DrainRequest& request) {
  return absl::NotFoundError(
      request.target_case() == DrainRequest::kNodeId
          ? absl::StrCat(
                "node ", request.node_id(),
                " is not a live member (unknown, left or declared dead)")
          : absl::StrCat("no live ", RoleName(request.rank().role()),
                         " holds rank ", request.rank().rank()));
}

}  // namespace

ClusterState::Node* ClusterState::FindDrainTargetLocked(
    const DrainRequest& request) {
  for (auto& [id, node] : nodes_) {
    if (node.info.state() != ALIVE) continue;
    const bool match =
        request.target_case() == DrainRequest::kNodeId
            ? id == request.node_id()
            : node.info.role() == request.rank().role() &&
                  node.info.rank() == request.rank().rank();
    if (match) return &node;
  }
  return nullptr;
}

absl::StatusOr<std::string> ClusterState::WorkerDrainNoteLocked(
    const NodeInfo& info, const std::string& who) const {
  bool other = false;
  for (const auto& [id, node] : nodes_) {
    other |= node.info.role() == WORKER && node.info.state() == ALIVE &&
             id != info.node_id() && !node.info.draining();
  }
  if (!other) {
    return absl::FailedPreconditionError(absl::StrCat(
        who,
        " is the only live worker not draining: nothing would train the "
        "rest of its shard; start another trainer first"));
  }
  return std::string(
      Reassign()
          ? "it stops after its current step; another worker resumes the "
            "rest of its shard from where it stopped"
          : "it stops after its current step; the rest of its shard is "
            "skipped (cluster.on_worker_loss SKIP_REST)");
}

absl::StatusOr<std::string> ClusterState::ReplicatedDrainNoteLocked(
    uint32_t rank, const std::string& who) const {
  auto live_backup =
      [this](uint32_t backup) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (backup == kNoBackup) return false;
        for (const auto& [id, node] : nodes_) {
          if (node.info.role() == SERVER && node.info.rank() == backup &&
              node.info.state() == ALIVE && !node.info.draining()) {
            return true;
          }
        }
        return false;
      };
  uint32_t owned = 0;
  for (int s = 0; s < view_.slot_owner_size(); ++s) {
    if (view_.slot_owner(s) != rank) continue;
    ++owned;
    const bool recovering =
        std::find(view_.recovering_slots().begin(),
                  view_.recovering_slots().end(),
                  static_cast<uint32_t>(s)) != view_.recovering_slots().end();
    const uint32_t backup =
        s < view_.slot_backup_size() ? view_.slot_backup(s) : kNoBackup;
    if (recovering || !live_backup(backup)) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, " holds the only live copy of slot ", s,
          recovering ? " (still recovering)" : " (no live backup not draining)",
          ": draining it would lose parameters",
          config_.checkpoint().dir().empty()
              ? ""
              : "; stop it with SIGTERM to checkpoint it for a replacement"));
    }
  }
  return absl::StrCat("its ", owned,
                      " slots are promoted to their backups when it leaves");
}

absl::StatusOr<std::string> ClusterState::ServerDrainNoteLocked(
    const NodeInfo& info, const std::string& who) const {
  if (view_.job_state() != RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        who,
        ": the job is not running yet, so its slots are not assigned; "
        "stop the process instead"));
  }
  for (const SlotMove& m : view_.moves()) {
    if (m.source() == info.rank() || m.target() == info.rank()) {
      return absl::FailedPreconditionError(absl::StrCat(
          who,
          " takes part in a slot move; drain it once the moves are "
          "done (psctl status), or empty it live with psctl scale"));
    }
  }
  // A spare holds nothing: it may go at once.
  if (Elastic() &&
      std::count(view_.slot_owner().begin(), view_.slot_owner().end(),
                 info.rank()) == 0 &&
      std::count(view_.slot_backup().begin(), view_.slot_backup().end(),
                 info.rank()) == 0) {
    return std::string("it holds no slot (a spare): it leaves at once");
  }
  if (Replicated()) return ReplicatedDrainNoteLocked(info.rank(), who);
  if (!config_.checkpoint().dir().empty()) {
    return std::string(
        "it checkpoints before leaving; its slots wait for a replacement "
        "server_main, which restores them from that checkpoint");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      who,
      " holds the only copy of its slots (cluster.replication 1) and "
      "the job has no checkpoint.dir: draining it would lose its "
      "parameters"));
}

absl::StatusOr<DrainResponse> ClusterState::Drain(const DrainRequest& request) {
  PS_RETURN_IF_ERROR(CheckDrainRequest(request));
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  PS_RETURN_IF_ERROR(journal.Admit());
  Node* target = FindDrainTargetLocked(request);
  if (target == nullptr) return DrainTargetNotFound(request);
  NodeInfo& info = target->info;
  const std::string who = absl::StrCat(RoleName(info.role()), " rank ", info.rank(),
                                       " (node ", info.node_id(), ")");
  DrainResponse response;
  if (info.draining()) {
    *response.mutable_node() = info;
    response.set_note("already draining");
    return response;
  }
  if (view_.job_state() == FINISHED) {
    return JobFinishedError(
        absl::StrCat("the job has finished; ", who, " leaves by itself"));
  }
  if (view_.job_state() == FAILED) {
    return JobFailedError(absl::StrCat("the job has failed (", view_.failure(),
                                       "); ", who, " exits by itself"));
  }
  absl::StatusOr<std::string> note = info.role() == WORKER
                                         ? WorkerDrainNoteLocked(info, who)
                                         : ServerDrainNoteLocked(info, who);
  if (!note.ok()) return note.status();
  info.set_draining(true);
  SchedulerLog()->info("draining {}: {}", who, *note);
  BumpEpochLocked();
  *response.mutable_node() = info;
  response.set_note(*note);
  PS_RETURN_IF_ERROR(journal.Commit());
  return response;
}

}  // namespace ps
