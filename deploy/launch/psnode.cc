// psnode: starts this machine's node of a job from the cluster manager's
// environment, so the same container command serves every replica.
//
//   psnode --config=JOB.pbtxt [--launch_from=auto|tf_config|dmlc]
//          [--bin_dir=DIR] [--listen_host=0.0.0.0] [--advertise_host=HOST]
//          [--print] [-- EXTRA_ARGS...]
//
// Reads TF_CONFIG (Kubeflow TFJob) or DMLC_* (ps-lite / MXNet launchers),
// decides the role (deploy/launch/launch_env.h has the exact rules) and execs
// scheduler_main, server_main or trainer (or the config's
// launch.worker_command, and for a TFJob evaluator task its
// launch.evaluator_command, found on PATH, with PS_CONFIG, PS_SCHEDULER,
// PS_NUM_SERVERS, PS_NUM_WORKERS and PS_ROLE set, and for a worker
// PS_RING_HOST unless already set) with the matching flags (a trainer also
// gets --ring_host: the advertised host, where the other workers reach its
// dense all-reduce ring), the
// cluster sizes from the environment (--num_servers/--num_workers override
// the config's) and EXTRA_ARGS appended. A worker command gets --config,
// --scheduler and EXTRA_ARGS, nothing else (deploy/README.md, "The worker
// command"). The rest of psnode's environment passes through, among it
// PS_SUMMARY_OUT: the file the evaluating worker writes the job's summary
// to, when the cluster manager sets it. --print writes the command (shell-
// quoted, one line) to stdout instead of running it.
//
// Binaries are looked up as DIR/NAME and DIR/PACKAGE/NAME (an install
// directory or bazel-bin), DIR being --bin_dir, else psnode's own directory
// and then the bazel-bin root above it.
//
// PS_LAUNCH_ID, when set, is the scheduler's --launch_id: a scheduler
// restarted within the launch takes its journal back, one of a new launch
// never does (deploy/README.md). A command starting with "python3" runs
// $PS_PYTHON, else the first of PATH's python3 and /usr/bin/python3 that
// imports what its script imports of NumPy and PyTorch (as
// deploy/choose_python.sh picks for the demo); psnode installs nothing.
//
// Exit status: 2 for a usage or environment error (the message says which
// variable), 1 when the binary cannot be found or exec'd, or no python3 can
// run the job's Python command (one line naming each and the fix);
// otherwise the exec'd node's own.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/config.h"
#include "deploy/launch/launch_env.h"
#include "deploy/launch/python_check.h"

ABSL_FLAG(std::string, config, "", "Job config file (textproto). Required.");
ABSL_FLAG(std::string, launch_from, "auto",
          "Which environment to read: auto (exactly one of TF_CONFIG and "
          "DMLC_ROLE must be set), tf_config or dmlc.");
ABSL_FLAG(std::string, bin_dir, "",
          "Where scheduler_main, server_main and trainer are (DIR/NAME or "
          "DIR/PACKAGE/NAME); default: beside psnode, then the bazel-bin root.");
ABSL_FLAG(std::string, listen_host, "0.0.0.0",
          "Address the scheduler and servers listen on.");
ABSL_FLAG(std::string, advertise_host, "",
          "Host a server advertises when the environment gives none "
          "(DMLC without DMLC_NODE_HOST); default: this machine's host name.");
ABSL_FLAG(bool, print, false,
          "Print the resolved command instead of running it.");

namespace {

constexpr char kUsage[] =
    "usage: psnode --config=JOB.pbtxt [--launch_from=auto|tf_config|dmlc] "
    "[--bin_dir=DIR] [--listen_host=HOST] [--advertise_host=HOST] [--print] "
    "[-- EXTRA_ARGS...]";

int UsageError(const std::string& message) {
  std::cerr << "psnode: " << message << "\n" << kUsage << "\n";
  return 2;
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  return Dirname(std::string(buf, n));
}

// The first executable candidate for `name` of Bazel package `package`;
// "" if none, with the places looked at in `looked`.
std::string FindBinary(const std::string& name, const std::string& package,
                       const std::vector<std::string>& dirs,
                       std::vector<std::string>* looked) {
  for (const std::string& dir : dirs) {
    for (const std::string& path :
         {absl::StrCat(dir, "/", name), absl::StrCat(dir, "/", package, "/", name)}) {
      if (access(path.c_str(), X_OK) == 0) return path;
      looked->push_back(path);
    }
  }
  return "";
}

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

// Single-quoted for a POSIX shell when it has anything but safe characters
// (not `*`: a bind address like tcp://0.0.0.0:* would glob).
std::string ShellQuote(const std::string& arg) {
  if (!arg.empty() &&
      arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                            "0123456789-_=./:,@+") == std::string::npos) {
    return arg;
  }
  std::string out = "'";
  for (char c : arg) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// For a job's own command whose first element is "python3": sets
// options->python to the interpreter that imports what its script needs
// (deploy/launch/python_check.h). False, with one line on stderr naming
// each interpreter and the fix, when none does; psnode installs nothing.
bool ChooseInterpreter(const std::vector<std::string>& own,
                       ps::LaunchCommandOptions* options) {
  if (own.empty() || own[0] != "python3") return true;
  const std::string script =
      own.size() > 1
          ? absl::StrReplaceAll(own[1], {{"{config_dir}", options->config_dir}})
          : std::string();
  const char* ps_python = std::getenv("PS_PYTHON");
  absl::StatusOr<ps::PythonChoice> choice =
      ps::ChoosePython(script, ps::PythonNeeds(script, ReadFile(script)),
                       ps_python == nullptr ? "" : ps_python,
                       ps::FindOnPath("python3"), ps::ProbePython);
  if (!choice.ok()) {
    std::cerr << "psnode: " << choice.status().message() << "\n";
    return false;
  }
  if (!choice->notes.empty()) {
    std::cerr << "psnode: " << choice->notes << ": the command runs "
              << choice->python << "\n";
  }
  options->python = choice->python;
  return true;
}

// The scheduler of a launch without an id would take back the journal of
// an earlier launch of the same config (one killed within the unreachable
// timeout) as its own.
void WarnWithoutLaunchId(const ps::LaunchPlan& plan) {
  if (plan.role != ps::LaunchRole::kScheduler || !plan.launch_id.empty())
    return;
  std::cerr << "psnode: no PS_LAUNCH_ID in the environment: this scheduler "
               "may resume the journal of an earlier launch of the same "
               "config; set PS_LAUNCH_ID to an id per launch (Kubernetes: the "
               "pod's metadata.uid through the downward API)\n";
}

// Prints the command (--print) or execs it, setting the launch variables.
int PrintOrExec(std::vector<std::string> command, const ps::LaunchPlan& plan,
                const ps::LaunchCommandOptions& options, bool own_command) {
  if (absl::GetFlag(FLAGS_print)) {
    std::vector<std::string> quoted;
    for (const std::string& arg : command) quoted.push_back(ShellQuote(arg));
    std::cout << absl::StrJoin(quoted, " ") << std::endl;
    return 0;
  }
  for (const auto& [variable, value] : ps::LaunchEnvironment(plan, options)) {
    // An address the operator gave the ring (e.g. a Kubernetes pod's IP)
    // wins over the node's advertised name.
    const bool keep =
        variable == "PS_RING_HOST" && std::getenv(variable.c_str()) != nullptr;
    setenv(variable.c_str(), value.c_str(), keep ? 0 : 1);
  }
  std::vector<char*> exec_argv;
  for (std::string& arg : command) exec_argv.push_back(arg.data());
  exec_argv.push_back(nullptr);
  std::cerr.flush();
  // The job's own command is found on PATH, like a shell would.
  if (own_command) {
    execvp(exec_argv[0], exec_argv.data());
  } else {
    execv(exec_argv[0], exec_argv.data());
  }
  std::cerr << "psnode: cannot exec " << exec_argv[0] << ": "
            << std::strerror(errno) << "\n";
  return 1;
}

}  // namespace

extern char** environ;

int main(int argc, char** argv) {
  // Everything after "--" passes through untouched.
  int flag_argc = argc;
  std::vector<std::string> extra;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      flag_argc = i;
      for (int j = i + 1; j < argc; ++j) extra.emplace_back(argv[j]);
      break;
    }
  }
  const std::vector<char*> positional = absl::ParseCommandLine(flag_argc, argv);
  if (positional.size() > 1) {
    return UsageError(absl::StrCat("unexpected argument '", positional[1],
                                   "' (extra arguments go after --)"));
  }
  if (absl::GetFlag(FLAGS_config).empty()) return UsageError("--config is required");
  auto source = ps::ParseLaunchSource(absl::GetFlag(FLAGS_launch_from));
  if (!source.ok()) return UsageError(std::string(source.status().message()));

  ps::Environment env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) env[std::string(*e, eq - *e)] = std::string(eq + 1);
  }
  auto plan = ps::PlanLaunch(env, *source);
  if (!plan.ok()) return UsageError(std::string(plan.status().message()));

  std::vector<std::string> dirs;
  if (const std::string bin_dir = absl::GetFlag(FLAGS_bin_dir); !bin_dir.empty()) {
    dirs.push_back(bin_dir);
  } else {
    const std::string self = SelfDir();
    dirs = {self, Dirname(Dirname(self))};  // installed together; bazel-bin/deploy/launch
  }
  const char* name = plan->role == ps::LaunchRole::kScheduler ? "scheduler_main"
                     : plan->role == ps::LaunchRole::kServer  ? "server_main"
                                                              : "trainer";
  const char* package = plan->role == ps::LaunchRole::kScheduler ? "scheduler"
                        : plan->role == ps::LaunchRole::kServer  ? "server"
                                                                 : "worker";
  // The job's own worker or evaluator command, if its config names one.
  absl::StatusOr<ps::JobConfig> config = ps::LoadJobConfig(absl::GetFlag(FLAGS_config));
  if (!config.ok()) return UsageError(std::string(config.status().message()));
  ps::LaunchCommandOptions options;
  options.worker_command.assign(config->launch().worker_command().begin(),
                                config->launch().worker_command().end());
  options.evaluator_command.assign(config->launch().evaluator_command().begin(),
                                   config->launch().evaluator_command().end());
  options.config_dir = Dirname(absl::GetFlag(FLAGS_config));
  const bool own_command = (plan->role == ps::LaunchRole::kWorker &&
                            !options.worker_command.empty()) ||
                           plan->role == ps::LaunchRole::kEvaluator;
  if (own_command && !ChooseInterpreter(plan->role == ps::LaunchRole::kWorker
                                            ? options.worker_command
                                            : options.evaluator_command,
                                        &options)) {
    return 1;
  }
  std::vector<std::string> looked;
  const std::string binary =
      own_command ? std::string("-") : FindBinary(name, package, dirs, &looked);
  if (binary.empty()) {
    std::cerr << "psnode: cannot find " << name << " (looked at "
              << absl::StrJoin(looked, ", ") << "); pass --bin_dir\n";
    return 1;
  }
  options.scheduler_binary = options.server_binary = options.trainer_binary = binary;
  options.config = absl::GetFlag(FLAGS_config);
  options.listen_host = absl::GetFlag(FLAGS_listen_host);
  options.default_advertise_host = absl::GetFlag(FLAGS_advertise_host);
  if (options.default_advertise_host.empty()) options.default_advertise_host = HostName();
  options.extra_args = extra;
  auto command = ps::LaunchCommand(*plan, options);
  if (!command.ok()) return UsageError(std::string(command.status().message()));

  std::cerr << "psnode: " << ps::DescribeLaunchPlan(*plan) << "\n";
  WarnWithoutLaunchId(*plan);
  return PrintOrExec(std::move(*command), *plan, options, own_command);
}
