// The scheduler's one named logger ("scheduler"), shared by every part of
// the scheduler so that their lines carry the same component name and level.
#ifndef PS_SCHEDULER_SCHEDULER_LOG_H_
#define PS_SCHEDULER_SCHEDULER_LOG_H_

#include <memory>

#include "common/logging.h"

namespace ps {

// Returns the "scheduler" logger. Thread-safe; the logger is created on the
// first call and lives until the process exits (it is never destroyed, so
// threads that log during shutdown never see it gone).
const std::shared_ptr<spdlog::logger>& SchedulerLog();

}  // namespace ps

#endif  // PS_SCHEDULER_SCHEDULER_LOG_H_
