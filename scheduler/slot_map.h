// Which server rank owns each slot and which one holds its backup copy
// (cluster.replication 2), and how that changes as servers die, are replaced
// and come back: the placement rules of ClusterState (cluster_state.h, class
// comment) as functions of the live server ranks, so they can be tested
// without the membership state machine.
//
// A value type: not thread-safe. ClusterState builds one from its view
// under its mutex, changes it and writes it back (ClusterView.slot_owner,
// slot_backup). Ranks in it are trusted to be below num_servers except
// kNoBackup; a rank outside `live` counts as dead.
#ifndef PS_SCHEDULER_SLOT_MAP_H_
#define PS_SCHEDULER_SLOT_MAP_H_

#include <cstdint>
#include <vector>

#include "common/protocol.h"

namespace ps {

class SlotMap {
 public:
  // The initial layout of `num_slots` slots on `num_servers` servers
  // (num_servers >= 1): contiguous slot ranges in rank order; with
  // `replicated`, each slot backed by the next rank after its owner
  // (kNoBackup with a single server); without, no backups at all.
  static SlotMap Initial(uint32_t num_slots, uint32_t num_servers, bool replicated);
  // The owner and backup of `slot` in the initial layout.
  static uint32_t CanonicalOwner(uint32_t slot, uint32_t num_slots, uint32_t num_servers);
  static uint32_t CanonicalBackup(uint32_t slot, uint32_t num_slots, uint32_t num_servers);

  // `owner[s]` and `backup[s]` (kNoBackup: none) of every slot s. `backup`
  // is empty without replication; then Fail, Adopt and AssignBackups do
  // nothing.
  SlotMap(uint32_t num_servers, std::vector<uint32_t> owner, std::vector<uint32_t> backup)
      : num_servers_(num_servers), owner_(std::move(owner)), backup_(std::move(backup)) {}

  const std::vector<uint32_t> &owner() const { return owner_; }
  const std::vector<uint32_t> &backup() const { return backup_; }
  // Whether every slot has a backup entry (kNoBackup or a rank).
  bool replicated() const { return backup_.size() == owner_.size(); }

  // In the calls below, `live[r]` says whether server rank r is alive.

  // What Fail did, for the log.
  struct Failed {
    uint32_t promoted = 0;     // slots now owned by their former backup
    uint32_t lost_backup = 0;  // slots it backed, now without backup
    uint32_t orphaned = 0;     // slots it owned with no live backup
  };
  // Server `rank` died or left (it is not live): each slot it owned goes to
  // its backup if that is alive (which then holds every update the dead
  // primary acknowledged), else keeps `rank` as owner and waits for a
  // replacement to restore it from a checkpoint; either way the slot has no
  // backup now. Slots it backed lose their backup. Call AssignBackups next.
  Failed Fail(uint32_t rank, const std::vector<bool> &live);

  // A replacement registered at `rank`: it becomes the backup of the slots
  // its rank owns or backs in the initial layout, where the current owner
  // is alive and is not `rank` (slots it still owns it restores, not
  // backs); the copies other servers held meanwhile are released. Returns
  // the number of slots it now backs anew. Call AssignBackups next.
  uint32_t Adopt(uint32_t rank, const std::vector<bool> &live);

  // What AssignBackups did, for the log.
  struct Assigned {
    uint32_t assigned = 0;  // slots that got a backup
    uint32_t without = 0;   // slots left without: no other live server
  };
  // Gives every slot with a live owner and no backup one: the live server
  // other than the owner holding the fewest backup copies, ties going to
  // the next rank after the owner (as in the initial layout).
  Assigned AssignBackups(const std::vector<bool> &live);

 private:
  static bool Live(const std::vector<bool> &live, uint32_t rank) {
    return rank < live.size() && live[rank];
  }

  uint32_t num_servers_;
  std::vector<uint32_t> owner_;
  std::vector<uint32_t> backup_;
};

}  // namespace ps

#endif  // PS_SCHEDULER_SLOT_MAP_H_
