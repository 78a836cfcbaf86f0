#include "server/tier_waits.h"

#include <sys/eventfd.h>
#include <unistd.h>

namespace ps {

TierWaits::~TierWaits() {
  if (wake_fd_ >= 0) close(wake_fd_);
}

absl::Status TierWaits::OpenWake() {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    return absl::InternalError(
        "cannot create the disk tier readers' wake-up eventfd");
  }
  return absl::OkStatus();
}

void TierWaits::Wake() const {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void TierWaits::ClearWake() const {
  uint64_t count;
  (void)!read(wake_fd_, &count, sizeof(count));
}

}  // namespace ps
