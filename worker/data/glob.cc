#include "worker/data/glob.h"

#include <glob.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

#include "common/status.h"

namespace ps::data {

absl::StatusOr<std::vector<std::string>> ExpandGlobs(
    const std::vector<std::string>& patterns) {
  std::vector<std::string> out;
  absl::flat_hash_set<std::string> seen;
  for (const std::string& pattern : patterns) {
    glob_t g{};
    absl::Cleanup free_glob = [&g] { globfree(&g); };
    // glob(3) sorts its matches unless GLOB_NOSORT; sort again anyway so the
    // order never depends on the locale's collation.
    const int rc = glob(pattern.c_str(), 0, nullptr, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
      return absl::NotFoundError(
          absl::StrCat("no file matches '", pattern, "'"));
    }
    if (rc == GLOB_NOSPACE) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of memory expanding '", pattern, "'"));
    }
    if (rc != 0) {
      return absl::UnavailableError(
          absl::StrCat("read error expanding '", pattern, "'"));
    }
    std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + g.gl_pathc);
    std::sort(matches.begin(), matches.end());
    for (std::string& m : matches) {
      if (seen.insert(m).second) out.push_back(std::move(m));
    }
  }
  return out;
}

}  // namespace ps::data
