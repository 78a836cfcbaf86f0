// Pieces of the file format shared by format.cc (shard files) and
// catalog.cc (the MANIFEST, and Verify's whole-file checks). Internal to
// //checkpoint. Thread-compatible.
#ifndef PS_CHECKPOINT_FORMAT_INTERNAL_H_
#define PS_CHECKPOINT_FORMAT_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "checkpoint/checkpoint_io.h"
#include "common/status.h"

namespace ps {
namespace checkpoint_internal {

inline constexpr char kShardMagic[8] = {'P', 'S', 'C', 'K', 'S', 'H', 'R', 'D'};
inline constexpr char kManifestMagic[8] = {'P', 'S', 'C', 'K', 'M', 'N', 'F', 'T'};
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr size_t kPreambleBytes = 16;
inline constexpr size_t kRecordHeaderBytes = 24;
inline constexpr size_t kChecksumBytes = 8;

// Reads a file's preamble, checking the magic number and version; returns
// its last field (0 in shard files, the payload size in a MANIFEST).
// DATA_LOSS naming what is wrong.
absl::StatusOr<uint32_t> ReadPreamble(FileReader& file, const char (&magic)[8]);

// Checks the whole-file checksum in the last kChecksumBytes bytes, which
// must be all that is left to read, against the bytes read and `listed`
// (the MANIFEST's value). DATA_LOSS naming what is wrong.
absl::Status ReadTrailer(FileReader& file, uint64_t listed);

// Opens `file` in `dir`, a file a manifest lists: a missing file is lost
// data (DATA_LOSS), other errors are the errno's code.
absl::StatusOr<std::unique_ptr<FileReader>> OpenListed(const std::string& dir,
                                                       const std::string& file);

}  // namespace checkpoint_internal
}  // namespace ps

#endif  // PS_CHECKPOINT_FORMAT_INTERNAL_H_
