// An unreplicated shard with a durable log (leash-server --durable-log write: a group of one,
// no etcd; docs/replication.md, "One replica with a durable log"), with real leash-server
// processes and a real Client with fixed endpoints. SIGKILLed repeatedly under pushes of known
// values (SGD at learning rate 1) and restarted on its data directory, it loses no
// acknowledged push and applies none twice: the final table is their exact sum. A shard that
// ran without the log keeps its snapshot when first started with one. leashctl status shows
// the log.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "support/cluster.h"
#include "support/exact_sum_pusher.h"
#include "support/files.h"
#include "support/process.h"

namespace leash {
namespace {

using namespace std::chrono_literals;
using testing::Cluster;
using testing::ExactSumPusher;
using testing::TempDir;

// The "(N records replayed)" of every start from the durable log in a shard's log.
std::vector<int> RecordsReplayed(const std::string& log) {
  std::regex re("starts again from its durable log: .*\\(([0-9]+) records replayed\\)");
  std::vector<int> out;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    out.push_back(std::stoi((*it)[1]));
  }
  return out;
}

TEST(DurableShardTest, ASigkilledShardStartsAgainFromItsLogAndLosesNothing) {
  TempDir dir;
  // Snapshots every 300 ms: each kill falls between two, and what followed the last one is
  // only in the log.
  Cluster cluster(1, dir.path(), {"--durable-log=write", "--checkpoint-interval=300ms"});
  auto client = cluster.Connect("pusher");
  ASSERT_NE(client, nullptr);
  auto table = client->CreateTable(testing::Sgd1("t", 4, 1));
  ASSERT_TRUE(table.ok()) << table.status();
  ExactSumPusher pusher(*client, *table);
  constexpr int kKills = 3;
  for (int kill = 0; kill < kKills; ++kill) {
    ASSERT_TRUE(pusher.WaitForMore(1000)) << pusher.failure() << cluster.shard(0).ReadLog();
    cluster.shard(0).Kill();
    ASSERT_TRUE(cluster.shard(0).Wait(30s).has_value());
    cluster.Start(0);
  }
  ASSERT_TRUE(pusher.WaitForMore(1000)) << pusher.failure() << cluster.shard(0).ReadLog();
  pusher.Stop();
  pusher.ExpectExactSums(*client);
  const std::string log = cluster.shard(0).ReadLog();
  // Every start after a kill took the log back, and each replayed records past its
  // snapshot (more than the first record, which says where the snapshot stands).
  const std::vector<int> replayed = RecordsReplayed(log);
  ASSERT_EQ(replayed.size(), static_cast<size_t>(kKills)) << log;
  for (int n : replayed) EXPECT_GE(n, 2) << log;
  EXPECT_EQ(log.find("etcd"), std::string::npos) << "a group of one needs no etcd\n" << log;
  // leashctl status names the log, its bytes and the term (one per start: 1 + the kills).
  auto [rc, out] = testing::RunToCompletion(
      {LEASHCTL_BIN, "status", "--servers=" + cluster.servers()}, dir.path(), 60s);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("durable log write, "), std::string::npos) << out;
  EXPECT_NE(out.find("term " + std::to_string(kKills + 1) + " (one replica"), std::string::npos)
      << out;
  auto [jrc, json] = testing::RunToCompletion(
      {LEASHCTL_BIN, "status", "--json", "--servers=" + cluster.servers()}, dir.path(), 60s);
  EXPECT_EQ(jrc, 0) << json;
  EXPECT_NE(json.find("\"durable_log\": \"write\""), std::string::npos) << json;
}

TEST(DurableShardTest, AShardFirstStartedWithTheLogKeepsItsSnapshotAndLogsFromThere) {
  TempDir dir;
  Cluster cluster(1, dir.path());  // no log: snapshots only
  auto client = cluster.Connect("pusher");
  ASSERT_NE(client, nullptr);
  auto table = client->CreateTable(testing::Sgd1("t", 4, 1));
  ASSERT_TRUE(table.ok()) << table.status();
  std::vector<float> expected(4, 0.f);
  auto push = [&](int n) {
    for (int i = 0; i < n; ++i) {
      std::vector<float> g = {1, 2, 3, static_cast<float>(i % 5)};
      Status st = client->Push(*table, g.data()).get();
      ASSERT_TRUE(st.ok()) << st;
      for (size_t k = 0; k < 4; ++k) expected[k] -= g[k];
    }
  };
  auto expect_values = [&](const std::string& when) {
    std::vector<float> values(4);
    Status st = client->Pull(*table, values.data()).get();
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(values, expected) << when << "\n" << cluster.shard(0).ReadLog();
  };
  ASSERT_NO_FATAL_FAILURE(push(50));
  cluster.shard(0).Signal(SIGTERM);  // its final snapshot holds all 50
  ASSERT_EQ(cluster.shard(0).Wait(30s), std::optional<int>(0));
  cluster.Start(0, {"--durable-log=write"});
  ASSERT_NO_FATAL_FAILURE(expect_values("first start with the log"));
  EXPECT_NE(cluster.shard(0).ReadLog().find("no durable log in"), std::string::npos)
      << cluster.shard(0).ReadLog();
  // From here on the log holds every push: a SIGKILL loses none of them.
  ASSERT_NO_FATAL_FAILURE(push(70));
  cluster.shard(0).Kill();
  ASSERT_TRUE(cluster.shard(0).Wait(30s).has_value());
  cluster.Start(0, {"--durable-log=write"});
  ASSERT_NO_FATAL_FAILURE(expect_values("after a SIGKILL"));
  EXPECT_EQ(RecordsReplayed(cluster.shard(0).ReadLog()).size(), 1u) << cluster.shard(0).ReadLog();
}

// A log that cannot be used (here: its files deleted after a SIGKILL) is said at warn level,
// and the shard starts from its last snapshot, losing what came after it but not the
// snapshot itself (a backup would start empty and be caught up; a group of one has nobody
// to catch it up). It logs again from there: the next SIGKILL loses nothing.
TEST(DurableShardTest, AShardWhoseLogIsGoneKeepsItsSnapshotAndLogsAgain) {
  TempDir dir;
  Cluster cluster(1, dir.path(), {"--durable-log=write"});
  auto client = cluster.Connect("pusher");
  ASSERT_NE(client, nullptr);
  auto table = client->CreateTable(testing::Sgd1("t", 4, 1));
  ASSERT_TRUE(table.ok()) << table.status();
  std::vector<float> values(4, 0.f);
  auto push = [&](int n, std::vector<float>* sum) {
    for (int i = 0; i < n; ++i) {
      std::vector<float> g = {1, 2, static_cast<float>(i % 3), 4};
      Status st = client->Push(*table, g.data()).get();
      ASSERT_TRUE(st.ok()) << st;
      for (size_t k = 0; k < 4; ++k) (*sum)[k] -= g[k];
    }
  };
  auto pulled = [&] {
    std::vector<float> v(4);
    Status st = client->Pull(*table, v.data()).get();
    EXPECT_TRUE(st.ok()) << st;
    return v;
  };
  ASSERT_NO_FATAL_FAILURE(push(40, &values));
  auto snap = client->Checkpoint();
  ASSERT_TRUE(snap.ok()) << snap.status();
  const std::vector<float> at_snapshot = values;
  ASSERT_NO_FATAL_FAILURE(push(25, &values));  // only in the log
  cluster.shard(0).Kill();
  ASSERT_TRUE(cluster.shard(0).Wait(30s).has_value());
  const std::string log_dir = dir.path() + "/shard0/replica-log";
  int removed = 0;
  for (const auto& e : std::filesystem::directory_iterator(log_dir)) {
    if (e.path().filename().string().rfind("log-", 0) == 0) {
      std::filesystem::remove(e.path());
      ++removed;
    }
  }
  ASSERT_GT(removed, 0) << "no log file in " << log_dir;
  const size_t before = cluster.shard(0).ReadLog().size();
  cluster.Start(0);
  EXPECT_EQ(pulled(), at_snapshot) << cluster.shard(0).ReadLog().substr(before);
  const std::string restart = cluster.shard(0).ReadLog().substr(before);
  EXPECT_NE(restart.find("cannot be used"), std::string::npos) << restart;
  EXPECT_NE(restart.find("updates acknowledged after that snapshot are lost"), std::string::npos)
      << restart;
  // Logging again: a SIGKILL now loses nothing.
  std::vector<float> expected = at_snapshot;
  ASSERT_NO_FATAL_FAILURE(push(30, &expected));
  cluster.shard(0).Kill();
  ASSERT_TRUE(cluster.shard(0).Wait(30s).has_value());
  cluster.Start(0);
  EXPECT_EQ(pulled(), expected) << cluster.shard(0).ReadLog();
}

}  // namespace
}  // namespace leash
