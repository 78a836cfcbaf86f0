// For the tests of the scheduler's long-poll waiters (barriers, claims):
// a small registered job, and the outcome of a callback-API call. Test-only.
#ifndef PS_SCHEDULER_WAITERS_TESTING_H_
#define PS_SCHEDULER_WAITERS_TESTING_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/cluster_state.h"

namespace ps::testing {

// One call's outcome, filled by its completion callback (Callback()). It
// must outlive the callback: a call still open when a test ends is
// answered by the waiters' Close, after the test body's locals are gone,
// so tests keep outcomes in an OutcomeList.
template <typename Request, typename Response>
struct CallOutcome {
  grpc::ClientContext ctx;
  Request request;
  Response response;
  grpc::Status status;
  absl::Notification done;

  // For the stub's async method; the context's deadline is set here.
  std::function<void(grpc::Status)> Callback() {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    return [this](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    };
  }
};

// Outcomes that live until Drain, which waits for every callback.
template <typename Outcome>
class OutcomeList {
 public:
  Outcome* Add() {
    outcomes_.push_back(std::make_unique<Outcome>());
    return outcomes_.back().get();
  }
  // Whether every call was answered within `wait` each.
  bool Drain(absl::Duration wait) {
    bool all = true;
    for (const auto& o : outcomes_) {
      all = o->done.WaitForNotificationWithTimeout(wait) && all;
    }
    return all;
  }

 private:
  std::vector<std::unique_ptr<Outcome>> outcomes_;
};

// A registered job of one server and `workers` workers (trains_shards: the
// workers take data shards, as claims need), with 100 ms heartbeats.
struct SmallJob {
  std::unique_ptr<ClusterState> state;
  std::vector<RegisterResponse> workers;
};
inline absl::StatusOr<SmallJob> StartSmallJob(Clock* clock, uint32_t workers,
                                              bool trains_shards) {
  JobConfig config;
  config.mutable_cluster()->set_num_servers(1);
  config.mutable_cluster()->set_num_workers(workers);
  config.mutable_cluster()->set_num_slots(8);
  config.mutable_cluster()->set_heartbeat_interval_ms(100);
  config.mutable_cluster()->set_heartbeat_timeout_ms(1000);
  const uint64_t fingerprint = ConfigFingerprint(config);
  SmallJob job;
  job.state = std::make_unique<ClusterState>(config, clock);
  RegisterRequest server;
  server.set_role(SERVER);
  server.set_data_endpoint("tcp://s:1");
  server.set_config_fingerprint(fingerprint);
  absl::StatusOr<RegisterResponse> s = job.state->Register(server);
  if (!s.ok()) return s.status();
  for (uint32_t i = 0; i < workers; ++i) {
    RegisterRequest worker;
    worker.set_role(WORKER);
    worker.set_trains_shards(trains_shards);
    worker.set_config_fingerprint(fingerprint);
    absl::StatusOr<RegisterResponse> r = job.state->Register(worker);
    if (!r.ok()) return r.status();
    if (trains_shards && !r->has_shard()) {
      return absl::InternalError(absl::StrCat("worker ", i, " got no shard"));
    }
    job.workers.push_back(*std::move(r));
  }
  return job;
}

}  // namespace ps::testing

#endif  // PS_SCHEDULER_WAITERS_TESTING_H_
