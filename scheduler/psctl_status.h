// What `psctl status` prints, as pure functions of the scheduler's answer,
// so that the text can be tested without a scheduler.
#ifndef PS_SCHEDULER_PSCTL_STATUS_H_
#define PS_SCHEDULER_PSCTL_STATUS_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "proto/scheduler.pb.h"

namespace ps {

// "server", "worker" or "unknown".
const char* RoleName(Role role);

// The consistency mode as an operator names it, e.g. "SSP staleness 2".
std::string ModeText(const ConsistencyConfig& c);

// The status report, one fact a line: job state, epoch, a failing journal
// (`journal_error`, empty when it writes), the scheduler's restarts and
// its own faults (suspected isolation with how long and until when nodes
// are held, stalls noticed), consistency, every node and each live
// worker's clock. `now` is the operator's wall time, used only to say
// when a held isolation ends.
std::string FormatStatus(const GetStatusResponse& status,
                         absl::string_view journal_error, absl::Time now);

}  // namespace ps

#endif  // PS_SCHEDULER_PSCTL_STATUS_H_
