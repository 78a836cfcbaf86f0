#include "deploy/launch/python_check.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(PythonCheckTest, NeedsFollowTheScriptsImports) {
  EXPECT_THAT(PythonNeeds("train.py", "import argparse\nimport os\n"),
              IsEmpty());
  EXPECT_THAT(PythonNeeds("train.py", "import numpy as np\n"),
              ElementsAre("numpy"));
  EXPECT_THAT(PythonNeeds("train.py", "  from ps import Session\n"),
              ElementsAre("numpy"));
  EXPECT_THAT(PythonNeeds("train.py", "import ps.torch\n"),
              ElementsAre("numpy", "torch"));
  // Words elsewhere than an import line, or inside another word, do not count.
  EXPECT_THAT(
      PythonNeeds("train.py", "# uses numpy\nimport psutil\nx = 'torch'\n"),
      IsEmpty());
  // Not a .py file, or unreadable: the ps package at least.
  EXPECT_THAT(PythonNeeds("train", "import os\n"), ElementsAre("numpy"));
  EXPECT_THAT(PythonNeeds("train.py", std::nullopt), ElementsAre("numpy"));
}

// A fake interpreter per path: what it lacks; absent = not installed.
PythonProbe Fake(std::map<std::string, std::vector<std::string>> lacks) {
  return [lacks](const std::string& python,
                 const std::vector<std::string>& modules)
             -> std::optional<std::vector<std::string>> {
    auto it = lacks.find(python);
    if (it == lacks.end()) return std::nullopt;
    std::vector<std::string> missing;
    for (const std::string& m : modules) {
      for (const std::string& l : it->second) {
        if (l == m) missing.push_back(m);
      }
    }
    return missing;
  };
}

TEST(PythonCheckTest, ThePathsPython3FirstThenDebians) {
  auto choice = ChoosePython(
      "/c/train.py", {"numpy"}, "", "/opt/py/bin/python3",
      Fake({{"/opt/py/bin/python3", {"numpy"}}, {"/usr/bin/python3", {}}}));
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->python, "/usr/bin/python3");
  EXPECT_EQ(choice->notes, "/opt/py/bin/python3 has no numpy");

  choice = ChoosePython("/c/train.py", {"numpy"}, "", "/usr/bin/python3",
                        Fake({{"/usr/bin/python3", {}}}));
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->python, "/usr/bin/python3");
  EXPECT_EQ(choice->notes, "");
}

TEST(PythonCheckTest, NoneWillDoIsOneLineNamingEachInterpreterAndTheFix) {
  auto choice =
      ChoosePython("/c/train.py", {"numpy", "torch"}, "", "/opt/py/bin/python3",
                   Fake({{"/opt/py/bin/python3", {"numpy", "torch"}}}));
  ASSERT_FALSE(choice.ok());
  EXPECT_EQ(choice.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(choice.status().message());
  EXPECT_EQ(message.find('\n'), std::string::npos);
  EXPECT_THAT(
      message,
      HasSubstr("no python3 can run train.py, which needs numpy, torch: "
                "/opt/py/bin/python3 has no numpy, no torch; "
                "/usr/bin/python3 is not installed or does not run; fix: "));
  EXPECT_THAT(message, HasSubstr("--python --torch"));

  // PS_PYTHON is the only candidate, and the fix names it.
  choice = ChoosePython(
      "/c/train.py", {"numpy"}, "/venv/bin/python", "/usr/bin/python3",
      Fake({{"/venv/bin/python", {"numpy"}}, {"/usr/bin/python3", {}}}));
  ASSERT_FALSE(choice.ok());
  EXPECT_THAT(
      std::string(choice.status().message()),
      HasSubstr("/venv/bin/python has no numpy; fix: pip install numpy for "
                "PS_PYTHON=/venv/bin/python, or unset PS_PYTHON"));
}

TEST(PythonCheckTest, ProbeRunsARealInterpreter) {
  const std::string python = FindOnPath("python3");
  if (python.empty()) GTEST_SKIP() << "no python3 on PATH";
  auto missing = ProbePython(python, {"os", "no_such_module_xyz"});
  ASSERT_TRUE(missing.has_value());
  EXPECT_THAT(*missing, ElementsAre("no_such_module_xyz"));
  EXPECT_FALSE(ProbePython("/nonexistent/python3", {"os"}).has_value());
}

}  // namespace
}  // namespace ps
