// Keys of sparse features read from text files. They define which
// parameter row a feature trains, so they must never change between versions
// that share a model or checkpoint.
#ifndef PS_WORKER_DATA_KEYS_H_
#define PS_WORKER_DATA_KEYS_H_

#include <cstdint>

#include "common/hash.h"

namespace ps::data {

// Key of Criteo categorical field `field` (0..25) with value `value` (the
// hexadecimal digits as a number). kCriteoMissing cannot be the
// value of 8 hexadecimal digits, so "missing" never collides with a value.
inline constexpr uint64_t kCriteoMissing = uint64_t{1} << 32;
inline uint64_t CriteoKey(uint32_t field, uint64_t value) {
  return HashCombine(Mix64(0x43726974656f0000ULL + field), value);
}
inline uint64_t LibsvmKey(uint64_t index) {
  return HashCombine(0x6c6962737666ULL, index);
}

}  // namespace ps::data

#endif  // PS_WORKER_DATA_KEYS_H_
