// A key-value server: owns the key slots the cluster view assigns to it and
// serves push and pull over ZeroMQ (proto/data_plane.proto), and SCAN of
// every row it holds, for exporting a trained model.
//
// Start() binds the data-plane socket and starts one serving thread, which
// owns every table: requests are applied one at a time, in arrival order,
// so each request is atomic with respect to the others. Every request is
// validated in full before any table is touched; a rejected request changes
// nothing and is answered with an error, and the server keeps serving.
//
// Consistency (server/consistency.h): under BSP, pushes are buffered per
// step and applied, averaged, once every live worker finished the step;
// under BSP and SSP, a pull (or scan) that may not be answered yet is held
// and answered as soon as it may. A pull held longer than the watchdog timeout
// is logged with the worker ranks it waits for and their clocks.
//
// Registration with the scheduler is the caller's business (server_main.cc
// does it); the server only needs the view through UpdateView().
#ifndef PS_SERVER_SERVER_H_
#define PS_SERVER_SERVER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/config.pb.h"
#include "proto/data_plane.pb.h"
#include "proto/scheduler.pb.h"
#include "server/consistency.h"
#include "server/table.h"
#include "zmq.hpp"

namespace ps {

class KVServer {
 public:
  struct Options {
    // Validated job config (common/config.h); tables and the initial
    // consistency mode come from it.
    JobConfig config;
    // ZeroMQ endpoint to bind. Port "*" picks a free port.
    std::string bind_endpoint = "tcp://127.0.0.1:*";
    // When true, the server owns every slot and needs no cluster view
    // (single-server tools and tests). Otherwise it answers UNAVAILABLE
    // until UpdateView() gives it a view with a slot map.
    bool standalone = false;
    // Time source for row TTLs in seconds. Not owned; must outlive the
    // server.
    Clock* clock = Clock::Real();
  };

  struct Stats {
    uint64_t requests = 0;
    uint64_t errors = 0;
    uint64_t keys_pushed = 0;
    uint64_t keys_pulled = 0;
    // Pulls held until the consistency mode allowed an answer.
    uint64_t pulls_deferred = 0;
    // BSP steps applied (each an average over the workers of one step).
    uint64_t bsp_steps_applied = 0;
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

  // Installs a cluster view; `rank` is this server's rank in it. Its slot
  // map (present from RUNNING on), live workers and consistency mode take
  // effect within one poll period (50 ms). Thread-safe.
  void UpdateView(const ClusterView& view, uint32_t rank);

  // Thread-safe snapshot of the counters.
  Stats stats() const;

  // Thread-safe: every table's statistics (ordered by table id) as the
  // serving thread last published them, at most kStatsPeriod ago, and
  // exactly as they ended once Stop() returned. Clients get current ones
  // with the STATS op.
  static constexpr absl::Duration kStatsPeriod = absl::Seconds(1);
  std::vector<TableStats> table_stats() const;

  // Stops the serving thread. Idempotent.
  void Stop();

 private:
  struct Ownership {
    bool all = false;  // standalone
    uint32_t rank = 0;
    uint64_t epoch = 0;
    std::vector<uint32_t> slot_owner;  // empty: not ready
    bool has_view = false;
    std::vector<ConsistencyController::Worker> live_workers;
    ConsistencyConfig consistency;
  };
  // Gradients of one BSP step, summed per element until the step completes.
  struct StepBuffer {
    // Sums are kept in double so the average does not depend on the order
    // in which workers' pushes arrive (to float precision).
    struct Sparse {
      absl::flat_hash_map<uint64_t, uint32_t> index;  // key -> row
      std::vector<uint64_t> keys;
      std::vector<double> sums;
    };
    struct Dense {
      // block -> sums over the block, and the touched element range.
      absl::flat_hash_map<uint64_t, std::vector<double>> blocks;
      absl::flat_hash_map<uint64_t, std::pair<uint64_t, uint64_t>> touched;
    };
    absl::flat_hash_map<uint32_t, Sparse> sparse;
    absl::flat_hash_map<uint32_t, Dense> dense;
    absl::flat_hash_set<uint64_t> pushers;  // node ids
  };
  struct Deferred {
    zmq::message_t identity;
    std::vector<zmq::message_t> frames;  // a PULL request
    uint64_t clock = 0;
    uint32_t rank = 0;
    absl::Time since;
  };
  enum class Outcome { kAnswer, kDefer };

  explicit KVServer(Options options);
  void Serve();
  void ApplyView(const Ownership& own);
  void HandleMessage(zmq::message_t identity, std::vector<zmq::message_t> frames,
                     const Ownership& own);
  // Processes one request. kDefer: the (pull) request is not answered yet;
  // the frames were rewritten into a plain PULL to run again later.
  // `keys` is filled by SCAN only.
  Outcome Process(std::vector<zmq::message_t>& frames, const Ownership& own,
                  ResponseHeader* rh, zmq::message_t* values,
                  zmq::message_t* keys);
  absl::Status ProcessChecked(std::vector<zmq::message_t>& frames,
                              const Ownership& own, ResponseHeader* rh,
                              zmq::message_t* values, zmq::message_t* keys,
                              Outcome* outcome);
  // Answers a validated SCAN request of `sparse` with one page.
  void Scan(const SparseTable& sparse, const RequestHeader& h,
            ResponseHeader* rh, zmq::message_t* values, zmq::message_t* keys);
  void Buffer(uint64_t step, uint64_t node_id, Table* table,
              absl::Span<const uint64_t> keys, const Segments& segments,
              absl::Span<const float> grads);
  void ApplyBuffered(uint64_t step, StepBuffer& buffer, uint32_t divisor);
  // Applies completed BSP steps and answers held pulls that may be answered.
  void Progress(const Ownership& own);
  void FlushBuffers();
  void Watchdog();
  // Moves the tables' step and time forward (TTL expiry).
  void AdvanceTables();
  // Notes a worker's clock for the server's clock (staleness, TTL steps).
  void NoteClock(uint64_t clock);
  // Answers a STATS request.
  void FillStats(ResponseHeader* rh) const;
  void Send(zmq::message_t& identity, const ResponseHeader& rh,
            zmq::message_t& values, zmq::message_t& keys);

  const Options options_;
  zmq::context_t context_{1};
  zmq::socket_t socket_;
  std::string endpoint_;
  int port_ = 0;

  // Owned by the serving thread once it runs.
  absl::flat_hash_map<uint32_t, std::unique_ptr<Table>> tables_;
  ConsistencyController consistency_;
  std::map<uint64_t, StepBuffer> buffers_;  // BSP step -> sums
  std::deque<Deferred> deferred_;
  absl::Time last_watchdog_log_ = absl::InfinitePast();
  // The largest clock any worker has reported (requests and ADVANCE_CLOCK;
  // the finished marker excluded): the server's clock.
  uint64_t server_clock_ = 0;

  void PublishTableStats();
  absl::Time last_stats_publish_ = absl::InfinitePast();
  mutable absl::Mutex stats_mu_;
  std::vector<TableStats> table_stats_ ABSL_GUARDED_BY(stats_mu_);

  mutable absl::Mutex view_mu_;
  std::shared_ptr<const Ownership> ownership_ ABSL_GUARDED_BY(view_mu_);

  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> requests_{0}, errors_{0}, keys_pushed_{0},
      keys_pulled_{0}, pulls_deferred_{0}, bsp_steps_{0};
  std::thread thread_;
};

}  // namespace ps

#endif  // PS_SERVER_SERVER_H_
