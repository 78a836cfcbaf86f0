#include "scheduler/rank_runs.h"

#include "absl/strings/str_cat.h"

namespace ps {

std::vector<uint32_t> ToRankRuns(absl::Span<const uint32_t> ranks) {
  std::vector<uint32_t> runs;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i + 1;
    while (j < ranks.size() && ranks[j] == ranks[j - 1] + 1) ++j;
    runs.push_back(ranks[i]);
    runs.push_back(static_cast<uint32_t>(j - i));
    i = j;
  }
  return runs;
}

absl::StatusOr<std::vector<uint32_t>> FromRankRuns(
    absl::Span<const uint32_t> runs, uint64_t max_ranks) {
  if (runs.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank runs: ", runs.size(), " values, not (first, count) pairs"));
  }
  uint64_t total = 0;
  uint64_t next = 0;  // the lowest rank the next run may start at
  for (size_t i = 0; i < runs.size(); i += 2) {
    const uint64_t first = runs[i], count = runs[i + 1];
    if (count == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank runs: the run at ", first, " is empty"));
    }
    if (first + count - 1 > UINT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank runs: the run at ", first, " of ", count,
                       " ranks goes past the largest rank"));
    }
    if (i > 0 && first <= next) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank runs: the run at ", first,
                       " does not start after the previous one and a gap"));
    }
    total += count;
    if (total > max_ranks) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank runs: more than ", max_ranks, " ranks"));
    }
    next = first + count;
  }
  std::vector<uint32_t> ranks;
  ranks.reserve(total);
  for (size_t i = 0; i < runs.size(); i += 2) {
    for (uint32_t k = 0; k < runs[i + 1]; ++k) ranks.push_back(runs[i] + k);
  }
  return ranks;
}

}  // namespace ps
