// Tests of the in-memory transport itself: round trips, what a vanished or restarted
// shard loses, a client's reconnect, retarget and backup connection, Wake, and each fault (drop,
// duplicate, delay with reordering, rules per direction and peer). Single-threaded except where a
// test says.
#include "support/memory_transport.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

namespace leash::testing {
namespace {

using namespace std::chrono_literals;

Message Text(const std::string& s) { return {Frame::Copy(s)}; }

std::optional<Inbound> ServerGet(ServerTransport& s, std::chrono::milliseconds wait = 1000ms) {
  auto in = s.Receive(wait);
  EXPECT_TRUE(in.ok());
  return in.ok() ? std::move(*in) : std::nullopt;
}

std::optional<std::pair<int, Message>> ClientGet(ClientTransport& c,
                                                 std::chrono::milliseconds wait = 1000ms) {
  auto in = c.Receive(wait);
  EXPECT_TRUE(in.ok());
  return in.ok() ? std::move(*in) : std::nullopt;
}

TEST(MemoryTransportTest, MessagesGoBothWaysBetweenAClientAndItsShards) {
  MemoryNetwork net;
  auto s0 = net.Bind("s0");
  auto s1 = net.Bind("s1");
  ASSERT_TRUE(s0 && s1);
  EXPECT_FALSE(net.Bind("s0")) << "an address is bound once";
  auto client = net.Connect({"s0", "s1"});
  EXPECT_EQ(client->num_shards(), 2);
  ASSERT_TRUE(client->Send(1, Text("to one")).ok());
  auto in = ServerGet(*s1);
  ASSERT_TRUE(in);
  EXPECT_EQ(in->message[0].view(), "to one");
  EXPECT_FALSE(s0->Receive(0ms)->has_value());
  ASSERT_TRUE(s1->Send(in->peer, Text("back")).ok());
  auto out = ClientGet(*client);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->first, 1);
  EXPECT_EQ(out->second[0].view(), "back");
  EXPECT_FALSE(ClientGet(*client, 0ms));
}

TEST(MemoryTransportTest, AShardThatGoesAwayLosesWhatWasOnItsWayAndComesBackEmpty) {
  MemoryNetwork net;
  auto shard = net.Bind("s");
  auto client = net.Connect({"s"});
  ASSERT_TRUE(client->Send(0, Text("queued at the shard")).ok());
  shard.reset();
  ASSERT_TRUE(client->Send(0, Text("sent while down")).ok());
  shard = net.Bind("s");
  ASSERT_TRUE(shard);
  EXPECT_FALSE(ServerGet(*shard, 20ms)) << "both were lost";
  ASSERT_TRUE(client->Send(0, Text("after the restart")).ok());
  auto in = ServerGet(*shard);
  ASSERT_TRUE(in);
  EXPECT_EQ(in->message[0].view(), "after the restart");
  EXPECT_EQ(net.stats().dropped, 2u);
}

TEST(MemoryTransportTest, RepliesOnTheirWayDieWithTheShard) {
  MemoryNetwork net;
  net.SetFaults(Direction::kToClient, "", Faults{.delay_ms = 10'000});
  auto shard = net.Bind("s");
  auto client = net.Connect({"s"});
  ASSERT_TRUE(client->Send(0, Text("ping")).ok());
  auto in = ServerGet(*shard);
  ASSERT_TRUE(in);
  ASSERT_TRUE(shard->Send(in->peer, Text("slow pong")).ok());
  shard.reset();
  EXPECT_FALSE(ClientGet(*client, 20ms));
  EXPECT_EQ(net.stats().dropped, 1u);
}

TEST(MemoryTransportTest, AReconnectedConnectionIsANewPeerAndDropsWhatWasQueuedOnTheOld) {
  MemoryNetwork net;
  auto shard = net.Bind("s");
  auto client = net.Connect({"s"});
  ASSERT_TRUE(client->Send(0, Text("hello")).ok());
  auto first = ServerGet(*shard);
  ASSERT_TRUE(first);
  ASSERT_TRUE(shard->Send(first->peer, Text("queued reply")).ok());
  ASSERT_TRUE(client->Reconnect(0).ok());
  EXPECT_FALSE(ClientGet(*client, 20ms)) << "the old connection's reply is gone";
  ASSERT_TRUE(shard->Send(first->peer, Text("to the old peer")).ok());
  EXPECT_FALSE(ClientGet(*client, 20ms));
  ASSERT_TRUE(client->Send(0, Text("again")).ok());
  auto second = ServerGet(*shard);
  ASSERT_TRUE(second);
  EXPECT_NE(second->peer, first->peer);
}

TEST(MemoryTransportTest, RetargetMovesAConnectionAndABackupConnectionIsShardNPlusS) {
  MemoryNetwork net;
  auto a = net.Bind("a");
  auto b = net.Bind("b");
  auto backup = net.Bind("backup");
  auto client = net.Connect({"a"});
  ASSERT_TRUE(client->Retarget(0, "b").ok());
  ASSERT_TRUE(client->Send(0, Text("to b")).ok());
  auto in = ServerGet(*b);
  ASSERT_TRUE(in);
  EXPECT_FALSE(a->Receive(0ms)->has_value());

  // Shard 0's backup connection is "shard" 1 on the client's side, both ways.
  EXPECT_EQ(client->Send(1, Text("none yet")).code(), StatusCode::kUnavailable);
  ASSERT_TRUE(client->ConnectBackup(0, "backup").ok());
  ASSERT_TRUE(client->Send(1, Text("to the backup")).ok());
  auto at_backup = ServerGet(*backup);
  ASSERT_TRUE(at_backup);
  EXPECT_EQ(at_backup->message[0].view(), "to the backup");
  EXPECT_NE(at_backup->peer, in->peer);
  ASSERT_TRUE(backup->Send(at_backup->peer, Text("from the backup")).ok());
  auto out = ClientGet(*client);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->first, 1);
  EXPECT_EQ(out->second[0].view(), "from the backup");

  // Closed: its replies are lost, and sends are refused.
  ASSERT_TRUE(client->ConnectBackup(0, "").ok());
  ASSERT_TRUE(backup->Send(at_backup->peer, Text("too late")).ok());
  EXPECT_FALSE(ClientGet(*client, 0ms));
  EXPECT_EQ(client->Send(1, Text("closed")).code(), StatusCode::kUnavailable);
  EXPECT_EQ(client->ConnectBackup(1, "backup").code(), StatusCode::kInvalidArgument);
}

TEST(MemoryTransportTest, WakeEndsAWaitingReceiveOrTheNextOne) {
  MemoryNetwork net;
  auto shard = net.Bind("s");
  auto client = net.Connect({"s"});
  client->Wake();  // before anyone waits: the next wait ends at once
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(ClientGet(*client, 60'000ms));
  std::thread waker([&] {
    std::this_thread::sleep_for(20ms);
    client->Wake();
    shard->Wake();
  });
  EXPECT_FALSE(ClientGet(*client, 60'000ms));
  EXPECT_FALSE(ServerGet(*shard, 60'000ms));
  waker.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s) << "no wait ran to its end";
}

TEST(MemoryTransportTest, RandomDropsAndDuplicatesFollowTheSeed) {
  auto run = [](uint64_t seed) {
    MemoryNetwork net(seed);
    net.SetFaults(Direction::kToShard, "s", Faults{.drop = 0.3, .duplicate = 0.3});
    auto shard = net.Bind("s");
    auto client = net.Connect({"s"});
    for (int i = 0; i < 200; ++i) EXPECT_TRUE(client->Send(0, Text(std::to_string(i))).ok());
    std::vector<std::string> got;
    while (auto in = ServerGet(*shard, 0ms)) got.emplace_back(in->message[0].view());
    return std::make_pair(got, net.stats());
  };
  auto [a, stats] = run(7);
  EXPECT_EQ(a, run(7).first) << "the same seed, the same faults";
  EXPECT_NE(a, run(8).first);
  EXPECT_GT(stats.dropped, 30u);
  EXPECT_GT(stats.duplicated, 20u);
  EXPECT_EQ(a.size(), 200 - stats.dropped + stats.duplicated);
  std::set<std::string> distinct(a.begin(), a.end());
  EXPECT_LT(distinct.size(), a.size()) << "some came twice";
}

TEST(MemoryTransportTest, JitterReordersAndDelayHoldsMessagesBack) {
  MemoryNetwork net(3);
  net.SetFaults(Direction::kToClient, "", Faults{.delay_ms = 5, .jitter_ms = 30});
  auto shard = net.Bind("s");
  auto client = net.Connect({"s"});
  ASSERT_TRUE(client->Send(0, Text("hi")).ok());
  auto in = ServerGet(*shard);
  ASSERT_TRUE(in);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(shard->Send(in->peer, Text(std::to_string(i))).ok());
  EXPECT_FALSE(ClientGet(*client, 0ms)) << "nothing arrives before the delay";
  std::vector<int> order;
  while (order.size() < 20) {
    auto out = ClientGet(*client);
    ASSERT_TRUE(out);
    order.push_back(std::stoi(std::string(out->second[0].view())));
  }
  EXPECT_FALSE(std::is_sorted(order.begin(), order.end()));
}

TEST(MemoryTransportTest, RulesDecidePerDirectionAndPeerBeforeRandomFaults) {
  MemoryNetwork net;
  net.SetFaults(Direction::kToShard, "", Faults{.drop = 1.0});  // everything, unless a rule says
  PeerId spared;
  net.AddRule([&spared](const Packet& p) -> std::optional<Verdict> {
    if (p.direction == Direction::kToShard && p.message->at(0).view() == "keep") {
      spared = p.peer;
      return Verdict{Verdict::kDuplicate};
    }
    return std::nullopt;
  });
  auto shard = net.Bind("s");
  auto client = net.Connect({"s"});
  ASSERT_TRUE(client->Send(0, Text("lose")).ok());
  ASSERT_TRUE(client->Send(0, Text("keep")).ok());
  auto a = ServerGet(*shard, 0ms);
  auto b = ServerGet(*shard, 0ms);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->message[0].view(), "keep");
  EXPECT_EQ(b->message[0].view(), "keep");
  EXPECT_EQ(a->peer, spared);
  EXPECT_FALSE(ServerGet(*shard, 0ms));
  net.ClearRules();
  ASSERT_TRUE(client->Send(0, Text("keep")).ok());
  EXPECT_FALSE(ServerGet(*shard, 0ms)) << "without the rule the random drop applies";
}

}  // namespace
}  // namespace leash::testing
