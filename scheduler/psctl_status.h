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

// A length of time as people read it: "42s", "3m 12s", "2h 05m", "3d 04h".
std::string HumanDuration(double seconds);

// The job's progress on one line (no newline), as `psctl watch` and the
// progress line of `psctl status` show it:
//   "RUNNING  42.0% [########..........] 420/1000 steps  12.5 steps/s
//    3200 ex/s  ETA 31s  elapsed 40s  test_auc 0.7120"
// "ETA ?" while the time left is not known; "~" before the total when some
// shard's size is estimated. `bar_width` 0 leaves the bar out.
std::string FormatProgressLine(const GetStatusResponse& status,
                               int bar_width = 20);

}  // namespace ps

#endif  // PS_SCHEDULER_PSCTL_STATUS_H_
