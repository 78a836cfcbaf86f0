// The server's one named logger ("server"), shared by every part of the
// server so that their lines carry the same component name and level.
#ifndef PS_SERVER_SERVER_LOG_H_
#define PS_SERVER_SERVER_LOG_H_

#include <memory>

#include "common/logging.h"

namespace ps {

// Returns the "server" logger. Thread-safe; the logger is created on the
// first call and lives until the process exits (it is never destroyed, so
// threads that log during shutdown never see it gone).
const std::shared_ptr<spdlog::logger>& ServerLog();

}  // namespace ps

#endif  // PS_SERVER_SERVER_LOG_H_
