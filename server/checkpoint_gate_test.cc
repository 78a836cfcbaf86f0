// CheckpointGate's decisions, directly: no server, no sockets, no files.
#include "server/checkpoint_gate.h"

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "common/protocol.h"
#include "gtest/gtest.h"
#include "proto/config.pb.h"
#include "server/consistency.h"
#include "zmq.hpp"

namespace ps {
namespace {

using Result = CheckpointGate::TakeUpResult;

ConsistencyConfig Mode(ConsistencyMode mode) {
  ConsistencyConfig config;
  config.set_mode(mode);
  return config;
}

// A held request whose identity is `name`.
CheckpointGate::Held HeldRequest(const std::string& name, uint64_t bytes) {
  CheckpointGate::Held held;
  held.identity = zmq::message_t(name.data(), name.size());
  held.frames.emplace_back(size_t{3});
  held.bytes = bytes;
  return held;
}

class CheckpointGateTest : public ::testing::Test {
 protected:
  ConsistencyController async_{Mode(ASYNC)};
  CheckpointGate gate_;
};

TEST_F(CheckpointGateTest, TakesUpANewClock) {
  EXPECT_EQ(gate_.pending(), 0u);
  const Result r = gate_.TakeUp(10, true, async_);
  EXPECT_EQ(r.kind, Result::kPending);
  EXPECT_EQ(r.clock, 10u);
  EXPECT_EQ(gate_.pending(), 10u);
  // The same clock again changes nothing.
  EXPECT_EQ(gate_.TakeUp(10, true, async_).kind, Result::kUnchanged);
  EXPECT_EQ(gate_.pending(), 10u);
  // A newer clock replaces it.
  EXPECT_EQ(gate_.TakeUp(12, true, async_).kind, Result::kPending);
  EXPECT_EQ(gate_.pending(), 12u);
}

TEST_F(CheckpointGateTest, PushOfStepAtOrAfterPendingClockIsHeld) {
  EXPECT_FALSE(gate_.MustHold(10, false));  // nothing pending
  ASSERT_EQ(gate_.TakeUp(10, true, async_).kind, Result::kPending);
  EXPECT_FALSE(gate_.MustHold(9, false));
  EXPECT_TRUE(gate_.MustHold(10, false));
  EXPECT_TRUE(gate_.MustHold(11, false));
  // BSP buffers it instead; a finished worker's pushes are never held.
  EXPECT_FALSE(gate_.MustHold(10, true));
  EXPECT_FALSE(gate_.MustHold(kFinishedClock, false));
}

TEST_F(CheckpointGateTest, PullPastPendingClockWaits) {
  EXPECT_TRUE(gate_.PullAllowed(100));
  ASSERT_EQ(gate_.TakeUp(10, true, async_).kind, Result::kPending);
  EXPECT_TRUE(gate_.PullAllowed(10));
  EXPECT_FALSE(gate_.PullAllowed(11));
  EXPECT_TRUE(gate_.PullAllowed(kFinishedClock));
}

TEST_F(CheckpointGateTest, StepLimitIsThePendingClock) {
  EXPECT_EQ(gate_.StepLimit(), ConsistencyController::kNoWorkers);
  ASSERT_EQ(gate_.TakeUp(10, true, async_).kind, Result::kPending);
  EXPECT_EQ(gate_.StepLimit(), 10u);
}

TEST_F(CheckpointGateTest, ClockAtOrBelowAppliedPushStepIsTooLate) {
  gate_.NoteApplied(9);
  EXPECT_EQ(gate_.TakeUp(10, true, async_).kind, Result::kPending);
  gate_.NoteApplied(12);
  const Result r = gate_.TakeUp(12, true, async_);
  EXPECT_EQ(r.kind, Result::kTooLate);
  EXPECT_EQ(r.clock, 12u);
  EXPECT_EQ(r.applied_step, 12u);
  // Refused: nothing pending (the one at 10 was replaced), and the clock
  // counts as handled.
  EXPECT_EQ(gate_.pending(), 0u);
  EXPECT_EQ(gate_.handled(), 12u);
  EXPECT_EQ(gate_.TakeUp(12, true, async_).kind, Result::kUnchanged);
  EXPECT_EQ(gate_.TakeUp(13, true, async_).kind, Result::kPending);
  // A finished worker's push says nothing of the steps.
  gate_.NoteApplied(kFinishedClock);
  EXPECT_EQ(gate_.TakeUp(14, true, async_).kind, Result::kPending);
}

TEST_F(CheckpointGateTest, BspIsTooLateOnlyPastTheAppliedSteps) {
  ConsistencyController bsp(Mode(BSP));
  bsp.SetAppliedClock(12);
  // Pushes on arrival do not count under BSP: only applied steps do.
  gate_.NoteApplied(20);
  const Result r = gate_.TakeUp(11, true, bsp);
  EXPECT_EQ(r.kind, Result::kTooLate);
  EXPECT_EQ(r.applied_step, 11u);
  EXPECT_EQ(gate_.TakeUp(12, true, bsp).kind, Result::kPending);
}

TEST_F(CheckpointGateTest, ClockZeroAbandonsThePendingOne) {
  EXPECT_EQ(gate_.TakeUp(0, true, async_).kind, Result::kUnchanged);
  ASSERT_EQ(gate_.TakeUp(10, true, async_).kind, Result::kPending);
  const Result r = gate_.TakeUp(0, true, async_);
  EXPECT_EQ(r.kind, Result::kAbandoned);
  EXPECT_EQ(r.clock, 10u);
  EXPECT_EQ(gate_.pending(), 0u);
  // Not handled: the scheduler may name it again.
  EXPECT_EQ(gate_.TakeUp(10, true, async_).kind, Result::kPending);
}

TEST_F(CheckpointGateTest, DisabledServerTakesNothingUp) {
  ASSERT_EQ(gate_.TakeUp(10, true, async_).kind, Result::kPending);
  EXPECT_EQ(gate_.TakeUp(12, false, async_).kind, Result::kOff);
  EXPECT_EQ(gate_.pending(), 0u);
  EXPECT_FALSE(gate_.MustHold(12, false));
}

TEST_F(CheckpointGateTest, CutIsReachedWhenEveryLiveWorkerPassedIt) {
  EXPECT_FALSE(gate_.ReadyToWrite(async_));  // nothing pending
  async_.SetLiveWorkers({{1, 0, 0}, {2, 1, 0}});
  ASSERT_EQ(gate_.TakeUp(10, true, async_).kind, Result::kPending);
  async_.Advance(1, 10);
  async_.Advance(2, 9);
  EXPECT_FALSE(gate_.ReadyToWrite(async_));
  async_.Advance(2, 10);
  EXPECT_TRUE(gate_.ReadyToWrite(async_));
  EXPECT_EQ(gate_.StartWrite(), 10u);
  EXPECT_EQ(gate_.pending(), 0u);
  EXPECT_EQ(gate_.handled(), 10u);
  EXPECT_FALSE(gate_.ReadyToWrite(async_));
  EXPECT_EQ(gate_.TakeUp(10, true, async_).kind, Result::kUnchanged);
}

TEST_F(CheckpointGateTest, BspCutAlsoWaitsForTheStepsToBeApplied) {
  ConsistencyController bsp(Mode(BSP));
  bsp.SetLiveWorkers({{1, 0, 0}});
  ASSERT_EQ(gate_.TakeUp(10, true, bsp).kind, Result::kPending);
  bsp.Advance(1, 10);
  EXPECT_FALSE(gate_.ReadyToWrite(bsp));
  bsp.SetAppliedClock(10);
  EXPECT_TRUE(gate_.ReadyToWrite(bsp));
}

TEST_F(CheckpointGateTest, CutWithoutLiveWorkersIsReached) {
  ASSERT_EQ(gate_.TakeUp(10, true, async_).kind, Result::kPending);
  EXPECT_TRUE(gate_.ReadyToWrite(async_));
}

TEST_F(CheckpointGateTest, HeldRequestsComeBackInOrderOnceWritten) {
  ASSERT_EQ(gate_.TakeUp(10, true, async_).kind, Result::kPending);
  gate_.Hold(HeldRequest("a", 5));
  gate_.Hold(HeldRequest("b", 7));
  EXPECT_EQ(gate_.held_count(), 2u);
  // Not while the checkpoint is pending.
  EXPECT_TRUE(gate_.TakeHeld().empty());
  EXPECT_EQ(gate_.held_count(), 2u);
  gate_.StartWrite();
  std::deque<CheckpointGate::Held> held = gate_.TakeHeld();
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[0].identity.to_string(), "a");
  EXPECT_EQ(held[0].bytes, 5u);
  EXPECT_EQ(held[1].identity.to_string(), "b");
  EXPECT_EQ(held[1].frames.size(), 1u);
  EXPECT_EQ(gate_.held_count(), 0u);
}

TEST_F(CheckpointGateTest, ReplicaPushesCountOncePromoted) {
  gate_.NoteReplicaApplied(15);
  EXPECT_EQ(gate_.TakeUp(12, true, async_).kind, Result::kPending);
  gate_.Promoted();
  const Result r = gate_.TakeUp(14, true, async_);
  EXPECT_EQ(r.kind, Result::kTooLate);
  EXPECT_EQ(r.applied_step, 15u);
}

TEST_F(CheckpointGateTest, RestoredClockIsNotTakenUp) {
  EXPECT_FALSE(gate_.restore_tried());
  gate_.MarkRestoreTried();
  EXPECT_TRUE(gate_.restore_tried());
  gate_.NoteRestored(20);
  EXPECT_EQ(gate_.handled(), 20u);
  EXPECT_EQ(gate_.TakeUp(20, true, async_).kind, Result::kUnchanged);
  EXPECT_EQ(gate_.TakeUp(19, true, async_).kind, Result::kUnchanged);
  EXPECT_EQ(gate_.TakeUp(21, true, async_).kind, Result::kPending);
}

}  // namespace
}  // namespace ps
