#include "common/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

absl::Status IoError(int err, absl::string_view what, absl::string_view path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path)
      : fd_(fd), path_(std::move(path)) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(absl::string_view data) override {
    if (fd_ < 0)
      return absl::FailedPreconditionError(absl::StrCat(path_, " is closed"));
    while (!data.empty()) {
      const ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoError(errno, "cannot write", path_);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fd_ < 0)
      return absl::FailedPreconditionError(absl::StrCat(path_, " is closed"));
    if (::fsync(fd_) != 0) return IoError(errno, "cannot fsync", path_);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    if (fd_ < 0)
      return absl::FailedPreconditionError(absl::StrCat(path_, " is closed"));
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return IoError(errno, "cannot close", path_);
    return absl::OkStatus();
  }

 private:
  int fd_;
  const std::string path_;
};

class PosixFileEnv final : public FileEnv {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    const int fd =
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return IoError(errno, "cannot create", path);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, path));
  }

  absl::Status RenameFile(const std::string& from,
                          const std::string& to) override {
    if (std::rename(from.c_str(), to.c_str()) != 0) {
      return IoError(errno, absl::StrCat("cannot rename ", from, " to"), to);
    }
    return absl::OkStatus();
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return IoError(errno, "cannot remove", path);
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.empty() ? "." : dir.c_str(),
                          O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return IoError(errno, "cannot open directory", dir);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return IoError(err, "cannot fsync directory", dir);
    return absl::OkStatus();
  }

  absl::Status CreateDirs(const std::string& dir) override {
    // Each prefix ending at a '/' (and the whole path), shortest first.
    for (size_t i = 1; i <= dir.size(); ++i) {
      if (i != dir.size() && dir[i] != '/') continue;
      const std::string prefix = dir.substr(0, i);
      if (::mkdir(prefix.c_str(), 0755) == 0) {
        // The new directory's own entry lives in its parent.
        const size_t slash = prefix.rfind('/');
        const std::string parent =
            slash == std::string::npos
                ? ""
                : (slash == 0 ? "/" : prefix.substr(0, slash));
        PS_RETURN_IF_ERROR(SyncDir(parent));
      } else if (errno != EEXIST) {
        return IoError(errno, "cannot create directory", prefix);
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace

FileEnv* FileEnv::Default() {
  static FileEnv* const env = new PosixFileEnv();
  return env;
}

absl::Status WriteFileDurably(
    FileEnv& env, const std::string& dir, const std::string& path,
    absl::FunctionRef<absl::Status(WritableFile&)> fill,
    DurableWriteOptions options) {
  const std::string tmp = path + ".tmp";
  absl::Status status;
  {
    absl::StatusOr<std::unique_ptr<WritableFile>> file =
        env.NewWritableFile(tmp);
    if (!file.ok()) return file.status();
    status = fill(**file);
    if (status.ok() && options.sync) status = (*file)->Sync();
    if (status.ok()) status = (*file)->Close();
  }
  if (status.ok()) status = env.RenameFile(tmp, path);
  if (!status.ok()) {
    // Best effort: the error that matters is the one being returned.
    env.RemoveFile(tmp).IgnoreError();
    return status;
  }
  // Without this the rename itself may be lost in a crash, leaving the old
  // file (or none) while the caller was told the new one is durable.
  if (options.sync) return env.SyncDir(dir);
  return absl::OkStatus();
}

absl::Status WriteStringDurably(FileEnv& env, const std::string& dir,
                                const std::string& path,
                                absl::string_view content,
                                DurableWriteOptions options) {
  return WriteFileDurably(
      env, dir, path, [content](WritableFile& f) { return f.Append(content); },
      options);
}

}  // namespace ps
