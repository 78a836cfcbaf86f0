#include "common/reasons.h"

#include "absl/strings/cord.h"

namespace ps {

namespace {

constexpr char kReasonUrl[] = "type.ps/reason";

}  // namespace

absl::Status WithReason(absl::Status status, absl::string_view reason) {
  if (!status.ok()) status.SetPayload(kReasonUrl, absl::Cord(reason));
  return status;
}

std::string ReasonOf(const absl::Status& status) {
  const auto reason = status.GetPayload(kReasonUrl);  // absl::optional<Cord>
  return reason ? std::string(*reason) : std::string();
}

absl::Status JobFinishedError(absl::string_view message) {
  return WithReason(absl::FailedPreconditionError(message),
                    reason::kJobFinished);
}

bool IsJobFinished(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         ReasonOf(status) == reason::kJobFinished;
}

absl::Status JobFailedError(absl::string_view message) {
  return WithReason(absl::FailedPreconditionError(message), reason::kJobFailed);
}

bool IsJobFailed(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         ReasonOf(status) == reason::kJobFailed;
}

}  // namespace ps
