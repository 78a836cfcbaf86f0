// The data-shard ledger: one shard of the training data per worker rank,
// who trains it and where it stands (cluster.on_worker_loss). A shard whose
// worker dies or is preempted is orphaned at its last reported position and
// goes to the next worker that asks (REASSIGN), or is dropped (SKIP_REST).
// The job is over once every shard is done.
//
// A value type with no notion of nodes' liveness: ClusterState tells it who
// took, reported, finished or released what. Not thread-safe; ClusterState
// keeps it under its mutex. Shard indices and positions from requests are
// checked here; journals are validated by ClusterState before FromJournal.
#ifndef PS_SCHEDULER_SHARD_LEDGER_H_
#define PS_SCHEDULER_SHARD_LEDGER_H_

#include <cstdint>
#include <set>
#include <unordered_map>
#include <vector>

#include "proto/checkpoint.pb.h"
#include "proto/journal.pb.h"
#include "proto/scheduler.pb.h"

namespace ps {

class ShardLedger {
 public:
  // A shard's life: never handed out, trained by a live worker, waiting for
  // a new worker (its holder died or was preempted), or done (trained, or
  // skipped under SKIP_REST). Same values as JournalShard::State.
  enum class State { kUnstarted = 0, kActive = 1, kOrphaned = 2, kDone = 3 };
  struct Shard {
    State state = State::kUnstarted;
    DataPosition position;
    uint64_t holder = 0;  // node id while kActive
  };

  // `num_shards` shards (one per worker rank), all unstarted at their
  // beginning. `reassign`: orphaned shards go to other workers (REASSIGN);
  // otherwise the rest of a lost shard is dropped (SKIP_REST).
  ShardLedger(uint32_t num_shards, bool reassign);

  uint32_t size() const { return static_cast<uint32_t>(shards_.size()); }
  const Shard &shard(uint32_t s) const { return shards_.at(s); }

  // Whether shard `s` (< size()) may be handed out now: never started, or
  // orphaned under REASSIGN.
  bool Available(uint32_t s) const;
  // The first orphaned shard under REASSIGN, or -1. This and the next
  // three take constant time (a fleet's workers all ask at the end of
  // training), from indexes kept as shards change.
  int Orphan() const;
  bool AllDone() const { return done_ == shards_.size(); }
  uint32_t CountDone() const { return done_; }
  // The shard other than `except` that node `holder` trains, or -1.
  int HeldBy(uint64_t holder, uint32_t except) const;

  // Hands shard `s` (< size()) to node `holder`; returns the position to
  // start it from (done false).
  DataPosition Assign(uint32_t s, uint64_t holder);
  // A heartbeat of node `holder` reported `position`: recorded if it holds
  // that shard (ignored otherwise: a stale or foreign report).
  void Report(uint64_t holder, const DataPosition &position);
  // Node `holder` finished its shard at `position`: recorded as done if it
  // holds that shard. Returns whether anything changed.
  bool Finish(uint64_t holder, const DataPosition &position);
  // Node `holder` stopped training. With `done` its shards are done
  // (finished, or it never trained shards: a tool). Otherwise each is
  // orphaned (REASSIGN) or dropped (SKIP_REST) at `position` when that is
  // of the shard, else at its last reported position; a shard already at
  // its end is done.
  void Release(uint64_t holder, bool done, const DataPosition *position);

  // The job starts from a checkpoint with `positions`: each shard is
  // unstarted at its position, or done. False (nothing changed) unless
  // there is one position per shard.
  bool Restore(const google::protobuf::RepeatedPtrField<DataPosition> &positions);
  // A checkpoint's positions: `reported[s]` (null: none) for shards whose
  // worker reported at the checkpoint's clock, else the ledger's own (done
  // if the shard is). `reported` has size() entries.
  void FillManifest(const std::vector<const DataPosition *> &reported,
                    CheckpointManifest *manifest) const;
  void ToJournal(SchedulerJournal *journal) const;
  // From a validated journal (one shard per worker, valid states).
  void FromJournal(const SchedulerJournal &journal);

 private:
  // Every change of a shard's state or holder goes through here, which
  // keeps the indexes below.
  void Set(uint32_t s, State state, uint64_t holder);

  const bool reassign_;
  std::vector<Shard> shards_;
  std::set<uint32_t> orphaned_;
  uint32_t done_ = 0;
  // Each holder's active shards.
  std::unordered_map<uint64_t, std::set<uint32_t>> held_;
};

}  // namespace ps

#endif  // PS_SCHEDULER_SHARD_LEDGER_H_
