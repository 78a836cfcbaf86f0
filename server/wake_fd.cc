#include "server/wake_fd.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace ps {

WakeFd::~WakeFd() {
  if (fd_ >= 0) close(fd_);
}

absl::Status WakeFd::Open(const char* what) {
  fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create the ", what, " wake-up eventfd"));
  }
  return absl::OkStatus();
}

void WakeFd::Wake() const {
  if (fd_ < 0) return;
  const uint64_t one = 1;
  (void)!write(fd_, &one, sizeof(one));
}

void WakeFd::Clear() const {
  uint64_t count;
  (void)!read(fd_, &count, sizeof(count));
}

}  // namespace ps
