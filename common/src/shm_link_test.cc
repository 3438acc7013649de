// Tests of the shared-memory side protocol on its own, without sockets: a client's link
// and a shard's links exchange the offer, the answer and messages with trailers as the
// ZeroMQ adapter would pass them (frames that went into the segment left empty, the
// trailer as the last frame). Single-threaded.
#include "shm_link.h"
#include "zmq_util.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <vector>

namespace leash::shm {
namespace {

constexpr size_t kRing = size_t{1} << 20;
constexpr size_t kMin = 32 << 10;

Frame Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 13);
  return Frame::Own(std::move(v));
}

bool Same(const Frame& a, const Frame& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

// What the peer gets: `m` with the placed frames left empty, and the decoded trailer.
struct Wire {
  Message message;
  std::optional<Trailer> trailer;
};

Wire Carry(const Message& m, const std::optional<Placement>& p, uint32_t ring) {
  Wire w;
  w.message = m;
  if (!p) return w;
  for (const auto& moved : p->frames) w.message[moved.first] = Frame();
  w.trailer = DecodeTrailer(p->trailer.data(), p->trailer.size(), ring);
  return w;
}

// A client link whose offer `server` accepted for `peer`.
void Connect(ClientLink& client, ServerLinks& server, const PeerId& peer) {
  std::optional<std::string> offer = client.Offer();
  ASSERT_TRUE(offer);
  ASSERT_TRUE(IsOffer(offer->data(), offer->size()));
  std::string answer = server.AnswerOffer(peer, offer->data(), offer->size());
  ASSERT_TRUE(IsAnswer(answer.data(), answer.size()));
  client.OnAnswer(answer.data(), answer.size());
}

TEST(ShmLinkTest, AnAcceptedOfferCarriesLargeFramesBothWaysAndSmallOnesInline) {
  ClientLink client(kRing, kMin, "shard 0");
  ServerLinks server(/*enabled=*/true, kMin);
  ASSERT_EQ(client.state(), ClientLink::kOffered);
  Connect(client, server, "peer");
  ASSERT_TRUE(client.on());
  EXPECT_FALSE(client.Offer()) << "an answered offer is not sent again";

  Message request = {Pattern(100, 1), Pattern(200'000, 2), Pattern(1000, 3)};
  std::optional<Placement> placed = client.Place(request);
  ASSERT_TRUE(placed);
  ASSERT_EQ(placed->frames.size(), 1u) << "only the large payload frame goes";
  EXPECT_EQ(placed->frames[0].first, 1u);
  Wire up = Carry(request, placed, 0);
  ASSERT_TRUE(up.trailer);
  EXPECT_TRUE(up.message[1].empty());
  EXPECT_FALSE(server.OnMessage("peer", &*up.trailer, &up.message));
  for (size_t i = 0; i < request.size(); ++i) EXPECT_TRUE(Same(up.message[i], request[i])) << i;
  EXPECT_EQ(server.frames_received(), 1u);

  Message reply = {Pattern(64, 4), Pattern(300'000, 5)};
  std::optional<Placement> back = server.Place("peer", reply);
  ASSERT_TRUE(back);
  EXPECT_EQ(server.frames_sent(), 1u);
  Wire down = Carry(reply, back, 1);
  ASSERT_TRUE(down.trailer);
  ASSERT_TRUE(client.Fill(*down.trailer, &down.message).ok());
  for (size_t i = 0; i < reply.size(); ++i) EXPECT_TRUE(Same(down.message[i], reply[i])) << i;

  EXPECT_FALSE(server.Place("someone else", reply)) << "a peer without a segment";
  EXPECT_FALSE(client.Place({Pattern(100, 1), Pattern(1000, 2)})) << "nothing large enough";
}

TEST(ShmLinkTest, EachRingGrowsWithTheFramesItsWriterSends) {
  ClientLink client(16 << 20, kMin, "shard 0");
  ServerLinks server(true, kMin);
  Connect(client, server, "peer");
  ASSERT_TRUE(client.on());
  EXPECT_EQ(client.reserved_bytes(), 0u) << "nothing reserved before a frame needs it";
  EXPECT_EQ(server.reserved_bytes("peer"), 0u);

  Message request = {Pattern(64, 1), Pattern(200'000, 2)};
  Wire up = Carry(request, client.Place(request), 0);
  ASSERT_TRUE(up.trailer);
  EXPECT_FALSE(server.OnMessage("peer", &*up.trailer, &up.message));
  EXPECT_TRUE(Same(up.message[1], request[1]));
  EXPECT_EQ(client.reserved_bytes(), size_t{1} << 20);
  EXPECT_EQ(server.reserved_bytes("peer"), 0u) << "the shard has sent nothing large yet";

  // The shard reserves its own ring for its replies (a pull of 3 MB).
  Message reply = {Pattern(64, 3), Pattern(3'000'000, 4)};
  Wire down = Carry(reply, server.Place("peer", reply), 1);
  ASSERT_TRUE(down.trailer);
  ASSERT_TRUE(client.Fill(*down.trailer, &down.message).ok());
  EXPECT_TRUE(Same(down.message[1], reply[1]));
  EXPECT_EQ(server.reserved_bytes("peer"), size_t{3} << 20);
  EXPECT_EQ(client.reserved_bytes(), size_t{1} << 20);
}

TEST(ShmLinkTest, AReservedPayloadIsSentInPlaceAndReadAgainWhenResent) {
  ClientLink client(kRing, kMin, "shard 0");
  ServerLinks server(true, kMin);
  Connect(client, server, "peer");
  ASSERT_TRUE(client.on());
  EXPECT_FALSE(client.Reserve(1000)) << "below the threshold: ordinary memory";
  std::optional<WritableFrame> w = client.Reserve(100'000);
  ASSERT_TRUE(w);
  Frame expected = Pattern(100'000, 7);
  std::memcpy(w->data, expected.data(), expected.size());
  Message request = {Pattern(64, 1), w->frame};
  for (int send = 0; send < 2; ++send) {
    Wire up = Carry(request, client.Place(request), 0);
    ASSERT_TRUE(up.trailer) << send;
    EXPECT_FALSE(server.OnMessage("peer", &*up.trailer, &up.message));
    EXPECT_TRUE(Same(up.message[1], expected)) << send;
  }
}

TEST(ShmLinkTest, AShardWithSharedMemoryOffDeclinesAndTheClientStaysOff) {
  ClientLink client(kRing, kMin, "shard 0");
  ServerLinks server(/*enabled=*/false, kMin);
  Connect(client, server, "peer");
  EXPECT_EQ(client.state(), ClientLink::kOff);
  EXPECT_FALSE(client.Offer());
  EXPECT_FALSE(client.Reserve(1 << 20));
  EXPECT_FALSE(client.Place({Pattern(64, 1), Pattern(200'000, 2)}));
  EXPECT_TRUE(server.empty());
}

TEST(ShmLinkTest, ARestartedShardMapsTheSegmentFromTheNextTrailer) {
  ClientLink client(kRing, kMin, "shard 0");
  {
    ServerLinks before(true, kMin);
    Connect(client, before, "peer");
  }
  ASSERT_TRUE(client.on());
  ServerLinks after(true, kMin);  // a new process: nothing mapped
  Message request = {Pattern(64, 1), Pattern(150'000, 2)};
  Wire up = Carry(request, client.Place(request), 0);
  ASSERT_TRUE(up.trailer);
  EXPECT_FALSE(after.OnMessage("peer again", &*up.trailer, &up.message));
  EXPECT_TRUE(Same(up.message[1], request[1]));
  EXPECT_TRUE(after.Place("peer again", {Pattern(64, 3), Pattern(100'000, 4)}))
      << "replies go through the segment again";
}

TEST(ShmLinkTest, ATrailerTheShardCannotReadIsRefusedAndTurnsTheClientOff) {
  ClientLink client(kRing, kMin, "shard 0");
  ServerLinks accepting(true, kMin);
  Connect(client, accepting, "peer");
  ASSERT_TRUE(client.on());
  ServerLinks refusing(/*enabled=*/false, kMin);  // restarted with --no-shm
  Message request = {Pattern(64, 1), Pattern(150'000, 2)};
  Wire up = Carry(request, client.Place(request), 0);
  ASSERT_TRUE(up.trailer);
  std::optional<std::string> answer = refusing.OnMessage("peer", &*up.trailer, &up.message);
  ASSERT_TRUE(answer);
  EXPECT_TRUE(up.message[1].empty()) << "the request fails its size checks";
  client.OnAnswer(answer->data(), answer->size());
  EXPECT_EQ(client.state(), ClientLink::kOff);
  EXPECT_FALSE(client.Place(request));
}

TEST(ShmLinkTest, MalformedTrailersAndAnswersAreNotTakenForGoodOnes) {
  ClientLink client(kRing, kMin, "shard 0");
  ServerLinks server(true, kMin);
  Connect(client, server, "peer");
  Message request = {Pattern(64, 1), Pattern(150'000, 2)};
  std::optional<Placement> placed = client.Place(request);
  ASSERT_TRUE(placed);
  const std::string& bytes = placed->trailer;
  EXPECT_FALSE(DecodeTrailer(bytes.data(), bytes.size() - 1, 0)) << "sizes do not add up";
  EXPECT_FALSE(DecodeTrailer("ordinary payload", 16, 0));

  // A trailer naming frame 0 (the header) or a frame the message lacks fills nothing.
  Trailer forged = *DecodeTrailer(bytes.data(), bytes.size(), 0);
  forged.frames[0].first = 0;
  Message m = request;
  EXPECT_FALSE(server.OnMessage("peer", &forged, &m));
  EXPECT_TRUE(Same(m[0], request[0]));
  forged.frames[0].first = 9;
  Status st = client.Fill(forged, &m);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;

  // A trailer of another segment is not read by the client.
  Trailer other = *DecodeTrailer(bytes.data(), bytes.size(), 1);
  other.token ^= 1;
  Message reply = {Pattern(64, 3), Frame()};
  EXPECT_EQ(client.Fill(other, &reply).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(reply[1].empty());

  // An answer for another token is ignored.
  std::string answer = server.AnswerOffer("p2", "\xffLSHMHEL", 8);  // too short: refused
  client.OnAnswer(answer.data(), answer.size());
  EXPECT_TRUE(client.on());
}

}  // namespace
}  // namespace leash::shm

namespace leash::shm {
namespace {

// Connect(), then the client's messages switched to the queue as the transport does it: its
// notice taken and handed to the shard as come on `peer`. The notice, or "" on failure.
std::string SwitchToQueue(ClientLink& client, ServerLinks& server, const PeerId& peer) {
  Connect(client, server, peer);
  std::optional<std::string> notice = client.TakeNotice();
  EXPECT_TRUE(notice);
  if (!notice) return "";
  EXPECT_FALSE(server.OnNotice(peer, "", notice->data(), notice->size()));
  return *notice;
}

// Everything the shard takes now, in order.
std::vector<Inbound> TakeAll(ServerLinks& server) {
  std::vector<Inbound> got;
  while (std::optional<Inbound> in = server.Take()) got.push_back(std::move(*in));
  return got;
}

TEST(ShmLinkTest, RecordsCarryAMessagesFramesAndMalformedOnesAreRefused) {
  Message m = {Pattern(10, 1), Frame(), Pattern(3000, 2)};
  std::string r = EncodeRecord(m);
  auto back = DecodeRecord(reinterpret_cast<const uint8_t*>(r.data()), r.size());
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 3u);
  for (size_t i = 0; i < m.size(); ++i) EXPECT_TRUE(Same((*back)[i], m[i])) << i;
  const auto* d = reinterpret_cast<const uint8_t*>(r.data());
  EXPECT_FALSE(DecodeRecord(d, r.size() - 1).ok()) << "cut short";
  EXPECT_FALSE(DecodeRecord(d, 3).ok());
  std::string extra = r + "x";
  EXPECT_FALSE(DecodeRecord(reinterpret_cast<const uint8_t*>(extra.data()), extra.size()).ok());
  std::string huge = r;
  const uint32_t many = 1u << 30;
  std::memcpy(huge.data(), &many, 4);
  EXPECT_FALSE(DecodeRecord(reinterpret_cast<const uint8_t*>(huge.data()), huge.size()).ok());
  const std::string pause = EncodeRecord({});
  EXPECT_TRUE(IsPause(reinterpret_cast<const uint8_t*>(pause.data()), pause.size()));
  EXPECT_FALSE(IsPause(d, r.size()));
  EXPECT_FALSE(DecodeRecord(reinterpret_cast<const uint8_t*>(pause.data()), pause.size()).ok())
      << "a pause is no message";
}

// Whole messages through the segment, without sockets: the notice switches them to the
// queue; a message with no room in the ring takes the detour (a pause, the socket, the
// notice) and the shard still takes everything in the order sent.
TEST(ShmLinkTest, ADetourThroughTheSocketIsTakenBetweenThePauseAndTheNotice) {
  // The smallest rings (4 granules, 64 KiB): a 100 KB frame can never go through them.
  ClientLink client(64 << 10, kMin, "shard 0", /*messages=*/true);
  ServerLinks server(/*enabled=*/true, kMin, /*messages=*/true);
  Connect(client, server, "socket-peer");
  ASSERT_TRUE(client.on());
  EXPECT_FALSE(client.messages()) << "not before the notice is taken";
  std::optional<std::string> notice = client.TakeNotice();
  ASSERT_TRUE(notice);
  ASSERT_TRUE(IsNotice(notice->data(), notice->size()));
  EXPECT_TRUE(client.messages());
  EXPECT_FALSE(client.TakeNotice()) << "taken once";
  EXPECT_FALSE(server.OnNotice("socket-peer", "alice", notice->data(), notice->size()));

  auto post = [&](const Message& m) { return client.Post(m, client.Place(m)); };
  auto queued = [](const Result<bool>& r) { return r.ok() && *r; };
  ASSERT_TRUE(queued(post({Pattern(8, 1)})));
  const Message big = {Pattern(8, 2), Pattern(100'000, 3)};
  Result<bool> detour = post(big);
  ASSERT_TRUE(detour.ok()) << detour.status();
  ASSERT_FALSE(*detour) << "no room: the caller sends it on the socket";
  // The socket: the message, then the notice again. Meanwhile the client queues more.
  Inbound on_socket{"socket-peer", big, "alice"};
  EXPECT_TRUE(server.Hold(on_socket)) << "held until the queue's pause";
  std::optional<std::string> again = client.Notice();
  ASSERT_TRUE(again);
  EXPECT_FALSE(server.OnNotice("socket-peer", "alice", again->data(), again->size()));
  ASSERT_TRUE(queued(post({Pattern(8, 4)})));

  std::vector<Inbound> got = TakeAll(server);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(Same(got[0].message.at(0), Pattern(8, 1)));
  EXPECT_TRUE(Same(got[1].message.at(1), big[1]));
  EXPECT_EQ(got[1].peer, "socket-peer");
  EXPECT_TRUE(Same(got[2].message.at(0), Pattern(8, 4)));
  EXPECT_TRUE(ServerLinks::IsChannelPeer(got[0].peer));
  EXPECT_EQ(got[0].peer, got[2].peer);
  EXPECT_EQ(got[2].user, "alice") << "the user the notice's connection authenticated as";
  EXPECT_EQ(server.messages_received(), 2u);

  // Messages from another connection are not held.
  Inbound stranger{"another-peer", {Pattern(8, 5)}, ""};
  EXPECT_FALSE(server.Hold(stranger));

  // Replies: through queue 1, taken by the client in order.
  for (uint8_t k = 0; k < 3; ++k) {
    auto r = server.Post(got[0].peer, {Pattern(8, static_cast<uint8_t>(10 + k))});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(*r) << "queued, no detour";
  }
  for (uint8_t k = 0; k < 3; ++k) {
    auto m = client.Take();
    ASSERT_TRUE(m.ok() && *m) << k;
    EXPECT_TRUE(Same((*m)->at(0), Pattern(8, static_cast<uint8_t>(10 + k))));
  }
  // A reply with no room in the ring goes to the notice's connection on the socket.
  auto r = server.Post(got[0].peer, {Pattern(8, 20), Pattern(100'000, 21)});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(*r);
  EXPECT_EQ((*r)->first, "socket-peer");
  EXPECT_TRUE(Same((*r)->second.at(1), Pattern(100'000, 21)));
  EXPECT_FALSE(server.Post("unknown", {Pattern(8, 1)}).ok());
}

// A reconnect while a message is on its detour: the connection changes under it. The hello
// before the detoured message names the new connection, so the message is held until the
// pause wherever it arrives from; and the reconnect's hello, arriving while the queue is
// paused, does not end the detour (only the resume notice does).
TEST(ShmLinkTest, AReconnectDuringADetourNeitherLetsItOvertakeNorEndsItEarly) {
  ClientLink client(64 << 10, kMin, "shard 0", /*messages=*/true);
  ServerLinks server(/*enabled=*/true, kMin, /*messages=*/true);
  ASSERT_FALSE(SwitchToQueue(client, server, "old-connection").empty());
  auto post = [&](const Message& m) { return client.Post(m, client.Place(m)); };
  auto queued = [](const Result<bool>& r) { return r.ok() && *r; };

  // 1. Queued A; B takes the detour on a new connection: hello, B, resume; then C queued.
  ASSERT_TRUE(queued(post({Pattern(8, 1)})));
  const Message b = {Pattern(8, 2), Pattern(100'000, 3)};
  Result<bool> detour = post(b);
  ASSERT_TRUE(detour.ok() && !*detour);
  std::optional<std::string> hello = client.Hello();
  ASSERT_TRUE(hello);
  EXPECT_FALSE(server.OnNotice("new-connection", "", hello->data(), hello->size()));
  Inbound on_socket{"new-connection", b, ""};
  EXPECT_TRUE(server.Hold(on_socket)) << "known by its hello: held until the pause";
  std::optional<std::string> resume = client.Notice();
  ASSERT_TRUE(resume);
  EXPECT_FALSE(server.OnNotice("new-connection", "", resume->data(), resume->size()));
  ASSERT_TRUE(queued(post({Pattern(8, 4)})));
  std::vector<Inbound> got = TakeAll(server);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(Same(got[0].message.at(0), Pattern(8, 1)));
  EXPECT_TRUE(Same(got[1].message.at(1), b[1]));
  EXPECT_TRUE(Same(got[2].message.at(0), Pattern(8, 4)));

  // 2. A late message on the old connection is still this client's.
  Inbound late{"old-connection", {Pattern(8, 5)}, ""};
  EXPECT_TRUE(server.Hold(late)) << "reading, not paused: waits for a pause";
  ASSERT_TRUE(queued(post({Pattern(8, 6)})));
  // ... and the client's next detour brings the pause that lets it through.
  detour = post(b);
  ASSERT_TRUE(detour.ok() && !*detour);
  got = TakeAll(server);
  ASSERT_EQ(got.size(), 2u) << "the queue up to the pause, then what was held";
  EXPECT_TRUE(Same(got[0].message.at(0), Pattern(8, 6)));
  EXPECT_TRUE(Same(got[1].message.at(0), Pattern(8, 5)));

  // 3. Paused now (B's second detour). A reconnect's hello arrives before the detoured B:
  // it must not resume the queue, or D (queued after the detour) would overtake B.
  hello = client.Hello();
  EXPECT_FALSE(server.OnNotice("third-connection", "", hello->data(), hello->size()));
  ASSERT_TRUE(queued(post({Pattern(8, 7)})));
  EXPECT_TRUE(TakeAll(server).empty()) << "paused until the resume notice";
  Inbound b_again{"third-connection", b, ""};
  EXPECT_FALSE(server.Hold(b_again)) << "paused with nothing held: taken at once, in order";
  resume = client.Notice();
  EXPECT_FALSE(server.OnNotice("third-connection", "", resume->data(), resume->size()));
  got = TakeAll(server);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(Same(got[0].message.at(0), Pattern(8, 7)));
}

// A client that closes its link leaves a bye in its queue: the shard lets the segment and
// its bells go at the next sweep, not when it finds the client gone (a shard with many
// short-lived workers would otherwise hold two descriptors for each).
TEST(ShmLinkTest, AClientThatClosesSaysByeAndTheShardLetsItsSegmentGo) {
  ServerLinks server(/*enabled=*/true, kMin, /*messages=*/true);
  PeerId queue_peer;
  {
    ClientLink client(kRing, kMin, "shard 0", /*messages=*/true);
    ASSERT_FALSE(SwitchToQueue(client, server, "socket-peer").empty());
    Result<bool> posted = client.Post({Pattern(8, 1)}, std::nullopt);
    ASSERT_TRUE(posted.ok() && *posted);
    std::optional<Inbound> in = server.Take();
    ASSERT_TRUE(in);
    queue_peer = in->peer;
    EXPECT_TRUE(server.Post(queue_peer, {Pattern(8, 2)}).ok()) << "the client is there";
  }
  EXPECT_FALSE(server.Take()) << "a bye is no message";
  server.Sweep(0);  // due at once after a bye, whatever the time
  EXPECT_FALSE(server.Post(queue_peer, {Pattern(8, 3)}).ok()) << "its link is gone";
  EXPECT_FALSE(server.Take());
}

// A client on another process: it offers its segment (the offer and the answer through
// pipes), sends its notice if `notice`, queues one message if `queue`, then waits to be
// killed. Its pid is what the segment's name carries.
struct ChildClient {
  pid_t pid = -1;
  std::string notice;
};

bool WriteAll(int fd, const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  return ::write(fd, &n, sizeof n) == sizeof n &&
         (n == 0 || ::write(fd, s.data(), n) == static_cast<ssize_t>(n));
}

std::optional<std::string> ReadAll(int fd) {
  uint32_t n = 0;
  if (::read(fd, &n, sizeof n) != sizeof n) return std::nullopt;
  std::string s(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::read(fd, s.data() + got, n - got);
    if (r <= 0) return std::nullopt;
    got += static_cast<size_t>(r);
  }
  return s;
}

ChildClient StartChildClient(ServerLinks& server, const PeerId& peer, bool notice, bool queue) {
  int up[2], down[2];
  if (::pipe(up) != 0 || ::pipe(down) != 0) return {};
  ChildClient c;
  c.pid = ::fork();
  if (c.pid == 0) {
    ::close(up[0]);
    ::close(down[1]);
    ClientLink client(kRing, kMin, "shard 0", /*messages=*/true);
    std::optional<std::string> offer = client.Offer();
    if (!offer || !WriteAll(up[1], *offer)) ::_exit(1);
    std::optional<std::string> answer = ReadAll(down[0]);
    if (!answer) ::_exit(1);
    client.OnAnswer(answer->data(), answer->size());
    std::string n;
    if (notice) n = client.TakeNotice().value_or("");
    if (queue) {
      Result<bool> posted = client.Post({Pattern(8, 7)}, std::nullopt);
      if (!posted.ok() || !*posted) ::_exit(1);
    }
    if (!WriteAll(up[1], n)) ::_exit(1);
    while (true) ::pause();  // until killed: no bye, nothing unlinked
  }
  ::close(up[1]);
  ::close(down[0]);
  std::optional<std::string> offer = ReadAll(up[0]);
  if (offer) WriteAll(down[1], server.AnswerOffer(peer, offer->data(), offer->size()));
  std::optional<std::string> n = ReadAll(up[0]);
  if (n) c.notice = *n;
  ::close(up[0]);
  ::close(down[1]);
  if (!offer || !n) {
    ::kill(c.pid, SIGKILL);
    ::waitpid(c.pid, nullptr, 0);
    c.pid = -1;
  }
  return c;
}

void Kill(ChildClient& c) {
  ::kill(c.pid, SIGKILL);
  ::waitpid(c.pid, nullptr, 0);
}

// A client killed between its offer and its notice: its segment (and the bells its offer
// opened) go within a sweep of the host removing the dead's names, not 30 s later.
TEST(ShmLinkTest, AClientKilledBeforeItsNoticeIsLetGoOnceItsNameIsRemoved) {
  ServerLinks server(/*enabled=*/true, kMin, /*messages=*/true);
  ChildClient child = StartChildClient(server, "socket-peer", /*notice=*/false, /*queue=*/false);
  ASSERT_GT(child.pid, 0);
  int64_t now = zmq_util::NowMs();
  server.Sweep(now);
  EXPECT_FALSE(server.empty()) << "a live client may be idle for long";
  Kill(child);
  ShmSegment::RemoveStale();
  server.Sweep(now += ServerLinks::kSweepMs);
  EXPECT_TRUE(server.empty()) << "a dead client's segment is let go once its name is removed";
}

// A client killed while its queue is read, after a message of its went on the socket
// without the pause that would let it be taken: what its queue held comes first, then what
// was held for the pause, then its link goes.
TEST(ShmLinkTest, AClientKilledWhileItsQueueIsReadHasWhatItSentTakenThenIsLetGo) {
  ServerLinks server(/*enabled=*/true, kMin, /*messages=*/true);
  ChildClient child = StartChildClient(server, "socket-peer", /*notice=*/true, /*queue=*/true);
  ASSERT_GT(child.pid, 0);
  ASSERT_FALSE(child.notice.empty());
  EXPECT_FALSE(server.OnNotice("socket-peer", "", child.notice.data(), child.notice.size()));
  Inbound on_socket{"socket-peer", {Pattern(8, 9)}, ""};
  ASSERT_TRUE(server.Hold(on_socket)) << "held until a pause";
  Kill(child);
  ShmSegment::RemoveStale();
  int64_t now = zmq_util::NowMs();
  server.Sweep(now);
  EXPECT_FALSE(server.empty()) << "its queue still holds a message";
  std::vector<Inbound> got = TakeAll(server);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(Same(got[0].message.at(0), Pattern(8, 7)));
  server.Sweep(now += ServerLinks::kSweepMs);
  got = TakeAll(server);
  ASSERT_EQ(got.size(), 1u) << "what it sent on the socket, once its queue is empty";
  EXPECT_TRUE(Same(got[0].message.at(0), Pattern(8, 9)));
  EXPECT_EQ(got[0].peer, "socket-peer");
  EXPECT_FALSE(server.empty());
  server.Sweep(now += ServerLinks::kSweepMs);
  EXPECT_TRUE(server.empty());
}

// A resend restamps a payload written in place, so a copy of the request still queued
// (for a shard that died before reading it, say) names a generation that is gone: the shard
// drops that copy instead of answering it with an error, and takes the resend.
TEST(ShmLinkTest, AnOlderCopyOfAResentRequestIsDroppedNotAnswered) {
  ClientLink client(kRing, kMin, "shard 0", /*messages=*/true);
  ServerLinks server(/*enabled=*/true, kMin, /*messages=*/true);
  ASSERT_FALSE(SwitchToQueue(client, server, "socket-peer").empty());
  std::optional<WritableFrame> w = client.Reserve(100'000);
  ASSERT_TRUE(w);
  Frame payload = Pattern(100'000, 9);
  std::memcpy(w->data, payload.data(), payload.size());
  const Message push = {Pattern(8, 1), w->frame};
  for (int send = 0; send < 2; ++send) {
    Result<bool> posted = client.Post(push, client.Place(push));
    ASSERT_TRUE(posted.ok() && *posted) << send;
  }
  std::vector<Inbound> got = TakeAll(server);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(Same(got[0].message.at(1), payload));
  EXPECT_EQ(server.stale_dropped(), 1u);
}

// A client that turns shared memory off while the shard reads its queue leaves a pause
// there, so that what it sends on the socket from then on is not held forever.
TEST(ShmLinkTest, AClientTurningOffLeavesAPauseSoItsSocketMessagesFlow) {
  ClientLink client(kRing, kMin, "shard 0", /*messages=*/true);
  ServerLinks server(/*enabled=*/true, kMin, /*messages=*/true);
  const std::string notice = SwitchToQueue(client, server, "socket-peer");
  ASSERT_FALSE(notice.empty());
  Result<bool> posted = client.Post({Pattern(8, 1)}, std::nullopt);
  ASSERT_TRUE(posted.ok() && *posted) << posted.status();
  // The shard that can no longer read it answers no (as to a notice); the client turns off.
  std::string no("\xffLSHMANS", 8);
  no += std::string(4, '\0');  // accepted: 0
  no += notice.substr(8, 8);   // the segment's token, as the notice gave it
  no += "cannot read it";
  client.OnAnswer(no.data(), no.size());
  EXPECT_FALSE(client.on());
  EXPECT_FALSE(client.messages());
  Inbound later{"socket-peer", {Pattern(8, 2)}, ""};
  std::vector<Inbound> got = TakeAll(server);
  EXPECT_FALSE(server.Hold(later)) << "paused with nothing held: taken at once";
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(Same(got[0].message.at(0), Pattern(8, 1)));
}

// A client that lends its frames (a primary to its backup): the shard reads them in place,
// where the client wrote them, on the socket path and the queue's alike; each frame's room
// comes back when the shard lets the frame go, never before, however long it holds it.
TEST(ShmLinkTest, ALendingClientsFramesAreReadInPlaceAndTheirRoomComesBackWhenLetGo) {
  ClientLink client(kRing, kMin, "backup", /*messages=*/true, /*lend=*/true);
  ServerLinks server(/*enabled=*/true, kMin, /*messages=*/true);
  server.set_lenders("*");
  Connect(client, server, "socket-peer");
  ASSERT_TRUE(client.on());
  const Frame payload = Pattern(200'000, 3);
  const Message request = {Pattern(64, 1), payload};
  Wire up = Carry(request, client.Place(request), 0);
  ASSERT_TRUE(up.trailer);
  EXPECT_FALSE(server.OnMessage("socket-peer", &*up.trailer, &up.message));
  ASSERT_TRUE(up.message[1].lent()) << "read in place, not copied out";
  EXPECT_TRUE(Same(up.message[1], payload));
  EXPECT_FALSE(up.message[1].finite_f32()) << "no copy checked it";
  EXPECT_EQ(server.frames_lent(), 1u);

  // Through the queue: the same.
  std::optional<std::string> notice = client.TakeNotice();
  ASSERT_TRUE(notice);
  EXPECT_FALSE(server.OnNotice("socket-peer", "", notice->data(), notice->size()));
  Result<bool> posted = client.Post(request, client.Place(request));
  ASSERT_TRUE(posted.ok() && *posted);
  std::vector<Inbound> got = TakeAll(server);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0].message.at(1).lent());
  EXPECT_TRUE(Same(got[0].message[1], payload));
  EXPECT_EQ(server.frames_lent(), 2u);
  up.message.clear();
  got.clear();

  // A ring of 1 MiB holds four such frames: while the shard holds two, the client finds
  // room for two more only, and for all four again once the shard let them go.
  const Frame big = Pattern(kRing / 5, 4);
  auto fill = [&] {
    std::vector<Frame> placed;
    while (true) {
      std::optional<Placement> p = client.Place({Pattern(8, 2), big});
      if (!p) break;
      Wire w = Carry({Pattern(8, 2), big}, p, 0);
      EXPECT_FALSE(server.OnMessage("socket-peer", &*w.trailer, &w.message));
      placed.push_back(w.message[1]);
    }
    return placed;
  };
  std::vector<Frame> held = fill();
  ASSERT_GE(held.size(), 3u);
  const size_t room = held.size();
  for (const Frame& f : held) EXPECT_TRUE(Same(f, big));
  held.resize(2);
  std::vector<Frame> more = fill();
  EXPECT_EQ(more.size(), room - 2) << "the two frames still held keep their room";
  for (const Frame& f : held) EXPECT_TRUE(Same(f, big)) << "bytes held are never overwritten";
  held.clear();
  more.clear();
  EXPECT_EQ(fill().size(), room);
}

// A lending client's reserved frame resent while the shard still holds the first send in
// place: the resend goes into other room (stamping it again would let the shard's release of
// the resend free bytes it still reads), and both read the same bytes.
TEST(ShmLinkTest, ALendingClientsResendOfAFrameTheShardStillHoldsGoesElsewhere) {
  ClientLink client(kRing, kMin, "backup", /*messages=*/false, /*lend=*/true);
  ServerLinks server(true, kMin);
  server.set_lenders("*");
  Connect(client, server, "peer");
  std::optional<WritableFrame> w = client.Reserve(100'000);
  ASSERT_TRUE(w);
  const Frame expected = Pattern(100'000, 7);
  std::memcpy(w->data, expected.data(), expected.size());
  const Message request = {Pattern(64, 1), w->frame};
  Wire first = Carry(request, client.Place(request), 0);
  ASSERT_TRUE(first.trailer);
  EXPECT_FALSE(server.OnMessage("peer", &*first.trailer, &first.message));
  ASSERT_TRUE(first.message[1].lent());
  Wire second = Carry(request, client.Place(request), 0);
  ASSERT_TRUE(second.trailer);
  EXPECT_NE(second.trailer->frames[0].second.offset, first.trailer->frames[0].second.offset);
  bool stale = false;
  EXPECT_FALSE(server.OnMessage("peer", &*second.trailer, &second.message, &stale));
  EXPECT_FALSE(stale);
  second.message.clear();  // the shard lets the resend go first
  EXPECT_TRUE(Same(first.message[1], expected));
  // Once the first is let go too, the frame is stamped in place again.
  first.message.clear();
  Wire third = Carry(request, client.Place(request), 0);
  ASSERT_TRUE(third.trailer);
  EXPECT_EQ(third.trailer->frames[0].second.offset, first.trailer->frames[0].second.offset);
}

// Only the clients a shard trusts with its state may lend (a lender could change a frame
// after the shard checked it): by default none, else those authenticated as the lenders'
// key. The others' frames are copied out as ever.
TEST(ShmLinkTest, OnlyTheLendersAShardNamesHaveTheirFramesReadInPlace) {
  const Message request = {Pattern(8, 1), Pattern(100'000, 2)};
  auto lent = [&](const std::string& lenders, const std::string& user) {
    ClientLink client(kRing, kMin, "shard", /*messages=*/false, /*lend=*/true);
    ServerLinks server(true, kMin);
    server.set_lenders(lenders);
    std::optional<std::string> offer = client.Offer();
    EXPECT_TRUE(offer);
    if (!offer) return false;
    std::string answer = server.AnswerOffer("peer", offer->data(), offer->size(), user);
    client.OnAnswer(answer.data(), answer.size());
    EXPECT_TRUE(client.on());
    Wire up = Carry(request, client.Place(request), 0);
    EXPECT_TRUE(up.trailer);
    if (!up.trailer) return false;
    EXPECT_FALSE(server.OnMessage("peer", &*up.trailer, &up.message));
    EXPECT_TRUE(Same(up.message[1], request[1]));
    EXPECT_EQ(server.frames_lent(), up.message[1].lent() ? 1u : 0u);
    return up.message[1].lent();
  };
  EXPECT_FALSE(lent("", ""));
  EXPECT_FALSE(lent("", "replica"));
  EXPECT_FALSE(lent("replica", "worker"));
  EXPECT_FALSE(lent("replica", ""));
  EXPECT_TRUE(lent("replica", "replica"));
  EXPECT_TRUE(lent("*", ""));
}

// A shard that borrows all (a replicated primary, ZmqOptions::shm_borrow_all) reads the
// frames of clients that do not lend in place too, marked unstable (their client may still
// change them: nothing may take them as checked) and holding their room until let go; a
// lender's frames stay lent and stable; without it they are copied out and checked.
TEST(ShmLinkTest, AShardBorrowingAllReadsOtherClientsFramesInPlaceAsUnstable) {
  std::vector<float> values(50'000, 0.5f);
  const Frame payload = Frame::Copy(values.data(), values.size() * sizeof(float));
  const Message request = {Pattern(8, 1), payload};
  struct Got {
    bool lent, unstable, finite;
  };
  auto take = [&](bool borrow_all, bool lend) {
    ClientLink client(kRing, kMin, "shard", /*messages=*/true, lend);
    ServerLinks server(true, kMin, /*messages=*/true);
    server.set_lenders("*");
    server.set_borrow_all(borrow_all);
    Connect(client, server, "peer");
    EXPECT_TRUE(client.on());
    Wire up = Carry(request, client.Place(request), 0);
    EXPECT_TRUE(up.trailer);
    if (!up.trailer) return Got{};
    EXPECT_FALSE(server.OnMessage("peer", &*up.trailer, &up.message));
    EXPECT_TRUE(Same(up.message[1], payload));
    // Through the queue: the same.
    std::optional<std::string> notice = client.TakeNotice();
    EXPECT_TRUE(notice);
    if (!notice) return Got{};
    EXPECT_FALSE(server.OnNotice("peer", "", notice->data(), notice->size()));
    Result<bool> posted = client.Post(request, client.Place(request));
    EXPECT_TRUE(posted.ok() && *posted);
    std::vector<Inbound> got = TakeAll(server);
    EXPECT_EQ(got.size(), 1u);
    if (got.size() != 1) return Got{};
    EXPECT_TRUE(Same(got[0].message.at(1), payload));
    EXPECT_EQ(got[0].message[1].unstable(), up.message[1].unstable());
    EXPECT_EQ(server.frames_lent(), lend ? 2u : 0u) << "counted as lent: a lender's frames only";
    const Frame f = up.message[1];
    if (f.unstable()) {
      // A copy of an unstable frame is not taken as checked, even by a checking copy.
      std::vector<float> dst(values.size());
      EXPECT_FALSE(Frame::CopyToCheckingFinite(f, dst.data()).finite_f32());
      EXPECT_FALSE(Frame::CopiedCheckingFinite(f, true).finite_f32());
      EXPECT_FALSE(Frame::LentFinite(f).finite_f32());
      EXPECT_EQ(dst, values);
      // Its room is the client's again once the shard lets go: a ring of 1 MiB holds five
      // 200 KB frames, four while the shard holds these two.
      const Frame big = Pattern(kRing / 5, 4);
      auto fill = [&] {
        std::vector<Frame> placed;  // held by the shard until the end of the fill
        while (auto p = client.Place({Pattern(8, 2), big})) {
          Wire w = Carry({Pattern(8, 2), big}, p, 0);
          EXPECT_FALSE(server.OnMessage("peer", &*w.trailer, &w.message));
          placed.push_back(w.message[1]);
        }
        return placed.size();
      };
      const size_t while_held = fill();
      up.message.clear();
      got.clear();
      EXPECT_GT(fill(), while_held);
    }
    return Got{f.lent(), f.unstable(), f.finite_f32()};
  };
  Got copied = take(/*borrow_all=*/false, /*lend=*/false);
  EXPECT_FALSE(copied.lent);
  EXPECT_FALSE(copied.unstable);
  EXPECT_TRUE(copied.finite) << "copied out and checked on receipt";
  Got borrowed = take(/*borrow_all=*/true, /*lend=*/false);
  EXPECT_TRUE(borrowed.lent);
  EXPECT_TRUE(borrowed.unstable);
  EXPECT_FALSE(borrowed.finite);
  Got lent = take(/*borrow_all=*/true, /*lend=*/true);
  EXPECT_TRUE(lent.lent);
  EXPECT_FALSE(lent.unstable) << "a lender's frames stay as they were";
}

// Renew (a restarted shard held frames in place): a new segment offered afresh; until it is
// answered frames go through the socket.
TEST(ShmLinkTest, ALendingClientRenewedOffersANewSegment) {
  ClientLink client(kRing, kMin, "backup", /*messages=*/false, /*lend=*/true);
  ServerLinks server(true, kMin);
  server.set_lenders("*");
  Connect(client, server, "peer");
  std::optional<std::string> before = client.Offer();
  EXPECT_FALSE(before);
  client.Renew();
  EXPECT_FALSE(client.on());
  EXPECT_FALSE(client.Place({Pattern(8, 1), Pattern(100'000, 2)}));
  std::optional<std::string> offer = client.Offer();
  ASSERT_TRUE(offer);
  Connect(client, server, "peer");
  ASSERT_TRUE(client.on());
  const Message request = {Pattern(8, 1), Pattern(100'000, 2)};
  Wire up = Carry(request, client.Place(request), 0);
  ASSERT_TRUE(up.trailer);
  EXPECT_FALSE(server.OnMessage("peer", &*up.trailer, &up.message));
  EXPECT_TRUE(up.message[1].lent());
  EXPECT_TRUE(Same(up.message[1], request[1]));
}

}  // namespace
}  // namespace leash::shm
