// Test support: an in-memory coordinator (coordinator.h) with the rules of the etcd one —
// leases with a TTL on an injected clock, the primary key bound to a lease, a term counter
// and an in-sync set that outlive leases — and fault injection: expire a replica's lease
// behind its back, cut a replica off from the coordinator, make the coordinator unavailable.
// Thread-safe: the service and every handle may be used from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "leash/common/coordinator.h"

namespace leash::testing {

class MemoryCoordinatorService {
 public:
  // Leases last `ttl_ms` of `now_ms` after the last keep-alive; LeaseValid() is false once
  // `ttl_ms - margin_ms` have passed since it. Keep-alives of every joined replica that is
  // not cut off happen whenever anyone calls the service (the background keep-alive).
  // The job has `num_shards` shards of `replicas` replicas.
  MemoryCoordinatorService(uint32_t num_shards, uint32_t replicas, std::function<int64_t()> now_ms,
                           int64_t ttl_ms, int64_t margin_ms = 0);
  ~MemoryCoordinatorService();

  // A replica's handle and a directory reader; they may outlive nothing: the service must
  // outlive them.
  std::unique_ptr<Coordinator> Connect();
  std::unique_ptr<ShardDirectory> Directory();

  // Faults. The replica's lease ends now (its registration and primary key go); its own
  // handle still believes it alive until its TTL says otherwise (a paused process).
  void ExpireLease(uint32_t shard, uint32_t replica);
  // Cuts the replica off (true) or reconnects it: its calls fail Unavailable and its
  // keep-alives stop, so its lease runs out after the TTL.
  void Partition(uint32_t shard, uint32_t replica, bool cut);
  // Every call fails Unavailable and no lease is kept alive or ended (etcd down); leases
  // held are given the TTL again when it comes back (etcd's leases survive its restart).
  // Handles' LeaseValid() turns false after the TTL all the same: they cannot tell.
  void SetUnavailable(bool unavailable);

  ShardView View(uint32_t shard);

 private:
  friend class MemoryCoordinator;
  friend class MemoryDirectory;
  struct Lease {
    uint32_t shard = 0;
    ReplicaAddress address;
    int64_t deadline_ms = 0;
    int64_t keepalive_ms = 0;  // last successful keep-alive, for LeaseValid
    bool cut = false;
    bool alive = true;
  };
  struct ShardState {
    uint64_t term = 0;
    std::optional<uint64_t> primary_lease;  // the lease holding the primary key
    std::vector<uint32_t> in_sync;
  };

  // Under mu_: keeps leases alive and ends expired ones.
  void RefreshLocked();
  void ChangedLocked();
  ClusterView ViewLocked() const;
  Status RefuseLocked(uint64_t lease) const;  // Ok, or why `lease` cannot reach it

  std::function<int64_t()> now_ms_;
  int64_t ttl_ms_;
  int64_t margin_ms_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool unavailable_ = false;
  uint64_t next_lease_ = 1;
  std::map<uint64_t, Lease> leases_;
  std::map<uint32_t, ShardState> shards_;
  uint32_t num_shards_ = 0;
  uint32_t replicas_ = 0;
  int64_t revision_ = 1;
};

}  // namespace leash::testing
