// Test support: an in-memory coordinator (coordinator.h) with the rules of the etcd one —
// leases with a TTL on an injected clock, the primary key bound to a lease, a term counter
// and an in-sync set that outlive leases, the job's shape recorded by the first replica — and
// fault injection: expire a replica's lease behind its back, pause its keep-alives, cut a
// replica off from the coordinator, make the coordinator unavailable. It is held to etcd's
// contract by CoordinatorConformanceTest (tests/etcd_coordinator_test.cc, backend "memory").
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
  // A service whose job shape is recorded by the first replica to join (as in etcd).
  MemoryCoordinatorService(std::function<int64_t()> now_ms, int64_t ttl_ms, int64_t margin_ms = 0);
  ~MemoryCoordinatorService();

  // A replica's handle and a directory reader; they may outlive nothing: the service must
  // outlive them. Connect() uses the service's shape; Connect(num_shards, replicas) is a
  // replica started with that shape (its Join is refused if the job has another).
  std::unique_ptr<Coordinator> Connect();
  std::unique_ptr<Coordinator> Connect(uint32_t num_shards, uint32_t replicas);
  std::unique_ptr<ShardDirectory> Directory();

  // Faults. The replica's lease ends now (its registration and primary key go); its own
  // handle still believes it alive until its TTL says otherwise (a paused process), then
  // registers again under a new lease, as etcd's keep-alive does (a term it held is over).
  void ExpireLease(uint32_t shard, uint32_t replica);
  // Cuts the replica off (true) or reconnects it: its calls fail Unavailable and its
  // keep-alives stop, so its lease runs out after the TTL.
  void Partition(uint32_t shard, uint32_t replica, bool cut);
  // The keep-alives of `c` (a handle of this service) stop (true) or resume; its calls still
  // reach the service, so once its lease ran out they are answered as etcd answers a replica
  // whose lease expired (EtcdCoordinator::PauseKeepAlivesForTesting).
  void PauseKeepAlives(const Coordinator& c, bool paused);
  // Every call fails Unavailable and no lease is kept alive or ended (etcd down); leases
  // held are given the TTL again when it comes back (etcd's leases survive its restart).
  // Handles' LeaseValid() turns false after the TTL all the same: they cannot tell.
  void SetUnavailable(bool unavailable);
  // The next `calls` SetInSync calls (of any replica) fail Unavailable: the coordinator
  // did not answer in time.
  void FailSetInSync(int calls);

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
    bool paused = false;  // keep-alives stopped, calls still answered
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
  int fail_set_in_sync_ = 0;
  uint64_t next_lease_ = 1;
  std::map<uint64_t, Lease> leases_;
  std::map<uint32_t, ShardState> shards_;
  uint32_t num_shards_ = 0;
  uint32_t replicas_ = 0;
  bool shape_recorded_ = false;  // by the first Join
  int64_t revision_ = 1;
};

}  // namespace leash::testing
