// Integration test of `leashctl --etcd URL --job NAME status` with real processes: etcd,
// a leash-server registered there as a shard's primary (through EtcdCoordinator, as a
// replicated shard registers itself) and leashctl, which prints the replication view from
// etcd and then the shard's own status through the primary it found there.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "leash/common/etcd_coordinator.h"
#include "support/etcd_test.h"

namespace leash {
namespace {

using namespace std::chrono_literals;
using testing::Endpoint;
using testing::FreePort;
using testing::Process;

class EtcdLeashctlTest : public testing::EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (IsSkipped()) return;
    options_.endpoints = {etcd_->endpoint()};
    options_.job = "ctl";
    options_.ttl = 2s;
  }
  std::pair<int, std::string> Leashctl(std::vector<std::string> args) {
    args.insert(args.begin(), LEASHCTL_BIN);
    return testing::RunToCompletion(std::move(args), dir_.path(), 60s);
  }
  std::unique_ptr<EtcdCoordinator> Replica(uint32_t r, const std::string& endpoint) {
    auto c = EtcdCoordinator::Create(options_, JobShape{1, 2});
    EXPECT_TRUE(c.ok()) << c.status();
    Status s = (*c)->Join(0, ReplicaAddress{r, endpoint, 100 + r});
    EXPECT_TRUE(s.ok()) << s;
    return std::move(c).value();
  }

  EtcdOptions options_;
};

TEST_F(EtcdLeashctlTest, StatusPrintsPrimaryBackupsTermAndInSyncSetThenThePrimarysStatus) {
  const std::string shard_endpoint = Endpoint(FreePort());
  const std::string backup_endpoint = Endpoint(FreePort());
  Process shard({LEASH_SERVER_BIN, "--bind=" + shard_endpoint,
                 "--data-dir=" + dir_.path() + "/shard0", "--checkpoint-interval=0", "--no-sync"},
                dir_.path() + "/shard0.log");
  auto primary = Replica(0, shard_endpoint);
  auto backup = Replica(1, backup_endpoint);
  const std::vector<std::string> where = {"--etcd=" + etcd_->endpoint(), "--job=ctl",
                                          "--timeout=30"};

  // No primary yet: the view alone, and the commands that need every primary refuse.
  auto args = where;
  args.push_back("status");
  auto [code, out] = Leashctl(args);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("job 'ctl' in etcd: 1 shards x 2 replicas"), std::string::npos) << out;
  EXPECT_NE(out.find("shard 0: no primary"), std::string::npos) << out;
  args.back() = "health";
  EXPECT_EQ(Leashctl(args).first, 1);

  ASSERT_EQ(*primary->Campaign(), std::optional<uint64_t>(1));
  ASSERT_TRUE(primary->SetInSync(1, {0}).ok());
  args.back() = "status";
  std::tie(code, out) = Leashctl(args);
  EXPECT_EQ(code, 0) << out << shard.ReadLog();
  EXPECT_NE(out.find("shard 0: term 1, primary replica 0 at " + shard_endpoint + "; in sync: 0"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("backup replica 1 at " + backup_endpoint + ", catching up (cannot lead)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("shard 0: min clock"), std::string::npos) << out;  // from the primary

  args.push_back("--json");
  std::tie(code, out) = Leashctl(args);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"job\": \"ctl\""), std::string::npos) << out;
  EXPECT_NE(out.find("{\"shard\": 0, \"term\": 1, \"primary\": {\"replica\": 0, \"endpoint\": \"" +
                     shard_endpoint + "\""),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("\"backups\": [{\"replica\": 1"), std::string::npos) << out;
  EXPECT_NE(out.find("\"in_sync\": [0]"), std::string::npos) << out;
  EXPECT_NE(out.find("\"status\": {\"shards\": [{\"shard\": 0"), std::string::npos) << out;
}

TEST_F(EtcdLeashctlTest, UnreachableEtcdIsReportedWithWhatToDo) {
  const std::string nowhere = "http://127.0.0.1:" + std::to_string(FreePort());
  auto [code, out] = Leashctl({"--etcd=" + nowhere, "--job=ctl", "status"});
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("etcd at " + nowhere + " unreachable"), std::string::npos) << out;
  EXPECT_NE(out.find("start etcd or pass --etcd"), std::string::npos) << out;
  // An etcd without the job says so.
  std::tie(code, out) = Leashctl({"--etcd=" + etcd_->endpoint(), "--job=none", "status"});
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("no replica of job 'none' has registered"), std::string::npos) << out;
}

}  // namespace
}  // namespace leash
