// Unit tests of transient straggler injection (leash-worker --slow-spells): the flag's
// parsing and the seeded schedule every worker derives alike.
#include "leash/worker/slow_spells.h"

#include <gtest/gtest.h>

#include <vector>

namespace leash::worker {
namespace {

TEST(SlowSpellsTest, ParsesFactorSecondsWorkerAndSeed) {
  Result<SlowSpells> s = ParseSlowSpells("5,1.5,2/3,42");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->factor, 5);
  EXPECT_DOUBLE_EQ(s->seconds, 1.5);
  EXPECT_EQ(s->worker, 2);
  EXPECT_EQ(s->workers, 3);
  EXPECT_EQ(s->seed, 42u);
  EXPECT_TRUE(s->enabled());
  Result<SlowSpells> off = ParseSlowSpells("");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled());
}

TEST(SlowSpellsTest, RejectsMalformedOrOutOfRangeFields) {
  for (const char* bad :
       {"5", "5,1,0/3", "5,1,3/3,1", "0.5,1,0/3,1", "5,0,0/3,1", "5,1,0/3,1x", "5,1,-1/3,1"}) {
    Result<SlowSpells> s = ParseSlowSpells(bad);
    EXPECT_FALSE(s.ok()) << bad;
    if (!s.ok()) {
      EXPECT_NE(s.status().message().find("FACTOR,SECONDS,WORKER/WORKERS,SEED"), std::string::npos)
          << s.status();
    }
  }
}

TEST(SlowSpellsTest, ExactlyOneWorkerIsSlowInEachSpellAndEachIsSometimes) {
  std::vector<SlowSpells> workers(3);
  for (int i = 0; i < 3; ++i) {
    workers[i] = {5, 1, i, 3, 7};
  }
  std::vector<int> slow_spells(3, 0);
  for (int spell = 0; spell < 300; ++spell) {
    const double t = 1.8e9 + spell + 0.5;  // the middle of a spell
    int slow = 0;
    for (int i = 0; i < 3; ++i) {
      const double f = SpellFactorAt(workers[i], t);
      EXPECT_TRUE(f == 1 || f == 5) << f;
      if (f == 5) {
        ++slow;
        ++slow_spells[i];
      }
    }
    EXPECT_EQ(slow, 1) << "spell " << spell;
    // The pick holds for the whole spell.
    EXPECT_EQ(SlowWorkerAt(workers[0], t - 0.49), SlowWorkerAt(workers[0], t + 0.49));
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_GT(slow_spells[i], 60) << "worker " << i;  // about 100 each
  }
  // Another seed gives another schedule.
  SlowSpells other = workers[0];
  other.seed = 8;
  int same = 0;
  for (int spell = 0; spell < 300; ++spell) {
    const double t = 1.8e9 + spell + 0.5;
    same += SlowWorkerAt(other, t) == SlowWorkerAt(workers[0], t);
  }
  EXPECT_LT(same, 200);
}

}  // namespace
}  // namespace leash::worker
