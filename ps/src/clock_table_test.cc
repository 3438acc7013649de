// Unit tests of the staleness controller state: minimum clock, joins, leases, parking.
#include "leash/ps/clock_table.h"

#include <gtest/gtest.h>

namespace leash::ps {
namespace {

TEST(ClockTableTest, MinimumIsTheSlowestLiveWorker) {
  ClockTable t;
  ASSERT_EQ(*t.Register(1, 1, "a", 0), 0);
  ASSERT_EQ(*t.Register(2, 1, "b", 0), 0);
  EXPECT_FALSE(t.Advance(*t.Find(1, 1), 3));  // worker 2 still at 0
  EXPECT_EQ(t.MinClock(), 0);
  EXPECT_TRUE(t.Advance(*t.Find(2, 1), 2));
  EXPECT_EQ(t.MinClock(), 2);
}

TEST(ClockTableTest, BackupWorkersLeaveTheSlowestOutOfTheMinimum) {
  ClockTable t(0, /*backup_workers=*/1);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(t.Register(id, 1, "w", 0).ok());
  // Worker 3 is the straggler: the minimum is the second smallest clock.
  t.Advance(*t.Find(1, 1), 5);
  EXPECT_TRUE(t.Advance(*t.Find(2, 1), 4));
  EXPECT_EQ(t.MinClock(), 4);
  EXPECT_TRUE(t.Advance(*t.Find(2, 1), 6));
  EXPECT_EQ(t.MinClock(), 5);
  // Whoever is slowest is left out: the straggler overtaking worker 1 makes worker 1 the
  // one ignored.
  EXPECT_TRUE(t.Advance(*t.Find(3, 1), 7));
  EXPECT_EQ(t.MinClock(), 6);
}

TEST(ClockTableTest, BackupWorkersNeverLeaveEveryWorkerOut) {
  ClockTable t(0, /*backup_workers=*/2);
  ASSERT_TRUE(t.Register(1, 1, "a", 0).ok());
  t.Advance(*t.Find(1, 1), 3);
  EXPECT_EQ(t.MinClock(), 3);  // one live worker: it counts
  ASSERT_TRUE(t.Register(2, 1, "b", 0).ok());
  t.Advance(*t.Find(1, 1), 8);
  EXPECT_EQ(t.MinClock(), 8);  // two live, two backups: the fastest still counts
  // The minimum never goes back when the fastest leaves.
  EXPECT_TRUE(t.Remove(1));
  EXPECT_EQ(t.MinClock(), 8);
}

TEST(ClockTableTest, OnlyAPushLaggingTheMinimumBeyondItsBoundIsTooStale) {
  ClockTable t(0, /*backup_workers=*/1);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(t.Register(id, 1, "w", 0).ok());
  t.Advance(*t.Find(1, 1), 10);
  t.Advance(*t.Find(2, 1), 10);
  LiveWorker* slow = *t.Find(3, 1);
  t.Advance(slow, 7);
  ASSERT_EQ(t.MinClock(), 10);
  EXPECT_FALSE(t.TooStale(*slow));  // no pull seen: its bound is unknown
  slow->staleness = 3;
  EXPECT_FALSE(t.TooStale(*slow));  // 10 - 7 = 3 clocks behind: within the bound
  slow->staleness = 2;
  EXPECT_TRUE(t.TooStale(*slow));
  LiveWorker* fast = *t.Find(1, 1);
  fast->staleness = 0;
  EXPECT_FALSE(t.TooStale(*fast));
  // Without backup workers nothing is ever too stale.
  ClockTable plain;
  ASSERT_TRUE(plain.Register(1, 1, "a", 0).ok());
  ASSERT_TRUE(plain.Register(2, 1, "b", 0).ok());
  plain.Advance(*plain.Find(1, 1), 9);
  LiveWorker* b = *plain.Find(2, 1);
  b->staleness = 0;
  EXPECT_FALSE(plain.TooStale(*b));
}

TEST(ClockTableTest, DropPushDecidesOnceForAllPushesOfAnIteration) {
  ClockTable t(0, /*backup_workers=*/1);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(t.Register(id, 1, "w", 0).ok());
  t.Advance(*t.Find(1, 1), 3);
  t.Advance(*t.Find(2, 1), 3);
  LiveWorker* slow = *t.Find(3, 1);
  t.Advance(slow, 1);
  slow->staleness = 2;
  EXPECT_FALSE(t.DropPush(slow));  // 3 - 1 = 2 behind: the iteration is applied
  t.Advance(*t.Find(1, 1), 5);
  t.Advance(*t.Find(2, 1), 5);
  ASSERT_TRUE(t.TooStale(*slow));
  EXPECT_FALSE(t.DropPush(slow));  // the same iteration: still applied
  t.Advance(slow, 2);              // the next one, 3 behind: dropped, all of it
  EXPECT_TRUE(t.DropPush(slow));
  slow->staleness = 3;
  EXPECT_TRUE(t.DropPush(slow));
}

TEST(ClockTableTest, JoiningWorkerStartsAtTheMinimum) {
  ClockTable t;
  ASSERT_TRUE(t.Register(1, 1, "a", 0).ok());
  t.Advance(*t.Find(1, 1), 7);
  EXPECT_EQ(*t.Register(2, 1, "b", 0), 7);
  EXPECT_EQ(t.MinClock(), 7);
}

TEST(ClockTableTest, ClocksNeverGoBack) {
  ClockTable t;
  ASSERT_TRUE(t.Register(1, 1, "a", 0).ok());
  t.Advance(*t.Find(1, 1), 5);
  EXPECT_FALSE(t.Advance(*t.Find(1, 1), 3));
  EXPECT_EQ((*t.Find(1, 1))->clock, 5);
}

TEST(ClockTableTest, RemovingTheSlowestWorkerRaisesTheMinimum) {
  ClockTable t;
  ASSERT_TRUE(t.Register(1, 1, "a", 0).ok());
  ASSERT_TRUE(t.Register(2, 1, "b", 0).ok());
  t.Advance(*t.Find(1, 1), 4);
  EXPECT_TRUE(t.Remove(2));
  EXPECT_EQ(t.MinClock(), 4);
  EXPECT_FALSE(t.Remove(2));
}

TEST(ClockTableTest, MinimumStaysWhenTheLastWorkerLeaves) {
  ClockTable t;
  ASSERT_TRUE(t.Register(1, 1, "a", 0).ok());
  t.Advance(*t.Find(1, 1), 9);
  t.Remove(1);
  EXPECT_EQ(t.MinClock(), 9);
  EXPECT_EQ(*t.Register(3, 1, "c", 0), 9);
}

TEST(ClockTableTest, OlderIncarnationIsRefusedAndNewerReplaces) {
  ClockTable t;
  ASSERT_TRUE(t.Register(1, 5, "a", 0).ok());
  EXPECT_EQ(t.Register(1, 4, "a", 0).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(t.Register(1, 6, "a", 0).ok());
  EXPECT_EQ(t.Find(1, 5).status().code(), StatusCode::kNotRegistered);
  EXPECT_TRUE(t.Find(1, 6).ok());
}

TEST(ClockTableTest, UnknownWorkerIsToldToRegister) {
  ClockTable t;
  auto r = t.Find(42, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("register again"), std::string::npos);
}

TEST(ClockTableTest, ExpiredListsOnlySilentWorkers) {
  ClockTable t;
  ASSERT_TRUE(t.Register(1, 1, "a", 0).ok());
  ASSERT_TRUE(t.Register(2, 1, "b", 900).ok());
  auto e = t.Expired(1001, 1000);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0], 1u);
}

TEST(ClockTableTest, MinimumMovesWhenRestoredLaggingWorkersCatchUp) {
  ClockTable t(221);
  t.Restore({1, 1, "a", 225, 0, 0});
  t.Restore({2, 1, "b", 221, 0, 0});
  EXPECT_EQ(t.MinClock(), 225);  // never goes back, even below a lagging restored worker
  t.Advance(*t.Find(1, 1), 228);
  t.Advance(*t.Find(2, 1), 228);  // the lagging one was not "the minimum", yet it held it
  EXPECT_EQ(t.MinClock(), 228);
}

TEST(ClockTableTest, AllowsImplementsTheStalenessBound) {
  ClockTable t;
  ASSERT_TRUE(t.Register(1, 1, "a", 0).ok());
  t.Advance(*t.Find(1, 1), 3);
  EXPECT_TRUE(t.Allows(3, 0));
  EXPECT_FALSE(t.Allows(4, 0));
  EXPECT_TRUE(t.Allows(5, 2));
  EXPECT_FALSE(t.Allows(6, 2));
}

TEST(ParkedPullsTest, ReleasesExactlyThoseTheMinimumAllows) {
  ParkedPulls<int> p;
  p.Park(3, 30);
  p.Park(1, 10);
  p.Park(2, 20);
  p.Park(5, 50);
  EXPECT_TRUE(p.Release(0).empty());
  auto r = p.Release(2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], 10);
  EXPECT_EQ(r[1], 20);
  EXPECT_EQ(p.size(), 2u);
  EXPECT_EQ(p.DropIf([](int v) { return v == 50; }), 1u);
  EXPECT_EQ(p.Release(100).size(), 1u);
}

}  // namespace
}  // namespace leash::ps
