// The one place absl and gRPC status codes meet (the scheduler's RPCs and
// their clients).
#ifndef PS_COMMON_GRPC_STATUS_H_
#define PS_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/strings/string_view.h"
#include "common/status.h"
#include "grpcpp/support/status.h"

namespace ps {

// absl and gRPC share the canonical code numbering, so the codes map 1:1.
// A status's reason (WithReason below) travels in the gRPC status's details.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Why a status arose, beyond its code, as data rather than words of its
// message: a status that callers must tell apart from others of its code
// (scheduler/client.h: a worker dropped by the scheduler, the scheduler
// gone) carries a reason, an absl payload. Annotate (common/status.h) and
// the conversions above keep it. An OK status carries none.
absl::Status WithReason(absl::Status status, absl::string_view reason);
// The reason `status` carries; "" if none.
std::string ReasonOf(const absl::Status& status);

}  // namespace ps

#endif  // PS_COMMON_GRPC_STATUS_H_
