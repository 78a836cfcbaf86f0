#include "tests/testing/fault_flags.h"

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/fault_trials.h"

ABSL_FLAG(int64_t, fault_seed, -1,
          "Seed of the trials' choices; 0 picks one from the time. Default: "
          "$FAULT_SEED, else 1.");
ABSL_FLAG(
    int32_t, fault_trials, -1,
    "Trials (per mode, and per signal where the test has several). Default: "
    "$FAULT_TRIALS, else the test's own (fewer under a sanitizer).");
ABSL_FLAG(int32_t, fault_trial, -1,
          "Run only this trial (0-based). Default: $FAULT_TRIAL, else all.");
ABSL_FLAG(int32_t, fault_heartbeat_timeout_ms, -1,
          "The jobs' cluster.heartbeat_timeout_ms. Default: "
          "$FAULT_HEARTBEAT_TIMEOUT_MS, else the test's own (longer under a "
          "sanitizer).");

namespace ps::testing {
namespace {

FaultDefaults& Defaults() {
  static FaultDefaults defaults;
  return defaults;
}

int DefaultHeartbeatTimeoutMs() {
  return Sanitizer() ? Defaults().sanitizer_heartbeat_timeout_ms
                     : Defaults().heartbeat_timeout_ms;
}

void InitFaultTest(int* argc, char** argv, const FaultDefaults& defaults) {
  ::testing::InitGoogleTest(argc, argv);  // takes the --gtest_* flags
  absl::ParseCommandLine(*argc, argv);
  Defaults() = defaults;
}

}  // namespace

uint64_t FaultSeed() {
  static const uint64_t seed =
      SeedSetting(absl::GetFlag(FLAGS_fault_seed), "FAULT_SEED");
  return seed;
}

int FaultTrials() {
  return Setting(absl::GetFlag(FLAGS_fault_trials), "FAULT_TRIALS",
                 Sanitizer() ? Defaults().sanitizer_trials : Defaults().trials);
}

int FaultHeartbeatTimeoutMs() {
  return Setting(absl::GetFlag(FLAGS_fault_heartbeat_timeout_ms),
                 "FAULT_HEARTBEAT_TIMEOUT_MS", DefaultHeartbeatTimeoutMs());
}

int OnlyTrial() {
  return Setting(absl::GetFlag(FLAGS_fault_trial), "FAULT_TRIAL", -1);
}

bool SkipTrial(int trial) { return OnlyTrial() >= 0 && trial != OnlyTrial(); }

std::string AnnounceTrial(const std::string& what, const std::string& replay) {
  std::printf("%s\n", what.c_str());
  std::fflush(stdout);
  return absl::StrCat(what, "; seed ", FaultSeed(), "; replay: ", replay);
}

int FaultTestMain(int argc, char** argv, const char* name,
                  const FaultDefaults& defaults) {
  InitFaultTest(&argc, argv, defaults);
  return RunAllTestsTimed(name);
}

std::string FaultReplayCommand(const std::string& test,
                               const std::string& filter, int trial) {
  std::string command =
      absl::StrCat("bazel test --config=opt //tests:", test, " --test_filter='",
                   filter, "' --test_arg=--fault_seed=", FaultSeed(),
                   " --test_arg=--fault_trial=", trial);
  if (FaultHeartbeatTimeoutMs() != DefaultHeartbeatTimeoutMs()) {
    absl::StrAppend(&command, " --test_arg=--fault_heartbeat_timeout_ms=",
                    FaultHeartbeatTimeoutMs());
  }
  return command;
}

}  // namespace ps::testing
