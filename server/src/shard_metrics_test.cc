// Tests that ShardMetrics mirrors a shard's counters, gauges and snapshot durations.
#include "leash/server/shard_metrics.h"

#include <gtest/gtest.h>

#include "leash/common/metrics.h"
#include "leash/common/wire.h"

namespace leash::server {
namespace {

double Value(const prometheus::Registry& r, const std::string& name,
             const std::string& shard = "0") {
  auto v = CollectedValue(r, name, {{"shard", shard}});
  EXPECT_TRUE(v.has_value()) << name << " missing";
  return v.value_or(-1e9);
}

TEST(ShardMetricsTest, MirrorsCountersAndGaugesOfTheShard) {
  MemorySnapshotStore store;
  int64_t now = 1000;
  ShardOptions o;
  o.lease_ms = 1000;
  o.checkpoint_interval_ms = 0;
  Shard shard(o, &store, [&] { return now; });
  prometheus::Registry registry;
  ShardMetrics metrics(registry, shard);
  EXPECT_EQ(Value(registry, "leash_shard_pushes_total"), 0);
  EXPECT_EQ(Value(registry, "leash_shard_live_workers"), 0);
  EXPECT_EQ(Value(registry, "leash_shard_last_snapshot_clock"), -1);

  std::vector<Outgoing> out;
  shard.Handle("a", MakeRegister(1, 7, 1, "a"), &out);
  shard.Handle("b", MakeRegister(2, 8, 1, "b"), &out);
  TableSpec t;
  t.name = "w";
  t.rows = 4;
  t.cols = 2;
  shard.Handle("a", MakeCreateTable(3, t), &out);
  Rows rows;
  rows.begin = 0;
  rows.end = 4;
  std::vector<float> g(8, 0.5f);
  shard.Handle("a", MakePush(4, 0, rows, 7, 1, 1, DType::kF32, EncodeValues(g, DType::kF32)), &out);
  shard.Handle("a", MakePush(4, 0, rows, 7, 1, 1, DType::kF32, EncodeValues(g, DType::kF32)),
               &out);  // resent
  shard.Handle("a", MakeClock(5, 7, 2), &out);
  shard.Handle("a", MakePull(6, 0, rows, 7, 2, 0), &out);   // parked: b is still at clock 0
  shard.Handle("b", MakePull(7, 0, rows, 8, 0, 0), &out);   // served
  shard.Handle("b", MakePull(8, 99, rows, 8, 0, 0), &out);  // unknown table: an error
  metrics.Publish(shard);

  EXPECT_EQ(Value(registry, "leash_shard_pushes_total"), 1);
  EXPECT_EQ(Value(registry, "leash_shard_duplicate_pushes_total"), 1);
  EXPECT_EQ(Value(registry, "leash_shard_pulls_total"), 1);
  EXPECT_EQ(Value(registry, "leash_shard_parked_pulls_total"), 1);
  EXPECT_EQ(Value(registry, "leash_shard_parked_pulls"), 1);
  EXPECT_EQ(Value(registry, "leash_shard_errors_total"), 1);
  EXPECT_EQ(Value(registry, "leash_shard_live_workers"), 2);
  EXPECT_EQ(Value(registry, "leash_shard_min_clock"), 0);
  EXPECT_EQ(Value(registry, "leash_shard_max_clock"), 2);
  EXPECT_EQ(Value(registry, "leash_shard_staleness_iterations"), 2);
  EXPECT_EQ(Value(registry, "leash_shard_received_bytes_total"),
            static_cast<double>(shard.counters().bytes_in));
  EXPECT_GT(Value(registry, "leash_shard_sent_bytes_total"), 0);
  EXPECT_EQ(Value(registry, "leash_job_epochs_done"), 0);

  // b falls silent: its lease expires, the parked pull is released.
  now += 5000;
  shard.Handle("a", MakeHeartbeat(9, 7, 1), &out);
  shard.Tick(&out);
  ASSERT_TRUE(shard.Checkpoint().ok());
  metrics.Publish(shard);
  metrics.Publish(shard);  // publishing twice adds nothing
  EXPECT_EQ(Value(registry, "leash_shard_evictions_total"), 1);
  EXPECT_EQ(Value(registry, "leash_shard_live_workers"), 1);
  EXPECT_EQ(Value(registry, "leash_shard_parked_pulls"), 0);
  EXPECT_EQ(Value(registry, "leash_shard_pulls_total"), 2);
  EXPECT_EQ(Value(registry, "leash_shard_min_clock"), 2);
  EXPECT_EQ(Value(registry, "leash_shard_staleness_iterations"), 0);
  // One snapshot when the table was created, one now.
  EXPECT_EQ(store.saves(), 2);
  EXPECT_EQ(Value(registry, "leash_shard_snapshots_total"), 2);
  EXPECT_EQ(Value(registry, "leash_shard_last_snapshot_clock"), 2);
  EXPECT_EQ(Value(registry, "leash_shard_snapshot_duration_seconds_count"), 2);
  EXPECT_GE(Value(registry, "leash_shard_snapshot_duration_seconds_sum"), 0);
}

// A replica replaces its Shard when it installs a snapshot, and the new one counts from 0:
// the metrics go on counting from there instead of waiting for the old totals.
TEST(ShardMetricsTest, CountsGoOnAcrossANewShard) {
  MemorySnapshotStore store;
  ShardOptions o;
  auto registered = [&](Shard& shard) {
    std::vector<Outgoing> out;
    shard.Handle("a", MakeRegister(1, 7, 1, "a"), &out);
  };
  auto first = std::make_unique<Shard>(o, &store, [] { return int64_t{0}; });
  prometheus::Registry registry;
  ShardMetrics metrics(registry, *first);
  std::vector<Outgoing> out;
  registered(*first);
  first->Handle("a", MakeStats(2), &out);
  first->Handle("a", MakeStats(3), &out);
  metrics.Publish(*first);
  const double bytes = Value(registry, "leash_shard_received_bytes_total");
  EXPECT_GT(bytes, 0);
  Shard second(o, &store, [] { return int64_t{0}; });
  registered(second);
  metrics.Publish(second);
  EXPECT_EQ(Value(registry, "leash_shard_received_bytes_total"),
            bytes + static_cast<double>(second.counters().bytes_in));
}

TEST(ShardMetricsTest, LabelsByShardAndLeavesJobProgressToShardZero) {
  MemorySnapshotStore store;
  ShardOptions o;
  o.shard = 1;
  o.num_shards = 2;
  Shard shard(o, &store, [] { return int64_t{0}; });
  prometheus::Registry registry;
  ShardMetrics metrics(registry, shard);
  EXPECT_EQ(Value(registry, "leash_shard_live_workers", "1"), 0);
  EXPECT_FALSE(CollectedValue(registry, "leash_shard_live_workers", {{"shard", "0"}}).has_value());
  EXPECT_FALSE(CollectedValue(registry, "leash_job_epochs_done").has_value());
}

}  // namespace
}  // namespace leash::server
