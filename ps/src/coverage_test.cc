// Unit tests of data-chunk leases: coverage per epoch, failure, pipelining, snapshots.
#include "leash/ps/coverage.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <set>

namespace leash::ps {
namespace {

DataPlan Plan(uint64_t samples = 10, uint32_t chunk = 3, uint32_t epochs = 2) {
  return {samples, chunk, epochs, 7};
}

TEST(DataCoverageTest, EveryChunkOnceAndChunksCoverTheDataset) {
  DataCoverage d;
  ASSERT_TRUE(d.SetPlan(Plan(10, 3, 1)).ok());
  std::set<uint32_t> seen;
  uint64_t covered = 0;
  while (true) {
    ChunkGrant g = d.Next(1);
    if (g.kind != ChunkGrant::Kind::kChunk) {
      EXPECT_EQ(g.kind, ChunkGrant::Kind::kFinished);
      break;
    }
    EXPECT_TRUE(seen.insert(g.chunk).second);
    EXPECT_EQ(g.begin, g.chunk * 3u);
    EXPECT_EQ(g.end, std::min<uint64_t>(10, g.begin + 3));
    covered += g.end - g.begin;
    d.Complete(g.epoch, g.chunk);
  }
  EXPECT_EQ(seen.size(), 4u);
  EXPECT_EQ(covered, 10u);
  EXPECT_EQ(d.Progress().epochs_done, 1u);
}

TEST(DataCoverageTest, NextEpochIsHandedOutOnceTheCurrentIsAllLeased) {
  DataCoverage d;
  ASSERT_TRUE(d.SetPlan(Plan(6, 3, 3)).ok());
  ChunkGrant a = d.Next(1);
  ChunkGrant b = d.Next(2);  // worker 2 holds its chunk of epoch 0 to the end
  EXPECT_EQ(a.epoch, 0u);
  EXPECT_EQ(b.epoch, 0u);
  d.Complete(a.epoch, a.chunk);
  ChunkGrant c = d.Next(1);  // epoch 0 all leased or done: worker 1 goes on with epoch 1
  ASSERT_EQ(c.kind, ChunkGrant::Kind::kChunk);
  EXPECT_EQ(c.epoch, 1u);
  d.Complete(c.epoch, c.chunk);
  ChunkGrant e = d.Next(1);
  EXPECT_EQ(e.epoch, 1u);
  d.Complete(e.epoch, e.chunk);
  EXPECT_EQ(d.Next(1).kind, ChunkGrant::Kind::kWait);  // no more than two epochs in flight
  d.Complete(b.epoch, b.chunk);
  EXPECT_EQ(d.Next(1).epoch, 2u);
}

// Work in proportion to speed: a 3x straggler (1 against the others' 6) takes chunks while
// enough are left, then leaves the last ones to the others, who train every chunk once.
TEST(DataCoverageTest, ASlowWorkerLeavesTheLastChunksToFasterOnes) {
  DataCoverage d;
  ASSERT_TRUE(d.SetPlan(Plan(30, 1, 1)).ok());  // 30 chunks of 1 sample
  const DataCoverage::Speeds slow{1000, 6000};
  const DataCoverage::Speeds fast{3000, 4000};  // the other fast one and the straggler
  std::map<uint32_t, int> trained;
  std::map<uint64_t, std::optional<ChunkGrant>> held;  // worker -> its chunk
  int slow_chunks = 0;
  bool finished = false;
  // Each round the fast workers train 3 chunks each and the slow one at most 1.
  for (int round = 0; round < 100 && !finished; ++round) {
    finished = true;
    for (uint64_t w : {1, 2, 3}) {
      const int turns = w == 3 ? 1 : 3;
      for (int k = 0; k < turns; ++k) {
        auto& h = held[w];
        if (h && h->kind == ChunkGrant::Kind::kChunk) {
          ++trained[h->chunk];
          d.Complete(h->epoch, h->chunk);
        }
        const uint32_t unfinished = d.Progress().num_chunks - d.Progress().chunks_done;
        h = d.Next(w, w == 3 ? &slow : &fast);
        if (w == 3 && h->kind == ChunkGrant::Kind::kChunk) {
          ++slow_chunks;
          // Leased only while 6 <= pending + (leased to others) / 2: 7 or more unfinished.
          EXPECT_GE(unfinished, 7u) << "chunk " << h->chunk;
        }
        if (h->kind != ChunkGrant::Kind::kFinished) finished = false;
      }
    }
  }
  ASSERT_TRUE(finished);
  EXPECT_GT(slow_chunks, 0);
  EXPECT_GT(d.held_back(), 0u);
  ASSERT_EQ(trained.size(), 30u);
  for (const auto& [chunk, times] : trained) EXPECT_EQ(times, 1) << "chunk " << chunk;
  EXPECT_EQ(d.Progress().epochs_done, 1u);
}

// With nobody else training a chunk, even the slowest worker takes what is left.
TEST(DataCoverageTest, ASlowWorkerTakesTheLastChunkWhenNobodyElseIsTraining) {
  DataCoverage d;
  ASSERT_TRUE(d.SetPlan(Plan(1, 1, 1)).ok());
  const DataCoverage::Speeds slow{1000, 6000};
  ASSERT_EQ(d.Next(3, &slow).kind, ChunkGrant::Kind::kChunk);
  EXPECT_EQ(d.held_back(), 0u);
}

// Equal workers, or unknown speeds, never hold back: the last chunk is leased.
TEST(DataCoverageTest, EqualOrUnknownSpeedsLeaseTheLastChunk) {
  for (const DataCoverage::Speeds s :
       {DataCoverage::Speeds{3000, 6000}, DataCoverage::Speeds{0, 6000},
        DataCoverage::Speeds{1000, 0}}) {
    DataCoverage d;
    ASSERT_TRUE(d.SetPlan(Plan(3, 1, 1)).ok());
    ASSERT_EQ(d.Next(1).kind, ChunkGrant::Kind::kChunk);
    ASSERT_EQ(d.Next(2).kind, ChunkGrant::Kind::kChunk);
    // One pending, two in progress elsewhere: 6000 / 3000 = 2 <= 1 + 2 / 2.
    EXPECT_EQ(d.Next(3, &s).kind, ChunkGrant::Kind::kChunk) << s.own << " " << s.others;
    EXPECT_EQ(d.held_back(), 0u);
  }
}

// Found by the docker test's replicated case: a chunk request resent after a failover (the
// new primary had applied the first, whose reply was lost) leased the worker a second
// chunk that nobody trained, and every worker waited for the epoch's last chunk forever.
TEST(DataCoverageTest, ResentRequestIsAnsweredWithTheChunkTheWorkerHolds) {
  DataCoverage d;
  ASSERT_TRUE(d.SetPlan(Plan(30, 3, 3)).ok());
  ChunkGrant first = d.Next(1);
  ChunkGrant again = d.Next(1);
  EXPECT_EQ(again.kind, ChunkGrant::Kind::kChunk);
  EXPECT_EQ(again.epoch, first.epoch);
  EXPECT_EQ(again.chunk, first.chunk);
  EXPECT_EQ(again.begin, first.begin);
  EXPECT_EQ(d.Progress().chunks_leased, 1u);
  // Two workers whose every request (a report and the next lease) arrives twice: the job
  // ends, each chunk of each epoch trained once.
  std::optional<ChunkGrant> held[2] = {first, std::nullopt};
  for (int round = 0; round < 100; ++round) {
    for (uint64_t w = 1; w <= 2; ++w) {
      auto& h = held[w - 1];
      for (int copy = 0; copy < 2; ++copy) {
        if (h) d.Complete(h->epoch, h->chunk);
        ChunkGrant g = d.Next(w);
        if (copy == 1) {
          h.reset();
          if (g.kind == ChunkGrant::Kind::kChunk) h = g;
        }
      }
    }
  }
  EXPECT_EQ(d.Progress().epochs_done, 3u);
  EXPECT_EQ(d.Next(1).kind, ChunkGrant::Kind::kFinished);
}

// A replica caught up from a snapshot applies the primary's log from there: it must hold
// the same leases and queue, or it grants other chunks than the primary did.
TEST(DataCoverageTest, SerializeExactKeepsLeasesAndTheQueueSoACopyGrantsTheSameChunks) {
  DataCoverage d;
  ASSERT_TRUE(d.SetPlan(Plan(30, 3, 3)).ok());
  ChunkGrant a = d.Next(1);
  ChunkGrant b = d.Next(2);
  d.Next(3);
  d.Complete(a.epoch, a.chunk);
  d.Release(2);  // b goes to the front of the queue
  auto copy = DataCoverage::Deserialize(d.SerializeExact());
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->SerializeExact(), d.SerializeExact());
  EXPECT_EQ(copy->Progress().chunks_leased, 1u);
  for (int i = 0; i < 40; ++i) {
    const uint64_t w = 1 + static_cast<uint64_t>(i % 3);
    ChunkGrant x = d.Next(w);
    ChunkGrant y = copy->Next(w);
    ASSERT_EQ(x.kind, y.kind) << "request " << i;
    ASSERT_EQ(x.epoch, y.epoch) << "request " << i;
    ASSERT_EQ(x.chunk, y.chunk) << "request " << i;
    if (i == 0) {
      EXPECT_EQ(x.chunk, b.chunk);
    }
    if (x.kind == ChunkGrant::Kind::kChunk && i % 2 == 0) {
      d.Complete(x.epoch, x.chunk);
      copy->Complete(y.epoch, y.chunk);
    }
  }
  // The progress-only form drops the leases, as before.
  auto progress = DataCoverage::Deserialize(d.Serialize());
  ASSERT_TRUE(progress.ok());
  EXPECT_EQ(progress->Progress().chunks_leased, 0u);
  // A cut record is malformed.
  auto bytes = d.SerializeExact();
  bytes.resize(bytes.size() - 8);
  EXPECT_EQ(DataCoverage::Deserialize(bytes).status().code(), StatusCode::kDataLoss);
}

TEST(DataCoverageTest, ChunksOfAFailedWorkerGoToOthers) {
  DataCoverage d;
  ASSERT_TRUE(d.SetPlan(Plan(9, 3, 1)).ok());
  ChunkGrant lost = d.Next(1);
  ChunkGrant b = d.Next(2);
  d.Complete(b.epoch, b.chunk);
  EXPECT_EQ(d.Release(1), 1u);
  ChunkGrant again = d.Next(2);
  EXPECT_EQ(again.chunk, lost.chunk);  // the released chunk comes first
  d.Complete(again.epoch, again.chunk);
  ChunkGrant last = d.Next(2);
  d.Complete(last.epoch, last.chunk);
  EXPECT_EQ(d.Next(2).kind, ChunkGrant::Kind::kFinished);
}

TEST(DataCoverageTest, LateReportOfAReleasedChunkCountsOnce) {
  DataCoverage d;
  ASSERT_TRUE(d.SetPlan(Plan(3, 3, 2)).ok());
  ChunkGrant g = d.Next(1);
  d.Release(1);                  // worker 1 evicted (it was only paused)
  d.Complete(g.epoch, g.chunk);  // ... and reports the chunk after all
  EXPECT_EQ(d.times_completed(0, g.chunk), 1u);
  EXPECT_EQ(d.Progress().epochs_done, 1u);
  ChunkGrant next = d.Next(2);
  EXPECT_EQ(next.epoch, 1u);
}

TEST(DataCoverageTest, WaitWhileOthersHoldTheLastChunks) {
  DataCoverage d;
  ASSERT_TRUE(d.SetPlan(Plan(3, 3, 1)).ok());
  ChunkGrant g = d.Next(1);
  EXPECT_EQ(d.Next(2).kind, ChunkGrant::Kind::kWait);
  d.Complete(g.epoch, g.chunk);
  EXPECT_EQ(d.Next(2).kind, ChunkGrant::Kind::kFinished);
}

TEST(DataCoverageTest, PlansMustAgree) {
  DataCoverage d;
  EXPECT_FALSE(d.SetPlan(Plan(0, 3, 1)).ok());
  ASSERT_TRUE(d.SetPlan(Plan()).ok());
  EXPECT_TRUE(d.SetPlan(Plan()).ok());
  Status st = d.SetPlan(Plan(10, 3, 5));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("--epochs"), std::string::npos);
}

TEST(DataCoverageTest, SerializeKeepsProgressAndDropsLeases) {
  DataCoverage d;
  ASSERT_TRUE(d.SetPlan(Plan(12, 3, 3)).ok());
  for (int i = 0; i < 4; ++i) {  // finish epoch 0
    ChunkGrant g = d.Next(1);
    d.Complete(g.epoch, g.chunk);
  }
  ChunkGrant done = d.Next(1);
  d.Complete(done.epoch, done.chunk);
  ChunkGrant held = d.Next(2);
  auto r = DataCoverage::Deserialize(d.Serialize());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->Progress().epochs_done, 1u);
  EXPECT_EQ(r->Progress().chunks_done, 1u);
  EXPECT_EQ(r->Progress().chunks_leased, 0u);
  std::set<uint32_t> rest;
  while (true) {
    ChunkGrant g = r->Next(3);
    if (g.kind != ChunkGrant::Kind::kChunk || g.epoch != 1) break;
    rest.insert(g.chunk);
    r->Complete(g.epoch, g.chunk);
  }
  EXPECT_EQ(rest.size(), 3u);
  EXPECT_TRUE(rest.count(held.chunk));
  EXPECT_FALSE(rest.count(done.chunk));
}

TEST(DataCoverageTest, MalformedStateIsDataLoss) {
  DataCoverage d;
  ASSERT_TRUE(d.SetPlan(Plan()).ok());
  auto bytes = d.Serialize();
  bytes.pop_back();
  EXPECT_EQ(DataCoverage::Deserialize(bytes).status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(DataCoverage::Deserialize({}).ok());
}

// Found by fuzz_shard/fuzz_wire: a ChunkRequest whose plan cut the data into 2^32 chunks
// made shard 0 allocate and shuffle gigabytes (a hang, then out of memory).
TEST(DataCoverageTest, RejectsPlansWithTooManyChunks) {
  DataCoverage d;
  Status st = d.SetPlan({UINT64_MAX, 1, 1, 0});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("--chunk-size"), std::string::npos) << st;
  EXPECT_FALSE(d.SetPlan({kMaxChunks + 1, 1, 1, 0}).ok());
  // num_samples + chunk_size - 1 overflowed to a handful of chunks.
  EXPECT_FALSE(d.SetPlan({UINT64_MAX, UINT32_MAX, 1, 0}).ok());
  EXPECT_EQ(PlanChunks(DataPlan{UINT64_MAX, 2, 1, 0}), uint64_t{1} << 63);
  ASSERT_TRUE(d.SetPlan({kMaxChunks, 1, 1, 0}).ok());
  EXPECT_EQ(d.Next(1).kind, ChunkGrant::Kind::kChunk);
  EXPECT_EQ(d.Progress().num_chunks, kMaxChunks);
}

// Found by fuzz_wire: a worker reporting a chunk of an epoch it was never granted (two or
// more ahead) opened that epoch, and the snapshot then held three epochs, which
// Deserialize refuses: shard 0 could not recover after a restart.
TEST(DataCoverageTest, ReportsOfEpochsNeverGrantedAreIgnoredAndSnapshotsStayReadable) {
  DataCoverage d;
  ASSERT_TRUE(d.SetPlan(Plan(10, 3, 5)).ok());
  ChunkGrant g = d.Next(1);
  ASSERT_EQ(g.kind, ChunkGrant::Kind::kChunk);
  d.Complete(3, 0);
  d.Complete(4, 1);
  EXPECT_EQ(d.times_completed(3, 0), 0u);
  auto back = DataCoverage::Deserialize(d.Serialize());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Serialize(), d.Serialize());
  d.Complete(g.epoch, g.chunk);
  EXPECT_EQ(d.times_completed(g.epoch, g.chunk), 1u);
}

}  // namespace
}  // namespace leash::ps
