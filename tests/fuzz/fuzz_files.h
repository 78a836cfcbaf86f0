// A private scratch directory per fuzzing process, for targets whose code
// under test reads files (checkpoints, data files). Files are rewritten
// with plain writes, no fsync: the fuzzer runs thousands a second.
#ifndef PS_TESTS_FUZZ_FUZZ_FILES_H_
#define PS_TESTS_FUZZ_FUZZ_FILES_H_

#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace ps::fuzz {

// The process's scratch directory (created on first use under /dev/shm
// when it exists, else $TEST_TMPDIR or /tmp), removed at exit.
inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    std::string base = "/tmp";
    if (access("/dev/shm", W_OK) == 0) {
      base = "/dev/shm";
    } else if (const char* t = std::getenv("TEST_TMPDIR"); t != nullptr) {
      base = t;
    }
    std::string templ = base + "/ps-fuzz-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    auto* d = new std::string(templ);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(ScratchDir(), ignored);
    });
    return d;
  }();
  return *dir;
}

// Writes `size` bytes to `path` (truncating); aborts on an I/O error,
// which is the harness's problem, not a finding.
inline void WriteFileOrDie(const std::string& path, const void* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) ||
      std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
}

}  // namespace ps::fuzz

#endif  // PS_TESTS_FUZZ_FUZZ_FILES_H_
