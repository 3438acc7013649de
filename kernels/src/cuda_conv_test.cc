// Tests of the CUDA (cuDNN) convolution, channel-bias and max-pooling kernels against the
// CPU kernels on the same random data, through the entry points of kernels.h. Labelled
// gpu; every test skips where no GPU is usable. Single-threaded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "leash/kernels/kernels.h"
#include "test_inputs.h"

namespace leash::kernels {
namespace {

// Values on a grid of 0.25 in [-1, 1]: 2 x 2 windows often hold equal maxima.
std::vector<float> TiedVector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-4, 4);
  std::vector<float> v(n);
  for (float& x : v) x = 0.25f * static_cast<float>(dist(rng));
  return v;
}

// Summation orders (and cuDNN's algorithms: FFT, Winograd) differ from the CPU's; the
// error grows like the square root of the number of terms in each sum.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, int64_t terms,
                 const char* what) {
  kernels::ExpectClose(got, want, 1e-4f, 1e-5f * std::sqrt(static_cast<float>(terms)) * 4, what);
}

class CudaConvTest : public CudaAgainstCpuTest {
 protected:
  // Runs the three convolution kernels on both devices and compares.
  void CheckConvolution(const Conv2dShape& s, uint32_t seed) {
    SCOPED_TRACE(ShapeName(s));
    const auto x_size = static_cast<size_t>(s.n * s.c_in * s.h * s.w);
    const auto y_size = static_cast<size_t>(s.n * s.c_out * s.h_out() * s.w_out());
    const auto w_size = static_cast<size_t>(s.c_out * s.patch_rows());
    const auto x = RandomVector(x_size, seed);
    const auto w = RandomVector(w_size, seed + 1);
    const auto dy = RandomVector(y_size, seed + 2);
    auto xd = Upload(x), wd = Upload(w), dyd = Upload(dy);
    // Stale values in the outputs must not leak in.
    auto yd = Upload(std::vector<float>(y_size, std::numeric_limits<float>::quiet_NaN()));
    auto dxd = Upload(std::vector<float>(x_size, std::numeric_limits<float>::quiet_NaN()));
    auto dwd = Upload(std::vector<float>(w_size, std::numeric_limits<float>::quiet_NaN()));
    std::vector<float> y(y_size), dx(x_size), dw(w_size);

    ASSERT_TRUE(Conv2dForward(cpu(), s.n, s.c_in, s.h, s.w, s.c_out, s.k, s.pad, x.data(), w.data(),
                              y.data())
                    .ok());
    Status st = Conv2dForward(gpu(), s.n, s.c_in, s.h, s.w, s.c_out, s.k, s.pad, xd.data(),
                              wd.data(), yd.data());
    ASSERT_TRUE(st.ok()) << st;
    ExpectClose(Download(yd), y, s.patch_rows(), "y");

    ASSERT_TRUE(Conv2dBackwardData(cpu(), s.n, s.c_in, s.h, s.w, s.c_out, s.k, s.pad, dy.data(),
                                   w.data(), dx.data())
                    .ok());
    st = Conv2dBackwardData(gpu(), s.n, s.c_in, s.h, s.w, s.c_out, s.k, s.pad, dyd.data(),
                            wd.data(), dxd.data());
    ASSERT_TRUE(st.ok()) << st;
    ExpectClose(Download(dxd), dx, s.c_out * s.k * s.k, "dx");

    ASSERT_TRUE(Conv2dBackwardWeight(cpu(), s.n, s.c_in, s.h, s.w, s.c_out, s.k, s.pad, x.data(),
                                     dy.data(), dw.data())
                    .ok());
    st = Conv2dBackwardWeight(gpu(), s.n, s.c_in, s.h, s.w, s.c_out, s.k, s.pad, xd.data(),
                              dyd.data(), dwd.data());
    ASSERT_TRUE(st.ok()) << st;
    ExpectClose(Download(dwd), dw, s.n * s.h_out() * s.w_out(), "dweight");
  }
};

using CudaConv2dTest = CudaConvTest;
using CudaBiasChannelsTest = CudaConvTest;
using CudaMaxPool2dTest = CudaConvTest;

TEST_F(CudaConv2dTest, MatchesCpuForOddSizesPaddingAndTheCnnLayers) {
  uint32_t seed = 1;
  for (const Conv2dShape& s : {
           Conv2dShape{1, 1, 1, 1, 1, 1, 0}, Conv2dShape{2, 3, 5, 7, 4, 3, 1},
           Conv2dShape{3, 2, 6, 5, 3, 3, 0}, Conv2dShape{2, 3, 4, 4, 2, 1, 0},
           Conv2dShape{2, 2, 3, 5, 3, 1, 1}, Conv2dShape{1, 2, 7, 6, 3, 5, 2},
           Conv2dShape{2, 1, 3, 3, 2, 3, 2}, Conv2dShape{1, 1, 2, 3, 1, 4, 1},
           Conv2dShape{2, 2, 1, 6, 2, 3, 1},
           Conv2dShape{64, 1, 28, 28, 32, 3, 1},   // the CNN's first layer at batch 64
           Conv2dShape{64, 32, 14, 14, 64, 3, 1},  // and its second
           Conv2dShape{7, 32, 14, 14, 64, 3, 1},   // a ragged last chunk of an evaluation
       }) {
    CheckConvolution(s, seed);
    seed += 3;
  }
}

TEST_F(CudaConv2dTest, ShapesSeenBeforeReuseTheirAlgorithmsAndAGrownWorkspace) {
  // Small, large, small, large: cached algorithms and the grown workspace stay correct.
  const Conv2dShape small{2, 2, 5, 5, 2, 3, 0}, large{16, 16, 24, 24, 32, 5, 2};
  for (int round = 0; round < 2; ++round) {
    CheckConvolution(small, 100 + round);
    CheckConvolution(large, 200 + round);
  }
}

TEST_F(CudaConv2dTest, EmptyBatchZeroesTheWeightGradient) {
  auto dw = Upload(std::vector<float>(2 * 3 * 3 * 3, 42.f));
  ASSERT_TRUE(Conv2dBackwardWeight(gpu(), 0, 3, 5, 5, 2, 3, 1, nullptr, nullptr, dw.data()).ok());
  EXPECT_EQ(Download(dw), std::vector<float>(dw.size(), 0.f));
  EXPECT_TRUE(Conv2dForward(gpu(), 0, 3, 5, 5, 2, 3, 1, nullptr, nullptr, nullptr).ok());
}

TEST_F(CudaBiasChannelsTest, AddAndGradMatchCpu) {
  for (auto [n, c, hw] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 5, 7}, {64, 32, 784}, {2, 300, 3}}) {
    SCOPED_TRACE(testing::Message() << n << " x " << c << " x " << hw);
    auto y = RandomVector(n * c * hw, 300);
    const auto bias = RandomVector(c, 301);
    auto yd = Upload(y), biasd = Upload(bias);
    ASSERT_TRUE(BiasAddChannels(gpu(), n, c, hw, biasd.data(), yd.data()).ok());
    ASSERT_TRUE(BiasAddChannels(cpu(), n, c, hw, bias.data(), y.data()).ok());
    EXPECT_EQ(Download(yd), y);

    std::vector<float> db(c);
    auto dbd = Upload(std::vector<float>(c, 99.f));
    ASSERT_TRUE(BiasGradChannels(gpu(), n, c, hw, yd.data(), dbd.data()).ok());
    ASSERT_TRUE(BiasGradChannels(cpu(), n, c, hw, y.data(), db.data()).ok());
    ExpectClose(Download(dbd), db, n * hw, "db");
  }
}

TEST_F(CudaMaxPool2dTest, MatchesCpuExactlyWithTiesAndOddSizes) {
  uint32_t seed = 400;
  for (auto [n, c, h, w] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 1, 2, 2},
                            {2, 3, 5, 7},
                            {1, 2, 3, 2},
                            {64, 32, 28, 28},
                            {64, 64, 14, 14},
                            {3, 4, 9, 9}}) {
    SCOPED_TRACE(testing::Message() << n << "x" << c << "x" << h << "x" << w);
    const auto x = TiedVector(n * c * h * w, seed++);
    const auto dy = RandomVector(n * c * (h / 2) * (w / 2), seed++);
    std::vector<float> y(dy.size()), dx(x.size());
    auto xd = Upload(x), dyd = Upload(dy);
    auto yd = Upload(std::vector<float>(y.size(), std::numeric_limits<float>::quiet_NaN()));
    auto dxd = Upload(std::vector<float>(x.size(), std::numeric_limits<float>::quiet_NaN()));
    ASSERT_TRUE(MaxPool2dForward(cpu(), n, c, h, w, x.data(), y.data()).ok());
    Status st = MaxPool2dForward(gpu(), n, c, h, w, xd.data(), yd.data());
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(Download(yd), y);
    ASSERT_TRUE(
        MaxPool2dBackward(cpu(), n, c, h, w, x.data(), y.data(), dy.data(), dx.data()).ok());
    st = MaxPool2dBackward(gpu(), n, c, h, w, xd.data(), yd.data(), dyd.data(), dxd.data());
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(Download(dxd), dx)
        << "the gradient goes to the first maximum; the left-out edge is zero";
  }
}

}  // namespace
}  // namespace leash::kernels
