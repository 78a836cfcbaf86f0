// Update rules of the tables' optimizers, applied by servers to pushed
// gradients and by workers to the dense tables they all-reduce.
//
// An optimizer is stateless apart from its configuration; per-parameter
// state (e.g. Adagrad's accumulators, Adam's moments) lives with the
// parameters in the table, `state_size()` floats per parameter element,
// interleaved: the state of element i is
// state[i * state_size() .. (i + 1) * state_size()).
// That layout lets a contiguous run of a dense block and a sparse row be
// updated by the same call.
// Thread-compatible: Apply may run concurrently on disjoint parameters.
#ifndef PS_COMMON_OPTIMIZER_H_
#define PS_COMMON_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"
#include "proto/config.pb.h"

namespace ps {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // INVALID_ARGUMENT if the config sets no rule or a bad hyper-parameter.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(
      const OptimizerConfig& config);

  // Floats of state per parameter element.
  virtual int state_size() const = 0;

  // Initialises the state of n elements (state_size() * n floats).
  virtual void InitState(float* state, size_t n) const = 0;

  // Applies gradient g to parameters w (n elements each) and their state,
  // with the rule's learning rate multiplied by lr_scale > 0 (FTRL, whose
  // weight is a closed form of the gradients: the gradient is multiplied)
  // (the schedule and staleness factors, see RateMultiplier).
  // Every element in the call counts as updated, even with a zero gradient
  // (Adam advances its per-element step count). An optimizer may replace w
  // outright rather than adjust it (FTRL derives w from its state alone).
  // The caller guarantees the gradients are finite.
  virtual void Apply(float* w, float* state, const float* g, size_t n,
                     float lr_scale) const = 0;

  // Updates `count` rows of a sparse table, in order: row j's dim weights
  // start at rows[j], its state follows them (rows[j] + dim), and its
  // gradient is g[j * dim, (j + 1) * dim). Exactly what calling
  // Apply(rows[j], rows[j] + dim, g + j * dim, dim, lr_scale) for j = 0, 1,
  // ... in turn does, a row listed twice included (updated twice, in
  // order); one call per block of rows rather than per row.
  virtual void ApplyRows(float* const* rows, const float* g, size_t count,
                         size_t dim, float lr_scale) const = 0;
};

// The learning-rate multiplier for an update of step `step` pushed with the
// given staleness (steps the pusher is behind the server's clock) in a
// cluster of `num_workers` workers (cluster.num_workers), as config.proto's
// LearningRateSchedule, scale_with_workers and staleness_aware describe it.
// num_workers is read only with scale_with_workers; 0 counts as 1.
// Always in (0, k], where k is num_workers with scale_with_workers and 1
// without. The config must be valid (ValidateOptimizer).
float RateMultiplier(const OptimizerConfig& config, uint64_t step,
                     uint64_t staleness, uint32_t num_workers);

}  // namespace ps

#endif  // PS_COMMON_OPTIMIZER_H_
