// Named loggers, one per component ("scheduler", "server", "worker", ...).
//
// Thread-safe. Loggers write to stderr with a pattern that carries the
// component name and, once set, the node's role and rank, so interleaved
// output of a multi-process job stays readable.
#ifndef PS_COMMON_LOGGING_H_
#define PS_COMMON_LOGGING_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

#include "common/status.h"

// Debian builds Abseil with its own string_view type (not std::string_view),
// which fmt cannot format by itself; absl::Status is logged often too.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename Context>
  auto format(absl::string_view s, Context& ctx) const {
    return fmt::formatter<fmt::string_view>::format(
        fmt::string_view(s.data(), s.size()), ctx);
  }
};

template <>
struct fmt::formatter<absl::Status> : fmt::formatter<fmt::string_view> {
  template <typename Context>
  auto format(const absl::Status& s, Context& ctx) const {
    const std::string text = s.ToString();
    return fmt::formatter<fmt::string_view>::format(
        fmt::string_view(text.data(), text.size()), ctx);
  }
};

namespace ps {

// Returns the logger for `component`, creating it on first use.
std::shared_ptr<spdlog::logger> GetLogger(const std::string& component);

// Sets the level of all current and future loggers. `level` is one of
// trace, debug, info, warn, error, critical, off.
absl::Status SetLogLevel(absl::string_view level);

// Tags every line with e.g. "server/1" from now on. Call from main() once
// the node knows its rank.
void SetLogTag(absl::string_view tag);

}  // namespace ps

#endif  // PS_COMMON_LOGGING_H_
