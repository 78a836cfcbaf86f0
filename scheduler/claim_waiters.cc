#include "scheduler/claim_waiters.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace ps {

ClaimWaiters::ClaimWaiters(ClusterState* state)
    : state_(state), thread_([this] { Loop(); }) {
  state_->SetClaimListener([this] {
    absl::MutexLock lock(&mu_);
    woken_ = true;
  });
}

ClaimWaiters::~ClaimWaiters() { Close(); }

void ClaimWaiters::Claim(const ClaimShardRequest* request,
                         ClaimShardResponse* response,
                         grpc::ServerUnaryReactor* reactor) {
  const absl::Duration wait = std::min(
      absl::Milliseconds(request->timeout_ms()), ClusterState::kMaxWait);
  {
    absl::MutexLock lock(&mu_);
    if (!closed_) {
      // Recorded and decided on this class's thread, so that no wake-up
      // falls between a decision and the record.
      waiting_.push_back({request, response, reactor, absl::Now() + wait,
                          /*seq=*/0, /*first=*/true, /*arrived=*/true});
      fresh_ = true;
      return;
    }
  }
  reactor->Finish(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "the scheduler is closing"));
}

void ClaimWaiters::Close() {
  state_->SetClaimListener(nullptr);
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void ClaimWaiters::Loop() {
  while (true) {
    std::vector<Waiting> round;
    bool closing = false;
    absl::Time now;
    {
      absl::MutexLock lock(&mu_);
      absl::Time earliest = absl::InfiniteFuture();
      for (const Waiting& w : waiting_) earliest = std::min(earliest, w.deadline);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return woken_ || fresh_ || closed_;
      };
      mu_.AwaitWithDeadline(absl::Condition(&ready), earliest);
      closing = closed_;
      if (closing && waiting_.empty()) return;
      now = absl::Now();
      if (woken_ || closing) {
        // The state changed: any claim may be answered now.
        round.swap(waiting_);
      } else {
        // Only the new claims and those past their deadline: the others'
        // answer has not changed.
        auto stays = std::partition(
            waiting_.begin(), waiting_.end(),
            [&](const Waiting& w) { return !w.first && w.deadline > now; });
        round.assign(std::make_move_iterator(stays),
                     std::make_move_iterator(waiting_.end()));
        waiting_.erase(stays, waiting_.end());
      }
      woken_ = false;
      fresh_ = false;
    }
    if (round.empty()) continue;
    // The finishes of the claims that arrived since the last round.
    std::vector<const ClaimShardRequest*> arrived;
    for (const Waiting& w : round) {
      if (w.arrived) arrived.push_back(w.request);
    }
    if (!arrived.empty()) {
      const std::vector<ClusterState::ClaimTicket> tickets =
          state_->FinishClaims(arrived);
      std::vector<Waiting> recorded;
      size_t t = 0;
      for (Waiting& w : round) {
        if (!w.arrived) {
          recorded.push_back(w);
          continue;
        }
        const ClusterState::ClaimTicket& ticket = tickets[t++];
        if (!ticket.status.ok()) {
          w.reactor->Finish(ToGrpcStatus(ticket.status));
          continue;
        }
        w.arrived = false;
        w.seq = ticket.seq;
        recorded.push_back(w);
      }
      round.swap(recorded);
    }
    std::vector<ClusterState::ClaimAsk> asks;
    asks.reserve(round.size());
    for (const Waiting& w : round) {
      asks.push_back({w.request, w.first, closing || w.deadline <= now});
    }
    std::vector<std::optional<absl::StatusOr<ClaimShardResponse>>> answers =
        state_->DecideClaims(asks);
    std::vector<Waiting> still;
    for (size_t i = 0; i < round.size(); ++i) {
      if (answers[i].has_value()) {
        Answer(round[i], std::move(*answers[i]));
      } else {
        round[i].first = false;
        still.push_back(round[i]);
      }
    }
    if (!still.empty()) {
      absl::MutexLock lock(&mu_);
      waiting_.insert(waiting_.end(), still.begin(), still.end());
    }
  }
}

void ClaimWaiters::Answer(const Waiting& w,
                          absl::StatusOr<ClaimShardResponse> answer) {
  // The finish is on record before any answer (a failed write is retried
  // by the next; the worker retries meanwhile).
  if (answer.ok() && w.seq != 0 && !state_->JournalWritten(w.seq)) {
    answer = absl::UnavailableError(
        "the scheduler could not record the finished shard yet; retry");
  }
  if (!answer.ok()) {
    w.reactor->Finish(ToGrpcStatus(answer.status()));
    return;
  }
  *w.response = *std::move(answer);
  w.reactor->Finish(grpc::Status::OK);
}

}  // namespace ps
