// Unit tests of data-chunk leases: coverage per epoch, failure, pipelining, snapshots.
#include "leash/ps/coverage.h"

#include <gtest/gtest.h>

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
  ASSERT_TRUE(d.SetPlan(Plan(6, 3, 2)).ok());
  ChunkGrant a = d.Next(1);
  ChunkGrant b = d.Next(2);
  EXPECT_EQ(a.epoch, 0u);
  EXPECT_EQ(b.epoch, 0u);
  ChunkGrant c = d.Next(1);  // epoch 0 all leased: worker 1 goes on with epoch 1
  ASSERT_EQ(c.kind, ChunkGrant::Kind::kChunk);
  EXPECT_EQ(c.epoch, 1u);
  d.Next(1);
  EXPECT_EQ(d.Next(1).kind, ChunkGrant::Kind::kWait);  // no more than two epochs in flight
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
