// AllFinite (finite.h): the vector paths against the scalar reference, at every length
// around the vector widths and with the bad value at every position.
#include "leash/common/finite.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace leash {
namespace {

float Bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

TEST(FiniteTest, EveryBadValueAtEveryPositionIsFound) {
  const std::vector<float> bad = {std::numeric_limits<float>::quiet_NaN(),
                                  -std::numeric_limits<float>::quiet_NaN(),
                                  std::numeric_limits<float>::signaling_NaN(),
                                  std::numeric_limits<float>::infinity(),
                                  -std::numeric_limits<float>::infinity(),
                                  Bits(0x7f800001u),
                                  Bits(0xffffffffu)};
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 100.f);
  for (size_t n = 0; n <= 80; ++n) {
    std::vector<float> v(n + 1);  // +1: an unaligned start too
    for (float& x : v) x = normal(rng);
    for (size_t off = 0; off <= 1; ++off) {
      const float* p = v.data() + off;
      const size_t len = n + 1 - off;
      ASSERT_TRUE(AllFinite(p, len)) << len;
      for (size_t at = 0; at < len; ++at) {
        for (float b : bad) {
          const float keep = v[off + at];
          v[off + at] = b;
          EXPECT_FALSE(AllFinite(p, len)) << "length " << len << " bad at " << at;
          EXPECT_EQ(AllFinite(p, len), AllFiniteScalar(p, len));
          v[off + at] = keep;
        }
      }
    }
  }
}

TEST(FiniteTest, ExtremeFiniteValuesAreFinite) {
  std::vector<float> v = {std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::lowest(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(),
                          0.f,
                          -0.f,
                          Bits(0x7f7fffffu)};
  v.resize(1000, 1.f);
  EXPECT_TRUE(AllFinite(v.data(), v.size()));
  EXPECT_TRUE(AllFiniteScalar(v.data(), v.size()));
  EXPECT_TRUE(AllFinite(nullptr, 0));
  v[999] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(AllFinite(v.data(), v.size()));
  EXPECT_TRUE(AllFinite(v.data(), 999)) << "the bad value lies past the length";
}

}  // namespace
}  // namespace leash
