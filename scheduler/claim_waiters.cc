#include "scheduler/claim_waiters.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace ps {

ClaimWaiters::ClaimWaiters(ClusterState* state)
    : state_(state),
      rounds_([this](std::vector<Rounds::Queued> round, absl::Time now,
                     bool closing) {
        return Decide(std::move(round), now, closing);
      }) {
  state_->SetClaimListener([this] { rounds_.Wake(); });
}

ClaimWaiters::~ClaimWaiters() { Close(); }

void ClaimWaiters::Claim(const ClaimShardRequest* request,
                         ClaimShardResponse* response,
                         grpc::ServerUnaryReactor* reactor) {
  const absl::Duration wait = std::min(
      absl::Milliseconds(request->timeout_ms()), ClusterState::kMaxWait);
  // Recorded and decided on the rounds' thread, so that no wake-up falls
  // between a decision and the record.
  if (rounds_.Add({request, response, reactor, /*seq=*/0},
                  absl::Now() + wait)) {
    return;
  }
  reactor->Finish(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "the scheduler is closing"));
}

void ClaimWaiters::Close() {
  state_->SetClaimListener(nullptr);
  rounds_.Close();
}

std::vector<ClaimWaiters::Rounds::Queued> ClaimWaiters::Decide(
    std::vector<Rounds::Queued> round, absl::Time now, bool closing) {
  // The finishes of the claims new in this round, recorded together.
  std::vector<const ClaimShardRequest*> arrived;
  for (const Rounds::Queued& q : round) {
    if (q.fresh) arrived.push_back(q.call.request);
  }
  if (!arrived.empty()) {
    const std::vector<ClusterState::ClaimTicket> tickets =
        state_->FinishClaims(arrived);
    std::vector<Rounds::Queued> recorded;
    recorded.reserve(round.size());
    size_t t = 0;
    for (Rounds::Queued& q : round) {
      if (q.fresh) {
        const ClusterState::ClaimTicket& ticket = tickets[t++];
        if (!ticket.status.ok()) {
          q.call.reactor->Finish(ToGrpcStatus(ticket.status));
          continue;
        }
        q.call.seq = ticket.seq;
      }
      recorded.push_back(q);
    }
    round.swap(recorded);
  }
  std::vector<ClusterState::ClaimAsk> asks;
  asks.reserve(round.size());
  for (const Rounds::Queued& q : round) {
    asks.push_back(
        {q.call.request, /*first=*/q.fresh, closing || q.deadline <= now});
  }
  std::vector<std::optional<absl::StatusOr<ClaimShardResponse>>> answers =
      state_->DecideClaims(asks);
  return Rounds::AnswerDecided(
      round, answers,
      [this](const Call& c, absl::StatusOr<ClaimShardResponse> answer) {
        Answer(c, std::move(answer));
      });
}

void ClaimWaiters::Answer(const Call& c,
                          absl::StatusOr<ClaimShardResponse> answer) {
  // The finish is on record before any answer (a failed write is retried
  // by the next; the worker retries meanwhile).
  if (answer.ok() && c.seq != 0 && !state_->JournalWritten(c.seq)) {
    answer = absl::UnavailableError(
        "the scheduler could not record the finished shard yet; retry");
  }
  if (!answer.ok()) {
    c.reactor->Finish(ToGrpcStatus(answer.status()));
    return;
  }
  *c.response = *std::move(answer);
  c.reactor->Finish(grpc::Status::OK);
}

}  // namespace ps
