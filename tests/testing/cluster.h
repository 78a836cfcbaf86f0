// A whole job in one process, for tests and benchmarks: an in-process
// scheduler on loopback port 0, real servers registered through the
// membership client, and workers, each with its own membership and KV
// client (so its own sockets and node id).
//
// Not thread-safe to set up; the workers it returns may each be driven from
// their own thread.
#ifndef PS_TESTS_TESTING_CLUSTER_H_
#define PS_TESTS_TESTING_CLUSTER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"
#include "scheduler/client.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "worker/kv_client.h"

namespace ps::testing {

// A worker's membership and data-plane client. `kv` is declared first so
// `member`, whose view callback uses kv, is destroyed first.
struct InProcessWorker {
  std::unique_ptr<KVClient> kv;
  std::unique_ptr<SchedulerClient> member;
};

class InProcessCluster {
 public:
  // Starts the scheduler and config.cluster().num_servers() servers.
  static absl::StatusOr<std::unique_ptr<InProcessCluster>> Start(
      const JobConfig& config);
  ~InProcessCluster();

  // Registers `n` workers, then waits until every server's view lists all
  // of them, so no worker's first steps are synchronised without the others.
  absl::StatusOr<std::vector<InProcessWorker>> AddWorkers(int n);

  // A KV client that reads the final parameters once training is over: it
  // pulls at the finished clock, so under BSP/SSP its pulls are answered
  // once every live worker has finished.
  absl::StatusOr<std::unique_ptr<KVClient>> Reader();

  // Makes the nodes' view long polls return at once from now on, so that
  // leaving is quick. Barriers fail after this.
  void CloseWaits();

  SchedulerServer& scheduler() { return *scheduler_; }
  KVServer& server(int i) { return *servers_[i]; }
  // Counters summed over the servers.
  KVServer::Stats TotalStats() const;

 private:
  explicit InProcessCluster(const JobConfig& config) : config_(config) {}
  absl::StatusOr<std::unique_ptr<SchedulerClient>> Connect(
      Role role, const std::string& endpoint,
      std::function<void(const ClusterView&, uint32_t)> on_view);

  const JobConfig config_;
  std::unique_ptr<SchedulerServer> scheduler_;
  std::vector<std::unique_ptr<KVServer>> servers_;
  std::vector<std::unique_ptr<SchedulerClient>> server_members_;
};

}  // namespace ps::testing

#endif  // PS_TESTS_TESTING_CLUSTER_H_
