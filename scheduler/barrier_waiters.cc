#include "scheduler/barrier_waiters.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace ps {

BarrierWaiters::BarrierWaiters(ClusterState* state)
    : state_(state), thread_([this] { Loop(); }) {
  state_->SetBarrierListener([this] {
    absl::MutexLock lock(&mu_);
    woken_ = true;
  });
}

BarrierWaiters::~BarrierWaiters() { Close(); }

void BarrierWaiters::Wait(const BarrierRequest* request,
                          BarrierResponse* response,
                          grpc::ServerUnaryReactor* reactor) {
  const absl::Duration wait = std::min(
      absl::Milliseconds(request->timeout_ms()), ClusterState::kMaxWait);
  {
    absl::MutexLock lock(&mu_);
    if (!closed_) {
      // Recorded and decided on this class's thread, so that no wake-up
      // falls between a decision and the record.
      waiting_.push_back(
          {request, response, reactor, absl::Now() + wait, /*arrived=*/false});
      fresh_ = true;
      return;
    }
  }
  reactor->Finish(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "the scheduler is closing"));
}

void BarrierWaiters::Close() {
  state_->SetBarrierListener(nullptr);
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

size_t BarrierWaiters::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_.size() + in_round_;
}

void BarrierWaiters::Loop() {
  while (true) {
    std::vector<Waiting> round;
    bool closing = false;
    absl::Time now;
    {
      absl::MutexLock lock(&mu_);
      in_round_ = 0;
      absl::Time earliest = absl::InfiniteFuture();
      for (const Waiting& w : waiting_) {
        earliest = std::min(earliest, w.deadline);
      }
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return woken_ || fresh_ || closed_;
      };
      mu_.AwaitWithDeadline(absl::Condition(&ready), earliest);
      closing = closed_;
      if (closing && waiting_.empty()) return;
      now = absl::Now();
      if (woken_ || closing) {
        // A barrier may have been decided: every call may be answered.
        round.swap(waiting_);
      } else {
        // Only the new calls and those past their deadline: the others'
        // answer has not changed.
        auto stays = std::partition(
            waiting_.begin(), waiting_.end(),
            [&](const Waiting& w) { return w.arrived && w.deadline > now; });
        round.assign(std::make_move_iterator(stays),
                     std::make_move_iterator(waiting_.end()));
        waiting_.erase(stays, waiting_.end());
      }
      in_round_ = round.size();
      woken_ = false;
      fresh_ = false;
    }
    if (round.empty()) continue;
    // The arrivals since the last round, recorded together.
    std::vector<ClusterState::BarrierArrival> arrivals;
    for (const Waiting& w : round) {
      if (!w.arrived)
        arrivals.push_back({w.request->node_id(), &w.request->name()});
    }
    if (!arrivals.empty()) {
      const std::vector<absl::Status> statuses =
          state_->ArriveAtBarriers(arrivals);
      std::vector<Waiting> recorded;
      recorded.reserve(round.size());
      size_t a = 0;
      for (Waiting& w : round) {
        if (w.arrived) {
          recorded.push_back(w);
          continue;
        }
        const absl::Status& s = statuses[a++];
        if (!s.ok()) {
          w.reactor->Finish(ToGrpcStatus(s));
          continue;
        }
        w.arrived = true;
        recorded.push_back(w);
      }
      round.swap(recorded);
    }
    std::vector<ClusterState::BarrierAsk> asks;
    asks.reserve(round.size());
    for (const Waiting& w : round) {
      asks.push_back({&w.request->name(), closing || w.deadline <= now});
    }
    std::vector<ClusterState::BarrierAnswer> answers =
        state_->DecideBarriers(asks);
    std::vector<Waiting> still;
    for (size_t i = 0; i < round.size(); ++i) {
      if (answers[i].has_value()) {
        Answer(round[i], std::move(*answers[i]));
      } else {
        still.push_back(round[i]);
      }
    }
    absl::MutexLock lock(&mu_);
    waiting_.insert(waiting_.end(), still.begin(), still.end());
    in_round_ = 0;
  }
}

void BarrierWaiters::Answer(
    const Waiting& w,
    absl::StatusOr<std::shared_ptr<const ClusterState::BarrierRelease>>
        answer) {
  if (!answer.ok()) {
    w.reactor->Finish(ToGrpcStatus(answer.status()));
    return;
  }
  const ClusterState::BarrierRelease& release = **answer;
  if (w.request->rank_runs()) {
    w.response->mutable_rank_runs()->Add(release.rank_runs.begin(),
                                         release.rank_runs.end());
  } else {
    w.response->mutable_ranks()->Add(release.ranks.begin(),
                                     release.ranks.end());
  }
  w.reactor->Finish(grpc::Status::OK);
}

}  // namespace ps
