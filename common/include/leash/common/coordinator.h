// Membership, primary election and discovery of replicated shards (`--replicas R`, R > 1).
// The production coordinator is etcd (etcd_coordinator.h, through etcd's v3 JSON gateway);
// unit tests inject faults with the in-memory one (tests/support/memory_coordinator.h).
// Without a coordinator (static `--servers`, R = 1) none of this is used.
//
// What the coordinator keeps, per job and shard:
//  - every live replica's address, registered under the replica's lease (it disappears when
//    the process dies or is cut off from the coordinator for the lease's TTL);
//  - the primary, a key bound to the primary's lease, with its term;
//  - the term counter, which only grows, and the in-sync set: the replicas known to hold
//    every log entry the primary has acknowledged. Both outlive every lease.
// Only a member of the in-sync set may become primary (an empty set, before any entry was
// acknowledged, lets any live replica lead). A primary removes a backup from the set here,
// fenced by its term, before it acknowledges anything that backup does not hold. So a new
// primary holds every acknowledged entry, and a deposed one cannot gather acknowledgements:
// its backups refuse entries of a term older than the newest they know, and it cannot shrink
// the set without them. A primary alone in the set has nobody to fence it: it acknowledges
// only while LeaseValid(). (With backups in the set, training therefore goes on while the
// coordinator is down, as long as every backup keeps up.)
//
// Thread-safety: every method of both interfaces is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "leash/common/status.h"

namespace leash {

// One replica process of a shard, as workers and its peers reach it.
struct ReplicaAddress {
  uint32_t replica = 0;  // 0..R-1, stable across restarts (the pod ordinal on Kubernetes)
  std::string endpoint;  // "tcp://host:port" (workers and peer replicas connect here)
  uint64_t boot_id = 0;  // changes with every process start
  // This replica, as its primary's sole in-sync backup, answers workers' pushes and clocks
  // itself (--backup-answers): a worker connects to it too (ClientTransport::ConnectBackup).
  bool answers = false;
  bool operator==(const ReplicaAddress&) const = default;
};

// What the coordinator knows about one shard's replica group.
struct ShardView {
  uint32_t shard = 0;
  uint64_t term = 0;  // the current primary's term; 0 while the shard has no primary
  std::optional<ReplicaAddress> primary;
  std::vector<ReplicaAddress> live;  // replicas registered under a live lease, by replica
  std::vector<uint32_t> in_sync;     // replicas that may become primary, sorted
  bool operator==(const ShardView&) const = default;
};

// Every shard of a job. `revision` grows with every change the coordinator makes (it is
// etcd's store revision there); equal revisions mean equal views.
struct ClusterView {
  uint32_t num_shards = 0;
  uint32_t replicas = 0;
  std::vector<ShardView> shards;  // shards[s].shard == s
  int64_t revision = 0;
};

// A shard replica's handle on the coordinator.
class Coordinator {
 public:
  virtual ~Coordinator() = default;

  // Registers `self` as a replica of `shard` under a lease of the coordinator's TTL, kept
  // alive in the background until Leave() or destruction. The job's shape (num_shards,
  // replicas) is recorded by the first replica and must match for every later one
  // (FailedPrecondition naming both otherwise). Unavailable if the coordinator cannot be
  // reached, with what was tried.
  virtual Status Join(uint32_t shard, const ReplicaAddress& self) = 0;

  // Revokes the lease: the registration (and the primary key, if held) goes at once.
  virtual Status Leave() = 0;

  // True while this replica's lease is certainly alive: its last successful keep-alive was
  // less than the TTL minus a safety margin ago, measured on the steady clock. A primary
  // alone in the in-sync set that sees false must stop acknowledging until it is true again.
  virtual bool LeaseValid() const = 0;

  // One attempt to become the shard's primary: atomically, if the shard has no primary and
  // this replica is eligible (in the in-sync set, or the set is empty), takes the primary
  // key under this replica's lease and the next term. Returns the new term, or nullopt when
  // not elected (another primary exists, or this replica is not in sync).
  virtual Result<std::optional<uint64_t>> Campaign() = 0;

  // As primary of `term`, replaces the shard's in-sync set (which must contain this
  // replica). FailedPrecondition if `term` is no longer the current primary's term: the
  // caller was deposed and must stop acting as primary.
  virtual Status SetInSync(uint64_t term, const std::vector<uint32_t>& in_sync) = 0;

  // Gives the primary key of `term` up (a primary shutting down cleanly); no-op if `term`
  // is no longer current.
  virtual Status Resign(uint64_t term) = 0;
};

// How workers, leashctl and replicas find every shard's primary, and follow failovers.
class ShardDirectory {
 public:
  virtual ~ShardDirectory() = default;

  // The current view of every shard. Unavailable if the coordinator cannot be reached;
  // NotFound if no replica of the job has registered yet.
  virtual Result<ClusterView> View() = 0;

  // Waits up to `timeout` for a view with a revision newer than `after_revision` and
  // returns it; on timeout returns the current view (whose revision may equal
  // `after_revision`). Unavailable as View().
  virtual Result<ClusterView> WaitForChange(int64_t after_revision,
                                            std::chrono::milliseconds timeout) = 0;
};

}  // namespace leash
