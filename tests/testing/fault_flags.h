// The --fault_* settings of the seeded fault tests (tests/fault_test.cc,
// pause_test.cc, scheduler_restart_test.cc), each also read from the
// environment when the flag is not given (--test_env=FAULT_SEED=5 under
// bazel test, or --test_arg=--fault_seed=5):
//   --fault_seed=N    (FAULT_SEED)    default 1; 0 picks one from the time
//   --fault_trials=N  (FAULT_TRIALS)  trials, the test's own default
//   --fault_trial=I   (FAULT_TRIAL)   run only trial I (replaying a failure)
//   --fault_heartbeat_timeout_ms=N (FAULT_HEARTBEAT_TIMEOUT_MS) the jobs'
//       cluster.heartbeat_timeout_ms, the test's own default
// The defaults depend on Sanitizer() (tests/testing/fault_trials.h).
//
// The flags are the test main's: it is FaultTestMain, which parses them
// before anything reads them. Thread-compatible.
#ifndef PS_TESTS_TESTING_FAULT_FLAGS_H_
#define PS_TESTS_TESTING_FAULT_FLAGS_H_

#include <cstdint>
#include <string>

namespace ps::testing {

// A test's defaults for what its flags and environment do not set.
struct FaultDefaults {
  int trials = 1;
  int sanitizer_trials = 1;  // under a sanitizer
  int heartbeat_timeout_ms = 1000;
  int sanitizer_heartbeat_timeout_ms = 3000;  // under a sanitizer
};

// The settings (fixed after the first call).
uint64_t FaultSeed();
int FaultTrials();
int FaultHeartbeatTimeoutMs();
// The only trial to run, or -1 for all; SkipTrial: `trial` is not run.
int OnlyTrial();
bool SkipTrial(int trial);

// Prints `what` (a trial's choices) and returns what a SCOPED_TRACE of the
// trial says: `what`, the seed and `replay` (the command that replays it).
std::string AnnounceTrial(const std::string& what, const std::string& replay);

// A fault test's main: parses the command line (gtest's flags, then the
// fault_* ones), sets the test's defaults, runs every test and prints how
// long they took (RunAllTestsTimed).
int FaultTestMain(int argc, char** argv, const char* name,
                  const FaultDefaults& defaults);

// The command that replays trial `trial` of the tests `filter` matches in
// //tests:`test`: its seed and trial, and the heartbeat timeout when it
// is not the default.
std::string FaultReplayCommand(const std::string& test,
                               const std::string& filter, int trial);

}  // namespace ps::testing

#endif  // PS_TESTS_TESTING_FAULT_FLAGS_H_
