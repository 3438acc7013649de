// AllFinite (finite.h): the vector paths against the scalar reference, at every length
// around the vector widths and with the bad value at every position.
#include "leash/common/finite.h"

#include <gtest/gtest.h>

#include <memory>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "leash/common/message.h"

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
      std::vector<float> copy(len + 1, 0.f);  // +1: nothing is written past the length
      ASSERT_TRUE(CopyAllFinite(copy.data(), p, len)) << len;
      EXPECT_EQ(std::memcmp(copy.data(), p, len * sizeof(float)), 0) << len;
      EXPECT_EQ(copy[len], 0.f);
      for (size_t at = 0; at < len; ++at) {
        for (float b : bad) {
          const float keep = v[off + at];
          v[off + at] = b;
          EXPECT_FALSE(AllFinite(p, len)) << "length " << len << " bad at " << at;
          EXPECT_EQ(AllFinite(p, len), AllFiniteScalar(p, len));
          EXPECT_FALSE(CopyAllFinite(copy.data(), p, len)) << "length " << len << " bad at " << at;
          EXPECT_EQ(std::memcmp(copy.data(), p, len * sizeof(float)), 0) << "copied whole";
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

// A lent frame's kept copy (message.h) knows whether its bytes are finite floats, found in
// the copying pass; what is not a copy of a lent frame knows nothing.
TEST(FiniteTest, AKeptCopyOfALentFrameKnowsWhetherItsFloatsAreFinite) {
  std::vector<float> v(1000, 0.5f);
  auto lend = [&] {
    auto buf = std::make_shared<std::vector<float>>(v);
    return Frame::Lent(buf->data(), buf->size() * sizeof(float), buf);
  };
  Frame kept = lend().Kept();
  EXPECT_FALSE(kept.lent());
  EXPECT_TRUE(kept.finite_floats());
  ASSERT_EQ(kept.size(), v.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(kept.data(), v.data(), kept.size()), 0);
  EXPECT_TRUE(kept.Kept().finite_floats()) << "a kept frame keeps itself";

  v[517] = std::numeric_limits<float>::quiet_NaN();
  Frame bad = lend().Kept();
  EXPECT_FALSE(bad.finite_floats());
  EXPECT_EQ(std::memcmp(bad.data(), v.data(), bad.size()), 0) << "copied all the same";

  const Frame odd = Frame::Lent(v.data(), 7, nullptr).Kept();  // not whole floats
  EXPECT_FALSE(odd.finite_floats());
  EXPECT_EQ(odd.size(), 7u);
  EXPECT_FALSE(Frame::Copy(v.data(), 8).finite_floats()) << "not known for other frames";
}

}  // namespace
}  // namespace leash
