// A server's checkpoint gate (docs/design.md, "Checkpoints"): takes up the
// checkpoint clock C the view names, and decides, for the cut at C to hold
// exactly the steps < C here,
//   - whether it is too late (a push of a step >= C was applied already),
//   - which pushes must be held (steps >= C) and which pulls wait (past C),
//   - whether BSP may apply a step (only steps < C before the cut),
//   - when the cut is reached and the shard may be written;
// and keeps the requests held meanwhile, to be run again once it is
// written. The server does the I/O: writing and restoring shards
// (server/checkpoint.h), reporting, and processing what is released.
//
// Owned and used by the server's serving thread only: no locks.
//
// Invariants: at most one checkpoint is pending; a clock at or below
// handled() (written, refused as too late, or restored from) is never
// taken up; held requests are handed back only while none is pending.
//
// Errors: a checkpoint that cannot be taken (too late here) is an outcome
// of TakeUp, which the server reports to the scheduler; nothing here fails
// otherwise.
#ifndef PS_SERVER_CHECKPOINT_GATE_H_
#define PS_SERVER_CHECKPOINT_GATE_H_

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "server/consistency.h"
#include "zmq.hpp"

namespace ps {

class CheckpointGate {
 public:
  // A request held while a checkpoint is pending (a push of a step at or
  // after its clock, made self-contained by the pipeline).
  struct Held {
    zmq::message_t identity;
    std::vector<zmq::message_t> frames;
    // Counted in the server's held bytes while held.
    uint64_t bytes = 0;
  };

  // What TakeUp did with the view's checkpoint clock.
  struct TakeUpResult {
    enum Kind {
      kUnchanged,  // the same checkpoint as before, an old one, or none
      kAbandoned,  // clock 0: the scheduler dropped the pending one (`clock`)
      kOff,        // checkpoints are not written here; nothing pending
      kTooLate,    // `clock` refused: a push of `applied_step` >= it applied
      kPending,    // `clock` is pending now
    };
    Kind kind = kUnchanged;
    uint64_t clock = 0;
    uint64_t applied_step = 0;
  };

  CheckpointGate() = default;
  CheckpointGate(const CheckpointGate&) = delete;
  CheckpointGate& operator=(const CheckpointGate&) = delete;

  // The checkpoint in progress (0 = none), and the latest one written,
  // refused as too late, or restored from.
  uint64_t pending() const { return pending_; }
  uint64_t handled() const { return handled_; }

  // Takes up the view's checkpoint clock `clock` (0: none). `enabled`:
  // whether this server writes checkpoints (a directory is configured and
  // it is not standalone). A new clock replaces a pending one. It is too
  // late when, under BSP, a step >= clock is applied already, otherwise
  // when a push of a step >= clock was applied (NoteApplied); then it
  // counts as handled.
  TakeUpResult TakeUp(uint64_t clock, bool enabled, const ConsistencyController& consistency);

  // Whether a push of `step` must be held until the pending checkpoint is
  // written: a step at or after its clock, unless BSP `buffered` it (a
  // buffered step >= the clock is not applied before the cut anyway). A
  // finished worker's pushes (kFinishedClock) are never held.
  bool MustHold(uint64_t step, bool buffered) const;
  // The gate's part of whether a pull at `clock` may be answered: not one
  // past the pending checkpoint's clock (the consistency rule decides the
  // rest).
  bool PullAllowed(uint64_t clock) const;
  // BSP steps >= this are not applied before the pending checkpoint is
  // written (ConsistencyController::NextCompleteStep's limit).
  uint64_t StepLimit() const;

  // A push of `step` was applied on arrival (not BSP-buffered): a
  // checkpoint at a clock <= it can no longer be a consistent cut here.
  void NoteApplied(uint64_t step);
  // The same for a push applied to a backup copy of another server's
  // slots; it counts once those slots are promoted to this server.
  void NoteReplicaApplied(uint64_t step);
  void Promoted();

  // Whether the pending checkpoint's cut is reached: every live worker
  // finished the steps before it (their pushes, sent before their clocks,
  // are here) and, under BSP, those steps are applied; or no worker is
  // live.
  bool ReadyToWrite(const ConsistencyController& consistency) const;
  // The pending checkpoint is being written (whether or not that
  // succeeds, it is handled): returns its clock; none is pending after.
  // Requires pending() != 0.
  uint64_t StartWrite();

  // Restores: whether the first view with a slot map was taken up
  // (restoring from its checkpoint, if it names one); MarkRestoreTried
  // sets it. NoteRestored: the tables hold the checkpoint at `clock`, so
  // no checkpoint at or before it is taken.
  bool restore_tried() const { return restore_tried_; }
  void MarkRestoreTried() { restore_tried_ = true; }
  void NoteRestored(uint64_t clock);

  // Held requests, in arrival order.
  void Hold(Held held) { held_.push_back(std::move(held)); }
  size_t held_count() const { return held_.size(); }
  // Hands over every held request while no checkpoint is pending (the
  // caller runs them again); empty while one is.
  std::deque<Held> TakeHeld();

 private:
  uint64_t pending_ = 0;
  uint64_t handled_ = 0;
  std::deque<Held> held_;
  bool restore_tried_ = false;
  // The largest step of a push applied on arrival, and whether any was.
  uint64_t max_applied_push_step_ = 0;
  bool any_push_applied_ = false;
  // The same for pushes applied to backup copies.
  uint64_t max_replica_push_step_ = 0;
};

}  // namespace ps

#endif  // PS_SERVER_CHECKPOINT_GATE_H_
