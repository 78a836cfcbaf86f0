// Helpers shared by the fuzz targets: a cursor over the fuzzer's bytes and
// the check that stops the run on a broken invariant.
#ifndef PS_TESTS_FUZZ_FUZZ_INPUT_H_
#define PS_TESTS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ps::fuzz {

// Reads little-endian integers and byte strings off the front of the
// input; every read fails (returns false) once the input is exhausted.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool U64(uint64_t* v) { return Raw(v, 8); }
  // n bytes as a view into the input.
  bool Bytes(size_t n, const uint8_t** p) {
    if (n > size_ - pos_) return false;
    *p = data_ + pos_;
    pos_ += n;
    return true;
  }
  // Everything not read yet.
  const uint8_t* rest() const { return data_ + pos_; }
  size_t remaining() const { return size_ - pos_; }

 private:
  bool Raw(void* v, size_t n) {
    if (n > size_ - pos_) return false;
    std::memcpy(v, data_ + pos_, n);
    pos_ += n;
    return true;
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A broken invariant of the code under test: a finding.
[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "FUZZ INVARIANT BROKEN: %s\n", what.c_str());
  std::abort();
}

#define PS_FUZZ_CHECK(cond, what)                                   \
  do {                                                              \
    if (!(cond)) ::ps::fuzz::Fail(std::string(#cond ": ") + (what)); \
  } while (0)

}  // namespace ps::fuzz

#endif  // PS_TESTS_FUZZ_FUZZ_INPUT_H_
