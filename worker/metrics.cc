#include "worker/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/types/span.h"

namespace ps {

double Auc(absl::Span<const float> scores, absl::Span<const float> labels) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  const size_t n = scores.size();
  if (labels.size() != n) return kNaN;
  // NaN would break the strict weak ordering std::sort relies on.
  for (float s : scores) {
    if (std::isnan(s)) return kNaN;
  }

  // Sorting (score, label) pairs rather than indices keeps the scan below
  // sequential in memory.
  std::vector<std::pair<float, bool>> sorted(n);
  for (size_t i = 0; i < n; ++i) {
    sorted[i] = {scores[i], labels[i] >= 0.5f};
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });

  // Mann-Whitney U: sum the 1-based ranks of the positives, giving each run
  // of equal scores the average of the ranks it spans.
  double positive_rank_sum = 0;
  uint64_t positives = 0;
  size_t i = 0;
  while (i < n) {
    size_t j = i + 1;
    while (j < n && sorted[j].first == sorted[i].first) ++j;
    uint64_t run_positives = 0;
    for (size_t k = i; k < j; ++k) run_positives += sorted[k].second;
    const double avg_rank = 0.5 * (static_cast<double>(i + 1) + j);
    positive_rank_sum += avg_rank * static_cast<double>(run_positives);
    positives += run_positives;
    i = j;
  }
  const uint64_t negatives = n - positives;
  if (positives == 0 || negatives == 0) return kNaN;
  const double p = static_cast<double>(positives);
  const double u = positive_rank_sum - p * (p + 1) / 2;
  return u / (p * static_cast<double>(negatives));
}

double LogLoss(absl::Span<const float> probabilities,
               absl::Span<const float> labels) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr double kEps = 1e-7;
  const size_t n = probabilities.size();
  if (labels.size() != n || n == 0) return kNaN;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    double p = probabilities[i];
    // std::clamp returns a NaN argument unchanged, so NaN propagates.
    p = std::clamp(p, kEps, 1 - kEps);
    const double y = labels[i];
    sum -= y * std::log(p) + (1 - y) * std::log1p(-p);
  }
  return sum / static_cast<double>(n);
}

}  // namespace ps
