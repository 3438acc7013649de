// Tests of the CUDA kernels against the CPU kernels on the same random data, through the
// entry points of kernels.h. Labelled gpu; every test skips where no GPU is usable.
// Single-threaded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "leash/kernels/kernels.h"
#include "test_inputs.h"

namespace leash::kernels {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

using CudaKernelsTest = CudaAgainstCpuTest;

TEST_F(CudaKernelsTest, GemmMatchesCpuForEveryTransposeAndOddSizes) {
  struct Shape {
    int64_t m, n, k;
  };
  uint32_t seed = 1;
  for (Shape s : {Shape{1, 1, 1}, Shape{7, 13, 5}, Shape{33, 17, 65}, Shape{64, 256, 784},
                  Shape{3, 257, 2}}) {
    for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
      for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
        SCOPED_TRACE(testing::Message()
                     << "m=" << s.m << " n=" << s.n << " k=" << s.k
                     << " ta=" << (ta == Transpose::kYes) << " tb=" << (tb == Transpose::kYes));
        const auto a = RandomVector(s.m * s.k, seed++);
        const auto b = RandomVector(s.k * s.n, seed++);
        auto c = RandomVector(s.m * s.n, seed++);
        auto da = Upload(a), db = Upload(b), dc = Upload(c);
        ASSERT_TRUE(
            Gemm(gpu(), ta, tb, s.m, s.n, s.k, 0.7f, da.data(), db.data(), -0.3f, dc.data()).ok());
        ASSERT_TRUE(
            Gemm(cpu(), ta, tb, s.m, s.n, s.k, 0.7f, a.data(), b.data(), -0.3f, c.data()).ok());
        // Summation orders differ; the error grows like sqrt(k).
        ExpectClose(Download(dc), c, 1e-5f, 1e-5f * std::sqrt(static_cast<float>(s.k)) * 4, "C");
      }
    }
  }
}

TEST_F(CudaKernelsTest, GemmWithBetaZeroIgnoresCAndZeroKScales) {
  const auto a = RandomVector(6 * 4, 10);
  const auto b = RandomVector(4 * 5, 11);
  std::vector<float> c(6 * 5, std::numeric_limits<float>::quiet_NaN());
  auto da = Upload(a), db = Upload(b), dc = Upload(c);
  ASSERT_TRUE(Gemm(gpu(), Transpose::kNo, Transpose::kNo, 6, 5, 4, 1.f, da.data(), db.data(), 0.f,
                   dc.data())
                  .ok());
  ASSERT_TRUE(
      Gemm(cpu(), Transpose::kNo, Transpose::kNo, 6, 5, 4, 1.f, a.data(), b.data(), 0.f, c.data())
          .ok());
  ExpectClose(Download(dc), c, 1e-5f, 1e-6f, "C");

  auto scaled = Upload(std::vector<float>{1.f, 2.f, -4.f, 8.f});
  ASSERT_TRUE(Gemm(gpu(), Transpose::kNo, Transpose::kNo, 2, 2, 0, 1.f, nullptr, nullptr, 0.5f,
                   scaled.data())
                  .ok());
  EXPECT_EQ(Download(scaled), (std::vector<float>{0.5f, 1.f, -2.f, 4.f}));
}

TEST_F(CudaKernelsTest, BiasAddAndBiasGradMatchCpu) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {7, 13}, {1000, 37}, {3, 1025}}) {
    SCOPED_TRACE(testing::Message() << rows << " x " << cols);
    auto y = RandomVector(rows * cols, 20);
    const auto bias = RandomVector(cols, 21);
    auto dy = Upload(y), dbias = Upload(bias);
    ASSERT_TRUE(BiasAdd(gpu(), rows, cols, dbias.data(), dy.data()).ok());
    ASSERT_TRUE(BiasAdd(cpu(), rows, cols, bias.data(), y.data()).ok());
    EXPECT_EQ(Download(dy), y);

    std::vector<float> db(cols, 99.f);
    auto ddb = Upload(db);
    ASSERT_TRUE(BiasGrad(gpu(), rows, cols, dy.data(), ddb.data()).ok());
    ASSERT_TRUE(BiasGrad(cpu(), rows, cols, y.data(), db.data()).ok());
    ExpectClose(Download(ddb), db, 1e-5f, 1e-5f * std::sqrt(static_cast<float>(rows)), "db");
  }
}

TEST_F(CudaKernelsTest, ReluAndBackwardMatchCpuInPlace) {
  const int64_t n = (int64_t{1} << 24) + 3;  // more than the 65536 x 256 threads of one grid pass
  auto x = RandomVector(n, 30);
  x[0] = 0.f;
  x[1] = -0.f;
  auto dx = Upload(x);
  ASSERT_TRUE(Relu(gpu(), n, dx.data(), dx.data()).ok());
  ASSERT_TRUE(Relu(cpu(), n, x.data(), x.data()).ok());
  EXPECT_EQ(Download(dx), x);

  auto g = RandomVector(n, 31);
  auto dg = Upload(g);
  ASSERT_TRUE(ReluBackward(gpu(), n, dx.data(), dg.data(), dg.data()).ok());
  ASSERT_TRUE(ReluBackward(cpu(), n, x.data(), g.data(), g.data()).ok());
  EXPECT_EQ(Download(dg), g);
}

TEST_F(CudaKernelsTest, SoftmaxCrossEntropyMatchesCpu) {
  for (auto [rows, classes] : {std::pair<int64_t, int64_t>{1, 1}, {1000, 10}, {5, 100}, {77, 33}}) {
    SCOPED_TRACE(testing::Message() << rows << " x " << classes);
    const auto logits = RandomVector(rows * classes, 40, -6.f, 6.f);
    const auto labels = RandomLabels(rows, static_cast<int32_t>(classes), 41);
    auto dlogits_d = Upload(std::vector<float>(rows * classes, 7.f));
    auto logits_d = Upload(logits);
    auto labels_d = Upload(labels);
    float loss_gpu = -1.f, loss_cpu = -2.f;
    int64_t correct_gpu = -1, correct_cpu = -2;
    std::vector<float> dlogits(rows * classes);
    ASSERT_TRUE(SoftmaxCrossEntropy(gpu(), rows, classes, logits_d.data(), labels_d.data(),
                                    dlogits_d.data(), &loss_gpu, &correct_gpu)
                    .ok());
    ASSERT_TRUE(SoftmaxCrossEntropy(cpu(), rows, classes, logits.data(), labels.data(),
                                    dlogits.data(), &loss_cpu, &correct_cpu)
                    .ok());
    EXPECT_NEAR(loss_gpu, loss_cpu, 1e-5f * (1 + std::abs(loss_cpu)));
    EXPECT_EQ(correct_gpu, correct_cpu);
    ExpectClose(Download(dlogits_d), dlogits, 1e-5f, 1e-7f, "dlogits");

    // Without dlogits, the same totals.
    float loss_only = -1.f;
    ASSERT_TRUE(SoftmaxCrossEntropy(gpu(), rows, classes, logits_d.data(), labels_d.data(), nullptr,
                                    &loss_only, nullptr)
                    .ok());
    EXPECT_NEAR(loss_only, loss_cpu, 1e-5f * (1 + std::abs(loss_cpu)));
  }
}

TEST_F(CudaKernelsTest, SoftmaxArgmaxTiesAndHugeLogitsMatchCpu) {
  // Ties spread across lanes (class 3 and 35 equal), and offsets that overflow exp().
  const int64_t rows = 4, classes = 40;
  auto logits = RandomVector(rows * classes, 50, -1.f, 1.f);
  logits[0 * classes + 3] = logits[0 * classes + 35] = 9.f;
  for (int64_t c = 0; c < classes; ++c) logits[1 * classes + c] = 2.f;
  for (int64_t c = 0; c < classes; ++c) logits[2 * classes + c] += 1e4f;
  for (int64_t c = 0; c < classes; ++c) logits[3 * classes + c] -= 1e4f;
  const std::vector<int32_t> labels = {3, 0, 5, 39};
  auto logits_d = Upload(logits);
  auto labels_d = Upload(labels);
  auto dlogits_d = Upload(std::vector<float>(rows * classes));
  float loss_gpu = 0.f, loss_cpu = 0.f;
  int64_t correct_gpu = 0, correct_cpu = 0;
  std::vector<float> dlogits(rows * classes);
  ASSERT_TRUE(SoftmaxCrossEntropy(gpu(), rows, classes, logits_d.data(), labels_d.data(),
                                  dlogits_d.data(), &loss_gpu, &correct_gpu)
                  .ok());
  ASSERT_TRUE(SoftmaxCrossEntropy(cpu(), rows, classes, logits.data(), labels.data(),
                                  dlogits.data(), &loss_cpu, &correct_cpu)
                  .ok());
  EXPECT_TRUE(std::isfinite(loss_gpu));
  EXPECT_NEAR(loss_gpu, loss_cpu, 1e-4f * (1 + std::abs(loss_cpu)));
  EXPECT_EQ(correct_gpu, correct_cpu);
  ExpectClose(Download(dlogits_d), dlogits, 1e-4f, 1e-6f, "dlogits");
}

TEST_F(CudaKernelsTest, SoftmaxLabelsOutOfRangeAreInvalidArgument) {
  const auto logits = RandomVector(3 * 4, 60);
  auto logits_d = Upload(logits);
  auto labels_d = Upload(std::vector<int32_t>{0, 4, -1});
  float loss = 0.f;
  Status s =
      SoftmaxCrossEntropy(gpu(), 3, 4, logits_d.data(), labels_d.data(), nullptr, &loss, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("2 of 3 labels are outside [0, 4)"), std::string::npos) << s;
  // The context is still usable afterwards.
  EXPECT_TRUE(gpu().Synchronize().ok());
}

TEST_F(CudaKernelsTest, OptimizersMatchCpuOverSeveralSteps) {
  const int64_t n = 10007;
  const auto w0 = RandomVector(n, 70);
  std::vector<std::vector<float>> grads;
  for (uint32_t step = 0; step < 3; ++step) grads.push_back(RandomVector(n, 71 + step));
  std::vector<Buffer> grads_d;
  for (const auto& g : grads) grads_d.push_back(Upload(g));
  const std::vector<float> zeros(n, 0.f);

  {
    SCOPED_TRACE("sgd");
    auto w = w0;
    auto wd = Upload(w0);
    const SgdParams p{0.1f, 0.01f};
    for (size_t t = 0; t < grads.size(); ++t) {
      ASSERT_TRUE(SgdUpdate(gpu(), n, p, grads_d[t].data(), wd.data()).ok());
      ASSERT_TRUE(SgdUpdate(cpu(), n, p, grads[t].data(), w.data()).ok());
    }
    ExpectClose(Download(wd), w, 1e-6f, 1e-6f, "w");
  }
  {
    SCOPED_TRACE("momentum");
    auto w = w0, v = zeros;
    auto wd = Upload(w0), vd = Upload(zeros);
    const MomentumParams p{0.1f, 0.9f, 0.01f};
    for (size_t t = 0; t < grads.size(); ++t) {
      ASSERT_TRUE(MomentumUpdate(gpu(), n, p, grads_d[t].data(), wd.data(), vd.data()).ok());
      ASSERT_TRUE(MomentumUpdate(cpu(), n, p, grads[t].data(), w.data(), v.data()).ok());
    }
    ExpectClose(Download(wd), w, 1e-6f, 1e-6f, "w");
    ExpectClose(Download(vd), v, 1e-6f, 1e-6f, "v");
  }
  {
    SCOPED_TRACE("adam");
    auto w = w0, m = zeros, v = zeros;
    auto wd = Upload(w0), md = Upload(zeros), vd = Upload(zeros);
    const AdamParams p{0.01f, 0.9f, 0.999f, 1e-8f, 0.01f};
    for (size_t t = 0; t < grads.size(); ++t) {
      const auto step = static_cast<int64_t>(t + 1);
      ASSERT_TRUE(
          AdamUpdate(gpu(), n, p, step, grads_d[t].data(), wd.data(), md.data(), vd.data()).ok());
      ASSERT_TRUE(
          AdamUpdate(cpu(), n, p, step, grads[t].data(), w.data(), m.data(), v.data()).ok());
    }
    ExpectClose(Download(wd), w, 1e-5f, 1e-6f, "w");
    ExpectClose(Download(md), m, 1e-5f, 1e-7f, "m");
    ExpectClose(Download(vd), v, 1e-5f, 1e-9f, "v");
  }
  {
    SCOPED_TRACE("adagrad");
    auto w = w0, acc = zeros;
    auto wd = Upload(w0), accd = Upload(zeros);
    const AdagradParams p{0.1f, 1e-10f, 0.01f};
    for (size_t t = 0; t < grads.size(); ++t) {
      ASSERT_TRUE(AdagradUpdate(gpu(), n, p, grads_d[t].data(), wd.data(), accd.data()).ok());
      ASSERT_TRUE(AdagradUpdate(cpu(), n, p, grads[t].data(), w.data(), acc.data()).ok());
    }
    ExpectClose(Download(wd), w, 1e-5f, 1e-6f, "w");
    ExpectClose(Download(accd), acc, 1e-5f, 1e-7f, "acc");
  }
}

TEST_F(CudaKernelsTest, HalfConversionsAreBitIdenticalToCpu) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    // Every 16-bit pattern to float.
    std::vector<uint16_t> all(65536);
    for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
    auto all_d = Upload(all);
    auto floats_d = Upload(std::vector<float>(all.size()));
    ASSERT_TRUE(ConvertFromHalf(gpu(), static_cast<int64_t>(all.size()), all_d.data(),
                                floats_d.data(), bf16)
                    .ok());
    std::vector<float> floats(all.size());
    ASSERT_TRUE(
        ConvertFromHalf(cpu(), static_cast<int64_t>(all.size()), all.data(), floats.data(), bf16)
            .ok());
    const auto floats_gpu = Download(floats_d);
    // half.h's contract: a NaN stays a NaN of the same sign (the CPU's F16C sets a signaling
    // NaN's quiet bit, the GPU keeps it); every other value is bit-identical.
    size_t nans = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      if (std::isnan(floats[i])) {
        ++nans;
        ASSERT_TRUE(std::isnan(floats_gpu[i])) << std::hex << i;
        ASSERT_EQ(std::signbit(floats_gpu[i]), std::signbit(floats[i])) << std::hex << i;
      } else {
        ASSERT_EQ(Bits(floats_gpu[i]), Bits(floats[i])) << std::hex << i;
      }
    }
    EXPECT_EQ(nans, bf16 ? 2u * 127u : 2u * 1023u);  // every NaN pattern, and only those

    // Random floats over the whole range plus the special values, to 16 bits.
    std::vector<float> x = RandomVector(100000, 80, -70000.f, 70000.f);
    std::mt19937 rng(81);
    for (int i = 0; i < 100000; ++i) {
      uint32_t u = rng();
      float f;
      std::memcpy(&f, &u, sizeof f);
      x.push_back(f);  // any bit pattern: subnormals, NaNs with payloads, infinities
    }
    const float sub = std::ldexp(1.f, -24);
    for (float f :
         {0.f, -0.f, sub, sub / 2, sub * 1.5f, 65504.f, 65519.f, 65520.f, INFINITY, -INFINITY,
          std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::max(), 1e-40f}) {
      x.push_back(f);
    }
    auto x_d = Upload(x);
    auto h_d = Upload(std::vector<uint16_t>(x.size()));
    ASSERT_TRUE(
        ConvertToHalf(gpu(), static_cast<int64_t>(x.size()), x_d.data(), h_d.data(), bf16).ok());
    std::vector<uint16_t> h(x.size());
    ASSERT_TRUE(
        ConvertToHalf(cpu(), static_cast<int64_t>(x.size()), x.data(), h.data(), bf16).ok());
    const auto h_gpu = Download(h_d);
    const uint16_t exp = bf16 ? 0x7f80 : 0x7c00, mant = bf16 ? 0x7f : 0x3ff;
    auto is_nan16 = [&](uint16_t v) { return (v & exp) == exp && (v & mant) != 0; };
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(x[i])) {  // as above: a NaN of the same sign, its payload the device's
        ASSERT_TRUE(is_nan16(h[i]) && is_nan16(h_gpu[i])) << std::hex << Bits(x[i]);
        ASSERT_EQ(h_gpu[i] & 0x8000, h[i] & 0x8000) << std::hex << Bits(x[i]);
      } else {
        ASSERT_EQ(h_gpu[i], h[i]) << std::hex << Bits(x[i]);
      }
    }
  }
}

TEST_F(CudaKernelsTest, BuffersRoundTripAndRejectTheWrongContext) {
  auto buf = Buffer::Allocate(gpu(), 1000);
  ASSERT_TRUE(buf.ok()) << buf.status();
  EXPECT_EQ(buf->device(), (Device{DeviceType::kCuda, 0}));
  EXPECT_EQ(Download(*buf), std::vector<float>(1000, 0.f));  // zero-filled
  const auto data = RandomVector(10, 90);
  ASSERT_TRUE(buf->CopyFromHost(gpu(), data.data(), 10, 990).ok());
  std::vector<float> back(10);
  ASSERT_TRUE(buf->CopyToHost(gpu(), back.data(), 10, 990).ok());
  EXPECT_EQ(back, data);
  EXPECT_EQ(buf->CopyToHost(cpu(), back.data(), 10).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(buf->CopyFromHost(gpu(), data.data(), 10, 991).code(), StatusCode::kInvalidArgument);

  auto labels = Int32Buffer::Allocate(gpu(), 3);
  ASSERT_TRUE(labels.ok());
  const std::vector<int32_t> l = {2, 0, 1};
  ASSERT_TRUE(CopyInt32FromHost(gpu(), l.data(), 3, labels->data()).ok());
  EXPECT_EQ(Download(*labels), l);
  EXPECT_TRUE(gpu().Synchronize().ok());
}

// A copy queued from pinned memory on the copy stream, then a kernel on the context that
// the copy must precede (ContextWaitsForCopies), then the next copy into the same buffer
// that must wait for that kernel (CopiesWaitForContext): the results show both orders held.
TEST_F(CudaKernelsTest, CopyStreamIsOrderedAgainstTheContextByEvents) {
  const size_t n = 1 << 20;  // big enough that an unordered copy would be caught mid-way
  auto pinned = PinnedHostBuffer::Allocate(gpu(), n * sizeof(float));
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  auto copies = CopyStream::Create(gpu());
  ASSERT_TRUE(copies.ok()) << copies.status();
  auto x = Buffer::Allocate(gpu(), n);
  auto y = Buffer::Allocate(gpu(), n);
  ASSERT_TRUE(x.ok() && y.ok());
  auto* host = static_cast<float*>(pinned->data());
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 7) - 3.f;
  ASSERT_TRUE((*copies)->CopyToDevice(x->data(), host, n * sizeof(float)).ok());
  ASSERT_TRUE((*copies)->ContextWaitsForCopies().ok());
  ASSERT_TRUE(Relu(gpu(), static_cast<int64_t>(n), x->data(), y->data()).ok());
  ASSERT_TRUE((*copies)->CopiesWaitForContext().ok());
  ASSERT_TRUE((*copies)->Synchronize().ok());
  for (size_t i = 0; i < n; ++i) host[i] = -1.f;
  ASSERT_TRUE((*copies)->CopyToDevice(x->data(), host, n * sizeof(float)).ok());
  ASSERT_TRUE((*copies)->Synchronize().ok());
  const auto relu = Download(*y);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(relu[i], std::max(static_cast<float>(i % 7) - 3.f, 0.f)) << i;
  EXPECT_EQ(Download(*x), std::vector<float>(n, -1.f));
  EXPECT_EQ((*copies)->CopyToDevice(nullptr, host, 4).code(), StatusCode::kInvalidArgument);
}

TEST_F(CudaKernelsTest, MissingGpuIndexIsUnavailable) {
  auto ctx = Context::Create(Device{DeviceType::kCuda, CudaDeviceCount()});
  EXPECT_EQ(ctx.status().code(), StatusCode::kUnavailable) << ctx.status();
  auto parsed = ParseDevice("cuda:" + std::to_string(CudaDeviceCount()));
  EXPECT_EQ(parsed.status().code(), StatusCode::kUnavailable) << parsed.status();
  auto any = ParseDevice("auto");
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->type, DeviceType::kCuda);
}

}  // namespace
}  // namespace leash::kernels
