#include "deploy/launch/launch_env.h"

#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace ps {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(what);
}

const std::string* Find(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

struct HostPort {
  std::string host;
  int port = 0;
};

// "host:port" (the host may be a bracketed IPv6 address). `what` names the
// value in errors.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text,
                                       absl::string_view what) {
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return Bad(absl::StrCat(what, ": '", text, "' is not host:port"));
  }
  HostPort hp;
  hp.host = std::string(text.substr(0, colon));
  if (!absl::SimpleAtoi(text.substr(colon + 1), &hp.port) || hp.port < 1 ||
      hp.port > 65535) {
    return Bad(
        absl::StrCat(what, ": '", text,
                     "' has no valid port (1..65535 after the last ':')"));
  }
  return hp;
}

absl::StatusOr<int> ParsePort(const std::string& text, absl::string_view what) {
  int port = 0;
  if (!absl::SimpleAtoi(text, &port) || port < 1 || port > 65535) {
    return Bad(absl::StrCat(what, "='", text, "' is not a port (1..65535)"));
  }
  return port;
}

absl::StatusOr<int> ParseCount(const std::string& text,
                               absl::string_view what) {
  int n = 0;
  if (!absl::SimpleAtoi(text, &n) || n < 1 || n > 65536) {
    return Bad(absl::StrCat(what, "='", text, "' is not a count (1..65536)"));
  }
  return n;
}

// cluster[name] as a list of address strings; absent = empty.
absl::StatusOr<std::vector<std::string>> AddressList(const Struct& cluster,
                                                     const std::string& name) {
  std::vector<std::string> out;
  auto it = cluster.fields().find(name);
  if (it == cluster.fields().end()) return out;
  if (it->second.kind_case() != Value::kListValue) {
    return Bad(absl::StrCat("TF_CONFIG: cluster.", name,
                            " must be a list of \"host:port\" strings"));
  }
  const ListValue& list = it->second.list_value();
  for (int i = 0; i < list.values_size(); ++i) {
    if (list.values(i).kind_case() != Value::kStringValue) {
      return Bad(absl::StrCat("TF_CONFIG: cluster.", name, "[", i,
                              "] must be a \"host:port\" string"));
    }
    const std::string& addr = list.values(i).string_value();
    auto hp = ParseHostPort(
        addr, absl::StrCat("TF_CONFIG: cluster.", name, "[", i, "]"));
    if (!hp.ok()) return hp.status();
    out.push_back(addr);
  }
  return out;
}

// TF_CONFIG's "task": this pod's type and index.
struct TfTask {
  std::string type;
  int index = 0;
};

absl::StatusOr<TfTask> ParseTfTask(const Struct& root) {
  auto task_it = root.fields().find("task");
  if (task_it == root.fields().end() ||
      task_it->second.kind_case() != Value::kStructValue) {
    return Bad("TF_CONFIG: no \"task\" object (this pod's type and index)");
  }
  const Struct& task = task_it->second.struct_value();
  auto type_it = task.fields().find("type");
  if (type_it == task.fields().end() ||
      type_it->second.kind_case() != Value::kStringValue) {
    return Bad("TF_CONFIG: task.type must be a string");
  }
  TfTask out;
  out.type = type_it->second.string_value();
  auto index_it = task.fields().find("index");
  if (index_it != task.fields().end()) {
    const Value& v = index_it->second;
    if (v.kind_case() != Value::kNumberValue || v.number_value() < 0 ||
        v.number_value() != std::floor(v.number_value()) ||
        v.number_value() > 1e6) {
      return Bad("TF_CONFIG: task.index must be a whole number >= 0");
    }
    out.index = static_cast<int>(v.number_value());
  }
  return out;
}

// TF_CONFIG's "cluster": the addresses of each task type, checked to make
// a job (one scheduler task, named chief or master; at least one ps and
// one worker).
struct TfCluster {
  std::vector<std::string> schedulers;   // the chief's or the master's
  const char* scheduler_type = "chief";  // or "master"
  std::vector<std::string> ps;
  std::vector<std::string> workers;
  std::vector<std::string> evaluators;
};

absl::StatusOr<TfCluster> ParseTfCluster(const Struct& cluster) {
  for (const auto& [name, value] : cluster.fields()) {
    if (name != "chief" && name != "master" && name != "ps" &&
        name != "worker" && name != "evaluator") {
      return Bad(absl::StrCat("TF_CONFIG: unknown task type '", name,
                              "' in cluster (expected chief, ps, worker)"));
    }
  }
  TfCluster out;
  PS_ASSIGN_OR_RETURN(std::vector<std::string> chief,
                      AddressList(cluster, "chief"));
  PS_ASSIGN_OR_RETURN(std::vector<std::string> master,
                      AddressList(cluster, "master"));
  PS_ASSIGN_OR_RETURN(out.ps, AddressList(cluster, "ps"));
  PS_ASSIGN_OR_RETURN(out.workers, AddressList(cluster, "worker"));
  PS_ASSIGN_OR_RETURN(out.evaluators, AddressList(cluster, "evaluator"));
  if (!chief.empty() && !master.empty()) {
    return Bad("TF_CONFIG: cluster has both chief and master; give one");
  }
  const bool use_master = chief.empty() && !master.empty();
  out.schedulers = use_master ? std::move(master) : std::move(chief);
  out.scheduler_type = use_master ? "master" : "chief";
  if (out.schedulers.size() != 1) {
    return Bad(absl::StrCat("TF_CONFIG: cluster.", out.scheduler_type,
                            " must have exactly one address (it runs "
                            "the scheduler), has ",
                            out.schedulers.size()));
  }
  if (out.ps.empty()) {
    return Bad(
        "TF_CONFIG: cluster.ps is empty: the job needs at least one ps "
        "task (a server)");
  }
  if (out.workers.empty()) {
    return Bad(
        "TF_CONFIG: cluster.worker is empty: the job needs at least one "
        "worker task");
  }
  return out;
}

absl::StatusOr<LaunchPlan> PlanFromTfConfig(const std::string& json) {
  Struct root;
  google::protobuf::util::JsonParseOptions options;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(json, &root, options);
  if (!parsed.ok()) {
    return Bad(absl::StrCat("TF_CONFIG is not a JSON object: ",
                            std::string(parsed.message())));
  }
  auto cluster_it = root.fields().find("cluster");
  if (cluster_it == root.fields().end() ||
      cluster_it->second.kind_case() != Value::kStructValue) {
    return Bad("TF_CONFIG: no \"cluster\" object");
  }
  PS_ASSIGN_OR_RETURN(const TfTask task, ParseTfTask(root));
  PS_ASSIGN_OR_RETURN(const TfCluster cluster,
                      ParseTfCluster(cluster_it->second.struct_value()));
  const std::string& type = task.type;
  const int index = task.index;
  LaunchPlan plan;
  plan.source = LaunchSource::kTfConfig;
  plan.scheduler_address = cluster.schedulers[0];
  plan.num_servers = static_cast<int>(cluster.ps.size());
  plan.num_workers = static_cast<int>(cluster.workers.size());
  plan.task_index = index;
  const std::vector<std::string>* members = nullptr;
  if (type == "chief" || type == "master") {
    if (type != cluster.scheduler_type) {
      return Bad(absl::StrCat("TF_CONFIG: task.type is '", type,
                              "' but the cluster names its scheduler task '",
                              cluster.scheduler_type, "'"));
    }
    plan.role = LaunchRole::kScheduler;
    members = &cluster.schedulers;
  } else if (type == "ps") {
    plan.role = LaunchRole::kServer;
    members = &cluster.ps;
  } else if (type == "worker") {
    plan.role = LaunchRole::kWorker;
    members = &cluster.workers;
  } else if (type == "evaluator") {
    // Runs the config's launch.evaluator_command (LaunchCommand refuses the
    // task when the config has none).
    plan.role = LaunchRole::kEvaluator;
    members = &cluster.evaluators;
  } else {
    return Bad(absl::StrCat("TF_CONFIG: unknown task.type '", type,
                            "' (expected chief, ps or worker)"));
  }
  if (index >= static_cast<int>(members->size())) {
    return Bad(absl::StrCat("TF_CONFIG: task.index ", index,
                            " is out of range: the cluster has ",
                            members->size(), " ", type, " task(s)"));
  }
  auto self = ParseHostPort((*members)[index], "TF_CONFIG");
  if (!self.ok()) return self.status();
  plan.advertise_host = self->host;
  if (plan.role != LaunchRole::kWorker) plan.listen_port = self->port;
  return plan;
}

absl::StatusOr<LaunchPlan> PlanFromDmlc(const Environment& env) {
  auto require = [&env](const char* name) -> absl::StatusOr<std::string> {
    const std::string* v = Find(env, name);
    if (v == nullptr || v->empty()) {
      return Bad(absl::StrCat(name, " is not set"));
    }
    return *v;
  };
  auto role = require("DMLC_ROLE");
  if (!role.ok()) return role.status();
  LaunchPlan plan;
  plan.source = LaunchSource::kDmlc;
  if (*role == "scheduler") {
    plan.role = LaunchRole::kScheduler;
  } else if (*role == "server") {
    plan.role = LaunchRole::kServer;
  } else if (*role == "worker") {
    plan.role = LaunchRole::kWorker;
  } else {
    return Bad(absl::StrCat("DMLC_ROLE='", *role,
                            "' is not scheduler, server or worker"));
  }
  auto uri = require("DMLC_PS_ROOT_URI");
  if (!uri.ok()) return uri.status();
  if (uri->find_first_of(" /:") != std::string::npos && uri->front() != '[') {
    return Bad(
        absl::StrCat("DMLC_PS_ROOT_URI='", *uri,
                     "' must be a bare host (the port is DMLC_PS_ROOT_PORT)"));
  }
  auto port_text = require("DMLC_PS_ROOT_PORT");
  if (!port_text.ok()) return port_text.status();
  auto port = ParsePort(*port_text, "DMLC_PS_ROOT_PORT");
  if (!port.ok()) return port.status();
  auto servers = require("DMLC_NUM_SERVER");
  if (!servers.ok()) return servers.status();
  auto num_servers = ParseCount(*servers, "DMLC_NUM_SERVER");
  if (!num_servers.ok()) return num_servers.status();
  auto workers = require("DMLC_NUM_WORKER");
  if (!workers.ok()) return workers.status();
  auto num_workers = ParseCount(*workers, "DMLC_NUM_WORKER");
  if (!num_workers.ok()) return num_workers.status();
  plan.scheduler_address = absl::StrCat(*uri, ":", *port);
  plan.num_servers = *num_servers;
  plan.num_workers = *num_workers;
  if (plan.role == LaunchRole::kScheduler) plan.listen_port = *port;
  if (const std::string* host = Find(env, "DMLC_NODE_HOST"); host != nullptr) {
    if (host->find_first_of(" /") != std::string::npos) {
      return Bad(
          absl::StrCat("DMLC_NODE_HOST='", *host, "' is not a host name"));
    }
    plan.advertise_host = *host;
  }
  return plan;
}

}  // namespace

const char* LaunchRoleName(LaunchRole role) {
  switch (role) {
    case LaunchRole::kScheduler:
      return "scheduler";
    case LaunchRole::kServer:
      return "server";
    case LaunchRole::kWorker:
      return "worker";
    case LaunchRole::kEvaluator:
      return "evaluator";
  }
  return "unknown";
}

const char* LaunchSourceName(LaunchSource source) {
  switch (source) {
    case LaunchSource::kAuto:
      return "auto";
    case LaunchSource::kTfConfig:
      return "tf_config";
    case LaunchSource::kDmlc:
      return "dmlc";
  }
  return "unknown";
}

absl::StatusOr<LaunchSource> ParseLaunchSource(absl::string_view name) {
  for (LaunchSource s :
       {LaunchSource::kAuto, LaunchSource::kTfConfig, LaunchSource::kDmlc}) {
    if (name == LaunchSourceName(s)) return s;
  }
  return Bad(absl::StrCat("launch source '", name,
                          "' is not auto, tf_config or dmlc"));
}

absl::StatusOr<LaunchPlan> PlanLaunch(const Environment& env,
                                      LaunchSource source) {
  const std::string* tf = Find(env, "TF_CONFIG");
  const std::string* dmlc = Find(env, "DMLC_ROLE");
  const bool has_tf = tf != nullptr && !tf->empty();
  const bool has_dmlc = dmlc != nullptr && !dmlc->empty();
  if (source == LaunchSource::kAuto) {
    if (has_tf && has_dmlc) {
      return Bad(
          "both TF_CONFIG and DMLC_ROLE are set; choose one with "
          "--launch_from=tf_config or --launch_from=dmlc");
    }
    if (!has_tf && !has_dmlc) {
      return Bad(
          "neither TF_CONFIG (Kubeflow TFJob) nor DMLC_ROLE (ps-lite) "
          "is set: nothing says which node this is");
    }
    source = has_tf ? LaunchSource::kTfConfig : LaunchSource::kDmlc;
  }
  absl::StatusOr<LaunchPlan> plan;
  if (source == LaunchSource::kTfConfig) {
    if (!has_tf) return Bad("TF_CONFIG is not set");
    plan = PlanFromTfConfig(*tf);
  } else {
    plan = PlanFromDmlc(env);
  }
  if (const std::string* id = Find(env, "PS_LAUNCH_ID");
      plan.ok() && id != nullptr) {
    plan->launch_id = *id;
  }
  return plan;
}

namespace {

// `command` with "{config_dir}" replaced in every element, and a first
// element "python3" replaced by options.python when set.
std::vector<std::string> Substitute(const std::vector<std::string>& command,
                                    const LaunchCommandOptions& options) {
  std::vector<std::string> out;
  for (const std::string& arg : command) {
    out.push_back(
        absl::StrReplaceAll(arg, {{"{config_dir}", options.config_dir}}));
  }
  if (!out.empty() && out[0] == "python3" && !options.python.empty())
    out[0] = options.python;
  return out;
}

// The address other nodes reach this one at: the plan's (DMLC_NODE_HOST),
// else --advertise_host or the machine's name; empty when neither is known.
std::string AdvertisedHost(const LaunchPlan& plan,
                           const LaunchCommandOptions& options) {
  return plan.advertise_host.empty() ? options.default_advertise_host
                                     : plan.advertise_host;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> LaunchCommand(
    const LaunchPlan& plan, const LaunchCommandOptions& options) {
  if (options.config.empty()) return Bad("no job config given (--config)");
  if (options.listen_host.empty()) return Bad("no listen host given");
  // The job's own worker or evaluator command: the flags every worker
  // program takes; the cluster sizes travel in LaunchEnvironment.
  const std::vector<std::string>* own =
      plan.role == LaunchRole::kWorker      ? &options.worker_command
      : plan.role == LaunchRole::kEvaluator ? &options.evaluator_command
                                            : nullptr;
  if (plan.role == LaunchRole::kEvaluator && own->empty()) {
    return Bad(
        "TF_CONFIG: task type 'evaluator' needs launch.evaluator_command in "
        "the job "
        "config (a script that observes the job, e.g. with ps.observe); "
        "without "
        "one the lowest live worker rank evaluates the model once training is "
        "done: remove the Evaluator replica spec from the TFJob");
  }
  if (own != nullptr && !own->empty()) {
    std::vector<std::string> argv = Substitute(*own, options);
    argv.push_back(absl::StrCat("--config=", options.config));
    argv.push_back(absl::StrCat("--scheduler=", plan.scheduler_address));
    argv.insert(argv.end(), options.extra_args.begin(),
                options.extra_args.end());
    return argv;
  }
  const std::string& binary =
      plan.role == LaunchRole::kScheduler ? options.scheduler_binary
      : plan.role == LaunchRole::kServer  ? options.server_binary
                                          : options.trainer_binary;
  if (binary.empty()) {
    return Bad(
        absl::StrCat("no binary for the ", LaunchRoleName(plan.role), " role"));
  }
  std::vector<std::string> argv = {
      binary, absl::StrCat("--config=", options.config),
      absl::StrCat("--num_servers=", plan.num_servers),
      absl::StrCat("--num_workers=", plan.num_workers)};
  switch (plan.role) {
    case LaunchRole::kScheduler:
      argv.push_back(absl::StrCat("--host=", options.listen_host));
      argv.push_back(absl::StrCat("--port=", plan.listen_port));
      if (!plan.launch_id.empty()) {
        argv.push_back(absl::StrCat("--launch_id=", plan.launch_id));
      }
      break;
    case LaunchRole::kServer: {
      argv.push_back(absl::StrCat("--scheduler=", plan.scheduler_address));
      argv.push_back(absl::StrCat("--bind=tcp://", options.listen_host, ":",
                                  plan.listen_port > 0
                                      ? absl::StrCat(plan.listen_port)
                                      : std::string("*")));
      const std::string host = AdvertisedHost(plan, options);
      if (!host.empty()) {
        argv.push_back(absl::StrCat("--advertise_host=", host));
      } else if (options.listen_host == "0.0.0.0" ||
                 options.listen_host == "*" || options.listen_host == "::") {
        return Bad(
            "a server binding a wildcard address needs a host to "
            "advertise (DMLC_NODE_HOST or --advertise_host)");
      }
      break;
    }
    case LaunchRole::kWorker:
    case LaunchRole::kEvaluator: {
      argv.push_back(absl::StrCat("--scheduler=", plan.scheduler_address));
      // Dense tables with sync ALLREDUCE: the other workers connect to this
      // one's ring there (the trainer's default, 127.0.0.1, reaches only
      // workers on the same machine).
      const std::string host = AdvertisedHost(plan, options);
      if (plan.role == LaunchRole::kWorker && !host.empty()) {
        argv.push_back(absl::StrCat("--ring_host=", host));
      }
      break;
    }
  }
  argv.insert(argv.end(), options.extra_args.begin(), options.extra_args.end());
  return argv;
}

Environment LaunchEnvironment(const LaunchPlan& plan,
                              const LaunchCommandOptions& options) {
  Environment env = {{"PS_CONFIG", options.config},
                     {"PS_SCHEDULER", plan.scheduler_address},
                     {"PS_NUM_SERVERS", absl::StrCat(plan.num_servers)},
                     {"PS_NUM_WORKERS", absl::StrCat(plan.num_workers)},
                     {"PS_ROLE", LaunchRoleName(plan.role)}};
  const std::string host = AdvertisedHost(plan, options);
  if (plan.role == LaunchRole::kWorker && !host.empty()) {
    env["PS_RING_HOST"] = host;
  }
  return env;
}

std::string DescribeLaunchPlan(const LaunchPlan& plan) {
  std::string out = absl::StrCat(LaunchRoleName(plan.role), " (from ",
                                 LaunchSourceName(plan.source), "): scheduler ",
                                 plan.scheduler_address, ", ", plan.num_servers,
                                 " servers, ", plan.num_workers, " workers");
  if (plan.task_index >= 0)
    absl::StrAppend(&out, ", task index ", plan.task_index);
  if (plan.listen_port > 0)
    absl::StrAppend(&out, ", listen port ", plan.listen_port);
  if (!plan.advertise_host.empty()) {
    absl::StrAppend(&out, ", advertised as ", plan.advertise_host);
  }
  if (!plan.launch_id.empty()) {
    absl::StrAppend(&out, ", launch id ", plan.launch_id);
  }
  return out;
}

}  // namespace ps
