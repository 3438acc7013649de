// AllFinite and CopyAllFinite (finite.h): the vector paths against the scalar reference, at
// every length around the vector widths and with the bad value at every position; and the
// frames that learn from their copy that they hold finite floats (message.h).
#include "leash/common/finite.h"

#include <gtest/gtest.h>

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

// Every byte is copied, at every length (past two 128-byte blocks, and lengths that are not
// whole floats) and every misalignment of source and destination; the answer is AllFinite's
// of the copy, with each bad value at each position.
TEST(FiniteTest, CopyAllFiniteCopiesEveryByteAndFindsEveryBadValue) {
  const std::vector<uint32_t> bad = {0x7fc00000u, 0xffc00000u, 0x7fa00000u, 0x7f800000u,
                                     0xff800000u, 0x7f800001u, 0xffffffffu};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 100.f);
  for (size_t bytes = 0; bytes <= 300; ++bytes) {
    for (size_t src_off = 0; src_off < 4; src_off += 3) {
      for (size_t dst_off = 0; dst_off < 4; dst_off += 1) {
        std::vector<uint8_t> src(bytes + 8), dst(bytes + 8, 0xaa);
        for (size_t i = 0; i + 4 <= src.size(); i += 4) {
          const float f = normal(rng);
          std::memcpy(&src[i], &f, 4);
        }
        uint8_t* s = src.data() + src_off;
        uint8_t* d = dst.data() + dst_off;
        auto reference = [&] {
          std::vector<float> floats(bytes / 4);
          if (!floats.empty()) std::memcpy(floats.data(), s, floats.size() * 4);
          return bytes % 4 == 0 && AllFiniteScalar(floats.data(), floats.size());
        };
        const bool got = CopyAllFinite(d, s, bytes);
        ASSERT_EQ(got, reference()) << bytes << " bytes, offsets " << src_off << "/" << dst_off;
        ASSERT_EQ(bytes == 0 || std::memcmp(d, s, bytes) == 0, true) << bytes;
        ASSERT_EQ(dst[dst_off + bytes], 0xaa) << "nothing past the end is written";
        if (dst_off > 0) {
          ASSERT_EQ(dst[dst_off - 1], 0xaa) << "nor before the start";
        }
        if (dst_off != 1 || bytes % 4 != 0) continue;  // bad values: one layout is enough
        for (size_t at = 0; at + 4 <= bytes; at += 4) {
          for (uint32_t b : bad) {
            uint8_t keep[4];
            std::memcpy(keep, s + at, 4);
            std::memcpy(s + at, &b, 4);
            ASSERT_FALSE(CopyAllFinite(d, s, bytes)) << bytes << " bytes, bad at " << at;
            ASSERT_EQ(std::memcmp(d, s, bytes), 0);
            std::memcpy(s + at, keep, 4);
          }
        }
      }
    }
  }
}

TEST(FiniteTest, AFrameKnowsItsFloatsAreFiniteOnlyFromTheCopyThatCheckedThem) {
  std::vector<float> v(1000, 0.5f);
  Frame checked = Frame::CopyCheckingFinite(v.data(), v.size() * 4);
  EXPECT_TRUE(checked.finite_f32());
  EXPECT_EQ(std::memcmp(checked.data(), v.data(), v.size() * 4), 0);
  Frame same = checked;  // a fact about the bytes: every copy of the frame keeps it
  EXPECT_TRUE(same.finite_f32());
  EXPECT_FALSE(Frame::Copy(v.data(), v.size() * 4).finite_f32()) << "not checked: not known";
  EXPECT_FALSE(Frame::CopyCheckingFinite(v.data(), 6).finite_f32()) << "not whole floats";
  EXPECT_FALSE(Frame::CopyCheckingFinite(v.data(), 0).finite_f32()) << "no floats";
  v[999] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(Frame::CopyCheckingFinite(v.data(), v.size() * 4).finite_f32());
  EXPECT_TRUE(Frame::CopyCheckingFinite(v.data(), 999 * 4).finite_f32());
}

// Copying a frame somewhere else (a backup's ring) checks it on the way: the frame it returns
// is the source itself (same bytes, same storage) knowing the fact, or not knowing it.
TEST(FiniteTest, CopyingAFrameElsewhereTeachesTheFrameItsFloatsAreFinite) {
  std::vector<float> v(1000, -2.f);
  const Frame plain = Frame::Copy(v.data(), v.size() * 4);
  ASSERT_FALSE(plain.finite_f32());
  std::vector<float> ring(1000, 7.f);
  Frame known = Frame::CopyToCheckingFinite(plain, ring.data());
  EXPECT_TRUE(known.finite_f32());
  EXPECT_EQ(known.data(), plain.data()) << "the source's storage, not the copy's";
  EXPECT_EQ(known.size(), plain.size());
  EXPECT_EQ(ring, v) << "every byte copied";
  EXPECT_FALSE(plain.finite_f32()) << "the source object itself is not changed";

  v[500] = -std::numeric_limits<float>::infinity();
  const Frame bad = Frame::Copy(v.data(), v.size() * 4);
  EXPECT_FALSE(Frame::CopyToCheckingFinite(bad, ring.data()).finite_f32());
  EXPECT_EQ(ring, v) << "copied whole even when a value is not finite";
  EXPECT_FALSE(Frame::CopyToCheckingFinite(Frame::Copy(v.data(), 6), ring.data()).finite_f32())
      << "not whole floats";
}

}  // namespace
}  // namespace leash
