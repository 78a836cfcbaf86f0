// The reasons (WithReason below) the scheduler and its client
// attach to statuses that callers must tell apart from others of the same
// code. Each is data carried with the status, also over gRPC
// (common/grpc_status.h), so no caller matches words of a message.
#ifndef PS_COMMON_REASONS_H_
#define PS_COMMON_REASONS_H_

#include <string>

#include "absl/strings/string_view.h"
#include "common/status.h"

namespace ps {

// Why a status arose, beyond its code, as data rather than words of its
// message: a status that callers must tell apart from others of its code
// carries a reason, an absl payload. Annotate (common/status.h) and the
// gRPC conversions (common/grpc_status.h) keep it. An OK status carries
// none: WithReason returns it unchanged.
absl::Status WithReason(absl::Status status, absl::string_view reason);
// The reason `status` carries; "" if none.
std::string ReasonOf(const absl::Status& status);
namespace reason {

// ABORTED: the scheduler dropped this node (scheduler/client.h DroppedError).
inline constexpr char kDropped[] = "dropped";
// UNAVAILABLE: the scheduler stayed unreachable past the job's timeout
// (scheduler/client.h SchedulerClient::scheduler_gone).
inline constexpr char kSchedulerUnreachable[] = "scheduler_unreachable";
// FAILED_PRECONDITION: the job has finished; nothing joins or drains it.
inline constexpr char kJobFinished[] = "job_finished";
// FAILED_PRECONDITION: the job cannot continue (JobState FAILED); nothing
// joins or drains it, and every wait of its nodes ends.
inline constexpr char kJobFailed[] = "job_failed";

}  // namespace reason

// FAILED_PRECONDITION `message` with reason kJobFinished: the scheduler's
// answer to a node registering with (or a drain of) a job that has finished,
// and a worker's when the view it waits on says so.
absl::Status JobFinishedError(absl::string_view message);
// True for a JobFinishedError, also annotated or after a gRPC round trip;
// false for any status that only says so in words.
bool IsJobFinished(const absl::Status& status);

// FAILED_PRECONDITION `message` with reason kJobFailed: the scheduler's
// answer to a node registering with (or a drain of, or a wait in) a job that
// cannot continue, and a worker's once its view says so.
absl::Status JobFailedError(absl::string_view message);
// True for a JobFailedError, also annotated or after a gRPC round trip.
bool IsJobFailed(const absl::Status& status);

}  // namespace ps

#endif  // PS_COMMON_REASONS_H_
