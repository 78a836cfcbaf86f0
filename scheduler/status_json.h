// The scheduler's /status.json: a StatusReport (proto/scheduler.proto) in
// protobuf's JSON mapping, with the proto's field names. What the /status
// page's script draws, and what a script of one's own can read:
//   job.progress  in [0, 1], never going back while this scheduler runs
//   job.eta_s     seconds left; absent while unknown
//   series        the curves, each {name, t: [unix s], v: [...]}
// 64-bit integers are strings in that mapping (e.g. "steps_done": "420").
#ifndef PS_SCHEDULER_STATUS_JSON_H_
#define PS_SCHEDULER_STATUS_JSON_H_

#include <string>

#include "common/status.h"
#include "scheduler/cluster_state.h"

namespace ps {

// The report of `state` now, for job `job_name`. Thread-safe (as
// ClusterState::Report).
std::string StatusJson(const ClusterState& state, const std::string& job_name);

}  // namespace ps

#endif  // PS_SCHEDULER_STATUS_JSON_H_
