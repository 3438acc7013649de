// Fault tests of workers following a failover of replicated shards, with real processes:
// etcd, leash-server replicas (--replicas 2, a 2 s etcd lease) and leash-worker or a
// leash::Client that finds the primaries in etcd (--etcd) and follows them when a primary
// is SIGKILLed; SecureFailoverTest runs the replicas with CURVE keys (replicas reach each
// other as CURVE clients with the shards' key pair). Skipped without an etcd executable.
// Single-threaded tests.
#include <gtest/gtest.h>

#include <atomic>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "leash/common/curve_keys.h"
#include "leash/common/etcd_coordinator.h"
#include "leash/common/zmq_transport.h"
#include "leash/worker/client.h"
#include "support/cluster.h"
#include "support/etcd_process.h"
#include "support/process.h"

namespace leash {
namespace {

using namespace std::chrono_literals;
using testing::Endpoint;
using testing::EtcdProcess;
using testing::FreePort;
using testing::Process;
using testing::TempDir;
using testing::WaitFor;

constexpr char kJob[] = "follow";

class FailoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdProcess::Binary().empty()) {
      GTEST_SKIP() << "etcd is not installed (bash scripts/install-deps.sh installs "
                      "etcd-server)";
    }
    etcd_ = std::make_unique<EtcdProcess>(dir_.path());
    if (curve_) {
      keys_ = dir_.path() + "/keys";
      bool created = false;
      ASSERT_TRUE(GenerateCurveKeyPair(keys_, "server", /*authorize=*/false, &created).ok());
      ASSERT_TRUE(GenerateCurveKeyPair(keys_, "client", /*authorize=*/true, &created).ok());
    }
    for (int r = 0; r < 2; ++r) endpoints_.push_back(Endpoint(FreePort()));
    replicas_.resize(2);
    for (int r = 0; r < 2; ++r) StartReplica(r);
    EtcdOptions o;
    o.endpoints = {etcd_->endpoint()};
    o.job = kJob;
    auto d = NewEtcdShardDirectory(o);
    ASSERT_TRUE(d.ok()) << d.status();
    directory_ = std::move(*d);
    ASSERT_TRUE(WaitFor([&] { return InSync() == 2; }, 60s)) << Logs();
  }

  void TearDown() override {
    for (auto& r : replicas_) {
      if (r) r->Kill();
    }
  }

  // Starts replica r, with the CURVE keys if the test uses them and `with_keys`.
  void StartReplica(int r, bool with_keys = true) {
    std::vector<std::string> argv{LEASH_SERVER_BIN,
                                  "--bind=" + endpoints_[static_cast<size_t>(r)],
                                  "--data-dir=" + dir_.path() + "/r" + std::to_string(r),
                                  "--replicas=2",
                                  "--replica=" + std::to_string(r),
                                  "--peers=" + endpoints_[0] + "," + endpoints_[1],
                                  "--etcd=" + etcd_->endpoint(),
                                  "--job=" + std::string(kJob),
                                  "--etcd-ttl=2",
                                  "--no-sync",
                                  "--lease-timeout=10s"};
    if (curve_ && with_keys) argv.push_back("--curve-keys=" + keys_);
    replicas_[static_cast<size_t>(r)] =
        std::make_unique<Process>(argv, dir_.path() + "/r" + std::to_string(r) + ".log");
  }

  // The shard's view in etcd, or nullopt if it cannot be read.
  std::optional<ShardView> View() {
    auto v = directory_->View();
    if (!v.ok() || v->shards.empty()) return std::nullopt;
    return v->shards[0];
  }
  int InSync() {
    auto v = View();
    return v && v->primary ? static_cast<int>(v->in_sync.size()) : -1;
  }

  // A client that finds the primary in etcd and follows it.
  std::unique_ptr<Client> Follower(const std::string& name, bool register_worker) {
    auto view = ResolvePrimaries(*directory_, 30000);
    EXPECT_TRUE(view.ok()) << view.status();
    if (!view.ok()) return nullptr;
    ZmqOptions zo;
    if (curve_) {
      auto keys = LoadCurveClientKeys(keys_, "client");
      EXPECT_TRUE(keys.ok()) << keys.status();
      if (!keys.ok()) return nullptr;
      zo.curve = std::move(*keys);
    }
    auto t = ConnectZmqClient(ctx_, PrimaryEndpoints(*view), zo);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return nullptr;
    ClientOptions o;
    o.name = name;
    o.register_worker = register_worker;
    o.directory = directory_;
    o.directory_view = *view;
    auto c = Client::Connect(std::move(*t), o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  int64_t MinClock(Client& observer) {
    auto s = observer.Stats();
    return s.ok() ? (*s)[0].min_clock : -1;
  }

  // SIGKILLs the current primary; returns its replica index.
  int KillPrimary() {
    auto v = View();
    EXPECT_TRUE(v && v->primary);
    if (!v || !v->primary) return -1;
    int r = static_cast<int>(v->primary->replica);
    replicas_[static_cast<size_t>(r)]->Kill();
    return r;
  }

  std::string Logs() {
    std::string s;
    for (size_t r = 0; r < replicas_.size(); ++r) {
      if (replicas_[r]) s += "--- replica " + std::to_string(r) + "\n" + replicas_[r]->ReadLog();
    }
    return s;
  }

  bool curve_ = false;  // the replicas and clients use CURVE keys in keys_
  TempDir dir_;
  std::string keys_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<Process>> replicas_;
  std::shared_ptr<ShardDirectory> directory_;
  ZmqContext ctx_;
};

TEST_F(FailoverTest, WorkersFollowTheNewPrimaryAndTheJobFinishes) {
  std::vector<std::unique_ptr<Process>> workers;
  for (const char* name : {"a", "b"}) {
    workers.push_back(std::make_unique<Process>(
        std::vector<std::string>{LEASH_WORKER_BIN, "--etcd=" + etcd_->endpoint(),
                                 "--job=" + std::string(kJob), "--name=" + std::string(name),
                                 "--train-limit=6000", "--test-limit=1000", "--chunk-size=250",
                                 "--log-every=0", "--batch=32", "--connect-timeout=30",
                                 "--epochs=4", "--staleness=1"},
        dir_.path() + "/" + name + ".log"));
  }
  auto observer = Follower("observer", /*register_worker=*/false);
  ASSERT_NE(observer, nullptr);
  ASSERT_TRUE(WaitFor([&] { return MinClock(*observer) >= 40; }, 120s))
      << workers[0]->ReadLog() << Logs();
  const int64_t clock_at_kill = MinClock(*observer);
  const auto killed_at = std::chrono::steady_clock::now();
  const int killed = KillPrimary();
  ASSERT_GE(killed, 0);
  ASSERT_FALSE(workers[0]->Wait(0ms).has_value() && workers[1]->Wait(0ms).has_value())
      << "the job ended before the primary was killed";
  // Training goes on at the backup, now primary (the observer follows it too).
  ASSERT_TRUE(WaitFor([&] { return MinClock(*observer) > clock_at_kill + 1; }, 60s))
      << workers[0]->ReadLog() << Logs();
  const auto stall = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - killed_at);
  std::printf("stall after the primary's SIGKILL: %lld ms (etcd TTL 2000 ms)\n",
              static_cast<long long>(stall.count()));
  for (auto& w : workers) {
    auto code = w->Wait(180s);
    ASSERT_TRUE(code.has_value()) << w->ReadLog() << Logs();
    EXPECT_EQ(*code, 0) << w->ReadLog();
  }
  auto v = View();
  ASSERT_TRUE(v && v->primary);
  EXPECT_NE(static_cast<int>(v->primary->replica), killed);
  EXPECT_GE(v->term, 2u);
  std::string logs = workers[0]->ReadLog() + workers[1]->ReadLog();
  EXPECT_NE(logs.find("shard 0: primary is " + endpoints_[static_cast<size_t>(1 - killed)]),
            std::string::npos)
      << logs;
  for (auto& w : workers) {
    std::smatch acc;
    std::string log = w->ReadLog();
    ASSERT_TRUE(std::regex_search(log, acc, std::regex(R"(final test accuracy ([0-9.]+)%)")))
        << log;
    // 10 classes: chance is 10%; 4 epochs of 6000 samples end near 80%.
    EXPECT_GT(std::stod(acc[1]), 65.0) << log;
  }
}

TEST_F(FailoverTest, RepeatedPrimaryKillsLoseNoAcknowledgedPushAndApplyNoneTwice) {
  auto client = Follower("pusher", /*register_worker=*/true);
  ASSERT_NE(client, nullptr);
  auto table = client->CreateTable(testing::Sgd1("w", 4, 1));
  ASSERT_TRUE(table.ok()) << table.status();
  // Push i adds i to row i % 4 (SGD at lr 1 subtracts it): a lost or doubled push shows.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> acknowledged{0};
  std::vector<double> sum(4, 0);
  Status failure;
  std::thread pusher([&] {
    for (int64_t i = 1; !stop.load(); ++i) {
      std::vector<float> grad(4, 0.f);
      grad[static_cast<size_t>(i % 4)] = static_cast<float>(i % 64);
      Status st = client->Push(*table, grad.data()).get();
      if (!st.ok()) {
        failure = st;
        return;
      }
      sum[static_cast<size_t>(i % 4)] += static_cast<float>(i % 64);
      acknowledged.store(i);
    }
  });
  struct Joiner {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Joiner() {
      stop.store(true);
      if (t.joinable()) t.join();
    }
  } joiner{stop, pusher};
  for (int kill = 0; kill < 3; ++kill) {
    const int64_t before = acknowledged.load();
    ASSERT_TRUE(WaitFor([&] { return acknowledged.load() >= before + 200; }, 60s))
        << failure << Logs();
    const int r = KillPrimary();
    ASSERT_GE(r, 0);
    // Pushes go on at the new primary; then the killed replica comes back as a backup.
    const int64_t at_kill = acknowledged.load();
    ASSERT_TRUE(WaitFor([&] { return acknowledged.load() >= at_kill + 50; }, 60s))
        << failure << Logs();
    StartReplica(r);
    ASSERT_TRUE(WaitFor([&] { return InSync() == 2; }, 60s)) << Logs();
  }
  stop.store(true);
  pusher.join();
  ASSERT_TRUE(failure.ok()) << failure;
  std::vector<float> values(4);
  ASSERT_TRUE(client->Pull(*table, values.data()).get().ok());
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(values[k], -static_cast<float>(sum[k])) << "row " << k;
  EXPECT_GE(View()->term, 4u);
}

class SecureFailoverTest : public FailoverTest {
 protected:
  SecureFailoverTest() { curve_ = true; }

  // Pushes i = from..to (i added to row i % 4) and adds them to sum_; false on a failure.
  bool PushRange(Client& client, const TableHandle& table, int from, int to) {
    for (int i = from; i <= to; ++i) {
      std::vector<float> grad(4, 0.f);
      grad[static_cast<size_t>(i % 4)] = static_cast<float>(i % 64);
      Status st = client.Push(table, grad.data()).get();
      EXPECT_TRUE(st.ok()) << "push " << i << ": " << st;
      if (!st.ok()) return false;
      sum_[static_cast<size_t>(i % 4)] += static_cast<float>(i % 64);
    }
    return true;
  }

  std::vector<double> sum_ = std::vector<double>(4, 0);
};

TEST_F(SecureFailoverTest, ReplicasWithCurveKeysElectReplicateAndAcknowledgePushes) {
  // SetUp waited for a primary and both replicas in the in-sync set: the backup holds the
  // log, shipped over CURVE.
  auto client = Follower("pusher", /*register_worker=*/true);
  ASSERT_NE(client, nullptr);
  auto table = client->CreateTable(testing::Sgd1("w", 4, 1));
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_TRUE(PushRange(*client, *table, 1, 200)) << Logs();
  // Acknowledged while the backup is in sync: it holds every push.
  EXPECT_EQ(InSync(), 2) << Logs();
  const int killed = KillPrimary();
  ASSERT_GE(killed, 0);
  ASSERT_TRUE(PushRange(*client, *table, 201, 300)) << Logs();
  std::vector<float> values(4);
  ASSERT_TRUE(client->Pull(*table, values.data()).get().ok());
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(values[k], -static_cast<float>(sum_[k])) << "row " << k;
  auto v = View();
  ASSERT_TRUE(v && v->primary);
  EXPECT_NE(static_cast<int>(v->primary->replica), killed);
  EXPECT_GE(v->term, 2u);
  // The killed replica comes back with the keys and catches up over CURVE.
  StartReplica(killed);
  ASSERT_TRUE(WaitFor([&] { return InSync() == 2; }, 60s)) << Logs();
}

TEST_F(SecureFailoverTest, AReplicaWithoutTheKeysCannotJoinTheLog) {
  auto v = View();
  ASSERT_TRUE(v && v->primary);
  const int backup = 1 - static_cast<int>(v->primary->replica);
  replicas_[static_cast<size_t>(backup)]->Kill();
  StartReplica(backup, /*with_keys=*/false);
  // It stops on its own, saying why, instead of waiting for a log that never comes.
  auto code = replicas_[static_cast<size_t>(backup)]->Wait(60s);
  ASSERT_TRUE(code.has_value()) << Logs();
  EXPECT_EQ(*code, 2) << Logs();
  const std::string log = replicas_[static_cast<size_t>(backup)]->ReadLog();
  EXPECT_NE(log.find("cannot join the log"), std::string::npos) << log;
  EXPECT_NE(log.find("--curve-keys"), std::string::npos) << log;
  // The primary goes on without it: pushes are acknowledged, with the backup out of the set.
  auto client = Follower("pusher", /*register_worker=*/true);
  ASSERT_NE(client, nullptr);
  auto table = client->CreateTable(testing::Sgd1("w", 4, 1));
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_TRUE(PushRange(*client, *table, 1, 50)) << Logs();
  EXPECT_EQ(InSync(), 1) << Logs();
  std::vector<float> values(4);
  ASSERT_TRUE(client->Pull(*table, values.data()).get().ok());
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(values[k], -static_cast<float>(sum_[k])) << "row " << k;
}

}  // namespace
}  // namespace leash
