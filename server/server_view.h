// The cluster view as a server's serving thread applies it: which slots
// this server owns and backs, the live workers and servers, the
// consistency, checkpoint and replication settings. Built from a
// ClusterView by KVServer::UpdateView (server/server.cc), then immutable
// and shared (std::shared_ptr<const ServerView>). Internal to
// //server:server.
#ifndef PS_SERVER_SERVER_VIEW_H_
#define PS_SERVER_SERVER_VIEW_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/protocol.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"
#include "server/consistency.h"

namespace ps {

struct ServerView {
  bool all = false;  // standalone
  uint32_t rank = 0;
  uint64_t epoch = 0;
  std::vector<uint32_t> slot_owner;  // empty: not ready
  // slot_owner names this server for every slot: requests need no
  // per-key ownership check (a one-server job).
  bool owns_every_slot = false;
  bool has_view = false;
  std::vector<ConsistencyController::Worker> live_workers;
  // Live worker node id -> rank.
  absl::flat_hash_map<uint64_t, uint32_t> worker_rank;
  ConsistencyConfig consistency;
  uint64_t checkpoint_clock = 0;
  CheckpointRef restore;
  // The replication machinery runs: cluster.replication 2, or an elastic
  // job (cluster.elastic: slot moves copy the way a backup is caught up).
  // Never standalone.
  bool replicated = false;
  // cluster.replication 2: every owned slot should have a backup; one
  // without is logged and its pushes counted as unreplicated. False for an
  // elastic job with replication 1 (no slot has a backup).
  bool backups_required = true;
  std::vector<uint32_t> slot_backup;  // as slot_owner; kNoBackup = none
  // Slot moves (ClusterView.moves), those that passed UpdateView's checks:
  // slots in range, each owned by the move's source and in one move only,
  // source and target distinct ranks, the target the backup of every slot
  // (a promotion: SlotMove.promote) or of none.
  struct Move {
    uint32_t source = 0;
    uint32_t target = 0;
    std::vector<uint32_t> slots;  // ascending
    bool fencing = false;         // SlotMove.phase FENCING (else COPYING)
    bool promote = false;         // the target backs the slots already
    uint64_t copy_epoch = 0;
    uint64_t fence_epoch = 0;
  };
  std::vector<Move> moves;
  // Per slot, from `moves`: the rank a move copies it to (kNoBackup:
  // none), and whether its move is fencing. Both empty without moves.
  // A promotion's slots have no learner (their backup is the target):
  // slot_promote_to names it instead.
  std::vector<uint32_t> slot_learner;
  std::vector<uint32_t> slot_promote_to;
  std::vector<bool> slot_fenced;
  uint32_t learner(uint32_t slot) const {
    return slot < slot_learner.size() ? slot_learner[slot] : kNoBackup;
  }
  // The rank a move hands `slot` to, learner or promoted backup.
  uint32_t moving_to(uint32_t slot) const {
    if (learner(slot) != kNoBackup) return learner(slot);
    return slot < slot_promote_to.size() ? slot_promote_to[slot] : kNoBackup;
  }
  bool fenced(uint32_t slot) const {
    return slot < slot_fenced.size() && slot_fenced[slot];
  }
  uint64_t node_id = 0;               // this server's; 0 = not live
  // Live servers by rank: node id (0 = none) and data endpoint.
  std::vector<uint64_t> server_node;
  std::vector<std::string> server_endpoint;
};

}  // namespace ps

#endif  // PS_SERVER_SERVER_VIEW_H_
