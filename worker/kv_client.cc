#include "worker/kv_client.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/protocol.h"
#include "common/value_codec.h"
#include "common/wire.h"
#include "proto/data_plane.pb.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace ps {
namespace {


std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger =
      new std::shared_ptr<spdlog::logger>(GetLogger("kv_client"));
  return *logger;
}

constexpr std::chrono::milliseconds kPollPeriod{20};

}  // namespace

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
      latency->Observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (staleness != nullptr && s.ok() && slowest != UINT64_MAX &&
        clock < kFinishedClock) {
      staleness->Observe(static_cast<double>(clock > slowest ? clock - slowest : 0));
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

  void RecordTableStats(uint32_t server, const ResponseHeader& h) {
    absl::MutexLock lock(&mu);
    if (table_stats == nullptr) return;
    for (const TableStats& t : h.table_stats()) {
      table_stats->push_back({server, t});
    }
    if (remaining == 1) {
      std::sort(table_stats->begin(), table_stats->end(),
                [](const ServerTableStats& a, const ServerTableStats& b) {
                  return a.server_rank != b.server_rank
                             ? a.server_rank < b.server_rank
                             : a.stats.table_id() < b.stats.table_id();
                });
    }
  }

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

uint64_t Completion::min_clock() const {
  absl::MutexLock lock(&state_->mu);
  return state_->remaining == 0 && state_->min_clock != UINT64_MAX ? state_->min_clock : 0;
}

uint64_t Completion::applied_clock() const {
  absl::MutexLock lock(&state_->mu);
  return state_->remaining == 0 && state_->applied_clock != UINT64_MAX
             ? state_->applied_clock
             : 0;
}

absl::Status Completion::Wait() const {
  State* s = state_.get();
  absl::MutexLock lock(&s->mu);
  s->mu.Await(absl::Condition(
      +[](State* st)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(st->mu) { return st->remaining == 0; },
      s));
  return s->status;
}

bool Completion::WaitFor(absl::Duration timeout, absl::Status* status) const {
  State* s = state_.get();
  absl::MutexLock lock(&s->mu);
  const bool finished = s->mu.AwaitWithTimeout(
      absl::Condition(
          +[](State* st)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(st->mu) { return st->remaining == 0; },
          s),
      timeout);
  if (finished && status != nullptr) *status = s->status;
  return finished;
}

Completion Completion::Failed(absl::Status status) {
  auto state = std::make_shared<State>(1, nullptr);
  state->PartDone(status);
  return Completion(std::move(state));
}

bool Completion::done() const {
  absl::MutexLock lock(&state_->mu);
  return state_->remaining == 0;
}

// ------------------------------------------------------------------ Part

// One message to one server: part of a user request.
struct KVClient::Part {
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
struct KVClient::ScanChain {
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

namespace {

// Names the key-list slot of a sparse request's keys (RequestHeader
// key_list_slot and key_list_digest).
void SetKeyList(absl::Span<const uint64_t> keys, RequestHeader* h) {
  const uint64_t digest = KeyListDigest(keys);
  h->set_key_list_digest(digest);
  h->set_key_list_slot(KeyListSlotOf(digest));
}

// The error for pushed values that are not all finite; `outcome` says what
// became of the request ("nothing was sent", "nothing was applied").
absl::Status NonFiniteError(Op op, uint32_t table, absl::string_view outcome) {
  return absl::InvalidArgumentError(absl::StrCat(
      Op_Name(op), " to table ", table,
      " carries a value that is not finite (NaN or infinity); ", outcome));
}

}  // namespace

// ---------------------------------------------------------------- IoLoop

class KVClient::IoLoop {
 public:
  IoLoop(std::shared_ptr<const Routing> routing, absl::Duration request_timeout,
         absl::Duration failover_timeout, std::atomic<uint64_t>* next_request_id,
         int64_t key_cache_bytes, std::optional<CurveKeys> curve)
      : curve_(std::move(curve)),
        event_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
        key_cache_bytes_(key_cache_bytes),
        request_timeout_(request_timeout),
        failover_timeout_(failover_timeout),
        next_request_id_(next_request_id),
        routing_(std::move(routing)) {
    thread_ = std::thread([this] { Run(); });
  }

  ~IoLoop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    Wake();
    thread_.join();
    close(event_fd_);
  }

  void Enqueue(std::vector<std::unique_ptr<Part>> parts) {
    absl::Status aborted;
    {
      absl::MutexLock lock(&mu_);
      if (abort_.has_value()) {
        aborted = *abort_;
      } else {
        for (auto& p : parts) queue_.push_back(std::move(p));
      }
    }
    if (!aborted.ok()) {
      // Outside the lock: completion callbacks may issue requests.
      for (auto& p : parts) p->parent->PartDone(aborted);
      return;
    }
    Wake();
  }

  // Fails every part in flight with `why` (on the I/O thread, at once) and
  // every part enqueued later (in Enqueue). The first call's status sticks.
  void Abort(absl::Status why) {
    {
      absl::MutexLock lock(&mu_);
      if (abort_.has_value()) return;
      abort_ = std::move(why);
    }
    Wake();
  }

  void SetRouting(std::shared_ptr<const Routing> routing) {
    {
      absl::MutexLock lock(&mu_);
      new_routing_ = std::move(routing);
    }
    Wake();
  }

  Stats stats() const {
    Stats s;
    s.messages = messages_.load();
    s.bytes_sent = bytes_sent_.load();
    s.bytes_received = bytes_received_.load();
    return s;
  }

 private:
  void Wake() {
    const uint64_t one = 1;
    // A full counter (never in practice) still leaves the fd readable.
    (void)!write(event_fd_, &one, sizeof(one));
  }

  void Run() {
    ApplyRouting(routing_);
    std::vector<zmq::pollitem_t> items;
    std::vector<zmq::message_t> frames;
    while (true) {
      std::deque<std::unique_ptr<Part>> incoming;
      std::shared_ptr<const Routing> routing;
      bool stop;
      std::optional<absl::Status> abort;
      {
        absl::MutexLock lock(&mu_);
        incoming.swap(queue_);
        routing.swap(new_routing_);
        stop = stop_;
        abort = abort_;
      }
      if (stop) break;
      if (abort.has_value()) {
        for (auto& part : incoming) part->parent->PartDone(*abort);
        incoming.clear();
        FailAll(*abort);
      }
      if (routing != nullptr) ApplyRouting(routing);
      for (auto& part : incoming) Send(std::move(part));

      items.clear();
      items.push_back({nullptr, event_fd_, ZMQ_POLLIN, 0});
      for (auto& d : dealers_) {
        items.push_back({d ? d->handle() : nullptr, d ? 0 : -1,
                         static_cast<short>(d ? ZMQ_POLLIN : 0), 0});
      }
      const size_t first_monitor = items.size();
      for (auto& m : monitors_) {
        items.push_back({m ? m->handle() : nullptr, m ? 0 : -1,
                         static_cast<short>(m ? ZMQ_POLLIN : 0), 0});
      }
      try {
        zmq::poll(items.data(), items.size(),
                  retries_.empty() ? kPollPeriod : std::chrono::milliseconds(2));

      } catch (const zmq::error_t& e) {
        Log()->warn("poll: {}", e.what());
      }
      if (items[0].revents & ZMQ_POLLIN) {
        uint64_t count;
        (void)!read(event_fd_, &count, sizeof(count));
      }
      for (size_t i = first_monitor; i < items.size(); ++i) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        try {
          OnMonitorEvent(static_cast<uint32_t>(i - first_monitor));
        } catch (const zmq::error_t& e) {
          Log()->warn("monitor of server {}: {}", i - first_monitor, e.what());
        }
      }
      for (size_t i = 1; i < first_monitor; ++i) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        while (true) {
          frames.clear();
          std::optional<size_t> n;
          try {
            n = zmq::recv_multipart(*dealers_[i - 1],
                                    std::back_inserter(frames),
                                    zmq::recv_flags::dontwait);
          } catch (const zmq::error_t& e) {
            Log()->warn("receive from server {}: {}", i - 1, e.what());
            break;
          }
          if (!n) break;
          OnResponse(static_cast<uint32_t>(i - 1), frames);
        }
      }
      ExpireDeadlines();
      ResendDue();
    }
    FailAll(absl::CancelledError("client shut down"));
    monitors_.clear();
    dealers_.clear();
  }

  // Completes every part this thread holds with `status`.
  void FailAll(const absl::Status& status) {
    for (auto& [id, part] : pending_) part->parent->PartDone(status);
    for (auto& part : parked_) part->parent->PartDone(status);
    for (auto& part : retries_) part->parent->PartDone(status);
    for (auto& part : moved_) part->parent->PartDone(status);
    pending_.clear();
    parked_.clear();
    retries_.clear();
    moved_.clear();
  }

  // The server at rank r refused this client's handshake (a CURVE key
  // other than the job's, no CURVE where the server needs it, or the
  // reverse): nothing sent to it can be answered, so its pending requests
  // fail now with UNAUTHENTICATED instead of at their deadline.
  void OnMonitorEvent(uint32_t r) {
    std::vector<zmq::message_t> frames;
    while (zmq::recv_multipart(*monitors_[r], std::back_inserter(frames),
                               zmq::recv_flags::dontwait)) {
      if (frames.size() < 2 || frames[0].size() < 6) {
        frames.clear();
        continue;
      }
      uint16_t event = 0;
      uint32_t value = 0;
      std::memcpy(&event, frames[0].data(), sizeof(event));
      std::memcpy(&value, static_cast<const char*>(frames[0].data()) + 2, sizeof(value));
      frames.clear();
      if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        refusals_[r].clear();
        continue;
      }
      std::string why;
      if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
        // Also a server restarting; only a hint for a later timeout, and
        // never over a precise reason.
        if (refusals_[r].empty()) {
          refusals_[r] = absl::StrCat("its handshakes fail (errno ", value,
                                      "): CURVE on one side only, or other keys?");
        }
        continue;
      }
      if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
        why = absl::StrCat("the server refused this client's credentials (ZAP status ", value,
                           value == 300 ? ": temporarily, e.g. max_connections" : "", ")");
      } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
        why = value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                  ? std::string("security mechanism mismatch (CURVE on one side only: check "
                                "security.curve in both configs)")
                  : absl::StrCat("handshake protocol error 0x", absl::Hex(value),
                                 " (a CURVE key other than the job's?)");
      } else {
        continue;
      }
      if (refusals_[r] != why) {
        Log()->error("server {} at {}: {}", r, endpoints_[r], why);
      }
      refusals_[r] = why;
      if (value == 300) continue;  // ZeroMQ reconnects; requests wait
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second->server != r) {
          ++it;
          continue;
        }
        it->second->parent->PartDone(absl::UnauthenticatedError(
            absl::StrCat("server ", r, " at ", endpoints_[r], ": ", why)));
        pending_.erase(it++);
      }
    }
  }

  void ApplyRouting(const std::shared_ptr<const Routing>& routing) {
    routing_ = routing;
    const size_t n = routing->endpoints.size();
    if (dealers_.size() < n) {
      dealers_.resize(n);
      endpoints_.resize(n);
      monitors_.resize(n);
      refusals_.resize(n);
    }
    for (size_t r = 0; r < dealers_.size(); ++r) {
      const std::string want = r < n ? routing->endpoints[r] : "";
      if (want == endpoints_[r]) continue;
      // The server at this rank changed: its answers to requests already
      // sent can no longer arrive. Keyed requests are routed again by the
      // new view (servers drop duplicates by sequence number, so a push the
      // old server applied is not applied twice where it was replicated);
      // others fail.
      TakeOverPendingFor(static_cast<uint32_t>(r),
                         absl::UnavailableError(absl::StrCat(
                             "server ", r, " changed from ", endpoints_[r], " to ",
                             want.empty() ? "(none)" : want)));
      monitors_[r].reset();
      refusals_[r].clear();
      dealers_[r].reset();
      endpoints_[r] = want;
      // A new server holds none of this client's key lists.
      if (r < key_memos_.size()) key_memos_[r] = KeyMemo();
      if (want.empty()) continue;
      auto socket =
          std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
      socket->set(zmq::sockopt::linger, 0);
      socket->set(zmq::sockopt::sndhwm, 0);
      socket->set(zmq::sockopt::rcvhwm, 0);
      socket->set(zmq::sockopt::maxmsgsize, kMaxMessageBytes);
      if (curve_.has_value()) {
        if (absl::Status s = ApplyCurveClient(*socket, *curve_); !s.ok()) {
          Log()->error("server {} at {}: {}", r, want, s.message());
          continue;
        }
      }
      try {
        // Watched before connecting, so no refusal is missed.
        const std::string monitor =
            absl::StrCat("inproc://ps-kv-client-", reinterpret_cast<uintptr_t>(this), "-", r,
                         "-", ++monitor_serial_);
        if (zmq_socket_monitor(socket->handle(), monitor.c_str(),
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                   ZMQ_EVENT_HANDSHAKE_SUCCEEDED) == 0) {
          monitors_[r] = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::pair);
          monitors_[r]->set(zmq::sockopt::linger, 0);
          monitors_[r]->connect(monitor);
        }
        socket->connect(want);
      } catch (const zmq::error_t& e) {
        Log()->error("cannot connect to server {} at {}: {}", r, want,
                     e.what());
        continue;
      }
      dealers_[r] = std::move(socket);
    }
    // Parts waiting for a new owner, and those taken from replaced servers.
    std::vector<std::unique_ptr<Part>> again;
    again.swap(parked_);
    for (auto& part : moved_) again.push_back(std::move(part));
    moved_.clear();
    for (auto& part : again) Route(std::move(part));
  }

  // Sends a keyed part to the servers that own its slots now, splitting it
  // when they are several; parks it while a slot has no live owner.
  void Route(std::unique_ptr<Part> part) {
    const absl::Time now = absl::Now();
    std::vector<std::unique_ptr<Part>> pieces;
    const absl::Status split = Split(std::move(part), &pieces);
    if (!split.ok()) return;  // the part was completed with the error
    for (auto& piece : pieces) {
      const uint32_t r = piece->server;
      if (r >= dealers_.size() || dealers_[r] == nullptr) {
        if (piece->failover_deadline == absl::InfinitePast()) {
          piece->failover_deadline = now + failover_timeout_;
        }
        if (now >= piece->failover_deadline) {
          piece->parent->PartDone(absl::UnavailableError(absl::StrCat(
              "no live server owns the slots of request ", piece->request_id,
              " (server ", r, " is gone) after waiting ",
              absl::FormatDuration(failover_timeout_))));
          continue;
        }
        parked_.push_back(std::move(piece));
        continue;
      }
      piece->deadline = std::max(piece->deadline, now + request_timeout_);
      Send(std::move(piece));
    }
  }

  // Splits `part` by the current slot map into pieces, one per owning
  // server, each with a fresh request id and the same sequence number
  // (every server sees at most one piece of it). On a malformed part
  // completes it with an error and returns that error.
  absl::Status Split(std::unique_ptr<Part> part,
                     std::vector<std::unique_ptr<Part>>* pieces) {
    const Routing& routing = *routing_;
    const uint32_t num_slots = static_cast<uint32_t>(routing.slot_owner.size());
    RequestHeader& h = part->h;
    if (num_slots == 0) {
      pieces->push_back(std::move(part));
      return absl::OkStatus();
    }
    // owner of each key (sparse) or segment (dense)
    std::vector<uint32_t> owners;
    const bool dense = h.segments_size() > 0;
    if (dense) {
      for (const DenseSegment& seg : h.segments()) {
        owners.push_back(routing.slot_owner[DenseBlockSlot(
            h.table_id(), seg.begin() / part->block_size, num_slots)]);
      }
    } else {
      const size_t n = part->keys.size() / sizeof(uint64_t);
      const uint64_t* keys = part->keys.data<uint64_t>();
      owners.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        owners.push_back(
            routing.slot_owner[SparseSlot(h.table_id(), keys[i], num_slots)]);
      }
    }
    std::vector<uint32_t> distinct = owners;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    if (distinct.size() > 1 && part->values_unchecked &&
        !AllFinite(absl::MakeConstSpan(part->values.data<float>(),
                                       part->values.size() / sizeof(float)))) {
      // Several servers would each check only their share: one could apply
      // its share of a push another rejects.
      const absl::Status bad = NonFiniteError(h.op(), h.table_id(), "nothing was applied");
      part->parent->PartDone(bad);
      return bad;
    }
    auto finish = [&](Part* p, uint32_t server) {
      p->server = server;
      p->request_id = next_request_id_->fetch_add(1, std::memory_order_relaxed);
      p->h.set_request_id(p->request_id);
      p->h.set_epoch(routing.epoch);
      p->header = SerializeToFrame(p->h);
    };
    if (distinct.size() <= 1) {
      finish(part.get(), distinct.empty() ? part->server : distinct[0]);
      pieces->push_back(std::move(part));
      return absl::OkStatus();
    }
    part->parent->AddParts(static_cast<int>(distinct.size()) - 1);
    if (part->pulled != nullptr) {
      // A whole-range pull into a DenseValues now spans servers: its parts
      // are copied into the object's own array (runs are offsets into it).
      part->out = part->pulled->OwnArray(part->expected_values);
      part->pulled = nullptr;
    }
    const size_t dim = part->dim;
    for (uint32_t server : distinct) {
      auto p = std::make_unique<Part>();
      p->parent = part->parent;
      p->dim = part->dim;
      p->out = part->out;
      p->has_values = part->has_values;
      p->deadline = part->deadline;
      p->failover_deadline = part->failover_deadline;
      p->refusals = part->refusals;
      p->refused_until = part->refused_until;
      p->reroutable = true;
      p->block_size = part->block_size;
      p->h = h;
      // Values are moved as bytes: they may be half-width on the wire.
      const size_t width = EncodedValueBytes(h.push_values());
      std::vector<char> values;
      const char* src = part->has_values ? part->values.data<char>() : nullptr;
      if (dense) {
        p->h.clear_segments();
        uint64_t offset = 0;
        for (int i = 0; i < h.segments_size(); ++i) {
          const uint64_t len = h.segments(i).length();
          if (owners[i] == server) {
            *p->h.add_segments() = h.segments(i);
            if (src != nullptr) {
              values.insert(values.end(), src + offset * width, src + (offset + len) * width);
            }
            if (!part->runs.empty()) p->runs.push_back(part->runs[i]);
            if (part->expected_values > 0) p->expected_values += len;
          }
          offset += len;
        }
      } else {
        const uint64_t* keys = part->keys.data<uint64_t>();
        std::vector<uint64_t> k;
        for (size_t i = 0; i < owners.size(); ++i) {
          if (owners[i] != server) continue;
          k.push_back(keys[i]);
          if (src != nullptr) {
            values.insert(values.end(), src + i * dim * width, src + (i + 1) * dim * width);
          }
          if (part->expected_values > 0) {
            p->positions.push_back(part->positions.empty()
                                       ? static_cast<uint32_t>(i)
                                       : part->positions[i]);
            p->expected_values += dim;
          }
        }
        p->h.set_num_keys(k.size());
        if (h.key_list_slot() != 0) SetKeyList(k, &p->h);
        p->keys = FrameFromVector(std::move(k));
      }
      if (part->has_values) p->values = FrameFromVector(std::move(values));
      finish(p.get(), server);
      pieces->push_back(std::move(p));
    }
    return absl::OkStatus();
  }

  // Pending requests of a server that went away: keyed ones are routed
  // again once the new routing is in place; ADVANCE_CLOCK counts as done
  // (whoever serves the rank next learns the clock from later requests, see
  // the server's ProcessChecked); others fail.
  void TakeOverPendingFor(uint32_t server, const absl::Status& status) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second->server != server) {
        ++it;
        continue;
      }
      std::unique_ptr<Part> part = std::move(it->second);
      pending_.erase(it++);
      if (part->reroutable) {
        moved_.push_back(std::move(part));
      } else if (part->scan == nullptr && part->h.op() == ADVANCE_CLOCK) {
        part->parent->PartDone(absl::OkStatus());
      } else {
        part->parent->PartDone(status);
      }
    }
  }

  void Send(std::unique_ptr<Part> part) {
    const uint32_t r = part->server;
    if ((r >= dealers_.size() || dealers_[r] == nullptr) && part->reroutable &&
        part->failover_deadline == absl::InfinitePast()) {
      Route(std::move(part));
      return;
    }
    if (r >= dealers_.size() || dealers_[r] == nullptr) {
      // A clock report built with an older view for a server that is gone
      // has nobody to tell: a replacement learns the clock from later
      // requests.
      if (part->scan == nullptr && part->h.op() == ADVANCE_CLOCK) {
        part->parent->PartDone(absl::OkStatus());
        return;
      }
      part->parent->PartDone(
          absl::UnavailableError(absl::StrCat("no live server with rank ", r)));
      return;
    }
    if (part->scan != nullptr && endpoints_[r] != part->scan->endpoint) {
      part->parent->PartDone(absl::UnavailableError(absl::StrCat(
          "server ", r, " changed from ", part->scan->endpoint, " to ",
          endpoints_[r], " during the scan; scan again")));
      return;
    }
    const bool send_keys = KeysNeeded(*part);
    const uint64_t bytes = part->header.size() + (send_keys ? part->keys.size() : 0) +
                           part->values.size();
    try {
      // Sending consumes a frame; copies share the payload (reference
      // counted), and the originals stay for a retry.
      zmq::socket_t& s = *dealers_[r];
      zmq::message_t header, keys, values;
      header.copy(part->header);
      if (send_keys) keys.copy(part->keys);
      s.send(header, zmq::send_flags::sndmore);
      s.send(keys, part->has_values ? zmq::send_flags::sndmore
                                    : zmq::send_flags::none);
      if (part->has_values) {
        values.copy(part->values);
        s.send(values, zmq::send_flags::none);
      }
    } catch (const zmq::error_t& e) {
      part->parent->PartDone(absl::UnavailableError(
          absl::StrCat("send to server ", r, ": ", e.what())));
      return;
    }
    messages_.fetch_add(1, std::memory_order_relaxed);
    bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
    const uint64_t id = part->request_id;
    pending_[id] = std::move(part);
  }

  // Whether `part` must carry its keys frame (it always keeps it, for a
  // retry): not when it names a key-list slot that, as far as this client
  // knows, holds its list on its server. When it carries them under a
  // slot, the server stores them there, and so does the record here; a
  // list that would not fit in the budget is sent without a slot.
  bool KeysNeeded(Part& part) {
    if (part.h.key_list_slot() == 0 || part.h.num_keys() == 0) return true;
    const uint32_t r = part.server;
    if (key_memos_.size() <= r) key_memos_.resize(r + 1);
    KeyMemo& memo = key_memos_[r];
    const uint64_t digest = part.h.key_list_digest();
    const uint64_t n = part.h.num_keys();
    auto use_slot = [&](uint32_t slot) {
      memo.last_use[slot - 1] = ++memo.uses;
      if (part.h.key_list_slot() != slot) {
        part.h.set_key_list_slot(slot);
        part.header = SerializeToFrame(part.h);
      }
    };
    auto held = memo.slot_of.find(digest);
    if (held != memo.slot_of.end()) {
      const uint32_t slot = held->second;
      if (!part.send_keys && memo.count[slot - 1] == n) {
        use_slot(slot);
        return false;
      }
      memo.Forget(slot);
    }
    part.send_keys = false;
    const uint32_t slot = memo.LeastRecentlyUsed();
    memo.Forget(slot);
    const int64_t bytes = static_cast<int64_t>(n * sizeof(uint64_t));
    if (memo.bytes + bytes > key_cache_bytes_) {
      part.h.clear_key_list_slot();
      part.h.clear_key_list_digest();
      part.header = SerializeToFrame(part.h);
      return true;
    }
    memo.digest[slot - 1] = digest;
    memo.count[slot - 1] = n;
    memo.slot_of[digest] = slot;
    memo.bytes += bytes;
    use_slot(slot);
    return true;
  }

  void OnResponse(uint32_t server, std::vector<zmq::message_t>& frames) {
    uint64_t bytes = 0;
    for (const auto& f : frames) bytes += f.size();
    bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
    DecodedResponse response;
    absl::Status status = DecodeResponse(frames, &response);
    if (!status.ok()) {
      // Without a trustworthy request id the request cannot be matched; it
      // will time out.
      Log()->error("bad response from server {}: {}", server, status.message());
      return;
    }
    auto it = pending_.find(response.header.request_id());
    if (it == pending_.end()) return;  // answered after its deadline
    std::unique_ptr<Part> part = std::move(it->second);
    pending_.erase(it);
    if (part->server != server) {
      part->parent->PartDone(
          absl::InternalError("response from the wrong server"));
      return;
    }
    if (response.header.key_list_unknown() && part->h.key_list_slot() != 0 &&
        !part->send_keys) {
      // The server does not hold the key list this client thought it had
      // (a server restarted at the same address): nothing was applied;
      // send it again, keys included, at once.
      part->send_keys = true;
      Send(std::move(part));
      return;
    }
    const bool unavailable =
        response.header.code() == static_cast<int>(absl::StatusCode::kUnavailable);
    if (unavailable && response.header.refusal() != REFUSAL_NONE) {
      // The server refused without looking (its lease lapsed, or it was
      // dropped): nothing was applied or recorded. Until the scheduler
      // renews its lease or moves its slots, try again, routed by the
      // newest view each time; bounded from the first refusal, since a
      // reroutable part's own deadline moves with every routing.
      const absl::Time now = absl::Now();
      if (part->refused_until == absl::InfinitePast()) {
        part->refused_until = now + std::max(request_timeout_, failover_timeout_);
      }
      const absl::Duration backoff =
          std::min(absl::Milliseconds(20) * (1 << std::min(part->refusals, 4)),
                   absl::Milliseconds(200));
      part->retry_at = now + backoff;
      if (part->retry_at < part->refused_until) {
        // A part sent again as it is (not routed again) keeps its deadline:
        // it is moved so that the retry has a request timeout of its own.
        part->deadline = std::max(part->deadline, part->retry_at + request_timeout_);
        ++part->refusals;
        retries_.push_back(std::move(part));
        return;
      }
    }
    const bool misrouted = part->reroutable && response.header.wrong_owner();
    if ((unavailable && response.header.refusal() == REFUSAL_NONE) || misrouted) {
      // The server applied nothing (e.g. it has not received the cluster
      // view yet); try again with exponential backoff until the deadline.
      const absl::Duration backoff =
          std::min(absl::Milliseconds(2) * (1 << std::min(part->attempts, 8)),
                   absl::Milliseconds(200));
      part->retry_at = absl::Now() + backoff;
      if (part->retry_at < part->deadline) {
        ++part->attempts;
        retries_.push_back(std::move(part));
        return;
      }
    }
    if (response.header.code() != 0) {
      part->parent->PartDone(absl::Status(
          static_cast<absl::StatusCode>(response.header.code()),
          absl::StrCat("server ", server, ": ", response.header.message())));
      return;
    }
    if (part->scan != nullptr) {
      OnScanPage(std::move(part), response);
      return;
    }
    if (response.values.size() != part->expected_values) {
      part->parent->PartDone(absl::DataLossError(
          absl::StrCat("server ", server, " returned ", response.values.size(),
                       " values, expected ", part->expected_values)));
      return;
    }
    if (response.header.table_stats_size() > 0) {
      part->parent->RecordTableStats(server, response.header);
    }
    if (part->pulled != nullptr) {
      KeepFrame(part->pulled, response, frames);
    } else {
      Scatter(*part, response.values);
    }
    if (part->expected_values > 0) {
      part->parent->RecordClocks(response.header.min_clock(),
                                 response.header.applied_clock());
    }
    part->parent->PartDone(absl::OkStatus());
  }

  // Appends a SCAN page's rows and asks for the next page.
  void OnScanPage(std::unique_ptr<Part> part, const DecodedResponse& response) {
    ScanChain& chain = *part->scan;
    const uint64_t next = response.header.next_cursor();
    if (response.values.size() != response.keys.size() * chain.dim) {
      part->parent->PartDone(absl::DataLossError(absl::StrCat(
          "server ", part->server, " answered a scan page of ", response.keys.size(),
          " keys with ", response.values.size(), " values (dim ", chain.dim, ")")));
      return;
    }
    // Cursors only grow, which also guarantees that the scan ends.
    if (next != 0 && next <= chain.cursor) {
      part->parent->PartDone(absl::DataLossError(absl::StrCat(
          "server ", part->server, " did not advance the scan cursor (", chain.cursor,
          " -> ", next, ")")));
      return;
    }
    chain.keys->insert(chain.keys->end(), response.keys.begin(), response.keys.end());
    chain.values->insert(chain.values->end(), response.values.begin(),
                         response.values.end());
    if (next == 0) {
      part->parent->PartDone(absl::OkStatus());
      return;
    }
    chain.cursor = next;
    std::unique_ptr<Part> page = chain.page(next);
    page->scan = std::move(part->scan);
    Send(std::move(page));
  }

  // A whole-range dense pull's answer: the values stay in their frame (its
  // decoded view points into it), unless they were decoded from half-width
  // or copied for alignment, in which case they are moved.
  static void KeepFrame(DenseValues* out, DecodedResponse& response,
                        std::vector<zmq::message_t>& frames) {
    if (!response.value_copy.empty() || frames.size() < 2 ||
        response.values.data() != frames[1].data()) {
      out->Own(response.value_copy.empty()
                   ? std::vector<float>(response.values.begin(), response.values.end())
                   : std::move(response.value_copy));
      return;
    }
    // A moved message_t keeps the address of a large payload but not of a
    // small one (libzmq stores those inline): the view is taken from the
    // frame after the move.
    auto frame = std::make_shared<zmq::message_t>(std::move(frames[1]));
    const size_t n = response.values.size();
    const auto* data = static_cast<const float*>(frame->data());
    if (reinterpret_cast<uintptr_t>(data) % alignof(float) != 0) {
      std::memcpy(out->OwnArray(n), data, n * sizeof(float));
      return;
    }
    out->view_ = absl::MakeConstSpan(data, n);
    out->frame_ = std::move(frame);
  }

  static void Scatter(const Part& part, absl::Span<const float> values) {
    if (part.expected_values == 0) return;
    if (!part.runs.empty()) {
      const float* src = values.data();
      for (const auto& [offset, length] : part.runs) {
        std::memcpy(part.out + offset, src, length * sizeof(float));
        src += length;
      }
    } else if (part.positions.empty()) {
      std::memcpy(part.out, values.data(), values.size() * sizeof(float));
    } else {
      const size_t row = part.dim * sizeof(float);
      for (size_t i = 0; i < part.positions.size(); ++i) {
        std::memcpy(
            part.out + static_cast<size_t>(part.positions[i]) * part.dim,
            values.data() + i * part.dim, row);
      }
    }
  }

  void ResendDue() {
    if (retries_.empty()) return;
    const absl::Time now = absl::Now();
    std::vector<std::unique_ptr<Part>> due;
    for (auto it = retries_.begin(); it != retries_.end();) {
      if ((*it)->retry_at <= now) {
        due.push_back(std::move(*it));
        it = retries_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& part : due) {
      if (part->reroutable) {
        Route(std::move(part));
      } else {
        Send(std::move(part));
      }
    }
  }

  void ExpireDeadlines() {
    const absl::Time now = absl::Now();
    for (auto it = parked_.begin(); it != parked_.end();) {
      if ((*it)->failover_deadline <= now) {
        (*it)->parent->PartDone(absl::UnavailableError(absl::StrCat(
            "no live server took over server ", (*it)->server,
            "'s slots in time for request ", (*it)->request_id)));
        it = parked_.erase(it);
      } else {
        ++it;
      }
    }
    if (pending_.empty()) return;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second->deadline <= now) {
        const uint32_t r = it->second->server;
        const std::string refused =
            r < refusals_.size() && !refusals_[r].empty() ? absl::StrCat(" (", refusals_[r], ")")
            : curve_.has_value() ? std::string(" (CURVE: a server that refuses this job's key "
                                               "pair never answers; see its log)")
                                 : std::string();
        it->second->parent->PartDone(absl::DeadlineExceededError(absl::StrCat(
            "server ", r, " did not answer request ", it->first, " in time", refused)));
        pending_.erase(it++);
      } else {
        ++it;
      }
    }
  }

  // The job key pair of Options::curve (nullopt: plaintext).
  const std::optional<CurveKeys> curve_;
  const int event_fd_;
  uint64_t monitor_serial_ = 0;
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
    void Forget(uint32_t slot) {
      bytes -= static_cast<int64_t>(count[slot - 1] * sizeof(uint64_t));
      if (digest[slot - 1] != 0) slot_of.erase(digest[slot - 1]);
      digest[slot - 1] = 0;
      count[slot - 1] = 0;
    }
    uint32_t LeastRecentlyUsed() const {
      uint32_t best = 1;
      for (uint32_t s = 2; s <= kKeyListSlots; ++s) {
        if (last_use[s - 1] < last_use[best - 1]) best = s;
      }
      return best;
    }
  };
  const int64_t key_cache_bytes_;
  std::vector<KeyMemo> key_memos_;  // by server rank
  const absl::Duration request_timeout_;
  const absl::Duration failover_timeout_;
  std::atomic<uint64_t>* const next_request_id_;
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

// -------------------------------------------------------------- KVClient

std::shared_ptr<const KVClient::Routing> KVClient::MakeRouting(
    const ClusterView& view) {
  auto routing = std::make_shared<Routing>();
  routing->epoch = view.epoch();
  routing->mode = view.consistency().mode() == CONSISTENCY_MODE_UNSPECIFIED
                      ? ASYNC
                      : view.consistency().mode();
  routing->slot_owner.assign(view.slot_owner().begin(),
                             view.slot_owner().end());
  if (!routing->slot_owner.empty() &&
      std::all_of(routing->slot_owner.begin(), routing->slot_owner.end(),
                  [&](uint32_t owner) { return owner == routing->slot_owner[0]; })) {
    routing->sole_owner = routing->slot_owner[0];
  }
  for (const NodeInfo& node : view.nodes()) {
    if (node.role() != SERVER || node.state() != ALIVE) continue;
    if (routing->endpoints.size() <= node.rank()) {
      routing->endpoints.resize(node.rank() + 1);
    }
    routing->endpoints[node.rank()] = node.data_endpoint();
  }
  return routing;
}

absl::StatusOr<std::unique_ptr<KVClient>> KVClient::Create(
    Options options, const ClusterView& view) {
  if (view.job_state() != RUNNING || view.slot_owner().empty()) {
    return absl::InvalidArgumentError(
        "KVClient needs a RUNNING cluster view with a slot map");
  }
  for (uint32_t owner : view.slot_owner()) {
    if (owner >= options.config.cluster().num_servers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot map names server ", owner, " but the job has ",
                       options.config.cluster().num_servers()));
    }
  }
  return std::unique_ptr<KVClient>(
      new KVClient(std::move(options), MakeRouting(view)));
}

KVClient::KVClient(Options options, std::shared_ptr<const Routing> routing)
    : options_(std::move(options)),
      request_timeout_(
          absl::Milliseconds(options_.config.cluster().request_timeout_ms())),
      routing_(routing),
      io_(std::make_unique<IoLoop>(
          routing, request_timeout_,
          absl::Milliseconds(options_.config.cluster().failover_timeout_ms() > 0
                                 ? options_.config.cluster().failover_timeout_ms()
                                 : 120000),
          &next_request_id_,
          options_.config.data_plane().key_cache_bytes() > 0
              ? options_.config.data_plane().key_cache_bytes()
              : 0,
          options_.curve)) {
  clock_.store(options_.start_clock);
  const DataPlaneConfig& dp = options_.config.data_plane();
  // Only registered clients cache key lists: servers keep lists per node
  // id, and tools that did not register all send node id 0, so they would
  // overwrite each other's slots and share one budget.
  key_caching_ = dp.key_cache_bytes() > 0 && options_.node_id != 0;
  push_values_ = EncodedValueBytes(dp.push_values()) == 2 ? dp.push_values() : FLOAT32;
  pull_values_ = EncodedValueBytes(dp.pull_values()) == 2 ? dp.pull_values() : FLOAT32;
  servers_clip_nonfinite_ = dp.gradients().nonfinite() == GradientPolicy::CLIP &&
                            dp.gradients().clip_value() > 0;
  limits_ = LimitsWithDefaults(dp.limits());
  for (const TableConfig& t : options_.config.tables()) {
    TableInfo info;
    info.sparse = t.has_sparse();
    info.dim = t.has_sparse() ? t.sparse().dim() : 1;
    info.size = t.has_dense() ? t.dense().size() : 0;
    info.block_size = t.has_dense() ? t.dense().block_size() : 1;
    tables_[t.id()] = info;
  }
}

KVClient::~KVClient() { io_.reset(); }

void KVClient::UpdateView(const ClusterView& view) {
  if (view.slot_owner().empty()) return;
  for (uint32_t owner : view.slot_owner()) {
    if (owner >= options_.config.cluster().num_servers()) {
      Log()->error("ignoring view {}: slot map names server {}", view.epoch(),
                   owner);
      return;
    }
  }
  auto routing = MakeRouting(view);
  {
    absl::MutexLock lock(&routing_mu_);
    if (routing->epoch <= routing_->epoch) return;
    routing_ = routing;
  }
  io_->SetRouting(std::move(routing));
}

void KVClient::Abort(absl::Status why) {
  if (why.ok()) why = absl::CancelledError("KVClient aborted");
  {
    absl::MutexLock lock(&abort_mu_);
    if (aborted_.load()) return;
    abort_status_ = why;
    aborted_.store(true);
  }
  Log()->warn("data plane aborted: {}", why.ToString());
  io_->Abort(std::move(why));
}

std::shared_ptr<const KVClient::Routing> KVClient::routing() const {
  absl::MutexLock lock(&routing_mu_);
  return routing_;
}

KVClient::Stats KVClient::stats() const {
  Stats s = io_->stats();
  s.requests = requests_.load();
  return s;
}

void KVClient::Instrument(int op, Completion::State* state) const {
  const Options::Instruments& in = options_.instruments;
  state->latency = op == PUSH        ? in.push_seconds
                   : op == PULL      ? in.pull_seconds
                   : op == PUSH_PULL ? in.push_pull_seconds
                                     : nullptr;
  if (op == PULL || op == PUSH_PULL) state->staleness = in.staleness;
  if (state->latency != nullptr || state->staleness != nullptr) {
    state->clock = clock_.load();
    state->start = std::chrono::steady_clock::now();
  }
}

Completion KVClient::Failed(absl::Status status, DoneCallback done) {
  if (aborted_.load()) {
    // After Abort() nothing succeeds, not even a request with nothing to
    // send.
    absl::MutexLock lock(&abort_mu_);
    status = abort_status_;
  }
  auto state = std::make_shared<Completion::State>(1, std::move(done));
  state->PartDone(status);
  return Completion(std::move(state));
}

void KVClient::Submit(std::vector<std::unique_ptr<Part>> parts) {
  io_->Enqueue(std::move(parts));
}

Completion KVClient::Push(uint32_t table, absl::Span<const uint64_t> keys,
                          absl::Span<const float> grads, DoneCallback done) {
  return Sparse(PUSH, table, keys, grads, nullptr, std::move(done));
}

Completion KVClient::Pull(uint32_t table, absl::Span<const uint64_t> keys,
                          float* out, DoneCallback done) {
  return Sparse(PULL, table, keys, {}, out, std::move(done));
}

Completion KVClient::PushPull(uint32_t table, absl::Span<const uint64_t> keys,
                              absl::Span<const float> grads, float* out,
                              DoneCallback done) {
  return Sparse(PUSH_PULL, table, keys, grads, out, std::move(done));
}

Completion KVClient::PushDense(uint32_t table, uint64_t begin,
                               absl::Span<const float> grads,
                               DoneCallback done) {
  return Dense(PUSH, table, begin, grads.size(), grads, nullptr,
               std::move(done));
}

Completion KVClient::AssignDense(uint32_t table, uint64_t begin,
                                 absl::Span<const float> values,
                                 DoneCallback done) {
  return Dense(ASSIGN, table, begin, values.size(), values, nullptr,
               std::move(done));
}

Completion KVClient::PullDense(uint32_t table, uint64_t begin, uint64_t count,
                               float* out, DoneCallback done) {
  return Dense(PULL, table, begin, count, {}, out, std::move(done));
}

Completion KVClient::PushDense(uint32_t table, uint64_t begin,
                               std::shared_ptr<const std::vector<float>> grads,
                               DoneCallback done) {
  if (grads == nullptr) {
    return Failed(absl::InvalidArgumentError("PushDense: null gradients"), std::move(done));
  }
  const absl::Span<const float> span(*grads);
  return Dense(PUSH, table, begin, span.size(), span, nullptr, std::move(done),
               std::move(grads));
}

Completion KVClient::PullDense(uint32_t table, uint64_t begin, uint64_t count,
                               DenseValues* out, DoneCallback done) {
  if (out == nullptr) {
    return Failed(absl::InvalidArgumentError("PullDense: null DenseValues"), std::move(done));
  }
  out->Clear();
  return Dense(PULL, table, begin, count, {}, nullptr, std::move(done), nullptr, out);
}

std::unique_ptr<KVClient::Part> KVClient::NewPart(
    uint32_t server, int op, uint32_t table, const Routing& routing,
    const std::shared_ptr<Completion::State>& state, RequestHeader* header) {
  auto part = std::make_unique<Part>();
  part->request_id = next_request_id_.fetch_add(1, std::memory_order_relaxed);
  part->server = server;
  part->parent = state;
  part->deadline = absl::Now() + request_timeout_;
  header->set_request_id(part->request_id);
  header->set_op(static_cast<Op>(op));
  header->set_table_id(table);
  header->set_epoch(routing.epoch);
  header->set_sender_rank(options_.rank);
  header->set_sender_node_id(options_.node_id);
  header->set_clock(clock_.load());
  if (op == PUSH || op == PUSH_PULL || op == ASSIGN) {
    header->set_seq(next_seq_.fetch_add(1, std::memory_order_relaxed));
  }
  return part;
}

Completion KVClient::AdvanceClock(DoneCallback done) {
  return AdvanceClockTo(clock_.load() + 1, std::move(done));
}

Completion KVClient::AdvanceClockTo(uint64_t target, DoneCallback done) {
  uint64_t clock = clock_.load();
  while (clock < target && !clock_.compare_exchange_weak(clock, target)) {
  }
  clock = std::max(clock, target);
  return SendClock(clock, /*restart=*/false, std::move(done));
}

Completion KVClient::RestartClock(uint64_t clock, DoneCallback done) {
  clock_.store(clock);
  return SendClock(clock, /*restart=*/true, std::move(done));
}

Completion KVClient::SendClock(uint64_t clock, bool restart, DoneCallback done) {
  auto routing = this->routing();
  std::vector<uint32_t> servers;
  for (uint32_t r = 0; r < routing->endpoints.size(); ++r) {
    if (!routing->endpoints[r].empty()) servers.push_back(r);
  }
  if (servers.empty()) return Failed(absl::OkStatus(), std::move(done));
  auto state = std::make_shared<Completion::State>(static_cast<int>(servers.size()),
                                                   std::move(done));
  std::vector<std::unique_ptr<Part>> parts;
  for (uint32_t server : servers) {
    RequestHeader h;
    auto part = NewPart(server, ADVANCE_CLOCK, 0, *routing, state, &h);
    h.set_clock(clock);
    h.set_restart(restart);
    part->header = SerializeToFrame(h);
    part->h = h;
    parts.push_back(std::move(part));
  }
  Submit(std::move(parts));
  return Completion(std::move(state));
}

Completion KVClient::TableStatistics(std::vector<ServerTableStats>* out,
                                     DoneCallback done) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  out->clear();
  auto routing = this->routing();
  std::vector<uint32_t> servers;
  for (uint32_t r = 0; r < routing->endpoints.size(); ++r) {
    if (!routing->endpoints[r].empty()) servers.push_back(r);
  }
  if (servers.empty()) {
    return Failed(absl::UnavailableError("no live server"), std::move(done));
  }
  auto state = std::make_shared<Completion::State>(static_cast<int>(servers.size()),
                                                   std::move(done));
  {
    absl::MutexLock lock(&state->mu);
    state->table_stats = out;
  }
  std::vector<std::unique_ptr<Part>> parts;
  for (uint32_t server : servers) {
    RequestHeader h;
    auto part = NewPart(server, STATS, 0, *routing, state, &h);
    part->header = SerializeToFrame(h);
    parts.push_back(std::move(part));
  }
  Submit(std::move(parts));
  return Completion(std::move(state));
}

Completion KVClient::Scan(uint32_t table, std::vector<uint64_t>* keys,
                          std::vector<float>* values, DoneCallback done) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  auto it = tables_.find(table);
  if (it == tables_.end() || !it->second.sparse) {
    return Failed(absl::InvalidArgumentError(absl::StrCat(
                      "table ", table, " is not a sparse table of this job")),
                  std::move(done));
  }
  if (keys == nullptr || values == nullptr) {
    return Failed(absl::InvalidArgumentError("Scan needs keys and values outputs"),
                  std::move(done));
  }
  auto routing = this->routing();
  std::vector<uint32_t> servers;
  for (uint32_t r = 0; r < routing->endpoints.size(); ++r) {
    if (!routing->endpoints[r].empty()) servers.push_back(r);
  }
  if (servers.empty()) {
    return Failed(absl::UnavailableError("no live server"), std::move(done));
  }
  auto state = std::make_shared<Completion::State>(static_cast<int>(servers.size()),
                                                   std::move(done));
  const uint64_t page_rows = std::min(options_.scan_page_rows, kMaxScanRows);
  std::vector<std::unique_ptr<Part>> parts;
  for (uint32_t server : servers) {
    auto chain = std::make_shared<ScanChain>();
    chain->dim = it->second.dim;
    chain->keys = keys;
    chain->values = values;
    chain->endpoint = routing->endpoints[server];
    // Runs on the I/O thread, which the destructor joins before `this` goes.
    // Later pages carry the epoch current when they are sent.
    chain->page = [this, server, table, page_rows, state](uint64_t cursor) {
      RequestHeader h;
      auto part = NewPart(server, SCAN, table, *this->routing(), state, &h);
      h.set_scan_cursor(cursor);
      h.set_scan_max_rows(page_rows);
      part->header = SerializeToFrame(h);
      return part;
    };
    auto part = chain->page(0);
    part->scan = std::move(chain);
    parts.push_back(std::move(part));
  }
  Submit(std::move(parts));
  return Completion(std::move(state));
}

absl::Status KVClient::ScanAll(uint32_t table, std::vector<uint64_t>* keys,
                               std::vector<float>* values) {
  return Scan(table, keys, values).Wait();
}

Completion KVClient::Sparse(int op_int, uint32_t table,
                            absl::Span<const uint64_t> keys,
                            absl::Span<const float> grads, float* out,
                            DoneCallback done) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  const Op op = static_cast<Op>(op_int);
  auto it = tables_.find(table);
  if (it == tables_.end() || !it->second.sparse) {
    return Failed(absl::InvalidArgumentError(absl::StrCat(
                      "table ", table, " is not a sparse table of this job")),
                  std::move(done));
  }
  const uint32_t dim = it->second.dim;
  const bool push = op != PULL;
  if (push && grads.size() != keys.size() * dim) {
    return Failed(absl::InvalidArgumentError(absl::StrCat(
                      "push of ", keys.size(), " keys of dim ", dim, " needs ",
                      keys.size() * dim, " values, got ", grads.size())),
                  std::move(done));
  }
  // Checked before the request is split by server: a server refusing its
  // part while another applies its own would leave the update half done.
  if (push && !servers_clip_nonfinite_ && !AllFinite(grads)) {
    return Failed(NonFiniteError(op, table, "nothing was sent"), std::move(done));
  }
  if (keys.empty()) return Failed(absl::OkStatus(), std::move(done));
  if (keys.size() > UINT32_MAX) {
    return Failed(absl::InvalidArgumentError("too many keys in one request"),
                  std::move(done));
  }
  auto routing = this->routing();
  const uint32_t num_slots = static_cast<uint32_t>(routing->slot_owner.size());
  const size_t num_servers = options_.config.cluster().num_servers();

  // Owner of every key, and how many keys each server gets. The frames are
  // then filled in place: no per-key allocation, one pass per frame.
  std::vector<uint32_t> owners;
  std::vector<uint32_t> counts(num_servers, 0);
  if (routing->sole_owner >= 0 && static_cast<size_t>(routing->sole_owner) < num_servers) {
    // Every key goes to one server (`owners` is not needed then).
    counts[routing->sole_owner] = static_cast<uint32_t>(keys.size());
  } else {
    // Four sets of counters, taken in turn: with one, consecutive keys of
    // the same server each waited for the previous increment of the same
    // counter in memory (the loop's cost, by perf).
    owners.resize(keys.size());
    std::vector<uint32_t> counts4(4 * num_servers, 0);
    for (size_t i = 0; i < keys.size(); ++i) {
      const uint32_t owner = routing->slot_owner[SparseSlot(table, keys[i], num_slots)];
      owners[i] = owner;
      ++counts4[(i & 3) * num_servers + owner];
    }
    for (size_t k = 0; k < 4; ++k) {
      for (size_t s = 0; s < num_servers; ++s) counts[s] += counts4[k * num_servers + s];
    }
  }
  int num_parts = 0;
  for (uint32_t c : counts) {
    num_parts += c > 0;
    const uint64_t bytes = c * (sizeof(uint64_t) + (push ? dim * EncodedValueBytes(push_values_) : 0));
    if (absl::Status limit = CheckPartLimits(c, bytes); !limit.ok()) {
      return Failed(std::move(limit), std::move(done));
    }
  }
  auto state = std::make_shared<Completion::State>(num_parts, std::move(done));
  Instrument(op, state.get());
  std::vector<std::unique_ptr<Part>> parts;
  parts.reserve(num_parts);
  for (uint32_t server = 0; server < num_servers; ++server) {
    const size_t n = counts[server];
    if (n == 0) continue;
    RequestHeader h;
    auto part = NewPart(server, op, table, *routing, state, &h);
    part->dim = dim;
    h.set_num_keys(n);
    part->reroutable = true;
    // zmq::message_t(size) allocates without initialising (malloc), so each
    // byte is written once.
    part->keys = zmq::message_t(n * sizeof(uint64_t));
    const size_t width = EncodedValueBytes(push_values_);
    if (push) {
      part->values = zmq::message_t(n * dim * width);
      part->has_values = true;
    }
    auto* k = static_cast<uint64_t*>(part->keys.data());
    if (n == keys.size()) {
      // Every key on one server, in order: plain copies, no scatter map.
      std::memcpy(k, keys.data(), n * sizeof(uint64_t));
      if (push) EncodeValues(push_values_, grads.data(), grads.size(), part->values.data());
    } else {
      std::vector<uint32_t> idx;
      idx.reserve(n);
      for (size_t i = 0; i < keys.size(); ++i) {
        if (owners[i] == server) idx.push_back(static_cast<uint32_t>(i));
      }
      for (size_t j = 0; j < n; ++j) k[j] = keys[idx[j]];
      if (push) {
        // Gathered straight into the frame, or for a half-width encoding
        // into a scratch buffer that is then encoded into it.
        std::vector<float> scratch;
        float* v = static_cast<float*>(part->values.data());
        if (width != sizeof(float)) {
          scratch.resize(n * dim);
          v = scratch.data();
        }
        if (dim == 1) {
          for (size_t j = 0; j < n; ++j) v[j] = grads[idx[j]];
        } else {
          for (size_t j = 0; j < n; ++j) {
            std::memcpy(v + j * dim, &grads[static_cast<size_t>(idx[j]) * dim],
                        dim * sizeof(float));
          }
        }
        if (width != sizeof(float)) EncodeValues(push_values_, v, n * dim, part->values.data());
      }
      if (op != PUSH) part->positions = std::move(idx);
    }
    SetWireOptions(op, absl::MakeConstSpan(k, n), &h);
    part->header = SerializeToFrame(h);
    part->h = h;
    if (op != PUSH) {
      part->out = out;
      part->expected_values = n * dim;
    }
    parts.push_back(std::move(part));
  }
  Submit(std::move(parts));
  return Completion(std::move(state));
}

absl::Status KVClient::CheckPartLimits(uint64_t keys, uint64_t bytes) const {
  if (keys > limits_.max_keys_per_message()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a request part for one server carries ", keys,
        " keys; data_plane.limits.max_keys_per_message is ", limits_.max_keys_per_message(),
        "; nothing was sent (split the request)"));
  }
  // Headers are small; leave them 64 KiB.
  if (bytes + 65536 > static_cast<uint64_t>(limits_.max_message_bytes())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a request part for one server carries ", bytes,
        " bytes; data_plane.limits.max_message_bytes is ", limits_.max_message_bytes(),
        "; nothing was sent (split the request)"));
  }
  return absl::OkStatus();
}

void KVClient::SetWireOptions(int op_int, absl::Span<const uint64_t> keys,
                              RequestHeader* h) const {
  const Op op = static_cast<Op>(op_int);
  if ((op == PUSH || op == PUSH_PULL) && push_values_ != FLOAT32) {
    h->set_push_values(push_values_);
  }
  if ((op == PULL || op == PUSH_PULL) && pull_values_ != FLOAT32) {
    h->set_pull_values(pull_values_);
  }
  if (key_caching_ && !keys.empty() && op != ASSIGN) SetKeyList(keys, h);
}

Completion KVClient::Dense(int op_int, uint32_t table, uint64_t begin,
                           uint64_t count, absl::Span<const float> grads,
                           float* out, DoneCallback done,
                           std::shared_ptr<const std::vector<float>> shared,
                           DenseValues* pulled) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  const Op op = static_cast<Op>(op_int);
  auto it = tables_.find(table);
  if (it == tables_.end() || it->second.sparse) {
    return Failed(absl::InvalidArgumentError(absl::StrCat(
                      "table ", table, " is not a dense table of this job")),
                  std::move(done));
  }
  const TableInfo& info = it->second;
  if (begin >= info.size || count > info.size - begin) {
    return Failed(absl::OutOfRangeError(absl::StrCat(
                      "range [", begin, ", +", count, ") is outside table ",
                      table, " of size ", info.size)),
                  std::move(done));
  }
  auto not_finite = [&] {
    return Failed(NonFiniteError(op, table, "nothing was sent"), std::move(done));
  };
  // Pushed values go to the wire in the job's encoding (ASSIGN: float32).
  const ValueEncoding encoding = op == PUSH ? push_values_ : FLOAT32;
  const size_t width = EncodedValueBytes(encoding);
  // Float32 values are checked while they are copied into the frames (one
  // pass over a large tensor instead of two); others before encoding.
  // With CLIP the servers clip pushed gradients; ASSIGN's values must be
  // finite regardless.
  const bool check_finite = op != PULL && !(op == PUSH && servers_clip_nonfinite_);
  if (check_finite && width != sizeof(float) && !AllFinite(grads)) return not_finite();
  if (count == 0) return Failed(absl::OkStatus(), std::move(done));
  auto routing = this->routing();
  const uint32_t num_slots = static_cast<uint32_t>(routing->slot_owner.size());
  const size_t num_servers = options_.config.cluster().num_servers();

  struct Builder {
    RequestHeader header;
    zmq::message_t values;
    char* fill = nullptr;  // next free byte of `values`
    std::vector<std::pair<uint64_t, uint64_t>> runs;
    uint64_t total = 0;
    bool unchecked = false;  // zero-copy values left to the server's check
  };
  std::vector<Builder> builders(num_servers);
  if (op != PULL) {
    // Each server's frame is allocated at its exact size and filled in
    // place: no growth, no zero-filling, no copy into a frame afterwards.
    // With `shared` (zero-copy) a server whose share is one contiguous
    // piece of float32 values gets a frame pointing into `shared` instead.
    std::vector<uint64_t> totals(num_servers, 0);
    std::vector<uint64_t> first(num_servers, 0), next(num_servers, 0);
    std::vector<bool> contiguous(num_servers, true);
    for (uint64_t pos = begin; pos < begin + count;) {
      const uint64_t block = pos / info.block_size;
      const uint64_t end = std::min(begin + count, (block + 1) * info.block_size);
      const uint32_t s = routing->slot_owner[DenseBlockSlot(table, block, num_slots)];
      if (totals[s] == 0) {
        first[s] = pos - begin;
      } else if (next[s] != pos - begin) {
        contiguous[s] = false;
      }
      next[s] = end - begin;
      totals[s] += end - pos;
      pos = end;
    }
    // A push that one server receives whole is all-or-nothing by that
    // server's own check (it rejects a non-finite value before applying
    // anything, with the element's index), so the zero-copy form leaves the
    // check to it: one read pass over the tensor fewer on the sender. Spread
    // over servers, the sender checks first, so no server applies its share
    // of a push another would reject.
    const size_t receivers = static_cast<size_t>(
        std::count_if(totals.begin(), totals.end(), [](uint64_t t) { return t != 0; }));
    const bool left_to_server = receivers == 1;
    bool checked = left_to_server;
    for (size_t s = 0; s < num_servers; ++s) {
      if (totals[s] == 0) continue;
      if (shared != nullptr && width == sizeof(float) && contiguous[s]) {
        // One read pass instead of a copy: the check reads every value once
        // for all the zero-copy frames.
        if (check_finite && !checked) {
          if (!AllFinite(grads)) return not_finite();
          checked = true;
        }
        builders[s].unchecked = check_finite && left_to_server;
        builders[s].values = FrameFromShared(shared, first[s], totals[s]);
        continue;  // fill stays null: nothing to copy
      }
      builders[s].values = zmq::message_t(totals[s] * width);
      builders[s].fill = static_cast<char*>(builders[s].values.data());
    }
  }
  bool finite = true;
  // Cut the range at block boundaries; each block lives in one slot.
  for (uint64_t pos = begin; pos < begin + count;) {
    const uint64_t block = pos / info.block_size;
    const uint64_t end = std::min(begin + count, (block + 1) * info.block_size);
    const uint32_t owner =
        routing->slot_owner[DenseBlockSlot(table, block, num_slots)];
    Builder& b = builders[owner];
    DenseSegment* seg = b.header.add_segments();
    seg->set_begin(pos);
    seg->set_length(end - pos);
    if (op != PULL && b.fill != nullptr) {
      const float* src = grads.data() + (pos - begin);
      if (width == sizeof(float)) {
        finite &= CopyFinite(src, end - pos, reinterpret_cast<float*>(b.fill));
      } else {
        EncodeValues(encoding, src, end - pos, b.fill);
      }
      b.fill += (end - pos) * width;
    }
    b.runs.emplace_back(pos - begin, end - pos);
    b.total += end - pos;
    pos = end;
  }
  if (check_finite && !finite) return not_finite();
  int num_parts = 0;
  for (const auto& b : builders) {
    num_parts += b.total > 0;
    if (absl::Status limit = CheckPartLimits(0, b.values.size()); !limit.ok()) {
      return Failed(std::move(limit), std::move(done));
    }
  }
  auto state = std::make_shared<Completion::State>(num_parts, std::move(done));
  Instrument(op, state.get());
  // A pull into a DenseValues that spans servers is copied into the
  // object's own array (runs are offsets into it).
  float* const pulled_array =
      pulled != nullptr && num_parts > 1 ? pulled->OwnArray(count) : nullptr;
  std::vector<std::unique_ptr<Part>> parts;
  for (uint32_t server = 0; server < num_servers; ++server) {
    Builder& b = builders[server];
    if (b.total == 0) continue;
    auto part = NewPart(server, op, table, *routing, state, &b.header);
    SetWireOptions(op, {}, &b.header);
    part->header = SerializeToFrame(b.header);
    part->reroutable = true;
    part->h = b.header;
    part->block_size = info.block_size;
    if (op != PULL) {
      part->values = std::move(b.values);
      part->has_values = true;
      part->values_unchecked = b.unchecked;
    }
    if (op == PULL) {
      part->out = out;
      part->expected_values = b.total;
      part->runs = std::move(b.runs);
      if (pulled != nullptr && num_parts == 1) {
        part->pulled = pulled;
      } else if (pulled != nullptr) {
        part->out = pulled_array;
      }
    }
    parts.push_back(std::move(part));
  }
  Submit(std::move(parts));
  return Completion(std::move(state));
}

}  // namespace ps
