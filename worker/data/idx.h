// Reader of the idx format of (Fashion-)MNIST, plain or gzip-compressed.
#ifndef PS_WORKER_DATA_IDX_H_
#define PS_WORKER_DATA_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace ps::data {

// An idx file of unsigned bytes: dims (big-endian in the file) and the
// data, row-major, product(dims) bytes.
struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;
};

// Reads the idx file at `path` (gzip or raw: zlib reads both) whose magic
// number must be `magic` (0x00000801 labels, 0x00000803 images: type byte
// 0x08 = unsigned byte, then the number of dimensions). Thread-safe.
// Errors, all naming the path: NOT_FOUND / PERMISSION_DENIED if it cannot be
// opened; DATA_LOSS for a wrong magic, a truncated header or data, bytes
// after the data, or corrupt gzip data. Memory grows with the bytes actually
// read, so a corrupt header claiming huge dims cannot exhaust it up front.
absl::StatusOr<IdxArray> ReadIdx(const std::string& path, uint32_t magic);

}  // namespace ps::data

#endif  // PS_WORKER_DATA_IDX_H_
