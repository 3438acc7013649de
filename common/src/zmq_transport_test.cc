// Tests of the ZeroMQ transport adapter in one process over ipc:// sockets: plain round
// trips, CURVE with an authorized key, a refused key reported by health() and counted by
// the shard's transport, a plain client against a CURVE server, handshakes reset mid-way
// (retried, reported only when they persist), loopback endpoints, and
// same-host shared memory (frames through it both ways, a shard that declines it, a
// restarted shard, a forged trailer), a client receiving on one thread while another
// sends or wakes it, and striping over several connections.
#include "leash/common/zmq_transport.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include <zmq.hpp>

#include "leash/common/curve_keys.h"
#include "socket_monitor.h"
#include "stripes.h"
#include "zmq_util.h"

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
  static bool RoundTrip(ServerTransport& server, ClientTransport& client,
                        std::chrono::milliseconds wait) {
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

  // Shard 0's health once the client reports it unavailable (reading the monitors' events
  // as a worker does), or Ok if it did not within `wait`.
  static Status UnhealthyWithin(ClientTransport& client, std::chrono::milliseconds wait) {
    auto end = std::chrono::steady_clock::now() + wait;
    Status health = client.health()->ShardHealth(0);
    while (health.ok() && std::chrono::steady_clock::now() < end) {
      (void)client.Receive(20ms);
      health = client.health()->ShardHealth(0);
    }
    return health;
  }

  static Frame Pattern(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 13);
    return Frame::Own(std::move(v));
  }
  static bool Same(const Frame& a, const Frame& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
  }
  static ZmqOptions Shm(bool on) {
    ZmqOptions o;
    o.shared_memory = on;
    return o;
  }
  // The next message the server gets within `wait`.
  static std::optional<Inbound> ServerGet(ServerTransport& s, std::chrono::milliseconds wait) {
    auto end = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < end) {
      auto in = s.Receive(10ms);
      if (in.ok() && in->has_value()) return std::move(**in);
    }
    return std::nullopt;
  }
  static std::optional<Message> ClientGet(ClientTransport& c, std::chrono::milliseconds wait) {
    auto end = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < end) {
      auto in = c.Receive(10ms);
      if (in.ok() && in->has_value()) return std::move((*in)->second);
    }
    return std::nullopt;
  }
  // Lets the server answer the client's shared-memory offer; true once the client uses it.
  static bool AwaitShm(ServerTransport& s, ClientTransport& c, std::chrono::milliseconds wait) {
    auto end = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < end) {
      (void)s.Receive(5ms);
      (void)c.Receive(5ms);
      if (c.shared_memory() != nullptr && c.shared_memory()->ActiveWith(0)) return true;
    }
    return false;
  }

  // Lets the client switch its messages to the segment's queue (probes until one arrives
  // that way), and reads whatever came; true once it did.
  static bool AwaitQueue(ServerTransport& s, ClientTransport& c) {
    if (!AwaitShm(s, c, 10s)) return false;
    for (int k = 0; k < 100 && s.counters().shm_messages_received == 0; ++k) {
      if (!c.Send(0, {Frame::Copy("probe", 5)}).ok()) return false;
      (void)ServerGet(s, 10ms);
    }
    while (ServerGet(s, 50ms)) {
    }
    return s.counters().shm_messages_received > 0;
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
  EXPECT_TRUE((*client)->health()->ShardHealth(0).ok());
  EXPECT_EQ((*server)->counters().auth_refused, 0u);
}

TEST_F(ZmqTransportTest, RetargetMovesAShardsConnectionToAnotherEndpoint) {
  ZmqContext sctx, cctx;
  const std::string other = "ipc://" + dir_.path() + "/other.sock";
  auto first = BindZmqServer(sctx, endpoint_);
  auto second = BindZmqServer(sctx, other);
  ASSERT_TRUE(first.ok() && second.ok());
  auto client = ConnectZmqClient(cctx, {endpoint_});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(RoundTrip(**first, **client, 10s));
  ASSERT_TRUE((*client)->Retarget(0, other).ok());
  EXPECT_TRUE(RoundTrip(**second, **client, 10s));  // the new endpoint answers
  EXPECT_TRUE((*client)->health()->ShardHealth(0).ok());
  auto stray = (*first)->Receive(100ms);  // nothing more reaches the old one
  ASSERT_TRUE(stray.ok());
  EXPECT_FALSE(stray->has_value());
  EXPECT_EQ((*client)->Retarget(0, "nonsense").code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(RoundTrip(**second, **client, 10s));  // a failed retarget keeps the connection
}

// A shard's answering backup gets a connection of its own (ConnectBackup): a plain DEALER
// to a ROUTER, which Send(num_shards() + shard) reaches and whose replies come out of Receive
// as num_shards() + shard, also for a Receive already waiting when it was connected, with
// or without striping; the primary's connection goes on as before; "" closes it.
TEST_F(ZmqTransportTest, ABackupConnectionCarriesMessagesAsShardNumShardsPlusShard) {
  for (int stripes : {1, 2}) {
    SCOPED_TRACE("stripes " + std::to_string(stripes));
    ZmqContext sctx, cctx;
    auto primary = BindZmqServer(sctx, endpoint_);
    ASSERT_TRUE(primary.ok()) << primary.status();
    ZmqOptions o;
    o.stripes = stripes;
    o.stripe_min_bytes = 1;  // everything the primary's connection sends is striped
    auto client = ConnectZmqClient(cctx, {endpoint_}, o);
    ASSERT_TRUE(client.ok()) << client.status();
    ClientTransport& c = **client;
    ASSERT_EQ(c.num_shards(), 1);
    EXPECT_EQ(c.Send(1, {Frame::Copy("early", 5)}).code(), StatusCode::kUnavailable);

    zmq::context_t rctx;
    zmq::socket_t router(rctx, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 0);
    router.bind("tcp://127.0.0.1:*");
    const std::string backup = router.get(zmq::sockopt::last_endpoint);

    // A Receive that waits while the backup is connected hears it.
    // (Past its timeout a Receive still reads what is there: whether it heard the backup
    // while waiting shows in when it returned.)
    std::optional<std::pair<int, Message>> heard;
    std::chrono::steady_clock::time_point heard_at;
    std::thread receiver([&] {
      auto in = c.Receive(30s);
      heard_at = std::chrono::steady_clock::now();
      ASSERT_TRUE(in.ok()) << in.status();
      heard = std::move(*in);
    });
    std::this_thread::sleep_for(50ms);  // let it wait in poll (it works either way)
    ASSERT_TRUE(c.ConnectBackup(0, backup).ok());
    ASSERT_TRUE(c.Send(1, {Frame::Copy("to backup", 9), Frame::Copy("second", 6)}).ok());
    std::vector<zmq::message_t> parts;
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    ASSERT_EQ(zmq::poll(&item, 1, 10s), 1);
    ASSERT_TRUE(zmq_util::RecvAll(router, &parts).ok());
    ASSERT_EQ(parts.size(), 3u);  // the peer's id, then the message as sent: no offer, no stripes
    EXPECT_EQ(parts[1].to_string(), "to backup");
    EXPECT_EQ(parts[2].to_string(), "second");
    const std::string id = parts[0].to_string();
    auto to_client = [&](const std::string& text) {
      std::vector<zmq::message_t> out;
      out.emplace_back(id.data(), id.size());
      out.emplace_back(text.data(), text.size());
      return zmq_util::SendAll(router, out);
    };
    const auto replied = std::chrono::steady_clock::now();
    ASSERT_TRUE(to_client("from backup").ok());
    receiver.join();
    EXPECT_LT(heard_at - replied, 10s) << "the waiting Receive did not poll the backup";
    ASSERT_TRUE(heard.has_value()) << "the waiting Receive did not hear the backup";
    EXPECT_EQ(heard->first, 1);
    ASSERT_EQ(heard->second.size(), 1u);
    EXPECT_EQ(heard->second[0].view(), "from backup");

    // The primary's connection is untouched.
    EXPECT_TRUE(RoundTrip(**primary, c, 10s));

    // Closed: nothing goes to it, and what it sends is not read.
    ASSERT_TRUE(c.ConnectBackup(0, "").ok());
    EXPECT_EQ(c.Send(1, {Frame::Copy("late", 4)}).code(), StatusCode::kUnavailable);
    (void)to_client("stray");
    auto after = c.Receive(200ms);
    ASSERT_TRUE(after.ok());
    EXPECT_FALSE(after->has_value());
    EXPECT_EQ(c.ConnectBackup(0, "nonsense").code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(c.ConnectBackup(1, backup).code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(RoundTrip(**primary, c, 10s));
  }
}

// On one host a backup's connection has shared memory of its own: once the backup took the
// offer, what the client sends it and what it answers go through the segment's queues (the
// backup answers the queue's peer), and a backup of another process gets a segment afresh.
TEST_F(ZmqTransportTest, ABackupConnectionTakesSharedMemoryOfItsOwnOnThisHost) {
  ZmqContext sctx, bctx, b2ctx, cctx;
  auto primary = BindZmqServer(sctx, endpoint_, Shm(true));
  ASSERT_TRUE(primary.ok()) << primary.status();
  auto client = ConnectZmqClient(cctx, {endpoint_}, Shm(true));
  ASSERT_TRUE(client.ok()) << client.status();
  ClientTransport& c = **client;
  ASSERT_TRUE(AwaitShm(**primary, c, 10s));

  // Probes shard 0's backup (connection 1) until one arrives through the backup's queue;
  // the peer it came from, or "" if none did.
  auto through_queue = [&](ServerTransport& backup) -> std::string {
    for (int k = 0; k < 200; ++k) {
      if (!c.Send(1, {Frame::Copy("heartbeat", 9)}).ok()) return "";
      (void)c.Receive(5ms);  // reads the backup's answer to the offer when it comes
      if (auto in = ServerGet(backup, 10ms); in && backup.counters().shm_messages_received > 0) {
        return in->peer;
      }
    }
    return "";
  };
  // `backup`'s replies to `peer` reach the client as shard 1, every one through the queue.
  auto replies_through_queue = [&](ServerTransport& backup, const std::string& peer) {
    const uint64_t before = backup.counters().shm_messages_sent;
    for (uint32_t i = 0; i < 20; ++i) {
      ASSERT_TRUE(backup.Send(peer, {Frame::Copy(&i, sizeof i), Pattern(3'000, 5)}).ok());
      std::optional<std::pair<int, Message>> got;
      for (int k = 0; k < 500 && !got; ++k) {
        auto in = c.Receive(10ms);
        ASSERT_TRUE(in.ok()) << in.status();
        got = std::move(*in);
      }
      ASSERT_TRUE(got.has_value()) << "reply " << i;
      EXPECT_EQ(got->first, 1) << "the backup's connection is shard num_shards() + 0";
      ASSERT_EQ(got->second.size(), 2u);
      uint32_t seen = 0;
      std::memcpy(&seen, got->second[0].data(), sizeof seen);
      EXPECT_EQ(seen, i);
      EXPECT_TRUE(Same(got->second[1], Pattern(3'000, 5)));
    }
    EXPECT_EQ(backup.counters().shm_messages_sent - before, 20u);
    EXPECT_EQ(backup.counters().replies_dropped, 0u);
  };

  auto backup = BindZmqServer(bctx, "ipc://" + dir_.path() + "/backup.sock", Shm(true));
  ASSERT_TRUE(backup.ok()) << backup.status();
  ASSERT_NE(c.shared_memory(), nullptr);
  EXPECT_FALSE(c.shared_memory()->ActiveWith(1)) << "no backup connection yet";
  ASSERT_TRUE(c.ConnectBackup(0, "ipc://" + dir_.path() + "/backup.sock").ok());
  const std::string peer = through_queue(**backup);
  ASSERT_FALSE(peer.empty()) << "the backup never read the client's queue";
  EXPECT_TRUE(c.shared_memory()->ActiveWith(1)) << "the client says it sends through the queue";
  EXPECT_EQ(peer.substr(1, 3), "SHM") << "queued messages come from the queue's peer";
  replies_through_queue(**backup, peer);
  EXPECT_TRUE(RoundTrip(**primary, c, 10s)) << "the primary's connection is untouched";

  // Another backup process (after a failover): a segment of its own, through its queue.
  auto second = BindZmqServer(b2ctx, "ipc://" + dir_.path() + "/backup2.sock", Shm(true));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(c.ConnectBackup(0, "ipc://" + dir_.path() + "/backup2.sock").ok());
  const std::string peer2 = through_queue(**second);
  ASSERT_FALSE(peer2.empty()) << "the second backup never read the client's queue";
  EXPECT_NE(peer2, peer) << "a new segment, not the first backup's";
  replies_through_queue(**second, peer2);

  ASSERT_TRUE(c.ConnectBackup(0, "").ok());
  EXPECT_FALSE(c.shared_memory()->ActiveWith(1)) << "closed";
  EXPECT_FALSE(c.shared_memory()->ActiveWith(2)) << "out of range";
  EXPECT_EQ(c.Send(1, {Frame::Copy("late", 4)}).code(), StatusCode::kUnavailable);
  EXPECT_EQ(c.Send(2, {Frame::Copy("late", 4)}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Send(-1, {Frame::Copy("late", 4)}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(RoundTrip(**primary, c, 10s));
}

TEST_F(ZmqTransportTest, CurveRoundTripWithAnAuthorizedKey) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_, ServerOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_}, ClientOptions("good"));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(RoundTrip(**server, **client, 10s));
  EXPECT_TRUE((*client)->health()->ShardHealth(0).ok()) << (*client)->health()->ShardHealth(0);
  EXPECT_EQ((*server)->counters().auth_refused, 0u);
}

TEST_F(ZmqTransportTest, RefusedKeyIsReportedToTheClientAndCounted) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_, ServerOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_}, ClientOptions("rogue"));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_FALSE(RoundTrip(**server, **client, 2s));
  Status health = (*client)->health()->ShardHealth(0);
  EXPECT_EQ(health.code(), StatusCode::kUnavailable) << health;
  EXPECT_NE(health.message().find("did not complete the CURVE handshake"), std::string::npos)
      << health;
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
  // The client learns it from the mismatch itself, or, when the shard closed the connection
  // before the client read why, once its handshakes have broken for the grace period.
  Status health = UnhealthyWithin(**client, 10s);
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
  EXPECT_NE(second.status().message().find("one CURVE server per ZmqContext"), std::string::npos)
      << second.status();
}

TEST_F(ZmqTransportTest, SharedMemoryCarriesLargeFramesBothWaysOnThisHost) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_, Shm(true));
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_}, Shm(true));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(AwaitShm(**server, **client, 10s));

  Frame big = Pattern(200'000, 1), small = Pattern(100, 2);
  ASSERT_TRUE((*client)->Send(0, {Frame::Copy("req", 3), big, small}).ok());
  auto in = ServerGet(**server, 5s);
  ASSERT_TRUE(in);
  ASSERT_EQ(in->message.size(), 3u);
  EXPECT_EQ(in->message[0].view(), "req");
  EXPECT_TRUE(Same(in->message[1], big));
  EXPECT_TRUE(Same(in->message[2], small));
  EXPECT_EQ((*server)->counters().shm_frames_received, 1u) << "only the frame over the threshold";

  Frame reply = Pattern(300'000, 3);
  ASSERT_TRUE((*server)->Send(in->peer, {Frame::Copy("rep", 3), reply}).ok());
  auto out = ClientGet(**client, 5s);
  ASSERT_TRUE(out);
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[0].view(), "rep");
  EXPECT_TRUE(Same((*out)[1], reply));
  EXPECT_EQ((*server)->counters().shm_frames_sent, 1u);

  // A reply built in place (as a shard reads a pull into it).
  auto r = (*server)->ReservePayload(in->peer, 64'000);
  ASSERT_TRUE(r);
  Frame in_place = Pattern(64'000, 7);
  std::memcpy(r->data, in_place.data(), in_place.size());
  ASSERT_TRUE((*server)->Send(in->peer, {Frame::Copy("rep", 3), r->frame}).ok());
  out = ClientGet(**client, 5s);
  ASSERT_TRUE(out);
  ASSERT_EQ(out->size(), 2u);
  EXPECT_TRUE(Same((*out)[1], in_place));
  EXPECT_EQ((*server)->counters().shm_frames_sent, 2u);
  EXPECT_FALSE((*server)->ReservePayload("nobody", 64'000)) << "a peer without shared memory";

  // A payload built in place is sent without a copy, and again when resent.
  auto w = (*client)->shared_memory()->ReservePayload(0, 100'000);
  ASSERT_TRUE(w);
  Frame expected = Pattern(100'000, 4);
  std::memcpy(w->data, expected.data(), expected.size());
  for (int send = 0; send < 2; ++send) {
    ASSERT_TRUE((*client)->Send(0, {Frame::Copy("push", 4), w->frame}).ok());
    auto got = ServerGet(**server, 5s);
    ASSERT_TRUE(got);
    ASSERT_EQ(got->message.size(), 2u);
    EXPECT_TRUE(Same(got->message[1], expected)) << "send " << send;
  }
  EXPECT_EQ((*server)->counters().shm_frames_received, 3u);
  EXPECT_FALSE((*client)->shared_memory()->ReservePayload(0, 1000))
      << "below the threshold: ordinary memory";
}

// A client that lends its frames (a primary to its backups, ZmqOptions::shm_lend): the
// server gets them in place, in the client's ring, and a renewed link (the server process
// restarted holding some) is offered afresh and lends again once answered.
TEST_F(ZmqTransportTest, ALendingClientsLargeFramesAreReadInPlaceAndARenewedLinkLendsAgain) {
  ZmqContext sctx, cctx;
  ZmqOptions lenders = Shm(true);
  lenders.shm_lenders = "*";
  auto server = BindZmqServer(sctx, endpoint_, lenders);
  ASSERT_TRUE(server.ok()) << server.status();
  ZmqOptions lend = Shm(true);
  lend.shm_lend = true;
  auto client = ConnectZmqClient(cctx, {endpoint_}, lend);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(AwaitShm(**server, **client, 10s));
  const Frame big = Pattern(200'000, 1);
  ASSERT_TRUE((*client)->Send(0, {Frame::Copy("req", 3), big}).ok());
  auto in = ServerGet(**server, 5s);
  ASSERT_TRUE(in);
  ASSERT_EQ(in->message.size(), 2u);
  EXPECT_TRUE(in->message[1].lent());
  EXPECT_TRUE(Same(in->message[1], big));
  EXPECT_EQ((*server)->counters().shm_frames_lent, 1u);

  (*client)->shared_memory()->RenewLink(0);
  EXPECT_FALSE((*client)->shared_memory()->ActiveWith(0)) << "until the new offer is answered";
  ASSERT_TRUE(AwaitShm(**server, **client, 10s));
  ASSERT_TRUE((*client)->Send(0, {Frame::Copy("req", 3), big}).ok());
  std::optional<Inbound> again = ServerGet(**server, 5s);
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->message[1].lent());
  EXPECT_TRUE(Same(again->message[1], big));
  EXPECT_EQ((*server)->counters().shm_frames_lent, 2u);
  // The first frame, still held, was never overwritten.
  EXPECT_TRUE(Same(in->message[1], big));

  // A client that does not lend: frames are copied out.
  auto plain = ConnectZmqClient(cctx, {endpoint_}, Shm(true));
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(AwaitShm(**server, **plain, 10s));
  ASSERT_TRUE((*plain)->Send(0, {Frame::Copy("req", 3), big}).ok());
  std::optional<Inbound> copied = ServerGet(**server, 5s);
  ASSERT_TRUE(copied);
  ASSERT_EQ(copied->message.size(), 2u);
  EXPECT_FALSE(copied->message[1].lent());
  EXPECT_TRUE(Same(copied->message[1], big));
  EXPECT_EQ((*server)->counters().shm_frames_lent, 2u);
}

TEST_F(ZmqTransportTest, AShardWithSharedMemoryOffDeclinesItAndFramesGoThroughTheSocket) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_, Shm(false));
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_}, Shm(true));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_FALSE(AwaitShm(**server, **client, 500ms));
  EXPECT_FALSE((*client)->shared_memory()->ReservePayload(0, 1 << 20));
  Frame big = Pattern(500'000, 5);
  ASSERT_TRUE((*client)->Send(0, {Frame::Copy("req", 3), big}).ok());
  auto in = ServerGet(**server, 5s);
  ASSERT_TRUE(in);
  ASSERT_EQ(in->message.size(), 2u);
  EXPECT_TRUE(Same(in->message[1], big));
  ASSERT_TRUE((*server)->Send(in->peer, {Frame::Copy("rep", 3), big}).ok());
  auto out = ClientGet(**client, 5s);
  ASSERT_TRUE(out);
  ASSERT_EQ(out->size(), 2u);
  EXPECT_TRUE(Same((*out)[1], big));
  EXPECT_EQ((*server)->counters().shm_frames_received, 0u);
  EXPECT_EQ((*server)->counters().shm_frames_sent, 0u);
}

TEST_F(ZmqTransportTest, ARestartedShardMapsTheClientsSegmentAgain) {
  ZmqContext sctx, cctx;
  auto first = BindZmqServer(sctx, endpoint_, Shm(true));
  ASSERT_TRUE(first.ok()) << first.status();
  auto client = ConnectZmqClient(cctx, {endpoint_}, Shm(true));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(AwaitShm(**first, **client, 10s));
  first->reset();  // the shard process goes; ZeroMQ reconnects the client to the next one
  auto second = BindZmqServer(sctx, endpoint_, Shm(true));
  ASSERT_TRUE(second.ok()) << second.status();
  Frame big = Pattern(150'000, 6);
  std::optional<Inbound> in;
  for (int attempt = 0; attempt < 50 && !in; ++attempt) {  // sends before the reconnect may be lost
    ASSERT_TRUE((*client)->Send(0, {Frame::Copy("req", 3), big}).ok());
    in = ServerGet(**second, 200ms);
  }
  ASSERT_TRUE(in);
  ASSERT_EQ(in->message.size(), 2u);
  EXPECT_TRUE(Same(in->message[1], big));
  EXPECT_GE((*second)->counters().shm_frames_received, 1u);
  EXPECT_GE((*second)->counters().shm_messages_received, 1u)
      << "the client's notice after the reconnect told the new shard of its queue";
  ASSERT_TRUE((*second)->Send(in->peer, {Frame::Copy("rep", 3), big}).ok());
  auto out = ClientGet(**client, 5s);
  ASSERT_TRUE(out);
  EXPECT_TRUE(Same((*out)[1], big));
  EXPECT_EQ((*second)->counters().shm_frames_sent, 1u);
}

// Messages sent from the moment the client connects, before and after it switches to the
// segment's queue, arrive in the order sent and whole: small ones inline in a queue slot,
// medium ones (a record over a slot) in the ring, large frames in the ring beside them.
TEST_F(ZmqTransportTest, EveryMessageArrivesInOrderAcrossTheSwitchToTheSharedMemoryQueue) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_, Shm(true));
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_}, Shm(true));
  ASSERT_TRUE(client.ok()) << client.status();
  auto message = [](uint32_t i) {
    Message m = {Frame::Copy(&i, sizeof i)};
    if (i % 3 == 1) m.push_back(Pattern(2'000, static_cast<uint8_t>(i)));
    if (i % 5 == 2) m.push_back(Pattern(100'000, static_cast<uint8_t>(i)));
    return m;
  };
  constexpr uint32_t kMessages = 400;
  std::vector<Inbound> got;
  auto take = [&](std::chrono::milliseconds wait) {
    auto in = (*server)->Receive(wait);
    ASSERT_TRUE(in.ok()) << in.status();
    if (in->has_value()) got.push_back(std::move(**in));
  };
  for (uint32_t i = 0; i < kMessages; ++i) {
    ASSERT_TRUE((*client)->Send(0, message(i)).ok()) << i;
    (void)(*client)->Receive(0ms);  // reads the shard's answer when it comes
    take(i % 40 == 0 ? 5ms : 0ms);
  }
  for (int k = 0; k < 2000 && got.size() < kMessages; ++k) take(10ms);
  ASSERT_EQ(got.size(), kMessages);
  for (uint32_t i = 0; i < kMessages; ++i) {
    Message want = message(i);
    ASSERT_EQ(got[i].message.size(), want.size()) << i;
    for (size_t f = 0; f < want.size(); ++f) EXPECT_TRUE(Same(got[i].message[f], want[f])) << i;
  }
  const TransportCounters c = (*server)->counters();
  EXPECT_GT(c.shm_messages_received, 0u) << "the client switched to the queue";
  EXPECT_LT(c.shm_messages_received, kMessages) << "the first messages went before the answer";
  EXPECT_EQ(got.back().peer.substr(1, 3), "SHM") << "queued messages come from the queue's peer";

  // Replies to the queue's peer go through the client's queue; all arrive.
  for (uint32_t i = 0; i < 300; ++i) {
    ASSERT_TRUE((*server)->Send(got.back().peer, message(i)).ok());
    if (i % 50 == 49) {
      for (int k = 0; k < 50; ++k) ASSERT_TRUE(ClientGet(**client, 5s)) << i << " " << k;
    }
  }
  EXPECT_EQ((*server)->counters().shm_messages_sent, 300u);
  EXPECT_EQ((*server)->counters().replies_dropped, 0u);
}

// A reply addressed to the client's connection (its request came on the socket, before the
// client switched to the queue; or the connection was noted then, as an answering backup
// notes a worker's heartbeats) goes through the queue once the client sends through it.
TEST_F(ZmqTransportTest, RepliesToAConnectionGoThroughItsQueueOnceTheClientSwitched) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_, Shm(true));
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_}, Shm(true));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Send(0, {Frame::Copy("early", 5)}).ok());
  auto early = ServerGet(**server, 10s);
  ASSERT_TRUE(early);
  ASSERT_EQ(early->message[0].view(), "early");
  ASSERT_NE(early->peer.substr(1, 3), "SHM") << "it came before the switch, on the socket";
  ASSERT_TRUE(AwaitQueue(**server, **client));

  const uint64_t sent = (*server)->counters().shm_messages_sent;
  ASSERT_TRUE((*server)->Send(early->peer, {Frame::Copy("late reply", 10)}).ok());
  auto got = ClientGet(**client, 10s);
  ASSERT_TRUE(got);
  EXPECT_EQ((*got)[0].view(), "late reply");
  EXPECT_EQ((*server)->counters().shm_messages_sent, sent + 1) << "it went through the queue";
}

// A ring of 1 MiB cannot hold every 400 KB frame the client sends before the shard reads:
// those messages take the detour (a pause in the queue, the socket, the notice) and still
// arrive in the order sent; replies that find no room go on the socket and all arrive.
TEST_F(ZmqTransportTest, MessagesThatFindNoRoomTakeTheSocketAndKeepTheirOrder) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_, Shm(true));
  ASSERT_TRUE(server.ok()) << server.status();
  ZmqOptions small_ring = Shm(true);
  small_ring.shm_ring_bytes = 1 << 20;
  auto client = ConnectZmqClient(cctx, {endpoint_}, small_ring);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(AwaitQueue(**server, **client));
  auto message = [](uint32_t i) {
    Message m = {Frame::Copy(&i, sizeof i)};
    if (i % 2 == 0) m.push_back(Pattern(400'000, static_cast<uint8_t>(i)));
    return m;
  };
  const uint64_t queued_before = (*server)->counters().shm_messages_received;
  constexpr uint32_t kMessages = 60;
  std::vector<Inbound> got;
  for (uint32_t round = 0; round < kMessages / 10; ++round) {
    for (uint32_t i = round * 10; i < round * 10 + 10; ++i) {
      ASSERT_TRUE((*client)->Send(0, message(i)).ok()) << i;
    }
    for (int k = 0; k < 500 && got.size() < round * 10 + 10; ++k) {
      if (auto in = ServerGet(**server, 10ms)) got.push_back(std::move(*in));
    }
  }
  ASSERT_EQ(got.size(), kMessages);
  for (uint32_t i = 0; i < kMessages; ++i) {
    Message want = message(i);
    ASSERT_EQ(got[i].message.size(), want.size()) << i;
    for (size_t f = 0; f < want.size(); ++f) EXPECT_TRUE(Same(got[i].message[f], want[f])) << i;
  }
  const uint64_t queued = (*server)->counters().shm_messages_received - queued_before;
  EXPECT_LT(queued, kMessages) << "some took the socket";
  EXPECT_GT(queued, kMessages / 2) << "most took the queue";

  PeerId queue_peer;
  for (const Inbound& in : got) {
    if (in.peer.substr(1, 3) == "SHM") queue_peer = in.peer;
  }
  ASSERT_FALSE(queue_peer.empty());
  const uint64_t sent_before = (*server)->counters().shm_messages_sent;
  for (uint32_t i = 0; i < 10; ++i) ASSERT_TRUE((*server)->Send(queue_peer, message(2 * i)).ok());
  std::vector<Message> replies;
  for (int k = 0; k < 10; ++k) {
    auto out = ClientGet(**client, 5s);
    ASSERT_TRUE(out) << k;
    replies.push_back(std::move(*out));
  }
  std::vector<uint32_t> ids;
  for (const Message& m : replies) {
    uint32_t id = 0;
    std::memcpy(&id, m.at(0).data(), sizeof id);
    ids.push_back(id);
    ASSERT_EQ(m.size(), 2u);
    EXPECT_TRUE(Same(m[1], message(id)[1])) << id;
  }
  std::sort(ids.begin(), ids.end());
  for (uint32_t i = 0; i < 10; ++i) EXPECT_EQ(ids[i], 2 * i);
  EXPECT_LT((*server)->counters().shm_messages_sent - sent_before, 10u)
      << "replies beyond the ring's room took the socket";
  EXPECT_EQ((*server)->counters().replies_dropped, 0u);
}

TEST_F(ZmqTransportTest, AShardWithMessagesOffStillTakesLargeFramesThroughSharedMemory) {
  ZmqContext sctx, cctx;
  ZmqOptions frames_only = Shm(true);
  frames_only.shm_messages = false;
  auto server = BindZmqServer(sctx, endpoint_, frames_only);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_}, Shm(true));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(AwaitShm(**server, **client, 10s));
  Frame big = Pattern(200'000, 8);
  ASSERT_TRUE((*client)->Send(0, {Frame::Copy("req", 3), big}).ok());
  auto in = ServerGet(**server, 5s);
  ASSERT_TRUE(in);
  EXPECT_TRUE(Same(in->message.at(1), big));
  EXPECT_EQ((*server)->counters().shm_frames_received, 1u);
  EXPECT_EQ((*server)->counters().shm_messages_received, 0u);
  EXPECT_TRUE(RoundTrip(**server, **client, 5s));
}

// The shard does not read: the client's queue takes kQueueSlots messages and then says so
// (the caller resends later), and takes more once the shard has read.
TEST_F(ZmqTransportTest, AFullQueueRefusesTheSendUntilTheShardReads) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_, Shm(true));
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_}, Shm(true));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(AwaitQueue(**server, **client));
  int sent = 0;
  Status refused;
  for (int k = 0; k < 1000 && refused.ok(); ++k) {
    refused = (*client)->Send(0, {Frame::Copy("x", 1)});
    if (refused.ok()) ++sent;
  }
  EXPECT_EQ(sent, 256);
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused;
  EXPECT_NE(refused.message().find("does not read"), std::string::npos) << refused;
  ASSERT_TRUE(ServerGet(**server, 5s));
  EXPECT_TRUE((*client)->Send(0, {Frame::Copy("y", 1)}).ok());
  int read = 0;
  while (ServerGet(**server, 100ms)) ++read;
  EXPECT_EQ(read, 256);
}

// A client whose shard moves to one that cannot read its segment (another host, or
// shared memory off) is told so when it sends its notice, and goes back to the socket.
TEST_F(ZmqTransportTest, AShardThatCannotReadTheQueueSendsTheClientBackToTheSocket) {
  ZmqContext sctx, cctx;
  auto first = BindZmqServer(sctx, endpoint_, Shm(true));
  ASSERT_TRUE(first.ok()) << first.status();
  auto client = ConnectZmqClient(cctx, {endpoint_}, Shm(true));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(AwaitShm(**first, **client, 10s));
  ASSERT_TRUE(RoundTrip(**first, **client, 5s));
  const std::string other = "ipc://" + dir_.path() + "/other.sock";
  auto second = BindZmqServer(sctx, other, Shm(false));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE((*client)->Retarget(0, other).ok());
  std::optional<Inbound> in;
  for (int attempt = 0; attempt < 100 && !in; ++attempt) {
    (void)(*client)->Send(0, {Frame::Copy("req", 3)});  // queued ones are lost, as in a socket
    (void)(*client)->Receive(0ms);
    in = ServerGet(**second, 50ms);
  }
  ASSERT_TRUE(in);
  EXPECT_FALSE((*client)->shared_memory()->ActiveWith(0));
  EXPECT_TRUE(RoundTrip(**second, **client, 5s));
  EXPECT_EQ((*second)->counters().shm_messages_received, 0u);
}

TEST_F(ZmqTransportTest, AForgedSharedMemoryTrailerIsStrippedAndItsFrameStaysEmpty) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_, Shm(true));
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_}, Shm(false));
  ASSERT_TRUE(client.ok()) << client.status();
  // magic, token, name length, count, reserved, name, then index 1 at a made-up place.
  std::string name = "/leash-shm-1-0123456789abcdef";
  std::string t("\xffLSHMTRL", 8);
  auto put = [&t](auto v) { t.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(uint64_t{42});
  put(static_cast<uint16_t>(name.size()));
  put(uint16_t{1});
  put(uint32_t{0});
  t += name;
  put(uint32_t{1});
  put(uint32_t{7});
  put(uint64_t{0});
  put(uint64_t{4096});
  ASSERT_TRUE((*client)->Send(0, {Frame::Copy("req", 3), Frame(), Frame::Copy(t)}).ok());
  auto in = ServerGet(**server, 5s);
  ASSERT_TRUE(in);
  ASSERT_EQ(in->message.size(), 2u) << "the trailer is not passed on";
  EXPECT_TRUE(in->message[1].empty()) << "nothing was read from a segment that does not exist";
  EXPECT_EQ((*server)->counters().shm_frames_received, 0u);
  EXPECT_TRUE(RoundTrip(**server, **client, 5s)) << "the connection still works";
}

// One thread waits in Receive while another sends: every reply reaches the waiting
// thread (a send that consumes the sockets' edge wakes it), and Wake ends its wait.
TEST_F(ZmqTransportTest, AReceiveOnOneThreadGetsEveryReplyWhileAnotherThreadSends) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_});
  ASSERT_TRUE(client.ok()) << client.status();
  constexpr int kMessages = 500;
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    while (!stop.load()) {
      auto in = (*server)->Receive(20ms);
      if (in.ok() && in->has_value()) (void)(*server)->Send((*in)->peer, (*in)->message);
    }
  });
  int received = 0;
  std::thread receiver([&] {
    auto end = std::chrono::steady_clock::now() + 60s;
    while (received < kMessages && std::chrono::steady_clock::now() < end) {
      auto in = (*client)->Receive(10s);
      ASSERT_TRUE(in.ok()) << in.status();
      if (in->has_value()) ++received;
    }
  });
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE((*client)->Send(0, {Frame::Copy(std::to_string(i))}).ok());
    if (i % 50 == 0) std::this_thread::yield();
  }
  receiver.join();
  EXPECT_EQ(received, kMessages);
  std::thread waiter([&] {
    auto in = (*client)->Receive(60s);
    EXPECT_TRUE(in.ok() && !in->has_value()) << "woken, not timed out or given a message";
  });
  (*client)->Wake();
  waiter.join();
  stop.store(true);
  echo.join();
}

// Signals that interrupt the client's ZeroMQ calls (EINTR from the ZMQ_EVENTS query or a
// receive: what SIGTERM did to a worker in CI, which then aborted on cppzmq's exception)
// are retried: every reply arrives, nothing throws. SIGUSR1 without SA_RESTART, sent to
// the thread making the calls as fast as it goes.
TEST_F(ZmqTransportTest, SignalsInterruptingTheClientsCallsLoseNothingAndThrowNothing) {
  struct sigaction quiet {};
  struct sigaction old {};
  quiet.sa_handler = [](int) {};
  sigemptyset(&quiet.sa_mask);
  quiet.sa_flags = 0;
  ASSERT_EQ(sigaction(SIGUSR1, &quiet, &old), 0);
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_});
  ASSERT_TRUE(client.ok()) << client.status();
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    while (!stop.load()) {
      auto in = (*server)->Receive(20ms);
      if (in.ok() && in->has_value()) (void)(*server)->Send((*in)->peer, (*in)->message);
    }
  });
  const pthread_t target = pthread_self();
  std::atomic<int64_t> signals{0};
  std::thread signaller([&] {
    while (!stop.load()) {
      pthread_kill(target, SIGUSR1);
      signals.fetch_add(1);
      std::this_thread::sleep_for(20us);
    }
  });
  // At least 3000 round trips, and on until 5000 signals were sent.
  constexpr int kMessages = 3000;
  int sent = 0, answered = 0;
  try {
    for (int i = 0; (i < kMessages || signals.load() < 5000) && i < 1000000; ++i) {
      ++sent;
      ASSERT_TRUE((*client)->Send(0, {Frame::Copy(std::to_string(i))}).ok());
      auto end = std::chrono::steady_clock::now() + 10s;
      while (std::chrono::steady_clock::now() < end) {
        auto in = (*client)->Receive(100ms);
        ASSERT_TRUE(in.ok()) << in.status();
        if (in->has_value()) {
          EXPECT_EQ((*in)->second.at(0).view(), std::to_string(i));
          ++answered;
          break;
        }
      }
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "the client threw: " << e.what();
  }
  stop.store(true);
  signaller.join();
  echo.join();
  sigaction(SIGUSR1, &old, nullptr);
  EXPECT_EQ(answered, sent);
  EXPECT_GE(sent, kMessages);
  EXPECT_GE(signals.load(), 5000);
}

// A TCP listener on a free loopback port (SO_REUSEADDR, so that a ZeroMQ shard can bind the
// port once it is closed).
void ListenOnLoopback(int* listener, uint16_t* port) {
  *listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(*listener, 0);
  const int one = 1;
  ASSERT_EQ(::setsockopt(*listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(*listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(*listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ASSERT_EQ(::listen(*listener, 64), 0);
  *port = ntohs(addr.sin_port);
}

// A peer that accepts TCP connections and closes them at once, so every handshake with it
// breaks (a monitor event each time) while the client keeps replacing its socket. No event
// may block the client's ZeroMQ I/O thread: its other connection still carries messages.
TEST_F(ZmqTransportTest, ReconnectsDuringBrokenHandshakesNeverStallTheOtherShards) {
  int listener = -1;
  uint16_t port = 0;
  ASSERT_NO_FATAL_FAILURE(ListenOnLoopback(&listener, &port));
  std::atomic<bool> stop{false};
  std::atomic<int> accepted{0};
  struct Cleanup {
    std::atomic<bool>& stop;
    int fd;
    ~Cleanup() {
      stop.store(true);
      ::close(fd);
    }
  };
  std::jthread closer([&] {
    while (!stop.load()) {
      pollfd p{listener, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int c = ::accept(listener, nullptr, nullptr);
      if (c < 0) continue;
      ++accepted;
      ::close(c);
    }
  });
  Cleanup cleanup{stop, listener};  // destroyed first: stops the thread before it is joined

  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string hostile = "tcp://127.0.0.1:" + std::to_string(port);
  auto client = ConnectZmqClient(cctx, {endpoint_, hostile});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(RoundTrip(**server, **client, 10s));
  auto end = std::chrono::steady_clock::now() + 2s;
  while (std::chrono::steady_clock::now() < end) {
    Status st = (*client)->Reconnect(1);
    ASSERT_TRUE(st.ok()) << st;
    (void)(*client)->Receive(1ms);  // reads the monitors' events, as a worker does
  }
  EXPECT_GT(accepted.load(), 10);
  EXPECT_TRUE(RoundTrip(**server, **client, 10s));
}

// A connection the shard closes or resets mid-handshake is what a shard that is starting,
// stopping or failing over does, and ZeroMQ reconnects: it counts against the shard only
// once no handshake has succeeded for the grace period. A refusal counts at once.
TEST(HandshakeWatchTest, ABrokenHandshakeCountsOnlyOnceItPersistsARefusalAtOnce) {
  HandshakeWatch watch({"tcp://127.0.0.1:7000", "tcp://127.0.0.1:7001"}, ZmqOptions{},
                       /*grace_ms=*/150);
  const SocketMonitor::Event broken{ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                                    static_cast<uint32_t>(ECONNRESET)};
  watch.OnEvent(0, broken);
  EXPECT_TRUE(watch.ShardHealth(0).ok()) << watch.ShardHealth(0);
  std::this_thread::sleep_for(250ms);
  watch.OnEvent(0, broken);  // still breaking: the grace runs from the first
  Status st = watch.ShardHealth(0);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("shard 0 (tcp://127.0.0.1:7000) did not complete the handshake"),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("no handshake has succeeded for"), std::string::npos) << st;
  EXPECT_TRUE(watch.ShardHealth(1).ok()) << "only the shard whose handshakes broke";

  watch.OnEvent(0, {ZMQ_EVENT_HANDSHAKE_SUCCEEDED, 0});
  EXPECT_TRUE(watch.ShardHealth(0).ok()) << watch.ShardHealth(0);
  std::this_thread::sleep_for(250ms);
  EXPECT_TRUE(watch.ShardHealth(0).ok()) << "a success clears the broken handshake for good";

  watch.OnEvent(1,
                {ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL, ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH});
  st = watch.ShardHealth(1);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("--curve-keys"), std::string::npos) << st;
}

// A peer that resets the client's first connections during the handshake, then hands its port
// to a real shard (a shard process restarting in place): the client reconnects, its health
// never reports the shard unavailable, and the round trip completes.
TEST_F(ZmqTransportTest, AConnectionResetMidHandshakeIsRetriedNotReported) {
  int listener = -1;
  uint16_t port = 0;
  ASSERT_NO_FATAL_FAILURE(ListenOnLoopback(&listener, &port));
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);

  ZmqContext sctx, cctx;
  auto client = ConnectZmqClient(cctx, {endpoint});
  ASSERT_TRUE(client.ok()) << client.status();
  int reset = 0;
  auto end = std::chrono::steady_clock::now() + 10s;
  while (reset < 3 && std::chrono::steady_clock::now() < end) {
    pollfd p{listener, POLLIN, 0};
    if (::poll(&p, 1, 20) > 0) {
      int c = ::accept(listener, nullptr, nullptr);
      if (c >= 0) {
        const linger rst{1, 0};  // close with a reset, not a FIN
        ::setsockopt(c, SOL_SOCKET, SO_LINGER, &rst, sizeof rst);
        ::close(c);
        ++reset;
      }
    }
    (void)(*client)->Receive(1ms);  // reads the monitors' events, as a worker does
    Status health = (*client)->health()->ShardHealth(0);
    ASSERT_TRUE(health.ok()) << "after " << reset << " reset(s): " << health;
  }
  ASSERT_EQ(reset, 3);
  ::close(listener);
  auto server = BindZmqServer(sctx, endpoint);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(RoundTrip(**server, **client, 10s));
  EXPECT_TRUE((*client)->health()->ShardHealth(0).ok()) << (*client)->health()->ShardHealth(0);
}

TEST_F(ZmqTransportTest, AServerReceivesABurstInOrderWhetherOrNotItWaited) {
  ZmqContext sctx, cctx;
  auto server = BindZmqServer(sctx, endpoint_);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ConnectZmqClient(cctx, {endpoint_});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(RoundTrip(**server, **client, 10s));
  // Sent back to back: most are already queued when Receive is called (no poll), the first
  // may not be (a poll, then the message).
  constexpr int kMessages = 200;
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE((*client)->Send(0, {Frame::Copy(std::to_string(i))}).ok());
  }
  for (int i = 0; i < kMessages; ++i) {
    std::optional<Inbound> in = ServerGet(**server, 10s);
    ASSERT_TRUE(in.has_value()) << "message " << i << " never arrived";
    ASSERT_EQ(in->message.size(), 1u);
    EXPECT_EQ(in->message[0].view(), std::to_string(i));
  }
  auto none = (*server)->Receive(0ms);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value()) << "nothing more was sent";
}

TEST_F(ZmqTransportTest, AServerWakeEndsAWaitingReceiveWithoutAMessage) {
  ZmqContext sctx;
  auto server = BindZmqServer(sctx, endpoint_);
  ASSERT_TRUE(server.ok()) << server.status();
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    auto in = (*server)->Receive(60s);
    EXPECT_TRUE(in.ok() && !in->has_value()) << "woken, not given a message";
    returned.store(true);
  });
  // Woken until the waiter returns (a Wake before it waits is kept for its next Receive).
  auto end = std::chrono::steady_clock::now() + 30s;
  while (!returned.load() && std::chrono::steady_clock::now() < end) {
    (*server)->Wake();
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(returned.load()) << "Wake() did not end the Receive";
  if (!returned.load()) (*server)->Wake();
  waiter.join();
}

// Striping (stripes.h): a client with three connections per shard, large messages split
// over them both ways and put back together whole and in order between small ones.
TEST_F(ZmqTransportTest, StripedMessagesArriveWholeAndInOrderBothWays) {
  ZmqContext sctx(3), cctx(3);
  auto server = BindZmqServer(sctx, endpoint_);
  ASSERT_TRUE(server.ok()) << server.status();
  ZmqOptions o;
  o.stripes = 3;
  o.stripe_min_bytes = 64 * 1024;
  auto client = ConnectZmqClient(cctx, {endpoint_}, o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(RoundTrip(**server, **client, 10s));

  // Sent back to back: small and large alternate, so a small one is often complete before
  // the large one ahead of it.
  std::vector<Message> sent;
  for (int i = 0; i < 24; ++i) {
    const size_t n = i % 3 == 1 ? 1'000'003 + static_cast<size_t>(i) : 100;
    sent.push_back({Frame::Copy(std::to_string(i)), Pattern(n, static_cast<uint8_t>(i)),
                    Pattern(10, static_cast<uint8_t>(i + 1))});
    ASSERT_TRUE((*client)->Send(0, sent.back()).ok());
  }
  PeerId peer;
  for (size_t i = 0; i < sent.size(); ++i) {
    std::optional<Inbound> in = ServerGet(**server, 10s);
    ASSERT_TRUE(in) << "message " << i << " never arrived";
    ASSERT_EQ(in->message.size(), 3u);
    EXPECT_EQ(in->message[0].view(), std::to_string(i)) << "out of order";
    EXPECT_TRUE(Same(in->message[1], sent[i][1])) << "message " << i;
    EXPECT_TRUE(Same(in->message[2], sent[i][2])) << "message " << i;
    if (i == 0) peer = in->peer;
    EXPECT_EQ(in->peer, peer) << "every message comes from the client's one peer id";
  }
  EXPECT_EQ((*server)->counters().striped_received, 8u) << "the eight large ones were striped";

  // Replies the same way.
  for (int i = 0; i < 12; ++i) {
    const size_t n = i % 2 == 0 ? 2'000'000 : 64;
    ASSERT_TRUE((*server)
                    ->Send(peer, {Frame::Copy("r" + std::to_string(i)),
                                  Pattern(n, static_cast<uint8_t>(i))})
                    .ok());
  }
  for (int i = 0; i < 12; ++i) {
    std::optional<Message> out = ClientGet(**client, 10s);
    ASSERT_TRUE(out) << "reply " << i << " never arrived";
    ASSERT_EQ(out->size(), 2u);
    EXPECT_EQ((*out)[0].view(), "r" + std::to_string(i)) << "out of order";
    EXPECT_TRUE(Same((*out)[1], Pattern(i % 2 == 0 ? 2'000'000 : 64, static_cast<uint8_t>(i))));
  }
  EXPECT_EQ((*server)->counters().striped_sent, 6u);
  EXPECT_EQ((*server)->counters().striped_dropped, 0u);
}

TEST_F(ZmqTransportTest, AStripingClientReconnectsAndGoesOnStriping) {
  ZmqContext sctx(2), cctx(2);
  ZmqOptions o;
  o.stripe_min_bytes = 1024;  // the shard's threshold for striping its replies
  auto server = BindZmqServer(sctx, endpoint_, o);
  ASSERT_TRUE(server.ok()) << server.status();
  o.stripes = 2;
  auto client = ConnectZmqClient(cctx, {endpoint_}, o);
  ASSERT_TRUE(client.ok()) << client.status();
  for (int round = 0; round < 3; ++round) {
    Frame big = Pattern(300'000, static_cast<uint8_t>(round));
    ASSERT_TRUE((*client)->Send(0, {Frame::Copy("push"), big}).ok());
    std::optional<Inbound> in = ServerGet(**server, 10s);
    ASSERT_TRUE(in) << "round " << round;
    ASSERT_EQ(in->message.size(), 2u);
    EXPECT_TRUE(Same(in->message[1], big));
    ASSERT_TRUE((*server)->Send(in->peer, {Frame::Copy("pull"), big}).ok());
    std::optional<Message> out = ClientGet(**client, 10s);
    ASSERT_TRUE(out) << "round " << round;
    ASSERT_EQ(out->size(), 2u);
    EXPECT_TRUE(Same((*out)[1], big));
    ASSERT_TRUE((*client)->Reconnect(0).ok());
  }
  EXPECT_EQ((*server)->counters().striped_received, 3u);
  EXPECT_EQ((*server)->counters().striped_sent, 3u);
}

TEST_F(ZmqTransportTest, WithSharedMemoryLargeFramesTakeItInsteadOfStripes) {
  ZmqContext sctx(2), cctx(2);
  auto server = BindZmqServer(sctx, endpoint_, Shm(true));
  ASSERT_TRUE(server.ok()) << server.status();
  ZmqOptions o = Shm(true);
  o.stripes = 2;
  o.stripe_min_bytes = 1024;
  auto client = ConnectZmqClient(cctx, {endpoint_}, o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(AwaitShm(**server, **client, 10s));
  Frame big = Pattern(500'000, 1);
  ASSERT_TRUE((*client)->Send(0, {Frame::Copy("req"), big}).ok());
  std::optional<Inbound> in = ServerGet(**server, 5s);
  ASSERT_TRUE(in);
  EXPECT_TRUE(Same(in->message[1], big));
  EXPECT_EQ((*server)->counters().shm_frames_received, 1u);
  EXPECT_EQ((*server)->counters().striped_received, 0u);
}

// A shard that restarts: the striping client's connections come back to the new process
// under the same routing ids, and striped messages go both ways again.
TEST_F(ZmqTransportTest, AStripingClientReachesARestartedShard) {
  ZmqContext sctx(2), cctx(2);
  ZmqOptions so;
  so.stripe_min_bytes = 1024;
  auto first = BindZmqServer(sctx, endpoint_, so);
  ASSERT_TRUE(first.ok()) << first.status();
  ZmqOptions co;
  co.stripes = 2;
  co.stripe_min_bytes = 1024;
  auto client = ConnectZmqClient(cctx, {endpoint_}, co);
  ASSERT_TRUE(client.ok()) << client.status();
  Frame big = Pattern(400'000, 3);
  ASSERT_TRUE((*client)->Send(0, {Frame::Copy("one"), big}).ok());
  ASSERT_TRUE(ServerGet(**first, 10s));
  first->reset();  // the shard process goes; ZeroMQ reconnects every connection
  auto second = BindZmqServer(sctx, endpoint_, so);
  ASSERT_TRUE(second.ok()) << second.status();
  std::optional<Inbound> in;
  for (int attempt = 0; attempt < 50 && !in; ++attempt) {  // sends before the reconnect may be lost
    ASSERT_TRUE((*client)->Send(0, {Frame::Copy("two"), big}).ok());
    in = ServerGet(**second, 200ms);
  }
  ASSERT_TRUE(in);
  ASSERT_EQ(in->message.size(), 2u);
  EXPECT_TRUE(Same(in->message[1], big));
  EXPECT_GE((*second)->counters().striped_received, 1u);
  ASSERT_TRUE((*second)->Send(in->peer, {Frame::Copy("rep"), big}).ok());
  std::optional<Message> out = ClientGet(**client, 10s);
  ASSERT_TRUE(out);
  ASSERT_EQ(out->size(), 2u);
  EXPECT_TRUE(Same((*out)[1], big));
}

// A client whose routing id says it stripes but whose side connection the shard does not
// hold: the shard's large reply cannot go striped, so it goes whole on the main connection
// instead of leaving a part that would never be completed.
TEST_F(ZmqTransportTest, AReplyWhoseSideConnectionIsMissingGoesWhole) {
  ZmqContext sctx;
  ZmqOptions so;
  so.stripe_min_bytes = 1024;
  auto server = BindZmqServer(sctx, endpoint_, so);
  ASSERT_TRUE(server.ok()) << server.status();
  zmq::context_t raw;
  zmq::socket_t dealer(raw, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::routing_id, stripes::RoutingId(42, 0, 2));
  dealer.set(zmq::sockopt::rcvtimeo, 5000);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(endpoint_);
  dealer.send(zmq::str_buffer("hello"), zmq::send_flags::none);
  std::optional<Inbound> in = ServerGet(**server, 10s);
  ASSERT_TRUE(in);
  EXPECT_EQ(in->peer, stripes::RoutingId(42, 0, 2));
  Frame big = Pattern(100'000, 9);
  ASSERT_TRUE((*server)->Send(in->peer, {Frame::Copy("rep"), big}).ok());
  std::vector<zmq::message_t> parts;
  do {
    zmq::message_t m;
    ASSERT_TRUE(dealer.recv(m)) << "no reply within 5 s";
    parts.push_back(std::move(m));
  } while (parts.back().more());
  ASSERT_EQ(parts.size(), 2u) << "the reply whole, not a part";
  EXPECT_EQ(parts[0].to_string(), "rep");
  ASSERT_EQ(parts[1].size(), big.size());
  EXPECT_EQ(std::memcmp(parts[1].data(), big.data(), big.size()), 0);
  EXPECT_EQ((*server)->counters().striped_sent, 0u);
}

TEST(ZmqStripesOptionTest, AStripeCountOutOfRangeIsRefusedWithTheRange) {
  ZmqContext ctx;
  ZmqOptions o;
  for (int bad : {0, 17}) {
    o.stripes = bad;
    auto c = ConnectZmqClient(ctx, {"tcp://127.0.0.1:5555"}, o);
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("need 1 to 16"), std::string::npos) << c.status();
  }
}

TEST(ZmqEndpointTest, LoopbackEndpointsAreRecognized) {
  for (const char* e : {"tcp://127.0.0.1:7000", "tcp://127.1.2.3:1", "tcp://localhost:7000",
                        "tcp://[::1]:7000", "tcp://lo:7000", "ipc:///tmp/x.sock", "inproc://x"}) {
    EXPECT_TRUE(IsLoopbackEndpoint(e)) << e;
  }
  for (const char* e : {"tcp://0.0.0.0:7000", "tcp://*:7000", "tcp://10.0.0.5:7000",
                        "tcp://eth0:7000", "tcp://shard0:7000", "tcp://[::]:7000"}) {
    EXPECT_FALSE(IsLoopbackEndpoint(e)) << e;
  }
}

}  // namespace
}  // namespace leash
