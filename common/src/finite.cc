// AllFinite (finite.h). A float is NaN or Inf exactly when its exponent bits are all ones,
// so the check is integer work: AND with the exponent mask, compare with it, OR the
// outcomes; one branch per block, none per value.
#include "leash/common/finite.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace leash {
namespace {

constexpr uint32_t kExp = 0x7f800000u;

// Copies, then tests the whole floats of the copy (a tail of a vector loop: short).
bool CopyAllFiniteScalar(uint8_t* d, const uint8_t* s, size_t bytes) {
  if (bytes > 0) std::memcpy(d, s, bytes);
  uint32_t bad = 0;
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    uint32_t b;
    std::memcpy(&b, d + i, sizeof b);
    bad |= static_cast<uint32_t>((b & kExp) == kExp);
  }
  return bad == 0;
}

#if defined(__x86_64__)
// 32 floats per iteration in four independent accumulators.
bool AllFiniteSse2(const float* p, size_t n) {
  const __m128i mask = _mm_set1_epi32(static_cast<int>(kExp));
  __m128i bad0 = _mm_setzero_si128(), bad1 = bad0, bad2 = bad0, bad3 = bad0;
  size_t i = 0;
  auto test = [&](size_t at) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + at));
    return _mm_cmpeq_epi32(_mm_and_si128(v, mask), mask);
  };
  for (; i + 16 <= n; i += 16) {
    bad0 = _mm_or_si128(bad0, test(i));
    bad1 = _mm_or_si128(bad1, test(i + 4));
    bad2 = _mm_or_si128(bad2, test(i + 8));
    bad3 = _mm_or_si128(bad3, test(i + 12));
  }
  for (; i + 4 <= n; i += 4) bad0 = _mm_or_si128(bad0, test(i));
  const __m128i bad = _mm_or_si128(_mm_or_si128(bad0, bad1), _mm_or_si128(bad2, bad3));
  return _mm_movemask_epi8(bad) == 0 && AllFiniteScalar(p + i, n - i);
}

__attribute__((target("avx2"))) bool AllFiniteAvx2(const float* p, size_t n) {
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(kExp));
  __m256i bad0 = _mm256_setzero_si256(), bad1 = bad0, bad2 = bad0, bad3 = bad0;
  size_t i = 0;
#define LEASH_TEST8(at)                                                                       \
  _mm256_cmpeq_epi32(                                                                         \
      _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + (at))), mask), \
      mask)
  for (; i + 32 <= n; i += 32) {
    bad0 = _mm256_or_si256(bad0, LEASH_TEST8(i));
    bad1 = _mm256_or_si256(bad1, LEASH_TEST8(i + 8));
    bad2 = _mm256_or_si256(bad2, LEASH_TEST8(i + 16));
    bad3 = _mm256_or_si256(bad3, LEASH_TEST8(i + 24));
  }
  for (; i + 8 <= n; i += 8) bad0 = _mm256_or_si256(bad0, LEASH_TEST8(i));
#undef LEASH_TEST8
  const __m256i bad = _mm256_or_si256(_mm256_or_si256(bad0, bad1), _mm256_or_si256(bad2, bad3));
  return _mm256_testz_si256(bad, bad) != 0 && AllFiniteScalar(p + i, n - i);
}

// The copies: 64 bytes (SSE2) or 128 bytes (AVX2) per iteration, loaded once, stored and
// tested; the tail (under a block, or bytes past the last whole float) by CopyAllFiniteScalar.
bool CopyAllFiniteSse2(uint8_t* d, const uint8_t* s, size_t bytes) {
  const __m128i mask = _mm_set1_epi32(static_cast<int>(kExp));
  __m128i bad0 = _mm_setzero_si128(), bad1 = bad0, bad2 = bad0, bad3 = bad0;
  size_t i = 0;
  auto step = [&](size_t at, __m128i& bad) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + at));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + at), v);
    bad = _mm_or_si128(bad, _mm_cmpeq_epi32(_mm_and_si128(v, mask), mask));
  };
  for (; i + 64 <= bytes; i += 64) {
    step(i, bad0);
    step(i + 16, bad1);
    step(i + 32, bad2);
    step(i + 48, bad3);
  }
  const __m128i bad = _mm_or_si128(_mm_or_si128(bad0, bad1), _mm_or_si128(bad2, bad3));
  const bool tail = CopyAllFiniteScalar(d + i, s + i, bytes - i);
  return _mm_movemask_epi8(bad) == 0 && tail;
}

__attribute__((target("avx2"))) bool CopyAllFiniteAvx2(uint8_t* d, const uint8_t* s, size_t bytes) {
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(kExp));
  __m256i bad0 = _mm256_setzero_si256(), bad1 = bad0, bad2 = bad0, bad3 = bad0;
  size_t i = 0;
#define LEASH_STEP32(at, bad)                                                         \
  do {                                                                                \
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + (at))); \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + (at)), v);                     \
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(v, mask), mask));  \
  } while (0)
  for (; i + 128 <= bytes; i += 128) {
    LEASH_STEP32(i, bad0);
    LEASH_STEP32(i + 32, bad1);
    LEASH_STEP32(i + 64, bad2);
    LEASH_STEP32(i + 96, bad3);
  }
#undef LEASH_STEP32
  const __m256i bad = _mm256_or_si256(_mm256_or_si256(bad0, bad1), _mm256_or_si256(bad2, bad3));
  const bool tail = CopyAllFiniteScalar(d + i, s + i, bytes - i);
  return _mm256_testz_si256(bad, bad) != 0 && tail;
}

// AVX2 in the CPU (CPUID leaf 7) and YMM state saved by the OS (OSXSAVE, then XGETBV).
bool HasAvx2() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
    const unsigned need = (1u << 27) | (1u << 28);  // OSXSAVE, AVX
    if ((c & need) != need) return false;
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6u) != 6u) return false;  // XMM and YMM state
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    return (b & (1u << 5)) != 0;  // AVX2
  }();
  return has;
}
#endif

}  // namespace

bool AllFiniteScalar(const float* p, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, p + i, sizeof b);
    bad |= static_cast<uint32_t>((b & kExp) == kExp);
  }
  return bad == 0;
}

bool CopyAllFinite(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  bool finite;
#if defined(__x86_64__)
  finite = HasAvx2() ? CopyAllFiniteAvx2(d, s, bytes) : CopyAllFiniteSse2(d, s, bytes);
#else
  finite = CopyAllFiniteScalar(d, s, bytes);
#endif
  return finite && bytes % 4 == 0;
}

bool AllFinite(const float* p, size_t n) {
#if defined(__x86_64__)
  if (HasAvx2()) return AllFiniteAvx2(p, n);
  return AllFiniteSse2(p, n);
#else
  return AllFiniteScalar(p, n);
#endif
}

}  // namespace leash
