#include "scheduler/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

constexpr char kMagic[] = "PSJOURNAL1\n";
constexpr size_t kMagicSize = sizeof(kMagic) - 1;
constexpr size_t kHeaderSize = kMagicSize + 16;
// Far above any real job's state (a few KB per node); a larger length
// field means a damaged file, not a reason to allocate gigabytes.
constexpr uint64_t kMaxPayload = uint64_t{1} << 30;

uint64_t Fnv1a(const std::string& data) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

absl::Status Errno(const std::string& what, const std::string& path) {
  const int e = errno;
  return absl::Status(e == ENOENT ? absl::StatusCode::kNotFound
                                  : absl::StatusCode::kInternal,
                      absl::StrCat(what, " ", path, ": ", std::strerror(e)));
}

absl::Status MakeDirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i != dir.size() && dir[i] != '/') continue;
    const std::string prefix = dir.substr(0, i);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return Errno("cannot create directory", prefix);
    }
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write", path);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

JournalFile::JournalFile(std::string dir)
    : dir_(std::move(dir)), path_(dir_ + "/scheduler.journal") {}

absl::StatusOr<SchedulerJournal> JournalFile::Read() const {
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    struct stat st;
    if (::stat(path_.c_str(), &st) != 0 && errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("no scheduler journal at ", path_));
    }
    return Errno("cannot open", path_);
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string data = buffer.str();
  auto damaged = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("scheduler journal ", path_, " is damaged: ", what));
  };
  if (data.size() < kHeaderSize || data.compare(0, kMagicSize, kMagic) != 0) {
    return damaged("no journal header");
  }
  const uint64_t length = GetU64(data.data() + kMagicSize);
  const uint64_t checksum = GetU64(data.data() + kMagicSize + 8);
  if (length > kMaxPayload || data.size() - kHeaderSize != length) {
    return damaged(absl::StrCat("length field says ", length, " bytes, the file holds ",
                                data.size() - kHeaderSize));
  }
  const std::string payload = data.substr(kHeaderSize);
  if (Fnv1a(payload) != checksum) return damaged("checksum mismatch");
  SchedulerJournal journal;
  if (!journal.ParseFromString(payload)) return damaged("the payload does not parse");
  return journal;
}

absl::Status JournalFile::Write(const SchedulerJournal& journal, bool sync) {
  std::string payload;
  if (!journal.SerializeToString(&payload)) {
    return absl::InternalError("cannot serialize the scheduler journal");
  }
  std::string data(kMagic, kMagicSize);
  PutU64(&data, payload.size());
  PutU64(&data, Fnv1a(payload));
  data += payload;
  if (absl::Status s = MakeDirs(dir_); !s.ok()) return s;
  const std::string tmp = path_ + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  absl::Status status = WriteAll(fd, data, tmp);
  if (status.ok() && sync && ::fsync(fd) != 0) status = Errno("cannot fsync", tmp);
  if (::close(fd) != 0 && status.ok()) status = Errno("cannot close", tmp);
  if (status.ok() && std::rename(tmp.c_str(), path_.c_str()) != 0) {
    status = Errno("cannot rename to", path_);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  if (sync) {
    const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  return absl::OkStatus();
}

absl::Status JournalFile::SetAside(const std::string& suffix) {
  const std::string to = absl::StrCat(path_, ".", suffix);
  if (std::rename(path_.c_str(), to.c_str()) != 0 && errno != ENOENT) {
    return Errno("cannot rename", path_);
  }
  return absl::OkStatus();
}

}  // namespace ps
