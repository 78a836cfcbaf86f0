#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace ps::testing {

absl::StatusOr<Subprocess> Subprocess::Start(
    const std::vector<std::string>& argv, const std::string& stdout_path,
    const std::string& stderr_path) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, stdout_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  Subprocess p;
  // A bare name ("ip") is looked up in PATH, a path is run as given.
  const int rc =
      argv[0].find('/') == std::string::npos
          ? posix_spawnp(&p.pid_, argv[0].c_str(), &actions, nullptr, args.data(), environ)
          : posix_spawn(&p.pid_, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": errno ", rc));
  }
  p.stdout_path_ = stdout_path;
  p.stderr_path_ = stderr_path;
  return p;
}

Subprocess::Subprocess(Subprocess&& other) noexcept { *this = std::move(other); }

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  std::swap(pid_, other.pid_);
  std::swap(exit_code_, other.exit_code_);
  std::swap(exited_at_, other.exited_at_);
  std::swap(stdout_path_, other.stdout_path_);
  std::swap(stderr_path_, other.stderr_path_);
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exit_code_.has_value()) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

bool Subprocess::running() {
  if (exit_code_.has_value() || pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    exited_at_ = absl::Now();
    return false;
  }
  return true;
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + Scaled(timeout);
  while (running()) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " still running"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return *exit_code_;
}

void Subprocess::Signal(int sig) {
  if (running()) kill(pid_, sig);
}

double TimeoutScale() {
  const char* s = std::getenv("PS_TIMEOUT_SCALE");
  double scale = 1;
  if (s == nullptr || !absl::SimpleAtod(s, &scale) || !(scale >= 1)) return 1;
  return scale;
}

absl::Duration Scaled(absl::Duration d) { return d * TimeoutScale(); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Runfile(const std::string& workspace_relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "ps",
                      "/", workspace_relative);
}

absl::StatusOr<std::string> WaitForFile(const std::string& path,
                                        absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + Scaled(timeout);
  while (absl::Now() < deadline) {
    std::string contents = ReadFile(path);
    if (!contents.empty()) return contents;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat("no file ", path));
}

}  // namespace ps::testing
