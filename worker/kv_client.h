// Worker-side client of the data plane: push, pull and push-pull of sparse
// rows and dense ranges, routed by the cluster view's slot map, plus
// whole-cluster operations (clock, statistics, table export).
//
// Every call returns at once with a Completion; the request is split by
// owning server and sent to all of them in parallel by one background I/O
// thread. Completion::Wait() blocks until every part has answered, or the
// request timeout passes, and returns the first error. An optional callback
// runs on the I/O thread when the request completes; it must be quick and
// must not call Wait() on another request.
//
// Ownership: keys and gradients are copied before the call returns, so the
// caller may reuse them at once (the zero-copy dense forms share them
// instead, see PushDense). A pull's `out` buffer must stay valid until the
// request completes; it is written only by the I/O thread.
//
// Thread-safe: any number of threads may issue requests concurrently.
// Requests issued by one thread to the same server are applied in order.
#ifndef PS_WORKER_KV_CLIENT_H_
#define PS_WORKER_KV_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/curve_keys.h"
#include "common/metrics.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "proto/data_plane.pb.h"
#include "proto/scheduler.pb.h"

namespace ps {

// Internal to the client (worker/io_loop.h); declared here so that the
// private members below need no ZeroMQ include.
namespace kv_internal {
struct Routing;
struct Part;
struct ScanChain;
class IoLoop;
}  // namespace kv_internal

using DoneCallback = std::function<void(const absl::Status&)>;

// One server's statistics of one table (KVClient::TableStatistics).
struct ServerTableStats {
  uint32_t server_rank = 0;
  TableStats stats;
};

// The answer of a dense pull without a caller's buffer
// (KVClient::PullDense with a DenseValues): when one server holds the whole
// range, the values are read where they arrived (the answer's ZeroMQ frame,
// kept alive by this object), with no copy into a caller's array, as
// ps-lite's ZPull does; otherwise the client copies the servers' parts into
// an array this object owns. Read values() only after the pull's Completion
// is done with OK; until then it is empty. Reusing the object for another
// pull drops the previous values. Thread-compatible.
class DenseValues {
 public:
  absl::Span<const float> values() const { return view_; }

 private:
  friend class KVClient;
  friend class kv_internal::IoLoop;  // keeps a pull's answer frame
  // Drops the values (and the frame they pointed into).
  void Clear() {
    frame_.reset();
    copy_.clear();
    view_ = {};
  }
  // Makes the values this object's own array of n zeros, for answers that
  // are copied in (a pull spanning servers, an unaligned frame); returns
  // where they go.
  float* OwnArray(size_t n) {
    frame_.reset();
    copy_.assign(n, 0.0f);
    view_ = absl::MakeConstSpan(copy_);
    return copy_.data();
  }
  // Takes `values` as its own array.
  void Own(std::vector<float> values) {
    frame_.reset();
    copy_ = std::move(values);
    view_ = absl::MakeConstSpan(copy_);
  }
  std::shared_ptr<const void> frame_;  // the answer frame, when zero-copy
  std::vector<float> copy_;
  absl::Span<const float> view_;
};

// Handle on an asynchronous request. Copyable; all copies share the state.
class Completion {
 public:
  // Blocks until the request completes; returns its status.
  absl::Status Wait() const;
  // Waits at most `timeout` for the request to complete. true and *status
  // (if not null) set to the request's status when it did; false when it
  // is still in flight. Bounded waits let a caller react to signals in
  // between (the Python binding waits in short slices so Ctrl-C works).
  bool WaitFor(absl::Duration timeout, absl::Status* status = nullptr) const;
  bool done() const;
  // Pulls: the consistency diagnostics the servers answered with (the
  // smallest over the servers involved): the slowest live worker's clock,
  // and the number of BSP steps applied. 0 before completion.
  uint64_t min_clock() const;
  uint64_t applied_clock() const;

  // A request that completed at once with `status` (refused before
  // anything was sent).
  static Completion Failed(absl::Status status);

  struct State;

 private:
  friend class KVClient;
  explicit Completion(std::shared_ptr<State> state)
      : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

class KVClient {
 public:
  struct Options {
    // Validated job config: table shapes and timeouts come from it.
    JobConfig config;
    // This worker's rank and node id (from the scheduler), sent with every
    // request: servers track clocks by node id.
    uint32_t rank = 0;
    uint64_t node_id = 0;
    // The clock to start at (SchedulerClient::start_clock()).
    uint64_t start_clock = 0;
    // Scan(): most rows per page requested from a server, 1..kMaxScanRows
    // (common/wire.h); 0 lets the server pick (kDefaultScanRows). Larger
    // values are capped at kMaxScanRows.
    uint64_t scan_page_rows = 0;

    // Metrics (common/metrics.h), each optional; not owned, must outlive
    // the client. Observed on the I/O thread as a request completes (with
    // or without an error): the seconds from the call to its completion,
    // by kind (sparse and dense alike; ASSIGN, ADVANCE_CLOCK, STATS and
    // SCAN are not observed, nor requests refused before anything is sent).
    // `staleness`: for each successful request that pulled, how many clocks
    // this worker was ahead of the slowest live worker as the servers answered
    // (ResponseHeader.min_clock; 0 when it is the slowest).
    struct Instruments {
      metrics::Histogram* push_seconds = nullptr;
      metrics::Histogram* pull_seconds = nullptr;
      metrics::Histogram* push_pull_seconds = nullptr;
      metrics::Histogram* staleness = nullptr;
    };
    Instruments instruments;

    // The job's CURVE key pair (common/curve_keys.h LoadCurveKeys of
    // config.security.curve); nullopt: plaintext. With keys every
    // connection to a server is a CURVE client presenting the job pair and
    // expecting the job public key as the server's. A server that refuses
    // the keys never answers: requests end with DEADLINE_EXCEEDED.
    std::optional<CurveKeys> curve;

    // Time for request deadlines (request_timeout_ms), retry backoffs,
    // lease-refusal retries and failover waits (failover_timeout_ms), so
    // tests can drive them (common/clock.h FakeClock). Not owned; must
    // outlive the client; nullptr means Clock::Real(). The I/O thread
    // looks at it at least every 20 ms, so a FakeClock's Advance takes
    // effect within that. Latency metrics (instruments) use real time.
    Clock* clock = Clock::Real();
  };

  // `view` must be RUNNING. INVALID_ARGUMENT otherwise.
  static absl::StatusOr<std::unique_ptr<KVClient>> Create(
      Options options, const ClusterView& view);
  // Fails pending requests with CANCELLED and joins the I/O thread.
  ~KVClient();
  KVClient(const KVClient&) = delete;
  KVClient& operator=(const KVClient&) = delete;

  // Routes later requests by `view` (ignored unless newer). Thread-safe.
  void UpdateView(const ClusterView& view);
  // The consistency mode of the newest view routed by (it may change at run
  // time: SetConsistency). Thread-safe.
  ConsistencyMode consistency_mode() const;

  // Ends this client's traffic for good: every request still in flight
  // (sent, waiting to be retried, waiting for a server to take over its
  // slots) completes at once with `why`, and so does every later request,
  // before anything is sent (its callback then runs on the caller's
  // thread). A push in flight may or may not have been applied. Used when
  // the scheduler dropped this worker: nothing it sends may count any
  // more. The first call's `why` sticks; an OK `why` reads as CANCELLED.
  // Thread-safe; may be called from a completion callback.
  void Abort(absl::Status why);

  // Retries: a server's answer that it applied nothing (UNAVAILABLE, e.g.
  // no view yet or a backup busy; wrong_owner: the slot moved) is retried
  // with a backoff, routed again by key. A server that refuses because its
  // lease lapsed or it was dropped (ResponseHeader.refusal, server/server.h
  // "Fencing") is retried every 20 ms to 200 ms, routed by the newest view
  // each time, for at most the larger of the request and failover timeouts
  // from its first refusal; such a refusal recorded nothing, so a push
  // retried this way is applied exactly once.
  //
  // Sparse tables. `grads` holds keys.size() * dim floats, `out` room for
  // as many. Errors: INVALID_ARGUMENT (unknown or dense table, wrong
  // sizes), the server's error, DEADLINE_EXCEEDED, UNAVAILABLE (no live
  // server owns a slot), Abort()'s status.
  Completion Push(uint32_t table, absl::Span<const uint64_t> keys,
                  absl::Span<const float> grads, DoneCallback done = nullptr);
  Completion Pull(uint32_t table, absl::Span<const uint64_t> keys, float* out,
                  DoneCallback done = nullptr);
  Completion PushPull(uint32_t table, absl::Span<const uint64_t> keys,
                      absl::Span<const float> grads, float* out,
                      DoneCallback done = nullptr);
  // Tells the servers that `keys` will be pulled or pushed soon (the next
  // batch's): a server keeping the table's cold rows on disk starts reading
  // them into RAM, so that pull or push does not wait for the disk. Changes
  // no value; completes once every server answered (before its reads
  // finish). Untiered tables: a no-op on the servers. The keys are copied
  // before the call returns. Errors as for Pull; they are harmless to
  // ignore (the request then simply reads from disk).
  Completion Prefetch(uint32_t table, absl::Span<const uint64_t> keys,
                      DoneCallback done = nullptr);

  // Dense tables: elements [begin, begin + count).
  Completion PushDense(uint32_t table, uint64_t begin,
                       absl::Span<const float> grads,
                       DoneCallback done = nullptr);
  // Overwrites elements [begin, begin + values.size()) with `values` (op
  // ASSIGN: the optimizer state is kept). For writing initial values.
  Completion AssignDense(uint32_t table, uint64_t begin,
                         absl::Span<const float> values,
                         DoneCallback done = nullptr);
  Completion PullDense(uint32_t table, uint64_t begin, uint64_t count,
                       float* out, DoneCallback done = nullptr);

  // Zero-copy forms for large tensors (as ps-lite's ZPush and ZPull).
  // PushDense sends each server's values straight from `grads` when they
  // are one contiguous piece of it and the job sends float32 values
  // (otherwise they are copied as above); the client holds a reference to
  // `grads` until ZeroMQ is done with every frame that points into it,
  // retries included, so the caller must not modify the vector through
  // another pointer meanwhile. PullDense into `out` (which must stay valid
  // until the request completes) keeps the answer's frame instead of copying
  // it when one server holds the whole range. Errors as above; a null
  // `grads` or `out` is INVALID_ARGUMENT. A non-finite value is
  // INVALID_ARGUMENT with nothing applied in every case, but when one server
  // receives the whole push the client leaves the check to that server (one
  // pass over the tensor fewer), so the push is sent and the error comes
  // from the server, naming the element.
  Completion PushDense(uint32_t table, uint64_t begin,
                       std::shared_ptr<const std::vector<float>> grads,
                       DoneCallback done = nullptr);
  Completion PullDense(uint32_t table, uint64_t begin, uint64_t count,
                       DenseValues* out, DoneCallback done = nullptr);

  // The worker's clock: steps completed. Every request carries it; a pull
  // is answered under BSP/SSP when the servers' state allows that clock.
  uint64_t clock() const { return clock_.load(); }
  // The checkpoint in progress in the newest view applied (UpdateView):
  // ClusterView.checkpoint_clock, 0 for none.
  uint64_t checkpoint_clock() const { return checkpoint_clock_.load(); }

  // Ends the current step: the clock goes up by one and every live server
  // is told, after the pushes this thread issued before (requests to a
  // server keep their order). Call it once per step, in every mode.
  Completion AdvanceClock(DoneCallback done = nullptr);
  // Sets the clock to `clock` (not below the current one) and tells every
  // live server, like AdvanceClock. kFinishedClock marks the end of
  // training.
  Completion AdvanceClockTo(uint64_t clock, DoneCallback done = nullptr);
  // A worker that had finished (clock kFinishedClock) resumes training at
  // `clock` (ClaimShardResponse.start_clock), e.g. to take over an
  // orphaned shard: sets the clock (it may go down from kFinishedClock)
  // and tells every live server (ADVANCE_CLOCK with restart).
  Completion RestartClock(uint64_t clock, DoneCallback done = nullptr);

  // Asks every live server for the statistics of all its tables (op
  // STATS). On success *out holds one entry per (server, table), ordered
  // by server rank, then table id; `out` must stay valid until the request
  // completes and is written only by the I/O thread.
  Completion TableStatistics(std::vector<ServerTableStats>* out,
                             DoneCallback done = nullptr);

  // Exports sparse table `table`: reads every row every live server holds
  // (op SCAN, page by page; servers in parallel, each one's pages in
  // sequence) and appends the keys to *keys and their weights to *values
  // (dim floats per key, row-major, optimizer state excluded). Existing
  // contents are kept. Rows come in no particular order.
  //
  // Each key appears once provided no row is created or dropped (pushes of
  // new keys, TTL, eviction) on the servers while the scan runs: call it
  // after training. With replication, servers leave out their backup
  // copies. Servers answer under the consistency rule of a pull at this
  // client's clock(), so after AdvanceClockTo(kFinishedClock)
  // under BSP the scan waits until every live worker finished and every
  // step is applied.
  //
  // `keys` and `values` must stay valid until the request completes and
  // are written only by the I/O thread; do not read them before. Errors:
  // INVALID_ARGUMENT (unknown or dense table, null output), UNAVAILABLE (no
  // live server, or a server was replaced during the scan),
  // DEADLINE_EXCEEDED (a page was not answered within the request
  // timeout), DATA_LOSS (malformed page), the server's error. On error the
  // rows of the pages received so far may have been appended; keys and
  // values stay paired (values->size() == keys->size() * dim).
  Completion Scan(uint32_t table, std::vector<uint64_t>* keys,
                  std::vector<float>* values, DoneCallback done = nullptr);
  // Scan() and Wait(): blocks until the whole table is read.
  absl::Status ScanAll(uint32_t table, std::vector<uint64_t>* keys,
                       std::vector<float>* values);

  struct Stats {
    uint64_t requests = 0;    // user calls
    uint64_t messages = 0;    // per-server messages sent
    uint64_t bytes_sent = 0;  // header + keys + values
    uint64_t bytes_received = 0;
  };
  Stats stats() const;

 private:
  struct TableInfo {
    bool sparse = true;
    uint32_t dim = 1;
    uint64_t size = 0;
    uint64_t block_size = 1;
  };
  using Routing = kv_internal::Routing;
  using Part = kv_internal::Part;
  using ScanChain = kv_internal::ScanChain;
  using IoLoop = kv_internal::IoLoop;

  KVClient(Options options, std::shared_ptr<const Routing> routing);
  static std::shared_ptr<const Routing> MakeRouting(const ClusterView& view);
  std::shared_ptr<const Routing> routing() const;

  Completion Sparse(int op, uint32_t table, absl::Span<const uint64_t> keys,
                    absl::Span<const float> grads, float* out,
                    DoneCallback done);
  // `shared` (optional) owns `grads` for zero-copy frames; `pulled`
  // (optional, PULL only) receives the answer instead of `out`.
  Completion Dense(int op, uint32_t table, uint64_t begin, uint64_t count,
                   absl::Span<const float> grads, float* out, DoneCallback done,
                   std::shared_ptr<const std::vector<float>> shared = nullptr,
                   DenseValues* pulled = nullptr);
  Completion Failed(absl::Status status, DoneCallback done);
  // Sets what `state` (of a request with op `op`) observes on completion
  // (Options::instruments).
  void Instrument(int op, Completion::State* state) const;
  // Fills what config.data_plane asks of a request with op `op` (a proto
  // Op): value encodings, and for a sparse request's `keys` its key-list
  // slot and digest.
  void SetWireOptions(int op, absl::Span<const uint64_t> keys,
                      RequestHeader* h) const;
  // A message to `server` belonging to `state`, with the fields every
  // request header carries filled in `header`.
  std::unique_ptr<Part> NewPart(uint32_t server, int op, uint32_t table,
                                const Routing& routing,
                                const std::shared_ptr<Completion::State>& state,
                                RequestHeader* header);
  void Submit(std::vector<std::unique_ptr<Part>> parts);
  // ADVANCE_CLOCK to every live server.
  Completion SendClock(uint64_t clock, bool restart, DoneCallback done);

  const Options options_;
  const absl::Duration request_timeout_;
  // From options_.config.data_plane (set once in the constructor).
  bool key_caching_ = false;
  ValueEncoding push_values_ = FLOAT32;
  ValueEncoding pull_values_ = FLOAT32;
  // data_plane.gradients.nonfinite CLIP: non-finite gradients are sent for
  // the servers to clip instead of being refused here.
  bool servers_clip_nonfinite_ = false;
  // data_plane.limits, with defaults: what servers accept per message.
  DataPlaneLimits limits_;
  // RESOURCE_EXHAUSTED, before anything is sent, for a request part that a
  // server would refuse for its size.
  absl::Status CheckPartLimits(uint64_t keys, uint64_t bytes) const;
  absl::flat_hash_map<uint32_t, TableInfo> tables_;
  std::atomic<uint64_t> next_request_id_{1};
  // Sequence numbers of state-changing messages (RequestHeader.seq).
  std::atomic<uint64_t> next_seq_{1};
  std::atomic<uint64_t> clock_{0};
  std::atomic<uint64_t> checkpoint_clock_{0};
  std::atomic<uint64_t> requests_{0};

  // Abort(): set once; abort_status_ is read only after aborted_.
  std::atomic<bool> aborted_{false};
  mutable absl::Mutex abort_mu_;
  absl::Status abort_status_ ABSL_GUARDED_BY(abort_mu_);

  mutable absl::Mutex routing_mu_;
  std::shared_ptr<const Routing> routing_ ABSL_GUARDED_BY(routing_mu_);

  std::unique_ptr<IoLoop> io_;
};

}  // namespace ps

#endif  // PS_WORKER_KV_CLIENT_H_
