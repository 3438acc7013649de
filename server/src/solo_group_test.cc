// SoloGroup, the coordinator of an unreplicated shard with a durable log, on a real
// directory: terms only grow across restarts (reopening the directory), the in-sync set
// outlives the process, a deposed term is refused, the directory view follows, and a
// file that is not a group file is a clear error.
#include "solo_group.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <thread>

#include <unistd.h>
#include <filesystem>

namespace leash::server {
namespace {

using namespace std::chrono_literals;

// A directory of its own for each test, removed after it.
class Dir {
 public:
  Dir()
      : path_(std::filesystem::path(::testing::TempDir()) /
              ("solo_group_test_" + std::to_string(::getpid()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~Dir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

TEST(SoloGroupTest, TermsOnlyGrowAndTheInSyncSetOutlivesTheProcess) {
  Dir dir;
  const std::string path = dir.path() + "/replica-log";
  {
    auto g = SoloGroup::Open(path, 1, 3);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ((*g)->term(), 0u);
    EXPECT_TRUE((*g)->in_sync().empty());
    ASSERT_TRUE((*g)->Join(1, {0, "tcp://127.0.0.1:7000", 42}).ok());
    EXPECT_TRUE((*g)->LeaseValid());
    auto won = (*g)->Campaign();
    ASSERT_TRUE(won.ok()) << won.status();
    EXPECT_EQ(*won, std::optional<uint64_t>(1));
    // It already holds the primary key.
    EXPECT_EQ(*(*g)->Campaign(), std::nullopt);
    ASSERT_TRUE((*g)->SetInSync(1, {0}).ok());
    EXPECT_EQ((*g)->SetInSync(7, {0}).code(), StatusCode::kFailedPrecondition);
    const ClusterView v = (*g)->View();
    ASSERT_EQ(v.shards.size(), 3u);
    EXPECT_EQ(v.replicas, 1u);
    EXPECT_EQ(v.shards[1].term, 1u);
    ASSERT_TRUE(v.shards[1].primary.has_value());
    EXPECT_EQ(v.shards[1].primary->endpoint, "tcp://127.0.0.1:7000");
    EXPECT_EQ(v.shards[1].in_sync, std::vector<uint32_t>{0});
    EXPECT_FALSE(v.shards[0].primary.has_value());
    ASSERT_TRUE((*g)->Resign(1).ok());
    EXPECT_EQ((*g)->SetInSync(1, {0}).code(), StatusCode::kFailedPrecondition);
    EXPECT_FALSE((*g)->View().shards[1].primary.has_value());
    // A new term after resigning.
    EXPECT_EQ(*(*g)->Campaign(), std::optional<uint64_t>(2));
  }
  // Killed and started again: the term it took is never repeated, and the set is there
  // (what lets the replica use its log).
  auto g = SoloGroup::Open(path, 1, 3);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->term(), 2u);
  EXPECT_EQ((*g)->in_sync(), std::vector<uint32_t>{0});
  EXPECT_EQ((*g)->View().shards[1].in_sync, std::vector<uint32_t>{0});
  ASSERT_TRUE((*g)->Join(1, {0, "tcp://127.0.0.1:7000", 43}).ok());
  EXPECT_EQ(*(*g)->Campaign(), std::optional<uint64_t>(3));
}

TEST(SoloGroupTest, TheDirectoryWaitsForAChangeAndReturnsOnIt) {
  Dir dir;
  auto g = SoloGroup::Open(dir.path(), 0, 1);
  ASSERT_TRUE(g.ok()) << g.status();
  auto directory = (*g)->Directory();
  auto before = directory->View();
  ASSERT_TRUE(before.ok());
  // Nothing changes: the wait ends at its timeout with the same revision.
  auto same = directory->WaitForChange(before->revision, 50ms);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->revision, before->revision);
  std::thread joiner([&] {
    std::this_thread::sleep_for(50ms);
    (void)(*g)->Join(0, {0, "tcp://127.0.0.1:7001", 1});
  });
  auto changed = directory->WaitForChange(before->revision, 30s);
  joiner.join();
  ASSERT_TRUE(changed.ok());
  EXPECT_GT(changed->revision, before->revision);
  ASSERT_EQ(changed->shards[0].live.size(), 1u);
  EXPECT_EQ(changed->shards[0].live[0].endpoint, "tcp://127.0.0.1:7001");
}

TEST(SoloGroupTest, BadInputIsAClearError) {
  Dir dir;
  {
    std::ofstream f(dir.path() + "/group");
    f << "not a group\n";
  }
  auto bad = SoloGroup::Open(dir.path(), 0, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find(dir.path() + "/group"), std::string::npos) << bad.status();
  EXPECT_FALSE(SoloGroup::Open(dir.path() + "/x", 2, 2).ok());  // shard 2 of 2
  auto g = SoloGroup::Open(dir.path() + "/y", 0, 1);
  ASSERT_TRUE(g.ok());
  // Only replica 0 of its own shard.
  EXPECT_EQ((*g)->Join(0, {1, "tcp://127.0.0.1:7000", 1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*g)->Join(1, {0, "tcp://127.0.0.1:7000", 1}).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace leash::server
