// Integration test of `leashctl --etcd URL --job NAME status` with real processes: etcd,
// a leash-server registered there as a shard's primary (through EtcdCoordinator, as a
// replicated shard registers itself) and leashctl, which prints the replication view from
// etcd and then the shard's own status through the primary it found there; and with two
// real replicas, each backup's replication lag as the primary reports it.
#include <gtest/gtest.h>

#include <csignal>
#include <regex>
#include <string>
#include <vector>

#include "leash/common/etcd_coordinator.h"
#include "leash/common/zmq_transport.h"
#include "leash/worker/client.h"
#include "support/cluster.h"
#include "support/etcd_process.h"
#include "support/etcd_test.h"
#include "support/process.h"
#include "support/scrape.h"

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
  // `answers`: registered as with leash-server --backup-answers.
  std::unique_ptr<EtcdCoordinator> Replica(uint32_t r, const std::string& endpoint,
                                           bool answers = false) {
    auto c = EtcdCoordinator::Create(options_, JobShape{1, 2});
    EXPECT_TRUE(c.ok()) << c.status();
    Status s = (*c)->Join(0, ReplicaAddress{r, endpoint, 100 + r, answers});
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
  auto backup = Replica(1, backup_endpoint, /*answers=*/true);
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
  EXPECT_NE(out.find("backup replica 1 at " + backup_endpoint +
                     ", catching up (cannot lead); would answer pushes and clocks as the only "
                     "backup in sync"),
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
  EXPECT_NE(out.find("\"boot_id\": 101, \"answers\": true}"), std::string::npos) << out;
  EXPECT_NE(out.find("\"boot_id\": 100, \"answers\": false}"), std::string::npos) << out;
  EXPECT_NE(out.find("\"in_sync\": [0]"), std::string::npos) << out;
  EXPECT_NE(out.find("\"status\": {\"shards\": [{\"shard\": 0"), std::string::npos) << out;

  // In sync, the only backup: it answers.
  ASSERT_TRUE(primary->SetInSync(1, {0, 1}).ok());
  args.pop_back();
  std::tie(code, out) = Leashctl(args);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(
      out.find("backup replica 1 at " + backup_endpoint + ", in sync; answers pushes and clocks"),
      std::string::npos)
      << out;
}

// The number after `"key": ` in leashctl's JSON (the first occurrence), or -1.
int64_t JsonNumber(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\": (-?[0-9]+)"))) return -1;
  return std::stoll(m[1]);
}

// ... and the primary's durable log in the status, and each replica's own view in its
// Prometheus metrics: the primary's of the stopped backup, the backup's of itself.
TEST_F(EtcdLeashctlTest, StatusShowsEachBackupsReplicationLagAsItsPrimaryReportsIt) {
  // A real replicated shard: two leash-server replicas registered in etcd, with durable
  // logs and metrics.
  const std::vector<std::string> endpoints = {Endpoint(FreePort()), Endpoint(FreePort())};
  const std::vector<int> metrics = {FreePort(), FreePort()};
  std::vector<std::unique_ptr<Process>> replicas;
  for (int r = 0; r < 2; ++r) {
    replicas.push_back(std::make_unique<Process>(
        std::vector<std::string>{
            LEASH_SERVER_BIN, "--bind=" + endpoints[static_cast<size_t>(r)],
            "--data-dir=" + dir_.path() + "/r" + std::to_string(r), "--replicas=2",
            "--replica=" + std::to_string(r), "--peers=" + endpoints[0] + "," + endpoints[1],
            "--etcd=" + etcd_->endpoint(), "--job=ctl", "--etcd-ttl=2", "--no-sync",
            "--lease-timeout=10s", "--durable-log=write",
            "--metrics-bind=127.0.0.1:" + std::to_string(metrics[static_cast<size_t>(r)])},
        dir_.path() + "/r" + std::to_string(r) + ".log"));
  }
  auto logs = [&] { return replicas[0]->ReadLog() + replicas[1]->ReadLog(); };
  std::shared_ptr<ShardDirectory> directory = NewEtcdShardDirectory(options_).value();
  auto in_sync = [&] {
    auto v = directory->View();
    return v.ok() && !v->shards.empty() && v->shards[0].primary ? v->shards[0].in_sync.size()
                                                                : size_t{0};
  };
  ASSERT_TRUE(testing::WaitFor([&] { return in_sync() == 2; }, 60s)) << logs();
  auto view = ResolvePrimaries(*directory, 30000);
  ASSERT_TRUE(view.ok()) << view.status();
  const uint32_t primary = view->shards[0].primary->replica;
  Process& backup = *replicas[1 - primary];
  ZmqContext ctx;
  ClientOptions co;
  co.name = "pusher";
  co.directory = directory;
  co.directory_view = *view;
  auto client = Client::Connect(ConnectZmqClient(ctx, PrimaryEndpoints(*view)).value(), co);
  ASSERT_TRUE(client.ok()) << client.status();
  auto table = (*client)->CreateTable(testing::Sgd1("w", 256, 1));
  ASSERT_TRUE(table.ok()) << table.status();
  std::vector<float> grad(256, 1.f);
  auto push = [&](int n) {
    for (int i = 0; i < n; ++i) ASSERT_TRUE((*client)->Push(*table, grad.data()).get().ok());
  };
  push(5);
  const std::vector<std::string> status = {"--etcd=" + etcd_->endpoint(), "--job=ctl",
                                           "--timeout=30", "status"};
  // Every push was acknowledged, so the backup holds the whole log. A status may catch an
  // entry the primary logs on its own (an expiry sweep) on its way to the backup, so it is
  // asked until it shows none (below too).
  // (Backups answer by default: the only backup in sync says so.)
  const std::string caught_up = "backup replica " + std::to_string(1 - primary) + " at " +
                                endpoints[1 - primary] +
                                ", in sync; answers pushes and clocks; lag 0 entries (holds";
  int code = -1;
  std::string out;
  auto shows_caught_up = [&] {
    return testing::WaitFor(
        [&] {
          std::tie(code, out) = Leashctl(status);
          return code == 0 && out.find(caught_up) != std::string::npos;
        },
        30s);
  };
  EXPECT_TRUE(shows_caught_up()) << "exit " << code << ": " << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("; durable log write, [0-9.]+ [KM]?i?B written")))
      << out;
  const std::string b = std::to_string(1 - primary);

  // A stopped backup leaves the in-sync set, and the pushes acknowledged without it are
  // what it lacks: 30 entries, their bytes, the age of the oldest.
  backup.Signal(SIGSTOP);
  push(30);
  auto json = status;
  json.push_back("--json");
  std::tie(code, out) = Leashctl(json);
  // The primary's metrics show the same, while the backup is still stopped: out of the set,
  // 30 entries behind.
  auto scrape = testing::ScrapeWhen(
      metrics[primary],
      [&](const testing::Scrape& x) {
        return x.Find("leash_replica_backup_entries_behind", "backup", b).value_or(0) >= 30;
      },
      60s);
  backup.Signal(SIGCONT);
  ASSERT_TRUE(scrape.ok()) << scrape.status();
  EXPECT_EQ(scrape->Find("leash_replica_primary"), 1.0);
  EXPECT_EQ(scrape->Find("leash_replica_backup_in_sync", "backup", b), 0.0);
  EXPECT_EQ(scrape->Find("leash_replica_in_sync_replicas"), 1.0);
  EXPECT_GT(scrape->Find("leash_replica_durable_log_bytes_total").value_or(0), 35 * 256 * 4);
  EXPECT_EQ(scrape->Find("leash_replica_durable_log_mode", "mode", "write"), 1.0);
  EXPECT_EQ(scrape->Find("leash_replica_durable_log_failed"), 0.0);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(
      out.find("\"lag\": [{\"replica\": " + std::to_string(1 - primary) + ", \"in_sync\": false"),
      std::string::npos)
      << out;
  EXPECT_GE(JsonNumber(out, "entries_behind"), 30) << out;
  EXPECT_GE(JsonNumber(out, "entries_behind_commit"), 30) << out;
  EXPECT_GE(JsonNumber(out, "bytes_behind"), 30 * 256 * 4) << out;  // the pushes' gradients
  EXPECT_GT(JsonNumber(out, "ms_behind"), 0) << out;
  EXPECT_GT(JsonNumber(out, "log_index"), JsonNumber(out, "match_index")) << out;
  EXPECT_NE(out.find("\"durable_log\": \"write\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"durable_log_failed\": false"), std::string::npos) << out;
  EXPECT_GE(JsonNumber(out, "durable_log_bytes"), 35 * 256 * 4) << out;  // every push logged

  // Resumed, it catches up and joins the set again: no lag. Its own metrics: a backup in the
  // primary's term that has applied the whole log and written it to its durable log.
  ASSERT_TRUE(testing::WaitFor([&] { return in_sync() == 2; }, 60s)) << logs();
  EXPECT_TRUE(shows_caught_up()) << "exit " << code << ": " << out;
  const int64_t last = JsonNumber(out, "log_index");
  auto own = testing::ScrapeWhen(
      metrics[1 - primary],
      [&](const testing::Scrape& x) {
        return x.Find("leash_replica_applied_index").value_or(0) >= static_cast<double>(last);
      },
      60s);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->Find("leash_replica_primary"), 0.0);
  EXPECT_EQ(own->Find("leash_replica_terms_led_total"), 0.0);
  EXPECT_EQ(own->Find("leash_replica_term"), scrape->Find("leash_replica_term"));
  EXPECT_GT(own->Find("leash_replica_durable_log_records_total").value_or(0), 35);
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
