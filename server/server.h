// A key-value server: owns the key slots the cluster view assigns to it and
// serves push and pull over ZeroMQ (proto/data_plane.proto).
//
// Start() binds the data-plane socket and starts one serving thread, which
// owns every table: requests are applied one at a time, in arrival order,
// so each request is atomic with respect to the others. Every request is
// validated in full before any table is touched; a rejected request changes
// nothing and is answered with an error, and the server keeps serving.
//
// Registration with the scheduler is the caller's business (server_main.cc
// does it); the server only needs the view through UpdateView().
#ifndef PS_SERVER_SERVER_H_
#define PS_SERVER_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"
#include "server/table.h"
#include "zmq.hpp"

namespace ps {

class KVServer {
 public:
  struct Options {
    // Validated job config (common/config.h); tables come from it.
    JobConfig config;
    // ZeroMQ endpoint to bind. Port "*" picks a free port.
    std::string bind_endpoint = "tcp://127.0.0.1:*";
    // When true, the server owns every slot and needs no cluster view
    // (single-server tools and tests). Otherwise it answers UNAVAILABLE
    // until UpdateView() gives it a RUNNING view.
    bool standalone = false;
  };

  struct Stats {
    uint64_t requests = 0;
    uint64_t errors = 0;
    uint64_t keys_pushed = 0;
    uint64_t keys_pulled = 0;
  };

  // Errors: INVALID_ARGUMENT for a bad table config, UNAVAILABLE if the
  // endpoint cannot be bound.
  static absl::StatusOr<std::unique_ptr<KVServer>> Start(Options options);

  // Stops serving and joins the thread.
  ~KVServer();
  KVServer(const KVServer&) = delete;
  KVServer& operator=(const KVServer&) = delete;

  // The endpoint actually bound, e.g. "tcp://127.0.0.1:41577".
  const std::string& endpoint() const { return endpoint_; }
  int port() const { return port_; }

  // Installs a cluster view; `rank` is this server's rank in it.
  // Thread-safe.
  void UpdateView(const ClusterView& view, uint32_t rank);

  // Thread-safe snapshot of the counters.
  Stats stats() const;

  // Stops the serving thread. Idempotent.
  void Stop();

 private:
  struct Ownership {
    bool all = false;  // standalone
    uint32_t rank = 0;
    uint64_t epoch = 0;
    std::vector<uint32_t> slot_owner;  // empty: not ready
  };

  explicit KVServer(Options options);
  void Serve();
  // Handles one request; fills the response header and values.
  void Handle(std::vector<zmq::message_t>& frames, const Ownership& own,
              ResponseHeader* rh, zmq::message_t* values);
  absl::Status Process(std::vector<zmq::message_t>& frames,
                       const Ownership& own, ResponseHeader* rh,
                       zmq::message_t* values);

  const Options options_;
  zmq::context_t context_{1};
  zmq::socket_t socket_;
  std::string endpoint_;
  int port_ = 0;
  // Owned by the serving thread once it runs.
  absl::flat_hash_map<uint32_t, std::unique_ptr<Table>> tables_;

  mutable absl::Mutex view_mu_;
  std::shared_ptr<const Ownership> ownership_ ABSL_GUARDED_BY(view_mu_);

  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> requests_{0}, errors_{0}, keys_pushed_{0},
      keys_pulled_{0};
  std::thread thread_;
};

}  // namespace ps

#endif  // PS_SERVER_SERVER_H_
