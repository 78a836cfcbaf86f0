#include "worker/data/line_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

#include "common/status.h"

namespace ps::data::internal {
namespace {

absl::Status ErrnoError(int err, absl::string_view what,
                        const std::string& path) {
  const std::string msg = absl::StrCat(what, " ", path, ": ", strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case EISDIR:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

}  // namespace

absl::StatusOr<std::vector<FileInfo>> StatFiles(
    const std::vector<std::string>& paths) {
  std::vector<FileInfo> files;
  files.reserve(paths.size());
  for (const std::string& path : paths) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      return ErrnoError(errno, "cannot stat", path);
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is not a regular file"));
    }
    // Open once now so an unreadable file fails the job at start-up, not
    // hours later when a worker reaches it.
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError(errno, "cannot open", path);
    close(fd);
    files.push_back({path, static_cast<uint64_t>(st.st_size)});
  }
  return files;
}

std::pair<uint64_t, uint64_t> ByteRange(uint64_t total, uint32_t rank,
                                        uint32_t num_workers) {
  if (num_workers == 0) return {0, 0};
  if (rank >= num_workers) return {total, total};
  using u128 = unsigned __int128;
  const uint64_t b = static_cast<uint64_t>(u128{total} * rank / num_workers);
  const uint64_t e =
      static_cast<uint64_t>(u128{total} * (rank + 1) / num_workers);
  return {b, e};
}

LineReader::LineReader(std::vector<FileInfo> files, uint64_t begin,
                       uint64_t end, LineReaderOptions options)
    : files_(std::move(files)),
      begin_(begin),
      end_(end),
      options_(options),
      lines_before_(files_.size(), -1) {
  options_.buffer_bytes = std::max<size_t>(options_.buffer_bytes, 1);
  options_.max_line_bytes = std::max<size_t>(options_.max_line_bytes, 1);
  uint64_t offset = 0;
  for (const FileInfo& f : files_) {
    starts_.push_back(offset);
    offset += f.size;
  }
}

LineReader::~LineReader() { CloseCurrent(); }

void LineReader::CloseCurrent() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  head_ = tail_ = 0;
  eof_ = false;
}

void LineReader::Rewind() {
  CloseCurrent();
  cur_ = 0;
}

absl::Status LineReader::Fill() {
  if (head_ > 0) {
    std::memmove(buf_.data(), buf_.data() + head_, tail_ - head_);
    tail_ -= head_;
    head_ = 0;
  }
  if (buf_.size() < options_.buffer_bytes) buf_.resize(options_.buffer_bytes);
  if (tail_ == buf_.size()) {
    // A line longer than the buffer: grow (the caller bounds the length).
    buf_.resize(buf_.size() * 2);
  }
  for (;;) {
    const ssize_t n = read(fd_, buf_.data() + tail_, buf_.size() - tail_);
    if (n > 0) {
      tail_ += static_cast<size_t>(n);
      return absl::OkStatus();
    }
    if (n == 0) {
      eof_ = true;
      return absl::OkStatus();
    }
    if (errno != EINTR) {
      return ErrnoError(errno, "cannot read", files_[cur_].path);
    }
  }
}

absl::StatusOr<bool> LineReader::SkipPastNewline(uint64_t* skipped) {
  for (;;) {
    const char* start = buf_.data() + head_;
    // memchr must not be given a null pointer, even for 0 bytes (an empty
    // buffer has no storage yet).
    const void* nl =
        tail_ > head_ ? std::memchr(start, '\n', tail_ - head_) : nullptr;
    if (nl != nullptr) {
      const size_t n = static_cast<const char*>(nl) - start + 1;
      head_ += n;
      head_offset_ += n;
      *skipped += n;
      return true;
    }
    head_offset_ += tail_ - head_;
    *skipped += tail_ - head_;
    head_ = tail_;
    if (eof_) return false;
    absl::Status s = Fill();
    if (!s.ok()) return s;
  }
}

absl::StatusOr<bool> LineReader::OpenCurrent() {
  const FileInfo& file = files_[cur_];
  const uint64_t start = starts_[cur_];
  const uint64_t b = std::max(begin_, start) - start;
  const uint64_t e = std::min(end_, start + file.size);
  if (e <= start || e - start <= b) return false;  // no overlap
  local_end_ = e - start;

  fd_ = open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) return ErrnoError(errno, "cannot open", file.path);
  posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  head_ = tail_ = 0;
  eof_ = false;
  lines_in_file_ = 0;
  if (b == 0) {
    head_offset_ = 0;
  } else {
    // Our first line is the first one starting at or after b: the line
    // starting at b if byte b-1 is a newline, else the one after the next
    // newline. Reading from b-1 covers both cases.
    if (lseek(fd_, static_cast<off_t>(b - 1), SEEK_SET) < 0) {
      return ErrnoError(errno, "cannot seek in", file.path);
    }
    head_offset_ = b - 1;
    uint64_t skipped = 0;
    absl::StatusOr<bool> found = SkipPastNewline(&skipped);
    if (!found.ok()) return found.status();
    if (!*found) {
      CloseCurrent();
      return false;
    }
  }
  first_line_offset_ = head_offset_;
  return true;
}

absl::StatusOr<bool> LineReader::Next(Line* line) {
  for (;;) {
    if (fd_ < 0) {
      if (cur_ >= files_.size()) return false;
      absl::StatusOr<bool> opened = OpenCurrent();
      if (!opened.ok()) {
        CloseCurrent();
        return opened.status();
      }
      if (!*opened) {
        ++cur_;
        continue;
      }
    }
    if (head_offset_ >= local_end_) {  // the next line belongs to the next rank
      CloseCurrent();
      ++cur_;
      continue;
    }
    const char* start = buf_.data() + head_;
    const size_t avail = tail_ - head_;
    const void* nl = avail > 0 ? std::memchr(start, '\n', avail) : nullptr;
    if (nl != nullptr || (eof_ && avail > 0)) {
      const size_t len =
          nl != nullptr ? static_cast<const char*>(nl) - start : avail;
      const size_t consumed = nl != nullptr ? len + 1 : len;
      size_t text_len = len;
      if (text_len > 0 && start[text_len - 1] == '\r') --text_len;
      if (len > options_.max_line_bytes) {
        // Possible when the buffer grew past the limit in one read.
        line->text = absl::string_view();
        line->too_long = true;
      } else {
        line->text = absl::string_view(start, text_len);
        line->too_long = false;
      }
      line->file = cur_;
      line->bytes = consumed;
      head_ += consumed;
      head_offset_ += consumed;
      ++lines_in_file_;
      return true;
    }
    if (eof_) {  // nothing left in this file
      CloseCurrent();
      ++cur_;
      continue;
    }
    if (avail >= options_.max_line_bytes) {
      uint64_t skipped = 0;
      absl::StatusOr<bool> more = SkipPastNewline(&skipped);
      if (!more.ok()) return more.status();
      line->text = absl::string_view();
      line->too_long = true;
      line->file = cur_;
      line->bytes = skipped;
      ++lines_in_file_;
      return true;
    }
    absl::Status s = Fill();
    if (!s.ok()) return s;
  }
}

absl::StatusOr<uint64_t> LineReader::LineNumber() {
  if (cur_ >= files_.size() || lines_in_file_ == 0) {
    return absl::FailedPreconditionError("no line has been read");
  }
  int64_t& before = lines_before_[cur_];
  if (before < 0) {
    const std::string& path = files_[cur_].path;
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError(errno, "cannot open", path);
    absl::Cleanup closer = [fd] { close(fd); };
    std::vector<char> buf(std::min<uint64_t>(options_.buffer_bytes,
                                             std::max<uint64_t>(
                                                 first_line_offset_, 1)));
    uint64_t offset = 0;
    int64_t count = 0;
    while (offset < first_line_offset_) {
      const size_t want = static_cast<size_t>(
          std::min<uint64_t>(buf.size(), first_line_offset_ - offset));
      const ssize_t n = pread(fd, buf.data(), want, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError(errno, "cannot read", path);
      if (n == 0) break;  // file shrank
      count += std::count(buf.data(), buf.data() + n, '\n');
      offset += static_cast<uint64_t>(n);
    }
    before = count;
  }
  return static_cast<uint64_t>(before) + lines_in_file_;
}

}  // namespace ps::data::internal
