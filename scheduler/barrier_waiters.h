#ifndef PS_SCHEDULER_BARRIER_WAITERS_H_
#define PS_SCHEDULER_BARRIER_WAITERS_H_

#include <memory>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "proto/scheduler.pb.h"
#include "scheduler/call_rounds.h"
#include "scheduler/cluster_state.h"

namespace ps {

// Barrier calls (gRPC's callback API) kept as records and answered by one
// thread. Every worker of a fleet calls a barrier at once and all but the
// last wait; as blocked threads of gRPC's synchronous pool, 10 000 of them
// were 10 000 threads of the scheduler.
//
// The calls are answered in rounds (CallRounds). A round records the
// arrivals new since the last round at once (ClusterState::ArriveAtBarriers:
// one lock, one check for released barriers), then decides answers under
// one lock (DecideBarriers): right away for those whose barrier is
// released, when the state says a barrier may be decided (its barrier
// listener: a release, the job failing, Close), and at each call's deadline
// (BarrierRequest.timeout_ms, at most ClusterState::kMaxWait). The answers
// are AwaitBarrier's.
//
// Thread safety: Wait and Close from any thread. Lock order: the state's
// lock, then this class's (the listener runs under the state's lock).
// Every call is finished exactly once, also when Close comes first.
class BarrierWaiters {
 public:
  explicit BarrierWaiters(ClusterState* state);
  ~BarrierWaiters();
  BarrierWaiters(const BarrierWaiters&) = delete;
  BarrierWaiters& operator=(const BarrierWaiters&) = delete;

  // Handles one Barrier call; finishes `reactor` now or later. `request`
  // and `response` belong to the call and stay valid until then.
  void Wait(const BarrierRequest* request, BarrierResponse* response,
            grpc::ServerUnaryReactor* reactor);
  // Answers every waiting call as at its deadline, then stops the thread.
  void Close();

  // Calls waiting now (recorded or queued); for tests and metrics.
  size_t waiting() const;

 private:
  struct Call {
    const BarrierRequest* request;
    BarrierResponse* response;
    grpc::ServerUnaryReactor* reactor;
  };
  using Rounds = CallRounds<Call>;

  std::vector<Rounds::Queued> Decide(std::vector<Rounds::Queued> round,
                                     absl::Time now, bool closing);
  static void Answer(
      const Call& c,
      absl::StatusOr<std::shared_ptr<const ClusterState::BarrierRelease>>
          answer);

  ClusterState* const state_;
  Rounds rounds_;  // after state_: its thread starts at once
};

}  // namespace ps

#endif  // PS_SCHEDULER_BARRIER_WAITERS_H_
