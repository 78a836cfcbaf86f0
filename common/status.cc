#include "common/status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace ps {

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ", status.message()));
}

}  // namespace ps
