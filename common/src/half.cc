// Vectorised float32 <-> 16-bit conversion in bulk (half.h). x86-64: SSE2 (always there)
// for bfloat16, F16C when the CPU has it for float16; the scalar functions elsewhere.
#include "leash/common/half.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace leash {

namespace {

// The scalar loops: the vector loops' tails, and everything where those do not run.
template <float (*Widen)(uint16_t)>
void WidenScalar(const uint8_t* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = Widen(h);
  }
}

template <uint16_t (*Narrow)(float)>
void NarrowScalar(const float* in, size_t n, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = Narrow(in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void HalfToFloatF16c(const uint8_t* in, size_t n, float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  WidenScalar<HalfToFloat>(in + 2 * i, n - i, out + i);
}

__attribute__((target("avx,f16c"))) void FloatToHalfF16c(const float* in, size_t n, uint8_t* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  NarrowScalar<FloatToHalf>(in + i, n - i, out + 2 * i);
}

// CPUID leaf 1: F16C, AVX and OSXSAVE; XGETBV: the OS saves the YMM registers. (Asked
// directly: clang's __builtin_cpu_supports knows no "f16c".)
bool HasF16c() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
    const unsigned need = (1u << 27) | (1u << 28) | (1u << 29);  // OSXSAVE, AVX, F16C
    if ((c & need) != need) return false;
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u;  // XMM and YMM state
  }();
  return has;
}
#endif

}  // namespace

void Bf16ToFloatN(const uint8_t* in, size_t n, float* out) {
  size_t i = 0;
#if defined(__x86_64__)
  // Interleaving a zero below each 16-bit value makes the 32-bit value << 16: bf16's bits
  // are a float32's top half.
  const __m128i zero = _mm_setzero_si128();
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_unpacklo_epi16(zero, h));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 4), _mm_unpackhi_epi16(zero, h));
  }
#endif
  WidenScalar<Bf16ToFloat>(in + 2 * i, n - i, out + i);
}

void FloatToBf16N(const float* in, size_t n, uint8_t* out) {
  size_t i = 0;
#if defined(__x86_64__)
  // FloatToBf16 four lanes at a time: x + 0x7fff + (bit 16 of x), top half; a NaN keeps
  // its top half with the quiet bit set. The shift is arithmetic so that the signed
  // saturating pack keeps the 16 bits as they are.
  const __m128i one = _mm_set1_epi32(1), round = _mm_set1_epi32(0x7fff);
  const __m128i exp_mask = _mm_set1_epi32(0x7f800000), abs_mask = _mm_set1_epi32(0x7fffffff);
  const __m128i quiet = _mm_set1_epi32(0x400000);
  auto four = [&](const float* p) {
    const __m128i x = _mm_castps_si128(_mm_loadu_ps(p));
    const __m128i rounded =
        _mm_add_epi32(x, _mm_add_epi32(round, _mm_and_si128(_mm_srli_epi32(x, 16), one)));
    // NaN: |x| > 0x7f800000 (signed compare is right: |x| < 2^31).
    const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(x, abs_mask), exp_mask);
    const __m128i v =
        _mm_or_si128(_mm_and_si128(nan, _mm_or_si128(x, quiet)), _mm_andnot_si128(nan, rounded));
    return _mm_srai_epi32(v, 16);
  };
  for (; i + 8 <= n; i += 8) {
    const __m128i packed = _mm_packs_epi32(four(in + i), four(in + i + 4));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), packed);
  }
#endif
  NarrowScalar<FloatToBf16>(in + i, n - i, out + 2 * i);
}

void FloatToHalfN(const float* in, size_t n, uint8_t* out) {
#if defined(__x86_64__)
  if (HasF16c()) return FloatToHalfF16c(in, n, out);
#endif
  NarrowScalar<FloatToHalf>(in, n, out);
}

void HalfToFloatN(const uint8_t* in, size_t n, float* out) {
#if defined(__x86_64__)
  if (HasF16c()) return HalfToFloatF16c(in, n, out);
#endif
  WidenScalar<HalfToFloat>(in, n, out);
}

}  // namespace leash
