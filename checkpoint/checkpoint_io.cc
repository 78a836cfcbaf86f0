#include "checkpoint/checkpoint_io.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ps {
namespace checkpoint_internal {
namespace {

constexpr size_t kIoBufferBytes = size_t{1} << 20;

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t Round(uint64_t acc, uint64_t input) {
  acc += input * kP2;
  return Rotl(acc, 31) * kP1;
}
inline uint64_t MergeRound(uint64_t acc, uint64_t v) {
  acc ^= Round(0, v);
  return acc * kP1 + kP4;
}

}  // namespace

// ------------------------------------------------------------------ XXH64

Xxh64::Xxh64(uint64_t seed)
    : seed_(seed), v_{seed + kP1 + kP2, seed + kP2, seed, seed - kP1} {}

void Xxh64::Stripe(const unsigned char* p) {
  v_[0] = Round(v_[0], Load64(p));
  v_[1] = Round(v_[1], Load64(p + 8));
  v_[2] = Round(v_[2], Load64(p + 16));
  v_[3] = Round(v_[3], Load64(p + 24));
}

void Xxh64::Update(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += n;
  if (buffered_ + n < 32) {
    if (n > 0) std::memcpy(buffer_ + buffered_, p, n);
    buffered_ += n;
    return;
  }
  if (buffered_ > 0) {
    const size_t fill = 32 - buffered_;
    std::memcpy(buffer_ + buffered_, p, fill);
    Stripe(buffer_);
    p += fill;
    n -= fill;
    buffered_ = 0;
  }
  for (; n >= 32; p += 32, n -= 32) Stripe(p);
  if (n > 0) std::memcpy(buffer_, p, n);
  buffered_ = n;
}

uint64_t Xxh64::Digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = Rotl(v_[0], 1) + Rotl(v_[1], 7) + Rotl(v_[2], 12) + Rotl(v_[3], 18);
    for (uint64_t v : v_) h = MergeRound(h, v);
  } else {
    h = seed_ + kP5;
  }
  h += total_;
  const unsigned char* p = buffer_;
  size_t n = buffered_;
  for (; n >= 8; p += 8, n -= 8) {
    h ^= Round(0, Load64(p));
    h = Rotl(h, 27) * kP1 + kP4;
  }
  if (n >= 4) {
    h ^= static_cast<uint64_t>(Load32(p)) * kP1;
    h = Rotl(h, 23) * kP2 + kP3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; ++p, --n) {
    h ^= *p * kP5;
    h = Rotl(h, 11) * kP1;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

// ---------------------------------------------------------------- helpers

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

absl::Status IoError(int err, absl::string_view what, absl::string_view path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

absl::Status Corrupt(absl::string_view file, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(file, ": ", what));
}

absl::Status SyncDir(const std::string& dir) {
  return FileEnv::Default()->SyncDir(dir);
}

absl::Status MakeDirs(const std::string& dir) {
  return FileEnv::Default()->CreateDirs(dir);
}

// ------------------------------------------------------------- FileWriter

FileWriter::FileWriter(WritableFile* file)
    : file_(file), buffer_(new char[kIoBufferBytes]) {}

absl::Status FileWriter::Append(const void* data, size_t n) {
  hash_.Update(data, n);
  bytes_ += n;
  const auto* p = static_cast<const char*>(data);
  if (buffered_ + n <= kIoBufferBytes) {
    if (n > 0) std::memcpy(buffer_.get() + buffered_, p, n);
    buffered_ += n;
    return absl::OkStatus();
  }
  PS_RETURN_IF_ERROR(Flush());
  // Large pieces (sparse pages, dense blocks) skip the copy.
  if (n >= kIoBufferBytes) return file_->Append(absl::string_view(p, n));
  std::memcpy(buffer_.get(), p, n);
  buffered_ = n;
  return absl::OkStatus();
}

absl::Status FileWriter::Flush() {
  const size_t n = buffered_;
  buffered_ = 0;
  if (n == 0) return absl::OkStatus();
  return file_->Append(absl::string_view(buffer_.get(), n));
}

// ------------------------------------------------------------- FileReader

absl::StatusOr<std::unique_ptr<FileReader>> FileReader::Open(const std::string& path,
                                                             std::string name) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return IoError(err, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Corrupt(name, "not a regular file");
  }
  return std::unique_ptr<FileReader>(
      new FileReader(fd, std::move(name), static_cast<uint64_t>(st.st_size)));
}

FileReader::FileReader(int fd, std::string name, uint64_t size)
    : fd_(fd), name_(std::move(name)), size_(size), buffer_(new char[kIoBufferBytes]) {}

FileReader::~FileReader() { ::close(fd_); }

absl::Status FileReader::Read(void* dst, size_t n) {
  if (n > remaining()) {
    return Corrupt(name_, absl::StrCat("truncated: ", n, " bytes needed at offset ",
                                       position_, " of ", size_));
  }
  auto* out = static_cast<char*>(dst);
  const size_t from_buffer = std::min(n, end_ - begin_);
  if (from_buffer > 0) std::memcpy(out, buffer_.get() + begin_, from_buffer);
  begin_ += from_buffer;
  size_t done = from_buffer;
  if (n - done >= kIoBufferBytes) {
    // The buffer is empty; large payloads go straight to their destination.
    PS_RETURN_IF_ERROR(ReadFd(out + done, n - done, n - done));
    done = n;
  }
  while (done < n) {
    begin_ = 0;
    end_ = 0;
    const size_t want = static_cast<size_t>(
        std::min<uint64_t>(kIoBufferBytes, size_ - position_ - done));
    PS_RETURN_IF_ERROR(ReadFd(buffer_.get(), want, std::min(want, n - done)));
    end_ = filled_;
    const size_t take = std::min(n - done, end_);
    std::memcpy(out + done, buffer_.get(), take);
    begin_ = take;
    done += take;
  }
  hash_.Update(dst, n);
  position_ += n;
  return absl::OkStatus();
}

absl::Status FileReader::ReadFd(char* dst, size_t want, size_t need) {
  size_t got = 0;
  while (got < need) {
    const ssize_t r = ::read(fd_, dst + got, want - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Corrupt(name_, absl::StrCat("read failed: ", std::strerror(errno)));
    }
    if (r == 0) {
      return Corrupt(name_, absl::StrCat("truncated while reading (the file shrank "
                                         "below ", size_, " bytes)"));
    }
    got += static_cast<size_t>(r);
  }
  filled_ = got;
  return absl::OkStatus();
}

}  // namespace checkpoint_internal
}  // namespace ps
