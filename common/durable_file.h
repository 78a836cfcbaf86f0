// Durable replacement of a whole file: write a temporary file beside it,
// fsync it, rename it over the old one, fsync the directory. A reader (or
// a process started after a crash) sees the previous file or the new one,
// never a mix. Used by the scheduler's journal (scheduler/journal.cc) and
// the checkpoint files (checkpoint/checkpoint_io.h).
//
// The file operations go through FileEnv, so a test can make each step
// fail (leveldb's Env, reduced to what this needs). FileEnv::Default() is
// the POSIX one; it is thread-safe and never destroyed. A WritableFile is
// used by one thread at a time.
#ifndef PS_COMMON_DURABLE_FILE_H_
#define PS_COMMON_DURABLE_FILE_H_

#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "common/status.h"

namespace ps {

// A file being written. Errors carry the errno's code and name the path.
class WritableFile {
 public:
  virtual ~WritableFile() = default;  // closes the file if Close did not
  virtual absl::Status Append(absl::string_view data) = 0;
  // fsync: the data written so far survives a machine crash.
  virtual absl::Status Sync() = 0;
  // Further calls after Close are errors.
  virtual absl::Status Close() = 0;
};

class FileEnv {
 public:
  virtual ~FileEnv() = default;
  // The POSIX file system.
  static FileEnv* Default();

  // Creates or truncates `path`.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // rename(2): atomically replaces `to`.
  virtual absl::Status RenameFile(const std::string& from,
                                  const std::string& to) = 0;
  // OK when there is nothing to remove.
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // fsync of a directory, so that entries created or renamed in it survive
  // a crash. "" is the working directory.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  // Creates `dir` and its missing parents (mode 0755); OK when it exists.
  // Syncs the parent of each directory it creates.
  virtual absl::Status CreateDirs(const std::string& dir) = 0;
};

struct DurableWriteOptions {
  // fsync the file before the rename and the directory after it, so the
  // new file survives a machine crash. Without it the replacement is still
  // atomic and survives the writing process being killed (the data is in
  // the kernel's page cache once rename returns).
  bool sync = true;
};

// Replaces `path` (in directory `dir`, which must exist) with what `fill`
// appends to a temporary file `path`.tmp. Every step's error is returned,
// the directory fsync's included. On an error up to and including the
// rename, the temporary file is removed and `path` is left as it was. An
// error of the directory fsync comes after the rename: `path` then holds
// the new content, complete, but the rename may not survive a crash.
absl::Status WriteFileDurably(
    FileEnv& env, const std::string& dir, const std::string& path,
    absl::FunctionRef<absl::Status(WritableFile&)> fill,
    DurableWriteOptions options = {});

// The same for a string's content.
absl::Status WriteStringDurably(FileEnv& env, const std::string& dir,
                                const std::string& path,
                                absl::string_view content,
                                DurableWriteOptions options = {});

}  // namespace ps

#endif  // PS_COMMON_DURABLE_FILE_H_
