#include "tests/testing/ledger.h"

#include <cstdio>
#include <fstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ps::testing {
namespace {

// `argv` behind the options' prefix for the process `name`.
std::vector<std::string> Wrapped(const LedgerPushers::Options& o, const std::string& name,
                                 std::vector<std::string> argv) {
  if (!o.wrap) return argv;
  std::vector<std::string> wrapped = o.wrap(name);
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return wrapped;
}

}  // namespace

LedgerPushers::Options LedgerPushers::ForJob(const JobHarness& job,
                                             uint64_t seed) {
  Options o;
  o.dir = job.dir();
  o.config_path = job.dir() + "/job.pbtxt";
  o.scheduler_address = job.address();
  o.seed = seed;
  return o;
}

absl::StatusOr<LedgerPushers> LedgerPushers::Start(Options options,
                                                   absl::Duration timeout) {
  LedgerPushers p;
  p.options_ = std::move(options);
  const Options& o = p.options_;
  std::remove((o.dir + "/stop").c_str());
  for (int i = 0; i < o.pushers; ++i) {
    std::remove(absl::StrCat(o.dir, "/progress", i).c_str());
    auto pusher = Subprocess::Start(
        Wrapped(
            o, absl::StrCat("pusher", i),
            {Runfile(o.pusher_binary), "--config=" + o.config_path,
             "--scheduler=" + o.scheduler_address, "--table=" + o.table,
             absl::StrCat("--keys=", o.keys),
             absl::StrCat("--seed=", static_cast<uint32_t>(o.seed * 10 + i)),
             "--stop_file=" + o.dir + "/stop",
             absl::StrCat("--progress_file=", o.dir, "/progress", i),
             absl::StrCat("--ledger=", o.dir, "/ledger", i),
             absl::StrCat("--mixed=", o.mixed ? "true" : "false"),
             absl::StrCat("--clock_every=", o.clock_every)}),
        absl::StrCat(o.dir, "/pusher", i, ".out"),
        absl::StrCat(o.dir, "/pusher", i, ".log"));
    if (!pusher.ok()) return pusher.status();
    p.pushers_.push_back(*std::move(pusher));
  }
  for (int i = 0; i < o.pushers; ++i) {
    auto progress = WaitForFile(absl::StrCat(o.dir, "/progress", i), timeout);
    if (!progress.ok()) {
      return absl::DeadlineExceededError(
          absl::StrCat("pusher ", i, " had no 100 pushes acknowledged in time:\n",
                       ReadFile(p.pushers_[i].stderr_path())));
    }
  }
  return p;
}

LedgerPushers::Verdict LedgerPushers::StopAndVerify() {
  Verdict v;
  const Options& o = options_;
  auto problem = [&](std::string what) { v.problems.push_back(std::move(what)); };
  std::ofstream(o.dir + "/stop") << "stop\n";
  std::vector<double> sums(o.keys, 0);
  for (int i = 0; i < o.pushers; ++i) {
    auto code = pushers_[i].Wait(absl::Seconds(120));
    if (!code.ok() || *code != 0) {
      problem(absl::StrCat("pusher ", i, " exited with ",
                           code.ok() ? absl::StrCat(*code) : code.status().ToString(), ":\n",
                           ReadFile(pushers_[i].stderr_path())));
      return v;
    }
    std::ifstream ledger(absl::StrCat(o.dir, "/ledger", i));
    std::string kind;
    while (ledger >> kind) {
      if (kind == "sum") {
        uint64_t key;
        double sum;
        ledger >> key >> sum;
        if (key >= sums.size()) {
          problem(absl::StrCat("ledger ", i, " names key ", key));
          return v;
        }
        sums[key] += sum;
      } else if (kind == "ack") {
        Ack a;
        ledger >> a.group >> a.issue_us >> a.ack_us;
        ++v.acknowledged;
        v.acks.push_back(a);
      } else if (kind == "failed") {
        int failed;
        ledger >> failed;
        if (failed != 0) problem(absl::StrCat("pusher ", i, " had ", failed, " pushes fail"));
      }
    }
  }
  // Read everything back through a fresh worker, which leaves as finished:
  // the job ends.
  auto reader = Subprocess::Start(
      Wrapped(o, "reader",
              {Runfile(o.reader_binary), "--config=" + o.config_path,
               "--scheduler=" + o.scheduler_address, "--table=" + o.table, "--op=pull",
               absl::StrCat("--keys=0-", o.keys - 1), "--finish"}),
      o.dir + "/reader.out", o.dir + "/reader.log");
  if (!reader.ok()) {
    problem(reader.status().ToString());
    return v;
  }
  auto code = reader->Wait(absl::Seconds(60));
  if (!code.ok() || *code != 0) {
    problem(absl::StrCat("reader failed (",
                         code.ok() ? absl::StrCat("exit ", *code) : code.status().ToString(),
                         "):\n", ReadFile(reader->stderr_path())));
    return v;
  }
  std::vector<float> values;
  const std::string printed = ReadFile(reader->stdout_path());
  for (absl::string_view part :
       absl::StrSplit(absl::StripAsciiWhitespace(printed), ' ', absl::SkipEmpty())) {
    float value;
    if (!absl::SimpleAtof(part, &value)) {
      problem(absl::StrCat("reader printed '", part, "'"));
      return v;
    }
    values.push_back(value);
  }
  if (values.size() != static_cast<size_t>(o.keys)) {
    problem(absl::StrCat("reader printed ", values.size(), " values, want ", o.keys));
    return v;
  }
  int wrong = 0;
  for (int k = 0; k < o.keys; ++k) {
    if (values[k] != static_cast<float>(-sums[k]) && ++wrong <= 10) {
      problem(absl::StrCat("key ", k, " holds ", values[k],
                           "; its acknowledged pushes sum to ", -sums[k]));
    }
  }
  if (wrong > 0) {
    problem(absl::StrCat(wrong, " keys hold something else than minus the sum of their "
                         "acknowledged pushes"));
  }
  return v;
}

absl::Status LedgerPushers::Stop() {
  std::ofstream(options_.dir + "/stop") << "stop\n";
  for (size_t i = 0; i < pushers_.size(); ++i) {
    auto code = pushers_[i].Wait(absl::Seconds(120));
    if (!code.ok() || *code != 0) {
      return absl::InternalError(absl::StrCat(
          "pusher ", i, " exited with ",
          code.ok() ? absl::StrCat(*code) : code.status().ToString(), ":\n",
          ReadFile(pushers_[i].stderr_path())));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> LedgerSums(const std::string& dir,
                                               int pushers, int keys) {
  std::vector<double> sums(keys, 0);
  for (int i = 0; i < pushers; ++i) {
    const std::string path = absl::StrCat(dir, "/ledger", i);
    std::ifstream ledger(path);
    if (!ledger) return absl::NotFoundError(absl::StrCat("no ledger ", path));
    std::string kind;
    while (ledger >> kind) {
      if (kind != "sum") continue;
      uint64_t key = 0;
      double sum = 0;
      if (!(ledger >> key >> sum) || key >= sums.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, " has a bad sum line (key ", key, ")"));
      }
      sums[key] += sum;
    }
  }
  return sums;
}

}  // namespace ps::testing
