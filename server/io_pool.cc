#include "server/io_pool.h"

namespace ps {

IoPool::IoPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

IoPool::~IoPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void IoPool::Work() {
  while (fn_ != nullptr && next_ < tasks_) {
    const size_t i = next_++;
    const absl::FunctionRef<void(size_t)>* fn = fn_;
    mu_.Unlock();
    (*fn)(i);
    mu_.Lock();
    ++done_;
  }
}

void IoPool::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(this, &IoPool::WorkOrStop));
    if (stop_) return;
    Work();
  }
}

void IoPool::Run(size_t tasks, absl::FunctionRef<void(size_t)> fn) {
  if (tasks == 0) return;
  absl::MutexLock run(&run_mu_);
  absl::MutexLock lock(&mu_);
  fn_ = &fn;
  tasks_ = tasks;
  next_ = 0;
  done_ = 0;
  Work();
  // fn lives until Run returns: wait for the helpers' last calls.
  mu_.Await(absl::Condition(this, &IoPool::AllDone));
  fn_ = nullptr;
}

}  // namespace ps
