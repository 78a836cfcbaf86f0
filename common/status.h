// Status helpers shared by every component.
//
// Every function that can fail returns absl::Status or absl::StatusOr<T>.
// The macros below keep call sites short; the gRPC conversions are the only
// place absl and gRPC status codes meet.
#ifndef PS_COMMON_STATUS_H_
#define PS_COMMON_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/support/status.h"

#define PS_STATUS_CONCAT_INNER_(a, b) a##b
#define PS_STATUS_CONCAT_(a, b) PS_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define PS_RETURN_IF_ERROR(expr)                    \
  do {                                              \
    absl::Status ps_status_ = (expr);               \
    if (!ps_status_.ok()) return ps_status_;        \
  } while (0)

// `lhs = value of expr` when expr (an absl::StatusOr) is OK, else returns
// its status from the enclosing function. lhs may declare a variable.
#define PS_ASSIGN_OR_RETURN(lhs, expr) \
  PS_ASSIGN_OR_RETURN_IMPL_(PS_STATUS_CONCAT_(ps_statusor_, __LINE__), lhs, expr)
#define PS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()

namespace ps {

// absl and gRPC share the canonical code numbering, so the codes map 1:1.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Prefixes the message of a non-OK status with `context: `, keeping the code.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace ps

#endif  // PS_COMMON_STATUS_H_
