// Tests of the dense table's optimizer arithmetic that the shard tests do not reach: optimizer
// state decaying without gradient flushes to zero instead of turning subnormal.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "leash/ps/table.h"

namespace leash::ps {
namespace {

TableSpec MomentumSpec() {
  TableSpec s;
  s.name = "w";
  s.rows = 2;
  s.cols = 4;
  s.optimizer.kind = OptimizerKind::kMomentum;
  s.optimizer.lr = 0.5f;
  s.optimizer.momentum = 0.9f;
  return s;
}

int Subnormals(const std::vector<float>& v) {
  int n = 0;
  for (float x : v) n += std::fpclassify(x) == FP_SUBNORMAL;
  return n;
}

// 0.9^n leaves the normal range (2^-126) after ~830 steps; subnormal arithmetic costs ~100
// cycles per value on a CPU, which once made a GPU worker's steps 6x slower.
TEST(TableTest, MomentumDecayingWithoutGradientFlushesToZeroAndNeverTurnsSubnormal) {
  auto t = Table::Create(1, MomentumSpec(), RowRange{0, 2});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::vector<float> grad(8, 1.0f);
  t->Apply(Rows::Range(0, 2), grad.data());
  std::vector<float> zero(8, 0.0f);
  for (int step = 0; step < 1200; ++step) {
    t->Apply(Rows::Range(0, 2), zero.data());
    TableSnapshot snap = t->ToSnapshot();
    ASSERT_EQ(Subnormals(snap.slots[0]), 0) << "momentum turned subnormal at step " << step;
    ASSERT_EQ(Subnormals(snap.values), 0) << "a value turned subnormal at step " << step;
  }
  TableSnapshot snap = t->ToSnapshot();
  for (float v : snap.slots[0]) EXPECT_EQ(v, 0.0f);
  // The weights moved by lr * (1 + 0.9 + 0.81 + ...) = 0.5 / (1 - 0.9) = 5 (to float precision).
  for (float w : snap.values) EXPECT_NEAR(w, -5.0f, 1e-4f);
}

TEST(TableTest, TheFlushIsScopedToTheUpdateAndTheCallersModeComesBack) {
  auto t = Table::Create(1, MomentumSpec(), RowRange{0, 2});
  ASSERT_TRUE(t.ok());
  std::vector<float> grad(8, 1.0f);
  t->Apply(Rows::Range(0, 2), grad.data());
  volatile float tiny = 1e-37f;  // normal
  volatile float half = 0.01f;
  float product = tiny * half;  // 1e-39: subnormal unless this thread flushes
  EXPECT_EQ(std::fpclassify(product), FP_SUBNORMAL);
}

}  // namespace
}  // namespace leash::ps
