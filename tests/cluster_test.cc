// Integration tests with real leash-server processes on loopback: exact SGD sums across
// shards, restart from the RocksDB snapshot, and hostile raw ZeroMQ peers.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <limits>
#include <thread>
#include <variant>
#include <zmq.hpp>

#include "leash/common/half.h"
#include "leash/common/wire.h"
#include "leash/common/zmq_transport.h"
#include "leash/worker/client.h"
#include "support/cluster.h"
#include "wire_format.h"

namespace leash {
namespace {

using testing::Endpoint;
using testing::FreePort;
using testing::Process;
using testing::Sgd1;
using testing::TempDir;

using testing::Cluster;

TEST(ClusterTest, PushesFromTwoWorkersSumExactlyAcrossTwoShards) {
  TempDir dir;
  Cluster cluster(2, dir.path());
  auto a = cluster.Connect("a");
  auto b = cluster.Connect("b");
  ASSERT_TRUE(a && b);
  auto ta = a->CreateTable(Sgd1("w", 7, 3));  // 7 rows: shard 0 holds 4, shard 1 holds 3
  auto tb = b->CreateTable(Sgd1("w", 7, 3));
  ASSERT_TRUE(ta.ok() && tb.ok()) << ta.status() << tb.status();
  constexpr int kSteps = 20;
  auto run = [&](Client* c, const TableHandle& t, float scale) {
    std::vector<float> g(t.size());
    for (int step = 0; step < kSteps; ++step) {
      for (size_t i = 0; i < g.size(); ++i) g[i] = scale * static_cast<float>(i + 1);
      ASSERT_TRUE(c->Push(t, g.data()).get().ok());
      ASSERT_TRUE(c->Clock().get().ok());
    }
  };
  std::thread ra(run, a.get(), *ta, 1.f);
  std::thread rb(run, b.get(), *tb, 0.5f);
  ra.join();
  rb.join();
  std::vector<float> v(ta->size());
  ASSERT_TRUE(a->Pull(*ta, v.data()).get().ok());
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i], -kSteps * 1.5f * static_cast<float>(i + 1)) << "value " << i;
  }
  // Sparse rows across both shards see the same values.
  std::vector<uint64_t> keys = {6, 0, 3};
  std::vector<float> rows(keys.size() * 3);
  ASSERT_TRUE(b->Pull(*tb, keys, rows.data()).get().ok());
  for (size_t k = 0; k < keys.size(); ++k) {
    for (size_t c = 0; c < 3; ++c) EXPECT_EQ(rows[k * 3 + c], v[keys[k] * 3 + c]);
  }
  EXPECT_TRUE(a->Leave().ok());
  EXPECT_TRUE(b->Leave().ok());
}

TEST(ClusterTest, ThreadsWaitingOnOneClientEachGetTheirOwnReplies) {
  // Waiting threads read the connections themselves: each must still get its own
  // replies, and replies nobody waits for must be handled by the I/O thread.
  TempDir dir;
  Cluster cluster(2, dir.path());
  auto c = cluster.Connect("shared");
  ASSERT_TRUE(c);
  auto t = c->CreateTable(Sgd1("w", 9, 2));
  ASSERT_TRUE(t.ok()) << t.status();
  constexpr int kThreads = 4;
  constexpr int kSteps = 100;
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      std::vector<float> g(t->size(), static_cast<float>(k + 1));
      std::vector<Future> pending;
      for (int step = 0; step < kSteps; ++step) {
        pending.push_back(c->Push(*t, g.data()));
        if (pending.size() == 4) {  // several in flight, waited on out of order
          ASSERT_TRUE(pending[2].get().ok());
          ASSERT_TRUE(pending[0].get().ok());
          ASSERT_TRUE(pending[3].get().ok());
          ASSERT_TRUE(pending[1].get().ok());
          pending.clear();
        }
        if (step % 10 == 0) {
          std::vector<float> v(t->size());
          ASSERT_TRUE(c->Pull(*t, v.data()).get().ok());
        }
      }
      for (auto& f : pending) ASSERT_TRUE(f.get().ok());
    });
  }
  for (auto& th : threads) th.join();
  // A push nobody waits on is completed by the I/O thread.
  std::vector<float> one(t->size(), 1.f);
  Future unwaited = c->Push(*t, one.data());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);  // a stuck run only
  while (!unwaited.ready() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(unwaited.ready());
  EXPECT_TRUE(unwaited.get().ok());
  std::vector<float> v(t->size());
  ASSERT_TRUE(c->Pull(*t, v.data()).get().ok());
  float expected = -(kSteps * (1.f + 2.f + 3.f + 4.f) + 1.f);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], expected) << "value " << i;
  EXPECT_FALSE(Future().get().ok());  // a default-made future is an error, not a hang
  EXPECT_TRUE(c->Leave().ok());
}

TEST(ClusterTest, HalfPrecisionOnTheWireHalvesTheBytesAndKeepsFp32Masters) {
  TempDir dir;
  Cluster cluster(2, dir.path());
  for (auto dtype : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    ZmqContext ctx;
    auto make = [&](DType dt) {
      ClientOptions o;
      o.wire_dtype = dt;
      o.register_worker = true;
      auto c = Client::Connect(std::move(ConnectZmqClient(ctx, cluster.endpoints()).value()), o);
      EXPECT_TRUE(c.ok()) << c.status();
      return std::move(c).value();
    };
    auto full = make(DType::kF32);
    auto half = make(dtype);
    std::string name = std::string("w") + DTypeName(dtype);
    auto t = full->CreateTable(Sgd1(name, 1000, 4));
    ASSERT_TRUE(t.ok());
    // Small integers are exact in both encodings: the sums must be exact too.
    std::vector<float> g(t->size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 7);
    auto before_full = full->counters().bytes_sent;
    auto before_half = half->counters().bytes_sent;
    ASSERT_TRUE(full->Push(*t, g.data()).get().ok());
    ASSERT_TRUE(half->Push(*t, g.data()).get().ok());
    double full_bytes = static_cast<double>(full->counters().bytes_sent - before_full);
    double half_bytes = static_cast<double>(half->counters().bytes_sent - before_half);
    EXPECT_NEAR(half_bytes / full_bytes, 0.5, 0.05);
    // 1/3 is not representable in 16 bits: the shard adds the rounded value to an fp32
    // master, so repeated pushes accumulate in fp32 rather than collapsing.
    std::vector<float> third(t->size(), 1.f / 3.f);
    for (int k = 0; k < 300; ++k) ASSERT_TRUE(half->Push(*t, third.data()).get().ok());
    std::vector<float> v(t->size());
    ASSERT_TRUE(full->Pull(*t, v.data()).get().ok());
    float rounded = dtype == DType::kF16 ? HalfToFloat(FloatToHalf(1.f / 3.f))
                                         : Bf16ToFloat(FloatToBf16(1.f / 3.f));
    for (size_t i = 0; i < v.size(); i += 97) {
      EXPECT_NEAR(v[i], -2.f * g[i] - 300.f * rounded, 1e-3) << "value " << i;
    }
    // A half-precision pull returns the fp32 masters rounded once.
    std::vector<float> hv(t->size());
    ASSERT_TRUE(half->Pull(*t, hv.data()).get().ok());
    for (size_t i = 0; i < v.size(); i += 97) EXPECT_NEAR(hv[i], v[i], std::fabs(v[i]) / 100);
  }
}

// A same-host push comes out of shared memory through a copy that checks it for NaN and Inf
// (so the shard does not read it again): a gradient with a NaN or an Inf anywhere is still
// refused with a clear error and applies nothing, and finite ones sum exactly.
TEST(ClusterTest, NonFinitePushesThroughSharedMemoryAreRefusedAndApplyNothing) {
  TempDir dir;
  Cluster cluster(1, dir.path());
  ZmqOptions shm;
  shm.shared_memory = true;
  auto c = cluster.Connect("a", true, shm);
  ASSERT_TRUE(c);
  constexpr uint64_t kRows = 1024;
  auto t = c->CreateTable(Sgd1("w", kRows, 64));  // 256 KB a push: over the 32 KB of shm frames
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<float> g(t->size(), 0.25f);
  ASSERT_TRUE(c->Push(*t, g.data()).get().ok());
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    for (size_t at : {size_t{0}, g.size() / 2 + 3, g.size() - 1}) {
      std::vector<float> b = g;
      b[at] = bad;
      Status st = c->Push(*t, b.data()).get();
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << "bad value at " << at << ": " << st;
      EXPECT_NE(st.message().find("NaN or Inf"), std::string::npos) << st;
    }
  }
  ASSERT_TRUE(c->Push(*t, g.data()).get().ok());
  std::vector<float> v(t->size());
  ASSERT_TRUE(c->Pull(*t, v.data()).get().ok());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], -0.5f) << "value " << i;
  auto stats = cluster.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ((*stats)[0].pushes_applied, 2u);
  EXPECT_TRUE(c->Leave().ok());
}

// A gradient computed into Client::PushBuffer is the very frame the shard reads: pushed
// with no copy, applied exactly, refused whole when it holds a NaN. A table whose rows span
// two shards, a 16-bit wire and a table under shared memory's smallest frame get no buffer
// (the caller computes into memory of its own); another client's buffer is copied like any
// gradient; a buffer dropped unpushed gives its room in the ring back.
TEST(ClusterTest, AGradientComputedIntoAPushBufferIsSentWithoutACopyAndAppliedExactly) {
  TempDir dir;
  Cluster cluster(2, dir.path());
  ZmqOptions shm;
  shm.shared_memory = true;
  shm.shm_ring_bytes = int64_t{16} << 20;  // the 600 dropped buffers below are more than this
  auto c = cluster.Connect("a", true, shm);
  ASSERT_TRUE(c);
  auto one = c->CreateTable(Sgd1("one", 1, 16384));     // one row, on shard 0 alone: 64 KiB
  auto both = c->CreateTable(Sgd1("both", 64, 1024));   // rows on both shards
  auto small = c->CreateTable(Sgd1("small", 1, 1024));  // 4 KiB: under the 32 KiB frames
  ASSERT_TRUE(one.ok() && both.ok() && small.ok()) << one.status() << both.status();
  // Shared memory comes on after each connection's handshake.
  std::vector<float> g(both->size(), 0.25f);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (c->counters().shared_memory_shards < 2 && std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE(c->Push(*both, g.data()).get().ok());
  }
  ASSERT_EQ(c->counters().shared_memory_shards, 2);
  EXPECT_EQ(c->PushBuffer(*both), nullptr);
  EXPECT_EQ(c->PushBuffer(*small), nullptr);

  std::shared_ptr<float> buf = c->PushBuffer(*one);
  ASSERT_NE(buf, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.get()) % 64, 0u);
  for (size_t i = 0; i < one->size(); ++i) buf.get()[i] = static_cast<float>(i % 7);
  const ClientCounters before = c->counters();
  ASSERT_TRUE(c->Push(*one, std::shared_ptr<const float>(std::move(buf))).get().ok());
  ClientCounters after = c->counters();
  EXPECT_EQ(after.push_buffers, before.push_buffers);
  EXPECT_EQ(after.pushes_from_buffer, before.pushes_from_buffer + 1);
  std::vector<float> v(one->size());
  ASSERT_TRUE(c->Pull(*one, v.data()).get().ok());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], -static_cast<float>(i % 7)) << i;

  // A NaN written into the buffer: refused with the error any push gets, nothing applied.
  buf = c->PushBuffer(*one);
  ASSERT_NE(buf, nullptr);
  std::fill_n(buf.get(), one->size(), 1.f);
  buf.get()[one->size() / 3] = std::numeric_limits<float>::quiet_NaN();
  Status st = c->Push(*one, std::shared_ptr<const float>(std::move(buf))).get();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("NaN or Inf"), std::string::npos) << st;
  ASSERT_TRUE(c->Pull(*one, v.data()).get().ok());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], -static_cast<float>(i % 7)) << i;

  // Buffers dropped unpushed: 600 of 64 KiB are more than a ring's 16 MiB, so each one's
  // room came back.
  for (int k = 0; k < 600; ++k) ASSERT_NE(c->PushBuffer(*one), nullptr) << "buffer " << k;

  // Another client's buffer is not its frame: copied, and applied all the same.
  auto d = cluster.Connect("b", true, shm);
  ASSERT_TRUE(d);
  auto one_d = d->CreateTable(Sgd1("one", 1, 16384));
  ASSERT_TRUE(one_d.ok()) << one_d.status();
  buf = c->PushBuffer(*one);
  ASSERT_NE(buf, nullptr);
  std::fill_n(buf.get(), one->size(), 2.f);
  ASSERT_TRUE(d->Push(*one_d, std::shared_ptr<const float>(std::move(buf))).get().ok());
  EXPECT_EQ(d->counters().pushes_from_buffer, 0u);
  ASSERT_TRUE(d->Pull(*one_d, v.data()).get().ok());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], -static_cast<float>(i % 7) - 2.f) << i;
  after = c->counters();
  EXPECT_EQ(after.push_buffers, before.push_buffers + 602);  // the NaN one, 600, the last
  EXPECT_EQ(after.pushes_from_buffer, before.pushes_from_buffer + 2);

  // A 16-bit wire sends other bytes than the floats: no buffer.
  ZmqContext ctx;
  ClientOptions o;
  o.wire_dtype = DType::kBF16;
  o.register_worker = false;
  auto half =
      Client::Connect(std::move(ConnectZmqClient(ctx, cluster.endpoints(), shm).value()), o);
  ASSERT_TRUE(half.ok()) << half.status();
  auto one_h = (*half)->CreateTable(Sgd1("one", 1, 16384));
  ASSERT_TRUE(one_h.ok()) << one_h.status();
  EXPECT_EQ((*half)->PushBuffer(*one_h), nullptr);
  EXPECT_TRUE(c->Leave().ok());
  EXPECT_TRUE(d->Leave().ok());
}

// Client::PullInPlace against real shards: over the socket the pieces are the received
// messages themselves; from a same-host shard's shared-memory ring they are the ring's bytes,
// kept until released, up to a quarter of the ring (4 MiB of 16) held at a time, and copied
// out beyond it. 200 pulls held at once, 25 MiB from each shard: the first 4 MiB in place,
// the rest copied. Once they are released, the budget and the ring's room come back.
TEST(ClusterTest, APullInPlaceKeepsTheSocketsBytesAndAQuarterOfASharedMemoryRing) {
  TempDir dir;
  Cluster cluster(2, dir.path());
  for (bool with_shm : {false, true}) {
    SCOPED_TRACE(with_shm ? "shared memory" : "socket");
    ZmqOptions zo;
    zo.shared_memory = with_shm;
    zo.shm_ring_bytes = int64_t{16} << 20;  // the budget: a quarter of it, 4 MiB
    auto c = cluster.Connect(with_shm ? "shm" : "socket", true, zo);
    ASSERT_TRUE(c);
    auto t = c->CreateTable(Sgd1("t", 64, 1024));  // 128 KiB on each shard
    ASSERT_TRUE(t.ok()) << t.status();
    const size_t piece = t->size() / 2 * sizeof(float);
    std::vector<float> g(t->size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 11);
    ASSERT_TRUE(c->Push(*t, g.data()).get().ok());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::vector<float> v(t->size());
    while (with_shm && c->counters().shared_memory_shards < 2 &&
           std::chrono::steady_clock::now() < deadline) {
      ASSERT_TRUE(c->Pull(*t, v.data()).get().ok());
    }
    ASSERT_EQ(c->counters().shared_memory_shards, with_shm ? 2 : 0);
    ASSERT_TRUE(c->Pull(*t, v.data()).get().ok());
    std::vector<PulledValues> held(200);
    size_t copied_pieces = 0;
    for (size_t k = 0; k < held.size(); ++k) {
      PulledValues& p = held[k];
      ASSERT_TRUE(c->PullInPlace(*t, &p).get().ok());
      ASSERT_EQ(p.pieces().size(), 2u);
      ASSERT_EQ(p.copied_bytes() % piece, 0u);
      copied_pieces += p.copied_bytes() / piece;
      // The first 16 pulls (32 pieces of 128 KiB: 4 MiB) fit the budget.
      if (!with_shm || k < 16) {
        EXPECT_EQ(p.copied_bytes(), 0u) << "pull " << k;
      }
    }
    EXPECT_EQ(copied_pieces, with_shm ? 2 * held.size() - 32 : 0u);
    for (const PulledValues& p : held) {
      std::vector<float> got(t->size());
      p.CopyTo(got.data());
      ASSERT_EQ(got, v);
    }
    for (size_t i = 0; i < v.size(); i += 101) EXPECT_EQ(v[i], -g[i]) << i;
    held.clear();
    // Released: every pull in place again, one at a time, 200 x 128 KiB from each shard's
    // ring, more than its 16 MiB.
    for (int k = 0; k < 200; ++k) {
      PulledValues p;
      ASSERT_TRUE(c->PullInPlace(*t, &p).get().ok());
      ASSERT_EQ(p.copied_bytes(), 0u) << "pull " << k;
    }
    // Undo the push, so the next client starts from zeros too.
    for (float& x : g) x = -x;
    ASSERT_TRUE(c->Push(*t, g.data()).get().ok());
  }
}

TEST(ClusterTest, BulkSynchronousPullWaitsForTheSlowerWorker) {
  TempDir dir;
  Cluster cluster(2, dir.path());
  auto fast = cluster.Connect("fast");
  auto slow = cluster.Connect("slow");
  ASSERT_TRUE(fast && slow);
  auto t = fast->CreateTable(Sgd1("w", 4, 1));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(fast->Clock().get().ok());
  std::vector<float> v(4);
  auto pull = fast->Pull(*t, v.data());  // iteration 1 under s = 0 needs the slow worker's clock
  EXPECT_EQ(pull.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  ASSERT_TRUE(slow->Clock().get().ok());
  ASSERT_EQ(pull.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(pull.get().ok());
}

// Striping (leash-worker --stripes): 4 MB tables over two shards with their I/O threads, two
// clients on three connections per shard, pushes and pulls in flight together. Every push
// counts exactly once and every pull sees whole, ordered values; the shards' final logs
// show that the large messages went striped both ways.
// A shard at --update-threads 3 with a worker on its host: the push is copied out of the
// worker's ring, checked and applied by the threads, the pull reply written into the ring by
// them; every value exact, a NaN still refused, and the shard's last lines count the passes.
TEST(ClusterTest, AShardsUpdateThreadsShareItsCopiesThroughSharedMemoryAndSumExactly) {
  TempDir dir;
  Cluster cluster(1, dir.path(), {"--update-threads=3"});
  ZmqOptions zo;
  zo.shared_memory = true;
  auto c = cluster.Connect("a", true, zo);
  ASSERT_TRUE(c);
  const TableSpec spec = Sgd1("big", 8192, 128);  // 1 M floats: 4 MB, split in 3 ranges
  auto t = c->CreateTable(spec);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<float> g(t->size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 97 + 1);
  constexpr int kSteps = 3;
  std::vector<float> seen(t->size());
  for (int step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(c->Push(*t, g.data()).get().ok());
    ASSERT_TRUE(c->Pull(*t, seen.data()).get().ok());
    for (size_t i = 0; i < seen.size(); ++i) {
      ASSERT_EQ(seen[i], -(step + 1) * g[i]) << "step " << step << ", value " << i;
    }
  }
  g[g.size() - 1] = std::numeric_limits<float>::quiet_NaN();  // in the last range
  Status nan = c->Push(*t, g.data()).get();
  EXPECT_EQ(nan.code(), StatusCode::kInvalidArgument) << nan;
  EXPECT_TRUE(c->Leave().ok());
  c.reset();
  cluster.shard(0).Signal(SIGTERM);
  ASSERT_EQ(cluster.shard(0).Wait(std::chrono::seconds(30)), 0);
  const std::string log = cluster.shard(0).ReadLog();
  const int64_t received = testing::CountInFinalLog(log, "frames received");
  EXPECT_EQ(received, kSteps + 1) << log;
  EXPECT_EQ(testing::CountInFinalLog(log, "pushes checked"), kSteps) << log;
  // kSteps updates; each push's copy out of the ring (checked in that copy), each of the
  // kSteps pull replies' copy into it, and the NaN push's check by the shard (its copy
  // found the NaN).
  EXPECT_EQ(testing::CountInFinalLog(log, "updates split"), kSteps) << log;
  EXPECT_EQ(testing::CountInFinalLog(log, "passes split"), received + kSteps + 1) << log;
}

TEST(ClusterTest, StripedPushesAndPullsSumExactlyAcrossTwoShards) {
  TempDir dir;
  Cluster cluster(2, dir.path(), {"--io-threads=3", "--no-shm"});
  ZmqOptions zo;
  zo.stripes = 3;
  auto a = cluster.Connect("a", true, zo);
  auto b = cluster.Connect("b", true, zo);
  ASSERT_TRUE(a && b);
  const TableSpec spec = Sgd1("big", 8192, 128);  // 1 M floats: 2 MB on each shard
  auto ta = a->CreateTable(spec);
  auto tb = b->CreateTable(spec);
  ASSERT_TRUE(ta.ok() && tb.ok()) << ta.status() << tb.status();
  constexpr int kSteps = 6;
  // Worker b hands its gradient over (Push of a shared_ptr: sent from its floats, striped
  // over the socket without a copy); worker a's is copied.
  auto run = [&](Client* c, const TableHandle& t, float scale, bool owned) {
    auto floats = std::make_shared<std::vector<float>>(t.size());
    std::vector<float>& g = *floats;
    for (size_t i = 0; i < g.size(); ++i) g[i] = scale * static_cast<float>(i % 97 + 1);
    const std::shared_ptr<const float> grad(floats, floats->data());
    std::vector<float> seen(t.size());
    for (int step = 0; step < kSteps; ++step) {
      auto p1 = owned ? c->Push(t, grad) : c->Push(t, g.data());
      auto p2 = owned ? c->Push(t, grad) : c->Push(t, g.data());
      auto pull = c->Pull(t, seen.data());
      ASSERT_TRUE(p1.get().ok());
      ASSERT_TRUE(p2.get().ok());
      ASSERT_TRUE(pull.get().ok());
      // Whatever the pull saw, each value is a whole number of pushes of both workers.
      for (size_t i = 0; i < seen.size(); i += 4099) {
        const float unit = static_cast<float>(i % 97 + 1);
        const float pushes_a = -seen[i] / unit;
        EXPECT_EQ(pushes_a, std::floor(pushes_a * 2) / 2) << "value " << i << ": " << seen[i];
      }
      ASSERT_TRUE(c->Clock().get().ok());
    }
  };
  std::thread ra(run, a.get(), *ta, 1.f, false);
  std::thread rb(run, b.get(), *tb, 0.5f, true);
  ra.join();
  rb.join();
  std::vector<float> v(ta->size());
  ASSERT_TRUE(a->Pull(*ta, v.data()).get().ok());
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(v[i], -2 * kSteps * 1.5f * static_cast<float>(i % 97 + 1)) << "value " << i;
  }
  // A striped push with a NaN in each shard's range (the first value and the last) is
  // refused by both, and changes nothing: the parts' checking copy found the NaN, so the
  // shard read the gradient again and named what was wrong.
  std::vector<float> bad(ta->size(), 1.f);
  bad.front() = std::numeric_limits<float>::quiet_NaN();
  bad.back() = std::numeric_limits<float>::infinity();
  Status nan = a->Push(*ta, bad.data()).get();
  EXPECT_EQ(nan.code(), StatusCode::kInvalidArgument) << nan;
  EXPECT_NE(nan.message().find("NaN or Inf"), std::string::npos) << nan;
  std::vector<float> after(ta->size());
  ASSERT_TRUE(a->Pull(*ta, after.data()).get().ok());
  EXPECT_EQ(after, v);
  EXPECT_TRUE(a->Leave().ok());
  EXPECT_TRUE(b->Leave().ok());
  a.reset();
  b.reset();
  for (int s = 0; s < 2; ++s) {
    cluster.shard(s).Signal(SIGTERM);
    ASSERT_EQ(cluster.shard(s).Wait(std::chrono::seconds(30)), 0);
    const std::string log = cluster.shard(s).ReadLog();
    // Each worker's 2 x kSteps pushes and the NaN one, and the pulls' replies.
    EXPECT_GE(testing::CountInFinalLog(log, "messages received"), 4 * kSteps + 1) << log;
    EXPECT_GE(testing::CountInFinalLog(log, "replies sent"), 2 * kSteps) << log;
    EXPECT_EQ(testing::CountInFinalLog(log, "dropped incomplete"), 0) << log;
    // The finite pushes were checked by the copy that put their parts together, not read
    // again by the shard; the NaN push was not.
    EXPECT_EQ(testing::CountInFinalLog(log, "pushes checked"), 4 * kSteps) << log;
  }
}

TEST(ClusterTest, RestartedShardServesItsLastSnapshot) {
  TempDir dir;
  Cluster cluster(2, dir.path());
  std::vector<float> snapshot_values(6);
  {
    auto c = cluster.Connect("w");
    ASSERT_TRUE(c);
    auto t = c->CreateTable(Sgd1("w", 6, 1));
    ASSERT_TRUE(t.ok());
    std::vector<float> g = {1, 2, 3, 4, 5, 6};
    ASSERT_TRUE(c->Push(*t, g.data()).get().ok());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(c->Clock().get().ok());
    auto clocks = c->Checkpoint();
    ASSERT_TRUE(clocks.ok()) << clocks.status();
    EXPECT_EQ((*clocks)[0], 3);
    ASSERT_TRUE(c->Pull(*t, snapshot_values.data()).get().ok());
    // An update after the snapshot is lost when the shard is killed.
    ASSERT_TRUE(c->Push(*t, g.data()).get().ok());
  }
  cluster.shard(0).Kill();
  cluster.shard(1).Kill();
  cluster.Start(0);
  cluster.Start(1);
  auto c = cluster.Connect("reader", /*register_worker=*/false);
  ASSERT_TRUE(c);
  auto t = c->CreateTable(Sgd1("w", 6, 1));
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<float> v(6);
  ASSERT_TRUE(c->Pull(*t, v.data()).get().ok());
  EXPECT_EQ(v, snapshot_values);
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)[0].recovered_clock, 3);
  EXPECT_NE(cluster.shard(0).ReadLog().find("recovered snapshot"), std::string::npos);
}

TEST(ClusterTest, GracefulShutdownSnapshotsEveryUpdate) {
  TempDir dir;
  Cluster cluster(1, dir.path());
  {
    auto c = cluster.Connect("w");
    ASSERT_TRUE(c);
    auto t = c->CreateTable(Sgd1("w", 2, 1));
    ASSERT_TRUE(t.ok());
    std::vector<float> g = {1, 2};
    ASSERT_TRUE(c->Push(*t, g.data()).get().ok());
    ASSERT_TRUE(c->Leave().ok());
  }
  cluster.shard(0).Signal(SIGTERM);
  auto code = cluster.shard(0).Wait(std::chrono::seconds(20));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << cluster.shard(0).ReadLog();
  cluster.Start(0);
  auto c = cluster.Connect("reader", false);
  ASSERT_TRUE(c);
  auto t = c->CreateTable(Sgd1("w", 2, 1));
  ASSERT_TRUE(t.ok());
  std::vector<float> v(2);
  ASSERT_TRUE(c->Pull(*t, v.data()).get().ok());
  EXPECT_EQ(v, (std::vector<float>{-1, -2}));
}

// A raw DEALER that sends hand-made frames and reads replies.
class RawPeer {
 public:
  RawPeer(zmq::context_t& ctx, const std::string& endpoint) : s_(ctx, zmq::socket_type::dealer) {
    s_.set(zmq::sockopt::linger, 0);
    s_.set(zmq::sockopt::rcvtimeo, 10000);
    s_.connect(endpoint);
  }
  void Send(const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      s_.send(zmq::buffer(frames[i]),
              i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
  void Send(const Message& m) {
    std::vector<std::string> frames;
    for (const auto& f : m) frames.emplace_back(f.view());
    Send(frames);
  }
  // The status of the next reply (OK for a non-error reply), and its request id.
  Status Reply(uint64_t* rid = nullptr) {
    Message m;
    while (true) {
      zmq::message_t part;
      if (!s_.recv(part)) return DeadlineExceeded("no reply within 10 s");
      bool more = part.more();
      m.push_back(Frame::Copy(part.data(), part.size()));
      if (!more) break;
    }
    auto reply = DecodeReply(m);
    if (!reply.ok()) return Internal("unreadable reply: " + reply.status().ToString());
    if (rid != nullptr) *rid = reply->request_id;
    if (const auto* e = std::get_if<ErrorReply>(&reply->value)) return e->status;
    return Status::Ok();
  }

 private:
  zmq::socket_t s_;
};

TEST(ClusterTest, GarbageFromARawPeerGetsErrorRepliesWhileOthersAreServed) {
  TempDir dir;
  Cluster cluster(1, dir.path(), {"--max-message-mb=1"});
  auto good = cluster.Connect("good");
  ASSERT_TRUE(good);
  auto t = good->CreateTable(Sgd1("w", 8, 2));
  ASSERT_TRUE(t.ok());

  zmq::context_t raw_ctx;
  RawPeer raw(raw_ctx, cluster.endpoints()[0]);
  raw.Send({"complete garbage, not a flatbuffer"});
  EXPECT_EQ(raw.Reply().code(), StatusCode::kInvalidArgument);

  Message pull = MakePull(11, 0, Rows::Range(0, 8), 0, 0, 0);
  raw.Send({std::string(pull[0].view().substr(0, pull[0].size() / 2))});
  EXPECT_EQ(raw.Reply().code(), StatusCode::kInvalidArgument);

  Message unknown = MakePull(12, 99, Rows::Range(0, 1), 0, 0, 0);
  raw.Send(unknown);
  uint64_t rid = 0;
  Status st = raw.Reply(&rid);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(rid, 12u);
  EXPECT_NE(st.message().find("unknown table 99"), std::string::npos) << st;

  // Register, then push a gradient whose frame does not match the declared rows.
  raw.Send(MakeRegister(13, 4242, 1, "raw"));
  ASSERT_TRUE(raw.Reply().ok());
  std::vector<float> wrong(3, 1.f);
  raw.Send(MakePush(14, 0, Rows::Range(0, 8), 4242, 1, 1, DType::kF32,
                    EncodeValues(wrong, DType::kF32)));
  EXPECT_EQ(raw.Reply().code(), StatusCode::kInvalidArgument);

  // An oversized tensor (2 MiB against a 1 MiB limit) is refused, not applied.
  std::vector<float> huge(512 * 1024, 1.f);
  raw.Send(
      MakePush(15, 0, Rows::Range(0, 8), 4242, 1, 2, DType::kF32, EncodeValues(huge, DType::kF32)));
  EXPECT_EQ(raw.Reply().code(), StatusCode::kResourceExhausted);

  // Another protocol version (a raw message on purpose: the codec only writes its own).
  flatbuffers::FlatBufferBuilder fbb;
  auto body = wire::CreateStats(fbb);
  fbb.Finish(wire::CreateEnvelope(fbb, kProtocolVersion + 7, 16, wire::Body::Stats, body.Union()),
             wire::EnvelopeIdentifier());
  raw.Send({std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize())});
  EXPECT_EQ(raw.Reply().code(), StatusCode::kVersionMismatch);

  // The shard is alive, unharmed and still serving the well-behaved worker.
  std::vector<float> v(16, -1.f);
  ASSERT_TRUE(good->Pull(*t, v.data()).get().ok());
  EXPECT_EQ(v, std::vector<float>(16, 0.f));
  EXPECT_TRUE(cluster.shard(0).running());
  auto stats = good->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)[0].errors, 6u);
}

TEST(ClusterTest, UnreachableShardIsAClearErrorNotAHang) {
  ZmqContext ctx;
  auto t = ConnectZmqClient(ctx, {Endpoint(FreePort())});
  ASSERT_TRUE(t.ok());
  ClientOptions o;
  o.connect_timeout_ms = 500;
  auto c = Client::Connect(std::move(*t), o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("did not answer"), std::string::npos) << c.status();
}

TEST(ClusterTest, BadEndpointIsInvalidArgument) {
  ZmqContext ctx;
  auto t = ConnectZmqClient(ctx, {"not-an-endpoint"});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace leash
