// Chooses and creates the Compute a worker runs its model on.
//
// The CUDA backend lives in libps_cuda.so, built only where the CUDA toolkit
// is installed and loaded with dlopen, so the same binaries run on machines
// with no CUDA at all. The library is looked for, in order:
//   1. next to the running executable (/proc/self/exe), for deployed copies;
//   2. in its Bazel runfiles (<exe>.runfiles/ps/worker/compute/, or
//      $RUNFILES_DIR / $TEST_SRCDIR under `bazel test` and `bazel run`);
//   3. in the bazel-bin tree relative to the executable
//      (<dir>/compute/ for //worker binaries, <dir>/../worker/compute/ for
//      other top-level packages).
// Every binary or test that depends on :compute_factory gets the library in
// its runfiles. A build without CUDA ships an empty placeholder instead,
// reported as "built without CUDA".
//
// Thread safety: both functions may be called from any thread.
#ifndef PS_WORKER_COMPUTE_COMPUTE_FACTORY_H_
#define PS_WORKER_COMPUTE_COMPUTE_FACTORY_H_

#include <memory>
#include <string>

#include "common/status.h"
#include "proto/config.pb.h"
#include "worker/compute/compute.h"

namespace ps {

// Creates the Compute for `device`:
//   AUTO: CUDA device 0 when usable, otherwise the CPU backend with the
//         reason stored in *why_cpu;
//   CPU:  the CPU backend (*why_cpu says it was requested);
//   GPU:  CUDA device 0, or FAILED_PRECONDITION with the reason.
// `threads` (below 1 means 1) is the CPU backend's OpenBLAS thread count;
// the GPU backend ignores it. *why_cpu (may be nullptr) is cleared when the
// GPU is used. An unknown enum value is INVALID_ARGUMENT.
//
// Trying the GPU initialises a CUDA context (tens to hundreds of ms).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Compute>> CreateCompute(
    ComputeDevice device, int threads, std::string* why_cpu);

// True when CreateCompute(GPU, ...) would succeed now; otherwise false with
// the reason in *why (may be nullptr). It creates and destroys a CUDA
// Compute to find out, so it costs as much as CreateCompute.
bool GpuAvailable(std::string* why);

}  // namespace ps

#endif  // PS_WORKER_COMPUTE_COMPUTE_FACTORY_H_
