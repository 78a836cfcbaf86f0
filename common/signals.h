// Turns SIGINT and SIGTERM into a flag that main() loops can poll.
//
// Construct it first thing in main(), before any thread starts: it blocks
// the signals in the calling thread so every thread created afterwards
// inherits the mask, and a dedicated thread receives them with sigwait().
// A signal delivered to a thread started earlier (a library's, before
// main()) is forwarded to that thread by a handler, so it is never lost and
// never takes its default action. One instance per process.
// Thread-safe.
#ifndef PS_COMMON_SIGNALS_H_
#define PS_COMMON_SIGNALS_H_

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace ps {

class TerminationSignals {
 public:
  TerminationSignals();
  ~TerminationSignals();

  bool requested() const { return notification_.HasBeenNotified(); }
  // Returns true if a signal arrived within `timeout`.
  bool WaitFor(absl::Duration timeout) const {
    return notification_.WaitForNotificationWithTimeout(timeout);
  }
  // The signal number received, 0 if none.
  int signal() const { return signal_.load(); }
  // Acts as if SIGTERM had arrived (requested() and signal() follow), so a
  // stop asked for some other way (the scheduler draining the node) takes
  // exactly the SIGTERM path. Safe from any thread, any number of times.
  void RequestTermination();

 private:
  absl::Notification notification_;
  std::atomic<int> signal_{0};
  std::thread thread_;
};

}  // namespace ps

#endif  // PS_COMMON_SIGNALS_H_
