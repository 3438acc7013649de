// Benchmark (not a test) of the 16-bit wires' conversions on a shard: widening a 16-bit
// push to float32 before its update, and narrowing a pull reply. half.h's bulk functions
// (what DecodeValues and EncodeValues use) against the per-value scalar functions,
// interleaved round by round in one process. Also the shard's NaN/Inf check of a pushed
// gradient (finite.h's AllFinite against the loop the shard ran before it, kept here as
// the reference). Prints JSON. Usage:
//   leash-bench-decode16 [--values N] [--rounds R]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "leash/common/finite.h"
#include "leash/common/flags.h"
#include "leash/common/half.h"

namespace {

using Clock = std::chrono::steady_clock;

// The shard's check before finite.h: integer tests in blocks of 16 that the compiler
// vectorizes at -O2.
bool BlockLoopAllFinite(const float* p, size_t n) {
  constexpr uint32_t kExp = 0x7f800000u;
  uint32_t bad = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint32_t b[16];
    std::memcpy(b, p + i, sizeof b);
    for (int j = 0; j < 16; ++j) bad |= static_cast<uint32_t>((b[j] & kExp) == kExp);
  }
  for (; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, p + i, sizeof b);
    bad |= static_cast<uint32_t>((b & kExp) == kExp);
  }
  return bad == 0;
}

volatile bool g_sink;

// Median ns per value over 21 calls of `fn`.
double Time(const std::function<void()>& fn, size_t values) {
  std::vector<double> ns;
  for (int r = 0; r < 21; ++r) {
    const auto t0 = Clock::now();
    fn();
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
  }
  std::nth_element(ns.begin(), ns.begin() + 10, ns.end());
  return ns[10] / static_cast<double>(values);
}

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

template <typename F>
void Scalar16To32(const std::vector<uint8_t>& in, std::vector<float>& out, F f) {
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, in.data() + 2 * i, 2);
    out[i] = f(h);
  }
}

template <typename F>
void Scalar32To16(const std::vector<float>& in, std::vector<uint8_t>& out, F f) {
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t h = f(in[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t values_flag = 234000;  // about the MLP's parameters
  int64_t rounds_flag = 5;
  leash::Flags flags("leash-bench-decode16",
                     "16-bit conversions and the NaN/Inf check, bulk against scalar, "
                     "interleaved (JSON on stdout)");
  flags.Int("values", &values_flag, "values per conversion");
  flags.Int("rounds", &rounds_flag, "rounds, each timing every variant");
  if (auto code = flags.ParseOrExitCode(argc, argv)) return *code;
  if (values_flag <= 0 || rounds_flag <= 0 || rounds_flag > 1000000) {
    std::fprintf(stderr, "--values and --rounds must be positive (--rounds at most 1000000)\n");
    return 2;
  }
  const auto values = static_cast<size_t>(values_flag);
  const auto rounds = static_cast<int>(rounds_flag);
  // Gradient-like values: small normal floats, and as a worker would send them narrowed.
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.01f);
  std::vector<float> floats(values), wide(values);
  std::vector<uint8_t> half(2 * values), bf16(2 * values), narrow(2 * values);
  for (size_t i = 0; i < values; ++i) floats[i] = dist(rng);
  leash::FloatToHalfN(floats.data(), values, half.data());
  leash::FloatToBf16N(floats.data(), values, bf16.data());
  struct Row {
    const char* name;
    std::function<void()> scalar, bulk;
  };
  const Row rows[] = {
      {"widen fp16", [&] { Scalar16To32(half, wide, leash::HalfToFloat); },
       [&] { leash::HalfToFloatN(half.data(), values, wide.data()); }},
      {"widen bf16", [&] { Scalar16To32(bf16, wide, leash::Bf16ToFloat); },
       [&] { leash::Bf16ToFloatN(bf16.data(), values, wide.data()); }},
      {"narrow fp16", [&] { Scalar32To16(floats, narrow, leash::FloatToHalf); },
       [&] { leash::FloatToHalfN(floats.data(), values, narrow.data()); }},
      {"narrow bf16", [&] { Scalar32To16(floats, narrow, leash::FloatToBf16); },
       [&] { leash::FloatToBf16N(floats.data(), values, narrow.data()); }},
      {"finite check", [&] { g_sink = BlockLoopAllFinite(floats.data(), values); },
       [&] { g_sink = leash::AllFinite(floats.data(), values); }},
  };
  std::printf("{\"values\": %zu, \"rounds\": %d, \"rows\": [", values, rounds);
  bool first = true;
  for (const Row& row : rows) {
    std::vector<double> scalar, bulk;
    for (int k = 0; k < rounds; ++k) {  // interleaved, the order alternating
      if (k % 2 == 0) scalar.push_back(Time(row.scalar, values));
      bulk.push_back(Time(row.bulk, values));
      if (k % 2 == 1) scalar.push_back(Time(row.scalar, values));
    }
    std::printf("%s\n  {\"conversion\": \"%s\", \"scalar_ns_per_value\": [", first ? "" : ",",
                row.name);
    first = false;
    for (size_t k = 0; k < scalar.size(); ++k) std::printf("%s%.3f", k ? ", " : "", scalar[k]);
    std::printf("], \"bulk_ns_per_value\": [");
    for (size_t k = 0; k < bulk.size(); ++k) std::printf("%s%.3f", k ? ", " : "", bulk[k]);
    const double s = Median(scalar), b = Median(bulk);
    std::printf("], \"scalar_us_per_push\": %.1f, \"bulk_us_per_push\": %.1f, \"speedup\": %.1f}",
                s * static_cast<double>(values) / 1000, b * static_cast<double>(values) / 1000,
                s / b);
  }
  std::printf("\n]}\n");
  return 0;
}
