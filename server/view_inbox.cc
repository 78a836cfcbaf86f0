#include "server/view_inbox.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <utility>

namespace ps {

ViewInbox::~ViewInbox() {
  if (wake_fd_ >= 0) close(wake_fd_);
}

absl::Status ViewInbox::OpenWake() {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    return absl::InternalError(
        "cannot create the serving thread's wake-up eventfd");
  }
  return absl::OkStatus();
}

void ViewInbox::Install(std::shared_ptr<const ServerView> view) {
  absl::MutexLock lock(&mu_);
  posted_ = std::move(view);
}

void ViewInbox::Post(std::shared_ptr<const ServerView> view) {
  {
    absl::MutexLock lock(&mu_);
    if (posted_->all) return;  // standalone servers ignore views
    posted_ = std::move(view);
  }
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

std::shared_ptr<const ServerView> ViewInbox::Current() const {
  absl::MutexLock lock(&mu_);
  return posted_;
}

void ViewInbox::ClearWake() {
  uint64_t count;
  (void)!read(wake_fd_, &count, sizeof(count));
}

}  // namespace ps
