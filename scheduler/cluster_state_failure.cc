// ClusterState: when a running job cannot continue (JobState FAILED).
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/cluster_state.h"
#include "scheduler/scheduler_log.h"

namespace ps {
namespace {

// "slots 0-170, 342-511 (of server 0, 1)": `slots` ascending, runs of
// consecutive slots compressed; `owners` the server ranks they belong to.
std::string DescribeSlots(const std::vector<uint32_t>& slots,
                          const std::set<uint32_t>& owners) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < slots.size();) {
    size_t j = i;
    while (j + 1 < slots.size() && slots[j + 1] == slots[j] + 1) ++j;
    runs.push_back(i == j ? absl::StrCat(slots[i])
                          : absl::StrCat(slots[i], "-", slots[j]));
    i = j + 1;
  }
  return absl::StrCat(slots.size() == 1 ? "slot " : "slots ",
                      absl::StrJoin(runs, ", "), " (of server ",
                      absl::StrJoin(owners, ", "), ")");
}

}  // namespace

std::vector<std::string> ClusterState::CheckCanContinue() {
  // Whether a checkpoint exists is looked up without the lock (it may read
  // a whole checkpoint), once each time slots are found lost.
  bool look_up = false;
  {
    absl::MutexLock lock(&mu_);
    if (view_.job_state() != RUNNING) return {};
    const std::vector<uint32_t> lost = LostSlotsLocked();
    // Slots whose owner reported its shard to a checkpoint still pending
    // (a preempted server writes, reports, then leaves) become restorable
    // when it commits: nothing is judged until it commits or is abandoned.
    if (!lost_restorable_.has_value() && !lost.empty() &&
        PendingCheckpointHoldsLocked(lost)) {
      return {};
    }
    look_up = !lost_restorable_.has_value() && !lost.empty();
  }
  std::optional<bool> restorable;
  if (look_up) restorable = store_.latest && store_.latest().ok();
  absl::MutexLock lock(&mu_);
  JournalScope journal(this);
  // Nothing changes while the journal cannot record it.
  if (!journal.Admit().ok() || view_.job_state() != RUNNING) return {};
  const absl::Time now = clock_->Now();
  const std::string why = FailureLocked(now, restorable);
  if (why.empty()) return {};
  FailJobLocked(why, now);
  journal.Commit().IgnoreError();  // retried by SyncJournal
  return {why};
}

bool ClusterState::PendingCheckpointHoldsLocked(
    const std::vector<uint32_t>& slots) const {
  if (!checkpoint_.has_value()) return false;
  std::set<uint32_t> reported;
  for (const auto& [id, report] : checkpoint_->reports) {
    auto it = nodes_.find(id);
    if (it != nodes_.end() && it->second.info.role() == SERVER) {
      reported.insert(it->second.info.rank());
    }
  }
  for (uint32_t s : slots) {
    if (reported.count(view_.slot_owner(s)) == 0) return false;
  }
  return true;
}

std::vector<uint32_t> ClusterState::LostSlotsLocked() const {
  std::vector<uint32_t> lost;
  if (view_.job_state() != RUNNING) return lost;
  const std::vector<bool> live = LiveServersLocked();
  for (int s = 0; s < view_.slot_owner_size(); ++s) {
    const uint32_t owner = view_.slot_owner(s);
    if (owner >= live.size() || !live[owner]) lost.push_back(s);
  }
  return lost;
}

std::string ClusterState::FailureLocked(absl::Time now,
                                        std::optional<bool> restorable) {
  const ClusterConfig& cl = config_.cluster();
  const std::vector<uint32_t> lost = LostSlotsLocked();
  if (lost.empty()) {
    lost_since_ = absl::InfiniteFuture();
    lost_restorable_.reset();
  } else {
    if (!lost_restorable_.has_value() && restorable.has_value()) {
      lost_restorable_ = restorable;
      lost_since_ = now;
    }
    std::set<uint32_t> owners;
    for (uint32_t s : lost) owners.insert(view_.slot_owner(s));
    if (lost_restorable_.has_value() && !*lost_restorable_) {
      return absl::StrCat(DescribeSlots(lost, owners),
                          " have no live copy and there is no checkpoint to "
                          "restore them from",
                          config_.checkpoint().dir().empty()
                              ? " (the job has no checkpoint.dir)"
                              : "");
    }
    const absl::Duration wait = absl::Milliseconds(cl.failover_timeout_ms());
    if (now - lost_since_ >= wait) {
      return absl::StrCat(
          DescribeSlots(lost, owners),
          " have no live copy and no replacement server registered to restore "
          "them within ",
          absl::FormatDuration(wait), " (cluster.failover_timeout_ms)");
    }
  }
  bool anyone = false;
  for (const auto& [id, node] : nodes_) anyone |= node.info.state() == ALIVE;
  if (anyone) {
    empty_since_ = absl::InfiniteFuture();
    return "";
  }
  empty_since_ = std::min(empty_since_, now);
  // Nodes cut off from the scheduler that long have given up (exit 4).
  const absl::Duration bound =
      absl::Milliseconds(cl.scheduler_unreachable_timeout_ms());
  if (now - empty_since_ < bound) return "";
  return absl::StrCat("no server or worker has been alive for ",
                      absl::FormatDuration(bound),
                      " (cluster.scheduler_unreachable_timeout_ms)");
}

void ClusterState::FailJobLocked(const std::string& why, absl::Time now) {
  view_.set_job_state(FAILED);
  view_.set_failure(why);
  failed_at_ = now;
  AbortCheckpointLocked("the job failed");
  SchedulerLog()->error("the job cannot continue: {}; every process exits 5",
                        why);
  BumpEpochLocked();
}

}  // namespace ps
