// KVServer's request pipeline: every worker request passes
//
//   Decode -> Admit -> (STATS, PREFETCH, ADVANCE_CLOCK, SCAN: answered here)
//          -> Route -> Police -> Validate -> Keep? -> Apply -> AnswerPull
//
// The invariant "a refused request changes nothing" (server/server.h) holds
// by construction: Validate is const and only fills a ValidatedUpdate, and
// Apply, the only step that changes tables, sequence records, BSP buffers
// or backups, runs only once every check passed. What runs before Apply and
// does change something is documented as deliberate: Admit keeps the
// sender's key list and standalone-sender slot (a failing request still
// moves the sender's slots), the clock notes, Police's non-finite counts,
// and counters of refusals. Keep (hold for a checkpoint, defer a pull)
// only puts the request aside, to run through the pipeline again.
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/protocol.h"
#include "common/status.h"
#include "common/value_codec.h"
#include "common/wire.h"
#include "server/server_impl.h"
#include "server/server_log.h"

namespace ps {

namespace {

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

KVServer::Impl::Outcome KVServer::Impl::Process(
    std::vector<zmq::message_t>& frames, const Ownership& own,
    RequestContext* ctx, ResponseHeader* rh, zmq::message_t* values,
    zmq::message_t* keys) {
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
  try {
    status = ProcessChecked(frames, own, ctx, rh, values, keys, &outcome);
  } catch (const std::bad_alloc&) {
    // Validation already refuses oversized requests; this is the machine
    // running out of memory. The request fails, the server keeps serving.
    status =
        absl::ResourceExhaustedError("server out of memory for this request");
  }
  if (!status.ok()) {
    counters_.errors.fetch_add(1, std::memory_order_relaxed);
    SetResponseStatus(status, rh);
    rh->set_num_values(0);
    rh->set_num_keys(0);
    rh->set_next_cursor(0);
    *values = zmq::message_t();
    *keys = zmq::message_t();
    ServerLog()->debug("request {} rejected: {}", rh->request_id(),
                       status.ToString());
    if (instruments_ != nullptr) {
      instruments_->RecordError(ServerInstruments::Classify(status, *rh));
      instruments_->Record(ctx->op, ServerInstruments::Outcome::kError,
                           bytes_in, 0, start);
    }
    return Outcome::kAnswer;
  }
  if (instruments_ != nullptr) {
    instruments_->Record(
        ctx->op,
        outcome == Outcome::kDefer  ? ServerInstruments::Outcome::kDeferred
        : outcome == Outcome::kHold ? ServerInstruments::Outcome::kHeld
                                    : ServerInstruments::Outcome::kOk,
        bytes_in, values->size() + keys->size(), start);
  }
  return outcome;
}

absl::Status KVServer::Impl::ProcessChecked(
    std::vector<zmq::message_t>& frames, const Ownership& own,
    RequestContext* ctx, ResponseHeader* rh, zmq::message_t* values,
    zmq::message_t* keys, Outcome* outcome) {
  Request r;
  PS_RETURN_IF_ERROR(Decode(frames, ctx, rh, &r));
  const RequestHeader& h = r.req.header;
  PS_RETURN_IF_ERROR(Admit(frames, own, rh, &r));

  // Ops that are not updates of a table's values.
  if (h.op() == STATS) {
    if (!r.req.keys.empty())
      return absl::InvalidArgumentError("STATS carries no keys");
    FinishDrop();  // no row of a slot moved away counts
    FillStats(rh, own.replicated && !own.slot_owner.empty() ? &own : nullptr);
    return absl::OkStatus();
  }
  // A hint overtakes requests waiting for disk reads: it notes no clock.
  if (h.op() == PREFETCH) return Prefetch(r, own);
  NoteClocks(h, own);
  if (h.op() == ADVANCE_CLOCK) {
    if (!r.req.keys.empty()) {
      return absl::InvalidArgumentError("ADVANCE_CLOCK carries no keys");
    }
    if (h.restart()) {
      consistency_.Restart(h.sender_node_id(), h.clock());
    } else {
      consistency_.Advance(h.sender_node_id(), h.clock());
    }
    ctx->progress_due = true;
    return absl::OkStatus();
  }
  if (h.op() == SCAN) return ScanOp(frames, own, h, rh, values, keys, outcome);

  // PUSH, PULL, PUSH_PULL, ASSIGN.
  ValidatedUpdate v;
  PS_ASSIGN_OR_RETURN(v.table, Route(h, own));
  v.sparse = v.table->AsSparse();
  v.dense = v.table->AsDense();
  v.assign = h.op() == ASSIGN;
  // An ASSIGN is validated like a push (values for every element, finite).
  v.push = h.op() == PUSH || h.op() == PUSH_PULL || v.assign;
  v.pull = h.op() == PULL || h.op() == PUSH_PULL;
  if (v.push) {
    // Before the copies below: what is forwarded, buffered or held is the
    // policed gradient. Rewrites only the request's own values.
    PS_RETURN_IF_ERROR(admission_.PolicePushValues(
        h, own.all, own.worker_rank, v.assign,
        const_cast<float*>(r.req.values.data()), r.req.values.size()));
  }
  if (own.replicated && v.push) MakeSelfContained(r, frames);

  const absl::Status valid = Validate(r, own, rh, &v);
  // Notes Validate leaves to its caller (it changes nothing itself): they
  // hold whether or not the request passed.
  if (v.first_promoted) ctx->first_promoted = true;
  if (v.note_owned) {
    r.key_list->owned_epoch = own.epoch;
    r.key_list->owned_table = h.table_id();
  }
  if (v.over_budget) v.sparse->CountRefusedPush();
  if (v.fenced)
    counters_.move_fenced_refusals.fetch_add(1, std::memory_order_relaxed);
  PS_RETURN_IF_ERROR(valid);

  // Keep: put aside to run again (nothing applied yet).
  if (v.hold) {
    MakeSelfContained(r, frames);
    PS_RETURN_IF_ERROR(
        admission_.RoomToHold(frames, "pushes wait for a checkpoint"));
    *outcome = Outcome::kHold;
    return absl::OkStatus();
  }
  if (v.defer_pull && h.op() == PULL) {
    // A plain pull over the budget is refused (nothing was done).
    PS_RETURN_IF_ERROR(
        admission_.RoomToHold(frames, "requests wait for slower workers"));
  }

  PS_RETURN_IF_ERROR(Apply(r, v, frames, own, ctx, rh));
  if (!v.pull) return absl::OkStatus();
  if (v.defer_pull) {
    // A PUSH_PULL's push half is applied already: its pull is held anyway
    // (keys only), so the push is not applied twice.
    MakeSelfContained(r, frames);
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
  AnswerPull(r, v, rh, values);
  return absl::OkStatus();
}

absl::Status KVServer::Impl::Prefetch(const Request& r, const Ownership& own) {
  const RequestHeader& h = r.req.header;
  PS_ASSIGN_OR_RETURN(Table * table, Route(h, own));
  if (h.key_list_slot() != 0)
    return absl::InvalidArgumentError("PREFETCH carries its keys");
  SparseTable* sparse = table->AsSparse();
  if (sparse == nullptr || sparse->cold_reader() == nullptr)
    return absl::OkStatus();
  absl::Span<const uint64_t> keys = r.req.keys;
  std::vector<uint64_t> owned;
  if (!own.all && !own.owns_every_slot) {
    const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
    for (uint64_t key : keys) {
      if (own.slot_owner[SparseSlot(h.table_id(), key, num_slots)] == own.rank)
        owned.push_back(key);
    }
    keys = owned;
  }
  (void)sparse->ColdWait(keys, /*promote=*/true);
  counters_.keys_prefetched.fetch_add(keys.size(), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status KVServer::Impl::Decode(std::vector<zmq::message_t>& frames,
                                    RequestContext* ctx, ResponseHeader* rh,
                                    Request* r) {
  r->self_contained = false;
  absl::Status status = DecodeRequest(frames, &r->req);
  rh->set_request_id(r->req.header.request_id());
  if (!status.ok()) return status;
  ctx->op = r->req.header.op();
  // Requests that are kept (held, deferred) or forwarded to backups carry
  // their keys and float32 values in their own frames: a cached list may
  // be replaced meanwhile, and backups take float32 only.
  r->self_contained = r->req.header.key_list_slot() == 0 &&
                      EncodedValueBytes(r->req.header.push_values()) == 4;
  return absl::OkStatus();
}

absl::Status KVServer::Impl::Admit(const std::vector<zmq::message_t>& frames,
                                   const Ownership& own, ResponseHeader* rh,
                                   Request* r) {
  const RequestHeader& h = r->req.header;
  if (h.replica()) {
    return absl::InvalidArgumentError(
        "replica messages are for servers of a job with cluster.replication 2 "
        "or cluster.elastic");
  }
  PS_RETURN_IF_ERROR(admission_.AdmitRequest(
      Admission::FramesBytes(frames), h, own.all, own.worker_rank, own.epoch));
  if (h.key_list_slot() == 0) return absl::OkStatus();
  // The cached key list the request uses or stores. Before any other
  // check, so this server's record of the sender's slots follows the
  // sender's even when the request fails later.
  if (r->req.keys_cached) {
    r->key_list = key_cache_.Find(h.sender_node_id(), h.key_list_slot(),
                                  h.key_list_digest(), h.num_keys());
    if (r->key_list == nullptr) {
      rh->set_key_list_unknown(true);
      return absl::FailedPreconditionError(absl::StrCat(
          "key list slot ", h.key_list_slot(), " of node ", h.sender_node_id(),
          " does not hold the list named; send the keys"));
    }
    r->req.keys = absl::MakeConstSpan(r->key_list->keys);
  } else {
    PS_RETURN_IF_ERROR(key_cache_.Store(h.sender_node_id(), h.key_list_slot(),
                                        h.key_list_digest(), r->req.keys));
    r->key_list = key_cache_.Stored(h.sender_node_id(), h.key_list_slot());
  }
  return absl::OkStatus();
}

void KVServer::Impl::MakeSelfContained(Request& r,
                                       std::vector<zmq::message_t>& frames) {
  // A kept request must also not name its slot any more: processed again,
  // it would store its list a second time, over what the sender may have
  // put in that slot since.
  if (r.self_contained) return;
  r.self_contained = true;
  RequestHeader plain = r.req.header;
  plain.clear_key_list_slot();
  plain.clear_key_list_digest();
  plain.clear_push_values();
  frames[0] = SerializeToFrame(plain);
  if (r.req.keys_cached) {
    frames[1] =
        zmq::message_t(r.req.keys.data(), r.req.keys.size() * sizeof(uint64_t));
  }
  if (frames.size() == 3 && !r.req.value_copy.empty()) {
    frames[2] = zmq::message_t(r.req.values.data(),
                               r.req.values.size() * sizeof(float));
  }
}

void KVServer::Impl::NoteClocks(const RequestHeader& h, const Ownership& own) {
  // Tools (node 0) do not move the server's clock: only workers' steps do.
  if (own.all || h.sender_node_id() != 0) NoteClock(h.clock());
  // Any request at clock c tells that its sender completed c steps, and
  // its pushes of those steps to this server arrived before it (messages of
  // one sender to one server keep their order). A server that replaced a
  // dead one learns live workers' clocks this way without waiting for
  // their next ADVANCE_CLOCK. (ADVANCE_CLOCK itself is applied by its op.)
  if (h.op() != ADVANCE_CLOCK && h.clock() < kFinishedClock &&
      h.sender_node_id() != 0) {
    consistency_.Advance(h.sender_node_id(), h.clock());
  }
}

absl::StatusOr<Table*> KVServer::Impl::Route(const RequestHeader& h,
                                             const Ownership& own) const {
  auto it = tables_.find(h.table_id());
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown table ", h.table_id()));
  }
  if (!own.all && own.slot_owner.empty()) {
    return absl::UnavailableError("server has no cluster view yet");
  }
  return it->second.get();
}

absl::Status KVServer::Impl::Validate(const Request& r, const Ownership& own,
                                      ResponseHeader* rh,
                                      ValidatedUpdate* v) const {
  const RequestHeader& h = r.req.header;
  const absl::Span<const uint64_t> keys = r.req.keys;
  const uint32_t num_slots = static_cast<uint32_t>(own.slot_owner.size());
  auto not_owner = [&](uint32_t slot) {
    rh->set_wrong_owner(true);
    return absl::FailedPreconditionError(
        absl::StrCat("slot ", slot, " is owned by server ",
                     own.slot_owner[slot], ", not this server (rank ", own.rank,
                     ") in epoch ", own.epoch, "; refresh the cluster view"));
  };
  PS_RETURN_IF_ERROR(
      ValidateShape(h, *v->table, keys, r.req.values, v->push, &v->n));

  // Ownership.
  if (own.replicated) {
    // The slots are kept: forwarding to backups needs them too.
    SlotsOf(h, *v->table, keys, num_slots, &v->slots);
    for (uint32_t slot : v->slots) {
      if (own.slot_owner[slot] != own.rank) return not_owner(slot);
    }
    PS_RETURN_IF_ERROR(CheckNotFenced(h, own, v, rh));
    if (failover_.Touches(v->slots)) v->first_promoted = true;
  } else if (!own.all && !own.owns_every_slot) {
    if (v->sparse != nullptr) {
      // A cached list checked in this view needs no second look.
      const KeyListCache::List* list = r.key_list;
      if (list == nullptr || list->owned_epoch != own.epoch ||
          list->owned_table != h.table_id()) {
        for (uint64_t key : keys) {
          const uint32_t slot = SparseSlot(h.table_id(), key, num_slots);
          if (own.slot_owner[slot] != own.rank) return not_owner(slot);
        }
        v->note_owned = list != nullptr;
      }
    } else {
      for (const DenseSegment& s : h.segments()) {
        const uint32_t slot = DenseBlockSlot(
            h.table_id(), s.begin() / v->dense->block_size(), num_slots);
        if (own.slot_owner[slot] != own.rank) return not_owner(slot);
      }
    }
  }

  if (v->push && v->sparse != nullptr) {
    if (absl::Status room = v->sparse->CheckPush(
            keys, r.key_list != nullptr ? &r.key_list->rows : nullptr);
        !room.ok()) {
      v->over_budget = true;
      return room;
    }
  }
  v->defer_pull = v->pull && !PullAllowed(h.clock());
  if (!v->push) return absl::OkStatus();
  const bool buffered = consistency_.ShouldBuffer(h.clock());
  // A push of a step at or after a checkpoint in progress waits until the
  // shard is written (BSP buffers it anyway: buffered steps >= the
  // checkpoint's clock are not applied before it).
  if (checkpoint_gate_.MustHold(h.clock(), buffered)) {
    v->hold = true;
    return absl::OkStatus();
  }
  if (!v->assign && buffered &&
      h.clock() - consistency_.applied_clock() >
          ConsistencyController::kMaxStepsAhead) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push for step ", h.clock(), " is more than ",
        ConsistencyController::kMaxStepsAhead,
        " steps ahead of the applied step ", consistency_.applied_clock()));
  }
  v->buffer = buffered && !v->assign;
  if (h.seq() != 0) {
    auto window = seqs_.find(h.sender_node_id());
    switch (window == seqs_.end() ? SeqWindow::Check::kNew
                                  : window->second.Test(h.seq())) {
      case SeqWindow::Check::kNew:
        break;
      case SeqWindow::Check::kDuplicate:
        v->duplicate = true;
        break;
      case SeqWindow::Check::kTooOld:
        return absl::AbortedError(absl::StrCat(
            "push sequence number ", h.seq(), " of node ", h.sender_node_id(),
            " is too old to tell whether it was applied; not applied"));
    }
  }
  return absl::OkStatus();
}

absl::Status KVServer::Impl::CheckNotFenced(const RequestHeader& h,
                                            const Ownership& own,
                                            ValidatedUpdate* v,
                                            ResponseHeader* rh) const {
  // A slot move's fence: nothing more is applied to the slot here until
  // the view hands it to its target (or drops the move); the worker sends
  // again, to whoever owns it by then. Pulls are answered.
  if (!v->push || own.slot_fenced.empty()) return absl::OkStatus();
  for (uint32_t slot : v->slots) {
    if (!own.fenced(slot)) continue;
    v->fenced = true;
    // Not applied now, and (its number unrecorded) never before here.
    const auto window = seqs_.find(h.sender_node_id());
    rh->set_not_applied(h.seq() != 0 &&
                        (window == seqs_.end() ||
                         window->second.Test(h.seq()) ==
                             SeqWindow::Check::kNew));
    return absl::UnavailableError(absl::StrCat(
        "slot ", slot, " is moving to server ", own.learner(slot),
        " and takes no push until the move flips (epoch ", own.epoch,
        "); not applied, send again"));
  }
  return absl::OkStatus();
}

absl::Status KVServer::Impl::Apply(const Request& r, const ValidatedUpdate& v,
                                   std::vector<zmq::message_t>& frames,
                                   const Ownership& own, RequestContext* ctx,
                                   ResponseHeader* rh) {
  if (!v.push) return absl::OkStatus();
  const RequestHeader& h = r.req.header;
  const absl::Span<const uint64_t> keys = r.req.keys;
  const absl::Span<const float> values = r.req.values;
  if (v.duplicate) {
    rh->set_duplicate(true);
    counters_.duplicate_pushes.fetch_add(1, std::memory_order_relaxed);
    // Acknowledged only once the backups hold it (they may still be
    // taking it, from this server or in a catch-up). UNAVAILABLE while a
    // backup is copied again: a duplicate applies nothing either way.
    if (own.replicated)
      return primary_.NeedsForDuplicate(own, v.slots, &ctx->needs);
    return absl::OkStatus();
  }
  if (h.seq() != 0) seqs_[h.sender_node_id()].Record(h.seq());
  Table* table = v.table;
  if (v.assign) {
    v.dense->Assign(h.segments(), values.data());
    if (own.replicated) {
      primary_.Forward(own, h, REPLICA_APPLY, 1.0f, *table, keys, values,
                       frames, v.slots, &ctx->needs);
    }
    return absl::OkStatus();
  }
  if (v.buffer) {
    Buffer(h.clock(), h.sender_node_id(), table, keys, h.segments(), values);
    // Applied when the step completes: its rows read from disk stay in RAM
    // till then (the promotions let them go).
    if (v.sparse != nullptr) v.sparse->PinColdReads(keys);
    if (own.replicated) {
      primary_.Forward(own, h, REPLICA_BUFFER, 1.0f, *table, keys, values,
                       frames, v.slots, &ctx->needs);
    }
  } else {
    // Staleness: how far this push's step is behind the server's clock.
    const uint64_t staleness =
        server_clock_ > h.clock() ? server_clock_ - h.clock() : 0;
    const float lr_scale = table->RateScale(
        h.clock(), staleness, options_.config.cluster().num_workers());
    if (v.sparse != nullptr) {
      v.sparse->Push(keys, values.data(), lr_scale,
                     r.key_list != nullptr ? &r.key_list->rows : nullptr);
    } else {
      v.dense->Push(h.segments(), values.data(), lr_scale);
    }
    if (own.replicated) {
      primary_.Forward(own, h, REPLICA_APPLY, lr_scale, *table, keys, values,
                       frames, v.slots, &ctx->needs);
    }
    checkpoint_gate_.NoteApplied(h.clock());
  }
  counters_.keys_pushed.fetch_add(v.sparse != nullptr ? keys.size() : v.n,
                                  std::memory_order_relaxed);
  return absl::OkStatus();
}

void KVServer::Impl::AnswerPull(const Request& r, const ValidatedUpdate& v,
                                ResponseHeader* rh, zmq::message_t* values) {
  const RequestHeader& h = r.req.header;
  const uint64_t n = v.n;
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
  if (v.sparse != nullptr) {
    // A cached list's rows, found by the pull of a step, serve its push.
    v.sparse->Pull(r.req.keys, out,
                   r.key_list != nullptr ? &r.key_list->rows : nullptr);
    counters_.keys_pulled.fetch_add(r.req.keys.size(),
                                    std::memory_order_relaxed);
  } else {
    v.dense->Pull(h.segments(), out);
    counters_.keys_pulled.fetch_add(n, std::memory_order_relaxed);
  }
  if (encoding != FLOAT32) {
    *values = zmq::message_t(n * EncodedValueBytes(encoding));
    EncodeValues(encoding, out, n, values->data());
    rh->set_values_encoding(encoding);
  }
  rh->set_num_values(n);
  const uint64_t min_clock = consistency_.MinClock();
  rh->set_min_clock(min_clock == ConsistencyController::kNoWorkers ? 0
                                                                   : min_clock);
  rh->set_applied_clock(consistency_.applied_clock());
}

absl::Status KVServer::Impl::ValidateShape(const RequestHeader& h,
                                           const Table& table,
                                           absl::Span<const uint64_t> keys,
                                           absl::Span<const float> values,
                                           bool push, uint64_t* n) const {
  const SparseTable* sparse = table.AsSparse();
  const DenseTable* dense = table.AsDense();
  *n = 0;
  if (h.op() == ASSIGN && sparse != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", h.table_id(), " is sparse; ASSIGN writes dense tables"));
  }
  if (sparse != nullptr) {
    if (h.segments_size() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", h.table_id(),
                       " is sparse; requests carry keys, not segments"));
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
    return absl::InvalidArgumentError(
        absl::StrCat("table ", h.table_id(),
                     " is dense; requests carry segments, not keys"));
  }
  PS_RETURN_IF_ERROR(dense->ValidateSegments(h.segments()));
  for (const DenseSegment& s : h.segments()) *n += s.length();
  PS_RETURN_IF_ERROR(CheckResponseSize(*n));
  if (push && values.size() != *n) {
    return absl::InvalidArgumentError(absl::StrCat("dense push addresses ", *n,
                                                   " elements but carries ",
                                                   values.size(), " values"));
  }
  return absl::OkStatus();
}

void KVServer::Impl::SlotsOf(const RequestHeader& h, const Table& table,
                             absl::Span<const uint64_t> keys,
                             uint32_t num_slots,
                             std::vector<uint32_t>* slots) const {
  slots->clear();
  if (table.AsSparse() != nullptr) {
    slots->reserve(keys.size());
    for (uint64_t key : keys)
      slots->push_back(SparseSlot(h.table_id(), key, num_slots));
    return;
  }
  const uint64_t block_size = table.AsDense()->block_size();
  for (const DenseSegment& s : h.segments()) {
    slots->push_back(
        DenseBlockSlot(h.table_id(), s.begin() / block_size, num_slots));
  }
}

}  // namespace ps
