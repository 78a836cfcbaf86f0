#include "worker/data/text_format.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "worker/data/keys.h"

namespace ps::data::internal {
namespace {

// Hex digit values, -1 for anything else. A table beats branches here:
// categorical columns are ~3/4 of a Criteo line's bytes.
struct HexTable {
  int8_t v[256];
  constexpr HexTable() : v() {
    for (int i = 0; i < 256; ++i) v[i] = -1;
    for (int i = 0; i < 10; ++i) v['0' + i] = static_cast<int8_t>(i);
    for (int i = 0; i < 6; ++i) {
      v['a' + i] = static_cast<int8_t>(10 + i);
      v['A' + i] = static_cast<int8_t>(10 + i);
    }
  }
};
constexpr HexTable kHex;

// log1p(x) for the small integers that make up most of Criteo's integer
// columns; log1p costs ~20 ns, a load ~1.
constexpr int kLogTableSize = 4096;
const std::array<float, kLogTableSize>& LogTable() {
  static const std::array<float, kLogTableSize> table = [] {
    std::array<float, kLogTableSize> t{};
    for (int i = 0; i < kLogTableSize; ++i) {
      t[i] = static_cast<float>(std::log1p(static_cast<double>(i)));
    }
    return t;
  }();
  return table;
}

std::string ColumnName(int column) {  // 1-based
  if (column == 1) return "label";
  if (column <= 1 + kCriteoDense) return absl::StrCat("I", column - 1);
  return absl::StrCat("C", column - 1 - kCriteoDense);
}

const char* FindTab(const char* p, const char* end) {
  const void* t = end > p ? std::memchr(p, '\t', end - p) : nullptr;
  return t != nullptr ? static_cast<const char*>(t) : end;
}

bool ColumnCountError(absl::string_view line, std::string* reason) {
  const size_t columns =
      1 + static_cast<size_t>(std::count(line.begin(), line.end(), '\t'));
  *reason = absl::StrCat("has ", columns, " tab-separated columns, expected ",
                         kCriteoColumns);
  return false;
}

bool ColumnError(int column, const char* begin, const char* end,
                 absl::string_view what, std::string* reason) {
  *reason = absl::StrCat("column ", column, " (", ColumnName(column),
                         "): ", Quote(absl::string_view(begin, end - begin)),
                         " ", what);
  return false;
}

// Parses a whole token as a double, accepting a leading '+'. False if the
// token is not entirely a number. Out-of-range values come back as +-inf or
// as the underflowed value, so callers can test finiteness.
bool ParseDouble(const char* begin, const char* end, double* out) {
  if (begin < end && *begin == '+') {
    ++begin;
    if (begin < end && (*begin == '+' || *begin == '-')) return false;
  }
  if (begin == end) return false;
  const std::from_chars_result r = std::from_chars(begin, end, *out);
  if (r.ptr != end) return false;
  if (r.ec == std::errc::result_out_of_range) {
    // from_chars leaves *out alone here; strtod tells overflow (inf) from
    // underflow (0 or a denormal). Rare, so the copy does not matter.
    *out = std::strtod(std::string(begin, end).c_str(), nullptr);
    return true;
  }
  return r.ec == std::errc();
}

}  // namespace

std::string Quote(absl::string_view text) {
  constexpr size_t kMax = 40;
  const bool cut = text.size() > kMax;
  return absl::StrCat("'", absl::CHexEscape(text.substr(0, kMax)),
                      cut ? "...'" : "'");
}

CriteoParser::CriteoParser(uint64_t hash_buckets)
    : hash_buckets_(hash_buckets) {
  LogTable();  // build it now, not inside the first timed batch
}

bool CriteoParser::Parse(absl::string_view line, CriteoExample* out,
                         std::string* reason) const {
  const char* p = line.data();
  const char* const end = p + line.size();

  // Label: almost always a single '0' or '1'.
  const char* tab = FindTab(p, end);
  if (tab - p == 1 && (*p == '0' || *p == '1')) {
    out->label = static_cast<float>(*p - '0');
  } else {
    double v = 0;
    // A line without any tab is more usefully called malformed as a whole.
    if (tab == end) return ColumnCountError(line, reason);
    if (!ParseDouble(p, tab, &v)) {
      return ColumnError(1, p, tab, "is not a number", reason);
    }
    if (v != 0 && v != 1) return ColumnError(1, p, tab, "is not 0 or 1", reason);
    out->label = static_cast<float>(v);
  }
  if (tab == end) return ColumnCountError(line, reason);
  p = tab + 1;

  const std::array<float, kLogTableSize>& logs = LogTable();
  for (int j = 0; j < kCriteoDense; ++j) {
    const char* const start = p;
    bool negative = false;
    if (p < end && (*p == '-' || *p == '+')) {
      negative = *p == '-';
      ++p;
    }
    const char* const digits = p;
    uint64_t v = 0;
    // Saturates instead of overflowing: log1p of anything past 1e18 is
    // ~41.4 either way.
    constexpr uint64_t kCap = uint64_t{1} << 60;
    while (p < end && static_cast<unsigned>(*p - '0') < 10) {
      if (v < kCap) v = v * 10 + static_cast<unsigned>(*p - '0');
      ++p;
    }
    if ((p < end && *p != '\t') || (p == digits && p != start)) {
      return ColumnError(2 + j, start, FindTab(start, end),
                         "is not an integer", reason);
    }
    if (negative || v == 0) {
      out->dense[j] = 0;
    } else if (v < kLogTableSize) {
      out->dense[j] = logs[v];
    } else {
      out->dense[j] = static_cast<float>(std::log1p(static_cast<double>(v)));
    }
    if (p == end) return ColumnCountError(line, reason);
    ++p;
  }

  for (int f = 0; f < kCriteoFields; ++f) {
    const char* const start = p;
    uint64_t h = 0;
    while (p < end && *p != '\t') {
      const int d = kHex.v[static_cast<unsigned char>(*p)];
      if (d < 0) {
        return ColumnError(2 + kCriteoDense + f, start, FindTab(start, end),
                           "is not hexadecimal", reason);
      }
      h = (h << 4) | static_cast<uint64_t>(d);
      ++p;
    }
    const size_t n = p - start;
    if (n > 8) {
      return ColumnError(2 + kCriteoDense + f, start, p,
                         "is longer than 8 hexadecimal digits", reason);
    }
    uint64_t key = CriteoKey(f, n == 0 ? kCriteoMissing : h);
    if (hash_buckets_ > 0) key %= hash_buckets_;
    out->keys[f] = key;
    if (f + 1 < kCriteoFields) {
      if (p == end) return ColumnCountError(line, reason);
      ++p;
    } else if (p != end) {
      return ColumnCountError(line, reason);
    }
  }
  return true;
}

LibsvmParser::LibsvmParser(uint64_t hash_buckets)
    : hash_buckets_(hash_buckets) {}

ParseResult LibsvmParser::Parse(absl::string_view line, float* label,
                                std::vector<uint64_t>* keys,
                                std::vector<float>* values,
                                std::string* reason) const {
  const char* p = line.data();
  const char* end = p + line.size();
  if (const void* hash =
          line.empty() ? nullptr : std::memchr(p, '#', line.size())) {
    end = static_cast<const char*>(hash);
  }
  auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
  };
  auto next_token = [&](const char** begin, const char** stop) {
    while (p < end && is_space(*p)) ++p;
    *begin = p;
    while (p < end && !is_space(*p)) ++p;
    *stop = p;
    return *begin < *stop;
  };

  const char* tb;
  const char* te;
  if (!next_token(&tb, &te)) return ParseResult::kBlank;
  if (te - tb == 1 && (*tb == '1' || *tb == '0')) {
    *label = static_cast<float>(*tb - '0');
  } else {
    double v = 0;
    if (!ParseDouble(tb, te, &v) || (v != 1 && v != 0 && v != -1)) {
      *reason = absl::StrCat("label ", Quote(absl::string_view(tb, te - tb)),
                             " is not one of 1, +1, 0, -1");
      return ParseResult::kBad;
    }
    *label = v == 1 ? 1.0f : 0.0f;
  }

  int token = 1;
  while (next_token(&tb, &te)) {
    ++token;
    const absl::string_view text(tb, te - tb);
    if (text.size() >= 4 && std::memcmp(tb, "qid:", 4) == 0) continue;
    const char* colon = static_cast<const char*>(std::memchr(tb, ':', te - tb));
    if (colon == nullptr) {
      *reason = absl::StrCat("token ", token, " ", Quote(text),
                             " is not index:value");
      return ParseResult::kBad;
    }
    uint64_t index = 0;
    const std::from_chars_result r = std::from_chars(tb, colon, index);
    if (tb == colon || r.ptr != colon || r.ec != std::errc()) {
      *reason = absl::StrCat("token ", token, " ", Quote(text),
                             ": index is not a non-negative integer");
      return ParseResult::kBad;
    }
    double value = 0;
    if (!ParseDouble(colon + 1, te, &value)) {
      *reason = absl::StrCat("token ", token, " ", Quote(text),
                             ": value is not a number");
      return ParseResult::kBad;
    }
    const float f = static_cast<float>(value);
    if (!std::isfinite(f)) {
      *reason = absl::StrCat("token ", token, " ", Quote(text),
                             ": value is not finite");
      return ParseResult::kBad;
    }
    uint64_t key = LibsvmKey(index);
    if (hash_buckets_ > 0) key %= hash_buckets_;
    keys->push_back(key);
    values->push_back(f);
  }
  return ParseResult::kOk;
}

}  // namespace ps::data::internal
