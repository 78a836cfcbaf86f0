#include "common/status.h"
#include "common/optimizer.h"
#include "common/config.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "proto/config.pb.h"

namespace ps {
namespace {

OptimizerConfig SgdConfigWithLr(float lr) {
  OptimizerConfig c;
  c.mutable_sgd()->set_learning_rate(lr);
  return c;
}

OptimizerConfig AdagradConfigWith(float lr, float initial_accumulator,
                                  float epsilon) {
  OptimizerConfig c;
  AdagradConfig* a = c.mutable_adagrad();
  a->set_learning_rate(lr);
  a->set_initial_accumulator(initial_accumulator);
  a->set_epsilon(epsilon);
  return c;
}

OptimizerConfig MomentumConfigWith(float lr, float momentum, bool nesterov) {
  OptimizerConfig c;
  MomentumConfig* m = c.mutable_momentum();
  m->set_learning_rate(lr);
  m->set_momentum(momentum);
  m->set_nesterov(nesterov);
  return c;
}

OptimizerConfig AdamConfigWith(float lr, float beta1, float beta2,
                               float epsilon) {
  OptimizerConfig c;
  AdamConfig* a = c.mutable_adam();
  a->set_learning_rate(lr);
  a->set_beta1(beta1);
  a->set_beta2(beta2);
  a->set_epsilon(epsilon);
  return c;
}

OptimizerConfig FtrlConfigWith(float alpha, float beta, float l1, float l2) {
  OptimizerConfig c;
  FtrlConfig* f = c.mutable_ftrl();
  f->set_alpha(alpha);
  f->set_beta(beta);
  f->set_l1(l1);
  f->set_l2(l2);
  return c;
}

std::unique_ptr<Optimizer> MustCreate(const OptimizerConfig& config) {
  auto opt = Optimizer::Create(config);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return opt.ok() ? std::move(opt).value() : nullptr;
}

// ------------------------------------------------------------------- SGD

TEST(SgdTest, HasNoState) {
  auto sgd = MustCreate(SgdConfigWithLr(0.5f));
  ASSERT_NE(sgd, nullptr);
  EXPECT_EQ(sgd->state_size(), 0);
  // InitState of zero floats per element must not write anything.
  float sentinel[2] = {7.0f, 7.0f};
  sgd->InitState(sentinel, 2);
  EXPECT_EQ(sentinel[0], 7.0f);
  EXPECT_EQ(sentinel[1], 7.0f);
}

TEST(SgdTest, ThreeStepsExact) {
  // lr and gradients are short binary fractions, so every product and
  // difference below is exact in float and can be compared with ==.
  auto sgd = MustCreate(SgdConfigWithLr(0.5f));
  ASSERT_NE(sgd, nullptr);
  std::vector<float> w = {1.0f, -2.0f, 0.25f};

  const float g1[] = {0.5f, 1.0f, -2.0f};
  sgd->Apply(w.data(), nullptr, g1, 3, 1.0f);
  // w - 0.5 * g = {1 - 0.25, -2 - 0.5, 0.25 + 1}
  EXPECT_EQ(w, (std::vector<float>{0.75f, -2.5f, 1.25f}));

  const float g2[] = {1.5f, -3.0f, 0.0f};
  sgd->Apply(w.data(), nullptr, g2, 3, 1.0f);
  // {0.75 - 0.75, -2.5 + 1.5, 1.25 - 0}
  EXPECT_EQ(w, (std::vector<float>{0.0f, -1.0f, 1.25f}));

  const float g3[] = {-4.0f, 0.125f, 2.5f};
  sgd->Apply(w.data(), nullptr, g3, 3, 1.0f);
  // {0 + 2, -1 - 0.0625, 1.25 - 1.25}
  EXPECT_EQ(w, (std::vector<float>{2.0f, -1.0625f, 0.0f}));
}

TEST(SgdTest, TouchesOnlyTheFirstNElements) {
  auto sgd = MustCreate(SgdConfigWithLr(1.0f));
  ASSERT_NE(sgd, nullptr);
  std::vector<float> w = {1.0f, 1.0f, 1.0f};
  const float g[] = {1.0f, 1.0f, 1.0f};
  sgd->Apply(w.data(), nullptr, g, 2, 1.0f);
  EXPECT_EQ(w, (std::vector<float>{0.0f, 0.0f, 1.0f}));
}

TEST(SgdTest, LrScaleMultipliesTheLearningRate) {
  // lr = 0.5 with scales 0.25, 0.5, 0.125: effective rates 0.125, 0.25,
  // 0.0625. Every value is a short binary fraction, so exact in float:
  //   g1 = { 2, -4}:   w = {1 - 0.25,   -2 + 0.5}     = {0.75, -1.5}
  //   g2 = { 1,  8}:   w = {0.75 - 0.25, -1.5 - 2}    = {0.5, -3.5}
  //   g3 = {-8,  0.5}: w = {0.5 + 0.5,  -3.5 - 1/32}  = {1, -3.53125}
  auto sgd = MustCreate(SgdConfigWithLr(0.5f));
  ASSERT_NE(sgd, nullptr);
  std::vector<float> w = {1.0f, -2.0f};
  const float g1[] = {2.0f, -4.0f};
  sgd->Apply(w.data(), nullptr, g1, 2, 0.25f);
  EXPECT_EQ(w, (std::vector<float>{0.75f, -1.5f}));
  const float g2[] = {1.0f, 8.0f};
  sgd->Apply(w.data(), nullptr, g2, 2, 0.5f);
  EXPECT_EQ(w, (std::vector<float>{0.5f, -3.5f}));
  const float g3[] = {-8.0f, 0.5f};
  sgd->Apply(w.data(), nullptr, g3, 2, 0.125f);
  EXPECT_EQ(w, (std::vector<float>{1.0f, -3.53125f}));
}

TEST(SgdTest, LrScaleHalfOfPointOneIsPointZeroFive) {
  // lr 0.1 with scale 0.5 must take exactly the steps of lr 0.05 (halving
  // is exact in float, so 0.1f * 0.5f == 0.05f bit for bit).
  auto scaled = MustCreate(SgdConfigWithLr(0.1f));
  auto reference = MustCreate(SgdConfigWithLr(0.05f));
  ASSERT_NE(scaled, nullptr);
  ASSERT_NE(reference, nullptr);
  float w_scaled[2] = {0.3f, -0.7f};
  float w_reference[2] = {0.3f, -0.7f};
  double w_hand[2] = {0.3f, -0.7f};
  const float grads[4][2] = {
      {1.0f, -2.0f}, {0.3f, 0.9f}, {-1.7f, 0.0f}, {4.0f, -0.25f}};
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step + 1);
    scaled->Apply(w_scaled, nullptr, grads[step], 2, 0.5f);
    reference->Apply(w_reference, nullptr, grads[step], 2, 1.0f);
    for (int i = 0; i < 2; ++i) {
      w_hand[i] -= 0.05 * grads[step][i];
      EXPECT_EQ(w_scaled[i], w_reference[i]);
      EXPECT_NEAR(w_scaled[i], w_hand[i], 1e-7);
    }
  }
}

// --------------------------------------------------------------- Adagrad

TEST(AdagradTest, StateSizeAndInitState) {
  auto adagrad = MustCreate(AdagradConfigWith(0.1f, 0.25f, 1e-8f));
  ASSERT_NE(adagrad, nullptr);
  EXPECT_EQ(adagrad->state_size(), 1);
  std::vector<float> state = {-1.0f, -1.0f, -1.0f, -1.0f};
  adagrad->InitState(state.data(), 3);
  // Exactly n accumulators start at initial_accumulator; the 4th is not
  // part of the call and keeps its value.
  EXPECT_EQ(state, (std::vector<float>{0.25f, 0.25f, 0.25f, -1.0f}));
}

TEST(AdagradTest, HandComputedSteps) {
  // lr = 0.5, initial accumulator 16, epsilon 1 (large on purpose, so that
  // putting epsilon anywhere else in the formula changes the result).
  // Element 0 sees gradients 3, 12, 84, 132 whose squares keep the
  // accumulator a perfect square:
  //   step 1: acc = 16 + 9       = 25,    sqrt 5,   w = 1 - 0.5*3/6
  //                                                   = 0.75
  //   step 2: acc = 25 + 144     = 169,   sqrt 13,  w = 0.75 - 0.5*12/14
  //                                                   = 0.75 - 3/7
  //   step 3: acc = 169 + 7056   = 7225,  sqrt 85,  w -= 0.5*84/86 = 21/43
  //   step 4: acc = 7225 + 17424 = 24649, sqrt 157, w -= 0.5*132/158 = 33/79
  //   step 5: g = -132: acc = 24649 + 17424 = 42073,
  //           w += 0.5*132/(sqrt(42073) + 1)
  // Element 1 sees gradients -4, 0, 2, -1, 0.5:
  //   step 1: acc = 32,    w = -1 + 0.5*4/(sqrt(32)+1)
  //   step 2: acc = 32,    w unchanged (zero gradient)
  //   step 3: acc = 36,    w -= 0.5*2/7
  //   step 4: acc = 37,    w += 0.5*1/(sqrt(37)+1)
  //   step 5: acc = 37.25, w -= 0.5*0.5/(sqrt(37.25)+1)
  auto adagrad = MustCreate(AdagradConfigWith(0.5f, 16.0f, 1.0f));
  ASSERT_NE(adagrad, nullptr);
  float w[2] = {1.0f, -1.0f};
  float acc[2];
  adagrad->InitState(acc, 2);
  EXPECT_EQ(acc[0], 16.0f);
  EXPECT_EQ(acc[1], 16.0f);

  const float grads[5][2] = {
      {3.0f, -4.0f}, {12.0f, 0.0f}, {84.0f, 2.0f}, {132.0f, -1.0f},
      {-132.0f, 0.5f}};
  const double want_acc[5][2] = {
      {25, 32}, {169, 32}, {7225, 36}, {24649, 37}, {42073, 37.25}};
  const double w0_1 = 0.75;
  const double w0_2 = w0_1 - 3.0 / 7.0;
  const double w0_3 = w0_2 - 21.0 / 43.0;
  const double w0_4 = w0_3 - 33.0 / 79.0;
  const double w0_5 = w0_4 + 66.0 / (std::sqrt(42073.0) + 1.0);
  const double w1_1 = -1.0 + 2.0 / (std::sqrt(32.0) + 1.0);
  const double w1_2 = w1_1;
  const double w1_3 = w1_2 - 1.0 / 7.0;
  const double w1_4 = w1_3 + 0.5 / (std::sqrt(37.0) + 1.0);
  const double w1_5 = w1_4 - 0.25 / (std::sqrt(37.25) + 1.0);
  const double want_w[5][2] = {
      {w0_1, w1_1}, {w0_2, w1_2}, {w0_3, w1_3}, {w0_4, w1_4}, {w0_5, w1_5}};

  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step + 1);
    adagrad->Apply(w, acc, grads[step], 2, 1.0f);
    // Squares of these gradients and their sums are exact in float.
    EXPECT_EQ(acc[0], want_acc[step][0]);
    EXPECT_EQ(acc[1], want_acc[step][1]);
    // Float arithmetic drifts from the double reference by a few ulps.
    EXPECT_NEAR(w[0], want_w[step][0], 1e-6);
    EXPECT_NEAR(w[1], want_w[step][1], 1e-6);
  }
}

TEST(AdagradTest, MatchesDoubleReferenceOverManySteps) {
  // The same rule, written out independently in double:
  //   acc_i += g_i^2;  w_i -= lr * g_i / (sqrt(acc_i) + eps)
  // with acc_i starting at initial_accumulator.
  const double lr = 0.1, init = 0.1, eps = 1e-8;
  auto adagrad = MustCreate(AdagradConfigWith(0.1f, 0.1f, 1e-8f));
  ASSERT_NE(adagrad, nullptr);
  constexpr int kN = 3;
  float w[kN] = {0.5f, -0.25f, 0.0f};
  float acc[kN];
  adagrad->InitState(acc, kN);
  double ref_w[kN] = {0.5, -0.25, 0.0};
  double ref_acc[kN] = {init, init, init};
  for (int step = 0; step < 20; ++step) {
    float g[kN];
    for (int i = 0; i < kN; ++i) {
      // Fixed, varied gradients of both signs and different magnitudes.
      g[i] = static_cast<float>(((step * 7 + i * 3) % 11 - 5) * 0.125 *
                                (i + 1));
    }
    adagrad->Apply(w, acc, g, kN, 1.0f);
    for (int i = 0; i < kN; ++i) {
      ref_acc[i] += static_cast<double>(g[i]) * g[i];
      ref_w[i] -= lr * g[i] / (std::sqrt(ref_acc[i]) + eps);
    }
  }
  for (int i = 0; i < kN; ++i) {
    SCOPED_TRACE(testing::Message() << "element " << i);
    EXPECT_NEAR(acc[i], ref_acc[i], 1e-5 * ref_acc[i]);
    EXPECT_NEAR(w[i], ref_w[i], 1e-5);
  }
}

TEST(AdagradTest, ElementsKeepSeparateAccumulators) {
  // A large gradient on element 0 must not shrink element 1's step.
  auto adagrad = MustCreate(AdagradConfigWith(1.0f, 0.0f, 1e-8f));
  ASSERT_NE(adagrad, nullptr);
  float w[2] = {0.0f, 0.0f};
  float acc[2];
  adagrad->InitState(acc, 2);
  const float g1[] = {100.0f, 0.0f};
  adagrad->Apply(w, acc, g1, 2, 1.0f);
  const float g2[] = {0.0f, 3.0f};
  adagrad->Apply(w, acc, g2, 2, 1.0f);
  // w1 = -1 * 3 / (sqrt(9) + 1e-8): 3 + 1e-8 rounds to 3 in float.
  EXPECT_EQ(acc[0], 10000.0f);
  EXPECT_EQ(acc[1], 9.0f);
  EXPECT_FLOAT_EQ(w[0], -1.0f);
  EXPECT_FLOAT_EQ(w[1], -1.0f);
}

TEST(AdagradTest, LrScaleScalesTheStepNotTheAccumulator) {
  // lr = 0.5, initial accumulator 16, epsilon 1, gradients 3, 12, 84 as in
  // HandComputedSteps (acc = 25, 169, 7225; sqrt 5, 13, 85), with scales
  // 0.5, 0.25, 0.5:
  //   step 1: w = 1 - 0.5*0.5*3/(5+1)       = 1 - 1/8
  //   step 2: w -= 0.5*0.25*12/(13+1)       = 3/28
  //   step 3: w -= 0.5*0.5*84/(85+1)        = 21/86
  // The accumulators must be exactly those of an unscaled run.
  auto adagrad = MustCreate(AdagradConfigWith(0.5f, 16.0f, 1.0f));
  ASSERT_NE(adagrad, nullptr);
  float w = 1.0f, acc;
  float w_unscaled = 1.0f, acc_unscaled;
  adagrad->InitState(&acc, 1);
  adagrad->InitState(&acc_unscaled, 1);
  const float grads[] = {3.0f, 12.0f, 84.0f};
  const float scales[] = {0.5f, 0.25f, 0.5f};
  const float want_acc[] = {25.0f, 169.0f, 7225.0f};
  const double want_w[] = {1.0 - 1.0 / 8.0, 1.0 - 1.0 / 8.0 - 3.0 / 28.0,
                           1.0 - 1.0 / 8.0 - 3.0 / 28.0 - 21.0 / 86.0};
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step + 1);
    const float before = w;
    const float before_unscaled = w_unscaled;
    adagrad->Apply(&w, &acc, &grads[step], 1, scales[step]);
    adagrad->Apply(&w_unscaled, &acc_unscaled, &grads[step], 1, 1.0f);
    EXPECT_EQ(acc, want_acc[step]);
    EXPECT_EQ(acc, acc_unscaled);
    EXPECT_NEAR(w, want_w[step], 1e-6);
    // Same accumulator, so the step is the unscaled one times the scale.
    EXPECT_NEAR(before - w, scales[step] * (before_unscaled - w_unscaled),
                1e-6);
  }
}

// ---------------------------------------------------------------- Create

TEST(OptimizerCreateTest, AcceptsValidConfigs) {
  auto sgd = Optimizer::Create(SgdConfigWithLr(0.01f));
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  EXPECT_EQ((*sgd)->state_size(), 0);
  // initial_accumulator 0 is allowed (>= 0).
  auto adagrad = Optimizer::Create(AdagradConfigWith(0.01f, 0.0f, 1e-8f));
  ASSERT_TRUE(adagrad.ok()) << adagrad.status();
  EXPECT_EQ((*adagrad)->state_size(), 1);
}

TEST(OptimizerCreateTest, RejectsBadConfigs) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    const char* name;
    OptimizerConfig config;
  };
  const Case cases[] = {
      {"no optimizer set", OptimizerConfig()},
      {"sgd lr 0", SgdConfigWithLr(0.0f)},
      {"sgd lr < 0", SgdConfigWithLr(-0.1f)},
      {"sgd lr NaN", SgdConfigWithLr(nan)},
      {"sgd lr inf", SgdConfigWithLr(inf)},
      {"adagrad lr 0", AdagradConfigWith(0.0f, 0.1f, 1e-8f)},
      {"adagrad lr < 0", AdagradConfigWith(-1.0f, 0.1f, 1e-8f)},
      {"adagrad lr NaN", AdagradConfigWith(nan, 0.1f, 1e-8f)},
      {"adagrad negative accumulator", AdagradConfigWith(0.1f, -0.5f, 1e-8f)},
      {"adagrad NaN accumulator", AdagradConfigWith(0.1f, nan, 1e-8f)},
      // An infinite accumulator would silently freeze every parameter.
      {"adagrad infinite accumulator", AdagradConfigWith(0.1f, inf, 1e-8f)},
      {"adagrad epsilon 0", AdagradConfigWith(0.1f, 0.1f, 0.0f)},
      {"adagrad epsilon < 0", AdagradConfigWith(0.1f, 0.1f, -1e-8f)},
      {"adagrad epsilon NaN", AdagradConfigWith(0.1f, 0.1f, nan)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto opt = Optimizer::Create(c.config);
    EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(opt.status().message().empty());
  }
}

// -------------------------------------------------------------- Momentum

TEST(MomentumTest, StateSizeAndInitState) {
  auto momentum = MustCreate(MomentumConfigWith(0.1f, 0.9f, false));
  ASSERT_NE(momentum, nullptr);
  EXPECT_EQ(momentum->state_size(), 1);
  std::vector<float> state = {-1.0f, -1.0f, -1.0f};
  momentum->InitState(state.data(), 2);
  EXPECT_EQ(state, (std::vector<float>{0.0f, 0.0f, -1.0f}));
}

TEST(MomentumTest, PlainAndNesterovHandComputed) {
  // lr = 0.5, mu = 0.5; gradients 1, 2, -1, 0, 4 are short binary fractions,
  // so every value below is exact in float. The velocity is the same for
  // both variants:
  //   v = 0.5*0 + 1 = 1;  0.5*1 + 2 = 2.5;  1.25 - 1 = 0.25;
  //       0.125 + 0 = 0.125;  0.0625 + 4 = 4.0625
  // Plain: w -= 0.5 * v
  //   w = -0.5, -1.75, -1.875, -1.9375, -3.96875
  // Nesterov: w -= 0.5 * (g + 0.5 * v)
  //   g + 0.5v = 1.5, 3.25, -0.875, 0.0625, 6.03125
  //   w = -0.75, -2.375, -1.9375, -1.96875, -4.984375
  auto plain = MustCreate(MomentumConfigWith(0.5f, 0.5f, false));
  auto nesterov = MustCreate(MomentumConfigWith(0.5f, 0.5f, true));
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(nesterov, nullptr);
  const float grads[] = {1.0f, 2.0f, -1.0f, 0.0f, 4.0f};
  const float want_v[] = {1.0f, 2.5f, 0.25f, 0.125f, 4.0625f};
  const float want_plain[] = {-0.5f, -1.75f, -1.875f, -1.9375f, -3.96875f};
  const float want_nesterov[] = {-0.75f, -2.375f, -1.9375f, -1.96875f,
                                 -4.984375f};
  float w_plain = 0.0f, w_nesterov = 0.0f, v_plain, v_nesterov;
  plain->InitState(&v_plain, 1);
  nesterov->InitState(&v_nesterov, 1);
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step + 1);
    plain->Apply(&w_plain, &v_plain, &grads[step], 1, 1.0f);
    nesterov->Apply(&w_nesterov, &v_nesterov, &grads[step], 1, 1.0f);
    EXPECT_EQ(v_plain, want_v[step]);
    EXPECT_EQ(v_nesterov, want_v[step]);
    EXPECT_EQ(w_plain, want_plain[step]);
    EXPECT_EQ(w_nesterov, want_nesterov[step]);
    // Same velocities, different steps: Nesterov's w -= lr * (g + mu * v)
    // versus lr * v differ by lr * (g - (1 - mu) * v), nonzero throughout
    // this sequence.
    EXPECT_NE(w_plain, w_nesterov);
  }
}

TEST(MomentumTest, MatchesDoubleReferenceOverManySteps) {
  // v_i = mu * v_i + g_i;  w_i -= lr * (nesterov ? g_i + mu * v_i : v_i)
  for (bool use_nesterov : {false, true}) {
    SCOPED_TRACE(use_nesterov ? "nesterov" : "plain");
    const double lr = 0.05, mu = 0.9;
    auto opt = MustCreate(MomentumConfigWith(0.05f, 0.9f, use_nesterov));
    ASSERT_NE(opt, nullptr);
    constexpr int kN = 3;
    float w[kN] = {0.5f, -0.25f, 0.0f};
    float v[kN];
    opt->InitState(v, kN);
    double ref_w[kN] = {0.5, -0.25, 0.0};
    double ref_v[kN] = {0, 0, 0};
    for (int step = 0; step < 20; ++step) {
      float g[kN];
      for (int i = 0; i < kN; ++i) {
        g[i] = static_cast<float>(((step * 5 + i * 3) % 9 - 4) * 0.25 *
                                  (i + 1));
      }
      opt->Apply(w, v, g, kN, 1.0f);
      for (int i = 0; i < kN; ++i) {
        ref_v[i] = mu * ref_v[i] + g[i];
        ref_w[i] -= lr * (use_nesterov ? g[i] + mu * ref_v[i] : ref_v[i]);
      }
    }
    for (int i = 0; i < kN; ++i) {
      SCOPED_TRACE(testing::Message() << "element " << i);
      EXPECT_NEAR(v[i], ref_v[i], 1e-5);
      EXPECT_NEAR(w[i], ref_w[i], 1e-5);
    }
  }
}

TEST(MomentumTest, ZeroMomentumIsSgd) {
  // Create accepts momentum 0 (only the job file maps 0 to the default).
  auto momentum = MustCreate(MomentumConfigWith(0.5f, 0.0f, true));
  ASSERT_NE(momentum, nullptr);
  float w = 1.0f, v;
  momentum->InitState(&v, 1);
  const float g1 = 1.0f, g2 = -3.0f;
  momentum->Apply(&w, &v, &g1, 1, 1.0f);
  EXPECT_EQ(w, 0.5f);
  momentum->Apply(&w, &v, &g2, 1, 1.0f);
  EXPECT_EQ(w, 2.0f);
}

TEST(MomentumTest, LrScaleScalesTheStepNotTheVelocity) {
  // lr = 0.5, mu = 0.5, gradients 1, 2, -1 with scales 0.5, 0.25, 0.5
  // (effective rates 0.25, 0.125, 0.25). The velocity ignores the scale:
  //   v = 1, 2.5, 0.25
  // Plain: w -= rate * v
  //   w = -0.25, -0.25 - 0.3125 = -0.5625, -0.5625 - 0.0625 = -0.625
  // Nesterov: w -= rate * (g + 0.5 v); g + 0.5 v = 1.5, 3.25, -0.875
  //   w = -0.375, -0.375 - 0.40625 = -0.78125, -0.78125 + 0.21875 = -0.5625
  // All exact in float.
  auto plain = MustCreate(MomentumConfigWith(0.5f, 0.5f, false));
  auto nesterov = MustCreate(MomentumConfigWith(0.5f, 0.5f, true));
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(nesterov, nullptr);
  const float grads[] = {1.0f, 2.0f, -1.0f};
  const float scales[] = {0.5f, 0.25f, 0.5f};
  const float want_v[] = {1.0f, 2.5f, 0.25f};
  const float want_plain[] = {-0.25f, -0.5625f, -0.625f};
  const float want_nesterov[] = {-0.375f, -0.78125f, -0.5625f};
  float w_plain = 0.0f, w_nesterov = 0.0f, v_plain, v_nesterov;
  plain->InitState(&v_plain, 1);
  nesterov->InitState(&v_nesterov, 1);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step + 1);
    plain->Apply(&w_plain, &v_plain, &grads[step], 1, scales[step]);
    nesterov->Apply(&w_nesterov, &v_nesterov, &grads[step], 1, scales[step]);
    EXPECT_EQ(v_plain, want_v[step]);
    EXPECT_EQ(v_nesterov, want_v[step]);
    EXPECT_EQ(w_plain, want_plain[step]);
    EXPECT_EQ(w_nesterov, want_nesterov[step]);
  }
}

// ------------------------------------------------------------------ Adam

// Independent double-precision Adam (Kingma & Ba, Algorithm 1) for one
// element with its own step count.
struct RefAdam {
  double lr, b1, b2, eps;
  double w = 0, m = 0, v = 0;
  int t = 0;
  void Step(double g) {
    ++t;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double m_hat = m / (1 - std::pow(b1, t));
    const double v_hat = v / (1 - std::pow(b2, t));
    w -= lr * m_hat / (std::sqrt(v_hat) + eps);
  }
};

TEST(AdamTest, StateSizeAndInitState) {
  auto adam = MustCreate(AdamConfigWith(0.1f, 0.9f, 0.999f, 1e-8f));
  ASSERT_NE(adam, nullptr);
  EXPECT_EQ(adam->state_size(), 3);
  std::vector<float> state(7, -1.0f);
  adam->InitState(state.data(), 2);
  EXPECT_EQ(state, (std::vector<float>{0, 0, 0, 0, 0, 0, -1.0f}));
}

TEST(AdamTest, FirstStepMovesByLearningRate) {
  // Bias correction makes m_hat = g and v_hat = g^2 after one step, so the
  // step is lr * g / (|g| + eps) ~ lr * sign(g) whatever |g| is. Without
  // the correction it would be lr * 0.1 / sqrt(0.001) ~ 3.16 * lr.
  auto adam = MustCreate(AdamConfigWith(0.01f, 0.9f, 0.999f, 1e-8f));
  ASSERT_NE(adam, nullptr);
  constexpr int kN = 4;
  float w[kN] = {1.0f, 1.0f, -2.0f, 0.5f};
  float state[3 * kN];
  adam->InitState(state, kN);
  const float g[kN] = {3.0f, -0.5f, 100.0f, -1e-3f};
  adam->Apply(w, state, g, kN, 1.0f);
  EXPECT_NEAR(w[0], 1.0 - 0.01, 1e-7);
  EXPECT_NEAR(w[1], 1.0 + 0.01, 1e-7);
  EXPECT_NEAR(w[2], -2.0 - 0.01, 2e-7);
  // eps is 1e-5 of |g| here, so it visibly shortens the step.
  EXPECT_NEAR(w[3], 0.5 + 0.01 * 1e-3 / (1e-3 + 1e-8), 1e-7);
  for (int i = 0; i < kN; ++i) EXPECT_EQ(state[3 * i + 2], 1.0f);
}

TEST(AdamTest, ConstantGradientHandComputed) {
  // beta1 = 0.5, beta2 = 0.75, lr = 0.25, constant g = 2. The moments are
  // exact in float:
  //   m_t = 2 (1 - 0.5^t)  = 1, 1.5, 1.75, 1.875, 1.9375
  //   v_t = 4 (1 - 0.75^t) = 1, 1.75, 2.3125, 2.734375, 3.05078125
  // and the corrections undo exactly those factors: m_hat = 2, v_hat = 4,
  // so every step is 0.25 * 2 / (2 + eps) = 0.25 (eps = 1e-8 is below half
  // an ulp of 2). An uncorrected (or wrongly indexed) Adam would take steps
  // 0.25 * m_t / sqrt(v_t) = 0.25, 0.283, 0.288, ... instead.
  auto adam = MustCreate(AdamConfigWith(0.25f, 0.5f, 0.75f, 1e-8f));
  ASSERT_NE(adam, nullptr);
  float w = 0.0f;
  float state[3];
  adam->InitState(state, 1);
  const float g = 2.0f;
  const float want_m[] = {1.0f, 1.5f, 1.75f, 1.875f, 1.9375f};
  const float want_v[] = {1.0f, 1.75f, 2.3125f, 2.734375f, 3.05078125f};
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step + 1);
    adam->Apply(&w, state, &g, 1, 1.0f);
    EXPECT_EQ(state[0], want_m[step]);
    EXPECT_EQ(state[1], want_v[step]);
    EXPECT_EQ(state[2], static_cast<float>(step + 1));
    EXPECT_NEAR(w, -0.25 * (step + 1), 1e-6);
  }
}

TEST(AdamTest, MatchesDoubleReferenceOverManySteps) {
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  auto adam = MustCreate(AdamConfigWith(0.01f, 0.9f, 0.999f, 1e-8f));
  ASSERT_NE(adam, nullptr);
  constexpr int kN = 3;
  float w[kN] = {0.5f, -0.25f, 0.0f};
  float state[3 * kN];
  adam->InitState(state, kN);
  RefAdam ref[kN] = {{lr, b1, b2, eps}, {lr, b1, b2, eps}, {lr, b1, b2, eps}};
  for (int i = 0; i < kN; ++i) ref[i].w = w[i];
  for (int step = 0; step < 30; ++step) {
    float g[kN];
    for (int i = 0; i < kN; ++i) {
      // Includes zero gradients, which still count as steps.
      g[i] = static_cast<float>(((step * 7 + i * 3) % 11 - 5) * 0.125 *
                                (i + 1));
    }
    adam->Apply(w, state, g, kN, 1.0f);
    for (int i = 0; i < kN; ++i) ref[i].Step(g[i]);
    for (int i = 0; i < kN; ++i) {
      SCOPED_TRACE(testing::Message() << "step " << step + 1 << " element "
                                      << i);
      EXPECT_NEAR(state[3 * i], ref[i].m, 1e-6);
      EXPECT_NEAR(state[3 * i + 1], ref[i].v, 1e-6);
      EXPECT_EQ(state[3 * i + 2], static_cast<float>(step + 1));
      EXPECT_NEAR(w[i], ref[i].w, 2e-6);
    }
  }
}

TEST(AdamTest, StepCountsArePerElement) {
  // Two sparse rows of one element each, at their own state offsets, as a
  // table lays them out. Row 0 is pushed 4 times before row 1's first push:
  // row 1 must then be corrected with t = 1 (a step of ~lr), not t = 5.
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  auto adam = MustCreate(AdamConfigWith(0.1f, 0.9f, 0.999f, 1e-8f));
  ASSERT_NE(adam, nullptr);
  float w[2] = {0.0f, 0.0f};
  float state[6];
  adam->InitState(state, 2);
  RefAdam ref0{lr, b1, b2, eps}, ref1{lr, b1, b2, eps};
  const float g0[] = {1.0f, -0.5f, 2.0f, 0.25f, 1.5f, -1.0f};
  const float g1[] = {0.75f, 0.75f};
  for (int step = 0; step < 4; ++step) {
    adam->Apply(&w[0], &state[0], &g0[step], 1, 1.0f);
    ref0.Step(g0[step]);
  }
  EXPECT_EQ(state[2], 4.0f);
  EXPECT_EQ(state[5], 0.0f);
  EXPECT_EQ(w[1], 0.0f);

  // Both rows in one call: row 0's 5th step, row 1's first.
  const float both[] = {g0[4], g1[0]};
  adam->Apply(w, state, both, 2, 1.0f);
  ref0.Step(g0[4]);
  ref1.Step(g1[0]);
  EXPECT_EQ(state[2], 5.0f);
  EXPECT_EQ(state[5], 1.0f);
  EXPECT_NEAR(w[1], -0.1, 1e-7);
  // Corrected with row 0's count (t = 5) instead, the step would have been
  //   lr * (0.1 g / (1 - 0.9^5)) / sqrt(0.001 g^2 / (1 - 0.999^5))
  //   ~ 0.545 lr.
  RefAdam global_count{lr, b1, b2, eps};
  global_count.t = 4;
  global_count.Step(g1[0]);
  EXPECT_GT(std::abs(global_count.w - w[1]), 0.04);

  const float both2[] = {g0[5], g1[1]};
  adam->Apply(w, state, both2, 2, 1.0f);
  ref0.Step(g0[5]);
  ref1.Step(g1[1]);
  EXPECT_EQ(state[2], 6.0f);
  EXPECT_EQ(state[5], 2.0f);
  EXPECT_NEAR(w[0], ref0.w, 1e-6);
  EXPECT_NEAR(w[1], ref1.w, 1e-6);
  // Constant gradient on row 1: two corrected steps of ~lr each.
  EXPECT_NEAR(w[1], -0.2, 1e-6);
}

TEST(AdamTest, LrScaleScalesTheStepNotTheMoments) {
  // beta1 = 0.5, beta2 = 0.75, lr = 0.25, gradients 2, 2, -2, -2 with
  // scales 0.5, 0.25, 1, 0.5. The moments ignore the scale and are exact:
  //   m = 1, 1.5, 0.75 - 1 = -0.25, -0.125 - 1 = -1.125
  //   v = 1, 1.75, 2.3125, 2.734375   (v_hat = 4 at every step, |g| = 2)
  //   m_hat = m / (1 - 0.5^t) = 2, 2, -0.25/0.875 = -2/7, -1.125/0.9375 = -1.2
  // so step t moves w by -lr * scale_t * m_hat / 2 (eps = 1e-8 is far below
  // the tolerance):
  //   deltas -0.125, -0.0625, +0.25/7, +0.075
  auto adam = MustCreate(AdamConfigWith(0.25f, 0.5f, 0.75f, 1e-8f));
  ASSERT_NE(adam, nullptr);
  float w = 0.0f;
  float state[3];
  adam->InitState(state, 1);
  const float grads[] = {2.0f, 2.0f, -2.0f, -2.0f};
  const float scales[] = {0.5f, 0.25f, 1.0f, 0.5f};
  const float want_m[] = {1.0f, 1.5f, -0.25f, -1.125f};
  const float want_v[] = {1.0f, 1.75f, 2.3125f, 2.734375f};
  const double w1 = -0.125;
  const double w2 = w1 - 0.0625;
  const double w3 = w2 + 0.25 / 7.0;
  const double w4 = w3 + 0.075;
  const double want_w[] = {w1, w2, w3, w4};
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step + 1);
    adam->Apply(&w, state, &grads[step], 1, scales[step]);
    EXPECT_EQ(state[0], want_m[step]);
    EXPECT_EQ(state[1], want_v[step]);
    EXPECT_EQ(state[2], static_cast<float>(step + 1));
    EXPECT_NEAR(w, want_w[step], 2e-7);
  }
}

TEST(AdamTest, LrScaleMatchesReferenceWithScaledRate) {
  // Against the double reference whose rate is lr * scale at each step;
  // the moments must equal those of an unscaled run.
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  auto adam = MustCreate(AdamConfigWith(0.01f, 0.9f, 0.999f, 1e-8f));
  ASSERT_NE(adam, nullptr);
  float w = 0.5f, state[3], w_unscaled = 0.5f, state_unscaled[3];
  adam->InitState(state, 1);
  adam->InitState(state_unscaled, 1);
  RefAdam ref{lr, b1, b2, eps};
  ref.w = 0.5f;
  const float grads[] = {0.75f, -1.5f, 0.25f, 2.0f, -0.5f};
  const float scales[] = {0.5f, 0.125f, 1.0f, 0.25f, 0.75f};
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step + 1);
    adam->Apply(&w, state, &grads[step], 1, scales[step]);
    adam->Apply(&w_unscaled, state_unscaled, &grads[step], 1, 1.0f);
    ref.lr = lr * scales[step];
    ref.Step(grads[step]);
    EXPECT_EQ(state[0], state_unscaled[0]);
    EXPECT_EQ(state[1], state_unscaled[1]);
    EXPECT_EQ(state[2], state_unscaled[2]);
    EXPECT_NEAR(w, ref.w, 1e-6);
  }
}

// ------------------------------------------------------------------ FTRL

// Independent double-precision FTRL-proximal for one coordinate, written
// from McMahan et al. 2013, Algorithm 1: the weight is computed from (z, n)
// before each gradient, starting at w = 0.
struct RefFtrl {
  double alpha, beta, l1, l2;
  double z = 0, n = 0;
  double W() const {
    if (std::abs(z) <= l1) return 0;
    const double sgn = z < 0 ? -1 : 1;
    return -(z - sgn * l1) / ((beta + std::sqrt(n)) / alpha + l2);
  }
  void Step(double g) {
    const double w = W();
    const double sigma = (std::sqrt(n + g * g) - std::sqrt(n)) / alpha;
    z += g - sigma * w;
    n += g * g;
  }
};

TEST(FtrlTest, StateSizeAndInitState) {
  auto ftrl = MustCreate(FtrlConfigWith(0.05f, 1.0f, 0.0f, 0.0f));
  ASSERT_NE(ftrl, nullptr);
  EXPECT_EQ(ftrl->state_size(), 2);
  std::vector<float> state(5, -1.0f);
  ftrl->InitState(state.data(), 2);
  EXPECT_EQ(state, (std::vector<float>{0, 0, 0, 0, -1.0f}));
}

TEST(FtrlTest, L1ShrinksToExactlyZeroHandComputed) {
  // alpha = 1, beta = 1, l1 = 1.5, l2 = 0. With w = 0, sigma * w = 0 and
  // z simply accumulates g:
  //   1: g = 0.5:  z = 0.5,  n = 0.25   |z| <= 1.5 -> w = 0
  //   2: g = 0.5:  z = 1.0,  n = 0.5                -> w = 0
  //   3: g = 0.5:  z = 1.5,  n = 0.75   |z| == l1   -> w = 0 (boundary)
  //   4: g = 0.25: z = 1.75, n = 0.8125
  //                w = -(1.75 - 1.5) / (1 + sqrt(0.8125)) = -0.131483...
  //   5: g = -1:   sigma = sqrt(1.8125) - sqrt(0.8125) = 0.444903...
  //                z = 1.75 - 1 - sigma * w = 0.808497...  -> w = 0 again
  //   6: g = -2:   z = -1.191503..., n = 5.8125           -> w = 0
  //   7: g = -1:   z = -2.191503..., n = 6.8125
  //                w = (2.191503 - 1.5) / (1 + sqrt(6.8125)) = 0.191548...
  auto ftrl = MustCreate(FtrlConfigWith(1.0f, 1.0f, 1.5f, 0.0f));
  ASSERT_NE(ftrl, nullptr);
  float w = 0.0f;
  float state[2];
  ftrl->InitState(state, 1);
  RefFtrl ref{1.0, 1.0, 1.5, 0.0};
  const float grads[] = {0.5f, 0.5f, 0.5f, 0.25f, -1.0f, -2.0f, -1.0f};
  const double sigma5 = std::sqrt(1.8125) - std::sqrt(0.8125);
  const double w4 = -0.25 / (1 + std::sqrt(0.8125));
  const double z5 = 0.75 - sigma5 * w4;
  const double z7 = z5 - 3.0;
  const double want_w[] = {0, 0, 0, w4, 0, 0,
                           -(z7 + 1.5) / (1 + std::sqrt(6.8125))};
  const double want_z[] = {0.5, 1.0, 1.5, 1.75, z5, z5 - 2, z7};
  const float want_n[] = {0.25f, 0.5f, 0.75f, 0.8125f, 1.8125f, 5.8125f,
                          6.8125f};
  for (int step = 0; step < 7; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step + 1);
    ftrl->Apply(&w, state, &grads[step], 1, 1.0f);
    ref.Step(grads[step]);
    EXPECT_NEAR(state[0], want_z[step], 1e-6);
    EXPECT_EQ(state[1], want_n[step]);
    EXPECT_NEAR(state[0], ref.z, 1e-6);
    EXPECT_NEAR(w, ref.W(), 1e-6);
    if (want_w[step] == 0) {
      // Exactly zero, not merely small: the point of l1.
      EXPECT_EQ(w, 0.0f);
    } else {
      EXPECT_NE(w, 0.0f);
      EXPECT_NEAR(w, want_w[step], 1e-6);
    }
  }
  EXPECT_NEAR(want_w[3], -0.1314829, 1e-6);
  EXPECT_NEAR(want_w[6], 0.1915480, 1e-6);
}

TEST(FtrlTest, L2ShrinksMagnitude) {
  // One step, alpha = 1, beta = 1, g = 2: z = 2, n = 4, sqrt(n) = 2, so
  //   l1 = 0,   l2 = 0: w = -2 / 3
  //   l1 = 0,   l2 = 1: w = -2 / 4   = -0.5
  //   l1 = 0.5, l2 = 1: w = -1.5 / 4 = -0.375
  struct Case {
    float l1, l2;
    float want;
  };
  for (const Case& c : {Case{0.0f, 0.0f, -2.0f / 3.0f}, Case{0.0f, 1.0f, -0.5f},
                        Case{0.5f, 1.0f, -0.375f}}) {
    SCOPED_TRACE(testing::Message() << "l1 " << c.l1 << " l2 " << c.l2);
    auto ftrl = MustCreate(FtrlConfigWith(1.0f, 1.0f, c.l1, c.l2));
    ASSERT_NE(ftrl, nullptr);
    float w = 0.0f;
    float state[2];
    ftrl->InitState(state, 1);
    const float g = 2.0f;
    ftrl->Apply(&w, state, &g, 1, 1.0f);
    EXPECT_FLOAT_EQ(w, c.want);
  }
}

TEST(FtrlTest, MatchesDoubleReferenceOverManySteps) {
  for (float l2 : {0.0f, 0.5f}) {
    SCOPED_TRACE(testing::Message() << "l2 " << l2);
    auto ftrl = MustCreate(FtrlConfigWith(0.05f, 1.0f, 0.25f, l2));
    ASSERT_NE(ftrl, nullptr);
    constexpr int kN = 3;
    float w[kN] = {0, 0, 0};
    float state[2 * kN];
    ftrl->InitState(state, kN);
    RefFtrl ref[kN] = {{0.05f, 1.0, 0.25, l2},
                       {0.05f, 1.0, 0.25, l2},
                       {0.05f, 1.0, 0.25, l2}};
    int zeros = 0, nonzeros = 0;
    for (int step = 0; step < 30; ++step) {
      float g[kN];
      for (int i = 0; i < kN; ++i) {
        g[i] = static_cast<float>(((step * 7 + i * 3) % 11 - 4) * 0.0625 *
                                  (i + 1));
      }
      ftrl->Apply(w, state, g, kN, 1.0f);
      for (int i = 0; i < kN; ++i) {
        ref[i].Step(g[i]);
        SCOPED_TRACE(testing::Message() << "step " << step + 1 << " element "
                                        << i);
        EXPECT_NEAR(state[2 * i], ref[i].z, 1e-5);
        EXPECT_NEAR(state[2 * i + 1], ref[i].n, 1e-5 * ref[i].n);
        EXPECT_NEAR(w[i], ref[i].W(), 1e-5);
        (w[i] == 0.0f ? zeros : nonzeros)++;
      }
    }
    // The sequence exercises both sides of the l1 threshold.
    EXPECT_GT(zeros, 0);
    EXPECT_GT(nonzeros, 0);
  }
}

TEST(FtrlTest, InitialWeightIsIgnored) {
  // FTRL starts from w = 0; a table initializer's value must not leak into
  // z through sigma * w at the first update, and is overwritten by it.
  auto ftrl = MustCreate(FtrlConfigWith(1.0f, 1.0f, 0.0f, 0.0f));
  ASSERT_NE(ftrl, nullptr);
  float w[2] = {5.0f, -3.0f};
  float state[4];
  ftrl->InitState(state, 2);
  const float g[2] = {2.0f, 0.0f};
  ftrl->Apply(w, state, g, 2, 1.0f);
  // z = 2 - sigma * 0 = 2 (not 2 - 2 * 5), n = 4: w = -2 / 3.
  EXPECT_EQ(state[0], 2.0f);
  EXPECT_FLOAT_EQ(w[0], -2.0f / 3.0f);
  // A zero gradient still replaces the initial value with f(0, 0) = 0.
  EXPECT_EQ(state[2], 0.0f);
  EXPECT_EQ(w[1], 0.0f);
}

TEST(FtrlTest, LrScaleScalesTheGradientHandComputed) {
  // alpha = 1, beta = 1, l1 = 0, l2 = 0; gradients 3, 4, 12 with scales
  // 0.5, 0.25, 1: the updates see g' = 1.5, 1, 12.
  //   1: n = 2.25, sqrt 1.5; sigma = 1.5; w_old = 0; z = 1.5
  //      w = -1.5 / (1 + 1.5) = -0.6
  //   2: n = 3.25; sigma = sqrt(3.25) - 1.5; z = 1.5 + 0.6 * sigma + 1
  //      w = -z / (1 + sqrt(3.25))
  //   3: n = 147.25; sigma = sqrt(147.25) - sqrt(3.25)
  //      z = z2 - sigma * w2 + 12;  w = -z / (1 + sqrt(147.25))
  auto ftrl = MustCreate(FtrlConfigWith(1.0f, 1.0f, 0.0f, 0.0f));
  ASSERT_NE(ftrl, nullptr);
  float w = 0.0f, state[2];
  ftrl->InitState(state, 1);
  const float grads[] = {3.0f, 4.0f, 12.0f};
  const float scales[] = {0.5f, 0.25f, 1.0f};
  const double s2 = std::sqrt(3.25), s3 = std::sqrt(147.25);
  const double z2 = 2.5 + 0.6 * (s2 - 1.5);
  const double w2 = -z2 / (1 + s2);
  const double z3 = z2 - (s3 - s2) * w2 + 12;
  const double want_z[] = {1.5, z2, z3};
  const double want_n[] = {2.25, 3.25, 147.25};
  const double want_w[] = {-0.6, w2, -z3 / (1 + s3)};
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step + 1);
    ftrl->Apply(&w, state, &grads[step], 1, scales[step]);
    EXPECT_NEAR(state[0], want_z[step], 1e-5);
    EXPECT_NEAR(state[1], want_n[step], 1e-5);
    EXPECT_NEAR(w, want_w[step], 1e-6);
  }
  EXPECT_NEAR(want_w[1], -0.9567892, 1e-6);
}

TEST(FtrlTest, LrScaleEqualsScaledGradientsAndMovesLess) {
  // With l1 and l2 on: scaled updates are exactly updates with scaled
  // gradients, and a scaled (stale) update moves the weight less than the
  // same update unscaled.
  auto ftrl = MustCreate(FtrlConfigWith(0.5f, 1.0f, 0.5f, 1.0f));
  ASSERT_NE(ftrl, nullptr);
  float w = 0.0f, state[2], w_ref = 0.0f, state_ref[2];
  ftrl->InitState(state, 1);
  ftrl->InitState(state_ref, 1);
  const float grads[] = {3.0f, -4.0f, 12.0f, 0.5f, -2.0f};
  const float scales[] = {0.5f, 0.25f, 1.0f, 0.125f, 0.75f};
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step + 1);
    const float scaled = grads[step] * scales[step];
    ftrl->Apply(&w, state, &grads[step], 1, scales[step]);
    ftrl->Apply(&w_ref, state_ref, &scaled, 1, 1.0f);
    EXPECT_FLOAT_EQ(state[0], state_ref[0]);
    EXPECT_FLOAT_EQ(state[1], state_ref[1]);
    EXPECT_FLOAT_EQ(w, w_ref);
  }
  // First step by hand: g' = 1.5, n = 2.25, z = 1.5,
  //   w = -(1.5 - 0.5) / ((1 + 1.5) / 0.5 + 1) = -1/6.
  float w1 = 0.0f, s1[2], w_full = 0.0f, s_full[2];
  ftrl->InitState(s1, 1);
  ftrl->InitState(s_full, 1);
  ftrl->Apply(&w1, s1, &grads[0], 1, 0.5f);
  ftrl->Apply(&w_full, s_full, &grads[0], 1, 1.0f);
  EXPECT_NEAR(w1, -1.0 / 6.0, 1e-7);
  EXPECT_LT(std::abs(w1), std::abs(w_full));
}

// ------------------------------------------------- Create (new optimizers)

TEST(OptimizerCreateTest, AcceptsNewOptimizers) {
  // Boundary values that are valid: momentum and beta1 0, l1 and l2 0.
  auto momentum = Optimizer::Create(MomentumConfigWith(0.1f, 0.0f, true));
  ASSERT_TRUE(momentum.ok()) << momentum.status();
  EXPECT_EQ((*momentum)->state_size(), 1);
  auto adam = Optimizer::Create(AdamConfigWith(0.1f, 0.0f, 0.999f, 1e-8f));
  ASSERT_TRUE(adam.ok()) << adam.status();
  EXPECT_EQ((*adam)->state_size(), 3);
  auto ftrl = Optimizer::Create(FtrlConfigWith(0.05f, 1.0f, 0.0f, 0.0f));
  ASSERT_TRUE(ftrl.ok()) << ftrl.status();
  EXPECT_EQ((*ftrl)->state_size(), 2);
}

TEST(OptimizerCreateTest, RejectsBadNewOptimizerConfigs) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    const char* name;
    OptimizerConfig config;
  };
  const Case cases[] = {
      {"momentum lr 0", MomentumConfigWith(0.0f, 0.9f, false)},
      {"momentum lr < 0", MomentumConfigWith(-0.1f, 0.9f, false)},
      {"momentum lr NaN", MomentumConfigWith(nan, 0.9f, false)},
      {"momentum lr inf", MomentumConfigWith(inf, 0.9f, true)},
      {"momentum < 0", MomentumConfigWith(0.1f, -0.1f, false)},
      {"momentum 1", MomentumConfigWith(0.1f, 1.0f, false)},
      {"momentum > 1", MomentumConfigWith(0.1f, 1.5f, true)},
      {"momentum NaN", MomentumConfigWith(0.1f, nan, false)},
      {"adam lr 0", AdamConfigWith(0.0f, 0.9f, 0.999f, 1e-8f)},
      {"adam lr < 0", AdamConfigWith(-1.0f, 0.9f, 0.999f, 1e-8f)},
      {"adam lr NaN", AdamConfigWith(nan, 0.9f, 0.999f, 1e-8f)},
      {"adam lr inf", AdamConfigWith(inf, 0.9f, 0.999f, 1e-8f)},
      {"adam beta1 < 0", AdamConfigWith(0.1f, -0.1f, 0.999f, 1e-8f)},
      {"adam beta1 1", AdamConfigWith(0.1f, 1.0f, 0.999f, 1e-8f)},
      {"adam beta1 NaN", AdamConfigWith(0.1f, nan, 0.999f, 1e-8f)},
      {"adam beta2 < 0", AdamConfigWith(0.1f, 0.9f, -0.5f, 1e-8f)},
      {"adam beta2 1", AdamConfigWith(0.1f, 0.9f, 1.0f, 1e-8f)},
      {"adam beta2 inf", AdamConfigWith(0.1f, 0.9f, inf, 1e-8f)},
      {"adam beta2 NaN", AdamConfigWith(0.1f, 0.9f, nan, 1e-8f)},
      {"adam epsilon 0", AdamConfigWith(0.1f, 0.9f, 0.999f, 0.0f)},
      {"adam epsilon < 0", AdamConfigWith(0.1f, 0.9f, 0.999f, -1e-8f)},
      {"adam epsilon NaN", AdamConfigWith(0.1f, 0.9f, 0.999f, nan)},
      {"ftrl alpha 0", FtrlConfigWith(0.0f, 1.0f, 0.0f, 0.0f)},
      {"ftrl alpha < 0", FtrlConfigWith(-0.05f, 1.0f, 0.0f, 0.0f)},
      {"ftrl alpha NaN", FtrlConfigWith(nan, 1.0f, 0.0f, 0.0f)},
      {"ftrl alpha inf", FtrlConfigWith(inf, 1.0f, 0.0f, 0.0f)},
      {"ftrl beta 0", FtrlConfigWith(0.05f, 0.0f, 0.0f, 0.0f)},
      {"ftrl beta < 0", FtrlConfigWith(0.05f, -1.0f, 0.0f, 0.0f)},
      {"ftrl beta NaN", FtrlConfigWith(0.05f, nan, 0.0f, 0.0f)},
      {"ftrl l1 < 0", FtrlConfigWith(0.05f, 1.0f, -0.1f, 0.0f)},
      {"ftrl l1 NaN", FtrlConfigWith(0.05f, 1.0f, nan, 0.0f)},
      {"ftrl l1 inf", FtrlConfigWith(0.05f, 1.0f, inf, 0.0f)},
      {"ftrl l2 < 0", FtrlConfigWith(0.05f, 1.0f, 0.0f, -0.1f)},
      {"ftrl l2 NaN", FtrlConfigWith(0.05f, 1.0f, 0.0f, nan)},
      {"ftrl l2 inf", FtrlConfigWith(0.05f, 1.0f, 0.0f, inf)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto opt = Optimizer::Create(c.config);
    EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(opt.status().message().empty());
  }
}

TEST(OptimizerCreateTest, MissingKindListsAllOptimizers) {
  auto opt = Optimizer::Create(OptimizerConfig());
  EXPECT_EQ(opt.status().message(),
            "optimizer: set one of sgd, adagrad, momentum, adam, ftrl");
}

// -------------------------------------------------------- RateMultiplier

OptimizerConfig SgdWithSchedule(uint64_t warmup_steps, uint64_t decay_steps,
                                float decay_rate) {
  OptimizerConfig c = SgdConfigWithLr(0.5f);
  LearningRateSchedule* s = c.mutable_schedule();
  s->set_warmup_steps(warmup_steps);
  s->set_decay_steps(decay_steps);
  s->set_decay_rate(decay_rate);
  return c;
}

TEST(RateMultiplierTest, ConstantScheduleIsOneAtEveryStep) {
  const uint64_t kMax = std::numeric_limits<uint64_t>::max();
  // No schedule block, and a block with both step counts 0.
  for (const OptimizerConfig& config :
       {SgdConfigWithLr(0.5f), SgdWithSchedule(0, 0, 0.0f)}) {
    for (uint64_t step : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{99},
                          uint64_t{1} << 40, kMax}) {
      SCOPED_TRACE(testing::Message() << "step " << step);
      EXPECT_EQ(RateMultiplier(config, step, 0, 1), 1.0f);
      // staleness_aware is off: staleness is ignored.
      EXPECT_EQ(RateMultiplier(config, step, 5, 1), 1.0f);
      EXPECT_EQ(RateMultiplier(config, step, kMax, 1), 1.0f);
    }
  }
}

TEST(RateMultiplierTest, LinearWarmUp) {
  // warmup_steps 4: (t + 1) / 4 while t < 4, then 1.
  const OptimizerConfig config = SgdWithSchedule(4, 0, 0.0f);
  const float want[] = {0.25f, 0.5f, 0.75f, 1.0f, 1.0f, 1.0f, 1.0f};
  for (int t = 0; t < 7; ++t) {
    SCOPED_TRACE(testing::Message() << "step " << t);
    EXPECT_FLOAT_EQ(RateMultiplier(config, t, 0, 1), want[t]);
  }
  EXPECT_FLOAT_EQ(RateMultiplier(config, 1000000, 0, 1), 1.0f);

  // Thirds are not exact in binary; still within a float ulp or so.
  const OptimizerConfig thirds = SgdWithSchedule(3, 0, 0.0f);
  EXPECT_FLOAT_EQ(RateMultiplier(thirds, 0, 0, 1), 1.0f / 3.0f);
  EXPECT_FLOAT_EQ(RateMultiplier(thirds, 1, 0, 1), 2.0f / 3.0f);
  EXPECT_FLOAT_EQ(RateMultiplier(thirds, 2, 0, 1), 1.0f);
  EXPECT_FLOAT_EQ(RateMultiplier(thirds, 3, 0, 1), 1.0f);

  // warmup_steps 1 is a no-op: (0 + 1) / 1.
  EXPECT_FLOAT_EQ(RateMultiplier(SgdWithSchedule(1, 0, 0.0f), 0, 0, 1), 1.0f);
  // The largest valid warm-up starts at 2^-40.
  EXPECT_FLOAT_EQ(
      RateMultiplier(SgdWithSchedule(uint64_t{1} << 40, 0, 0.0f), 0, 0, 1),
      std::ldexp(1.0f, -40));
}

TEST(RateMultiplierTest, StepDecay) {
  // decay_steps 3, decay_rate 0.5: 0.5^floor(t / 3).
  const OptimizerConfig config = SgdWithSchedule(0, 3, 0.5f);
  const float want[] = {1.0f,  1.0f,  1.0f,  0.5f,  0.5f,  0.5f,
                        0.25f, 0.25f, 0.25f, 0.125f};
  for (int t = 0; t < 10; ++t) {
    SCOPED_TRACE(testing::Message() << "step " << t);
    EXPECT_FLOAT_EQ(RateMultiplier(config, t, 0, 1), want[t]);
  }
  EXPECT_FLOAT_EQ(RateMultiplier(config, 30, 0, 1), 1.0f / 1024.0f);
  EXPECT_FLOAT_EQ(RateMultiplier(config, 32, 0, 1), 1.0f / 1024.0f);
  EXPECT_FLOAT_EQ(RateMultiplier(config, 33, 0, 1), 1.0f / 2048.0f);

  // The default rate 0.1 (as ApplyDefaults fills it) every 10 steps.
  const OptimizerConfig tenth = SgdWithSchedule(0, 10, 0.1f);
  EXPECT_FLOAT_EQ(RateMultiplier(tenth, 9, 0, 1), 1.0f);
  EXPECT_FLOAT_EQ(RateMultiplier(tenth, 10, 0, 1), 0.1f);
  EXPECT_FLOAT_EQ(RateMultiplier(tenth, 19, 0, 1), 0.1f);
  EXPECT_FLOAT_EQ(RateMultiplier(tenth, 25, 0, 1), 0.01f);
  EXPECT_FLOAT_EQ(RateMultiplier(tenth, 30, 0, 1), 0.001f);

  // decay_rate 1 never decays.
  EXPECT_FLOAT_EQ(RateMultiplier(SgdWithSchedule(0, 1, 1.0f), 12345, 0, 1),
                  1.0f);
}

TEST(RateMultiplierTest, WarmUpTimesDecay) {
  // warmup_steps 4, decay_steps 2, decay_rate 0.5. Decay counts from step
  // 0, not from the end of the warm-up:
  //   t:       0     1    2      3    4     5     6
  //   warm-up: 0.25  0.5  0.75   1    1     1     1
  //   decay:   1     1    0.5    0.5  0.25  0.25  0.125
  const OptimizerConfig config = SgdWithSchedule(4, 2, 0.5f);
  const float want[] = {0.25f, 0.5f, 0.375f, 0.5f, 0.25f, 0.25f, 0.125f};
  for (int t = 0; t < 7; ++t) {
    SCOPED_TRACE(testing::Message() << "step " << t);
    EXPECT_FLOAT_EQ(RateMultiplier(config, t, 0, 1), want[t]);
  }
}

TEST(RateMultiplierTest, StalenessAware) {
  OptimizerConfig config = SgdConfigWithLr(0.5f);
  config.set_staleness_aware(true);
  // 1 / (1 + staleness), at any step.
  for (uint64_t step : {uint64_t{0}, uint64_t{7}, uint64_t{1} << 40}) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    EXPECT_FLOAT_EQ(RateMultiplier(config, step, 0, 1), 1.0f);
    EXPECT_FLOAT_EQ(RateMultiplier(config, step, 1, 1), 0.5f);
    EXPECT_FLOAT_EQ(RateMultiplier(config, step, 2, 1), 1.0f / 3.0f);
    EXPECT_FLOAT_EQ(RateMultiplier(config, step, 3, 1), 0.25f);
    EXPECT_FLOAT_EQ(RateMultiplier(config, step, 9, 1), 0.1f);
    EXPECT_FLOAT_EQ(RateMultiplier(config, step, 999, 1), 0.001f);
  }
  // 1 + (2^64 - 1) rounds to 2^64 in double: the result is 2^-64, not 0
  // and not an overflowed 1 / 0.
  EXPECT_FLOAT_EQ(
      RateMultiplier(config, 0, std::numeric_limits<uint64_t>::max(), 1),
      std::ldexp(1.0f, -64));

  // Combined with a schedule (warm-up 4, decay 0.5 every 2 steps):
  // t = 1: 0.5 * 1 / (1 + 1); t = 4: 1 * 0.25 / (1 + 3).
  OptimizerConfig scheduled = SgdWithSchedule(4, 2, 0.5f);
  scheduled.set_staleness_aware(true);
  EXPECT_FLOAT_EQ(RateMultiplier(scheduled, 1, 1, 1), 0.25f);
  EXPECT_FLOAT_EQ(RateMultiplier(scheduled, 4, 3, 1), 0.0625f);
  EXPECT_FLOAT_EQ(RateMultiplier(scheduled, 2, 0, 1), 0.375f);

  // The same configs with staleness_aware off ignore staleness.
  scheduled.set_staleness_aware(false);
  EXPECT_FLOAT_EQ(RateMultiplier(scheduled, 1, 1, 1), 0.5f);
  EXPECT_FLOAT_EQ(RateMultiplier(scheduled, 4, 3, 1), 0.25f);
  EXPECT_FLOAT_EQ(RateMultiplier(scheduled, 4, 1000000, 1), 0.25f);
}

TEST(RateMultiplierTest, DeepDecayStaysPositive) {
  // 0.5^1000 and 0.1^(2^40) are far below the smallest float; the
  // multiplier must still be > 0 (a 0 would silently stop training), finite,
  // tiny, and never increase as the decay deepens.
  const OptimizerConfig halves = SgdWithSchedule(0, 1, 0.5f);
  float previous = 1.0f;
  for (uint64_t t = 0; t <= 1100; ++t) {
    const float m = RateMultiplier(halves, t, 0, 1);
    ASSERT_GT(m, 0.0f) << "step " << t;
    ASSERT_LE(m, previous) << "step " << t;
    previous = m;
  }
  EXPECT_FLOAT_EQ(RateMultiplier(halves, 100, 0, 1), std::ldexp(1.0f, -100));
  EXPECT_LE(RateMultiplier(halves, 1000, 0, 1),
            std::numeric_limits<float>::min());

  const uint64_t kMax = std::numeric_limits<uint64_t>::max();
  OptimizerConfig deep = SgdWithSchedule(0, 1, 0.1f);
  for (uint64_t step : {uint64_t{100}, uint64_t{1} << 40, kMax}) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    const float m = RateMultiplier(deep, step, 0, 1);
    EXPECT_GT(m, 0.0f);
    EXPECT_TRUE(std::isfinite(m));
    EXPECT_LE(m, std::numeric_limits<float>::min());
  }
  // Deep decay and extreme staleness together.
  deep.set_staleness_aware(true);
  EXPECT_GT(RateMultiplier(deep, kMax, kMax, 1), 0.0f);
  // Warm-up, decay and staleness all at their extremes.
  OptimizerConfig all = SgdWithSchedule(uint64_t{1} << 40, 1, 0.1f);
  all.set_staleness_aware(true);
  EXPECT_GT(RateMultiplier(all, (uint64_t{1} << 40) - 1, kMax, 1), 0.0f);
}

TEST(RateMultiplierTest, ScheduleDrivesSgdSteps) {
  // lr 0.5 with warm-up 2 and decay 0.5 every 2 steps; multipliers
  //   t = 0..4: 0.5 * 1, 1 * 1, 1 * 0.5, 1 * 0.5, 1 * 0.25
  // so the effective rates are 0.25, 0.5, 0.25, 0.25, 0.125. With
  // gradients 1, 2, -1, 4, 8 from w = 0:
  //   w = -0.25, -1.25, -1, -2, -3
  // With staleness_aware and staleness 0, 1, 0, 3, 1 the multipliers are
  // 0.5, 0.5, 0.5, 0.125, 0.125, the rates 0.25, 0.25, 0.25, 0.0625, 0.0625:
  //   w = -0.25, -0.75, -0.5, -0.75, -1.25
  // Every value is exact in float.
  OptimizerConfig config = SgdWithSchedule(2, 2, 0.5f);
  auto sgd = MustCreate(config);
  ASSERT_NE(sgd, nullptr);
  const float grads[] = {1.0f, 2.0f, -1.0f, 4.0f, 8.0f};
  const uint64_t staleness[] = {0, 1, 0, 3, 1};
  const float want_fresh[] = {-0.25f, -1.25f, -1.0f, -2.0f, -3.0f};
  const float want_stale[] = {-0.25f, -0.75f, -0.5f, -0.75f, -1.25f};
  OptimizerConfig stale_config = config;
  stale_config.set_staleness_aware(true);
  float w_fresh = 0.0f, w_stale = 0.0f;
  for (uint64_t t = 0; t < 5; ++t) {
    SCOPED_TRACE(testing::Message() << "step " << t);
    // Staleness is ignored without staleness_aware.
    sgd->Apply(&w_fresh, nullptr, &grads[t], 1,
               RateMultiplier(config, t, staleness[t], 1));
    sgd->Apply(&w_stale, nullptr, &grads[t], 1,
               RateMultiplier(stale_config, t, staleness[t], 1));
    EXPECT_EQ(w_fresh, want_fresh[t]);
    EXPECT_EQ(w_stale, want_stale[t]);
  }
}

// ---------------------------------------------------- scale_with_workers

OptimizerConfig Scaled(OptimizerConfig c) {
  c.set_scale_with_workers(true);
  return c;
}

TEST(RateMultiplierTest, WithoutScaleWithWorkersNumWorkersIsIgnored) {
  // The existing schedules, bit for bit, whatever the cluster size.
  for (const OptimizerConfig& config :
       {SgdConfigWithLr(0.5f), SgdWithSchedule(4, 0, 0.0f),
        SgdWithSchedule(0, 3, 0.5f), SgdWithSchedule(4, 2, 0.5f)}) {
    for (uint64_t t = 0; t < 10; ++t) {
      for (uint32_t k : {0u, 2u, 4u, 65536u}) {
        SCOPED_TRACE(testing::Message() << "step " << t << ", k " << k);
        EXPECT_EQ(RateMultiplier(config, t, 0, k),
                  RateMultiplier(config, t, 0, 1));
      }
    }
  }
  // Warm-up 4 still ramps from 0: (t + 1) / 4.
  EXPECT_EQ(RateMultiplier(SgdWithSchedule(4, 0, 0.0f), 0, 0, 4), 0.25f);
}

TEST(RateMultiplierTest, ScaleWithWorkersOnOneWorker) {
  // k = 1 without a warm-up: the same multiplier as without scaling, with
  // decay and staleness.
  OptimizerConfig decayed = SgdWithSchedule(0, 3, 0.5f);
  decayed.set_staleness_aware(true);
  for (uint64_t t = 0; t < 10; ++t) {
    for (uint64_t staleness : {uint64_t{0}, uint64_t{3}}) {
      SCOPED_TRACE(testing::Message() << "step " << t << ", staleness "
                                      << staleness);
      EXPECT_EQ(RateMultiplier(Scaled(decayed), t, staleness, 1),
                RateMultiplier(decayed, t, staleness, 1));
      EXPECT_EQ(RateMultiplier(Scaled(SgdConfigWithLr(0.5f)), t, staleness, 1),
                1.0f);
    }
  }
  // k = 1 with a warm-up: 1 + 0 * (t + 1) / 4 = 1 from step 0. The ramp
  // goes from the single-worker rate to itself, so there is none.
  for (uint64_t t = 0; t < 6; ++t) {
    SCOPED_TRACE(testing::Message() << "step " << t);
    EXPECT_EQ(RateMultiplier(Scaled(SgdWithSchedule(4, 0, 0.0f)), t, 0, 1),
              1.0f);
  }
  // num_workers 0 (never valid in a config) counts as 1, not as "no rate".
  EXPECT_EQ(RateMultiplier(Scaled(SgdConfigWithLr(0.5f)), 0, 0, 0), 1.0f);
  EXPECT_EQ(RateMultiplier(Scaled(SgdWithSchedule(4, 0, 0.0f)), 0, 0, 0),
            1.0f);
}

TEST(RateMultiplierTest, ScaleWithWorkersWithoutWarmUp) {
  // k = 4: 4 at every step.
  const OptimizerConfig plain = Scaled(SgdConfigWithLr(0.5f));
  for (uint64_t step : {uint64_t{0}, uint64_t{1}, uint64_t{99},
                        uint64_t{1} << 40,
                        std::numeric_limits<uint64_t>::max()}) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    EXPECT_EQ(RateMultiplier(plain, step, 0, 4), 4.0f);
  }
  // The largest cluster.
  EXPECT_EQ(RateMultiplier(plain, 0, 0, 65536), 65536.0f);

  // With decay 0.5 every 3 steps: 4 * 0.5^floor(t / 3).
  const OptimizerConfig decayed = Scaled(SgdWithSchedule(0, 3, 0.5f));
  const float want[] = {4, 4, 4, 2, 2, 2, 1, 1, 1, 0.5f};
  for (int t = 0; t < 10; ++t) {
    SCOPED_TRACE(testing::Message() << "step " << t);
    EXPECT_EQ(RateMultiplier(decayed, t, 0, 4), want[t]);
  }

  // With staleness: 4 / (1 + staleness).
  OptimizerConfig stale = plain;
  stale.set_staleness_aware(true);
  EXPECT_EQ(RateMultiplier(stale, 7, 0, 4), 4.0f);
  EXPECT_EQ(RateMultiplier(stale, 7, 1, 4), 2.0f);
  EXPECT_EQ(RateMultiplier(stale, 7, 3, 4), 1.0f);
  EXPECT_EQ(RateMultiplier(stale, 7, 7, 4), 0.5f);

  // Deep decay stays positive with scaling too.
  const OptimizerConfig deep = Scaled(SgdWithSchedule(0, 1, 0.1f));
  EXPECT_GT(RateMultiplier(deep, uint64_t{1} << 40, 0, 65536), 0.0f);
}

TEST(RateMultiplierTest, ScaleWithWorkersGradualWarmUp) {
  // k = 4, warmup_steps 4: 1 + 3 * (t + 1) / 4 while t < 4, then 4. Every
  // value is exact in float.
  const OptimizerConfig four = Scaled(SgdWithSchedule(4, 0, 0.0f));
  const float want[] = {1.75f, 2.5f, 3.25f, 4, 4, 4, 4};
  for (int t = 0; t < 7; ++t) {
    SCOPED_TRACE(testing::Message() << "step " << t);
    EXPECT_EQ(RateMultiplier(four, t, 0, 4), want[t]);
  }
  EXPECT_EQ(RateMultiplier(four, 1000000, 0, 4), 4.0f);

  // warmup_steps 3: 1 + 3 * (t + 1) / 3 = 2, 3, 4, then 4.
  const OptimizerConfig three = Scaled(SgdWithSchedule(3, 0, 0.0f));
  EXPECT_EQ(RateMultiplier(three, 0, 0, 4), 2.0f);
  EXPECT_EQ(RateMultiplier(three, 1, 0, 4), 3.0f);
  EXPECT_EQ(RateMultiplier(three, 2, 0, 4), 4.0f);
  EXPECT_EQ(RateMultiplier(three, 3, 0, 4), 4.0f);

  // warmup_steps 1 is a no-op: k from step 0.
  EXPECT_EQ(RateMultiplier(Scaled(SgdWithSchedule(1, 0, 0.0f)), 0, 0, 4),
            4.0f);
  // The longest warm-up starts at the single-worker rate (just above 1),
  // not near 0 as without scaling.
  EXPECT_FLOAT_EQ(
      RateMultiplier(Scaled(SgdWithSchedule(uint64_t{1} << 40, 0, 0.0f)), 0,
                     0, 4),
      1.0f);

  // Warm-up times decay (warm-up 4, decay 0.5 every 2 steps):
  //   t:       0     1    2     3    4     5     6
  //   warm-up: 1.75  2.5  3.25  4    4     4     4
  //   decay:   1     1    0.5   0.5  0.25  0.25  0.125
  const OptimizerConfig decayed = Scaled(SgdWithSchedule(4, 2, 0.5f));
  const float want_decayed[] = {1.75f, 2.5f, 1.625f, 2, 1, 1, 0.5f};
  for (int t = 0; t < 7; ++t) {
    SCOPED_TRACE(testing::Message() << "step " << t);
    EXPECT_EQ(RateMultiplier(decayed, t, 0, 4), want_decayed[t]);
  }
  // And staleness on top: t = 1, staleness 1: 2.5 / 2.
  OptimizerConfig stale = decayed;
  stale.set_staleness_aware(true);
  EXPECT_EQ(RateMultiplier(stale, 1, 1, 4), 1.25f);
}

TEST(RateMultiplierTest, ScaleWithWorkersDrivesSgdSteps) {
  // lr 0.5, k = 4, warm-up 2: multipliers 2.5, 4, 4, so with gradients 1,
  // 1, -2 from w = 0: w = -1.25, -3.25, 0.75 (exact in float). Without
  // scaling the multipliers are 0.5, 1, 1: w = -0.25, -0.75, 0.25.
  const OptimizerConfig plain = SgdWithSchedule(2, 0, 0.0f);
  const OptimizerConfig scaled = Scaled(plain);
  auto sgd = MustCreate(scaled);
  ASSERT_NE(sgd, nullptr);
  const float grads[] = {1.0f, 1.0f, -2.0f};
  const float want_scaled[] = {-1.25f, -3.25f, 0.75f};
  const float want_plain[] = {-0.25f, -0.75f, 0.25f};
  float w_scaled = 0.0f, w_plain = 0.0f;
  for (uint64_t t = 0; t < 3; ++t) {
    SCOPED_TRACE(testing::Message() << "step " << t);
    sgd->Apply(&w_scaled, nullptr, &grads[t], 1,
               RateMultiplier(scaled, t, 0, 4));
    sgd->Apply(&w_plain, nullptr, &grads[t], 1,
               RateMultiplier(plain, t, 0, 4));
    EXPECT_EQ(w_scaled, want_scaled[t]);
    EXPECT_EQ(w_plain, want_plain[t]);
  }
}

TEST(OptimizerCreateTest, RejectsBadSchedules) {
  // Create checks schedules with the job file's rules; without defaults a
  // decay_rate left 0 under decay_steps is not replaced by 0.1.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    const char* name;
    OptimizerConfig config;
    const char* error;
  };
  const Case cases[] = {
      {"decay_rate 0 with decay_steps", SgdWithSchedule(0, 10, 0.0f),
       "optimizer.schedule.decay_rate: must be in (0, 1]"},
      {"decay_rate > 1", SgdWithSchedule(0, 10, 1.5f),
       "optimizer.schedule.decay_rate: must be in (0, 1]"},
      {"decay_rate < 0", SgdWithSchedule(0, 10, -0.5f),
       "optimizer.schedule.decay_rate: must be in (0, 1]"},
      {"decay_rate NaN", SgdWithSchedule(0, 10, nan),
       "optimizer.schedule.decay_rate: must be in (0, 1]"},
      {"decay_rate without decay_steps", SgdWithSchedule(5, 0, 0.5f),
       "optimizer.schedule.decay_rate: needs schedule.decay_steps > 0"},
      {"warmup_steps > 2^40", SgdWithSchedule((uint64_t{1} << 40) + 1, 0, 0),
       "optimizer.schedule.warmup_steps: must be at most 2^40"},
      {"decay_steps > 2^40",
       SgdWithSchedule(0, (uint64_t{1} << 40) + 1, 0.5f),
       "optimizer.schedule.decay_steps: must be at most 2^40"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto opt = Optimizer::Create(c.config);
    EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(opt.status().message(), c.error);
  }
  for (const OptimizerConfig& ok :
       {SgdWithSchedule(uint64_t{1} << 40, uint64_t{1} << 40, 1.0f),
        SgdWithSchedule(3, 0, 0.0f), SgdWithSchedule(0, 1, 1e-30f)}) {
    auto opt = Optimizer::Create(ok);
    EXPECT_TRUE(opt.ok()) << opt.status() << "\n" << ok.DebugString();
  }
}

// The config loader sizes all-reduced tables' state tables by its own
// count of state floats, which must match the rules'.
TEST(OptimizerTest, ConfigCountsTheSameStateFloats) {
  OptimizerConfig configs[5];
  configs[0].mutable_sgd()->set_learning_rate(0.1f);
  configs[1].mutable_adagrad()->set_learning_rate(0.1f);
  configs[1].mutable_adagrad()->set_initial_accumulator(0.1f);
  configs[1].mutable_adagrad()->set_epsilon(1e-8f);
  configs[2].mutable_momentum()->set_learning_rate(0.1f);
  configs[2].mutable_momentum()->set_momentum(0.9f);
  configs[3].mutable_adam()->set_learning_rate(0.1f);
  configs[3].mutable_adam()->set_beta1(0.9f);
  configs[3].mutable_adam()->set_beta2(0.999f);
  configs[3].mutable_adam()->set_epsilon(1e-8f);
  configs[4].mutable_ftrl()->set_alpha(0.1f);
  configs[4].mutable_ftrl()->set_beta(1.0f);
  for (const OptimizerConfig& c : configs) {
    auto opt = Optimizer::Create(c);
    ASSERT_TRUE(opt.ok()) << opt.status() << c.DebugString();
    EXPECT_EQ(static_cast<uint32_t>((*opt)->state_size()),
              OptimizerStateFloats(c))
        << c.DebugString();
  }
}

}  // namespace
}  // namespace ps
