// Publishes one shard's counters and gauges as Prometheus metrics (leash_shard_*, label
// shard="N") in a registry, and every snapshot's duration in a histogram. The shard
// itself knows nothing of Prometheus: leash-server calls Publish() from the serving
// thread after every turn of Serve's loop, and the snapshot observer this class installs
// runs on that thread too. Not thread-safe itself (one serving thread drives it); the
// registry it writes to is, so scrapes from the HTTP threads are safe at any time.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <utility>
#include <vector>

#include "leash/server/shard.h"

namespace leash::server {

class ShardMetrics {
 public:
  // Registers the shard's metrics in `registry` and installs a snapshot observer on
  // `shard` that records into the registry: the registry must outlive this object and
  // the shard's last snapshot.
  ShardMetrics(prometheus::Registry& registry, Shard& shard);
  ShardMetrics(const ShardMetrics&) = delete;
  ShardMetrics& operator=(const ShardMetrics&) = delete;

  // Copies the shard's current counters and gauges into the registry.
  void Publish(const Shard& shard);
  // What records a snapshot's duration (the constructor gives it to its shard; a replica,
  // whose Shard is replaced on a snapshot install, keeps it: Replica::set_snapshot_observer).
  Shard::SnapshotObserver snapshot_observer() const {
    prometheus::Histogram* h = snapshot_seconds_;
    return [h](double seconds) { h->Observe(seconds); };
  }
  // Sets leash_shard_resident_bytes (leash-server calls it a few times a second: reading
  // the process's memory is a system call, kept off every turn of the loop).
  void SetResidentBytes(uint64_t bytes);

 private:
  // A shard counter mirrored by a Prometheus counter: Publish() adds what it grew by.
  struct Mirrored {
    uint64_t ShardCounters::*field;
    prometheus::Counter* counter;
    uint64_t published = 0;
  };

  // One sparse table's series (label table="name"), added when Publish first sees it.
  struct SparseSeries {
    uint32_t table_id = 0;
    prometheus::Gauge* resident_rows;
    prometheus::Gauge* memory_bytes;
    std::vector<std::pair<uint64_t ps::SparseCounters::*, prometheus::Counter*>> counters;
    ps::SparseCounters published;
  };
  void AddSparseSeries(const ps::SparseTable& table);

  prometheus::Labels labels_;
  prometheus::Family<prometheus::Gauge>* sparse_resident_;
  prometheus::Family<prometheus::Gauge>* sparse_memory_;
  std::vector<std::pair<uint64_t ps::SparseCounters::*, prometheus::Family<prometheus::Counter>*>>
      sparse_counter_families_;
  std::vector<SparseSeries> sparse_;
  size_t tables_seen_ = 0;
  prometheus::Gauge* memory_used_;
  prometheus::Gauge* memory_budget_;
  prometheus::Gauge* resident_;
  std::vector<Mirrored> counters_;
  prometheus::Gauge* parked_pulls_;
  prometheus::Gauge* min_clock_;
  prometheus::Gauge* max_clock_;
  prometheus::Gauge* staleness_;
  prometheus::Gauge* live_workers_;
  prometheus::Gauge* last_snapshot_clock_;
  prometheus::Gauge* epochs_done_ = nullptr;  // shard 0 only (it leases the data chunks)
  prometheus::Gauge* chunks_done_ = nullptr;
  prometheus::Histogram* snapshot_seconds_;
};

}  // namespace leash::server
