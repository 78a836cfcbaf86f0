// The cluster view handed to the serving thread: the newest view any
// thread posted (under a mutex), the eventfd that wakes the serving thread
// when one arrives, and the view the serving thread applied last. Internal
// to //server:server.
#ifndef PS_SERVER_VIEW_INBOX_H_
#define PS_SERVER_VIEW_INBOX_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "server/server_view.h"
#include "server/wake_fd.h"

namespace ps {

class ViewInbox {
 public:
  // Holds an empty view (no slots: requests are refused) until one is
  // posted.
  ViewInbox() : posted_(std::make_shared<const ServerView>()) {}
  ViewInbox(const ViewInbox&) = delete;
  ViewInbox& operator=(const ViewInbox&) = delete;

  // Creates the wake-up eventfd; INTERNAL if it cannot. Before the serving
  // thread starts.
  absl::Status OpenWake() { return wake_.Open("serving thread's"); }
  // Before the serving thread starts: `view` (a standalone one, `all`) is
  // the view from now on.
  void Install(std::shared_ptr<const ServerView> view);
  // Any thread: `view` is the newest view, and the serving thread wakes to
  // apply it. Ignored once a standalone view is installed.
  void Post(std::shared_ptr<const ServerView> view);
  // Any thread: the newest view posted or installed (never null).
  std::shared_ptr<const ServerView> Current() const;

  // Serving thread only: the fd that polls readable after a Post (-1
  // before OpenWake), and the read that resets it.
  int wake_fd() const { return wake_.fd(); }
  void ClearWake() { wake_.Clear(); }

  // Serving thread only: the view it applied last (null before the first),
  // which the next one's promotions are computed against.
  const std::shared_ptr<const ServerView>& applied() const { return applied_; }
  void SetApplied(std::shared_ptr<const ServerView> view) {
    applied_ = std::move(view);
  }

 private:
  mutable absl::Mutex mu_;
  std::shared_ptr<const ServerView> posted_ ABSL_GUARDED_BY(mu_);
  WakeFd wake_;
  std::shared_ptr<const ServerView> applied_;
};

}  // namespace ps

#endif  // PS_SERVER_VIEW_INBOX_H_
