#include "common/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ps {

namespace {

// A status's reason travels in the gRPC status's details, after this.
constexpr absl::string_view kReasonDetails = "ps-reason:";

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const std::string reason = ReasonOf(status);
  return grpc::Status(
      static_cast<grpc::StatusCode>(status.code()),
      std::string(status.message()),
      reason.empty() ? std::string() : absl::StrCat(kReasonDetails, reason));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()),
                   status.error_message());
  const std::string all_details = status.error_details();
  absl::string_view details = all_details;
  if (absl::ConsumePrefix(&details, kReasonDetails))
    return WithReason(out, details);
  return out;
}

}  // namespace ps
