// The C ABI of python/native/ps_c.h over WorkerSession and KVClient.
#include "python/native/ps_c.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
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
#include "common/config.h"
#include "common/curve_keys.h"
#include "common/initializer.h"
#include "common/logging.h"
#include "common/node_main.h"
#include "common/protocol.h"
#include "common/status.h"
#include "google/protobuf/util/json_util.h"
#include "worker/data/keys.h"
#include "worker/data/synthetic_ctr.h"
#include "worker/kv_client.h"
#include "worker/session.h"

namespace {

thread_local std::string last_error;

int32_t Fail(const absl::Status& s) {
  last_error = std::string(s.message());
  return s.ok() ? 0 : static_cast<int32_t>(s.code());
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

absl::Duration Seconds(double s) {
  if (!std::isfinite(s) || s > 1e9) return absl::InfiniteDuration();
  return absl::Seconds(std::max(0.0, s));
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string PositionJson(const ps::DataPosition& p) {
  return absl::StrCat("{\"shard\":", p.shard(), ",\"epoch\":", p.epoch(),
                      ",\"batch\":", p.batch(),
                      ",\"done\":", p.done() ? "true" : "false", "}");
}

std::string OptimizerName(const ps::OptimizerConfig& o) {
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

std::string TablesJson(const ps::JobConfig& config) {
  std::vector<std::string> tables;
  for (const ps::TableConfig& t : config.tables()) {
    std::string optimizer;
    google::protobuf::util::JsonPrintOptions o;
    o.preserve_proto_field_names = true;
    o.always_print_primitive_fields = true;
    (void)google::protobuf::util::MessageToJsonString(t.optimizer(), &optimizer,
                                                      o);
    tables.push_back(absl::StrCat(
        "{\"name\":", Quote(t.name()), ",\"id\":", t.id(),
        ",\"sparse\":", t.has_sparse() ? "true" : "false",
        ",\"dim\":", t.has_sparse() ? t.sparse().dim() : 1,
        ",\"size\":", t.has_dense() ? t.dense().size() : 0,
        ",\"optimizer\":", Quote(OptimizerName(t.optimizer())),
        ",\"optimizer_config\":", optimizer.empty() ? "{}" : optimizer, "}"));
  }
  return absl::StrCat("[", absl::StrJoin(tables, ","), "]");
}

// The servers clip non-finite gradients: the worker sends them (as
// KVClient decides, worker/kv_client.cc) instead of refusing the push.
bool ClipsNonFinite(const ps::JobConfig& config) {
  const ps::GradientPolicy& g = config.data_plane().gradients();
  return g.nonfinite() == ps::GradientPolicy::CLIP && g.clip_value() > 0;
}

std::string ConfigJson(const ps::JobConfig& config) {
  return absl::StrCat(
      "{\"name\":", Quote(config.name()), ",\"mode\":",
      Quote(ps::ConsistencyMode_Name(config.consistency().mode())),
      ",\"staleness\":", config.consistency().staleness(),
      ",\"num_workers\":", config.cluster().num_workers(),
      ",\"num_servers\":", config.cluster().num_servers(),
      ",\"prefetch\":", config.training().prefetch() ? "true" : "false",
      ",\"clips_nonfinite\":", ClipsNonFinite(config) ? "true" : "false",
      ",\"training\":{\"batch_size\":", config.training().batch_size(),
      ",\"epochs\":", config.training().epochs(), ",\"shard_by_batch\":",
      config.training().shard_by_batch() ? "true" : "false",
      ",\"max_steps\":", config.training().max_steps(),
      ",\"export_path\":", Quote(config.training().export_path()), "}",
      ",\"checkpoint_dir\":", Quote(config.checkpoint().dir()),
      ",\"tables\":", TablesJson(config), "}");
}

absl::StatusOr<ps::JobConfig> LoadConfig(const char* path, int64_t num_servers,
                                         int64_t num_workers) {
  if (path == nullptr || *path == '\0') {
    return absl::InvalidArgumentError("no job config file given");
  }
  absl::StatusOr<ps::JobConfig> config = ps::LoadJobConfig(path);
  if (!config.ok()) return config.status();
  if (absl::Status s =
          ps::OverrideClusterSize({num_servers, num_workers}, &*config);
      !s.ok()) {
    return s;
  }
  return config;
}

}  // namespace

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

// A session and the pid that made it: its threads exist only there. Its
// lifecycle operations share ownership of the WorkerSession (they run on
// threads of their own and may still be running when the session is
// freed); ps_session_free stops them and waits until they have let go.
struct ps_session {
  std::shared_ptr<ps::WorkerSession> session;
  std::shared_ptr<OpTracker> ops = std::make_shared<OpTracker>();
  pid_t pid = 0;
};

// A lifecycle operation running on a thread of its own.
struct AsyncOp {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  std::thread thread;
};

struct ps_future {
  std::optional<ps::Completion> completion;
  std::shared_ptr<AsyncOp> op;
  // Asked to stop when the handle is freed while `op` still runs.
  std::function<void()> stop;
  // Results.
  int64_t value = 0;
  std::string text;
  bool has_text = false;
  std::unique_ptr<ps::WorkerSession> started;
  std::vector<ps::ServerTableStats> stats;
  std::vector<uint64_t> scan_keys;
  std::vector<float> scan_values;
  uint32_t scan_dim = 1;
  // Produces `text` from the results once the completion is OK (stats).
  std::function<void(ps_future*)> finish;
  bool finished = false;
  // The request writes into this object (scan, stats): freeing waits for it.
  bool writes_into_self = false;
};

namespace {

// Runs `body` on a thread; its status completes `f`.
void RunAsync(ps_future* f, std::function<absl::Status()> body) {
  auto op = std::make_shared<AsyncOp>();
  f->op = op;
  op->thread = std::thread([op, body = std::move(body)] {
    absl::Status s = body();
    absl::MutexLock lock(&op->mu);
    op->status = std::move(s);
    op->done = true;
  });
}

// Runs `body` on a thread with a reference to the session of `s`, counted
// in `s`'s operations until the thread lets go of it. With `stop_on_free`,
// freeing the future before the operation ends asks the session to stop (a
// weak reference: a session already freed has nothing left to stop).
void RunSessionOp(ps_session* s, ps_future* f, bool stop_on_free,
                  std::function<absl::Status(ps::WorkerSession&)> body) {
  if (stop_on_free) {
    std::weak_ptr<ps::WorkerSession> weak = s->session;
    f->stop = [weak] {
      if (std::shared_ptr<ps::WorkerSession> w = weak.lock()) w->RequestStop();
    };
  }
  std::shared_ptr<OpTracker> ops = s->ops;
  ops->Started();
  RunAsync(f, [w = s->session, ops, body = std::move(body)]() mutable {
    absl::Status st = body(*w);
    w.reset();  // before Ended(): the session may be destroyed once idle
    ops->Ended();
    return st;
  });
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

ps::DataPosition Position(uint32_t shard, uint64_t epoch, uint64_t batch,
                          int32_t done) {
  ps::DataPosition p;
  p.set_shard(shard);
  p.set_epoch(epoch);
  p.set_batch(batch);
  p.set_done(done != 0);
  return p;
}

ps_future* FromCompletion(ps::Completion c) {
  auto* f = new ps_future;
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

}  // namespace

extern "C" {

int32_t ps_abi_version(void) { return PS_C_ABI_VERSION; }

const char* ps_last_error(void) { return last_error.c_str(); }

int32_t ps_set_log_level(const char* level) {
  return Fail(ps::SetLogLevel(level == nullptr ? "" : level));
}

void ps_hash_keys(uint32_t field, const uint64_t* values, size_t n,
                  uint64_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = ps::data::CriteoKey(field, values[i]);
}

void ps_free_string(char* s) { std::free(s); }

int32_t ps_describe_config(const char* path, int64_t num_servers,
                           int64_t num_workers, char** out_json) {
  absl::StatusOr<ps::JobConfig> config =
      LoadConfig(path, num_servers, num_workers);
  if (!config.ok()) return Fail(config.status());
  *out_json = CopyString(ConfigJson(*config));
  return 0;
}

int32_t ps_initial_values(const char* path, const char* table,
                          const uint64_t* keys, size_t n, uint64_t first,
                          float* out, size_t out_len) {
  absl::StatusOr<ps::JobConfig> config = LoadConfig(path, 0, 0);
  if (!config.ok()) return Fail(config.status());
  absl::StatusOr<const ps::TableConfig*> t =
      ps::FindTable(*config, table == nullptr ? "" : table);
  if (!t.ok()) return Fail(t.status());
  const ps::TableConfig& tc = **t;
  if (tc.has_sparse()) {
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

int32_t ps_synthetic_ctr(const char* path, int32_t split, uint64_t begin,
                         uint64_t count, float* numeric, size_t numeric_len,
                         uint64_t* keys, size_t keys_len, float* labels,
                         float* true_logits) {
  absl::StatusOr<ps::JobConfig> config = LoadConfig(path, 0, 0);
  if (!config.ok()) return Fail(config.status());
  if (!config->data().has_synthetic_ctr()) {
    return Invalid(
        absl::StrCat(path, ": the job has no data.synthetic_ctr block"));
  }
  // One generator per config file: building its sampling tables takes
  // milliseconds, filling a batch microseconds.
  static absl::Mutex cache_mu;
  static std::string* cached_path = new std::string;
  static std::shared_ptr<const ps::ctr::SyntheticCtr>* cached =
      new std::shared_ptr<const ps::ctr::SyntheticCtr>;
  std::shared_ptr<const ps::ctr::SyntheticCtr> gen;
  {
    absl::MutexLock lock(&cache_mu);
    const std::string key =
        absl::StrCat(path, "\n", config->data().synthetic_ctr().DebugString());
    if (*cached_path != key || *cached == nullptr) {
      auto made = ps::ctr::SyntheticCtr::Create(config->data().synthetic_ctr());
      if (!made.ok()) return Fail(made.status());
      *cached = std::make_shared<const ps::ctr::SyntheticCtr>(*std::move(made));
      *cached_path = key;
    }
    gen = *cached;
  }
  const ps::ctr::Split sp =
      split == 0 ? ps::ctr::Split::kTrain : ps::ctr::Split::kTest;
  if (split != 0 && split != 1)
    return Invalid("split must be 0 (train) or 1 (test)");
  const uint64_t size = gen->size(sp);
  if (begin > size || count > size - begin) {
    return Invalid(absl::StrCat("examples [", begin, ", ", begin + count,
                                ") of a split of ", size));
  }
  if (numeric_len != count * gen->num_numeric() ||
      keys_len != count * gen->num_categorical()) {
    return Invalid(absl::StrCat(
        "synthetic_ctr: ", count, " examples need ", count * gen->num_numeric(),
        " numeric values and ", count * gen->num_categorical(),
        " keys; got room for ", numeric_len, " and ", keys_len));
  }
  ps::ctr::Batch batch;
  if (absl::Status s = gen->Fill(sp, begin, count, &batch); !s.ok())
    return Fail(s);
  std::copy(batch.numeric.begin(), batch.numeric.end(), numeric);
  std::copy(batch.keys.begin(), batch.keys.end(), keys);
  std::copy(batch.labels.begin(), batch.labels.end(), labels);
  if (true_logits != nullptr) {
    std::copy(batch.true_logits.begin(), batch.true_logits.end(), true_logits);
  }
  return 0;
}

int32_t ps_session_start(const char* config_path, const char* scheduler,
                         int64_t num_servers, int64_t num_workers,
                         int32_t flags, double stop_check_s,
                         double startup_timeout_s, ps_future** out) {
  absl::StatusOr<ps::JobConfig> config =
      LoadConfig(config_path, num_servers, num_workers);
  if (!config.ok()) return Fail(config.status());
  if (scheduler == nullptr || *scheduler == '\0') {
    return Invalid("no scheduler address (host:port) given");
  }
  absl::StatusOr<std::optional<ps::CurveKeys>> curve =
      ps::LoadCurveKeys(config->security().curve());
  if (!curve.ok()) return Fail(curve.status());
  ps::WorkerSession::Options options;
  options.config = *std::move(config);
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
  auto* f = new ps_future;
  f->stop = [stop] { stop->store(true); };
  RunAsync(f, [f, options = std::move(options)]() mutable -> absl::Status {
    auto session = ps::WorkerSession::Start(std::move(options));
    if (!session.ok()) return session.status();
    f->started = *std::move(session);
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

int32_t ps_session_info(ps_session* s, char** out_json) {
  if (int32_t e = Usable(s)) return e;
  ps::WorkerSession& w = *s->session;
  const std::optional<ps::DataPosition> pos = w.initial_position();
  *out_json = CopyString(absl::StrCat(
      "{\"rank\":", w.rank(), ",\"node_id\":", w.node_id(),
      ",\"observer\":", w.observer() ? "true" : "false",
      ",\"restored_start\":", w.restored_start() ? "true" : "false",
      ",\"start_clock\":", w.start_clock(),
      ",\"position\":", pos ? PositionJson(*pos) : std::string("null"),
      ",\"job\":", ConfigJson(w.config()), "}"));
  return 0;
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

int32_t ps_session_end_step(ps_session* s, int32_t has_position, uint32_t shard,
                            uint64_t epoch, uint64_t batch, int32_t done,
                            ps_future** out) {
  if (int32_t e = Usable(s)) return e;
  std::optional<ps::DataPosition> next;
  if (has_position) next = Position(shard, epoch, batch, done);
  *out = FromCompletion(s->session->EndStep(next));
  return 0;
}

int32_t ps_session_barrier(ps_session* s, const char* name, double timeout_s,
                           ps_future** out) {
  if (int32_t e = Usable(s)) return e;
  if (name == nullptr || *name == '\0')
    return Invalid("a barrier needs a name");
  auto* f = new ps_future;
  RunSessionOp(s, f, /*stop_on_free=*/true,
               [f, name = std::string(name),
                timeout = Seconds(timeout_s)](ps::WorkerSession& w) {
                 std::vector<uint32_t> ranks;
                 absl::Status st = w.Barrier(name, timeout, &ranks);
                 if (st.ok()) {
                   f->text = absl::StrCat("[", absl::StrJoin(ranks, ","), "]");
                   f->has_text = true;
                 }
                 return st;
               });
  *out = f;
  return 0;
}

int32_t ps_session_claim(ps_session* s, int32_t has_finished, uint32_t shard,
                         uint64_t epoch, uint64_t batch, ps_future** out) {
  if (int32_t e = Usable(s)) return e;
  auto* f = new ps_future;
  std::optional<ps::DataPosition> finished;
  if (has_finished) finished = Position(shard, epoch, batch, 1);
  RunSessionOp(s, f, /*stop_on_free=*/true,
               [f, finished](ps::WorkerSession& w) -> absl::Status {
                 auto r = w.Claim(finished ? &*finished : nullptr);
                 if (!r.ok()) return r.status();
                 f->text = absl::StrCat(
                     "{\"result\":",
                     Quote(ps::ClaimShardResponse::Result_Name(r->result())),
                     ",\"shard\":", r->shard().shard(),
                     ",\"epoch\":", r->shard().epoch(),
                     ",\"batch\":", r->shard().batch(),
                     ",\"done\":", r->shard().done() ? "true" : "false",
                     ",\"start_clock\":", r->start_clock(), "}");
                 f->has_text = true;
                 return absl::OkStatus();
               });
  *out = f;
  return 0;
}

int32_t ps_session_restart(ps_session* s, uint64_t clock) {
  if (int32_t e = Usable(s)) return e;
  return Fail(s->session->Restart(clock));
}

int32_t ps_session_finish(ps_session* s, double timeout_s, ps_future** out) {
  if (int32_t e = Usable(s)) return e;
  auto* f = new ps_future;
  RunSessionOp(
      s, f, /*stop_on_free=*/true,
      [f, timeout = Seconds(timeout_s)](ps::WorkerSession& w) -> absl::Status {
        auto r = w.Finish(timeout);
        if (!r.ok()) return r.status();
        f->value = *r ? 1 : 0;
        f->text =
            absl::StrCat("[", absl::StrJoin(w.finished_ranks(), ","), "]");
        f->has_text = true;
        return absl::OkStatus();
      });
  *out = f;
  return 0;
}

int32_t ps_session_evaluation_done(ps_session* s) {
  if (int32_t e = Usable(s)) return e;
  return Fail(s->session->EvaluationDone());
}

int32_t ps_session_checkpoint(ps_session* s, ps_future** out) {
  if (int32_t e = Usable(s)) return e;
  auto* f = new ps_future;
  RunSessionOp(s, f, /*stop_on_free=*/false,
               [f](ps::WorkerSession& w) -> absl::Status {
                 auto r = w.RequestCheckpoint();
                 if (!r.ok()) return r.status();
                 f->value = static_cast<int64_t>(*r);
                 return absl::OkStatus();
               });
  *out = f;
  return 0;
}

int32_t ps_session_leave(ps_session* s, int32_t finished, int32_t has_position,
                         uint32_t shard, uint64_t epoch, uint64_t batch,
                         int32_t done) {
  if (int32_t e = Usable(s)) return e;
  std::optional<ps::DataPosition> pos;
  if (has_position) pos = Position(shard, epoch, batch, done);
  return Fail(s->session->Leave(finished != 0, pos ? &*pos : nullptr));
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
  auto* fut = new ps_future;
  fut->scan_dim = *dim;
  fut->writes_into_self = true;
  fut->completion =
      s->session->kv()->Scan(table, &fut->scan_keys, &fut->scan_values);
  *f = fut;
  return 0;
}

int32_t ps_stats(ps_session* s, ps_future** f) {
  if (int32_t e = Usable(s)) return e;
  auto* fut = new ps_future;
  fut->writes_into_self = true;
  fut->completion = s->session->kv()->TableStatistics(&fut->stats);
  fut->finish = [](ps_future* me) {
    std::vector<std::string> lines;
    google::protobuf::util::JsonPrintOptions o;
    o.preserve_proto_field_names = true;
    o.always_print_primitive_fields = true;
    for (const ps::ServerTableStats& st : me->stats) {
      std::string json;
      (void)google::protobuf::util::MessageToJsonString(st.stats, &json, o);
      lines.push_back(absl::StrCat("{\"server\":", st.server_rank,
                                   ",\"stats\":", json, "}"));
    }
    me->text = absl::StrCat("[", absl::StrJoin(lines, ","), "]");
    me->has_text = true;
  };
  *f = fut;
  return 0;
}

int32_t ps_future_wait(ps_future* f, double timeout_s) {
  if (f == nullptr) return Invalid("no future");
  absl::Status status;
  if (f->completion) {
    if (!f->completion->WaitFor(Seconds(timeout_s), &status)) {
      last_error = "pending";
      return PS_PENDING;
    }
  } else if (f->op) {
    AsyncOp* op = f->op.get();
    absl::MutexLock lock(&op->mu);
    if (!op->mu.AwaitWithTimeout(absl::Condition(&op->done),
                                 Seconds(timeout_s))) {
      last_error = "pending";
      return PS_PENDING;
    }
    status = op->status;
  }
  if (status.ok() && f->finish && !f->finished) {
    f->finished = true;
    f->finish(f);
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

int64_t ps_future_value(ps_future* f) { return f == nullptr ? 0 : f->value; }

char* ps_future_text(ps_future* f) {
  if (f == nullptr || !f->has_text) return nullptr;
  return CopyString(f->text);
}

ps_session* ps_future_take_session(ps_future* f) {
  if (f == nullptr || f->started == nullptr) return nullptr;
  auto* s = new ps_session;
  s->session = std::move(f->started);
  s->pid = getpid();
  return s;
}

int32_t ps_future_scan_size(ps_future* f, uint64_t* rows, uint32_t* dim) {
  if (f == nullptr || !f->completion) return Invalid("not a scan");
  if (!f->completion->done())
    return Fail(absl::FailedPreconditionError("scan not done"));
  *rows = f->scan_keys.size();
  *dim = f->scan_dim;
  return 0;
}

int32_t ps_future_scan_copy(ps_future* f, uint64_t* keys, float* values) {
  if (f == nullptr || !f->completion) return Invalid("not a scan");
  if (!f->completion->done())
    return Fail(absl::FailedPreconditionError("scan not done"));
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
  if (f->completion && f->writes_into_self) {
    (void)f->completion->Wait();
  }
  delete f;
}

}  // extern "C"
