// Expanding file patterns of a data config.
#ifndef PS_WORKER_DATA_GLOB_H_
#define PS_WORKER_DATA_GLOB_H_

#include <string>
#include <vector>

#include "common/status.h"

namespace ps::data {

// Expands each pattern with glob(3) (*, ?, [...]; a plain path matches
// itself if it exists). The result keeps the patterns' order; the matches of
// one pattern are sorted (byte order). A path matched by several patterns is
// kept once, at its first place, so no file is read twice in a pass.
// Thread-safe. Errors: NOT_FOUND naming the first pattern that matches
// nothing; RESOURCE_EXHAUSTED / UNAVAILABLE if glob(3) itself fails.
absl::StatusOr<std::vector<std::string>> ExpandGlobs(
    const std::vector<std::string>& patterns);

}  // namespace ps::data

#endif  // PS_WORKER_DATA_GLOB_H_
