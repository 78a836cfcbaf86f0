#include "worker/evaluation.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/metrics.h"

namespace ps {
namespace {

// Log loss of one example from its logit, stable for large |z|.
double LossFromLogit(float z, float y) {
  const double softplus =
      z > 0 ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z));
  return softplus - y * z;
}

}  // namespace

std::string Describe(const EvalResult& eval) {
  std::string out;
  if (std::isfinite(eval.auc)) {
    absl::StrAppend(&out, absl::StrFormat("test AUC %.4f", eval.auc));
  }
  if (std::isfinite(eval.oracle_auc)) {
    absl::StrAppend(&out, absl::StrFormat(" (oracle %.4f)", eval.oracle_auc));
  }
  absl::StrAppend(&out, out.empty() ? "" : ", ",
                  absl::StrFormat("test logloss %.4f, accuracy %.4f",
                                  eval.logloss, eval.accuracy));
  return out;
}

void EvalAccumulator::Add(const data::ExampleBatch& batch,
                          const ModelOutput& output) {
  loss_ += output.loss_sum;
  for (size_t i = 0; i < batch.size; ++i) {
    const float y = batch.labels[i];
    const float* p = &output.probs[i * classes_];
    if (classes_ == 1) {
      probs_.push_back(p[0]);
      labels_.push_back(y);
      correct_ += (p[0] >= 0.5f) == (y >= 0.5f);
      if (!batch.true_logits.empty()) {
        oracle_.push_back(batch.true_logits[i]);
        oracle_loss_ += LossFromLogit(batch.true_logits[i], y);
      }
    } else {
      const int best = static_cast<int>(std::max_element(p, p + classes_) - p);
      correct_ += best == static_cast<int>(y);
    }
  }
  examples_ += batch.size;
}

EvalResult EvalAccumulator::Result() const {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double count = static_cast<double>(examples_);
  EvalResult r;
  r.examples = examples_;
  r.auc = classes_ == 1 ? Auc(probs_, labels_) : nan;
  r.logloss = examples_ > 0 ? loss_ / count : nan;
  r.accuracy = examples_ > 0 ? correct_ / count : nan;
  r.oracle_auc = oracle_.empty() ? nan : Auc(oracle_, labels_);
  r.oracle_logloss = oracle_.empty() ? nan : oracle_loss_ / count;
  return r;
}

}  // namespace ps
