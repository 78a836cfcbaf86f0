#include "worker/data/synthetic_ctr.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/status.h"

namespace ps::ctr {
namespace {

// Limits shared with ps::ValidateJobConfig (common/config.cc).
constexpr uint32_t kMaxFields = 1000;
constexpr uint32_t kMaxVocab = 10000000;

// CDF table sizing: at most kMaxTableRanks per field and about
// kTableBudget entries over all fields, but never fewer than kMinTableRanks
// per field, so the (approximate) tail only ever starts far from the head.
constexpr uint32_t kMaxTableRanks = 1u << 16;
constexpr uint32_t kMinTableRanks = 1u << 10;
constexpr uint64_t kTableBudget = uint64_t{1} << 19;

// Pairwise interactions: the largest interaction_rank, the default scale,
// and the latent-vector cache: about kFactorBudget floats over all fields,
// but at least kMinFactorCache ids per field (the most frequent ones, which
// most draws hit) when the table has them.
constexpr uint32_t kMaxInteractionRank = 64;
constexpr float kDefaultInteractionScale = 0.1f;
constexpr uint64_t kFactorBudget = uint64_t{1} << 22;
constexpr uint32_t kMinFactorCache = 64;

// Salts that separate the hash streams. Field f of an example uses salt f
// (< kMaxFields), so these must stay above that.
constexpr uint64_t kNumericSalt = uint64_t{1} << 32;  // + pair index
constexpr uint64_t kLabelSalt = uint64_t{1} << 33;
constexpr uint64_t kTrainSalt = 0x747261696e;        // "train"
constexpr uint64_t kTestSalt = 0x74657374;           // "test"
constexpr uint64_t kKeySalt = 0x6b6579;              // "key"
constexpr uint64_t kFactorSalt = 0x666163746f72;     // "factor"
constexpr uint64_t kWeightSalt = 0x776569676874;     // "weight"
constexpr uint64_t kNumericWeightSalt = 0x6e756d77;  // "numw"

constexpr double kTwoPi = 6.283185307179586476925286766559;
constexpr double kSqrtHalf = 0.70710678118654752440084436210485;
constexpr double kInv2Pow32 = 1.0 / 4294967296.0;

// Numeric features: a piecewise-linear approximation of the standard normal
// quantile function, so that a feature costs a table read instead of a log
// and a sincos. Quantiles()[i] = Phi^-1((i + 0.5) / (kBins + 1)), so features
// are bounded by Phi^-1(1 - 0.5 / 4097) ~= 3.67 (a normal truncated there;
// variance ~0.997), which also keeps a trained model's inputs tame.
constexpr int kBinBits = 12;
constexpr int kBins = 1 << kBinBits;

const std::vector<float>& Quantiles() {
  static const std::vector<float>* const table = [] {
    auto* t = new std::vector<float>(kBins + 1);
    for (int i = 0; i <= kBins; ++i) {
      const double p = (i + 0.5) / (kBins + 1);
      // Bisection on Phi(x) = erfc(-x / sqrt(2)) / 2; run once per process.
      double lo = -10, hi = 10;
      for (int it = 0; it < 64; ++it) {
        const double mid = 0.5 * (lo + hi);
        (0.5 * std::erfc(-mid * kSqrtHalf) < p ? lo : hi) = mid;
      }
      (*t)[i] = static_cast<float>(0.5 * (lo + hi));
    }
    return t;
  }();
  return *table;
}

// Approximately standard normal from 32 uniform bits: the top kBinBits pick
// a bin of the quantile table, the other 20 interpolate within it.
inline float QuantileNormal(const float* q, uint32_t bits) {
  const uint32_t bin = bits >> (32 - kBinBits);
  const float frac = static_cast<float>(bits & ((1u << (32 - kBinBits)) - 1)) *
                     (1.0f / (1u << (32 - kBinBits)));
  return q[bin] + frac * (q[bin + 1] - q[bin]);
}

// Exact standard normal from one 64-bit hash (Box-Muller on its two 32-bit
// halves; 32 bits per uniform bound |z| by about 6.7). Used for the true
// weights, which are mostly computed once, at Create().
inline double Normal(uint64_t h) {
  const double u1 = (static_cast<double>(h >> 32) + 0.5) * kInv2Pow32;
  const double u2 = static_cast<double>(h & 0xffffffffu) * kInv2Pow32;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

inline uint64_t FieldId(uint32_t field, uint32_t id) {
  return (static_cast<uint64_t>(field) << 32) | id;
}

bool PositiveFinite(float v) { return std::isfinite(v) && v > 0; }

// x^(1-s), or log(x) when s == 1: the antiderivative of x^-s up to a factor.
inline double PowerIntegral(double x, double one_minus_s) {
  return one_minus_s == 0 ? std::log(x) : std::pow(x, one_minus_s);
}

absl::Status Validate(const SyntheticCtrConfig& c) {
  auto bad = [](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic_ctr.", field, ": ", why));
  };
  if (c.num_categorical() > kMaxFields) {
    return bad("num_categorical", "must be at most 1000");
  }
  if (c.num_numeric() > kMaxFields) {
    return bad("num_numeric", "must be at most 1000");
  }
  if (c.max_vocab() > kMaxVocab) {
    return bad("max_vocab", "must be at most 10000000");
  }
  if (c.min_vocab() < 1 || c.min_vocab() > c.max_vocab()) {
    return bad("min_vocab", "must be in 1..max_vocab");
  }
  if (!PositiveFinite(c.zipf_exponent())) {
    return bad("zipf_exponent", "must be finite and > 0");
  }
  if (!PositiveFinite(c.weight_scale())) {
    return bad("weight_scale", "must be finite and > 0");
  }
  if (!std::isfinite(c.bias())) return bad("bias", "must be finite");
  if (c.interaction_rank() > kMaxInteractionRank) {
    return bad("interaction_rank", "must be at most 64");
  }
  if (c.interaction_rank() > 0 && !PositiveFinite(c.interaction_scale())) {
    return bad("interaction_scale", "must be finite and > 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SyntheticCtr> SyntheticCtr::Create(
    const SyntheticCtrConfig& config) {
  // ps::ApplyDefaults may predate interaction_scale's default; fill it here
  // so that both paths agree.
  SyntheticCtrConfig cfg = config;
  if (cfg.interaction_rank() > 0 && cfg.interaction_scale() == 0) {
    cfg.set_interaction_scale(kDefaultInteractionScale);
  }
  if (absl::Status s = Validate(cfg); !s.ok()) return s;

  SyntheticCtr g;
  g.cfg_ = cfg;
  g.num_categorical_ = cfg.num_categorical();
  g.num_numeric_ = cfg.num_numeric();
  g.zipf_ = cfg.zipf_exponent();
  const uint64_t root = Mix64(cfg.seed());
  g.train_stream_ = HashCombine(root, kTrainSalt);
  g.test_stream_ = HashCombine(root, kTestSalt);
  g.key_salt_ = HashCombine(root, kKeySalt);
  g.weight_salt_ = HashCombine(root, kWeightSalt);
  g.factor_salt_ = HashCombine(root, kFactorSalt);
  g.rank_ = cfg.interaction_rank();
  g.stride_ = (g.rank_ + 3) & ~3u;
  g.quantiles_ = Quantiles().data();  // built here, not in the first Fill()

  const uint32_t nf = g.num_categorical_;
  const uint32_t max_table = static_cast<uint32_t>(
      std::clamp<uint64_t>(kTableBudget / std::max<uint32_t>(nf, 1),
                           kMinTableRanks, kMaxTableRanks));
  const uint32_t rank = g.rank_;
  const uint32_t max_factor_cache =
      rank == 0 ? 0
                : static_cast<uint32_t>(std::clamp<uint64_t>(
                      kFactorBudget /
                          (uint64_t{std::max<uint32_t>(nf, 1)} * g.stride_),
                      kMinFactorCache, kMaxTableRanks));
  const double s = g.zipf_;
  const double log_max = std::log(static_cast<double>(cfg.max_vocab()));
  const double log_min = std::log(static_cast<double>(cfg.min_vocab()));

  g.fields_.resize(nf);
  g.field_salts_.resize(nf);
  for (uint32_t f = 0; f < nf; ++f) g.field_salts_[f] = Mix64(f);
  for (uint32_t f = 0; f < nf; ++f) {
    Field& fd = g.fields_[f];
    // Log-linear from max_vocab (field 0) to min_vocab (last field).
    const double t = nf > 1 ? static_cast<double>(f) / (nf - 1) : 0.0;
    const double v = std::round(std::exp(log_max + (log_min - log_max) * t));
    fd.vocab = static_cast<uint32_t>(
        std::clamp<double>(v, cfg.min_vocab(), cfg.max_vocab()));
    fd.table_size = std::min(fd.vocab, max_table);
    BuildSampling(s, &fd);
    g.CenterField(f, max_factor_cache);
  }

  g.numeric_weights_.resize(g.num_numeric_);
  const uint64_t nw_salt = HashCombine(root, kNumericWeightSalt);
  for (uint32_t j = 0; j < g.num_numeric_; ++j) {
    g.numeric_weights_[j] = static_cast<float>(cfg.weight_scale() *
                                               Normal(HashCombine(nw_salt, j)));
  }
  return g;
}

void SyntheticCtr::BuildSampling(double s, Field* fd) {
  const double one_minus_s = 1.0 - s;
  // Unnormalised masses: table ranks exactly, the tail as an integral.
  const uint32_t k = fd->table_size;
  fd->cdf.resize(k);
  double sum = 0;
  for (uint32_t r = 0; r < k; ++r) {
    sum += std::pow(static_cast<double>(r) + 1.0, -s);
    fd->cdf[r] = sum;
  }
  double tail_mass = 0;
  if (k < fd->vocab) {
    fd->tail_lo = PowerIntegral(k + 0.5, one_minus_s);
    fd->tail_hi = PowerIntegral(fd->vocab + 0.5, one_minus_s);
    tail_mass = one_minus_s == 0 ? fd->tail_hi - fd->tail_lo
                                 : (fd->tail_hi - fd->tail_lo) / one_minus_s;
  }
  const double total = sum + tail_mass;
  for (double& c : fd->cdf) c /= total;
  // Exact end points: u < 1 always, so the search below cannot run off
  // the table when there is no tail.
  fd->head_mass = k < fd->vocab ? fd->cdf[k - 1] : 1.0;
  fd->cdf[k - 1] = fd->head_mass;

  // Guide table of a power-of-two size G >= 4k (and >= 2, so that the
  // shift below stays < 64). With a power of two, bucket g holds exactly
  // the u in [g / G, (g + 1) / G), so guide[g] is a safe place to start.
  // 4k buckets leave few buckets that span several ranks, so the search
  // rarely takes a second (mispredicted) step; 8k gained under 5%.
  uint32_t log2g = 1;
  while ((uint64_t{1} << log2g) < 4 * uint64_t{k}) ++log2g;
  const uint32_t gsize = 1u << log2g;
  fd->guide_shift = 64 - log2g;
  fd->guide.resize(gsize);
  uint32_t i = 0;
  for (uint32_t b = 0; b < gsize; ++b) {
    const double lo = static_cast<double>(b) / gsize;
    while (i + 1 < k && fd->cdf[i] <= lo) ++i;
    fd->guide[b] = i;
  }
}

void SyntheticCtr::CenterField(uint32_t f, uint32_t max_factor_cache) {
  Field& fd = fields_[f];
  const uint32_t k = fd.table_size;
  const uint32_t rank = rank_;
  // Center the field: subtract the frequency-weighted mean of its table
  // weights, so that a field's expected contribution to the logit is ~0
  // and `bias` alone sets the average logit. Without this the click rate
  // moved from 15% to 27% between seeds, because a few random head weights
  // (id 0 of a 10-id field is drawn ~35% of the time) shift every logit.
  // The tail is left out: its mean is 0 up to a tiny random term.
  double mean = 0, prev = 0;
  for (uint32_t r = 0; r < k; ++r) {
    mean += (fd.cdf[r] - prev) * RawWeight(f, r);
    prev = fd.cdf[r];
  }
  fd.weight_offset = mean;
  // Cached exactly as TrueWeight() computes them, which the tail uses.
  fd.weights.resize(k);
  for (uint32_t r = 0; r < k; ++r) fd.weights[r] = TrueWeight(f, r);
  if (rank == 0) return;
  // The same centring for the latent vectors. Without it the mean of an
  // interaction, <d_f, d_g> summed over pairs, is a seed-dependent shift
  // of the logit (frequent ids of small fields recur in most examples)
  // that grows with interaction_scale^2.
  fd.factor_offset.assign(rank, 0.0);
  prev = 0;
  for (uint32_t r = 0; r < k; ++r) {
    const double p = fd.cdf[r] - prev;
    prev = fd.cdf[r];
    for (uint32_t c = 0; c < rank; ++c) {
      fd.factor_offset[c] += p * RawFactor(f, r, c);
    }
  }
  fd.factor_cache_size = std::min(k, max_factor_cache);
  // Zeros pad each row to the stride.
  fd.factors.assign(size_t{fd.factor_cache_size} * stride_, 0.0f);
  for (uint32_t r = 0; r < fd.factor_cache_size; ++r) {
    for (uint32_t c = 0; c < rank; ++c) {
      fd.factors[size_t{r} * stride_ + c] = TrueFactor(f, r, c);
    }
  }
}

uint64_t SyntheticCtr::size(Split split) const {
  return split == Split::kTrain ? cfg_.num_train() : cfg_.num_test();
}

uint64_t SyntheticCtr::Key(uint32_t field, uint32_t id) const {
  // Mix64 is a bijection and XOR with a constant is one too, so distinct
  // (field, id) pairs (id < 2^32) give distinct keys.
  return Mix64(FieldId(field, id) ^ key_salt_);
}

double SyntheticCtr::RawWeight(uint32_t field, uint32_t id) const {
  return cfg_.weight_scale() *
         Normal(HashCombine(weight_salt_, FieldId(field, id)));
}

float SyntheticCtr::TrueWeight(uint32_t field, uint32_t id) const {
  return static_cast<float>(RawWeight(field, id) -
                            fields_[field].weight_offset);
}

double SyntheticCtr::RawFactor(uint32_t field, uint32_t id, uint32_t c) const {
  return cfg_.interaction_scale() *
         Normal(HashCombine(HashCombine(factor_salt_, FieldId(field, id)), c));
}

float SyntheticCtr::TrueFactor(uint32_t field, uint32_t id, uint32_t c) const {
  return static_cast<float>(RawFactor(field, id, c) -
                            fields_[field].factor_offset[c]);
}

const float* SyntheticCtr::Factors(uint32_t field, uint32_t id,
                                   float* scratch) const {
  const Field& fd = fields_[field];
  if (id < fd.factor_cache_size) return &fd.factors[size_t{id} * stride_];
  for (uint32_t c = 0; c < rank_; ++c) scratch[c] = TrueFactor(field, id, c);
  for (uint32_t c = rank_; c < stride_; ++c) scratch[c] = 0.0f;
  return scratch;
}

double SyntheticCtr::TailInverse(const Field& fd, double t) const {
  const double one_minus_s = 1.0 - zipf_;
  const double y = fd.tail_lo + t * (fd.tail_hi - fd.tail_lo);
  return one_minus_s == 0 ? std::exp(y) : std::pow(y, 1.0 / one_minus_s);
}

uint32_t SyntheticCtr::SampleTail(const Field& fd, double u) const {
  // Continuous power law on [k + 0.5, vocab + 0.5) in 1-based ranks, rounded
  // to the nearest rank.
  const double t = (u - fd.head_mass) / (1.0 - fd.head_mass);
  const double x = TailInverse(fd, t);
  const double rank1 = std::floor(x + 0.5);  // 1-based
  const double lo = static_cast<double>(fd.table_size) + 1;
  const double hi = static_cast<double>(fd.vocab);
  return static_cast<uint32_t>(std::clamp(rank1, lo, hi)) - 1;
}

inline uint32_t SyntheticCtr::SampleId(const Field& fd, uint64_t h) const {
  const double u = HashToUnit(h);
  if (ABSL_PREDICT_FALSE(u >= fd.head_mass)) return SampleTail(fd, u);
  // The bucket of u is its top bits (HashToUnit keeps the top 53 bits).
  uint32_t i = fd.guide[h >> fd.guide_shift];
  // Terminates: cdf[table_size - 1] == head_mass > u.
  while (fd.cdf[i] <= u) ++i;
  return i;
}

absl::Status SyntheticCtr::Fill(Split split, uint64_t begin, uint64_t count,
                                Batch* out) const {
  if (out == nullptr) return absl::InvalidArgumentError("Fill: null batch");
  const uint64_t n = size(split);
  if (begin > n || count > n - begin) {
    return absl::OutOfRangeError(absl::StrCat(
        "Fill: examples [", begin, ", ", begin, " + ", count, ") are past the ",
        split == Split::kTrain ? "train" : "test", " split's ", n,
        " examples"));
  }
  const uint64_t width =
      std::max<uint64_t>({uint64_t{1}, num_categorical_, num_numeric_});
  if (count > std::numeric_limits<size_t>::max() / sizeof(uint64_t) / width) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fill: a batch of ", count, " examples is too large"));
  }

  const size_t m = static_cast<size_t>(count);
  const uint32_t nf = num_categorical_;
  const uint32_t nn = num_numeric_;
  out->size = m;
  out->labels.resize(m);
  out->keys.resize(m * nf);
  out->ids.resize(m * nf);
  out->numeric.resize(m * nn);
  out->true_logits.resize(m);

  const uint64_t stream = split == Split::kTrain ? train_stream_ : test_stream_;
  const double bias = cfg_.bias();
  const float* q = quantiles_;
  const uint64_t* field_salts = field_salts_.data();
  // Interactions: the example's latent vectors, and room for the vectors
  // that are not cached.
  std::vector<const float*> rows(rank_ > 0 ? nf : 0);
  std::vector<float> scratch(size_t{nf} * stride_);
  for (size_t e = 0; e < m; ++e) {
    // Every draw of an example is a hash of (stream, index, salt), so any
    // example can be computed alone. HashCombine(ex, s) = Mix64(ex ^
    // Mix64(s)); the Mix64(s) of the fields are precomputed.
    const uint64_t ex = HashCombine(stream, begin + e);
    double logit = bias;

    uint64_t* keys = out->keys.data() + e * nf;
    uint32_t* ids = out->ids.data() + e * nf;
    for (uint32_t f = 0; f < nf; ++f) {
      const Field& fd = fields_[f];
      const uint32_t id = SampleId(fd, Mix64(ex ^ field_salts[f]));
      keys[f] = Key(f, id);
      ids[f] = id;
      logit += id < fd.table_size ? fd.weights[id] : TrueWeight(f, id);
    }

    float* x = out->numeric.data() + e * nn;
    for (uint32_t j = 0; j < nn; j += 2) {
      const uint64_t h = HashCombine(ex, kNumericSalt + j / 2);
      x[j] = QuantileNormal(q, static_cast<uint32_t>(h >> 32));
      logit += numeric_weights_[j] * static_cast<double>(x[j]);
      if (j + 1 < nn) {
        x[j + 1] = QuantileNormal(q, static_cast<uint32_t>(h));
        logit += numeric_weights_[j + 1] * static_cast<double>(x[j + 1]);
      }
    }

    if (rank_ > 0) {
      // sum_{f<g} <u_f, u_g> = 0.5 * (|sum_f u_f|^2 - sum_f |u_f|^2), four
      // components at a time in registers (rows are zero-padded to a
      // multiple of 4); summing into arrays, or squares into one total, ran
      // at half the speed. Added last, so that without interactions the
      // logit is the same sequence of additions as before they existed.
      for (uint32_t f = 0; f < nf; ++f) {
        rows[f] = Factors(f, ids[f], scratch.data() + size_t{f} * stride_);
      }
      double pairs = 0;
      for (uint32_t c = 0; c < stride_; c += 4) {
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        double q0 = 0, q1 = 0, q2 = 0, q3 = 0;
        for (uint32_t f = 0; f < nf; ++f) {
          const float* u = rows[f] + c;
          const double v0 = u[0], v1 = u[1], v2 = u[2], v3 = u[3];
          s0 += v0;
          s1 += v1;
          s2 += v2;
          s3 += v3;
          q0 += v0 * v0;
          q1 += v1 * v1;
          q2 += v2 * v2;
          q3 += v3 * v3;
        }
        pairs += ((s0 * s0 - q0) + (s1 * s1 - q1)) +
                 ((s2 * s2 - q2) + (s3 * s3 - q3));
      }
      logit += 0.5 * pairs;
    }

    const double p = 1.0 / (1.0 + std::exp(-logit));
    out->labels[e] = HashToUnit(HashCombine(ex, kLabelSalt)) < p ? 1.0f : 0.0f;
    out->true_logits[e] = static_cast<float>(logit);
  }
  return absl::OkStatus();
}

std::pair<uint64_t, uint64_t> ShardRange(uint64_t total, uint32_t rank,
                                         uint32_t num_workers) {
  if (num_workers == 0) return {0, 0};
  if (rank >= num_workers) return {total, total};
  // The first `rem` ranks get one extra example. Written without total *
  // rank, which could overflow.
  const uint64_t base = total / num_workers;
  const uint64_t rem = total % num_workers;
  const uint64_t begin = base * rank + std::min<uint64_t>(rank, rem);
  const uint64_t len = base + (rank < rem ? 1 : 0);
  return {begin, begin + len};
}

}  // namespace ps::ctr
