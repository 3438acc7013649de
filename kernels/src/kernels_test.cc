// Tests of the CPU kernels through the entry points of kernels.h: every op against a plain
// double-precision reference loop, numerical gradients, optimizers against hand-computed
// values, argument validation, devices and buffers, fp16/bf16 conversion. Single-threaded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "leash/common/half.h"
#include "leash/kernels/cpu.h"
#include "leash/kernels/kernels.h"
#include "test_inputs.h"

namespace leash::kernels {
namespace {

// op(X)[i][j] of a row-major matrix whose op is rows x cols.
double OpAt(const std::vector<double>& x, Transpose t, int64_t rows, int64_t cols, int64_t i,
            int64_t j) {
  return t == Transpose::kNo ? x[i * cols + j] : x[j * rows + i];
}

// Reference C = op(A) op(B) in double.
std::vector<double> RefProduct(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k,
                               const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) s += OpAt(a, ta, m, k, i, p) * OpAt(b, tb, k, n, p, j);
      c[i * n + j] = s;
    }
  }
  return c;
}

using CpuKernelsTest = CpuContextTest;
using KernelsGradientTest = CpuKernelsTest;
using KernelsOptimizerTest = CpuKernelsTest;
using KernelsValidationTest = CpuKernelsTest;
using KernelsDeviceTest = CpuKernelsTest;
using KernelsHalfTest = CpuKernelsTest;

// ---------------------------------------------------------------- ops vs reference

TEST_F(KernelsDeviceTest, CpuCopyStreamCopiesAtOnceAndPinnedMemoryIsPlain) {
  auto pinned = PinnedHostBuffer::Allocate(ctx(), 64 * sizeof(float));
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(pinned->bytes(), 64 * sizeof(float));
  auto* src = static_cast<float*>(pinned->data());
  for (int i = 0; i < 64; ++i) src[i] = static_cast<float>(i);
  auto copies = CopyStream::Create(ctx());
  ASSERT_TRUE(copies.ok()) << copies.status();
  auto dst = Buffer::Allocate(ctx(), 64);
  ASSERT_TRUE(dst.ok());
  ASSERT_TRUE((*copies)->CopyToDevice(dst->data(), src, 64 * sizeof(float)).ok());
  ASSERT_TRUE((*copies)->ContextWaitsForCopies().ok());
  ASSERT_TRUE((*copies)->CopiesWaitForContext().ok());
  ASSERT_TRUE((*copies)->Synchronize().ok());
  EXPECT_EQ(std::vector<float>(dst->data(), dst->data() + 64), std::vector<float>(src, src + 64));
  EXPECT_EQ((*copies)->CopyToDevice(dst->data(), nullptr, 4).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*copies)->CopyToDevice(nullptr, nullptr, 0).ok());
  PinnedHostBuffer moved = std::move(pinned).value();
  EXPECT_EQ(moved.bytes(), 64 * sizeof(float));
}

TEST_F(CpuKernelsTest, GemmMatchesReferenceForEveryTransposeAndOddSizes) {
  struct Shape {
    int64_t m, n, k;
  };
  uint32_t seed = 1;
  for (Shape s :
       {Shape{1, 1, 1}, Shape{7, 13, 5}, Shape{33, 17, 65}, Shape{64, 10, 129}, Shape{3, 257, 2}}) {
    for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
      for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
        const auto a = RandomVector(s.m * s.k, seed++);
        const auto b = RandomVector(s.k * s.n, seed++);
        auto c = RandomVector(s.m * s.n, seed++);
        const float alpha = 0.7f, beta = -0.3f;
        const auto ab = RefProduct(ta, tb, s.m, s.n, s.k, ToDouble(a), ToDouble(b));
        const auto abs_ab = RefProduct(
            ta, tb, s.m, s.n, s.k,
            [&] {
              auto v = ToDouble(a);
              for (double& x : v) x = std::abs(x);
              return v;
            }(),
            [&] {
              auto v = ToDouble(b);
              for (double& x : v) x = std::abs(x);
              return v;
            }());
        std::vector<double> want(c.size());
        for (size_t i = 0; i < c.size(); ++i)
          want[i] = alpha * ab[i] + beta * static_cast<double>(c[i]);
        ASSERT_TRUE(
            Gemm(ctx(), ta, tb, s.m, s.n, s.k, alpha, a.data(), b.data(), beta, c.data()).ok());
        for (size_t i = 0; i < c.size(); ++i) {
          ASSERT_NEAR(c[i], want[i], 1e-6 * (1 + abs_ab[i]) * 4)
              << "m=" << s.m << " n=" << s.n << " k=" << s.k << " ta=" << (ta == Transpose::kYes)
              << " tb=" << (tb == Transpose::kYes) << " i=" << i;
        }
      }
    }
  }
}

TEST_F(CpuKernelsTest, GemmWithBetaZeroDoesNotReadC) {
  const int64_t m = 5, n = 3, k = 4;
  const auto a = RandomVector(m * k, 11);
  const auto b = RandomVector(k * n, 12);
  std::vector<float> c(m * n, std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE(
      Gemm(ctx(), Transpose::kNo, Transpose::kNo, m, n, k, 1.f, a.data(), b.data(), 0.f, c.data())
          .ok());
  const auto want = RefProduct(Transpose::kNo, Transpose::kNo, m, n, k, ToDouble(a), ToDouble(b));
  for (size_t i = 0; i < c.size(); ++i) EXPECT_NEAR(c[i], want[i], 1e-5) << i;
}

TEST_F(CpuKernelsTest, GemmWithZeroInnerSizeScalesC) {
  std::vector<float> c = {1.f, -2.f, 3.f, 4.f, 5.f, 6.f};
  ASSERT_TRUE(
      Gemm(ctx(), Transpose::kNo, Transpose::kNo, 2, 3, 0, 1.f, nullptr, nullptr, 0.5f, c.data())
          .ok());
  EXPECT_EQ(c, (std::vector<float>{0.5f, -1.f, 1.5f, 2.f, 2.5f, 3.f}));
  c.assign(6, std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE(
      Gemm(ctx(), Transpose::kNo, Transpose::kNo, 2, 3, 0, 1.f, nullptr, nullptr, 0.f, c.data())
          .ok());
  EXPECT_EQ(c, std::vector<float>(6, 0.f));
  // Empty outputs touch nothing.
  EXPECT_TRUE(
      Gemm(ctx(), Transpose::kNo, Transpose::kNo, 0, 3, 4, 1.f, nullptr, nullptr, 0.f, nullptr)
          .ok());
}

TEST_F(CpuKernelsTest, BiasAddMatchesReference) {
  const int64_t rows = 7, cols = 13;
  auto y = RandomVector(rows * cols, 21);
  const auto bias = RandomVector(cols, 22);
  auto want = y;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) want[r * cols + c] += bias[c];
  }
  ASSERT_TRUE(BiasAdd(ctx(), rows, cols, bias.data(), y.data()).ok());
  EXPECT_EQ(y, want);
}

TEST_F(CpuKernelsTest, BiasGradOverwritesWithColumnSums) {
  const int64_t rows = 9, cols = 11;
  const auto dy = RandomVector(rows * cols, 23);
  std::vector<float> db(cols, 123.f);  // stale values must not leak in
  ASSERT_TRUE(BiasGrad(ctx(), rows, cols, dy.data(), db.data()).ok());
  for (int64_t c = 0; c < cols; ++c) {
    double want = 0;
    for (int64_t r = 0; r < rows; ++r) want += dy[r * cols + c];
    EXPECT_NEAR(db[c], want, 1e-5) << c;
  }
}

TEST_F(CpuKernelsTest, ReluAndBackwardMatchReferenceInPlace) {
  const int64_t n = 37;
  auto x = RandomVector(n, 24);
  x[3] = 0.f;
  x[4] = -0.f;
  const auto x0 = x;
  ASSERT_TRUE(Relu(ctx(), n, x.data(), x.data()).ok());  // in place
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(x[i], x0[i] > 0 ? x0[i] : 0.f) << i;

  auto dy = RandomVector(n, 25);
  const auto dy0 = dy;
  ASSERT_TRUE(ReluBackward(ctx(), n, x.data(), dy.data(), dy.data()).ok());  // dx aliases dy
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(dy[i], x0[i] > 0 ? dy0[i] : 0.f) << i;
}

TEST_F(CpuKernelsTest, SoftmaxCrossEntropyMatchesReference) {
  const int64_t rows = 9, classes = 11;
  const auto logits = RandomVector(rows * classes, 26, -5.f, 5.f);
  const auto labels = RandomLabels(rows, classes, 27);
  std::vector<float> dlogits(rows * classes);
  float loss = -1.f;
  int64_t correct = -1;
  ASSERT_TRUE(SoftmaxCrossEntropy(ctx(), rows, classes, logits.data(), labels.data(),
                                  dlogits.data(), &loss, &correct)
                  .ok());
  const auto x = ToDouble(logits);
  EXPECT_NEAR(loss, RefSoftmaxLoss(rows, classes, x, labels), 1e-5);
  int64_t want_correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double max = x[r * classes];
    int64_t argmax = 0;
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) {
      if (x[r * classes + c] > max) {
        max = x[r * classes + c];
        argmax = c;
      }
    }
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(x[r * classes + c] - max);
    for (int64_t c = 0; c < classes; ++c) {
      const double want =
          (std::exp(x[r * classes + c] - max) / sum - (c == labels[r] ? 1 : 0)) / rows;
      EXPECT_NEAR(dlogits[r * classes + c], want, 1e-6) << r << "," << c;
    }
    if (argmax == labels[r]) ++want_correct;
  }
  EXPECT_EQ(correct, want_correct);
}

TEST_F(CpuKernelsTest, SoftmaxCrossEntropyIsStableForHugeLogits) {
  // exp(1e4) overflows; the log-sum-exp form must not care about a common offset.
  const int64_t rows = 3, classes = 4;
  const auto base = RandomVector(rows * classes, 28, -2.f, 2.f);
  const std::vector<int32_t> labels = {0, 3, 1};
  float base_loss = 0.f;
  ASSERT_TRUE(SoftmaxCrossEntropy(ctx(), rows, classes, base.data(), labels.data(), nullptr,
                                  &base_loss, nullptr)
                  .ok());
  for (float offset : {1e4f, -1e4f}) {
    auto shifted = base;
    for (float& v : shifted) v += offset;
    std::vector<float> d(rows * classes);
    float loss = 0.f;
    ASSERT_TRUE(SoftmaxCrossEntropy(ctx(), rows, classes, shifted.data(), labels.data(), d.data(),
                                    &loss, nullptr)
                    .ok());
    EXPECT_TRUE(std::isfinite(loss));
    EXPECT_NEAR(loss, base_loss, 2e-3) << offset;  // the offset itself costs fp32 precision
    for (float v : d) EXPECT_TRUE(std::isfinite(v));
  }
}

TEST_F(CpuKernelsTest, SoftmaxArgmaxTakesTheFirstOfTiedLogits) {
  const std::vector<float> logits = {1.f, 1.f, 1.f, 2.f, 5.f, 5.f};
  const std::vector<int32_t> labels = {0, 2};
  int64_t correct = -1;
  float loss = 0.f;
  ASSERT_TRUE(
      SoftmaxCrossEntropy(ctx(), 2, 3, logits.data(), labels.data(), nullptr, &loss, &correct)
          .ok());
  EXPECT_EQ(correct, 1);  // row 0 ties -> class 0 (right); row 1 ties 1 and 2 -> class 1 (wrong)
  EXPECT_NEAR(loss, (std::log(3.0) + (5 + std::log(std::exp(-3.0) + 2.0) - 5)) / 2, 1e-6);
}

TEST_F(CpuKernelsTest, SoftmaxOfNoRowsIsZero) {
  float loss = -1.f;
  int64_t correct = -1;
  ASSERT_TRUE(SoftmaxCrossEntropy(ctx(), 0, 5, nullptr, nullptr, nullptr, &loss, &correct).ok());
  EXPECT_EQ(loss, 0.f);
  EXPECT_EQ(correct, 0);
}

// ---------------------------------------------------------------- numerical gradients

// Gradient of L = sum(G .* (op(A) op(B))) through the kernels' own products, which is how
// the models backpropagate, against central differences of a double reference.
TEST_F(KernelsGradientTest, GemmGradientsMatchNumericalForEveryTranspose) {
  const int64_t m = 4, n = 3, k = 5;
  uint32_t seed = 100;
  for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
    for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
      SCOPED_TRACE(testing::Message()
                   << "ta=" << (ta == Transpose::kYes) << " tb=" << (tb == Transpose::kYes));
      const auto a = RandomVector(m * k, seed++);
      const auto b = RandomVector(k * n, seed++);
      const auto g = RandomVector(m * n, seed++);
      auto loss = [&](const std::vector<double>& av, const std::vector<double>& bv) {
        const auto c = RefProduct(ta, tb, m, n, k, av, bv);
        double s = 0;
        for (size_t i = 0; i < c.size(); ++i) s += g[i] * c[i];
        return s;
      };
      const bool at = ta == Transpose::kYes, bt = tb == Transpose::kYes;
      const auto N = Transpose::kNo, T = Transpose::kYes;
      // d op(A) = G op(B)^T  and  d op(B) = op(A)^T G, laid out as A and B are stored.
      std::vector<float> da(m * k), db(k * n);
      if (!at) {
        ASSERT_TRUE(
            Gemm(ctx(), N, bt ? N : T, m, k, n, 1.f, g.data(), b.data(), 0.f, da.data()).ok());
      } else {
        ASSERT_TRUE(
            Gemm(ctx(), bt ? T : N, T, k, m, n, 1.f, b.data(), g.data(), 0.f, da.data()).ok());
      }
      if (!bt) {
        ASSERT_TRUE(
            Gemm(ctx(), at ? N : T, N, k, n, m, 1.f, a.data(), g.data(), 0.f, db.data()).ok());
      } else {
        ASSERT_TRUE(
            Gemm(ctx(), T, at ? T : N, n, k, m, 1.f, g.data(), a.data(), 0.f, db.data()).ok());
      }
      const auto bd = ToDouble(b);
      const auto ad = ToDouble(a);
      ExpectGradientsMatch(
          da, NumericGradient([&](const std::vector<double>& x) { return loss(x, bd); }, ad, 1e-3),
          "dA");
      ExpectGradientsMatch(
          db, NumericGradient([&](const std::vector<double>& x) { return loss(ad, x); }, bd, 1e-3),
          "dB");
    }
  }
}

TEST_F(KernelsGradientTest, BiasGradMatchesNumerical) {
  const int64_t rows = 5, cols = 7;
  const auto y = RandomVector(rows * cols, 110);
  const auto g = RandomVector(rows * cols, 111);
  const auto bias = RandomVector(cols, 112);
  auto loss = [&](const std::vector<double>& b) {
    double s = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) s += g[r * cols + c] * (y[r * cols + c] + b[c]);
    }
    return s;
  };
  std::vector<float> db(cols);
  ASSERT_TRUE(BiasGrad(ctx(), rows, cols, g.data(), db.data()).ok());
  ExpectGradientsMatch(db, NumericGradient(loss, ToDouble(bias), 1e-3), "db");
}

TEST_F(KernelsGradientTest, ReluBackwardMatchesNumerical) {
  const int64_t n = 41;
  auto x = RandomVector(n, 120);
  for (float& v : x) v += v >= 0 ? 0.05f : -0.05f;  // keep clear of the kink at 0
  const auto g = RandomVector(n, 121);
  auto loss = [&](const std::vector<double>& xv) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += g[i] * std::max(xv[i], 0.0);
    return s;
  };
  std::vector<float> y(n), dx(n);
  ASSERT_TRUE(Relu(ctx(), n, x.data(), y.data()).ok());
  ASSERT_TRUE(ReluBackward(ctx(), n, y.data(), g.data(), dx.data()).ok());
  ExpectGradientsMatch(dx, NumericGradient(loss, ToDouble(x), 1e-3), "dx");
}

TEST_F(KernelsGradientTest, SoftmaxCrossEntropyGradientMatchesNumerical) {
  const int64_t rows = 6, classes = 5;
  const auto logits = RandomVector(rows * classes, 130, -3.f, 3.f);
  const auto labels = RandomLabels(rows, classes, 131);
  std::vector<float> d(rows * classes);
  float loss = 0.f;
  ASSERT_TRUE(SoftmaxCrossEntropy(ctx(), rows, classes, logits.data(), labels.data(), d.data(),
                                  &loss, nullptr)
                  .ok());
  auto f = [&](const std::vector<double>& x) { return RefSoftmaxLoss(rows, classes, x, labels); };
  EXPECT_NEAR(loss, f(ToDouble(logits)), 1e-5);
  ExpectGradientsMatch(d, NumericGradient(f, ToDouble(logits), 1e-4), "dlogits");
}

// ---------------------------------------------------------------- optimizers

// Two parameters w = {1, -2}; gradients {0.5, 0.25}, {-0.2, 1}, {0.3, -0.4} (or zero).
const std::vector<std::vector<float>> kGrads = {{0.5f, 0.25f}, {-0.2f, 1.f}, {0.3f, -0.4f}};

TEST_F(KernelsOptimizerTest, SgdWithWeightDecayMatchesHandComputedSteps) {
  std::vector<float> w = {1.f, -2.f};
  const SgdParams p{0.1f, 0.01f};
  // Step 1: g + wd w = {0.51, 0.23}; w = {1 - 0.051, -2 - 0.023}.
  ASSERT_TRUE(SgdUpdate(ctx(), 2, p, kGrads[0].data(), w.data()).ok());
  EXPECT_NEAR(w[0], 0.949, 1e-6);
  EXPECT_NEAR(w[1], -2.023, 1e-6);
  // Step 2: g + wd w = {-0.2 + 0.00949, 1 - 0.02023} = {-0.19051, 0.97977}.
  ASSERT_TRUE(SgdUpdate(ctx(), 2, p, kGrads[1].data(), w.data()).ok());
  EXPECT_NEAR(w[0], 0.968051, 1e-6);
  EXPECT_NEAR(w[1], -2.120977, 1e-6);
}

TEST_F(KernelsOptimizerTest, MomentumWithWeightDecayMatchesHandComputedSteps) {
  std::vector<float> w = {1.f, -2.f}, v = {0.f, 0.f};
  const MomentumParams p{0.1f, 0.9f, 0.01f};
  const std::vector<float> zero = {0.f, 0.f};
  // Step 1: v = {0.51, 0.23}; w = {0.949, -2.023}.
  ASSERT_TRUE(MomentumUpdate(ctx(), 2, p, kGrads[0].data(), w.data(), v.data()).ok());
  EXPECT_NEAR(v[0], 0.51, 1e-6);
  EXPECT_NEAR(v[1], 0.23, 1e-6);
  EXPECT_NEAR(w[0], 0.949, 1e-6);
  EXPECT_NEAR(w[1], -2.023, 1e-6);
  // Step 2: v = 0.9 * {0.51, 0.23} + {-0.19051, 0.97977} = {0.26849, 1.18677}.
  ASSERT_TRUE(MomentumUpdate(ctx(), 2, p, kGrads[1].data(), w.data(), v.data()).ok());
  EXPECT_NEAR(v[0], 0.26849, 1e-6);
  EXPECT_NEAR(v[1], 1.18677, 1e-6);
  EXPECT_NEAR(w[0], 0.922151, 1e-6);
  EXPECT_NEAR(w[1], -2.141677, 1e-6);
  // Step 3 with a zero gradient still moves: v = 0.9 v + wd w.
  ASSERT_TRUE(MomentumUpdate(ctx(), 2, p, zero.data(), w.data(), v.data()).ok());
  EXPECT_NEAR(v[0], 0.25086251, 1e-6);
  EXPECT_NEAR(v[1], 1.04667623, 1e-6);
  EXPECT_NEAR(w[0], 0.897064749, 1e-6);
  EXPECT_NEAR(w[1], -2.246344623, 1e-6);
}

TEST_F(KernelsOptimizerTest, AdamIsBiasCorrectedFromStepOne) {
  std::vector<float> w = {1.f, -2.f}, m = {0.f, 0.f}, v = {0.f, 0.f};
  const AdamParams p{0.1f, 0.9f, 0.999f, 1e-8f, 0.f};
  // Step 1: m = 0.1 g, v = 0.001 g^2, so the corrected m / sqrt(v) = sign(g): w moves by lr.
  ASSERT_TRUE(AdamUpdate(ctx(), 2, p, 1, kGrads[0].data(), w.data(), m.data(), v.data()).ok());
  EXPECT_NEAR(m[0], 0.05, 1e-7);
  EXPECT_NEAR(m[1], 0.025, 1e-7);
  // 1 - 0.999f is 0.000999987 in fp32, hence the relative tolerance on v.
  EXPECT_NEAR(v[0], 0.00025, 0.00025 * 1e-4);
  EXPECT_NEAR(v[1], 0.0000625, 0.0000625 * 1e-4);
  EXPECT_NEAR(w[0], 0.9, 1e-6);
  EXPECT_NEAR(w[1], -2.1, 1e-6);
  // Step 2: m = {0.025, 0.1225}, v = {0.00028975, 0.0010624375}, corrections 0.19 and 0.001999:
  // w0 = 0.9 - 0.1 * (0.025 / 0.19) / sqrt(0.00028975 / 0.001999).
  ASSERT_TRUE(AdamUpdate(ctx(), 2, p, 2, kGrads[1].data(), w.data(), m.data(), v.data()).ok());
  EXPECT_NEAR(m[0], 0.025, 1e-7);
  EXPECT_NEAR(m[1], 0.1225, 1e-7);
  EXPECT_NEAR(v[0], 0.00028975, 0.00028975 * 1e-4);
  EXPECT_NEAR(v[1], 0.0010624375, 0.0010624375 * 1e-4);
  EXPECT_NEAR(w[0], 0.8654394181, 1e-5);
  EXPECT_NEAR(w[1], -2.1884376438, 1e-5);
  ASSERT_TRUE(AdamUpdate(ctx(), 2, p, 3, kGrads[2].data(), w.data(), m.data(), v.data()).ok());
  EXPECT_NEAR(w[0], 0.8109953837, 1e-5);
  EXPECT_NEAR(w[1], -2.2290441806, 1e-5);
}

TEST_F(KernelsOptimizerTest, AdamWeightDecayIsAddedToTheGradient) {
  std::vector<float> w = {1.f, -2.f}, m = {0.f, 0.f}, v = {0.f, 0.f};
  const AdamParams p{0.1f, 0.9f, 0.999f, 1e-8f, 0.1f};
  // Step 1: g + wd w = {0.6, 0.05}: m = {0.06, 0.005}, still a step of lr.
  ASSERT_TRUE(AdamUpdate(ctx(), 2, p, 1, kGrads[0].data(), w.data(), m.data(), v.data()).ok());
  EXPECT_NEAR(m[0], 0.06, 1e-7);
  EXPECT_NEAR(m[1], 0.005, 1e-7);
  EXPECT_NEAR(w[0], 0.9, 1e-6);
  EXPECT_NEAR(w[1], -2.1, 1e-6);
  ASSERT_TRUE(AdamUpdate(ctx(), 2, p, 2, kGrads[1].data(), w.data(), m.data(), v.data()).ok());
  EXPECT_NEAR(w[0], 0.8475190630, 1e-5);
  EXPECT_NEAR(w[1], -2.1784955116, 1e-5);
}

TEST_F(KernelsOptimizerTest, AdagradWithWeightDecayMatchesHandComputedSteps) {
  std::vector<float> w = {1.f, -2.f}, acc = {0.f, 0.f};
  const AdagradParams p{0.1f, 1e-10f, 0.1f};
  // Step 1: g + wd w = {0.6, 0.05}; acc = {0.36, 0.0025}; w moves by lr * sign.
  ASSERT_TRUE(AdagradUpdate(ctx(), 2, p, kGrads[0].data(), w.data(), acc.data()).ok());
  EXPECT_NEAR(acc[0], 0.36, 1e-7);
  EXPECT_NEAR(acc[1], 0.0025, 1e-8);
  EXPECT_NEAR(w[0], 0.9, 1e-6);
  EXPECT_NEAR(w[1], -2.1, 1e-6);
  // Step 2: g + wd w = {-0.11, 0.79}; acc = {0.3721, 0.6266}.
  ASSERT_TRUE(AdagradUpdate(ctx(), 2, p, kGrads[1].data(), w.data(), acc.data()).ok());
  EXPECT_NEAR(acc[0], 0.3721, 1e-6);
  EXPECT_NEAR(acc[1], 0.6266, 1e-6);
  EXPECT_NEAR(w[0], 0.9180327869, 1e-6);
  EXPECT_NEAR(w[1], -2.1998003111, 1e-6);
  ASSERT_TRUE(AdagradUpdate(ctx(), 2, p, kGrads[2].data(), w.data(), acc.data()).ok());
  EXPECT_NEAR(w[0], 0.8639901744, 1e-6);
  EXPECT_NEAR(w[1], -2.1381397543, 1e-6);
}

TEST_F(KernelsOptimizerTest, RawCpuKernelsAgreeWithEntryPoints) {
  // The parameter server calls cpu:: directly; it must be the same arithmetic.
  const int64_t n = 19;
  const auto g = RandomVector(n, 140);
  auto w1 = RandomVector(n, 141), w2 = w1;
  std::vector<float> m1(n), v1(n), m2(n), v2(n);
  const AdamParams p{0.01f, 0.8f, 0.99f, 1e-6f, 0.05f};
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(AdamUpdate(ctx(), n, p, step, g.data(), w1.data(), m1.data(), v1.data()).ok());
    cpu::AdamUpdate(n, p, step, g.data(), w2.data(), m2.data(), v2.data());
  }
  EXPECT_EQ(w1, w2);
}

// The update loops run vectorized in blocks of 16 with a scalar remainder (cpu_kernels.cc);
// every element must still get exactly the arithmetic of the scalar formula, whichever lane
// or remainder it falls in, so an update split at any offset (update threads, a backup with
// another thread count) is the same bit for bit.
TEST_F(KernelsOptimizerTest, EveryOptimizerIsItsScalarFormulaBitForBitWhereverTheArrayIsSplit) {
  const int64_t n = 83;  // 5 blocks and a remainder of 3
  const AdamParams ap{0.01f, 0.8f, 0.99f, 1e-6f, 0.05f};
  const AdagradParams gp{0.1f, 1e-7f, 0.02f};
  const MomentumParams mp{0.05f, 0.9f, 0.01f};
  const SgdParams sp{0.05f, 0.01f};
  // One step of every optimizer on element i of state {w, a, b}, as the formulas read.
  auto reference = [&](int64_t step, float g, float& w, float& a, float& b) {
    const float c1 = AdamBiasCorrection(ap.beta1, step), c2 = AdamBiasCorrection(ap.beta2, step);
    const float gi = g + ap.weight_decay * w;
    a = ap.beta1 * a + (1.f - ap.beta1) * gi;
    b = ap.beta2 * b + (1.f - ap.beta2) * gi * gi;
    w -= ap.lr * (a / c1) / (std::sqrt(b / c2) + ap.epsilon);
  };
  auto reference_adagrad = [&](float g, float& w, float& acc) {
    const float gi = g + gp.weight_decay * w;
    acc += gi * gi;
    w -= gp.lr * gi / (std::sqrt(acc) + gp.epsilon);
  };
  auto reference_momentum = [&](float g, float& w, float& v) {
    const float gi = g + mp.weight_decay * w;
    v = mp.momentum * v + gi;
    w -= mp.lr * v;
  };
  auto reference_sgd = [&](float g, float& w) { w -= sp.lr * (g + sp.weight_decay * w); };
  const float a = 0.37f;  // Scale and Axpy: a weighted push and a sum of them
  auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  for (int64_t split :
       {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{16}, int64_t{17}, int64_t{70}}) {
    SCOPED_TRACE(testing::Message() << "split at " << split);
    const auto w0 = RandomVector(n, 150, -1.f, 1.f);
    // Per optimizer: the reference state, the whole array's and the split array's.
    std::vector<float> rw = w0, ra(n), rb(n), ww = w0, wa(n), wb(n), sw = w0, sa(n), sb(n);
    std::vector<float> gw = w0, gacc(n), wgw = w0, wgacc(n), sgw = w0, sgacc(n);
    std::vector<float> mw = w0, mv(n), wmw = w0, wmv(n), smw = w0, smv(n);
    std::vector<float> qw = w0, wqw = w0, sqw = w0;
    std::vector<float> rs(n), ws(n), ss(n), ry = w0, wy = w0, sy = w0;
    for (int64_t step = 1; step <= 3; ++step) {
      const auto g = RandomVector(n, 150 + static_cast<uint32_t>(step), -2.f, 2.f);
      for (int64_t i = 0; i < n; ++i) {
        reference(step, g[i], rw[i], ra[i], rb[i]);
        reference_adagrad(g[i], gw[i], gacc[i]);
        reference_momentum(g[i], mw[i], mv[i]);
        reference_sgd(g[i], qw[i]);
        rs[i] = a * g[i];
        ry[i] += a * g[i];
      }
      cpu::AdamUpdate(n, ap, step, g.data(), ww.data(), wa.data(), wb.data());
      cpu::AdagradUpdate(n, gp, g.data(), wgw.data(), wgacc.data());
      cpu::MomentumUpdate(n, mp, g.data(), wmw.data(), wmv.data());
      cpu::SgdUpdate(n, sp, g.data(), wqw.data());
      cpu::Scale(n, a, g.data(), ws.data());
      cpu::Axpy(n, a, g.data(), wy.data());
      for (auto [b, e] : {std::pair{int64_t{0}, split}, std::pair{split, n}}) {
        cpu::AdamUpdate(e - b, ap, step, g.data() + b, sw.data() + b, sa.data() + b, sb.data() + b);
        cpu::AdagradUpdate(e - b, gp, g.data() + b, sgw.data() + b, sgacc.data() + b);
        cpu::MomentumUpdate(e - b, mp, g.data() + b, smw.data() + b, smv.data() + b);
        cpu::SgdUpdate(e - b, sp, g.data() + b, sqw.data() + b);
        cpu::Scale(e - b, a, g.data() + b, ss.data() + b);
        cpu::Axpy(e - b, a, g.data() + b, sy.data() + b);
      }
    }
    EXPECT_TRUE(same_bits(rw, ww) && same_bits(ra, wa) && same_bits(rb, wb)) << "adam, whole";
    EXPECT_TRUE(same_bits(rw, sw) && same_bits(ra, sa) && same_bits(rb, sb)) << "adam, split";
    EXPECT_TRUE(same_bits(gw, wgw) && same_bits(gacc, wgacc)) << "adagrad, whole";
    EXPECT_TRUE(same_bits(gw, sgw) && same_bits(gacc, sgacc)) << "adagrad, split";
    EXPECT_TRUE(same_bits(mw, wmw) && same_bits(mv, wmv)) << "momentum, whole";
    EXPECT_TRUE(same_bits(mw, smw) && same_bits(mv, smv)) << "momentum, split";
    EXPECT_TRUE(same_bits(qw, wqw)) << "sgd, whole";
    EXPECT_TRUE(same_bits(qw, sqw)) << "sgd, split";
    EXPECT_TRUE(same_bits(rs, ws) && same_bits(ry, wy)) << "scale and axpy, whole";
    EXPECT_TRUE(same_bits(rs, ss) && same_bits(ry, sy)) << "scale and axpy, split";
    EXPECT_FALSE(same_bits(rw, w0));  // the steps moved the weights
  }
}

// ---------------------------------------------------------------- validation

void ExpectInvalid(const Status& s, const std::string& needle) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "message \"" << s.message() << "\" lacks \"" << needle << "\"";
}

TEST_F(KernelsValidationTest, NegativeSizesAreInvalidArgument) {
  std::vector<float> f(16);
  std::vector<int32_t> l(4);
  ExpectInvalid(
      Gemm(ctx(), Transpose::kNo, Transpose::kNo, -1, 2, 2, 1.f, f.data(), f.data(), 0.f, f.data()),
      "Gemm: m must be >= 0, got -1");
  ExpectInvalid(
      Gemm(ctx(), Transpose::kNo, Transpose::kNo, 2, 2, -3, 1.f, f.data(), f.data(), 0.f, f.data()),
      "k");
  ExpectInvalid(BiasAdd(ctx(), 2, -1, f.data(), f.data()), "BiasAdd: cols");
  ExpectInvalid(BiasGrad(ctx(), -2, 2, f.data(), f.data()), "BiasGrad: rows");
  ExpectInvalid(Relu(ctx(), -1, f.data(), f.data()), "Relu: n");
  ExpectInvalid(ReluBackward(ctx(), -1, f.data(), f.data(), f.data()), "ReluBackward: n");
  ExpectInvalid(SoftmaxCrossEntropy(ctx(), -1, 2, f.data(), l.data(), nullptr, nullptr, nullptr),
                "rows");
  ExpectInvalid(SoftmaxCrossEntropy(ctx(), 2, 0, f.data(), l.data(), nullptr, nullptr, nullptr),
                "classes");
  ExpectInvalid(SgdUpdate(ctx(), -1, {}, f.data(), f.data()), "SgdUpdate: n");
  ExpectInvalid(ConvertFromHalf(ctx(), -5, nullptr, nullptr, false), "ConvertFromHalf: n");
  ExpectInvalid(Gemm(ctx(), Transpose::kNo, Transpose::kNo, int64_t{1} << 31, 1, 1, 1.f, f.data(),
                     f.data(), 0.f, f.data()),
                "BLAS limit");
}

TEST_F(KernelsValidationTest, NullPointersAreInvalidArgument) {
  std::vector<float> f(16);
  std::vector<int32_t> l(4);
  ExpectInvalid(
      Gemm(ctx(), Transpose::kNo, Transpose::kNo, 2, 2, 2, 1.f, nullptr, f.data(), 0.f, f.data()),
      "Gemm: a is null");
  ExpectInvalid(
      Gemm(ctx(), Transpose::kNo, Transpose::kNo, 2, 2, 2, 1.f, f.data(), f.data(), 0.f, nullptr),
      "Gemm: c is null");
  ExpectInvalid(BiasAdd(ctx(), 2, 2, nullptr, f.data()), "bias is null");
  ExpectInvalid(BiasGrad(ctx(), 2, 2, f.data(), nullptr), "db is null");
  ExpectInvalid(Relu(ctx(), 3, nullptr, f.data()), "x is null");
  ExpectInvalid(ReluBackward(ctx(), 3, f.data(), f.data(), nullptr), "dx is null");
  ExpectInvalid(SoftmaxCrossEntropy(ctx(), 2, 2, f.data(), nullptr, nullptr, nullptr, nullptr),
                "labels is null");
  ExpectInvalid(MomentumUpdate(ctx(), 3, {}, f.data(), f.data(), nullptr), "v is null");
  ExpectInvalid(AdamUpdate(ctx(), 3, {}, 1, f.data(), f.data(), nullptr, f.data()), "m is null");
  ExpectInvalid(AdagradUpdate(ctx(), 3, {}, nullptr, f.data(), f.data()), "g is null");
  ExpectInvalid(ConvertToHalf(ctx(), 3, f.data(), nullptr, true), "y is null");
  ExpectInvalid(CopyInt32FromHost(ctx(), nullptr, 3, l.data()), "src_host");
  // Nothing to do: null is fine.
  EXPECT_TRUE(Relu(ctx(), 0, nullptr, nullptr).ok());
  EXPECT_TRUE(AdamUpdate(ctx(), 0, {}, 1, nullptr, nullptr, nullptr, nullptr).ok());
}

TEST_F(KernelsValidationTest, LabelsOutOfRangeAreInvalidArgumentBeforeAnyWrite) {
  const std::vector<float> logits(6, 0.5f);
  std::vector<float> d(6, 42.f);
  float loss = 42.f;
  for (int32_t bad : {-1, 3, 1000}) {
    const std::vector<int32_t> labels = {0, bad};
    ExpectInvalid(
        SoftmaxCrossEntropy(ctx(), 2, 3, logits.data(), labels.data(), d.data(), &loss, nullptr),
        "label " + std::to_string(bad) + " of row 1 is outside [0, 3)");
  }
  EXPECT_EQ(d, std::vector<float>(6, 42.f));
  EXPECT_EQ(loss, 42.f);
}

TEST_F(KernelsValidationTest, BadHyperParametersAreInvalidArgument) {
  std::vector<float> f(4);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ExpectInvalid(SgdUpdate(ctx(), 4, {nan, 0.f}, f.data(), f.data()), "lr must be finite");
  ExpectInvalid(MomentumUpdate(ctx(), 4, {0.1f, INFINITY, 0.f}, f.data(), f.data(), f.data()),
                "momentum");
  ExpectInvalid(AdamUpdate(ctx(), 4, {}, 0, f.data(), f.data(), f.data(), f.data()),
                "step is 1-based, got 0");
  AdamParams beta_one;
  beta_one.beta1 = 1.f;
  ExpectInvalid(AdamUpdate(ctx(), 4, beta_one, 1, f.data(), f.data(), f.data(), f.data()),
                "beta1 must be in [0, 1)");
  ExpectInvalid(AdagradUpdate(ctx(), 4, {0.1f, -1.f, 0.f}, f.data(), f.data(), f.data()),
                "epsilon must be >= 0");
  EXPECT_EQ(f, std::vector<float>(4, 0.f));
}

// ---------------------------------------------------------------- devices and buffers

TEST_F(KernelsDeviceTest, ParseDeviceAcceptsCpuAndAuto) {
  auto cpu = ParseDevice("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(*cpu, (Device{DeviceType::kCpu, 0}));
  auto automatic = ParseDevice("auto");
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  const Device want =
      CudaDeviceCount() > 0 ? Device{DeviceType::kCuda, 0} : Device{DeviceType::kCpu, 0};
  EXPECT_EQ(*automatic, want);
  EXPECT_EQ(DeviceName(Device{DeviceType::kCpu, 0}), "cpu");
  EXPECT_EQ(DeviceName(Device{DeviceType::kCuda, 3}), "cuda:3");
}

TEST_F(KernelsDeviceTest, ParseDeviceRejectsMalformedSpecs) {
  for (const char* spec : {"", "gpu", "CPU", " cpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x",
                           "cuda:+1", "cuda0", "cuda:99999999999"}) {
    auto d = ParseDevice(spec);
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument)
        << "\"" << spec << "\": " << d.status();
  }
}

TEST_F(KernelsDeviceTest, ParseDeviceReportsMissingGpusAsUnavailable) {
  const int count = CudaDeviceCount();
  for (const char* spec : {"cuda", "cuda:0", "cuda:7"}) {
    auto d = ParseDevice(spec);
    const int index = std::string(spec) == "cuda:7" ? 7 : 0;
    if (CudaBuilt() && index < count) {
      ASSERT_TRUE(d.ok()) << d.status();
      EXPECT_EQ(*d, (Device{DeviceType::kCuda, index}));
      continue;
    }
    EXPECT_EQ(d.status().code(), StatusCode::kUnavailable) << spec << ": " << d.status();
    if (!CudaBuilt()) {
      EXPECT_EQ(d.status().message(),
                "this build has no CUDA support; rebuild with -DLEASH_WITH_CUDA=ON");
    }
  }
}

TEST_F(KernelsDeviceTest, ContextCreationRejectsBadDevicesWithoutAborting) {
  EXPECT_EQ(Context::Create(Device{DeviceType::kCpu, 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Context::Create(Device{DeviceType::kCpu, 0}, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Context::Create(Device{DeviceType::kCuda, 1000}).status().code(),
            StatusCode::kUnavailable);
  if (CudaDeviceCount() == 0) {
    auto gpu = Context::Create(Device{DeviceType::kCuda, 0});
    EXPECT_EQ(gpu.status().code(), StatusCode::kUnavailable) << gpu.status();
  }
  auto ctx = Context::Create(Device{DeviceType::kCpu, 0}, 2);
  ASSERT_TRUE(ctx.ok());
  EXPECT_TRUE((*ctx)->Synchronize().ok());
  EXPECT_EQ((*ctx)->device(), (Device{DeviceType::kCpu, 0}));
}

TEST_F(KernelsDeviceTest, BufferIsZeroFilledAndCopiesAtOffsets) {
  auto buf = Buffer::Allocate(ctx(), 10);
  ASSERT_TRUE(buf.ok()) << buf.status();
  ASSERT_EQ(buf->size(), 10u);
  std::vector<float> out(10, -1.f);
  ASSERT_TRUE(buf->CopyToHost(ctx(), out.data(), 10).ok());
  EXPECT_EQ(out, std::vector<float>(10, 0.f));
  const std::vector<float> in = {1.f, 2.f, 3.f};
  ASSERT_TRUE(buf->CopyFromHost(ctx(), in.data(), 3, 7).ok());
  std::vector<float> tail(3);
  ASSERT_TRUE(buf->CopyToHost(ctx(), tail.data(), 3, 7).ok());
  EXPECT_EQ(tail, in);
  ExpectInvalid(buf->CopyFromHost(ctx(), in.data(), 3, 8), "outside an array of 10");
  ExpectInvalid(buf->CopyToHost(ctx(), out.data(), 11), "outside");
  ExpectInvalid(buf->CopyToHost(ctx(), nullptr, 1), "null");

  Buffer moved = std::move(*buf);
  EXPECT_EQ(moved.size(), 10u);
  EXPECT_EQ(buf->data(), nullptr);
  EXPECT_EQ(buf->size(), 0u);
  Buffer empty;
  EXPECT_TRUE(empty.CopyToHost(ctx(), out.data(), 0).ok());
  auto zero = Buffer::Allocate(ctx(), 0);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->size(), 0u);
}

TEST_F(KernelsDeviceTest, DeviceArraysHoldLabelsAndHalves) {
  auto labels = Int32Buffer::Allocate(ctx(), 4);
  ASSERT_TRUE(labels.ok()) << labels.status();
  const std::vector<int32_t> in = {3, -1, 7, 0};
  ASSERT_TRUE(labels->CopyFromHost(ctx(), in.data(), 4).ok());
  std::vector<int32_t> out(4);
  ASSERT_TRUE(labels->CopyToHost(ctx(), out.data(), 4).ok());
  EXPECT_EQ(out, in);
  ASSERT_TRUE(CopyInt32FromHost(ctx(), in.data() + 2, 2, labels->data()).ok());
  ASSERT_TRUE(labels->CopyToHost(ctx(), out.data(), 4).ok());
  EXPECT_EQ(out, (std::vector<int32_t>{7, 0, 7, 0}));
  auto halves = HalfBuffer::Allocate(ctx(), 3);
  ASSERT_TRUE(halves.ok());
  EXPECT_EQ(halves->size(), 3u);
}

// ---------------------------------------------------------------- fp16 / bf16

std::vector<uint16_t> ToHalves(Context& ctx, const std::vector<float>& x, bool bf16) {
  std::vector<uint16_t> y(x.size());
  EXPECT_TRUE(ConvertToHalf(ctx, static_cast<int64_t>(x.size()), x.data(), y.data(), bf16).ok());
  return y;
}

std::vector<float> FromHalves(Context& ctx, const std::vector<uint16_t>& x, bool bf16) {
  std::vector<float> y(x.size());
  EXPECT_TRUE(ConvertFromHalf(ctx, static_cast<int64_t>(x.size()), x.data(), y.data(), bf16).ok());
  return y;
}

bool IsHalfNan(uint16_t h, bool bf16) {
  return bf16 ? (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) : (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
}

TEST_F(KernelsHalfTest, EveryHalfPatternRoundTrips) {
  for (bool bf16 : {false, true}) {
    std::vector<uint16_t> all(65536);
    for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
    const auto floats = FromHalves(ctx(), all, bf16);
    const auto back = ToHalves(ctx(), floats, bf16);
    for (uint32_t i = 0; i < all.size(); ++i) {
      if (IsHalfNan(all[i], bf16)) {
        EXPECT_TRUE(std::isnan(floats[i])) << std::hex << i;
        EXPECT_TRUE(IsHalfNan(back[i], bf16)) << std::hex << i;
        EXPECT_EQ(back[i] & 0x8000u, all[i] & 0x8000u) << "sign of NaN " << std::hex << i;
      } else {
        ASSERT_EQ(back[i], all[i])
            << (bf16 ? "bf16 " : "fp16 ") << std::hex << i << " -> " << floats[i];
      }
    }
  }
}

TEST_F(KernelsHalfTest, Fp16RoundsToNearestEvenWithSubnormalsAndOverflow) {
  struct Case {
    float in;
    uint16_t want;
  };
  const float sub = std::ldexp(1.f, -24);  // smallest fp16 subnormal
  const Case cases[] = {
      {1.f, 0x3c00},
      {std::ldexp(1.f, -11) + 1.f, 0x3c00},                         // halfway, even stays
      {3 * std::ldexp(1.f, -11) + 1.f, 0x3c02},                     // halfway, odd rounds up
      {1.f + std::ldexp(1.f, -11) + std::ldexp(1.f, -20), 0x3c01},  // just above halfway
      {-2.5f, 0xc100},
      {65504.f, 0x7bff},  // largest finite
      {65519.f, 0x7bff},  // below the halfway point to 65536
      {65520.f, 0x7c00},  // halfway to 65536 rounds to even: infinity
      {1e10f, 0x7c00},
      {-INFINITY, 0xfc00},
      {INFINITY, 0x7c00},
      {sub, 0x0001},
      {sub / 2, 0x0000},               // halfway between 0 and the smallest subnormal: even (0)
      {sub * 0.75f, 0x0001},           // above halfway
      {sub * 1.5f, 0x0002},            // halfway between 1 and 2 subnormal steps: even (2)
      {std::ldexp(1.f, -14), 0x0400},  // smallest normal
      {std::ldexp(1.f, -14) - sub, 0x03ff},  // largest subnormal
      {1e-40f, 0x0000},                      // fp32 subnormal underflows
      {-0.f, 0x8000},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ToHalves(ctx(), {c.in}, false)[0], c.want) << c.in;
  }
  const uint16_t nan = ToHalves(ctx(), {std::numeric_limits<float>::quiet_NaN()}, false)[0];
  EXPECT_TRUE(IsHalfNan(nan, false)) << std::hex << nan;
  EXPECT_EQ(FromHalves(ctx(), {0x0001}, false)[0], sub);
  EXPECT_EQ(FromHalves(ctx(), {0x7bff}, false)[0], 65504.f);
  EXPECT_EQ(FromHalves(ctx(), {0xfc00}, false)[0], -INFINITY);
}

TEST_F(KernelsHalfTest, Bf16RoundsToNearestEvenAndKeepsNan) {
  struct Case {
    float in;
    uint16_t want;
  };
  const Case cases[] = {
      {1.f, 0x3f80},
      {1.f + std::ldexp(1.f, -8), 0x3f80},                         // halfway, even stays
      {1.f + 3 * std::ldexp(1.f, -8), 0x3f82},                     // halfway, odd rounds up
      {1.f + std::ldexp(1.f, -8) + std::ldexp(1.f, -16), 0x3f81},  // above halfway
      {std::numeric_limits<float>::max(), 0x7f80},                 // rounds past the largest bf16
      {-INFINITY, 0xff80},
      {1e-40f, 0x0001},  // fp32 subnormal -> bf16 subnormal
      {-0.f, 0x8000},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ToHalves(ctx(), {c.in}, true)[0], c.want) << c.in;
  }
  for (float nan :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
        std::numeric_limits<float>::signaling_NaN()}) {
    const uint16_t h = ToHalves(ctx(), {nan}, true)[0];
    EXPECT_TRUE(IsHalfNan(h, true)) << std::hex << h;  // never rounds to infinity
    EXPECT_TRUE(h & 0x40u) << "quiet";
  }
}

TEST_F(KernelsHalfTest, ConversionsAgreeWithCommonHalfHeader) {
  const auto x = RandomVector(1001, 150, -70000.f, 70000.f);
  const auto h = ToHalves(ctx(), x, false);
  const auto b = ToHalves(ctx(), x, true);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i], FloatToHalf(x[i])) << x[i];
    ASSERT_EQ(b[i], FloatToBf16(x[i])) << x[i];
  }
}

}  // namespace
}  // namespace leash::kernels
