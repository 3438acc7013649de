// Unit tests of leash::Client against real shards on the in-memory transport
// (tests/support/memory_cluster.h): pushes and pulls across shards, resends after a shard
// restart and after lost messages, exactly-once pushes under duplicated messages, parked
// pulls released by the slowest worker's clock, rejoining after an eviction, and
// heartbeats across a long step. Waits are for events (a future, a shard's state), never
// for a duration, except where a test needs time to pass (a long step).
#include "leash/worker/client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <variant>
#include <vector>

#include "leash/common/partition.h"
#include "leash/common/wire.h"
#include "support/memory_cluster.h"

namespace leash {
namespace {

using namespace std::chrono_literals;
using testing::Direction;
using testing::Faults;
using testing::MemoryCluster;
using testing::Packet;
using testing::Verdict;

TableSpec SparseTable(const std::string& name, uint32_t dim);

ClientOptions Worker(const std::string& name, uint64_t id) {
  ClientOptions o;
  o.name = name;
  o.worker_id = id;
  o.connect_timeout_ms = 20000;
  o.shard_silence_ms = 200;  // lost messages are resent quickly
  o.heartbeat_ms = 50;       // and a silent shard is noticed after 200 ms, not 2.5 s
  return o;
}

TableSpec Table(const std::string& name, uint64_t rows, uint32_t cols) {
  TableSpec t;
  t.name = name;
  t.rows = rows;
  t.cols = cols;
  t.optimizer.lr = 1.f;  // SGD: a pushed gradient g moves a value by -g
  return t;
}

std::unique_ptr<Client> MustConnect(MemoryCluster& cluster, ClientOptions o) {
  auto c = cluster.Connect(std::move(o));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// Pushes `g` everywhere, ends the iteration, and waits for both.
void PushAndClock(Client& c, const TableHandle& t, float g) {
  std::vector<float> grad(t.size(), g);
  Future push = c.Push(t, grad.data());
  Future clock = c.Clock();
  ASSERT_TRUE(push.get().ok()) << push.get();
  ASSERT_TRUE(clock.get().ok()) << clock.get();
}

std::vector<float> PullAll(Client& c, const TableHandle& t) {
  std::vector<float> v(t.size(), 12345.f);
  Status st = c.Pull(t, v.data()).get();
  EXPECT_TRUE(st.ok()) << st;
  return v;
}

void ExpectAll(const std::vector<float>& v, float x) {
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], x) << "value " << i;
}

TEST(ClientTest, PullsReadWhatPushesAppliedOnEveryShard) {
  MemoryCluster cluster(3);
  auto c = MustConnect(cluster, Worker("w", 1));
  ASSERT_TRUE(c);
  auto t = c->CreateTable(Table("t", 10, 3));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->shard_ids.size(), 3u);
  PushAndClock(*c, *t, 0.5f);
  PushAndClock(*c, *t, 0.25f);
  ExpectAll(PullAll(*c, *t), -0.75f);
  EXPECT_EQ(c->clock(), 2);
  std::vector<uint64_t> keys = {9, 0, 4};
  std::vector<float> rows(keys.size() * 3);
  ASSERT_TRUE(c->Pull(*t, keys, rows.data()).get().ok());
  ExpectAll(rows, -0.75f);
}

// PullInPlace reads what Pull reads, a piece per shard in row order. On this transport the
// replies' frames are the shard's memory, so a float32 wire copies nothing and the pieces
// keep the values they were pulled with while later pushes change the table; a 16-bit wire
// widens them into pieces of their own.
TEST(ClientTest, APullInPlaceReadsWhatAPullReadsWithoutCopyingAFloat32Wire) {
  for (DType wire : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(wire == DType::kF32 ? "float32 wire" : "bfloat16 wire");
    MemoryCluster cluster(3);
    ClientOptions o = Worker("w", 1);
    o.wire_dtype = wire;
    auto c = MustConnect(cluster, o);
    ASSERT_TRUE(c);
    auto t = c->CreateTable(Table("t", 10, 3));
    ASSERT_TRUE(t.ok()) << t.status();
    PushAndClock(*c, *t, 0.5f);
    PulledValues v;
    EXPECT_EQ(v.size(), 0u);
    ASSERT_TRUE(c->PullInPlace(*t, &v).get().ok());
    ASSERT_EQ(v.size(), 30u);
    ASSERT_EQ(v.pieces().size(), 3u);  // rows 0-3, 4-6, 7-9
    size_t next = 0;
    for (const PulledValues::Piece& p : v.pieces()) {
      EXPECT_EQ(p.offset, next);
      next += p.values.size();
    }
    EXPECT_EQ(next, 30u);
    EXPECT_TRUE(v.contiguous().empty());  // three pieces
    EXPECT_EQ(v.copied_bytes(), wire == DType::kF32 ? 0u : 30 * sizeof(float));
    std::vector<float> got(30, 7.f);
    v.CopyTo(got.data());
    ExpectAll(got, -0.5f);
    EXPECT_EQ(got, PullAll(*c, *t));
    // A later push changes the table, not the pieces pulled before it.
    PushAndClock(*c, *t, 0.25f);
    ExpectAll(PullAll(*c, *t), -0.75f);
    for (const PulledValues::Piece& p : v.pieces()) {
      for (float x : p.values) ASSERT_EQ(x, -0.5f);
    }
    // A table on one shard comes in one piece.
    auto one = c->CreateTable(Table("one", 1, 5));
    ASSERT_TRUE(one.ok()) << one.status();
    PulledValues w;
    ASSERT_TRUE(c->PullInPlace(*one, &w).get().ok());
    ASSERT_EQ(w.contiguous().size(), 5u);
    for (float x : w.contiguous()) EXPECT_EQ(x, 0.f);
  }
}

TEST(ClientTest, RequestsLostToAShardRestartAreResentAndAnswered) {
  MemoryCluster cluster(2);
  auto c = MustConnect(cluster, Worker("w", 1));
  ASSERT_TRUE(c);
  auto t = c->CreateTable(Table("t", 8, 2));
  ASSERT_TRUE(t.ok()) << t.status();
  PushAndClock(*c, *t, 1.f);
  cluster.Stop(1);  // its snapshot holds the push and the clock
  std::vector<float> grad(t->size(), 2.f);
  Future push = c->Push(*t, grad.data());  // shard 1's part is lost
  Future clock = c->Clock();
  cluster.Start(1);
  ASSERT_TRUE(push.get().ok()) << push.get();
  ASSERT_TRUE(clock.get().ok()) << clock.get();
  ExpectAll(PullAll(*c, *t), -3.f);
  EXPECT_GT(c->counters().resends, 0u);
}

TEST(ClientTest, DuplicatedMessagesApplyEachPushExactlyOnce) {
  MemoryCluster cluster(2);
  cluster.network().AddRule([](const Packet&) { return Verdict{Verdict::kDuplicate}; });
  auto c = MustConnect(cluster, Worker("w", 1));
  ASSERT_TRUE(c);
  auto t = c->CreateTable(Table("t", 6, 4));
  ASSERT_TRUE(t.ok()) << t.status();
  for (int i = 0; i < 5; ++i) PushAndClock(*c, *t, 1.f);
  ExpectAll(PullAll(*c, *t), -5.f);
  EXPECT_TRUE(cluster.WaitFor(0, [](const MemoryCluster::View& v) {
    return v.counters.pushes_duplicate >= 5;
  })) << "the shard saw the copies and skipped them";
  EXPECT_GT(cluster.network().stats().duplicated, 0u);
}

// Once `cut` is set, every reply on the next connection a client uses to shard `shard` is
// lost (its requests still reach the shard): the client finds the shard silent, reconnects
// and resends.
void LoseRepliesOnTheNextConnection(MemoryCluster& cluster, int shard, std::atomic<bool>& cut) {
  auto lost = std::make_shared<PeerId>();  // touched by the rule only
  cluster.network().AddRule([&cut, lost, shard](const Packet& p) -> std::optional<Verdict> {
    if (cut.load() && lost->empty() && p.direction == Direction::kToShard &&
        p.address == MemoryCluster::Address(shard)) {
      *lost = p.peer;
    }
    if (!lost->empty() && p.direction == Direction::kToClient && p.peer == *lost) {
      return Verdict{Verdict::kDrop};
    }
    return std::nullopt;
  });
}

// Replies on the connection to shard 1 are lost (requests still reach the shard): the
// client finds the shard silent, reconnects, resends, and the shard skips the push it
// has already applied.
TEST(ClientTest, APushWhoseReplyWasLostIsResentAndAppliedOnce) {
  MemoryCluster cluster(2);
  std::atomic<bool> cut{false};
  LoseRepliesOnTheNextConnection(cluster, 1, cut);
  auto c = MustConnect(cluster, Worker("w", 1));
  ASSERT_TRUE(c);
  auto t = c->CreateTable(Table("t", 4, 4));
  ASSERT_TRUE(t.ok()) << t.status();
  cut.store(true);
  PushAndClock(*c, *t, 1.f);
  ExpectAll(PullAll(*c, *t), -1.f);
  EXPECT_GT(c->counters().resends, 0u);
  EXPECT_GT(cluster.network().stats().dropped, 0u);
  EXPECT_TRUE(cluster.WaitFor(1, [](const MemoryCluster::View& v) {
    return v.counters.pushes_duplicate >= 1;
  })) << "the resent push reached shard 1, which had applied it";
}

TEST(ClientTest, APullParkedBehindTheSlowestWorkerIsAnsweredWhenItClocks) {
  MemoryCluster cluster(1);
  auto fast = MustConnect(cluster, Worker("fast", 1));
  auto slow = MustConnect(cluster, Worker("slow", 2));
  ASSERT_TRUE(fast && slow);
  auto t = fast->CreateTable(Table("t", 4, 1));
  ASSERT_TRUE(t.ok()) << t.status();
  auto ts = slow->CreateTable(Table("t", 4, 1));
  ASSERT_TRUE(ts.ok()) << ts.status();
  PushAndClock(*fast, *t, 1.f);  // fast is at clock 1, slow at 0: pulls for 1 wait (s = 0)
  std::vector<float> v(t->size(), 0.f);
  Future pull = fast->Pull(*t, v.data());
  ASSERT_TRUE(cluster.WaitFor(0, [](const MemoryCluster::View& s) { return s.parked_pulls == 1; }));
  EXPECT_FALSE(pull.ready());
  PushAndClock(*slow, *ts, 2.f);
  ASSERT_TRUE(pull.get().ok()) << pull.get();
  ExpectAll(v, -3.f);  // it waited for the slow worker's push too
}

TEST(ClientTest, AnEvictedWorkerIsToldToRejoinAndWorksAfterRejoining) {
  server::ShardOptions o;
  o.lease_ms = 60'000;
  MemoryCluster cluster(2, o);
  std::atomic<bool> cut{false};
  // Requests (heartbeats) are lost while `cut`; replies on their way still arrive (a
  // reply lost on a live connection is never asked for again).
  cluster.network().AddRule([&cut](const Packet& p) -> std::optional<Verdict> {
    if (cut.load() && p.direction == Direction::kToShard) return Verdict{Verdict::kDrop};
    return std::nullopt;
  });
  auto c = MustConnect(cluster, Worker("w", 1));
  ASSERT_TRUE(c);
  auto t = c->CreateTable(Table("t", 6, 2));
  ASSERT_TRUE(t.ok()) << t.status();
  PushAndClock(*c, *t, 1.f);
  cut.store(true);  // heartbeats go nowhere while the lease runs out
  ASSERT_TRUE(cluster.AdvanceUntil(1, 61'000, [](const MemoryCluster::View& v) {
    return v.counters.evictions == 1;
  })) << "the lease ran out";
  cut.store(false);
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!c->needs_rejoin() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(2ms);
  ASSERT_TRUE(c->needs_rejoin()) << "a heartbeat to shard 1 was refused";
  uint64_t before = c->incarnation();
  ASSERT_TRUE(c->Rejoin().ok());
  EXPECT_FALSE(c->needs_rejoin());
  EXPECT_GT(c->incarnation(), before);
  PushAndClock(*c, *t, 1.f);
  ExpectAll(PullAll(*c, *t), -2.f);
}

TEST(ClientTest, HeartbeatsKeepAWorkerAliveThroughAStepLongerThanItsLease) {
  server::ShardOptions o;
  o.lease_ms = 200;
  MemoryCluster cluster(2, o);
  auto c = MustConnect(cluster, Worker("w", 1));
  ASSERT_TRUE(c);
  auto t = c->CreateTable(Table("t", 4, 2));
  ASSERT_TRUE(t.ok()) << t.status();
  PushAndClock(*c, *t, 1.f);
  std::this_thread::sleep_for(1500ms);  // a long compute step: over seven leases
  PushAndClock(*c, *t, 1.f);
  ExpectAll(PullAll(*c, *t), -2.f);
  EXPECT_FALSE(c->needs_rejoin());
  EXPECT_EQ(cluster.view(0).counters.evictions, 0u);
  EXPECT_EQ(cluster.view(1).counters.evictions, 0u);
}

TEST(ClientTest, HeldRequestsGoOutAsOneMessagePerShardWhenFlushed) {
  MemoryCluster cluster(2);
  auto c = MustConnect(cluster, Worker("w", 1));
  ASSERT_TRUE(c);
  auto a = c->CreateTable(Table("a", 64, 8));  // 1 KiB of gradient per shard
  auto b = c->CreateTable(Table("b", 64, 8));
  ASSERT_TRUE(a.ok() && b.ok());
  std::atomic<int> large{0};  // messages to shards bigger than a heartbeat
  cluster.network().AddRule([&large](const Packet& p) -> std::optional<Verdict> {
    size_t bytes = 0;
    for (const Frame& f : *p.message) bytes += f.size();
    if (p.direction == Direction::kToShard && bytes > 1000) ++large;
    return std::nullopt;
  });
  std::vector<float> grad(a->size(), 1.f);
  c->HoldSends();
  Future pa = c->Push(*a, grad.data());
  Future pb = c->Push(*b, grad.data());
  Future clock = c->Clock();
  EXPECT_EQ(large.load(), 0) << "nothing sent while held";
  c->FlushSends();
  ASSERT_TRUE(pa.get().ok() && pb.get().ok() && clock.get().ok());
  EXPECT_EQ(large.load(), 2) << "one batch per shard";
  ExpectAll(PullAll(*c, *a), -1.f);
}

// Counts the frames sent to shards whose bytes lie inside [begin, end).
std::shared_ptr<std::atomic<int>> CountFramesFrom(MemoryCluster& cluster, const void* begin,
                                                  const void* end) {
  auto count = std::make_shared<std::atomic<int>>(0);
  const auto* b = static_cast<const uint8_t*>(begin);
  const auto* e = static_cast<const uint8_t*>(end);
  cluster.network().AddRule([count, b, e](const Packet& p) -> std::optional<Verdict> {
    if (p.direction != Direction::kToShard) return std::nullopt;
    for (const Frame& f : *p.message) {
      if (!f.empty() && f.data() >= b && f.data() + f.size() <= e) ++*count;
    }
    return std::nullopt;
  });
  return count;
}

// A gradient handed over with its owner travels as the caller's own floats (no copy), one
// frame per shard; the owner is released once every shard has answered. The plain Push
// copies: no frame refers to the caller's buffer.
TEST(ClientTest, AnOwnedGradientIsSentFromTheCallersFloatsAndReleasedOnceAnswered) {
  MemoryCluster cluster(2);
  auto c = MustConnect(cluster, Worker("w", 1));
  ASSERT_TRUE(c);
  auto t = c->CreateTable(Table("t", 8, 1000));  // 16 KB of gradient per shard
  ASSERT_TRUE(t.ok()) << t.status();
  auto floats = std::make_shared<std::vector<float>>(t->size(), 0.25f);
  std::shared_ptr<const float> grad(floats, floats->data());
  const float* begin = floats->data();
  auto from_buffer = CountFramesFrom(cluster, begin, begin + floats->size());
  std::weak_ptr<const float> held = grad;
  floats.reset();
  Future push = c->Push(*t, std::move(grad));
  ASSERT_TRUE(push.get().ok()) << push.get();
  ASSERT_TRUE(c->Clock().get().ok());
  EXPECT_EQ(from_buffer->load(), 2) << "one frame of the caller's floats per shard";
  ExpectAll(PullAll(*c, *t), -0.25f);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!held.expired() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(held.expired()) << "the client still holds the gradient after both answers";

  std::vector<float> copied(t->size(), 0.25f);
  auto from_copied = CountFramesFrom(cluster, copied.data(), copied.data() + copied.size());
  ASSERT_TRUE(c->Push(*t, copied.data()).get().ok());
  EXPECT_EQ(from_copied->load(), 0) << "Push(const float*) sends a copy";
  ExpectAll(PullAll(*c, *t), -0.5f);
}

// A push whose answer is lost is resent from the same floats (the client kept them, the
// caller did not), and the shard applies it once; then the floats are released.
TEST(ClientTest, AnOwnedGradientIsResentFromTheSameFloatsAndAppliedOnce) {
  MemoryCluster cluster(2);
  std::atomic<bool> cut{false};
  LoseRepliesOnTheNextConnection(cluster, 1, cut);
  auto c = MustConnect(cluster, Worker("w", 1));
  ASSERT_TRUE(c);
  auto t = c->CreateTable(Table("t", 8, 1000));
  ASSERT_TRUE(t.ok()) << t.status();
  auto floats = std::make_shared<const std::vector<float>>(t->size(), 1.f);
  const float* begin = floats->data();
  auto from_buffer = CountFramesFrom(cluster, begin, begin + floats->size());
  std::weak_ptr<const float> held = std::shared_ptr<const float>(floats, begin);
  cut.store(true);
  Future push = c->Push(*t, std::shared_ptr<const float>(floats, begin));
  floats.reset();  // from here only the client holds the gradient
  ASSERT_TRUE(push.get().ok()) << push.get();
  EXPECT_GT(c->counters().resends, 0u);
  EXPECT_GE(from_buffer->load(), 3) << "shard 0's frame, shard 1's, and shard 1's resend";
  ASSERT_TRUE(c->Clock().get().ok());
  ExpectAll(PullAll(*c, *t), -1.f);
  EXPECT_TRUE(cluster.WaitFor(1, [](const MemoryCluster::View& v) {
    return v.counters.pushes_duplicate >= 1;
  })) << "the resent push reached shard 1, which had applied it";
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!held.expired() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(held.expired()) << "the client still holds the gradient after both answers";
}

// A 16-bit wire converts the owned floats (the caller's bytes are not the wire's), with the
// same result; a null gradient is refused by name.
TEST(ClientTest, AnOwnedGradientOnA16BitWireIsConvertedAndANullOneRefused) {
  MemoryCluster cluster(1);
  ClientOptions o = Worker("w", 1);
  o.wire_dtype = DType::kF16;
  auto c = MustConnect(cluster, o);
  ASSERT_TRUE(c);
  auto t = c->CreateTable(Table("t", 4, 1000));
  ASSERT_TRUE(t.ok()) << t.status();
  auto floats = std::make_shared<const std::vector<float>>(t->size(), 0.5f);
  auto from_buffer = CountFramesFrom(cluster, floats->data(), floats->data() + floats->size());
  ASSERT_TRUE(c->Push(*t, std::shared_ptr<const float>(floats, floats->data())).get().ok());
  EXPECT_EQ(from_buffer->load(), 0);
  ExpectAll(PullAll(*c, *t), -0.5f);
  Status null = c->Push(*t, std::shared_ptr<const float>()).get();
  EXPECT_EQ(null.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(null.message().find("'t'"), std::string::npos) << null;
}

TableSpec SparseTable(const std::string& name, uint32_t dim) {
  TableSpec t;
  t.name = name;
  t.kind = TableKind::kSparse;
  t.cols = dim;
  t.optimizer.lr = 1.f;  // SGD: a pushed gradient g moves a value by -g
  t.init.kind = InitKind::kConstant;
  t.init.scale = 0.5f;
  return t;
}

// Keys spread over three shards, some named twice in one request: a pull returns the same
// row at every position of its key, a push sums a key's gradients on the worker, and the
// rows read back are exactly what the pushes made of them.
TEST(ClientTest, SparsePullsAndPushesRouteByKeyAndMergeRepeatedKeys) {
  MemoryCluster cluster(3);
  auto c = MustConnect(cluster, Worker("w", 1));
  ASSERT_TRUE(c);
  auto t = c->CreateTable(SparseTable("emb", 2));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->kind, TableKind::kSparse);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 40; ++k) keys.push_back(k * 0x9e3779b97f4a7c15ULL);
  std::vector<int> per_shard(3, 0);
  for (uint64_t k : keys) ++per_shard[static_cast<size_t>(SparseOwner(k, 3))];
  for (int n : per_shard) ASSERT_GT(n, 0) << "the keys must reach every shard";

  std::vector<uint64_t> twice = keys;
  twice.insert(twice.end(), keys.begin(), keys.begin() + 10);  // the first 10 keys twice
  std::vector<float> rows(twice.size() * 2, -1.f);
  ASSERT_TRUE(c->PullSparse(*t, twice, rows.data()).get().ok());
  ExpectAll(rows, 0.5f);  // created by the initializer

  std::vector<float> grad(twice.size() * 2);
  for (size_t i = 0; i < twice.size(); ++i) {
    grad[2 * i] = static_cast<float>(i % 40);  // a key's two rows: i and i + 40
    grad[2 * i + 1] = 1.f;
  }
  Future push = c->PushSparse(*t, twice, grad.data());
  ASSERT_TRUE(push.get().ok()) << push.get();
  ASSERT_TRUE(c->Clock().get().ok());
  ASSERT_TRUE(c->PullSparse(*t, twice, rows.data()).get().ok());
  for (size_t i = 0; i < twice.size(); ++i) {
    size_t k = i % 40;
    float times = k < 10 ? 2.f : 1.f;  // the gradients of a repeated key were summed
    EXPECT_EQ(rows[2 * i], 0.5f - times * static_cast<float>(k)) << "key position " << i;
    EXPECT_EQ(rows[2 * i + 1], 0.5f - times) << "key position " << i;
  }
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  uint64_t rows_held = 0;
  for (const ShardStats& s : *stats) {
    for (const auto& ts : s.tables) {
      if (ts.name == "emb") rows_held += ts.local_rows;
    }
  }
  EXPECT_EQ(rows_held, 40u) << "each key has one row, on one shard";
}

TEST(ClientTest, DenseAndSparseCallsRefuseTheOtherKindOfTable) {
  MemoryCluster cluster(2);
  auto c = MustConnect(cluster, Worker("w", 1));
  ASSERT_TRUE(c);
  auto sparse = c->CreateTable(SparseTable("emb", 4));
  auto dense = c->CreateTable(Table("fc", 4, 4));
  ASSERT_TRUE(sparse.ok() && dense.ok());
  std::vector<uint64_t> keys = {1, 2};
  std::vector<float> buf(16);
  Status st = c->Pull(*sparse, buf.data()).get();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("PullSparse"), std::string::npos) << st;
  EXPECT_EQ(c->Push(*sparse, keys, buf.data()).get().code(), StatusCode::kInvalidArgument);
  st = c->PullSparse(*dense, keys, buf.data()).get();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("dense"), std::string::npos) << st;
  EXPECT_EQ(c->PushSparse(*dense, keys, buf.data()).get().code(), StatusCode::kInvalidArgument);
  // PullInPlace: a dense call too, and it needs somewhere to put the values.
  PulledValues v;
  st = c->PullInPlace(*sparse, &v).get();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("PullSparse"), std::string::npos) << st;
  st = c->PullInPlace(*dense, nullptr).get();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'fc'"), std::string::npos) << st;
}

TEST(ClientTest, DuplicatedMessagesApplyEachSparsePushExactlyOnce) {
  MemoryCluster cluster(2);
  cluster.network().AddRule([](const Packet&) { return Verdict{Verdict::kDuplicate}; });
  auto c = MustConnect(cluster, Worker("w", 1));
  ASSERT_TRUE(c);
  auto t = c->CreateTable(SparseTable("emb", 3));
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<uint64_t> keys = {7, 1ull << 40, 99, 12345678901ull};
  std::vector<float> rows(keys.size() * 3);
  ASSERT_TRUE(c->PullSparse(*t, keys, rows.data()).get().ok());
  std::vector<float> grad(rows.size(), 1.f);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(c->PushSparse(*t, keys, grad.data()).get().ok());
    ASSERT_TRUE(c->Clock().get().ok());
  }
  ASSERT_TRUE(c->PullSparse(*t, keys, rows.data()).get().ok());
  ExpectAll(rows, 0.5f - 5.f);
  EXPECT_GT(cluster.network().stats().duplicated, 0u);
}

// A replica driven by the test on the in-memory network: with `answers_basics` it answers
// registrations (as the only shard of one) and heartbeats itself, as a primary; every other
// request it keeps for the test (a backup's heartbeats too).
class FakeReplica {
 public:
  struct Got {
    PeerId peer;
    uint64_t rid = 0;
    Request request;
  };

  FakeReplica(testing::MemoryNetwork& network, const std::string& address, bool answers_basics)
      : transport_(network.Bind(address)), answers_basics_(answers_basics) {
    thread_ = std::thread([this] { Run(); });
  }
  ~FakeReplica() {
    stop_.store(true);
    transport_->Wake();
    thread_.join();
  }

  // The next request of type T that came (taken from what is kept) whose request id `want`
  // accepts (null: any), or nullopt after `timeout`.
  template <typename T>
  std::optional<Got> Next(const std::function<bool(uint64_t)>& want = nullptr,
                          std::chrono::milliseconds timeout = 20s) {
    std::unique_lock<std::mutex> lock(mu_);
    std::optional<Got> found;
    cv_.wait_for(lock, timeout, [&] {
      for (auto it = got_.begin(); it != got_.end(); ++it) {
        if (std::holds_alternative<T>(it->request) && (!want || want(it->rid))) {
          found = std::move(*it);
          got_.erase(it);
          return true;
        }
      }
      return false;
    });
    return found;
  }

  void Send(const PeerId& peer, uint64_t rid, const Reply& reply,
            std::vector<Frame> payloads = {}) {
    ASSERT_TRUE(transport_->Send(peer, EncodeReply(rid, reply, std::move(payloads))).ok());
  }
  // `replies` (request id, reply) as one batch.
  void SendBatch(const PeerId& peer, const std::vector<std::pair<uint64_t, Reply>>& replies) {
    std::vector<Message> parts;
    for (const auto& [rid, reply] : replies) parts.push_back(EncodeReply(rid, reply));
    ASSERT_TRUE(transport_->Send(peer, PackBatch(std::move(parts))).ok());
  }

 private:
  void Run() {
    while (!stop_.load()) {
      auto in = transport_->Receive(20ms);
      if (!in.ok() || !in->has_value()) continue;
      if (IsBatch((*in)->message)) {
        auto parts = UnpackBatch((*in)->message);
        if (parts.ok()) {
          for (const Message& m : *parts) Handle((*in)->peer, m);
        }
        continue;
      }
      Handle((*in)->peer, (*in)->message);
    }
  }

  void Handle(const PeerId& peer, const Message& message) {
    auto req = DecodeRequest(message);
    if (!req.ok()) return;
    if (answers_basics_ && std::holds_alternative<RegisterRequest>(req->value)) {
      Welcome w;
      w.lease_ms = 10000;
      w.boot_id = 77;
      (void)transport_->Send(peer, EncodeReply(req->request_id, w));
      return;
    }
    if (answers_basics_ && std::holds_alternative<HeartbeatRequest>(req->value)) {
      (void)transport_->Send(peer, EncodeReply(req->request_id, HeartbeatReply{0, 77}));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    got_.push_back({peer, req->request_id, req->value});
    cv_.notify_all();
  }

  std::unique_ptr<ServerTransport> transport_;
  const bool answers_basics_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Got> got_;  // under mu_
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A directory whose view the test sets.
class FakeDirectory final : public ShardDirectory {
 public:
  explicit FakeDirectory(ClusterView view) : view_(std::move(view)) {}
  Result<ClusterView> View() override {
    std::lock_guard<std::mutex> lock(mu_);
    return view_;
  }
  Result<ClusterView> WaitForChange(int64_t after_revision,
                                    std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return view_.revision != after_revision; });
    return view_;
  }
  void Set(ClusterView view) {
    std::lock_guard<std::mutex> lock(mu_);
    view.revision = view_.revision + 1;
    view_ = std::move(view);
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  ClusterView view_;  // under mu_
};

// The future's result, or DeadlineExceeded if it is not ready within 20 s (a reply that
// never comes fails the test instead of hanging it).
Status Within20s(const Future& f) {
  if (f.wait_for(20s) != std::future_status::ready) return DeadlineExceeded("no reply in 20 s");
  return f.get();
}

// One shard of two replicas: the primary at "p" and, in sync with it, a backup at "b" that
// answers pushes and clocks (ReplicaAddress::answers) unless `answering` is false.
ClusterView ChainView(bool answering) {
  ShardView sv;
  sv.term = 1;
  sv.primary = ReplicaAddress{0, "p", 1, false};
  sv.live = {*sv.primary, ReplicaAddress{1, "b", 2, true}};
  sv.in_sync = answering ? std::vector<uint32_t>{0, 1} : std::vector<uint32_t>{0};
  ClusterView view;
  view.num_shards = 1;
  view.replicas = 2;
  view.shards = {sv};
  view.revision = 1;
  return view;
}

// With a backup that answers pushes and clocks itself (--backup-answers), the client connects
// to it, introduces itself with a heartbeat, and takes those replies from it: a push the
// primary never answers completes; the backup's reply to a pull is ignored (only the primary
// answers pulls); a push the backup leaves unanswered goes to the primary again; and once
// the backup no longer answers, what is pending goes to the primary at once.
TEST(ClientTest, AnAnsweringBackupsRepliesCompletePushesAndClocksAndTheSilentOnesAreResent) {
  testing::MemoryNetwork network;
  FakeReplica primary(network, "p", /*answers_basics=*/true);
  FakeReplica backup(network, "b", /*answers_basics=*/false);
  auto directory = std::make_shared<FakeDirectory>(ChainView(true));
  ClientOptions o = Worker("w", 1);
  o.heartbeat_ms = 20;  // the safety net resends after max(4 heartbeats, 1 s)
  o.directory = directory;
  o.directory_view = ChainView(true);
  auto connected = Client::Connect(network.Connect({"p"}), o);
  ASSERT_TRUE(connected.ok()) << connected.status();
  Client& c = **connected;

  // The backup learns the worker's connection from an untracked heartbeat.
  auto hb = backup.Next<HeartbeatRequest>();
  ASSERT_TRUE(hb);
  EXPECT_EQ(std::get<HeartbeatRequest>(hb->request).worker_id, 1u);
  EXPECT_EQ(std::get<HeartbeatRequest>(hb->request).incarnation, c.incarnation());
  const PeerId worker = hb->peer;

  TableHandle t;
  t.name = "t";
  t.rows = 4;
  t.cols = 1;
  t.shard_ids = {7};
  std::vector<float> grad(4, 1.f);

  // Requests the client has not sent before (resends of earlier ones are not looked at).
  uint64_t last_rid = hb->rid;
  auto fresh = [&last_rid](uint64_t rid) {
    if (rid <= last_rid) return false;
    last_rid = rid;
    return true;
  };

  // A push the primary does not answer: the backup's reply completes it.
  Future push = c.Push(t, grad.data());
  auto at_primary = primary.Next<PushRequest>(fresh);
  ASSERT_TRUE(at_primary);
  backup.Send(worker, at_primary->rid, PushReply{true, 0});
  ASSERT_TRUE(Within20s(push).ok()) << push.get();

  // So does a clock's.
  Future clock = c.Clock();
  auto clock_at_primary = primary.Next<ClockRequest>(fresh);
  ASSERT_TRUE(clock_at_primary);
  backup.Send(worker, clock_at_primary->rid, ClockReply{0, 0});
  ASSERT_TRUE(Within20s(clock).ok()) << clock.get();

  // Held requests go out as one batch; the backup's batch of their replies completes them.
  c.HoldSends();
  Future held_push = c.Push(t, grad.data());
  Future held_clock = c.Clock();
  c.FlushSends();
  auto held_push_at_primary = primary.Next<PushRequest>(fresh);
  auto held_clock_at_primary = primary.Next<ClockRequest>(fresh);
  ASSERT_TRUE(held_push_at_primary && held_clock_at_primary);
  backup.SendBatch(worker, {{held_push_at_primary->rid, PushReply{true, 0}},
                            {held_clock_at_primary->rid, ClockReply{0, 0}}});
  ASSERT_TRUE(Within20s(held_push).ok()) << held_push.get();
  ASSERT_TRUE(Within20s(held_clock).ok()) << held_clock.get();

  // A pull: the backup's replies to it (values, an error) are ignored. A second push's
  // reply, sent after them on the same connection, shows the client has read them.
  std::vector<float> out(4, 0.f);
  Future pull = c.Pull(t, out.data());
  auto pull_at_primary = primary.Next<PullRequest>(fresh);
  ASSERT_TRUE(pull_at_primary);
  PullReply values{7, 4, 1, DType::kF32, 0};
  std::vector<float> wrong(4, 9.f), right(4, 1.f);
  backup.Send(worker, pull_at_primary->rid, values, {EncodeValues(wrong, DType::kF32)});
  backup.Send(worker, pull_at_primary->rid, ErrorReply{Internal("not the backup's to answer"), 2});
  Future second = c.Push(t, grad.data());
  auto second_at_primary = primary.Next<PushRequest>(fresh);
  ASSERT_TRUE(second_at_primary);
  backup.Send(worker, second_at_primary->rid, PushReply{true, 0});
  ASSERT_TRUE(Within20s(second).ok()) << second.get();
  EXPECT_FALSE(pull.ready()) << "a backup's reply to a pull completed it";
  primary.Send(pull_at_primary->peer, pull_at_primary->rid, values,
               {EncodeValues(right, DType::kF32)});
  ASSERT_TRUE(Within20s(pull).ok()) << pull.get();
  ExpectAll(out, 1.f);

  // A push the backup leaves unanswered goes to the primary again, which answers it.
  Future silent = c.Push(t, grad.data());
  auto first_try = primary.Next<PushRequest>(fresh);
  ASSERT_TRUE(first_try);
  const uint64_t silent_rid = first_try->rid;
  auto resent = primary.Next<PushRequest>([&](uint64_t rid) { return rid == silent_rid; });
  ASSERT_TRUE(resent) << "the push was not resent to the primary";
  primary.Send(resent->peer, resent->rid, PushReply{true, 0});
  ASSERT_TRUE(Within20s(silent).ok()) << silent.get();
  EXPECT_GE(c.counters().backup_reply_resends, 1u);

  // The backup leaves the in-sync set with a push pending: the push goes to the primary
  // again, which answers it.
  const uint64_t before = c.counters().backup_reply_resends;
  Future orphan = c.Push(t, grad.data());
  auto orphan_at_primary = primary.Next<PushRequest>(fresh);
  ASSERT_TRUE(orphan_at_primary);
  const uint64_t orphan_rid = orphan_at_primary->rid;
  directory->Set(ChainView(false));
  auto orphan_resent = primary.Next<PushRequest>([&](uint64_t rid) { return rid == orphan_rid; });
  ASSERT_TRUE(orphan_resent) << "the push was not resent to the primary";
  EXPECT_GT(c.counters().backup_reply_resends, before);
  primary.Send(orphan_resent->peer, orphan_resent->rid, PushReply{true, 0});
  ASSERT_TRUE(Within20s(orphan).ok()) << orphan.get();
}

}  // namespace
}  // namespace leash
