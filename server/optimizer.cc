#include "server/optimizer.h"

#include <cmath>
#include <memory>

#include "absl/status/status.h"

namespace ps {
namespace {

// w -= lr * g
class Sgd : public Optimizer {
 public:
  explicit Sgd(const SgdConfig& c) : lr_(c.learning_rate()) {}
  int state_size() const override { return 0; }
  void InitState(float*, size_t) const override {}
  void Apply(float* w, float*, const float* g, size_t n) const override {
    for (size_t i = 0; i < n; ++i) w[i] -= lr_ * g[i];
  }

 private:
  const float lr_;
};

// acc += g^2;  w -= lr * g / (sqrt(acc) + eps)   (Duchi et al., 2011)
class Adagrad : public Optimizer {
 public:
  explicit Adagrad(const AdagradConfig& c)
      : lr_(c.learning_rate()),
        init_(c.initial_accumulator()),
        eps_(c.epsilon()) {}
  int state_size() const override { return 1; }
  void InitState(float* state, size_t n) const override {
    for (size_t i = 0; i < n; ++i) state[i] = init_;
  }
  void Apply(float* w, float* acc, const float* g, size_t n) const override {
    for (size_t i = 0; i < n; ++i) {
      acc[i] += g[i] * g[i];
      w[i] -= lr_ * g[i] / (std::sqrt(acc[i]) + eps_);
    }
  }

 private:
  const float lr_;
  const float init_;
  const float eps_;
};

bool PositiveFinite(float v) { return std::isfinite(v) && v > 0; }

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    const OptimizerConfig& config) {
  switch (config.kind_case()) {
    case OptimizerConfig::kSgd:
      if (!PositiveFinite(config.sgd().learning_rate())) {
        return absl::InvalidArgumentError("sgd.learning_rate must be > 0");
      }
      return std::make_unique<Sgd>(config.sgd());
    case OptimizerConfig::kAdagrad: {
      const AdagradConfig& a = config.adagrad();
      if (!PositiveFinite(a.learning_rate()) || !PositiveFinite(a.epsilon()) ||
          !(std::isfinite(a.initial_accumulator()) &&
            a.initial_accumulator() >= 0)) {
        return absl::InvalidArgumentError(
            "adagrad needs learning_rate > 0, epsilon > 0 and a finite "
            "initial_accumulator >= 0");
      }
      return std::make_unique<Adagrad>(a);
    }
    case OptimizerConfig::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("optimizer: set one of sgd, adagrad");
}

}  // namespace ps
