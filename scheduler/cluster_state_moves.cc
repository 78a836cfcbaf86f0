// ClusterState: live scale-out and scale-in by slot moves (the contract is
// in cluster_state.h, at Scale; the servers' side in server/server.h).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/protocol.h"
#include "scheduler/cluster_state.h"
#include "scheduler/move_planner.h"
#include "scheduler/scheduler_log.h"

namespace ps {
namespace {

std::string Describe(const SlotMove& m) {
  return absl::StrCat(m.slots_size(), " slots from server ", m.source(),
                      " to server ", m.target(),
                      m.promote() ? " (their backup)" : "");
}

bool Involves(const SlotMove& m, uint32_t rank) {
  return m.source() == rank || m.target() == rank;
}

}  // namespace

std::vector<uint64_t> ClusterState::SlotWeightsLocked(bool* by_bytes) const {
  const uint32_t num_slots = config_.cluster().num_slots();
  std::vector<uint64_t> weight(num_slots, 1);
  // The bytes of each owner's slots, from its newest report.
  std::vector<const std::vector<uint64_t>*> report(MaxServers(), nullptr);
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() != SERVER || node.info.state() != ALIVE) continue;
    auto it = slot_bytes_.find(id);
    if (it != slot_bytes_.end()) report[node.info.rank()] = &it->second;
  }
  *by_bytes = true;
  for (uint32_t s = 0; s < num_slots && *by_bytes; ++s) {
    const uint32_t owner = view_.slot_owner(s);
    *by_bytes = owner < report.size() && report[owner] != nullptr;
  }
  if (!*by_bytes) return weight;
  // One byte more per slot: empty slots still spread evenly.
  for (uint32_t s = 0; s < num_slots; ++s) {
    weight[s] = (*report[view_.slot_owner(s)])[s] + 1;
  }
  return weight;
}

absl::StatusOr<ScaleResponse> ClusterState::Scale(const ScaleRequest& request) {
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  PS_RETURN_IF_ERROR(journal.Admit());
  if (!Elastic()) {
    return absl::FailedPreconditionError(
        "the job is not elastic: its config has no cluster.elastic");
  }
  if (view_.job_state() != RUNNING) {
    return absl::FailedPreconditionError("the job is not running");
  }
  if (view_.moves_size() > 0 || !queued_moves_.empty() || !removing_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        view_.moves_size() + queued_moves_.size(),
        " slot moves are in progress (psctl status shows them): ask again "
        "once they are done"));
  }
  MovePlanInput in;
  in.owner.assign(view_.slot_owner().begin(), view_.slot_owner().end());
  in.backup.assign(view_.slot_backup().begin(), view_.slot_backup().end());
  bool by_bytes = false;
  in.weight = SlotWeightsLocked(&by_bytes);
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() == SERVER && node.info.state() == ALIVE &&
        !node.info.draining()) {
      in.live.push_back(node.info.rank());
    }
  }
  std::sort(in.live.begin(), in.live.end());
  in.servers = request.servers();
  in.remove.assign(request.remove().begin(), request.remove().end());
  in.replicated = Replicated();
  PS_ASSIGN_OR_RETURN(MovePlan plan, PlanMoves(in));
  ScaleResponse response;
  const int64_t now = absl::ToUnixMicros(clock_->Now());
  for (SlotMove& m : plan.moves) m.set_started_unix_micros(now);
  *response.mutable_moves() = {plan.moves.begin(), plan.moves.end()};
  for (uint32_t r : plan.emptied) response.add_emptied(r);
  response.set_note(absl::StrCat(
      plan.moves.empty()
          ? "nothing to move"
          : absl::StrCat(plan.moves.size(), " moves of ", plan.slots_moved,
                         " slots (",
                         plan.weight_moved * 100 /
                             std::max<uint64_t>(1, plan.weight_total),
                         "% of the ", by_bytes ? "bytes" : "slots", ")"),
      plan.added.empty() ? ""
                         : absl::StrCat("; spares taking slots: server ",
                                        absl::StrJoin(plan.added, ", ")),
      plan.emptied.empty()
          ? ""
          : absl::StrCat("; emptied, then drained (exit 0): server ",
                         absl::StrJoin(plan.emptied, ", ")),
      by_bytes ? ""
               : "; balanced by slot counts (not every server has "
                 "reported its bytes yet)"));
  if (request.dry_run() || plan.moves.empty()) return response;
  SchedulerLog()->info("scale to {} servers: {}", request.servers(),
                       response.note());
  removing_ = plan.emptied;
  queued_moves_ = std::move(plan.moves);
  StartQueuedMovesLocked();
  BumpEpochLocked();
  response.set_epoch(view_.epoch());
  PS_RETURN_IF_ERROR(journal.Commit());
  return response;
}

void ClusterState::StartMoveLocked(SlotMove move) {
  move.set_phase(SlotMove::COPYING);
  // The epoch of the view this call's caller publishes.
  move.set_copy_epoch(view_.epoch() + 1);
  move.set_fence_epoch(0);
  move.set_copied(false);
  SchedulerLog()->info("move of {}: copying", Describe(move));
  *view_.add_moves() = std::move(move);
}

bool ClusterState::StartQueuedMovesLocked() {
  const uint32_t limit = config_.cluster().elastic().max_concurrent_moves();
  const int64_t now = absl::ToUnixMicros(clock_->Now());
  bool started = false;
  for (auto it = queued_moves_.begin(); it != queued_moves_.end();) {
    if (limit != 0 && static_cast<uint32_t>(view_.moves_size()) >= limit) break;
    // One move per (source, target) pair at a time: a pair's promotion
    // and copy run one after the other. A retry waits for its time.
    bool busy = it->not_before_unix_micros() > now;
    for (const SlotMove& m : view_.moves()) {
      busy |= m.source() == it->source() && m.target() == it->target();
    }
    if (busy) {
      ++it;
      continue;
    }
    StartMoveLocked(std::move(*it));
    it = queued_moves_.erase(it);
    started = true;
  }
  return started;
}

bool ClusterState::FencingLocked() const {
  for (const SlotMove& m : view_.moves()) {
    if (m.phase() == SlotMove::FENCING) return true;
  }
  return false;
}

void ClusterState::StartFenceLocked(SlotMove* move) {
  move->set_phase(SlotMove::FENCING);
  move->set_copied(false);
  move->set_fence_epoch(view_.epoch() + 1);
  SchedulerLog()->info("move of {}: copied ({} rows, {:.1f} MB); fencing",
                       Describe(*move), move->rows_copied(),
                       move->bytes_copied() / 1e6);
}

bool ClusterState::TargetReceivingCopyLocked(const SlotMove& move) const {
  for (const SlotMove& m : view_.moves()) {
    if (&m != &move && m.target() == move.target() &&
        m.phase() == SlotMove::COPYING && !m.copied() && !m.promote()) {
      return true;
    }
  }
  return false;
}

bool ClusterState::StartDeferredFencesLocked() {
  if (checkpoint_.has_value()) return false;
  bool started = false;
  for (SlotMove& m : *view_.mutable_moves()) {
    if (m.phase() == SlotMove::COPYING && m.copied() &&
        !TargetReceivingCopyLocked(m)) {
      StartFenceLocked(&m);
      started = true;
    }
  }
  return started;
}

absl::Status ClusterState::ReportMove(const ReportMoveRequest& request) {
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  PS_RETURN_IF_ERROR(journal.Admit());
  auto it = nodes_.find(request.node_id());
  if (it == nodes_.end() || it->second.info.state() != ALIVE ||
      it->second.info.role() != SERVER) {
    return absl::NotFoundError(absl::StrCat(
        "node ", request.node_id(), " is not a live server of the job"));
  }
  if (request.error().size() > 65536) {
    return absl::InvalidArgumentError("error too long");
  }
  int index = -1;
  for (int i = 0; i < view_.moves_size(); ++i) {
    const SlotMove& m = view_.moves(i);
    if (m.source() == it->second.info.rank() &&
        m.source() == request.source() && m.target() == request.target()) {
      index = i;
    }
  }
  SlotMove* move = index < 0 ? nullptr : view_.mutable_moves(index);
  const bool copied = request.stage() == ReportMoveRequest::COPIED &&
                      move != nullptr && move->phase() == SlotMove::COPYING &&
                      move->copy_epoch() == request.epoch();
  const bool fenced = request.stage() == ReportMoveRequest::FENCED &&
                      move != nullptr && move->phase() == SlotMove::FENCING &&
                      move->fence_epoch() == request.epoch();
  const bool aborted = request.stage() == ReportMoveRequest::ABORTED &&
                       move != nullptr &&
                       (move->copy_epoch() == request.epoch() ||
                        move->fence_epoch() == request.epoch());
  if (!copied && !fenced && !aborted) {
    return absl::FailedPreconditionError(
        absl::StrCat("no move from server ", request.source(), " to server ",
                     request.target(), " at epoch ", request.epoch(),
                     " is in that phase (a stale report)"));
  }
  if (copied) {
    move->set_rows_copied(request.rows_copied());
    move->set_bytes_copied(request.bytes_copied());
    if (checkpoint_.has_value()) {
      move->set_copied(true);  // fenced once the checkpoint is over
      journal_dirty_ = true;
      SchedulerLog()->info(
          "move of {}: copied; the fence waits for the checkpoint at clock {}",
          Describe(*move), checkpoint_->clock);
      return journal.Commit();
    }
    // The target confirms a fence once it applied everything before it;
    // while it is importing another move's copy that would take as long
    // as that copy, so the fence waits for the copy's end instead.
    if (TargetReceivingCopyLocked(*move)) {
      move->set_copied(true);
      journal_dirty_ = true;
      SchedulerLog()->info(
          "move of {}: copied; the fence waits for the target's other copy",
          Describe(*move));
      return journal.Commit();
    }
    StartFenceLocked(move);
    StartDeferredFencesLocked();  // fences that waited for this copy
  } else if (fenced) {
    FlipMoveLocked(index);
    FinishScaleInLocked();
    StartQueuedMovesLocked();
    StartDeferredFencesLocked();
  } else if (RetryMoveLocked(index, request.error())) {
    StartQueuedMovesLocked();
    StartDeferredFencesLocked();
  } else {
    SchedulerLog()->error("move of {} abandoned: {}", Describe(*move),
                          request.error());
    const uint32_t source = move->source();
    view_.mutable_moves()->DeleteSubrange(index, 1);
    // A scale-in that cannot empty its server stops there: the server's
    // other moves go too.
    if (auto r = std::find(removing_.begin(), removing_.end(), source);
        r != removing_.end()) {
      removing_.erase(r);
      auto from_source = [&](const SlotMove& m) {
        return m.source() == source;
      };
      queued_moves_.erase(std::remove_if(queued_moves_.begin(),
                                         queued_moves_.end(), from_source),
                          queued_moves_.end());
      auto& moves = *view_.mutable_moves();
      for (int i = moves.size() - 1; i >= 0; --i) {
        if (from_source(moves.Get(i))) moves.DeleteSubrange(i, 1);
      }
      SchedulerLog()->warn("server {} stays (a move off it was abandoned)",
                           source);
    }
    StartQueuedMovesLocked();
    StartDeferredFencesLocked();
  }
  BumpEpochLocked();
  return journal.Commit();
}

bool ClusterState::RetryMoveLocked(int index, const std::string& error) {
  SlotMove move = view_.moves(index);
  const uint32_t attempt = std::max<uint32_t>(1, move.attempt());
  bool source_live = false;
  bool target_live = false;
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() != SERVER || node.info.state() != ALIVE) continue;
    source_live |= node.info.rank() == move.source();
    target_live |= node.info.rank() == move.target() && !node.info.draining();
  }
  if (attempt >= kMoveAttempts || !source_live || !target_live) return false;
  view_.mutable_moves()->DeleteSubrange(index, 1);
  const absl::Duration wait = kMoveRetryWait * attempt;
  SchedulerLog()->warn(
      "move of {} aborted (try {} of {}): {}; trying again in {} from a "
      "fresh copy",
      Describe(move), attempt, kMoveAttempts, error,
      absl::FormatDuration(wait));
  move.set_attempt(attempt + 1);
  move.set_not_before_unix_micros(absl::ToUnixMicros(clock_->Now() + wait));
  move.set_phase(SlotMove::PHASE_UNSPECIFIED);
  move.set_copy_epoch(0);
  move.set_fence_epoch(0);
  move.set_rows_copied(0);
  move.set_bytes_copied(0);
  move.set_copied(false);
  queued_moves_.insert(queued_moves_.begin(), std::move(move));
  return true;
}

void ClusterState::FlipMoveLocked(int index) {
  const SlotMove move = view_.moves(index);
  view_.mutable_moves()->DeleteSubrange(index, 1);
  SlotMap slots = SlotsLocked();
  std::vector<uint32_t> owner = slots.owner();
  std::vector<uint32_t> backup = slots.backup();
  for (uint32_t s : move.slots()) {
    owner[s] = move.target();
    // The source holds an identical copy (it was fenced): it becomes the
    // backup, no copy needed.
    if (!backup.empty()) backup[s] = move.source();
  }
  SetSlotsLocked(SlotMap(MaxServers(), std::move(owner), std::move(backup)));
  const double seconds =
      move.started_unix_micros() == 0
          ? 0
          : (absl::ToUnixMicros(clock_->Now()) - move.started_unix_micros()) /
                1e6;
  SchedulerLog()->info(
      "move of {} done in {:.1f} s: server {} owns them{}", Describe(move),
      seconds, move.target(),
      Replicated() ? absl::StrCat(", server ", move.source(), " backs them")
                   : "");
}

bool ClusterState::CancelMovesLocked(uint32_t rank, const std::string& why) {
  bool any = false;
  auto& moves = *view_.mutable_moves();
  for (int i = moves.size() - 1; i >= 0; --i) {
    const SlotMove& m = moves.Get(i);
    bool allowed = !Involves(m, rank);
    for (uint32_t s : m.slots()) {
      const bool backed_by_target =
          view_.slot_backup_size() > 0 && view_.slot_backup(s) == m.target();
      allowed &=
          view_.slot_owner(s) == m.source() && backed_by_target == m.promote();
    }
    if (allowed) continue;
    SchedulerLog()->warn("move of {} abandoned: {}", Describe(m), why);
    moves.DeleteSubrange(i, 1);
    any = true;
  }
  const size_t queued = queued_moves_.size();
  queued_moves_.erase(
      std::remove_if(queued_moves_.begin(), queued_moves_.end(),
                     [&](const SlotMove& m) { return Involves(m, rank); }),
      queued_moves_.end());
  any |= queued != queued_moves_.size();
  if (auto r = std::find(removing_.begin(), removing_.end(), rank);
      r != removing_.end()) {
    removing_.erase(r);
    any = true;
  }
  if (any) StartQueuedMovesLocked();
  return any;
}

bool ClusterState::FinishScaleInLocked() {
  bool any = false;
  for (auto r = removing_.begin(); r != removing_.end();) {
    const uint32_t rank = *r;
    bool busy = std::count(view_.slot_owner().begin(), view_.slot_owner().end(),
                           rank) > 0;
    for (const SlotMove& m : view_.moves()) busy |= Involves(m, rank);
    for (const SlotMove& m : queued_moves_) busy |= Involves(m, rank);
    if (busy) {
      ++r;
      continue;
    }
    // Its backups go first to servers that stay, which copy them as for
    // any new backup.
    if (Replicated()) {
      SlotMap slots = SlotsLocked();
      std::vector<uint32_t> backup = slots.backup();
      uint32_t rehomed = 0;
      for (uint32_t& b : backup) {
        if (b == rank) {
          b = kNoBackup;
          ++rehomed;
        }
      }
      std::vector<bool> eligible = LiveServersLocked();
      for (uint32_t gone : removing_) {
        if (gone < eligible.size()) eligible[gone] = false;
      }
      SlotMap rest(MaxServers(), slots.owner(), std::move(backup));
      const SlotMap::Assigned assigned = rest.AssignBackups(eligible);
      SetSlotsLocked(rest);
      SchedulerLog()->info(
          "server {} holds no slot now; its {} backup copies go to other "
          "servers ({} placed)",
          rank, rehomed, assigned.assigned);
    }
    for (auto& [id, node] : nodes_) {
      if (node.info.role() == SERVER && node.info.state() == ALIVE &&
          node.info.rank() == rank) {
        node.info.set_draining(true);
      }
    }
    SchedulerLog()->info("server {} is emptied: draining it (it exits 0)",
                         rank);
    r = removing_.erase(r);
    any = true;
  }
  return any;
}

std::vector<std::string> ClusterState::CheckMoves() {
  std::vector<std::string> lines;
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  if (!journal.Admit().ok() || view_.job_state() != RUNNING) return lines;
  const int before = view_.moves_size();
  bool changed = StartDeferredFencesLocked();
  changed |= StartQueuedMovesLocked();
  changed |= FinishScaleInLocked();
  if (!changed) return lines;
  lines.push_back(absl::StrCat(view_.moves_size(), " moves in progress (",
                               before, " before)"));
  BumpEpochLocked();
  journal.Commit().IgnoreError();  // retried by SyncJournal
  return lines;
}

bool ClusterState::IsSpareRankLocked(uint32_t rank) const {
  if (!Elastic() || view_.job_state() != RUNNING) return false;
  return std::count(view_.slot_owner().begin(), view_.slot_owner().end(),
                    rank) == 0;
}

}  // namespace ps
