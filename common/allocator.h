// Process-wide allocator settings for the data plane.
#ifndef PS_COMMON_ALLOCATOR_H_
#define PS_COMMON_ALLOCATOR_H_

namespace ps {

// Tells glibc's malloc to serve buffers up to 32 MiB from its heaps and to
// keep freed memory instead of returning it to the kernel at once.
//
// Why: glibc hands out blocks above its mmap threshold (128 KiB at start,
// raised only as such blocks are freed) as fresh mappings, and gives freed
// heap tops back to the kernel. A data plane allocates and frees a
// multi-megabyte frame per message (a dense tensor, a large pull answer),
// on different threads, so every message paid for page faults and for
// zeroing fresh pages: a third of the CPU of a 4 MB dense push (see
// docs/PERFORMANCE.md). Call once at the start of main(), before other
// threads start; process-global, so libraries never call it themselves.
void KeepLargeBuffers();

}  // namespace ps

#endif  // PS_COMMON_ALLOCATOR_H_
