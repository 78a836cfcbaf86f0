#include "server/server_metrics.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/server_impl.h"

namespace ps {
namespace {

const char* const kOpNames[ServerInstruments::kMaxOp + 1] = {
    "invalid", "push", "pull",   "push_pull", "advance_clock",
    "stats",   "scan", "assign", "prefetch"};
const char* const kOutcomeNames[ServerInstruments::kNumOutcomes] = {
    "ok", "error", "deferred", "held"};
const char* const kReasonNames[ServerInstruments::kNumReasons] = {
    "misrouted",      "key_list_unknown", "non_finite",
    "unavailable",    "unknown_table",    "resource_exhausted",
    "stale_sequence", "invalid_request",  "other"};

}  // namespace

ServerInstruments::ServerInstruments(metrics::Registry* registry) {
  metrics::CounterFamily* requests =
      registry->AddCounterFamily("ps_server_requests_total",
                                 "Data-plane requests processed, by op and "
                                 "outcome (deferred and held ones are "
                                 "counted again when processed once more).",
                                 {"op", "outcome"});
  metrics::HistogramFamily* duration = registry->AddHistogramFamily(
      "ps_server_request_duration_seconds",
      "Time to process a request on the serving thread, by op.", {"op"},
      metrics::LatencyBuckets());
  for (int op = 0; op <= kMaxOp; ++op) {
    for (int o = 0; o < kNumOutcomes; ++o) {
      requests_[op][o] = requests->With({kOpNames[op], kOutcomeNames[o]});
    }
    duration_[op] = duration->With({kOpNames[op]});
  }
  metrics::CounterFamily* errors = registry->AddCounterFamily(
      "ps_server_request_errors_total",
      "Requests rejected with an error, by reason.", {"reason"});
  for (int r = 0; r < kNumReasons; ++r)
    errors_[r] = errors->With({kReasonNames[r]});
  bytes_in_ =
      registry->AddCounter("ps_server_received_bytes_total",
                           "Bytes of data-plane request frames received.");
  bytes_out_ = registry->AddCounter("ps_server_sent_bytes_total",
                                    "Bytes of answer payload frames (keys and "
                                    "values) sent; headers not counted.");
  hold_ = registry->AddHistogram("ps_server_pull_hold_seconds",
                                 "How long pulls deferred by the consistency "
                                 "rule were held before their answer.",
                                 metrics::LatencyBuckets());
}

void ServerInstruments::Record(int op, Outcome outcome, uint64_t bytes_in,
                               uint64_t bytes_out, TimePoint start) {
  const int i = OpIndex(op);
  requests_[i][static_cast<int>(outcome)]->Add();
  bytes_in_->Add(bytes_in);
  if (bytes_out > 0) bytes_out_->Add(bytes_out);
  duration_[i]->Observe(std::chrono::duration<double>(Now() - start).count());
}

void ServerInstruments::RecordError(Reason reason) {
  errors_[static_cast<int>(reason)]->Add();
}

ServerInstruments::Reason ServerInstruments::Classify(
    const absl::Status& status, const ResponseHeader& rh) {
  if (rh.wrong_owner()) return Reason::kMisrouted;
  if (rh.key_list_unknown()) return Reason::kKeyListUnknown;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return absl::StrContains(status.message(), "not finite")
                 ? Reason::kNonFinite
                 : Reason::kInvalidRequest;
    case absl::StatusCode::kUnavailable:
      return Reason::kUnavailable;
    case absl::StatusCode::kNotFound:
      return Reason::kUnknownTable;
    case absl::StatusCode::kResourceExhausted:
      return Reason::kResourceExhausted;
    case absl::StatusCode::kAborted:
      return Reason::kStaleSequence;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kDataLoss:
      return Reason::kInvalidRequest;
    default:
      return Reason::kOther;
  }
}

// The scrape-time metrics read the server through this, so a registry
// scraped after the server is gone reads nothing instead of freed memory.
struct KVServer::Impl::MetricsSource {
  absl::Mutex mu;
  const KVServer::Impl* server ABSL_GUARDED_BY(mu) = nullptr;
};

namespace {

// Registers the per-table metrics. `read` returns the per-table statistics
// the serving thread published last (none once the server is gone); it is
// called at scrape time, from any thread.
void RegisterTableMetrics(metrics::Registry* r,
                          std::function<std::vector<TableStats>()> read) {
  // Per-table values, from the statistics the serving thread publishes
  // every kStatsPeriod.
  auto per_table = [r, read](const char* name, const char* help,
                             metrics::Type type,
                             uint64_t (TableStats::*get)() const) {
    r->AddCallbackFamily(name, help, type, {"table"}, [read, get] {
      std::vector<metrics::Sample> out;
      for (const TableStats& t : read()) {
        out.push_back({{t.name()}, double((t.*get)())});
      }
      return out;
    });
  };
  per_table("ps_server_table_rows",
            "Rows (sparse) or elements (dense) the table holds here, backup "
            "copies included.",
            metrics::Type::kGauge, &TableStats::rows);
  per_table("ps_server_table_bytes",
            "Memory the table's rows and optimizer state use here.",
            metrics::Type::kGauge, &TableStats::bytes);
  per_table("ps_server_table_memory_budget_bytes",
            "The table's memory budget on this server (0: none).",
            metrics::Type::kGauge, &TableStats::memory_budget_bytes);
  per_table("ps_server_table_keys_pushed_total",
            "Keys or elements pushed to the table.", metrics::Type::kCounter,
            &TableStats::keys_pushed);
  per_table("ps_server_table_keys_pulled_total",
            "Keys or elements pulled from the table.", metrics::Type::kCounter,
            &TableStats::keys_pulled);
  per_table("ps_server_table_pushes_refused_total",
            "Pushes refused because the table was at its memory budget.",
            metrics::Type::kCounter, &TableStats::pushes_refused);
  // A sparse table's disk tier (0 for tables without one).
  per_table("ps_server_table_cold_rows",
            "Rows of the table on its disk tier here (rows: those in RAM).",
            metrics::Type::kGauge, &TableStats::cold_rows);
  per_table("ps_server_table_disk_bytes",
            "Bytes of the table's disk tier files here.", metrics::Type::kGauge,
            &TableStats::disk_bytes);
  per_table("ps_server_table_tier_memory_bytes",
            "RAM the table's disk tier holds here (part of bytes).",
            metrics::Type::kGauge, &TableStats::tier_memory_bytes);
  per_table("ps_server_table_demotions_total",
            "Rows written to the disk tier to make room in RAM.",
            metrics::Type::kCounter, &TableStats::demotions);
  per_table("ps_server_table_promotions_total",
            "Rows taken back from the disk tier into RAM by a push.",
            metrics::Type::kCounter, &TableStats::promotions);
  per_table("ps_server_table_cold_reads_total",
            "Lookups on the disk tier that found a row.",
            metrics::Type::kCounter, &TableStats::cold_reads);
  per_table("ps_server_table_cold_misses_total",
            "Lookups on the disk tier that found no row.",
            metrics::Type::kCounter, &TableStats::cold_misses);
  per_table("ps_server_table_bloom_useful_total",
            "Disk tier lookups a bloom filter answered without a disk read.",
            metrics::Type::kCounter, &TableStats::bloom_useful);
  per_table("ps_server_table_disk_reads_total",
            "Blocks read from the disk tier's files.", metrics::Type::kCounter,
            &TableStats::disk_reads);
  per_table("ps_server_table_disk_written_bytes_total",
            "Bytes written to the disk tier's files (flushes, compactions).",
            metrics::Type::kCounter, &TableStats::disk_bytes_written);
  per_table("ps_server_table_cold_rows_dropped_total",
            "Rows dropped because the disk tier was at max_disk_bytes.",
            metrics::Type::kCounter, &TableStats::cold_rows_dropped);
  per_table("ps_server_table_tier_errors_total",
            "Failed disk tier reads and writes (each logged).",
            metrics::Type::kCounter, &TableStats::tier_errors);
  r->AddCallbackFamily(
      "ps_server_table_cold_read_seconds_total",
      "Time spent in disk tier lookups that found rows.",
      metrics::Type::kCounter, {"table"}, [read] {
        std::vector<metrics::Sample> out;
        for (const TableStats& t : read()) {
          out.push_back({{t.name()}, double(t.cold_read_micros()) / 1e6});
        }
        return out;
      });
  r->AddCallbackFamily(
      "ps_server_table_evictions_total",
      "Rows evicted, by cause (ttl or budget).", metrics::Type::kCounter,
      {"table", "cause"}, [read] {
        std::vector<metrics::Sample> out;
        for (const TableStats& t : read()) {
          out.push_back({{t.name(), "ttl"}, double(t.evictions_ttl())});
          out.push_back({{t.name(), "budget"}, double(t.evictions_budget())});
        }
        return out;
      });
}

// Slot moves (cluster.elastic), from this server's Stats as `read` gives
// them.
void RegisterMoveMetrics(metrics::Registry* r,
                         std::function<KVServer::Stats()> read) {
  using Stats = KVServer::Stats;
  auto by_direction = [r, read](const char* name, const char* help,
                                uint64_t Stats::*in, uint64_t Stats::*out) {
    r->AddCallbackFamily(
        name, help, metrics::Type::kCounter, {"direction"}, [read, in, out] {
          const Stats s = read();
          return std::vector<metrics::Sample>{{{"in"}, double(s.*in)},
                                              {{"out"}, double(s.*out)}};
        });
  };
  by_direction("ps_server_move_slots_total",
               "Slots moved to this server (in) and from it (out) by live "
               "slot moves.",
               &Stats::move_slots_in, &Stats::move_slots_out);
  by_direction("ps_server_move_rows_total",
               "Rows and dense blocks of moved slots: held when the slots "
               "came in, copied to the target when they went out.",
               &Stats::move_rows_in, &Stats::move_rows_out);
  auto counter = [r, read](const char* name, const char* help,
                           uint64_t Stats::*field) {
    r->AddCallback(name, help, metrics::Type::kCounter,
                   [read, field] { return double(read().*field); });
  };
  counter("ps_server_move_fences_total",
          "Slot moves this server fenced as their source and the target "
          "confirmed.",
          &Stats::move_fences);
  counter("ps_server_move_aborts_total",
          "Slot moves this server abandoned as their source (e.g. the "
          "digests of the copy differed).",
          &Stats::move_aborts);
  counter("ps_server_move_fenced_refusals_total",
          "Pushes refused (UNAVAILABLE, retried) because a move fenced their "
          "slot.",
          &Stats::move_fenced_refusals);
  r->AddCallback(
      "ps_server_move_fence_seconds",
      "The longest fence pause of a slot move this server was the source "
      "of: from applying the fence view to the target's confirmation.",
      metrics::Type::kGauge,
      [read] { return read().move_fence_max_micros / 1e6; });
  counter("ps_server_tier_waits_total",
          "Requests put aside while their cold rows were read from a disk "
          "tier, or behind such a request of their sender.",
          &Stats::tier_waits);
  r->AddCallback(
      "ps_server_tier_wait_seconds_total",
      "Time requests waited for disk tier reads, in all; divided by "
      "ps_server_tier_waits_total, the I/O wait per waiting request.",
      metrics::Type::kCounter,
      [read] { return read().tier_wait_micros / 1e6; });
}

// The serving thread's own cost, from this server's Stats as `read` gives
// them.
void RegisterServingMetrics(metrics::Registry* r,
                            std::function<KVServer::Stats()> read) {
  r->AddCallback(
      "ps_server_serving_cpu_seconds_total",
      "CPU time the serving thread used (user and system): near 1 per second "
      "of wall time, the server is limited by its one serving thread.",
      metrics::Type::kCounter,
      [read] { return read().serving_cpu_micros / 1e6; });
}

}  // namespace

void KVServer::Impl::RegisterMetrics(metrics::Registry* r) {
  instruments_ = std::make_unique<ServerInstruments>(r);
  metrics_source_ = std::make_shared<MetricsSource>();
  {
    absl::MutexLock lock(&metrics_source_->mu);
    metrics_source_->server = this;
  }
  std::shared_ptr<MetricsSource> source = metrics_source_;
  // A counter of Stats, read at scrape time.
  auto stat = [r, source](const char* name, const char* help,
                          uint64_t Stats::*field) {
    r->AddCallback(name, help, metrics::Type::kCounter, [source, field] {
      absl::MutexLock lock(&source->mu);
      return source->server == nullptr ? 0.0
                                       : double(source->server->stats().*field);
    });
  };
  stat("ps_server_keys_pushed_total",
       "Keys (sparse) and elements (dense) pushed.", &Stats::keys_pushed);
  stat("ps_server_keys_pulled_total",
       "Keys (sparse) and elements (dense) pulled.", &Stats::keys_pulled);
  stat("ps_server_pulls_deferred_total",
       "Pulls held until the consistency mode allowed an answer.",
       &Stats::pulls_deferred);
  stat("ps_server_bsp_steps_applied_total",
       "BSP steps applied (averaged over workers).", &Stats::bsp_steps_applied);
  stat("ps_server_duplicate_pushes_total",
       "Pushes answered without applying them again (a retry of an applied "
       "push).",
       &Stats::duplicate_pushes);
  stat("ps_server_checkpoints_written_total", "Checkpoint shards written.",
       &Stats::checkpoints_written);
  stat("ps_server_rows_restored_total", "Rows restored from checkpoints.",
       &Stats::rows_restored);
  stat("ps_server_replica_forwards_total",
       "Updates forwarded to backups (replication).", &Stats::forwards);
  stat("ps_server_replica_messages_total",
       "Replica messages applied here as a backup.", &Stats::replica_messages);
  stat("ps_server_slots_promoted_total",
       "Slots this server took over as their backup when their primary died.",
       &Stats::slots_promoted);
  stat("ps_server_unreplicated_pushes_total",
       "Pushes applied to a slot that had no backup copy.",
       &Stats::unreplicated_pushes);
  stat("ps_server_limit_refusals_total",
       "Requests refused by a data_plane.limits limit (message bytes, keys, "
       "held bytes).",
       &Stats::limit_refusals);
  stat(
      "ps_server_unknown_sender_refusals_total",
      "Requests refused because their sender is not a live worker in the view.",
      &Stats::unknown_sender_refusals);
  stat("ps_server_lease_refusals_total",
       "Requests refused because this server's lease had lapsed (it had not "
       "reached the "
       "scheduler for 3/4 of the heartbeat timeout); the workers retry them.",
       &Stats::lease_refusals);
  stat("ps_server_fenced_refusals_total",
       "Requests refused because the scheduler dropped this server (fenced for "
       "good).",
       &Stats::fenced_refusals);
  r->AddCallback("ps_server_held_bytes",
                 "Bytes of requests held aside (pulls waiting for slower "
                 "workers, pushes waiting "
                 "for a checkpoint, replica messages waiting for a view); at "
                 "most max_held_bytes.",
                 metrics::Type::kGauge, [source] {
                   absl::MutexLock lock(&source->mu);
                   return source->server == nullptr
                              ? 0.0
                              : double(source->server->stats().held_bytes);
                 });
  admission_.set_nonfinite_family(r->AddCounterFamily(
      "ps_server_nonfinite_gradients_total",
      "Non-finite gradient values received, by the sending worker's rank and "
      "what was "
      "done (rejected: the push was refused; clipped: replaced and applied).",
      {"worker", "action"}));
  r->AddCallback("ps_server_view_epoch",
                 "Epoch of the cluster view this server holds (0: none yet).",
                 metrics::Type::kGauge, [source] {
                   absl::MutexLock lock(&source->mu);
                   if (source->server == nullptr) return 0.0;
                   return double(source->server->views_.Current()->epoch);
                 });
  const std::function<Stats()> read_stats = [source] {
    absl::MutexLock lock(&source->mu);
    return source->server == nullptr ? Stats() : source->server->stats();
  };
  RegisterMoveMetrics(r, read_stats);
  RegisterServingMetrics(r, read_stats);
  RegisterTableMetrics(r, [source] {
    absl::MutexLock lock(&source->mu);
    return source->server == nullptr ? std::vector<TableStats>()
                                     : source->server->table_stats();
  });
}

void KVServer::Impl::UnregisterMetrics() {
  if (metrics_source_ == nullptr) return;
  absl::MutexLock lock(&metrics_source_->mu);
  metrics_source_->server = nullptr;
}

}  // namespace ps
