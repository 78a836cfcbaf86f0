#include "scheduler/move_planner.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/protocol.h"

namespace ps {
namespace {

absl::Status CheckInput(const MovePlanInput& in) {
  const size_t n = in.owner.size();
  if (n == 0 || in.weight.size() != n ||
      (!in.backup.empty() && in.backup.size() != n)) {
    return absl::InvalidArgumentError(
        "the slot map, backups and weights differ in size");
  }
  if (in.servers == 0) {
    return absl::InvalidArgumentError("scale to at least 1 server");
  }
  if (in.replicated && in.servers < 2) {
    return absl::InvalidArgumentError(
        "with cluster.replication 2 a job needs at least 2 servers");
  }
  if (in.servers > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job has only ", n, " slots"));
  }
  const std::set<uint32_t> live(in.live.begin(), in.live.end());
  for (uint32_t r : in.remove) {
    if (live.count(r) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server ", r, " is not a live server (or is draining)"));
    }
  }
  for (size_t s = 0; s < n; ++s) {
    if (live.count(in.owner[s]) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "slot ", s, " is owned by server ", in.owner[s],
          ", which is not live: wait until the job has recovered"));
    }
  }
  return absl::OkStatus();
}

// The servers that own slots once the moves are done.
absl::StatusOr<std::set<uint32_t>> FinalOwners(
    const MovePlanInput& in, const std::map<uint32_t, uint64_t>& load) {
  std::set<uint32_t> removed(in.remove.begin(), in.remove.end());
  std::set<uint32_t> kept;
  for (const auto& [rank, w] : load) {
    if (removed.count(rank) == 0) kept.insert(rank);
  }
  if (kept.size() > in.servers) {
    // Empty those holding the least (ties: the highest rank).
    std::vector<std::pair<uint64_t, uint32_t>> by_load;
    for (uint32_t r : kept) by_load.push_back({load.at(r), r});
    std::sort(by_load.begin(), by_load.end(),
              [](const auto& a, const auto& b) {
                return a.first != b.first ? a.first < b.first
                                          : a.second > b.second;
              });
    for (size_t i = 0; kept.size() > in.servers; ++i) {
      kept.erase(by_load[i].second);
    }
  }
  for (uint32_t r : in.live) {
    if (kept.size() >= in.servers) break;
    if (load.count(r) == 0 && removed.count(r) == 0) kept.insert(r);
  }
  if (kept.size() < in.servers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "only ", kept.size(), " live servers can own slots, ", in.servers,
        " asked: start ", in.servers - kept.size(),
        " more server_main (they join as spares) and ask again"));
  }
  if (!in.remove.empty() && kept.size() + in.remove.size() > in.live.size()) {
    return absl::InvalidArgumentError("a server to remove is also kept");
  }
  return kept;
}

}  // namespace

absl::StatusOr<MovePlan> PlanMoves(const MovePlanInput& in) {
  PS_RETURN_IF_ERROR(CheckInput(in));
  const uint32_t num_slots = static_cast<uint32_t>(in.owner.size());
  std::map<uint32_t, uint64_t> load;  // owners only
  MovePlan plan;
  for (uint32_t s = 0; s < num_slots; ++s) {
    load[in.owner[s]] += in.weight[s];
    plan.weight_total += in.weight[s];
  }
  PS_ASSIGN_OR_RETURN(const std::set<uint32_t> kept, FinalOwners(in, load));
  std::map<uint32_t, uint64_t> final_load;
  for (uint32_t r : kept) final_load[r] = load.count(r) > 0 ? load.at(r) : 0;
  const double share = static_cast<double>(plan.weight_total) / kept.size();
  // Slots set loose: all of emptied servers', and what a kept server holds
  // above its share (from its highest slots down, so ranges stay whole).
  std::vector<uint32_t> loose;
  for (uint32_t s = num_slots; s-- > 0;) {
    const uint32_t r = in.owner[s];
    if (kept.count(r) == 0) {
      loose.push_back(s);
    } else if (final_load[r] - in.weight[s] / 2.0 > share) {
      final_load[r] -= in.weight[s];
      loose.push_back(s);
    }
  }
  std::stable_sort(loose.begin(), loose.end(), [&](uint32_t a, uint32_t b) {
    return in.weight[a] != in.weight[b] ? in.weight[a] > in.weight[b] : a < b;
  });
  // (source, target, whether the target backs the slots) -> slots.
  std::map<std::tuple<uint32_t, uint32_t, bool>, std::vector<uint32_t>> pairs;
  uint32_t last = kNoBackup;  // the previous slot's receiver
  for (uint32_t s : loose) {
    const uint32_t backup = in.backup.empty() ? kNoBackup : in.backup[s];
    // The previous receiver while it stays within its share, so that
    // slots move in runs (fewer, larger moves); else the least loaded,
    // ties going to the slot's backup (it holds a copy: nothing to copy).
    uint32_t best = kNoBackup;
    if (last != kNoBackup && final_load[last] + in.weight[s] / 2.0 <= share) {
      best = last;
    } else {
      for (const auto& [r, w] : final_load) {
        if (best == kNoBackup || w < final_load[best] ||
            (w == final_load[best] && r == backup)) {
          best = r;
        }
      }
    }
    last = best;
    final_load[best] += in.weight[s];
    if (best == in.owner[s]) continue;
    pairs[{in.owner[s], best, best == backup}].push_back(s);
    ++plan.slots_moved;
    plan.weight_moved += in.weight[s];
  }
  for (auto& [key, slots] : pairs) {
    std::sort(slots.begin(), slots.end());
    SlotMove& move = plan.moves.emplace_back();
    move.set_source(std::get<0>(key));
    move.set_target(std::get<1>(key));
    move.set_promote(std::get<2>(key));
    for (uint32_t s : slots) move.add_slots(s);
  }
  for (const auto& [r, w] : load) {
    if (kept.count(r) == 0) plan.emptied.push_back(r);
  }
  for (uint32_t r : kept) {
    if (load.count(r) == 0) plan.added.push_back(r);
  }
  return plan;
}

}  // namespace ps
