// Tests of range partitioning.
#include "leash/common/partition.h"

#include <gtest/gtest.h>

namespace leash {
namespace {

TEST(RangePartitionerTest, RangesAreAdjacentBalancedAndCoverEveryRow) {
  for (int shards : {1, 2, 3, 7}) {
    RangePartitioner p(shards);
    for (uint64_t rows : {0ull, 1ull, 2ull, 10ull, 784ull, 1001ull}) {
      uint64_t next = 0;
      uint64_t lo = UINT64_MAX, hi = 0;
      for (int s = 0; s < shards; ++s) {
        RowRange r = p.Range(rows, s);
        EXPECT_EQ(r.begin, next) << rows << " rows, shard " << s;
        next = r.end;
        lo = std::min(lo, r.size());
        hi = std::max(hi, r.size());
        for (uint64_t k = r.begin; k < r.end; ++k) ASSERT_EQ(p.Owner(rows, k), s) << "key " << k;
      }
      EXPECT_EQ(next, rows);
      EXPECT_LE(hi - lo, 1u);
    }
  }
}

TEST(RangePartitionerTest, SplitGroupsKeysByOwnerAndRemembersPositions) {
  RangePartitioner p(2);
  std::vector<std::vector<uint64_t>> keys;
  std::vector<std::vector<size_t>> pos;
  p.Split(10, {9, 0, 5, 4}, &keys, &pos);
  EXPECT_EQ(keys[0], (std::vector<uint64_t>{0, 4}));
  EXPECT_EQ(keys[1], (std::vector<uint64_t>{9, 5}));
  EXPECT_EQ(pos[0], (std::vector<size_t>{1, 3}));
  EXPECT_EQ(pos[1], (std::vector<size_t>{0, 2}));
}

TEST(SparseOwnerTest, SpreadsSequentialAndStridedKeysEvenlyAndIsStable) {
  for (int shards : {1, 2, 3, 7}) {
    for (uint64_t stride : {uint64_t{1}, uint64_t{1} << 32, uint64_t{1024}}) {
      std::vector<int> count(static_cast<size_t>(shards), 0);
      const int n = 70000;
      for (int i = 0; i < n; ++i) {
        int s = SparseOwner(static_cast<uint64_t>(i) * stride, shards);
        ASSERT_GE(s, 0);
        ASSERT_LT(s, shards);
        ++count[static_cast<size_t>(s)];
      }
      for (int c : count) {
        EXPECT_NEAR(c, n / shards, n / shards / 20) << shards << " shards, stride " << stride;
      }
    }
  }
  // Pinned: clients and shards of different builds must agree on every key's owner.
  EXPECT_EQ(SparseOwner(0, 2), 0);
  EXPECT_EQ(SparseOwner(42, 1), 0);
  EXPECT_EQ((std::vector<int>{SparseOwner(1, 4), SparseOwner(2, 4), SparseOwner(3, 4),
                              SparseOwner(4, 4), SparseOwner(123456789, 4)}),
            (std::vector<int>{2, 0, 0, 1, 2}));
  EXPECT_EQ(SparseOwner(123456789, 3), 1);
}

}  // namespace
}  // namespace leash
