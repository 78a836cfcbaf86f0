// Which slots move where when a running job scales to a new number of
// servers (ClusterState::Scale, psctl scale): a pure function of the slot
// map, the bytes each slot holds and the live servers, so the rules can be
// tested without the membership state machine.
//
// The plan moves the least it can: every slot of a server that is emptied
// moves, and each kept server sheds only what it holds above its fair share
// (total bytes / servers); the slots set loose go, largest first and in
// runs, to the kept server holding the least. So 2 -> 4 servers moves half
// of the bytes, 4 -> 3 a quarter. A slot that goes to the server holding
// its backup (replication 2) is a promotion (SlotMove.promote): nothing is
// copied. Either way the source becomes the backup at the flip.
#ifndef PS_SCHEDULER_MOVE_PLANNER_H_
#define PS_SCHEDULER_MOVE_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/scheduler.pb.h"

namespace ps {

struct MovePlanInput {
  // Per slot: its owner's rank, its backup's (kNoBackup: none; empty
  // without replication), and its weight: bytes held, or 1 for every slot
  // when bytes are not known (then slot counts are balanced).
  std::vector<uint32_t> owner;
  std::vector<uint32_t> backup;
  std::vector<uint64_t> weight;
  // Live server ranks not draining, ascending: the owners and the spares.
  std::vector<uint32_t> live;
  // How many servers should own slots, and the ranks to empty (may be
  // empty: the planner then empties those holding the least).
  uint32_t servers = 0;
  std::vector<uint32_t> remove;
  // Replication 2: a slot keeps two copies, so at least 2 servers.
  bool replicated = false;
};

struct MovePlan {
  // One move per (source, target) pair and kind (promotion or copy),
  // slots ascending; phase unset. A pair may have one of each kind.
  std::vector<SlotMove> moves;
  // Ranks that own slots now and none once the moves are done.
  std::vector<uint32_t> emptied;
  // Spares that own slots once the moves are done.
  std::vector<uint32_t> added;
  uint64_t slots_moved = 0;
  uint64_t weight_moved = 0;
  uint64_t weight_total = 0;
};

// INVALID_ARGUMENT for a bad count, a rank that is not live, or sizes that
// do not match; FAILED_PRECONDITION when a slot's owner is not live (the
// job is recovering) or there are too few spares for the count asked.
absl::StatusOr<MovePlan> PlanMoves(const MovePlanInput& in);

}  // namespace ps

#endif  // PS_SCHEDULER_MOVE_PLANNER_H_
