// Tests of scalar fp16 / bf16 conversion.
#include "leash/common/half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

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

// The bulk widening gives every one of the 65536 patterns as the scalar functions do, from
// an odd address and with a tail that is not a whole vector.
TEST(HalfTest, BulkWideningMatchesTheScalarFunctionsForEveryPattern) {
  constexpr size_t kCount = 65536 + 5;
  std::vector<uint8_t> bytes(1 + 2 * kCount);
  for (size_t i = 0; i < kCount; ++i) {
    const auto h = static_cast<uint16_t>(i * 40503u);  // odd multiplier: every pattern once
    std::memcpy(bytes.data() + 1 + 2 * i, &h, 2);
  }
  std::vector<float> half(kCount), bf16(kCount);
  HalfToFloatN(bytes.data() + 1, kCount, half.data());
  Bf16ToFloatN(bytes.data() + 1, kCount, bf16.data());
  size_t nans = 0;
  for (size_t i = 0; i < kCount; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 1 + 2 * i, 2);
    const float want_half = HalfToFloat(h), want_bf16 = Bf16ToFloat(h);
    if (std::isnan(want_half)) {
      ++nans;
      EXPECT_TRUE(std::isnan(half[i])) << "half 0x" << std::hex << h;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(half[i]), std::bit_cast<uint32_t>(want_half))
          << "half 0x" << std::hex << h;
    }
    EXPECT_EQ(std::bit_cast<uint32_t>(bf16[i]), std::bit_cast<uint32_t>(want_bf16))
        << "bf16 0x" << std::hex << h;
  }
  EXPECT_GE(nans, 2u * 1023u);  // every NaN pattern was among them
}

// Narrowing in bulk rounds as the scalar functions do: every float whose top half is any
// pattern, with the low half at the rounding edges (just below, at and above half way,
// both parities) and random low halves, from an odd address, with a tail.
TEST(HalfTest, BulkNarrowingMatchesTheScalarFunctions) {
  std::vector<float> in;
  std::mt19937 rng(7);
  const uint32_t lows[] = {0u, 1u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x1000u, 0x0fffu, 0x1001u};
  for (uint32_t top = 0; top < 65536; ++top) {
    for (uint32_t low : lows) in.push_back(std::bit_cast<float>(top << 16 | low));
    in.push_back(std::bit_cast<float>(top << 16 | (static_cast<uint32_t>(rng()) & 0xffffu)));
  }
  in.push_back(1.0f);  // a tail that is not a whole vector
  in.push_back(-65520.0f);
  in.push_back(5.96046448e-8f);
  std::vector<uint8_t> half(1 + 2 * in.size()), bf16(1 + 2 * in.size());
  FloatToHalfN(in.data(), in.size(), half.data() + 1);
  FloatToBf16N(in.data(), in.size(), bf16.data() + 1);
  size_t mismatches = 0;
  for (size_t i = 0; i < in.size() && mismatches < 10; ++i) {
    uint16_t h, b;
    std::memcpy(&h, half.data() + 1 + 2 * i, 2);
    std::memcpy(&b, bf16.data() + 1 + 2 * i, 2);
    const uint32_t bits = std::bit_cast<uint32_t>(in[i]);
    if (std::isnan(in[i])) {
      EXPECT_TRUE(std::isnan(HalfToFloat(h))) << std::hex << bits;
    } else if (h != FloatToHalf(in[i])) {
      ++mismatches;
      ADD_FAILURE() << "half of 0x" << std::hex << bits << ": 0x" << h << ", scalar 0x"
                    << FloatToHalf(in[i]);
    }
    if (b != FloatToBf16(in[i])) {
      ++mismatches;
      ADD_FAILURE() << "bf16 of 0x" << std::hex << bits << ": 0x" << b << ", scalar 0x"
                    << FloatToBf16(in[i]);
    }
  }
}

}  // namespace
}  // namespace leash
