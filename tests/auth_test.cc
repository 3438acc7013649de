// Integration tests of CURVE security with real leash-server / leash-worker / leashctl
// processes on loopback: refused keys fail Connect with a clear error while the shard goes
// on serving authorized clients, a worker trains and leashctl reports with keys, a plain
// ZeroMQ peer gets nothing from a CURVE shard, bad key directories exit 2, and a shard or
// worker reachable from other hosts without keys refuses to start unless --insecure.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <thread>
#include <zmq.hpp>

#include "leash/common/curve_keys.h"
#include "leash/common/wire.h"
#include "leash/common/zmq_transport.h"
#include "leash/worker/client.h"
#include "support/cluster.h"
#include "support/process.h"

namespace leash {
namespace {

using namespace std::chrono_literals;
using testing::Endpoint;
using testing::FreePort;
using testing::Process;
using testing::TempDir;

constexpr const char* kData = "/usr/share/datasets/fashion-mnist";

// Runs leashctl to completion; returns its exit code and output.
std::pair<int, std::string> Leashctl(const std::string& dir, std::vector<std::string> args) {
  args.insert(args.begin(), LEASHCTL_BIN);
  return testing::RunToCompletion(std::move(args), dir, 60s);
}

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    keys_ = dir_.path() + "/keys";
    // The layout docs/security.md documents: a server pair, a shared client pair, a per-worker
    // pair.
    auto [code, out] =
        Leashctl(dir_.path(), {"keygen", keys_, "--server", "--client", "client,w0"});
    ASSERT_EQ(code, 0) << out;
    // A pair that is not authorized: generated in the same directory, not in authorized/.
    bool created = false;
    ASSERT_TRUE(GenerateCurveKeyPair(keys_, "rogue", false, &created).ok());
    endpoint_ = Endpoint(FreePort());
  }

  std::unique_ptr<Process> StartShard(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {
        LEASH_SERVER_BIN,          "--bind=" + endpoint_, "--data-dir=" + dir_.path() + "/shard0",
        "--checkpoint-interval=0", "--no-sync",           "--curve-keys=" + keys_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Process>(argv, dir_.path() + "/shard0.log");
  }

  Result<std::unique_ptr<Client>> Connect(const std::string& key_name, int64_t timeout_ms = 20000,
                                          bool register_worker = true) {
    ZmqOptions zo;
    if (!key_name.empty()) {
      auto keys = LoadCurveClientKeys(keys_, key_name);
      if (!keys.ok()) return keys.status();
      zo.curve = *keys;
    }
    auto t = ConnectZmqClient(ctx_, {endpoint_}, zo);
    if (!t.ok()) return t.status();
    ClientOptions o;
    o.name = key_name.empty() ? "plain" : key_name;
    o.register_worker = register_worker;
    o.connect_timeout_ms = timeout_ms;
    return Client::Connect(std::move(*t), o);
  }

  // SIGTERM, wait for a clean exit, return the log.
  std::string StopShard(Process& shard) {
    shard.Signal(SIGTERM);
    auto code = shard.Wait(30s);
    EXPECT_EQ(code, std::optional<int>(0)) << shard.ReadLog();
    return shard.ReadLog();
  }

  TempDir dir_;
  std::string keys_;
  std::string endpoint_;
  ZmqContext ctx_;
};

TEST_F(AuthTest, RefusedKeyFailsConnectClearlyAndTheShardServesOthers) {
  auto shard = StartShard();
  auto good = Connect("w0");
  ASSERT_TRUE(good.ok()) << good.status() << shard->ReadLog();
  TableSpec t;
  t.name = "w";
  t.rows = 4;
  t.cols = 2;
  t.optimizer.kind = OptimizerKind::kSgd;
  t.optimizer.lr = 1.f;
  auto table = (*good)->CreateTable(t);
  ASSERT_TRUE(table.ok()) << table.status();

  // A client whose key is not authorized: Connect returns (well before its 20 s timeout,
  // though no timing is asserted) with an error that says what to check.
  auto rogue = Connect("rogue");
  ASSERT_FALSE(rogue.ok());
  EXPECT_EQ(rogue.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(rogue.status().message().find("did not complete the CURVE handshake"),
            std::string::npos)
      << rogue.status();
  EXPECT_NE(rogue.status().message().find("authorized keys"), std::string::npos) << rogue.status();
  EXPECT_NE(rogue.status().message().find("rogue.pub"), std::string::npos) << rogue.status();

  // A client without keys at all is told the shard requires CURVE.
  auto plain = Connect("", 20000, false);
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(plain.status().message().find("--curve-keys"), std::string::npos) << plain.status();

  // The authorized worker is still served, over the encrypted connection.
  std::vector<float> g = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE((*good)->Push(*table, g.data()).get().ok());
  std::vector<float> v(8);
  ASSERT_TRUE((*good)->Pull(*table, v.data()).get().ok());
  EXPECT_EQ(v, (std::vector<float>{-1, -2, -3, -4, -5, -6, -7, -8}));
  EXPECT_TRUE((*good)->Leave().ok());
  good->reset();

  std::string log = StopShard(*shard);
  EXPECT_NE(log.find("refused CURVE client key"), std::string::npos) << log;
  EXPECT_EQ(log.find("refused CURVE client key", log.find("refused CURVE client key") + 1),
            std::string::npos)
      << "a refused key is logged once\n"
      << log;
  EXPECT_GE(testing::CountInFinalLog(log, "CURVE keys refused"), 1) << log;
  EXPECT_GE(testing::CountInFinalLog(log, "failed handshakes"), 1) << log;
}

TEST_F(AuthTest, PlainZeroMqPeerGetsNoReplyFromACurveShard) {
  auto shard = StartShard();
  auto good = Connect("client", 20000, false);
  ASSERT_TRUE(good.ok()) << good.status();
  zmq::context_t raw_ctx;
  zmq::socket_t raw(raw_ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(endpoint_);
  Message stats = MakeStats(1);
  raw.send(zmq::buffer(stats[0].view()), zmq::send_flags::dontwait);
  zmq::pollitem_t item{raw.handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, 2s);
  EXPECT_FALSE(item.revents & ZMQ_POLLIN) << "a plain peer got a reply from a CURVE shard";
  // The authorized client is unaffected.
  auto st = (*good)->Stats();
  EXPECT_TRUE(st.ok()) << st.status();
  good->reset();
  std::string log = StopShard(*shard);
  EXPECT_GE(testing::CountInFinalLog(log, "failed handshakes"), 1) << log;
}

TEST_F(AuthTest, WorkerTrainsAndLeashctlReportsWithKeys) {
  if (!std::filesystem::exists(std::string(kData) + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST not found at " << kData;
  }
  auto shard = StartShard();
  Process worker({LEASH_WORKER_BIN, "--servers=" + endpoint_, "--name=w0", "--curve-keys=" + keys_,
                  "--curve-client=w0", "--epochs=1", "--train-limit=2000", "--test-limit=500",
                  "--chunk-size=500", "--staleness=1"},
                 dir_.path() + "/w0.log");
  auto code = worker.Wait(180s);
  ASSERT_TRUE(code.has_value()) << worker.ReadLog();
  EXPECT_EQ(*code, 0) << worker.ReadLog();
  EXPECT_NE(worker.ReadLog().find("final test accuracy"), std::string::npos) << worker.ReadLog();
  EXPECT_NE(worker.ReadLog().find("CURVE security on"), std::string::npos) << worker.ReadLog();

  auto [ok, status] =
      Leashctl(dir_.path(), {"--servers=" + endpoint_, "--curve-keys=" + keys_, "status"});
  EXPECT_EQ(ok, 0) << status;
  EXPECT_NE(status.find("epoch 1 of 1 complete"), std::string::npos) << status;

  // The same leashctl without keys, or with a refused key, fails clearly (exit 1).
  auto [plain, plain_out] =
      Leashctl(dir_.path(), {"--servers=" + endpoint_, "--timeout=20", "status"});
  EXPECT_EQ(plain, 1) << plain_out;
  EXPECT_NE(plain_out.find("--curve-keys"), std::string::npos) << plain_out;
  auto [rogue, rogue_out] =
      Leashctl(dir_.path(), {"--servers=" + endpoint_, "--timeout=20", "--curve-keys=" + keys_,
                             "--curve-client=rogue", "status"});
  EXPECT_EQ(rogue, 1) << rogue_out;
  EXPECT_NE(rogue_out.find("authorized keys"), std::string::npos) << rogue_out;
  StopShard(*shard);
}

TEST_F(AuthTest, BadKeyDirectoriesExitTwoNamingTheFile) {
  // A missing directory.
  Process missing({LEASH_SERVER_BIN, "--bind=" + endpoint_, "--data-dir=" + dir_.path() + "/s",
                   "--curve-keys=" + dir_.path() + "/nowhere"},
                  dir_.path() + "/missing.log");
  EXPECT_EQ(missing.Wait(30s), std::optional<int>(2));
  EXPECT_NE(missing.ReadLog().find(dir_.path() + "/nowhere"), std::string::npos)
      << missing.ReadLog();

  // A malformed authorized key.
  std::string bad = keys_ + "/authorized/broken.pub";
  {
    std::FILE* f = std::fopen(bad.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("this is not a key\n", f);
    std::fclose(f);
  }
  auto shard = StartShard();
  EXPECT_EQ(shard->Wait(30s), std::optional<int>(2));
  EXPECT_NE(shard->ReadLog().find(bad), std::string::npos) << shard->ReadLog();
  EXPECT_NE(shard->ReadLog().find("malformed key file"), std::string::npos) << shard->ReadLog();

  // A worker whose own key pair does not exist.
  Process worker(
      {LEASH_WORKER_BIN, "--servers=" + endpoint_, "--curve-keys=" + keys_, "--curve-client=w7"},
      dir_.path() + "/w7.log");
  EXPECT_EQ(worker.Wait(60s), std::optional<int>(2));
  EXPECT_NE(worker.ReadLog().find(keys_ + "/w7.key"), std::string::npos) << worker.ReadLog();
}

// Secure by default: a shard bound where other hosts can reach it, or a worker connecting
// to such an address, without keys exits 2 before touching anything, naming both fixes;
// with --insecure both run (0.0.0.0 reaches this host's own shard).
TEST_F(AuthTest, ReachableWithoutKeysRefusesToStartUnlessInsecure) {
  const int port = FreePort();
  const std::string any = "tcp://0.0.0.0:" + std::to_string(port);
  const std::string data = dir_.path() + "/open";
  Process refused({LEASH_SERVER_BIN, "--bind=" + any, "--data-dir=" + data},
                  dir_.path() + "/refused.log");
  EXPECT_EQ(refused.Wait(30s), std::optional<int>(2)) << refused.ReadLog();
  EXPECT_NE(refused.ReadLog().find("refusing to listen on " + any + " (--bind) without CURVE keys"),
            std::string::npos)
      << refused.ReadLog();
  EXPECT_NE(refused.ReadLog().find("--curve-keys DIR"), std::string::npos) << refused.ReadLog();
  EXPECT_NE(refused.ReadLog().find("--insecure"), std::string::npos) << refused.ReadLog();
  EXPECT_FALSE(std::filesystem::exists(data)) << "a refused shard created its data directory";

  Process worker_refused({LEASH_WORKER_BIN, "--servers=" + any, "--connect-timeout=5"},
                         dir_.path() + "/worker_refused.log");
  EXPECT_EQ(worker_refused.Wait(30s), std::optional<int>(2)) << worker_refused.ReadLog();
  EXPECT_NE(worker_refused.ReadLog().find("refusing to connect to " + any +
                                          " (--servers) without CURVE keys"),
            std::string::npos)
      << worker_refused.ReadLog();

  Process open({LEASH_SERVER_BIN, "--bind=" + any, "--data-dir=" + data, "--insecure",
                "--checkpoint-interval=0", "--no-sync"},
               dir_.path() + "/open.log");
  auto [code, out] =
      Leashctl(dir_.path(), {"--servers=" + Endpoint(port), "--timeout=30", "status"});
  EXPECT_EQ(code, 0) << out << open.ReadLog();
  EXPECT_NE(open.ReadLog().find("WITHOUT CURVE keys (--insecure)"), std::string::npos)
      << open.ReadLog();
  if (std::filesystem::exists(std::string(kData) + "/train-images-idx3-ubyte.gz")) {
    Process worker({LEASH_WORKER_BIN, "--servers=" + any, "--insecure", "--epochs=1",
                    "--train-limit=1000", "--test-limit=200", "--chunk-size=500", "--no-eval"},
                   dir_.path() + "/open_worker.log");
    EXPECT_EQ(worker.Wait(180s), std::optional<int>(0)) << worker.ReadLog();
    EXPECT_NE(worker.ReadLog().find("WITHOUT CURVE keys (--insecure)"), std::string::npos)
        << worker.ReadLog();
  }
  StopShard(open);
}

}  // namespace
}  // namespace leash
