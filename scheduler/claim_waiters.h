#ifndef PS_SCHEDULER_CLAIM_WAITERS_H_
#define PS_SCHEDULER_CLAIM_WAITERS_H_

#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/scheduler.pb.h"
#include "scheduler/cluster_state.h"

namespace ps {

// ClaimShard calls (gRPC's callback API) that wait for work, kept as
// records and answered by one thread. At the end of training every worker
// of a fleet asks at once and most wait until every shard is done; as
// blocked threads, thousands of them outgrow gRPC's synchronous pool and
// the last finishes queue behind waits.
//
// A call is queued as it arrives (gRPC's threads, which also answer
// heartbeats, never wait for the state's lock here). This class's thread
// records the finishes of everything queued since its last round at once
// (ClusterState::FinishClaims: one lock, one journal write), then decides
// answers: right away, when the state says a waiting claim may be answered
// (ClusterState's claim listener), and at each claim's deadline (WAIT), all
// of a round under one lock (DecideClaims). A decided claim is finished
// once its finish is in the journal.
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
  struct Waiting {
    const ClaimShardRequest* request;
    ClaimShardResponse* response;
    grpc::ServerUnaryReactor* reactor;
    absl::Time deadline;
    uint64_t seq;   // journal snapshot of its finish (0: none pending)
    bool first;     // not decided yet even once
    bool arrived;   // its finish not recorded yet
  };

  void Loop();
  void Answer(const Waiting& w, absl::StatusOr<ClaimShardResponse> answer);

  ClusterState* const state_;
  absl::Mutex mu_;
  std::vector<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  // The state changed so that any waiting claim may be answered.
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  // Claims not decided yet even once are waiting.
  bool fresh_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest is set
};

}  // namespace ps

#endif  // PS_SCHEDULER_CLAIM_WAITERS_H_
