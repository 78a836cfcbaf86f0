// File primitives of the checkpoint format (checkpoint/format.cc,
// checkpoint/catalog.cc): a streaming XXH64, a buffered writer and reader
// that checksum everything they pass, and durable
// (tmp + fsync + rename) file replacement. Internal to checkpoints; not a
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

#include "absl/cleanup/cleanup.h"
#include "absl/strings/string_view.h"
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
// crash.
absl::Status SyncDir(const std::string& dir);

// Creates dir and its parents, and makes the new entries durable.
absl::Status MakeDirs(const std::string& dir);

// Writes a new file through a 1 MiB buffer, checksumming everything
// appended.
class FileWriter {
 public:
  // Creates or truncates path.
  static absl::StatusOr<std::unique_ptr<FileWriter>> Create(const std::string& path);

  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  ~FileWriter();  // closes the file if SyncAndClose did not

  absl::Status Append(const void* data, size_t n);
  // Checksum and size of everything appended so far.
  uint64_t checksum() const { return hash_.Digest(); }
  uint64_t bytes() const { return bytes_; }
  absl::Status SyncAndClose();

 private:
  FileWriter(int fd, std::string path);
  absl::Status Flush();
  absl::Status WriteAll(const char* p, size_t n);

  int fd_;
  const std::string path_;
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

// Writes `path` (in directory `dir`) durably: `fill(FileWriter&) ->
// absl::Status` appends the content to a writer on path + ".tmp", which is
// then fsync'd, renamed to path, and the directory fsync'd. Returns the
// file's size. On an error before the rename, the tmp file is removed and
// path is untouched.
template <typename Fill>
absl::StatusOr<uint64_t> WriteFileAtomically(const std::string& dir,
                                             const std::string& path, Fill fill) {
  const std::string tmp = path + ".tmp";
  PS_ASSIGN_OR_RETURN(std::unique_ptr<FileWriter> out, FileWriter::Create(tmp));
  absl::Cleanup remove_tmp = [&] {
    out.reset();
    ::unlink(tmp.c_str());
  };
  PS_RETURN_IF_ERROR(fill(*out));
  const uint64_t written = out->bytes();
  PS_RETURN_IF_ERROR(out->SyncAndClose());
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return IoError(errno, "cannot rename to", path);
  }
  std::move(remove_tmp).Cancel();
  PS_RETURN_IF_ERROR(SyncDir(dir));
  return written;
}

}  // namespace checkpoint_internal
}  // namespace ps

#endif  // PS_CHECKPOINT_CHECKPOINT_IO_H_
