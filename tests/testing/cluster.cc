#include "tests/testing/cluster.h"

#include <atomic>
#include <utility>

#include "absl/time/clock.h"
#include "common/status.h"
#include "common/wire.h"

namespace ps::testing {
namespace {

int LiveWorkers(const ClusterView& view) {
  int n = 0;
  for (const NodeInfo& node : view.nodes()) {
    n += node.role() == WORKER && node.state() == ALIVE;
  }
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<InProcessCluster>> InProcessCluster::Start(
    const JobConfig& config) {
  std::unique_ptr<InProcessCluster> c(new InProcessCluster(config));
  SchedulerServer::Options so;
  so.config = config;
  PS_ASSIGN_OR_RETURN(c->scheduler_, SchedulerServer::Start(so));
  for (uint32_t i = 0; i < config.cluster().num_servers(); ++i) {
    KVServer::Options ko;
    ko.config = config;
    PS_ASSIGN_OR_RETURN(std::unique_ptr<KVServer> server, KVServer::Start(ko));
    KVServer* kv = server.get();
    c->servers_.push_back(std::move(server));
    PS_ASSIGN_OR_RETURN(
        std::unique_ptr<SchedulerClient> member,
        c->Connect(SERVER, kv->endpoint(),
                   [kv](const ClusterView& v, uint32_t rank) { kv->UpdateView(v, rank); }));
    c->server_members_.push_back(std::move(member));
  }
  return c;
}

InProcessCluster::~InProcessCluster() {
  // Closing the scheduler's state first makes every long poll return at
  // once, so the memberships stop without waiting out a poll period.
  scheduler_->state()->Close();
  server_members_.clear();
  scheduler_->Shutdown();
  servers_.clear();
}

void InProcessCluster::CloseWaits() { scheduler_->state()->Close(); }

absl::StatusOr<std::unique_ptr<SchedulerClient>> InProcessCluster::Connect(
    Role role, const std::string& endpoint,
    std::function<void(const ClusterView&, uint32_t)> on_view) {
  auto options = SchedulerClient::Options::ForJob(config_, scheduler_->address(), role);
  options.data_endpoint = endpoint;
  options.on_view = std::move(on_view);
  return SchedulerClient::Connect(options);
}

absl::StatusOr<std::vector<InProcessWorker>> InProcessCluster::AddWorkers(int n) {
  std::vector<InProcessWorker> workers(n);
  for (InProcessWorker& w : workers) {
    auto holder = std::make_shared<std::atomic<KVClient*>>(nullptr);
    PS_ASSIGN_OR_RETURN(w.member,
                        Connect(WORKER, "", [holder](const ClusterView& v, uint32_t) {
                          if (KVClient* c = holder->load()) c->UpdateView(v);
                        }));
    PS_ASSIGN_OR_RETURN(ClusterView view, w.member->WaitForRunning(absl::Seconds(30)));
    PS_ASSIGN_OR_RETURN(w.kv, KVClient::Create({config_, w.member->rank(),
                                                w.member->node_id(),
                                                w.member->start_clock()},
                                               view));
    holder->store(w.kv.get());
    w.kv->UpdateView(w.member->view());
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (auto& m : server_members_) {
    while (LiveWorkers(m->view()) < n) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError("servers did not see every worker register");
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
  }
  for (InProcessWorker& w : workers) w.kv->UpdateView(w.member->view());
  return workers;
}

absl::StatusOr<std::unique_ptr<KVClient>> InProcessCluster::Reader() {
  return KVClient::Create({config_, 0, 0, kFinishedClock},
                          scheduler_->state()->AwaitView(0, true, absl::Seconds(5)));
}

KVServer::Stats InProcessCluster::TotalStats() const {
  KVServer::Stats total;
  for (const auto& s : servers_) {
    const KVServer::Stats x = s->stats();
    total.requests += x.requests;
    total.errors += x.errors;
    total.keys_pushed += x.keys_pushed;
    total.keys_pulled += x.keys_pulled;
    total.pulls_deferred += x.pulls_deferred;
    total.bsp_steps_applied += x.bsp_steps_applied;
  }
  return total;
}

}  // namespace ps::testing
