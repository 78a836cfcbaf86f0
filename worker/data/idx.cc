#include "worker/data/idx.h"

#include <errno.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include "common/status.h"

namespace ps::data {
namespace {

// Reads up to `n` bytes; fewer only at end of file. DATA_LOSS on a gzip or
// read error.
absl::StatusOr<size_t> ReadSome(gzFile f, const std::string& path, void* dst,
                                size_t n) {
  size_t got = 0;
  while (got < n) {
    const unsigned want =
        static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30));
    const int r = gzread(f, static_cast<char*>(dst) + got, want);
    if (r < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      return absl::DataLossError(absl::StrCat(
          path, ": ", code == Z_ERRNO ? strerror(errno) : msg));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdx(const std::string& path, uint32_t magic) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    const std::string msg = absl::StrCat("cannot open ", path, ": ",
                                         errno != 0 ? strerror(errno) : "");
    if (errno == EACCES || errno == EPERM) {
      return absl::PermissionDeniedError(msg);
    }
    return absl::NotFoundError(msg);
  }
  absl::Cleanup closer = [f] { gzclose(f); };
  gzbuffer(f, 1 << 20);

  unsigned char header[4];
  absl::StatusOr<size_t> got = ReadSome(f, path, header, 4);
  if (!got.ok()) return got.status();
  if (*got < 4) {
    return absl::DataLossError(absl::StrCat(path, ": truncated idx header"));
  }
  const uint32_t found = (uint32_t{header[0]} << 24) |
                         (uint32_t{header[1]} << 16) |
                         (uint32_t{header[2]} << 8) | header[3];
  if (found != magic) {
    return absl::DataLossError(absl::StrFormat(
        "%s: idx magic number is 0x%08x, expected 0x%08x (not an idx file "
        "of this kind, or a corrupt one)",
        path, found, magic));
  }
  IdxArray out;
  const int ndims = header[3];
  uint64_t total = 1;
  for (int i = 0; i < ndims; ++i) {
    unsigned char d[4];
    got = ReadSome(f, path, d, 4);
    if (!got.ok()) return got.status();
    if (*got < 4) {
      return absl::DataLossError(absl::StrCat(path, ": truncated idx header"));
    }
    const uint32_t dim = (uint32_t{d[0]} << 24) | (uint32_t{d[1]} << 16) |
                         (uint32_t{d[2]} << 8) | d[3];
    out.dims.push_back(dim);
    // Saturate: the truncation check below rejects such a file anyway.
    total = (dim != 0 && total > (uint64_t{1} << 48) / dim) ? (uint64_t{1} << 48)
                                                           : total * dim;
  }
  // Grow in chunks as data arrives (see the header).
  constexpr size_t kChunk = size_t{16} << 20;
  while (out.data.size() < total) {
    const size_t have = out.data.size();
    const size_t want = static_cast<size_t>(
        std::min<uint64_t>(kChunk, total - have));
    out.data.resize(have + want);
    got = ReadSome(f, path, out.data.data() + have, want);
    if (!got.ok()) return got.status();
    if (*got < want) {
      return absl::DataLossError(absl::StrCat(
          path, ": truncated: the header promises ", total,
          " bytes of data, the file holds ", have + *got));
    }
  }
  unsigned char extra;
  got = ReadSome(f, path, &extra, 1);
  if (!got.ok()) return got.status();
  if (*got != 0) {
    return absl::DataLossError(absl::StrCat(
        path, ": has bytes after the ", total, " bytes of data its header "
        "promises"));
  }
  return out;
}

}  // namespace ps::data
