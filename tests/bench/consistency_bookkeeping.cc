#include "tests/bench/consistency_bookkeeping.h"

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/protocol.h"
#include "server/bsp_steps.h"
#include "server/checkpoint_gate.h"
#include "server/consistency.h"
#include "server/deferred_pulls.h"
#include "server/replication.h"
#include "server/step_buffers.h"
#include "server/table.h"

namespace ps::bench {
namespace {

constexpr uint32_t kSparseTable = 0;
constexpr uint32_t kDenseTable = 1;
// Node ids of the simulated workers start here (0 is a tool's).
constexpr uint64_t kFirstNode = 1000;

uint64_t ThreadCpuNanos() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000 +
         static_cast<uint64_t>(t.tv_nsec);
}

// One server's state for tracking workers, and the steps of
// KVServer::Impl that touch it, minus everything that is per request and
// the same for any N (decoding, admission, routing, replies).
class SimulatedServer {
 public:
  // `keys`: what each worker pulls and pushes; must outlive the server.
  SimulatedServer(const BookkeepingOptions& o,
                  absl::flat_hash_map<uint32_t, std::unique_ptr<Table>> tables,
                  const std::vector<std::vector<uint64_t>>* keys)
      : options_(o),
        consistency_(Config(o)),
        tables_(std::move(tables)),
        keys_(keys) {
    sparse_ = tables_.at(kSparseTable)->AsSparse();
    dense_ = tables_.at(kDenseTable)->AsDense();
    std::vector<ConsistencyController::Worker> live;
    for (int w = 0; w < o.workers; ++w) {
      live.push_back({kFirstNode + w, static_cast<uint32_t>(w), 0});
    }
    consistency_.SetLiveWorkers(live);
    segments_.Add()->set_begin(0);
    segments_[0].set_length(o.dense);
    answer_.resize(std::max<size_t>(size_t(o.keys) * o.dim, o.dense));
  }

  // request_pipeline.cc: NoteClocks, Validate's consistency and sequence
  // checks, Apply (Buffer, or a push applied at once).
  void Push(uint32_t worker, uint64_t seq, uint64_t clock, uint32_t table_id,
            absl::Span<const uint64_t> keys, absl::Span<const float> grads) {
    const uint64_t node = kFirstNode + worker;
    NoteClock(node, clock);
    const bool buffered = consistency_.ShouldBuffer(clock);
    if (gate_.MustHold(clock, buffered)) return;  // no checkpoint: never
    auto window = seqs_.find(node);
    if (window != seqs_.end() &&
        window->second.Test(seq) != replication::SeqWindow::Check::kNew) {
      return;  // a duplicate: never here
    }
    seqs_[node].Record(seq);
    Table* table = tables_.at(table_id).get();
    if (buffered) {
      consistency_.NoteBuffered(clock);
      bsp_.buffers[clock].Add(node, table, keys, segments_, grads);
      return;
    }
    const float lr_scale = table->RateScale(
        clock, server_clock_ > clock ? server_clock_ - clock : 0,
        options_.workers);
    if (table_id == kSparseTable) {
      sparse_->Push(keys, grads.data(), lr_scale);
    } else {
      dense_->Push(segments_, grads.data(), lr_scale);
    }
    gate_.NoteApplied(clock);
  }

  // request_pipeline.cc ADVANCE_CLOCK, then server.cc Progress.
  void AdvanceClock(uint32_t worker, uint64_t clock) {
    server_clock_ = std::max(server_clock_, clock);
    consistency_.Advance(kFirstNode + worker, clock);
    Progress();
  }

  // NoteClocks, then the pull answered, or deferred.
  void Pull(uint32_t worker, uint64_t clock, uint32_t table_id,
            absl::Span<const uint64_t> keys) {
    NoteClock(kFirstNode + worker, clock);
    if (PullAllowed(clock)) {
      Answer(table_id, keys);
      return;
    }
    ++deferred_count_;
    // The server keeps the request's frames and reads them again to
    // answer; here the one thing to read again is the table.
    DeferredPull pull;
    pull.frames.emplace_back(&table_id, sizeof(table_id));
    pull.clock = clock;
    pull.rank = worker;
    deferred_.Add(std::move(pull));
  }

  uint64_t deferred_count() const { return deferred_count_; }
  uint64_t steps_applied() const { return steps_applied_; }
  uint64_t seq_window_bytes() const {
    return seqs_.size() * replication::SeqWindow::kWords * sizeof(uint64_t);
  }

 private:
  static ConsistencyConfig Config(const BookkeepingOptions& o) {
    ConsistencyConfig c;
    c.set_mode(o.mode);
    c.set_staleness(o.staleness);
    return c;
  }

  void NoteClock(uint64_t node, uint64_t clock) {
    server_clock_ = std::max(server_clock_, clock);
    consistency_.Advance(node, clock);
  }

  bool PullAllowed(uint64_t clock) const {
    return gate_.PullAllowed(clock) && consistency_.PullReady(clock);
  }

  // AnswerPull and FillPull: the values, and the clocks every answer
  // carries.
  void Answer(uint32_t table_id, absl::Span<const uint64_t> keys) {
    if (table_id == kSparseTable) {
      sparse_->Pull(keys, answer_.data());
    } else {
      dense_->Pull(segments_, answer_.data());
    }
    min_clock_sink_ += consistency_.MinClock();
    min_clock_sink_ += consistency_.applied_clock();
  }

  void Progress() {
    uint64_t step;
    while (consistency_.NextCompleteStep(&step, gate_.StepLimit())) {
      auto it = bsp_.buffers.find(step);
      if (it != bsp_.buffers.end()) {
        const uint32_t divisor = std::max<uint32_t>(
            consistency_.FinishedCount(step),
            static_cast<uint32_t>(it->second.pushers.size()));
        it->second.ApplyTo(tables_, step, divisor, options_.workers);
        bsp_.buffers.erase(it);
      }
      consistency_.ForgetStep(step);
      consistency_.StepApplied();
      ++steps_applied_;
    }
    deferred_.AnswerAllowed(
        [this](uint64_t clock) { return PullAllowed(clock); },
        [this](const DeferredPull& pull) {
          uint32_t table_id;
          std::memcpy(&table_id, pull.frames[0].data(), sizeof(table_id));
          Answer(table_id, (*keys_)[pull.rank]);
        });
  }

  const BookkeepingOptions options_;
  ConsistencyController consistency_;
  CheckpointGate gate_;
  BspSteps bsp_;
  DeferredPulls deferred_;
  absl::flat_hash_map<uint64_t, replication::SeqWindow> seqs_;
  absl::flat_hash_map<uint32_t, std::unique_ptr<Table>> tables_;
  const std::vector<std::vector<uint64_t>>* const keys_;
  SparseTable* sparse_ = nullptr;
  DenseTable* dense_ = nullptr;
  Segments segments_;
  std::vector<float> answer_;
  uint64_t server_clock_ = 0;
  uint64_t deferred_count_ = 0;
  uint64_t steps_applied_ = 0;
  // Keeps the clock reads of the answers from being optimised away.
  uint64_t min_clock_sink_ = 0;
};

absl::StatusOr<absl::flat_hash_map<uint32_t, std::unique_ptr<Table>>> Tables(
    const BookkeepingOptions& o) {
  absl::flat_hash_map<uint32_t, std::unique_ptr<Table>> tables;
  TableConfig sparse;
  sparse.set_id(kSparseTable);
  sparse.set_name("emb");
  sparse.mutable_sparse()->set_dim(o.dim);
  sparse.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.01f);
  PS_ASSIGN_OR_RETURN(tables[kSparseTable], Table::Create(sparse));
  TableConfig dense;
  dense.set_id(kDenseTable);
  dense.set_name("dense");
  dense.mutable_dense()->set_size(o.dense);
  dense.mutable_dense()->set_block_size(o.dense);
  dense.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.01f);
  PS_ASSIGN_OR_RETURN(tables[kDenseTable], Table::Create(dense));
  return tables;
}

}  // namespace

absl::StatusOr<BookkeepingResult> MeasureBookkeeping(
    const BookkeepingOptions& o) {
  if (o.workers < 1 || o.steps < 1 || o.warmup < 0 || o.keys < 1 || o.dim < 1 ||
      o.dense < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bookkeeping: bad options (workers ", o.workers,
                     ", steps ", o.steps, ", warmup ", o.warmup, ", keys ",
                     o.keys, ", dim ", o.dim, ", dense ", o.dense, ")"));
  }
  PS_ASSIGN_OR_RETURN(auto tables, Tables(o));
  std::vector<std::vector<uint64_t>> keys(o.workers);
  for (int w = 0; w < o.workers; ++w) {
    for (int i = 0; i < o.keys; ++i)
      keys[w].push_back(uint64_t(w) * o.keys + i);
  }
  SimulatedServer server(o, std::move(tables), &keys);
  const std::vector<float> sparse_grads(size_t(o.keys) * o.dim, 1e-3f);
  const std::vector<float> dense_grads(o.dense, 1e-3f);
  std::vector<uint64_t> seq(o.workers, 0);

  // A consistency_bench step as one server sees it, worker after worker:
  // the step's pushes, the clock advance, the next step's pulls. Under BSP
  // the pulls wait until the last worker's advance completes the step.
  auto step = [&](uint64_t t) {
    for (int w = 0; w < o.workers; ++w) {
      server.Push(w, ++seq[w], t, kSparseTable, keys[w], sparse_grads);
      server.Push(w, ++seq[w], t, kDenseTable, {}, dense_grads);
      server.AdvanceClock(w, t + 1);
      server.Pull(w, t + 1, kDenseTable, {});
      server.Pull(w, t + 1, kSparseTable, keys[w]);
    }
  };
  // Step 0's pulls, as workers begin.
  for (int w = 0; w < o.workers; ++w) {
    server.Pull(w, 0, kDenseTable, {});
    server.Pull(w, 0, kSparseTable, keys[w]);
  }
  uint64_t t = 0;
  for (; t < uint64_t(o.warmup); ++t) step(t);
  const uint64_t deferred = server.deferred_count();
  const uint64_t applied = server.steps_applied();
  const uint64_t start = ThreadCpuNanos();
  for (int i = 0; i < o.steps; ++i, ++t) step(t);
  BookkeepingResult r;
  r.ns_per_step = double(ThreadCpuNanos() - start) / o.steps;
  r.deferred = server.deferred_count() - deferred;
  r.steps_applied = server.steps_applied() - applied;
  r.seq_window_bytes = server.seq_window_bytes();
  return r;
}

}  // namespace ps::bench
