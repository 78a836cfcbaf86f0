// The C ABI of python/native/ps_c.h over WorkerSession and KVClient.
#include "python/native/ps_c.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/config.h"
#include "common/curve_keys.h"
#include "common/initializer.h"
#include "common/logging.h"
#include "common/node_main.h"
#include "common/protocol.h"
#include "common/reasons.h"
#include "common/status.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/client.h"
#include "worker/data/keys.h"
#include "worker/data/synthetic_ctr.h"
#include "worker/dense_ring.h"
#include "worker/dense_ring_copy.h"
#include "worker/kv_client.h"
#include "worker/session.h"
#include "worker/shard_cursor.h"

namespace {

thread_local std::string last_error;
thread_local int32_t last_reason = PS_REASON_NONE;

// The reason a status carries (common/reasons.h), as the ABI names it.
int32_t Reason(const absl::Status& s) {
  if (ps::IsDropped(s)) return PS_REASON_DROPPED;
  if (ps::IsSchedulerGone(s)) return PS_REASON_SCHEDULER_UNREACHABLE;
  if (ps::IsJobFinished(s)) return PS_REASON_JOB_FINISHED;
  if (ps::IsJobFailed(s)) return PS_REASON_JOB_FAILED;
  return PS_REASON_NONE;
}

// Records `s` as this thread's last outcome; its code (0 when OK).
int32_t Fail(const absl::Status& s) {
  last_error = std::string(s.message());
  last_reason = Reason(s);
  return static_cast<int32_t>(s.code());
}

int32_t Invalid(const std::string& message) {
  return Fail(absl::InvalidArgumentError(message));
}

char* CopyString(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) return nullptr;
  std::memcpy(out, s.data(), s.size() + 1);
  return out;
}

// A timeout of the ABI: PS_NO_TIMEOUT (any negative or non-finite value)
// never passes.
absl::Duration Seconds(double s) {
  if (!std::isfinite(s) || s < 0) return absl::InfiniteDuration();
  return absl::Seconds(s);
}

const char* OptimizerName(const ps::OptimizerConfig& o) {
  switch (o.kind_case()) {
    case ps::OptimizerConfig::kSgd:
      return "sgd";
    case ps::OptimizerConfig::kAdagrad:
      return "adagrad";
    case ps::OptimizerConfig::kMomentum:
      return "momentum";
    case ps::OptimizerConfig::kAdam:
      return "adam";
    case ps::OptimizerConfig::kFtrl:
      return "ftrl";
    default:
      return "none";
  }
}

absl::StatusOr<std::string> OptimizerJson(const ps::TableConfig& t) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string json;
  const auto st =
      google::protobuf::util::MessageToJsonString(t.optimizer(), &json, o);
  if (!st.ok()) {
    return absl::InternalError(
        absl::StrCat("the optimizer of table ", t.name(),
                     " cannot be written as JSON: ", st.ToString()));
  }
  return json;
}

ps::DataPosition Position(const ps_position& p) {
  ps::DataPosition out;
  out.set_shard(p.shard);
  out.set_epoch(p.epoch);
  out.set_batch(p.batch);
  out.set_done(p.done != 0);
  return out;
}

ps_position ToC(const ps::DataPosition& p) {
  ps_position out{};
  out.shard = p.shard();
  out.epoch = p.epoch();
  out.batch = p.batch();
  out.done = p.done() ? 1 : 0;
  return out;
}

}  // namespace

// A loaded job config and what the ABI hands out of it.
struct ps_config {
  explicit ps_config(ps::JobConfig c) : config(std::move(c)) {
    const ps::ConsistencyMode m = config.consistency().mode();
    mode = m == ps::CONSISTENCY_MODE_UNSPECIFIED ? "ASYNC"
                                                 : ps::ConsistencyMode_Name(m);
    for (const ps::TableConfig& t : config.tables()) {
      optimizer_json.push_back(OptimizerJson(t));
      state_of.push_back(StateOf(t));
    }
  }

  const ps::JobConfig config;
  std::string mode;
  std::vector<absl::StatusOr<std::string>> optimizer_json;  // by table index
  // By table index: the id of the all-reduced table whose optimizer state
  // the table holds on the servers (common/config.h AllReduceStateTable),
  // or -1.
  std::vector<int32_t> state_of;
  // data.synthetic_ctr's generator, built on first use (building its
  // sampling tables takes milliseconds, filling a batch microseconds).
  mutable absl::Mutex mu;
  mutable std::shared_ptr<const ps::ctr::SyntheticCtr> synthetic
      ABSL_GUARDED_BY(mu);

 private:
  int32_t StateOf(const ps::TableConfig& table) const {
    for (const ps::TableConfig& t : config.tables()) {
      if (t.has_dense() &&
          t.dense().sync() == ps::DenseTableConfig::ALLREDUCE &&
          ps::OptimizerStateFloats(t.optimizer()) > 0 &&
          ps::AllReduceStateTable(t.name()) == table.name()) {
        return static_cast<int32_t>(t.id());
      }
    }
    return -1;
  }
};

namespace {

absl::StatusOr<std::shared_ptr<const ps::ctr::SyntheticCtr>> Synthetic(
    const ps_config& c) {
  if (!c.config.data().has_synthetic_ctr()) {
    return absl::InvalidArgumentError(
        "the job has no data.synthetic_ctr block");
  }
  absl::MutexLock lock(&c.mu);
  if (c.synthetic == nullptr) {
    auto made = ps::ctr::SyntheticCtr::Create(c.config.data().synthetic_ctr());
    if (!made.ok()) return made.status();
    c.synthetic =
        std::make_shared<const ps::ctr::SyntheticCtr>(*std::move(made));
  }
  return c.synthetic;
}

// Counts the lifecycle operations of one session still running on threads
// of their own, so that freeing the session can wait for them.
class OpTracker {
 public:
  void Started() {
    absl::MutexLock lock(&mu_);
    ++running_;
  }
  void Ended() {
    absl::MutexLock lock(&mu_);
    --running_;
  }
  void WaitIdle() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* running) { return *running == 0; }, &running_));
  }

 private:
  absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
};

// What a lifecycle operation answers, by kind.
enum class Kind {
  kRequest,
  kStart,
  kBarrier,
  kClaim,
  kNextShard,
  kFinish,
  kCheckpoint,
  kScan,
  kStats
};

struct OpResults {
  std::unique_ptr<ps::WorkerSession> started;  // kStart
  std::vector<uint32_t> ranks;                 // kBarrier, kFinish
  ps_claim claim{};                            // kClaim
  ps_next_shard next_shard{};                  // kNextShard
  int32_t evaluator = 0;                       // kFinish
  uint64_t clock = 0;                          // kCheckpoint
};

// A lifecycle operation running on a thread of its own. Its results are
// written by that thread, under `mu`, together with `done`.
struct AsyncOp {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  OpResults results ABSL_GUARDED_BY(mu);
  std::thread thread;
};

}  // namespace

// A session and the pid that made it: its threads exist only there. Its
// lifecycle operations share ownership of the WorkerSession (they run on
// threads of their own and may still be running when the session is
// freed); ps_session_free stops them and waits until they have let go.
struct ps_session {
  std::shared_ptr<ps::WorkerSession> session;
  std::unique_ptr<ps_config> config;  // a copy of the session's
  std::shared_ptr<OpTracker> ops = std::make_shared<OpTracker>();
  pid_t pid = 0;
  // The newest clock seen below kFinishedClock: the step of a metric
  // reported while the clock reads finished (the evaluator's, after
  // finish).
  std::atomic<uint64_t> last_step{0};
};

struct ps_future {
  explicit ps_future(Kind k) : kind(k) {}

  const Kind kind;
  // Data-plane requests, scan and stats.
  std::optional<ps::Completion> completion;
  // Lifecycle operations.
  std::shared_ptr<AsyncOp> op;
  // Asked to stop when the handle is freed while `op` still runs.
  std::function<void()> stop;
  // Scan and stats: written by the I/O thread before `completion` is done;
  // freeing the handle waits for it.
  std::vector<ps::ServerTableStats> stats;
  std::vector<uint64_t> scan_keys;
  std::vector<float> scan_values;
  uint32_t scan_dim = 1;
};

namespace {

using OpBody = std::function<absl::Status(OpResults&)>;

// Runs `body` on a thread; its status and results complete `f`.
void RunAsync(ps_future* f, OpBody body) {
  auto op = std::make_shared<AsyncOp>();
  f->op = op;
  op->thread = std::thread([op, body = std::move(body)] {
    OpResults results;
    absl::Status s = body(results);
    absl::MutexLock lock(&op->mu);
    op->status = std::move(s);
    op->results = std::move(results);
    op->done = true;
  });
}

// Runs `body` on a thread with a reference to the session of `s`, counted
// in `s`'s operations until the thread lets go of it. With `stop_on_free`,
// freeing the future before the operation ends asks the session to stop (a
// weak reference: a session already freed has nothing left to stop).
ps_future* RunSessionOp(
    ps_session* s, Kind kind, bool stop_on_free,
    std::function<absl::Status(ps::WorkerSession&, OpResults&)> body) {
  auto* f = new ps_future(kind);
  if (stop_on_free) {
    std::weak_ptr<ps::WorkerSession> weak = s->session;
    f->stop = [weak] {
      if (std::shared_ptr<ps::WorkerSession> w = weak.lock()) w->RequestStop();
    };
  }
  std::shared_ptr<OpTracker> ops = s->ops;
  ops->Started();
  RunAsync(
      f, [w = s->session, ops, body = std::move(body)](OpResults& r) mutable {
        absl::Status st = body(*w, r);
        w.reset();  // before Ended(): the session may be destroyed once idle
        ops->Ended();
        return st;
      });
  return f;
}

// Reads the results of `f`'s successful lifecycle operation, one of
// `kinds`; fills last_error otherwise.
int32_t ReadResults(ps_future* f, std::initializer_list<Kind> kinds,
                    const std::function<void(OpResults&)>& read) {
  if (f == nullptr || f->op == nullptr ||
      std::find(kinds.begin(), kinds.end(), f->kind) == kinds.end()) {
    return Invalid("not a future of an operation with that result");
  }
  absl::MutexLock lock(&f->op->mu);
  if (!f->op->done)
    return Fail(
        absl::FailedPreconditionError("the operation is still running"));
  if (!f->op->status.ok()) {
    return Fail(absl::FailedPreconditionError(
        absl::StrCat("the operation failed: ", f->op->status.message())));
  }
  read(f->op->results);
  return 0;
}

// OK once the request of `f` (one of `kind`) completed successfully.
int32_t RequestDone(ps_future* f, Kind kind) {
  if (f == nullptr || !f->completion || f->kind != kind) {
    return Invalid("not a future of an operation with that result");
  }
  absl::Status status;
  if (!f->completion->WaitFor(absl::ZeroDuration(), &status)) {
    return Fail(absl::FailedPreconditionError("the request is still running"));
  }
  if (!status.ok()) {
    return Fail(absl::FailedPreconditionError(
        absl::StrCat("the request failed: ", status.message())));
  }
  return 0;
}

bool Forked(const ps_session* s) { return s->pid != getpid(); }

// Checks that `s` may be used here; fills last_error otherwise.
int32_t Usable(ps_session* s) {
  if (s == nullptr || s->session == nullptr)
    return Invalid("no session (closed?)");
  if (Forked(s)) {
    return Fail(absl::FailedPreconditionError(
        "this session was started in process " + std::to_string(s->pid) +
        " and cannot be used in a forked child (" + std::to_string(getpid()) +
        "): its network threads do not exist here. Start a session in the "
        "child, or use forked workers (DataLoader num_workers) for data only"));
  }
  return 0;
}

ps_future* FromCompletion(ps::Completion c, Kind kind = Kind::kRequest) {
  auto* f = new ps_future(kind);
  f->completion = std::move(c);
  return f;
}

// FAILED_PRECONDITION for a write from an observer.
int32_t Writable(ps_session* s, const char* what) {
  if (int32_t e = Usable(s)) return e;
  if (s->session->observer()) {
    return Fail(absl::FailedPreconditionError(
        absl::StrCat(what,
                     ": this session is an observer, which only reads (pull, "
                     "scan, stats)")));
  }
  return 0;
}

// FAILED_PRECONDITION for a report to the scheduler from an observer.
int32_t Reporting(ps_session* s, const char* what) {
  if (int32_t e = Usable(s)) return e;
  if (s->session->membership() == nullptr) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        what,
        ": this session is an observer, which sends the scheduler no "
        "heartbeats to carry it")));
  }
  return 0;
}

// The step to report a metric at: the clock, or the last step trained while
// the clock reads finished (after finish, or claiming a shard). Called too
// where the clock is about to go to finished, to remember that step.
uint64_t Step(ps_session* s) {
  const uint64_t clock = s->session->clock();
  if (clock >= ps::kFinishedClock) return s->last_step.load();
  s->last_step.store(clock);
  return clock;
}

// The sparse table `table` and its row width, or an error status.
absl::StatusOr<uint32_t> SparseDim(ps_session* s, uint32_t table) {
  for (const ps::TableConfig& t : s->session->config().tables()) {
    if (t.id() != table) continue;
    if (!t.has_sparse()) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", t.name(), " is dense: use the dense calls"));
    }
    return t.sparse().dim();
  }
  return absl::InvalidArgumentError(absl::StrCat("no table with id ", table));
}

ps_table_stats ToC(const ps::ServerTableStats& s) {
  const ps::TableStats& t = s.stats;
  ps_table_stats out{};
  out.server = s.server_rank;
  out.table_id = t.table_id();
  out.sparse = t.sparse() ? 1 : 0;
  out.rows = t.rows();
  out.bytes = t.bytes();
  out.memory_budget_bytes = t.memory_budget_bytes();
  out.keys_pushed = t.keys_pushed();
  out.keys_pulled = t.keys_pulled();
  out.admissions = t.admissions();
  out.pushes_filtered = t.pushes_filtered();
  out.evictions_ttl = t.evictions_ttl();
  out.evictions_budget = t.evictions_budget();
  out.pushes_refused = t.pushes_refused();
  out.keys_dropped = t.keys_dropped();
  out.backup_rows = t.backup_rows();
  out.cold_rows = t.cold_rows();
  out.disk_bytes = t.disk_bytes();
  out.demotions = t.demotions();
  out.promotions = t.promotions();
  out.cold_reads = t.cold_reads();
  out.cold_misses = t.cold_misses();
  out.bloom_useful = t.bloom_useful();
  out.disk_reads = t.disk_reads();
  out.cold_read_micros = t.cold_read_micros();
  out.disk_bytes_written = t.disk_bytes_written();
  out.cold_rows_dropped = t.cold_rows_dropped();
  out.tier_errors = t.tier_errors();
  out.tier_memory_bytes = t.tier_memory_bytes();
  out.rows_read_ahead = t.rows_read_ahead();
  out.staged_rows = t.staged_rows();
  return out;
}

int32_t FillSparseInitial(const ps::TableConfig& tc, const uint64_t* keys,
                          size_t n, float* out, size_t out_len) {
  const uint32_t dim = tc.sparse().dim();
  if (out_len != n * dim) {
    return Invalid(absl::StrCat("initial values of ", n, " keys of table ",
                                tc.name(), " (dim ", dim, ") need ", n * dim,
                                " floats; the output has ", out_len));
  }
  for (size_t i = 0; i < n; ++i) {
    ps::InitializeValues(tc.init(), tc.id(), keys[i], 0, dim, out + i * dim);
  }
  return 0;
}

}  // namespace

// A worker's replica of its all-reduced dense tables. It shares ownership
// of the session: the table calls the session's scheduler client, which
// must outlive it.
struct ps_allreduce {
  std::shared_ptr<ps::WorkerSession> session;
  pid_t pid = 0;
  // The clock a worker waiting to join a running ring resumes at (its
  // clock reads finished meanwhile): what it tells the others as the
  // source of the state. Read by the table's clock callback.
  std::shared_ptr<std::atomic<uint64_t>> paused_clock =
      std::make_shared<std::atomic<uint64_t>>(0);
  // The tables concatenated in the replica, in its order, and the servers'
  // copy of them.
  std::optional<ps::DenseRingCopy> copy;
  // Serialises the calls: AllReducedTable is for one thread at a time.
  absl::Mutex mu;
  std::unique_ptr<ps::AllReducedTable> table ABSL_GUARDED_BY(mu);
};

namespace {

// The largest replica, as config validation bounds one table (gloo counts
// elements in int).
constexpr uint64_t kMaxAllReducedElements = uint64_t{1} << 30;

// Table `id` of `config`, checked to be dense with sync ALLREDUCE.
absl::StatusOr<const ps::TableConfig*> AllReducedTableConfig(
    const ps::JobConfig& config, uint32_t id) {
  for (const ps::TableConfig& t : config.tables()) {
    if (t.id() != id) continue;
    if (!t.has_dense()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", t.name(), " is sparse: only dense tables are all-reduced"));
    }
    if (t.dense().sync() != ps::DenseTableConfig::ALLREDUCE) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dense table ", t.name(),
          " is updated by the servers (dense.sync SERVERS): push its "
          "gradients with ps_push_dense, or set dense { sync: ALLREDUCE } in "
          "the job config to all-reduce it"));
    }
    return &t;
  }
  return absl::InvalidArgumentError(absl::StrCat("no table with id ", id));
}

// One table config for the dense tables `ids` of `config`, concatenated in
// that order (a worker has one ring, so they are all-reduced together):
// the first table's, named "a+b+...", of their summed size. `parts`
// receives the tables. Their optimizer configs must be equal: the update
// rule is element-wise, so one optimizer over the concatenation applies
// each table's own rule.
absl::StatusOr<ps::TableConfig> FusedTable(
    const ps::JobConfig& config, absl::Span<const uint32_t> ids,
    std::vector<const ps::TableConfig*>* parts) {
  std::vector<std::string> names;
  uint64_t size = 0;
  for (uint32_t id : ids) {
    PS_ASSIGN_OR_RETURN(const ps::TableConfig* t,
                        AllReducedTableConfig(config, id));
    if (std::find(parts->begin(), parts->end(), t) != parts->end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dense table ", t->name(), " is given twice"));
    }
    const ps::TableConfig& first = parts->empty() ? *t : *parts->front();
    if (!google::protobuf::util::MessageDifferencer::Equals(first.optimizer(),
                                                            t->optimizer())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dense tables ", first.name(), " and ", t->name(),
          " are all-reduced together (a worker has one ring) and must have "
          "the same optimizer config"));
    }
    parts->push_back(t);
    names.push_back(t->name());
    size += t->dense().size();
  }
  if (size > kMaxAllReducedElements) {
    return absl::InvalidArgumentError(
        absl::StrCat("the all-reduced dense tables hold ", size,
                     " elements together; at most 2^30"));
  }
  ps::TableConfig fused = *parts->front();
  fused.set_name(absl::StrJoin(names, "+"));
  fused.mutable_dense()->set_size(size);
  return fused;
}

// The servers' initial values of `parts`, concatenated.
std::vector<float> InitialDenseValues(
    const std::vector<const ps::TableConfig*>& parts, uint64_t size) {
  std::vector<float> values(size);
  uint64_t offset = 0;
  for (const ps::TableConfig* t : parts) {
    // Dense tables use key 0 with the element index (server/dense_table.cc).
    ps::InitializeValues(t->init(), t->id(), 0, 0, t->dense().size(),
                         values.data() + offset);
    offset += t->dense().size();
  }
  return values;
}

// Checks a step's gradients (n == the replica's size, finite); fills
// last_error otherwise. A non-finite value would reach every replica: it is
// refused before this worker joins the collective.
int32_t CheckGradients(const ps::AllReducedTable& t, const float* grads,
                       size_t n) {
  if (grads == nullptr && n != 0) return Invalid("no gradients given");
  if (n != t.values().size()) {
    return Invalid(absl::StrCat("dense gradient of ", n,
                                " floats; the all-reduced tables hold ",
                                t.values().size()));
  }
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(grads[i])) {
      return Invalid(absl::StrCat("non-finite gradient at element ", i, ": ",
                                  grads[i], "; nothing was all-reduced"));
    }
  }
  return 0;
}

// Checks that `r` may be used here; fills last_error otherwise.
int32_t UsableRing(const ps_allreduce* r) {
  if (r == nullptr) return Invalid("no all-reduced dense table (freed?)");
  if (r->pid != getpid()) {
    return Fail(absl::FailedPreconditionError(
        "this all-reduced dense table was made in process " +
        std::to_string(r->pid) + " and cannot be used in a forked child"));
  }
  return 0;
}

}  // namespace

extern "C" {

int32_t ps_abi_version(void) { return PS_C_ABI_VERSION; }

const char* ps_last_error(void) { return last_error.c_str(); }

int32_t ps_last_error_reason(void) { return last_reason; }

int32_t ps_set_log_level(const char* level) {
  return Fail(ps::SetLogLevel(level == nullptr ? "" : level));
}

void ps_hash_keys(uint32_t field, const uint64_t* values, size_t n,
                  uint64_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = ps::data::CriteoKey(field, values[i]);
}

void ps_free_string(char* s) { std::free(s); }

int32_t ps_config_load(const char* path, int64_t num_servers,
                       int64_t num_workers, ps_config** out) {
  if (path == nullptr || *path == '\0')
    return Invalid("no job config file given");
  absl::StatusOr<ps::JobConfig> config = ps::LoadJobConfig(path);
  if (!config.ok()) return Fail(config.status());
  if (absl::Status s =
          ps::OverrideClusterSize({num_servers, num_workers}, &*config);
      !s.ok()) {
    return Fail(s);
  }
  *out = new ps_config(*std::move(config));
  return 0;
}

void ps_config_free(ps_config* c) { delete c; }

int32_t ps_config_job(const ps_config* c, ps_job_info* out) {
  if (c == nullptr || out == nullptr) return Invalid("no config");
  const ps::JobConfig& j = c->config;
  *out = ps_job_info{};
  out->name = j.name().c_str();
  out->mode = c->mode.c_str();
  out->staleness = j.consistency().staleness();
  out->num_workers = j.cluster().num_workers();
  out->num_servers = j.cluster().num_servers();
  out->prefetch = j.training().prefetch() ? 1 : 0;
  // As KVClient decides (worker/kv_client.cc): the servers clip.
  const ps::GradientPolicy& g = j.data_plane().gradients();
  out->clips_nonfinite =
      g.nonfinite() == ps::GradientPolicy::CLIP && g.clip_value() > 0;
  out->num_tables = static_cast<uint32_t>(j.tables_size());
  out->batch_size = j.training().batch_size();
  out->epochs = j.training().epochs();
  out->shard_by_batch = j.training().shard_by_batch() ? 1 : 0;
  out->max_steps = j.training().max_steps();
  out->export_path = j.training().export_path().c_str();
  out->checkpoint_dir = j.checkpoint().dir().c_str();
  return 0;
}

int32_t ps_config_table(const ps_config* c, uint32_t index,
                        ps_table_info* out) {
  if (c == nullptr || out == nullptr) return Invalid("no config");
  if (index >= static_cast<uint32_t>(c->config.tables_size())) {
    return Invalid(
        absl::StrCat("table index ", index, " of ", c->config.tables_size()));
  }
  const ps::TableConfig& t = c->config.tables(index);
  const absl::StatusOr<std::string>& json = c->optimizer_json[index];
  if (!json.ok()) return Fail(json.status());
  *out = ps_table_info{};
  out->name = t.name().c_str();
  out->id = t.id();
  out->sparse = t.has_sparse() ? 1 : 0;
  out->dim = t.has_sparse() ? t.sparse().dim() : 1;
  out->size = t.has_dense() ? t.dense().size() : 0;
  out->optimizer = OptimizerName(t.optimizer());
  out->optimizer_json = json->c_str();
  out->allreduce =
      t.has_dense() && t.dense().sync() == ps::DenseTableConfig::ALLREDUCE ? 1
                                                                           : 0;
  out->allreduce_state_of = c->state_of[index];
  return 0;
}

int32_t ps_config_synthetic_ctr(const ps_config* c, ps_synthetic_info* out) {
  if (c == nullptr || out == nullptr) return Invalid("no config");
  auto gen = Synthetic(*c);
  if (!gen.ok()) return Fail(gen.status());
  out->num_train = (*gen)->size(ps::ctr::Split::kTrain);
  out->num_test = (*gen)->size(ps::ctr::Split::kTest);
  out->num_numeric = (*gen)->num_numeric();
  out->num_categorical = (*gen)->num_categorical();
  return 0;
}

int32_t ps_initial_values(const ps_config* c, const char* table,
                          const uint64_t* keys, size_t n, uint64_t first,
                          float* out, size_t out_len) {
  if (c == nullptr) return Invalid("no config");
  absl::StatusOr<const ps::TableConfig*> t =
      ps::FindTable(c->config, table == nullptr ? "" : table);
  if (!t.ok()) return Fail(t.status());
  const ps::TableConfig& tc = **t;
  if (tc.has_sparse()) return FillSparseInitial(tc, keys, n, out, out_len);
  const uint64_t size = tc.dense().size();
  if (out_len != n || first > size || n > size - first) {
    return Invalid(absl::StrCat(
        "dense table ", tc.name(), " has ", size, " elements: [", first, ", ",
        first + n, ") is out of range or the output is not ", n, " floats"));
  }
  // Dense tables use key 0 with the element index (server/dense_table.cc).
  ps::InitializeValues(tc.init(), tc.id(), 0, first, n, out);
  return 0;
}

int32_t ps_synthetic_ctr(const ps_config* c, int32_t split, uint64_t begin,
                         uint64_t count, float* numeric, size_t numeric_len,
                         uint64_t* keys, size_t keys_len, float* labels,
                         float* true_logits) {
  if (c == nullptr) return Invalid("no config");
  auto gen = Synthetic(*c);
  if (!gen.ok()) return Fail(gen.status());
  if (split != 0 && split != 1)
    return Invalid("split must be 0 (train) or 1 (test)");
  const ps::ctr::Split sp =
      split == 0 ? ps::ctr::Split::kTrain : ps::ctr::Split::kTest;
  const uint64_t size = (*gen)->size(sp);
  if (begin > size || count > size - begin) {
    return Invalid(absl::StrCat("examples [", begin, ", ", begin + count,
                                ") of a split of ", size));
  }
  const uint64_t num_numeric = (*gen)->num_numeric();
  const uint64_t num_categorical = (*gen)->num_categorical();
  if (numeric_len != count * num_numeric ||
      keys_len != count * num_categorical) {
    return Invalid(absl::StrCat("synthetic_ctr: ", count, " examples need ",
                                count * num_numeric, " numeric values and ",
                                count * num_categorical, " keys; got room for ",
                                numeric_len, " and ", keys_len));
  }
  ps::ctr::Batch batch;
  if (absl::Status s = (*gen)->Fill(sp, begin, count, &batch); !s.ok())
    return Fail(s);
  std::copy(batch.numeric.begin(), batch.numeric.end(), numeric);
  std::copy(batch.keys.begin(), batch.keys.end(), keys);
  std::copy(batch.labels.begin(), batch.labels.end(), labels);
  if (true_logits != nullptr) {
    std::copy(batch.true_logits.begin(), batch.true_logits.end(), true_logits);
  }
  return 0;
}

int32_t ps_session_start(const ps_config* config, const char* scheduler,
                         int32_t flags, double stop_check_s,
                         double startup_timeout_s, ps_future** out) {
  if (config == nullptr) return Invalid("no job config given");
  if (scheduler == nullptr || *scheduler == '\0') {
    return Invalid("no scheduler address (host:port) given");
  }
  absl::StatusOr<std::optional<ps::CurveKeys>> curve =
      ps::LoadCurveKeys(config->config.security().curve());
  if (!curve.ok()) return Fail(curve.status());
  ps::WorkerSession::Options options;
  options.config = config->config;
  options.scheduler = scheduler;
  options.trains_shards = (flags & PS_TRAINS_SHARDS) != 0;
  options.observer = (flags & PS_OBSERVER) != 0;
  if (options.observer && options.trains_shards) {
    return Invalid("an observer trains no shards");
  }
  options.curve = *std::move(curve);
  if (stop_check_s > 0) options.stop_check = Seconds(stop_check_s);
  if (startup_timeout_s > 0)
    options.startup_timeout = Seconds(startup_timeout_s);
  auto stop = std::make_shared<std::atomic<bool>>(false);
  options.should_stop = [stop] { return stop->load(); };
  auto* f = new ps_future(Kind::kStart);
  f->stop = [stop] { stop->store(true); };
  RunAsync(
      f, [options = std::move(options)](OpResults& r) mutable -> absl::Status {
        auto session = ps::WorkerSession::Start(std::move(options));
        if (!session.ok()) return session.status();
        r.started = *std::move(session);
        return absl::OkStatus();
      });
  *out = f;
  return 0;
}

void ps_session_free(ps_session* s) {
  if (s == nullptr) return;
  if (Forked(s)) {
    // The parent's threads are not here: destroying the clients would wait
    // for them forever. Leak instead.
    (void)new std::shared_ptr<ps::WorkerSession>(std::move(s->session));
    delete s;
    return;
  }
  // Lifecycle operations still running end (stopped) and let go of the
  // session before it is destroyed here, with its data plane.
  s->session->RequestStop();
  s->ops->WaitIdle();
  s->session.reset();
  delete s;
}

int32_t ps_session_info(ps_session* s, ps_session_details* out) {
  if (int32_t e = Usable(s)) return e;
  const ps::WorkerSession& w = *s->session;
  *out = ps_session_details{};
  out->rank = w.rank();
  out->node_id = w.node_id();
  out->observer = w.observer() ? 1 : 0;
  out->restored_start = w.restored_start() ? 1 : 0;
  out->start_clock = w.start_clock();
  if (const std::optional<ps::DataPosition> pos = w.initial_position()) {
    out->has_position = 1;
    out->position = ToC(*pos);
  }
  return 0;
}

const ps_config* ps_session_config(ps_session* s) {
  if (Usable(s) != 0) return nullptr;
  return s->config.get();
}

uint64_t ps_session_clock(ps_session* s) {
  if (Usable(s) != 0) return 0;
  return s->session->clock();
}

char* ps_session_slow_workers(ps_session* s) {
  if (Usable(s) != 0) return nullptr;
  return CopyString(s->session->DescribeSlowWorkers());
}

uint64_t ps_session_last_checkpoint(ps_session* s) {
  if (Usable(s) != 0) return 0;
  return s->session->last_checkpoint_clock();
}

int32_t ps_session_stop_requested(ps_session* s) {
  if (Usable(s) != 0) return 1;
  return s->session->stop_requested() ? 1 : 0;
}

int32_t ps_session_ended(ps_session* s) {
  if (int32_t bad = Usable(s); bad != 0) return bad;
  return Fail(s->session->ended());
}

void ps_session_request_stop(ps_session* s) {
  if (Usable(s) != 0) return;
  s->session->RequestStop();
}

int32_t ps_session_end_step(ps_session* s, const ps_position* next,
                            ps_future** out) {
  if (int32_t e = Usable(s)) return e;
  std::optional<ps::DataPosition> pos;
  if (next != nullptr) pos = Position(*next);
  *out = FromCompletion(s->session->EndStep(pos));
  return 0;
}

int32_t ps_session_barrier(ps_session* s, const char* name, double timeout_s,
                           ps_future** out) {
  if (int32_t e = Usable(s)) return e;
  if (name == nullptr || *name == '\0')
    return Invalid("a barrier needs a name");
  *out = RunSessionOp(s, Kind::kBarrier, /*stop_on_free=*/true,
                      [name = std::string(name), timeout = Seconds(timeout_s)](
                          ps::WorkerSession& w, OpResults& r) {
                        return w.Barrier(name, timeout, &r.ranks);
                      });
  return 0;
}

int32_t ps_session_claim(ps_session* s, const ps_position* finished,
                         ps_future** out) {
  if (int32_t e = Usable(s)) return e;
  (void)Step(s);  // a claim sets the clock to finished
  std::optional<ps::DataPosition> done;
  if (finished != nullptr) {
    done = Position(*finished);
    done->set_done(true);
  }
  *out =
      RunSessionOp(s, Kind::kClaim, /*stop_on_free=*/true,
                   [done](ps::WorkerSession& w, OpResults& r) -> absl::Status {
                     auto answer = w.Claim(done ? &*done : nullptr);
                     if (!answer.ok()) return answer.status();
                     switch (answer->result()) {
                       case ps::ClaimShardResponse::WAIT:
                         r.claim.result = PS_CLAIM_WAIT;
                         break;
                       case ps::ClaimShardResponse::ASSIGNED:
                         r.claim.result = PS_CLAIM_ASSIGNED;
                         break;
                       case ps::ClaimShardResponse::ALL_DONE:
                         r.claim.result = PS_CLAIM_ALL_DONE;
                         break;
                       default:
                         return absl::InternalError(absl::StrCat(
                             "the scheduler answered a claim with ",
                             static_cast<int>(answer->result())));
                     }
                     r.claim.position = ToC(answer->shard());
                     r.claim.start_clock = answer->start_clock();
                     return absl::OkStatus();
                   });
  return 0;
}

int32_t ps_session_restart(ps_session* s, uint64_t clock) {
  if (int32_t e = Usable(s)) return e;
  return Fail(s->session->Restart(clock));
}

int32_t ps_session_finish(ps_session* s, double timeout_s, ps_future** out) {
  if (int32_t e = Usable(s)) return e;
  (void)Step(s);  // the last step trained, for the evaluator's metrics
  *out = RunSessionOp(s, Kind::kFinish, /*stop_on_free=*/true,
                      [timeout = Seconds(timeout_s)](
                          ps::WorkerSession& w, OpResults& r) -> absl::Status {
                        auto evaluator = w.Finish(timeout);
                        if (!evaluator.ok()) return evaluator.status();
                        r.evaluator = *evaluator ? 1 : 0;
                        r.ranks = w.finished_ranks();
                        return absl::OkStatus();
                      });
  return 0;
}

int32_t ps_session_evaluation_done(ps_session* s) {
  if (int32_t e = Usable(s)) return e;
  return Fail(s->session->EvaluationDone());
}

int32_t ps_session_checkpoint(ps_session* s, ps_future** out) {
  if (int32_t e = Usable(s)) return e;
  *out = RunSessionOp(s, Kind::kCheckpoint, /*stop_on_free=*/false,
                      [](ps::WorkerSession& w, OpResults& r) -> absl::Status {
                        auto clock = w.RequestCheckpoint();
                        if (!clock.ok()) return clock.status();
                        r.clock = *clock;
                        return absl::OkStatus();
                      });
  return 0;
}

int32_t ps_session_leave(ps_session* s, int32_t finished,
                         const ps_position* position) {
  if (int32_t e = Usable(s)) return e;
  std::optional<ps::DataPosition> pos;
  if (position != nullptr) pos = Position(*position);
  return Fail(s->session->Leave(finished != 0, pos ? &*pos : nullptr));
}

// ---- the job's progress and curves.

int32_t ps_session_job_progress(ps_session* s, ps_job_progress* out) {
  if (int32_t e = Usable(s)) return e;
  if (out == nullptr) return Invalid("no ps_job_progress to fill");
  absl::StatusOr<ps::GetStatusResponse> status = s->session->GetStatus();
  if (!status.ok()) return Fail(status.status());
  const ps::JobProgress& p = status->progress();
  // Finite values in range whatever the scheduler sent: a binding shows
  // them as they are.
  auto finite = [](double v) { return std::isfinite(v) ? v : 0.0; };
  *out = ps_job_progress{};
  out->progress = std::clamp(finite(p.progress()), 0.0, 1.0);
  if (p.has_eta_s() && std::isfinite(p.eta_s())) {
    out->has_eta = 1;
    out->eta_s = std::max(0.0, p.eta_s());
  }
  out->steps_done = p.steps_done();
  out->steps_total = p.steps_total();
  out->total_known = p.total_known() ? 1 : 0;
  out->steps_per_second = std::max(0.0, finite(p.steps_per_second()));
  out->examples_per_second = std::max(0.0, finite(p.examples_per_second()));
  out->examples = p.examples();
  out->elapsed_s = std::max(0.0, finite(p.elapsed_s()));
  return 0;
}

int32_t ps_session_report_metric(ps_session* s, const char* name,
                                 double value) {
  if (int32_t e = Reporting(s, "report a metric")) return e;
  if (name == nullptr) return Invalid("a metric needs a name");
  return Fail(s->session->membership()->ReportMetric(name, value, Step(s)));
}

int32_t ps_session_report_trained(ps_session* s, uint64_t examples,
                                  double loss_sum, uint64_t loss_examples) {
  if (int32_t e = Reporting(s, "report training")) return e;
  s->session->membership()->AddTrained(examples, loss_sum, loss_examples,
                                       absl::ZeroDuration());
  return 0;
}

int32_t ps_session_set_shard_batches(ps_session* s, uint64_t batches) {
  if (int32_t e = Reporting(s, "report a shard's size")) return e;
  s->session->membership()->SetShardBatches(batches);
  return 0;
}

// ---- the shard protocol: Session.batches over WorkerSession::shards().

int32_t ps_session_next_shard(ps_session* s, const ps_position* ended,
                              ps_future** out) {
  if (int32_t e = Usable(s)) return e;
  (void)Step(s);  // its claims set the clock to finished
  std::optional<ps::DataPosition> end;
  if (ended != nullptr) end = Position(*ended);
  *out = RunSessionOp(
      s, Kind::kNextShard, /*stop_on_free=*/true,
      [end](ps::WorkerSession& w, OpResults& r) -> absl::Status {
        ps::ShardCursor* shards = w.shards();
        if (end) shards->Ended(*end);
        absl::StatusOr<std::optional<ps::DataPosition>> next = shards->Next();
        if (!next.ok()) return next.status();
        std::optional<ps::DataPosition> at = *next;
        if (next->has_value()) {
          r.next_shard.result = PS_SHARD_TRAIN;
        } else if (shards->all_done()) {
          r.next_shard.result = PS_SHARD_ALL_DONE;
        } else {
          r.next_shard.result = PS_SHARD_STOPPED;
          at = shards->position();
        }
        r.next_shard.has_position = at ? 1 : 0;
        if (at) r.next_shard.position = ToC(*at);
        return absl::OkStatus();
      });
  return 0;
}

int32_t ps_pull(ps_session* s, uint32_t table, const uint64_t* keys, size_t n,
                float* out, size_t out_len, ps_future** f) {
  if (int32_t e = Usable(s)) return e;
  absl::StatusOr<uint32_t> dim = SparseDim(s, table);
  if (!dim.ok()) return Fail(dim.status());
  if (out_len != n * *dim) {
    return Invalid(absl::StrCat("pull of ", n, " keys of dim ", *dim,
                                " needs room for ", n * *dim,
                                " floats; the output has ", out_len));
  }
  *f = FromCompletion(
      s->session->kv()->Pull(table, absl::MakeConstSpan(keys, n), out));
  return 0;
}

int32_t ps_prefetch(ps_session* s, uint32_t table, const uint64_t* keys,
                    size_t n, ps_future** f) {
  if (int32_t e = Usable(s)) return e;
  absl::StatusOr<uint32_t> dim = SparseDim(s, table);
  if (!dim.ok()) return Fail(dim.status());
  *f = FromCompletion(
      s->session->kv()->Prefetch(table, absl::MakeConstSpan(keys, n)));
  return 0;
}

int32_t ps_push(ps_session* s, uint32_t table, const uint64_t* keys, size_t n,
                const float* grads, size_t grads_len, ps_future** f) {
  if (int32_t e = Writable(s, "push")) return e;
  absl::StatusOr<uint32_t> dim = SparseDim(s, table);
  if (!dim.ok()) return Fail(dim.status());
  if (grads_len != n * *dim) {
    return Invalid(absl::StrCat("push of ", n, " keys of dim ", *dim, " needs ",
                                n * *dim, " gradient values; got ", grads_len));
  }
  *f = FromCompletion(
      s->session->kv()->Push(table, absl::MakeConstSpan(keys, n),
                             absl::MakeConstSpan(grads, grads_len)));
  return 0;
}

int32_t ps_push_pull(ps_session* s, uint32_t table, const uint64_t* keys,
                     size_t n, const float* grads, size_t grads_len, float* out,
                     size_t out_len, ps_future** f) {
  if (int32_t e = Writable(s, "push_pull")) return e;
  absl::StatusOr<uint32_t> dim = SparseDim(s, table);
  if (!dim.ok()) return Fail(dim.status());
  if (grads_len != n * *dim || out_len != n * *dim) {
    return Invalid(absl::StrCat("push_pull of ", n, " keys of dim ", *dim,
                                " needs ", n * *dim,
                                " gradient values and as much room; got ",
                                grads_len, " and ", out_len));
  }
  *f = FromCompletion(
      s->session->kv()->PushPull(table, absl::MakeConstSpan(keys, n),
                                 absl::MakeConstSpan(grads, grads_len), out));
  return 0;
}

int32_t ps_pull_dense(ps_session* s, uint32_t table, uint64_t begin, size_t n,
                      float* out, ps_future** f) {
  if (int32_t e = Usable(s)) return e;
  *f = FromCompletion(s->session->kv()->PullDense(table, begin, n, out));
  return 0;
}

int32_t ps_push_dense(ps_session* s, uint32_t table, uint64_t begin,
                      const float* grads, size_t n, ps_future** f) {
  if (int32_t e = Writable(s, "push_dense")) return e;
  *f = FromCompletion(
      s->session->kv()->PushDense(table, begin, absl::MakeConstSpan(grads, n)));
  return 0;
}

int32_t ps_assign_dense(ps_session* s, uint32_t table, uint64_t begin,
                        const float* values, size_t n, ps_future** f) {
  if (int32_t e = Writable(s, "assign")) return e;
  *f = FromCompletion(s->session->kv()->AssignDense(
      table, begin, absl::MakeConstSpan(values, n)));
  return 0;
}

int32_t ps_scan(ps_session* s, uint32_t table, ps_future** f) {
  if (int32_t e = Usable(s)) return e;
  absl::StatusOr<uint32_t> dim = SparseDim(s, table);
  if (!dim.ok()) return Fail(dim.status());
  auto* fut = new ps_future(Kind::kScan);
  fut->scan_dim = *dim;
  fut->completion =
      s->session->kv()->Scan(table, &fut->scan_keys, &fut->scan_values);
  *f = fut;
  return 0;
}

int32_t ps_stats(ps_session* s, ps_future** f) {
  if (int32_t e = Usable(s)) return e;
  auto* fut = new ps_future(Kind::kStats);
  fut->completion = s->session->kv()->TableStatistics(&fut->stats);
  *f = fut;
  return 0;
}

// ---- dense tables by ring all-reduce.

int32_t ps_allreduce_create(ps_session* s, const uint32_t* tables,
                            size_t num_tables, const float* initial,
                            size_t initial_len, uint64_t step, const char* host,
                            ps_allreduce** out) {
  if (int32_t e = Writable(s, "an all-reduced dense table")) return e;
  if (out == nullptr) return Invalid("no ps_allreduce* to fill");
  if (tables == nullptr || num_tables == 0)
    return Invalid("no dense table given to all-reduce");
  const ps::JobConfig& config = s->session->config();
  std::vector<const ps::TableConfig*> parts;
  absl::StatusOr<ps::TableConfig> fused =
      FusedTable(config, absl::MakeConstSpan(tables, num_tables), &parts);
  if (!fused.ok()) return Fail(fused.status());
  const uint64_t size = fused->dense().size();
  std::vector<float> values;
  if (initial == nullptr) {
    values = InitialDenseValues(parts, size);
  } else if (initial_len != size) {
    return Invalid(absl::StrCat("dense table ", fused->name(), " has ", size,
                                " elements; the initial values are ",
                                initial_len));
  } else {
    values.assign(initial, initial + size);
  }
  ps::AllReducedTable::Options options;
  options.table = *std::move(fused);
  options.num_workers = s->session->num_workers();
  options.allreduce = config.allreduce();
  options.scheduler = s->session->membership();
  if (host != nullptr && *host != '\0') options.host = host;
  auto r = std::make_unique<ps_allreduce>();
  // Called by the table, which the handle (holding the session) outlives.
  options.clock = [w = s->session.get(), paused = r->paused_clock] {
    const uint64_t clock = w->clock();
    return clock < ps::kFinishedClock ? clock : paused->load();
  };
  absl::StatusOr<ps::DenseRingCopy> copy =
      ps::DenseRingCopy::Create(config, parts);
  if (!copy.ok()) return Fail(copy.status());
  r->copy = *std::move(copy);
  absl::StatusOr<std::unique_ptr<ps::AllReducedTable>> table =
      ps::AllReducedTable::Create(std::move(options), std::move(values), step);
  if (!table.ok()) return Fail(table.status());
  r->session = s->session;
  r->pid = getpid();
  {
    absl::MutexLock lock(&r->mu);
    r->table = *std::move(table);
  }
  *out = r.release();
  return 0;
}

void ps_allreduce_free(ps_allreduce* r) {
  if (r == nullptr) return;
  if (r->pid != getpid()) {
    // The parent's watcher thread is not here: leak, as ps_session_free.
    return;
  }
  {
    absl::MutexLock lock(&r->mu);
    r->table.reset();  // leaves the ring
  }
  delete r;
}

int32_t ps_allreduce_join(ps_allreduce* r, uint32_t min_members) {
  if (int32_t e = UsableRing(r)) return e;
  absl::MutexLock lock(&r->mu);
  if (r->table->connected()) return 0;
  if (min_members > 0) return Fail(r->table->Join(min_members));
  ps::WorkerSession& w = *r->session;
  return Fail(ps::DenseRingCopy::JoinRunning(
      *w.kv(), *r->table, *r->paused_clock,
      [&w](uint64_t clock) { return w.Restart(clock); }));
}

int32_t ps_allreduce_step(ps_allreduce* r, const float* grads, size_t n) {
  if (int32_t e = UsableRing(r)) return e;
  absl::MutexLock lock(&r->mu);
  if (int32_t e = CheckGradients(*r->table, grads, n)) return e;
  return Fail(r->table->Step(absl::MakeConstSpan(grads, n)));
}

int32_t ps_allreduce_end_step(ps_allreduce* r, const float* grads, size_t n,
                              const ps_position* next, ps_future** out) {
  if (int32_t e = UsableRing(r)) return e;
  if (out == nullptr) return Invalid("no ps_future* to fill");
  *out = nullptr;
  absl::MutexLock lock(&r->mu);
  ps::AllReducedTable& t = *r->table;
  if (int32_t e = CheckGradients(t, grads, n)) return e;
  std::optional<ps::DataPosition> pos;
  if (next != nullptr) pos = Position(*next);
  ps::WorkerSession& w = *r->session;
  return Fail(r->copy->EndStep(*w.kv(), t, absl::MakeConstSpan(grads, n),
                               [&] { *out = FromCompletion(w.EndStep(pos)); }));
}

int32_t ps_allreduce_write(ps_allreduce* r) {
  if (int32_t e = UsableRing(r)) return e;
  absl::MutexLock lock(&r->mu);
  return Fail(r->copy->WriteServers(*r->session->kv(), *r->table));
}

int32_t ps_allreduce_read(ps_allreduce* r, int32_t state) {
  if (int32_t e = UsableRing(r)) return e;
  absl::MutexLock lock(&r->mu);
  return Fail(r->copy->ReadServers(*r->session->kv(), *r->table, state != 0));
}

int32_t ps_allreduce_leave(ps_allreduce* r) {
  if (int32_t e = UsableRing(r)) return e;
  absl::MutexLock lock(&r->mu);
  return Fail(r->table->Leave());
}

int32_t ps_allreduce_values(ps_allreduce* r, uint64_t begin, float* out,
                            size_t n) {
  if (int32_t e = UsableRing(r)) return e;
  absl::MutexLock lock(&r->mu);
  const std::vector<float>& v = r->table->values();
  if (begin > v.size() || n > v.size() - begin || (out == nullptr && n != 0)) {
    return Invalid(absl::StrCat("elements [", begin, ", ", begin + n,
                                ") of an all-reduced table of ", v.size()));
  }
  std::copy_n(v.begin() + begin, n, out);
  return 0;
}

int32_t ps_allreduce_state(ps_allreduce* r, float* out, size_t n) {
  if (int32_t e = UsableRing(r)) return e;
  absl::MutexLock lock(&r->mu);
  const std::vector<float>& state = r->table->state();
  if (n != state.size() || (out == nullptr && n != 0)) {
    return Invalid(absl::StrCat("the optimizer state is ", state.size(),
                                " floats; the output has room for ", n));
  }
  std::copy(state.begin(), state.end(), out);
  return 0;
}

int32_t ps_allreduce_reset(ps_allreduce* r, const float* values, size_t n,
                           const float* state, size_t state_len,
                           uint64_t step) {
  if (int32_t e = UsableRing(r)) return e;
  if (values == nullptr && n != 0) return Invalid("no values given");
  absl::MutexLock lock(&r->mu);
  std::vector<float> new_state =
      state == nullptr ? r->table->state()
                       : std::vector<float>(state, state + state_len);
  return Fail(r->table->Reset(std::vector<float>(values, values + n),
                              std::move(new_state), step));
}

int32_t ps_allreduce_info(ps_allreduce* r, ps_ring_info* out) {
  if (int32_t e = UsableRing(r)) return e;
  if (out == nullptr) return Invalid("no ps_ring_info to fill");
  absl::MutexLock lock(&r->mu);
  const ps::AllReducedTable& t = *r->table;
  *out = ps_ring_info{};
  out->size = t.values().size();
  out->state_size =
      out->size == 0 ? 0 : static_cast<uint32_t>(t.state().size() / out->size);
  out->step = t.step();
  out->ring_size = t.ring_size();
  out->generation = t.generation();
  out->reforms = t.reforms();
  out->peer_clock = t.peer_clock();
  out->connected = t.connected() ? 1 : 0;
  return 0;
}

int32_t ps_future_wait(ps_future* f, double timeout_s) {
  if (f == nullptr) return Invalid("no future");
  absl::Status status;
  if (f->completion) {
    if (!f->completion->WaitFor(Seconds(timeout_s), &status)) {
      last_error = "pending";
      last_reason = PS_REASON_NONE;
      return PS_PENDING;
    }
  } else if (f->op) {
    AsyncOp* op = f->op.get();
    absl::MutexLock lock(&op->mu);
    if (!op->mu.AwaitWithTimeout(absl::Condition(&op->done),
                                 Seconds(timeout_s))) {
      last_error = "pending";
      last_reason = PS_REASON_NONE;
      return PS_PENDING;
    }
    status = op->status;
  }
  return Fail(status);
}

int32_t ps_future_done(ps_future* f) {
  if (f == nullptr) return 1;
  if (f->completion) return f->completion->done() ? 1 : 0;
  if (f->op) {
    absl::MutexLock lock(&f->op->mu);
    return f->op->done ? 1 : 0;
  }
  return 1;
}

uint64_t ps_future_min_clock(ps_future* f) {
  return f != nullptr && f->completion ? f->completion->min_clock() : 0;
}

int32_t ps_future_claim(ps_future* f, ps_claim* out) {
  return ReadResults(f, {Kind::kClaim},
                     [out](OpResults& r) { *out = r.claim; });
}

int32_t ps_future_next_shard(ps_future* f, ps_next_shard* out) {
  return ReadResults(f, {Kind::kNextShard},
                     [out](OpResults& r) { *out = r.next_shard; });
}

int32_t ps_future_ranks(ps_future* f, uint32_t* out, size_t capacity,
                        size_t* n) {
  return ReadResults(f, {Kind::kBarrier, Kind::kFinish}, [&](OpResults& r) {
    *n = r.ranks.size();
    std::copy_n(r.ranks.begin(), std::min(capacity, r.ranks.size()), out);
  });
}

int32_t ps_future_finish(ps_future* f, int32_t* evaluator) {
  return ReadResults(f, {Kind::kFinish},
                     [&](OpResults& r) { *evaluator = r.evaluator; });
}

int32_t ps_future_checkpoint(ps_future* f, uint64_t* clock) {
  return ReadResults(f, {Kind::kCheckpoint},
                     [&](OpResults& r) { *clock = r.clock; });
}

int32_t ps_future_stats(ps_future* f, ps_table_stats* out, size_t capacity,
                        size_t* n) {
  if (int32_t e = RequestDone(f, Kind::kStats)) return e;
  *n = f->stats.size();
  for (size_t i = 0; i < std::min(capacity, f->stats.size()); ++i)
    out[i] = ToC(f->stats[i]);
  return 0;
}

ps_session* ps_future_take_session(ps_future* f) {
  std::unique_ptr<ps::WorkerSession> started;
  if (ReadResults(f, {Kind::kStart},
                  [&](OpResults& r) { started = std::move(r.started); }) != 0 ||
      started == nullptr) {
    return nullptr;
  }
  auto* s = new ps_session;
  s->config = std::make_unique<ps_config>(started->config());
  s->session = std::move(started);
  s->pid = getpid();
  return s;
}

int32_t ps_future_scan_size(ps_future* f, uint64_t* rows, uint32_t* dim) {
  if (int32_t e = RequestDone(f, Kind::kScan)) return e;
  *rows = f->scan_keys.size();
  *dim = f->scan_dim;
  return 0;
}

int32_t ps_future_scan_copy(ps_future* f, uint64_t* keys, float* values) {
  if (int32_t e = RequestDone(f, Kind::kScan)) return e;
  std::copy(f->scan_keys.begin(), f->scan_keys.end(), keys);
  std::copy(f->scan_values.begin(), f->scan_values.end(), values);
  return 0;
}

void ps_future_free(ps_future* f) {
  if (f == nullptr) return;
  if (f->op != nullptr) {
    bool done;
    {
      absl::MutexLock lock(&f->op->mu);
      done = f->op->done;
    }
    if (!done && f->stop) f->stop();
    if (f->op->thread.joinable()) f->op->thread.join();
  }
  // A scan or stats request writes into this object: wait for it (its
  // requests are bounded by the request timeout).
  if (f->completion && (f->kind == Kind::kScan || f->kind == Kind::kStats)) {
    (void)f->completion->Wait();
  }
  delete f;
}

}  // extern "C"
