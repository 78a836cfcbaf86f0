#include "common/wire.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(FrameFromSharedTest, PointsIntoTheVectorAndHoldsItUntilTheFrameGoes) {
  auto data = std::make_shared<const std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5});
  std::weak_ptr<const std::vector<float>> watch = data;
  {
    zmq::message_t frame = FrameFromShared(data, 1, 3);
    EXPECT_EQ(frame.data(), static_cast<const void*>(data->data() + 1));
    EXPECT_EQ(frame.size(), 3 * sizeof(float));
    data.reset();
    EXPECT_FALSE(watch.expired());  // the frame holds it
    const float* v = frame.data<float>();
    EXPECT_EQ(v[0], 2.0f);
    EXPECT_EQ(v[2], 4.0f);
  }
  EXPECT_TRUE(watch.expired());
  auto other = std::make_shared<const std::vector<float>>(std::vector<float>{1});
  EXPECT_EQ(FrameFromShared(other, 0, 0).size(), 0u);
}

}  // namespace
}  // namespace ps
