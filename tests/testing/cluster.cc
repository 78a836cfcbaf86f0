#include "tests/testing/cluster.h"

#include <utility>

#include "absl/time/clock.h"
#include "common/status.h"
#include "common/wire.h"

namespace ps::testing {
namespace {

int LiveWorkers(const ClusterView &view) {
  int n = 0;
  for (const NodeInfo &node : view.nodes()) {
    n += node.role() == WORKER && node.state() == ALIVE;
  }
  return n;
}

} // namespace

absl::StatusOr<std::unique_ptr<InProcessCluster>>
InProcessCluster::Start(const JobConfig &config) {
  std::unique_ptr<InProcessCluster> c(new InProcessCluster(config));
  SchedulerServer::Options so;
  so.config = config;
  PS_ASSIGN_OR_RETURN(c->scheduler_, SchedulerServer::Start(so));
  for (uint32_t i = 0; i < config.cluster().num_servers(); ++i) {
    ServerNode::Options o;
    o.config = config;
    o.scheduler = c->scheduler_->address();
    // Nodes share this process: no HTTP endpoint, process metrics or log
    // tag of their own.
    o.own_process = false;
    o.http_port = -1;
    PS_ASSIGN_OR_RETURN(std::unique_ptr<ServerNode> node,
                        ServerNode::Start(std::move(o)));
    c->servers_.push_back(std::move(node));
  }
  return c;
}

InProcessCluster::~InProcessCluster() {
  // Closing the scheduler's state first makes every long poll return at
  // once, so the memberships stop without waiting out a poll period.
  scheduler_->state()->Close();
  servers_.clear();
  scheduler_->Shutdown();
}

void InProcessCluster::CloseWaits() { scheduler_->state()->Close(); }

absl::StatusOr<std::vector<InProcessWorker>>
InProcessCluster::AddWorkers(int n, bool trains_shards) {
  std::vector<InProcessWorker> workers(n);
  for (InProcessWorker &w : workers) {
    WorkerSession::Options o;
    o.config = config_;
    o.scheduler = scheduler_->address();
    o.trains_shards = trains_shards;
    o.startup_timeout = absl::Seconds(30);
    PS_ASSIGN_OR_RETURN(w.session, WorkerSession::Start(std::move(o)));
    w.kv = w.session->kv();
    w.member = w.session->membership();
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (const auto &node : servers_) {
    while (LiveWorkers(node->membership().view()) < n) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            "servers did not see every worker register");
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
  }
  for (InProcessWorker &w : workers)
    w.kv->UpdateView(w.member->view());
  return workers;
}

absl::StatusOr<std::unique_ptr<KVClient>> InProcessCluster::Reader() {
  return KVClient::Create(
      {config_, 0, 0, kFinishedClock},
      scheduler_->state()->AwaitView(0, true, absl::Seconds(5)));
}

KVServer::Stats InProcessCluster::TotalStats() const {
  KVServer::Stats total;
  for (const auto &s : servers_) {
    const KVServer::Stats x = s->server().stats();
    total.requests += x.requests;
    total.errors += x.errors;
    total.keys_pushed += x.keys_pushed;
    total.keys_pulled += x.keys_pulled;
    total.pulls_deferred += x.pulls_deferred;
    total.bsp_steps_applied += x.bsp_steps_applied;
  }
  return total;
}

} // namespace ps::testing
