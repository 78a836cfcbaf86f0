// A KVServer's Prometheus metrics (KVServer::Options::metrics).
//
// Counted on the serving thread, per request processed (a few relaxed
// atomic adds and two clock reads; nothing per key):
//   ps_server_requests_total{op,outcome}        outcome: ok, error, deferred
//                                               (a pull held by the
//                                               consistency rule), held (a
//                                               push held by a checkpoint).
//                                               A deferred or held request
//                                               is counted again when it is
//                                               processed once more.
//   ps_server_request_duration_seconds{op}      time to process it on the
//                                               serving thread (queueing and
//                                               the network not included)
//   ps_server_received_bytes_total              request frames
//   ps_server_sent_bytes_total                  answer payload frames (keys
//                                               and values; headers not
//                                               counted)
//   ps_server_request_errors_total{reason}      rejected requests by reason:
//                                               misrouted, key_list_unknown,
//                                               non_finite, unavailable,
//                                               unknown_table,
//                                               resource_exhausted,
//                                               stale_sequence,
//                                               invalid_request, other
//   ps_server_pull_hold_seconds                 how long deferred pulls were
//                                               held before their answer
// Computed at scrape time from KVServer::stats() and table_stats():
//   ps_server_keys_pushed_total, ps_server_keys_pulled_total,
//   ps_server_pulls_deferred_total, ps_server_bsp_steps_applied_total,
//   ps_server_duplicate_pushes_total, ps_server_checkpoints_written_total,
//   ps_server_rows_restored_total, ps_server_replica_forwards_total,
//   ps_server_replica_messages_total, ps_server_slots_promoted_total,
//   ps_server_unreplicated_pushes_total,
//   ps_server_view_epoch (the epoch of the view the server holds),
//   ps_server_table_rows{table}, ps_server_table_bytes{table},
//   ps_server_table_memory_budget_bytes{table},
//   ps_server_table_keys_pushed_total{table},
//   ps_server_table_keys_pulled_total{table},
//   ps_server_table_evictions_total{table,cause} (cause ttl or budget),
//   ps_server_table_pushes_refused_total{table},
//   a disk tier's (0 without one): ps_server_table_cold_rows{table},
//   ps_server_table_disk_bytes{table},
//   ps_server_table_tier_memory_bytes{table},
//   ps_server_table_{demotions,promotions,cold_reads,cold_misses,bloom_useful,
//   disk_reads,disk_written_bytes,cold_rows_dropped,tier_errors}_total{table},
//   ps_server_table_cold_read_seconds_total{table},
//   ps_server_tier_waits_total, ps_server_tier_wait_seconds_total
//   ps_server_limit_refusals_total, ps_server_unknown_sender_refusals_total,
//   ps_server_held_bytes,
//   ps_server_nonfinite_gradients_total{worker,action} (rejected or clipped)
// Counted by the gate (server/peer_gate.h):
//   ps_server_connections, ps_server_connections_refused_total,
//   with CURVE (Options::curve):
//   ps_server_auth_refusals_total{reason}       connections refused: client_key
//                                               (not the job key), handshake
//                                               (no CURVE, wrong server key)
// (op labels are lower-case op names; table labels the configured table names).
#ifndef PS_SERVER_SERVER_METRICS_H_
#define PS_SERVER_SERVER_METRICS_H_

#include <chrono>
#include <cstdint>

#include "common/metrics.h"
#include "common/status.h"
#include "proto/data_plane.pb.h"

namespace ps {

// The serving thread's instruments, looked up once. Thread-safe (relaxed
// atomics); not copyable.
class ServerInstruments {
 public:
  enum class Outcome { kOk, kError, kDeferred, kHeld };
  static constexpr int kNumOutcomes = 4;
  // Ops 0..kMaxOp (proto Op); anything else is counted as op "invalid".
  static constexpr int kMaxOp = 8;
  enum class Reason {
    kMisrouted,
    kKeyListUnknown,
    kNonFinite,
    kUnavailable,
    kUnknownTable,
    kResourceExhausted,
    kStaleSequence,
    kInvalidRequest,
    kOther,
  };
  static constexpr int kNumReasons = 9;

  using TimePoint = std::chrono::steady_clock::time_point;
  static TimePoint Now() { return std::chrono::steady_clock::now(); }

  // Registers the request metrics in `registry` (not owned; must outlive
  // this object).
  explicit ServerInstruments(metrics::Registry* registry);
  ServerInstruments(const ServerInstruments&) = delete;
  ServerInstruments& operator=(const ServerInstruments&) = delete;

  // One request processed: `op` as in RequestHeader (0 when it could not
  // be decoded), bytes of its frames and of the answer's payload, and
  // when processing started.
  void Record(int op, Outcome outcome, uint64_t bytes_in, uint64_t bytes_out,
              TimePoint start);
  // A rejected request's reason (also counted by Record as kError).
  void RecordError(Reason reason);
  // A deferred pull answered after being held for `seconds`.
  void RecordHold(double seconds) { hold_->Observe(seconds); }

  // Why `status` (from processing a request answered with `rh`) failed.
  static Reason Classify(const absl::Status& status, const ResponseHeader& rh);

 private:
  static int OpIndex(int op) { return op >= 0 && op <= kMaxOp ? op : 0; }

  metrics::Counter* requests_[kMaxOp + 1][kNumOutcomes];
  metrics::Histogram* duration_[kMaxOp + 1];
  metrics::Counter* errors_[kNumReasons];
  metrics::Counter* bytes_in_;
  metrics::Counter* bytes_out_;
  metrics::Histogram* hold_;
};

}  // namespace ps

#endif  // PS_SERVER_SERVER_METRICS_H_
