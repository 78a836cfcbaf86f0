// Picking the interpreter for a job's own command that starts with
// "python3", as deploy/choose_python.sh does for the demo and ps.sbatch:
// $PS_PYTHON if set, else the first of PATH's python3 and /usr/bin/python3
// that imports what the script imports of NumPy and PyTorch. psnode never
// installs anything: when none will do it stops with one line naming each
// interpreter, what it lacks and the fix.
//
// Thread-compatible; ChoosePython runs the interpreters through `probe`.
#ifndef PS_DEPLOY_LAUNCH_PYTHON_CHECK_H_
#define PS_DEPLOY_LAUNCH_PYTHON_CHECK_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/status.h"

namespace ps {

// The modules of NumPy and PyTorch the script at `script_path` imports,
// given its text (nullopt: unreadable): "numpy" for numpy or the ps
// package, then "torch" for torch or ps.torch. A path that is not a .py
// file, or an unreadable one, needs numpy (the ps package).
std::vector<std::string> PythonNeeds(absl::string_view script_path,
                                     const std::optional<std::string>& text);

// Which of `modules` `python` cannot import (empty: all of them); nullopt
// when `python` is not installed or does not run.
using PythonProbe = std::function<std::optional<std::vector<std::string>>(
    const std::string& python, const std::vector<std::string>& modules)>;

// Runs `python -c ...` (found on PATH when it has no '/'), its output read
// back; nullopt when it cannot be run or exits non-zero.
std::optional<std::vector<std::string>> ProbePython(
    const std::string& python, const std::vector<std::string>& modules);

struct PythonChoice {
  // The interpreter to run.
  std::string python;
  // What each interpreter tried before it lacked; empty when the first did.
  std::string notes;
};

// The interpreter for `script_path` (needing `needs`): candidates are
// {ps_python} when that is not empty, else {path_python, /usr/bin/python3}
// (path_python: PATH's python3, "" when PATH has none). FAILED_PRECONDITION
// with one line "no python3 can run SCRIPT, which needs ...: <notes>; fix:
// ..." when none imports them all.
absl::StatusOr<PythonChoice> ChoosePython(absl::string_view script_path,
                                          const std::vector<std::string>& needs,
                                          const std::string& ps_python,
                                          const std::string& path_python,
                                          const PythonProbe& probe);

// PATH's `name` ("" if none is executable).
std::string FindOnPath(const std::string& name);

}  // namespace ps

#endif  // PS_DEPLOY_LAUNCH_PYTHON_CHECK_H_
