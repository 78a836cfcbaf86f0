#include "scheduler/pace_estimator.h"

#include "gtest/gtest.h"

namespace ps {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(PaceEstimatorTest, UnknownUntilTheFirstObservation) {
  PaceEstimator pace;
  EXPECT_FALSE(pace.started());
  EXPECT_EQ(pace.steps_per_second(), 0);
  pace.Observe(10, kT0);
  EXPECT_TRUE(pace.started());
  EXPECT_EQ(pace.steps_per_second(), 0);
}

TEST(PaceEstimatorTest, BeforeAWholeWindowThePaceSoFar) {
  PaceEstimator pace;
  pace.Observe(0, kT0);
  pace.Observe(5, kT0 + absl::Milliseconds(50));
  EXPECT_DOUBLE_EQ(pace.steps_per_second(), 100);
  pace.Observe(15, kT0 + absl::Milliseconds(100));
  EXPECT_DOUBLE_EQ(pace.steps_per_second(), 150);
}

TEST(PaceEstimatorTest, ObservationsAtTheSameTimeChangeNothing) {
  PaceEstimator pace;
  pace.Observe(0, kT0);
  pace.Observe(7, kT0);
  EXPECT_EQ(pace.steps_per_second(), 0);
}

TEST(PaceEstimatorTest, AfterAWholeWindowOnlyWholeWindowsCount) {
  PaceEstimator pace;
  pace.Observe(0, kT0);
  pace.Observe(100, kT0 + absl::Milliseconds(200));  // a whole window
  EXPECT_DOUBLE_EQ(pace.steps_per_second(), 500);
  // A short window after a measured one leaves the measured pace.
  pace.Observe(150, kT0 + absl::Milliseconds(250));
  EXPECT_DOUBLE_EQ(pace.steps_per_second(), 500);
  // The next whole window is measured from the end of the last one.
  pace.Observe(200, kT0 + absl::Milliseconds(600));
  EXPECT_DOUBLE_EQ(pace.steps_per_second(), 250);
}

}  // namespace
}  // namespace ps
