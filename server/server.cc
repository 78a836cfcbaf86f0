#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hash.h"
#include "common/protocol.h"
#include "common/status.h"
#include "common/value_codec.h"
#include "common/wire.h"
#include "server/checkpoint.h"
#include "server/server_impl.h"
#include "server/server_log.h"
#include "zmq_addon.hpp"

namespace ps {

namespace {

// Poll period of the serving loop; bounds how long Stop() waits and how
// late a new view takes effect.
constexpr std::chrono::milliseconds kPollPeriod{50};

// The move work credit a busy serving thread may save up: about one step.
constexpr absl::Duration kMoveWorkBurst = absl::Milliseconds(2);

// cluster.elastic.move_work_share, or its default when unset or out of
// range (a config that skipped validation); 1 (no pacing) without
// elastic membership, where nothing moves.
double MoveWorkShare(const ClusterConfig& cluster) {
  if (!cluster.has_elastic()) return 1.0;
  const double share = cluster.elastic().move_work_share();
  return share > 0 && share <= 1 ? share : 0.25;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KVServer>> KVServer::Start(Options options) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl,
                      Impl::Start(std::move(options)));
  return std::unique_ptr<KVServer>(new KVServer(std::move(impl)));
}

KVServer::KVServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KVServer::~KVServer() = default;
const std::string& KVServer::endpoint() const { return impl_->endpoint(); }
int KVServer::port() const { return impl_->port(); }
void KVServer::UpdateView(const ClusterView& view, uint32_t rank) {
  impl_->UpdateView(view, rank);
}
KVServer::Stats KVServer::stats() const { return impl_->stats(); }
void KVServer::SetLease(std::chrono::steady_clock::time_point until) {
  impl_->SetLease(until);
}
void KVServer::Fence(std::string why) { impl_->Fence(std::move(why)); }
absl::Status KVServer::storage_failure() const {
  return impl_->storage_failure();
}
std::vector<TableStats> KVServer::table_stats() const {
  return impl_->table_stats();
}
std::vector<uint64_t> KVServer::slot_bytes() const {
  return impl_->slot_bytes();
}
void KVServer::Stop() { impl_->Stop(); }
std::vector<const Table*> KVServer::StoppedTables() const {
  return impl_->StoppedTables();
}
void KVServer::StopAfterNextCheckpoint() { impl_->StopAfterNextCheckpoint(); }
bool KVServer::stopped() const { return impl_->stopped(); }

absl::Status KVServer::Impl::CreateTables() {
  const JobConfig& config = options_.config;
  tiered_.clear();
  for (const TableConfig& tc : config.tables()) {
    TableEnv env;
    env.num_slots =
        config.cluster().num_slots() > 0 ? config.cluster().num_slots() : 4096;
    if (tc.has_sparse() && tc.sparse().has_disk_tier()) {
      const std::string& base = tc.sparse().disk_tier().dir();
      std::unique_ptr<TierRoot>& root = tier_roots_[base];
      if (root == nullptr) {
        PS_ASSIGN_OR_RETURN(root, TierRoot::Claim(base, config.name()));
      }
      env.tier_root = root->path();
    }
    tables_.erase(tc.id());
    PS_ASSIGN_OR_RETURN(tables_[tc.id()], Table::Create(tc, env));
    if (!env.tier_root.empty()) tiered_.push_back(tables_[tc.id()]->AsSparse());
  }
  return absl::OkStatus();
}

bool KVServer::Impl::StorageFailed() {
  for (const SparseTable* table : tiered_) {
    const absl::Status& failure = table->tier_failure();
    if (failure.ok()) continue;
    {
      absl::MutexLock lock(&storage_mu_);
      if (!storage_failure_.ok()) return true;
      storage_failure_ = failure;
    }
    // What the table holds can no longer be trusted: nothing more is
    // answered from it, and the process is recovered as a crashed one.
    Fence(absl::StrCat(failure.message(),
                       "; this server stops and is recovered as a crashed "
                       "one, from the checkpoint"));
    return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<KVServer::Impl>> KVServer::Impl::Start(
    Options options) {
  std::unique_ptr<Impl> server(new Impl(std::move(options)));
  PS_RETURN_IF_ERROR(server->CreateTables());
  PS_RETURN_IF_ERROR(server->data_.Open(
      server->options_.bind_endpoint, server->admission_.limits(),
      server->options_.curve, server->options_.metrics));
  PS_RETURN_IF_ERROR(server->views_.OpenWake());
  if (!server->tiered_.empty()) {
    PS_RETURN_IF_ERROR(server->tier_waits_.wake.Open("disk tier readers'"));
    const WakeFd* wake = &server->tier_waits_.wake;
    for (SparseTable* table : server->tiered_) {
      table->StartColdReader([wake] { wake->Wake(); },
                             server->options_.before_tier_read);
    }
  }
  if (server->options_.standalone) {
    auto own = std::make_shared<Ownership>();
    own->all = true;
    own->consistency = server->options_.config.consistency();
    server->views_.Install(std::move(own));
  }
  if (server->options_.metrics != nullptr)
    server->RegisterMetrics(server->options_.metrics);
  server->serving_.Start([s = server.get()] { s->Serve(); });
  ServerLog()->info("serving {} tables on {}{}", server->tables_.size(),
                    server->data_.endpoint(),
                    server->options_.curve.has_value() ? " (CURVE)" : "");
  return server;
}

KVServer::Impl::Impl(Options options)
    : options_(std::move(options)),
      consistency_(options_.config.consistency()),
      key_cache_(options_.config.data_plane().key_cache_bytes()),
      replicated_(!options_.standalone &&
                  (options_.config.cluster().replication() >= 2 ||
                   options_.config.cluster().has_elastic())),
      move_work_(options_.clock, MoveWorkShare(options_.config.cluster()),
                 kMoveWorkBurst) {}

ReplicationPrimary::Deps KVServer::Impl::ReplicationPrimaryDeps() {
  ReplicationPrimary::Deps deps;
  deps.context = &data_.context();
  deps.curve = options_.curve.has_value() ? &*options_.curve : nullptr;
  deps.clock = options_.clock;
  deps.tables = &tables_;
  deps.digests = &move_digests_;
  deps.seqs = &seqs_;
  deps.buffers = &bsp_.buffers;
  deps.forwards = &counters_.forwards;
  deps.unreplicated_pushes = &counters_.unreplicated_pushes;
  deps.catchups_sent = &counters_.catchups_sent;
  deps.rows_copied = &counters_.rows_copied;
  deps.move_rows_out = &counters_.move_rows_out;
  deps.move_fences = &counters_.move_fences;
  deps.move_aborts = &counters_.move_aborts;
  deps.move_fence_max_micros = &counters_.move_fence_max_micros;
  deps.on_move = options_.on_move;
  deps.send = [this](zmq::message_t& identity, const ResponseHeader& rh,
                     zmq::message_t& values, zmq::message_t& keys) {
    Send(identity, rh, values, keys);
  };
  deps.first_promoted_served = [this] { failover_.FirstServed(); };
  return deps;
}

KVServer::Impl::~Impl() {
  UnregisterMetrics();
  Stop();
}

std::vector<const Table*> KVServer::Impl::StoppedTables() const {
  std::vector<const Table*> tables;
  if (!serving_.stopped()) return tables;
  for (const auto& [id, table] : tables_) tables.push_back(table.get());
  std::sort(tables.begin(), tables.end(),
            [](const Table* a, const Table* b) { return a->id() < b->id(); });
  return tables;
}

void KVServer::Impl::Stop() { serving_.Stop(); }

void KVServer::Impl::UpdateView(const ClusterView& view, uint32_t rank) {
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
    own->backups_required = options_.config.cluster().replication() >= 2;
    const size_t num_slots = own->slot_owner.size();
    const uint32_t max_ranks = MaxServerRanks(options_.config.cluster());
    if (static_cast<size_t>(view.slot_backup_size()) == num_slots) {
      own->slot_backup.assign(view.slot_backup().begin(),
                              view.slot_backup().end());
    } else {
      own->slot_backup.assign(num_slots, replication::kNoBackup);
    }
    for (const NodeInfo& n : view.nodes()) {
      if (n.role() != SERVER || n.state() != ALIVE) continue;
      if (n.rank() >= max_ranks) {
        ServerLog()->warn(
            "view {} names server rank {}, beyond the job's {} ranks; "
            "ignored",
            view.epoch(), n.rank(), max_ranks);
        continue;
      }
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
          absl::SimpleAtoi(e.substr(colon + 1), &port) &&
          port == data_.port()) {
        own->node_id = n.node_id();
      }
    }
    ReadMoves(view, own.get());
  }
  views_.Post(std::move(own));
}

void KVServer::Impl::SetLease(std::chrono::steady_clock::time_point until) {
  lease_fence_.SetLease(until);
}

void KVServer::Impl::Fence(std::string why) {
  lease_fence_.Fence(std::move(why));
}

void KVServer::Impl::SendRefusal(zmq::message_t& identity,
                                 const zmq::message_t& header,
                                 const absl::Status& status,
                                 ServerRefusal refusal, uint64_t epoch) {
  // The request id is all that is read of the request: its answer must
  // find its way back, and nothing else of it matters.
  RequestHeader h;
  ResponseHeader rh;
  if (h.ParseFromArray(header.data(), static_cast<int>(header.size()))) {
    rh.set_request_id(h.request_id());
  }
  rh.set_epoch(epoch);
  SetResponseStatus(status, &rh);
  rh.set_refusal(refusal);
  zmq::message_t values, keys;
  Send(identity, rh, values, keys);
}

KVServer::Stats KVServer::Impl::stats() const {
  Stats s = counters_.Snapshot();
  const PeerGate* gate = data_.gate();
  s.auth_refusals = gate ? gate->auth_refusals() : 0;
  s.connection_refusals = gate ? gate->connection_refusals() : 0;
  s.open_connections = gate ? gate->open_connections() : 0;
  s.serving_cpu_micros = serving_.cpu_nanos() / 1000;
  return s;
}

void KVServer::Impl::ApplyView(const Ownership& own) {
  if (!own.has_view) return;
  // Slots coming back (a move, a promotion, a new backup) get their rows
  // after the old ones are gone, not dropped with them.
  FinishDropOfHeld(own);
  if (!checkpoint_gate_.restore_tried() && !own.slot_owner.empty())
    Restore(own);
  consistency_.SetLiveWorkers(own.live_workers);
  // Senders that are gone: their retries cannot come, so their sequence
  // windows and stored key lists go.
  absl::flat_hash_set<uint64_t> live_workers;
  for (const auto& w : own.live_workers) live_workers.insert(w.node_id);
  for (auto it = seqs_.begin(); it != seqs_.end();) {
    if (!live_workers.contains(it->first)) {
      seqs_.erase(it++);
    } else {
      ++it;
    }
  }
  key_cache_.Retain(live_workers);
  if (own.replicated && !own.slot_owner.empty()) {
    // A message from the old primary of a slot may still be on its way
    // when the view promoting this server arrives: it is refused (its
    // worker's retry comes here). Promotion first, so the catch-ups of the
    // promoted slots to their new backups include what was promoted.
    if (views_.applied() != nullptr) {
      Promote(*views_.applied(), own);
      // After the flip's count of the moved-in rows (Promote reads their
      // running digests), before the rows moved away are dropped (so that
      // no digest of a finished move refreshes them).
      SyncMoveDigests(own);
      HandOver(*views_.applied(), own);
      DropAbandonedCopies(*views_.applied(), own);
    }
    // Held replica messages stay: they may come from a primary this view
    // does not know yet; ReleaseReplicas refuses those of dead ones.
    absl::flat_hash_set<uint64_t> live_servers(own.server_node.begin(),
                                               own.server_node.end());
    replicas_.Retain(live_servers, live_workers);
  }
  const ConsistencyMode before = consistency_.mode();
  const uint32_t staleness_before = consistency_.config().staleness();
  if (consistency_.SetMode(own.consistency)) FlushBuffers();
  if (consistency_.mode() != before ||
      consistency_.config().staleness() != staleness_before) {
    ServerLog()->info(
        "consistency is now {}{} (epoch {})",
        ConsistencyMode_Name(consistency_.mode()),
        consistency_.mode() == SSP
            ? absl::StrCat(" staleness ", consistency_.config().staleness())
        : consistency_.mode() == BSP
            ? absl::StrCat(", aggregating from step ",
                           consistency_.applied_clock())
            : "",
        own.epoch);
  }
  NoteCheckpointClock(own);
  // Before the catch-ups and fences below (a second call changes nothing).
  SyncMoveDigests(own);
  if (own.replicated && !own.slot_owner.empty()) {
    const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
    replicas_.SizeSlots(num_slots);
    failover_.SizeSlots(num_slots);
    primary_.SyncBackups(own);
    ReleaseReplicas(own);
  }
  if (checkpoint_gate_.pending() == 0 && checkpoint_gate_.held_count() > 0)
    ReleaseHeld(own);
}

void KVServer::Impl::Serve() {
  std::vector<zmq::message_t> frames;
  std::shared_ptr<const Ownership> applied;
  // The newest view, applied if it changed. Read after every poll so a view
  // installed while polling already governs the messages that woke it.
  auto current_view = [&]() -> std::shared_ptr<const Ownership> {
    std::shared_ptr<const Ownership> own = views_.Current();
    if (own != applied) {
      ApplyView(*own);
      applied = own;
      views_.SetApplied(own);
      Progress(*own);
    }
    return own;
  };
  // Start the tables' clocks (TTL in seconds counts from here).
  AdvanceTables();
  std::vector<zmq::pollitem_t> items;
  std::vector<uint64_t>
      item_links;  // node id of the link polled at items[2 + i]
  while (!serving_.stop_requested()) {
    items.clear();
    item_links.clear();
    items.push_back({data_.socket().handle(), 0, ZMQ_POLLIN, 0});
    items.push_back({nullptr, views_.wake_fd(), ZMQ_POLLIN, 0});
    primary_.AddPollItems(&items, &item_links);
    const size_t tier_item = items.size();
    if (!tiered_.empty())
      items.push_back({nullptr, tier_waits_.wake.fd(), ZMQ_POLLIN, 0});
    try {
      // A move's background work goes on as soon as its budget allows, at
      // once when no request waits (the poll timing out means nothing
      // came in: the thread was idle).
      const bool idle =
          zmq::poll(items.data(), items.size(), MoveWorkPoll(kPollPeriod)) == 0;
      if (items[1].revents & ZMQ_POLLIN) views_.ClearWake();
      const bool readable = (items[0].revents & ZMQ_POLLIN) != 0;
      std::shared_ptr<const Ownership> own = current_view();
      // Backups' answers first: they release answers to workers.
      for (size_t i = 0; i < item_links.size(); ++i) {
        if (items[2 + i].revents & ZMQ_POLLIN)
          primary_.ReadAnswers(item_links[i]);
      }
      if (own->replicated) primary_.MaybeResync(*own);
      // Requests whose cold rows were read go before newer ones.
      if (tier_item < items.size() && (items[tier_item].revents & ZMQ_POLLIN))
        ReleaseTierWaits(*own);
      if (readable) {
        // Drain everything queued before polling again.
        while (!serving_.stop_requested()) {
          frames.clear();
          auto n =
              zmq::recv_multipart(data_.socket(), std::back_inserter(frames),
                                  zmq::recv_flags::dontwait);
          if (!n) break;
          if (frames.empty()) continue;
          // frames[0] is the peer identity added by the ROUTER socket.
          zmq::message_t identity = std::move(frames[0]);
          frames.erase(frames.begin());
          const bool progress_due =
              HandleMessage(std::move(identity), std::move(frames), *own);
          frames = std::vector<zmq::message_t>();
          // Before the next message: see Progress in server_impl.h.
          if (progress_due) Progress(*own);
          // Bounded, and paced where it grows with the table, so the
          // digests, copies and drops go on without delaying requests much.
          RunMoveWork(*own, /*idle=*/false);
        }
        Progress(*own);
      }
      RunMoveWork(*own, idle);
      AdvanceTables();
      // A failure met outside a request (a BSP step applied, a TTL
      // expiry, a checkpoint's read of the cold rows) fences the server
      // too.
      if (!tiered_.empty()) {
        FinishCheckpointWrite(/*wait=*/false);
        StorageFailed();
      }
      Watchdog();
      if (table_stats_.Due(options_.clock->Now())) PublishTableStats();
      MaybeMeasureSlots(*own);
    } catch (const zmq::error_t& e) {
      // A send to a vanished peer or an interrupted poll must not take the
      // server down; log and keep serving.
      ServerLog()->warn("data plane: {}", e.what());
    }
  }
  // A checkpoint being written is reported before the server stops.
  FinishCheckpointWrite(/*wait=*/true);
  PublishTableStats();
  if (replicated_) LogReplicationSummary();
  serving_.MarkStopped();
}

void KVServer::Impl::LogReplicationSummary() const {
  ServerLog()->info(
      "replication: {} updates forwarded to backups, {} replica messages "
      "applied as a backup, {} catch-ups sent ({} rows and blocks), {} slots "
      "taken over, {} duplicate pushes answered, {} pushes without a backup "
      "copy",
      counters_.forwards.load(), counters_.replica_messages.load(),
      counters_.catchups_sent.load(), counters_.rows_copied.load(),
      counters_.slots_promoted.load(), counters_.duplicate_pushes.load(),
      counters_.unreplicated_pushes.load());
}

void KVServer::Impl::PublishTableStats() {
  FinishDrop();  // no row of a slot moved away counts
  ResponseHeader rh;
  FillStats(&rh);
  std::vector<TableStats> stats(rh.table_stats().begin(),
                                rh.table_stats().end());
  table_stats_.Publish(options_.clock->Now(), std::move(stats));
}

std::vector<TableStats> KVServer::Impl::table_stats() const {
  return table_stats_.Get();
}

bool KVServer::Impl::HandleMessage(zmq::message_t identity,
                                   std::vector<zmq::message_t> frames,
                                   const Ownership& own, bool tier_checked) {
  if (replicated_) {
    RequestHeader header;
    if (replication::IsReplica(frames, &header)) {
      if (!tier_checked && !tiered_.empty() &&
          WaitForColdRows(identity, frames)) {
        return false;
      }
      HandleReplica(std::move(identity), std::move(frames), header, own);
      return false;
    }
  }
  // Checked when the request is taken up, not when it arrived: what queued
  // while the process was paused is refused once it resumes with a lapsed
  // lease. Nothing of the request is looked at before (no clock, no key
  // list, no sequence number).
  ServerRefusal refusal = REFUSAL_NONE;
  if (absl::Status serving = lease_fence_.Check(own.rank, &refusal);
      !serving.ok()) {
    static const zmq::message_t kEmpty;
    SendRefusal(identity, frames.empty() ? kEmpty : frames[0], serving, refusal,
                own.epoch);
    return false;
  }
  if (!tier_checked && !tiered_.empty() && WaitForColdRows(identity, frames))
    return false;
  counters_.requests.fetch_add(1, std::memory_order_relaxed);
  ResponseHeader rh;
  zmq::message_t values, keys;
  RequestContext ctx;
  const Outcome outcome = Process(frames, own, &ctx, &rh, &values, &keys);
  if (!tiered_.empty() && StorageFailed()) {
    // Not acknowledged: the request met the failure, or came after it.
    static const zmq::message_t kEmpty;
    const absl::Status refused = lease_fence_.Check(own.rank, &refusal);
    SendRefusal(identity, frames.empty() ? kEmpty : frames[0], refused, refusal,
                own.epoch);
    return false;
  }
  if (outcome == Outcome::kHold) {
    const uint64_t bytes = Admission::FramesBytes(frames);
    counters_.held_bytes += bytes;
    checkpoint_gate_.Hold({std::move(identity), std::move(frames), bytes});
    return ctx.progress_due;
  }
  if (outcome == Outcome::kDefer) {
    RequestHeader h;
    h.ParseFromArray(frames[0].data(), static_cast<int>(frames[0].size()));
    counters_.pulls_deferred.fetch_add(1, std::memory_order_relaxed);
    const uint64_t bytes = Admission::FramesBytes(frames);
    counters_.held_bytes += bytes;
    if (!tiered_.empty()) PinColdRows(frames, /*pin=*/true);
    deferred_.Add({std::move(identity), std::move(frames), h.clock(),
                   h.sender_rank(), options_.clock->Now(), std::move(ctx.needs),
                   bytes});
    return ctx.progress_due;
  }
  if (!replicated_) {
    Send(identity, rh, values, keys);
  } else {
    primary_.Answer(views_.applied().get(), identity, rh, values, keys,
                    std::move(ctx.needs), ctx.first_promoted);
  }
  return ctx.progress_due;
}

void KVServer::Impl::Buffer(uint64_t step, uint64_t node_id, Table* table,
                            absl::Span<const uint64_t> keys,
                            const Segments& segments,
                            absl::Span<const float> grads) {
  consistency_.NoteBuffered(step);
  bsp_.buffers[step].Add(node_id, table, keys, segments, grads);
}

void KVServer::Impl::ApplyBuffered(uint64_t step, StepBuffer& buffer,
                                   uint32_t divisor) {
  // scale_with_workers scales by the configured cluster size, not by
  // `divisor`: the schedule must not jump when one step has fewer pushers.
  buffer.ApplyTo(tables_, step, divisor,
                 options_.config.cluster().num_workers());
  ServerLog()->debug("BSP step {} applied: {} workers averaged", step, divisor);
}

void KVServer::Impl::Progress(const Ownership& own) {
  uint64_t step;
  MaybeWriteCheckpoint(own);
  while (consistency_.NextCompleteStep(&step, checkpoint_gate_.StepLimit())) {
    auto it = bsp_.buffers.find(step);
    // finished_ marks exactly the buffered steps, so the buffer exists.
    if (it != bsp_.buffers.end()) {
      const uint32_t divisor =
          std::max<uint32_t>(consistency_.FinishedCount(step),
                             static_cast<uint32_t>(it->second.pushers.size()));
      ApplyBuffered(step, it->second, divisor);
      bsp_.buffers.erase(it);
      StepDone(step, divisor);
    }
    consistency_.ForgetStep(step);
    consistency_.StepApplied();
    counters_.bsp_steps_applied.fetch_add(1, std::memory_order_relaxed);
  }
  if (checkpoint_gate_.pending() != 0) {
    MaybeWriteCheckpoint(own);
    if (checkpoint_gate_.pending() == 0) {
      // Written: apply what waited for it.
      Progress(own);
      return;
    }
  }
  // Answer held pulls that may now be answered, oldest first. Most calls
  // (any one worker's clock advance) release none; the index says so
  // without walking the queue.
  deferred_.AnswerAllowed(
      [this](uint64_t clock) { return PullAllowed(clock); },
      [&](DeferredPull& pull) {
        // Released before the answer leaves, so a client that has its
        // answer sees the server's held bytes without this pull.
        counters_.held_bytes -= pull.bytes;
        ResponseHeader rh;
        zmq::message_t values, keys;
        ServerRefusal refusal = REFUSAL_NONE;
        if (absl::Status serving = lease_fence_.Check(own.rank, &refusal);
            !serving.ok()) {
          // Not answered from a view that may be stale. A PUSH_PULL's push
          // half was applied when it arrived: the client's retry (same
          // sequence number) is answered as a duplicate by whoever owns the
          // slots then.
          SendRefusal(pull.identity, pull.frames[0], serving, refusal,
                      own.epoch);
        } else {
          RequestContext ctx;  // a plain PULL: waits for nothing new
          Process(pull.frames, own, &ctx, &rh, &values, &keys);
          if (!tiered_.empty() && StorageFailed()) {
            SendRefusal(pull.identity, pull.frames[0],
                        lease_fence_.Check(own.rank, &refusal), refusal,
                        own.epoch);
          } else {
            if (instruments_ != nullptr) {
              instruments_->RecordHold(
                  absl::ToDoubleSeconds(options_.clock->Now() - pull.since));
            }
            if (replicated_) {
              primary_.Answer(views_.applied().get(), pull.identity, rh,
                              values, keys, std::move(pull.needs), false);
            } else {
              Send(pull.identity, rh, values, keys);
            }
          }
        }
        if (!tiered_.empty()) PinColdRows(pull.frames, /*pin=*/false);
      });
}

void KVServer::Impl::FlushBuffers() {
  // Leaving BSP: apply what was gathered, step by step, averaged over the
  // workers that took part.
  for (auto& [step, buffer] : bsp_.buffers) {
    const uint32_t divisor =
        std::max<uint32_t>(consistency_.FinishedCount(step),
                           static_cast<uint32_t>(buffer.pushers.size()));
    ApplyBuffered(step, buffer, divisor);
    StepDone(step, divisor);
    consistency_.ForgetStep(step);
  }
  bsp_.buffers.clear();
}

void KVServer::Impl::StepDone(uint64_t step, uint32_t divisor) {
  if (!replicated_) return;
  bsp_.NoteDivisor(step, divisor);
  primary_.AnnounceStep(views_.applied().get(), step, divisor);
}

bool KVServer::Impl::PullAllowed(uint64_t clock) const {
  return checkpoint_gate_.PullAllowed(clock) && consistency_.PullReady(clock);
}

void KVServer::Impl::NoteClock(uint64_t clock) {
  if (clock < kFinishedClock) server_clock_ = std::max(server_clock_, clock);
}

void KVServer::Impl::AdvanceTables() {
  const absl::Time now = options_.clock->Now();
  for (auto& [id, table] : tables_) {
    if (SparseTable* sparse = table->AsSparse())
      sparse->Advance(server_clock_, now);
  }
}

void KVServer::Impl::FillStats(ResponseHeader* rh, const Ownership* own) const {
  std::vector<uint32_t> ids;
  for (const auto& [id, table] : tables_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint32_t id : ids) {
    TableStats* stats = rh->add_table_stats();
    *stats = tables_.at(id)->Stats();
    if (own == nullptr) continue;
    // Separate the backup copies: a pass over the table's rows.
    const uint32_t num_slots = static_cast<uint32_t>(own->slot_owner.size());
    auto mine = [&](uint32_t slot) {
      return own->slot_owner[slot] == own->rank;
    };
    // A sparse table counts rows, a dense one elements (as Stats() does).
    // Rows in RAM only, as rows() counts them: a disk tier's cold_rows
    // count both kinds, and are not read for a statistic.
    const Table& table = *tables_.at(id);
    uint64_t backup = 0;
    if (const SparseTable* sparse = table.AsSparse()) {
      sparse->ForEachKey([&](uint64_t key) {
        backup += !mine(SparseSlot(id, key, num_slots));
      });
    } else {
      const DenseTable& dense = *table.AsDense();
      // The callback never fails.
      dense
          .ForEachBlock([&](uint64_t block, absl::Span<const float> values,
                            absl::Span<const float>) {
            if (!mine(DenseBlockSlot(id, block, num_slots)))
              backup += values.size();
            return absl::OkStatus();
          })
          .IgnoreError();
    }
    stats->set_rows(stats->rows() - std::min(stats->rows(), backup));
    stats->set_backup_rows(backup);
    stats->set_keys_pushed(
        stats->keys_pushed() -
        std::min(stats->keys_pushed(), replicas_.applied(id)));
  }
}

void KVServer::Impl::Watchdog() {
  if (deferred_.empty()) return;
  const ConsistencyConfig& c = consistency_.config();
  const absl::Time now = options_.clock->Now();
  if (!deferred_.WatchdogDue(now, absl::Milliseconds(c.watchdog_timeout_ms()),
                             absl::Milliseconds(c.watchdog_interval_ms()))) {
    return;
  }
  const DeferredPull& oldest = deferred_.front();
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
  ServerLog()->warn(
      "watchdog: {} pull(s) held; the oldest, from worker rank {} at clock {}, "
      "has waited {:.1f} s ({}, applied steps < {}); waiting for worker ranks: "
      "{}",
      deferred_.size(), oldest.rank, oldest.clock,
      absl::ToDoubleSeconds(now - oldest.since),
      consistency_.mode() == SSP ? absl::StrCat("SSP staleness ", c.staleness())
                                 : ConsistencyMode_Name(consistency_.mode()),
      consistency_.applied_clock(),
      missing.empty() ? "none (clock reports in flight)"
                      : absl::StrJoin(missing, ", "));
}

}  // namespace ps
