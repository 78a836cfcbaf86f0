// Starting and supervising real processes in multi-process tests.
//
// A Subprocess runs a binary with its stdout and stderr sent to files, so
// tests can read what it printed. The destructor kills a process still
// running (SIGKILL), so a failing test never leaves strays behind.
// Not thread-safe.
#ifndef PS_TESTS_TESTING_SUBPROCESS_H_
#define PS_TESTS_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

#include "common/status.h"

namespace ps::testing {

class Subprocess {
 public:
  // Starts `argv[0]` with `argv` (a name without '/' is looked up in
  // PATH); output goes to `stdout_path` and `stderr_path` (created or
  // truncated).
  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv,
                                          const std::string& stdout_path,
                                          const std::string& stderr_path);
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  bool running();
  // Waits for exit (for `timeout` times TimeoutScale()); the exit code,
  // 128 + signal for a signal, or DEADLINE_EXCEEDED (process left running).
  absl::StatusOr<int> Wait(absl::Duration timeout);
  void Signal(int sig);
  // When running() or Wait() first saw the process gone (so as precise as
  // the caller's polling); nullopt while it runs.
  std::optional<absl::Time> exited_at() const { return exited_at_; }

  const std::string& stdout_path() const { return stdout_path_; }
  const std::string& stderr_path() const { return stderr_path_; }

 private:
  Subprocess() = default;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::optional<absl::Time> exited_at_;
  std::string stdout_path_, stderr_path_;
};

// How many times longer than normal a test may wait for processes and
// files: PS_TIMEOUT_SCALE from the environment (.bazelrc's tsan config sets
// it: ThreadSanitizer runs every process 5-15 times slower), 1 when unset
// or not a number >= 1. Subprocess::Wait and WaitForFile apply it to their
// timeouts; tests apply it to their own time bounds.
double TimeoutScale();
// `d` scaled by TimeoutScale().
absl::Duration Scaled(absl::Duration d);

// The whole file, or "" if it cannot be read.
std::string ReadFile(const std::string& path);

// Path of a binary built by this workspace, from the test's runfiles,
// e.g. Runfile("server/server_main").
std::string Runfile(const std::string& workspace_relative);

// Polls until `path` exists and is non-empty, then returns its contents
// (DEADLINE_EXCEEDED after `timeout` times TimeoutScale()).
absl::StatusOr<std::string> WaitForFile(const std::string& path,
                                        absl::Duration timeout);

}  // namespace ps::testing

#endif  // PS_TESTS_TESTING_SUBPROCESS_H_
