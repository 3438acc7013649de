// Publishes one replica's state as Prometheus metrics (leash_replica_*, labels shard="N" and
// replica="R"; per other replica, backup="B"): its role and term, how far its log is
// committed and applied, what a primary holds back and how far each backup is behind, the
// failovers it led and the snapshot transfers it received, and its durable log. Every
// replica publishes its own, backups included, so a scrape of each process shows what the
// primary's `leashctl status` cannot: a backup's view, and its durable log. leash-server
// calls Publish() from the serving thread after each turn of the replica's loop; not
// thread-safe itself, the registry is (scrapes from the HTTP threads are safe at any time).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <vector>

#include "leash/server/replica.h"

namespace leash::server {

class ReplicaMetrics {
 public:
  // Registers the replica's metrics in `registry` (which must outlive this object).
  ReplicaMetrics(prometheus::Registry& registry, const Replica& replica);
  ReplicaMetrics(const ReplicaMetrics&) = delete;
  ReplicaMetrics& operator=(const ReplicaMetrics&) = delete;

  // Copies the replica's current state into the registry.
  void Publish(const Replica& replica);

 private:
  // A replica's count mirrored by a Prometheus counter: Publish() adds what it grew by.
  struct Mirrored {
    uint64_t (Replica::*get)() const;
    prometheus::Counter* counter;
    uint64_t published = 0;
  };
  // The gauges of one other replica, as this one (when primary) sees it.
  struct Backup {
    uint32_t replica;
    prometheus::Gauge* in_sync;
    prometheus::Gauge* entries_behind;
    prometheus::Gauge* seconds_behind;
    prometheus::Gauge* seconds_since_ack;
  };

  std::vector<Mirrored> counters_;
  std::vector<Backup> backups_;
  prometheus::Gauge* primary_;
  prometheus::Gauge* term_;
  prometheus::Gauge* log_index_;
  prometheus::Gauge* commit_index_;
  prometheus::Gauge* applied_index_;
  prometheus::Gauge* log_entries_;
  prometheus::Gauge* log_bytes_;
  prometheus::Gauge* held_replies_;
  prometheus::Gauge* has_state_;
  prometheus::Gauge* in_sync_;
  prometheus::Gauge* lag_;
  prometheus::Gauge* durable_failed_;
  prometheus::Gauge* lease_valid_;
  prometheus::Counter* durable_sync_seconds_;
  double durable_sync_seconds_published_ = 0;
};

}  // namespace leash::server
