#ifndef PS_SCHEDULER_CALL_BATCHER_H_
#define PS_SCHEDULER_CALL_BATCHER_H_

#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

namespace ps {

// Unary calls of gRPC's callback API answered in rounds by one thread. A
// call is queued when it arrives (no thread waits for it); each round
// hands everything queued since the last one to `handle` at once and
// finishes every call with the status `handle` gave it.
//
// Why: some calls each change what the scheduler journals (checkpoint
// reports). Handled one per gRPC thread, a journal write covers at most as
// many as the synchronous pool has threads (about a dozen), and a fleet's
// thousands of reports cost a thousand writes, each holding the state's
// lock. Here one write covers every report that arrived during the last.
//
// Thread safety: Add and Close may be called from any thread; `handle`
// runs on the batcher's thread only. Every added call is finished exactly
// once: by a round, or with UNAVAILABLE when it arrives after Close.
template <typename Request, typename Response>
class CallBatcher {
 public:
  struct Call {
    const Request* request;
    Response* response;
    grpc::ServerUnaryReactor* reactor;
  };
  // Fills the responses of `calls` and returns one status per call.
  using Handler =
      std::function<std::vector<grpc::Status>(const std::vector<Call>& calls)>;

  explicit CallBatcher(Handler handle)
      : handle_(std::move(handle)), thread_([this] { Loop(); }) {}
  ~CallBatcher() { Close(); }
  CallBatcher(const CallBatcher&) = delete;
  CallBatcher& operator=(const CallBatcher&) = delete;

  void Add(Call call) {
    {
      absl::MutexLock lock(&mu_);
      if (!closed_) {
        queue_.push_back(call);
        return;
      }
    }
    call.reactor->Finish(
        grpc::Status(grpc::StatusCode::UNAVAILABLE, "the scheduler is closing"));
  }

  // Answers what is queued (one last round), then stops the thread.
  void Close() {
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop() {
    while (true) {
      std::vector<Call> batch;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return closed_ || !queue_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;  // closed, nothing left
        batch.swap(queue_);
      }
      const std::vector<grpc::Status> statuses = handle_(batch);
      for (size_t i = 0; i < batch.size(); ++i) {
        batch[i].reactor->Finish(
            i < statuses.size()
                ? statuses[i]
                : grpc::Status(grpc::StatusCode::INTERNAL, "no answer"));
      }
    }
  }

  const Handler handle_;
  absl::Mutex mu_;
  std::vector<Call> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest is set
};

}  // namespace ps

#endif  // PS_SCHEDULER_CALL_BATCHER_H_
