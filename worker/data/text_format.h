// Parsers of one text line of the Criteo and libsvm formats. Internal to
// worker/data; the formats are described in proto/config.proto
// (FileDataConfig.Format) and the keys in worker/data/dataset.h.
//
// Parsers never allocate on a well-formed line and never crash or assert on
// any input: every malformed line yields an error reason instead.
// Thread-safe (immutable after construction).
#ifndef PS_WORKER_DATA_TEXT_FORMAT_H_
#define PS_WORKER_DATA_TEXT_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ps::data::internal {

inline constexpr int kCriteoDense = 13;
inline constexpr int kCriteoFields = 26;
inline constexpr int kCriteoColumns = 1 + kCriteoDense + kCriteoFields;

struct CriteoExample {
  float label = 0;
  float dense[kCriteoDense];
  uint64_t keys[kCriteoFields];  // field f's key at index f
};

class CriteoParser {
 public:
  // hash_buckets > 0: keys are reduced modulo hash_buckets.
  explicit CriteoParser(uint64_t hash_buckets = 0);

  // Parses `line` (no terminator, not blank). On a malformed line returns
  // false and sets *reason, naming the column 1-based as `cut -f` counts
  // them: "column 16 (C2): 'zz' is not hexadecimal"; *out is then
  // unspecified.
  bool Parse(absl::string_view line, CriteoExample* out,
             std::string* reason) const;

 private:
  uint64_t hash_buckets_;
};

enum class ParseResult { kOk, kBlank, kBad };

class LibsvmParser {
 public:
  explicit LibsvmParser(uint64_t hash_buckets = 0);

  // Parses `line` (no terminator), appending its features to *keys and
  // *values. kBlank: only whitespace and/or a comment (nothing appended).
  // kBad: *reason says why; what was appended is unspecified (the caller
  // truncates).
  ParseResult Parse(absl::string_view line, float* label,
                    std::vector<uint64_t>* keys, std::vector<float>* values,
                    std::string* reason) const;

 private:
  uint64_t hash_buckets_;
};

// `text` quoted for an error message: C-escaped, at most ~40 characters.
std::string Quote(absl::string_view text);

}  // namespace ps::data::internal

#endif  // PS_WORKER_DATA_TEXT_FORMAT_H_
