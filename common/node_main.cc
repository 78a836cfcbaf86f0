#include "common/node_main.h"

#include "absl/strings/str_cat.h"
#include "common/allocator.h"
#include "common/config.h"
#include "common/logging.h"

namespace ps {

absl::Status OverrideClusterSize(const ClusterSizeOverride& sizes, JobConfig* config) {
  if (sizes.num_servers < 0 || sizes.num_servers > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num_servers=", sizes.num_servers, " must be in 0..1024 (0 keeps the config's)"));
  }
  if (sizes.num_workers < 0 || sizes.num_workers > 65536) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num_workers=", sizes.num_workers, " must be in 0..65536 (0 keeps the config's)"));
  }
  if (sizes.num_servers == 0 && sizes.num_workers == 0) return absl::OkStatus();
  ClusterConfig* cluster = config->mutable_cluster();
  if (sizes.num_servers > 0) cluster->set_num_servers(static_cast<uint32_t>(sizes.num_servers));
  if (sizes.num_workers > 0) cluster->set_num_workers(static_cast<uint32_t>(sizes.num_workers));
  ApplyDefaults(config);
  absl::Status valid = ValidateJobConfig(*config);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "with --num_servers=", cluster->num_servers(), " --num_workers=",
        cluster->num_workers(), ": ", valid.message()));
  }
  return absl::OkStatus();
}

std::optional<JobConfig> StartNode(
    spdlog::logger& log, absl::string_view log_level, const std::string& config_path,
    const std::vector<std::pair<const char*, std::string>>& required,
    const ClusterSizeOverride& sizes) {
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
  if (absl::Status s = OverrideClusterSize(sizes, &*config); !s.ok()) {
    log.error("bad cluster size: {}", s.message());
    return std::nullopt;
  }
  return *std::move(config);
}

}  // namespace ps
