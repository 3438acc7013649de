// Tests of the dense table's optimizer arithmetic that the shard tests do not reach: optimizer
// state decaying without gradient flushes to zero instead of turning subnormal; a weighted
// gradient applied as it came is bit for bit a scaled copy applied; a pull reply's frame is
// the table's memory and never changes after an update (copy on write); threads sharing an
// update change no bit of it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "leash/ps/table.h"

namespace leash::ps {
namespace {

// A table "w" of rows x cols under optimizer `kind` at rate `lr`.
TableSpec Spec(OptimizerKind kind, uint64_t rows, uint32_t cols, float lr) {
  TableSpec s;
  s.name = "w";
  s.rows = rows;
  s.cols = cols;
  s.optimizer.kind = kind;
  s.optimizer.lr = lr;
  return s;
}

TableSpec MomentumSpec() {
  TableSpec s = Spec(OptimizerKind::kMomentum, 2, 4, 0.5f);
  s.optimizer.momentum = 0.9f;
  return s;
}

// Bit for bit, so that a NaN or -0 would count as different from a number or +0.
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Values and every optimizer slot (and pending sum), bit for bit.
void ExpectSameState(const TableSnapshot& a, const TableSnapshot& b) {
  EXPECT_TRUE(SameBits(a.values, b.values));
  ASSERT_EQ(a.slots.size(), b.slots.size());
  for (size_t i = 0; i < a.slots.size(); ++i) {
    EXPECT_TRUE(SameBits(a.slots[i], b.slots[i])) << "slot " << i;
  }
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

// A push weighted by its samples (work in proportion to speed) is scaled block by block as
// it is applied. Rows of 3000 floats span blocks and a partial one; weight decay reads the
// values too. Each optimizer, by range and by keys, over three steps.
TEST(TableTest, AWeightedGradientUpdatesExactlyAsItsScaledCopyDoes) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam,
                             OptimizerKind::kAdagrad}) {
    for (bool by_keys : {false, true}) {
      SCOPED_TRACE(testing::Message() << "optimizer " << static_cast<int>(kind)
                                      << (by_keys ? ", by keys" : ", by range"));
      TableSpec spec = Spec(kind, 4, 3000, 0.01f);
      spec.optimizer.weight_decay = 0.001f;
      spec.init.kind = InitKind::kUniform;
      spec.init.scale = 0.5f;
      auto scaled = Table::Create(1, spec, RowRange{0, 4});
      auto copied = Table::Create(1, spec, RowRange{0, 4});
      ASSERT_TRUE(scaled.ok() && copied.ok()) << scaled.status().ToString();
      const Rows rows = by_keys ? Rows::Keys({3, 1, 2}) : Rows::Range(1, 4);
      for (float scale : {0.3f, 1.f / 3, 0.75f}) {
        std::vector<float> g(rows.size() * spec.cols);
        for (float& v : g) v = normal(rng);
        std::vector<float> copy = g;
        for (float& v : copy) v *= scale;
        scaled->Apply(rows, g.data(), scale);
        copied->Apply(rows, copy.data());
      }
      const TableSnapshot a = scaled->ToSnapshot();
      const TableSnapshot b = copied->ToSnapshot();
      ExpectSameState(a, b);
      // And the weight moved: row 0 was never pushed, the others were.
      auto fresh = Table::Create(1, spec, RowRange{0, 4});
      const TableSnapshot f = fresh->ToSnapshot();
      EXPECT_EQ(std::memcmp(a.values.data(), f.values.data(), spec.cols * sizeof(float)), 0);
      EXPECT_NE(std::memcmp(a.values.data() + spec.cols, f.values.data() + spec.cols,
                            spec.cols * sizeof(float)),
                0);
    }
  }
}

// Clock steps: pushes summed into an iteration are one optimizer step on their sum, taken in
// iteration order, and a snapshot carries the sums not yet applied.
TEST(TableTest, SummedPushesAreOneStepPerIterationAndASnapshotKeepsThePendingSums) {
  const TableSpec spec = Spec(OptimizerKind::kAdam, 3, 2, 0.1f);
  auto t = Table::Create(1, spec, RowRange{0, 3});
  auto ref = Table::Create(1, spec, RowRange{0, 3});
  ASSERT_TRUE(t.ok() && ref.ok());
  // Iteration 4: rows 0-1 by range (scale 0.5), row 2 by key (scale 0.25). Iteration 5: row 1.
  const std::vector<float> a = {1, 2, 3, 4};
  const std::vector<float> b = {8, -8};
  const std::vector<float> c = {5, 6};
  t->Accumulate(4, Rows::Range(0, 2), a.data(), 0.5f);
  t->Accumulate(4, Rows::Keys({2}), b.data(), 0.25f);
  t->Accumulate(5, Rows::Keys({1}), c.data(), 1.f);
  EXPECT_EQ(t->pending(), 2u);
  EXPECT_EQ(t->ApplyPendingBefore(4), 0u);  // iteration 4 not finished
  EXPECT_EQ(t->steps(), 0u);

  // A snapshot now, restored, carries on as the original does.
  const TableSnapshot snap = t->ToSnapshot();
  EXPECT_EQ(snap.pending_clocks, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(snap.slots.size(), 2u + 2u);  // Adam's m and v, then the two sums
  auto restored = Table::FromSnapshot(snap);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();

  const std::vector<float> step4 = {0.5f, 1, 1.5f, 2, 2, -2};
  const std::vector<float> step5 = {0, 0, 5, 6, 0, 0};
  ref->Apply(Rows::Range(0, 3), step4.data());
  ref->Apply(Rows::Range(0, 3), step5.data());
  for (Table* x : {&*t, &*restored}) {
    EXPECT_EQ(x->ApplyPendingBefore(6), 2u);
    EXPECT_EQ(x->pending(), 0u);
    EXPECT_EQ(x->steps(), 2u);
    std::vector<float> got(6), want(6);
    x->Read(Rows::Range(0, 3), got.data());
    ref->Read(Rows::Range(0, 3), want.data());
    EXPECT_TRUE(SameBits(got, want));
  }
  // A snapshot whose pending clocks do not match its arrays is refused.
  TableSnapshot bad = snap;
  bad.pending_clocks.push_back(9);
  EXPECT_EQ(Table::FromSnapshot(bad).status().code(), StatusCode::kDataLoss);
  bad = snap;
  bad.pending_clocks = {5, 4};
  EXPECT_EQ(Table::FromSnapshot(bad).status().code(), StatusCode::kDataLoss);
}

// Threads sharing an update (UpdateThreads) change nothing in the result: every optimizer,
// weighted or not, by range and by keys (rows of 1001 floats are split too), and the summed
// pushes of clock steps, bit for bit against one thread; in the tiny case the values and
// gradients are near the subnormal range, where a thread that did not flush as the caller
// does would keep subnormal results the caller's thread flushes to zero.
TEST(TableTest, AnUpdateSharedByThreadsIsBitForBitTheUpdateOfOneThread) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  UpdateThreads threads(3, /*min_range=*/100);
  for (bool tiny : {false, true}) {
    for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam,
                               OptimizerKind::kAdagrad}) {
      SCOPED_TRACE(testing::Message()
                   << "optimizer " << static_cast<int>(kind) << (tiny ? ", tiny values" : ""));
      TableSpec spec = Spec(kind, 37, 1001, tiny ? 0.5f : 0.01f);
      spec.optimizer.weight_decay = 0.001f;
      spec.init.kind = InitKind::kUniform;
      spec.init.scale = tiny ? 2e-38f : 0.5f;
      auto one = Table::Create(1, spec, RowRange{0, 37});
      auto shared = Table::Create(1, spec, RowRange{0, 37});
      ASSERT_TRUE(one.ok() && shared.ok()) << one.status().ToString();
      const uint64_t runs_before = threads.split_runs();
      uint64_t splits = 0;  // every span of 1001 floats and more is split
      int step = 0;
      for (const Rows& rows : {Rows::Range(0, 37), Rows::Keys({5, 36, 0}), Rows::Range(3, 30)}) {
        for (float scale : {1.f, 0.37f}) {
          std::vector<float> g(rows.size() * spec.cols);
          for (float& v : g) v = normal(rng) * (tiny ? 1e-38f : 1.f);
          one->Apply(rows, g.data(), scale);
          shared->Apply(rows, g.data(), scale, &threads);
          // Clock steps: the same gradient summed into an iteration of its own.
          one->Accumulate(++step, rows, g.data(), scale);
          shared->Accumulate(step, rows, g.data(), scale, &threads);
          splits += 2 * (rows.explicit_keys ? rows.size() : 1);
        }
      }
      EXPECT_EQ(one->ApplyPendingBefore(step + 1), static_cast<size_t>(step));
      EXPECT_EQ(shared->ApplyPendingBefore(step + 1, &threads), static_cast<size_t>(step));
      const TableSnapshot a = one->ToSnapshot();
      const TableSnapshot b = shared->ToSnapshot();
      ExpectSameState(a, b);
      EXPECT_EQ(Subnormals(b.values), 0);
      EXPECT_EQ(threads.split_runs() - runs_before, splits + static_cast<uint64_t>(step));
      if (tiny) {
        // The case tests something: without the flush some results would be subnormal.
        int flushed = 0;
        for (float v : b.values) flushed += v == 0.f;
        EXPECT_GT(flushed, 0);
      }
    }
  }
}

std::vector<float> FrameFloats(const Frame& f) {
  std::vector<float> v(f.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), f.data(), f.size());
  return v;
}

std::vector<float> ReadAll(const Table& t, const Rows& rows) {
  std::vector<float> v(rows.size() * t.cols());
  t.Read(rows, v.data());
  return v;
}

TEST(TableTest, AFrameOfARangeIsTheTablesMemoryAndAnUpdateCopiesOnlyWhileOneIsHeld) {
  auto t = Table::Create(1, Spec(OptimizerKind::kSgd, 4, 3, 1.f), RowRange{0, 4});
  ASSERT_TRUE(t.ok()) << t.status();
  const Rows all = Rows::Range(0, 4), tail = Rows::Range(2, 4);
  const std::vector<float> before = ReadAll(*t, all);
  std::vector<float> grad(12);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 0.25f * static_cast<float>(i + 1);
  {
    const Frame f = t->ReadFrame(all);
    const Frame part = t->ReadFrame(tail);
    // Not a copy: the frames point into the table's values.
    EXPECT_EQ(reinterpret_cast<const float*>(f.data()), t->RangeValues(all)->data());
    EXPECT_EQ(reinterpret_cast<const float*>(part.data()), t->RangeValues(all)->data() + 6);
    EXPECT_TRUE(SameBits(FrameFloats(f), before));
    // An update while they are held writes a copy: the frames keep the values they were made
    // with, the table moves on.
    t->Apply(all, grad.data());
    EXPECT_EQ(t->copies_on_write(), 1u);
    EXPECT_TRUE(SameBits(FrameFloats(f), before));
    EXPECT_TRUE(SameBits(FrameFloats(part), std::vector<float>(before.begin() + 6, before.end())));
    const std::vector<float> after = ReadAll(*t, all);
    for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i], before[i] - grad[i]) << i;
    EXPECT_NE(reinterpret_cast<const float*>(f.data()), t->RangeValues(all)->data());
  }
  // No frame holds the values any more: the next update writes them in place.
  const float* values = t->RangeValues(all)->data();
  t->Apply(all, grad.data());
  EXPECT_EQ(t->copies_on_write(), 1u);
  EXPECT_EQ(t->RangeValues(all)->data(), values);
  // A frame made now shows the values as they are now.
  EXPECT_TRUE(SameBits(FrameFloats(t->ReadFrame(all)), ReadAll(*t, all)));
}

TEST(TableTest, AFrameOutlivesItsTableAndOneReleasedOnAnotherThreadCostsNoCopy) {
  Frame kept;
  std::vector<float> want;
  {
    auto t = Table::Create(1, Spec(OptimizerKind::kMomentum, 3, 5, 0.1f), RowRange{0, 3});
    ASSERT_TRUE(t.ok());
    want = ReadAll(*t, Rows::Range(0, 3));
    kept = t->ReadFrame(Rows::Range(0, 3));
    // Released on another thread, as a transport's I/O thread releases a sent message.
    Frame sent = t->ReadFrame(Rows::Range(1, 3));
    std::thread([f = std::move(sent)]() mutable { f = Frame(); }).join();
    std::vector<float> grad(15, 1.f);
    t->Apply(Rows::Range(0, 3), grad.data());
    EXPECT_EQ(t->copies_on_write(), 1u);  // `kept` only
  }
  EXPECT_TRUE(SameBits(FrameFloats(kept), want));  // the table is gone, its values are not
}

TEST(TableTest, AFrameOfExplicitKeysIsACopyAndNeedsNoCopyOnWrite) {
  auto t = Table::Create(1, Spec(OptimizerKind::kSgd, 4, 2, 1.f), RowRange{0, 4});
  ASSERT_TRUE(t.ok());
  const Rows keys = Rows::Keys({3, 0});
  const std::vector<float> want = ReadAll(*t, keys);
  const Frame f = t->ReadFrame(keys);
  EXPECT_FALSE(t->RangeValues(keys).has_value());
  EXPECT_TRUE(SameBits(FrameFloats(f), want));
  std::vector<float> grad(8, 1.f);
  t->Apply(Rows::Range(0, 4), grad.data());
  EXPECT_EQ(t->copies_on_write(), 0u);
  EXPECT_TRUE(SameBits(FrameFloats(f), want));
  EXPECT_EQ(t->ReadFrame(Rows::Range(2, 2)).size(), 0u);  // an empty range
}

}  // namespace
}  // namespace leash::ps
