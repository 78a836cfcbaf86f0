#include "common/status.h"
#include "scheduler/monitoring.h"

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/cluster_state.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kConfig[] = R"pb(
  name: "ctr <demo> & \"co\""
  cluster {
    num_servers: 2
    num_workers: 2
    num_slots: 8
    heartbeat_interval_ms: 100
    heartbeat_timeout_ms: 1000
  }
  consistency { mode: SSP staleness: 3 }
  training { batch_size: 100 }
)pb";

class MonitoringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = ParseJobConfig(kConfig, "test");
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    state_ = std::make_unique<ClusterState>(config_, &clock_);
    s0_ = Register(SERVER, "tcp://s0:7001");
    s1_ = Register(SERVER, "tcp://s1:7001");
    w0_ = Register(WORKER, "");
    w1_ = Register(WORKER, "");
  }

  uint64_t Register(Role role, const std::string& endpoint) {
    RegisterRequest r;
    r.set_role(role);
    r.set_data_endpoint(endpoint);
    r.set_host("host<1>");
    r.set_pid(77);
    r.set_config_fingerprint(ConfigFingerprint(config_));
    auto response = state_->Register(r);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->node_id() : 0;
  }

  void Heartbeat(uint64_t node, uint64_t clock = 0) {
    HeartbeatRequest r;
    r.set_node_id(node);
    r.set_clock(clock);
    EXPECT_TRUE(state_->Heartbeat(r).ok());
  }

  JobConfig config_;
  FakeClock clock_{absl::FromUnixSeconds(1700000000)};
  std::unique_ptr<ClusterState> state_;
  uint64_t s0_ = 0, s1_ = 0, w0_ = 0, w1_ = 0;
};

TEST_F(MonitoringTest, MonitorCountsHeartbeatsBarriersAndDeaths) {
  ClusterState::Monitoring m = state_->Monitor();
  EXPECT_EQ(m.heartbeats, 0u);
  EXPECT_EQ(m.nodes.size(), 4u);
  EXPECT_EQ(m.nodes[w0_].steps_per_second, -1);  // no heartbeat yet

  Heartbeat(w0_, 10);
  Heartbeat(w1_, 5);
  clock_.Advance(absl::Milliseconds(500));
  Heartbeat(w0_, 15);  // 10 steps/s
  Heartbeat(w1_, 6);   // 2 steps/s
  Heartbeat(s0_);
  clock_.Advance(absl::Milliseconds(300));
  m = state_->Monitor();
  EXPECT_EQ(m.heartbeats, 5u);
  EXPECT_DOUBLE_EQ(m.nodes[w0_].steps_per_second, 10);
  EXPECT_DOUBLE_EQ(m.nodes[w1_].steps_per_second, 2);
  EXPECT_EQ(m.nodes[s0_].steps_per_second, -1);
  EXPECT_NEAR(m.nodes[s0_].silent_seconds, 0.3, 1e-9);
  EXPECT_NEAR(m.nodes[s1_].silent_seconds, 0.8, 1e-9);  // since registering

  // A barrier released once counts once, however often it is passed.
  EXPECT_FALSE(state_->AwaitBarrier(w0_, "b", absl::ZeroDuration()).ok());
  EXPECT_TRUE(state_->AwaitBarrier(w1_, "b", absl::ZeroDuration()).ok());
  EXPECT_TRUE(state_->AwaitBarrier(w0_, "b", absl::ZeroDuration()).ok());
  EXPECT_EQ(state_->Monitor().barriers_completed, 1u);

  // w1 and s1 stop heartbeating; w0 and s0 go on (a half of the nodes
  // silent past the timeout is no suspected isolation).
  clock_.Advance(absl::Milliseconds(600));
  Heartbeat(w0_, 16);
  Heartbeat(s0_);
  clock_.Advance(absl::Milliseconds(500));
  Heartbeat(w0_, 16);
  Heartbeat(s0_);
  clock_.Advance(absl::Milliseconds(100));
  EXPECT_EQ(state_->ExpireSilentNodes().size(), 2u);
  m = state_->Monitor();
  EXPECT_EQ(m.nodes_declared_dead, 2u);
  EXPECT_EQ(m.nodes.count(w1_), 0u);  // only live nodes
  EXPECT_EQ(m.nodes.size(), 2u);
}

TEST_F(MonitoringTest, StatusPageShowsTheClusterEscaped) {
  Heartbeat(w0_, 10);
  clock_.Advance(absl::Milliseconds(500));
  Heartbeat(w0_, 15);  // 10 steps/s = 1000 examples/s at batch 100
  Heartbeat(w1_, 3);
  SchedulerMonitor monitor(state_.get(), config_, &clock_);
  const std::string html = monitor.StatusPage();
  // Reloads itself only without JavaScript; with it, status.js updates the
  // page in place.
  EXPECT_THAT(html, HasSubstr("<noscript><meta http-equiv=\"refresh\" "
                              "content=\"2\"></noscript>"));
  EXPECT_THAT(html, HasSubstr("<script defer src=\"/static/status.js\">"));
  EXPECT_LT(html.find("id=\"progress\""), html.find("<div id=\"tables\">"));
  EXPECT_LT(html.find("<div id=\"tables\">"), html.find("<h2>Nodes</h2>"));
  EXPECT_THAT(html, HasSubstr("id=\"chart-loss\""));
  EXPECT_LT(html.find("</footer>\n</div>"), html.find("id=\"chart-loss\""));
  EXPECT_THAT(html, HasSubstr("Job ctr &lt;demo&gt; &amp; &quot;co&quot;:"));
  EXPECT_THAT(html, Not(HasSubstr("<demo>")));
  EXPECT_THAT(html, Not(HasSubstr("host<1>")));
  EXPECT_THAT(html, HasSubstr("host&lt;1&gt; (77)"));
  EXPECT_THAT(html, HasSubstr("RUNNING"));
  EXPECT_THAT(html, HasSubstr("SSP (staleness 3)"));
  for (const char* name : {"server/0", "server/1", "worker/0", "worker/1"}) {
    EXPECT_THAT(html, HasSubstr(absl::StrCat("<td>", name, "</td>"))) << name;
  }
  EXPECT_THAT(html, HasSubstr("tcp://s1:7001"));
  EXPECT_THAT(html, HasSubstr("<td class=\"num\">15</td><td class=\"num\">1000</td>"));
  EXPECT_THAT(html, HasSubstr("Slowest / fastest clock</td><td>3 / 15</td>"));
  EXPECT_THAT(html, HasSubstr("2 alive, 0 left, 0 dead"));
  EXPECT_THAT(html, Not(HasSubstr("http://")));  // no external assets
  EXPECT_THAT(html, Not(HasSubstr("https://")));

  // A dead worker is shown as such, without clock or pace.
  clock_.Advance(absl::Seconds(2));
  Heartbeat(w0_, 16);
  Heartbeat(s0_);
  Heartbeat(s1_);
  state_->ExpireSilentNodes();
  clock_.Advance(absl::Seconds(1));  // past the snapshot's reuse window
  const std::string later = monitor.StatusPage();
  EXPECT_THAT(later, HasSubstr("1 alive, 0 left, 1 dead"));
  EXPECT_THAT(later, HasSubstr("<span class=\"dead\">dead</span>"));
  EXPECT_THAT(later, HasSubstr("Nodes declared dead</td><td>1</td>"));
}

TEST_F(MonitoringTest, ServersWithDiskTiersShowWhatTheirTiersHold) {
  SchedulerMonitor monitor(state_.get(), config_, &clock_);
  // No server reported a tier: no such table.
  EXPECT_THAT(monitor.StatusPage(), Not(HasSubstr("Disk tiers")));
  HeartbeatRequest r;
  r.set_node_id(s1_);
  ServerStorage* st = r.mutable_storage();
  st->set_rows_in_ram(2500);
  st->set_cold_rows(7500);
  st->set_disk_bytes(12300000);
  st->set_tier_memory_bytes(1048576);
  st->set_cold_reads(4321);
  st->set_tier_waits(17);
  st->set_tier_wait_seconds(0.25);
  ASSERT_TRUE(state_->Heartbeat(r).ok());
  // A worker's report of storage is not a server's: ignored.
  r.set_node_id(w0_);
  ASSERT_TRUE(state_->Heartbeat(r).ok());
  ClusterState::Monitoring m = state_->Monitor();
  EXPECT_TRUE(m.nodes[s1_].has_storage);
  EXPECT_EQ(m.nodes[s1_].storage.cold_rows(), 7500u);
  EXPECT_FALSE(m.nodes[s0_].has_storage);
  EXPECT_FALSE(m.nodes[w0_].has_storage);
  clock_.Advance(absl::Seconds(1));  // past the snapshot's reuse window
  const std::string html = monitor.StatusPage();
  EXPECT_THAT(html, HasSubstr("<h2>Disk tiers</h2>"));
  EXPECT_THAT(html,
              HasSubstr("<tr><td>server/1</td><td class=\"num\">2500</td>"
                        "<td class=\"num\">7500 (75%)</td>"
                        "<td class=\"num\">12.3 MB</td>"
                        "<td class=\"num\">1.0 MB</td>"
                        "<td class=\"num\">4321</td>"
                        "<td class=\"num\">17 (0.2 s waiting)</td></tr>"));
  // Server 0 reported no tier.
  EXPECT_THAT(html.substr(html.find("Disk tiers")), Not(HasSubstr("server/0")));
}

TEST_F(MonitoringTest, Metrics) {
  Heartbeat(w0_, 10);
  clock_.Advance(absl::Milliseconds(500));
  Heartbeat(w0_, 20);
  Heartbeat(w1_, 4);
  SchedulerMonitor monitor(state_.get(), config_, &clock_);
  metrics::Registry registry;
  monitor.RegisterMetrics(&registry);
  const std::string text = registry.Expose();
  EXPECT_THAT(text, HasSubstr("ps_scheduler_nodes{role=\"server\",state=\"alive\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_nodes{role=\"worker\",state=\"alive\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_nodes{role=\"worker\",state=\"dead\"} 0\n"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("ps_scheduler_view_epoch ",
                                           state_->View().epoch(), "\n")));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_job_state{state=\"running\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_job_state{state=\"starting\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_consistency_mode{mode=\"ssp\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_consistency_mode{mode=\"async\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_ssp_staleness 3\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_heartbeats_received_total 3\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_worker_clock{rank=\"0\"} 20\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_worker_clock{rank=\"1\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_worker_clock_spread 16\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_worker_steps_per_second{rank=\"0\"} 20\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_node_heartbeat_age_seconds{role=\"server\","
                              "rank=\"1\"} 0.5\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE ps_scheduler_nodes_declared_dead_total counter\n"
                              "ps_scheduler_nodes_declared_dead_total 0\n"));
}

TEST_F(MonitoringTest, SuspectedIsolationShowsOnThePageAndInTheMetrics) {
  SchedulerMonitor monitor(state_.get(), config_, &clock_);
  metrics::Registry registry;
  monitor.RegisterMetrics(&registry);
  EXPECT_THAT(monitor.StatusPage(), HasSubstr("Suspected isolations</td><td>0</td>"));
  // Every node silent at once: suspected isolation, nobody declared dead.
  clock_.Advance(absl::Milliseconds(1200));
  EXPECT_TRUE(state_->ExpireSilentNodes().empty());
  clock_.Advance(absl::Milliseconds(500));  // past the snapshot's reuse window
  EXPECT_THAT(monitor.StatusPage(),
              HasSubstr("<td>Isolation</td><td><span class=\"dead\">suspected for 0.5 s"));
  std::string text = registry.Expose();
  EXPECT_THAT(text, HasSubstr("ps_scheduler_isolation_suspected 1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE ps_scheduler_isolation_suspicions_total counter\n"
                              "ps_scheduler_isolation_suspicions_total 1\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_stalls_total 0\n"));
  // Heartbeats are back.
  for (uint64_t node : {s0_, s1_, w0_, w1_}) Heartbeat(node);
  EXPECT_TRUE(state_->ExpireSilentNodes().empty());
  clock_.Advance(absl::Milliseconds(500));
  const std::string page = monitor.StatusPage();
  EXPECT_THAT(page, Not(HasSubstr("<td>Isolation</td>")));
  EXPECT_THAT(page, HasSubstr("Suspected isolations</td><td>1</td>"));
  text = registry.Expose();
  EXPECT_THAT(text, HasSubstr("ps_scheduler_isolation_suspected 0\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_isolation_suspicions_total 1\n"));
}

TEST_F(MonitoringTest, ASchedulerRestartShowsOnThePageAndInTheMetrics) {
  {
    SchedulerMonitor monitor(state_.get(), config_, &clock_);
    EXPECT_THAT(monitor.StatusPage(), HasSubstr("<td>Scheduler restarts</td><td>none</td>"));
  }
  std::optional<SchedulerJournal> journal;
  ASSERT_TRUE(state_
                  ->SetJournal([&](const SchedulerJournal& j, bool) {
                    journal = j;
                    return absl::OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(journal.has_value());
  // The scheduler dies; its successor takes the job back.
  ClusterState restarted(config_, &clock_);
  ASSERT_TRUE(restarted.Recover(*journal).ok());
  const ClusterView view = restarted.View();
  SchedulerMonitor monitor(&restarted, config_, &clock_);
  EXPECT_THAT(monitor.StatusPage(),
              HasSubstr(absl::StrCat("<td>Scheduler restarts</td><td>1 (the newest took the "
                                     "job back at epoch ",
                                     view.epoch(), " with 4 live nodes)</td>")));
  metrics::Registry registry;
  monitor.RegisterMetrics(&registry);
  EXPECT_THAT(registry.Expose(), HasSubstr("ps_scheduler_restarts 1\n"));
}

TEST_F(MonitoringTest, JournalWritesTheirTimeAndSizeAreMetrics) {
  size_t size = 0;
  ASSERT_TRUE(state_
                  ->SetJournal([&](const SchedulerJournal& j, bool) {
                    size = j.ByteSizeLong();
                    return absl::OkStatus();
                  })
                  .ok());
  state_->SyncJournal();
  SchedulerMonitor monitor(state_.get(), config_, &clock_);
  metrics::Registry registry;
  monitor.RegisterMetrics(&registry);
  const std::string text = registry.Expose();
  EXPECT_THAT(text, HasSubstr("# TYPE ps_scheduler_journal_writes_total counter\n"
                              "ps_scheduler_journal_writes_total 2\n"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("ps_scheduler_journal_bytes ", size, "\n")));
  EXPECT_GT(size, 100u);
  EXPECT_THAT(text, HasSubstr("# TYPE ps_scheduler_journal_write_seconds_total counter\n"));
}

TEST_F(MonitoringTest, AFailedJobShowsItsReasonOnThePageAndInTheMetrics) {
  SchedulerMonitor monitor(state_.get(), config_, &clock_);
  metrics::Registry registry;
  monitor.RegisterMetrics(&registry);
  // Server 1 leaves a job without replication or checkpoint: slots 4-7
  // have no copy left.
  LeaveRequest leave;
  leave.set_node_id(s1_);
  ASSERT_TRUE(state_->Leave(leave).ok());
  ASSERT_EQ(state_->CheckCanContinue().size(), 1u);
  clock_.Advance(absl::Milliseconds(500));  // past the snapshot's reuse window
  const std::string page = monitor.StatusPage();
  EXPECT_THAT(page, HasSubstr("<span class=\"state-FAILED\">FAILED</span>"));
  EXPECT_THAT(page, HasSubstr("<td>Failure</td><td><span class=\"dead\">slots 4-7 (of "
                              "server 1) have no live copy"));
  const std::string text = registry.Expose();
  EXPECT_THAT(text, HasSubstr("ps_scheduler_job_state{state=\"failed\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ps_scheduler_job_state{state=\"running\"} 0\n"));
}

TEST(HtmlEscapeTest, EscapesTheFiveCharacters) {
  EXPECT_EQ(HtmlEscape("<a href=\"x\">it's & more</a>"),
            "&lt;a href=&quot;x&quot;&gt;it&#39;s &amp; more&lt;/a&gt;");
}

}  // namespace
}  // namespace ps
