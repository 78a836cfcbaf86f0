#include "server/server_log.h"

namespace ps {

const std::shared_ptr<spdlog::logger>& ServerLog() {
  // Leaked on purpose: static destructors run while detached or late
  // threads may still log.
  static const auto* const logger =
      new std::shared_ptr<spdlog::logger>(GetLogger("server"));
  return *logger;
}

}  // namespace ps
