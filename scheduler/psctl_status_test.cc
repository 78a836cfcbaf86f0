#include "scheduler/psctl_status.h"

#include <cmath>
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/scheduler.pb.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

absl::Time Noon() {
  return absl::FromCivil(absl::CivilSecond(2026, 11, 28, 12, 0, 0),
                         absl::UTCTimeZone());
}

TEST(PsctlStatusTest, ShowsSuspectedIsolationAndUntilWhenNodesAreHeld) {
  GetStatusResponse status;
  SchedulerFaults* faults = status.mutable_faults();
  faults->set_isolation_suspected(true);
  faults->set_isolation_suspected_ms(3200);
  faults->set_isolation_hold_left_ms(26800);
  faults->set_isolation_suspicions(1);
  faults->set_stalls(2);
  const std::string out = FormatStatus(status, "", Noon());
  EXPECT_THAT(out, HasSubstr("isolation: SUSPECTED for 3.2 s"));
  EXPECT_THAT(out, HasSubstr("until 2026-11-28 12:00:26.8 UTC (in 26.8 s, "
                             "cluster.isolation_hold_ms)"));
  EXPECT_THAT(out, HasSubstr("scheduler faults: stalls noticed 2, isolation "
                             "suspicions 1\n"));
}

TEST(PsctlStatusTest, WithoutIsolationShowsOnlyTheCounts) {
  GetStatusResponse status;
  status.mutable_faults()->set_stalls(4);
  status.mutable_faults()->set_isolation_suspicions(3);
  const std::string out = FormatStatus(status, "", Noon());
  EXPECT_THAT(out, Not(HasSubstr("isolation:")));
  EXPECT_THAT(out, HasSubstr("scheduler faults: stalls noticed 4, isolation "
                             "suspicions 3\n"));
}

TEST(PsctlStatusTest, ListsNodesAndFinishedWorkers) {
  GetStatusResponse status;
  status.mutable_view()->set_epoch(7);
  NodeInfo* node = status.mutable_view()->add_nodes();
  node->set_node_id(2);
  node->set_role(WORKER);
  node->set_rank(0);
  node->set_state(ALIVE);
  WorkerClock* clock = status.add_clocks();
  clock->set_rank(0);
  clock->set_clock(uint64_t{1} << 62);
  const std::string out = FormatStatus(status, "disk full", Noon());
  EXPECT_THAT(out, HasSubstr("epoch: 7\n"));
  EXPECT_THAT(out, HasSubstr("journal: FAILING: disk full\n"));
  EXPECT_THAT(out, HasSubstr("node 2  worker rank 0  ALIVE"));
  EXPECT_THAT(out, HasSubstr("worker rank 0  clock finished"));
}

TEST(PsctlStatusTest, ShowsSlotMovesAndSpares) {
  GetStatusResponse status;
  ClusterView& view = *status.mutable_view();
  view.set_job_state(RUNNING);
  for (uint32_t owner : {0, 0, 1, 1}) view.add_slot_owner(owner);
  for (uint32_t rank : {0, 1, 2}) {
    NodeInfo* n = view.add_nodes();
    n->set_node_id(rank + 1);
    n->set_role(SERVER);
    n->set_rank(rank);
    n->set_state(ALIVE);
  }
  SlotMove* m = view.add_moves();
  m->set_source(1);
  m->set_target(2);
  m->add_slots(3);
  m->set_phase(SlotMove::FENCING);
  m->set_rows_copied(1200);
  m->set_bytes_copied(2500000);
  m->set_started_unix_micros(absl::ToUnixMicros(Noon() - absl::Seconds(3)));
  const std::string out = FormatStatus(status, "", Noon());
  EXPECT_THAT(out, HasSubstr("slot moves: 1\n"));
  EXPECT_THAT(out, HasSubstr("  server 1 -> server 2  1 slots  fencing  1200 "
                             "rows (2.5 MB) copied  for 3.0 s\n"));
  EXPECT_THAT(out, HasSubstr("server rank 0  ALIVE  host -  pid 0  slots 2\n"));
  EXPECT_THAT(out, HasSubstr("server rank 2  ALIVE  host -  pid 0  spare (no "
                             "slots)\n"));
}

TEST(PsctlStatusTest, ShowsQueuedMovesAndRetries) {
  GetStatusResponse status;
  ClusterView& view = *status.mutable_view();
  view.set_job_state(RUNNING);
  for (uint32_t owner : {0, 0, 1, 1}) view.add_slot_owner(owner);
  SlotMove* q = status.add_queued_moves();
  q->set_source(0);
  q->set_target(2);
  q->add_slots(0);
  q->add_slots(1);
  q->set_attempt(2);
  q->set_not_before_unix_micros(
      absl::ToUnixMicros(Noon() + absl::Milliseconds(1500)));
  SlotMove* m = view.add_moves();
  m->set_source(1);
  m->set_target(2);
  m->add_slots(3);
  m->set_phase(SlotMove::COPYING);
  m->set_attempt(3);
  const std::string out = FormatStatus(status, "", Noon());
  EXPECT_THAT(out, HasSubstr("queued slot move: server 0 -> server 2  2 "
                             "slots  try 2  in 1.5 s\n"));
  EXPECT_THAT(out,
              HasSubstr("  server 1 -> server 2  1 slots  copying  try 3\n"));
}

TEST(PsctlStatusTest, HumanDurationReadsAsPeopleWriteIt) {
  EXPECT_EQ(HumanDuration(0), "0s");
  EXPECT_EQ(HumanDuration(42.4), "42s");
  EXPECT_EQ(HumanDuration(192), "3m 12s");
  EXPECT_EQ(HumanDuration(7500), "2h 05m");
  EXPECT_EQ(HumanDuration(3 * 86400 + 4 * 3600), "3d 04h");
  EXPECT_EQ(HumanDuration(-1), "?");
  EXPECT_EQ(HumanDuration(std::nan("")), "?");
}

TEST(PsctlStatusTest, ProgressLineShowsProgressPaceEtaAndMetrics) {
  GetStatusResponse status;
  status.mutable_view()->set_job_state(RUNNING);
  JobProgress* p = status.mutable_progress();
  p->set_progress(0.42);
  p->set_steps_done(420);
  p->set_steps_total(1000);
  p->set_total_known(true);
  p->set_steps_per_second(12.5);
  p->set_examples_per_second(3200);
  p->set_eta_s(192);
  p->set_elapsed_s(40);
  MetricPoint* auc = p->add_metrics();
  auc->set_name("test_auc");
  auc->set_value(0.712);
  EXPECT_EQ(FormatProgressLine(status, 10),
            "RUNNING   42.0% [####......]  420/1000 steps  12.5 steps/s  "
            "3200 ex/s  ETA 3m 12s  elapsed 40s  test_auc 0.7120");
  p->clear_eta_s();
  p->set_total_known(false);
  const std::string line = FormatProgressLine(status, 0);
  EXPECT_THAT(line, HasSubstr("420/~1000 steps"));
  EXPECT_THAT(line, HasSubstr("ETA ?"));
  EXPECT_THAT(line, Not(HasSubstr("[")));
  ShardProgress* shard = p->add_shards();
  shard->set_shard(1);
  shard->set_state("ACTIVE");
  shard->set_worker_rank(0);
  shard->set_progress(0.5);
  shard->set_steps_done(50);
  shard->set_steps_total(100);
  shard->set_eta_s(5);
  const std::string out = FormatStatus(status, "", Noon());
  EXPECT_THAT(out, HasSubstr("progress: RUNNING   42.0%"));
  EXPECT_THAT(out, HasSubstr("  shard 1  ACTIVE  epoch 0 batch 0  50.0%  "
                             "50/100 steps  worker rank 0  ETA 5s\n"));
}

}  // namespace
}  // namespace ps
