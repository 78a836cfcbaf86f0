// A whole job in one process, for tests and benchmarks: an in-process
// scheduler on loopback port 0, servers that are ServerNodes (the wiring
// server_main runs: views, leases, fencing, checkpoint reports), and
// workers that are WorkerSessions (each with its own membership and KV
// client, so its own sockets and node id).
//
// Not thread-safe to set up; the workers it returns may each be driven from
// their own thread.
#ifndef PS_TESTS_TESTING_CLUSTER_H_
#define PS_TESTS_TESTING_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/config.pb.h"
#include "scheduler/client.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "server/server_node.h"
#include "worker/kv_client.h"
#include "worker/session.h"

namespace ps::testing {

// A worker: its session owns the membership and the data-plane client;
// `kv` and `member` point into it, for tests that drive them directly.
// Destroying the session leaves the job unless it was left through
// session->Leave() (a test that left through `member` is told NOT_FOUND,
// logged).
struct InProcessWorker {
  std::unique_ptr<WorkerSession> session;
  KVClient *kv = nullptr;
  SchedulerClient *member = nullptr;
};

class InProcessCluster {
public:
  // Starts the scheduler and config.cluster().num_servers() servers.
  static absl::StatusOr<std::unique_ptr<InProcessCluster>>
  Start(const JobConfig &config);
  ~InProcessCluster();

  // Registers `n` workers, then waits until every server's view lists all
  // of them, so no worker's first steps are synchronised without the others.
  // `trains_shards`: workers that train data shards, as trainer_main's do
  // (their shards are handed to others when they leave unfinished).
  absl::StatusOr<std::vector<InProcessWorker>>
  AddWorkers(int n, bool trains_shards = false);

  // A KV client that reads the final parameters once training is over: it
  // pulls at the finished clock, so under BSP/SSP its pulls are answered
  // once every live worker has finished.
  absl::StatusOr<std::unique_ptr<KVClient>> Reader();

  // Makes the nodes' view long polls return at once from now on, so that
  // leaving is quick. Barriers fail after this.
  void CloseWaits();

  SchedulerServer &scheduler() { return *scheduler_; }
  KVServer &server(int i) { return servers_[i]->server(); }
  ServerNode &node(int i) { return *servers_[i]; }
  // Counters summed over the servers.
  KVServer::Stats TotalStats() const;

private:
  explicit InProcessCluster(const JobConfig &config) : config_(config) {}

  const JobConfig config_;
  std::unique_ptr<SchedulerServer> scheduler_;
  std::vector<std::unique_ptr<ServerNode>> servers_;
};

} // namespace ps::testing

#endif // PS_TESTS_TESTING_CLUSTER_H_
