// Tests of KeyedRateLimit: per-key and total limits per window, the count of suppressed
// events reported with the next allowed one, and the bound on keys tracked.
#include "leash/common/rate_limit.h"

#include <gtest/gtest.h>

namespace leash {
namespace {

TEST(KeyedRateLimitTest, AllowsPerKeyBurstPerWindowAndReportsWhatItSuppressed) {
  KeyedRateLimit limit({.per_key = 3, .total = 100, .window_ms = 1000, .max_keys = 16});
  int allowed = 0;
  for (int i = 0; i < 10; ++i) allowed += limit.Admit("peer-a/bad", 0).allowed;
  EXPECT_EQ(allowed, 3);
  // Another key, or the same peer for another reason, has its own budget.
  EXPECT_TRUE(limit.Admit("peer-b/bad", 10).allowed);
  EXPECT_TRUE(limit.Admit("peer-a/limit", 10).allowed);
  EXPECT_FALSE(limit.Admit("peer-a/bad", 999).allowed);
  // The next window: allowed again, and told how many were suppressed in between.
  KeyedRateLimit::Decision d = limit.Admit("peer-a/bad", 1000);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.suppressed_before, 8u);
  EXPECT_EQ(limit.Admit("peer-a/bad", 1001).suppressed_before, 0u);
  EXPECT_EQ(limit.allowed(), 7u);
  EXPECT_EQ(limit.suppressed(), 8u);
}

TEST(KeyedRateLimitTest, TotalLimitBoundsManyKeysTogether) {
  KeyedRateLimit limit({.per_key = 5, .total = 20, .window_ms = 1000, .max_keys = 1000});
  int allowed = 0;
  for (int peer = 0; peer < 100; ++peer) {
    for (int i = 0; i < 5; ++i) allowed += limit.Admit("peer" + std::to_string(peer), 0).allowed;
  }
  EXPECT_EQ(allowed, 20);
  EXPECT_EQ(limit.suppressed(), 480u);
}

TEST(KeyedRateLimitTest, KeysBeyondTheBoundShareOneAndIdleOnesAreForgotten) {
  KeyedRateLimit limit({.per_key = 1, .total = 1000, .window_ms = 100, .max_keys = 4});
  for (int peer = 0; peer < 50; ++peer) limit.Admit("peer" + std::to_string(peer), 0);
  EXPECT_LE(limit.keys(), 5u);  // 4 and the shared "*"
  // Once their windows are over, keys with nothing left to report make room for new ones.
  for (int peer = 0; peer < 4; ++peer) {
    EXPECT_TRUE(limit.Admit("later" + std::to_string(peer), 200).allowed) << peer;
  }
  EXPECT_LE(limit.keys(), 5u);
}

}  // namespace
}  // namespace leash
