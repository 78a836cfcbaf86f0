#include "worker/kv_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/finite.h"
#include "common/logging.h"
#include "common/protocol.h"
#include "common/value_codec.h"
#include "common/wire.h"
#include "proto/data_plane.pb.h"
#include "worker/io_loop.h"
#include "worker/router.h"
#include "zmq.hpp"

namespace ps {
namespace {

using kv_internal::NonFiniteError;

std::shared_ptr<spdlog::logger> Log() {
  static auto* const logger =
      new std::shared_ptr<spdlog::logger>(GetLogger("kv_client"));
  return *logger;
}

// A null Options::clock means the real one.
KVClient::Options WithClock(KVClient::Options options) {
  if (options.clock == nullptr) options.clock = Clock::Real();
  return options;
}

// Fills a sparse request part's key frame, and for a push its value frame
// in `encoding`, with the keys (and their rows of `dim` gradients) at
// `idx`, or with all of them in order when `idx` is empty. The frames are
// allocated at their exact size and each byte is written once.
void FillSparseFrames(absl::Span<const uint64_t> keys,
                      absl::Span<const float> grads, uint32_t dim, bool push,
                      ValueEncoding encoding, const std::vector<uint32_t>& idx,
                      kv_internal::Part* part) {
  const size_t n = idx.empty() ? keys.size() : idx.size();
  // zmq::message_t(size) allocates without initialising (malloc), so each
  // byte is written once.
  part->keys = zmq::message_t(n * sizeof(uint64_t));
  const size_t width = EncodedValueBytes(encoding);
  if (push) {
    part->values = zmq::message_t(n * dim * width);
    part->has_values = true;
  }
  auto* k = static_cast<uint64_t*>(part->keys.data());
  if (idx.empty()) {
    // Every key on one server, in order: plain copies, no scatter map.
    std::memcpy(k, keys.data(), n * sizeof(uint64_t));
    if (push) {
      EncodeValues(encoding, grads.data(), grads.size(), part->values.data());
    }
    return;
  }
  for (size_t j = 0; j < n; ++j) k[j] = keys[idx[j]];
  if (!push) return;
  // Gathered straight into the frame, or for a half-width encoding into a
  // scratch buffer that is then encoded into it.
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
  if (width != sizeof(float)) {
    EncodeValues(encoding, v, n * dim, part->values.data());
  }
}

// One server's share of a dense request while it is built.
struct DenseFrame {
  RequestHeader header;
  zmq::message_t values;
  char* fill = nullptr;  // next free byte of `values`
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  uint64_t total = 0;
  bool unchecked = false;  // zero-copy values left to the server's check
};

// Gives each server that receives values of a dense push or assign its
// value frame. Each frame is allocated at its exact size and filled in
// place later (FillDenseFrames): no growth, no zero-filling, no copy into
// a frame afterwards. With `shared` (zero-copy) a server whose share is
// one contiguous piece of float32 values gets a frame pointing into
// `shared` instead.
//
// A push that one server receives whole is all-or-nothing by that
// server's own check (it rejects a non-finite value before applying
// anything, with the element's index), so the zero-copy form leaves the
// check to it: one read pass over the tensor fewer on the sender. Spread
// over servers, the sender checks first, so no server applies its share
// of a push another would reject. False when that check finds a
// non-finite value in `grads`.
bool AllocateDenseFrames(
    const kv_internal::DenseSplit& split, absl::Span<const float> grads,
    size_t width, bool check_finite,
    const std::shared_ptr<const std::vector<float>>& shared,
    std::vector<DenseFrame>* frames) {
  const std::vector<uint64_t>& totals = split.totals;
  const size_t receivers = static_cast<size_t>(std::count_if(
      totals.begin(), totals.end(), [](uint64_t t) { return t != 0; }));
  const bool left_to_server = receivers == 1;
  bool checked = left_to_server;
  for (size_t s = 0; s < totals.size(); ++s) {
    DenseFrame& f = (*frames)[s];
    if (totals[s] == 0) continue;
    if (shared != nullptr && width == sizeof(float) && split.contiguous[s]) {
      // One read pass instead of a copy: the check reads every value once
      // for all the zero-copy frames.
      if (check_finite && !checked) {
        if (!AllFinite(grads)) return false;
        checked = true;
      }
      f.unchecked = check_finite && left_to_server;
      f.values = FrameFromShared(shared, split.first[s], totals[s]);
      continue;  // fill stays null: nothing to copy
    }
    f.values = zmq::message_t(totals[s] * width);
    f.fill = static_cast<char*>(f.values.data());
  }
  return true;
}

// Adds each piece of `split` to its server's frame: the segment, where
// its answer goes and (for a push or assign, `values`) its values in
// `encoding`. False when a float32 value copied is not finite (the
// caller decides whether that matters).
bool FillDenseFrames(const kv_internal::DenseSplit& split, bool values,
                     absl::Span<const float> grads, ValueEncoding encoding,
                     std::vector<DenseFrame>* frames) {
  const size_t width = EncodedValueBytes(encoding);
  bool finite = true;
  for (const kv_internal::DensePiece& piece : split.pieces) {
    DenseFrame& b = (*frames)[piece.owner];
    DenseSegment* seg = b.header.add_segments();
    seg->set_begin(piece.begin);
    seg->set_length(piece.length);
    if (values && b.fill != nullptr) {
      const float* src = grads.data() + piece.offset;
      if (width == sizeof(float)) {
        finite &=
            CopyFinite(src, piece.length, reinterpret_cast<float*>(b.fill));
      } else {
        EncodeValues(encoding, src, piece.length, b.fill);
      }
      b.fill += piece.length * width;
    }
    b.runs.emplace_back(piece.offset, piece.length);
    b.total += piece.length;
  }
  return finite;
}

}  // namespace

// ------------------------------------------------------------ Completion
// (Completion::State is in worker/io_loop.h: the I/O thread completes it.)

uint64_t Completion::min_clock() const {
  absl::MutexLock lock(&state_->mu);
  return state_->remaining == 0 && state_->min_clock != UINT64_MAX
             ? state_->min_clock
             : 0;
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
  const bool finished =
      s->mu.AwaitWithTimeout(absl::Condition(
                                 +[](State* st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                                      st->mu) { return st->remaining == 0; },
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
      std::all_of(
          routing->slot_owner.begin(), routing->slot_owner.end(),
          [&](uint32_t owner) { return owner == routing->slot_owner[0]; })) {
    routing->sole_owner = routing->slot_owner[0];
  }
  for (uint32_t owner : routing->slot_owner) {
    routing->num_servers = std::max(routing->num_servers, owner + 1);
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
  const uint32_t max_servers = MaxServerRanks(options.config.cluster());
  for (uint32_t owner : view.slot_owner()) {
    if (owner >= max_servers) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot map names server ", owner, " but the job has ",
                       max_servers, " server ranks"));
    }
  }
  return std::unique_ptr<KVClient>(
      new KVClient(std::move(options), MakeRouting(view)));
}

KVClient::KVClient(Options options, std::shared_ptr<const Routing> routing)
    : options_(WithClock(std::move(options))),
      request_timeout_(
          absl::Milliseconds(options_.config.cluster().request_timeout_ms())),
      routing_(routing),
      io_(std::make_unique<IoLoop>(
          routing,
          IoLoop::Options{
              request_timeout_,
              absl::Milliseconds(
                  options_.config.cluster().failover_timeout_ms() > 0
                      ? options_.config.cluster().failover_timeout_ms()
                      : 120000),
              options_.config.data_plane().key_cache_bytes() > 0
                  ? options_.config.data_plane().key_cache_bytes()
                  : 0,
              options_.curve, options_.clock},
          &next_request_id_, &next_seq_)) {
  clock_.store(options_.start_clock);
  const DataPlaneConfig& dp = options_.config.data_plane();
  // Only registered clients cache key lists: servers keep lists per node
  // id, and tools that did not register all send node id 0, so they would
  // overwrite each other's slots and share one budget.
  key_caching_ = dp.key_cache_bytes() > 0 && options_.node_id != 0;
  push_values_ =
      EncodedValueBytes(dp.push_values()) == 2 ? dp.push_values() : FLOAT32;
  pull_values_ =
      EncodedValueBytes(dp.pull_values()) == 2 ? dp.pull_values() : FLOAT32;
  servers_clip_nonfinite_ =
      dp.gradients().nonfinite() == GradientPolicy::CLIP &&
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
    if (owner >= MaxServerRanks(options_.config.cluster())) {
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
    checkpoint_clock_.store(view.checkpoint_clock());
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

ConsistencyMode KVClient::consistency_mode() const { return routing()->mode; }

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

Completion KVClient::Prefetch(uint32_t table, absl::Span<const uint64_t> keys,
                              DoneCallback done) {
  return Sparse(PREFETCH, table, keys, {}, nullptr, std::move(done));
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
    return Failed(absl::InvalidArgumentError("PushDense: null gradients"),
                  std::move(done));
  }
  const absl::Span<const float> span(*grads);
  return Dense(PUSH, table, begin, span.size(), span, nullptr, std::move(done),
               std::move(grads));
}

Completion KVClient::PullDense(uint32_t table, uint64_t begin, uint64_t count,
                               DenseValues* out, DoneCallback done) {
  if (out == nullptr) {
    return Failed(absl::InvalidArgumentError("PullDense: null DenseValues"),
                  std::move(done));
  }
  out->Clear();
  return Dense(PULL, table, begin, count, {}, nullptr, std::move(done), nullptr,
               out);
}

std::unique_ptr<kv_internal::Part> KVClient::NewPart(
    uint32_t server, int op, uint32_t table, const Routing& routing,
    const std::shared_ptr<Completion::State>& state, RequestHeader* header) {
  auto part = std::make_unique<Part>();
  part->request_id = next_request_id_.fetch_add(1, std::memory_order_relaxed);
  part->server = server;
  part->parent = state;
  part->deadline = options_.clock->Now() + request_timeout_;
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

Completion KVClient::SendClock(uint64_t clock, bool restart,
                               DoneCallback done) {
  auto routing = this->routing();
  std::vector<uint32_t> servers;
  for (uint32_t r = 0; r < routing->endpoints.size(); ++r) {
    if (!routing->endpoints[r].empty()) servers.push_back(r);
  }
  if (servers.empty()) return Failed(absl::OkStatus(), std::move(done));
  auto state = std::make_shared<Completion::State>(
      static_cast<int>(servers.size()), std::move(done));
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
  auto state = std::make_shared<Completion::State>(
      static_cast<int>(servers.size()), std::move(done));
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
    return Failed(
        absl::InvalidArgumentError("Scan needs keys and values outputs"),
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
  auto state = std::make_shared<Completion::State>(
      static_cast<int>(servers.size()), std::move(done));
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
  const bool push = op == PUSH || op == PUSH_PULL;
  const bool pull = op == PULL || op == PUSH_PULL;
  if (push && grads.size() != keys.size() * dim) {
    return Failed(absl::InvalidArgumentError(absl::StrCat(
                      "push of ", keys.size(), " keys of dim ", dim, " needs ",
                      keys.size() * dim, " values, got ", grads.size())),
                  std::move(done));
  }
  // Checked before the request is split by server: a server refusing its
  // part while another applies its own would leave the update half done.
  if (push && !servers_clip_nonfinite_ && !AllFinite(grads)) {
    return Failed(NonFiniteError(op, table, "nothing was sent"),
                  std::move(done));
  }
  if (keys.empty()) return Failed(absl::OkStatus(), std::move(done));
  if (keys.size() > UINT32_MAX) {
    return Failed(absl::InvalidArgumentError("too many keys in one request"),
                  std::move(done));
  }
  auto routing = this->routing();
  // Owner of every key, and how many keys each server gets. The frames are
  // then filled in place: no per-key allocation, one pass per frame.
  const kv_internal::SparseSplit split =
      kv_internal::SplitSparse(routing->slot_owner, routing->sole_owner,
                               routing->num_servers, table, keys);
  const std::vector<uint32_t>& counts = split.counts;
  const size_t num_servers = counts.size();
  int num_parts = 0;
  for (uint32_t c : counts) {
    num_parts += c > 0;
    const uint64_t bytes =
        c *
        (sizeof(uint64_t) + (push ? dim * EncodedValueBytes(push_values_) : 0));
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
    // Every key on one server: in order, no scatter map (idx stays empty).
    std::vector<uint32_t> idx;
    if (n != keys.size()) idx = split.IndicesOf(server);
    FillSparseFrames(keys, grads, dim, push, push_values_, idx, part.get());
    if (pull && !idx.empty()) part->positions = std::move(idx);
    const auto* k = static_cast<const uint64_t*>(part->keys.data());
    SetWireOptions(op, absl::MakeConstSpan(k, n), &h);
    part->header = SerializeToFrame(h);
    part->h = h;
    if (pull) {
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
    return absl::ResourceExhaustedError(
        absl::StrCat("a request part for one server carries ", keys,
                     " keys; data_plane.limits.max_keys_per_message is ",
                     limits_.max_keys_per_message(),
                     "; nothing was sent (split the request)"));
  }
  // Headers are small; leave them 64 KiB.
  if (bytes + 65536 > static_cast<uint64_t>(limits_.max_message_bytes())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a request part for one server carries ", bytes,
        " bytes; data_plane.limits.max_message_bytes is ",
        limits_.max_message_bytes(), "; nothing was sent (split the request)"));
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
  if (key_caching_ && !keys.empty() && op != ASSIGN && op != PREFETCH)
    kv_internal::SetKeyList(keys, h);
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
    return Failed(NonFiniteError(op, table, "nothing was sent"),
                  std::move(done));
  };
  // Pushed values go to the wire in the job's encoding (ASSIGN: float32).
  const ValueEncoding encoding = op == PUSH ? push_values_ : FLOAT32;
  const size_t width = EncodedValueBytes(encoding);
  // Float32 values are checked while they are copied into the frames (one
  // pass over a large tensor instead of two); others before encoding.
  // With CLIP the servers clip pushed gradients; ASSIGN's values must be
  // finite regardless.
  const bool check_finite =
      op != PULL && !(op == PUSH && servers_clip_nonfinite_);
  if (check_finite && width != sizeof(float) && !AllFinite(grads))
    return not_finite();
  if (count == 0) return Failed(absl::OkStatus(), std::move(done));
  auto routing = this->routing();
  // The range cut at block boundaries (each block lives in one slot), by
  // owning server.
  const kv_internal::DenseRange range{begin, count};
  const kv_internal::DenseSplit split =
      kv_internal::SplitDense(routing->slot_owner, routing->num_servers, table,
                              info.block_size, absl::MakeConstSpan(&range, 1));
  const std::vector<uint64_t>& totals = split.totals;
  const size_t num_servers = totals.size();

  std::vector<DenseFrame> frames(num_servers);
  if (op != PULL && !AllocateDenseFrames(split, grads, width, check_finite,
                                         shared, &frames)) {
    return not_finite();
  }
  const bool finite =
      FillDenseFrames(split, op != PULL, grads, encoding, &frames);
  if (check_finite && !finite) return not_finite();
  int num_parts = 0;
  for (const DenseFrame& b : frames) {
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
    DenseFrame& b = frames[server];
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
