#include "server/optimizer.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
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
  sgd->Apply(w.data(), nullptr, g1, 3);
  // w - 0.5 * g = {1 - 0.25, -2 - 0.5, 0.25 + 1}
  EXPECT_EQ(w, (std::vector<float>{0.75f, -2.5f, 1.25f}));

  const float g2[] = {1.5f, -3.0f, 0.0f};
  sgd->Apply(w.data(), nullptr, g2, 3);
  // {0.75 - 0.75, -2.5 + 1.5, 1.25 - 0}
  EXPECT_EQ(w, (std::vector<float>{0.0f, -1.0f, 1.25f}));

  const float g3[] = {-4.0f, 0.125f, 2.5f};
  sgd->Apply(w.data(), nullptr, g3, 3);
  // {0 + 2, -1 - 0.0625, 1.25 - 1.25}
  EXPECT_EQ(w, (std::vector<float>{2.0f, -1.0625f, 0.0f}));
}

TEST(SgdTest, TouchesOnlyTheFirstNElements) {
  auto sgd = MustCreate(SgdConfigWithLr(1.0f));
  ASSERT_NE(sgd, nullptr);
  std::vector<float> w = {1.0f, 1.0f, 1.0f};
  const float g[] = {1.0f, 1.0f, 1.0f};
  sgd->Apply(w.data(), nullptr, g, 2);
  EXPECT_EQ(w, (std::vector<float>{0.0f, 0.0f, 1.0f}));
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
    adagrad->Apply(w, acc, grads[step], 2);
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
    adagrad->Apply(w, acc, g, kN);
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
  adagrad->Apply(w, acc, g1, 2);
  const float g2[] = {0.0f, 3.0f};
  adagrad->Apply(w, acc, g2, 2);
  // w1 = -1 * 3 / (sqrt(9) + 1e-8): 3 + 1e-8 rounds to 3 in float.
  EXPECT_EQ(acc[0], 10000.0f);
  EXPECT_EQ(acc[1], 9.0f);
  EXPECT_FLOAT_EQ(w[0], -1.0f);
  EXPECT_FLOAT_EQ(w[1], -1.0f);
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

}  // namespace
}  // namespace ps
