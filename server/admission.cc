#include "server/admission.h"

#include <algorithm>
#include <limits>

#include "common/hash.h"

namespace ps {

AdmissionSketch::AdmissionSketch(uint32_t width, uint64_t seed)
    : width_(std::max<uint32_t>(width, 1)),
      seed_(seed),
      counters_(new uint16_t[size_t{kDepth} * width_]()) {}

size_t AdmissionSketch::Cell(int row, uint64_t key) const {
  // Independent-enough hashes per row from one 64-bit mix each.
  const uint64_t h = HashCombine(seed_ + static_cast<uint64_t>(row) * 0x9e3779b97f4a7c15ULL, key);
  return size_t{static_cast<uint32_t>(row)} * width_ +
         static_cast<size_t>((static_cast<unsigned __int128>(h) * width_) >> 64);
}

uint32_t AdmissionSketch::Estimate(uint64_t key) const {
  uint32_t m = std::numeric_limits<uint16_t>::max();
  for (int r = 0; r < kDepth; ++r) m = std::min<uint32_t>(m, counters_[Cell(r, key)]);
  return m;
}

uint32_t AdmissionSketch::Add(uint64_t key) {
  size_t cells[kDepth];
  uint32_t m = std::numeric_limits<uint16_t>::max();
  for (int r = 0; r < kDepth; ++r) {
    cells[r] = Cell(r, key);
    m = std::min<uint32_t>(m, counters_[cells[r]]);
  }
  if (m < std::numeric_limits<uint16_t>::max()) {
    for (size_t c : cells) {
      if (counters_[c] == m) counters_[c] = static_cast<uint16_t>(m + 1);
    }
    ++m;
  }
  if (++added_ >= uint64_t{8} * width_) {
    for (size_t i = 0; i < size_t{kDepth} * width_; ++i) counters_[i] >>= 1;
    added_ = 0;
    ++halvings_;
  }
  return m;
}

}  // namespace ps
