#include "scheduler/scheduler_log.h"

namespace ps {

const std::shared_ptr<spdlog::logger>& SchedulerLog() {
  // Leaked on purpose: static destructors run while detached or late
  // threads may still log.
  static const auto* const logger =
      new std::shared_ptr<spdlog::logger>(GetLogger("scheduler"));
  return *logger;
}

}  // namespace ps
