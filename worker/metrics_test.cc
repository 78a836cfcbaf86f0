#include "worker/metrics.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(AucTest, PerfectRanking) {
  std::vector<float> scores = {0.1f, 0.2f, 0.8f, 0.9f};
  std::vector<float> labels = {0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(Auc(scores, labels), 1.0);
}

TEST(AucTest, InvertedRanking) {
  std::vector<float> scores = {0.9f, 0.8f, 0.2f, 0.1f};
  std::vector<float> labels = {0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(Auc(scores, labels), 0.0);
}

TEST(AucTest, HandComputedWithoutTies) {
  // Positives score 0.35 and 0.8; negatives 0.1, 0.4, 0.9.
  // Pairs (pos > neg): 0.35 beats 0.1; 0.8 beats 0.1 and 0.4 -> 3 of 6.
  std::vector<float> scores = {0.1f, 0.35f, 0.4f, 0.8f, 0.9f};
  std::vector<float> labels = {0, 1, 0, 1, 0};
  EXPECT_DOUBLE_EQ(Auc(scores, labels), 3.0 / 6.0);
}

TEST(AucTest, TiesCountHalf) {
  // Positives: 0.5, 0.7. Negatives: 0.5, 0.2.
  // 0.5 vs 0.5 tie -> 0.5; 0.5 > 0.2 -> 1; 0.7 beats both -> 2. Total 3.5/4.
  std::vector<float> scores = {0.5f, 0.7f, 0.5f, 0.2f};
  std::vector<float> labels = {1, 1, 0, 0};
  EXPECT_DOUBLE_EQ(Auc(scores, labels), 3.5 / 4.0);
}

TEST(AucTest, AllScoresEqualGiveOneHalf) {
  std::vector<float> scores(10, 0.3f);
  std::vector<float> labels = {1, 0, 1, 0, 0, 0, 1, 0, 0, 0};
  EXPECT_DOUBLE_EQ(Auc(scores, labels), 0.5);
}

TEST(AucTest, TieRunsSpanningBothClasses) {
  // Scores 1,1,2,2,2,3 with labels 0,1,0,1,1,0.
  // Positives: s=1 (vs negs 1,2,3 -> 0.5), s=2 (vs 1 -> 1, vs 2 -> 0.5,
  // vs 3 -> 0) twice -> 1.5 each. Total 3.5 of 3*3 = 9 pairs.
  std::vector<float> scores = {1, 1, 2, 2, 2, 3};
  std::vector<float> labels = {0, 1, 0, 1, 1, 0};
  EXPECT_DOUBLE_EQ(Auc(scores, labels), 3.5 / 9.0);
}

TEST(AucTest, InvariantToMonotoneTransformAndOrder) {
  std::vector<float> scores = {-2, 0.5f, 3, 1, -1, 2};
  std::vector<float> labels = {0, 1, 1, 0, 0, 1};
  const double a = Auc(scores, labels);
  std::vector<float> shifted, rev_s, rev_l;
  for (float s : scores) shifted.push_back(10 * s + 3);
  for (int i = 5; i >= 0; --i) {
    rev_s.push_back(scores[i]);
    rev_l.push_back(labels[i]);
  }
  EXPECT_DOUBLE_EQ(Auc(shifted, labels), a);
  EXPECT_DOUBLE_EQ(Auc(rev_s, rev_l), a);
}

TEST(AucTest, SingleClassIsNaN) {
  std::vector<float> scores = {0.1f, 0.2f, 0.3f};
  EXPECT_TRUE(std::isnan(Auc(scores, std::vector<float>{1, 1, 1})));
  EXPECT_TRUE(std::isnan(Auc(scores, std::vector<float>{0, 0, 0})));
  EXPECT_TRUE(std::isnan(Auc({}, {})));
}

TEST(AucTest, BadInputIsNaN) {
  EXPECT_TRUE(std::isnan(
      Auc(std::vector<float>{0.1f, 0.2f}, std::vector<float>{0, 1, 1})));
  EXPECT_TRUE(std::isnan(
      Auc(std::vector<float>{0.1f, std::nanf("")}, std::vector<float>{0, 1})));
}

TEST(LogLossTest, HandValues) {
  // -(log 0.8 + log(1 - 0.4)) / 2
  std::vector<float> p = {0.8f, 0.4f};
  std::vector<float> y = {1, 0};
  const double want =
      -(std::log(double{0.8f}) + std::log(1 - double{0.4f})) / 2;
  EXPECT_NEAR(LogLoss(p, y), want, 1e-12);
  // p = 0.5 costs log 2 whatever the label.
  EXPECT_NEAR(LogLoss(std::vector<float>{0.5f, 0.5f}, std::vector<float>{0, 1}),
              std::log(2.0), 1e-12);
}

TEST(LogLossTest, ClipsToFiniteValues) {
  // A confident mistake costs -log(1e-7), a confident hit about 1e-7.
  EXPECT_NEAR(LogLoss(std::vector<float>{0.0f}, std::vector<float>{1}),
              -std::log(1e-7), 1e-9);
  EXPECT_NEAR(LogLoss(std::vector<float>{1.0f}, std::vector<float>{0}),
              -std::log(1e-7), 1e-6);
  EXPECT_NEAR(LogLoss(std::vector<float>{1.0f}, std::vector<float>{1}), 1e-7,
              1e-9);
}

TEST(LogLossTest, BadInputIsNaN) {
  EXPECT_TRUE(std::isnan(LogLoss({}, {})));
  EXPECT_TRUE(
      std::isnan(LogLoss(std::vector<float>{0.5f}, std::vector<float>{0, 1})));
  EXPECT_TRUE(std::isnan(
      LogLoss(std::vector<float>{std::nanf("")}, std::vector<float>{1})));
}

}  // namespace
}  // namespace ps
