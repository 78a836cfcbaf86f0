// replication_pusher: a worker for tests/replication_test.cc that pushes
// integer gradients to the keys 0..N-1 of a sparse SGD table as fast as it
// can, a few pushes in flight, until a stop file appears, and writes a
// ledger of what was acknowledged:
//
//   sum KEY SUM               per key: the sum of its acknowledged gradients
//   ack GROUP ISSUE_US ACK_US per acknowledged push: the rank that owned its
//                             keys when the pusher started, and when it was
//                             sent and acknowledged (Unix microseconds)
//   failed N                  pushes that failed (the test expects 0)
//
// Each push carries keys of one server's slots (as the view at start has
// them), so the test can tell pushes to a server it killed apart; with
// --mixed, keys of every server (the client splits the push among them).
// The client follows the cluster views, so pushes to a dead server go to
// the backup that takes over its slots (with the same sequence numbers).
// With --clock_every=N it also ends a step (ADVANCE_CLOCK) after every N
// pushes sent, so that the job's clock moves and checkpoints are taken.
// Exit code 0 when every push was acknowledged, 1 otherwise (or on error).
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/node_main.h"
#include "scheduler/client.h"
#include "worker/kv_client.h"

ABSL_FLAG(std::string, config, "", "Job config file (textproto). Required.");
ABSL_FLAG(std::string, scheduler, "", "Scheduler host:port. Required.");
ABSL_FLAG(std::string, table, "sgd", "Sparse table (dim 1) to push to.");
ABSL_FLAG(uint64_t, keys, 1000, "Push to keys 0..keys-1.");
ABSL_FLAG(int, batch, 16, "Keys per push.");
ABSL_FLAG(int, inflight, 8, "Pushes in flight at a time.");
ABSL_FLAG(int, clock_every, 0,
          "End a step after every this many pushes sent; 0: never.");
ABSL_FLAG(uint32_t, seed, 1, "Random seed (keys and gradients).");
ABSL_FLAG(std::string, stop_file, "", "Stop once this file exists. Required.");
ABSL_FLAG(std::string, progress_file, "",
          "Written (with the count) once 100 pushes were acknowledged.");
ABSL_FLAG(std::string, ledger, "", "Where the ledger goes. Required.");
ABSL_FLAG(std::string, log_level, "warn", "trace|debug|info|warn|error");
ABSL_FLAG(bool, mixed, false,
          "Each push draws its keys from all keys, so it spans servers (and "
          "is split among them); its ledger group is then the job's server "
          "count.");

namespace {

struct Push {
  uint32_t group = 0;
  std::vector<uint64_t> keys;
  std::vector<float> grads;
  int64_t issue_us = 0;
  int64_t ack_us = 0;
  bool ok = false;
  std::string error;
};

// Forwards views to the client once it exists.
struct ViewSink {
  absl::Mutex mu;
  ps::KVClient* client ABSL_GUARDED_BY(mu) = nullptr;
};

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto log = ps::GetLogger("pusher");
  std::optional<ps::JobConfig> config =
      ps::StartNode(*log, absl::GetFlag(FLAGS_log_level), absl::GetFlag(FLAGS_config),
                    {{"scheduler", absl::GetFlag(FLAGS_scheduler)},
                     {"stop_file", absl::GetFlag(FLAGS_stop_file)},
                     {"ledger", absl::GetFlag(FLAGS_ledger)}});
  if (!config) return 2;
  auto table = ps::FindTable(*config, absl::GetFlag(FLAGS_table));
  if (!table.ok() || !(*table)->has_sparse() || (*table)->sparse().dim() != 1) {
    log->error("--table must name a sparse table of dim 1");
    return 2;
  }
  const uint32_t table_id = (*table)->id();

  auto sink = std::make_shared<ViewSink>();
  auto options =
      ps::SchedulerClient::Options::ForJob(*config, absl::GetFlag(FLAGS_scheduler), ps::WORKER);
  options.on_view = [sink](const ps::ClusterView& view, uint32_t) {
    absl::MutexLock lock(&sink->mu);
    if (sink->client != nullptr) sink->client->UpdateView(view);
  };
  auto member = ps::SchedulerClient::Connect(options);
  if (!member.ok()) {
    log->error("{}", member.status().message());
    return 1;
  }
  auto view = (*member)->WaitForRunning(
      absl::Milliseconds(config->cluster().startup_timeout_ms()));
  if (!view.ok()) {
    log->error("{}", view.status().message());
    return 1;
  }
  auto client = ps::KVClient::Create(
      {*config, (*member)->rank(), (*member)->node_id(), (*member)->start_clock()}, *view);
  if (!client.ok()) {
    log->error("{}", client.status().message());
    return 1;
  }
  {
    absl::MutexLock lock(&sink->mu);
    sink->client = client->get();
  }
  (*client)->UpdateView((*member)->view());

  // Keys by the server owning them at the start.
  const uint32_t num_slots = static_cast<uint32_t>(view->slot_owner_size());
  std::vector<std::vector<uint64_t>> groups(config->cluster().num_servers());
  for (uint64_t k = 0; k < absl::GetFlag(FLAGS_keys); ++k) {
    groups[view->slot_owner(ps::SparseSlot(table_id, k, num_slots))].push_back(k);
  }

  std::mt19937 rng(absl::GetFlag(FLAGS_seed));
  std::vector<std::unique_ptr<Push>> pushes;
  absl::Mutex mu;
  int in_flight = 0, acked = 0;  // guarded by mu
  const int max_in_flight = absl::GetFlag(FLAGS_inflight);
  const std::string stop_file = absl::GetFlag(FLAGS_stop_file);
  const std::string progress_file = absl::GetFlag(FLAGS_progress_file);
  bool progress_written = false;
  absl::Time next_stop_check = absl::InfinitePast();
  uint32_t next_group = 0;
  while (true) {
    const absl::Time now = absl::Now();
    if (now >= next_stop_check) {
      if (Exists(stop_file)) break;
      next_stop_check = now + absl::Milliseconds(5);
    }
    if (!progress_written && !progress_file.empty()) {
      absl::MutexLock lock(&mu);
      if (acked >= 100) {
        std::ofstream(progress_file) << acked << "\n";
        progress_written = true;
      }
    }
    {
      absl::MutexLock lock(&mu);
      auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return in_flight < max_in_flight;
      };
      if (!mu.AwaitWithTimeout(absl::Condition(&room), absl::Milliseconds(5))) continue;
      ++in_flight;
    }
    // Round-robin over the servers' groups.
    uint32_t group = next_group;
    for (size_t tries = 0; tries < groups.size() && groups[group].empty(); ++tries) {
      group = (group + 1) % groups.size();
    }
    next_group = (group + 1) % groups.size();
    auto push = std::make_unique<Push>();
    const bool mixed = absl::GetFlag(FLAGS_mixed);
    push->group = mixed ? static_cast<uint32_t>(groups.size()) : group;
    for (int i = 0; i < absl::GetFlag(FLAGS_batch); ++i) {
      push->keys.push_back(mixed ? rng() % absl::GetFlag(FLAGS_keys)
                                 : groups[group][rng() % groups[group].size()]);
      push->grads.push_back(static_cast<float>(static_cast<int>(rng() % 9) - 4));
    }
    push->issue_us = absl::ToUnixMicros(absl::Now());
    Push* p = push.get();
    pushes.push_back(std::move(push));
    (*client)->Push(table_id, p->keys, p->grads, [p, &mu, &in_flight, &acked](const absl::Status& s) {
      absl::MutexLock lock(&mu);
      p->ack_us = absl::ToUnixMicros(absl::Now());
      p->ok = s.ok();
      if (!s.ok()) p->error = s.ToString();
      --in_flight;
      if (s.ok()) ++acked;
    });
    const int clock_every = absl::GetFlag(FLAGS_clock_every);
    if (clock_every > 0 && pushes.size() % clock_every == 0) {
      // The step ends after the pushes sent before (each server keeps its
      // connection's order). Not waited for: one refused while a dead
      // server's slots move is overtaken by the next.
      (*client)->AdvanceClock();
      // The scheduler takes checkpoints at the clocks workers report.
      (*member)->set_clock((*client)->clock());
    }
  }
  {
    absl::MutexLock lock(&mu);
    auto drained = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return in_flight == 0; };
    mu.Await(absl::Condition(&drained));
  }

  std::vector<double> sums(absl::GetFlag(FLAGS_keys), 0);
  int failed = 0;
  std::ofstream ledger(absl::GetFlag(FLAGS_ledger));
  for (const auto& p : pushes) {
    if (!p->ok) {
      if (++failed <= 5) log->error("push failed: {}", p->error);
      continue;
    }
    for (size_t i = 0; i < p->keys.size(); ++i) sums[p->keys[i]] += p->grads[i];
    ledger << "ack " << p->group << " " << p->issue_us << " " << p->ack_us << "\n";
  }
  for (size_t k = 0; k < sums.size(); ++k) ledger << "sum " << k << " " << sums[k] << "\n";
  ledger << "failed " << failed << "\n";
  ledger.close();
  std::printf("{\"pushes\":%zu,\"failed\":%d}\n", pushes.size(), failed);
  {
    absl::MutexLock lock(&sink->mu);
    sink->client = nullptr;
  }
  client->reset();
  // Not finished: the rank is free again for the tool that reads the result.
  if (absl::Status s = (*member)->Leave(false); !s.ok()) log->warn("{}", s.message());
  return failed == 0 ? 0 : 1;
}
