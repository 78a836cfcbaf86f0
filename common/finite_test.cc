#include "common/finite.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(AllFiniteTest, FiniteValuesPass) {
  EXPECT_TRUE(AllFinite({}));
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1e30f,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::lowest(),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min()};
  for (int n = 0; n < 40; ++n) {
    v.push_back(static_cast<float>(n) * 0.37f);
    EXPECT_TRUE(AllFinite(v)) << v.size();
  }
}

// Every position relative to the 16-float blocks (four lanes of four), their
// lanes and the tail, for each kind of non-finite value.
TEST(AllFiniteTest, ANonFiniteValueAnywhereIsFound) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    -std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::signaling_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (size_t n : {1, 7, 8, 9, 15, 16, 17, 23, 31, 32, 33, 64, 79}) {
      for (size_t at = 0; at < n; ++at) {
        std::vector<float> v(n, 2.5f);
        v[at] = bad;
        EXPECT_FALSE(AllFinite(v)) << "n " << n << " at " << at << " value " << bad;
      }
    }
  }
}

TEST(CopyFiniteTest, CopiesEverythingAndTellsWhetherAllWereFinite) {
  for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 33, 48, 50}) {
    std::vector<float> src(n), dst(n, -1.0f);
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 1.5f;
    EXPECT_TRUE(CopyFinite(src.data(), n, dst.data()));
    EXPECT_EQ(dst, src);
    for (size_t at = 0; at < n; ++at) {
      std::vector<float> bad = src;
      bad[at] = std::numeric_limits<float>::infinity();
      std::vector<float> out(n, -1.0f);
      EXPECT_FALSE(CopyFinite(bad.data(), n, out.data())) << n << " " << at;
      EXPECT_EQ(out[at], bad[at]);
    }
  }
}

}  // namespace
}  // namespace ps
