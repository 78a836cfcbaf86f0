// The serving thread's lifecycle: the thread, the stop requests it polls
// and whether it has stopped. Internal to //server:server.
#ifndef PS_SERVER_SERVING_THREAD_H_
#define PS_SERVER_SERVING_THREAD_H_

#include <atomic>
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
    thread_ = std::thread(std::move(serve));
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

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> stop_after_checkpoint_{false};
  std::atomic<bool> stopped_{false};
  std::thread thread_;
};

}  // namespace ps

#endif  // PS_SERVER_SERVING_THREAD_H_
