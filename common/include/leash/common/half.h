// Scalar float32 <-> float16 / bfloat16 conversion (round to nearest even). Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace leash {

inline uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x007fffffu))
    return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

inline float Bf16ToFloat(uint16_t h) {
  uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

inline uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xffu)
    return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));  // Inf / NaN
  int32_t e = static_cast<int32_t>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> Inf
  if (e <= 0) {                                                 // subnormal or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half_mant = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return static_cast<uint16_t>(sign | half_mant);
  }
  uint32_t h = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
  return static_cast<uint16_t>(h);
}

inline float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while (!(mant & 0x400u));
      x = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// Bulk widening of `n` little-endian 16-bit values at `in` (any alignment) into `out`, as
// the scalar functions above would, vectorised: a shard widens every 16-bit push before
// its update. Half NaNs stay NaNs (F16C may set their quiet bit); every other value is
// bit-identical to HalfToFloat's. half.cc.
void Bf16ToFloatN(const uint8_t* in, size_t n, float* out);
void HalfToFloatN(const uint8_t* in, size_t n, float* out);
// And the other way, into `n` little-endian 16-bit values at `out` (any alignment), as
// FloatToBf16 / FloatToHalf round them; NaNs stay NaNs.
void FloatToBf16N(const float* in, size_t n, uint8_t* out);
void FloatToHalfN(const float* in, size_t n, uint8_t* out);

}  // namespace leash
