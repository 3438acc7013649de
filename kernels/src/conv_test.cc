// Tests of the CPU convolution, channel-bias and max-pooling kernels through the entry
// points of kernels.h: each against a plain double-precision reference loop, gradients
// against central differences, and argument validation. Single-threaded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "leash/kernels/kernels.h"
#include "test_inputs.h"

namespace leash::kernels {
namespace {

size_t XSize(const Conv2dShape& s) { return static_cast<size_t>(s.n * s.c_in * s.h * s.w); }
size_t YSize(const Conv2dShape& s) {
  return static_cast<size_t>(s.n * s.c_out * s.h_out() * s.w_out());
}
size_t WSize(const Conv2dShape& s) { return static_cast<size_t>(s.c_out * s.patch_rows()); }

// Calls f(y index, x index, weight index) for every product the convolution sums, straight
// from the definition in kernels.h: y[i, o, r, c] += w[o, ci, a, b] x[i, ci, r + a - pad,
// c + b - pad] wherever that input pixel is inside the image.
void ForEachTap(const Conv2dShape& s, const std::function<void(size_t, size_t, size_t)>& f) {
  for (int64_t i = 0; i < s.n; ++i) {
    for (int64_t o = 0; o < s.c_out; ++o) {
      for (int64_t r = 0; r < s.h_out(); ++r) {
        for (int64_t col = 0; col < s.w_out(); ++col) {
          const auto yi =
              static_cast<size_t>(((i * s.c_out + o) * s.h_out() + r) * s.w_out() + col);
          for (int64_t ci = 0; ci < s.c_in; ++ci) {
            for (int64_t a = 0; a < s.k; ++a) {
              for (int64_t b = 0; b < s.k; ++b) {
                const int64_t ih = r + a - s.pad, iw = col + b - s.pad;
                if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) continue;
                const auto xi = static_cast<size_t>(((i * s.c_in + ci) * s.h + ih) * s.w + iw);
                const auto wi = static_cast<size_t>(((o * s.c_in + ci) * s.k + a) * s.k + b);
                f(yi, xi, wi);
              }
            }
          }
        }
      }
    }
  }
}

// Reference sums and, for the tolerance, sums of absolute terms.
struct RefResult {
  std::vector<double> value;
  std::vector<double> magnitude;
};

RefResult RefForward(const Conv2dShape& s, const std::vector<double>& x,
                     const std::vector<double>& w) {
  RefResult r{std::vector<double>(YSize(s)), std::vector<double>(YSize(s))};
  ForEachTap(s, [&](size_t yi, size_t xi, size_t wi) {
    r.value[yi] += w[wi] * x[xi];
    r.magnitude[yi] += std::abs(w[wi] * x[xi]);
  });
  return r;
}

RefResult RefBackwardData(const Conv2dShape& s, const std::vector<double>& dy,
                          const std::vector<double>& w) {
  RefResult r{std::vector<double>(XSize(s)), std::vector<double>(XSize(s))};
  ForEachTap(s, [&](size_t yi, size_t xi, size_t wi) {
    r.value[xi] += dy[yi] * w[wi];
    r.magnitude[xi] += std::abs(dy[yi] * w[wi]);
  });
  return r;
}

RefResult RefBackwardWeight(const Conv2dShape& s, const std::vector<double>& x,
                            const std::vector<double>& dy) {
  RefResult r{std::vector<double>(WSize(s)), std::vector<double>(WSize(s))};
  ForEachTap(s, [&](size_t yi, size_t xi, size_t wi) {
    r.value[wi] += dy[yi] * x[xi];
    r.magnitude[wi] += std::abs(dy[yi] * x[xi]);
  });
  return r;
}

// fp32 sums against double ones: the error of a sum grows with the size of its terms.
void ExpectMatchesReference(const std::vector<float>& got, const RefResult& want,
                            const char* what) {
  ASSERT_EQ(got.size(), want.value.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want.value[i], 1e-6 + 1e-5 * want.magnitude[i]) << what << " element " << i;
  }
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
}

// Shapes with odd and even sizes, pad 0, 1 and 2, n > 1 and c_in > 1, the 1x1 kernel that
// needs no patch matrix, a 1x1 kernel with padding that does, an even kernel, one-row
// images and a layer of the CNN's size.
const Conv2dShape kShapes[] = {
    {1, 1, 1, 1, 1, 1, 0}, {2, 3, 5, 7, 4, 3, 1}, {3, 2, 6, 5, 3, 3, 0},    {2, 3, 4, 4, 2, 1, 0},
    {2, 2, 3, 5, 3, 1, 1}, {1, 2, 7, 6, 3, 5, 2}, {2, 1, 3, 3, 2, 3, 2},    {1, 1, 2, 3, 1, 4, 1},
    {2, 2, 1, 6, 2, 3, 1}, {3, 1, 9, 1, 2, 1, 0}, {2, 8, 14, 14, 16, 3, 1},
};

class CpuConvTest : public CpuContextTest {
 protected:
  std::vector<float> Forward(const Conv2dShape& s, const std::vector<float>& x,
                             const std::vector<float>& w) {
    std::vector<float> y(YSize(s), std::numeric_limits<float>::quiet_NaN());  // must be overwritten
    Status st = Conv2dForward(ctx(), s.n, s.c_in, s.h, s.w, s.c_out, s.k, s.pad, x.data(), w.data(),
                              y.data());
    EXPECT_TRUE(st.ok()) << st;
    return y;
  }
  std::vector<float> BackwardData(const Conv2dShape& s, const std::vector<float>& dy,
                                  const std::vector<float>& w) {
    std::vector<float> dx(XSize(s), std::numeric_limits<float>::quiet_NaN());
    Status st = Conv2dBackwardData(ctx(), s.n, s.c_in, s.h, s.w, s.c_out, s.k, s.pad, dy.data(),
                                   w.data(), dx.data());
    EXPECT_TRUE(st.ok()) << st;
    return dx;
  }
  std::vector<float> BackwardWeight(const Conv2dShape& s, const std::vector<float>& x,
                                    const std::vector<float>& dy) {
    std::vector<float> dw(WSize(s), std::numeric_limits<float>::quiet_NaN());
    Status st = Conv2dBackwardWeight(ctx(), s.n, s.c_in, s.h, s.w, s.c_out, s.k, s.pad, x.data(),
                                     dy.data(), dw.data());
    EXPECT_TRUE(st.ok()) << st;
    return dw;
  }
};

using Conv2dTest = CpuConvTest;
using BiasChannelsTest = CpuConvTest;
using MaxPool2dTest = CpuConvTest;
using ConvValidationTest = CpuConvTest;

// ---------------------------------------------------------------- convolution

TEST_F(Conv2dTest, ForwardMatchesReference) {
  uint32_t seed = 1;
  for (const Conv2dShape& s : kShapes) {
    SCOPED_TRACE(ShapeName(s));
    const auto x = RandomVector(XSize(s), seed++);
    const auto w = RandomVector(WSize(s), seed++);
    ExpectMatchesReference(Forward(s, x, w), RefForward(s, ToDouble(x), ToDouble(w)), "y");
  }
}

TEST_F(Conv2dTest, BackwardDataMatchesReference) {
  uint32_t seed = 100;
  for (const Conv2dShape& s : kShapes) {
    SCOPED_TRACE(ShapeName(s));
    const auto dy = RandomVector(YSize(s), seed++);
    const auto w = RandomVector(WSize(s), seed++);
    ExpectMatchesReference(BackwardData(s, dy, w), RefBackwardData(s, ToDouble(dy), ToDouble(w)),
                           "dx");
  }
}

TEST_F(Conv2dTest, BackwardWeightMatchesReferenceSummedOverTheBatch) {
  uint32_t seed = 200;
  for (const Conv2dShape& s : kShapes) {
    SCOPED_TRACE(ShapeName(s));
    const auto x = RandomVector(XSize(s), seed++);
    const auto dy = RandomVector(YSize(s), seed++);
    ExpectMatchesReference(BackwardWeight(s, x, dy),
                           RefBackwardWeight(s, ToDouble(x), ToDouble(dy)), "dweight");
  }
}

// L = sum(G .* conv(x, w)): its gradients are BackwardData(G, w) and BackwardWeight(x, G).
TEST_F(Conv2dTest, GradientsMatchCentralDifferences) {
  uint32_t seed = 300;
  for (const Conv2dShape& s : {Conv2dShape{2, 2, 5, 4, 3, 3, 1}, Conv2dShape{2, 3, 4, 5, 2, 3, 0},
                               Conv2dShape{1, 2, 3, 3, 2, 2, 1}}) {
    SCOPED_TRACE(ShapeName(s));
    const auto x = RandomVector(XSize(s), seed++);
    const auto w = RandomVector(WSize(s), seed++);
    const auto g = RandomVector(YSize(s), seed++);
    const auto gd = ToDouble(g), xd = ToDouble(x), wd = ToDouble(w);
    const auto numeric_dx = NumericGradient(
        [&](const std::vector<double>& v) { return Dot(gd, RefForward(s, v, wd).value); }, xd,
        1e-3);
    const auto numeric_dw = NumericGradient(
        [&](const std::vector<double>& v) { return Dot(gd, RefForward(s, xd, v).value); }, wd,
        1e-3);
    ExpectGradientsMatch(BackwardData(s, g, w), numeric_dx, "dx");
    ExpectGradientsMatch(BackwardWeight(s, x, g), numeric_dw, "dweight");
  }
}

TEST_F(Conv2dTest, ScratchIsReusedAcrossShapesOfEverySize) {
  // Small, large, small again: the context's scratch grows once and stays correct.
  uint32_t seed = 400;
  for (const Conv2dShape& s :
       {Conv2dShape{1, 1, 4, 4, 1, 3, 1}, Conv2dShape{2, 4, 12, 11, 3, 5, 2},
        Conv2dShape{2, 2, 5, 5, 2, 3, 0}, Conv2dShape{2, 4, 12, 11, 3, 5, 2}}) {
    SCOPED_TRACE(ShapeName(s));
    const auto x = RandomVector(XSize(s), seed++);
    const auto w = RandomVector(WSize(s), seed++);
    const auto dy = RandomVector(YSize(s), seed++);
    ExpectMatchesReference(Forward(s, x, w), RefForward(s, ToDouble(x), ToDouble(w)), "y");
    ExpectMatchesReference(BackwardWeight(s, x, dy),
                           RefBackwardWeight(s, ToDouble(x), ToDouble(dy)), "dweight");
    ExpectMatchesReference(BackwardData(s, dy, w), RefBackwardData(s, ToDouble(dy), ToDouble(w)),
                           "dx");
  }
}

TEST_F(Conv2dTest, EmptyBatchWritesNothingButZeroWeightGradient) {
  std::vector<float> out(4, 42.f);
  EXPECT_TRUE(Conv2dForward(ctx(), 0, 2, 3, 3, 2, 3, 1, nullptr, nullptr, nullptr).ok());
  EXPECT_TRUE(Conv2dBackwardData(ctx(), 0, 2, 3, 3, 2, 3, 1, nullptr, nullptr, out.data()).ok());
  EXPECT_EQ(out, std::vector<float>(4, 42.f));
  std::vector<float> dw(2 * 2 * 3 * 3, 42.f);
  ASSERT_TRUE(Conv2dBackwardWeight(ctx(), 0, 2, 3, 3, 2, 3, 1, nullptr, nullptr, dw.data()).ok());
  EXPECT_EQ(dw, std::vector<float>(dw.size(), 0.f));
}

// ---------------------------------------------------------------- channel biases

TEST_F(BiasChannelsTest, AddAndGradMatchReference) {
  const int64_t n = 3, c = 5, hw = 7;
  auto y = RandomVector(n * c * hw, 500);
  const auto bias = RandomVector(c, 501);
  auto want = y;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t p = 0; p < hw; ++p) want[(i * c + ch) * hw + p] += bias[ch];
    }
  }
  ASSERT_TRUE(BiasAddChannels(ctx(), n, c, hw, bias.data(), y.data()).ok());
  EXPECT_EQ(y, want);

  std::vector<float> db(c, 123.f);  // stale values must not leak in
  ASSERT_TRUE(BiasGradChannels(ctx(), n, c, hw, y.data(), db.data()).ok());
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t p = 0; p < hw; ++p) sum += y[(i * c + ch) * hw + p];
    }
    EXPECT_NEAR(db[ch], sum, 1e-5) << ch;
  }
  ASSERT_TRUE(BiasGradChannels(ctx(), 0, c, hw, nullptr, db.data()).ok());
  EXPECT_EQ(db, std::vector<float>(c, 0.f));
}

// ---------------------------------------------------------------- max pooling

struct PoolShape {
  int64_t n, c, h, w;
  size_t in() const { return static_cast<size_t>(n * c * h * w); }
  size_t out() const { return static_cast<size_t>(n * c * (h / 2) * (w / 2)); }
};

// Reference: the flat input index of each output's window maximum, first on ties.
std::vector<size_t> RefPoolArgmax(const PoolShape& s, const std::vector<float>& x) {
  std::vector<size_t> arg;
  for (int64_t plane = 0; plane < s.n * s.c; ++plane) {
    for (int64_t r = 0; r < s.h / 2; ++r) {
      for (int64_t col = 0; col < s.w / 2; ++col) {
        size_t best = 0;
        bool first = true;
        for (int64_t a = 0; a < 2; ++a) {
          for (int64_t b = 0; b < 2; ++b) {
            const auto i = static_cast<size_t>((plane * s.h + 2 * r + a) * s.w + 2 * col + b);
            if (first || x[i] > x[best]) best = i;
            first = false;
          }
        }
        arg.push_back(best);
      }
    }
  }
  return arg;
}

const PoolShape kPoolShapes[] = {{1, 1, 2, 2}, {2, 3, 4, 6}, {2, 2, 5, 7},
                                 {1, 3, 3, 2}, {3, 1, 2, 9}, {2, 4, 28, 28}};

TEST_F(MaxPool2dTest, ForwardAndBackwardMatchReferenceForOddSizes) {
  uint32_t seed = 600;
  for (const PoolShape& s : kPoolShapes) {
    SCOPED_TRACE(testing::Message() << s.n << "x" << s.c << "x" << s.h << "x" << s.w);
    const auto x = RandomVector(s.in(), seed++);
    const auto dy = RandomVector(s.out(), seed++);
    const auto arg = RefPoolArgmax(s, x);
    std::vector<float> y(s.out(), std::numeric_limits<float>::quiet_NaN());
    ASSERT_TRUE(MaxPool2dForward(ctx(), s.n, s.c, s.h, s.w, x.data(), y.data()).ok());
    std::vector<float> want_dx(s.in(), 0.f);
    for (size_t o = 0; o < arg.size(); ++o) {
      EXPECT_EQ(y[o], x[arg[o]]) << o;
      want_dx[arg[o]] = dy[o];
    }
    std::vector<float> dx(s.in(),
                          std::numeric_limits<float>::quiet_NaN());  // the odd edge must be zeroed
    ASSERT_TRUE(
        MaxPool2dBackward(ctx(), s.n, s.c, s.h, s.w, x.data(), y.data(), dy.data(), dx.data())
            .ok());
    EXPECT_EQ(dx, want_dx);
  }
}

TEST_F(MaxPool2dTest, TiesSendTheGradientToTheFirstMaximum) {
  // One 4 x 4 plane: windows with all four equal, the two bottom ones equal, the right
  // column equal, and a single maximum.
  const std::vector<float> x = {
      1.f,  1.f,  0.f, 5.f,  //
      1.f,  1.f,  0.f, 5.f,  //
      -1.f, -2.f, 7.f, 3.f,  //
      4.f,  4.f,  3.f, 3.f,  //
  };
  std::vector<float> y(4);
  ASSERT_TRUE(MaxPool2dForward(ctx(), 1, 1, 4, 4, x.data(), y.data()).ok());
  EXPECT_EQ(y, (std::vector<float>{1.f, 5.f, 4.f, 7.f}));
  const std::vector<float> dy = {10.f, 20.f, 30.f, 40.f};
  std::vector<float> dx(16, -1.f);
  ASSERT_TRUE(MaxPool2dBackward(ctx(), 1, 1, 4, 4, x.data(), y.data(), dy.data(), dx.data()).ok());
  EXPECT_EQ(dx, (std::vector<float>{
                    10.f, 0.f, 0.f, 20.f,  //
                    0.f, 0.f, 0.f, 0.f,    //
                    0.f, 0.f, 40.f, 0.f,   //
                    30.f, 0.f, 0.f, 0.f,   //
                }));
}

TEST_F(MaxPool2dTest, GradientMatchesCentralDifferences) {
  // Distinct values at least 0.01 apart, so a 1e-3 step never changes a window's maximum.
  const PoolShape s{2, 2, 5, 6};
  std::vector<float> x(s.in());
  std::iota(x.begin(), x.end(), 0.f);
  std::shuffle(x.begin(), x.end(), std::mt19937(700));
  for (float& v : x) v = v * 0.01f - 0.5f;
  const auto g = RandomVector(s.out(), 701);
  const auto gd = ToDouble(g);
  auto loss = [&](const std::vector<double>& v) {
    std::vector<float> vf(v.begin(), v.end());
    const auto arg = RefPoolArgmax(s, vf);
    double sum = 0;
    for (size_t o = 0; o < arg.size(); ++o) sum += gd[o] * v[arg[o]];
    return sum;
  };
  const auto numeric = NumericGradient(loss, ToDouble(x), 1e-3);
  std::vector<float> y(s.out()), dx(s.in());
  ASSERT_TRUE(MaxPool2dForward(ctx(), s.n, s.c, s.h, s.w, x.data(), y.data()).ok());
  ASSERT_TRUE(
      MaxPool2dBackward(ctx(), s.n, s.c, s.h, s.w, x.data(), y.data(), g.data(), dx.data()).ok());
  ExpectGradientsMatch(dx, numeric, "dx");
}

// ---------------------------------------------------------------- validation

void ExpectInvalid(const Status& s, const std::string& needle) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "message \"" << s.message() << "\" lacks \"" << needle << "\"";
}

TEST_F(ConvValidationTest, BadConvolutionSizesAreInvalidArgument) {
  std::vector<float> f(1024, 7.f);
  const float* p = f.data();
  float* q = f.data();
  ExpectInvalid(Conv2dForward(ctx(), -1, 1, 3, 3, 1, 3, 1, p, p, q),
                "Conv2dForward: n must be >= 0, got -1");
  ExpectInvalid(Conv2dForward(ctx(), 1, 0, 3, 3, 1, 3, 1, p, p, q), "c_in must be >= 1, got 0");
  ExpectInvalid(Conv2dForward(ctx(), 1, 1, 0, 3, 1, 3, 1, p, p, q), "h must be >= 1");
  ExpectInvalid(Conv2dForward(ctx(), 1, 1, 3, -3, 1, 3, 1, p, p, q), "w must be >= 1");
  ExpectInvalid(Conv2dForward(ctx(), 1, 1, 3, 3, 0, 3, 1, p, p, q), "c_out must be >= 1");
  ExpectInvalid(Conv2dBackwardData(ctx(), 1, 1, 3, 3, 1, 0, 1, p, p, q),
                "Conv2dBackwardData: k must be >= 1");
  ExpectInvalid(Conv2dBackwardWeight(ctx(), 1, 1, 3, 3, 1, 3, -1, p, p, q),
                "Conv2dBackwardWeight: pad must be >= 0");
  ExpectInvalid(Conv2dForward(ctx(), 1, 1, 2, 3, 1, 5, 1, p, p, q),
                "5 x 5 kernel does not fit in the padded 4 x 5");
  ExpectInvalid(Conv2dForward(ctx(), 1, 1, int64_t{1} << 31, 3, 1, 3, 1, p, p, q), "BLAS limit");
  ExpectInvalid(Conv2dForward(ctx(), 1 << 20, 64, 64, 64, 1, 1, 0, p, p, q),
                "x (n x c_in x h x w) has more than");
  ExpectInvalid(Conv2dForward(ctx(), 1, 1, 1 << 16, 1 << 16, 1, 1, 0, p, p, q),
                "x (n x c_in x h x w)");
  ExpectInvalid(Conv2dForward(ctx(), 1, 1 << 16, 4, 4, 1 << 16, 1, 0, p, p, q),
                "weight (c_out x c_in x k x k)");
  ExpectInvalid(Conv2dForward(ctx(), 1, 1 << 14, 128, 128, 1, 3, 1, p, p, q), "the patch matrix");
  ExpectInvalid(Conv2dForward(ctx(), 1 << 10, 1, 64, 64, 1 << 10, 1, 0, p, p, q),
                "y (n x c_out x h_out x w_out)");
  EXPECT_EQ(f, std::vector<float>(1024, 7.f));
}

TEST_F(ConvValidationTest, NullPointersAreInvalidArgument) {
  std::vector<float> f(64);
  ExpectInvalid(Conv2dForward(ctx(), 1, 1, 3, 3, 1, 3, 1, nullptr, f.data(), f.data()),
                "Conv2dForward: x is null");
  ExpectInvalid(Conv2dForward(ctx(), 1, 1, 3, 3, 1, 3, 1, f.data(), nullptr, f.data()),
                "weight is null");
  ExpectInvalid(Conv2dForward(ctx(), 1, 1, 3, 3, 1, 3, 1, f.data(), f.data(), nullptr),
                "y is null");
  ExpectInvalid(Conv2dBackwardData(ctx(), 1, 1, 3, 3, 1, 3, 1, nullptr, f.data(), f.data()),
                "dy is null");
  ExpectInvalid(Conv2dBackwardData(ctx(), 1, 1, 3, 3, 1, 3, 1, f.data(), f.data(), nullptr),
                "dx is null");
  ExpectInvalid(Conv2dBackwardWeight(ctx(), 1, 1, 3, 3, 1, 3, 1, nullptr, f.data(), f.data()),
                "x is null");
  // The weight gradient is written even for an empty batch.
  ExpectInvalid(Conv2dBackwardWeight(ctx(), 0, 1, 3, 3, 1, 3, 1, nullptr, nullptr, nullptr),
                "dweight is null");
  ExpectInvalid(BiasAddChannels(ctx(), 2, 3, 4, nullptr, f.data()),
                "BiasAddChannels: bias is null");
  ExpectInvalid(BiasGradChannels(ctx(), 2, 3, 4, f.data(), nullptr),
                "BiasGradChannels: db is null");
  ExpectInvalid(MaxPool2dForward(ctx(), 1, 1, 4, 4, f.data(), nullptr),
                "MaxPool2dForward: y is null");
  ExpectInvalid(MaxPool2dBackward(ctx(), 1, 1, 4, 4, f.data(), nullptr, f.data(), f.data()),
                "y is null");
  ExpectInvalid(MaxPool2dBackward(ctx(), 1, 1, 4, 4, f.data(), f.data(), f.data(), nullptr),
                "dx is null");
  // Nothing to do: null is fine.
  EXPECT_TRUE(BiasAddChannels(ctx(), 2, 0, 4, nullptr, nullptr).ok());
  EXPECT_TRUE(MaxPool2dForward(ctx(), 0, 3, 4, 4, nullptr, nullptr).ok());
}

TEST_F(ConvValidationTest, BadPoolingAndBiasSizesAreInvalidArgument) {
  std::vector<float> f(64);
  ExpectInvalid(MaxPool2dForward(ctx(), 1, 1, 1, 4, f.data(), f.data()), "h and w must be >= 2");
  ExpectInvalid(MaxPool2dBackward(ctx(), 1, 1, 4, 1, f.data(), f.data(), f.data(), f.data()),
                "got h = 4, w = 1");
  ExpectInvalid(MaxPool2dForward(ctx(), -1, 1, 4, 4, f.data(), f.data()), "n must be >= 0");
  ExpectInvalid(MaxPool2dForward(ctx(), 1 << 20, 64, 64, 64, f.data(), f.data()), "has more than");
  ExpectInvalid(BiasAddChannels(ctx(), 2, 3, -4, f.data(), f.data()),
                "BiasAddChannels: hw must be >= 0");
  ExpectInvalid(BiasGradChannels(ctx(), -2, 3, 4, f.data(), f.data()),
                "BiasGradChannels: n must be >= 0");
  ExpectInvalid(BiasAddChannels(ctx(), 1 << 20, 1 << 10, 1 << 10, f.data(), f.data()),
                "has more than");
}

}  // namespace
}  // namespace leash::kernels
