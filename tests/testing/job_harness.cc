#include "tests/testing/job_harness.h"

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <regex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/grpc_security.h"
#include "common/protocol.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace ps::testing {
namespace {

// Polling period of every wait: short next to the jobs' heartbeat interval.
constexpr absl::Duration kPoll = absl::Milliseconds(10);

#define PS_HARNESS_RETURN_IF_ERROR(expr)      \
  do {                                        \
    if (absl::Status s_ = (expr); !s_.ok()) { \
      return s_;                              \
    }                                         \
  } while (false)

}  // namespace

JobHarness::JobHarness(Options options) : options_(std::move(options)) {}

JobHarness::~JobHarness() = default;  // Subprocess kills what still runs

std::string JobHarness::WorkerName(int i) { return absl::StrCat("worker", i); }

absl::StatusOr<std::unique_ptr<JobHarness>> JobHarness::Start(Options options) {
  std::unique_ptr<JobHarness> job(new JobHarness(std::move(options)));
  const std::string& dir = job->options_.dir;
  mkdir(dir.c_str(), 0755);
  job->config_path_ = dir + "/job.pbtxt";
  {
    std::ofstream out(job->config_path_);
    out << job->options_.config;
    if (!out) return absl::InternalError("cannot write " + job->config_path_);
  }
  std::remove((dir + "/summary.json").c_str());
  job->started_ = absl::Now();
  PS_HARNESS_RETURN_IF_ERROR(job->LaunchScheduler(0, 0));
  // The harness reaches the scheduler as the job's processes do: with the
  // config's TLS files when it has them.
  JobConfig config;
  google::protobuf::TextFormat::ParseFromString(job->options_.config, &config);
  auto creds = MakeChannelCredentials(config.security().tls());
  if (!creds.ok()) return creds.status();
  job->stub_ = Scheduler::NewStub(grpc::CreateChannel(job->address_, *creds));
  for (int i = 0; i < job->options_.num_servers; ++i) {
    auto server = job->StartServer();
    if (!server.ok()) return server.status();
  }
  for (int i = 0; i < job->options_.num_workers; ++i) {
    auto worker = job->StartWorker();
    if (!worker.ok()) return worker.status();
  }
  return job;
}

absl::StatusOr<Subprocess> JobHarness::Launch(const std::string& name,
                                              const std::string& file_prefix,
                                              const std::string& binary,
                                              std::vector<std::string> args) {
  std::vector<std::string> argv;
  if (options_.wrap) argv = options_.wrap(name);
  argv.push_back(Runfile(binary));
  for (std::string& a : args) argv.push_back(std::move(a));
  if (options_.extra_args) {
    for (std::string& a : options_.extra_args(name))
      argv.push_back(std::move(a));
  }
  const std::string prefix = absl::StrCat(options_.dir, "/", file_prefix);
  return Subprocess::Start(argv, prefix + ".out", prefix + ".log");
}

absl::Status JobHarness::LaunchScheduler(int n, int port) {
  const std::string name = n == 0 ? "scheduler" : absl::StrCat("scheduler.", n);
  const std::string port_file = absl::StrCat(options_.dir, "/", name, ".port");
  const std::string shared_port_file = options_.dir + "/scheduler.port";
  const absl::Time deadline = absl::Now() + Scaled(options_.startup_timeout);
  // A restart may find the port still held a moment after the old
  // process died (its socket closing): it then exits, and is tried again.
  while (true) {
    std::remove(port_file.c_str());
    auto scheduler = Launch(
        "scheduler", name, options_.scheduler_binary,
        {"--config=" + config_path_, "--port_file=" + port_file,
         "--host=" + options_.scheduler_host, absl::StrCat("--port=", port),
         // This job's own state directory: a job of an earlier test case
         // (same job name, killed unfinished) is not taken back.
         "--state_dir=" + options_.dir + "/scheduler-state"});
    if (!scheduler.ok()) return scheduler.status();
    Subprocess& p = schedulers_.emplace_back(*std::move(scheduler));
    while (ReadFile(port_file).empty() && p.running() &&
           absl::Now() < deadline) {
      absl::SleepFor(kPoll);
    }
    const std::string text = ReadFile(port_file);
    if (!text.empty()) {
      int bound = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &bound)) {
        return absl::InternalError("bad port file: " + text);
      }
      port_ = bound;
      address_ = absl::StrCat(options_.scheduler_host, ":", port_);
      if (n == 0) {
        std::ofstream(shared_port_file) << port_ << "\n";
      }
      return absl::OkStatus();
    }
    if (p.running() || n == 0 || absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(name, " wrote no port: ", ReadFile(p.stderr_path())));
    }
    // It exited (the bind failed): this try's files are overwritten by the
    // next one; the dead process stays in schedulers_ with the others.
    absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::Status JobHarness::RestartScheduler() {
  if (schedulers_.back().running()) {
    return absl::FailedPreconditionError("the scheduler still runs");
  }
  return LaunchScheduler(static_cast<int>(schedulers_.size()), port_);
}

std::string JobHarness::ServerName(int i) { return absl::StrCat("server", i); }

absl::StatusOr<int> JobHarness::StartServer() {
  const int i = static_cast<int>(servers_.size());
  auto server = Launch(ServerName(i), ServerName(i), options_.server_binary,
                       {"--config=" + config_path_, "--scheduler=" + address_});
  if (!server.ok()) return server.status();
  servers_.push_back(*std::move(server));
  return i;
}

absl::StatusOr<int> JobHarness::StartWorker() {
  const int i = static_cast<int>(workers_.size());
  std::vector<std::string> args = {
      "--config=" + config_path_, "--scheduler=" + address_,
      "--summary_out=" + options_.dir + "/summary.json"};
  for (const std::string& a : options_.worker_args) args.push_back(a);
  auto worker = Launch(WorkerName(i), WorkerName(i), options_.worker_binary,
                       std::move(args));
  if (!worker.ok()) return worker.status();
  workers_.push_back(*std::move(worker));
  return i;
}

bool JobHarness::SignalServer(int i, int sig) {
  if (!servers_[i].running()) return false;
  signalled_ = true;
  servers_[i].Signal(sig);
  return true;
}

bool JobHarness::SignalScheduler(int sig) {
  if (!schedulers_.back().running()) return false;
  signalled_ = true;
  schedulers_.back().Signal(sig);
  return true;
}

absl::StatusOr<Subprocess> JobHarness::StartPsctl(
    std::vector<std::string> args, absl::Duration psctl_timeout) {
  args.insert(args.begin(),
              {Runfile("scheduler/psctl"), "--scheduler=" + address_,
               absl::StrCat("--timeout_ms=",
                            absl::ToInt64Milliseconds(psctl_timeout))});
  const std::string name = absl::StrCat(dir(), "/psctl", ++psctl_runs_);
  return Subprocess::Start(args, name + ".out", name + ".err");
}

JobHarness::ToolRun JobHarness::RunPsctl(std::vector<std::string> args,
                                         absl::Duration psctl_timeout) {
  ToolRun run;
  auto p = StartPsctl(std::move(args), psctl_timeout);
  if (!p.ok()) {
    run.output = p.status().ToString();
    return run;
  }
  auto code = p->Wait((psctl_timeout + absl::Seconds(60)) * TimeoutScale());
  run.code = code.value_or(-1);
  run.output = ReadFile(p->stdout_path()) + ReadFile(p->stderr_path());
  return run;
}

absl::StatusOr<GetStatusResponse> JobHarness::Status() {
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + Scaled(absl::Seconds(2))));
  GetStatusResponse response;
  const grpc::Status status =
      stub_->GetStatus(&context, GetStatusRequest(), &response);
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("scheduler GetStatus: ", status.error_message()));
  }
  // After a signal the victim's own silence would count.
  if (!signalled_) {
    for (const WorkerClock& c : response.clocks()) {
      max_silent_ms_ = std::max<uint64_t>(max_silent_ms_, c.silent_ms());
    }
  }
  return response;
}

absl::StatusOr<std::optional<NodeInfo>> JobHarness::LiveNode(pid_t pid) {
  auto status = Status();
  if (!status.ok()) return status.status();
  for (const NodeInfo& node : status->view().nodes()) {
    if (node.role() == WORKER && node.pid() == static_cast<uint32_t>(pid) &&
        node.state() == ALIVE) {
      return std::optional<NodeInfo>(node);
    }
  }
  return std::optional<NodeInfo>();
}

absl::StatusOr<uint32_t> JobHarness::WaitForRegistration(
    int i, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + Scaled(timeout);
  while (true) {
    auto node = LiveNode(workers_[i].pid());
    if (node.ok() && node->has_value()) {
      if (node_ids_.size() <= static_cast<size_t>(i))
        node_ids_.resize(i + 1, 0);
      node_ids_[i] = (*node)->node_id();
      return (*node)->rank();
    }
    if (!workers_[i].running()) {
      return absl::FailedPreconditionError(
          absl::StrCat(WorkerName(i), " exited before it registered"));
    }
    PS_HARNESS_RETURN_IF_ERROR(CheckAbort());
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(WorkerName(i), " did not register in time"));
    }
    absl::SleepFor(kPoll);
  }
}

absl::StatusOr<uint64_t> JobHarness::WaitForStep(int i, uint64_t step,
                                                 absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + Scaled(timeout);
  while (true) {
    if (!workers_[i].running()) {
      return absl::FailedPreconditionError(
          absl::StrCat(WorkerName(i), " exited"));
    }
    auto status = Status();
    if (status.ok()) {
      std::optional<uint32_t> rank;
      for (const NodeInfo& node : status->view().nodes()) {
        if (node.role() == WORKER && node.state() == ALIVE &&
            node.pid() == static_cast<uint32_t>(workers_[i].pid())) {
          rank = node.rank();
        }
      }
      if (!rank.has_value()) {
        return absl::FailedPreconditionError(
            absl::StrCat(WorkerName(i), " is not a live member of the job"));
      }
      for (const WorkerClock& c : status->clocks()) {
        if (c.rank() == *rank &&
            (c.clock() >= step || c.clock() >= kFinishedClock)) {
          return c.clock();
        }
      }
    }
    PS_HARNESS_RETURN_IF_ERROR(CheckAbort());
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          WorkerName(i), " did not reach step ", step, " in time"));
    }
    absl::SleepFor(kPoll);
  }
}

bool JobHarness::Signal(int i, int sig) {
  if (!workers_[i].running()) return false;
  signalled_ = true;
  workers_[i].Signal(sig);
  return true;
}

absl::Status JobHarness::WaitUntilGone(int i, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + Scaled(timeout);
  while (true) {
    auto node = LiveNode(workers_[i].pid());
    if (node.ok() && !node->has_value()) return absl::OkStatus();
    if (!node.ok() && !schedulers_.back().running()) return absl::OkStatus();
    PS_HARNESS_RETURN_IF_ERROR(CheckAbort());
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the scheduler still counts ", WorkerName(i), " as alive"));
    }
    absl::SleepFor(kPoll);
  }
}

void JobHarness::SleepFor(absl::Duration d) {
  const absl::Time until = absl::Now() + d;
  while (true) {
    for (Subprocess& p : schedulers_) p.running();
    for (Subprocess& p : servers_) p.running();
    for (Subprocess& p : workers_) p.running();
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) return;
    absl::SleepFor(std::min(left, kPoll));
  }
}

absl::Status JobHarness::CheckAbort() {
  if (!abort_check_) return absl::OkStatus();
  // Reading logs is the usual check: not on every poll.
  const absl::Time now = absl::Now();
  if (now - last_abort_check_ < absl::Milliseconds(50)) return absl::OkStatus();
  last_abort_check_ = now;
  std::string reason = abort_check_();
  if (reason.empty()) return absl::OkStatus();
  return absl::AbortedError(reason);
}

absl::StatusOr<JobHarness::Result> JobHarness::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + Scaled(timeout);
  // Every process is polled, so a stop by the abort check is prompt.
  std::vector<std::pair<std::string, Subprocess*>> all;
  for (size_t i = 0; i < workers_.size(); ++i)
    all.emplace_back(WorkerName(i), &workers_[i]);
  for (size_t i = 0; i < servers_.size(); ++i) {
    all.emplace_back(ServerName(i), &servers_[i]);
  }
  for (size_t n = 0; n < schedulers_.size(); ++n) {
    all.emplace_back(n == 0 ? "scheduler" : absl::StrCat("scheduler.", n),
                     &schedulers_[n]);
  }
  while (true) {
    std::vector<std::string> running;
    for (auto& [name, p] : all) {
      if (p->running()) running.push_back(name);
    }
    if (running.empty()) break;
    PS_HARNESS_RETURN_IF_ERROR(CheckAbort());
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("job not over after ", absl::FormatDuration(timeout),
                       ": ", absl::StrJoin(running, ", "), " still running"));
    }
    absl::SleepFor(kPoll);
  }
  Result result;
  auto code = [](Subprocess& p) { return *p.Wait(absl::ZeroDuration()); };
  for (Subprocess& w : workers_) result.workers.push_back(code(w));
  for (Subprocess& s : servers_) result.servers.push_back(code(s));
  for (Subprocess& s : schedulers_) result.scheduler = code(s);
  result.elapsed = absl::Now() - started_;
  for (const Subprocess& w : workers_) {
    result.worker_summaries.emplace_back();
    for (absl::string_view line :
         absl::StrSplit(ReadFile(w.stdout_path()), '\n', absl::SkipEmpty())) {
      if (absl::StartsWith(line, "{") &&
          line.find("\"test_auc\"") != absl::string_view::npos) {
        ++result.summaries;
        result.summary = std::string(line);
        result.worker_summaries.back() = result.summary;
      }
    }
  }
  return result;
}

std::vector<uint64_t> JobHarness::DeclaredDead() const {
  // "worker rank 2 (node 5) declared dead: no heartbeat for 322ms"
  static const std::regex kDead("\\(node ([0-9]+)\\) declared dead");
  std::string log;
  for (const Subprocess& s : schedulers_) {
    // A retried restart's files were overwritten by the next try: once.
    if (&s != &schedulers_.front() &&
        s.stderr_path() == (&s - 1)->stderr_path())
      continue;
    log += ReadFile(s.stderr_path());
  }
  std::vector<uint64_t> ids;
  for (std::sregex_iterator it(log.begin(), log.end(), kDead), end; it != end;
       ++it) {
    ids.push_back(std::stoull((*it)[1].str()));
  }
  return ids;
}

std::string JobHarness::LogTails(int lines) const {
  std::vector<const Subprocess*> all;
  for (const Subprocess& s : schedulers_) {
    // A retried restart's files were overwritten by the next try: once.
    if (!all.empty() && all.back()->stderr_path() == s.stderr_path())
      all.pop_back();
    all.push_back(&s);
  }
  for (const Subprocess& s : servers_) all.push_back(&s);
  for (const Subprocess& w : workers_) all.push_back(&w);
  std::string out;
  for (const Subprocess* p : all) {
    for (const std::string& path : {p->stderr_path(), p->stdout_path()}) {
      std::vector<std::string> text =
          absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty());
      if (text.empty()) continue;
      const size_t from =
          text.size() > static_cast<size_t>(lines) ? text.size() - lines : 0;
      absl::StrAppend(&out, "---- ", path, " (pid ", p->pid(), ")",
                      from > 0 ? absl::StrCat(", last ", lines, " lines") : "",
                      "\n");
      for (size_t k = from; k < text.size(); ++k)
        absl::StrAppend(&out, text[k], "\n");
    }
  }
  return out;
}

std::string JsonRaw(const std::string& json, const std::string& field) {
  const std::string key = absl::StrCat("\"", field, "\":");
  const size_t at = json.find(key);
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size();
  size_t end = begin;
  if (end < json.size() && json[end] == '[') {
    end = json.find(']', begin);
    return end == std::string::npos ? "" : json.substr(begin, end + 1 - begin);
  }
  if (end < json.size() && json[end] == '"') {
    end = json.find('"', begin + 1);
    return end == std::string::npos ? ""
                                    : json.substr(begin + 1, end - begin - 1);
  }
  end = json.find_first_of(",}", begin);
  return end == std::string::npos ? "" : json.substr(begin, end - begin);
}

std::optional<double> JsonNumber(const std::string& json,
                                 const std::string& field) {
  double v;
  if (!absl::SimpleAtod(JsonRaw(json, field), &v)) return std::nullopt;
  return v;
}

}  // namespace ps::testing
