// A server's rows seen per slot (proto/scheduler.proto SlotMove): the
// digest that a slot move's source and target compare at the fence
// (REPLICA_FENCE), the bytes each slot holds (HeartbeatRequest.slot_bytes,
// for the planner), and dropping the rows of slots that moved away.
//
// A "row" is a sparse table's row (its key and full state: weights and
// optimizer state) or a dense table's created block (its values and
// state); its slot is common/hash.h SparseSlot or DenseBlockSlot.
//
// Not thread-safe: call on the thread that owns the tables (the serving
// thread), while nothing else changes them. Internal to //server:server.
#ifndef PS_SERVER_SLOT_DIGEST_H_
#define PS_SERVER_SLOT_DIGEST_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "server/table.h"

namespace ps {

using TableMap = absl::flat_hash_map<uint32_t, std::unique_ptr<Table>>;

struct SlotDigest {
  // The wrapping sum of a 64-bit hash of every row's (table id, key or
  // block, full state bits): independent of the order rows are visited
  // in, so two servers holding the same rows agree whatever their
  // tables' histories. 0 for no rows.
  uint64_t digest = 0;
  uint64_t rows = 0;   // rows and blocks
  uint64_t bytes = 0;  // their state (and sparse keys), as SlotBytes counts
};

// One row's term of SlotDigest::digest: a hash of the table, the key (or
// block) and every float of `values` then `state`, bit for bit.
uint64_t RowHash(uint32_t table, uint64_t key, absl::Span<const float> values,
                 absl::Span<const float> state);

// The digest of the rows of `tables` whose slot is set in `mask` (one
// entry per slot of the view).
SlotDigest DigestSlots(const TableMap& tables, const std::vector<bool>& mask);

// Bytes each of `num_slots` slots holds in `tables`: per sparse row its
// key and full state (rows on a disk tier too), per dense block its values
// and state. Reads only the sparse tables' indexes, their tiers' counts per
// slot and the dense blocks' sizes.
std::vector<uint64_t> SlotBytes(const TableMap& tables, uint32_t num_slots);

// SlotBytes in steps, for a serving thread to interleave with requests:
// a step looks at most `max_positions` positions of one sparse table's
// index, or at every block of one dense table. Rows created or dropped
// between steps may be missed or counted twice: an estimate (what the
// planner needs), exact when nothing changes in between.
class SlotBytesScan {
 public:
  SlotBytesScan(const TableMap& tables, uint32_t num_slots);
  // One step; true once every table was looked at (TakeBytes then).
  bool Step(const TableMap& tables, size_t max_positions);
  std::vector<uint64_t> TakeBytes() { return std::move(bytes_); }
  uint32_t num_slots() const { return num_slots_; }

 private:
  std::vector<uint32_t> ids_;  // the tables', sorted
  size_t table_ = 0;           // ids_[table_] is next
  size_t cursor_ = 0;          // its index position (sparse)
  uint32_t num_slots_;
  std::vector<uint64_t> bytes_;
};

// Lists the rows (sparse keys) and created blocks of `tables` whose slot
// is set in `mask`, in steps, for a serving thread to interleave with
// requests: a step looks at most `max_positions` positions of the sparse
// tables' indexes (and at every block of the dense tables it reaches).
// Reads only the indexes (and disk tiers). Every row held when the walk starts
// and still held when it ends is listed once: linear probing moves rows only
// when the index grows or rows are dropped (backward shifts), so when a sparse
// table's capacity or generation() changes between steps its list is emptied
// and its pass starts over; after kMaxPasses passes it is listed in one go. A
// table with a disk tier is listed in one step, its rows in RAM then those on
// disk (a row promoted from disk into a position a pass went by would otherwise
// be missed). Rows created during the walk may or may not be listed.
class SlotKeyWalk {
 public:
  static constexpr int kMaxPasses = 4;
  // Index positions a step may look at per row of a caller's budget:
  // looking at a position costs a small part of reading or sending a row.
  static constexpr size_t kPositionsPerRow = 8;
  // kPositionsPerRow * rows, saturating (~0 stays ~0: to the end).
  static size_t PositionsFor(size_t rows) {
    return rows > ~size_t{0} / kPositionsPerRow ? ~size_t{0}
                                                : rows * kPositionsPerRow;
  }
  struct Keys {
    uint32_t table = 0;
    bool sparse = true;
    std::vector<uint64_t> keys;  // index then tier order (sparse), block order
  };

  SlotKeyWalk(const TableMap& tables, std::vector<bool> mask);
  // One step; true once every table was listed. max_positions 0: nothing.
  bool Step(const TableMap& tables, size_t max_positions);
  // Runs the steps to the end.
  void Finish(const TableMap& tables);
  bool done() const { return table_ >= keys_.size(); }
  // The tables' lists, by table id; complete once done().
  std::vector<Keys>& keys() { return keys_; }
  // Passes started over because the index changed under the walk.
  int restarts() const { return restarts_; }

 private:
  std::vector<bool> mask_;
  std::vector<Keys> keys_;  // one per table, by id
  size_t table_ = 0;        // keys_[table_] is being listed
  size_t cursor_ = 0;       // its index position (sparse)
  int passes_ = 0;          // of keys_[table_], started
  size_t capacity_ = 0;     // its index capacity and generation when
  uint64_t generation_ = 0;  // the pass started
  int restarts_ = 0;
};

// Drops the rows and blocks of `tables` in the slots set in `mask`
// (SparseTable::DropRows and DropColdSlots, DenseTable::DropBlocks).
// Returns how many.
uint64_t DropSlots(TableMap& tables, const std::vector<bool>& mask);

// DropSlots in steps, for a serving thread to interleave with requests: a
// step looks at most `max_positions` positions of one sparse table's index
// (dropping the selected rows among them), or drops the selected blocks of
// one dense table. Rows created between steps are of other slots (the
// server no longer owns these) and are kept. A sparse table is done after
// a whole pass over its index that dropped nothing while nothing else
// dropped rows or grew the index (drops shift positions, so one pass may
// miss rows); after kMaxPasses passes the rest goes in one DropRows.
// Until Done(), the tables still hold rows of the masked slots: whatever
// reads whole tables, or takes these slots back, calls Finish() first.
class SlotDrop {
 public:
  static constexpr int kMaxPasses = 4;

  SlotDrop(const TableMap& tables, std::vector<bool> mask);
  // Adds the slots set in `mask` (same size) to those dropped; the
  // pass in progress no longer counts as clean.
  void Add(const TableMap& tables, const std::vector<bool>& mask);
  // One step; true once every table is done. max_positions 0: nothing.
  bool Step(TableMap& tables, size_t max_positions);
  // Runs the steps to the end.
  void Finish(TableMap& tables) {
    while (!Step(tables, ~size_t{0})) {
    }
  }
  bool Done() const { return table_ >= ids_.size(); }
  const std::vector<bool>& mask() const { return mask_; }
  uint64_t dropped() const { return dropped_; }

 private:
  void Restart(const TableMap& tables);
  // A step on one sparse table; true once it is done.
  bool StepSparse(uint32_t id, SparseTable* sparse, size_t max_positions);

  std::vector<bool> mask_;
  std::vector<uint32_t> ids_;  // the tables', sorted
  size_t table_ = 0;           // ids_[table_] is next
  // The sparse table in progress: its index position, its pass, and what
  // it looked like after the last step (to notice changes in between).
  const Table* current_ = nullptr;
  size_t cursor_ = 0;
  int passes_ = 0;
  bool clean_ = true;  // the pass so far dropped nothing and saw no change
  uint64_t generation_ = 0;
  size_t capacity_ = 0;
  std::vector<uint64_t> key_of_;  // see SparseTable::DropRowsFrom
  uint64_t dropped_ = 0;
};

}  // namespace ps

#endif  // PS_SERVER_SLOT_DIGEST_H_
