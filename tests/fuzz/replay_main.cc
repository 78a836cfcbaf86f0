// A main() for the libFuzzer targets in the normal (gcc) build: runs
// LLVMFuzzerTestOneInput over every file of the directories (or the files)
// named on the command line, and over 16 truncations of each, so that
// `bazel test //...` replays the seed and regression corpora through the
// decoders on every run. A crash, a sanitizer report or an abort fails the
// test by ending the process; an empty corpus fails it too (a replay of
// nothing would pass whatever the code did).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

// Runs the target on an exactly-sized heap copy, as libFuzzer does, so
// that a sanitizer sees any read past the end.
void RunOne(const std::vector<char>& bytes, size_t size) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[size == 0 ? 1 : size]);
  if (size > 0) std::memcpy(copy.get(), bytes.data(), size);
  LLVMFuzzerTestOneInput(copy.get(), size);
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    if (std::filesystem::is_directory(arg)) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(arg)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else if (std::filesystem::is_regular_file(arg)) {
      files.push_back(arg);
    } else {
      std::fprintf(stderr, "replay: %s is neither a file nor a directory\n", argv[i]);
      return 2;
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "replay: no inputs found\n");
    return 2;
  }
  std::sort(files.begin(), files.end());
  size_t runs = 0;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
    if (!in.eof() && in.fail()) {
      std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
      return 2;
    }
    RunOne(bytes, bytes.size());
    ++runs;
    // Truncations: what a peer or a disk that stops early produces.
    constexpr size_t kCuts = 16;
    for (size_t k = 0; k < kCuts && bytes.size() > 1; ++k) {
      const size_t size = bytes.size() * k / kCuts;
      RunOne(bytes, size);
      ++runs;
    }
  }
  std::printf("replay: %zu files, %zu runs, no crash\n", files.size(), runs);
  return 0;
}
