// Helpers shared by the worker/data tests.
#ifndef PS_WORKER_DATA_TEST_UTIL_H_
#define PS_WORKER_DATA_TEST_UTIL_H_

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace ps::data::testing {

// A fresh path under TEST_TMPDIR (or /tmp).
inline std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

inline std::string WriteFile(const std::string& name,
                             const std::string& content) {
  const std::string path = TempPath(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  EXPECT_TRUE(out.good()) << path;
  return path;
}

// A well-formed Criteo line for example `i`: C1 holds i in hex, so the key
// of field 0 identifies the example; some fields empty, one negative.
inline std::string CriteoLine(uint64_t i) {
  std::string line = absl::StrCat(i % 2);
  for (int j = 0; j < 13; ++j) {
    if ((i + j) % 5 == 0) {
      absl::StrAppend(&line, "\t");
    } else if (j == 3) {
      absl::StrAppend(&line, "\t-", j);
    } else {
      absl::StrAppend(&line, "\t", (i * 7 + j) % 3000);
    }
  }
  absl::StrAppend(&line, absl::StrFormat("\t%x", i));
  for (int f = 1; f < 26; ++f) {
    if ((i + f) % 7 == 0) {
      absl::StrAppend(&line, "\t");
    } else {
      absl::StrAppend(&line, absl::StrFormat("\t%08x", (i * 2654435761u + f) &
                                                          0xffffffffu));
    }
  }
  return line;
}

}  // namespace ps::data::testing

#endif  // PS_WORKER_DATA_TEST_UTIL_H_
