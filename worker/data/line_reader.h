// Reads the lines of a byte range of several files taken as one stream.
// Internal to worker/data.
#ifndef PS_WORKER_DATA_LINE_READER_H_
#define PS_WORKER_DATA_LINE_READER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "common/status.h"

namespace ps::data::internal {

struct FileInfo {
  std::string path;
  uint64_t size = 0;  // bytes, as stat(2) saw them when the reader was built
};

// Stats each path. Errors: NOT_FOUND / PERMISSION_DENIED naming the path;
// INVALID_ARGUMENT for something that is not a regular file.
absl::StatusOr<std::vector<FileInfo>> StatFiles(
    const std::vector<std::string>& paths);

// The byte range [begin, end) of worker `rank` of `num_workers` in a stream
// of `total` bytes: [rank*total/k, (rank+1)*total/k), computed without
// overflow. Ranges of ranks 0..k-1 tile [0, total).
std::pair<uint64_t, uint64_t> ByteRange(uint64_t total, uint32_t rank,
                                        uint32_t num_workers);

struct LineReaderOptions {
  // Size of each read(2). Large reads keep the reader at disk speed.
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  // The fuzzing build (tests/fuzz): a small buffer takes the refill and
  // line-growth paths on small inputs, and no 4 MiB page-in per input.
  size_t buffer_bytes = 16;
#else
  size_t buffer_bytes = size_t{4} << 20;
#endif
  // Longer lines are skipped whole and handed out with too_long set, so a
  // file without newlines cannot make the buffer grow without bound.
  size_t max_line_bytes = size_t{16} << 20;
};

struct Line {
  // The line without its '\n' and without one '\r' before it. Valid until
  // the next call of Next() or Rewind(). Empty when too_long.
  absl::string_view text;
  size_t file = 0;         // index into files()
  uint64_t bytes = 0;      // bytes consumed, terminators included
  bool too_long = false;   // longer than max_line_bytes; skipped
};

// Files f_0..f_n-1 are taken as one stream of their concatenated bytes; the
// reader hands out, in order, the lines that START at a stream offset in
// [begin, end). A line starts at the beginning of a file or after a '\n';
// a line runs to its '\n' or to the end of its file (a missing final
// newline is fine; lines never span files), so it may end past `end`.
// Readers of adjacent ranges therefore see every line exactly once.
//
// Files are opened one at a time, when first needed. A file that changed
// size since StatFiles is read up to the stat size (plus the rest of a line
// that starts before it) or to its actual end, whichever is first.
// Not thread-safe.
class LineReader {
 public:
  LineReader(std::vector<FileInfo> files, uint64_t begin, uint64_t end,
             LineReaderOptions options = {});
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // Next line of the range: true and *line set, or false at its end.
  // Errors (open/read failures) name the file.
  absl::StatusOr<bool> Next(Line* line);

  // Back to the first line of the range.
  void Rewind();

  // 1-based line number, within its file, of the line last returned by
  // Next(). The first call for a file whose share starts mid-file counts the
  // newlines before that point (one sequential read, cached for later
  // passes); reading them up front would cost every worker of a large job a
  // read of everything before its share, usually for nothing.
  absl::StatusOr<uint64_t> LineNumber();

  const std::vector<FileInfo>& files() const { return files_; }

 private:
  // Opens files_[cur_] if it overlaps the range and positions the buffer on
  // its first line. False if the file holds no line of the range.
  absl::StatusOr<bool> OpenCurrent();
  void CloseCurrent();
  // Reads more bytes after the unread ones. Sets eof_ at end of file.
  absl::Status Fill();
  // Drops bytes up to and including the next '\n'. False at end of file.
  absl::StatusOr<bool> SkipPastNewline(uint64_t* skipped);

  std::vector<FileInfo> files_;
  std::vector<uint64_t> starts_;  // stream offset of each file
  uint64_t begin_;
  uint64_t end_;
  LineReaderOptions options_;

  std::vector<char> buf_;
  size_t head_ = 0;  // unread bytes are buf_[head_, tail_)
  size_t tail_ = 0;
  uint64_t head_offset_ = 0;  // file offset of buf_[head_]
  int fd_ = -1;
  bool eof_ = false;
  size_t cur_ = 0;            // file being read, or next to open
  uint64_t local_end_ = 0;    // lines of cur_ starting before this are ours
  uint64_t first_line_offset_ = 0;  // where our first line of cur_ starts
  uint64_t lines_in_file_ = 0;      // lines of cur_ handed out this pass
  // Per file: newlines before our first line, or -1 if not counted yet.
  std::vector<int64_t> lines_before_;
};

}  // namespace ps::data::internal

#endif  // PS_WORKER_DATA_LINE_READER_H_
