// UpdateThreads: the ranges cover every element once, on the caller and the other threads,
// under the caller's floating-point mode, with bounds on kAlign; small jobs are not split.
#include "leash/ps/update_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "leash/common/denormals.h"

namespace leash::ps {
namespace {

struct Seen {
  std::mutex mu;
  std::vector<std::pair<size_t, size_t>> ranges;
  std::set<std::thread::id> threads;
};

TEST(UpdateThreadsTest, RangesCoverEveryElementOnceOnSeveralThreadsWithAlignedBounds) {
  UpdateThreads pool(4, /*min_range=*/1000);
  EXPECT_EQ(pool.threads(), 4);
  for (size_t n : {size_t{4096}, size_t{100003}, size_t{2050}, size_t{64 * 1024 + 1}}) {
    SCOPED_TRACE(n);
    std::vector<std::atomic<int>> hits(n);
    Seen seen;
    const uint64_t before = pool.split_runs();
    pool.Run(n, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
      std::lock_guard<std::mutex> l(seen.mu);
      seen.ranges.emplace_back(b, e);
      seen.threads.insert(std::this_thread::get_id());
    });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "element " << i;
    EXPECT_EQ(seen.ranges.size(), pool.Ranges(n));
    EXPECT_GT(seen.ranges.size(), 1u);
    EXPECT_LE(seen.ranges.size(), 4u);
    EXPECT_EQ(seen.threads.size(), seen.ranges.size());  // one range per thread
    EXPECT_EQ(seen.threads.count(std::this_thread::get_id()), 1u);
    for (auto [b, e] : seen.ranges) {
      EXPECT_EQ(b % UpdateThreads::kAlign, 0u);
      EXPECT_TRUE(e == n || e % UpdateThreads::kAlign == 0) << e;
    }
    EXPECT_EQ(pool.split_runs(), before + 1);
  }
}

TEST(UpdateThreadsTest, SmallJobsAndOneThreadRunOnTheCallerAlone) {
  UpdateThreads pool(3, /*min_range=*/1000);
  EXPECT_EQ(pool.Ranges(0), 1u);
  EXPECT_EQ(pool.Ranges(1999), 1u);  // two ranges would be under 1000 (rounded up to 1024)
  EXPECT_EQ(pool.Ranges(2048), 2u);
  EXPECT_EQ(pool.Ranges(1u << 20), 3u);
  int calls = 0;
  const std::thread::id caller = std::this_thread::get_id();
  pool.Run(1999, [&](size_t b, size_t e) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(b, 0u);
    EXPECT_EQ(e, 1999u);
    ++calls;
  });
  pool.Run(0, [&](size_t, size_t) { ++calls; });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(pool.split_runs(), 0u);

  UpdateThreads alone(1, 1);
  EXPECT_EQ(alone.threads(), 1);
  EXPECT_EQ(alone.Ranges(1u << 20), 1u);
  alone.Run(1u << 20, [&](size_t b, size_t e) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(e - b, size_t{1} << 20);
  });
}

// A range on another thread computes as the caller would: with subnormals flushed when the
// caller flushes them, and not when it does not.
TEST(UpdateThreadsTest, EveryRangeRunsUnderTheCallersFloatingPointMode) {
  UpdateThreads pool(2, /*min_range=*/64);
  for (bool flush : {true, false}) {
    SCOPED_TRACE(flush ? "flushing" : "not flushing");
    std::vector<float> out(256);
    auto run = [&] {
      pool.Run(out.size(), [&](size_t b, size_t e) {
        volatile float tiny = 1e-37f;
        volatile float scale = 0.01f;
        for (size_t i = b; i < e; ++i) out[i] = tiny * scale;  // 1e-39: subnormal, or 0
      });
    };
    if (flush) {
      ScopedFlushDenormals f;
      run();
    } else {
      run();
    }
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(std::fpclassify(out[i]), flush ? FP_ZERO : FP_SUBNORMAL) << "element " << i;
    }
  }
  // The helper threads' own mode was put back: a job without the flush, again.
  std::vector<float> again(256);
  pool.Run(again.size(), [&](size_t b, size_t e) {
    volatile float tiny = 1e-37f;
    volatile float scale = 0.01f;
    for (size_t i = b; i < e; ++i) again[i] = tiny * scale;
  });
  for (float v : again) ASSERT_EQ(std::fpclassify(v), FP_SUBNORMAL);
}

// Many jobs in a row, of sizes that use some or all threads, each finished before the next.
TEST(UpdateThreadsTest, JobsOneAfterAnotherEachFinishBeforeRunReturns) {
  UpdateThreads pool(3, /*min_range=*/64);
  std::vector<uint64_t> v(3000, 0);
  uint64_t want = 0;
  for (uint64_t job = 1; job <= 2000; ++job) {
    const size_t n = 64 + (job * 97) % (v.size() - 64);
    pool.Run(n, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) v[i] += job;
    });
    want += job;
    ASSERT_EQ(v[0], want) << "job " << job;
  }
  uint64_t total = 0, expect = 0;
  for (uint64_t x : v) total += x;
  for (uint64_t job = 1; job <= 2000; ++job) expect += job * (64 + (job * 97) % (v.size() - 64));
  EXPECT_EQ(total, expect);
}

// The passes beside the threads give what one call gives, split or not, and count as passes.
TEST(UpdateThreadsTest, SharedChecksAndCopiesGiveWhatOneCallGives) {
  UpdateThreads pool(3, /*min_range=*/64);
  const size_t n = 64 * 100 + 5;
  std::vector<float> src(n);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 0.25f - 100.f;
  EXPECT_TRUE(AllFiniteShared(&pool, src.data(), n));
  EXPECT_TRUE(AllFiniteShared(nullptr, src.data(), n));
  std::vector<float> to(n, -1.f);
  EXPECT_TRUE(CopyAllFiniteShared(&pool, to.data(), src.data(), n * sizeof(float)));
  EXPECT_EQ(to, src);
  EXPECT_EQ(pool.split_passes(), 2u);
  EXPECT_EQ(pool.split_runs(), 0u) << "passes are not updates";
  // A NaN or Inf in the first, a middle or the last range is found.
  for (size_t at : {size_t{0}, n / 2, n - 1}) {
    for (float bad : {std::nanf(""), INFINITY}) {
      std::vector<float> v = src;
      v[at] = bad;
      EXPECT_FALSE(AllFiniteShared(&pool, v.data(), n)) << at;
      std::vector<float> copy(n);
      EXPECT_FALSE(CopyAllFiniteShared(&pool, copy.data(), v.data(), n * sizeof(float))) << at;
      EXPECT_EQ(std::memcmp(copy.data(), v.data(), n * sizeof(float)), 0) << "copied anyway";
    }
  }
  std::vector<float> copy(n);
  EXPECT_TRUE(CopyAllFiniteShared(&pool, copy.data(), src.data(), n * sizeof(float)));
  EXPECT_EQ(copy, src);
  // Bytes past the last whole float: copied, and not whole float32 values.
  std::vector<uint8_t> odd(n * sizeof(float) + 3, 0);
  std::vector<uint8_t> odd_copy(odd.size(), 1);
  EXPECT_FALSE(CopyAllFiniteShared(&pool, odd_copy.data(), odd.data(), odd.size()));
  EXPECT_EQ(odd_copy, odd);
  EXPECT_FALSE(CopyAllFiniteShared(nullptr, odd_copy.data(), odd.data(), odd.size()));
  EXPECT_FALSE(CopyAllFiniteShared(&pool, nullptr, nullptr, 0)) << "empty";
  // A new frame, as Frame::CopyCheckingFinite makes one.
  Frame made = CopyCheckingFiniteShared(&pool, src.data(), n * sizeof(float));
  EXPECT_TRUE(made.finite_f32());
  ASSERT_EQ(made.size(), n * sizeof(float));
  EXPECT_NE(made.data(), reinterpret_cast<const uint8_t*>(src.data()));
  EXPECT_EQ(std::memcmp(made.data(), src.data(), made.size()), 0);
  std::vector<float> with_inf = src;
  with_inf[n - 2] = -INFINITY;
  EXPECT_FALSE(CopyCheckingFiniteShared(&pool, with_inf.data(), n * sizeof(float)).finite_f32());
  EXPECT_FALSE(CopyCheckingFiniteShared(&pool, odd.data(), odd.size()).finite_f32());
  EXPECT_TRUE(CopyCheckingFiniteShared(nullptr, src.data(), n * sizeof(float)).finite_f32());
}

TEST(UpdateThreadsTest, ResolveTakesAPositiveSettingAndOtherwiseHalfTheCoresUpToFour) {
  EXPECT_EQ(UpdateThreads::Resolve(3), 3);
  const int automatic = UpdateThreads::Resolve(0);
  EXPECT_GE(automatic, 1);
  EXPECT_LE(automatic, 4);
  const auto cores = static_cast<int>(std::thread::hardware_concurrency());
  if (cores > 0) {
    EXPECT_LE(automatic, std::max(1, cores / 2));
  }
}

}  // namespace
}  // namespace leash::ps
