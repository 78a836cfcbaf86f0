// Deterministic synthetic click-through-rate (CTR) data.
//
// The data come from a known logistic model, so a trained model can be
// compared with the best achievable one (the "oracle"):
//
//   * `num_categorical` categorical fields. Field f has a vocabulary of V_f
//     ids, V_f going from max_vocab (field 0) down to min_vocab (the last
//     field) on a log scale. Ids follow a power law: id r (0-based; id 0 is
//     the most frequent) has probability proportional to (r + 1)^-s with
//     s = zipf_exponent. Each (field, id) is reported as a 64-bit key.
//   * `num_numeric` numeric features, each (almost) standard normal: a
//     normal truncated at +-3.67 (variance 0.997), drawn through a
//     piecewise-linear quantile table because that is several times faster
//     than an exact normal.
//   * label ~ Bernoulli(sigmoid(true_logit)) with
//       true_logit = bias + sum_f w(f, id_f) + sum_j v(j) * x_j
//                    + sum_{f < g} <u(f, id_f), u(g, id_g)>,
//     w(f, id) = weight_scale * z(seed, f, id) - c_f and
//     v(j) = weight_scale * z'(seed, j), with z and z' standard normal
//     hashes of their arguments. c_f is the frequency-weighted mean of field
//     f's weights (over its CDF table, see below), so each field adds ~0 to
//     the logit on average and the click rate is set by `bias` and
//     `weight_scale` rather than by the luck of a few frequent ids.
//   * Pairwise interactions (only when interaction_rank R > 0; with R = 0
//     the last sum is absent and the data are bit-identical to a build
//     without interactions): u(f, id) is a latent vector of R values,
//     u(f, id)[c] = interaction_scale * z''(seed, f, id, c) - d_f[c], z''
//     again a standard normal hash and d_f the frequency-weighted mean of
//     field f's latent vectors (over its CDF table), centred for the same
//     reason as the weights: ids of different fields are independent, so
//     E <u(f, id_f), u(g, id_g)> = <E u(f, id_f), E u(g, id_g)> ~ 0 and the
//     interactions add variance but hardly move the mean logit (the tail,
//     left out of d_f, adds a tiny random term). Only categorical fields
//     interact. The sum over the
//     F(F-1)/2 pairs is computed as 0.5 * (|sum_f u_f|^2 - sum_f |u_f|^2),
//     O(F * R) per example. Its variance is about F(F-1)/2 * R * scale^4,
//     so scale should shrink as F or R grow. On the default config (26
//     fields, max_vocab 1000, bias -2, weight_scale 0.3; 200k test
//     examples, seeds 1..3) R = 8 gives click rates of 22-23% at scale 0.1,
//     25-26% at 0.2 and 31% at 0.3 (23% without interactions), and oracle
//     AUCs of 0.86-0.88, 0.91-0.92 and 0.96-0.97 (0.875 without): scales
//     above ~0.3 make the labels nearly deterministic.
//
// Every example is a pure function of (config, split, index): it is computed
// from counter-based hashes (common/hash.h) of the seed, the split, the index
// and the field, never from a sequential random number generator. A worker
// can therefore generate only its own shard, in any batch sizes, in any
// order, and get the same examples as any other process. The train and test
// splits are independent draws from the same model. Reproducibility is
// exact for processes running the same build on the same C library (all
// workers of a job); a different libm or floating-point contraction setting
// could, very rarely, flip a label or an id whose draw falls within an
// ulp of a threshold.
//
// Keys: key(f, id) is a bijective 64-bit mix of (seed, f, id), so two
// different (field, id) pairs never share a key (within a field or across
// fields) and keys look uniformly random, like hashed production features.
//
// Sampling: the most frequent ids of each field (up to 65536 of them, fewer
// when there are many fields: about 2^19 table entries over all fields) come
// from an exact CDF table built by Create(). Instead of a plain binary
// search, a draw starts from a guide table (4x as many buckets as CDF
// entries, indexed by the top bits of the hash), so it usually costs one
// probe; this made generation ~1.4x faster. When a vocabulary is larger than
// its table, each remaining id r gets probability proportional to the
// integral of x^-s over [r + 0.5, r + 1.5) instead of (r + 1)^-s, and is
// sampled by inverting that integral. This bounds memory (at most ~44 bytes
// per table entry, under 30 MiB in all) for any vocabulary size, while
// differing from the discrete law by a relative O(r^-2), only far in the
// tail. Table sizes depend on the config alone, so determinism holds.
// Latent vectors are cached for the most frequent ids of each field too: at
// most min(table size, max(64, 2^22 / (F * R'))) ids per field, R' = R
// rounded up to a multiple of 4 (rows are zero-padded), so the cache is at
// most ~16 MiB (2^22 floats; 64 * R' floats per field when F is near 1000
// can add 0.1 MiB); other ids (rarer table ids and tail ids) have their vectors
// computed on the fly, R normal draws each.
//
// Thread safety: a SyntheticCtr is immutable after Create(); concurrent
// calls of const methods are safe (each with its own Batch).
#ifndef PS_WORKER_DATA_SYNTHETIC_CTR_H_
#define PS_WORKER_DATA_SYNTHETIC_CTR_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/status.h"
#include "proto/config.pb.h"

namespace ps::ctr {

enum class Split { kTrain, kTest };

// A batch in struct-of-arrays layout. Fill() resizes the vectors to the
// batch; reusing one Batch for equal or smaller batches does not reallocate.
struct Batch {
  size_t size = 0;             // examples in the batch
  std::vector<float> labels;   // size; 0 or 1
  std::vector<uint64_t> keys;  // size * num_categorical, row-major
  // The ids behind `keys` (keys[i] == Key(i % num_categorical, ids[i])).
  std::vector<uint32_t> ids;
  std::vector<float> numeric;      // size * num_numeric, row-major
  std::vector<float> true_logits;  // size: the generating model's logit
};

class SyntheticCtr {
 public:
  // `cfg` must have defaults applied (ps::ApplyDefaults). Returns
  // InvalidArgument when a value is out of range: num_categorical or
  // num_numeric above 1000, min_vocab not in 1..max_vocab, max_vocab above
  // 10,000,000, zipf_exponent or weight_scale not finite and > 0, or bias not
  // finite, interaction_rank above 64, or (when interaction_rank > 0)
  // interaction_scale not finite and > 0 (the same rules as
  // ps::ValidateJobConfig). An interaction_scale of 0 with interaction_rank
  // > 0 means the default, 0.1, which config() then reports.
  static absl::StatusOr<SyntheticCtr> Create(const SyntheticCtrConfig& cfg);

  SyntheticCtr(SyntheticCtr&&) = default;
  SyntheticCtr& operator=(SyntheticCtr&&) = default;
  SyntheticCtr(const SyntheticCtr&) = default;
  SyntheticCtr& operator=(const SyntheticCtr&) = default;

  // Examples in `split` (num_train or num_test).
  uint64_t size(Split split) const;
  uint32_t num_categorical() const { return num_categorical_; }
  uint32_t num_numeric() const { return num_numeric_; }
  const SyntheticCtrConfig& config() const { return cfg_; }

  // Vocabulary size of categorical field `field`. Precondition (unchecked,
  // like an index): field < num_categorical(); likewise id < vocab_size(field)
  // and j < num_numeric() below.
  uint32_t vocab_size(uint32_t field) const { return fields_[field].vocab; }

  // The key that (field, id) is reported as. Distinct for distinct pairs.
  uint64_t Key(uint32_t field, uint32_t id) const;

  // The generating model's weights: w(field, id) and v(j).
  float TrueWeight(uint32_t field, uint32_t id) const;
  float TrueNumericWeight(uint32_t j) const { return numeric_weights_[j]; }
  // Component c of the latent vector u(field, id). Precondition (unchecked):
  // c < config().interaction_rank().
  float TrueFactor(uint32_t field, uint32_t id, uint32_t c) const;

  // Fills `out` with examples [begin, begin + count) of `split`; the batch
  // gets `count` rows (0 is allowed). Errors: OUT_OF_RANGE when the range
  // ends past size(split) (`out` is left unchanged); INVALID_ARGUMENT when
  // `out` is null or the batch could not be addressed in memory.
  absl::Status Fill(Split split, uint64_t begin, uint64_t count,
                    Batch* out) const;

 private:
  // Sampling tables of one categorical field.
  struct Field {
    uint32_t vocab = 0;
    // Ranks [0, table_size) come from the CDF table; the rest from the tail.
    uint32_t table_size = 0;
    // Probability of the table ranks; u >= head_mass selects the tail.
    double head_mass = 1.0;
    // Tail: a continuous power law on [table_size + 0.5, vocab + 0.5) in
    // 1-based ranks. tail_lo and tail_hi are those bounds raised to 1 - s
    // (logs when s == 1); a draw interpolates between them and inverts.
    double tail_lo = 0;
    double tail_hi = 0;
    // cdf[i] = P(rank <= i) for i < table_size; cdf.back() = head_mass.
    std::vector<double> cdf;
    // guide[g] = first i with cdf[i] > g / guide.size(); power-of-two size
    // >= 4 * table_size.
    std::vector<uint32_t> guide;
    uint32_t guide_shift = 0;  // 64 - log2(guide.size())
    // Subtracted from every raw weight of the field (see Create()).
    double weight_offset = 0;
    // w(f, r) for r < table_size, cached.
    std::vector<float> weights;
    // Interactions (rank R > 0 only): d_f, subtracted from every raw latent
    // vector of the field (R values), and u(f, r) for r < factor_cache_size,
    // row-major with rows of stride_ floats (R values, then zeros).
    std::vector<double> factor_offset;
    uint32_t factor_cache_size = 0;
    std::vector<float> factors;
  };

  SyntheticCtr() = default;

  // Create()'s steps for one field. BuildSampling fills the sampling
  // tables of `fd` (vocab and table_size set) for Zipf exponent `s`;
  // CenterField then fills field `f`'s weight offset and caches, which
  // read its sampling tables.
  static void BuildSampling(double s, Field* fd);
  void CenterField(uint32_t f, uint32_t max_factor_cache);

  // weight_scale * N(0, 1), a pure function of (seed, field, id).
  double RawWeight(uint32_t field, uint32_t id) const;
  // Id of field `f` for a uniform 64-bit hash `h`.
  uint32_t SampleId(const Field& field, uint64_t h) const;
  // interaction_scale * N(0, 1), a pure function of (seed, field, id, c).
  double RawFactor(uint32_t field, uint32_t id, uint32_t c) const;
  // u(field, id) padded with zeros to stride_ floats: a pointer into the
  // cache, or `scratch` (stride_ floats) filled.
  const float* Factors(uint32_t field, uint32_t id, float* scratch) const;
  uint32_t SampleTail(const Field& field, double u) const;  // u >= head_mass
  double TailInverse(const Field& field, double t) const;

  SyntheticCtrConfig cfg_;
  uint32_t num_categorical_ = 0;
  uint32_t num_numeric_ = 0;
  double zipf_ = 1.0;
  uint64_t train_stream_ = 0;  // per-split roots of the example hashes
  uint64_t test_stream_ = 0;
  uint64_t key_salt_ = 0;
  uint64_t weight_salt_ = 0;
  uint64_t factor_salt_ = 0;
  uint32_t rank_ = 0;    // interaction_rank
  uint32_t stride_ = 0;  // rank_ rounded up to a multiple of 4
  std::vector<Field> fields_;
  std::vector<uint64_t> field_salts_;  // Mix64(f), the per-field hash salt
  std::vector<float> numeric_weights_;
  const float* quantiles_ = nullptr;  // process-wide normal quantile table
};

// The examples of `total` that worker `rank` of `num_workers` owns: a
// contiguous range [begin, end). The ranges of ranks 0..num_workers-1 tile
// [0, total) in order; their sizes differ by at most one. Returns {0, 0} when
// num_workers is 0 and {total, total} when rank >= num_workers.
std::pair<uint64_t, uint64_t> ShardRange(uint64_t total, uint32_t rank,
                                         uint32_t num_workers);

}  // namespace ps::ctr

#endif  // PS_WORKER_DATA_SYNTHETIC_CTR_H_
