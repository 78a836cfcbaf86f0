// Scores a model's predictions against labels, batch by batch: AUC, log
// loss and accuracy, and for synthetic data the generating model's (the
// "oracle's") AUC and log loss. Used by the trainer's evaluations and by
// `predict`, so both report the same figures for the same model and data.
//
// Not thread-safe; one accumulator per evaluation.
#ifndef PS_WORKER_EVALUATION_H_
#define PS_WORKER_EVALUATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "worker/data/dataset.h"
#include "worker/models/model.h"

namespace ps {

struct EvalResult {
  uint64_t examples = 0;
  double auc = 0;             // binary models; NaN when not defined
  double logloss = 0;         // mean cross-entropy (softmax for the MLP)
  double accuracy = 0;        // threshold 0.5 (binary) or argmax
  double oracle_auc = 0;      // synthetic data: the generating model's
  double oracle_logloss = 0;  // NaN otherwise
};

// "test AUC 0.8 (oracle 0.9), test logloss 0.4, accuracy 0.8", leaving out
// what the model does not have.
std::string Describe(const EvalResult& eval);

class EvalAccumulator {
 public:
  // `classes`: 1 for a binary model (ModelOutput::probs holds P(label 1)
  // per example), otherwise the number of classes (a row of probabilities
  // per example).
  explicit EvalAccumulator(int classes) : classes_(classes) {}

  // Adds the batch's examples, scored by `output` (Model::Run on it).
  void Add(const data::ExampleBatch& batch, const ModelOutput& output);
  // Figures over everything added; NaN where undefined (no examples, AUC
  // of a multi-class model, oracle figures without true logits).
  EvalResult Result() const;

 private:
  const int classes_;
  std::vector<float> probs_;   // binary models
  std::vector<float> labels_;  // binary models
  std::vector<float> oracle_;  // true logits, synthetic data
  double loss_ = 0;
  double oracle_loss_ = 0;
  uint64_t correct_ = 0;
  uint64_t examples_ = 0;
};

}  // namespace ps

#endif  // PS_WORKER_EVALUATION_H_
