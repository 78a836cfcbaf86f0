// Admission filter for sparse tables: counts pushes of keys that have no
// row yet, in fixed memory, so that ids seen once (most ids of a CTR
// stream) never get a row.
//
// A count-min sketch of 4 rows of `width` 16-bit counters with conservative
// update: each push raises only the counters at the key's current minimum,
// so a key's estimate is exactly one more after each of its pushes (until
// 65535) plus whatever colliding keys added. Estimates never undercount:
// a key may be admitted early, never late. After every 8 * width counted
// pushes all counters are halved, so old counts fade.
//
// Not thread-safe; owned by one table.
#ifndef PS_SERVER_ADMISSION_H_
#define PS_SERVER_ADMISSION_H_

#include <cstddef>
#include <cstdint>
#include <memory>

namespace ps {

class AdmissionSketch {
 public:
  static constexpr int kDepth = 4;

  // width: counters per row, >= 1.
  AdmissionSketch(uint32_t width, uint64_t seed);

  // The count of `key` so far (no change).
  uint32_t Estimate(uint64_t key) const;

  // Counts one push of `key`; returns its new estimate.
  uint32_t Add(uint64_t key);

  size_t MemoryBytes() const {
    return size_t{kDepth} * width_ * sizeof(uint16_t);
  }
  // Number of halvings so far.
  uint64_t halvings() const { return halvings_; }

 private:
  size_t Cell(int row, uint64_t key) const;

  const uint32_t width_;
  const uint64_t seed_;
  uint64_t added_ = 0;
  uint64_t halvings_ = 0;
  std::unique_ptr<uint16_t[]> counters_;  // kDepth * width_
};

}  // namespace ps

#endif  // PS_SERVER_ADMISSION_H_
