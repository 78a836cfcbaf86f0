// kv_tool: push to or pull from a running job's tables from the command
// line, as a worker would. For operators (inspecting parameters) and tests
// (driving exact update sequences through real processes).
//
//   kv_tool --config=JOB --scheduler=HOST:PORT --table=NAME --op=pull
//   --keys=1,2,5-9 kv_tool ... --op=push --keys=1-100 --values=0.25 --repeat=10
//   kv_tool ... --op=pull_dense --begin=0 --count=14
//   kv_tool --config=JOB --scheduler=HOST:PORT --op=stats
//   kv_tool ... --table=NAME --op=scan [--limit=10]
//
// --op=stats prints one JSON line per server and table: rows, bytes, budget,
// keys pushed and pulled, admissions, filtered pushes, evictions, refusals.
// --op=scan reads every row of a sparse table from every server (as a model
// export would) and prints {"table":...,"table_id":...,"rows":N}, then the
// --limit rows with the smallest keys as {"key":K,"values":[...]} lines.
//
// Reads (pull, pull_dense, scan, stats) join as an observer: no worker
// rank, no clock, answered at once with what the servers hold, beside a
// running job of any consistency mode. Writes, --barrier and --finish join
// as a worker (taking a free worker rank) and leave when done; with
// --finish the tool leaves as a finished worker, which lets the job end once
// no other worker is alive. Pulled values are printed on one
// line, separated by spaces, with enough digits to round-trip a float.
//
// Exit codes: 0 done, 1 error, 2 bad flags or config, 3 dropped by the
// scheduler while joined as a worker (nothing more it sends counts), 4 the
// scheduler unreachable for cluster.scheduler_unreachable_timeout_ms.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/curve_keys.h"
#include "common/logging.h"
#include "common/node_main.h"
#include "common/status.h"
#include "worker/kv_client.h"
#include "worker/session.h"

ABSL_FLAG(std::string, config, "", "Job config file (textproto). Required.");
ABSL_FLAG(std::string, scheduler, "", "Scheduler host:port. Required.");
ABSL_FLAG(std::string, table, "",
          "Table name. Required except for --op=stats.");
ABSL_FLAG(std::string, op, "pull",
          "push | pull | push_pull | push_dense | pull_dense | stats | scan");
ABSL_FLAG(std::string, keys, "",
          "Sparse keys: comma-separated ids or ranges a-b (inclusive).");
ABSL_FLAG(std::string, values, "",
          "Gradients: comma-separated floats, one per pushed element, or a "
          "single float used for every element.");
ABSL_FLAG(uint64_t, begin, 0, "Dense ops: first element.");
ABSL_FLAG(uint64_t, count, 0, "pull_dense: number of elements.");
ABSL_FLAG(int, repeat, 1, "Send the push this many times, one after another.");
ABSL_FLAG(uint64_t, limit, 0,
          "scan: print this many rows (smallest keys first).");
ABSL_FLAG(bool, finish, false, "Leave as a finished worker.");
ABSL_FLAG(std::string, barrier, "",
          "Before the op, wait at this scheduler barrier for every worker of "
          "the job (so concurrent tools really overlap).");
ABSL_FLAG(std::string, log_level, "warn", "trace|debug|info|warn|error");

namespace {

absl::StatusOr<std::vector<uint64_t>> ParseKeys(const std::string& text) {
  std::vector<uint64_t> keys;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> range = absl::StrSplit(part, '-');
    uint64_t a = 0, b = 0;
    if (range.size() == 1 && absl::SimpleAtoi(range[0], &a)) {
      keys.push_back(a);
    } else if (range.size() == 2 && absl::SimpleAtoi(range[0], &a) &&
               absl::SimpleAtoi(range[1], &b) && a <= b && b - a < 100000000) {
      for (uint64_t k = a; k <= b; ++k) keys.push_back(k);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("bad key or range '", part, "'"));
    }
  }
  return keys;
}

absl::StatusOr<std::vector<float>> ParseValues(const std::string& text,
                                               size_t n) {
  std::vector<float> values;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    float v;
    if (!absl::SimpleAtof(part, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("bad value '", part, "'"));
    }
    values.push_back(v);
  }
  if (values.size() == 1) values.assign(n, values[0]);
  if (values.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("--values has ", values.size(),
                     " numbers; the push needs ", n, " (or 1)"));
  }
  return values;
}

void Print(const std::vector<float>& values) {
  for (size_t i = 0; i < values.size(); ++i) {
    std::printf(i ? " %.9g" : "%.9g", values[i]);
  }
  std::printf("\n");
}

// Table names come from the config file: escape them for JSON.
std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out;
}

// The disk tier's fields (with a leading comma), or "" for a table without
// one.
std::string TierJson(const ps::TableStats& t) {
  if (t.tier_memory_bytes() == 0) return "";
  return absl::StrCat(
      ",\"cold_rows\":", t.cold_rows(), ",\"disk_bytes\":", t.disk_bytes(),
      ",\"demotions\":", t.demotions(), ",\"promotions\":", t.promotions(),
      ",\"cold_reads\":", t.cold_reads(), ",\"cold_misses\":", t.cold_misses(),
      ",\"bloom_useful\":", t.bloom_useful(),
      ",\"disk_reads\":", t.disk_reads(),
      ",\"cold_read_micros\":", t.cold_read_micros(),
      ",\"disk_bytes_written\":", t.disk_bytes_written(),
      ",\"cold_rows_dropped\":", t.cold_rows_dropped(),
      ",\"tier_errors\":", t.tier_errors(),
      ",\"tier_memory_bytes\":", t.tier_memory_bytes(),
      ",\"rows_read_ahead\":", t.rows_read_ahead(),
      ",\"staged_rows\":", t.staged_rows());
}

// One JSON object per (server, table).
absl::Status PrintStats(ps::KVClient& client) {
  std::vector<ps::ServerTableStats> stats;
  PS_RETURN_IF_ERROR(client.TableStatistics(&stats).Wait());
  for (const ps::ServerTableStats& s : stats) {
    const ps::TableStats& t = s.stats;
    std::printf(
        "{\"server\":%u,\"table\":\"%s\",\"table_id\":%u,\"sparse\":%s,"
        "\"rows\":%llu,\"bytes\":%llu,\"memory_budget_bytes\":%llu,"
        "\"keys_pushed\":%llu,\"keys_pulled\":%llu,\"admissions\":%llu,"
        "\"pushes_filtered\":%llu,\"evictions_ttl\":%llu,"
        "\"evictions_budget\":%llu,\"pushes_refused\":%llu,\"keys_dropped\":%"
        "llu%s}\n",
        s.server_rank, JsonEscape(t.name()).c_str(), t.table_id(),
        t.sparse() ? "true" : "false",
        static_cast<unsigned long long>(t.rows()),
        static_cast<unsigned long long>(t.bytes()),
        static_cast<unsigned long long>(t.memory_budget_bytes()),
        static_cast<unsigned long long>(t.keys_pushed()),
        static_cast<unsigned long long>(t.keys_pulled()),
        static_cast<unsigned long long>(t.admissions()),
        static_cast<unsigned long long>(t.pushes_filtered()),
        static_cast<unsigned long long>(t.evictions_ttl()),
        static_cast<unsigned long long>(t.evictions_budget()),
        static_cast<unsigned long long>(t.pushes_refused()),
        static_cast<unsigned long long>(t.keys_dropped()), TierJson(t).c_str());
  }
  return absl::OkStatus();
}

// The row count, then the first --limit rows by key.
absl::Status PrintScan(const ps::TableConfig& table, ps::KVClient& client) {
  if (!table.has_sparse()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", table.name(), "' is dense; read it with pull_dense"));
  }
  std::vector<uint64_t> keys;
  std::vector<float> values;
  PS_RETURN_IF_ERROR(client.ScanAll(table.id(), &keys, &values));
  std::printf("{\"table\":\"%s\",\"table_id\":%u,\"rows\":%zu}\n",
              JsonEscape(table.name()).c_str(), table.id(), keys.size());
  const size_t shown =
      std::min<uint64_t>(absl::GetFlag(FLAGS_limit), keys.size());
  if (shown == 0) return absl::OkStatus();
  std::vector<size_t> order(keys.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::partial_sort(order.begin(), order.begin() + shown, order.end(),
                    [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  const size_t dim = table.sparse().dim();
  for (size_t i = 0; i < shown; ++i) {
    const size_t r = order[i];
    std::string line = absl::StrCat("{\"key\":", keys[r], ",\"values\":[");
    for (size_t e = 0; e < dim; ++e) {
      // JSON has no NaN or infinity; parameters are finite in practice.
      absl::StrAppend(&line, e ? "," : "",
                      absl::StrFormat("%.9g", values[r * dim + e]));
    }
    std::printf("%s]}\n", line.c_str());
  }
  return absl::OkStatus();
}

absl::Status Run(const ps::JobConfig& config, ps::KVClient& client) {
  const std::string op = absl::GetFlag(FLAGS_op);
  if (op == "stats") return PrintStats(client);
  PS_ASSIGN_OR_RETURN(const ps::TableConfig* table,
                      ps::FindTable(config, absl::GetFlag(FLAGS_table)));
  if (op == "scan") return PrintScan(*table, client);
  const int repeat = absl::GetFlag(FLAGS_repeat);
  if (op == "push" || op == "pull" || op == "push_pull") {
    if (!table->has_sparse()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table->name(), "' is dense; use push_dense / pull_dense"));
    }
    PS_ASSIGN_OR_RETURN(std::vector<uint64_t> keys,
                        ParseKeys(absl::GetFlag(FLAGS_keys)));
    const size_t n = keys.size() * table->sparse().dim();
    std::vector<float> out(n);
    if (op == "pull") {
      PS_RETURN_IF_ERROR(client.Pull(table->id(), keys, out.data()).Wait());
      Print(out);
      return absl::OkStatus();
    }
    PS_ASSIGN_OR_RETURN(std::vector<float> grads,
                        ParseValues(absl::GetFlag(FLAGS_values), n));
    for (int i = 0; i < repeat; ++i) {
      if (op == "push") {
        PS_RETURN_IF_ERROR(client.Push(table->id(), keys, grads).Wait());
      } else {
        PS_RETURN_IF_ERROR(
            client.PushPull(table->id(), keys, grads, out.data()).Wait());
      }
    }
    if (op == "push_pull") Print(out);
    return absl::OkStatus();
  }
  if (op == "push_dense" || op == "pull_dense") {
    if (!table->has_dense()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table->name(), "' is sparse; use push / pull"));
    }
    const uint64_t begin = absl::GetFlag(FLAGS_begin);
    if (op == "pull_dense") {
      std::vector<float> out(absl::GetFlag(FLAGS_count));
      PS_RETURN_IF_ERROR(
          client.PullDense(table->id(), begin, out.size(), out.data()).Wait());
      Print(out);
      return absl::OkStatus();
    }
    std::vector<float> grads;
    for (absl::string_view part :
         absl::StrSplit(absl::GetFlag(FLAGS_values), ',', absl::SkipEmpty())) {
      float v;
      if (!absl::SimpleAtof(part, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad value '", part, "'"));
      }
      grads.push_back(v);
    }
    for (int i = 0; i < repeat; ++i) {
      PS_RETURN_IF_ERROR(client.PushDense(table->id(), begin, grads).Wait());
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown --op '", op, "'"));
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto log = ps::GetLogger("kv_tool");
  std::optional<ps::JobConfig> config = ps::StartNode(
      *log, absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_config),
      {{"scheduler", absl::GetFlag(FLAGS_scheduler)}});
  if (!config) return 2;
  absl::StatusOr<std::optional<ps::CurveKeys>> curve =
      ps::LoadCurveKeys(config->security().curve());
  if (!curve.ok()) {
    log->error("{}", curve.status().message());
    return 2;
  }
  // Reads join as an observer: no worker rank to wait for, no clock, so
  // they work beside a running job (also a BSP one, which they never hold
  // back) and are answered with what the servers hold. Writes, barriers
  // and --finish join as a worker that trains no shard (leaving early
  // hands nothing over).
  const std::string op = absl::GetFlag(FLAGS_op);
  const bool read_only =
      (op == "pull" || op == "pull_dense" || op == "scan" || op == "stats") &&
      absl::GetFlag(FLAGS_barrier).empty() && !absl::GetFlag(FLAGS_finish);
  ps::WorkerSession::Options options;
  options.config = *config;
  options.scheduler = absl::GetFlag(FLAGS_scheduler);
  options.trains_shards = false;
  options.observer = read_only;
  options.curve = *std::move(curve);
  auto session = ps::WorkerSession::Start(std::move(options));
  if (!session.ok()) {
    log->error("{}", session.status().message());
    if (ps::IsDropped(session.status())) return 3;
    if (ps::IsSchedulerGone(session.status())) return 4;
    return 1;
  }
  absl::Status status;
  if (const std::string barrier = absl::GetFlag(FLAGS_barrier);
      !barrier.empty()) {
    status = (*session)->Barrier(barrier, absl::Seconds(60));
  }
  if (status.ok()) status = Run(*config, *(*session)->kv());
  absl::Status left = (*session)->Leave(absl::GetFlag(FLAGS_finish));
  // Dropped or the scheduler gone: the session's status says so whatever
  // request noticed it first.
  if (absl::Status ended = (*session)->ended(); !ended.ok()) {
    log->error("{}", ended.message());
    return ps::IsDropped(ended) ? 3 : 4;
  }
  if (!status.ok()) {
    log->error("{}", status.message());
    return 1;
  }
  if (!left.ok()) log->warn("{}", left.message());
  return 0;
}
