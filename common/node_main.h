// The start every binary's main() shares, after flags are parsed: keep
// large message buffers in the process (common/allocator.h), set the log
// level, check required flags, load and validate the job config. Flags
// are read by main() itself and passed in as values.
#ifndef PS_COMMON_NODE_MAIN_H_
#define PS_COMMON_NODE_MAIN_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "proto/config.pb.h"
#include "spdlog/spdlog.h"

namespace ps {

// `required`: (flag name, value) pairs that must not be empty. On any
// problem, logs it on `log` and returns nullopt; the caller exits with 2.
std::optional<JobConfig> StartNode(
    spdlog::logger& log, absl::string_view log_level, const std::string& config_path,
    const std::vector<std::pair<const char*, std::string>>& required = {});

}  // namespace ps

#endif  // PS_COMMON_NODE_MAIN_H_
