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
#include <functional>
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
    // Called on the serving thread when this server has written its shard
    // of a checkpoint (or failed to, or found it too late to take one at
    // the view's checkpoint_clock). server_main.cc forwards it to the
    // scheduler. Must not block for long.
    std::function<void(const ReportCheckpointRequest&)> on_checkpoint;
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
    // Pushes answered without being applied again: the same (sender, seq)
    // had been applied (a retry after a timeout or a failover).
    uint64_t duplicate_pushes = 0;
    // Checkpoint shards written, and rows restored from checkpoints.
    uint64_t checkpoints_written = 0;
    uint64_t rows_restored = 0;
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

  // Graceful exit without losing acknowledged updates (SIGTERM): the
  // serving thread stops right after it writes its shard of the next
  // checkpoint, before it applies or answers anything of later steps, so
  // every update it acknowledged is in the checkpoint a replacement
  // restores. Requests left unanswered are routed again by the workers
  // once this server leaves the view. stopped() tells when it happened.
  void StopAfterNextCheckpoint() { stop_after_checkpoint_.store(true); }
  bool stopped() const { return stopped_.load(); }

 private:
  struct Ownership {
    bool all = false;  // standalone
    uint32_t rank = 0;
    uint64_t epoch = 0;
    std::vector<uint32_t> slot_owner;  // empty: not ready
    bool has_view = false;
    std::vector<ConsistencyController::Worker> live_workers;
    ConsistencyConfig consistency;
    uint64_t checkpoint_clock = 0;
    CheckpointRef restore;
  };
  // Which sequence numbers of one sender were applied: the highest, and a
  // window of kSeqWindow below it.
  struct SeqWindow {
    uint64_t top = 0;
    std::vector<uint64_t> bits;  // kSeqWindow bits; bit (seq % kSeqWindow)
  };
  static constexpr uint64_t kSeqWindow = 1 << 16;
  enum class SeqCheck { kNew, kDuplicate, kTooOld };
  SeqCheck CheckSeq(uint64_t sender, uint64_t seq) const;
  void RecordSeq(uint64_t sender, uint64_t seq);
  // A request held while a checkpoint is taken (pushes of steps at or after
  // its clock), processed once the shard is written.
  struct Held {
    zmq::message_t identity;
    std::vector<zmq::message_t> frames;
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
  enum class Outcome { kAnswer, kDefer, kHold };

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
  // Whether a pull at `clock` may be answered: the consistency rule, and no
  // pull past a checkpoint in progress.
  bool PullAllowed(uint64_t clock) const;
  // Checkpoints: takes up the view's checkpoint clock, writes the shard
  // when the cut is reached, restores from the view's checkpoint once.
  void NoteCheckpointClock(const Ownership& own);
  void MaybeWriteCheckpoint(const Ownership& own);
  void ReleaseHeld(const Ownership& own);
  void Restore(const Ownership& own);
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
  // Sender node id -> applied sequence numbers.
  absl::flat_hash_map<uint64_t, SeqWindow> seqs_;
  // The largest step of a push applied on arrival (not BSP-buffered): a
  // checkpoint at a clock <= it can no longer be a consistent cut here.
  uint64_t max_applied_push_step_ = 0;
  bool any_push_applied_ = false;
  // Checkpoint in progress (0 = none) and the last one written or refused.
  uint64_t checkpoint_pending_ = 0;
  uint64_t checkpoint_handled_ = 0;
  std::deque<Held> held_;
  // Whether the first view with a slot map has been applied (restoring
  // from the view's checkpoint, if it names one).
  bool restored_ = false;

  void PublishTableStats();
  absl::Time last_stats_publish_ = absl::InfinitePast();
  mutable absl::Mutex stats_mu_;
  std::vector<TableStats> table_stats_ ABSL_GUARDED_BY(stats_mu_);

  mutable absl::Mutex view_mu_;
  std::shared_ptr<const Ownership> ownership_ ABSL_GUARDED_BY(view_mu_);

  std::atomic<bool> stop_{false};
  std::atomic<bool> stop_after_checkpoint_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> requests_{0}, errors_{0}, keys_pushed_{0},
      keys_pulled_{0}, pulls_deferred_{0}, bsp_steps_{0}, duplicates_{0},
      checkpoints_{0}, rows_restored_{0};
  std::thread thread_;
};

}  // namespace ps

#endif  // PS_SERVER_SERVER_H_
