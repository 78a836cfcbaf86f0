// GetClusterView long polls kept as records rather than threads.
//
// Every node keeps one long poll open for the next epoch. A thread blocked
// per poll (the synchronous gRPC server's way) costs a thread per node, and
// every waiter is a condition on ClusterState's mutex that each unlock
// re-evaluates: at thousands of nodes that taxes every heartbeat. Here a
// poll whose view is not ready is a record in a table indexed by the epoch
// it waits for and by its deadline, and one dispatch thread answers it when
// the epoch comes (or the job runs, for wait_for_running), when its timeout
// passes (with the current view, as ClusterState::AwaitView), or on Close.
//
// Storms are coalesced: after a round that answered polls, the next round
// waits as long as that one took. A single change is answered at once; a
// stream of changes (a fleet registering) costs each node at most one
// answer per round, and the dispatch thread at most about half a core.
//
// Thread safety: every method may be called from any thread. `done` is
// called exactly once per Watch, from the caller's thread (when the view is
// ready at once) or the dispatch thread, never under a lock of this class;
// `response` must stay valid until then. The ClusterState must outlive this
// object.
#ifndef PS_SCHEDULER_VIEW_WATCHERS_H_
#define PS_SCHEDULER_VIEW_WATCHERS_H_

#include <cstdint>
#include <functional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/scheduler.pb.h"
#include "scheduler/cluster_state.h"

namespace ps {

class ViewWatchers {
 public:
  using Done = std::function<void()>;

  // Registers itself as `state`'s view listener and starts the dispatch
  // thread.
  explicit ViewWatchers(ClusterState* state);
  ~ViewWatchers();
  ViewWatchers(const ViewWatchers&) = delete;
  ViewWatchers& operator=(const ViewWatchers&) = delete;

  // Answers `request` into `response`, then calls `done`: at once when the
  // view already satisfies it (or its timeout is not positive), else once
  // it does or the timeout (at most 30 s) passes.
  void Watch(const GetClusterViewRequest& request, ClusterView* response,
             Done done);

  // Answers every waiting poll with the current view and stops the dispatch
  // thread; later polls are answered at once. Idempotent.
  void Close();

  // Polls waiting now (for tests and monitoring).
  size_t Waiting() const;

 private:
  struct Waiter {
    uint64_t min_epoch = 0;
    bool wait_for_running = false;
    ClusterState::ViewAsk ask;
    absl::Time deadline;
    ClusterView* response = nullptr;
    Done done;
  };

  void Run();
  // Moves out the waiters ready at `head` or past their deadline at `now`
  // (every one when closed).
  std::vector<Waiter> TakeReadyLocked(const ClusterState::ViewHead& head,
                                      absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills every waiter's response from one ViewsFor call, then calls
  // the done callbacks (no lock held).
  void Answer(std::vector<Waiter> ready);

  ClusterState* const state_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, uint64_t>> by_epoch_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, uint64_t>> by_deadline_ ABSL_GUARDED_BY(mu_);
  // Set by the state's listener (an epoch changed) and by Watch when a
  // change raced its registration.
  bool changed_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ps

#endif  // PS_SCHEDULER_VIEW_WATCHERS_H_
