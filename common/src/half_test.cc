// Tests of scalar fp16 / bf16 conversion.
#include "leash/common/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace leash {
namespace {

TEST(HalfTest, ExactValuesRoundTrip) {
  for (float x : {0.f, -0.f, 1.f, -2.5f, 65504.f, 6.103515625e-05f, 5.9604645e-08f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(x)), x) << x;
  }
  for (float x : {0.f, 1.f, -3.5f, 0x1.8p100f}) EXPECT_EQ(Bf16ToFloat(FloatToBf16(x)), x) << x;
}

TEST(HalfTest, RoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.f + 1.f / 2048), FloatToHalf(1.f));               // tie -> even
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.f + 3.f / 2048)), 1.f + 2.f / 1024);  // tie -> even (up)
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.f + 1.f / 256)), 1.f);                // tie -> even
  EXPECT_NEAR(HalfToFloat(FloatToHalf(0.1f)), 0.1f, 1e-4);
}

TEST(HalfTest, OverflowInfAndNanArePreserved) {
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(1e6f))));
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(-std::numeric_limits<float>::infinity()))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(HalfToFloat(FloatToHalf(1e-10f)), 0.f);
}

TEST(HalfTest, RelativeErrorIsWithinHalfAnUlp) {
  for (float x = 1e-3f; x < 6e4f; x *= 1.37f) {
    EXPECT_LE(std::fabs(HalfToFloat(FloatToHalf(x)) - x) / x, 1.f / 2048 + 1e-7f) << x;
    EXPECT_LE(std::fabs(Bf16ToFloat(FloatToBf16(x)) - x) / x, 1.f / 256 + 1e-7f) << x;
  }
}

}  // namespace
}  // namespace leash
