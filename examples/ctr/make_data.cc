// Writes synthetic CTR data (worker/data/synthetic_ctr.h) to text files in
// the Criteo TSV or the libsvm format, for tests and benchmarks of the file
// readers (FileDataConfig in proto/config.proto).
//
// Usage:
//   make_data --out_prefix=/tmp/ctr --format=criteo [--num_train=N]
//       [--num_test=N] [--seed=S] [--interaction_rank=R]
//       [--interaction_scale=X] [--missing_rate=P] [--bad_lines=N]
//       [--shards=K] ...
// writes /tmp/ctr.train.txt (or, with --shards=K > 1, the K files
// /tmp/ctr.train-00000-of-0000K.txt ...) and /tmp/ctr.test.txt. Generator
// flags left at 0 take ps::ApplyDefaults' defaults. Exit status 0 on
// success, 1 with a message on stderr for a bad flag or an I/O error.
//
// Formats (one example per line, '\n' line ends):
//   * criteo: label, 13 integer columns, 26 categorical columns, tab
//     separated. Requires the Criteo shape (num_categorical 26, num_numeric
//     13, the defaults). A numeric feature x (about standard normal,
//     |x| <= 3.67) is written as the integer v = round(exp(x + 6)), in
//     10..15800, so the reader's log(1 + v) is x + 6 up to 0.07 (0.01 for
//     x > -1.4) and is monotone in x: the offset 6 keeps v large enough for
//     the rounding to be fine-grained while v stays in the range of real
//     Criteo counts. Categorical (field, id) is written as the low 32 bits
//     of its key in 8 lowercase hex digits (keys are already random 64-bit
//     mixes, and no two ids of the default vocabularies collide in 32 bits
//     with any real chance); with probability --missing_rate it is written
//     empty instead (a deterministic hash of the seed, split, example and
//     field decides).
//   * libsvm: "label idx:value ...", indices ascending: numeric feature j
//     is index j with its value ("%.6g"); categorical (f, id) is index
//     num_numeric + (vocabularies of fields 0..f-1) + id with value 1, so
//     indices are unique and dense. A missing categorical (--missing_rate)
//     is left out. Any num_categorical / num_numeric is allowed.
//   Labels are 0 or 1.
//
// --bad_lines=N inserts N malformed lines into the train data (never the
// test file) in addition to the num_train good ones, evenly spread over the
// whole train stream, cycling through the kinds (criteo: wrong column
// count, bad hex, bad label, non-numeric integer; libsvm: token without a
// colon, bad index, bad value, bad label). Each is reported on stderr as
//   make_data: bad line FILE:LINE: KIND
// (LINE 1-based). The good lines are exactly the generator's examples in
// order, so a reader that skips the bad lines sees num_train examples.
//
// Shards split the train stream (bad lines included) into K contiguous parts
// of sizes differing by at most one line (ps::ctr::ShardRange);
// concatenated in order they are the single-file output.

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/status.h"
#include "proto/config.pb.h"
#include "worker/data/synthetic_ctr.h"

ABSL_FLAG(std::string, out_prefix, "",
          "write PREFIX.train.txt (or PREFIX.train-i-of-K.txt) and "
          "PREFIX.test.txt");
ABSL_FLAG(std::string, format, "criteo", "criteo or libsvm");
ABSL_FLAG(uint32_t, shards, 1, "train files");
ABSL_FLAG(uint64_t, bad_lines, 0, "malformed lines inserted into the train data");
ABSL_FLAG(double, missing_rate, 0,
          "probability that a categorical feature is written empty");

// SyntheticCtrConfig; 0 keeps the default from ps::ApplyDefaults.
ABSL_FLAG(uint64_t, num_train, 0, "train examples");
ABSL_FLAG(uint64_t, num_test, 0, "test examples");
ABSL_FLAG(uint64_t, seed, 0, "generator seed");
ABSL_FLAG(uint32_t, num_categorical, 0, "categorical fields (criteo: 26)");
ABSL_FLAG(uint32_t, num_numeric, 0, "numeric fields (criteo: 13)");
ABSL_FLAG(uint32_t, max_vocab, 0, "largest vocabulary");
ABSL_FLAG(uint32_t, min_vocab, 0, "smallest vocabulary");
ABSL_FLAG(double, zipf_exponent, 0, "Zipf exponent");
ABSL_FLAG(double, weight_scale, 0, "std of the true weights");
ABSL_FLAG(double, bias, 0, "true bias (0: the default)");
ABSL_FLAG(uint32_t, interaction_rank, 0, "true interaction rank (0: none)");
ABSL_FLAG(double, interaction_scale, 0,
          "std of the true latent factors (0: the default, 0.1)");

namespace ps::ctr {
namespace {

enum class Format { kCriteo, kLibsvm };

struct Options {
  Format format = Format::kCriteo;
  std::string out_prefix;
  uint32_t shards = 1;
  uint64_t bad_lines = 0;
  double missing_rate = 0;
};

constexpr uint64_t kMissingSalt = 0x6d697373;  // "miss"
constexpr size_t kFlushBytes = size_t{1} << 20;
constexpr uint64_t kBatch = 4096;

// Buffered output to one file; every error names the file.
class Writer {
 public:
  explicit Writer(std::string path) : path_(std::move(path)) {}
  ~Writer() {
    if (file_ != nullptr) std::fclose(file_);
  }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  const std::string& path() const { return path_; }
  std::string* buffer() { return &buf_; }

  absl::Status Open() {
    file_ = std::fopen(path_.c_str(), "wb");
    if (file_ == nullptr) return Error("cannot open");
    buf_.reserve(kFlushBytes + 65536);
    return absl::OkStatus();
  }
  // Writes the buffer out once it is large.
  absl::Status MaybeFlush() {
    return buf_.size() >= kFlushBytes ? Flush() : absl::OkStatus();
  }
  absl::Status Close() {
    if (absl::Status s = Flush(); !s.ok()) return s;
    const int rc = std::fclose(file_);
    file_ = nullptr;
    return rc == 0 ? absl::OkStatus() : Error("cannot close");
  }

 private:
  absl::Status Flush() {
    if (!buf_.empty() &&
        std::fwrite(buf_.data(), 1, buf_.size(), file_) != buf_.size()) {
      return Error("cannot write");
    }
    buf_.clear();
    return absl::OkStatus();
  }
  absl::Status Error(absl::string_view what) const {
    return absl::UnavailableError(
        absl::StrCat(what, " ", path_, ": ", std::strerror(errno)));
  }

  std::string path_;
  std::FILE* file_ = nullptr;
  std::string buf_;
};

void AppendHex8(uint32_t v, std::string* out) {
  static constexpr char kDigits[] = "0123456789abcdef";
  char s[8];
  for (int i = 7; i >= 0; --i, v >>= 4) s[i] = kDigits[v & 15];
  out->append(s, 8);
}

// Formats examples of one split; one instance per split.
class LineFormatter {
 public:
  LineFormatter(const SyntheticCtr& gen, const Options& opt, Split split)
      : gen_(gen), opt_(opt) {
    const uint64_t split_salt = split == Split::kTrain ? 1 : 2;
    missing_stream_ = HashCombine(
        HashCombine(Mix64(gen.config().seed()), kMissingSalt), split_salt);
    uint64_t offset = gen.num_numeric();
    for (uint32_t f = 0; f < gen.num_categorical(); ++f) {
      field_offsets_.push_back(offset);
      offset += gen.vocab_size(f);
    }
  }

  // Appends example `e` of `b` (global index `index`) and a newline.
  void Append(const Batch& b, size_t e, uint64_t index,
              std::string* out) const {
    const uint32_t nf = gen_.num_categorical(), nn = gen_.num_numeric();
    out->push_back(b.labels[e] > 0.5f ? '1' : '0');
    const float* x = b.numeric.data() + e * nn;
    const uint64_t* keys = b.keys.data() + e * nf;
    const uint32_t* ids = b.ids.data() + e * nf;
    const uint64_t ex = HashCombine(missing_stream_, index);
    if (opt_.format == Format::kCriteo) {
      for (uint32_t j = 0; j < nn; ++j) {
        absl::StrAppend(out, "\t", std::llround(std::exp(x[j] + 6.0)));
      }
      for (uint32_t f = 0; f < nf; ++f) {
        out->push_back('\t');
        if (!Missing(ex, f)) AppendHex8(static_cast<uint32_t>(keys[f]), out);
      }
    } else {
      char num[32];
      for (uint32_t j = 0; j < nn; ++j) {
        const int n = std::snprintf(num, sizeof(num), " %u:%.6g", j,
                                    static_cast<double>(x[j]));
        out->append(num, static_cast<size_t>(n));
      }
      for (uint32_t f = 0; f < nf; ++f) {
        if (Missing(ex, f)) continue;
        absl::StrAppend(out, " ", field_offsets_[f] + ids[f], ":1");
      }
    }
    out->push_back('\n');
  }

 private:
  bool Missing(uint64_t ex, uint32_t f) const {
    return opt_.missing_rate > 0 &&
           HashToUnit(HashCombine(ex, f)) < opt_.missing_rate;
  }

  const SyntheticCtr& gen_;
  const Options& opt_;
  uint64_t missing_stream_ = 0;
  std::vector<uint64_t> field_offsets_;
};

// Bad line number `i` (0-based) of the train stream; returns its kind.
const char* AppendBadLine(Format format, uint64_t i, std::string* out) {
  if (format == Format::kCriteo) {
    // A well-formed line, then one defect.
    std::string ints[13], cats[26];
    std::string label = "0";
    for (std::string& v : ints) v = "1";
    for (std::string& c : cats) c = "0badc0de";
    const char* kind = "";
    int columns = 40;
    switch (i % 4) {
      case 0:
        kind = "wrong column count";
        columns = 39;
        break;
      case 1:
        kind = "bad hex";
        cats[3] = "12xz34ab";
        break;
      case 2:
        kind = "bad label";
        label = "x";
        break;
      default:
        kind = "non-numeric integer";
        ints[2] = "12a";
        break;
    }
    out->append(label);
    for (int c = 1; c < columns; ++c) {
      absl::StrAppend(out, "\t", c <= 13 ? ints[c - 1] : cats[c - 14]);
    }
    out->push_back('\n');
    return kind;
  }
  switch (i % 4) {
    case 0:
      out->append("1 0:0.5 17 40:1\n");
      return "token without a colon";
    case 1:
      out->append("0 0:0.5 ab:1\n");
      return "bad index";
    case 2:
      out->append("1 0:0.5 17:zz\n");
      return "bad value";
    default:
      out->append("x 0:0.5 17:1\n");
      return "bad label";
  }
}

std::string TrainPath(const Options& opt, uint32_t shard) {
  if (opt.shards == 1) return absl::StrCat(opt.out_prefix, ".train.txt");
  return absl::StrFormat("%s.train-%05d-of-%05d.txt", opt.out_prefix, shard,
                         opt.shards);
}

// Writes the train stream: num_train examples with opt.bad_lines bad lines
// among them, split over opt.shards files.
absl::Status WriteTrain(const SyntheticCtr& gen, const Options& opt) {
  const uint64_t n = gen.size(Split::kTrain);
  const uint64_t total = n + opt.bad_lines;
  // Bad line i sits at stream position floor((2i + 1) * total / (2N)):
  // evenly spread and distinct because total >= N.
  auto bad_pos = [&](uint64_t i) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(2 * i + 1) *
                                  total) /
                                 (2 * opt.bad_lines));
  };
  LineFormatter fmt(gen, opt, Split::kTrain);
  Batch batch;
  uint64_t next_example = 0, next_bad = 0;
  uint64_t batch_begin = 0;  // examples [batch_begin, + batch.size)
  batch.size = 0;
  for (uint32_t shard = 0; shard < opt.shards; ++shard) {
    Writer w(TrainPath(opt, shard));
    if (absl::Status s = w.Open(); !s.ok()) return s;
    auto [begin, end] = ShardRange(total, shard, opt.shards);
    for (uint64_t pos = begin; pos < end; ++pos) {
      if (next_bad < opt.bad_lines && bad_pos(next_bad) == pos) {
        const char* kind = AppendBadLine(opt.format, next_bad, w.buffer());
        absl::FPrintF(stderr, "make_data: bad line %s:%d: %s\n", w.path(),
                      pos - begin + 1, kind);
        ++next_bad;
      } else {
        if (next_example >= batch_begin + batch.size) {
          batch_begin = next_example;
          const uint64_t count = std::min(kBatch, n - batch_begin);
          if (absl::Status s = gen.Fill(Split::kTrain, batch_begin, count,
                                        &batch);
              !s.ok()) {
            return s;
          }
        }
        fmt.Append(batch, next_example - batch_begin, next_example,
                   w.buffer());
        ++next_example;
      }
      if (absl::Status s = w.MaybeFlush(); !s.ok()) return s;
    }
    if (absl::Status s = w.Close(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status WriteTest(const SyntheticCtr& gen, const Options& opt) {
  Writer w(absl::StrCat(opt.out_prefix, ".test.txt"));
  if (absl::Status s = w.Open(); !s.ok()) return s;
  LineFormatter fmt(gen, opt, Split::kTest);
  Batch batch;
  const uint64_t n = gen.size(Split::kTest);
  for (uint64_t begin = 0; begin < n; begin += kBatch) {
    const uint64_t count = std::min(kBatch, n - begin);
    if (absl::Status s = gen.Fill(Split::kTest, begin, count, &batch);
        !s.ok()) {
      return s;
    }
    for (size_t e = 0; e < batch.size; ++e) {
      fmt.Append(batch, e, begin + e, w.buffer());
    }
    if (absl::Status s = w.MaybeFlush(); !s.ok()) return s;
  }
  return w.Close();
}

int Fail(absl::string_view message) {
  absl::FPrintF(stderr, "make_data: %s\n", message);
  return 1;
}

int Run(const Options& opt, const SyntheticCtrConfig& cfg) {
  if (opt.out_prefix.empty()) return Fail("--out_prefix is required");
  if (opt.shards == 0) return Fail("--shards must be at least 1");
  if (opt.bad_lines > (uint64_t{1} << 40)) {
    return Fail("--bad_lines must be at most 2^40");
  }
  if (!(opt.missing_rate >= 0 && opt.missing_rate <= 1)) {
    return Fail("--missing_rate must be in [0, 1]");
  }
  if (opt.format == Format::kCriteo &&
      (cfg.num_categorical() != 26 || cfg.num_numeric() != 13)) {
    return Fail(
        "--format=criteo needs 26 categorical and 13 numeric features");
  }
  absl::StatusOr<SyntheticCtr> gen = SyntheticCtr::Create(cfg);
  if (!gen.ok()) return Fail(gen.status().ToString());
  if (absl::Status s = WriteTrain(*gen, opt); !s.ok()) {
    return Fail(s.ToString());
  }
  if (absl::Status s = WriteTest(*gen, opt); !s.ok()) {
    return Fail(s.ToString());
  }
  absl::FPrintF(stderr,
                "make_data: wrote %d train examples and %d bad lines in %d "
                "file(s), %d test examples; config: %s\n",
                gen->size(Split::kTrain), opt.bad_lines, opt.shards,
                gen->size(Split::kTest), gen->config().ShortDebugString());
  return 0;
}

}  // namespace
}  // namespace ps::ctr

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using ps::ctr::Format;
  ps::ctr::Options opt;
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format == "criteo") {
    opt.format = Format::kCriteo;
  } else if (format == "libsvm") {
    opt.format = Format::kLibsvm;
  } else {
    return ps::ctr::Fail(
        absl::StrCat("--format must be criteo or libsvm, not '", format, "'"));
  }
  opt.out_prefix = absl::GetFlag(FLAGS_out_prefix);
  opt.shards = absl::GetFlag(FLAGS_shards);
  opt.bad_lines = absl::GetFlag(FLAGS_bad_lines);
  opt.missing_rate = absl::GetFlag(FLAGS_missing_rate);

  ps::JobConfig job;
  ps::SyntheticCtrConfig* c = job.mutable_data()->mutable_synthetic_ctr();
  c->set_num_train(absl::GetFlag(FLAGS_num_train));
  c->set_num_test(absl::GetFlag(FLAGS_num_test));
  c->set_seed(absl::GetFlag(FLAGS_seed));
  c->set_num_categorical(absl::GetFlag(FLAGS_num_categorical));
  c->set_num_numeric(absl::GetFlag(FLAGS_num_numeric));
  c->set_max_vocab(absl::GetFlag(FLAGS_max_vocab));
  c->set_min_vocab(absl::GetFlag(FLAGS_min_vocab));
  c->set_zipf_exponent(absl::GetFlag(FLAGS_zipf_exponent));
  c->set_weight_scale(absl::GetFlag(FLAGS_weight_scale));
  c->set_bias(absl::GetFlag(FLAGS_bias));
  c->set_interaction_rank(absl::GetFlag(FLAGS_interaction_rank));
  c->set_interaction_scale(absl::GetFlag(FLAGS_interaction_scale));
  ps::ApplyDefaults(&job);
  return ps::ctr::Run(opt, *c);
}
