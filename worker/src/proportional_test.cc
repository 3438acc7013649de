// Unit tests of the rebalancing arithmetic of work in proportion to speed.
#include "proportional.h"

#include <gtest/gtest.h>

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
  // (640, 400, 280, 220, 190, 175).
  for (int i = 0; i < 5; ++i) r.Add(64, 0.4);
  EXPECT_NEAR(r.samples_per_second(), 160, 16);
  // Its batch follows: its share of 192 beside two workers of 640 samples/s each.
  EXPECT_EQ(ProportionalBatch(192, r.samples_per_second(), r.samples_per_second() + 1280, 64), 23);
}

}  // namespace
}  // namespace leash::worker
