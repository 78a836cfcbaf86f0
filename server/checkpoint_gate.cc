#include "server/checkpoint_gate.h"

#include <algorithm>
#include <utility>

#include "common/protocol.h"

namespace ps {

CheckpointGate::TakeUpResult CheckpointGate::TakeUp(uint64_t clock, bool enabled,
                                                    const ConsistencyController& consistency) {
  TakeUpResult result;
  if (clock == 0) {
    if (pending_ != 0) {
      // Abandoned by the scheduler (e.g. a server died meanwhile).
      result.kind = TakeUpResult::kAbandoned;
      result.clock = pending_;
      pending_ = 0;
    }
    return result;
  }
  if (clock == pending_ || clock <= handled_) return result;
  pending_ = 0;
  if (!enabled) {
    result.kind = TakeUpResult::kOff;
    return result;
  }
  result.clock = clock;
  // The cut at `clock` must hold no push of a step >= clock. Under BSP
  // pushes of steps >= the applied clock are only buffered.
  const bool bsp = consistency.mode() == BSP;
  const bool too_late = bsp ? consistency.applied_clock() > clock
                            : any_push_applied_ && max_applied_push_step_ >= clock;
  if (too_late) {
    handled_ = clock;
    result.kind = TakeUpResult::kTooLate;
    result.applied_step = bsp ? consistency.applied_clock() - 1 : max_applied_push_step_;
    return result;
  }
  pending_ = clock;
  result.kind = TakeUpResult::kPending;
  return result;
}

bool CheckpointGate::MustHold(uint64_t step, bool buffered) const {
  return pending_ != 0 && step >= pending_ && step < kFinishedClock && !buffered;
}

bool CheckpointGate::PullAllowed(uint64_t clock) const {
  return !(pending_ != 0 && clock > pending_ && clock < kFinishedClock);
}

uint64_t CheckpointGate::StepLimit() const {
  return pending_ != 0 ? pending_ : ConsistencyController::kNoWorkers;
}

void CheckpointGate::NoteApplied(uint64_t step) {
  if (step >= kFinishedClock) return;
  max_applied_push_step_ = std::max(max_applied_push_step_, step);
  any_push_applied_ = true;
}

void CheckpointGate::NoteReplicaApplied(uint64_t step) {
  if (step >= kFinishedClock) return;
  max_replica_push_step_ = std::max(max_replica_push_step_, step);
}

void CheckpointGate::Promoted() {
  // The promoted rows hold pushes of steps up to this.
  if (max_replica_push_step_ > 0) {
    max_applied_push_step_ = std::max(max_applied_push_step_, max_replica_push_step_);
    any_push_applied_ = true;
  }
}

bool CheckpointGate::ReadyToWrite(const ConsistencyController& consistency) const {
  if (pending_ == 0) return false;
  const uint64_t min_clock = consistency.MinClock();
  if (min_clock == ConsistencyController::kNoWorkers) return true;
  if (min_clock < pending_) return false;
  return consistency.mode() != BSP || consistency.applied_clock() >= pending_;
}

uint64_t CheckpointGate::StartWrite() {
  const uint64_t clock = pending_;
  handled_ = clock;
  pending_ = 0;
  return clock;
}

void CheckpointGate::NoteRestored(uint64_t clock) { handled_ = std::max(handled_, clock); }

std::deque<CheckpointGate::Held> CheckpointGate::TakeHeld() {
  std::deque<Held> held;
  if (pending_ == 0) held.swap(held_);
  return held;
}

}  // namespace ps
