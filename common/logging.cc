#include "common/logging.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace ps {
namespace {

std::string Pattern(absl::string_view tag) {
  return absl::StrCat("%Y-%m-%d %H:%M:%S.%e %^%L%$ ", tag.empty() ? "" : "[",
                      tag, tag.empty() ? "" : "] ", "%n: %v");
}

}  // namespace

std::shared_ptr<spdlog::logger> GetLogger(const std::string& component) {
  // spdlog's registry is internally synchronised; creation races are
  // resolved by trying get() again if create throws "already exists".
  if (auto logger = spdlog::get(component)) return logger;
  try {
    auto logger = spdlog::stderr_color_mt(component);
    logger->set_level(spdlog::get_level());
    return logger;
  } catch (const spdlog::spdlog_ex&) {
    return spdlog::get(component);
  }
}

absl::Status SetLogLevel(absl::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown log level '", level,
        "' (expected trace, debug, info, warn, error, critical or off)"));
  }
  spdlog::set_level(parsed);
  return absl::OkStatus();
}

void SetLogTag(absl::string_view tag) { spdlog::set_pattern(Pattern(tag)); }

}  // namespace ps
