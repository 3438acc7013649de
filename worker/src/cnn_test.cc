// Tests of the CNN model: gradients against central differences of a double-precision
// reference network, the on_grad order, SGD through the kernels on real Fashion-MNIST
// samples, chunked evaluation, bad arguments, parameters bound in place against copied
// ones, and CUDA against CPU. Built twice: cnn_test
// holds the CPU tests; cnn_cuda_test (LEASH_CNN_CUDA_TEST, labelled gpu) only the CUDA one,
// which skips where no GPU is usable. Single-threaded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "leash/kernels/kernels.h"
#include "leash/worker/dataset.h"
#include "leash/worker/model.h"

#include "model_checks.h"
#include "test_inputs.h"

#ifndef LEASH_CNN_CUDA_TEST
#define LEASH_CNN_CUDA_TEST 0
#endif

namespace leash::worker {
namespace {

using kernels::Context;
using kernels::Device;
using kernels::DeviceType;
using kernels::RandomLabels;

constexpr int64_t kPixels = 28 * 28;
constexpr int64_t kClasses = 10;

std::vector<float> NormalVector(size_t n, std::mt19937& rng, float stddev) {
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Values for every parameter as its ParamSpec says (He-normal weights), with biases made
// small and random when `random_biases` so that their gradients are exercised too; set
// into `model`.
std::vector<std::vector<float>> InitParams(Model& model, std::mt19937& rng, bool random_biases) {
  std::vector<std::vector<float>> values;
  for (size_t i = 0; i < model.params().size(); ++i) {
    const ParamSpec& p = model.params()[i];
    const float stddev = p.init == InitKind::kNormal ? p.init_scale : random_biases ? 0.1f : 0.f;
    values.push_back(NormalVector(p.size(), rng, stddev));
    EXPECT_TRUE(model.SetParam(i, values.back().data()).ok());
  }
  return values;
}

#if !LEASH_CNN_CUDA_TEST

// ---- The same network in double precision, straight from the definition in model.h.

using Tensor = std::vector<double>;

// 3x3 convolution with padding 1 and bias, ReLU, then 2x2 max pooling, of n images of
// c_in x size x size; weight is c_out x c_in x 3 x 3.
Tensor RefConvBlock(const Tensor& x, int64_t n, int64_t c_in, int64_t size, const Tensor& w,
                    const Tensor& b, int64_t c_out) {
  Tensor act(n * c_out * size * size);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t o = 0; o < c_out; ++o) {
      for (int64_t r = 0; r < size; ++r) {
        for (int64_t c = 0; c < size; ++c) {
          double s = b[o];
          for (int64_t ci = 0; ci < c_in; ++ci) {
            for (int64_t a = 0; a < 3; ++a) {
              const int64_t ih = r + a - 1;
              if (ih < 0 || ih >= size) continue;
              for (int64_t bb = 0; bb < 3; ++bb) {
                const int64_t iw = c + bb - 1;
                if (iw < 0 || iw >= size) continue;
                s += w[((o * c_in + ci) * 3 + a) * 3 + bb] *
                     x[((i * c_in + ci) * size + ih) * size + iw];
              }
            }
          }
          act[((i * c_out + o) * size + r) * size + c] = std::max(s, 0.0);
        }
      }
    }
  }
  const int64_t half = size / 2;
  Tensor pooled(n * c_out * half * half);
  for (int64_t plane = 0; plane < n * c_out; ++plane) {
    for (int64_t r = 0; r < half; ++r) {
      for (int64_t c = 0; c < half; ++c) {
        const double* top = &act[(plane * size + 2 * r) * size + 2 * c];
        pooled[(plane * half + r) * half + c] =
            std::max({top[0], top[1], top[size], top[size + 1]});
      }
    }
  }
  return pooled;
}

// x W + b (W is in x out), optionally through ReLU.
Tensor RefDense(const Tensor& x, int64_t n, int64_t in, int64_t out, const Tensor& w,
                const Tensor& b, bool relu) {
  Tensor y(n * out);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < out; ++j) {
      double s = b[j];
      for (int64_t k = 0; k < in; ++k) s += x[i * in + k] * w[k * out + j];
      y[i * out + j] = relu ? std::max(s, 0.0) : s;
    }
  }
  return y;
}

double RefLoss(const std::vector<Tensor>& p, const std::vector<float>& images,
               const std::vector<int32_t>& labels, int64_t n) {
  const Tensor x(images.begin(), images.begin() + n * kPixels);
  const Tensor p1 = RefConvBlock(x, n, 1, 28, p[0], p[1], 32);
  const Tensor p2 = RefConvBlock(p1, n, 32, 14, p[2], p[3], 64);
  const Tensor h = RefDense(p2, n, 3136, 128, p[4], p[5], true);
  const Tensor logits = RefDense(h, n, 128, kClasses, p[6], p[7], false);
  return kernels::RefSoftmaxLoss(n, kClasses, logits, labels);
}

class CnnTest : public kernels::CpuContextTest {
 protected:
  std::unique_ptr<Model> Make(int64_t max_batch) {
    auto m = MakeCnn(*ctx_, max_batch);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(m).value() : nullptr;
  }
};

TEST_F(CnnTest, ParamsDescribeTheLayersHeInitialized) {
  auto model = Make(4);
  ASSERT_NE(model, nullptr);
  struct Want {
    const char* name;
    uint64_t rows;
    uint32_t cols;
    float stddev;  // 0: zeros
  };
  const Want want[] = {
      {"cnn/conv1/w", 32, 9, std::sqrt(2.f / 9)},      {"cnn/conv1/b", 1, 32, 0.f},
      {"cnn/conv2/w", 64, 288, std::sqrt(2.f / 288)},  {"cnn/conv2/b", 1, 64, 0.f},
      {"cnn/fc1/w", 3136, 128, std::sqrt(2.f / 3136)}, {"cnn/fc1/b", 1, 128, 0.f},
      {"cnn/fc2/w", 128, 10, std::sqrt(2.f / 128)},    {"cnn/fc2/b", 1, 10, 0.f},
  };
  const auto& p = model->params();
  ASSERT_EQ(p.size(), std::size(want));
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i].name, want[i].name);
    EXPECT_EQ(p[i].rows, want[i].rows) << want[i].name;
    EXPECT_EQ(p[i].cols, want[i].cols) << want[i].name;
    EXPECT_EQ(p[i].init, want[i].stddev > 0 ? InitKind::kNormal : InitKind::kZeros) << want[i].name;
    EXPECT_FLOAT_EQ(p[i].init_scale, want[i].stddev) << want[i].name;
  }
  EXPECT_EQ(model->input_size(), kPixels);
  EXPECT_EQ(model->num_classes(), kClasses);
}

TEST_F(CnnTest, GradientsMatchCentralDifferencesOfReference) {
  // A batch of two; the double reference is too slow to difference all 422,026
  // parameters, so a random sample of each table is checked.
  const int64_t batch = 2;
  const size_t per_table = 16;
  std::mt19937 rng(17);
  auto model = Make(batch);
  ASSERT_NE(model, nullptr);
  const auto values = InitParams(*model, rng, true);
  const auto images = NormalVector(batch * kPixels, rng, 1.f);
  const auto labels = RandomLabels(batch, kClasses, rng);

  std::vector<std::vector<float>> grads(values.size());
  auto stats = model->TrainStep(images.data(), labels.data(), batch, [&](size_t i) {
    grads[i].resize(values[i].size());
    EXPECT_TRUE(model->Gradient(i, grads[i].data()).ok());
  });
  ASSERT_TRUE(stats.ok()) << stats.status();

  std::vector<Tensor> params;
  for (const auto& v : values) params.emplace_back(v.begin(), v.end());
  EXPECT_NEAR(stats->loss, RefLoss(params, images, labels, batch), 1e-5);

  // A tiny step in double keeps clear of ReLU kinks and changes of a pooling maximum.
  const double eps = 1e-6;
  for (size_t t = 0; t < params.size(); ++t) {
    std::vector<size_t> elements(params[t].size());
    for (size_t e = 0; e < elements.size(); ++e) elements[e] = e;
    std::shuffle(elements.begin(), elements.end(), rng);
    elements.resize(std::min(per_table, elements.size()));
    for (size_t e : elements) {
      const double saved = params[t][e];
      params[t][e] = saved + eps;
      const double up = RefLoss(params, images, labels, batch);
      params[t][e] = saved - eps;
      const double down = RefLoss(params, images, labels, batch);
      params[t][e] = saved;
      const double numeric = (up - down) / (2 * eps);
      EXPECT_NEAR(grads[t][e], numeric, 1e-6 + 1e-4 * std::abs(numeric))
          << model->params()[t].name << " element " << e;
    }
  }
}

TEST_F(CnnTest, OnGradIsCalledOncePerParameterLastLayerFirst) {
  auto model = Make(3);
  ASSERT_NE(model, nullptr);
  std::vector<float> out(3136 * 128);
  EXPECT_EQ(model->Gradient(0, out.data()).code(), StatusCode::kFailedPrecondition);

  std::mt19937 rng(3);
  const auto images = NormalVector(3 * kPixels, rng, 1.f);
  const auto labels = RandomLabels(3, kClasses, rng);
  std::vector<size_t> order;
  auto stats = model->TrainStep(images.data(), labels.data(), 3, [&](size_t i) {
    order.push_back(i);
    // The gradient is final when announced, and only the announced ones are.
    EXPECT_TRUE(model->Gradient(i, out.data()).ok());
    if (i >= 2) {
      EXPECT_EQ(model->Gradient(i - 2, out.data()).code(), StatusCode::kFailedPrecondition);
    }
  });
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(order, (std::vector<size_t>{7, 6, 5, 4, 3, 2, 1, 0}));
  // Without a callback the gradients are still there afterwards.
  ASSERT_TRUE(model->TrainStep(images.data(), labels.data(), 3).ok());
  EXPECT_TRUE(model->Gradient(0, out.data()).ok());
}

TEST_F(CnnTest, SgdThroughKernelsLowersTheLossOnFashionMnist) {
  auto data = LoadFashionMnist("", /*train=*/true);
  if (data.status().code() == StatusCode::kNotFound) GTEST_SKIP() << data.status();
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->features(), kPixels);
  const int64_t n = 512, batch = 32;
  data->Truncate(n);

  auto model = Make(batch);
  ASSERT_NE(model, nullptr);
  // A worker keeps the parameters it pulled; here they start as the ParamSpecs say, and
  // plain SGD applied by the kernels updates them after each step.
  std::mt19937 rng(11);
  auto params = InitParams(*model, rng, false);
  auto before = model->Evaluate(data->images.data(), data->labels.data(), n);
  ASSERT_TRUE(before.ok()) << before.status();

  const kernels::SgdParams sgd{0.05f, 0.f};
  std::vector<float> grad;
  for (int epoch = 0; epoch < 5; ++epoch) {
    for (int64_t start = 0; start < n; start += batch) {
      auto stats = model->TrainStep(
          data->images.data() + start * kPixels, data->labels.data() + start, batch, [&](size_t i) {
            grad.resize(params[i].size());
            ASSERT_TRUE(model->Gradient(i, grad.data()).ok());
            ASSERT_TRUE(kernels::SgdUpdate(*ctx_, static_cast<int64_t>(grad.size()), sgd,
                                           grad.data(), params[i].data())
                            .ok());
          });
      ASSERT_TRUE(stats.ok()) << stats.status();
      for (size_t i = 0; i < params.size(); ++i)
        ASSERT_TRUE(model->SetParam(i, params[i].data()).ok());
    }
  }
  auto after = model->Evaluate(data->images.data(), data->labels.data(), n);
  ASSERT_TRUE(after.ok()) << after.status();
  // He-initialized logits start large (loss about 4.8); five epochs reach about 0.5 and
  // 83% of the samples right.
  EXPECT_LT(after->loss, before->loss / 4) << "from " << before->loss;
  EXPECT_GE(after->correct, n * 75 / 100);
  // And it generalizes: images it never saw are mostly right too (about 75%).
  auto test = LoadFashionMnist("", /*train=*/false);
  ASSERT_TRUE(test.ok()) << test.status();
  test->Truncate(500);
  auto held_out = model->Evaluate(test->images.data(), test->labels.data(), test->count);
  ASSERT_TRUE(held_out.ok()) << held_out.status();
  EXPECT_GE(held_out->correct, test->count * 65 / 100);
}

TEST_F(CnnTest, EvaluateInChunksEqualsEvaluatingAtOnce) {
  const int64_t n = 23;
  std::mt19937 rng(5);
  auto small = Make(5);  // 23 = 4 * 5 + 3: a ragged last chunk
  auto large = Make(32);
  ASSERT_NE(small, nullptr);
  ASSERT_NE(large, nullptr);
  const auto values = InitParams(*small, rng, true);
  for (size_t i = 0; i < values.size(); ++i) ASSERT_TRUE(large->SetParam(i, values[i].data()).ok());
  const auto images = NormalVector(n * kPixels, rng, 1.f);
  const auto labels = RandomLabels(n, kClasses, rng);
  ExpectChunkedEvaluationMatchesWhole(*small, *large, images, labels, n, 1e-5);
}

// Work in proportion to speed trains batches of any size up to the one the model was built
// for (a straggler's share may be 19 of 192): after a full batch of other samples, a
// smaller batch's loss and gradients are those of a model built for exactly that batch.
TEST_F(CnnTest, ASmallerBatchAfterAFullOneTrainsAsAModelBuiltForIt) {
  constexpr int64_t kFull = 24, kSmall = 7;
  std::mt19937 rng(23);
  auto large = Make(kFull);
  auto exact = Make(kSmall);
  ASSERT_NE(large, nullptr);
  ASSERT_NE(exact, nullptr);
  const auto values = InitParams(*large, rng, true);
  for (size_t i = 0; i < values.size(); ++i) ASSERT_TRUE(exact->SetParam(i, values[i].data()).ok());
  const auto first = NormalVector(kFull * kPixels, rng, 1.f);
  const auto first_labels = RandomLabels(kFull, kClasses, rng);
  ASSERT_TRUE(large->TrainStep(first.data(), first_labels.data(), kFull).ok());
  const auto images = NormalVector(kSmall * kPixels, rng, 1.f);
  const auto labels = RandomLabels(kSmall, kClasses, rng);
  auto a = large->TrainStep(images.data(), labels.data(), kSmall);
  auto b = exact->TrainStep(images.data(), labels.data(), kSmall);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NEAR(a->loss, b->loss, 1e-5);
  EXPECT_EQ(a->correct, b->correct);
  for (size_t i = 0; i < values.size(); ++i) {
    std::vector<float> ga(values[i].size()), gb(values[i].size());
    ASSERT_TRUE(large->Gradient(i, ga.data()).ok());
    ASSERT_TRUE(exact->Gradient(i, gb.data()).ok());
    for (size_t e = 0; e < ga.size(); ++e) {
      ASSERT_NEAR(ga[e], gb[e], 1e-6f + 1e-4f * std::abs(gb[e]))
          << large->params()[i].name << " element " << e;
    }
  }
}

TEST_F(CnnTest, BadSizesAndArgumentsAreRejected) {
  EXPECT_EQ(MakeCnn(*ctx_, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCnn(*ctx_, -1).status().code(), StatusCode::kInvalidArgument);
  auto too_big = MakeCnn(*ctx_, 85599);
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("[1, 85598]"), std::string::npos) << too_big.status();

  auto model = Make(4);
  ASSERT_NE(model, nullptr);
  ExpectBadArgumentsRejected(*model, 4);
}

TEST_F(CnnTest, BoundParamsTrainBitIdenticallyToCopiedOnes) {
  auto copied = Make(3);
  auto bound = Make(3);
  ASSERT_NE(copied, nullptr);
  ASSERT_NE(bound, nullptr);
  ExpectNoHostGradientBeforeTraining(*bound);
  ExpectBoundParamsTrainLikeCopiedOnes(*copied, *bound, 3, 6);
}

TEST_F(CnnTest, BoundGradientsAreWrittenWhereBoundForOneStep) {
  auto own = Make(3);
  auto bound = Make(3);
  ASSERT_NE(own, nullptr);
  ASSERT_NE(bound, nullptr);
  ExpectBoundGradientsAreWrittenWhereBoundForOneStep(*own, *bound, 3, 8);
}

#else  // LEASH_CNN_CUDA_TEST

TEST(CnnTest, CudaModelMatchesCpuModel) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: this test needs a GPU";
  auto cpu_ctx = kernels::MakeCpuContext();
  ASSERT_NE(cpu_ctx, nullptr);
  auto gpu_ctx = Context::Create(Device{DeviceType::kCuda, 0});
  ASSERT_TRUE(gpu_ctx.ok()) << gpu_ctx.status();
  const int64_t batch = 17;
  auto cpu = MakeCnn(*cpu_ctx, batch);
  auto gpu = MakeCnn(**gpu_ctx, batch);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::mt19937 rng(9);
  const auto values = InitParams(**cpu, rng, true);
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_TRUE((*gpu)->SetParam(i, values[i].data()).ok());
  const auto images = NormalVector(batch * kPixels, rng, 1.f);
  const auto labels = RandomLabels(batch, kClasses, rng);

  std::vector<size_t> order;
  auto cpu_stats = (*cpu)->TrainStep(images.data(), labels.data(), batch);
  auto gpu_stats =
      (*gpu)->TrainStep(images.data(), labels.data(), batch, [&](size_t i) { order.push_back(i); });
  ASSERT_TRUE(cpu_stats.ok()) << cpu_stats.status();
  ASSERT_TRUE(gpu_stats.ok()) << gpu_stats.status();
  EXPECT_EQ(order, (std::vector<size_t>{7, 6, 5, 4, 3, 2, 1, 0}));
  EXPECT_NEAR(gpu_stats->loss, cpu_stats->loss, 1e-4 * (1 + cpu_stats->loss));
  EXPECT_EQ(gpu_stats->correct, cpu_stats->correct);
  for (size_t i = 0; i < values.size(); ++i) {
    std::vector<float> gc(values[i].size()), gg(values[i].size());
    ASSERT_TRUE((*cpu)->Gradient(i, gc.data()).ok());
    ASSERT_TRUE((*gpu)->Gradient(i, gg.data()).ok());
    // Tolerance relative to the table's largest gradient: sums of up to 17 x 784 terms in
    // different orders.
    float scale = 0.f;
    for (float g : gc) scale = std::max(scale, std::abs(g));
    for (size_t e = 0; e < gc.size(); ++e) {
      ASSERT_NEAR(gg[e], gc[e], 1e-4f * scale + 1e-3f * std::abs(gc[e]))
          << (*cpu)->params()[i].name << " " << e;
    }
  }
  auto cpu_eval = (*cpu)->Evaluate(images.data(), labels.data(), batch);
  auto gpu_eval = (*gpu)->Evaluate(images.data(), labels.data(), batch);
  ASSERT_TRUE(cpu_eval.ok()) << cpu_eval.status();
  ASSERT_TRUE(gpu_eval.ok()) << gpu_eval.status();
  EXPECT_NEAR(gpu_eval->loss, cpu_eval->loss, 1e-4 * (1 + cpu_eval->loss));
}

#endif  // LEASH_CNN_CUDA_TEST

}  // namespace
}  // namespace leash::worker
