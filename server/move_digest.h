// The fence digest of every slot move a server takes part in (as source or
// target), kept up to date as rows change, so that the fence reads it
// instead of walking every row of the server (server/slot_digest.h
// DigestSlots, whose result it equals).
//
// Per move: S, the wrapping sum of RowHash over the rows of its slots; the
// hash each row last added to S; and the rows changed since (the tables
// report them through RowWatch). FoldChanged() refreshes changed rows in
// bounded batches (S -= the stored hash, S += the hash of the row as it is
// now, or nothing if it is gone), so at the fence only the rows changed
// since the last fold are read. When tracking starts every row the server
// holds of the slots counts as changed: FoldInitial() lists them in steps
// (SlotKeyWalk) and hashes them in bounded batches.
//
// Memory: a map entry per row of the tracked slots while the move is
// tracked; nothing for other slots or once the move is untracked.
//
// Not thread-safe: call on the thread that owns the tables (the serving
// thread). Borrows the tables: they must outlive it, and while it tracks a
// move it is their RowWatch (the destructor unsets it). Internal to
// //server:server.
#ifndef PS_SERVER_MOVE_DIGEST_H_
#define PS_SERVER_MOVE_DIGEST_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "server/slot_digest.h"
#include "server/table.h"

namespace ps {

class MoveDigests : public RowWatch {
 public:
  // (source rank, target rank, copy epoch): a move a view replaces with
  // another of the same ranks has a new copy epoch, so it starts afresh.
  using MoveKey = std::tuple<uint32_t, uint32_t, uint64_t>;

  explicit MoveDigests(TableMap* tables) : tables_(tables) {}
  ~MoveDigests() override;
  MoveDigests(const MoveDigests&) = delete;
  MoveDigests& operator=(const MoveDigests&) = delete;

  // Tracks exactly `moves` (key -> its slots, each < num_slots): starts
  // the new ones (every row held of their slots counts as changed), keeps
  // the ones tracked already with the same slots, forgets the others.
  void Sync(uint32_t num_slots,
            const std::map<MoveKey, std::vector<uint32_t>>& moves);

  // Bounded folds (over all moves). FoldInitial lists and hashes at most
  // `max_rows` of the rows held when tracking started (work that grows
  // with the table: a server paces it); FoldChanged refreshes at most
  // `max_rows` of the rows changed since (work that follows the updates
  // served). Each returns how many rows of its kind are left (a listing in
  // progress counts as one).
  size_t FoldInitial(size_t max_rows);
  size_t FoldChanged(size_t max_rows);

  // The digest (digest, rows, bytes, as DigestSlots counts them) of the
  // tracked move whose slots are exactly `slots` (in any order), after
  // refreshing its changed rows; nullopt when no such move is tracked.
  std::optional<SlotDigest> Digest(std::vector<uint32_t> slots);

  // Rows changed and not folded yet, over all moves: in all, of the rows
  // held at the start, of the rows changed since.
  size_t pending() const { return pending_initial() + pending_changed(); }
  size_t pending_initial() const;
  size_t pending_changed() const;
  size_t moves() const { return moves_.size(); }

  void RowChanged(uint32_t table, bool sparse, uint64_t row) override;

 private:
  using RowKey = std::pair<uint32_t, uint64_t>;  // (table id, key or block)
  struct Folded {
    uint64_t hash = 0;
    uint64_t bytes = 0;
  };
  struct Move {
    uint32_t num_slots = 0;
    std::vector<uint32_t> slots;  // sorted
    std::vector<bool> mask;       // num_slots entries
    absl::flat_hash_map<RowKey, Folded> folded;
    // Lists the rows held when tracking started, in steps (FoldInitial);
    // empty once `initial` holds them.
    std::optional<SlotKeyWalk> walk;
    // The rows held when tracking started (a list: cheaper to fill than
    // the set, and refreshing a row twice is harmless), folded from `next`
    // on; then the rows changed since.
    std::vector<RowKey> initial;
    size_t next = 0;
    absl::flat_hash_set<RowKey> changed;
    SlotDigest sum;
  };

  void Start(Move& move);
  // A step of the move's listing walk of at most `positions` index
  // positions (~0: to its end); true once `initial` holds the list.
  bool StepWalk(Move& move, size_t positions);
  // Index positions the listing looks at when tracking starts (all of a
  // small table's index).
  static constexpr size_t kStartPositions = 32768;
  static void FreeInitial(Move& move);
  void Refresh(Move& move, const RowKey& row);
  // Sets this as the watch of every table (or none when no move is
  // tracked).
  void Watch();

  TableMap* const tables_;
  std::map<MoveKey, Move> moves_;
  // A cold row Refresh read (kept to spare allocations).
  std::vector<float> cold_state_;
  std::vector<bool> cold_found_;
};

}  // namespace ps

#endif  // PS_SERVER_MOVE_DIGEST_H_
