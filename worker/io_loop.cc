#include "worker/io_loop.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/finite.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/value_codec.h"
#include "worker/router.h"
#include "zmq_addon.hpp"

namespace ps {

void Completion::State::RecordTableStats(uint32_t server,
                                         const ResponseHeader& h) {
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

namespace kv_internal {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger =
      new std::shared_ptr<spdlog::logger>(GetLogger("kv_client"));
  return *logger;
}

constexpr std::chrono::milliseconds kPollPeriod{20};

// IoLoop::Split's pieces. A piece of `part` for another server: same
// request, deadlines and answer destination, without keys, values or
// segments (FillDensePiece and FillSparsePiece add its share).
std::unique_ptr<Part> NewPiece(const Part& part) {
  auto p = std::make_unique<Part>();
  p->parent = part.parent;
  p->dim = part.dim;
  p->out = part.out;
  p->has_values = part.has_values;
  p->deadline = part.deadline;
  p->failover_deadline = part.failover_deadline;
  p->refusals = part.refusals;
  p->refused_until = part.refused_until;
  p->reroutable = true;
  p->fate_unknown = part.fate_unknown;
  p->block_size = part.block_size;
  p->h = part.h;
  return p;
}

// Gives `p` the segments of a dense `part` that `server` owns, their
// values (bytes of `width` each, as encoded on the wire: `src`, null when
// the part carries none) and where their answers go.
void FillDensePiece(const Part& part, const DenseSplit& split, uint32_t server,
                    const char* src, size_t width, Part* p,
                    std::vector<char>* values) {
  const RequestHeader& h = part.h;
  p->h.clear_segments();
  for (const DensePiece& piece : split.pieces) {
    if (piece.owner != server) continue;
    DenseSegment* seg = p->h.add_segments();
    seg->set_begin(piece.begin);
    seg->set_length(piece.length);
    if (src != nullptr) {
      values->insert(values->end(), src + piece.offset * width,
                     src + (piece.offset + piece.length) * width);
    }
    if (!part.runs.empty()) {
      // Where the piece's answer goes: its segment's run, shifted by
      // where the piece starts in the segment.
      const auto& run = part.runs[piece.source];
      p->runs.emplace_back(
          run.first + (piece.begin - h.segments(piece.source).begin()),
          piece.length);
    }
    if (part.expected_values > 0) p->expected_values += piece.length;
  }
}

// Gives `p` the keys of a sparse `part` that `server` owns, their values
// (rows of part.dim values of `width` bytes: `src`, null when the part
// carries none) and where their answers go.
void FillSparsePiece(const Part& part, const SparseSplit& split,
                     uint32_t server, const char* src, size_t width, Part* p,
                     std::vector<char>* values) {
  const uint64_t* keys = part.keys.data<uint64_t>();
  const size_t dim = part.dim;
  std::vector<uint32_t> idx = split.IndicesOf(server);
  std::vector<uint64_t> k;
  k.reserve(idx.size());
  for (uint32_t i : idx) {
    k.push_back(keys[i]);
    if (src != nullptr) {
      values->insert(values->end(), src + i * dim * width,
                     src + (i + 1) * dim * width);
    }
    if (part.expected_values > 0) {
      p->positions.push_back(part.positions.empty() ? i : part.positions[i]);
      p->expected_values += dim;
    }
  }
  p->h.set_num_keys(k.size());
  if (part.h.key_list_slot() != 0) SetKeyList(k, &p->h);
  p->keys = FrameFromVector(std::move(k));
}

// IoLoop::OnResponse's retries. A part a server refused without looking
// (its lease lapsed, or it was dropped): nothing was applied or recorded.
// Until the scheduler renews the lease or moves the slots it is tried
// again, routed by the newest view each time; bounded from the first
// refusal, since a reroutable part's own deadline moves with every
// routing. True when `part` is to be retried at part->retry_at.
bool RetryRefused(absl::Time now, const IoLoop::Options& options, Part* part) {
  if (part->refused_until == absl::InfinitePast()) {
    part->refused_until =
        now + std::max(options.request_timeout, options.failover_timeout);
  }
  const absl::Duration backoff =
      std::min(absl::Milliseconds(20) * (1 << std::min(part->refusals, 4)),
               absl::Milliseconds(200));
  part->retry_at = now + backoff;
  if (part->retry_at >= part->refused_until) return false;
  // A part sent again as it is (not routed again) keeps its deadline: it
  // is moved so that the retry has a request timeout of its own.
  part->deadline =
      std::max(part->deadline, part->retry_at + options.request_timeout);
  ++part->refusals;
  return true;
}

// A part the server applied nothing of (e.g. it has not received the
// cluster view yet): tried again with exponential backoff until its
// deadline. True when `part` is to be retried at part->retry_at.
bool RetryNotApplied(absl::Time now, Part* part) {
  const absl::Duration backoff =
      std::min(absl::Milliseconds(2) * (1 << std::min(part->attempts, 8)),
               absl::Milliseconds(200));
  part->retry_at = now + backoff;
  if (part->retry_at >= part->deadline) return false;
  ++part->attempts;
  return true;
}

}  // namespace

void SetKeyList(absl::Span<const uint64_t> keys, RequestHeader* h) {
  const uint64_t digest = KeyListDigest(keys);
  h->set_key_list_digest(digest);
  h->set_key_list_slot(KeyListSlotOf(digest));
}

absl::Status NonFiniteError(Op op, uint32_t table, absl::string_view outcome) {
  return absl::InvalidArgumentError(absl::StrCat(
      Op_Name(op), " to table ", table,
      " carries a value that is not finite (NaN or infinity); ", outcome));
}

void IoLoop::KeyMemo::Forget(uint32_t slot) {
  bytes -= static_cast<int64_t>(count[slot - 1] * sizeof(uint64_t));
  if (digest[slot - 1] != 0) slot_of.erase(digest[slot - 1]);
  digest[slot - 1] = 0;
  count[slot - 1] = 0;
}

uint32_t IoLoop::KeyMemo::LeastRecentlyUsed() const {
  uint32_t best = 1;
  for (uint32_t s = 2; s <= kKeyListSlots; ++s) {
    if (last_use[s - 1] < last_use[best - 1]) best = s;
  }
  return best;
}

IoLoop::IoLoop(std::shared_ptr<const Routing> routing, Options options,
               std::atomic<uint64_t>* next_request_id,
               std::atomic<uint64_t>* next_seq)
    : options_(std::move(options)),
      event_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      next_request_id_(next_request_id),
      next_seq_(next_seq),
      routing_(std::move(routing)) {
  thread_ = std::thread([this] { Run(); });
}

IoLoop::~IoLoop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  Wake();
  thread_.join();
  close(event_fd_);
}

void IoLoop::Enqueue(std::vector<std::unique_ptr<Part>> parts) {
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
void IoLoop::Abort(absl::Status why) {
  {
    absl::MutexLock lock(&mu_);
    if (abort_.has_value()) return;
    abort_ = std::move(why);
  }
  Wake();
}

void IoLoop::SetRouting(std::shared_ptr<const Routing> routing) {
  {
    absl::MutexLock lock(&mu_);
    new_routing_ = std::move(routing);
  }
  Wake();
}

KVClient::Stats IoLoop::stats() const {
  KVClient::Stats s;
  s.messages = messages_.load();
  s.bytes_sent = bytes_sent_.load();
  s.bytes_received = bytes_received_.load();
  return s;
}

void IoLoop::Wake() {
  const uint64_t one = 1;
  // A full counter (never in practice) still leaves the fd readable.
  (void)!write(event_fd_, &one, sizeof(one));
}

void IoLoop::Run() {
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
          n = zmq::recv_multipart(*dealers_[i - 1], std::back_inserter(frames),
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
void IoLoop::FailAll(const absl::Status& status) {
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
void IoLoop::OnMonitorEvent(uint32_t r) {
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
    std::memcpy(&value, static_cast<const char*>(frames[0].data()) + 2,
                sizeof(value));
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
        refusals_[r] =
            absl::StrCat("its handshakes fail (errno ", value,
                         "): CURVE on one side only, or other keys?");
      }
      continue;
    }
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      why = absl::StrCat(
          "the server refused this client's credentials (ZAP status ", value,
          value == 300 ? ": temporarily, e.g. max_connections" : "", ")");
    } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
      why = value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                ? std::string(
                      "security mechanism mismatch (CURVE on one side "
                      "only: check "
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

void IoLoop::ApplyRouting(const std::shared_ptr<const Routing>& routing) {
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
                           "server ", r, " changed from ", endpoints_[r],
                           " to ", want.empty() ? "(none)" : want)));
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
    if (options_.curve.has_value()) {
      if (absl::Status s = ApplyCurveClient(*socket, *options_.curve);
          !s.ok()) {
        Log()->error("server {} at {}: {}", r, want, s.message());
        continue;
      }
    }
    try {
      // Watched before connecting, so no refusal is missed.
      const std::string monitor = absl::StrCat(
          "inproc://ps-kv-client-", reinterpret_cast<uintptr_t>(this), "-", r,
          "-", ++monitor_serial_);
      if (zmq_socket_monitor(socket->handle(), monitor.c_str(),
                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                 ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                 ZMQ_EVENT_HANDSHAKE_SUCCEEDED) == 0) {
        monitors_[r] =
            std::make_unique<zmq::socket_t>(context_, zmq::socket_type::pair);
        monitors_[r]->set(zmq::sockopt::linger, 0);
        monitors_[r]->connect(monitor);
      }
      socket->connect(want);
    } catch (const zmq::error_t& e) {
      Log()->error("cannot connect to server {} at {}: {}", r, want, e.what());
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
void IoLoop::Route(std::unique_ptr<Part> part) {
  const absl::Time now = options_.clock->Now();
  std::vector<std::unique_ptr<Part>> pieces;
  const absl::Status split = Split(std::move(part), &pieces);
  if (!split.ok()) return;  // the part was completed with the error
  for (auto& piece : pieces) {
    const uint32_t r = piece->server;
    if (r >= dealers_.size() || dealers_[r] == nullptr) {
      if (piece->failover_deadline == absl::InfinitePast()) {
        piece->failover_deadline = now + options_.failover_timeout;
      }
      if (now >= piece->failover_deadline) {
        piece->parent->PartDone(absl::UnavailableError(absl::StrCat(
            "no live server owns the slots of request ", piece->request_id,
            " (server ", r, " is gone) after waiting ",
            absl::FormatDuration(options_.failover_timeout))));
        continue;
      }
      parked_.push_back(std::move(piece));
      continue;
    }
    piece->deadline = std::max(piece->deadline, now + options_.request_timeout);
    Send(std::move(piece));
  }
}

// Splits `part` by the current slot map into pieces, one per owning
// server, each with a fresh request id. A push whose fate is unknown
// (Part::fate_unknown) keeps its sequence number in every piece (every
// server sees at most one piece of it, and a server that applied it, or a
// backup it forwarded it to, recognises it). Any other push gets a fresh
// one per piece: nothing of it was applied anywhere, and a piece must not
// share its number with a sibling that another server applies, lest the
// sibling's record make a server that takes over the slots of the first
// (a live move's flip, a failover) take the first for a duplicate. The
// owners come from the same router functions that split the request when
// it was built. On a malformed part completes it with an error and
// returns that error.
absl::Status IoLoop::Split(std::unique_ptr<Part> part,
                           std::vector<std::unique_ptr<Part>>* pieces) {
  const Routing& routing = *routing_;
  RequestHeader& h = part->h;
  if (routing.slot_owner.empty()) {
    pieces->push_back(std::move(part));
    return absl::OkStatus();
  }
  const absl::Span<const uint32_t> slot_owner(routing.slot_owner);
  const bool dense = h.segments_size() > 0;
  const uint64_t* keys = part->keys.data<uint64_t>();
  const size_t num_keys = dense ? 0 : part->keys.size() / sizeof(uint64_t);
  SparseSplit sparse;
  DenseSplit by_block;
  std::vector<uint32_t> distinct;
  if (dense) {
    std::vector<DenseRange> ranges;
    ranges.reserve(h.segments_size());
    for (const DenseSegment& seg : h.segments())
      ranges.push_back({seg.begin(), seg.length()});
    by_block = SplitDense(slot_owner, routing.num_servers, h.table_id(),
                          part->block_size, ranges);
    distinct = by_block.Servers();
  } else {
    sparse = SplitSparse(slot_owner, routing.sole_owner, routing.num_servers,
                         h.table_id(), absl::MakeConstSpan(keys, num_keys));
    distinct = sparse.Servers();
  }
  if (distinct.size() > 1 && part->values_unchecked &&
      !AllFinite(absl::MakeConstSpan(part->values.data<float>(),
                                     part->values.size() / sizeof(float)))) {
    // Several servers would each check only their share: one could apply
    // its share of a push another rejects.
    const absl::Status bad =
        NonFiniteError(h.op(), h.table_id(), "nothing was applied");
    part->parent->PartDone(bad);
    return bad;
  }
  const bool fresh_seq =
      next_seq_ != nullptr && !part->fate_unknown &&
      (h.op() == PUSH || h.op() == PUSH_PULL || h.op() == ASSIGN);
  auto finish = [&](Part* p, uint32_t server) {
    p->server = server;
    p->request_id = next_request_id_->fetch_add(1, std::memory_order_relaxed);
    p->h.set_request_id(p->request_id);
    if (fresh_seq) {
      p->h.set_seq(next_seq_->fetch_add(1, std::memory_order_relaxed));
    }
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
  // Values are moved as bytes: they may be half-width on the wire.
  const size_t width = EncodedValueBytes(h.push_values());
  const char* src = part->has_values ? part->values.data<char>() : nullptr;
  for (uint32_t server : distinct) {
    std::unique_ptr<Part> p = NewPiece(*part);
    std::vector<char> values;
    if (dense) {
      FillDensePiece(*part, by_block, server, src, width, p.get(), &values);
    } else {
      FillSparsePiece(*part, sparse, server, src, width, p.get(), &values);
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
void IoLoop::TakeOverPendingFor(uint32_t server, const absl::Status& status) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second->server != server) {
      ++it;
      continue;
    }
    std::unique_ptr<Part> part = std::move(it->second);
    pending_.erase(it++);
    if (part->reroutable) {
      part->fate_unknown = true;  // sent, never answered
      moved_.push_back(std::move(part));
    } else if (part->scan == nullptr && part->h.op() == ADVANCE_CLOCK) {
      part->parent->PartDone(absl::OkStatus());
    } else {
      part->parent->PartDone(status);
    }
  }
}

void IoLoop::Send(std::unique_ptr<Part> part) {
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
    part->parent->PartDone(absl::UnavailableError(
        absl::StrCat("server ", r, " changed from ", part->scan->endpoint,
                     " to ", endpoints_[r], " during the scan; scan again")));
    return;
  }
  const bool send_keys = KeysNeeded(*part);
  const uint64_t bytes = part->header.size() +
                         (send_keys ? part->keys.size() : 0) +
                         part->values.size();
  try {
    // Sending consumes a frame; copies share the payload (reference
    // counted), and the originals stay for a retry.
    zmq::socket_t& s = *dealers_[r];
    zmq::message_t header, keys, values;
    header.copy(part->header);
    if (send_keys) keys.copy(part->keys);
    s.send(header, zmq::send_flags::sndmore);
    s.send(keys,
           part->has_values ? zmq::send_flags::sndmore : zmq::send_flags::none);
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
bool IoLoop::KeysNeeded(Part& part) {
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
  if (memo.bytes + bytes > options_.key_cache_bytes) {
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

void IoLoop::OnResponse(uint32_t server, std::vector<zmq::message_t>& frames) {
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
  const bool unavailable = response.header.code() ==
                           static_cast<int>(absl::StatusCode::kUnavailable);
  // An UNAVAILABLE that does not say nothing was applied may follow an
  // update the server applied (and forwarded to a backup).
  if (unavailable && response.header.refusal() == REFUSAL_NONE &&
      !response.header.not_applied() && !response.header.wrong_owner()) {
    part->fate_unknown = true;
  }
  if (unavailable && response.header.refusal() != REFUSAL_NONE &&
      RetryRefused(options_.clock->Now(), options_, part.get())) {
    retries_.push_back(std::move(part));
    return;
  }
  const bool misrouted = part->reroutable && response.header.wrong_owner();
  if (((unavailable && response.header.refusal() == REFUSAL_NONE) ||
       misrouted) &&
      RetryNotApplied(options_.clock->Now(), part.get())) {
    retries_.push_back(std::move(part));
    return;
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
void IoLoop::OnScanPage(std::unique_ptr<Part> part,
                        const DecodedResponse& response) {
  ScanChain& chain = *part->scan;
  const uint64_t next = response.header.next_cursor();
  if (response.values.size() != response.keys.size() * chain.dim) {
    part->parent->PartDone(absl::DataLossError(
        absl::StrCat("server ", part->server, " answered a scan page of ",
                     response.keys.size(), " keys with ",
                     response.values.size(), " values (dim ", chain.dim, ")")));
    return;
  }
  // Cursors only grow, which also guarantees that the scan ends.
  if (next != 0 && next <= chain.cursor) {
    part->parent->PartDone(absl::DataLossError(absl::StrCat(
        "server ", part->server, " did not advance the scan cursor (",
        chain.cursor, " -> ", next, ")")));
    return;
  }
  chain.keys->insert(chain.keys->end(), response.keys.begin(),
                     response.keys.end());
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
void IoLoop::KeepFrame(DenseValues* out, DecodedResponse& response,
                       std::vector<zmq::message_t>& frames) {
  if (!response.value_copy.empty() || frames.size() < 2 ||
      response.values.data() != frames[1].data()) {
    out->Own(
        response.value_copy.empty()
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

void IoLoop::Scatter(const Part& part, absl::Span<const float> values) {
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
      std::memcpy(part.out + static_cast<size_t>(part.positions[i]) * part.dim,
                  values.data() + i * part.dim, row);
    }
  }
}

void IoLoop::ResendDue() {
  if (retries_.empty()) return;
  const absl::Time now = options_.clock->Now();
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

void IoLoop::ExpireDeadlines() {
  const absl::Time now = options_.clock->Now();
  for (auto it = parked_.begin(); it != parked_.end();) {
    if ((*it)->failover_deadline <= now) {
      (*it)->parent->PartDone(absl::UnavailableError(
          absl::StrCat("no live server took over server ", (*it)->server,
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
          r < refusals_.size() && !refusals_[r].empty()
              ? absl::StrCat(" (", refusals_[r], ")")
          : options_.curve.has_value()
              ? std::string(
                    " (CURVE: a server that refuses this job's key "
                    "pair never answers; see its log)")
              : std::string();
      it->second->parent->PartDone(absl::DeadlineExceededError(
          absl::StrCat("server ", r, " did not answer request ", it->first,
                       " in time", refused)));
      pending_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace kv_internal
}  // namespace ps
