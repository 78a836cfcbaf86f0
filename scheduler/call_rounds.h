#ifndef PS_SCHEDULER_CALL_ROUNDS_H_
#define PS_SCHEDULER_CALL_ROUNDS_H_

#include <algorithm>
#include <cstddef>
#include <functional>
#include <iterator>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ps {

// Long-poll calls (gRPC's callback API) kept as records and answered in
// rounds by one thread: what the scheduler's barriers and end-of-training
// claims share. Every worker of a fleet makes such a call at once and most
// wait; as blocked threads of gRPC's synchronous pool, 10 000 of them were
// 10 000 threads of the scheduler, and the calls that would release them
// queued behind the waits.
//
// A call is queued as it arrives (gRPC's threads, which also answer
// heartbeats, never wait for the cluster state's lock here). The thread
// takes a round:
//   - every waiting call, after Wake (the state changed so that any of them
//     may be answered) or Close;
//   - otherwise the calls new since the last round and those past their
//     deadline: the others' answer has not changed.
// and hands it to `decide`, which records what the new calls bring (under
// one lock of the state for the whole round), answers what it can, and
// returns the calls still waiting. Those are decided again in a later
// round, no longer marked `fresh`. A call is in exactly one round at a
// time, so `decide` owns the round it is given.
//
// Call is a small copyable record of one call (pointers to its request,
// response and reactor). `decide` runs on this class's thread only; it
// must finish every call it does not return, exactly once. Close makes the
// next round contain every call with `closing` set: `decide` must then
// answer all of them (as at their deadline), and Add refuses new ones.
//
// Thread safety: Add, Wake, Close and waiting from any thread. Wake may be
// called under a lock that `decide` also takes (the cluster state's
// listeners run under the state's lock): it takes only this class's lock,
// which is never held while `decide` runs.
template <typename Call>
class CallRounds {
 public:
  struct Queued {
    Call call;
    absl::Time deadline;
    bool fresh;  // not in any round yet
  };
  // Decides `round` at `now` (closing: the last round, answer every call);
  // returns the calls still waiting.
  using Decide = std::function<std::vector<Queued>(
      std::vector<Queued> round, absl::Time now, bool closing)>;

  explicit CallRounds(Decide decide)
      : decide_(std::move(decide)), thread_([this] { Loop(); }) {}
  ~CallRounds() { Close(); }
  CallRounds(const CallRounds&) = delete;
  CallRounds& operator=(const CallRounds&) = delete;

  // Queues `call` until `deadline`; false (nothing queued) once closing,
  // when the caller answers it itself.
  bool Add(Call call, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    waiting_.push_back({std::move(call), deadline, /*fresh=*/true});
    fresh_ = true;
    return true;
  }

  // The state changed so that any waiting call may be answered.
  void Wake() {
    absl::MutexLock lock(&mu_);
    woken_ = true;
  }

  // Answers every waiting call in a last round, then stops the thread.
  void Close() {
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  // For `decide`: answers each call of `round` whose entry in `answers`
  // (one per call, in order) holds a value, by answer(call, value), and
  // returns the others, still waiting.
  template <typename Answers, typename AnswerFn>
  static std::vector<Queued> AnswerDecided(const std::vector<Queued>& round,
                                           Answers& answers,
                                           const AnswerFn& answer) {
    std::vector<Queued> still;
    for (size_t i = 0; i < round.size(); ++i) {
      if (answers[i].has_value()) {
        answer(round[i].call, std::move(*answers[i]));
      } else {
        still.push_back(round[i]);
      }
    }
    return still;
  }

  // Calls waiting now (queued or in the round in progress).
  size_t waiting() const {
    absl::MutexLock lock(&mu_);
    return waiting_.size() + in_round_;
  }

 private:
  void Loop() {
    while (true) {
      std::vector<Queued> round;
      bool closing = false;
      absl::Time now;
      {
        absl::MutexLock lock(&mu_);
        in_round_ = 0;
        absl::Time earliest = absl::InfiniteFuture();
        for (const Queued& q : waiting_) {
          earliest = std::min(earliest, q.deadline);
        }
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return woken_ || fresh_ || closed_;
        };
        mu_.AwaitWithDeadline(absl::Condition(&ready), earliest);
        closing = closed_;
        if (closing && waiting_.empty()) return;
        now = absl::Now();
        if (woken_ || closing) {
          round.swap(waiting_);
        } else {
          auto stays = std::partition(
              waiting_.begin(), waiting_.end(),
              [&](const Queued& q) { return !q.fresh && q.deadline > now; });
          round.assign(std::make_move_iterator(stays),
                       std::make_move_iterator(waiting_.end()));
          waiting_.erase(stays, waiting_.end());
        }
        in_round_ = round.size();
        woken_ = false;
        fresh_ = false;
      }
      if (round.empty()) continue;
      std::vector<Queued> still = decide_(std::move(round), now, closing);
      for (Queued& q : still) q.fresh = false;
      absl::MutexLock lock(&mu_);
      waiting_.insert(waiting_.end(), std::make_move_iterator(still.begin()),
                      std::make_move_iterator(still.end()));
      in_round_ = 0;
    }
  }

  const Decide decide_;
  mutable absl::Mutex mu_;
  std::vector<Queued> waiting_ ABSL_GUARDED_BY(mu_);
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  // Calls not in any round yet are queued.
  bool fresh_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Taken out of waiting_ for the round in progress.
  size_t in_round_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: starts once the rest is set
};

}  // namespace ps

#endif  // PS_SCHEDULER_CALL_ROUNDS_H_
