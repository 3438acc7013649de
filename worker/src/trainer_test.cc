// Unit tests of the training loop's straggler injection (--step-delay-factor) and periodic
// evaluation (--eval-every): a local (in-process) MLP on a small synthetic dataset.
// Single-threaded.
#include "leash/worker/trainer.h"

#include <gtest/gtest.h>

#include <chrono>

#include "leash/kernels/kernels.h"
#include "leash/worker/model.h"
#include "leash/worker/params.h"

namespace leash::worker {
namespace {

using kernels::Context;
using kernels::Device;
using kernels::DeviceType;

Dataset Synthetic(int64_t count) {
  Dataset d;
  d.count = count;
  d.rows = 8;
  d.cols = 8;
  d.images.resize(static_cast<size_t>(count * d.features()));
  d.labels.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    d.labels[static_cast<size_t>(i)] = static_cast<int32_t>(i % 10);
    for (int64_t f = 0; f < d.features(); ++f) {
      d.images[static_cast<size_t>(i * d.features() + f)] = static_cast<float>((i * 31 + f * 7) % 17) / 17.f - 0.5f;
    }
  }
  return d;
}

struct TimedRun {
  TrainResult result;
  double wall_seconds = 0;
};

TimedRun TrainLocal(double factor) {
  auto ctx = Context::Create(Device{DeviceType::kCpu, 0});
  EXPECT_TRUE(ctx.ok()) << ctx.status();
  Dataset train = Synthetic(512);
  auto model = MakeMlp(**ctx, train.features(), {256, 256}, 10, 32);
  EXPECT_TRUE(model.ok()) << model.status();
  auto params = MakeLocalParams();
  OptimizerOptions opt;
  EXPECT_TRUE(params->Setup((*model)->params(), opt).ok());
  TrainOptions o;
  o.epochs = 2;
  o.batch = 32;
  o.chunk_size = 128;
  o.log_every = 0;
  o.evaluate = false;
  o.step_delay_factor = factor;
  auto t0 = std::chrono::steady_clock::now();
  auto r = Train(**model, *params, train, nullptr, o, nullptr);
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.ok()) << r.status();
  return TimedRun{r.ok() ? *r : TrainResult{}, wall};
}

TEST(TrainerTest, NoStepDelayByDefault) {
  TimedRun run = TrainLocal(1.0);
  EXPECT_EQ(run.result.iterations, 2 * 512 / 32);
  EXPECT_GT(run.result.compute_seconds, 0);
  EXPECT_EQ(run.result.injected_delay_seconds, 0);
}

// The sleeps are lower bounds (a sleep never ends early), so these hold on any machine:
// the slowed worker sleeps at least (factor - 1) x its compute time, and its epochs'
// step time and its wall time include that sleep.
TEST(TrainerTest, StepDelayFactorSlowsTheWorkerByThatFactor) {
  TimedRun run = TrainLocal(3.0);
  const TrainResult& r = run.result;
  EXPECT_EQ(r.iterations, 2 * 512 / 32);
  ASSERT_GT(r.compute_seconds, 0);
  EXPECT_GE(r.injected_delay_seconds, 2.0 * r.compute_seconds);
  double step_seconds = 0;
  for (const auto& e : r.epochs) step_seconds += e.train_seconds;
  EXPECT_GE(step_seconds, 3.0 * r.compute_seconds);
  EXPECT_GE(run.wall_seconds, 3.0 * r.compute_seconds);
}

TEST(TrainerTest, RejectsAStepDelayFactorBelowOne) {
  auto ctx = Context::Create(Device{DeviceType::kCpu, 0});
  ASSERT_TRUE(ctx.ok());
  Dataset train = Synthetic(64);
  auto model = MakeMlp(**ctx, train.features(), {8}, 10, 32);
  ASSERT_TRUE(model.ok());
  auto params = MakeLocalParams();
  ASSERT_TRUE(params->Setup((*model)->params(), OptimizerOptions{}).ok());
  TrainOptions o;
  o.epochs = 1;
  o.batch = 32;
  o.evaluate = false;
  o.step_delay_factor = 0.5;
  auto r = Train(**model, *params, train, nullptr, o, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("step delay factor"), std::string::npos) << r.status().message();
}

// 512 training samples, batch 32, 2 epochs: 32 iterations; every 5th is followed by an
// evaluation on a test set large enough that evaluating costs more than training.
TEST(TrainerTest, EvalEveryRecordsAPointEveryNIterationsOutsideTrainingTime) {
  auto ctx = Context::Create(Device{DeviceType::kCpu, 0});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  Dataset train = Synthetic(512);
  Dataset test = Synthetic(2048);
  auto model = MakeMlp(**ctx, train.features(), {256, 256}, 10, 32);
  ASSERT_TRUE(model.ok()) << model.status();
  auto params = MakeLocalParams();
  ASSERT_TRUE(params->Setup((*model)->params(), OptimizerOptions{}).ok());
  TrainOptions o;
  o.epochs = 2;
  o.batch = 32;
  o.chunk_size = 128;
  o.log_every = 0;
  o.evaluate = false;  // periodic evaluation does not depend on the epoch-end one
  o.eval_every = 5;
  double step_seconds = 0;
  o.on_step = [&](const StepReport& r) { step_seconds += r.seconds; };
  auto t0 = std::chrono::steady_clock::now();
  auto r = Train(**model, *params, train, &test, o, nullptr);
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->iterations, 32);
  ASSERT_EQ(r->evaluations.size(), 6u);  // after steps 5, 10, ..., 30
  double point_seconds = 0, last_elapsed = 0;
  for (size_t i = 0; i < r->evaluations.size(); ++i) {
    const EvalPoint& p = r->evaluations[i];
    EXPECT_EQ(p.step, 5 * static_cast<int64_t>(i + 1));
    EXPECT_EQ(p.samples, 32 * p.step);
    EXPECT_GE(p.test_accuracy, 0.0);
    EXPECT_LE(p.test_accuracy, 1.0);
    EXPECT_GT(p.test_loss, 0.0);
    EXPECT_GE(p.elapsed_seconds, last_elapsed);
    EXPECT_GT(p.eval_seconds, 0.0);
    last_elapsed = p.elapsed_seconds;
    point_seconds += p.eval_seconds;
  }
  EXPECT_DOUBLE_EQ(r->eval_seconds, point_seconds);  // no epoch-end evaluation here
  // The epochs' training time is the iterations' time and nothing else. Evaluating costs
  // several times what training does here (2048 test samples six times against 1024
  // trained), so had it been counted as training too, training plus evaluation would
  // exceed the wall time. (No comparison of the two durations: that is a timing.)
  double train_seconds = 0;
  int64_t samples = 0;
  for (const auto& e : r->epochs) {
    train_seconds += e.train_seconds;
    samples += e.samples;
  }
  EXPECT_EQ(samples, 1024);
  EXPECT_NEAR(train_seconds, step_seconds, 1e-9);
  EXPECT_LE(train_seconds + r->eval_seconds, wall);
}

TEST(TrainerTest, EvalEveryRecordsNothingByDefault) {
  auto ctx = Context::Create(Device{DeviceType::kCpu, 0});
  ASSERT_TRUE(ctx.ok());
  Dataset train = Synthetic(256);
  Dataset test = Synthetic(64);
  auto model = MakeMlp(**ctx, train.features(), {16}, 10, 32);
  ASSERT_TRUE(model.ok());
  auto params = MakeLocalParams();
  ASSERT_TRUE(params->Setup((*model)->params(), OptimizerOptions{}).ok());
  TrainOptions o;
  o.epochs = 1;
  o.batch = 32;
  o.log_every = 0;
  auto r = Train(**model, *params, train, &test, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->evaluations.empty());
  ASSERT_EQ(r->epochs.size(), 1u);
  EXPECT_GE(r->epochs[0].test_accuracy, 0.0);  // the epoch-end evaluation still runs
  EXPECT_GT(r->eval_seconds, 0.0);
}

TEST(TrainerTest, RejectsANegativeEvalEvery) {
  auto ctx = Context::Create(Device{DeviceType::kCpu, 0});
  ASSERT_TRUE(ctx.ok());
  Dataset train = Synthetic(64);
  auto model = MakeMlp(**ctx, train.features(), {8}, 10, 32);
  ASSERT_TRUE(model.ok());
  auto params = MakeLocalParams();
  ASSERT_TRUE(params->Setup((*model)->params(), OptimizerOptions{}).ok());
  TrainOptions o;
  o.epochs = 1;
  o.batch = 32;
  o.eval_every = -1;
  auto r = Train(**model, *params, train, &train, o, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("eval_every"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace leash::worker
