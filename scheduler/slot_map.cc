#include "scheduler/slot_map.h"

#include <cstddef>

namespace ps {

uint32_t SlotMap::CanonicalOwner(uint32_t slot, uint32_t num_slots, uint32_t num_servers) {
  return static_cast<uint32_t>(uint64_t{slot} * num_servers / num_slots);
}

uint32_t SlotMap::CanonicalBackup(uint32_t slot, uint32_t num_slots, uint32_t num_servers) {
  return (CanonicalOwner(slot, num_slots, num_servers) + 1) % num_servers;
}

SlotMap SlotMap::Initial(uint32_t num_slots, uint32_t num_servers, bool replicated) {
  std::vector<uint32_t> owner, backup;
  owner.reserve(num_slots);
  for (uint32_t s = 0; s < num_slots; ++s) {
    owner.push_back(CanonicalOwner(s, num_slots, num_servers));
    if (replicated) {
      backup.push_back(num_servers >= 2 ? CanonicalBackup(s, num_slots, num_servers) : kNoBackup);
    }
  }
  return SlotMap(num_servers, std::move(owner), std::move(backup));
}

SlotMap::Failed SlotMap::Fail(uint32_t rank, const std::vector<bool> &live) {
  Failed failed;
  if (!replicated()) return failed;
  for (size_t s = 0; s < owner_.size(); ++s) {
    const uint32_t backup = backup_[s];
    if (owner_[s] == rank) {
      if (backup != kNoBackup && Live(live, backup)) {
        // The backup holds every update the dead primary acknowledged.
        owner_[s] = backup;
        ++failed.promoted;
      } else {
        // No live copy: the slot waits for a replacement at this rank,
        // which restores it from the newest checkpoint.
        ++failed.orphaned;
      }
      backup_[s] = kNoBackup;
    } else if (backup == rank) {
      backup_[s] = kNoBackup;
      ++failed.lost_backup;
    }
  }
  return failed;
}

uint32_t SlotMap::Adopt(uint32_t rank, const std::vector<bool> &live) {
  if (!replicated()) return 0;
  const uint32_t num_slots = static_cast<uint32_t>(owner_.size());
  uint32_t moved = 0;
  for (uint32_t s = 0; s < num_slots; ++s) {
    if (owner_[s] == rank) continue;  // owned: restored, not backed
    if ((CanonicalOwner(s, num_slots, num_servers_) == rank ||
         CanonicalBackup(s, num_slots, num_servers_) == rank) &&
        backup_[s] != rank && Live(live, owner_[s])) {
      backup_[s] = rank;
      ++moved;
    }
  }
  return moved;
}

SlotMap::Assigned SlotMap::AssignBackups(const std::vector<bool> &live) {
  Assigned out;
  if (!replicated()) return out;
  const uint32_t n = num_servers_;
  std::vector<uint64_t> load(n, 0);  // backup copies per rank
  for (uint32_t b : backup_) {
    if (b != kNoBackup && b < n) ++load[b];
  }
  for (size_t s = 0; s < owner_.size(); ++s) {
    const uint32_t owner = owner_[s];
    if (backup_[s] != kNoBackup || owner >= n || !Live(live, owner)) continue;
    // The least loaded live server other than the owner; ties go to the
    // next rank after the owner, as in the initial layout.
    uint32_t best = kNoBackup;
    for (uint32_t i = 1; i < n; ++i) {
      const uint32_t r = (owner + i) % n;
      if (Live(live, r) && (best == kNoBackup || load[r] < load[best])) best = r;
    }
    if (best == kNoBackup) {
      ++out.without;
      continue;
    }
    backup_[s] = best;
    ++load[best];
    ++out.assigned;
  }
  return out;
}

}  // namespace ps
