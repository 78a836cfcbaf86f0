#include "worker/dense_ring.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/broadcast_one_to_all.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace ps {
namespace {

const std::shared_ptr<spdlog::logger>& Log() {
  static const auto* logger =
      new std::shared_ptr<spdlog::logger>(GetLogger("dense_ring"));
  return *logger;
}

// gloo's rendezvous through the scheduler (Scheduler.RingStore): keys are
// put under the generation, so a stale member's keys are refused. gloo
// expects failures as exceptions; they are caught where gloo is called.
class SchedulerStore final : public gloo::rendezvous::Store {
 public:
  SchedulerStore(SchedulerClient* scheduler, uint64_t generation,
                 absl::Duration timeout)
      : scheduler_(scheduler),
        prefix_(absl::StrCat(generation, "/")),
        timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    RingStoreRequest request;
    request.set_set_key(prefix_ + key);
    request.set_set_value(std::string(data.begin(), data.end()));
    Check(scheduler_->RingStore(std::move(request), absl::ZeroDuration())
              .status());
  }

  std::vector<char> get(const std::string& key) override {
    RingStoreRequest request;
    request.add_get_keys(prefix_ + key);
    absl::StatusOr<RingStoreResponse> r =
        scheduler_->RingStore(std::move(request), timeout_);
    Check(r.status());
    const std::string& v = r->values(0);
    return std::vector<char>(v.begin(), v.end());
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    RingStoreRequest request;
    for (const std::string& k : keys) request.add_get_keys(prefix_ + k);
    Check(scheduler_
              ->RingStore(std::move(request),
                          std::min(timeout_, absl::FromChrono(timeout)))
              .status());
  }

 private:
  static void Check(const absl::Status& s) {
    if (!s.ok()) throw gloo::IoException(std::string(s.ToString()));
  }

  SchedulerClient* const scheduler_;
  const std::string prefix_;
  const absl::Duration timeout_;
};

// Election of the state's source: a replica that a ring has synchronised
// before over one that only holds initial or servers' values (a joining
// worker's step is its clock, which may run ahead of the ring's steps),
// then the most steps, then the lowest rank.
constexpr int kRankBits = 20;
constexpr uint64_t kRankMask = (uint64_t{1} << kRankBits) - 1;
constexpr uint64_t kSynchronisedBit = uint64_t{1} << 63;
constexpr uint64_t kStepMask = (uint64_t{1} << (63 - kRankBits)) - 1;

}  // namespace

// One connected generation. Members own their buffers' addresses: gloo's
// algorithms keep pointers to them.
//
// gloo registers these buffers with the connections, and a peer may still
// write into one (the next step's first chunk, a broadcast) after this
// member gave up on the ring: the connections are closed first, in the
// destructor's body, before any buffer is freed.
struct AllReducedTable::Ring {
  ~Ring() {
    if (context == nullptr) return;
    try {
      context->closeConnections();
    } catch (const std::exception& e) {
      Log()->debug("closing dense ring generation {}: {}", generation,
                   e.what());
    }
  }

  uint64_t generation = 0;
  uint32_t rank = 0;
  uint32_t size = 1;
  std::shared_ptr<gloo::rendezvous::Context> context;  // null for size 1
  std::vector<float> buffer;
  std::unique_ptr<gloo::AllreduceRingChunked<float>> allreduce;
  // Synchronise's: the vote, the source's clock and its state arrive here,
  // and replace the replica only once all of it has arrived.
  uint64_t vote = 0;
  uint64_t clock = 0;
  uint64_t pending = 0;
  std::vector<float> values;
  std::vector<float> state;
  std::vector<std::unique_ptr<gloo::Algorithm>> algorithms;
};

AllReducedTable::AllReducedTable(Options options,
                                 std::unique_ptr<Optimizer> optimizer)
    : options_(std::move(options)), optimizer_(std::move(optimizer)) {}

absl::StatusOr<std::unique_ptr<AllReducedTable>> AllReducedTable::Create(
    Options options, std::vector<float> values, uint64_t step) {
  if (!options.table.has_dense()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", options.table.name(),
                     "' is not dense: only dense tables "
                     "are all-reduced"));
  }
  if (values.size() != options.table.dense().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", options.table.name(), "' has ", options.table.dense().size(),
        " elements, not ", values.size()));
  }
  if (options.scheduler == nullptr) {
    return absl::InvalidArgumentError("an all-reduced table needs a scheduler");
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                      Optimizer::Create(options.table.optimizer()));
  std::unique_ptr<AllReducedTable> t(
      new AllReducedTable(std::move(options), std::move(optimizer)));
  t->values_ = std::move(values);
  t->state_.resize(t->values_.size() * t->optimizer_->state_size());
  t->optimizer_->InitState(t->state_.data(), t->values_.size());
  t->step_ = step;
  t->watcher_ = std::thread([p = t.get()] { p->Watch(); });
  return t;
}

AllReducedTable::~AllReducedTable() {
  {
    absl::MutexLock lock(&watch_mu_);
    stop_ = true;
  }
  const bool member = generation_.load() != 0;
  CloseRing();
  // The scheduler answers the watcher's long poll at once when this node
  // leaves, so the join below does not wait for it.
  if (member) {
    absl::Status left = options_.scheduler->LeaveRing();
    if (!left.ok()) Log()->warn("leaving the dense ring: {}", left.message());
  }
  if (watcher_.joinable()) watcher_.join();
}

absl::Status AllReducedTable::Reset(std::vector<float> values,
                                    std::vector<float> state, uint64_t step) {
  if (values.size() != values_.size() || state.size() != state_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense state of ", values.size(), "+", state.size(),
                     " floats, expected ", values_.size(), "+", state_.size()));
  }
  values_ = std::move(values);
  state_ = std::move(state);
  step_ = step;
  return absl::OkStatus();
}

uint32_t AllReducedTable::ring_size() const {
  return ring_ == nullptr ? 0 : ring_->size;
}

uint32_t AllReducedTable::ring_rank() const {
  return ring_ == nullptr ? 0 : ring_->rank;
}

uint64_t AllReducedTable::Digest() const {
  // FNV-1a, stable across processes unlike absl::Hash, taken over 8-byte
  // words rather than bytes: every ring formation computes it, and a table
  // with Adam's state holds 12 bytes a parameter.
  uint64_t h = 14695981039346656037ull;
  auto add = [&h](const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + sizeof(uint64_t) <= bytes; i += sizeof(uint64_t)) {
      uint64_t word;
      std::memcpy(&word, p + i, sizeof(word));
      h = (h ^ word) * 1099511628211ull;
    }
    for (; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  add(values_.data(), values_.size() * sizeof(float));
  add(state_.data(), state_.size() * sizeof(float));
  return h;
}

void AllReducedTable::CloseRing() {
  // Destroying the context closes its connections: peers blocked in a
  // collective with this member fail at once instead of timing out.
  ring_.reset();
  generation_.store(0);
}

bool AllReducedTable::RejoinRequested() const {
  const uint64_t g = generation_.load();
  return g != 0 && rejoin_.load() == g;
}

void AllReducedTable::Watch() {
  while (true) {
    {
      absl::MutexLock lock(&watch_mu_);
      if (stop_) return;
    }
    const uint64_t g = generation_.load();
    if (g == 0 || rejoin_.load() == g) {
      absl::MutexLock lock(&watch_mu_);
      watch_mu_.AwaitWithTimeout(absl::Condition(&stop_),
                                 absl::Milliseconds(20));
      continue;
    }
    absl::StatusOr<bool> r = options_.scheduler->WatchRing(g, absl::Seconds(1));
    if (r.ok() && *r) {
      rejoin_.store(g);
    } else if (!r.ok()) {
      absl::MutexLock lock(&watch_mu_);
      watch_mu_.AwaitWithTimeout(absl::Condition(&stop_),
                                 absl::Milliseconds(200));
    }
  }
}

absl::Status AllReducedTable::Join(uint32_t min_members) {
  if (ring_ != nullptr && !RejoinRequested()) return absl::OkStatus();
  CloseRing();
  return Form(
      absl::Now() + absl::Milliseconds(options_.allreduce.form_timeout_ms()),
      min_members, /*pending=*/false);
}

absl::Status AllReducedTable::Leave() {
  if (generation_.load() == 0 && ring_ == nullptr) return absl::OkStatus();
  CloseRing();
  return options_.scheduler->LeaveRing();
}

bool AllReducedTable::Connect(const JoinRingResponse& joined) {
  auto ring = std::make_unique<Ring>();
  ring->generation = joined.generation();
  ring->rank = joined.rank();
  ring->size = joined.size();
  // The gradients, then how many members contributed (see Step).
  ring->buffer.resize(values_.size() + 1);
  if (ring->size > 1) {
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = options_.host;
      std::shared_ptr<gloo::transport::Device> device =
          gloo::transport::tcp::CreateDevice(attr);
      ring->context = std::make_shared<gloo::rendezvous::Context>(
          static_cast<int>(ring->rank), static_cast<int>(ring->size));
      ring->context->setTimeout(
          std::chrono::milliseconds(options_.allreduce.timeout_ms()));
      SchedulerStore store(options_.scheduler, ring->generation,
                           absl::Milliseconds(options_.allreduce.timeout_ms()));
      ring->context->connectFullMesh(store, device);
      ring->allreduce = std::make_unique<gloo::AllreduceRingChunked<float>>(
          ring->context, std::vector<float*>{ring->buffer.data()},
          static_cast<int>(ring->buffer.size()));
    } catch (const std::exception& e) {
      Log()->warn("connecting dense ring generation {} ({} members): {}",
                  joined.generation(), joined.size(), e.what());
      return false;
    }
  }
  ring_ = std::move(ring);
  generation_.store(joined.generation());
  return true;
}

bool AllReducedTable::Synchronise(bool pending) {
  Ring& r = *ring_;
  if (r.size == 1) {
    synchronised_ = true;
    peer_clock_ = options_.clock ? options_.clock() : 0;
    synced_step_ = step_;
    synced_digest_ = Digest();
    return true;
  }
  try {
    r.vote = (synchronised_ ? kSynchronisedBit : 0) |
             ((step_ & kStepMask) << kRankBits) | (kRankMask - r.rank);
    auto run = [&r](std::unique_ptr<gloo::Algorithm> algorithm) {
      r.algorithms.push_back(std::move(algorithm));
      r.algorithms.back()->run();
    };
    run(std::make_unique<gloo::AllreduceRing<uint64_t>>(
        r.context, std::vector<uint64_t*>{&r.vote}, 1,
        gloo::ReductionFunction<uint64_t>::max));
    const int root = static_cast<int>(kRankMask - (r.vote & kRankMask));
    const uint64_t steps = (r.vote >> kRankBits) & kStepMask;
    const bool source = root == static_cast<int>(r.rank);
    r.clock = options_.clock ? options_.clock() : 0;
    r.values = source ? values_ : std::vector<float>(values_.size());
    r.state = source ? state_ : std::vector<float>(state_.size());
    run(std::make_unique<gloo::BroadcastOneToAll<uint64_t>>(
        r.context, std::vector<uint64_t*>{&r.clock}, 1, root));
    run(std::make_unique<gloo::BroadcastOneToAll<float>>(
        r.context, std::vector<float*>{r.values.data()}, r.values.size(),
        root));
    if (!r.state.empty()) {
      run(std::make_unique<gloo::BroadcastOneToAll<float>>(
          r.context, std::vector<float*>{r.state.data()}, r.state.size(),
          root));
    }
    if (!source) {
      Log()->info(
          "dense ring generation {}: took the dense state at step {} from "
          "ring rank {} (had step {})",
          r.generation, steps, root, step_);
      values_.swap(r.values);
      state_.swap(r.state);
    }
    peer_clock_ = r.clock;
    step_ = steps;
    synchronised_ = true;
    synced_step_ = steps;
    synced_digest_ = Digest();
    // Members that formed this generation inside Step retry (or, behind,
    // skip) the step they were in, and their clocks are already past it. A
    // member that joined without a step in hand (a new worker, resuming at
    // the source's clock) takes part in that first all-reduce with nothing
    // to add, so that every member's next step is the same all-reduce.
    r.pending = pending ? 1 : 0;
    run(std::make_unique<gloo::AllreduceRing<uint64_t>>(
        r.context, std::vector<uint64_t*>{&r.pending}, 1,
        gloo::ReductionFunction<uint64_t>::max));
    if (r.pending != 0 && !pending) {
      std::fill(r.buffer.begin(), r.buffer.end(), 0.0f);
      r.allreduce->run();
      ApplyAverage(r.buffer.data(), r.buffer.back());
    }
  } catch (const std::exception& e) {
    Log()->warn("synchronising dense ring generation {}: {}", r.generation,
                e.what());
    return false;
  }
  return true;
}

absl::Status AllReducedTable::Form(absl::Time deadline, uint32_t min_members,
                                   bool pending) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("no dense all-reduce ring formed within ",
                       options_.allreduce.form_timeout_ms(), " ms"));
    }
    absl::StatusOr<JoinRingResponse> joined = options_.scheduler->JoinRing(
        std::min(left, absl::Seconds(10)), min_members, asked_after_);
    if (!joined.ok()) return joined.status();
    if (!joined->formed()) {
      asked_after_ = joined->generation();
      Log()->warn(
          "dense ring: the generation after {} still waits for nodes {} to "
          "join",
          joined->generation(), absl::StrJoin(joined->waiting_for(), ","));
      continue;
    }
    asked_after_ = 0;
    if (!Connect(*joined) || !Synchronise(pending)) {
      CloseRing();
      ++reforms_;
      continue;
    }
    Log()->info(
        "in dense ring generation {} as rank {} of {}, at step {}; the state "
        "it started from: step {}, digest {:016x}",
        joined->generation(), joined->rank(), joined->size(), step_,
        synced_step_, synced_digest_);
    return absl::OkStatus();
  }
}

void AllReducedTable::ApplyAverage(float* sum, float contributors) {
  // Equal on every member (it is part of the all-reduced buffer): all skip
  // a round nobody contributed to.
  if (!(contributors > 0)) return;
  if (contributors != 1) {
    const float inv = 1.0f / contributors;
    for (size_t i = 0; i < values_.size(); ++i) sum[i] *= inv;
  }
  const float lr = RateMultiplier(options_.table.optimizer(), step_,
                                  /*staleness=*/0, options_.num_workers);
  optimizer_->Apply(values_.data(), state_.data(), sum, values_.size(), lr);
  ++step_;
}

absl::Status AllReducedTable::Step(absl::Span<const float> grad) {
  if (grad.size() != values_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense gradient of ", grad.size(), " floats, expected ",
                     values_.size()));
  }
  while (true) {
    if (ring_ == nullptr || RejoinRequested()) {
      CloseRing();
      const uint64_t before = step_;
      PS_RETURN_IF_ERROR(
          Form(absl::Now() +
                   absl::Milliseconds(options_.allreduce.form_timeout_ms()),
               /*min_members=*/0, /*pending=*/true));
      // The members that finished the step this gradient was for applied
      // it (with this gradient, reduced before the failure): done.
      if (step_ > before) return absl::OkStatus();
    }
    std::copy(grad.begin(), grad.end(), ring_->buffer.begin());
    ring_->buffer.back() = 1;  // one contributor
    if (ring_->allreduce != nullptr) {
      try {
        ring_->allreduce->run();
      } catch (const std::exception& e) {
        Log()->warn("all-reduce in dense ring generation {} failed: {}",
                    ring_->generation, e.what());
        CloseRing();
        ++reforms_;
        continue;
      }
    }
    ApplyAverage(ring_->buffer.data(), ring_->buffer.back());
    return absl::OkStatus();
  }
}

}  // namespace ps
