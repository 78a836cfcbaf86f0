#include "deploy/launch/python_check.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "deploy/launch/python_probe.h"

namespace ps {

namespace {

std::string Basename(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return std::string(slash == absl::string_view::npos ? path
                                                      : path.substr(slash + 1));
}

}  // namespace

std::vector<std::string> PythonNeeds(absl::string_view script_path,
                                     const std::optional<std::string>& text) {
  if (!absl::EndsWith(script_path, ".py") || !text.has_value())
    return {"numpy"};
  static const std::regex kImport(R"(^[ \t]*(import|from)[ \t])");
  static const std::regex kAny(R"(\b(numpy|ps|torch)\b)");
  static const std::regex kTorch(R"(\btorch\b)");
  bool numpy = false, torch = false;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    const std::string l(line);
    if (!std::regex_search(l, kImport)) continue;
    numpy = numpy || std::regex_search(l, kAny);
    torch = torch || std::regex_search(l, kTorch);
  }
  std::vector<std::string> needs;
  if (numpy) needs.push_back("numpy");
  if (torch) needs.push_back("torch");
  return needs;
}

std::optional<std::vector<std::string>> ProbePython(
    const std::string& python, const std::vector<std::string>& modules) {
  int out[2];
  if (pipe(out) != 0) return std::nullopt;
  std::vector<std::string> args = {python, "-c", kPythonProbe};
  args.insert(args.end(), modules.begin(), modules.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return std::nullopt;
  if (pid == 0) {
    dup2(out[1], 1);
    const int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 2);
    close(out[0]);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buf[256];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof(buf))) > 0) text.append(buf, n);
  close(out[0]);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    return std::nullopt;
  }
  return std::vector<std::string>(
      absl::StrSplit(text, absl::ByAnyChar(" \n"), absl::SkipEmpty()));
}

absl::StatusOr<PythonChoice> ChoosePython(absl::string_view script_path,
                                          const std::vector<std::string>& needs,
                                          const std::string& ps_python,
                                          const std::string& path_python,
                                          const PythonProbe& probe) {
  std::vector<std::string> candidates;
  if (!ps_python.empty()) {
    candidates = {ps_python};
  } else {
    if (!path_python.empty()) candidates.push_back(path_python);
    if (path_python != "/usr/bin/python3")
      candidates.push_back("/usr/bin/python3");
  }
  std::vector<std::string> notes;
  for (const std::string& c : candidates) {
    const std::optional<std::vector<std::string>> missing = probe(c, needs);
    if (!missing.has_value()) {
      notes.push_back(absl::StrCat(c, " is not installed or does not run"));
    } else if (!missing->empty()) {
      notes.push_back(
          absl::StrCat(c, " has no ", absl::StrJoin(*missing, ", no ")));
    } else {
      return PythonChoice{c, absl::StrJoin(notes, "; ")};
    }
  }
  const std::string need = absl::StrJoin(needs, ", ");
  const std::string fix =
      !ps_python.empty()
          ? absl::StrCat("pip install ", absl::StrJoin(needs, " "),
                         " for PS_PYTHON=", ps_python, ", or unset PS_PYTHON")
          : absl::StrCat(
                "install ", need.empty() ? "it" : need,
                " for python3 in the image (Debian: deploy/install_deps.sh "
                "--python",
                absl::StrContains(need, "torch") ? " --torch" : "",
                "), or set PS_PYTHON to a python3 that has it");
  return absl::FailedPreconditionError(
      absl::StrCat("no python3 can run ",
                   script_path.empty() ? "python3" : Basename(script_path),
                   need.empty() ? "" : absl::StrCat(", which needs ", need),
                   ": ", absl::StrJoin(notes, "; "), "; fix: ", fix));
}

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace ps
