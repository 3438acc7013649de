// Unit tests of RemoteParams (MakeRemoteParams) against real shards on the in-memory
// transport: an iteration's pushes held until EndIteration unless they add up to a 1 MiB
// bucket, the prefetch under staleness >= 1 (swapped in, not pulled again) and none
// under staleness 0, and a rejoin after eviction that drops the old incarnation's work.
// Single training thread, as RemoteParams requires.
#include "leash/worker/params.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "leash/common/wire.h"
#include "support/memory_cluster.h"
#include "support/process.h"

namespace leash::worker {
namespace {

using namespace std::chrono_literals;
using testing::Direction;
using testing::MemoryCluster;
using testing::Packet;
using testing::Verdict;

ParamSpec Param(const std::string& name, uint64_t rows, uint32_t cols) {
  ParamSpec p;
  p.name = name;
  p.rows = rows;
  p.cols = cols;
  return p;  // zeros
}

OptimizerOptions Sgd() {
  OptimizerOptions o;
  o.learning_rate = 1.f;  // a pushed gradient g moves a value by -g
  return o;
}

class RemoteParamsTest : public ::testing::Test {
 protected:
  // A worker of `cluster` with RemoteParams under `staleness`, set up with `params`.
  void Open(MemoryCluster& cluster, int64_t staleness, const std::vector<ParamSpec>& params,
            bool clock_with_pull = true, bool in_place = false, DType wire = DType::kF32) {
    ClientOptions o;
    o.name = "w";
    o.worker_id = 1;
    o.staleness = staleness;
    o.heartbeat_ms = 50;
    o.wire_dtype = wire;
    auto c = cluster.Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    store_ = MakeRemoteParams(client_.get(), staleness, clock_with_pull, in_place);
    ASSERT_TRUE(store_->Setup(params, Sgd()).ok());
  }

  // Defined beside the tests that use it.
  void ExpectMessagesPerIteration(bool clock_with_pull, int per_iteration);
  // Counts the messages to shards that carry more than `bytes` (gradients, not
  // heartbeats or clocks), and their bytes.
  void CountLarge(MemoryCluster& cluster, size_t bytes) {
    cluster.network().AddRule([this, bytes](const Packet& p) -> std::optional<Verdict> {
      size_t n = 0;
      for (const Frame& f : *p.message) n += f.size();
      // Heartbeats (every 50 ms here) are not the messages these tests count.
      const bool heartbeat =
          !IsBatch(*p.message) && PeekRequest(*p.message).kind == RequestPeek::kHeartbeat;
      if (p.direction == Direction::kToShard && n > bytes && !heartbeat) {
        ++large_;
        large_bytes_ += n;
      }
      return std::nullopt;
    });
  }

  std::unique_ptr<Client> client_;
  std::unique_ptr<ParamStore> store_;
  std::atomic<int> large_{0};
  std::atomic<size_t> large_bytes_{0};
};

TEST_F(RemoteParamsTest, SmallPushesAreHeldUntilEndIterationAndGoWithTheClock) {
  MemoryCluster cluster(1);
  Open(cluster, 0, {Param("a", 256, 4), Param("b", 256, 4)});  // 4 KiB each
  CountLarge(cluster, 2000);
  std::vector<std::vector<float>> values;
  ASSERT_TRUE(store_->PullAll(&values).ok());
  std::vector<float> grad(1024, 1.f);
  store_->Push(0, grad.data());
  store_->Push(1, grad.data());
  EXPECT_EQ(large_.load(), 0) << "held";
  ASSERT_TRUE(store_->EndIteration().ok());
  EXPECT_EQ(large_.load(), 1) << "both pushes and the clock in one message";
  EXPECT_GT(large_bytes_.load(), 2 * 4096u);
  ASSERT_TRUE(store_->PullAll(&values).ok());
  for (const auto& v : values) EXPECT_EQ(v.front(), -1.f);
  EXPECT_EQ(store_->clock(), 1);
}

TEST_F(RemoteParamsTest, AWorkerThePeersLeftBehindCatchesUpSoItsPushIsNotDropped) {
  server::ShardOptions so;
  so.backup_workers = 1;
  MemoryCluster cluster(1, so);
  Open(cluster, 0, {Param("a", 1, 1)});
  // Two peers register and run 5 clocks ahead; with one backup worker the minimum is the
  // second smallest clock, theirs.
  std::vector<std::unique_ptr<Client>> peers;
  for (uint64_t id = 2; id <= 3; ++id) {
    ClientOptions o;
    o.worker_id = id;
    auto c = cluster.Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    for (int i = 0; i < 5; ++i) ASSERT_TRUE((*c)->Clock().get().ok());
    peers.push_back(std::move(*c));
  }
  ASSERT_EQ(store_->clock(), 0);
  std::vector<std::vector<float>> values;
  ASSERT_TRUE(store_->PullAll(&values).ok());
  EXPECT_EQ(store_->clock(), 5);  // moved up to the minimum its values reflect
  const float g = 1.f;
  store_->Push(0, &g);
  ASSERT_TRUE(store_->EndIteration().ok());
  EXPECT_EQ(store_->clock(), 6);
  ASSERT_TRUE(store_->PullAll(&values).ok());
  EXPECT_EQ(values[0][0], -1.f) << "applied: it was for the minimum's iteration, not 0";
  EXPECT_EQ(cluster.view(0).counters.pushes_dropped_stale, 0u);
}

TEST_F(RemoteParamsTest, WeightedPushesAndReportedSpeedsReachTheShards) {
  MemoryCluster cluster(1);
  Open(cluster, 0, {Param("a", 1, 1)});
  std::vector<std::vector<float>> values;
  ASSERT_TRUE(store_->PullAll(&values).ok());
  store_->SetPushWeight({16, 64});
  store_->SetSamplesPerSecond(250);
  const float g = 2.f;
  store_->Push(0, &g);
  ASSERT_TRUE(store_->EndIteration().ok());
  ASSERT_TRUE(store_->PullAll(&values).ok());
  EXPECT_EQ(values[0][0], -0.5f);  // 2 x 16 / 64
  ASSERT_TRUE(store_->EndIteration().ok());
  ASSERT_TRUE(store_->Finish().ok());  // waits for the clocks' replies
  EXPECT_EQ(store_->cluster_samples_per_second(), 250);
}

TEST_F(RemoteParamsTest, PushesThatAddUpToAMebibyteGoBeforeEndIteration) {
  MemoryCluster cluster(1);
  // Three 512 KiB tables: the second push fills a 1 MiB bucket.
  Open(cluster, 0, {Param("a", 1024, 128), Param("b", 1024, 128), Param("c", 1024, 128)});
  CountLarge(cluster, 100'000);
  std::vector<std::vector<float>> values;
  ASSERT_TRUE(store_->PullAll(&values).ok());
  std::vector<float> grad(1024 * 128, 1.f);
  store_->Push(0, grad.data());
  EXPECT_EQ(large_.load(), 0) << "half a bucket is held";
  store_->Push(1, grad.data());
  EXPECT_EQ(large_.load(), 1) << "a full bucket goes at once, as one message";
  EXPECT_GE(large_bytes_.load(), size_t{1} << 20);
  store_->Push(2, grad.data());
  EXPECT_EQ(large_.load(), 1);
  ASSERT_TRUE(store_->EndIteration().ok());
  EXPECT_EQ(large_.load(), 2);
  ASSERT_TRUE(store_->PullAll(&values).ok());
  for (const auto& v : values) EXPECT_EQ(v.back(), -1.f);
}

TEST_F(RemoteParamsTest, APrefetchUnderStalenessOneIsSwappedInWithoutPullingAgain) {
  MemoryCluster cluster(2);
  Open(cluster, 1, {Param("a", 8, 2), Param("b", 3, 5)});
  std::vector<std::vector<float>> values;
  std::vector<float> grad(16, 1.f);
  for (int iteration = 0; iteration < 4; ++iteration) {
    uint64_t pulls = client_->counters().pulls;
    ASSERT_TRUE(store_->PullAll(&values).ok());
    if (iteration == 0) {
      EXPECT_EQ(client_->counters().pulls, pulls + 2) << "nothing prefetched yet";
    } else {
      EXPECT_EQ(client_->counters().pulls, pulls) << "the prefetch was used";
    }
    // The prefetch started in the previous iteration (before its pushes): one behind.
    float expected = -static_cast<float>(std::max(0, iteration - 1));
    for (const auto& v : values) EXPECT_EQ(v.front(), expected) << "iteration " << iteration;
    const float* a = values[0].data();
    store_->Prefetch();
    EXPECT_EQ(client_->counters().pulls, pulls + (iteration == 0 ? 4 : 2));
    EXPECT_EQ(values[0].data(), a) << "the prefetch writes other arrays";
    store_->Push(0, grad.data());
    store_->Push(1, grad.data());
    ASSERT_TRUE(store_->EndIteration().ok());
  }
}

// Pulling in place: a table on one shard is offered where its reply arrived (values[i] stays
// empty), those values never change while offered, not when the shard applies pushes nor when
// the next prefetch lands, and every pull offers what a copying store reads. A table whose
// rows lie on two shards is copied into values[i] from its first pull on. Under staleness 1
// (prefetches swapped in) and 0 (pulled each iteration).
TEST_F(RemoteParamsTest, PulledInPlaceATableOnOneShardIsOfferedWhereItsReplyArrived) {
  for (int64_t staleness : {1, 0}) {
    SCOPED_TRACE("staleness " + std::to_string(staleness));
    MemoryCluster cluster(2);
    // "one": a single row, on one shard; "split": 8 rows over both.
    Open(cluster, staleness, {Param("one", 1, 64), Param("split", 8, 2)}, true, /*in_place=*/true);
    EXPECT_TRUE(store_->InPlace(0).empty()) << "nothing pulled yet";
    std::vector<std::vector<float>> values;
    std::vector<float> grad(64, 1.f);
    std::span<const float> last;
    float last_value = 0;
    for (int iteration = 0; iteration < 5; ++iteration) {
      SCOPED_TRACE("iteration " + std::to_string(iteration));
      if (!last.empty()) {
        // Pushes applied and a prefetch answered since the last pull: the offer still
        // holds what it was pulled with.
        for (float v : last) ASSERT_EQ(v, last_value);
      }
      ASSERT_TRUE(store_->PullAll(&values).ok());
      ASSERT_EQ(values.size(), 2u);
      const std::span<const float> one = store_->InPlace(0);
      ASSERT_EQ(one.size(), 64u);
      EXPECT_TRUE(values[0].empty()) << "never written: InPlace(0) holds the values";
      EXPECT_TRUE(store_->InPlace(1).empty()) << "rows on two shards: copied";
      ASSERT_EQ(values[1].size(), 16u);
      // Staleness 1 reads the prefetch started before the last iteration's pushes.
      const float expected =
          -static_cast<float>(staleness == 1 ? std::max(0, iteration - 1) : iteration);
      for (float v : one) ASSERT_EQ(v, expected);
      for (float v : values[1]) ASSERT_EQ(v, expected);
      last = one;
      last_value = expected;
      if (staleness == 1) store_->Prefetch();
      store_->Push(0, grad.data());
      store_->Push(1, grad.data());
      ASSERT_TRUE(staleness == 1 ? store_->EndIteration().ok()
                                 : store_->EndIterationBeforePull().ok());
    }
    ASSERT_TRUE(store_->Finish().ok());
  }
}

// A reply that is widened (a 16-bit wire) is copied whatever the store does: such a table
// is pulled into values from its first pull on, and reads what it would without in place.
TEST_F(RemoteParamsTest, PulledInPlaceA16BitWireIsCopiedIntoValuesAsWithout) {
  MemoryCluster cluster(1);
  Open(cluster, 0, {Param("one", 1, 64)}, true, /*in_place=*/true, DType::kBF16);
  std::vector<std::vector<float>> values;
  std::vector<float> grad(64, 1.f);
  for (int iteration = 0; iteration < 3; ++iteration) {
    ASSERT_TRUE(store_->PullAll(&values).ok());
    EXPECT_TRUE(store_->InPlace(0).empty());
    ASSERT_EQ(values[0].size(), 64u);
    for (float v : values[0]) ASSERT_EQ(v, -static_cast<float>(iteration));
    store_->Push(0, grad.data());
    ASSERT_TRUE(store_->EndIterationBeforePull().ok());
  }
}

// Three iterations of two 4 KiB pushes at staleness 0 against one shard, counting the large
// messages the shard receives: `per_iteration` in all, of which the pushes and the clock
// (sent by EndIterationBeforePull) are the first. After each, the pull sees the iteration's
// own pushes.
void RemoteParamsTest::ExpectMessagesPerIteration(bool clock_with_pull, int per_iteration) {
  MemoryCluster cluster(1);
  Open(cluster, 0, {Param("a", 256, 4), Param("b", 256, 4)}, clock_with_pull);
  CountLarge(cluster, 0);
  std::vector<std::vector<float>> values;
  ASSERT_TRUE(store_->PullAll(&values).ok());
  const int before = large_.load();
  std::vector<float> grad(1024, 1.f);
  for (int iteration = 1; iteration <= 3; ++iteration) {
    store_->Push(0, grad.data());
    store_->Push(1, grad.data());
    ASSERT_TRUE(store_->EndIterationBeforePull().ok());
    EXPECT_EQ(large_.load(), before + per_iteration * iteration - 1)
        << "after the clock, iteration " << iteration;
    EXPECT_EQ(store_->clock(), iteration);
    ASSERT_TRUE(store_->PullAll(&values).ok());
    EXPECT_EQ(large_.load(), before + per_iteration * iteration)
        << "after the pull, iteration " << iteration;
    for (const auto& v : values) EXPECT_EQ(v.front(), -static_cast<float>(iteration));
  }
  EXPECT_TRUE(cluster.WaitFor(0, [](const MemoryCluster::View& v) { return v.min_clock == 3; }));
}

// Between two batches of a chunk the clock waits for the next pull: an iteration's
// pushes, its clock and the next pull reach the shard as one message. At staleness 0 the
// pull is answered after the clock, with the iteration's own push in.
TEST_F(RemoteParamsTest, AtStalenessZeroTheClockGoesInTheMessageOfTheNextPull) {
  ExpectMessagesPerIteration(/*clock_with_pull=*/true, 1);
}

// With replicated shards (clock_with_pull off) the pushes and the clock go at the end of the
// iteration, and the pull in a message of its own: two messages per iteration.
TEST_F(RemoteParamsTest, WithoutClockWithPullTheIterationEndsWithItsOwnMessage) {
  ExpectMessagesPerIteration(/*clock_with_pull=*/false, 2);
}

// Above staleness 0 the held clock goes with the prefetch (started after the pull that
// swaps the last prefetch in), and anything that waits for a shard sends it first: a
// clock held at the end of a chunk is not left behind.
TEST_F(RemoteParamsTest, AHeldClockGoesWithThePrefetchOrWithAnyWait) {
  MemoryCluster cluster(1);
  Open(cluster, 1, {Param("a", 8, 2)});
  CountLarge(cluster, 0);
  std::vector<std::vector<float>> values;
  std::vector<float> grad(16, 1.f);
  ASSERT_TRUE(store_->PullAll(&values).ok());
  store_->Prefetch();
  for (int iteration = 1; iteration <= 3; ++iteration) {
    // In training the prefetch is answered while the batch computes; here, wait for it
    // (the first one reflects the same minimum clock as the pull before it: not told apart).
    if (iteration > 1) {
      testing::WaitFor([&] { return client_->counters().pulled_min_clock == iteration - 1; }, 10s);
      ASSERT_EQ(client_->counters().pulled_min_clock, iteration - 1);
    }
    store_->Push(0, grad.data());
    ASSERT_TRUE(store_->EndIterationBeforePull().ok());
    const int held = large_.load();
    ASSERT_TRUE(store_->PullAll(&values).ok());  // the prefetch, swapped in
    if (iteration > 1) {
      EXPECT_EQ(large_.load(), held) << "still held";
    }
    store_->Prefetch();
    if (iteration > 1) {
      EXPECT_EQ(large_.load(), held + 1) << "pushes, clock and prefetch in one message";
    }
    // The prefetch started one iteration ago, before that iteration's push.
    EXPECT_EQ(values[0].front(), -static_cast<float>(iteration - 1));
  }
  // The last batch's clock held, then a chunk request (a wait) instead of a pull.
  store_->Push(0, grad.data());
  ASSERT_TRUE(store_->EndIterationBeforePull().ok());
  DataPlan plan{64, 64, 1, 1};
  auto grant = store_->NextChunk(plan, nullptr);
  ASSERT_TRUE(grant.ok()) << grant.status();
  // The request went after the held clock, which therefore reached the shard.
  EXPECT_TRUE(cluster.WaitFor(0, [](const MemoryCluster::View& v) { return v.min_clock == 4; }));
  ASSERT_TRUE(store_->Finish().ok());
}

TEST_F(RemoteParamsTest, NoPrefetchUnderStalenessZero) {
  MemoryCluster cluster(1);
  Open(cluster, 0, {Param("a", 8, 2)});
  std::vector<std::vector<float>> values;
  ASSERT_TRUE(store_->PullAll(&values).ok());
  uint64_t pulls = client_->counters().pulls;
  store_->Prefetch();
  EXPECT_EQ(client_->counters().pulls, pulls);
  std::vector<float> grad(16, 1.f);
  store_->Push(0, grad.data());
  ASSERT_TRUE(store_->EndIteration().ok());
  ASSERT_TRUE(store_->PullAll(&values).ok());
  EXPECT_EQ(values[0].front(), -1.f) << "pulled afresh: this iteration's push is in";
}

TEST_F(RemoteParamsTest, RejoiningDropsThePrefetchAndPullsForTheNewClock) {
  server::ShardOptions o;
  o.lease_ms = 60'000;
  MemoryCluster cluster(1, o);
  std::atomic<bool> cut{false};
  // Requests (heartbeats) are lost while `cut`; replies on their way still arrive (a
  // reply lost on a live connection is never asked for again).
  cluster.network().AddRule([&cut](const Packet& p) -> std::optional<Verdict> {
    if (cut.load() && p.direction == Direction::kToShard) return Verdict{Verdict::kDrop};
    return std::nullopt;
  });
  Open(cluster, 1, {Param("a", 8, 2)});
  std::vector<std::vector<float>> values;
  std::vector<float> grad(16, 1.f);
  ASSERT_TRUE(store_->PullAll(&values).ok());
  store_->Push(0, grad.data());
  ASSERT_TRUE(store_->EndIteration().ok());
  ASSERT_TRUE(store_->PullAll(&values).ok());
  store_->Prefetch();
  cut.store(true);  // no heartbeat arrives while the lease runs out
  ASSERT_TRUE(cluster.AdvanceUntil(0, 61'000, [](const MemoryCluster::View& v) {
    return v.counters.evictions == 1;
  })) << "the lease ran out";
  cut.store(false);
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!store_->needs_rejoin() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_TRUE(store_->needs_rejoin());
  ASSERT_TRUE(store_->Rejoin().ok());
  EXPECT_FALSE(store_->needs_rejoin());
  uint64_t pulls = client_->counters().pulls;
  ASSERT_TRUE(store_->PullAll(&values).ok());
  EXPECT_EQ(client_->counters().pulls, pulls + 1) << "no prefetch is left to swap in";
  EXPECT_EQ(values[0].front(), -1.f);
}

// The same iteration of dense and sparse pulls and pushes through 2 shards and through
// LocalParams gives the same values: rows start at the initializer (zeros), a key pushed
// twice in a batch is summed, a key never pushed stays, and the dense table is unchanged
// by the sparse push.
TEST_F(RemoteParamsTest, SparseRowsArePulledWithTheDenseTablesAndUpdatedAsLocally) {
  MemoryCluster cluster(2);
  Open(cluster, 0, {Param("a", 8, 2)});
  std::unique_ptr<ParamStore> local = MakeLocalParams();
  ASSERT_TRUE(local->Setup({Param("a", 8, 2)}, Sgd()).ok());
  ParamSpec emb = Param("emb", 0, 3);
  ASSERT_TRUE(store_->SetupSparse(emb, Sgd()).ok());
  ASSERT_TRUE(local->SetupSparse(emb, Sgd()).ok());
  const std::vector<uint64_t> keys = {5, 1ULL << 60, 77, 5};
  const std::vector<float> grad = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 30};
  std::vector<std::vector<float>> results;
  for (ParamStore* s : {store_.get(), local.get()}) {
    std::vector<std::vector<float>> values;
    std::vector<float> rows;
    ASSERT_TRUE(s->PullAllSparse(&values, keys, &rows).ok());
    ASSERT_EQ(rows, std::vector<float>(12, 0.f));
    ASSERT_EQ(values.size(), 1u);
    s->PushSparse(std::span<const uint64_t>(keys).first(3),
                  grad.data());                                               // key 5 once here...
    s->PushSparse(std::span<const uint64_t>(keys).last(1), grad.data() + 9);  // ...and again
    ASSERT_TRUE(s->EndIteration().ok());
    const std::vector<uint64_t> again = {5, 1ULL << 60, 77, 999};
    ASSERT_TRUE(s->PullAllSparse(&values, again, &rows).ok());
    EXPECT_EQ(values[0], std::vector<float>(16, 0.f));
    results.push_back(rows);
  }
  EXPECT_EQ(results[0], (std::vector<float>{-11, -22, -33, -4, -5, -6, -7, -8, -9, 0, 0, 0}));
  EXPECT_EQ(results[0], results[1]);
}

// Under staleness 1 the next iteration's rows are prefetched with its dense values: the
// pull of the same keys takes them without a request; other keys (an evaluation) are
// pulled afresh and see the earlier iteration's push.
TEST_F(RemoteParamsTest, PrefetchedRowsAreTakenByThePullOfTheSameKeys) {
  MemoryCluster cluster(2);
  Open(cluster, 1, {Param("a", 8, 2)});
  ASSERT_TRUE(store_->SetupSparse(Param("emb", 0, 2), Sgd()).ok());
  const std::vector<uint64_t> now = {3, 4}, next = {4, 5};
  std::vector<std::vector<float>> values;
  std::vector<float> rows;
  ASSERT_TRUE(store_->PullAllSparse(&values, now, &rows).ok());
  store_->PrefetchSparse(next);
  const std::vector<float> grad = {1, 1, 2, 2};
  store_->PushSparse(now, grad.data());
  ASSERT_TRUE(store_->EndIteration().ok());
  uint64_t pulls = client_->counters().pulls;
  ASSERT_TRUE(store_->PullAllSparse(&values, next, &rows).ok());
  EXPECT_EQ(client_->counters().pulls, pulls) << "the prefetch was taken";
  // Read for clock 1 under staleness 1, before the held push went out: it may miss it.
  EXPECT_EQ(rows, (std::vector<float>{0, 0, 0, 0}));
  store_->PrefetchSparse(now);
  ASSERT_TRUE(store_->EndIteration().ok());
  ASSERT_TRUE(store_->PullAllSparse(&values, next, &rows).ok());  // not the prefetched keys
  EXPECT_GT(client_->counters().pulls, pulls);
  EXPECT_EQ(rows, (std::vector<float>{-2, -2, 0, 0}));
}

}  // namespace
}  // namespace leash::worker
