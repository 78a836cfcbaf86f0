// The CPU backend of Compute: OpenBLAS for Gemm, plain loops for the rest.
#ifndef PS_WORKER_COMPUTE_CPU_COMPUTE_H_
#define PS_WORKER_COMPUTE_CPU_COMPUTE_H_

#include <memory>

#include "worker/compute/compute.h"

namespace ps {

// Returns a Compute working on host memory. Every kernel runs to completion
// before it returns, so Synchronize() and Download() never report an error.
//
// `threads` (values below 1 mean 1) is handed to openblas_set_num_threads,
// which is a process-wide setting: the last CPU Compute created decides it
// for all of them. The other kernels run on the calling thread; they are
// memory-bound at the sizes models use, and the backward scatters would
// need atomics to be split across threads.
//
// Alloc() returns 64-byte aligned memory.
std::unique_ptr<Compute> CreateCpuCompute(int threads);

}  // namespace ps

#endif  // PS_WORKER_COMPUTE_CPU_COMPUTE_H_
