// Tests of the ZeroMQ transport adapter in one process over ipc:// sockets: plain round
// trips, CURVE with an authorized key, a refused key reported by ShardHealth and counted by
// the shard's transport, a plain client against a CURVE server, and loopback endpoints.
#include "leash/common/zmq_transport.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "leash/common/curve_keys.h"

namespace leash {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class Dir {
 public:
  Dir() {
    std::string tmpl = (fs::temp_directory_path() / "leash-zmq-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class ZmqTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    endpoint_ = "ipc://" + dir_.path() + "/shard.sock";
    keys_ = dir_.path() + "/keys";
    bool created = false;
    ASSERT_TRUE(GenerateCurveKeyPair(keys_, "server", false, &created).ok());
    ASSERT_TRUE(GenerateCurveKeyPair(keys_, "good", true, &created).ok());
    ASSERT_TRUE(GenerateCurveKeyPair(keys_, "rogue", false, &created).ok());
  }

  ZmqOptions ServerOptions() {
    ZmqOptions o;
    auto k = LoadCurveServerKeys(keys_);
    EXPECT_TRUE(k.ok()) << k.status();
    if (k.ok()) o.curve = *k;
    return o;
  }

  ZmqOptions ClientOptions(const std::string& name) {
    ZmqOptions o;
    if (name.empty()) return o;
    auto k = LoadCurveClientKeys(keys_, name);
    EXPECT_TRUE(k.ok()) << k.status();
    if (k.ok()) o.curve = *k;
    return o;
  }

  // Sends "ping" from the client and answers "pong" from the server; true if the client
  // got the answer within `wait`.
  static bool RoundTrip(ServerTransport& server, ClientTransport& client, std::chrono::milliseconds wait) {
    EXPECT_TRUE(client.Send(0, {Frame::Copy("ping", 4)}).ok());
    auto end = std::chrono::steady_clock::now() + wait;
    bool answered = false;
    while (std::chrono::steady_clock::now() < end) {
      auto in = server.Receive(20ms);
      if (in.ok() && in->has_value() && !answered) {
        EXPECT_EQ((*in)->message.at(0).view(), "ping");
        EXPECT_TRUE(server.Send((*in)->peer, {Frame::Copy("pong", 4)}).ok());
        answered = true;
      }
      auto out = client.Receive(20ms);
      if (out.ok() && out->has_value()) {
        EXPECT_EQ((*out)->second.at(0).view(), "pong");
        return true;
      }
    }
    return false;
  }

  Dir dir_;
  std::string endpoint_;
  std::string keys_;
};

TEST_F(ZmqTransportTest, PlainRoundTrip) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(RoundTrip(**server, **client, 10s));
  EXPECT_TRUE((*client)->ShardHealth(0).ok());
  EXPECT_EQ((*server)->counters().auth_refused, 0u);
}

TEST_F(ZmqTransportTest, CurveRoundTripWithAnAuthorizedKey) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_, ServerOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_}, ClientOptions("good"));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(RoundTrip(**server, **client, 10s));
  EXPECT_TRUE((*client)->ShardHealth(0).ok()) << (*client)->ShardHealth(0);
  EXPECT_EQ((*server)->counters().auth_refused, 0u);
}

TEST_F(ZmqTransportTest, RefusedKeyIsReportedToTheClientAndCounted) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_, ServerOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_}, ClientOptions("rogue"));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_FALSE(RoundTrip(**server, **client, 2s));
  Status health = (*client)->ShardHealth(0);
  EXPECT_EQ(health.code(), StatusCode::kUnavailable) << health;
  EXPECT_NE(health.message().find("did not complete the CURVE handshake"), std::string::npos) << health;
  EXPECT_NE(health.message().find("rogue.pub"), std::string::npos) << health;
  EXPECT_GE((*server)->counters().auth_refused, 1u);
}

TEST_F(ZmqTransportTest, PlainClientOfACurveServerIsToldToUseKeys) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_, ServerOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_FALSE(RoundTrip(**server, **client, 2s));
  Status health = (*client)->ShardHealth(0);
  EXPECT_FALSE(health.ok());
  EXPECT_NE(health.message().find("--curve-keys"), std::string::npos) << health;
  EXPECT_GE((*server)->counters().handshake_failed, 1u);
}

TEST_F(ZmqTransportTest, OneCurveServerPerContext) {
  ZmqContext ctx;
  auto first = BindZmqServer(ctx, endpoint_, ServerOptions());
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = BindZmqServer(ctx, "ipc://" + dir_.path() + "/other.sock", ServerOptions());
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("one CURVE server per ZmqContext"), std::string::npos) << second.status();
}

TEST(ZmqEndpointTest, LoopbackEndpointsAreRecognized) {
  for (const char* e : {"tcp://127.0.0.1:7000", "tcp://127.1.2.3:1", "tcp://localhost:7000", "tcp://[::1]:7000",
                        "tcp://lo:7000", "ipc:///tmp/x.sock", "inproc://x"}) {
    EXPECT_TRUE(IsLoopbackEndpoint(e)) << e;
  }
  for (const char* e : {"tcp://0.0.0.0:7000", "tcp://*:7000", "tcp://10.0.0.5:7000", "tcp://eth0:7000",
                        "tcp://shard0:7000", "tcp://[::]:7000"}) {
    EXPECT_FALSE(IsLoopbackEndpoint(e)) << e;
  }
}

}  // namespace
}  // namespace leash
