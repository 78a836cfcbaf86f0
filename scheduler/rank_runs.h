// Sets of worker ranks as runs of consecutive ranks: what a barrier answers
// (BarrierResponse.rank_runs). A fleet's barrier is usually met by every
// rank, or by all but a few, so the runs take a few numbers where the list
// of ranks takes one per worker, and a barrier's release sends O(N) bytes
// to N workers instead of O(N^2).
//
// Pure functions; thread-safe.
#ifndef PS_SCHEDULER_RANK_RUNS_H_
#define PS_SCHEDULER_RANK_RUNS_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/status.h"

namespace ps {

// `ranks`, ascending and without repeats, as (first, count) pairs, ascending,
// each run as long as it can be.
std::vector<uint32_t> ToRankRuns(absl::Span<const uint32_t> ranks);

// The ranks of `runs` ((first, count) pairs), ascending. INVALID_ARGUMENT
// for an odd number of values, a run of count 0, a run reaching past rank
// 2^32 - 1, runs not ascending and apart, or more than `max_ranks` ranks in
// all (a bound on what a malformed answer may make the caller allocate).
absl::StatusOr<std::vector<uint32_t>> FromRankRuns(
    absl::Span<const uint32_t> runs, uint64_t max_ranks);

}  // namespace ps

#endif  // PS_SCHEDULER_RANK_RUNS_H_
