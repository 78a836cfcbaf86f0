#include "scheduler/view_watchers.h"

#include <algorithm>
#include <utility>

namespace ps {
namespace {

// As ClusterState's own waits: a poll never holds a record longer.
// Deadlines this close together are answered in one round.
constexpr absl::Duration kDeadlineSlack = absl::Milliseconds(5);

bool Ready(const ClusterState::ViewHead& head, uint64_t min_epoch,
           bool wait_for_running) {
  return head.closed || (head.epoch >= min_epoch &&
                         (!wait_for_running || head.job_state != STARTING));
}

}  // namespace

ViewWatchers::ViewWatchers(ClusterState* state) : state_(state) {
  state_->SetViewListener([this] {
    absl::MutexLock lock(&mu_);
    changed_ = true;
  });
  thread_ = std::thread([this] { Run(); });
}

ViewWatchers::~ViewWatchers() {
  state_->SetViewListener(nullptr);
  Close();
}

void ViewWatchers::Watch(const GetClusterViewRequest& request,
                         ClusterView* response, Done done) {
  const absl::Duration timeout =
      std::min(absl::Milliseconds(request.timeout_ms()), ClusterState::kMaxWait);
  const uint64_t min_epoch = request.min_epoch();
  const bool wait_for_running = request.wait_for_running();
  const ClusterState::ViewAsk ask{request.known_epoch(), request.servers_only(),
                                  request.node_id()};
  auto answer_now = [&] {
    *response = std::move(state_->ViewsFor({ask}).front());
    done();
  };
  if (timeout <= absl::ZeroDuration() ||
      Ready(state_->Head(), min_epoch, wait_for_running)) {
    answer_now();
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!closed_) {
      const uint64_t id = next_id_++;
      Waiter& w = waiters_[id];
      w.min_epoch = min_epoch;
      w.wait_for_running = wait_for_running;
      w.ask = ask;
      w.deadline = absl::Now() + timeout;
      w.response = response;
      w.done = std::move(done);
      // A deadline earlier than the one the dispatcher sleeps towards.
      if (by_deadline_.empty() || w.deadline < by_deadline_.begin()->first) {
        changed_ = true;
      }
      by_epoch_.emplace(min_epoch, id);
      by_deadline_.emplace(w.deadline, id);
      done = nullptr;
    }
  }
  if (done != nullptr) {  // closed meanwhile
    answer_now();
    return;
  }
  // A change between the first look and the record's insertion found no
  // record to answer: look again, and leave the answer to the dispatcher.
  if (Ready(state_->Head(), min_epoch, wait_for_running)) {
    absl::MutexLock lock(&mu_);
    changed_ = true;
  }
}

void ViewWatchers::Close() {
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

size_t ViewWatchers::Waiting() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

void ViewWatchers::Run() {
  absl::Time not_before = absl::InfinitePast();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const absl::Time deadline = by_deadline_.empty()
                                      ? absl::InfiniteFuture()
                                      : by_deadline_.begin()->first;
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return changed_ || closed_;
      };
      mu_.AwaitWithDeadline(absl::Condition(&woken), deadline);
      changed_ = false;
      // Coalescing: the previous round's length again before this one.
      if (!closed_ && absl::Now() < not_before) {
        mu_.AwaitWithDeadline(absl::Condition(&closed_), not_before);
      }
    }
    // Read without holding mu_: the state's listener takes mu_ under the
    // state's lock, so this order (state, then mu_) is the only one.
    const ClusterState::ViewHead head = state_->Head();
    std::vector<Waiter> ready;
    bool closed;
    {
      absl::MutexLock lock(&mu_);
      closed = closed_;
      ready = TakeReadyLocked(head, absl::Now());
    }
    if (!ready.empty()) {
      const absl::Time start = absl::Now();
      Answer(std::move(ready));
      const absl::Time end = absl::Now();
      not_before = end + (end - start);
    }
    if (closed) return;  // Watch answers at once from now on
  }
}

std::vector<ViewWatchers::Waiter> ViewWatchers::TakeReadyLocked(
    const ClusterState::ViewHead& head, absl::Time now) {
  std::vector<uint64_t> ids;
  if (closed_ || head.closed) {
    for (const auto& [id, w] : waiters_) ids.push_back(id);
  } else {
    for (auto it = by_deadline_.begin();
         it != by_deadline_.end() && it->first <= now + kDeadlineSlack; ++it) {
      ids.push_back(it->second);
    }
    for (auto it = by_epoch_.begin();
         it != by_epoch_.end() && it->first <= head.epoch; ++it) {
      const Waiter& w = waiters_.at(it->second);
      if (Ready(head, w.min_epoch, w.wait_for_running) &&
          w.deadline > now + kDeadlineSlack) {
        ids.push_back(it->second);
      }
    }
  }
  std::vector<Waiter> ready;
  ready.reserve(ids.size());
  for (uint64_t id : ids) {
    auto it = waiters_.find(id);
    by_epoch_.erase({it->second.min_epoch, id});
    by_deadline_.erase({it->second.deadline, id});
    ready.push_back(std::move(it->second));
    waiters_.erase(it);
  }
  return ready;
}

void ViewWatchers::Answer(std::vector<Waiter> ready) {
  std::vector<ClusterState::ViewAsk> asks;
  asks.reserve(ready.size());
  for (const Waiter& w : ready) asks.push_back(w.ask);
  std::vector<ClusterView> views = state_->ViewsFor(asks);
  for (size_t i = 0; i < ready.size(); ++i) {
    *ready[i].response = std::move(views[i]);
    ready[i].done();
  }
}

}  // namespace ps
