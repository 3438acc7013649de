// Unit tests of work in proportion to speed: the rebalancing arithmetic and the optimizer rates.
#include "proportional.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace leash::worker {
namespace {

TEST(ProportionalBatchTest, SharesTheGlobalBatchInProportionToSpeed) {
  // Two workers three times as fast as the third: 3 : 3 : 1 of 448.
  const double total = 300 + 300 + 100;
  EXPECT_EQ(ProportionalBatch(448, 300, total, 64), 192);
  EXPECT_EQ(ProportionalBatch(448, 100, total, 64), 64);
  // Equal speeds split evenly; the shares round to the nearest sample.
  EXPECT_EQ(ProportionalBatch(192, 50, 150, 7), 64);
  EXPECT_EQ(ProportionalBatch(100, 1, 3, 7), 33);
}

TEST(ProportionalBatchTest, RebalancesWhenAWorkerJoinsOrLeaves) {
  // Alone, a worker takes the whole global batch.
  EXPECT_EQ(ProportionalBatch(256, 400, 400, 64), 256);
  // An equally fast worker joins: the next clock's sum holds both, each takes half.
  EXPECT_EQ(ProportionalBatch(256, 400, 800, 64), 128);
  // A slower one joins: 400 : 400 : 200.
  EXPECT_EQ(ProportionalBatch(256, 400, 1000, 64), 102);
  EXPECT_EQ(ProportionalBatch(256, 200, 1000, 64), 51);
  // It leaves again: back to halves.
  EXPECT_EQ(ProportionalBatch(256, 400, 800, 64), 128);
}

TEST(ProportionalBatchTest, UnknownSpeedsFallBackAndEveryBatchIsAtLeastOneSample) {
  EXPECT_EQ(ProportionalBatch(256, 0, 1000, 64), 64);    // not measured yet
  EXPECT_EQ(ProportionalBatch(256, 400, 0, 64), 64);     // no clock reply yet
  EXPECT_EQ(ProportionalBatch(256, 400, 300, 64), 64);   // a sum without this worker
  EXPECT_EQ(ProportionalBatch(256, 400, 0, 1000), 256);  // the fallback is clamped too
  EXPECT_EQ(ProportionalBatch(256, 1, 1e9, 64), 1);      // a very slow worker trains one
}

TEST(StepRateTest, FollowsAChangeOfSpeedWithinAFewIterations) {
  StepRate r;
  EXPECT_EQ(r.samples_per_second(), 0);
  r.Add(64, 0.1);
  EXPECT_DOUBLE_EQ(r.samples_per_second(), 640);
  r.Add(0, 0.1);  // nothing trained: ignored
  r.Add(64, 0);
  EXPECT_DOUBLE_EQ(r.samples_per_second(), 640);
  // The worker becomes 4x slower: within 5 iterations the estimate is within 10% of it
  // (seconds 0.25, 0.325, 0.3625, 0.381, 0.391: 256, 197, 177, 168, 164 samples/s).
  for (int i = 0; i < 5; ++i) r.Add(64, 0.4);
  EXPECT_NEAR(r.samples_per_second(), 160, 16);
  // Its batch follows: its share of 192 beside two workers of 640 samples/s each.
  EXPECT_EQ(ProportionalBatch(192, r.samples_per_second(), r.samples_per_second() + 1280, 64), 22);
  // And 4x faster again: within 5 iterations within 10% of 640 (256, 366, 465, 539, 587).
  for (int i = 0; i < 5; ++i) r.Add(64, 0.1);
  EXPECT_NEAR(r.samples_per_second(), 640, 64);
}

TEST(StepRateTest, AWorkerWhoseTimePerSampleVariesIsRatedAtWhatItTrains) {
  // Iterations of 64 samples alternately 0.1 s and 0.3 s: 320 samples/s over any two. An
  // average of each iteration's rate (640 and 213) would rate it 356-498 samples/s and give
  // it more of each clock than it trains while the others train theirs.
  StepRate r;
  for (int i = 0; i < 20; ++i) r.Add(64, i % 2 == 0 ? 0.1 : 0.3);
  // The averaged seconds settle at 0.233 after a slow iteration and 0.167 after a fast one.
  EXPECT_NEAR(r.samples_per_second(), 64 / (0.7 / 3), 0.5);
  r.Add(64, 0.1);
  EXPECT_NEAR(r.samples_per_second(), 64 / (0.5 / 3), 0.5);
  // Batches of different sizes at one speed: the rate is that speed.
  StepRate sizes;
  for (int n : {64, 20, 90, 7, 33}) sizes.Add(n, n / 500.0);
  EXPECT_NEAR(sizes.samples_per_second(), 500, 1e-9);
}

OptimizerOptions Opt(OptimizerKind kind, float lr, float weight_decay = 0) {
  OptimizerOptions o;
  o.kind = kind;
  o.learning_rate = lr;
  o.weight_decay = weight_decay;
  return o;
}

TEST(ProportionalOptimizerTest, KeepsBspSgdUpdatePerClock) {
  // 3 workers, --batch 64, --global-batch 192, SGD at --lr 0.01 with weight decay 0.1, one
  // scalar parameter w = 2, per-sample gradients 0, 1, 2, ... (sample k's is k). BSP: each
  // worker pushes the mean over its 64 samples; the shard steps lr x (g + wd x w) on each.
  const float lr = 0.01f, wd = 0.1f;
  const double w = 2;
  std::vector<double> grads(192);
  std::iota(grads.begin(), grads.end(), 0.0);
  auto mean = [&](int begin, int n) {
    return std::accumulate(grads.begin() + begin, grads.begin() + begin + n, 0.0) / n;
  };
  double bsp = 0;
  for (int begin : {0, 64, 128}) bsp += lr * (mean(begin, 64) + wd * w);
  // Proportional work: the same 192 samples split 82 : 82 : 28 by speed; each push is the
  // mean over its samples, weighted by samples / 192 on the shard, at the derived options.
  // A step per push: each push steps with weight decay.
  const OptimizerOptions o =
      ProportionalOptimizer(Opt(OptimizerKind::kSgd, lr, wd), 192, 64, /*clock_steps=*/false);
  EXPECT_FLOAT_EQ(o.learning_rate, 0.03f);
  double proportional = 0;
  int begin = 0;
  for (int n : {82, 82, 28}) {
    proportional += o.learning_rate * ((n / 192.0) * mean(begin, n) + o.weight_decay * w);
    begin += n;
  }
  EXPECT_NEAR(proportional, bsp, 1e-5);
  // Clock steps: one step on the weighted sum of the three pushes, with weight decay once.
  const OptimizerOptions c =
      ProportionalOptimizer(Opt(OptimizerKind::kSgd, lr, wd), 192, 64, /*clock_steps=*/true);
  EXPECT_FLOAT_EQ(c.learning_rate, 0.03f);
  EXPECT_FLOAT_EQ(c.weight_decay, wd);
  double sum = 0;
  begin = 0;
  for (int n : {82, 82, 28}) {
    sum += (n / 192.0) * mean(begin, n);
    begin += n;
  }
  EXPECT_NEAR(c.learning_rate * (sum + c.weight_decay * w), bsp, 1e-5);
  // Momentum with a step per push scales alike; a global batch of 512 over --batch 64 is 8
  // BSP steps' worth.
  EXPECT_FLOAT_EQ(
      ProportionalOptimizer(Opt(OptimizerKind::kMomentum, 0.01f), 512, 64, false).learning_rate,
      0.08f);
}

// Momentum with clock steps: one step per clock stands for global_batch / batch BSP pushes.
// The velocity decays per clock as it does over those pushes (mu^3 for 3), and the step per
// clock under a steady gradient is BSP's; the weights follow BSP's path clock by clock
// under a constant gradient to within the first clocks' transient.
TEST(ProportionalOptimizerTest, MomentumWithClockStepsKeepsBspsDecayAndStepPerSample) {
  OptimizerOptions bsp = Opt(OptimizerKind::kMomentum, 0.01f);
  bsp.momentum = 0.9f;
  const OptimizerOptions c = ProportionalOptimizer(bsp, 192, 64, /*clock_steps=*/true);
  EXPECT_NEAR(c.momentum, 0.729f, 1e-6);
  EXPECT_NEAR(c.learning_rate, 0.01f * 3 * (1 - 0.729f) / (1 - 0.9f), 1e-6);
  // Under a constant gradient g the displacement per clock tends to BSP's 3 pushes' worth.
  const double g = 1;
  double v_bsp = 0, w_bsp = 0, v_c = 0, w_c = 0;
  for (int clock = 0; clock < 200; ++clock) {
    for (int push = 0; push < 3; ++push) {
      v_bsp = bsp.momentum * v_bsp + g;
      w_bsp -= bsp.learning_rate * v_bsp;
    }
    v_c = c.momentum * v_c + g;  // the clock's weighted pushes sum to the mean gradient g
    w_c -= c.learning_rate * v_c;
  }
  const double step_bsp = 3 * bsp.learning_rate * g / (1 - bsp.momentum);
  EXPECT_NEAR(c.learning_rate * v_c, step_bsp, 1e-4);
  EXPECT_NEAR(w_c / w_bsp, 1.0, 0.02);
  // With a step per push, the momentum stays (each push is one BSP push's step).
  EXPECT_FLOAT_EQ(ProportionalOptimizer(bsp, 192, 64, false).momentum, 0.9f);
  EXPECT_FLOAT_EQ(ProportionalOptimizer(bsp, 192, 64, false).learning_rate, 0.03f);
}

TEST(ProportionalOptimizerTest, LeavesScaleFreeRatesAndOffAlone) {
  // Adam and Adagrad divide the gradient's scale out: the weighting does not shrink their
  // steps, so the rate stays; weight decay, added to the weighted gradient of every push, is
  // scaled down with a step per push and stays with one step per clock.
  const OptimizerOptions adam =
      ProportionalOptimizer(Opt(OptimizerKind::kAdam, 0.001f, 0.3f), 192, 64, false);
  EXPECT_FLOAT_EQ(adam.learning_rate, 0.001f);
  EXPECT_FLOAT_EQ(adam.weight_decay, 0.1f);
  EXPECT_FLOAT_EQ(
      ProportionalOptimizer(Opt(OptimizerKind::kAdam, 0.001f, 0.3f), 192, 64, true).weight_decay,
      0.3f);
  EXPECT_FLOAT_EQ(
      ProportionalOptimizer(Opt(OptimizerKind::kAdagrad, 0.05f), 192, 64, false).learning_rate,
      0.05f);
  // Work in proportion to speed off (global batch 0): the options as given.
  const OptimizerOptions off =
      ProportionalOptimizer(Opt(OptimizerKind::kSgd, 0.01f, 0.3f), 0, 64, true);
  EXPECT_FLOAT_EQ(off.learning_rate, 0.01f);
  EXPECT_FLOAT_EQ(off.weight_decay, 0.3f);
}

}  // namespace
}  // namespace leash::worker
