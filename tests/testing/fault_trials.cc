#include "tests/testing/fault_trials.h"

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace ps::testing {

int64_t Setting(int64_t flag, const char* env, int64_t fallback) {
  if (flag >= 0) return flag;
  int64_t v;
  if (const char* s = std::getenv(env); s != nullptr && absl::SimpleAtoi(s, &v))
    return v;
  return fallback;
}

uint64_t SeedSetting(int64_t flag, const char* env) {
  int64_t s = Setting(flag, env, 1);
  if (s == 0) s = absl::ToUnixMicros(absl::Now()) & 0x7fffffff;
  return static_cast<uint64_t>(s);
}

bool Sanitizer() {
  const char* s = std::getenv("PS_SANITIZER");
  return s != nullptr && std::string_view(s) == "1";
}

std::mt19937_64 TrialRng(uint64_t seed, const std::vector<uint32_t>& words) {
  std::vector<uint32_t> all = {static_cast<uint32_t>(seed),
                               static_cast<uint32_t>(seed >> 32)};
  all.insert(all.end(), words.begin(), words.end());
  std::seed_seq seq(all.begin(), all.end());
  return std::mt19937_64(seq);
}

std::string JobHead(const std::string& name, int servers, int workers,
                    int slots, int heartbeat_timeout_ms,
                    const std::string& more_cluster) {
  return absl::StrCat(
      "name: \"", name, "\"\ncluster {\n  num_servers: ", servers,
      "\n  num_workers: ", workers, "\n  num_slots: ", slots,
      "\n  heartbeat_interval_ms: 100\n  heartbeat_timeout_ms: ",
      heartbeat_timeout_ms, "\n  ", more_cluster, "\n}\n");
}

std::string CtrJobConfig(const std::string& head,
                         const std::string& consistency, int num_train,
                         const std::string& more) {
  return absl::StrCat(
      head, "consistency { ", consistency, " }\n", R"pb(
        tables {
          id: 0
          name: "w"
          sparse { dim: 1 }
          optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
        }
        tables {
          id: 1
          name: "d"
          dense { size: 14 }
          optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
        }
        data { synthetic_ctr { num_train:)pb",
      num_train, R"pb(                                             num_test: 20000 seed: 1 }
                                                                   }
    training {
      batch_size: 256 epochs: 2 log_interval_s: 1
      sparse_table: "w" dense_table: "d"
    }
  )pb",
      more, "\n");
}

std::string LedgerJobConfig(const std::string& head,
                            const std::string& sparse) {
  // Spaces around `sparse` are in the strings, where clang-format keeps
  // them.
  return absl::StrCat(head, "tables { id: 0 name: \"sgd\" sparse { dim: 1 ",
                      sparse,
                      " } optimizer { sgd { learning_rate: 1 } } "
                      "init { kind: ZEROS } }\n");
}

namespace {

// The sum of the first capture of `re` over `text`, each match's captures
// weighted by `weights` (capture k + 1 times weights[k]).
uint64_t SumOfMatches(const std::string& text, const std::regex& re,
                      const std::vector<uint64_t>& weights) {
  uint64_t total = 0;
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end;
       ++it) {
    for (size_t k = 0; k < weights.size(); ++k) {
      total += std::stoull((*it)[k + 1].str()) * weights[k];
    }
  }
  return total;
}

}  // namespace

uint64_t ExamplesTrainedIn(const std::string& log) {
  static const std::regex kTrained("trained ([0-9]+) examples");
  return SumOfMatches(log, kTrained, {1});
}

uint64_t WorkersTrained(JobHarness& job) {
  uint64_t total = 0;
  for (int i = 0; i < job.num_worker_processes(); ++i) {
    total += ExamplesTrainedIn(ReadFile(job.worker(i).stderr_path()));
  }
  return total;
}

uint64_t ExamplesTrainedWithOrphans(JobHarness& job,
                                    uint64_t shard_epoch_examples,
                                    uint64_t batch) {
  static const std::regex kOrphaned(
      "shard [0-9]+ orphaned at epoch ([0-9]+) batch ([0-9]+)");
  return WorkersTrained(job) +
         SumOfMatches(ReadFile(job.dir() + "/scheduler.log"), kOrphaned,
                      {shard_epoch_examples, batch});
}

std::vector<std::string> LinesWith(const std::string& text,
                                   const std::string& needle) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StrContains(line, needle)) lines.emplace_back(line);
  }
  return lines;
}

std::string LineWith(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  if (at == std::string::npos) return "";
  const size_t begin = text.rfind('\n', at) + 1;
  return text.substr(begin, text.find('\n', at) - begin);
}

std::string SchedulerLogs(const JobHarness& job) {
  std::string all = ReadFile(job.dir() + "/scheduler.log");
  for (int n = 1; n <= job.scheduler_restarts(); ++n) {
    absl::StrAppend(
        &all, ReadFile(absl::StrCat(job.dir(), "/scheduler.", n, ".log")));
  }
  return all;
}

std::string DeclaredDeadLine(const JobHarness& job, uint64_t id) {
  return LineWith(SchedulerLogs(job),
                  absl::StrCat("(node ", id, ") declared dead"));
}

std::optional<uint32_t> WaitForServerRank(JobHarness& job, int i,
                                          absl::Duration timeout) {
  static const std::regex kRank("registered as server ([0-9]+)");
  const absl::Time give_up = absl::Now() + Scaled(timeout);
  while (absl::Now() < give_up) {
    const std::string log = ReadFile(job.server(i).stderr_path());
    std::smatch m;
    if (std::regex_search(log, m, kRank))
      return static_cast<uint32_t>(std::stoul(m[1].str()));
    if (!job.server(i).running()) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return std::nullopt;
}

absl::StatusOr<int> WorkerWithRank(JobHarness& job, int workers, uint32_t rank,
                                   absl::Duration timeout) {
  int found = -1;
  for (int i = 0; i < workers; ++i) {
    absl::StatusOr<uint32_t> r = job.WaitForRegistration(i, timeout);
    if (!r.ok()) return r.status();
    if (*r == rank) found = i;
  }
  if (found < 0)
    return absl::NotFoundError(absl::StrCat("no worker got rank ", rank));
  return found;
}

std::string StallOrFail(const absl::Status& status, const std::string& what,
                        const JobHarness& job) {
  if (absl::IsAborted(status)) return std::string(status.message());
  ADD_FAILURE() << what << ": " << status << "\n" << job.LogTails(40);
  return "";
}

bool ExpectSchedulerAndServersExitedZero(const JobHarness::Result& result,
                                         const std::string& what,
                                         int skip_server) {
  bool ok = true;
  if (result.scheduler != 0) {
    ok = false;
    ADD_FAILURE() << what << ": the scheduler exited with " << result.scheduler;
  }
  for (size_t i = 0; i < result.servers.size(); ++i) {
    if (static_cast<int>(i) != skip_server && result.servers[i] != 0) {
      ok = false;
      ADD_FAILURE() << what << ": " << JobHarness::ServerName(i)
                    << " exited with " << result.servers[i];
    }
  }
  return ok;
}

bool ExpectOneSummary(const JobHarness::Result& result,
                      const std::string& what) {
  if (result.summaries == 1) return true;
  ADD_FAILURE() << what << ": " << result.summaries
                << " workers printed a summary, expected 1";
  return false;
}

std::optional<Outcome> CheckedOutcome(const JobHarness& job,
                                      const JobHarness::Result& result, bool ok,
                                      const std::string& what,
                                      uint64_t examples) {
  Outcome out;
  out.summary = result.summary;
  out.elapsed = result.elapsed;
  out.auc = JsonNumber(result.summary, "test_auc").value_or(NAN);
  out.steps = static_cast<uint64_t>(
      JsonNumber(result.summary, "rank0_steps").value_or(0));
  out.examples = examples;
  if (!std::isfinite(out.auc)) {
    ok = false;
    ADD_FAILURE() << what << ": no test_auc in the summary '" << result.summary
                  << "'";
  }
  if (!ok) {
    ADD_FAILURE() << what << ": logs of " << job.dir() << "\n"
                  << job.LogTails(40);
    return std::nullopt;
  }
  return out;
}

void PrintStall(const std::string& stall, bool again) {
  std::printf(
      "  STALLED, a node the test did not disturb was declared dead: %s%s\n",
      stall.c_str(), again ? "; running it again" : "");
  std::fflush(stdout);
}

void FailStalledTwice(const std::string& what, const std::string& stall,
                      int heartbeat_timeout_ms, const std::string& hint) {
  ADD_FAILURE() << what << ": stalled again (" << stall
                << "): the machine is too busy for a heartbeat timeout of "
                << heartbeat_timeout_ms << " ms" << (hint.empty() ? "" : " ")
                << hint;
}

int RunAllTestsTimed(const char* name) {
  const absl::Time start = absl::Now();
  const int status = RUN_ALL_TESTS();
  std::printf("%s: %.1f s in all\n", name,
              absl::ToDoubleSeconds(absl::Now() - start));
  return status;
}

}  // namespace ps::testing
