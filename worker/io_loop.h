// Internal to //worker:kv_client: the request state KVClient builds and the
// I/O thread that sends it. Nothing outside worker/kv_client*.cc and
// worker/io_loop.cc includes this header (it is a private header of the
// kv_client target, and it brings in ZeroMQ, which kv_client.h does not).
//
// Threading: KVClient builds Parts on caller threads and hands them to
// IoLoop::Enqueue; from then on only the I/O thread touches them (sockets,
// pending parts, retries, the key-list memo). A Completion::State is shared
// between both sides under its own mutex.
#ifndef PS_WORKER_IO_LOOP_H_
#define PS_WORKER_IO_LOOP_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/curve_keys.h"
#include "common/metrics.h"
#include "common/protocol.h"
#include "common/status.h"
#include "common/wire.h"
#include "proto/config.pb.h"
#include "proto/data_plane.pb.h"
#include "worker/kv_client.h"
#include "zmq.hpp"

namespace ps {

// ------------------------------------------------------------ Completion

struct Completion::State {
  explicit State(int parts, DoneCallback cb)
      : remaining(parts), done(std::move(cb)) {}

  void PartDone(const absl::Status& s) {
    absl::Status final_status;
    bool finished;
    {
      absl::MutexLock lock(&mu);
      if (!s.ok() && status.ok()) status = s;
      // Observed before the request counts as complete, so whoever Wait()
      // released sees it in the metrics. Atomics only: fine under the lock.
      if (remaining == 1) Observe(status, min_clock);
      finished = --remaining == 0;
      final_status = status;
    }
    if (finished && done) done(final_status);
  }

  // KVClient::Options::instruments, once the request completed.
  void Observe(const absl::Status& s, uint64_t slowest) const {
    if (latency != nullptr) {
      latency->Observe(std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - start)
                           .count());
    }
    if (staleness != nullptr && s.ok() && slowest != UINT64_MAX &&
        clock < kFinishedClock) {
      staleness->Observe(
          static_cast<double>(clock > slowest ? clock - slowest : 0));
    }
  }

  // A part was split in two or more (rerouted after a failover).
  void AddParts(int n) {
    absl::MutexLock lock(&mu);
    remaining += n;
  }

  void RecordClocks(uint64_t min_c, uint64_t applied) {
    absl::MutexLock lock(&mu);
    min_clock = std::min(min_clock, min_c);
    applied_clock = std::min(applied_clock, applied);
  }

  // STATS: appends server `server`'s table statistics; the last part to
  // answer sorts them by (server rank, table id).
  void RecordTableStats(uint32_t server, const ResponseHeader& h);

  absl::Mutex mu;
  int remaining ABSL_GUARDED_BY(mu);
  // STATS requests: where the answers go.
  std::vector<ServerTableStats>* table_stats ABSL_GUARDED_BY(mu) = nullptr;
  absl::Status status ABSL_GUARDED_BY(mu);
  uint64_t min_clock ABSL_GUARDED_BY(mu) = UINT64_MAX;
  uint64_t applied_clock ABSL_GUARDED_BY(mu) = UINT64_MAX;
  const DoneCallback done;
  // Set before the request is submitted (KVClient::Instrument); null: not
  // observed. `clock`: the sender's clock in the request.
  metrics::Histogram* latency = nullptr;
  metrics::Histogram* staleness = nullptr;
  uint64_t clock = 0;
  std::chrono::steady_clock::time_point start;
};

namespace kv_internal {

// A cluster view compiled for routing. Immutable once built; shared.
struct Routing {
  uint64_t epoch = 0;
  std::vector<uint32_t> slot_owner;
  // One more than the largest rank in slot_owner: the ranks requests are
  // split over.
  uint32_t num_servers = 0;
  // The rank that owns every slot (a one-server job), or -1: its
  // requests need no per-key routing.
  int64_t sole_owner = -1;
  std::vector<std::string> endpoints;  // by server rank; "" = not live
  ConsistencyMode mode = ASYNC;
};

struct ScanChain;

// One message to one server: part of a user request.
struct Part {
  uint64_t request_id = 0;
  uint32_t server = 0;
  std::shared_ptr<Completion::State> parent;
  zmq::message_t header, keys, values;
  bool has_values = false;
  // Float32 values sent unchecked for finiteness: a zero-copy push that one
  // server receives whole leaves the check to that server (Dense). Split
  // checks them before they go to several servers.
  bool values_unchecked = false;
  // Send the keys frame even if the server should hold the key list (it
  // said it does not).
  bool send_keys = false;
  // Where a pull's answer goes: out + positions[i] * dim for sparse key i
  // (identity when positions is empty), or (offset, length) runs for dense.
  float* out = nullptr;
  // A dense pull answered into a DenseValues (the whole range, one server):
  // the answer's frame is kept instead of copied into `out`.
  DenseValues* pulled = nullptr;
  uint32_t dim = 1;
  std::vector<uint32_t> positions;
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  uint64_t expected_values = 0;
  absl::Time deadline;
  // Retries of answers that say the request was not applied (UNAVAILABLE).
  int attempts = 0;
  absl::Time retry_at;
  // Refusals by a server whose lease lapsed or that was dropped
  // (ResponseHeader.refusal), and until when they are retried
  // (InfinitePast: none yet).
  int refusals = 0;
  absl::Time refused_until = absl::InfinitePast();
  // A transmission of this part (or of the part it was split from) went
  // unanswered to a server that went away, or was answered UNAVAILABLE
  // without saying that nothing was applied: it may have been applied
  // there (and forwarded to a backup), so its sequence number is kept for
  // good. While false, every answer said "not applied" (wrong_owner, a
  // refusal, ResponseHeader.not_applied), and a part routed again is split
  // with fresh sequence numbers (see IoLoop::Split).
  bool fate_unknown = false;
  // Keyed requests (PUSH, PULL, PUSH_PULL, ASSIGN) can be routed again when
  // their server dies or no longer owns their slots: `h` is the header
  // (frame `header` serialized), `block_size` routes dense segments.
  bool reroutable = false;
  RequestHeader h;
  uint64_t block_size = 1;
  // While no live server owns one of its slots, the part waits (parked)
  // until this time for a view with a new owner, then fails UNAVAILABLE.
  absl::Time failover_deadline = absl::InfinitePast();
  // SCAN pages: the server's page sequence this page belongs to.
  std::shared_ptr<ScanChain> scan;
};

// One server's sequence of SCAN pages. Used only by the I/O thread once
// the first page is submitted: each answer appends its rows and sends the
// request for the next page, until the server answers next_cursor 0.
struct ScanChain {
  uint32_t dim = 1;
  std::vector<uint64_t>* keys = nullptr;
  std::vector<float>* values = nullptr;
  // The server's endpoint when the scan started: cursors mean nothing to a
  // server that replaced it at the same rank.
  std::string endpoint;
  uint64_t cursor = 0;
  // Builds the request for the page at `cursor` (same server, table and
  // Completion).
  std::function<std::unique_ptr<Part>(uint64_t cursor)> page;
};

// Names the key-list slot of a sparse request's keys (RequestHeader
// key_list_slot and key_list_digest).
void SetKeyList(absl::Span<const uint64_t> keys, RequestHeader* h);

// The error for pushed values that are not all finite; `outcome` says what
// became of the request ("nothing was sent", "nothing was applied").
absl::Status NonFiniteError(Op op, uint32_t table, absl::string_view outcome);

// The client's I/O thread: one DEALER socket per live server, the parts in
// flight, retries, failover re-routing and deadlines. Public methods are
// thread-safe; everything else runs on the thread the constructor starts.
class IoLoop {
 public:
  struct Options {
    absl::Duration request_timeout;
    // How long a part waits for a live owner of its slots.
    absl::Duration failover_timeout;
    // Budget of the key lists this client keeps on each server
    // (data_plane.key_cache_bytes; 0: none).
    int64_t key_cache_bytes = 0;
    // The job key pair (nullopt: plaintext).
    std::optional<CurveKeys> curve;
    // Deadlines, retry backoffs and failover waits are measured on it; not
    // owned, never null.
    Clock* clock = Clock::Real();
  };
  // Starts the I/O thread, routing by `routing`. `next_request_id` (not
  // owned, shared with the request builders) numbers re-split parts;
  // `next_seq` (not owned; null: sequence numbers are always kept) gives
  // fresh sequence numbers to the pieces of a re-split push whose every
  // transmission was answered "not applied".
  IoLoop(std::shared_ptr<const Routing> routing, Options options,
         std::atomic<uint64_t>* next_request_id,
         std::atomic<uint64_t>* next_seq = nullptr);
  // Fails every part still held with CANCELLED and joins the thread.
  ~IoLoop();
  IoLoop(const IoLoop&) = delete;
  IoLoop& operator=(const IoLoop&) = delete;

  // Hands `parts` to the I/O thread; after Abort they complete at once
  // with its status, on the calling thread.
  void Enqueue(std::vector<std::unique_ptr<Part>> parts);
  // Fails every part in flight with `why` (on the I/O thread, at once) and
  // every part enqueued later (in Enqueue). The first call's status sticks.
  void Abort(absl::Status why);
  // Routes by `routing` from now on (the caller checks it is newer).
  void SetRouting(std::shared_ptr<const Routing> routing);
  // Messages and bytes; `requests` is left 0.
  KVClient::Stats stats() const;

 private:
  // What this client believes each server holds in its key-list slots
  // (RequestHeader.key_list_slot): the digest and key count per slot, the
  // bytes they take (by the same rule as the server's KeyListCache), and
  // which slot each digest is in. The client picks the slots, least
  // recently used first, so the server needs no policy of its own.
  struct KeyMemo {
    std::array<uint64_t, kKeyListSlots> digest{};
    std::array<uint64_t, kKeyListSlots> count{};
    std::array<uint64_t, kKeyListSlots> last_use{};
    absl::flat_hash_map<uint64_t, uint32_t> slot_of;  // digest -> slot
    uint64_t uses = 0;
    int64_t bytes = 0;
    void Forget(uint32_t slot);
    uint32_t LeastRecentlyUsed() const;
  };

  void Wake();
  void Run();
  // Completes every part this thread holds with `status`.
  void FailAll(const absl::Status& status);
  void OnMonitorEvent(uint32_t r);
  void ApplyRouting(const std::shared_ptr<const Routing>& routing);
  void Route(std::unique_ptr<Part> part);
  absl::Status Split(std::unique_ptr<Part> part,
                     std::vector<std::unique_ptr<Part>>* pieces);
  void TakeOverPendingFor(uint32_t server, const absl::Status& status);
  void Send(std::unique_ptr<Part> part);
  bool KeysNeeded(Part& part);
  void OnResponse(uint32_t server, std::vector<zmq::message_t>& frames);
  void OnScanPage(std::unique_ptr<Part> part, const DecodedResponse& response);
  static void KeepFrame(DenseValues* out, DecodedResponse& response,
                        std::vector<zmq::message_t>& frames);
  static void Scatter(const Part& part, absl::Span<const float> values);
  void ResendDue();
  void ExpireDeadlines();

  const Options options_;
  const int event_fd_;
  uint64_t monitor_serial_ = 0;
  std::vector<KeyMemo> key_memos_;  // by server rank
  std::atomic<uint64_t>* const next_request_id_;
  std::atomic<uint64_t>* const next_seq_;
  absl::Mutex mu_;
  std::deque<std::unique_ptr<Part>> queue_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Routing> new_routing_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> abort_ ABSL_GUARDED_BY(mu_);

  // Owned by the I/O thread.
  zmq::context_t context_{1};
  std::shared_ptr<const Routing> routing_;
  std::vector<std::unique_ptr<zmq::socket_t>> dealers_;
  std::vector<std::string> endpoints_;
  // By server rank: the PAIR end of its dealer's socket monitor, and why
  // the server last refused this client's handshake ("" while none did).
  std::vector<std::unique_ptr<zmq::socket_t>> monitors_;
  std::vector<std::string> refusals_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Part>> pending_;
  std::vector<std::unique_ptr<Part>> retries_;
  // Keyed parts waiting for a live owner of their slots, and parts taken
  // from a replaced server until the new routing is applied.
  std::vector<std::unique_ptr<Part>> parked_;
  std::vector<std::unique_ptr<Part>> moved_;

  std::atomic<uint64_t> messages_{0}, bytes_sent_{0}, bytes_received_{0};
  std::thread thread_;
};

}  // namespace kv_internal
}  // namespace ps

#endif  // PS_WORKER_IO_LOOP_H_
