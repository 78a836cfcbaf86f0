// What a backup keeps of the slots it backs (cluster.replication 2),
// besides their rows, which live in the tables like the server's own:
//
//   - by primary node: the sequence numbers of the pushes it relayed (by
//     sender), so a worker's retry after a failover is answered as a
//     duplicate by the promoted backup; and the BSP steps it buffered,
//     applied when the primary tells the step's divisor;
//   - by slot: whether a catch-up (the primary's snapshot of the slot)
//     completed here since this server became its backup;
//   - by table: the keys (sparse) or elements (dense) applied to copies, so
//     the server's statistics count its own pushes only.
//
// The Impl decodes and validates replica messages and owns their I/O (the
// messages held for a newer view); this class owns the state they change
// and the rules that move it: a catch-up replaces what was buffered of its
// slots, a promotion hands a primary's records for the promoted slots to
// the server, a dead primary's records are dropped.
//
// Not thread-safe: owned by the serving thread. Internal to //server:server.
#ifndef PS_SERVER_REPLICA_STORE_H_
#define PS_SERVER_REPLICA_STORE_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "server/replication.h"
#include "server/step_buffers.h"

namespace ps {

class ReplicaStore {
public:
  using SeqWindow = replication::SeqWindow;
  // Sequence windows by sender node id.
  using Windows = absl::flat_hash_map<uint64_t, SeqWindow>;
  // Sparse table id -> row dim (dense tables: 1), for slot extraction.
  using Dims = absl::flat_hash_map<uint32_t, uint32_t>;

  // The per-slot record covers `num_slots` slots; a new count (a new slot
  // map) starts it over with no slot caught up.
  void SizeSlots(uint32_t num_slots);

  // Whether `seq` of `sender`, relayed by `primary`, was recorded before
  // (then nothing changes); otherwise records it. seq 0 (no sequence
  // number) is never a duplicate and is not recorded.
  bool SeenOrRecord(uint64_t primary, uint64_t sender, uint64_t seq);
  // Merges a primary's window of `sender` (a catch-up's REPLICA_SEQS).
  void MergeSeqs(uint64_t primary, uint64_t sender, const SeqWindow &window);

  // The buffer of `primary`'s BSP `step` (created empty when missing).
  StepBuffer &Buffer(uint64_t primary, uint64_t step);
  // Moves `primary`'s buffer of `step` to *out and forgets it; false (and
  // *out untouched) when nothing of that step is buffered.
  bool TakeStep(uint64_t primary, uint64_t step, StepBuffer *out);
  // Steps buffered for `primary` (tests and logs).
  size_t buffered_steps(uint64_t primary) const;

  // A catch-up of `slots` (each < the sized slot count) from `primary`
  // begins: they are not caught up, and what was buffered of them is
  // dropped, since the snapshot that follows holds it.
  void BeginCatchUp(uint64_t primary, absl::Span<const uint32_t> slots,
                    const Dims &dims);
  // This server gives up its copy of `slots` from `primary` (a slot move
  // it was the target of was abandoned): as BeginCatchUp, what was
  // buffered of them goes and they are not caught up.
  void ForgetSlots(uint64_t primary, absl::Span<const uint32_t> slots,
                   const Dims &dims) {
    BeginCatchUp(primary, slots, dims);
  }
  // The catch-up of `slots` completed.
  void EndCatchUp(absl::Span<const uint32_t> slots);
  // False for a slot outside the sized range.
  bool caught_up(uint32_t slot) const;

  // Counts keys or elements applied to copies of `table`.
  void CountApplied(uint32_t table, uint64_t n) { applied_[table] += n; }
  uint64_t applied(uint32_t table) const;

  // This server became the primary of the slots in `mask` (sized to
  // `num_slots`) that `primary` served: `primary`'s sequence windows are
  // merged into `seqs` (the server's own), and the part of each of its
  // buffered steps that belongs to those slots is passed, moved out, to
  // `each` in step order (empty parts are skipped). What belongs to other
  // slots stays.
  void
  TakeOver(uint64_t primary, const std::vector<bool> &mask, uint32_t num_slots,
           const Dims &dims, Windows *seqs,
           absl::FunctionRef<void(uint64_t step, StepBuffer &&moved)> each);

  // Forgets every primary not in `live_servers` (its slots went to others
  // or to this server already) and every sender not in `live_workers`
  // (its retries cannot come).
  void Retain(const absl::flat_hash_set<uint64_t> &live_servers,
              const absl::flat_hash_set<uint64_t> &live_workers);

private:
  absl::flat_hash_map<uint64_t, Windows> seqs_;
  absl::flat_hash_map<uint64_t, std::map<uint64_t, StepBuffer>> buffers_;
  std::vector<bool> caught_up_;
  absl::flat_hash_map<uint32_t, uint64_t> applied_;
};

} // namespace ps

#endif // PS_SERVER_REPLICA_STORE_H_
