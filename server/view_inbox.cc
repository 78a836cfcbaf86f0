#include "server/view_inbox.h"

#include <utility>

namespace ps {

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
  wake_.Wake();
}

std::shared_ptr<const ServerView> ViewInbox::Current() const {
  absl::MutexLock lock(&mu_);
  return posted_;
}

}  // namespace ps
