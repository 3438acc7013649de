// Tests of the MLP model: gradients against central differences of a double-precision
// reference network, the on_grad order, learning a synthetic problem with SGD applied by
// the kernels, chunked evaluation, bad sizes, parameters bound in place and gradients
// read in place against copied ones, and (where a GPU exists) CUDA against CPU.
// Single-threaded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "leash/kernels/kernels.h"
#include "leash/worker/model.h"

#include "model_checks.h"
#include "test_inputs.h"

namespace leash::worker {
namespace {

using kernels::Context;
using kernels::Device;
using kernels::DeviceType;
using kernels::RandomLabels;
using kernels::RandomVector;

// Random values for every parameter of `model`, set into it.
std::vector<std::vector<float>> RandomizeParams(Model& model, std::mt19937& rng) {
  std::vector<std::vector<float>> values;
  for (size_t i = 0; i < model.params().size(); ++i) {
    const ParamSpec& p = model.params()[i];
    const float scale = p.rows == 1 ? 0.2f : 1.f / std::sqrt(static_cast<float>(p.rows));
    values.push_back(RandomVector(p.size(), rng, -scale, scale));
    EXPECT_TRUE(model.SetParam(i, values.back().data()).ok());
  }
  return values;
}

// The same network in double precision: x W + b, ReLU between layers, mean softmax CE.
double ReferenceLoss(const std::vector<std::vector<double>>& params,
                     const std::vector<float>& images, const std::vector<int32_t>& labels,
                     int64_t batch, int64_t input_size) {
  std::vector<double> a(images.begin(), images.begin() + batch * input_size);
  int64_t width = input_size;
  const size_t layers = params.size() / 2;
  for (size_t l = 0; l < layers; ++l) {
    const auto& w = params[2 * l];
    const auto& b = params[2 * l + 1];
    const auto out = static_cast<int64_t>(b.size());
    std::vector<double> z(batch * out);
    for (int64_t r = 0; r < batch; ++r) {
      for (int64_t j = 0; j < out; ++j) {
        double s = b[j];
        for (int64_t i = 0; i < width; ++i) s += a[r * width + i] * w[i * out + j];
        z[r * out + j] = l + 1 < layers ? std::max(s, 0.0) : s;
      }
    }
    a = std::move(z);
    width = out;
  }
  return kernels::RefSoftmaxLoss(batch, width, a, labels);
}

// Trains `direct` with plain TrainStep calls and `staged` with PrefetchBatch ahead of each
// step (also a prefetch that is never used, one discarded by Evaluate, and a short last
// batch) on the same parameters, and checks both trained the same batches the same way.
void ExpectPrefetchedStepsMatchDirectOnes(Model& direct, Model& staged, int64_t max_batch,
                                          double tolerance) {
  std::mt19937 rng(21);
  const auto values = RandomizeParams(direct, rng);
  for (size_t i = 0; i < values.size(); ++i) ASSERT_TRUE(staged.SetParam(i, values[i].data()).ok());
  const int64_t input = direct.input_size();
  struct B {
    std::vector<float> images;
    std::vector<int32_t> labels;
    int64_t size;
  };
  std::vector<B> batches;
  for (int b = 0; b < 7; ++b) {
    const int64_t size = b == 6 ? max_batch / 2 : max_batch;
    batches.push_back({RandomVector(size * input, rng, -1.f, 1.f),
                       RandomLabels(size, direct.num_classes(), rng), size});
  }
  auto step = [&](const B& b, const char* what) {
    auto d = direct.TrainStep(b.images.data(), b.labels.data(), b.size);
    auto s = staged.TrainStep(b.images.data(), b.labels.data(), b.size);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_NEAR(s->loss, d->loss, tolerance * (1 + d->loss)) << what;
    EXPECT_EQ(s->correct, d->correct) << what;
    for (size_t i = 0; i < values.size(); ++i) {
      std::vector<float> gd(values[i].size()), gs(values[i].size());
      ASSERT_TRUE(direct.Gradient(i, gd.data()).ok());
      ASSERT_TRUE(staged.Gradient(i, gs.data()).ok());
      for (size_t e = 0; e < gd.size(); ++e)
        ASSERT_NEAR(gs[e], gd[e], tolerance * (1 + std::abs(gd[e]))) << what;
    }
  };
  auto prefetch = [&](const B& b) {
    ASSERT_TRUE(staged.PrefetchBatch(b.images.data(), b.labels.data(), b.size).ok());
  };

  prefetch(batches[0]);
  step(batches[0], "a prefetched batch");
  prefetch(batches[1]);
  step(batches[1], "the next prefetched batch");
  EXPECT_EQ(staged.staging().used, 2);
  prefetch(batches[2]);
  step(batches[3], "another batch than the one prefetched");
  EXPECT_EQ(staged.staging().used, 2);
  prefetch(batches[4]);
  ASSERT_TRUE(
      staged.Evaluate(batches[5].images.data(), batches[5].labels.data(), batches[5].size).ok());
  step(batches[4], "a prefetch discarded by Evaluate");
  prefetch(batches[6]);
  step(batches[6], "a short prefetched batch");
  EXPECT_EQ(staged.staging().prefetched, 5);
  EXPECT_EQ(staged.staging().used, 3);

  std::vector<int32_t> bad_labels(batches[0].labels);
  bad_labels[3] = static_cast<int32_t>(direct.num_classes());
  EXPECT_EQ(staged.PrefetchBatch(batches[0].images.data(), bad_labels.data(), max_batch).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(staged.PrefetchBatch(batches[0].images.data(), batches[0].labels.data(), max_batch + 1)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(staged.PrefetchBatch(nullptr, batches[0].labels.data(), 1).code(),
            StatusCode::kInvalidArgument);
}

class MlpTest : public kernels::CpuContextTest {
 protected:
  std::unique_ptr<Model> Make(int64_t input, std::vector<int64_t> hidden, int64_t classes,
                              int64_t max_batch) {
    auto m = MakeMlp(*ctx_, input, std::move(hidden), classes, max_batch);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(m).value() : nullptr;
  }
};

TEST_F(MlpTest, ParamsDescribeHeInitializedLayers) {
  auto model = Make(5, {4}, 3, 8);
  ASSERT_NE(model, nullptr);
  const auto& p = model->params();
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].name, "mlp/fc1/w");
  EXPECT_EQ(p[0].rows, 5u);
  EXPECT_EQ(p[0].cols, 4u);
  EXPECT_EQ(p[0].init, InitKind::kNormal);
  EXPECT_FLOAT_EQ(p[0].init_scale, std::sqrt(2.f / 5.f));
  EXPECT_EQ(p[1].name, "mlp/fc1/b");
  EXPECT_EQ(p[1].rows, 1u);
  EXPECT_EQ(p[1].cols, 4u);
  EXPECT_EQ(p[1].init, InitKind::kZeros);
  EXPECT_EQ(p[2].name, "mlp/fc2/w");
  EXPECT_EQ(p[2].rows, 4u);
  EXPECT_EQ(p[2].cols, 3u);
  EXPECT_FLOAT_EQ(p[2].init_scale, std::sqrt(2.f / 4.f));
  EXPECT_EQ(p[3].size(), 3u);
  EXPECT_EQ(model->input_size(), 5);
  EXPECT_EQ(model->num_classes(), 3);
}

TEST_F(MlpTest, GradientsMatchCentralDifferencesOfReference) {
  const int64_t input = 5, classes = 3, batch = 3;
  for (const std::vector<int64_t>& hidden : {std::vector<int64_t>{4}, std::vector<int64_t>{6, 4}}) {
    SCOPED_TRACE(testing::Message() << "hidden layers: " << hidden.size());
    std::mt19937 rng(7 + static_cast<uint32_t>(hidden.size()));
    auto model = Make(input, hidden, classes, batch);
    ASSERT_NE(model, nullptr);
    const auto values = RandomizeParams(*model, rng);
    const auto images = RandomVector(batch * input, rng, -1.f, 1.f);
    const auto labels = RandomLabels(batch, classes, rng);

    std::vector<std::vector<float>> grads(values.size());
    auto stats = model->TrainStep(images.data(), labels.data(), batch, [&](size_t i) {
      grads[i].resize(values[i].size());
      EXPECT_TRUE(model->Gradient(i, grads[i].data()).ok());
    });
    ASSERT_TRUE(stats.ok()) << stats.status();

    std::vector<std::vector<double>> params;
    for (const auto& v : values) params.emplace_back(v.begin(), v.end());
    EXPECT_NEAR(stats->loss, ReferenceLoss(params, images, labels, batch, input), 1e-5);

    const double eps = 1e-4;
    for (size_t i = 0; i < params.size(); ++i) {
      for (size_t e = 0; e < params[i].size(); ++e) {
        const double saved = params[i][e];
        params[i][e] = saved + eps;
        const double up = ReferenceLoss(params, images, labels, batch, input);
        params[i][e] = saved - eps;
        const double down = ReferenceLoss(params, images, labels, batch, input);
        params[i][e] = saved;
        const double numeric = (up - down) / (2 * eps);
        EXPECT_NEAR(grads[i][e], numeric, 1e-4 + 1e-3 * std::abs(numeric))
            << model->params()[i].name << " element " << e;
      }
    }
  }
}

TEST_F(MlpTest, OnGradIsCalledOncePerParameterLastLayerFirst) {
  auto model = Make(5, {6, 4}, 3, 4);
  ASSERT_NE(model, nullptr);
  std::vector<float> out(30);
  EXPECT_EQ(model->Gradient(0, out.data()).code(), StatusCode::kFailedPrecondition);

  std::mt19937 rng(3);
  const auto images = RandomVector(4 * 5, rng, -1.f, 1.f);
  const auto labels = RandomLabels(4, 3, rng);
  std::vector<size_t> order;
  auto stats = model->TrainStep(images.data(), labels.data(), 4, [&](size_t i) {
    order.push_back(i);
    // The gradient is final when announced, and only the announced ones are.
    std::vector<float> g(model->params()[i].size());
    EXPECT_TRUE(model->Gradient(i, g.data()).ok());
    if (i >= 2) {
      EXPECT_EQ(model->Gradient(i - 2, g.data()).code(), StatusCode::kFailedPrecondition);
    }
  });
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(order, (std::vector<size_t>{5, 4, 3, 2, 1, 0}));
  // Without a callback the gradients are still there afterwards.
  ASSERT_TRUE(model->TrainStep(images.data(), labels.data(), 4).ok());
  EXPECT_TRUE(model->Gradient(0, out.data()).ok());
}

TEST_F(MlpTest, SgdThroughKernelsLearnsSyntheticClasses) {
  // Four Gaussian blobs in 8 dimensions, trained with plain SGD applied by the kernels.
  const int64_t input = 8, classes = 4, n = 512, batch = 32;
  std::mt19937 rng(11);
  std::vector<std::vector<float>> centers;
  for (int64_t c = 0; c < classes; ++c) centers.push_back(RandomVector(input, rng, -1.5f, 1.5f));
  std::normal_distribution<float> noise(0.f, 0.4f);
  std::vector<float> images(n * input);
  std::vector<int32_t> labels = RandomLabels(n, classes, rng);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t d = 0; d < input; ++d) images[i * input + d] = centers[labels[i]][d] + noise(rng);
  }

  auto model = Make(input, {16}, classes, batch);
  ASSERT_NE(model, nullptr);
  // A worker keeps the parameters it pulled; here they start He-initialized as specified.
  std::vector<std::vector<float>> params;
  for (size_t i = 0; i < model->params().size(); ++i) {
    const ParamSpec& p = model->params()[i];
    std::normal_distribution<float> he(0.f, p.init_scale);
    std::vector<float> v(p.size(), 0.f);
    if (p.init == InitKind::kNormal) {
      for (float& x : v) x = he(rng);
    }
    ASSERT_TRUE(model->SetParam(i, v.data()).ok());
    params.push_back(std::move(v));
  }
  auto before = model->Evaluate(images.data(), labels.data(), n);
  ASSERT_TRUE(before.ok()) << before.status();

  const kernels::SgdParams sgd{0.2f, 0.f};
  std::vector<float> grad;
  for (int epoch = 0; epoch < 20; ++epoch) {
    for (int64_t start = 0; start < n; start += batch) {
      auto stats = model->TrainStep(
          images.data() + start * input, labels.data() + start, batch, [&](size_t i) {
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
  auto after = model->Evaluate(images.data(), labels.data(), n);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_LT(after->loss, before->loss / 20) << "from " << before->loss;
  EXPECT_GE(after->correct, n * 97 / 100);
}

TEST_F(MlpTest, EvaluateInChunksEqualsEvaluatingAtOnce) {
  const int64_t input = 6, classes = 5, n = 50;
  std::mt19937 rng(5);
  auto small = Make(input, {7}, classes, 7);  // 50 = 7 * 7 + 1: a ragged last chunk
  auto large = Make(input, {7}, classes, 64);
  ASSERT_NE(small, nullptr);
  ASSERT_NE(large, nullptr);
  const auto values = RandomizeParams(*small, rng);
  for (size_t i = 0; i < values.size(); ++i) ASSERT_TRUE(large->SetParam(i, values[i].data()).ok());
  const auto images = RandomVector(n * input, rng, -2.f, 2.f);
  const auto labels = RandomLabels(n, classes, rng);
  ExpectChunkedEvaluationMatchesWhole(*small, *large, images, labels, n, 1e-6);
}

TEST_F(MlpTest, BadSizesAndArgumentsAreRejected) {
  auto code = [&](int64_t input, std::vector<int64_t> hidden, int64_t classes, int64_t max_batch) {
    return MakeMlp(*ctx_, input, std::move(hidden), classes, max_batch).status().code();
  };
  EXPECT_EQ(code(0, {4}, 3, 8), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(5, {4, 0}, 3, 8), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(5, {-4}, 3, 8), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(5, {4}, 0, 8), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(5, {4}, 3, 0), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(5, {4}, 3, -1), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(int64_t{1} << 40, {4}, 3, 8), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(5, {}, 3, 8),
            StatusCode::kInvalidArgument);  // model.h: no hidden layer is "empty"

  auto model = Make(5, {4}, 3, 8);
  ASSERT_NE(model, nullptr);
  ExpectBadArgumentsRejected(*model, 8);
}

TEST_F(MlpTest, PrefetchedBatchesTrainExactlyLikeDirectOnes) {
  auto direct = Make(33, {24, 16}, 10, 12);
  auto staged = Make(33, {24, 16}, 10, 12);
  ASSERT_NE(direct, nullptr);
  ASSERT_NE(staged, nullptr);
  ExpectPrefetchedStepsMatchDirectOnes(*direct, *staged, 12, 0.0);
}

TEST_F(MlpTest, BoundParamsTrainBitIdenticallyToCopiedOnes) {
  auto copied = Make(33, {24, 16}, 10, 12);
  auto bound = Make(33, {24, 16}, 10, 12);
  ASSERT_NE(copied, nullptr);
  ASSERT_NE(bound, nullptr);
  ExpectNoHostGradientBeforeTraining(*bound);
  ExpectBoundParamsTrainLikeCopiedOnes(*copied, *bound, 12, 5);
}

TEST_F(MlpTest, BoundGradientsAreWrittenWhereBoundForOneStep) {
  auto own = Make(33, {24, 16}, 10, 12);
  auto bound = Make(33, {24, 16}, 10, 12);
  ASSERT_NE(own, nullptr);
  ASSERT_NE(bound, nullptr);
  ExpectBoundGradientsAreWrittenWhereBoundForOneStep(*own, *bound, 12, 7);
}

TEST_F(MlpTest, CudaModelRefusesBindingAndHasNoHostGradient) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: this test needs a GPU";
  auto gpu_ctx = Context::Create(Device{DeviceType::kCuda, 0});
  ASSERT_TRUE(gpu_ctx.ok()) << gpu_ctx.status();
  auto gpu = MakeMlp(**gpu_ctx, 5, {4}, 3, 8);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::vector<float> w(20, 0.1f);
  EXPECT_EQ((*gpu)->BindParam(0, w.data()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*gpu)->BindGradient(0, w.data()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*gpu)->HostGradient(0).status().code(),
            StatusCode::kFailedPrecondition);  // not trained yet
  std::vector<float> images(2 * 5, 0.1f);
  std::vector<int32_t> labels(2, 1);
  ASSERT_TRUE((*gpu)->TrainStep(images.data(), labels.data(), 2).ok());
  Result<const float*> g = (*gpu)->HostGradient(0);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(*g, nullptr);
}

TEST_F(MlpTest, CudaPrefetchedBatchesMatchCpuSteps) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: this test needs a GPU";
  auto gpu_ctx = Context::Create(Device{DeviceType::kCuda, 0});
  ASSERT_TRUE(gpu_ctx.ok()) << gpu_ctx.status();
  auto cpu = Make(33, {64, 32}, 10, 17);
  auto gpu = MakeMlp(**gpu_ctx, 33, {64, 32}, 10, 17);
  ASSERT_NE(cpu, nullptr);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ExpectPrefetchedStepsMatchDirectOnes(*cpu, **gpu, 17, 1e-4);
}

TEST_F(MlpTest, CudaModelMatchesCpuModel) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: this test needs a GPU";
  auto gpu_ctx = Context::Create(Device{DeviceType::kCuda, 0});
  ASSERT_TRUE(gpu_ctx.ok()) << gpu_ctx.status();
  const int64_t input = 33, classes = 10, batch = 17;
  auto cpu = Make(input, {64, 32}, classes, batch);
  auto gpu = MakeMlp(**gpu_ctx, input, {64, 32}, classes, batch);
  ASSERT_NE(cpu, nullptr);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::mt19937 rng(9);
  const auto values = RandomizeParams(*cpu, rng);
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_TRUE((*gpu)->SetParam(i, values[i].data()).ok());
  const auto images = RandomVector(batch * input, rng, -1.f, 1.f);
  const auto labels = RandomLabels(batch, classes, rng);
  auto cpu_stats = cpu->TrainStep(images.data(), labels.data(), batch);
  auto gpu_stats = (*gpu)->TrainStep(images.data(), labels.data(), batch);
  ASSERT_TRUE(cpu_stats.ok()) << cpu_stats.status();
  ASSERT_TRUE(gpu_stats.ok()) << gpu_stats.status();
  EXPECT_NEAR(gpu_stats->loss, cpu_stats->loss, 1e-5 * (1 + cpu_stats->loss));
  EXPECT_EQ(gpu_stats->correct, cpu_stats->correct);
  for (size_t i = 0; i < values.size(); ++i) {
    std::vector<float> gc(values[i].size()), gg(values[i].size());
    ASSERT_TRUE(cpu->Gradient(i, gc.data()).ok());
    ASSERT_TRUE((*gpu)->Gradient(i, gg.data()).ok());
    for (size_t e = 0; e < gc.size(); ++e)
      ASSERT_NEAR(gg[e], gc[e], 1e-5 + 1e-4 * std::abs(gc[e])) << i << "/" << e;
  }
}

}  // namespace
}  // namespace leash::worker
