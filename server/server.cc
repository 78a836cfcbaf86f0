#include "server/server.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/protocol.h"
#include "common/status.h"
#include "common/value_codec.h"
#include "common/wire.h"
#include "server/checkpoint.h"
#include "zmq_addon.hpp"

namespace ps {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger = new std::shared_ptr<spdlog::logger>(GetLogger("server"));
  return *logger;
}

// Poll period of the serving loop; bounds how long Stop() waits and how
// late a new view takes effect.
constexpr std::chrono::milliseconds kPollPeriod{50};
// Data-plane handshakes must complete within this (see Start).
constexpr int kHandshakeTimeoutMs = 3000;

// A pull answers with n floats; refuse before allocating what no frame may
// carry anyway.
absl::Status CheckResponseSize(uint64_t n) {
  if (n > static_cast<uint64_t>(kMaxMessageBytes) / sizeof(float)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request addresses ", n, " values; the limit per message is ",
        kMaxMessageBytes / sizeof(float)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KVServer>> KVServer::Start(Options options) {
  std::unique_ptr<KVServer> server(new KVServer(std::move(options)));
  for (const TableConfig& tc : server->options_.config.tables()) {
    auto table = Table::Create(tc);
    if (!table.ok()) return table.status();
    server->tables_[tc.id()] = std::move(table).value();
  }
  try {
    const DataPlaneLimits& limits = server->limits_;
    server->socket_ = zmq::socket_t(server->context_, zmq::socket_type::router);
    // A frame over the limit makes ZeroMQ drop the connection as soon as
    // the frame's size is read: nothing of it is buffered.
    server->socket_.set(zmq::sockopt::maxmsgsize, limits.max_message_bytes());
    server->socket_.set(zmq::sockopt::rcvhwm, static_cast<int>(limits.receive_queue_messages()));
    server->socket_.set(zmq::sockopt::linger, 0);
    // A connection that has not finished its handshake within this is
    // dropped: idle or stalled peers cannot hold connection places for
    // libzmq's default 30 s, and a peer the gate told to wait (max_connections)
    // is dropped and reconnects within it.
    server->socket_.set(zmq::sockopt::handshake_ivl, static_cast<int>(kHandshakeTimeoutMs));
    // The gate (ZAP handler) must be bound before the first handshake.
    PeerGate::Options gate;
    gate.curve = server->options_.curve;
    gate.max_connections = limits.max_connections();
    gate.metrics = server->options_.metrics;
    auto started = PeerGate::Start(server->context_, server->socket_, std::move(gate));
    if (!started.ok()) return started.status();
    server->gate_ = std::move(started).value();
    if (server->options_.curve.has_value()) {
      PS_RETURN_IF_ERROR(ApplyCurveServer(server->socket_, *server->options_.curve));
    }
    server->socket_.bind(server->options_.bind_endpoint);
    server->endpoint_ = server->socket_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot bind ", server->options_.bind_endpoint, ": ", e.what()));
  }
  const size_t colon = server->endpoint_.rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(server->endpoint_.substr(colon + 1), &server->port_)) {
    return absl::InternalError(
        absl::StrCat("cannot parse bound endpoint ", server->endpoint_));
  }
  server->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (server->wake_fd_ < 0) {
    return absl::InternalError("cannot create the serving thread's wake-up eventfd");
  }
  if (server->options_.standalone) {
    auto own = std::make_shared<Ownership>();
    own->all = true;
    own->consistency = server->options_.config.consistency();
    absl::MutexLock lock(&server->view_mu_);
    server->ownership_ = std::move(own);
  }
  if (server->options_.metrics != nullptr) server->RegisterMetrics(server->options_.metrics);
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  Log()->info("serving {} tables on {}{}", server->tables_.size(),
              server->endpoint_, server->options_.curve.has_value() ? " (CURVE)" : "");
  return server;
}

KVServer::KVServer(Options options)
    : options_(std::move(options)),
      consistency_(options_.config.consistency()),
      key_cache_(options_.config.data_plane().key_cache_bytes()),
      replicated_(!options_.standalone &&
                  options_.config.cluster().replication() >= 2),
      ownership_(std::make_shared<Ownership>()) {
  limits_ = LimitsWithDefaults(options_.config.data_plane().limits());
}

KVServer::~KVServer() {
  UnregisterMetrics();
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

std::vector<const Table*> KVServer::StoppedTables() const {
  std::vector<const Table*> tables;
  if (!stopped_.load()) return tables;
  for (const auto& [id, table] : tables_) tables.push_back(table.get());
  std::sort(tables.begin(), tables.end(),
            [](const Table* a, const Table* b) { return a->id() < b->id(); });
  return tables;
}

void KVServer::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void KVServer::UpdateView(const ClusterView& view, uint32_t rank) {
  auto own = std::make_shared<Ownership>();
  own->rank = rank;
  own->epoch = view.epoch();
  own->has_view = true;
  if (view.job_state() != STARTING) {
    own->slot_owner.assign(view.slot_owner().begin(), view.slot_owner().end());
    own->owns_every_slot =
        !own->slot_owner.empty() &&
        std::all_of(own->slot_owner.begin(), own->slot_owner.end(),
                    [rank](uint32_t owner) { return owner == rank; });
  }
  for (const NodeInfo& n : view.nodes()) {
    if (n.role() == WORKER && n.state() == ALIVE) {
      own->live_workers.push_back({n.node_id(), n.rank(), n.start_clock()});
      own->worker_rank[n.node_id()] = n.rank();
    }
  }
  own->consistency = view.has_consistency() ? view.consistency()
                                            : options_.config.consistency();
  own->checkpoint_clock = view.checkpoint_clock();
  own->restore = view.restore();
  if (replicated_) {
    own->replicated = true;
    const size_t num_slots = own->slot_owner.size();
    if (static_cast<size_t>(view.slot_backup_size()) == num_slots) {
      own->slot_backup.assign(view.slot_backup().begin(), view.slot_backup().end());
    } else {
      own->slot_backup.assign(num_slots, replication::kNoBackup);
    }
    for (const NodeInfo& n : view.nodes()) {
      if (n.role() != SERVER || n.state() != ALIVE) continue;
      if (own->server_node.size() <= n.rank()) {
        own->server_node.resize(n.rank() + 1, 0);
        own->server_endpoint.resize(n.rank() + 1);
      }
      own->server_node[n.rank()] = n.node_id();
      own->server_endpoint[n.rank()] = n.data_endpoint();
      // This server is the live one at its rank whose endpoint has its
      // port (the host may be advertised differently); a server declared
      // dead whose rank went to a replacement is not.
      const std::string& e = n.data_endpoint();
      const size_t colon = e.rfind(':');
      int port = 0;
      if (n.rank() == rank && colon != std::string::npos &&
          absl::SimpleAtoi(e.substr(colon + 1), &port) && port == port_) {
        own->node_id = n.node_id();
      }
    }
  }
  {
    absl::MutexLock lock(&view_mu_);
    if (ownership_->all) return;  // standalone servers ignore views
    ownership_ = std::move(own);
  }
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

void KVServer::SetLease(std::chrono::steady_clock::time_point until) {
  int64_t ticks = until.time_since_epoch().count();
  // kNoLease means "not enforced"; a lease that far away is the same.
  if (ticks == kNoLease) --ticks;
  lease_until_.store(ticks, std::memory_order_release);
}

void KVServer::Fence(std::string why) {
  {
    absl::MutexLock lock(&fence_mu_);
    if (fenced_.load()) return;
    fence_why_ = std::move(why);
    Log()->warn("fenced: {}; refusing every request from now on", fence_why_);
  }
  fenced_.store(true, std::memory_order_release);
}

absl::Status KVServer::CheckServing(const Ownership& own, ServerRefusal* refusal) {
  absl::Status refused;
  if (fenced_.load(std::memory_order_acquire)) {
    fenced_refusals_.fetch_add(1, std::memory_order_relaxed);
    *refusal = NOT_MEMBER;
    std::string why;
    {
      absl::MutexLock lock(&fence_mu_);
      why = fence_why_;
    }
    refused = absl::UnavailableError(absl::StrCat(
        "server ", own.rank, " is no longer a member of the job (", why,
        "): refresh the cluster view and retry with the slots' new owner"));
  } else {
    const int64_t until = lease_until_.load(std::memory_order_acquire);
    if (until == kNoLease) return absl::OkStatus();
    using SteadyClock = std::chrono::steady_clock;
    const SteadyClock::time_point now = SteadyClock::now();
    const SteadyClock::time_point end{SteadyClock::duration(until)};
    if (now < end) {
      if (refusing_ != 0) {
        Log()->info("lease renewed: serving again after refusing {} requests", refusing_);
        refusing_ = 0;
      }
      return absl::OkStatus();
    }
    lease_refusals_.fetch_add(1, std::memory_order_relaxed);
    *refusal = LEASE_LAPSED;
    refused = absl::UnavailableError(absl::StrCat(
        "server ", own.rank, "'s lease lapsed ",
        std::chrono::duration_cast<std::chrono::milliseconds>(now - end).count(),
        "ms ago: it has not reached the scheduler; retry"));
  }
  if (refusing_++ == 0) Log()->warn("refusing requests: {}", refused.message());
  return refused;
}

void KVServer::SendRefusal(zmq::message_t& identity, const zmq::message_t& header,
                           const absl::Status& status, ServerRefusal refusal,
                           uint64_t epoch) {
  // The request id is all that is read of the request: its answer must
  // find its way back, and nothing else of it matters.
  RequestHeader h;
  ResponseHeader rh;
  if (h.ParseFromArray(header.data(), static_cast<int>(header.size()))) {
    rh.set_request_id(h.request_id());
  }
  rh.set_epoch(epoch);
  rh.set_code(static_cast<int32_t>(status.code()));
  rh.set_message(std::string(status.message()));
  rh.set_refusal(refusal);
  zmq::message_t values, keys;
  Send(identity, rh, values, keys);
}

KVServer::Stats KVServer::stats() const {
  Stats s;
  s.requests = requests_.load();
  s.errors = errors_.load();
  s.keys_pushed = keys_pushed_.load();
  s.keys_pulled = keys_pulled_.load();
  s.pulls_deferred = pulls_deferred_.load();
  s.bsp_steps_applied = bsp_steps_.load();
  s.duplicate_pushes = duplicates_.load();
  s.checkpoints_written = checkpoints_.load();
  s.rows_restored = rows_restored_.load();
  s.forwards = forwards_.load();
  s.replica_messages = replica_messages_.load();
  s.catchups_sent = catchups_.load();
  s.rows_copied = rows_copied_.load();
  s.slots_promoted = slots_promoted_.load();
  s.unreplicated_pushes = unreplicated_.load();
  s.auth_refusals = gate_ ? gate_->auth_refusals() : 0;
  s.connection_refusals = gate_ ? gate_->connection_refusals() : 0;
  s.open_connections = gate_ ? gate_->open_connections() : 0;
  s.limit_refusals = limit_refusals_.load();
  s.unknown_sender_refusals = sender_refusals_.load();
  s.nonfinite_values = nonfinite_values_.load();
  s.nonfinite_pushes_rejected = nonfinite_rejected_.load();
  s.held_bytes = held_bytes_.load();
  s.lease_refusals = lease_refusals_.load();
  s.fenced_refusals = fenced_refusals_.load();
  return s;
}

void KVServer::ApplyView(const Ownership& own) {
  if (!own.has_view) return;
  if (!restored_ && !own.slot_owner.empty()) Restore(own);
  consistency_.SetLiveWorkers(own.live_workers);
  // Sequence windows of senders that are gone: their retries cannot come.
  auto forget_gone = [&](absl::flat_hash_map<uint64_t, SeqWindow>& windows) {
    absl::flat_hash_set<uint64_t> live;
    for (const auto& w : own.live_workers) live.insert(w.node_id);
    for (auto it = windows.begin(); it != windows.end();) {
      if (!live.contains(it->first)) {
        windows.erase(it++);
      } else {
        ++it;
      }
    }
  };
  if (!seqs_.empty()) forget_gone(seqs_);
  {
    absl::flat_hash_set<uint64_t> live;
    for (const auto& w : own.live_workers) live.insert(w.node_id);
    key_cache_.Retain(live);
  }
  if (own.replicated && !own.slot_owner.empty()) {
    // A message from the old primary of a slot may still be on its way
    // when the view promoting this server arrives: it is refused (its
    // worker's retry comes here). Promotion first, so the catch-ups of the
    // promoted slots to their new backups include what was promoted.
    if (last_applied_ != nullptr) Promote(*last_applied_, own);
    DropDeadPrimaries(own);
    for (auto& [node, windows] : replica_seqs_) forget_gone(windows);
  }
  const ConsistencyMode before = consistency_.mode();
  const uint32_t staleness_before = consistency_.config().staleness();
  if (consistency_.SetMode(own.consistency)) FlushBuffers();
  if (consistency_.mode() != before ||
      consistency_.config().staleness() != staleness_before) {
    Log()->info("consistency is now {}{} (epoch {})",
                ConsistencyMode_Name(consistency_.mode()),
                consistency_.mode() == SSP
                    ? absl::StrCat(" staleness ", consistency_.config().staleness())
                : consistency_.mode() == BSP
                    ? absl::StrCat(", aggregating from step ", consistency_.applied_clock())
                    : "",
                own.epoch);
  }
  NoteCheckpointClock(own);
  if (own.replicated && !own.slot_owner.empty()) {
    SyncBackups(own);
    ReleaseReplicas(own);
  }
  if (checkpoint_pending_ == 0 && !held_.empty()) ReleaseHeld(own);
}

void KVServer::Serve() {
  std::vector<zmq::message_t> frames;
  std::shared_ptr<const Ownership> applied;
  // The newest view, applied if it changed. Read after every poll so a view
  // installed while polling already governs the messages that woke it.
  auto current_view = [&]() -> std::shared_ptr<const Ownership> {
    std::shared_ptr<const Ownership> own;
    {
      absl::MutexLock lock(&view_mu_);
      own = ownership_;
    }
    if (own != applied) {
      ApplyView(*own);
      applied = own;
      last_applied_ = own;
      Progress(*own);
    }
    return own;
  };
  // Start the tables' clocks (TTL in seconds counts from here).
  AdvanceTables();
  std::vector<zmq::pollitem_t> items;
  std::vector<uint64_t> item_links;  // node id of the link polled at items[2 + i]
  while (!stop_.load(std::memory_order_relaxed)) {
    items.clear();
    item_links.clear();
    items.push_back({socket_.handle(), 0, ZMQ_POLLIN, 0});
    items.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
    for (auto& [node, link] : links_) {
      items.push_back({link->socket().handle(), 0, ZMQ_POLLIN, 0});
      item_links.push_back(node);
    }
    try {
      zmq::poll(items.data(), items.size(), kPollPeriod);
      if (items[1].revents & ZMQ_POLLIN) {
        uint64_t count;
        (void)!read(wake_fd_, &count, sizeof(count));
      }
      const bool readable = (items[0].revents & ZMQ_POLLIN) != 0;
      std::shared_ptr<const Ownership> own = current_view();
      // Backups' answers first: they release answers to workers. A link
      // the view just dropped is gone from links_ (its socket with it).
      for (size_t i = 0; i < item_links.size(); ++i) {
        if (!(items[2 + i].revents & ZMQ_POLLIN)) continue;
        while (true) {
          auto link = links_.find(item_links[i]);
          if (link == links_.end()) break;
          frames.clear();
          auto n = zmq::recv_multipart(link->second->socket(),
                                       std::back_inserter(frames),
                                       zmq::recv_flags::dontwait);
          if (!n) break;
          OnBackupAnswer(item_links[i], frames);
        }
      }
      if (own->replicated) MaybeResync(*own);
      if (readable) {
        // Drain everything queued before polling again.
        while (!stop_.load(std::memory_order_relaxed)) {
          frames.clear();
          auto n = zmq::recv_multipart(socket_, std::back_inserter(frames),
                                       zmq::recv_flags::dontwait);
          if (!n) break;
          if (frames.empty()) continue;
          // frames[0] is the peer identity added by the ROUTER socket.
          zmq::message_t identity = std::move(frames[0]);
          frames.erase(frames.begin());
          HandleMessage(std::move(identity), std::move(frames), *own);
          frames = std::vector<zmq::message_t>();
        }
        Progress(*own);
      }
      AdvanceTables();
      Watchdog();
      if (absl::Now() - last_stats_publish_ >= kStatsPeriod) PublishTableStats();
    } catch (const zmq::error_t& e) {
      // A send to a vanished peer or an interrupted poll must not take the
      // server down; log and keep serving.
      Log()->warn("data plane: {}", e.what());
    }
  }
  PublishTableStats();
  if (replicated_) {
    Log()->info(
        "replication: {} updates forwarded to backups, {} replica messages applied "
        "as a backup, {} catch-ups sent ({} rows and blocks), {} slots taken over, "
        "{} duplicate pushes answered, {} pushes without a backup copy",
        forwards_.load(), replica_messages_.load(), catchups_.load(), rows_copied_.load(),
        slots_promoted_.load(), duplicates_.load(), unreplicated_.load());
  }
  stopped_.store(true);
}

void KVServer::PublishTableStats() {
  ResponseHeader rh;
  FillStats(&rh);
  std::vector<TableStats> stats(rh.table_stats().begin(), rh.table_stats().end());
  last_stats_publish_ = absl::Now();
  absl::MutexLock lock(&stats_mu_);
  table_stats_ = std::move(stats);
}

std::vector<TableStats> KVServer::table_stats() const {
  absl::MutexLock lock(&stats_mu_);
  return table_stats_;
}

void KVServer::Send(zmq::message_t& identity, const ResponseHeader& rh,
                    zmq::message_t& values, zmq::message_t& keys) {
  // header, [values, [keys]]: a keys frame needs the values frame before
  // it, even if empty.
  const bool has_keys = keys.size() > 0;
  const bool has_values = has_keys || values.size() > 0;
  socket_.send(identity, zmq::send_flags::sndmore);
  socket_.send(SerializeToFrame(rh),
               has_values ? zmq::send_flags::sndmore : zmq::send_flags::none);
  if (has_values) {
    socket_.send(values, has_keys ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  if (has_keys) socket_.send(keys, zmq::send_flags::none);
}

void KVServer::HandleMessage(zmq::message_t identity,
                             std::vector<zmq::message_t> frames,
                             const Ownership& own) {
  if (replicated_) {
    RequestHeader header;
    if (replication::IsReplica(frames, &header)) {
      HandleReplica(std::move(identity), std::move(frames), header, own);
      return;
    }
    needs_.clear();
    first_promoted_ = false;
  }
  // Checked when the request is taken up, not when it arrived: what queued
  // while the process was paused is refused once it resumes with a lapsed
  // lease. Nothing of the request is looked at before (no clock, no key
  // list, no sequence number).
  ServerRefusal refusal = REFUSAL_NONE;
  if (absl::Status serving = CheckServing(own, &refusal); !serving.ok()) {
    static const zmq::message_t kEmpty;
    SendRefusal(identity, frames.empty() ? kEmpty : frames[0], serving, refusal, own.epoch);
    return;
  }
  requests_.fetch_add(1, std::memory_order_relaxed);
  ResponseHeader rh;
  zmq::message_t values, keys;
  const Outcome outcome = Process(frames, own, &rh, &values, &keys);
  if (outcome == Outcome::kHold) {
    const uint64_t bytes = FramesBytes(frames);
    held_bytes_ += bytes;
    held_.push_back({std::move(identity), std::move(frames), 0, bytes});
    return;
  }
  if (outcome == Outcome::kDefer) {
    RequestHeader h;
    h.ParseFromArray(frames[0].data(), static_cast<int>(frames[0].size()));
    pulls_deferred_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t bytes = FramesBytes(frames);
    held_bytes_ += bytes;
    deferred_.push_back({std::move(identity), std::move(frames), h.clock(),
                         h.sender_rank(), absl::Now(), std::move(needs_), bytes});
    needs_.clear();
    return;
  }
  if (!replicated_) {
    Send(identity, rh, values, keys);
    return;
  }
  Answer(identity, rh, values, keys, std::move(needs_), first_promoted_);
  needs_.clear();
}

void KVServer::Answer(zmq::message_t& identity, ResponseHeader& rh,
                      zmq::message_t& values, zmq::message_t& keys,
                      std::vector<Need> needs, bool first_promoted) {
  std::vector<Need> open;
  bool gone = false;
  for (const Need& need : needs) {
    auto link = links_.find(need.first);
    if (link == links_.end()) {
      gone = true;
    } else if (link->second->acked() < need.second) {
      open.push_back(need);
    }
  }
  if (gone && rh.code() == 0) {
    // A backup this answer waited for went away meanwhile (a deferred
    // pull's push half): the update is held by the current backups once
    // they have taken everything sent to them, catch-ups included.
    if (last_applied_ == nullptr || last_applied_->node_id == 0) {
      NotAcknowledged(&rh, &values, &keys, "this server is no longer a live member");
    } else {
      for (const auto& [node, link] : links_) {
        if (!link->all_acked()) open.emplace_back(node, link->last_sent());
      }
    }
  }
  if (open.empty() || rh.code() != 0) {
    Send(identity, rh, values, keys);
    if (first_promoted && rh.code() == 0) LogFirstPromotedServed();
    return;
  }
  const uint64_t id = next_wait_++;
  Wait& w = waits_[id];
  w.identity = std::move(identity);
  w.rh = rh;
  w.values = std::move(values);
  w.keys = std::move(keys);
  w.remaining = static_cast<int>(open.size());
  w.first_promoted = first_promoted;
  for (const Need& need : open) links_[need.first]->waiters().emplace(need.second, id);
}

void KVServer::NotAcknowledged(ResponseHeader* rh, zmq::message_t* values,
                               zmq::message_t* keys, const std::string& why) {
  // Applied here, perhaps, but not held by a backup: the worker sends it
  // again with the same sequence number, and whoever owns its slots then
  // applies it or answers it as a duplicate.
  rh->set_code(static_cast<int32_t>(absl::StatusCode::kUnavailable));
  rh->set_message(absl::StrCat(why, "; not acknowledged, send again"));
  rh->set_num_values(0);
  rh->set_num_keys(0);
  rh->set_duplicate(false);
  *values = zmq::message_t();
  *keys = zmq::message_t();
}

void KVServer::LogFirstPromotedServed() {
  if (!awaiting_first_promoted_) return;
  awaiting_first_promoted_ = false;
  const absl::Time now = absl::Now();
  Log()->info(
      "failover: first request for the slots promoted at epoch {} answered "
      "{:.1f} ms after that view was applied (unix_us={})",
      promoted_epoch_, absl::ToDoubleMilliseconds(now - promoted_at_),
      absl::ToUnixMicros(now));
}

KVServer::Outcome KVServer::Process(std::vector<zmq::message_t>& frames,
                                    const Ownership& own, ResponseHeader* rh,
                                    zmq::message_t* values, zmq::message_t* keys) {
  rh->set_epoch(own.epoch);
  Outcome outcome = Outcome::kAnswer;
  absl::Status status;
  // Counted per request, never per key: two clock reads and a few adds.
  ServerInstruments::TimePoint start;
  uint64_t bytes_in = 0;
  if (instruments_ != nullptr) {
    start = ServerInstruments::Now();
    for (const zmq::message_t& f : frames) bytes_in += f.size();
  }
  request_op_ = 0;
  try {
    status = ProcessChecked(frames, own, rh, values, keys, &outcome);
  } catch (const std::bad_alloc&) {
    // Validation already refuses oversized requests; this is the machine
    // running out of memory. The request fails, the server keeps serving.
    status = absl::ResourceExhaustedError("server out of memory for this request");
  }
  if (!status.ok()) {
    errors_.fetch_add(1, std::memory_order_relaxed);
    rh->set_code(static_cast<int32_t>(status.code()));
    rh->set_message(std::string(status.message()));
    rh->set_num_values(0);
    rh->set_num_keys(0);
    rh->set_next_cursor(0);
    *values = zmq::message_t();
    *keys = zmq::message_t();
    Log()->debug("request {} rejected: {}", rh->request_id(), status.ToString());
    if (instruments_ != nullptr) {
      instruments_->RecordError(ServerInstruments::Classify(status, *rh));
      instruments_->Record(request_op_, ServerInstruments::Outcome::kError, bytes_in, 0,
                           start);
    }
    return Outcome::kAnswer;
  }
  if (instruments_ != nullptr) {
    instruments_->Record(request_op_,
                         outcome == Outcome::kDefer  ? ServerInstruments::Outcome::kDeferred
                         : outcome == Outcome::kHold ? ServerInstruments::Outcome::kHeld
                                                     : ServerInstruments::Outcome::kOk,
                         bytes_in, values->size() + keys->size(), start);
  }
  return outcome;
}

absl::Status KVServer::ProcessChecked(std::vector<zmq::message_t>& frames,
                                      const Ownership& own, ResponseHeader* rh,
                                      zmq::message_t* values, zmq::message_t* keys,
                                      Outcome* outcome) {
  DecodedRequest req;
  absl::Status status = DecodeRequest(frames, &req);
  rh->set_request_id(req.header.request_id());
  if (!status.ok()) return status;
  const RequestHeader& h = req.header;
  request_op_ = h.op();

  if (h.replica()) {
    return absl::InvalidArgumentError(
        "replica messages are for servers of a job with cluster.replication 2");
  }
  PS_RETURN_IF_ERROR(AdmitRequest(frames, h, own));
  // The cached key list the request uses or stores, if any.
  KeyListCache::List* key_list = nullptr;
  if (h.key_list_slot() != 0) {
    // Before any other check, so this server's record of the sender's
    // slots follows the sender's even when the request fails later.
    if (req.keys_cached) {
      key_list = key_cache_.Find(h.sender_node_id(), h.key_list_slot(), h.key_list_digest(),
                                 h.num_keys());
      if (key_list == nullptr) {
        rh->set_key_list_unknown(true);
        return absl::FailedPreconditionError(absl::StrCat(
            "key list slot ", h.key_list_slot(), " of node ", h.sender_node_id(),
            " does not hold the list named; send the keys"));
      }
      req.keys = absl::MakeConstSpan(key_list->keys);
    } else {
      PS_RETURN_IF_ERROR(key_cache_.Store(h.sender_node_id(), h.key_list_slot(),
                                          h.key_list_digest(), req.keys));
      key_list = key_cache_.Stored(h.sender_node_id(), h.key_list_slot());
    }
  }
  // Requests that are kept (held, deferred) or forwarded to backups carry
  // their keys and float32 values in their own frames: a cached list may
  // be replaced meanwhile, and backups take float32 only.
  // A kept request must also not name its slot any more: processed again,
  // it would store its list a second time, over what the sender may have
  // put in that slot since.
  bool self_contained = h.key_list_slot() == 0 && EncodedValueBytes(h.push_values()) == 4;
  auto make_self_contained = [&] {
    if (self_contained) return;
    self_contained = true;
    RequestHeader plain = h;
    plain.clear_key_list_slot();
    plain.clear_key_list_digest();
    plain.clear_push_values();
    frames[0] = SerializeToFrame(plain);
    if (req.keys_cached) {
      frames[1] = zmq::message_t(req.keys.data(), req.keys.size() * sizeof(uint64_t));
    }
    if (frames.size() == 3 && !req.value_copy.empty()) {
      frames[2] = zmq::message_t(req.values.data(), req.values.size() * sizeof(float));
    }
  };
  if (h.op() == STATS) {
    if (!req.keys.empty()) return absl::InvalidArgumentError("STATS carries no keys");
    FillStats(rh, own.replicated && !own.slot_owner.empty() ? &own : nullptr);
    return absl::OkStatus();
  }
  // Tools (node 0) do not move the server's clock: only workers' steps do.
  if (own.all || h.sender_node_id() != 0) NoteClock(h.clock());
  if (h.op() == ADVANCE_CLOCK) {
    if (!req.keys.empty()) {
      return absl::InvalidArgumentError("ADVANCE_CLOCK carries no keys");
    }
    if (h.restart()) {
      consistency_.Restart(h.sender_node_id(), h.clock());
    } else {
      consistency_.Advance(h.sender_node_id(), h.clock());
    }
    return absl::OkStatus();
  }
  // Any request at clock c tells that its sender completed c steps, and
  // its pushes of those steps to this server arrived before it (messages of
  // one sender to one server keep their order). A server that replaced a
  // dead one learns live workers' clocks this way without waiting for
  // their next ADVANCE_CLOCK.
  if (h.clock() < kFinishedClock && h.sender_node_id() != 0) {
    consistency_.Advance(h.sender_node_id(), h.clock());
  }
  if (h.op() == SCAN) {
    auto it = tables_.find(h.table_id());
    if (it == tables_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown table ", h.table_id()));
    }
    const SparseTable* sparse = it->second->AsSparse();
    if (sparse == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", h.table_id(), " is dense; SCAN reads sparse tables (read "
          "dense ones with PULL)"));
    }
    // Held like a pull, so an export sees every step the sender's clock
    // covers; Progress() runs the request again once it may be answered.
    if (!PullAllowed(h.clock())) {
      PS_RETURN_IF_ERROR(RoomToHold(frames, "requests wait for slower workers"));
      *outcome = Outcome::kDefer;
      return absl::OkStatus();
    }
    Scan(*sparse, h, rh, values, keys);
    if (own.replicated && !own.slot_owner.empty() && rh->num_keys() > 0) {
      // Backup copies of other servers' slots stay out of an export.
      const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
      const uint32_t dim = sparse->dim();
      const uint64_t* k = keys->data<uint64_t>();
      const float* v = values->data<float>();
      std::vector<uint64_t> kept_keys;
      std::vector<float> kept_values;
      for (uint64_t i = 0; i < rh->num_keys(); ++i) {
        if (own.slot_owner[SparseSlot(h.table_id(), k[i], num_slots)] != own.rank) continue;
        kept_keys.push_back(k[i]);
        kept_values.insert(kept_values.end(), v + i * dim, v + (i + 1) * dim);
      }
      rh->set_num_keys(kept_keys.size());
      rh->set_num_values(kept_values.size());
      *keys = FrameFromVector(std::move(kept_keys));
      *values = FrameFromVector(std::move(kept_values));
    }
    return absl::OkStatus();
  }

  auto it = tables_.find(h.table_id());
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown table ", h.table_id()));
  }
  if (!own.all && own.slot_owner.empty()) {
    return absl::UnavailableError("server has no cluster view yet");
  }
  const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
  auto not_owner = [&](uint32_t slot) {
    rh->set_wrong_owner(true);
    return absl::FailedPreconditionError(absl::StrCat(
        "slot ", slot, " is owned by server ", own.slot_owner[slot],
        ", not this server (rank ", own.rank, ") in epoch ", own.epoch,
        "; refresh the cluster view"));
  };
  const bool assign = h.op() == ASSIGN;
  // An ASSIGN is validated like a push (values for every element, finite).
  const bool push = h.op() == PUSH || h.op() == PUSH_PULL || assign;
  const bool pull = h.op() == PULL || h.op() == PUSH_PULL;
  if (push) {
    // Before the copies below: what is forwarded, buffered or held is the
    // policed gradient.
    PS_RETURN_IF_ERROR(PolicePushValues(h, own, assign, const_cast<float*>(req.values.data()),
                                        req.values.size()));
  }
  if (own.replicated && push) make_self_contained();
  Table* table = it->second.get();
  SparseTable* sparse = table->AsSparse();
  DenseTable* dense = table->AsDense();
  const Segments& segments = h.segments();

  // Validate everything first: a rejected request must change nothing.
  uint64_t n = 0;
  PS_RETURN_IF_ERROR(ValidateShape(h, *table, req.keys, req.values, push, &n));
  if (own.replicated) {
    // The slots are kept: forwarding to backups needs them too.
    SlotsOf(h, *table, req.keys, num_slots, &slots_scratch_);
    for (uint32_t slot : slots_scratch_) {
      if (own.slot_owner[slot] != own.rank) return not_owner(slot);
    }
    if (awaiting_first_promoted_) {
      for (uint32_t slot : slots_scratch_) {
        if (promoted_[slot]) first_promoted_ = true;
      }
    }
  } else if (!own.all && !own.owns_every_slot) {
    if (sparse != nullptr) {
      // A cached list checked in this view needs no second look.
      if (key_list == nullptr || key_list->owned_epoch != own.epoch ||
          key_list->owned_table != h.table_id()) {
        for (uint64_t key : req.keys) {
          const uint32_t slot = SparseSlot(h.table_id(), key, num_slots);
          if (own.slot_owner[slot] != own.rank) return not_owner(slot);
        }
        if (key_list != nullptr) {
          key_list->owned_epoch = own.epoch;
          key_list->owned_table = h.table_id();
        }
      }
    } else {
      for (const DenseSegment& s : segments) {
        const uint32_t slot =
            DenseBlockSlot(h.table_id(), s.begin() / dense->block_size(), num_slots);
        if (own.slot_owner[slot] != own.rank) return not_owner(slot);
      }
    }
  }
  if (push && sparse != nullptr) {
    if (absl::Status room =
            sparse->CheckPush(req.keys, key_list != nullptr ? &key_list->rows : nullptr);
        !room.ok()) {
      sparse->CountRefusedPush();
      return room;
    }
  }
  // A push of a step at or after a checkpoint in progress waits until the
  // shard is written (BSP buffers it anyway: buffered steps >= the
  // checkpoint's clock are not applied before it).
  if (push && checkpoint_pending_ != 0 && h.clock() >= checkpoint_pending_ &&
      h.clock() < kFinishedClock && !consistency_.ShouldBuffer(h.clock())) {
    make_self_contained();
    PS_RETURN_IF_ERROR(RoomToHold(frames, "pushes wait for a checkpoint"));
    *outcome = Outcome::kHold;
    return absl::OkStatus();
  }
  // Before the sequence number is recorded: a refused push is not applied,
  // so its resend must not be taken for a duplicate.
  if (push && !assign && consistency_.ShouldBuffer(h.clock()) &&
      h.clock() - consistency_.applied_clock() > ConsistencyController::kMaxStepsAhead) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push for step ", h.clock(), " is more than ",
        ConsistencyController::kMaxStepsAhead, " steps ahead of the applied step ",
        consistency_.applied_clock()));
  }
  bool duplicate = false;
  if (push && h.seq() != 0) {
    auto window = seqs_.find(h.sender_node_id());
    switch (window == seqs_.end() ? SeqWindow::Check::kNew
                                  : window->second.Test(h.seq())) {
      case SeqWindow::Check::kNew:
        break;
      case SeqWindow::Check::kDuplicate:
        duplicate = true;
        break;
      case SeqWindow::Check::kTooOld:
        return absl::AbortedError(absl::StrCat(
            "push sequence number ", h.seq(), " of node ", h.sender_node_id(),
            " is too old to tell whether it was applied; not applied"));
    }
  }
  if (duplicate) {
    rh->set_duplicate(true);
    duplicates_.fetch_add(1, std::memory_order_relaxed);
    // Acknowledged only once the backups hold it (they may still be
    // taking it, from this server or in a catch-up).
    if (own.replicated) PS_RETURN_IF_ERROR(NeedsForDuplicate(own, slots_scratch_));
    if (!pull) return absl::OkStatus();
  } else if (push && h.seq() != 0) {
    seqs_[h.sender_node_id()].Record(h.seq());
  }
  if (assign) {
    dense->Assign(segments, req.values.data());
    if (own.replicated) {
      Forward(own, h, REPLICA_APPLY, 1.0f, *table, req.keys, req.values, frames,
              slots_scratch_);
    }
    return absl::OkStatus();
  }

  if (push && !duplicate) {
    if (consistency_.ShouldBuffer(h.clock())) {
      Buffer(h.clock(), h.sender_node_id(), table, req.keys, segments, req.values);
      if (own.replicated) {
        Forward(own, h, REPLICA_BUFFER, 1.0f, *table, req.keys, req.values, frames,
                slots_scratch_);
      }
    } else {
      // Staleness: how far this push's step is behind the server's clock.
      const uint64_t staleness =
          server_clock_ > h.clock() ? server_clock_ - h.clock() : 0;
      const float lr_scale = table->RateScale(
          h.clock(), staleness, options_.config.cluster().num_workers());
      if (sparse != nullptr) {
        sparse->Push(req.keys, req.values.data(), lr_scale,
                     key_list != nullptr ? &key_list->rows : nullptr);
      } else {
        dense->Push(segments, req.values.data(), lr_scale);
      }
      if (own.replicated) {
        Forward(own, h, REPLICA_APPLY, lr_scale, *table, req.keys, req.values,
                frames, slots_scratch_);
      }
      if (h.clock() < kFinishedClock) {
        max_applied_push_step_ = std::max(max_applied_push_step_, h.clock());
        any_push_applied_ = true;
      }
    }
    keys_pushed_.fetch_add(sparse != nullptr ? req.keys.size() : n,
                           std::memory_order_relaxed);
  }
  if (!pull) return absl::OkStatus();
  if (!PullAllowed(h.clock())) {
    // A plain pull over the budget is refused (nothing was done). A
    // PUSH_PULL's push half is applied already: its pull is held anyway
    // (keys only), so the push is not applied twice.
    if (h.op() == PULL) {
      PS_RETURN_IF_ERROR(RoomToHold(frames, "requests wait for slower workers"));
    }
    // Hold the pull. A PUSH_PULL's push half is done: keep only a PULL.
    make_self_contained();
    if (h.op() == PUSH_PULL) {
      RequestHeader pull_only = h;
      pull_only.set_op(PULL);
      pull_only.clear_key_list_slot();
      pull_only.clear_key_list_digest();
      pull_only.clear_push_values();
      frames[0] = SerializeToFrame(pull_only);
      frames.resize(2);
    }
    *outcome = Outcome::kDefer;
    return absl::OkStatus();
  }
  // Written in place: zmq::message_t(size) does not initialise its bytes,
  // and libzmq sends it without another copy. Half-width answers are
  // gathered into a scratch buffer and encoded into the frame.
  const ValueEncoding encoding =
      EncodedValueBytes(h.pull_values()) == 4 ? FLOAT32 : h.pull_values();
  float* out;
  if (encoding == FLOAT32) {
    *values = zmq::message_t(n * sizeof(float));
    out = static_cast<float*>(values->data());
  } else {
    pull_scratch_.resize(n);
    out = pull_scratch_.data();
  }
  if (sparse != nullptr) {
    // A cached list's rows, found by the pull of a step, serve its push.
    sparse->Pull(req.keys, out, key_list != nullptr ? &key_list->rows : nullptr);
    keys_pulled_.fetch_add(req.keys.size(), std::memory_order_relaxed);
  } else {
    dense->Pull(segments, out);
    keys_pulled_.fetch_add(n, std::memory_order_relaxed);
  }
  if (encoding != FLOAT32) {
    *values = zmq::message_t(n * EncodedValueBytes(encoding));
    EncodeValues(encoding, out, n, values->data());
    rh->set_values_encoding(encoding);
  }
  rh->set_num_values(n);
  const uint64_t min_clock = consistency_.MinClock();
  rh->set_min_clock(min_clock == ConsistencyController::kNoWorkers ? 0 : min_clock);
  rh->set_applied_clock(consistency_.applied_clock());
  return absl::OkStatus();
}

absl::Status KVServer::ValidateShape(const RequestHeader& h, const Table& table,
                                     absl::Span<const uint64_t> keys,
                                     absl::Span<const float> values, bool push,
                                     uint64_t* n) const {
  const SparseTable* sparse = table.AsSparse();
  const DenseTable* dense = table.AsDense();
  *n = 0;
  if (h.op() == ASSIGN && sparse != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", h.table_id(), " is sparse; ASSIGN writes dense tables"));
  }
  if (sparse != nullptr) {
    if (h.segments_size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", h.table_id(), " is sparse; requests carry keys, not segments"));
    }
    *n = keys.size() * uint64_t{sparse->dim()};
    PS_RETURN_IF_ERROR(CheckResponseSize(*n));
    if (push && values.size() != *n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push of ", keys.size(), " keys to table ", h.table_id(), " (dim ",
          sparse->dim(), ") needs ", *n, " values, got ", values.size()));
    }
    return absl::OkStatus();
  }
  if (!keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", h.table_id(), " is dense; requests carry segments, not keys"));
  }
  PS_RETURN_IF_ERROR(dense->ValidateSegments(h.segments()));
  for (const DenseSegment& s : h.segments()) *n += s.length();
  PS_RETURN_IF_ERROR(CheckResponseSize(*n));
  if (push && values.size() != *n) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense push addresses ", *n, " elements but carries ",
                     values.size(), " values"));
  }
  return absl::OkStatus();
}

void KVServer::SlotsOf(const RequestHeader& h, const Table& table,
                       absl::Span<const uint64_t> keys, uint32_t num_slots,
                       std::vector<uint32_t>* slots) const {
  slots->clear();
  if (table.AsSparse() != nullptr) {
    slots->reserve(keys.size());
    for (uint64_t key : keys) slots->push_back(SparseSlot(h.table_id(), key, num_slots));
    return;
  }
  const uint64_t block_size = table.AsDense()->block_size();
  for (const DenseSegment& s : h.segments()) {
    slots->push_back(DenseBlockSlot(h.table_id(), s.begin() / block_size, num_slots));
  }
}

void KVServer::Scan(const SparseTable& sparse, const RequestHeader& h,
                    ResponseHeader* rh, zmq::message_t* values,
                    zmq::message_t* keys) {
  // Slot ownership is not checked: an export wants every row this server
  // holds, including rows of slots it no longer owns.
  uint64_t max_rows = h.scan_max_rows() == 0 ? kDefaultScanRows : h.scan_max_rows();
  // Keep the page (keys and values) under the message limit for wide rows.
  const uint64_t row_bytes = uint64_t{sparse.dim()} * sizeof(float) + sizeof(uint64_t);
  max_rows = std::max<uint64_t>(
      1, std::min<uint64_t>(max_rows, kMaxMessageBytes / 2 / row_bytes));
  // Bounds the work of one page when the index is mostly empty (rows
  // dropped by TTL or eviction leave the index at its largest size), so a
  // scan never stalls the serving loop for long.
  const uint64_t max_slots = std::max<uint64_t>(max_rows * 8, 65536);
  std::vector<uint64_t> page_keys;
  std::vector<float> page_values;
  page_keys.reserve(std::min<uint64_t>(max_rows, sparse.num_rows()));
  page_values.reserve(page_keys.capacity() * sparse.dim());
  const uint64_t next =
      sparse.Scan(h.scan_cursor(), max_rows, max_slots, &page_keys, &page_values);
  rh->set_num_keys(page_keys.size());
  rh->set_num_values(page_values.size());
  rh->set_next_cursor(next);
  *keys = FrameFromVector(std::move(page_keys));
  *values = FrameFromVector(std::move(page_values));
}

void KVServer::Buffer(uint64_t step, uint64_t node_id, Table* table,
                      absl::Span<const uint64_t> keys, const Segments& segments,
                      absl::Span<const float> grads) {
  consistency_.NoteBuffered(step);
  BufferInto(buffers_[step], node_id, table, keys, segments, grads);
}

void KVServer::BufferInto(StepBuffer& buffer, uint64_t node_id, Table* table,
                          absl::Span<const uint64_t> keys,
                          const Segments& segments,
                          absl::Span<const float> grads) {
  buffer.pushers.insert(node_id);
  if (SparseTable* sparse = table->AsSparse()) {
    StepBuffer::Sparse& b = buffer.sparse[table->id()];
    const uint32_t dim = sparse->dim();
    for (size_t i = 0; i < keys.size(); ++i) {
      auto [it, inserted] =
          b.index.try_emplace(keys[i], static_cast<uint32_t>(b.keys.size()));
      if (inserted) {
        b.keys.push_back(keys[i]);
        b.sums.resize(b.sums.size() + dim, 0.0);
      }
      double* sum = &b.sums[size_t{it->second} * dim];
      const float* g = &grads[i * dim];
      for (uint32_t e = 0; e < dim; ++e) sum[e] += g[e];
    }
    return;
  }
  DenseTable* dense = table->AsDense();
  StepBuffer::Dense& b = buffer.dense[table->id()];
  const uint64_t block_size = dense->block_size();
  const float* g = grads.data();
  for (const DenseSegment& s : segments) {
    const uint64_t block = s.begin() / block_size;
    std::vector<double>& sums = b.blocks[block];
    if (sums.empty()) {
      sums.assign(std::min(block_size, dense->size() - block * block_size), 0.0);
    }
    const uint64_t offset = s.begin() - block * block_size;
    for (uint64_t e = 0; e < s.length(); ++e) sums[offset + e] += g[e];
    auto [range, inserted] =
        b.touched.try_emplace(block, offset, offset + s.length());
    if (!inserted) {
      range->second.first = std::min(range->second.first, offset);
      range->second.second = std::max(range->second.second, offset + s.length());
    }
    g += s.length();
  }
}

void KVServer::ApplyBuffered(uint64_t step, StepBuffer& buffer, uint32_t divisor) {
  // scale_with_workers scales by the configured cluster size, not by
  // `divisor`: the schedule must not jump when one step has fewer pushers.
  const uint32_t num_workers = options_.config.cluster().num_workers();
  std::vector<float> grads;
  for (auto& [id, b] : buffer.sparse) {
    grads.resize(b.sums.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      grads[i] = static_cast<float>(b.sums[i] / divisor);
    }
    // Every worker's gradients of the step were read at the step's
    // parameters: no staleness under BSP.
    SparseTable* sparse = tables_[id]->AsSparse();
    sparse->Push(b.keys, grads.data(), sparse->RateScale(step, 0, num_workers));
  }
  for (auto& [id, b] : buffer.dense) {
    DenseTable* dense = tables_[id]->AsDense();
    for (auto& [block, sums] : b.blocks) {
      // Only the touched range: elements no worker pushed this step are
      // not updated, as they would not be under ASYNC.
      const auto [lo, hi] = b.touched[block];
      Segments seg;
      DenseSegment* s = seg.Add();
      s->set_begin(block * dense->block_size() + lo);
      s->set_length(hi - lo);
      grads.resize(hi - lo);
      for (uint64_t e = lo; e < hi; ++e) {
        grads[e - lo] = static_cast<float>(sums[e] / divisor);
      }
      dense->Push(seg, grads.data(), dense->RateScale(step, 0, num_workers));
    }
  }
  Log()->debug("BSP step {} applied: {} workers averaged", step, divisor);
}

void KVServer::Progress(const Ownership& own) {
  uint64_t step;
  MaybeWriteCheckpoint(own);
  while (consistency_.NextCompleteStep(
      &step, checkpoint_pending_ != 0 ? checkpoint_pending_
                                      : ConsistencyController::kNoWorkers)) {
    auto it = buffers_.find(step);
    // finished_ marks exactly the buffered steps, so the buffer exists.
    if (it != buffers_.end()) {
      const uint32_t divisor = std::max<uint32_t>(
          consistency_.FinishedCount(step),
          static_cast<uint32_t>(it->second.pushers.size()));
      ApplyBuffered(step, it->second, divisor);
      buffers_.erase(it);
      StepDone(step, divisor);
    }
    consistency_.ForgetStep(step);
    consistency_.StepApplied();
    bsp_steps_.fetch_add(1, std::memory_order_relaxed);
  }
  if (checkpoint_pending_ != 0) {
    MaybeWriteCheckpoint(own);
    if (checkpoint_pending_ == 0) {
      // Written: apply what waited for it.
      Progress(own);
      return;
    }
  }
  // Answer held pulls that may now be answered, oldest first.
  for (auto it = deferred_.begin(); it != deferred_.end();) {
    if (!PullAllowed(it->clock)) {
      ++it;
      continue;
    }
    ResponseHeader rh;
    zmq::message_t values, keys;
    ServerRefusal refusal = REFUSAL_NONE;
    if (absl::Status serving = CheckServing(own, &refusal); !serving.ok()) {
      // Not answered from a view that may be stale. A PUSH_PULL's push half
      // was applied when it arrived: the client's retry (same sequence
      // number) is answered as a duplicate by whoever owns the slots then.
      held_bytes_ -= it->bytes;
      SendRefusal(it->identity, it->frames[0], serving, refusal, own.epoch);
      it = deferred_.erase(it);
      continue;
    }
    Process(it->frames, own, &rh, &values, &keys);
    if (instruments_ != nullptr) {
      instruments_->RecordHold(absl::ToDoubleSeconds(absl::Now() - it->since));
    }
    if (replicated_) {
      Answer(it->identity, rh, values, keys, std::move(it->needs), false);
    } else {
      Send(it->identity, rh, values, keys);
    }
    held_bytes_ -= it->bytes;
    it = deferred_.erase(it);
  }
}

void KVServer::FlushBuffers() {
  // Leaving BSP: apply what was gathered, step by step, averaged over the
  // workers that took part.
  for (auto& [step, buffer] : buffers_) {
    const uint32_t divisor =
        std::max<uint32_t>(consistency_.FinishedCount(step),
                           static_cast<uint32_t>(buffer.pushers.size()));
    ApplyBuffered(step, buffer, divisor);
    StepDone(step, divisor);
    consistency_.ForgetStep(step);
  }
  buffers_.clear();
}

void KVServer::StepDone(uint64_t step, uint32_t divisor) {
  if (!replicated_) return;
  recent_divisors_[step] = divisor;
  while (recent_divisors_.size() > 64) recent_divisors_.erase(recent_divisors_.begin());
  // Backups apply what they buffered of the step with the same divisor.
  for (auto& [node, link] : links_) {
    RequestHeader h;
    h.set_replica(true);
    h.set_epoch(last_applied_ != nullptr ? last_applied_->epoch : 0);
    ReplicaInfo* r = h.mutable_replica_info();
    r->set_kind(REPLICA_APPLY_STEP);
    r->set_primary_node_id(last_applied_ != nullptr ? last_applied_->node_id : 0);
    r->set_step(step);
    r->set_divisor(divisor);
    link->Send(h, zmq::message_t(), zmq::message_t(), false);
  }
}

bool KVServer::PullAllowed(uint64_t clock) const {
  if (checkpoint_pending_ != 0 && clock > checkpoint_pending_ &&
      clock < kFinishedClock) {
    return false;
  }
  return consistency_.PullReady(clock);
}

void KVServer::Restore(const Ownership& own) {
  restored_ = true;
  if (own.restore.path().empty()) return;
  // With replication a replacement server usually owns nothing (its old
  // slots went to their backups) and copies what it backs from the
  // primaries: reading the whole checkpoint would be for nothing.
  if (own.replicated &&
      std::find(own.slot_owner.begin(), own.slot_owner.end(), own.rank) ==
          own.slot_owner.end()) {
    return;
  }
  const uint64_t clock = own.restore.clock();
  // RestoreShards checks every record and file checksum as it reads.
  auto manifest = ReadManifest(own.restore.path());
  absl::Status status = manifest.status();
  if (manifest.ok()) {
    std::vector<Table*> tables;
    for (auto& [id, table] : tables_) tables.push_back(table.get());
    const absl::Time start = absl::Now();
    auto restored = RestoreShards(own.restore.path(), *manifest, tables,
                                  OwnedSlotsFilter(own.slot_owner, own.rank));
    status = restored.status();
    if (restored.ok()) {
      rows_restored_.fetch_add(restored->rows_restored, std::memory_order_relaxed);
      Log()->info(
          "restored {} rows and {} dense blocks of my slots from {} (clock {}, "
          "{} shard files of {} servers, {:.1f} MB read) in {:.2f} s",
          restored->rows_restored, restored->blocks_restored, own.restore.path(),
          clock, restored->files, manifest->num_servers(), restored->bytes / 1e6,
          absl::ToDoubleSeconds(absl::Now() - start));
    }
  }
  if (!status.ok()) {
    // Serving half-restored tables would hand workers parameters from no
    // consistent state: start from the initial values instead, loudly.
    Log()->error("cannot restore checkpoint {}: {}; serving initial values",
                 own.restore.path(), status.ToString());
    for (const TableConfig& tc : options_.config.tables()) {
      auto table = Table::Create(tc);
      if (table.ok()) tables_[tc.id()] = std::move(table).value();
    }
    return;
  }
  server_clock_ = std::max(server_clock_, clock);
  consistency_.SetAppliedClock(clock);
  checkpoint_handled_ = std::max(checkpoint_handled_, clock);
}

void KVServer::NoteCheckpointClock(const Ownership& own) {
  const uint64_t c = own.checkpoint_clock;
  if (c == 0) {
    if (checkpoint_pending_ != 0) {
      // Abandoned by the scheduler (e.g. a server died meanwhile).
      Log()->warn("checkpoint at clock {} abandoned", checkpoint_pending_);
      checkpoint_pending_ = 0;
    }
    return;
  }
  if (c == checkpoint_pending_ || c <= checkpoint_handled_) return;
  checkpoint_pending_ = 0;
  if (options_.config.checkpoint().dir().empty() || own.all) return;
  // The cut at c must hold no push of a step >= c. Under BSP pushes of
  // steps >= the applied clock are only buffered.
  const bool too_late = consistency_.mode() == BSP
                            ? consistency_.applied_clock() > c
                            : any_push_applied_ && max_applied_push_step_ >= c;
  if (too_late) {
    checkpoint_handled_ = c;
    ReportCheckpointRequest report;
    report.set_clock(c);
    report.set_ok(false);
    report.set_error(absl::StrCat(
        "server ", own.rank, " already applied pushes of step ",
        consistency_.mode() == BSP ? consistency_.applied_clock() - 1
                                   : max_applied_push_step_,
        " >= ", c, "; retry at a later clock"));
    Log()->info("checkpoint at clock {}: too late here ({})", c, report.error());
    if (options_.on_checkpoint) options_.on_checkpoint(report);
    return;
  }
  checkpoint_pending_ = c;
  Log()->debug("checkpoint at clock {} pending", c);
}

void KVServer::MaybeWriteCheckpoint(const Ownership& own) {
  const uint64_t c = checkpoint_pending_;
  if (c == 0) return;
  // Every live worker finished the steps < c (and their pushes, sent
  // before their clocks, are here); under BSP they are applied too.
  const uint64_t min_clock = consistency_.MinClock();
  if (min_clock != ConsistencyController::kNoWorkers && min_clock < c) return;
  if (consistency_.mode() == BSP && consistency_.applied_clock() < c &&
      min_clock != ConsistencyController::kNoWorkers) {
    return;
  }
  checkpoint_pending_ = 0;
  checkpoint_handled_ = c;
  const std::string dir = CheckpointPath(options_.config.checkpoint().dir(), c);
  std::vector<const Table*> tables;
  for (const auto& [id, table] : tables_) tables.push_back(table.get());
  const absl::Time start = absl::Now();
  // With replication this server also holds backup copies of other
  // servers' slots; each slot is written by its owner only.
  auto written = WriteShard(dir, own.rank, c, static_cast<uint32_t>(own.slot_owner.size()),
                            tables,
                            own.replicated ? OwnedSlotsFilter(own.slot_owner, own.rank)
                                           : RowFilter{});
  ReportCheckpointRequest report;
  report.set_clock(c);
  report.set_ok(written.ok());
  if (written.ok()) {
    checkpoints_.fetch_add(1, std::memory_order_relaxed);
    report.set_file(written->file());
    report.set_bytes(written->bytes());
    report.set_checksum(written->checksum());
    Log()->info("checkpoint at clock {}: wrote {} ({:.1f} MB) in {:.2f} s", c,
                written->file(), written->bytes() / 1e6,
                absl::ToDoubleSeconds(absl::Now() - start));
  } else {
    report.set_error(std::string(written.status().message()));
    Log()->error("checkpoint at clock {}: {}", c, written.status().ToString());
  }
  if (options_.on_checkpoint) options_.on_checkpoint(report);
  if (written.ok() && stop_after_checkpoint_.load()) {
    Log()->info("stopping after checkpoint at clock {}: {} held request(s) left "
                "for the workers to route again",
                c, held_.size());
    stop_.store(true);
    return;
  }
  ReleaseHeld(own);
}

void KVServer::ReleaseHeld(const Ownership& own) {
  std::deque<Held> held;
  held.swap(held_);
  for (const Held& h : held) held_bytes_ -= h.bytes;
  for (Held& h : held) {
    HandleMessage(std::move(h.identity), std::move(h.frames), own);
  }
}

uint64_t KVServer::FramesBytes(const std::vector<zmq::message_t>& frames) {
  uint64_t bytes = 0;
  for (const zmq::message_t& f : frames) bytes += f.size();
  return bytes;
}

bool KVServer::MayHold(uint64_t bytes) const {
  return held_bytes_.load() + bytes <= static_cast<uint64_t>(limits_.max_held_bytes());
}

absl::Status KVServer::RoomToHold(const std::vector<zmq::message_t>& frames,
                                  absl::string_view waiting) {
  if (MayHold(FramesBytes(frames))) return absl::OkStatus();
  limit_refusals_.fetch_add(1, std::memory_order_relaxed);
  return absl::UnavailableError(absl::StrCat("server busy: ", held_bytes_.load(), " bytes of ",
                                             waiting, " (data_plane.limits.max_held_bytes ",
                                             limits_.max_held_bytes(), "); retry"));
}

absl::Status KVServer::AdmitRequest(const std::vector<zmq::message_t>& frames,
                                    const RequestHeader& h, const Ownership& own) {
  const uint64_t bytes = FramesBytes(frames);
  if (bytes > static_cast<uint64_t>(limits_.max_message_bytes())) {
    limit_refusals_.fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(
        absl::StrCat("request of ", bytes, " bytes exceeds data_plane.limits.max_message_bytes ",
                     limits_.max_message_bytes()));
  }
  if (h.num_keys() > limits_.max_keys_per_message()) {
    limit_refusals_.fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat(
        "request of ", h.num_keys(), " keys exceeds data_plane.limits.max_keys_per_message ",
        limits_.max_keys_per_message()));
  }
  const uint64_t sender = h.sender_node_id();
  if (sender == 0 || h.op() == STATS) return absl::OkStatus();
  if (own.all) {
    // No view to check senders against: bound how many get state here.
    if (!standalone_senders_.contains(sender)) {
      if (standalone_senders_.size() >= kMaxStandaloneSenders) {
        limit_refusals_.fetch_add(1, std::memory_order_relaxed);
        return absl::ResourceExhaustedError(absl::StrCat(
            "this standalone server already keeps state for ", kMaxStandaloneSenders,
            " senders; node ", sender, " refused"));
      }
      standalone_senders_.insert(sender);
    }
    return absl::OkStatus();
  }
  if (!own.worker_rank.contains(sender)) {
    sender_refusals_.fetch_add(1, std::memory_order_relaxed);
    return absl::UnavailableError(absl::StrCat(
        "sender node ", sender, " is not a live worker in this server's view (epoch ",
        own.epoch, "); retry once the view has it"));
  }
  return absl::OkStatus();
}

absl::Status KVServer::PolicePushValues(const RequestHeader& h, const Ownership& own,
                                        bool assign, float* values, size_t n) {
  const GradientPolicy& policy = options_.config.data_plane().gradients();
  const float clip = policy.clip_value();
  if (!AllFinite(absl::MakeConstSpan(values, n))) {
    uint64_t bad = 0;
    size_t first = n;
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(values[i])) {
        if (first == n) first = i;
        ++bad;
      }
    }
    const bool reject = assign || policy.nonfinite() != GradientPolicy::CLIP || clip <= 0;
    nonfinite_values_.fetch_add(bad, std::memory_order_relaxed);
    if (reject) nonfinite_rejected_.fetch_add(1, std::memory_order_relaxed);
    // The rank the view knows for the sender (a header's own claim only on
    // a standalone server); labels stay bounded by the live workers.
    std::string worker = "none";
    if (h.sender_node_id() != 0) {
      auto it = own.worker_rank.find(h.sender_node_id());
      if (it != own.worker_rank.end()) {
        worker = absl::StrCat(it->second);
      } else if (own.all && h.sender_rank() < kMaxStandaloneSenders) {
        worker = absl::StrCat(h.sender_rank());
      } else {
        worker = "other";
      }
    }
    const char* action = reject ? "rejected" : "clipped";
    if (nonfinite_family_ != nullptr) nonfinite_family_->With({worker, action})->Add(bad);
    const absl::Time now = absl::Now();
    if (now - last_nonfinite_log_ >= absl::Seconds(1)) {
      Log()->warn(
          "worker rank {} (node {}) pushed {} non-finite value(s) of {} to table {} at "
          "step {} (first: element {} = {}); {}{}",
          worker, h.sender_node_id(), bad, n, h.table_id(), h.clock(), first, values[first],
          reject ? "push rejected" : "clipped and applied",
          nonfinite_unlogged_ > 0
              ? absl::StrCat(" (", nonfinite_unlogged_, " such pushes not logged before it)")
              : "");
      last_nonfinite_log_ = now;
      nonfinite_unlogged_ = 0;
    } else {
      ++nonfinite_unlogged_;
    }
    if (reject) {
      return absl::InvalidArgumentError(absl::StrCat(
          assign ? "ASSIGN value " : "gradient ", first, " is not finite (", values[first],
          "); ", bad, " of ", n, " values are not; ", assign ? "assign" : "push",
          " rejected"));
    }
    for (size_t i = 0; i < n; ++i) {
      if (std::isnan(values[i])) {
        values[i] = 0.0f;
      } else if (std::isinf(values[i])) {
        values[i] = values[i] > 0 ? clip : -clip;
      }
    }
  }
  if (!assign && clip > 0) {
    for (size_t i = 0; i < n; ++i) values[i] = std::clamp(values[i], -clip, clip);
  }
  return absl::OkStatus();
}

void KVServer::NoteClock(uint64_t clock) {
  if (clock < kFinishedClock) server_clock_ = std::max(server_clock_, clock);
}

void KVServer::AdvanceTables() {
  const absl::Time now = options_.clock->Now();
  for (auto& [id, table] : tables_) {
    if (SparseTable* sparse = table->AsSparse()) sparse->Advance(server_clock_, now);
  }
}

void KVServer::FillStats(ResponseHeader* rh, const Ownership* own) const {
  std::vector<uint32_t> ids;
  for (const auto& [id, table] : tables_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint32_t id : ids) {
    TableStats* stats = rh->add_table_stats();
    *stats = tables_.at(id)->Stats();
    if (own == nullptr) continue;
    // Separate the backup copies: a pass over the table's rows.
    const uint32_t num_slots = static_cast<uint32_t>(own->slot_owner.size());
    auto mine = [&](uint32_t slot) { return own->slot_owner[slot] == own->rank; };
    uint64_t backup = 0;
    if (const SparseTable* sparse = tables_.at(id)->AsSparse()) {
      std::vector<uint64_t> keys;
      std::vector<float> values;
      uint64_t cursor = 0;
      do {
        keys.clear();
        values.clear();
        cursor = sparse->Scan(cursor, 65536, 1 << 20, &keys, &values);
        for (uint64_t key : keys) backup += !mine(SparseSlot(id, key, num_slots));
      } while (cursor != 0);
    } else {
      const DenseTable* dense = tables_.at(id)->AsDense();
      (void)dense->ForEachBlock([&](uint64_t block, absl::Span<const float> values,
                                    absl::Span<const float>) {
        if (!mine(DenseBlockSlot(id, block, num_slots))) backup += values.size();
        return absl::OkStatus();
      });
    }
    stats->set_rows(stats->rows() - std::min(stats->rows(), backup));
    stats->set_backup_rows(backup);
    auto replica = replica_keys_.find(id);
    if (replica != replica_keys_.end()) {
      stats->set_keys_pushed(stats->keys_pushed() -
                             std::min(stats->keys_pushed(), replica->second));
    }
  }
}

void KVServer::Watchdog() {
  if (deferred_.empty()) return;
  const ConsistencyConfig& c = consistency_.config();
  const absl::Time now = absl::Now();
  const Deferred& oldest = deferred_.front();
  if (now - oldest.since < absl::Milliseconds(c.watchdog_timeout_ms()) ||
      now - last_watchdog_log_ < absl::Milliseconds(c.watchdog_interval_ms())) {
    return;
  }
  last_watchdog_log_ = now;
  // What the oldest pull needs: under BSP every step below its clock
  // applied, i.e. every live worker at that clock; under SSP every live
  // worker at clock - staleness.
  uint64_t needed = oldest.clock;
  if (consistency_.mode() == SSP) {
    needed = oldest.clock > c.staleness() ? oldest.clock - c.staleness() : 0;
  }
  std::vector<std::string> missing;
  for (const auto& l : consistency_.Behind(needed)) {
    missing.push_back(absl::StrCat(l.rank, " (clock ", l.clock, ")"));
  }
  Log()->warn(
      "watchdog: {} pull(s) held; the oldest, from worker rank {} at clock {}, "
      "has waited {:.1f} s ({}, applied steps < {}); waiting for worker ranks: {}",
      deferred_.size(), oldest.rank, oldest.clock,
      absl::ToDoubleSeconds(now - oldest.since),
      consistency_.mode() == SSP
          ? absl::StrCat("SSP staleness ", c.staleness())
          : ConsistencyMode_Name(consistency_.mode()),
      consistency_.applied_clock(),
      missing.empty() ? "none (clock reports in flight)" : absl::StrJoin(missing, ", "));
}

}  // namespace ps
