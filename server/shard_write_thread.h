// Runs a checkpoint's ShardWriteInParts::Finish on a thread of its own, so
// the serving thread goes on while the disk tiers' cold rows are written.
//
// Thread safety: Start, done, Take and the destructor are called from one
// thread (the serving thread); `on_done` runs on the writing thread once
// the result is ready. The destructor waits for the write to end, so it
// must go before the tiers the write reads (declare it after the tables).
#ifndef PS_SERVER_SHARD_WRITE_THREAD_H_
#define PS_SERVER_SHARD_WRITE_THREAD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/time/time.h"
#include "common/status.h"
#include "server/checkpoint.h"

namespace ps {

class ShardWriteThread {
 public:
  // What ended: the checkpoint's clock, when it began, what the serving
  // thread spent on it (Begin), the write itself and its result.
  struct Ended {
    uint64_t clock = 0;
    absl::Time start;
    absl::Duration paused;
    std::unique_ptr<ShardWriteInParts> write;
    absl::StatusOr<ShardFile> result;
  };

  ShardWriteThread() = default;
  ~ShardWriteThread() { Join(); }
  ShardWriteThread(const ShardWriteThread&) = delete;
  ShardWriteThread& operator=(const ShardWriteThread&) = delete;

  // Whether a write was started and not yet taken.
  bool busy() const { return ended_.has_value(); }
  // Starts Finish of `write` (none may be busy()).
  void Start(uint64_t clock, absl::Time start, absl::Duration paused,
             std::unique_ptr<ShardWriteInParts> write,
             std::function<void()> on_done) {
    Join();
    done_.store(false, std::memory_order_relaxed);
    ended_.emplace(Ended{clock, start, paused, std::move(write),
                         absl::UnknownError("not written yet")});
    Ended* ended = &*ended_;
    thread_ = std::thread([this, ended, on_done = std::move(on_done)] {
      ended->result = ended->write->Finish();
      done_.store(true, std::memory_order_release);
      if (on_done) on_done();
    });
  }
  // Whether the busy write ended (Take then returns at once).
  bool done() const { return done_.load(std::memory_order_acquire); }
  // Waits for the busy write to end and hands it over; nullopt when none
  // is busy.
  std::optional<Ended> Take() {
    if (!ended_.has_value()) return std::nullopt;
    Join();
    std::optional<Ended> out = std::move(ended_);
    ended_.reset();
    return out;
  }

 private:
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

  std::thread thread_;
  std::atomic<bool> done_{false};
  std::optional<Ended> ended_;
};

}  // namespace ps

#endif  // PS_SERVER_SHARD_WRITE_THREAD_H_
