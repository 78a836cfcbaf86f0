#include "common/allocator.h"

#include <malloc.h>

namespace ps {

void KeepLargeBuffers() {
  // 32 MiB is glibc's largest mmap threshold on 64-bit; setting it also
  // stops the dynamic adjustment. The trim threshold keeps up to 512 MiB of
  // freed heap top; per-thread arenas shrink by the same rule.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

}  // namespace ps
