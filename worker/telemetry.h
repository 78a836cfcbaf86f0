// The trainer process's metrics and its answers to /healthz and /readyz
// (worker/trainer_main.cc serves them with common/http_endpoint.h).
//
// Metrics:
//   ps_worker_steps_total                      training steps computed
//   ps_worker_examples_total                   examples trained
//   ps_worker_step_duration_seconds            wall time per step
//   ps_worker_request_duration_seconds{op}     push, pull, push_pull: from
//                                              the call to the answer
//   ps_worker_staleness_clocks                 per answered pull: clocks
//                                              this worker was ahead of the
//                                              slowest live worker
//   ps_worker_sent_bytes_total,
//   ps_worker_received_bytes_total             data-plane bytes (all frames)
//   ps_worker_clock                            steps completed (the clock;
//                                              absent once finished)
//   ps_worker_rank                             this worker's rank (-1 before
//                                              registering)
//
// Thread-safe. Must outlive every Expose() of the registry it was given;
// the KV client and scheduler client it is given must be unset (null)
// before they are destroyed.
#ifndef PS_WORKER_TELEMETRY_H_
#define PS_WORKER_TELEMETRY_H_

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/status.h"
#include "scheduler/client.h"
#include "worker/kv_client.h"

namespace ps {

class WorkerTelemetry {
 public:
  // Registers the metrics above in `registry` (not owned; must outlive
  // this object).
  explicit WorkerTelemetry(metrics::Registry* registry);
  WorkerTelemetry(const WorkerTelemetry&) = delete;
  WorkerTelemetry& operator=(const WorkerTelemetry&) = delete;

  // For KVClient::Options::instruments.
  KVClient::Options::Instruments instruments() const { return instruments_; }
  // TrainerHooks::on_trained.
  void OnTrained(uint64_t examples, absl::Duration step_time);

  // The scheduler client once registered (null again before it is
  // destroyed): health is "lost membership" once it says so.
  void SetMembership(const SchedulerClient* membership);
  // The KV client while training (null again before it is destroyed; its
  // byte counts are kept): ready while one is set.
  void SetClient(const KVClient* client);

  // OK unless the scheduler dropped this worker from the job.
  absl::Status Health() const;
  // OK while registered and training (a KV client set).
  absl::Status Readiness() const;

 private:
  KVClient::Options::Instruments instruments_;
  metrics::Counter* steps_;
  metrics::Counter* examples_;
  metrics::Histogram* step_seconds_;

  mutable absl::Mutex mu_;
  const SchedulerClient* membership_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  const KVClient* client_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Bytes of clients that are gone.
  uint64_t sent_before_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t received_before_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rank_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace ps

#endif  // PS_WORKER_TELEMETRY_H_
