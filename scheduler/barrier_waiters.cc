#include "scheduler/barrier_waiters.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace ps {

BarrierWaiters::BarrierWaiters(ClusterState* state)
    : state_(state),
      rounds_([this](std::vector<Rounds::Queued> round, absl::Time now,
                     bool closing) {
        return Decide(std::move(round), now, closing);
      }) {
  state_->SetBarrierListener([this] { rounds_.Wake(); });
}

BarrierWaiters::~BarrierWaiters() { Close(); }

void BarrierWaiters::Wait(const BarrierRequest* request,
                          BarrierResponse* response,
                          grpc::ServerUnaryReactor* reactor) {
  const absl::Duration wait = std::min(
      absl::Milliseconds(request->timeout_ms()), ClusterState::kMaxWait);
  // Recorded and decided on the rounds' thread, so that no wake-up falls
  // between a decision and the record.
  if (rounds_.Add({request, response, reactor}, absl::Now() + wait)) return;
  reactor->Finish(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "the scheduler is closing"));
}

void BarrierWaiters::Close() {
  state_->SetBarrierListener(nullptr);
  rounds_.Close();
}

size_t BarrierWaiters::waiting() const { return rounds_.waiting(); }

std::vector<BarrierWaiters::Rounds::Queued> BarrierWaiters::Decide(
    std::vector<Rounds::Queued> round, absl::Time now, bool closing) {
  // The arrivals new in this round, recorded together.
  std::vector<ClusterState::BarrierArrival> arrivals;
  for (const Rounds::Queued& q : round) {
    if (q.fresh) {
      arrivals.push_back({q.call.request->node_id(), &q.call.request->name()});
    }
  }
  if (!arrivals.empty()) {
    const std::vector<absl::Status> statuses =
        state_->ArriveAtBarriers(arrivals);
    std::vector<Rounds::Queued> recorded;
    recorded.reserve(round.size());
    size_t a = 0;
    for (Rounds::Queued& q : round) {
      if (q.fresh) {
        const absl::Status& s = statuses[a++];
        if (!s.ok()) {
          q.call.reactor->Finish(ToGrpcStatus(s));
          continue;
        }
      }
      recorded.push_back(q);
    }
    round.swap(recorded);
  }
  std::vector<ClusterState::BarrierAsk> asks;
  asks.reserve(round.size());
  for (const Rounds::Queued& q : round) {
    asks.push_back({&q.call.request->name(), closing || q.deadline <= now});
  }
  std::vector<ClusterState::BarrierAnswer> answers =
      state_->DecideBarriers(asks);
  return Rounds::AnswerDecided(round, answers, &BarrierWaiters::Answer);
}

void BarrierWaiters::Answer(
    const Call& c,
    absl::StatusOr<std::shared_ptr<const ClusterState::BarrierRelease>>
        answer) {
  if (!answer.ok()) {
    c.reactor->Finish(ToGrpcStatus(answer.status()));
    return;
  }
  const ClusterState::BarrierRelease& release = **answer;
  if (c.request->rank_runs()) {
    c.response->mutable_rank_runs()->Add(release.rank_runs.begin(),
                                         release.rank_runs.end());
  } else {
    c.response->mutable_ranks()->Add(release.ranks.begin(),
                                     release.ranks.end());
  }
  c.reactor->Finish(grpc::Status::OK);
}

}  // namespace ps
