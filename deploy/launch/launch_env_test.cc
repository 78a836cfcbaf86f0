#include "deploy/launch/launch_env.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kCluster[] =
    R"("cluster": {"chief": ["chief-0:2222"],
                   "ps": ["ps-0:2223", "ps-1:2224"],
                   "worker": ["worker-0:2225", "worker-1:2226", "worker-2:2227"]})";

std::string TfConfig(const std::string& type, int index) {
  return std::string("{") + kCluster + R"(, "task": {"type": ")" + type +
         R"(", "index": )" + std::to_string(index) + "}}";
}

Environment Dmlc(const std::string& role) {
  return {{"DMLC_ROLE", role},
          {"DMLC_PS_ROOT_URI", "10.0.0.1"},
          {"DMLC_PS_ROOT_PORT", "9091"},
          {"DMLC_NUM_SERVER", "2"},
          {"DMLC_NUM_WORKER", "4"}};
}

// The message of a failed plan ("" when it succeeded, which fails the test).
std::string Error(const Environment& env, LaunchSource source = LaunchSource::kAuto) {
  auto plan = PlanLaunch(env, source);
  EXPECT_FALSE(plan.ok()) << DescribeLaunchPlan(*plan);
  if (plan.ok()) return "";
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(plan.status().message());
}

TEST(LaunchEnvTest, TfConfigChiefRunsTheScheduler) {
  auto plan = PlanLaunch({{"TF_CONFIG", TfConfig("chief", 0)}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->source, LaunchSource::kTfConfig);
  EXPECT_EQ(plan->role, LaunchRole::kScheduler);
  EXPECT_EQ(plan->scheduler_address, "chief-0:2222");
  EXPECT_EQ(plan->listen_port, 2222);
  EXPECT_EQ(plan->advertise_host, "chief-0");
  EXPECT_EQ(plan->num_servers, 2);
  EXPECT_EQ(plan->num_workers, 3);
  EXPECT_EQ(plan->task_index, 0);
}

TEST(LaunchEnvTest, TfConfigPsRunsAServerOnItsAddress) {
  auto plan = PlanLaunch({{"TF_CONFIG", TfConfig("ps", 1)}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->role, LaunchRole::kServer);
  EXPECT_EQ(plan->scheduler_address, "chief-0:2222");
  EXPECT_EQ(plan->listen_port, 2224);
  EXPECT_EQ(plan->advertise_host, "ps-1");
  EXPECT_EQ(plan->task_index, 1);
}

TEST(LaunchEnvTest, TfConfigWorkerRunsATrainer) {
  auto plan = PlanLaunch({{"TF_CONFIG", TfConfig("worker", 2)}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->role, LaunchRole::kWorker);
  EXPECT_EQ(plan->listen_port, 0);
  EXPECT_EQ(plan->num_workers, 3);
  EXPECT_EQ(plan->task_index, 2);
}

TEST(LaunchEnvTest, TfConfigAcceptsMasterAndAMissingIndex) {
  auto plan = PlanLaunch({{"TF_CONFIG", R"({"cluster": {"master": ["m:1"],
      "ps": ["p:2"], "worker": ["w:3"]}, "task": {"type": "master"}})"}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->role, LaunchRole::kScheduler);
  EXPECT_EQ(plan->scheduler_address, "m:1");
  EXPECT_EQ(plan->task_index, 0);
}

TEST(LaunchEnvTest, TfConfigErrors) {
  auto tf = [](const std::string& json) { return Environment{{"TF_CONFIG", json}}; };
  EXPECT_THAT(Error(tf("{not json")), HasSubstr("TF_CONFIG is not a JSON object"));
  EXPECT_THAT(Error(tf("[1, 2]")), HasSubstr("TF_CONFIG is not a JSON object"));
  EXPECT_THAT(Error(tf(R"({"task": {"type": "ps", "index": 0}})")),
              HasSubstr("no \"cluster\" object"));
  EXPECT_THAT(Error(tf(std::string("{") + kCluster + "}")),
              HasSubstr("no \"task\" object"));
  EXPECT_THAT(Error(tf(std::string("{") + kCluster + R"(, "task": {"index": 0}})")),
              HasSubstr("task.type must be a string"));
  EXPECT_THAT(Error(tf(TfConfig("ps", 2))),
              HasSubstr("task.index 2 is out of range: the cluster has 2 ps task(s)"));
  EXPECT_THAT(Error(tf(std::string("{") + kCluster +
                       R"(, "task": {"type": "ps", "index": -1}})")),
              HasSubstr("task.index must be a whole number >= 0"));
  EXPECT_THAT(Error(tf(std::string("{") + kCluster +
                       R"(, "task": {"type": "ps", "index": 0.5}})")),
              HasSubstr("task.index must be a whole number >= 0"));
  EXPECT_THAT(Error(tf(std::string("{") + kCluster +
                       R"(, "task": {"type": "ps", "index": "0"}})")),
              HasSubstr("task.index must be a whole number >= 0"));
  EXPECT_THAT(Error(tf(TfConfig("trainer", 0))), HasSubstr("unknown task.type 'trainer'"));
  EXPECT_THAT(Error(tf(R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]},
                           "task": {"type": "ps", "index": 0}})")),
              HasSubstr("cluster.chief must have exactly one address"));
  EXPECT_THAT(Error(tf(R"({"cluster": {"chief": ["a:1", "b:1"], "ps": ["p:1"],
                           "worker": ["w:1"]}, "task": {"type": "ps", "index": 0}})")),
              HasSubstr("cluster.chief must have exactly one address"));
  EXPECT_THAT(Error(tf(R"({"cluster": {"chief": ["a:1"], "master": ["b:1"],
                           "ps": ["p:1"], "worker": ["w:1"]},
                           "task": {"type": "ps", "index": 0}})")),
              HasSubstr("both chief and master"));
  EXPECT_THAT(Error(tf(R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"]},
                           "task": {"type": "worker", "index": 0}})")),
              HasSubstr("cluster.ps is empty"));
  EXPECT_THAT(Error(tf(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]},
                           "task": {"type": "ps", "index": 0}})")),
              HasSubstr("cluster.worker is empty"));
  EXPECT_THAT(Error(tf(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"],
                           "worker": ["w:1"], "gpu": ["g:1"]},
                           "task": {"type": "ps", "index": 0}})")),
              HasSubstr("unknown task type 'gpu' in cluster"));
  EXPECT_THAT(Error(tf(R"({"cluster": {"chief": ["c:1"], "ps": "p:1",
                           "worker": ["w:1"]}, "task": {"type": "ps", "index": 0}})")),
              HasSubstr("cluster.ps must be a list"));
  EXPECT_THAT(Error(tf(R"({"cluster": {"chief": ["c:1"], "ps": [7],
                           "worker": ["w:1"]}, "task": {"type": "ps", "index": 0}})")),
              HasSubstr("cluster.ps[0] must be a \"host:port\" string"));
  // Bad ports and addresses without one.
  for (const char* addr : {"p", "p:", "p:0", "p:65536", "p:http", ":80"}) {
    EXPECT_THAT(Error(tf(std::string(R"({"cluster": {"chief": ["c:1"], "ps": [")") +
                         addr + R"("], "worker": ["w:1"]},
                           "task": {"type": "worker", "index": 0}})")),
                HasSubstr("cluster.ps[0]"))
        << addr;
  }
  EXPECT_THAT(Error(tf(R"({"cluster": {"master": ["m:1"], "ps": ["p:2"],
                           "worker": ["w:3"]}, "task": {"type": "chief"}})")),
              HasSubstr("names its scheduler task 'master'"));
}

TEST(LaunchEnvTest, DmlcRoles) {
  auto scheduler = PlanLaunch(Dmlc("scheduler"));
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  EXPECT_EQ(scheduler->source, LaunchSource::kDmlc);
  EXPECT_EQ(scheduler->role, LaunchRole::kScheduler);
  EXPECT_EQ(scheduler->scheduler_address, "10.0.0.1:9091");
  EXPECT_EQ(scheduler->listen_port, 9091);
  EXPECT_EQ(scheduler->num_servers, 2);
  EXPECT_EQ(scheduler->num_workers, 4);
  EXPECT_EQ(scheduler->task_index, -1);

  Environment env = Dmlc("server");
  env["DMLC_NODE_HOST"] = "10.0.0.7";
  auto server = PlanLaunch(env);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(server->role, LaunchRole::kServer);
  EXPECT_EQ(server->listen_port, 0);
  EXPECT_EQ(server->advertise_host, "10.0.0.7");

  auto worker = PlanLaunch(Dmlc("worker"));
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->role, LaunchRole::kWorker);
  EXPECT_EQ(worker->advertise_host, "");
}

TEST(LaunchEnvTest, DmlcErrors) {
  EXPECT_THAT(Error(Dmlc("learner")), HasSubstr("DMLC_ROLE='learner' is not"));
  for (const char* name : {"DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
                           "DMLC_NUM_SERVER", "DMLC_NUM_WORKER"}) {
    Environment env = Dmlc("worker");
    env.erase(name);
    EXPECT_THAT(Error(env), HasSubstr(std::string(name) + " is not set"));
    env[name] = "";
    EXPECT_THAT(Error(env), HasSubstr(std::string(name) + " is not set"));
  }
  for (const char* port : {"0", "65536", "-1", "x", "80x"}) {
    Environment env = Dmlc("worker");
    env["DMLC_PS_ROOT_PORT"] = port;
    EXPECT_THAT(Error(env), HasSubstr("DMLC_PS_ROOT_PORT")) << port;
  }
  for (const char* count : {"0", "-2", "two", "70000"}) {
    Environment env = Dmlc("worker");
    env["DMLC_NUM_SERVER"] = count;
    EXPECT_THAT(Error(env), HasSubstr("DMLC_NUM_SERVER")) << count;
    env = Dmlc("worker");
    env["DMLC_NUM_WORKER"] = count;
    EXPECT_THAT(Error(env), HasSubstr("DMLC_NUM_WORKER")) << count;
  }
  Environment env = Dmlc("server");
  env["DMLC_PS_ROOT_URI"] = "10.0.0.1:9091";
  EXPECT_THAT(Error(env), HasSubstr("must be a bare host"));
  env = Dmlc("server");
  env["DMLC_NODE_HOST"] = "a b";
  EXPECT_THAT(Error(env), HasSubstr("DMLC_NODE_HOST"));
}

TEST(LaunchEnvTest, SourceSelection) {
  EXPECT_THAT(Error({}), HasSubstr("neither TF_CONFIG"));
  EXPECT_THAT(Error({{"TF_CONFIG", ""}, {"DMLC_ROLE", ""}}), HasSubstr("neither TF_CONFIG"));
  Environment both = Dmlc("server");
  both["TF_CONFIG"] = TfConfig("worker", 0);
  EXPECT_THAT(Error(both), HasSubstr("--launch_from"));
  auto tf = PlanLaunch(both, LaunchSource::kTfConfig);
  ASSERT_TRUE(tf.ok()) << tf.status();
  EXPECT_EQ(tf->role, LaunchRole::kWorker);
  auto dmlc = PlanLaunch(both, LaunchSource::kDmlc);
  ASSERT_TRUE(dmlc.ok()) << dmlc.status();
  EXPECT_EQ(dmlc->role, LaunchRole::kServer);
  EXPECT_THAT(Error(Dmlc("server"), LaunchSource::kTfConfig),
              HasSubstr("TF_CONFIG is not set"));
  EXPECT_THAT(Error({{"TF_CONFIG", TfConfig("ps", 0)}}, LaunchSource::kDmlc),
              HasSubstr("DMLC_ROLE is not set"));

  EXPECT_EQ(*ParseLaunchSource("tf_config"), LaunchSource::kTfConfig);
  EXPECT_EQ(*ParseLaunchSource("dmlc"), LaunchSource::kDmlc);
  EXPECT_EQ(*ParseLaunchSource("auto"), LaunchSource::kAuto);
  EXPECT_FALSE(ParseLaunchSource("k8s").ok());
}

LaunchCommandOptions Binaries() {
  LaunchCommandOptions o;
  o.scheduler_binary = "/b/scheduler_main";
  o.server_binary = "/b/server_main";
  o.trainer_binary = "/b/trainer";
  o.config = "/c/job.pbtxt";
  return o;
}

TEST(LaunchEnvTest, Commands) {
  auto scheduler = PlanLaunch({{"TF_CONFIG", TfConfig("chief", 0)}});
  ASSERT_TRUE(scheduler.ok());
  EXPECT_THAT(*LaunchCommand(*scheduler, Binaries()),
              ElementsAre("/b/scheduler_main", "--config=/c/job.pbtxt",
                          "--num_servers=2", "--num_workers=3", "--host=0.0.0.0",
                          "--port=2222"));

  auto server = PlanLaunch({{"TF_CONFIG", TfConfig("ps", 1)}});
  ASSERT_TRUE(server.ok());
  EXPECT_THAT(*LaunchCommand(*server, Binaries()),
              ElementsAre("/b/server_main", "--config=/c/job.pbtxt", "--num_servers=2",
                          "--num_workers=3", "--scheduler=chief-0:2222",
                          "--bind=tcp://0.0.0.0:2224", "--advertise_host=ps-1"));

  LaunchCommandOptions o = Binaries();
  o.extra_args = {"--log_level=debug", "--summary_out=/tmp/s.json"};
  auto worker = PlanLaunch(Dmlc("worker"));
  ASSERT_TRUE(worker.ok());
  EXPECT_THAT(*LaunchCommand(*worker, o),
              ElementsAre("/b/trainer", "--config=/c/job.pbtxt", "--num_servers=2",
                          "--num_workers=4", "--scheduler=10.0.0.1:9091",
                          "--log_level=debug", "--summary_out=/tmp/s.json"));
  EXPECT_EQ(LaunchEnvironment(*worker, o).count("PS_RING_HOST"), 0u)
      << "no host known: the trainer's and ps's own default (127.0.0.1)";
  // With a host to advertise, the other workers reach this one's dense
  // all-reduce ring there: the trainer's --ring_host, a worker command's
  // PS_RING_HOST.
  o.default_advertise_host = "node-3";
  EXPECT_THAT(*LaunchCommand(*worker, o),
              ElementsAre("/b/trainer", "--config=/c/job.pbtxt", "--num_servers=2",
                          "--num_workers=4", "--scheduler=10.0.0.1:9091",
                          "--ring_host=node-3", "--log_level=debug",
                          "--summary_out=/tmp/s.json"));
  EXPECT_EQ(LaunchEnvironment(*worker, o).at("PS_RING_HOST"), "node-3");

  // A DMLC server without DMLC_NODE_HOST: the launcher's default host, and
  // none at all is refused when binding every interface.
  auto dmlc_server = PlanLaunch(Dmlc("server"));
  ASSERT_TRUE(dmlc_server.ok());
  o = Binaries();
  o.default_advertise_host = "node-7";
  EXPECT_THAT(*LaunchCommand(*dmlc_server, o),
              ElementsAre("/b/server_main", "--config=/c/job.pbtxt", "--num_servers=2",
                          "--num_workers=4", "--scheduler=10.0.0.1:9091",
                          "--bind=tcp://0.0.0.0:*", "--advertise_host=node-7"));
  auto refused = LaunchCommand(*dmlc_server, Binaries());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("needs a host to advertise"));
  o = Binaries();
  o.listen_host = "127.0.0.1";
  EXPECT_THAT(*LaunchCommand(*dmlc_server, o),
              ElementsAre("/b/server_main", "--config=/c/job.pbtxt", "--num_servers=2",
                          "--num_workers=4", "--scheduler=10.0.0.1:9091",
                          "--bind=tcp://127.0.0.1:*"));

  o = Binaries();
  o.config = "";
  EXPECT_FALSE(LaunchCommand(*worker, o).ok());
  o = Binaries();
  o.trainer_binary = "";
  EXPECT_THAT(std::string(LaunchCommand(*worker, o).status().message()),
              HasSubstr("no binary for the worker role"));
}

// The job config's own worker command replaces the trainer, and a TFJob
// evaluator task runs its evaluator command (refused without one).
// The scheduler gets the launch id of its environment, whichever
// convention: a new launch never resumes the journal of another.
TEST(LaunchEnvTest, TheSchedulerGetsPsLaunchId) {
  Environment tf = {{"TF_CONFIG", TfConfig("chief", 0)},
                    {"PS_LAUNCH_ID", "uid-1"}};
  auto scheduler = PlanLaunch(tf);
  ASSERT_TRUE(scheduler.ok());
  EXPECT_EQ(scheduler->launch_id, "uid-1");
  EXPECT_THAT(
      *LaunchCommand(*scheduler, Binaries()),
      ElementsAre("/b/scheduler_main", "--config=/c/job.pbtxt",
                  "--num_servers=2", "--num_workers=3", "--host=0.0.0.0",
                  "--port=2222", "--launch_id=uid-1"));
  EXPECT_THAT(DescribeLaunchPlan(*scheduler), HasSubstr("launch id uid-1"));

  Environment dmlc = Dmlc("scheduler");
  dmlc["PS_LAUNCH_ID"] = "uid-2";
  EXPECT_THAT(*LaunchCommand(*PlanLaunch(dmlc), Binaries()),
              Contains("--launch_id=uid-2"));
  // Only the scheduler takes it.
  dmlc["DMLC_ROLE"] = "worker";
  EXPECT_THAT(*LaunchCommand(*PlanLaunch(dmlc), Binaries()),
              Not(Contains(HasSubstr("--launch_id"))));
  // None, or an empty one: no flag.
  dmlc = Dmlc("scheduler");
  dmlc["PS_LAUNCH_ID"] = "";
  EXPECT_THAT(*LaunchCommand(*PlanLaunch(dmlc), Binaries()),
              Not(Contains(HasSubstr("--launch_id"))));
}

TEST(LaunchEnvTest, TheJobsOwnWorkerAndEvaluatorCommands) {
  auto worker = PlanLaunch({{"TF_CONFIG", TfConfig("worker", 2)}});
  ASSERT_TRUE(worker.ok());
  LaunchCommandOptions o = Binaries();
  o.worker_command = {"python3", "{config_dir}/train.py", "--epochs=2"};
  o.config_dir = "/c";
  o.extra_args = {"--log_every_steps=10"};
  EXPECT_THAT(*LaunchCommand(*worker, o),
              ElementsAre("python3", "/c/train.py", "--epochs=2", "--config=/c/job.pbtxt",
                          "--scheduler=chief-0:2222", "--log_every_steps=10"));
  o.python = "/opt/conda/bin/python";
  EXPECT_EQ((*LaunchCommand(*worker, o))[0], "/opt/conda/bin/python");
  const Environment env = LaunchEnvironment(*worker, o);
  EXPECT_EQ(env.at("PS_SCHEDULER"), "chief-0:2222");
  EXPECT_EQ(env.at("PS_NUM_SERVERS"), "2");
  EXPECT_EQ(env.at("PS_NUM_WORKERS"), "3");
  EXPECT_EQ(env.at("PS_CONFIG"), "/c/job.pbtxt");
  EXPECT_EQ(env.at("PS_ROLE"), "worker");
  EXPECT_EQ(env.at("PS_RING_HOST"), "worker-2") << "the task's own host";

  const std::string with_evaluator =
      R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"], "worker": ["w:1"],
                      "evaluator": ["e:1"]},
          "task": {"type": "evaluator", "index": 0}})";
  auto evaluator = PlanLaunch({{"TF_CONFIG", with_evaluator}});
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  EXPECT_EQ(evaluator->role, LaunchRole::kEvaluator);
  EXPECT_THAT(std::string(LaunchCommand(*evaluator, Binaries()).status().message()),
              HasSubstr("needs launch.evaluator_command"));
  o = Binaries();
  o.evaluator_command = {"python3", "eval.py"};
  EXPECT_THAT(*LaunchCommand(*evaluator, o),
              ElementsAre("python3", "eval.py", "--config=/c/job.pbtxt", "--scheduler=c:1"));
  EXPECT_EQ(LaunchEnvironment(*evaluator, o).at("PS_ROLE"), "evaluator");
  // Index past the evaluators listed.
  EXPECT_THAT(Error({{"TF_CONFIG", R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"],
                                                   "worker": ["w:1"]},
                                       "task": {"type": "evaluator", "index": 0}})"}}),
              HasSubstr("out of range"));
}

}  // namespace
}  // namespace ps
