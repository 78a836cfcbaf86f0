#include "common/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "common/config.h"
#include "common/status.h"

namespace ps {
namespace {

// ApplyRows for a rule with an inline Apply: the calls are not virtual, and
// with one float per row (scalar embeddings) Apply inlines with n = 1.
template <typename Rule>
class RowsByApply : public Optimizer {
 public:
  void ApplyRows(float* const* rows, const float* g, size_t count, size_t dim,
                 float lr_scale) const final {
    const Rule& rule = static_cast<const Rule&>(*this);
    if (dim == 1) {
      for (size_t j = 0; j < count; ++j) {
        rule.Rule::Apply(rows[j], rows[j] + 1, g + j, 1, lr_scale);
      }
      return;
    }
    for (size_t j = 0; j < count; ++j) {
      rule.Rule::Apply(rows[j], rows[j] + dim, g + j * dim, dim, lr_scale);
    }
  }
};

// w -= lr * g
class Sgd final : public RowsByApply<Sgd> {
 public:
  explicit Sgd(const SgdConfig& c) : lr_(c.learning_rate()) {}
  int state_size() const override { return 0; }
  void InitState(float*, size_t) const override {}
  void Apply(float* w, float*, const float* g, size_t n,
             float lr_scale) const override {
    const float lr = lr_ * lr_scale;
    for (size_t i = 0; i < n; ++i) w[i] -= lr * g[i];
  }

 private:
  const float lr_;
};

// acc += g^2;  w -= lr * g / (sqrt(acc) + eps)   (Duchi et al., 2011)
class Adagrad final : public RowsByApply<Adagrad> {
 public:
  explicit Adagrad(const AdagradConfig& c)
      : lr_(c.learning_rate()),
        init_(c.initial_accumulator()),
        eps_(c.epsilon()) {}
  int state_size() const override { return 1; }
  void InitState(float* state, size_t n) const override {
    for (size_t i = 0; i < n; ++i) state[i] = init_;
  }
  void Apply(float* w, float* acc, const float* g, size_t n,
             float lr_scale) const override {
    const float lr = lr_ * lr_scale;
    for (size_t i = 0; i < n; ++i) {
      acc[i] += g[i] * g[i];
      w[i] -= lr * g[i] / (std::sqrt(acc[i]) + eps_);
    }
  }

 private:
  const float lr_;
  const float init_;
  const float eps_;
};

// v = mu * v + g;  w -= lr * v,  or with Nesterov  w -= lr * (g + mu * v)
// (v already updated). State per element: v, starting at 0.
class Momentum final : public RowsByApply<Momentum> {
 public:
  explicit Momentum(const MomentumConfig& c)
      : lr_(c.learning_rate()), mu_(c.momentum()), nesterov_(c.nesterov()) {}
  int state_size() const override { return 1; }
  void InitState(float* state, size_t n) const override {
    for (size_t i = 0; i < n; ++i) state[i] = 0.0f;
  }
  void Apply(float* w, float* v, const float* g, size_t n,
             float lr_scale) const override {
    const float lr = lr_ * lr_scale;
    for (size_t i = 0; i < n; ++i) {
      v[i] = mu_ * v[i] + g[i];
      w[i] -= nesterov_ ? lr * (g[i] + mu_ * v[i]) : lr * v[i];
    }
  }

 private:
  const float lr_;
  const float mu_;
  const bool nesterov_;
};

// Adam (Kingma & Ba, 2015, Algorithm 1), lazily: an element's moments and
// step count advance only when an Apply covers it, so sparse rows pushed
// rarely are bias-corrected by their own step count, not a global one (as
// TensorFlow's LazyAdam). State per element, interleaved: m, v, t.
//
// t is kept as a float so the state stays one float array. Floats hold every
// integer up to 2^24 exactly; after 2^24 (~16.7M) updates of one element,
// t + 1 rounds back to t and the count saturates. That is harmless for any
// beta up to 0.999999: beta^(2^24) < 1e-7, so the correction factors are 1
// to float precision either way.
class Adam final : public RowsByApply<Adam> {
 public:
  explicit Adam(const AdamConfig& c)
      : lr_(c.learning_rate()),
        beta1_(c.beta1()),
        beta2_(c.beta2()),
        eps_(c.epsilon()) {}
  int state_size() const override { return 3; }
  void InitState(float* state, size_t n) const override {
    for (size_t i = 0; i < 3 * n; ++i) state[i] = 0.0f;
  }
  void Apply(float* w, float* state, const float* g, size_t n,
             float lr_scale) const override {
    const double lr = static_cast<double>(lr_) * lr_scale;
    // Neighbouring elements nearly always share their step count (always in
    // a dense block), so the two powers are computed once per run of equal
    // counts rather than per element.
    float cached_t = -1.0f;
    double c1 = 1.0, c2 = 1.0;
    for (size_t i = 0; i < n; ++i) {
      float& m = state[3 * i];
      float& v = state[3 * i + 1];
      float& t = state[3 * i + 2];
      t += 1.0f;
      m = beta1_ * m + (1.0f - beta1_) * g[i];
      v = beta2_ * v + (1.0f - beta2_) * g[i] * g[i];
      // beta^t in float loses most of its digits once beta^t nears 1 (small
      // t, beta2 = 0.999): 1 - beta^t would then be badly rounded, and it
      // scales the whole step. Double keeps the correction accurate.
      if (t != cached_t) {
        cached_t = t;
        c1 = 1.0 - std::pow(static_cast<double>(beta1_), t);
        c2 = 1.0 - std::pow(static_cast<double>(beta2_), t);
      }
      const double m_hat = m / c1;
      const double v_hat = v / c2;
      w[i] -= static_cast<float>(lr * m_hat / (std::sqrt(v_hat) + eps_));
    }
  }

 private:
  const float lr_;
  const float beta1_;
  const float beta2_;
  const float eps_;
};

// FTRL-proximal (McMahan et al., 2013, Algorithm 1), per coordinate. State
// per element, interleaved: z, n, both starting at 0.
//
// The weight is a pure function of (z, n), so Apply derives the current
// weight from the state instead of reading w: whatever the table's
// initializer put in w is ignored (the algorithm starts from w = 0) and
// simply overwritten by the first update.
class Ftrl final : public RowsByApply<Ftrl> {
 public:
  explicit Ftrl(const FtrlConfig& c)
      : alpha_(c.alpha()), beta_(c.beta()), l1_(c.l1()), l2_(c.l2()) {}
  int state_size() const override { return 2; }
  void InitState(float* state, size_t n) const override {
    for (size_t i = 0; i < 2 * n; ++i) state[i] = 0.0f;
  }
  // lr_scale scales this update's gradient. FTRL's weight is a closed form
  // of all gradients so far with alpha as a global factor: scaling alpha
  // for one update would rescale the whole weight (w is proportional to
  // alpha when l1 = l2 = 0), not the update. A scaled gradient makes this
  // update count less, in both z and n, which is what a decayed or stale
  // update should do; a scale of 1 is exactly the algorithm above.
  void Apply(float* w, float* state, const float* g, size_t n,
             float lr_scale) const override {
    const double alpha = alpha_;
    for (size_t i = 0; i < n; ++i) {
      float& z = state[2 * i];
      float& acc = state[2 * i + 1];
      // Double for the intermediates: sqrt(n + g^2) - sqrt(n) cancels
      // badly in float once n is large relative to g^2.
      const double gi = static_cast<double>(g[i]) * lr_scale;
      const double n_old = acc;
      const double n_new = n_old + gi * gi;
      const double sigma = (std::sqrt(n_new) - std::sqrt(n_old)) / alpha;
      z = static_cast<float>(z - sigma * Weight(z, n_old, alpha) + gi);
      acc = static_cast<float>(n_new);
      w[i] = static_cast<float>(Weight(z, acc, alpha));
    }
  }

 private:
  // The closed-form minimiser of the regularised, linearised loss.
  double Weight(double z, double n, double alpha) const {
    if (std::abs(z) <= l1_) return 0.0;
    const double shrunk = z > 0 ? z - l1_ : z + l1_;
    // beta > 0 keeps the denominator positive even while n is 0.
    return -shrunk / ((beta_ + std::sqrt(n)) / alpha + l2_);
  }

  const double alpha_;
  const double beta_;
  const double l1_;
  const double l2_;
};

}  // namespace

float RateMultiplier(const OptimizerConfig& config, uint64_t step,
                     uint64_t staleness, uint32_t num_workers) {
  const LearningRateSchedule& s = config.schedule();
  // The warm-up ramps linearly from `from` (reached one step before step 0)
  // to the target k, arriving at step warmup_steps - 1. Without scaling it
  // ramps from 0 to 1. With scaling it starts at the single-worker rate, 1,
  // not at 0 (Goyal et al.'s gradual warm-up): the single-worker rate is
  // known to be safe, only the climb to k times it needs easing in.
  const bool scaled = config.scale_with_workers();
  const double k =
      scaled ? static_cast<double>(std::max(num_workers, uint32_t{1})) : 1.0;
  const double from = scaled ? 1.0 : 0.0;
  double m = k;
  if (s.warmup_steps() > 0 && step < s.warmup_steps()) {
    m = from + (k - from) * static_cast<double>(step + 1) /
                   static_cast<double>(s.warmup_steps());
  }
  if (s.decay_steps() > 0) {
    m *= std::pow(static_cast<double>(s.decay_rate()),
                  static_cast<double>(step / s.decay_steps()));
  }
  if (config.staleness_aware()) m /= 1.0 + static_cast<double>(staleness);
  // Deep decay underflows to 0, which the optimizers take as "no update";
  // keep the smallest positive float instead so the contract (> 0) holds.
  return std::max(static_cast<float>(m), std::numeric_limits<float>::min());
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    const OptimizerConfig& config) {
  // The config may not have come through ValidateJobConfig: check it with
  // the same rules rather than trust it.
  if (absl::Status valid = ValidateOptimizer(config); !valid.ok()) return valid;
  switch (config.kind_case()) {
    case OptimizerConfig::kSgd:
      return std::make_unique<Sgd>(config.sgd());
    case OptimizerConfig::kAdagrad:
      return std::make_unique<Adagrad>(config.adagrad());
    case OptimizerConfig::kMomentum:
      return std::make_unique<Momentum>(config.momentum());
    case OptimizerConfig::kAdam:
      return std::make_unique<Adam>(config.adam());
    case OptimizerConfig::kFtrl:
      return std::make_unique<Ftrl>(config.ftrl());
    case OptimizerConfig::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("optimizer: no update rule set");
}

}  // namespace ps
