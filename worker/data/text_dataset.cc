// Dataset over Criteo or libsvm text files.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/data/dataset.h"
#include "worker/data/glob.h"
#include "worker/data/line_reader.h"
#include "worker/data/readers.h"
#include "worker/data/text_format.h"

namespace ps::data::internal {
namespace {

constexpr size_t kMaxReports = 100;
constexpr uint64_t kLoggedInFull = 20;

class TextDataset final : public Dataset {
 public:
  TextDataset(FileDataConfig::Format format, BadLinePolicy policy,
              uint64_t hash_buckets, std::vector<FileInfo> files,
              uint64_t begin, uint64_t end, LineReaderOptions options)
      : format_(format),
        fail_on_bad_line_(policy == FAIL),
        criteo_(hash_buckets),
        libsvm_(hash_buckets),
        share_bytes_(end > begin ? end - begin : 0),
        reader_(std::move(files), begin, end, options),
        log_(GetLogger("data")),
        max_line_bytes_(options.max_line_bytes) {
    if (format_ == FileDataConfig::CRITEO) {
      schema_.num_dense = kCriteoDense;
      schema_.num_fields = kCriteoFields;
    } else {
      schema_.num_dense = 0;
      schema_.num_fields = 1;
    }
    schema_.num_classes = 2;
  }

  const Schema& schema() const override { return schema_; }
  ReadStats stats() const override { return stats_; }
  std::vector<std::string> bad_line_reports() const override {
    return reports_;
  }
  std::optional<uint64_t> ExamplesPerPass() const override {
    if (stats_.bytes == 0) return std::nullopt;
    return static_cast<uint64_t>(std::llround(
        static_cast<double>(share_bytes_) * stats_.examples / stats_.bytes));
  }

  absl::Status Rewind() override {
    reader_.Rewind();
    // Lines of later passes are the same lines again: count them, but do
    // not log or report them a second time.
    if (stats_.lines > 0) first_pass_ = false;
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> Next(size_t max, ExampleBatch* out) override {
    if (max == 0 || out == nullptr) {
      return absl::InvalidArgumentError("Next: max must be > 0, out non-null");
    }
    out->Clear(schema_.num_dense);
    return format_ == FileDataConfig::CRITEO ? NextCriteo(max, out)
                                             : NextLibsvm(max, out);
  }

 private:
  absl::StatusOr<size_t> NextCriteo(size_t max, ExampleBatch* out) {
    // Rows are written in place; sizes grow to `max` once and stay there,
    // so a reused batch never reallocates.
    out->labels.resize(max);
    out->dense.resize(max * kCriteoDense);
    out->offsets.resize(max + 1);
    out->keys.resize(max * kCriteoFields);
    out->values.assign(max * kCriteoFields, 1.0f);
    out->fields.resize(max * kCriteoFields);
    size_t n = 0;
    CriteoExample ex;
    Line line;
    while (n < max) {
      PS_ASSIGN_OR_RETURN(const bool got, reader_.Next(&line));
      if (!got) break;
      ++stats_.lines;
      stats_.bytes += line.bytes;
      line_file_ = line.file;
      if (line.too_long) {
        PS_RETURN_IF_ERROR(BadLine(TooLongReason()));
      } else if (line.text.empty()) {
        continue;  // blank line
      } else if (!criteo_.Parse(line.text, &ex, &reason_)) {
        PS_RETURN_IF_ERROR(BadLine(reason_));
      } else {
        out->labels[n] = ex.label;
        std::copy(ex.dense, ex.dense + kCriteoDense,
                  out->dense.begin() + n * kCriteoDense);
        std::copy(ex.keys, ex.keys + kCriteoFields,
                  out->keys.begin() + n * kCriteoFields);
        for (uint32_t f = 0; f < kCriteoFields; ++f) {
          out->fields[n * kCriteoFields + f] = f;
        }
        ++n;
        out->offsets[n] = static_cast<uint32_t>(n * kCriteoFields);
      }
    }
    out->size = n;
    out->labels.resize(n);
    out->dense.resize(n * kCriteoDense);
    out->offsets.resize(n + 1);
    out->keys.resize(n * kCriteoFields);
    out->values.resize(n * kCriteoFields);
    out->fields.resize(n * kCriteoFields);
    stats_.examples += n;
    return n;
  }

  absl::StatusOr<size_t> NextLibsvm(size_t max, ExampleBatch* out) {
    out->labels.reserve(max);
    out->offsets.reserve(max + 1);
    size_t n = 0;
    Line line;
    float label = 0;
    while (n < max) {
      PS_ASSIGN_OR_RETURN(const bool got, reader_.Next(&line));
      if (!got) break;
      ++stats_.lines;
      stats_.bytes += line.bytes;
      line_file_ = line.file;
      if (line.too_long) {
        PS_RETURN_IF_ERROR(BadLine(TooLongReason()));
        continue;
      }
      const size_t had = out->keys.size();
      const ParseResult r =
          libsvm_.Parse(line.text, &label, &out->keys, &out->values, &reason_);
      if (r == ParseResult::kBlank) continue;
      if (r == ParseResult::kBad) {
        out->keys.resize(had);
        out->values.resize(had);
        PS_RETURN_IF_ERROR(BadLine(reason_));
        continue;
      }
      if (out->keys.size() > UINT32_MAX) {
        // Offsets are 32-bit; a batch this large is a caller error, but it
        // must not wrap silently.
        return absl::ResourceExhaustedError(
            "batch holds more than 2^32 features; use a smaller max");
      }
      out->labels.push_back(label);
      out->offsets.push_back(static_cast<uint32_t>(out->keys.size()));
      ++n;
    }
    out->fields.assign(out->keys.size(), 0);
    out->size = n;
    stats_.examples += n;
    return n;
  }

  std::string TooLongReason() const {
    return absl::StrCat("line is longer than ", max_line_bytes_, " bytes");
  }

  // Records a malformed line of the current file. Returns the error to fail
  // with under FAIL, OK under SKIP.
  absl::Status BadLine(const std::string& reason) {
    ++stats_.bad_lines;
    if (first_pass_) ++first_pass_bad_;
    const bool report = first_pass_ && reports_.size() < kMaxReports;
    const bool log_full = first_pass_ && first_pass_bad_ <= kLoggedInFull;
    const bool log_summary = IsPowerOfTenAtLeast100(stats_.bad_lines);
    if (!fail_on_bad_line_ && !report && !log_full && !log_summary) {
      return absl::OkStatus();  // spare the line-number lookup
    }
    const std::string where = Location();
    if (fail_on_bad_line_) {
      return absl::DataLossError(absl::StrCat(where, ": ", reason));
    }
    if (report) reports_.push_back(absl::StrCat(where, ": ", reason));
    if (log_full) {
      log_->warn("skipping bad line {}: {}{}", where, reason,
                 first_pass_bad_ == kLoggedInFull
                     ? " (further bad lines are only counted)"
                     : "");
    }
    if (log_summary) {
      log_->warn("{} bad lines skipped so far, of {} read; latest {}: {}",
                 stats_.bad_lines, stats_.lines, where, reason);
    }
    return absl::OkStatus();
  }

  std::string Location() {
    const std::string& path = reader_.files()[line_file_].path;
    absl::StatusOr<uint64_t> line = reader_.LineNumber();
    if (!line.ok()) return absl::StrCat(path, ":?");
    return absl::StrCat(path, ":", *line);
  }

  static bool IsPowerOfTenAtLeast100(uint64_t n) {
    for (uint64_t p = 100; p <= n; p *= 10) {
      if (p == n) return true;
      if (p > UINT64_MAX / 10) break;
    }
    return false;
  }

  const FileDataConfig::Format format_;
  const bool fail_on_bad_line_;
  const CriteoParser criteo_;
  const LibsvmParser libsvm_;
  const uint64_t share_bytes_;
  LineReader reader_;
  std::shared_ptr<spdlog::logger> log_;
  Schema schema_;
  ReadStats stats_;
  std::vector<std::string> reports_;
  bool first_pass_ = true;
  uint64_t first_pass_bad_ = 0;
  std::string reason_;  // reused so well-formed lines never allocate
  const size_t max_line_bytes_;
  size_t line_file_ = 0;  // file of the line being handled
};

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> OpenTextDataset(
    const FileDataConfig& config, Split split, uint32_t rank,
    uint32_t num_workers, LineReaderOptions options) {
  if (config.format() != FileDataConfig::CRITEO &&
      config.format() != FileDataConfig::LIBSVM) {
    return absl::InvalidArgumentError(
        "data.files.format: must be CRITEO or LIBSVM");
  }
  const bool train = split == Split::kTrain;
  const auto& patterns = train ? config.train_files() : config.test_files();
  if (patterns.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.files.", train ? "train_files" : "test_files",
                     " is empty"));
  }
  PS_ASSIGN_OR_RETURN(
      std::vector<std::string> paths,
      ExpandGlobs(std::vector<std::string>(patterns.begin(), patterns.end())));
  PS_ASSIGN_OR_RETURN(std::vector<FileInfo> files, StatFiles(paths));
  uint64_t total = 0;
  for (const FileInfo& f : files) total += f.size;
  const auto [begin, end] = ByteRange(total, rank, num_workers);
  return std::make_unique<TextDataset>(config.format(), config.on_bad_line(),
                                       config.hash_buckets(), std::move(files),
                                       begin, end, options);
}

}  // namespace ps::data::internal
