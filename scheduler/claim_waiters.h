#ifndef PS_SCHEDULER_CLAIM_WAITERS_H_
#define PS_SCHEDULER_CLAIM_WAITERS_H_

#include <vector>

#include "grpcpp/grpcpp.h"
#include "proto/scheduler.pb.h"
#include "scheduler/call_rounds.h"
#include "scheduler/cluster_state.h"

namespace ps {

// ClaimShard calls (gRPC's callback API) that wait for work, kept as
// records and answered by one thread. At the end of training every worker
// of a fleet asks at once and most wait until every shard is done; as
// blocked threads, thousands of them outgrow gRPC's synchronous pool and
// the last finishes queue behind waits.
//
// The calls are answered in rounds (CallRounds). A round records the
// finishes of the claims new since the last round at once
// (ClusterState::FinishClaims: one lock, one journal write), then decides
// answers under one lock (DecideClaims): right away, when the state says a
// waiting claim may be answered (ClusterState's claim listener), and at each
// claim's deadline (WAIT). A decided claim is finished once its finish is
// in the journal.
//
// Thread safety: Claim and Close from any thread. Lock order: the state's
// lock, then this class's (the listener runs under the state's lock).
// Every claim is finished exactly once, also when Close comes first.
class ClaimWaiters {
 public:
  explicit ClaimWaiters(ClusterState* state);
  ~ClaimWaiters();
  ClaimWaiters(const ClaimWaiters&) = delete;
  ClaimWaiters& operator=(const ClaimWaiters&) = delete;

  // Handles one ClaimShard call; finishes `reactor` now or later.
  void Claim(const ClaimShardRequest* request, ClaimShardResponse* response,
             grpc::ServerUnaryReactor* reactor);
  // Answers every waiting claim as at its deadline, then stops the thread.
  void Close();

 private:
  struct Call {
    const ClaimShardRequest* request;
    ClaimShardResponse* response;
    grpc::ServerUnaryReactor* reactor;
    uint64_t seq;  // journal snapshot of its finish (0: none pending)
  };
  using Rounds = CallRounds<Call>;

  std::vector<Rounds::Queued> Decide(std::vector<Rounds::Queued> round,
                                     absl::Time now, bool closing);
  void Answer(const Call& c, absl::StatusOr<ClaimShardResponse> answer);

  ClusterState* const state_;
  Rounds rounds_;  // after state_: its thread starts at once
};

}  // namespace ps

#endif  // PS_SCHEDULER_CLAIM_WAITERS_H_
