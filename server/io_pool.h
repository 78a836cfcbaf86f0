// A few threads that run one batch of blocking reads at a time, so the
// reads of one request are in flight together instead of one after the
// other: a disk answers several random reads at once in about the time of
// one (an SSD's queue, a VM's virtual disk), and a tier read in the
// serving thread otherwise waits for each in turn.
//
// Thread safety: Run may be called from any thread; calls run one after
// the other. The destructor waits for the running batch and joins the
// threads.
#ifndef PS_SERVER_IO_POOL_H_
#define PS_SERVER_IO_POOL_H_

#include <cstddef>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace ps {

class IoPool {
 public:
  // `threads` helpers besides the caller of Run (0: Run does everything
  // itself).
  explicit IoPool(int threads);
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  // Calls fn(i) for every i in [0, tasks), on the helpers and the calling
  // thread at once, and returns when every call returned.
  void Run(size_t tasks, absl::FunctionRef<void(size_t)> fn);

  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();
  // Takes and runs tasks of the current batch until none is left.
  void Work() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool WorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || (fn_ != nullptr && next_ < tasks_);
  }
  bool AllDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done_ == tasks_;
  }

  absl::Mutex run_mu_;  // one batch at a time
  absl::Mutex mu_;
  const absl::FunctionRef<void(size_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t tasks_ ABSL_GUARDED_BY(mu_) = 0;
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ps

#endif  // PS_SERVER_IO_POOL_H_
