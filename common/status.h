// Status helpers shared by every component.
//
// Every function that can fail returns absl::Status or absl::StatusOr<T>.
// The macros below keep call sites short. The gRPC conversions are in
// common/grpc_status.h.
#ifndef PS_COMMON_STATUS_H_
#define PS_COMMON_STATUS_H_

#include <utility>

// Every absl::Status and absl::StatusOr<T> returned by value must be used,
// or dropped on purpose with an explicit (void). Debian's abseil 20220623
// leaves its class attribute out (absl/status/status.h: the
// `class ABSL_MUST_USE_RESULT Status;` line is commented out), so a dropped
// Status compiled silently. A class is nodiscard when a declaration of it
// says so; these redeclarations make every function returning one
// nodiscard: ours, lambdas and std::function alike. Project code includes
// this header, never abseil's status headers directly (tests/layering_test
// checks); the clang build makes a dropped Status an error
// (-Werror=unused-result in .bazelrc's build:clang).
#include "absl/base/config.h"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
// When another header brought in abseil's definition first, GCC still
// applies the attribute but says it is ignored.
#pragma GCC diagnostic ignored "-Wattributes"
#endif
namespace absl {
ABSL_NAMESPACE_BEGIN
class [[nodiscard]] Status;
template <typename T>
class [[nodiscard]] StatusOr;
ABSL_NAMESPACE_END
}  // namespace absl
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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

// Prefixes the message of a non-OK status with `context: `, keeping the code.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace ps

#endif  // PS_COMMON_STATUS_H_
