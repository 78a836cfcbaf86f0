#include "common/node_main.h"

#include "common/allocator.h"
#include "common/config.h"
#include "common/logging.h"

namespace ps {

std::optional<JobConfig> StartNode(
    spdlog::logger& log, absl::string_view log_level, const std::string& config_path,
    const std::vector<std::pair<const char*, std::string>>& required) {
  KeepLargeBuffers();
  if (absl::Status s = SetLogLevel(log_level); !s.ok()) {
    log.error("{}", s.message());
    return std::nullopt;
  }
  if (config_path.empty()) {
    log.error("--config is required");
    return std::nullopt;
  }
  for (const auto& [flag, value] : required) {
    if (value.empty()) {
      log.error("--{} is required", flag);
      return std::nullopt;
    }
  }
  absl::StatusOr<JobConfig> config = LoadJobConfig(config_path);
  if (!config.ok()) {
    log.error("bad config: {}", config.status().message());
    return std::nullopt;
  }
  return *std::move(config);
}

}  // namespace ps
