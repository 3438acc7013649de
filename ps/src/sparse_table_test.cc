// Tests of sparse tables: the sparse optimizers against hand-computed values, the memory
// tier's eviction and promotion (bit-exact against an unbounded table), admission, expiry,
// memory accounting, dirty-row flushes, store errors and spec validation.
#include "leash/ps/sparse_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace leash::ps {
namespace {

TableSpec SparseSpec(uint32_t cols, OptimizerKind kind) {
  TableSpec s;
  s.name = "emb";
  s.kind = TableKind::kSparse;
  s.rows = 0;
  s.cols = cols;
  s.optimizer.kind = kind;
  s.optimizer.lr = 0.1f;
  s.init = {InitKind::kUniform, 0.05f, 7};
  return s;
}

// ---------------------------------------------------------------------------------------
// Optimizers. Expected values computed by hand in Python (float64) from the formulas in
// sparse_table.h: w0 = {0.5, -1}, gradients {0.1, -0.2}, {0.3, 0}, {-0.5, 0.4}.

const float kW0[2] = {0.5f, -1.0f};
const float kGrads[3][2] = {{0.1f, -0.2f}, {0.3f, 0.0f}, {-0.5f, 0.4f}};

struct Step {
  float w[2];
  float s0[2];
  float s1[2];
};

void ExpectSteps(const OptimizerConfig& opt, const std::vector<Step>& want, int slots) {
  float w[2] = {kW0[0], kW0[1]};
  std::vector<float> st(static_cast<size_t>(slots) * 2, 0.f);
  uint64_t steps = 0;
  for (size_t t = 0; t < want.size(); ++t) {
    ApplySparseRow(opt, 2, w, st.data(), &steps, kGrads[t]);
    EXPECT_EQ(steps, t + 1);
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(w[i], want[t].w[i], 2e-6) << "step " << t + 1 << " value " << i;
      if (slots >= 1) {
        EXPECT_NEAR(st[i], want[t].s0[i], 2e-6) << "step " << t + 1;
      }
      if (slots >= 2) {
        EXPECT_NEAR(st[2 + i], want[t].s1[i], 2e-6) << "step " << t + 1;
      }
    }
  }
}

TEST(SparseOptimizerTest, SgdWithL2MatchesHandComputedValues) {
  OptimizerConfig o;
  o.kind = OptimizerKind::kSgd;
  o.lr = 0.1f;
  o.weight_decay = 0.01f;
  ExpectSteps(o,
              {{{0.4895f, -0.979f}, {}, {}},
               {{0.4590105f, -0.978021f}, {}, {}},
               {{0.5085514895f, -1.017042979f}, {}, {}}},
              0);
}

TEST(SparseOptimizerTest, MomentumMatchesHandComputedValues) {
  OptimizerConfig o;
  o.kind = OptimizerKind::kMomentum;
  o.lr = 0.1f;
  o.momentum = 0.9f;
  ExpectSteps(o,
              {{{0.49f, -0.98f}, {0.1f, -0.2f}, {}},
               {{0.451f, -0.962f}, {0.39f, -0.18f}, {}},
               {{0.4659f, -0.9858f}, {-0.149f, 0.238f}, {}}},
              1);
}

TEST(SparseOptimizerTest, AdagradMatchesHandComputedValues) {
  OptimizerConfig o;
  o.kind = OptimizerKind::kAdagrad;
  o.lr = 0.1f;
  o.epsilon = 1e-8f;
  ExpectSteps(o,
              {{{0.40000001f, -0.900000005f}, {0.01f, 0.04f}, {}},
               {{0.3051316832f, -0.900000005f}, {0.1f, 0.04f}, {}},
               {{0.3896471072f, -0.9894427221f}, {0.35f, 0.2f}, {}}},
              1);
}

TEST(SparseOptimizerTest, LazyAdamUsesTheRowsOwnStepCount) {
  OptimizerConfig o;
  o.kind = OptimizerKind::kAdam;
  o.lr = 0.01f;
  o.beta1 = 0.9f;
  o.beta2 = 0.999f;
  o.epsilon = 1e-8f;
  ExpectSteps(
      o,
      {{{0.490000001f, -0.9900000005f}, {0.01f, -0.02f}, {1e-5f, 4e-5f}},
       {{0.4808221902f, -0.9832994184f}, {0.039f, -0.018f}, {9.999e-5f, 3.996e-5f}},
       {{0.4824313332f, -0.986699763f}, {-0.0149f, 0.0238f}, {3.4989001e-4f, 1.9992004e-4f}}},
      2);
}

TEST(SparseOptimizerTest, FtrlProximalMatchesHandComputedValues) {
  OptimizerConfig o;
  o.kind = OptimizerKind::kFtrl;
  o.lr = 0.1f;
  o.l1 = 0.05f;
  o.ftrl_beta = 1.0f;
  o.weight_decay = 0.01f;  // FTRL's l2
  ExpectSteps(o,
              {{{0.03178928247f, -0.1457119067f}, {-0.4f, 1.8f}, {0.01f, 0.04f}},
               {{0.009014177987f, -0.1457119067f}, {-0.1687372553f, 1.8f}, {0.1f, 0.04f}},
               {{0.04040922352f, -0.1733321419f}, {-0.6935605178f, 2.560219644f}, {0.35f, 0.2f}}},
              2);
}

TEST(SparseOptimizerTest, FtrlL1ZeroesValuesWhoseZStaysWithinL1) {
  OptimizerConfig o;
  o.kind = OptimizerKind::kFtrl;
  o.lr = 0.1f;
  o.l1 = 1.0f;
  float w[1] = {0.f};
  float st[2] = {0.f, 0.f};
  uint64_t steps = 0;
  float g[1] = {0.5f};
  ApplySparseRow(o, 1, w, st, &steps, g);  // z = 0.5 <= l1
  EXPECT_EQ(w[0], 0.f);
  EXPECT_FLOAT_EQ(st[0], 0.5f);
}

TEST(SparseOptimizerTest, ClipValueClampsValuesAfterTheUpdate) {
  OptimizerConfig o;
  o.kind = OptimizerKind::kSgd;
  o.lr = 1.0f;
  o.clip_value = 0.75f;
  float w[2] = {kW0[0], kW0[1]};
  uint64_t steps = 0;
  float g1[2] = {10.f, -10.f};
  ApplySparseRow(o, 2, w, nullptr, &steps, g1);
  EXPECT_FLOAT_EQ(w[0], -0.75f);
  EXPECT_FLOAT_EQ(w[1], 0.75f);
  float g2[2] = {-0.1f, 0.1f};
  ApplySparseRow(o, 2, w, nullptr, &steps, g2);
  EXPECT_FLOAT_EQ(w[0], -0.65f);
  EXPECT_FLOAT_EQ(w[1], 0.65f);
}

// ---------------------------------------------------------------------------------------
// Initializer

TEST(SparseTableTest, NewRowsReadAsTheDeterministicInitializer) {
  MemoryRowStore store;
  auto t = SparseTable::Create(1, SparseSpec(4, OptimizerKind::kSgd), &store, {});
  ASSERT_TRUE(t.ok()) << t.status().message();
  std::vector<uint64_t> keys = {42, 1ull << 63, 0};
  std::vector<float> out(12);
  ASSERT_TRUE((*t)->Read(keys, 0, out.data()).ok());
  std::vector<float> want(4);
  for (size_t i = 0; i < keys.size(); ++i) {
    InitSparseRow(SparseSpec(4, OptimizerKind::kSgd).init, keys[i], 4, want.data());
    for (int c = 0; c < 4; ++c) EXPECT_EQ(out[i * 4 + c], want[c]);
    for (int c = 0; c < 4; ++c) EXPECT_LE(std::fabs(want[c]), 0.05f);
  }
  EXPECT_NE(out[0], out[4]);  // different keys, different rows
  EXPECT_NE(out[0], out[1]);  // different columns, different values
  EXPECT_EQ((*t)->counters().admissions, 3u);
}

// ---------------------------------------------------------------------------------------
// Tiers: a table with a small budget against an unbounded one.

// Power-law keys over [0, n): key = floor(n * u^3) concentrates on small keys, scattered
// by a multiplier so the hot keys are not neighbours.
std::vector<uint64_t> Batch(std::mt19937_64& rng, size_t size, uint64_t n) {
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<uint64_t> keys(size);
  for (auto& k : keys) {
    double x = u(rng);
    k = static_cast<uint64_t>(static_cast<double>(n) * x * x * x) * 0x9e3779b97f4a7c15ULL;
  }
  return keys;
}

void ExpectSameRecords(SparseTable& a, SparseTable& b, const std::vector<uint64_t>& keys) {
  size_t rb = a.layout().bytes();
  std::vector<uint8_t> ra(rb), rbuf(rb);
  for (uint64_t k : keys) {
    auto fa = a.ReadRecord(k, ra.data());
    auto fb = b.ReadRecord(k, rbuf.data());
    ASSERT_TRUE(fa.ok() && fb.ok());
    ASSERT_EQ(*fa, *fb) << "key " << k;
    if (*fa) {
      ASSERT_EQ(0, std::memcmp(ra.data(), rbuf.data(), rb)) << "key " << k;
    }
  }
}

class TierTest : public ::testing::TestWithParam<OptimizerKind> {};

TEST_P(TierTest, EvictionThenPromotionKeepsValuesStateAndStepsBitExact) {
  TableSpec spec = SparseSpec(8, GetParam());
  spec.optimizer.l1 = 0.001f;
  spec.optimizer.lr = 0.05f;
  MemoryRowStore big_store, small_store;
  auto big = SparseTable::Create(1, spec, &big_store, {});
  SparseTableOptions opt;
  opt.memory_bytes = 20000;  // 140 rows of 8 x 3 floats (128 B slots + index)
  auto small = SparseTable::Create(1, spec, &small_store, opt);
  ASSERT_TRUE(big.ok() && small.ok());
  std::mt19937_64 rng(1);
  std::vector<uint64_t> all;
  std::vector<float> out_big, out_small, grad;
  for (int it = 0; it < 300; ++it) {
    // Batches of up to 200 keys, some repeated, some more than the tier holds.
    auto keys = Batch(rng, 1 + rng() % 200, 2000);
    out_big.resize(keys.size() * 8);
    out_small.resize(keys.size() * 8);
    ASSERT_TRUE((*big)->Read(keys, it, out_big.data()).ok());
    ASSERT_TRUE((*small)->Read(keys, it, out_small.data()).ok());
    ASSERT_EQ(0, std::memcmp(out_big.data(), out_small.data(), out_big.size() * 4)) << it;
    grad.resize(keys.size() * 8);
    std::normal_distribution<float> g(0, 1);
    for (auto& x : grad) x = g(rng);
    ASSERT_TRUE((*big)->Apply(keys, grad.data(), it).ok());
    ASSERT_TRUE((*small)->Apply(keys, grad.data(), it).ok());
    ASSERT_LE((*small)->memory_bytes(), opt.memory_bytes);
    all.insert(all.end(), keys.begin(), keys.end());
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  SparseCounters c = (*small)->counters();
  EXPECT_GT(c.evictions, 1000u);
  EXPECT_GT(c.tier_hits, 0u);
  EXPECT_LT(c.resident_rows, all.size() / 4);
  EXPECT_EQ((*big)->counters().evictions, 0u);
  EXPECT_EQ((*big)->counters().resident_rows, all.size());
  ExpectSameRecords(**big, **small, all);
  // After a flush the store alone holds the table.
  ASSERT_TRUE((*small)->FlushDirty().ok());
  EXPECT_EQ(small_store.ApproxRows(1), all.size());
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TierTest,
                         ::testing::Values(OptimizerKind::kAdam, OptimizerKind::kFtrl,
                                           OptimizerKind::kAdagrad));

TEST(SparseTableTest, ABurstOfOnceSeenKeysDoesNotEvictTheHotRows) {
  MemoryRowStore store;
  SparseTableOptions opt;
  opt.memory_bytes = 20000;  // 140 rows
  auto t = SparseTable::Create(1, SparseSpec(8, OptimizerKind::kAdam), &store, opt);
  ASSERT_TRUE(t.ok());
  std::vector<uint64_t> hot(20);
  for (size_t i = 0; i < hot.size(); ++i) hot[i] = 1000 + i;
  std::vector<float> out(20 * 8);
  for (int round = 0; round < 10; ++round) ASSERT_TRUE((*t)->Read(hot, 0, out.data()).ok());
  // 300 new keys, each pulled once, in batches of 10: more than twice the tier. Under LRU
  // the hot rows, untouched meanwhile, would be the oldest and go first.
  for (uint64_t b = 0; b < 30; ++b) {
    std::vector<uint64_t> cold(10);
    for (uint64_t i = 0; i < 10; ++i) cold[i] = 1000000 + b * 10 + i;
    ASSERT_TRUE((*t)->Read(cold, 0, out.data()).ok());
  }
  EXPECT_GT((*t)->counters().evictions, 100u);
  for (uint64_t k : hot) EXPECT_TRUE((*t)->Resident(k)) << k;
}

TEST(SparseTableTest, MemoryStaysWithinTheBudgetUnderTenTimesMoreRows) {
  TableSpec spec = SparseSpec(16, OptimizerKind::kAdam);
  spec.sparse.admit_after = 2;
  MemoryRowStore store;
  SparseTableOptions opt;
  opt.memory_bytes = 100000;
  opt.sketch_width = 1 << 16;  // shrunk to fit a quarter of the budget
  auto t = SparseTable::Create(3, spec, &store, opt);
  ASSERT_TRUE(t.ok());
  EXPECT_LE((*t)->memory_bytes(), opt.memory_bytes);
  std::mt19937_64 rng(2);
  std::vector<float> out(256 * 16), grad(256 * 16, 0.1f);
  uint64_t most = 0;
  for (int it = 0; it < 200; ++it) {
    auto keys = Batch(rng, 256, 20000);
    ASSERT_TRUE((*t)->Read(keys, it, out.data()).ok());
    ASSERT_LE((*t)->memory_bytes(), opt.memory_bytes);
    ASSERT_TRUE((*t)->Apply(keys, grad.data(), it).ok());
    ASSERT_LE((*t)->memory_bytes(), opt.memory_bytes);
    most = std::max(most, (*t)->memory_bytes());
  }
  SparseCounters c = (*t)->counters();
  size_t row = (*t)->layout().bytes();
  EXPECT_GT(c.store_rows * row, 10 * opt.memory_bytes);  // the table is 10x the budget
  EXPECT_GT(most, opt.memory_bytes * 3 / 4);             // and the budget is used
  EXPECT_EQ(c.memory_bytes, (*t)->memory_bytes());
  // Shrinking the budget evicts to fit and keeps the rows.
  std::vector<uint64_t> probe = Batch(rng, 64, 20000);
  std::vector<float> before(64 * 16), after(64 * 16);
  ASSERT_TRUE((*t)->Read(probe, 300, before.data()).ok());
  ASSERT_TRUE((*t)->SetMemoryBudget(40000).ok());
  EXPECT_LE((*t)->memory_bytes(), 40000u);
  ASSERT_TRUE((*t)->Read(probe, 300, after.data()).ok());
  EXPECT_EQ(before, after);
}

TEST(SparseTableTest, FlushDirtyWritesOnlyChangedRows) {
  MemoryRowStore store;
  auto t = SparseTable::Create(1, SparseSpec(4, OptimizerKind::kAdagrad), &store, {});
  ASSERT_TRUE(t.ok());
  std::vector<uint64_t> keys(100);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 7919;
  std::vector<float> out(400), grad(400, 0.5f);
  ASSERT_TRUE((*t)->Read(keys, 0, out.data()).ok());
  auto n = (*t)->FlushDirty();
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 100u);  // new rows are written once
  EXPECT_EQ(store.writes(), 100u);
  ASSERT_TRUE((*t)->Read(keys, 1, out.data()).ok());  // reads do not dirty rows
  std::vector<uint64_t> some(keys.begin(), keys.begin() + 10);
  ASSERT_TRUE((*t)->Apply(some, grad.data(), 1).ok());
  n = (*t)->FlushDirty();
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 10u);
  EXPECT_EQ(store.writes(), 110u);
  n = (*t)->FlushDirty();
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  EXPECT_EQ(store.writes(), 110u);
  EXPECT_EQ((*t)->counters().rows_written, 110u);
}

TEST(SparseTableTest, AdmissionServesTheInitializerAndDropsGradientsUntilNPulls) {
  TableSpec spec = SparseSpec(2, OptimizerKind::kSgd);
  spec.sparse.admit_after = 3;
  MemoryRowStore store;
  auto t = SparseTable::Create(1, spec, &store, {});
  ASSERT_TRUE(t.ok());
  std::vector<uint64_t> key = {99};
  float init[2], out[2], grad[2] = {1.f, 1.f};
  InitSparseRow(spec.init, 99, 2, init);
  std::vector<uint8_t> rec((*t)->layout().bytes());
  for (int pull = 1; pull <= 2; ++pull) {
    ASSERT_TRUE((*t)->Read(key, pull, out).ok());
    EXPECT_EQ(out[0], init[0]);
    EXPECT_EQ(out[1], init[1]);
    ASSERT_TRUE((*t)->Apply(key, grad, pull).ok());
    auto found = (*t)->ReadRecord(99, rec.data());
    ASSERT_TRUE(found.ok());
    EXPECT_FALSE(*found) << "pull " << pull;
  }
  SparseCounters c = (*t)->counters();
  EXPECT_EQ(c.unadmitted_reads, 2u);
  EXPECT_EQ(c.dropped_gradients, 2u);
  EXPECT_EQ(c.admissions, 0u);
  ASSERT_TRUE((*t)->Read(key, 3, out).ok());  // the third pull admits it
  EXPECT_EQ(out[0], init[0]);
  auto found = (*t)->ReadRecord(99, rec.data());
  ASSERT_TRUE(found.ok() && *found);
  ASSERT_TRUE((*t)->Apply(key, grad, 3).ok());
  ASSERT_TRUE((*t)->Read(key, 3, out).ok());
  EXPECT_FLOAT_EQ(out[0], init[0] - 0.1f);
  c = (*t)->counters();
  EXPECT_EQ(c.admissions, 1u);
  EXPECT_EQ(c.dropped_gradients, 2u);
  EXPECT_EQ(c.resident_rows, 1u);
}

TEST(SparseTableTest, AdmissionSketchFollowsTheBudgetAndKeepsEveryKeysCount) {
  TableSpec spec = SparseSpec(2, OptimizerKind::kSgd);
  spec.sparse.admit_after = 3;
  MemoryRowStore store;
  SparseTableOptions opt;
  opt.sketch_width = 1 << 16;  // 4 x 64 KiB unbounded
  auto t = SparseTable::Create(1, spec, &store, opt);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->memory_bytes(), 4u << 16);
  std::vector<uint64_t> a(1000), b(1000);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = (i + 1) * 0x9E3779B97F4A7C15ull;
    b[i] = (i + 1) * 0xC2B2AE3D27D4EB4Full;
  }
  std::vector<float> out(2 * a.size());
  for (int pull = 0; pull < 2; ++pull) {  // seen twice: not admitted yet
    ASSERT_TRUE((*t)->Read(a, 0, out.data()).ok());
    ASSERT_TRUE((*t)->Read(b, 0, out.data()).ok());
  }
  EXPECT_EQ((*t)->counters().admissions, 0u);
  // A 64 KiB budget: the sketch shrinks to a quarter of it (folded, not cleared).
  ASSERT_TRUE((*t)->SetMemoryBudget(64 << 10).ok());
  EXPECT_LE((*t)->memory_bytes(), 64u << 10);
  ASSERT_TRUE((*t)->Read(a, 0, out.data()).ok());  // the third pull admits every key
  EXPECT_EQ((*t)->counters().admissions, a.size());
  EXPECT_LE((*t)->memory_bytes(), 64u << 10);
  // Unbounded again: the sketch grows back to its width, the counts kept.
  ASSERT_TRUE((*t)->SetMemoryBudget(UINT64_MAX).ok());
  EXPECT_GE((*t)->memory_bytes(), 4u << 16);
  ASSERT_TRUE((*t)->Read(b, 0, out.data()).ok());
  EXPECT_EQ((*t)->counters().admissions, a.size() + b.size());
}

TEST(SparseTableTest, ExpiryDropsRowsUnseenForEClocksFromBothTiers) {
  TableSpec spec = SparseSpec(4, OptimizerKind::kSgd);
  spec.sparse.expire_after_clocks = 5;
  MemoryRowStore store;
  SparseTableOptions opt;
  opt.memory_bytes = 4000;  // a few dozen rows: most rows live in the store
  auto t = SparseTable::Create(1, spec, &store, opt);
  ASSERT_TRUE(t.ok());
  std::vector<uint64_t> old_keys, kept;
  for (uint64_t k = 0; k < 200; ++k) (k % 4 == 0 ? kept : old_keys).push_back(k * 1000003);
  std::vector<float> out(200 * 4), grad(200 * 4, 1.f);
  ASSERT_TRUE((*t)->Read(old_keys, 0, out.data()).ok());
  ASSERT_TRUE((*t)->Apply(old_keys, grad.data(), 0).ok());
  ASSERT_TRUE((*t)->Read(kept, 0, out.data()).ok());
  ASSERT_TRUE((*t)->Apply(kept, grad.data(), 0).ok());
  ASSERT_TRUE((*t)->Read(kept, 8, out.data()).ok());  // seen at clock 8
  ASSERT_GT(store.ApproxRows(1), 0u);
  ASSERT_GT((*t)->counters().resident_rows, 0u);
  // At clock 10: old keys are 10 clocks unseen (> 5), kept keys 2. Sweep in small steps.
  for (int i = 0; i < 40; ++i) ASSERT_TRUE((*t)->Expire(10, 16).ok());
  std::vector<uint8_t> rec((*t)->layout().bytes());
  for (uint64_t k : old_keys) {
    auto f = (*t)->ReadRecord(k, rec.data());
    ASSERT_TRUE(f.ok());
    EXPECT_FALSE(*f) << k;
  }
  for (uint64_t k : kept) {
    auto f = (*t)->ReadRecord(k, rec.data());
    ASSERT_TRUE(f.ok());
    EXPECT_TRUE(*f) << k;
  }
  ASSERT_TRUE((*t)->FlushDirty().ok());
  EXPECT_EQ(store.ApproxRows(1), kept.size());
  EXPECT_EQ((*t)->counters().expired_rows, old_keys.size());
  // An expired key comes back fresh: the initializer's value, not the trained one.
  float back[4], init[4];
  ASSERT_TRUE((*t)->Read(std::span<const uint64_t>(&old_keys[0], 1), 11, back).ok());
  InitSparseRow(spec.init, old_keys[0], 4, init);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(back[c], init[c]);
}

// ---------------------------------------------------------------------------------------
// Store errors

// A MemoryRowStore whose Read or Write fails on demand.
class FaultyStore final : public RowStore {
 public:
  bool fail_read = false;
  bool fail_write = false;
  MemoryRowStore inner;
  Status Read(uint32_t t, std::span<const uint64_t> k, size_t rb, uint8_t* out,
              std::vector<uint8_t>* found) override {
    if (fail_read) return IOError("injected read error");
    return inner.Read(t, k, rb, out, found);
  }
  Status Write(uint32_t t, std::span<const uint64_t> k, size_t rb, const uint8_t* r,
               std::span<const uint64_t> d) override {
    if (fail_write) return IOError("injected write error");
    return inner.Write(t, k, rb, r, d);
  }
  Status Scan(uint32_t t, uint64_t* c, size_t l, size_t rb,
              const std::function<void(uint64_t, const uint8_t*)>& v, bool* w) override {
    return inner.Scan(t, c, l, rb, v, w);
  }
  Status DropTable(uint32_t t) override { return inner.DropTable(t); }
  uint64_t ApproxRows(uint32_t t) const override { return inner.ApproxRows(t); }
  uint64_t MemoryBytes() const override { return 0; }
};

TEST(SparseTableTest, StoreErrorsLeaveTheTableUnchangedAndAreReturned) {
  TableSpec spec = SparseSpec(4, OptimizerKind::kAdam);
  spec.optimizer.lr = 0.01f;
  FaultyStore faulty;
  MemoryRowStore ref_store;
  SparseTableOptions opt;
  opt.memory_bytes = 6000;
  auto t = SparseTable::Create(1, spec, &faulty, opt);
  auto ref = SparseTable::Create(1, spec, &ref_store, opt);
  ASSERT_TRUE(t.ok() && ref.ok());
  std::mt19937_64 rng(3);
  std::vector<uint64_t> all;
  std::vector<float> out, out_ref, grad;
  int failures = 0;
  for (int it = 0; it < 200; ++it) {
    auto keys = Batch(rng, 1 + rng() % 40, 500);
    all.insert(all.end(), keys.begin(), keys.end());
    out.resize(keys.size() * 4);
    out_ref.resize(keys.size() * 4);
    grad.assign(keys.size() * 4, 0.01f * static_cast<float>(it % 7));
    // Every third iteration, the faulty table's store fails once first; the retry must
    // behave as if the failed call never happened.
    if (it % 3 == 0) {
      faulty.fail_read = it % 2 == 0;
      faulty.fail_write = it % 2 != 0;
      Status st = (*t)->Read(keys, it, out.data());
      Status sa = (*t)->Apply(keys, grad.data(), it);
      if (!st.ok()) {
        EXPECT_EQ(st.code(), StatusCode::kIOError);
        ++failures;
      }
      if (!sa.ok()) ++failures;
      // A call that needed no store access succeeded; redo the rest without faults.
      faulty.fail_read = faulty.fail_write = false;
      if (st.ok()) {
        ASSERT_TRUE((*ref)->Read(keys, it, out_ref.data()).ok());
        EXPECT_EQ(out, out_ref);
      } else {
        ASSERT_TRUE((*t)->Read(keys, it, out.data()).ok());
        ASSERT_TRUE((*ref)->Read(keys, it, out_ref.data()).ok());
        EXPECT_EQ(out, out_ref);
      }
      if (sa.ok()) {
        ASSERT_TRUE((*ref)->Apply(keys, grad.data(), it).ok());
      } else {
        ASSERT_TRUE((*t)->Apply(keys, grad.data(), it).ok());
        ASSERT_TRUE((*ref)->Apply(keys, grad.data(), it).ok());
      }
      continue;
    }
    ASSERT_TRUE((*t)->Read(keys, it, out.data()).ok());
    ASSERT_TRUE((*ref)->Read(keys, it, out_ref.data()).ok());
    EXPECT_EQ(out, out_ref);
    ASSERT_TRUE((*t)->Apply(keys, grad.data(), it).ok());
    ASSERT_TRUE((*ref)->Apply(keys, grad.data(), it).ok());
  }
  EXPECT_GT(failures, 20);
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  ExpectSameRecords(**t, **ref, all);
  faulty.fail_write = true;
  EXPECT_FALSE((*t)->FlushDirty().ok());
  faulty.fail_write = false;
  auto a = (*t)->FlushDirty();
  auto b = (*ref)->FlushDirty();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);  // the failed flush left every row dirty
}

// ---------------------------------------------------------------------------------------
// MemoryRowStore

TEST(MemoryRowStoreTest, ScanVisitsEveryRecordOfOneTableInKeyOrderAndWraps) {
  MemoryRowStore s;
  std::vector<uint64_t> keys = {5, 1, 9, UINT64_MAX, 3};
  std::vector<uint8_t> recs(keys.size() * 8, 1);
  ASSERT_TRUE(s.Write(2, keys, 8, recs.data(), {}).ok());
  ASSERT_TRUE(s.Write(1, keys, 8, recs.data(), {}).ok());
  ASSERT_TRUE(s.Write(3, keys, 8, recs.data(), {}).ok());
  uint64_t cursor = 0;
  bool wrapped = false;
  std::vector<uint64_t> seen;
  int calls = 0;
  while (!wrapped) {
    ASSERT_TRUE(
        s.Scan(
             2, &cursor, 2, 8, [&](uint64_t k, const uint8_t*) { seen.push_back(k); }, &wrapped)
            .ok());
    ASSERT_LT(++calls, 10);
  }
  EXPECT_EQ(seen, (std::vector<uint64_t>{1, 3, 5, 9, UINT64_MAX}));
  EXPECT_EQ(cursor, 0u);
  ASSERT_TRUE(s.Write(2, {}, 8, nullptr, std::vector<uint64_t>{3, 9}).ok());
  EXPECT_EQ(s.ApproxRows(2), 3u);
  ASSERT_TRUE(s.DropTable(2).ok());
  EXPECT_EQ(s.ApproxRows(2), 0u);
  EXPECT_EQ(s.ApproxRows(1), 5u);
  EXPECT_EQ(s.ApproxRows(3), 5u);
}

// ---------------------------------------------------------------------------------------
// Specs

TEST(SparseSpecTest, ValidateSpecChecksSparseOnlyFieldsAndSizes) {
  TableSpec ok = SparseSpec(8, OptimizerKind::kFtrl);
  ok.optimizer.clip_value = 1;
  ok.sparse = {5, 100};
  EXPECT_TRUE(ValidateSpec(ok).ok()) << ValidateSpec(ok).message();

  auto bad = [](TableSpec s, const std::string& word) {
    Status st = ValidateSpec(s);
    EXPECT_FALSE(st.ok()) << word;
    EXPECT_NE(st.message().find(word), std::string::npos) << st.message();
  };
  TableSpec s = ok;
  s.rows = 10;
  bad(s, "rows = 0");
  s = ok;
  s.cols = 0;
  bad(s, "cols");
  s = ok;
  s.cols = kMaxSparseCols;
  EXPECT_TRUE(ValidateSpec(s).ok());
  s.cols = kMaxSparseCols + 1;  // the fuzzer found a wide row's arena chunk allocating 8.5 GB
  bad(s, "at most 4096");
  s = ok;
  s.optimizer.l1 = -1;
  bad(s, "l1");
  s = ok;
  s.optimizer.ftrl_beta = NAN;
  bad(s, "ftrl_beta");
  s = ok;
  s.optimizer.clip_value = INFINITY;
  bad(s, "clip_value");
  s = ok;
  s.sparse.expire_after_clocks = -1;
  bad(s, "expire_after_clocks");
  s = ok;
  s.sparse.admit_after = 1000;
  bad(s, "admit_after");

  TableSpec dense;
  dense.name = "w";
  dense.rows = 10;
  dense.cols = 4;
  EXPECT_TRUE(ValidateSpec(dense).ok());
  s = dense;
  s.optimizer.kind = OptimizerKind::kFtrl;
  bad(s, "ftrl");
  s = dense;
  s.optimizer.clip_value = 1;
  bad(s, "clip_value");
  s = dense;
  s.sparse.admit_after = 2;
  bad(s, "admit_after");
  s = dense;
  s.sparse.expire_after_clocks = 3;
  bad(s, "expire_after_clocks");
  s = dense;
  s.optimizer.l1 = -0.5f;
  bad(s, "l1");

  EXPECT_FALSE(Table::Create(1, ok, RowRange{0, 0}).ok());
  MemoryRowStore store;
  EXPECT_FALSE(SparseTable::Create(1, dense, &store, {}).ok());
}

TEST(SparseSpecTest, SameTableSpecAndDescribeSpecCoverKindSparseConfigAndFtrl) {
  TableSpec a = SparseSpec(8, OptimizerKind::kFtrl);
  a.sparse = {3, 10};
  TableSpec b = a;
  b.optimizer.momentum = 0.5f;  // unused by FTRL
  EXPECT_TRUE(SameTableSpec(a, b));
  b = a;
  b.optimizer.l1 = 0.5f;
  EXPECT_FALSE(SameTableSpec(a, b));
  b = a;
  b.optimizer.ftrl_beta = 2;
  EXPECT_FALSE(SameTableSpec(a, b));
  b = a;
  b.optimizer.clip_value = 2;
  EXPECT_FALSE(SameTableSpec(a, b));
  b = a;
  b.sparse.admit_after = 4;
  EXPECT_FALSE(SameTableSpec(a, b));
  b = a;
  b.sparse.expire_after_clocks = 11;
  EXPECT_FALSE(SameTableSpec(a, b));
  b = a;
  b.sparse.admit_after = 0;
  TableSpec c = b;
  c.sparse.admit_after = 1;
  EXPECT_TRUE(SameTableSpec(b, c));  // both admit at once
  TableSpec dense;
  dense.name = "emb";
  dense.rows = 10;
  dense.cols = 8;
  TableSpec sp = dense;
  sp.rows = 0;
  sp.kind = TableKind::kSparse;
  EXPECT_FALSE(SameTableSpec(dense, sp));

  std::string d = DescribeSpec(a);
  EXPECT_NE(d.find("sparse"), std::string::npos) << d;
  EXPECT_NE(d.find("ftrl"), std::string::npos) << d;
  EXPECT_NE(d.find("l1="), std::string::npos) << d;
  EXPECT_NE(d.find("admit after 3"), std::string::npos) << d;
  EXPECT_NE(d.find("expire after 10"), std::string::npos) << d;
  EXPECT_EQ(DescribeSpec(dense).find("sparse"), std::string::npos);
}

}  // namespace
}  // namespace leash::ps
