// File primitives of the checkpoint format (checkpoint/format.cc,
// checkpoint/catalog.cc): a streaming XXH64, a buffered writer and reader
// that checksum everything they pass, and durable
// (tmp + fsync + rename + directory fsync) file replacement on
// common/durable_file.h. Internal to checkpoints; not a
// general-purpose API. Thread-compatible.
#ifndef PS_CHECKPOINT_CHECKPOINT_IO_H_
#define PS_CHECKPOINT_CHECKPOINT_IO_H_

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "common/durable_file.h"
#include "common/status.h"

namespace ps {
namespace checkpoint_internal {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint files are little-endian: add byte swapping to "
              "port this to a big-endian machine");

inline uint64_t Load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t Load32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void Put32(unsigned char* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline void Put64(unsigned char* p, uint64_t v) { std::memcpy(p, &v, 8); }

// Streaming XXH64 (https://github.com/Cyan4973/xxHash, the XXH64 spec): four
// independent lanes, so it runs at memory speed, and the same digest
// however the input is split into Update calls.
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void Update(const void* data, size_t n);
  // The digest of everything so far; Update may go on after it.
  uint64_t Digest() const;

 private:
  void Stripe(const unsigned char* p);

  uint64_t seed_;
  uint64_t v_[4];
  unsigned char buffer_[32];
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

// dir + "/" + name (no doubled slash; name alone if dir is empty).
std::string JoinPath(absl::string_view dir, absl::string_view name);

// The status of errno `err` for an operation on `path`.
absl::Status IoError(int err, absl::string_view what, absl::string_view path);

// DATA_LOSS "file: what".
absl::Status Corrupt(absl::string_view file, absl::string_view what);

// fsync of a directory, so that entries created or renamed in it survive a
// crash (FileEnv::Default()).
absl::Status SyncDir(const std::string& dir);

// Creates dir and its parents, and makes the new entries durable.
absl::Status MakeDirs(const std::string& dir);

// Appends to a file being written through a 1 MiB buffer, checksumming
// everything appended. Does not own the file; Flush before closing it.
class FileWriter {
 public:
  explicit FileWriter(WritableFile* file);

  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  absl::Status Append(const void* data, size_t n);
  // Checksum and size of everything appended so far.
  uint64_t checksum() const { return hash_.Digest(); }
  uint64_t bytes() const { return bytes_; }
  // Hands the buffered bytes to the file.
  absl::Status Flush();

 private:
  WritableFile* const file_;
  std::unique_ptr<char[]> buffer_;
  size_t buffered_ = 0;
  uint64_t bytes_ = 0;
  Xxh64 hash_;
};

// Reads a file front to back through a 1 MiB buffer, checksumming every
// byte read. The size is taken when the file is opened; the file ending
// early is DATA_LOSS.
class FileReader {
 public:
  // `name` is how errors refer to the file. The errno's code if it cannot
  // be opened (NOT_FOUND if it does not exist); DATA_LOSS if it is not a
  // regular file.
  static absl::StatusOr<std::unique_ptr<FileReader>> Open(const std::string& path,
                                                          std::string name);

  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;
  ~FileReader();

  const std::string& name() const { return name_; }
  uint64_t size() const { return size_; }
  uint64_t position() const { return position_; }
  uint64_t remaining() const { return size_ - position_; }
  // Checksum of every byte read so far.
  uint64_t checksum() const { return hash_.Digest(); }

  // Reads exactly n bytes; DATA_LOSS if the file ends first or a read fails.
  absl::Status Read(void* dst, size_t n);

 private:
  FileReader(int fd, std::string name, uint64_t size);
  // Reads up to `want` bytes into dst, at least `need`; sets filled_.
  absl::Status ReadFd(char* dst, size_t want, size_t need);

  const int fd_;
  const std::string name_;
  const uint64_t size_;
  uint64_t position_ = 0;
  std::unique_ptr<char[]> buffer_;
  size_t begin_ = 0;  // unread bytes of buffer_: [begin_, end_)
  size_t end_ = 0;
  size_t filled_ = 0;
  Xxh64 hash_;
};

// Writes `path` (in directory `dir`) durably (common/durable_file.h):
// `fill(FileWriter&) -> absl::Status` appends the content to a writer on
// path + ".tmp", which is then fsync'd, renamed to path, and the directory
// fsync'd. Returns the file's size. Every step's error is returned; on an
// error before the rename, the tmp file is removed and path is untouched.
template <typename Fill>
absl::StatusOr<uint64_t> WriteFileAtomically(
    const std::string& dir, const std::string& path, Fill fill,
    FileEnv& env = *FileEnv::Default()) {
  uint64_t written = 0;
  PS_RETURN_IF_ERROR(
      WriteFileDurably(env, dir, path, [&](WritableFile& file) -> absl::Status {
        FileWriter out(&file);
        PS_RETURN_IF_ERROR(fill(out));
        written = out.bytes();
        return out.Flush();
      }));
  return written;
}

}  // namespace checkpoint_internal
}  // namespace ps

#endif  // PS_CHECKPOINT_CHECKPOINT_IO_H_
