#include "common/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hash.h"
#include "common/model_layout.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/text_format.h"

namespace ps {
namespace {

// The largest data-plane message any process accepts: kMaxMessageBytes in
// common/wire.h (wire_test checks that the two agree; this target does not
// link ZeroMQ).
constexpr int64_t kMessageBytesCeiling = int64_t{1} << 30;

// Collects every parse error with its position; TextFormat reports 0-based
// lines and columns.
class CollectingErrors : public google::protobuf::io::ErrorCollector {
 public:
  explicit CollectingErrors(absl::string_view source) : source_(source) {}
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    errors_.push_back(
        absl::StrCat(source_, ":", line + 1, ":", column + 1, ": ", message));
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column,
                  const std::string& message) override {
    AddError(line, column, message);
  }
  std::string Joined() const { return absl::StrJoin(errors_, "; "); }

 private:
  std::string source_;
  std::vector<std::string> errors_;
};

// Validation accumulates all problems so a user fixes a file in one pass.
class Checker {
 public:
  void Require(bool ok, absl::string_view field, absl::string_view what) {
    if (!ok) errors_.push_back(absl::StrCat(field, ": ", what));
  }
  absl::Status Result() const {
    if (errors_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(errors_, "; "));
  }

 private:
  std::vector<std::string> errors_;
};

bool Positive(float v) { return std::isfinite(v) && v > 0; }
bool NonNegative(float v) { return std::isfinite(v) && v >= 0; }
// Decay rates: 1 would never forget (and divide by zero in Adam's bias
// correction), negative values oscillate.
bool UnitInterval(float v) { return v >= 0 && v < 1; }

void CheckOptimizer(const OptimizerConfig& opt, const std::string& path,
                    Checker* c) {
  switch (opt.kind_case()) {
    case OptimizerConfig::kSgd:
      c->Require(Positive(opt.sgd().learning_rate()),
                 path + ".sgd.learning_rate", "must be a finite number > 0");
      break;
    case OptimizerConfig::kAdagrad:
      c->Require(Positive(opt.adagrad().learning_rate()),
                 path + ".adagrad.learning_rate",
                 "must be a finite number > 0");
      c->Require(std::isfinite(opt.adagrad().initial_accumulator()) &&
                     opt.adagrad().initial_accumulator() >= 0,
                 path + ".adagrad.initial_accumulator", "must be >= 0");
      c->Require(Positive(opt.adagrad().epsilon()), path + ".adagrad.epsilon",
                 "must be > 0");
      break;
    case OptimizerConfig::kMomentum:
      c->Require(Positive(opt.momentum().learning_rate()),
                 path + ".momentum.learning_rate",
                 "must be a finite number > 0");
      c->Require(UnitInterval(opt.momentum().momentum()),
                 path + ".momentum.momentum", "must be in [0, 1)");
      break;
    case OptimizerConfig::kAdam:
      c->Require(Positive(opt.adam().learning_rate()),
                 path + ".adam.learning_rate", "must be a finite number > 0");
      c->Require(UnitInterval(opt.adam().beta1()), path + ".adam.beta1",
                 "must be in [0, 1)");
      c->Require(UnitInterval(opt.adam().beta2()), path + ".adam.beta2",
                 "must be in [0, 1)");
      c->Require(Positive(opt.adam().epsilon()), path + ".adam.epsilon",
                 "must be > 0");
      break;
    case OptimizerConfig::kFtrl:
      c->Require(Positive(opt.ftrl().alpha()), path + ".ftrl.alpha",
                 "must be a finite number > 0");
      c->Require(Positive(opt.ftrl().beta()), path + ".ftrl.beta",
                 "must be a finite number > 0");
      c->Require(NonNegative(opt.ftrl().l1()), path + ".ftrl.l1",
                 "must be >= 0");
      c->Require(NonNegative(opt.ftrl().l2()), path + ".ftrl.l2",
                 "must be >= 0");
      break;
    case OptimizerConfig::KIND_NOT_SET:
      c->Require(false, path, "set one of sgd, adagrad, momentum, adam, ftrl");
      break;
  }
  const LearningRateSchedule& sched = opt.schedule();
  // An unset decay_rate means "default" only after ApplyDefaults; a config
  // checked without defaults may still leave it 0 when decay is off.
  c->Require(sched.decay_steps() == 0 ||
                 (Positive(sched.decay_rate()) && sched.decay_rate() <= 1),
             path + ".schedule.decay_rate", "must be in (0, 1]");
  c->Require(sched.decay_rate() == 0 || sched.decay_steps() > 0,
             path + ".schedule.decay_rate", "needs schedule.decay_steps > 0");
  c->Require(sched.warmup_steps() <= (uint64_t{1} << 40),
             path + ".schedule.warmup_steps", "must be at most 2^40");
  c->Require(sched.decay_steps() <= (uint64_t{1} << 40),
             path + ".schedule.decay_steps", "must be at most 2^40");
  // FTRL's weight is a closed form in which a common factor on every
  // gradient nearly cancels: scaling would silently do almost nothing.
  c->Require(!opt.scale_with_workers() || !opt.has_ftrl(),
             path + ".scale_with_workers",
             "does not apply to FTRL (its weights barely change when every "
             "gradient is scaled); scale alpha instead");
}

void CheckSparseTable(const SparseTableConfig& t, const std::string& path,
                      Checker* c) {
  c->Require(t.dim() >= 1 && t.dim() <= 65536, path + ".dim",
             "must be in 1..65536");
  c->Require(t.admit_after_pushes() <= 65535, path + ".admit_after_pushes",
             "must be at most 65535");
  c->Require(t.admission_sketch_width() == 0 ||
                 (t.admission_sketch_width() >= 1024 &&
                  t.admission_sketch_width() <= (1u << 28)),
             path + ".admission_sketch_width", "must be in 1024..2^28");
  c->Require(t.ttl_steps() <= (uint64_t{1} << 62), path + ".ttl_steps",
             "must be at most 2^62");
  c->Require(t.ttl_seconds() <= (uint64_t{1} << 31), path + ".ttl_seconds",
             "must be at most 2^31");
  c->Require(t.memory_budget_bytes() == 0 ||
                 t.memory_budget_bytes() >= (uint64_t{1} << 20),
             path + ".memory_budget_bytes",
             "must be 0 (no budget) or >= 1 MiB");
  c->Require(t.eviction() == EVICT_NONE || t.eviction() == EVICT_LRU ||
                 t.eviction() == EVICT_LFU,
             path + ".eviction", "must be EVICT_NONE, EVICT_LRU or EVICT_LFU");
  c->Require(t.eviction() == EVICT_NONE || t.memory_budget_bytes() > 0,
             path + ".eviction",
             "evicts only under memory_budget_bytes; set it");
  if (t.has_disk_tier()) {
    const DiskTierConfig& dt = t.disk_tier();
    const std::string p = path + ".disk_tier";
    c->Require(!dt.dir().empty(), p + ".dir", "is required");
    c->Require(dt.dir().size() <= 4096, p + ".dir", "is too long");
    c->Require(t.memory_budget_bytes() > 0, p,
               "needs memory_budget_bytes (rows beyond it go to disk)");
    c->Require(t.eviction() == EVICT_LRU || t.eviction() == EVICT_LFU, p,
               "needs eviction EVICT_LRU or EVICT_LFU (it picks the rows "
               "that go to disk)");
    c->Require(dt.memory_bytes() == 0 ||
                   (dt.memory_bytes() >= (uint64_t{256} << 10) &&
                    dt.memory_bytes() <= t.memory_budget_bytes() / 2),
               p + ".memory_bytes",
               "must be 0 (1/8 of memory_budget_bytes) or 256 KiB..half of "
               "memory_budget_bytes");
  }
}

// A file the job needs at run time: named, readable by this process, and,
// for a secret, not readable by every user. Refused rather than warned
// about: anyone on the machine could copy a world-readable key and join
// the job, and a warning in one process's log is easily missed.
void CheckSecurityFile(const std::string& path, absl::string_view field,
                       bool secret, Checker* c) {
  if (path.empty()) return;
  if (access(path.c_str(), R_OK) != 0) {
    c->Require(
        false, field,
        absl::StrCat("'", path, "' cannot be read: ", std::strerror(errno)));
    return;
  }
  struct stat st;
  c->Require(stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode), field,
             absl::StrCat("'", path, "' is not a regular file"));
  c->Require(
      !secret || (st.st_mode & S_IROTH) == 0, field,
      absl::StrCat("'", path,
                   "' is readable by every user; run chmod o-rwx on it"));
}

// Files only; their contents are checked where they are loaded
// (common/grpc_security, common/curve_keys).
void CheckSecurity(const SecurityConfig& sec, Checker* c) {
  const TlsConfig& tls = sec.tls();
  const int tls_set = !tls.ca_cert_file().empty() + !tls.cert_file().empty() +
                      !tls.key_file().empty();
  c->Require(tls_set == 0 || tls_set == 3, "security.tls",
             "ca_cert_file, cert_file and key_file are all required (or none, "
             "for plaintext)");
  CheckSecurityFile(tls.ca_cert_file(), "security.tls.ca_cert_file", false, c);
  CheckSecurityFile(tls.cert_file(), "security.tls.cert_file", false, c);
  CheckSecurityFile(tls.key_file(), "security.tls.key_file", true, c);
  const CurveConfig& curve = sec.curve();
  c->Require(curve.public_key_file().empty() == curve.secret_key_file().empty(),
             "security.curve",
             "public_key_file and secret_key_file are both required (or none, "
             "for plaintext)");
  CheckSecurityFile(curve.public_key_file(), "security.curve.public_key_file",
                    false, c);
  CheckSecurityFile(curve.secret_key_file(), "security.curve.secret_key_file",
                    true, c);
}

}  // namespace

absl::Status ValidateOptimizer(const OptimizerConfig& optimizer,
                               const std::string& path) {
  Checker check;
  CheckOptimizer(optimizer, path, &check);
  return check.Result();
}

absl::Status ValidateSparseTable(const SparseTableConfig& sparse,
                                 const std::string& path) {
  Checker check;
  CheckSparseTable(sparse, path, &check);
  return check.Result();
}

absl::Status ValidateConsistency(const ConsistencyConfig& c) {
  Checker check;
  check.Require(c.mode() == ASYNC || c.mode() == BSP || c.mode() == SSP, "mode",
                "must be ASYNC, BSP or SSP");
  check.Require(c.staleness() <= 1000000, "staleness",
                "must be at most 1000000");
  check.Require(c.mode() == SSP || c.staleness() == 0, "staleness",
                "is only meaningful with mode SSP");
  return check.Result();
}

DataPlaneLimits LimitsWithDefaults(DataPlaneLimits lim) {
  if (lim.max_message_bytes() == 0)
    lim.set_max_message_bytes(kMessageBytesCeiling);
  if (lim.max_keys_per_message() == 0)
    lim.set_max_keys_per_message(uint64_t{1} << 26);
  if (lim.max_connections() == 0) lim.set_max_connections(1024);
  if (lim.receive_queue_messages() == 0) lim.set_receive_queue_messages(1000);
  if (lim.max_held_bytes() == 0) lim.set_max_held_bytes(int64_t{1} << 30);
  return lim;
}

namespace {

// ApplyDefaults, one section of the job config at a time. The order of the
// calls matters where a default reads another section (see ApplyDefaults).

void DefaultCluster(ClusterConfig* cl) {
  if (cl->num_slots() == 0) cl->set_num_slots(4096);
  if (cl->heartbeat_interval_ms() == 0) cl->set_heartbeat_interval_ms(500);
  if (cl->heartbeat_timeout_ms() == 0) cl->set_heartbeat_timeout_ms(5000);
  if (cl->request_timeout_ms() == 0) cl->set_request_timeout_ms(30000);
  if (cl->startup_timeout_ms() == 0) cl->set_startup_timeout_ms(60000);
  if (cl->failover_timeout_ms() == 0) cl->set_failover_timeout_ms(120000);
  if (cl->scheduler_unreachable_timeout_ms() == 0) {
    cl->set_scheduler_unreachable_timeout_ms(
        std::max(60000u, cl->heartbeat_timeout_ms()));
  }
  if (cl->isolation_hold_ms() == 0) {
    // 5 timeouts, and 5 s for the nodes' connections to come back after
    // the link does (scheduler/client.cc reconnects within about 2 s).
    const uint64_t hold = 5ull * cl->heartbeat_timeout_ms() + 5000;
    cl->set_isolation_hold_ms(static_cast<uint32_t>(
        std::min<uint64_t>(hold, cl->scheduler_unreachable_timeout_ms())));
  }
  if (cl->on_worker_loss() == WORKER_LOSS_POLICY_UNSPECIFIED) {
    cl->set_on_worker_loss(REASSIGN);
  }
  if (cl->replication() == 0) cl->set_replication(1);
  if (cl->has_elastic() && cl->elastic().max_servers() == 0) {
    cl->mutable_elastic()->set_max_servers(
        std::min<uint32_t>(1024, 4 * std::max<uint32_t>(1, cl->num_servers())));
  }
  if (cl->has_elastic() && cl->elastic().move_work_share() == 0) {
    cl->mutable_elastic()->set_move_work_share(0.25);
  }
}

void DefaultDataPlane(DataPlaneConfig* dp) {
  if (dp->key_cache_bytes() == 0) dp->set_key_cache_bytes(16 << 20);
  if (dp->push_values() == VALUE_ENCODING_UNSPECIFIED)
    dp->set_push_values(FLOAT32);
  if (dp->pull_values() == VALUE_ENCODING_UNSPECIFIED)
    dp->set_pull_values(FLOAT32);
  *dp->mutable_limits() = LimitsWithDefaults(dp->limits());
  if (dp->gradients().nonfinite() == GradientPolicy::NONFINITE_UNSPECIFIED) {
    dp->mutable_gradients()->set_nonfinite(GradientPolicy::REJECT);
  }
}

void DefaultOptimizer(OptimizerConfig* opt) {
  if (opt->has_adagrad()) {
    AdagradConfig* a = opt->mutable_adagrad();
    if (a->initial_accumulator() == 0) a->set_initial_accumulator(0.1f);
    if (a->epsilon() == 0) a->set_epsilon(1e-8f);
  }
  if (opt->has_momentum()) {
    MomentumConfig* m = opt->mutable_momentum();
    if (m->momentum() == 0) m->set_momentum(0.9f);
  }
  if (opt->has_adam()) {
    AdamConfig* a = opt->mutable_adam();
    if (a->beta1() == 0) a->set_beta1(0.9f);
    if (a->beta2() == 0) a->set_beta2(0.999f);
    if (a->epsilon() == 0) a->set_epsilon(1e-8f);
  }
  if (opt->has_ftrl()) {
    FtrlConfig* f = opt->mutable_ftrl();
    if (f->alpha() == 0) f->set_alpha(0.05f);
    if (f->beta() == 0) f->set_beta(1.0f);
    // l1 and l2 default to 0, their proto default.
  }
  LearningRateSchedule* sched = opt->mutable_schedule();
  if (sched->decay_steps() > 0 && sched->decay_rate() == 0) {
    sched->set_decay_rate(0.1f);
  }
  if (opt->schedule().ByteSizeLong() == 0) opt->clear_schedule();
}

void DefaultTable(TableConfig* t) {
  if (t->has_dense() && t->dense().block_size() == 0) {
    t->mutable_dense()->set_block_size(65536);
  }
  DefaultOptimizer(t->mutable_optimizer());
  if (t->has_sparse() && t->sparse().admit_after_pushes() > 1 &&
      t->sparse().admission_sketch_width() == 0) {
    t->mutable_sparse()->set_admission_sketch_width(262144);
  }
}

void DefaultData(DataConfig* data) {
  if (data->has_synthetic_ctr()) {
    SyntheticCtrConfig* d = data->mutable_synthetic_ctr();
    if (d->num_train() == 0) d->set_num_train(1000000);
    if (d->num_test() == 0) d->set_num_test(100000);
    if (d->seed() == 0) d->set_seed(1);
    if (d->num_categorical() == 0) d->set_num_categorical(26);
    if (d->num_numeric() == 0) d->set_num_numeric(13);
    if (d->max_vocab() == 0) d->set_max_vocab(1000);
    if (d->min_vocab() == 0) d->set_min_vocab(10);
    if (d->zipf_exponent() == 0) d->set_zipf_exponent(1.1f);
    if (d->weight_scale() == 0) d->set_weight_scale(0.3f);
    if (d->bias() == 0) d->set_bias(-2.0f);
    if (d->interaction_rank() > 0 && d->interaction_scale() == 0) {
      d->set_interaction_scale(0.1f);
    }
  }
  if (data->has_fashion_mnist()) {
    FashionMnistConfig* d = data->mutable_fashion_mnist();
    if (d->dir().empty()) d->set_dir("/usr/share/datasets/fashion-mnist");
  }
  if (data->has_files()) {
    FileDataConfig* d = data->mutable_files();
    if (d->on_bad_line() == BAD_LINE_POLICY_UNSPECIFIED) {
      d->set_on_bad_line(SKIP);
    }
  }
}

// The MLP's class count comes from the data, so `data` must have its
// defaults already.
void DefaultModel(const DataConfig& data, ModelConfig* m) {
  if (m->kind() == ModelConfig::KIND_UNSPECIFIED) m->set_kind(ModelConfig::LR);
  if (m->embedding_dim() == 0) {
    if (m->kind() == ModelConfig::FM) m->set_embedding_dim(8);
    if (m->kind() == ModelConfig::DLRM) m->set_embedding_dim(16);
  }
  if (m->kind() == ModelConfig::DLRM) {
    if (m->bottom_mlp_size() == 0) m->add_bottom_mlp(64);
    if (m->top_mlp_size() == 0) m->add_top_mlp(64);
  }
  if (m->kind() == ModelConfig::MLP) {
    if (m->hidden_size() == 0) {
      m->add_hidden(256);
      m->add_hidden(128);
    }
    if (m->num_classes() == 0) {
      m->set_num_classes(ShapeOfData(data).num_classes);
    }
  }
  if (m->init_gain() == 0) m->set_init_gain(1.0f);
  if (m->init_seed() == 0) m->set_init_seed(1);
}

void DefaultTraining(const DataConfig& data, TrainingConfig* tr) {
  if (tr->batch_size() == 0) tr->set_batch_size(1024);
  if (tr->epochs() == 0) tr->set_epochs(1);
  if (tr->log_interval_s() == 0) tr->set_log_interval_s(5);
  if (tr->threads() == 0) tr->set_threads(1);
  DefaultModel(data, tr->mutable_model());
}

}  // namespace

namespace {

// Floats of state per element of each update rule (common/optimizer.h,
// whose test checks that the two agree).
uint32_t StateFloats(const OptimizerConfig& optimizer) {
  switch (optimizer.kind_case()) {
    case OptimizerConfig::kAdagrad:
    case OptimizerConfig::kMomentum:
      return 1;
    case OptimizerConfig::kAdam:
      return 3;
    case OptimizerConfig::kFtrl:
      return 2;
    default:
      return 0;
  }
}

// Adds the companion table that holds an all-reduced dense table's
// optimizer state on the servers (AllReduceStateTable).
void AddAllReduceStateTables(JobConfig* config) {
  absl::flat_hash_set<uint32_t> ids;
  absl::flat_hash_set<std::string> names;
  for (const TableConfig& t : config->tables()) {
    ids.insert(t.id());
    names.insert(t.name());
  }
  std::vector<TableConfig> added;
  uint32_t next_id = 65535;
  for (const TableConfig& t : config->tables()) {
    if (!t.has_dense() || t.dense().sync() != DenseTableConfig::ALLREDUCE) {
      continue;
    }
    const uint32_t floats = StateFloats(t.optimizer());
    const std::string name = AllReduceStateTable(t.name());
    if (floats == 0 || t.dense().size() == 0 || names.contains(name)) continue;
    while (ids.contains(next_id)) --next_id;
    ids.insert(next_id);
    TableConfig state;
    state.set_id(next_id);
    state.set_name(name);
    state.mutable_dense()->set_size(t.dense().size() * floats);
    state.mutable_dense()->set_block_size(t.dense().block_size());
    // Written and read whole by the workers, never pushed to.
    state.mutable_optimizer()->mutable_sgd()->set_learning_rate(1);
    added.push_back(std::move(state));
  }
  for (TableConfig& t : added) *config->add_tables() = std::move(t);
}

}  // namespace

std::string AllReduceStateTable(absl::string_view table) {
  return absl::StrCat(table, ".allreduce_state");
}

uint32_t OptimizerStateFloats(const OptimizerConfig& optimizer) {
  return StateFloats(optimizer);
}

void ApplyDefaults(JobConfig* config) {
  if (config->name().empty()) config->set_name("job");
  DefaultCluster(config->mutable_cluster());
  if (!config->checkpoint().dir().empty() && config->checkpoint().keep() == 0) {
    config->mutable_checkpoint()->set_keep(3);
  }
  DefaultDataPlane(config->mutable_data_plane());
  ConsistencyConfig* cons = config->mutable_consistency();
  if (cons->mode() == CONSISTENCY_MODE_UNSPECIFIED) cons->set_mode(ASYNC);
  if (cons->watchdog_timeout_ms() == 0) cons->set_watchdog_timeout_ms(10000);
  if (cons->watchdog_interval_ms() == 0) cons->set_watchdog_interval_ms(5000);
  for (TableConfig& t : *config->mutable_tables()) DefaultTable(&t);
  DefaultData(config->mutable_data());
  DefaultTraining(config->data(), config->mutable_training());
  AllReduceConfig* ar = config->mutable_allreduce();
  if (ar->timeout_ms() == 0) ar->set_timeout_ms(30000);
  if (ar->form_timeout_ms() == 0) {
    // Long enough for a dead member to be declared dead a few times over.
    ar->set_form_timeout_ms(std::max<uint64_t>(
        120000, 4ull * config->cluster().heartbeat_timeout_ms()));
  }
  // A dense table left at size 0 is sized for the model, so a user need
  // not count an MLP's weights by hand. Last: the layout reads the model,
  // the data and the tables, all with their defaults.
  const TrainingConfig& tr = config->training();
  for (TableConfig& t : *config->mutable_tables()) {
    if (t.has_dense() && t.dense().size() == 0 &&
        t.name() == tr.dense_table()) {
      absl::StatusOr<ModelLayout> layout = LayoutModel(*config);
      if (layout.ok()) t.mutable_dense()->set_size(layout->dense_size);
    }
  }
  // Last: it reads the sizes set above.
  AddAllReduceStateTables(config);
}

namespace {

// ValidateJobConfig, one section of the job config at a time; each adds its
// problems to `c`, named by the field's path.

void CheckCluster(const ClusterConfig& cl, Checker* c) {
  c->Require(cl.num_servers() >= 1 && cl.num_servers() <= 1024,
             "cluster.num_servers", "must be in 1..1024");
  c->Require(cl.num_workers() >= 1 && cl.num_workers() <= 65536,
             "cluster.num_workers", "must be in 1..65536");
  c->Require(cl.num_slots() >= cl.num_servers() && cl.num_slots() <= 1048576,
             "cluster.num_slots", "must be in num_servers..1048576");
  c->Require(cl.heartbeat_timeout_ms() > cl.heartbeat_interval_ms(),
             "cluster.heartbeat_timeout_ms",
             "must exceed cluster.heartbeat_interval_ms");
  c->Require(cl.scheduler_unreachable_timeout_ms() >= cl.heartbeat_timeout_ms(),
             "cluster.scheduler_unreachable_timeout_ms",
             "must be at least cluster.heartbeat_timeout_ms");
  c->Require(cl.isolation_hold_ms() <= cl.scheduler_unreachable_timeout_ms(),
             "cluster.isolation_hold_ms",
             "must be at most cluster.scheduler_unreachable_timeout_ms");
  c->Require(cl.replication() <= 2, "cluster.replication",
             "must be 1 (one copy of every slot) or 2 (a backup copy on "
             "another server)");
  c->Require(cl.replication() < 2 || cl.num_servers() >= 2,
             "cluster.replication",
             "2 needs at least 2 servers (a backup lives on another server)");
  c->Require(WorkerLossPolicy_IsValid(cl.on_worker_loss()),
             "cluster.on_worker_loss", "must be REASSIGN or SKIP_REST");
  if (cl.has_elastic()) {
    c->Require(cl.elastic().max_servers() >= cl.num_servers() &&
                   cl.elastic().max_servers() <= 1024,
               "cluster.elastic.max_servers", "must be in num_servers..1024");
    c->Require(cl.elastic().max_servers() <= cl.num_slots(),
               "cluster.elastic.max_servers",
               "must be at most cluster.num_slots");
    // NaN fails both comparisons.
    c->Require(cl.elastic().move_work_share() > 0 &&
                   cl.elastic().move_work_share() <= 1,
               "cluster.elastic.move_work_share", "must be in (0, 1]");
  }
}

void CheckCheckpoint(const CheckpointConfig& ck, Checker* c) {
  c->Require(ck.dir().size() <= 4096, "checkpoint.dir", "is too long");
  c->Require(
      ck.dir().empty() ? ck.interval_steps() == 0 && !ck.restore() : true,
      "checkpoint", "interval_steps and restore need checkpoint.dir");
  c->Require(ck.keep() <= 1000, "checkpoint.keep", "must be at most 1000");
}

void CheckDataPlane(const DataPlaneConfig& dp, Checker* c) {
  c->Require(dp.key_cache_bytes() == -1 ||
                 (dp.key_cache_bytes() >= 1 &&
                  dp.key_cache_bytes() <= (int64_t{1} << 30)),
             "data_plane.key_cache_bytes", "must be -1 (off) or 1..1073741824");
  c->Require(ValueEncoding_IsValid(dp.push_values()) &&
                 dp.push_values() != VALUE_ENCODING_UNSPECIFIED,
             "data_plane.push_values", "must be FLOAT32, FLOAT16 or BFLOAT16");
  c->Require(ValueEncoding_IsValid(dp.pull_values()) &&
                 dp.pull_values() != VALUE_ENCODING_UNSPECIFIED,
             "data_plane.pull_values", "must be FLOAT32, FLOAT16 or BFLOAT16");
  const DataPlaneLimits& lim = dp.limits();
  c->Require(lim.max_message_bytes() >= (int64_t{1} << 20) &&
                 lim.max_message_bytes() <= kMessageBytesCeiling,
             "data_plane.limits.max_message_bytes",
             "must be 1048576..1073741824");
  c->Require(lim.max_keys_per_message() >= 1 &&
                 lim.max_keys_per_message() <= (uint64_t{1} << 27),
             "data_plane.limits.max_keys_per_message", "must be 1..134217728");
  c->Require(lim.max_connections() >= 1 && lim.max_connections() <= 65536,
             "data_plane.limits.max_connections", "must be 1..65536");
  c->Require(lim.receive_queue_messages() >= 1 &&
                 lim.receive_queue_messages() <= 100000,
             "data_plane.limits.receive_queue_messages", "must be 1..100000");
  c->Require(lim.max_held_bytes() >= (int64_t{1} << 20),
             "data_plane.limits.max_held_bytes", "must be at least 1048576");
  const GradientPolicy& grads = dp.gradients();
  c->Require(GradientPolicy::NonFinite_IsValid(grads.nonfinite()) &&
                 grads.nonfinite() != GradientPolicy::NONFINITE_UNSPECIFIED,
             "data_plane.gradients.nonfinite", "must be REJECT or CLIP");
  c->Require(std::isfinite(grads.clip_value()) && grads.clip_value() >= 0,
             "data_plane.gradients.clip_value", "must be finite and >= 0");
  c->Require(
      grads.nonfinite() != GradientPolicy::CLIP || grads.clip_value() > 0,
      "data_plane.gradients.clip_value",
      "must be > 0 with nonfinite: CLIP (it is what +/-Inf becomes)");
}

// A table's kind, optimizer and initializer; `path` is "tables[i]".
void CheckTableContents(const TableConfig& t, const std::string& path,
                        Checker* c) {
  switch (t.kind_case()) {
    case TableConfig::kSparse:
      CheckSparseTable(t.sparse(), path + ".sparse", c);
      break;
    case TableConfig::kDense:
      c->Require(t.dense().size() >= 1 && t.dense().size() <= (1ULL << 40),
                 path + ".dense.size", "must be in 1..2^40");
      c->Require(
          t.dense().block_size() >= 1 && t.dense().block_size() <= (1u << 26),
          path + ".dense.block_size", "must be in 1..2^26");
      // Every worker holds an all-reduced table and its optimizer state
      // in memory, and gloo counts elements in int.
      c->Require(t.dense().sync() != DenseTableConfig::ALLREDUCE ||
                     t.dense().size() <= (1ULL << 30),
                 path + ".dense.size", "must be at most 2^30 with ALLREDUCE");
      c->Require(DenseTableConfig::Sync_IsValid(t.dense().sync()),
                 path + ".dense.sync", "unknown value");
      break;
    case TableConfig::KIND_NOT_SET:
      c->Require(false, path, "set one of sparse, dense");
      break;
  }
  CheckOptimizer(t.optimizer(), path + ".optimizer", c);
  const InitializerConfig& init = t.init();
  c->Require(std::isfinite(init.value()), path + ".init.value",
             "must be finite");
  c->Require(std::isfinite(init.scale()) && init.scale() >= 0,
             path + ".init.scale", "must be finite and >= 0");
  // FTRL derives the weight from its accumulators, which start at zero:
  // other initial values would be served until the first push and then
  // silently replaced.
  const bool zero_init =
      init.kind() == InitializerConfig::ZEROS ||
      (init.kind() == InitializerConfig::CONSTANT && init.value() == 0);
  c->Require(!t.optimizer().has_ftrl() || zero_init, path + ".init",
             "FTRL starts from zero weights; use init { kind: ZEROS }");
}

// Every table, and that no two share an id or a name.
void CheckTables(const JobConfig& config, Checker* c) {
  absl::flat_hash_set<uint32_t> ids;
  absl::flat_hash_set<std::string> names;
  for (int i = 0; i < config.tables_size(); ++i) {
    const TableConfig& t = config.tables(i);
    const std::string path = absl::StrCat("tables[", i, "]");
    c->Require(t.id() < 65536, path + ".id", "must be < 65536");
    c->Require(ids.insert(t.id()).second, path + ".id",
               absl::StrCat("duplicate table id ", t.id()));
    c->Require(!t.name().empty(), path + ".name", "is required");
    c->Require(names.insert(t.name()).second, path + ".name",
               absl::StrCat("duplicate table name '", t.name(), "'"));
    CheckTableContents(t, path, c);
  }
}

void CheckData(const DataConfig& data, Checker* c) {
  if (data.has_synthetic_ctr()) {
    const SyntheticCtrConfig& d = data.synthetic_ctr();
    const std::string p = "data.synthetic_ctr";
    c->Require(d.num_categorical() <= 1000, p + ".num_categorical",
               "must be at most 1000");
    c->Require(d.num_numeric() <= 1000, p + ".num_numeric",
               "must be at most 1000");
    c->Require(d.min_vocab() >= 1 && d.min_vocab() <= d.max_vocab(),
               p + ".min_vocab", "must be in 1..max_vocab");
    c->Require(d.max_vocab() <= 10000000, p + ".max_vocab",
               "must be at most 10000000");
    c->Require(Positive(d.zipf_exponent()), p + ".zipf_exponent",
               "must be > 0");
    c->Require(Positive(d.weight_scale()), p + ".weight_scale", "must be > 0");
    c->Require(std::isfinite(d.bias()), p + ".bias", "must be finite");
    c->Require(d.interaction_rank() <= 64, p + ".interaction_rank",
               "must be at most 64");
    c->Require(d.interaction_rank() == 0 || Positive(d.interaction_scale()),
               p + ".interaction_scale", "must be > 0");
  }
  if (data.has_files()) {
    const FileDataConfig& d = data.files();
    c->Require(d.format() != FileDataConfig::FORMAT_UNSPECIFIED,
               "data.files.format", "set CRITEO or LIBSVM");
    c->Require(d.train_files_size() > 0, "data.files.train_files",
               "name at least one file or glob");
    c->Require(d.hash_buckets() != 1, "data.files.hash_buckets",
               "must be 0 (no bucketing) or >= 2");
  }
  if (data.has_fashion_mnist()) {
    c->Require(data.fashion_mnist().num_train() <= 60000,
               "data.fashion_mnist.num_train", "must be at most 60000");
  }
}

// That the model's layout fits the tables training names. Only for jobs
// that train: a config may describe tables alone, e.g. for the KV tools.
void CheckModelTables(const JobConfig& config, Checker* c) {
  const TrainingConfig& tr = config.training();
  if (tr.dense_table().empty() && tr.sparse_table().empty()) return;
  absl::StatusOr<ModelLayout> layout = LayoutModel(config);
  c->Require(layout.ok(), "training.model",
             layout.ok() ? "" : std::string(layout.status().message()));
  if (!layout.ok()) return;
  auto t = FindTable(config, tr.dense_table());
  c->Require(
      t.ok() && (*t)->has_dense() && (*t)->dense().size() == layout->dense_size,
      "training.dense_table",
      absl::StrCat("'", tr.dense_table(), "' must name a dense table of size ",
                   layout->dense_size, " for this ",
                   ModelConfig::Kind_Name(layout->kind),
                   " model (or size 0, which sizes it)"));
  if (layout->sparse_dim > 0) {
    auto sp = FindTable(config, tr.sparse_table());
    c->Require(sp.ok() && (*sp)->has_sparse() &&
                   (*sp)->sparse().dim() == layout->sparse_dim,
               "training.sparse_table",
               absl::StrCat("'", tr.sparse_table(),
                            "' must name a sparse table with dim ",
                            layout->sparse_dim, " for this ",
                            ModelConfig::Kind_Name(layout->kind), " model"));
  }
}

void CheckTraining(const JobConfig& config, Checker* c) {
  const TrainingConfig& tr = config.training();
  c->Require(tr.batch_size() <= 1000000, "training.batch_size",
             "must be at most 1000000");
  c->Require(tr.epochs() <= 10000, "training.epochs", "must be at most 10000");
  c->Require(tr.threads() <= 256, "training.threads", "must be at most 256");
  c->Require(!tr.prefetch() || config.consistency().mode() == ASYNC,
             "training.prefetch",
             "needs consistency mode ASYNC (under BSP and SSP a step must "
             "read the previous step's updates)");
  c->Require(
      std::isfinite(tr.model().init_gain()) && tr.model().init_gain() >= 0,
      "training.model.init_gain", "must be finite and >= 0");
  CheckModelTables(config, c);
}

void CheckAllReduce(const JobConfig& config, Checker* c) {
  const bool used = std::any_of(
      config.tables().begin(), config.tables().end(), [](const TableConfig& t) {
        return t.has_dense() && t.dense().sync() == DenseTableConfig::ALLREDUCE;
      });
  if (!used) return;
  const AllReduceConfig& ar = config.allreduce();
  c->Require(ar.timeout_ms() >= 100 && ar.timeout_ms() <= 3600000,
             "allreduce.timeout_ms", "must be in 100..3600000");
  // A ring re-forms only once a dead member is declared dead.
  c->Require(ar.form_timeout_ms() > config.cluster().heartbeat_timeout_ms() &&
                 ar.form_timeout_ms() <= 3600000,
             "allreduce.form_timeout_ms",
             "must exceed cluster.heartbeat_timeout_ms and be at most 3600000");
}

void CheckLaunch(const LaunchConfig& launch, Checker* c) {
  for (const auto* command :
       {&launch.worker_command(), &launch.evaluator_command()}) {
    const std::string field = command == &launch.worker_command()
                                  ? "launch.worker_command"
                                  : "launch.evaluator_command";
    c->Require(command->empty() || !(*command)[0].empty(), field,
               "its first element (the program) must not be empty");
  }
}

}  // namespace

absl::Status ValidateJobConfig(const JobConfig& config) {
  Checker c;
  CheckCluster(config.cluster(), &c);
  CheckCheckpoint(config.checkpoint(), &c);
  CheckDataPlane(config.data_plane(), &c);
  const absl::Status cons = ValidateConsistency(config.consistency());
  c.Require(cons.ok(), "consistency", cons.message());
  CheckSecurity(config.security(), &c);
  CheckTables(config, &c);
  CheckData(config.data(), &c);
  CheckTraining(config, &c);
  CheckLaunch(config.launch(), &c);
  CheckAllReduce(config, &c);
  return c.Result();
}

absl::StatusOr<JobConfig> ParseJobConfig(absl::string_view text,
                                         absl::string_view source) {
  JobConfig config;
  CollectingErrors errors(source);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &config)) {
    return absl::InvalidArgumentError(errors.Joined());
  }
  ApplyDefaults(&config);
  absl::Status status = ValidateJobConfig(config);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", status.message()));
  }
  return config;
}

absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read config file '", path, "'"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("error reading '", path, "'"));
  }
  return ParseJobConfig(buffer.str(), path);
}

uint64_t ConfigFingerprint(const JobConfig& config) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    config.SerializeToCodedStream(&out);
  }
  uint64_t h = 0x6a09e667f3bcc908ULL;
  for (unsigned char ch : bytes) h = Mix64(h ^ ch);
  return h;
}

absl::StatusOr<const TableConfig*> FindTable(const JobConfig& config,
                                             absl::string_view name) {
  for (const TableConfig& t : config.tables()) {
    if (t.name() == name) return &t;
  }
  return absl::NotFoundError(absl::StrCat("no table named '", name, "'"));
}

}  // namespace ps
