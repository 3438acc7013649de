// OtherReplicas over a real ZeroMQ client and real ZeroMQ servers (ipc sockets in a
// temporary directory): replica numbers map to the others' connections both ways, and
// nothing is sent to or asked of this replica itself.
#include "other_replicas.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "leash/common/zmq_transport.h"

namespace leash::server {
namespace {

using namespace std::chrono_literals;

std::optional<Inbound> ServerGet(ServerTransport& s, std::chrono::milliseconds wait) {
  const auto end = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < end) {
    auto in = s.Receive(10ms);
    if (in.ok() && in->has_value()) return std::move(**in);
  }
  return std::nullopt;
}

std::optional<std::pair<int, Message>> ClientGet(ClientTransport& c,
                                                 std::chrono::milliseconds wait) {
  const auto end = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < end) {
    auto in = c.Receive(10ms);
    if (in.ok() && in->has_value()) return std::move(**in);
  }
  return std::nullopt;
}

class OtherReplicasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/leash-other-replicas-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Endpoint(int replica) const {
    return "ipc://" + dir_ + "/replica" + std::to_string(replica) + ".sock";
  }
  std::string dir_;
};

// Replica 1 of 3: its connections are to replicas 0 and 2 only. Each message reaches the
// replica it is addressed to, each answer comes back under the replica that sent it, and
// replica 1 itself is refused by name, healthy, and reserves nothing.
TEST_F(OtherReplicasTest, RepliesAndSendsKeepTheReplicaNumbersAndItselfIsRefused) {
  ZmqContext ctx;
  auto r0 = BindZmqServer(ctx, Endpoint(0), {});
  auto r2 = BindZmqServer(ctx, Endpoint(2), {});
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r2.ok()) << r2.status();
  ZmqContext client_ctx;
  ZmqOptions shm;
  shm.shared_memory = true;
  auto others = ConnectZmqClient(client_ctx, {Endpoint(0), Endpoint(2)}, shm);
  ASSERT_TRUE(others.ok()) << others.status();
  OtherReplicas peers(std::move(*others), /*self=*/1);
  EXPECT_EQ(peers.num_shards(), 3);

  ASSERT_TRUE(peers.Send(0, {Frame::Copy("to 0")}).ok());
  ASSERT_TRUE(peers.Send(2, {Frame::Copy("to 2")}).ok());
  auto at0 = ServerGet(**r0, 10s);
  auto at2 = ServerGet(**r2, 10s);
  ASSERT_TRUE(at0 && at2);
  EXPECT_EQ(at0->message[0].view(), "to 0");
  EXPECT_EQ(at2->message[0].view(), "to 2");
  EXPECT_FALSE(ServerGet(**r0, 100ms)) << "replica 0 got a message addressed elsewhere";

  ASSERT_TRUE((*r2)->Send(at2->peer, {Frame::Copy("from 2")}).ok());
  ASSERT_TRUE((*r0)->Send(at0->peer, {Frame::Copy("from 0")}).ok());
  std::map<int, std::string> answers;
  for (int i = 0; i < 2; ++i) {
    auto in = ClientGet(peers, 10s);
    ASSERT_TRUE(in) << "answer " << i << " did not arrive";
    answers[in->first] = std::string(in->second[0].view());
  }
  EXPECT_EQ(answers, (std::map<int, std::string>{{0, "from 0"}, {2, "from 2"}}));

  Status self = peers.Send(1, {Frame::Copy("to myself")});
  EXPECT_EQ(self.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(self.message().find("replica 1 is this process"), std::string::npos) << self;
  EXPECT_EQ(peers.Reconnect(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(peers.Retarget(1, Endpoint(1)).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(peers.Reconnect(2).ok());

  ASSERT_NE(peers.health(), nullptr);
  EXPECT_TRUE(peers.health()->ShardHealth(1).ok());
  ASSERT_NE(peers.shared_memory(), nullptr);
  EXPECT_FALSE(peers.shared_memory()->ActiveWith(1));
  EXPECT_FALSE(peers.shared_memory()->ReservePayload(1, 1 << 20).has_value());
}

}  // namespace
}  // namespace leash::server
