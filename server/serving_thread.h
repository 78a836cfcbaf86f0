// The serving thread's lifecycle: the thread, the stop requests it polls
// and whether it has stopped, and the CPU time it used. Internal to
// //server:server.
#ifndef PS_SERVER_SERVING_THREAD_H_
#define PS_SERVER_SERVING_THREAD_H_

#include <pthread.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <utility>

namespace ps {

class ServingThread {
 public:
  ServingThread() = default;
  // Stops and joins the thread.
  ~ServingThread() { Stop(); }
  ServingThread(const ServingThread&) = delete;
  ServingThread& operator=(const ServingThread&) = delete;

  // Runs `serve` on the thread; it returns once stop_requested(). Once.
  void Start(std::function<void()> serve) {
    thread_ = std::thread([this, serve = std::move(serve)] {
      clockid_t clock;
      if (pthread_getcpuclockid(pthread_self(), &clock) == 0) {
        cpu_clock_.store(clock);
        has_cpu_clock_.store(true);
      }
      serve();
      // Read once more before the thread ends: its clock id would name
      // no thread (or, once the id is reused, another one) afterwards.
      final_cpu_nanos_.store(cpu_nanos());
      has_cpu_clock_.store(false);
    });
  }
  // Any thread but the serving one: asks the thread to stop and joins it.
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // Serving thread: stop once the loop polls again.
  void RequestStop() { stop_.store(true); }
  // Serving thread: whether to stop (polled, so relaxed).
  bool stop_requested() const { return stop_.load(std::memory_order_relaxed); }

  // Any thread: stop once the next checkpoint is written.
  void StopAfterNextCheckpoint() { stop_after_checkpoint_.store(true); }
  bool stop_after_checkpoint() const { return stop_after_checkpoint_.load(); }

  // Serving thread, as it returns: serving has ended, nothing touches the
  // tables any more.
  void MarkStopped() { stopped_.store(true); }
  // Any thread.
  bool stopped() const { return stopped_.load(); }

  // Any thread: CPU time (user and system) the serving thread has used so
  // far, in nanoseconds; 0 before it starts. What one server costs, apart
  // from how many cores the machine has and what else runs on them.
  uint64_t cpu_nanos() const {
    if (!has_cpu_clock_.load()) return final_cpu_nanos_.load();
    timespec t;
    if (clock_gettime(cpu_clock_.load(), &t) != 0)
      return final_cpu_nanos_.load();
    return static_cast<uint64_t>(t.tv_sec) * 1000000000 +
           static_cast<uint64_t>(t.tv_nsec);
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> stop_after_checkpoint_{false};
  std::atomic<bool> stopped_{false};
  // The thread's CPU clock while it runs; its last reading once it ended.
  std::atomic<bool> has_cpu_clock_{false};
  std::atomic<clockid_t> cpu_clock_{0};
  std::atomic<uint64_t> final_cpu_nanos_{0};
  std::thread thread_;
};

}  // namespace ps

#endif  // PS_SERVER_SERVING_THREAD_H_
