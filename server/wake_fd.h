// An eventfd that wakes the serving thread's poll: any thread calls Wake,
// the serving thread polls fd() and resets it with Clear. Internal to
// //server:server.
#ifndef PS_SERVER_WAKE_FD_H_
#define PS_SERVER_WAKE_FD_H_

#include "common/status.h"

namespace ps {

class WakeFd {
 public:
  WakeFd() = default;
  // Closes the eventfd.
  ~WakeFd();
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;

  // Creates the eventfd; INTERNAL naming `what` (whose wake-up it is) if it
  // cannot. Before the serving thread starts.
  absl::Status Open(const char* what);
  // -1 before Open.
  int fd() const { return fd_; }
  // Any thread: makes fd() poll readable (nothing before Open).
  void Wake() const;
  // Serving thread: the read that makes fd() not readable again.
  void Clear() const;

 private:
  int fd_ = -1;
};

}  // namespace ps

#endif  // PS_SERVER_WAKE_FD_H_
