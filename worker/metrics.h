// Evaluation metrics for binary classifiers (e.g. click prediction).
//
// Both functions are pure: they read their inputs only and are safe to call
// concurrently. They never abort: inputs they cannot score (mismatched
// sizes, no examples, NaN scores) give NaN, which callers should report as
// "not available" rather than treat as an error.
#ifndef PS_WORKER_METRICS_H_
#define PS_WORKER_METRICS_H_

#include "absl/types/span.h"

namespace ps {

// Area under the ROC curve: the probability that a random positive example
// scores higher than a random negative one, counting ties as one half
// (equivalently, tied scores share their average rank). A label >= 0.5 is
// positive, anything else negative. Returns NaN when the spans differ in
// size, when there are no positives or no negatives, or when a score is NaN.
// O(n log n) time, O(n) extra memory.
double Auc(absl::Span<const float> scores, absl::Span<const float> labels);

// Mean binary cross-entropy -[y log p + (1 - y) log(1 - p)] in nats, with
// each p clipped to [1e-7, 1 - 1e-7] so that a confident mistake costs a
// finite amount. Labels are normally 0 or 1; values in between are used as
// soft targets. Returns NaN when the spans differ in size or are empty; a
// NaN probability or label makes the result NaN.
double LogLoss(absl::Span<const float> probabilities,
               absl::Span<const float> labels);

}  // namespace ps

#endif  // PS_WORKER_METRICS_H_
