#include "scheduler/journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
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

}  // namespace

JournalFile::JournalFile(std::string dir, FileEnv* env)
    : dir_(std::move(dir)), path_(dir_ + "/scheduler.journal"), env_(env) {}

JournalFile::~JournalFile() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

absl::Status JournalFile::Lock() {
  if (lock_fd_ >= 0) return absl::OkStatus();
  PS_RETURN_IF_ERROR(env_->CreateDirs(dir_));
  const std::string path = dir_ + "/scheduler.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot open", path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    const ssize_t n = ::pread(fd, pid, sizeof(pid) - 1, 0);
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("another scheduler (pid ",
                       n > 0 ? absl::StripAsciiWhitespace(pid) : "?",
                       ") uses the state directory ", dir_));
    }
    errno = err;
    return Errno("cannot lock", path);
  }
  // The holder's pid, for the message above; the lock is what counts.
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    // Harmless: only the message above would lack the pid.
  }
  lock_fd_ = fd;
  return absl::OkStatus();
}

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
  PS_RETURN_IF_ERROR(env_->CreateDirs(dir_));
  DurableWriteOptions options;
  options.sync = sync;
  return WriteStringDurably(*env_, dir_, path_, data, options);
}

absl::Status JournalFile::SetAside(const std::string& suffix) {
  const std::string to = absl::StrCat(path_, ".", suffix);
  if (std::rename(path_.c_str(), to.c_str()) != 0 && errno != ENOENT) {
    return Errno("cannot rename", path_);
  }
  return absl::OkStatus();
}

}  // namespace ps
