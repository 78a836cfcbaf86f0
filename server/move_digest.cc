#include "server/move_digest.h"

#include <algorithm>

#include "common/hash.h"

namespace ps {

MoveDigests::~MoveDigests() {
  moves_.clear();
  Watch();
}

void MoveDigests::Watch() {
  for (auto& [id, table] : *tables_)
    table->set_row_watch(moves_.empty() ? nullptr : this);
}

void MoveDigests::Sync(uint32_t num_slots,
                       const std::map<MoveKey, std::vector<uint32_t>>& moves) {
  for (auto it = moves_.begin(); it != moves_.end();) {
    auto wanted = moves.find(it->first);
    std::vector<uint32_t> slots;
    if (wanted != moves.end()) {
      slots = wanted->second;
      std::sort(slots.begin(), slots.end());
    }
    if (wanted != moves.end() && it->second.num_slots == num_slots &&
        it->second.slots == slots) {
      ++it;
    } else {
      moves_.erase(it++);
    }
  }
  for (const auto& [key, slots] : moves) {
    if (moves_.count(key) > 0) continue;
    Move& move = moves_[key];
    move.num_slots = num_slots;
    move.slots = slots;
    std::sort(move.slots.begin(), move.slots.end());
    move.mask.assign(num_slots, false);
    for (uint32_t s : move.slots) {
      if (s < num_slots) move.mask[s] = true;
    }
    Start(move);
  }
  Watch();
}

void MoveDigests::Start(Move& move) {
  // Reads only the indexes, in steps: the rows are hashed by FoldInitial,
  // between requests.
  move.walk.emplace(*tables_, move.mask);
  StepWalk(move, kStartPositions);
}

bool MoveDigests::StepWalk(Move& move, size_t positions) {
  if (!move.walk.has_value()) return true;
  if (positions == ~size_t{0}) {
    move.walk->Finish(*tables_);
  } else if (!move.walk->Step(*tables_, positions)) {
    return false;
  }
  for (SlotKeyWalk::Keys& k : move.walk->keys()) {
    for (uint64_t key : k.keys) move.initial.push_back({k.table, key});
  }
  move.walk.reset();
  return true;
}

void MoveDigests::FreeInitial(Move& move) {
  move.initial = std::vector<RowKey>();
  move.next = 0;
}

void MoveDigests::RowChanged(uint32_t table, bool sparse, uint64_t row) {
  for (auto& [key, move] : moves_) {
    const uint32_t slot = sparse ? SparseSlot(table, row, move.num_slots)
                                 : DenseBlockSlot(table, row, move.num_slots);
    if (move.mask[slot]) move.changed.insert({table, row});
  }
}

void MoveDigests::Refresh(Move& move, const RowKey& row) {
  auto it = move.folded.find(row);
  if (it != move.folded.end()) {
    move.sum.digest -= it->second.hash;
    move.sum.bytes -= it->second.bytes;
    --move.sum.rows;
  }
  Folded now;
  bool held = false;
  auto table = tables_->find(row.first);
  if (table != tables_->end()) {
    if (const SparseTable* sparse = table->second->AsSparse()) {
      absl::Span<const float> state = sparse->RowState(row.second);
      if (state.empty() && sparse->disk_tier() != nullptr) {
        // Not in RAM: the row as its disk tier holds it (reading one row
        // here; most changed rows are in RAM, where their update left them).
        const uint64_t key = row.second;
        sparse->ReadColdRows(absl::MakeConstSpan(&key, 1), &cold_state_,
                             &cold_found_);
        if (cold_found_[0]) state = absl::MakeConstSpan(cold_state_);
      }
      held = !state.empty();
      if (held) {
        now.hash = RowHash(row.first, row.second, state, {});
        now.bytes = state.size() * sizeof(float) + sizeof(uint64_t);
      }
    } else {
      absl::Span<const float> values, state;
      held = table->second->AsDense()->FindBlock(row.second, &values, &state);
      if (held) {
        now.hash = RowHash(row.first, row.second, values, state);
        now.bytes = (values.size() + state.size()) * sizeof(float);
      }
    }
  }
  if (!held) {
    if (it != move.folded.end()) move.folded.erase(it);
    return;
  }
  move.sum.digest += now.hash;
  move.sum.bytes += now.bytes;
  ++move.sum.rows;
  if (it != move.folded.end()) {
    it->second = now;
  } else {
    move.folded.emplace(row, now);
  }
}

size_t MoveDigests::FoldInitial(size_t max_rows) {
  size_t left = 0;
  for (auto& [key, move] : moves_) {
    if (!StepWalk(move, SlotKeyWalk::PositionsFor(max_rows))) {
      max_rows = 0;  // a step that did not end the listing spends the turn
      ++left;
      continue;
    }
    while (max_rows > 0 && move.next < move.initial.size()) {
      Refresh(move, move.initial[move.next++]);
      --max_rows;
    }
    if (move.next == move.initial.size()) FreeInitial(move);
    left += move.initial.size() - move.next;
  }
  return left;
}

size_t MoveDigests::FoldChanged(size_t max_rows) {
  size_t left = 0;
  std::vector<RowKey> batch;
  for (auto& [key, move] : moves_) {
    batch.clear();
    for (auto it = move.changed.begin();
         it != move.changed.end() && batch.size() < max_rows; ++it) {
      batch.push_back(*it);
    }
    for (const RowKey& row : batch) {
      move.changed.erase(row);
      Refresh(move, row);
    }
    max_rows -= batch.size();
    // A drained set is released: its erased entries would slow the scans
    // of the next batches down.
    if (move.changed.empty()) move.changed = absl::flat_hash_set<RowKey>();
    left += move.changed.size();
  }
  return left;
}

std::optional<SlotDigest> MoveDigests::Digest(std::vector<uint32_t> slots) {
  std::sort(slots.begin(), slots.end());
  for (auto& [key, move] : moves_) {
    if (move.slots != slots) continue;
    StepWalk(move, ~size_t{0});
    while (move.next < move.initial.size())
      Refresh(move, move.initial[move.next++]);
    FreeInitial(move);
    for (const RowKey& row : move.changed) Refresh(move, row);
    move.changed = absl::flat_hash_set<RowKey>();
    return move.sum;
  }
  return std::nullopt;
}

size_t MoveDigests::pending_initial() const {
  size_t n = 0;
  // A listing in progress counts as one row: its size is not known yet.
  for (const auto& [key, move] : moves_)
    n += move.initial.size() - move.next + (move.walk.has_value() ? 1 : 0);
  return n;
}

size_t MoveDigests::pending_changed() const {
  size_t n = 0;
  for (const auto& [key, move] : moves_) n += move.changed.size();
  return n;
}

}  // namespace ps
