// Launching a node from a cluster manager's environment: Kubeflow TFJob
// (TF_CONFIG) or ps-lite / MXNet launchers (DMLC_* variables). A pure
// function turns the environment, passed in as a map, into a LaunchPlan,
// and a second one turns the plan into the command line of the binary to
// run (deploy/launch/psnode execs it). Neither reads the process
// environment or the file system, so tests are deterministic.
//
// TF_CONFIG (JSON, as TFJob sets it):
//   {"cluster": {"chief": ["h:p"], "ps": ["h:p", ...], "worker": ["h:p", ...]},
//    "task": {"type": "worker", "index": 0}}
// TFJob has no scheduler replica, so:
//   - the `chief` task (exactly one address; "master", the older name, is
//     accepted when there is no chief) runs the scheduler, listening on the
//     chief address's port; every node dials the chief address;
//   - `ps` task i runs a server whose data plane binds the port of
//     cluster.ps[i] and is advertised as that address's host;
//   - `worker` task i runs a trainer (its address is not used);
//   - num_servers = len(cluster.ps) and num_workers = len(cluster.worker),
//     both required and >= 1;
//   - `evaluator` task i runs the job config's launch.evaluator_command (a
//     sidecar that observes the job, e.g. with ps.observe); LaunchCommand
//     refuses it when the config has none (the lowest live worker rank
//     evaluates once training is done). Any other task type is refused.
//   Ranks are assigned by the scheduler in registration order, not from
//   task.index; the index only picks this task's address.
//
// DMLC (ps-lite / MXNet):
//   DMLC_ROLE              scheduler | server | worker (required)
//   DMLC_PS_ROOT_URI       the scheduler's host (required)
//   DMLC_PS_ROOT_PORT      the scheduler's port, 1..65535 (required); the
//                          scheduler listens on it
//   DMLC_NUM_SERVER        num_servers >= 1 (required)
//   DMLC_NUM_WORKER        num_workers >= 1 (required)
//   DMLC_NODE_HOST         optional: the host other nodes reach this node
//                          at (a server's advertised data-plane host)
//   A server's data plane binds a free port (ps-lite has no per-server
//   port variable).
//
// Launch id (either convention): PS_LAUNCH_ID, when set and not empty, is
// passed to the scheduler as --launch_id, so a scheduler restarted within
// the same launch takes its journal back and one of a new launch never
// does (docs/operations.md, "Restart"). Neither TF_CONFIG nor DMLC_* says
// which launch a node belongs to; the cluster manager sets PS_LAUNCH_ID
// (Kubernetes: from the pod's or the Job's uid through the downward API).
//
// Source selection: with LaunchSource::kAuto, exactly one of TF_CONFIG and
// DMLC_ROLE must be set (both set is an error naming --launch_from, so a
// pod that inherits both never silently picks one); kTfConfig or kDmlc
// read only that convention and ignore the other's variables.
//
// Errors: INVALID_ARGUMENT with a message naming the variable and, for
// TF_CONFIG, the JSON path ("TF_CONFIG: task.index 3 is out of range: the
// cluster has 2 ps tasks").
//
// Thread-safe (pure functions).
#ifndef PS_DEPLOY_LAUNCH_LAUNCH_ENV_H_
#define PS_DEPLOY_LAUNCH_LAUNCH_ENV_H_

#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "common/status.h"

namespace ps {

enum class LaunchRole { kScheduler, kServer, kWorker, kEvaluator };
enum class LaunchSource { kAuto, kTfConfig, kDmlc };

// "scheduler", "server", "worker".
const char* LaunchRoleName(LaunchRole role);
// "auto", "tf_config", "dmlc".
const char* LaunchSourceName(LaunchSource source);
// The inverse of LaunchSourceName; INVALID_ARGUMENT for anything else.
absl::StatusOr<LaunchSource> ParseLaunchSource(absl::string_view name);

struct LaunchPlan {
  // The convention the plan was read from (kTfConfig or kDmlc).
  LaunchSource source = LaunchSource::kAuto;
  LaunchRole role = LaunchRole::kWorker;
  // The scheduler's "host:port", as every node dials it.
  std::string scheduler_address;
  // Scheduler: the gRPC port to listen on. Server: the data-plane port to
  // bind, 0 = any free port. Worker: 0.
  int listen_port = 0;
  // The host other nodes reach this node at; empty = not given by the
  // environment (the launcher decides, e.g. the machine's host name).
  std::string advertise_host;
  int num_servers = 0;
  int num_workers = 0;
  // TF_CONFIG task.index; -1 for DMLC (ranks come from the scheduler).
  int task_index = -1;
  // PS_LAUNCH_ID; empty when the environment has none.
  std::string launch_id;
};

// Variable name -> value.
using Environment = std::map<std::string, std::string>;

// Reads the plan from `env` (see the file comment for the rules).
absl::StatusOr<LaunchPlan> PlanLaunch(const Environment& env,
                                      LaunchSource source = LaunchSource::kAuto);

// How a plan becomes a command line.
struct LaunchCommandOptions {
  // Paths of the three binaries.
  std::string scheduler_binary;
  std::string server_binary;
  std::string trainer_binary;
  // The job config file every node loads (required).
  std::string config;
  // Address the scheduler and servers listen on.
  std::string listen_host = "0.0.0.0";
  // Used when the plan has no advertise_host (servers only).
  std::string default_advertise_host;
  // Appended as given (arguments after `--`).
  std::vector<std::string> extra_args;
  // The job config's launch.worker_command and launch.evaluator_command: a
  // worker runs the first instead of the trainer when it is not empty; an
  // evaluator needs the second. "{config_dir}" in them becomes config_dir;
  // a first element "python3" becomes `python` when that is not empty.
  std::vector<std::string> worker_command;
  std::vector<std::string> evaluator_command;
  std::string config_dir = ".";
  std::string python;
};

// argv of the binary to exec for `plan`: the binary, --config,
// --num_servers and --num_workers (they override the config's cluster
// block), then per role:
//   scheduler: --host=<listen_host> --port=<listen_port>
//              [--launch_id=<plan.launch_id>]
//   server:    --scheduler=<address> --bind=tcp://<listen_host>:<port or *>
//              [--advertise_host=<host>]
//   worker:    --scheduler=<address> [--ring_host=<host>]
// (host: plan.advertise_host, else default_advertise_host: where the other
// workers reach this one's dense all-reduce ring), then extra_args. A worker with a worker_command, or an evaluator, runs
// that command instead, with --config, --scheduler and extra_args appended
// (the cluster sizes come from LaunchEnvironment). INVALID_ARGUMENT when config
// or the role's binary is empty, or a server would bind a wildcard address with
// nothing to advertise.
absl::StatusOr<std::vector<std::string>> LaunchCommand(
    const LaunchPlan& plan, const LaunchCommandOptions& options);

// Variables the launched command gets: PS_CONFIG, PS_SCHEDULER,
// PS_NUM_SERVERS, PS_NUM_WORKERS and PS_ROLE (scheduler, server, worker,
// evaluator), as ps.Session reads them; a worker also PS_RING_HOST (its
// --ring_host above) when a host is known.
Environment LaunchEnvironment(const LaunchPlan& plan, const LaunchCommandOptions& options);

// A one-line description of the plan for logs and --print.
std::string DescribeLaunchPlan(const LaunchPlan& plan);

}  // namespace ps

#endif  // PS_DEPLOY_LAUNCH_LAUNCH_ENV_H_
