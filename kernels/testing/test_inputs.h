// Shared by the tests of the kernels (CPU and CUDA) and of the models built on them:
// seeded random inputs, central-difference gradients, and the CPU and CUDA-against-CPU
// fixtures that the inputs run through. Test code only; single-threaded.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "leash/kernels/kernels.h"

namespace leash::kernels {

// n values drawn uniformly from [lo, hi) by `rng`.
inline std::vector<float> RandomVector(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// n values drawn uniformly from [lo, hi) by a generator seeded with `seed`.
inline std::vector<float> RandomVector(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  return RandomVector(n, rng, lo, hi);
}

// n labels drawn uniformly from [0, classes) by `rng`.
inline std::vector<int32_t> RandomLabels(size_t n, int64_t classes, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(classes - 1));
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(rng);
  return v;
}

// n labels drawn uniformly from [0, classes) by a generator seeded with `seed`.
inline std::vector<int32_t> RandomLabels(size_t n, int64_t classes, uint32_t seed) {
  std::mt19937 rng(seed);
  return RandomLabels(n, classes, rng);
}

inline std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Reference mean softmax cross-entropy of `rows` rows of `classes` logits, in double.
inline double RefSoftmaxLoss(int64_t rows, int64_t classes, const std::vector<double>& x,
                             const std::vector<int32_t>& labels) {
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double max = x[r * classes];
    for (int64_t c = 1; c < classes; ++c) max = std::max(max, x[r * classes + c]);
    double sum = 0.0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(x[r * classes + c] - max);
    total += max + std::log(sum) - x[r * classes + labels[r]];
  }
  return total / static_cast<double>(rows);
}

// Central-difference gradient of f at x.
inline std::vector<double> NumericGradient(
    const std::function<double(const std::vector<double>&)>& f, std::vector<double> x, double eps) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double up = f(x);
    x[i] = saved - eps;
    const double down = f(x);
    x[i] = saved;
    g[i] = (up - down) / (2 * eps);
  }
  return g;
}

// A float analytic gradient against a double numeric one: loose enough for fp32 rounding,
// far too tight for a wrong scale, sign, transpose or missing term.
inline void ExpectGradientsMatch(const std::vector<float>& analytic,
                                 const std::vector<double>& numeric, const char* what) {
  ASSERT_EQ(analytic.size(), numeric.size());
  for (size_t i = 0; i < analytic.size(); ++i) {
    EXPECT_NEAR(analytic[i], numeric[i], 1e-4 + 1e-3 * std::abs(numeric[i]))
        << what << " element " << i;
  }
}

// Each element of `got` within atol + rtol * |want| of `want`'s (the first one that is not
// fails the test).
inline void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float rtol,
                        float atol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << what << " element " << i;
  }
}

// "n=... c_in=... h=... w=... c_out=... k=... pad=...", for a trace.
inline std::string ShapeName(const Conv2dShape& s) {
  return "n=" + std::to_string(s.n) + " c_in=" + std::to_string(s.c_in) +
         " h=" + std::to_string(s.h) + " w=" + std::to_string(s.w) +
         " c_out=" + std::to_string(s.c_out) + " k=" + std::to_string(s.k) +
         " pad=" + std::to_string(s.pad);
}

// A CPU context, or nullptr (and a failed expectation) when it cannot be made.
inline std::unique_ptr<Context> MakeCpuContext() {
  auto ctx = Context::Create(Device{DeviceType::kCpu, 0});
  EXPECT_TRUE(ctx.ok()) << ctx.status();
  return ctx.ok() ? std::move(ctx).value() : nullptr;
}

// Tests on a CPU context.
class CpuContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = MakeCpuContext();
    ASSERT_NE(ctx_, nullptr);
  }
  Context& ctx() { return *ctx_; }

  std::unique_ptr<Context> ctx_;
};

// Tests that run the same inputs on the first GPU and on the CPU; every test skips where
// no GPU is usable.
class CudaAgainstCpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaBuilt() || CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device: this test needs a GPU";
    }
    auto gpu = Context::Create(Device{DeviceType::kCuda, 0});
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(gpu).value();
    cpu_ = MakeCpuContext();
    ASSERT_NE(cpu_, nullptr);
  }

  Context& gpu() { return *gpu_; }
  Context& cpu() { return *cpu_; }

  // `host` copied into a new array on the GPU (an empty one, and a failed expectation, when
  // that fails).
  template <typename T>
  DeviceArray<T> Upload(const std::vector<T>& host) {
    auto a = DeviceArray<T>::Allocate(gpu(), host.size());
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return DeviceArray<T>();
    EXPECT_TRUE(a->CopyFromHost(gpu(), host.data(), host.size()).ok());
    return std::move(a).value();
  }

  // The array's elements copied back to the host.
  template <typename T>
  std::vector<T> Download(const DeviceArray<T>& a) {
    std::vector<T> host(a.size());
    Status s = a.CopyToHost(gpu(), host.data(), host.size());
    EXPECT_TRUE(s.ok()) << s;
    return host;
  }

  std::unique_ptr<Context> gpu_;
  std::unique_ptr<Context> cpu_;
};

}  // namespace leash::kernels
