// The one place absl and gRPC status codes meet (the scheduler's RPCs and
// their clients).
#ifndef PS_COMMON_GRPC_STATUS_H_
#define PS_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/strings/string_view.h"
#include "common/reasons.h"
#include "common/status.h"
#include "grpcpp/support/status.h"

namespace ps {

// absl and gRPC share the canonical code numbering, so the codes map 1:1.
// A status's reason (common/reasons.h WithReason) travels in the gRPC
// status's details.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace ps

#endif  // PS_COMMON_GRPC_STATUS_H_
