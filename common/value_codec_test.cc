#include "common/value_codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/hash.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

// Every finite half comes back bit for bit (infinities saturate by design).
TEST(ValueCodecTest, HalfRoundTripsEveryFiniteHalfValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (!std::isfinite(f)) continue;
    EXPECT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
}

TEST(ValueCodecTest, HalfKnownValues) {
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  // Saturation, not infinity.
  EXPECT_EQ(FloatToHalf(1e9f), 0x7bff);
  EXPECT_EQ(FloatToHalf(-1e9f), 0xfbff);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7bff);
  // Smallest subnormal 2^-24; half of it rounds to even (0), a bit more to it.
  EXPECT_EQ(FloatToHalf(5.9604644775390625e-08f), 0x0001);
  EXPECT_EQ(FloatToHalf(2.98023223876953125e-08f), 0x0000);
  EXPECT_EQ(FloatToHalf(3.0e-08f), 0x0001);
  EXPECT_EQ(FloatToHalf(1e-12f), 0x0000);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1).
  EXPECT_EQ(FloatToHalf(1.00048828125f), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.00146484375f), 0x3c02);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
}

TEST(ValueCodecTest, Bfloat16KnownValues) {
  EXPECT_EQ(FloatToBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(Bfloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(FloatToBfloat16(-0.0f), 0x8000);
  // Ties to even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(FloatToBfloat16(1.00390625f), 0x3f80);
  EXPECT_EQ(FloatToBfloat16(1.01171875f), 0x3f82);
  // The largest floats saturate instead of becoming infinity.
  EXPECT_EQ(FloatToBfloat16(std::numeric_limits<float>::max()), 0x7f7f);
  EXPECT_EQ(FloatToBfloat16(std::numeric_limits<float>::lowest()), 0xff7f);
  EXPECT_TRUE(std::isnan(Bfloat16ToFloat(FloatToBfloat16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(Bfloat16ToFloat(FloatToBfloat16(INFINITY))));
}

// The bulk functions (F16C when the CPU has it) agree with the scalar
// reference on random values of every magnitude, at any length and at an
// odd source address.
TEST(ValueCodecTest, BulkMatchesScalar) {
  std::vector<float> in;
  uint64_t s = 7;
  for (int i = 0; i < 4099; ++i) {
    s = Mix64(s);
    const float mantissa = static_cast<float>(HashToUnit(s)) * 2 - 1;
    in.push_back(std::ldexp(mantissa, static_cast<int>(s % 80) - 40));
  }
  in.push_back(70000.0f);
  in.push_back(-1e30f);
  for (ValueEncoding e : {FLOAT16, BFLOAT16, FLOAT32}) {
    const size_t width = EncodedValueBytes(e);
    std::vector<unsigned char> wire(in.size() * width + 1);
    EncodeValues(e, in.data(), in.size(), wire.data());
    // Decode from an odd address too.
    std::memmove(wire.data() + 1, wire.data(), in.size() * width);
    std::vector<float> out(in.size());
    DecodeValues(e, wire.data() + 1, in.size(), out.data());
    for (size_t i = 0; i < in.size(); ++i) {
      float expected = in[i];
      if (e == FLOAT16) expected = HalfToFloat(FloatToHalf(in[i]));
      if (e == BFLOAT16) expected = Bfloat16ToFloat(FloatToBfloat16(in[i]));
      ASSERT_EQ(out[i], expected) << "encoding " << e << " value " << in[i];
      ASSERT_TRUE(std::isfinite(out[i]));
      if (e != FLOAT32 && in[i] != 0 && std::fabs(in[i]) > 1e-4f && std::fabs(in[i]) < 6e4f) {
        EXPECT_LT(std::fabs(out[i] - in[i]) / std::fabs(in[i]), e == FLOAT16 ? 1e-3 : 8e-3);
      }
    }
  }
}

}  // namespace
}  // namespace ps
