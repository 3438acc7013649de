// Test support: real shards (leash::server::Shard with a MemorySnapshotStore, each served
// by server::Serve on a thread of its own) on an in-memory network, and leash::Clients
// connected to them, for unit tests of the client and of what is built on it. A shard
// can be stopped and started again (a restart: a new boot id, state recovered from its
// store) and its clock moved forward (leases expire without waiting).
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "leash/server/shard.h"
#include "leash/server/snapshot.h"
#include "leash/worker/client.h"
#include "support/memory_transport.h"

namespace leash::testing {

class MemoryCluster {
 public:
  // Starts `shards` shards with `options` (shard and num_shards are set here) on a
  // network whose random faults use `seed`.
  explicit MemoryCluster(int shards, server::ShardOptions options = {}, uint64_t seed = 1);
  ~MemoryCluster();  // stops every shard
  MemoryCluster(const MemoryCluster&) = delete;
  MemoryCluster& operator=(const MemoryCluster&) = delete;

  MemoryNetwork& network() { return network_; }
  int size() const { return static_cast<int>(shards_.size()); }
  static std::string Address(int shard) { return "shard" + std::to_string(shard); }

  // A client of every shard (registered as a worker unless options.register_worker is
  // false).
  Result<std::unique_ptr<Client>> Connect(ClientOptions options);

  // Takes shard i down: its loop ends (writing a snapshot to its store) and its endpoint
  // goes away with everything on the way to it.
  void Stop(int i);
  // Starts shard i again: a new Shard (a new boot id) that recovers from its store.
  void Start(int i);
  // Moves shard i's clock `ms` forward.
  void Advance(int i, int64_t ms);

  // Shard i as its serving loop saw it after its latest turn.
  struct View {
    server::ShardCounters counters;
    int64_t min_clock = 0;
    size_t parked_pulls = 0;
    size_t live_workers = 0;
  };
  View view(int i);
  // Moves shard i's clock `step_ms` forward, again every 50 ms, until `condition` holds
  // for view(i) (a message the shard had queued may renew a lease after a step); false
  // if it did not within `timeout`.
  bool AdvanceUntil(int i, int64_t step_ms, const std::function<bool(const View&)>& condition,
                    std::chrono::milliseconds timeout = std::chrono::seconds(20));
  // Waits until `condition` holds for view(i); false if it did not within `timeout`.
  bool WaitFor(int i, const std::function<bool(const View&)>& condition,
               std::chrono::milliseconds timeout = std::chrono::seconds(20));

 private:
  struct Node {
    server::ShardOptions options;
    server::MemorySnapshotStore store;
    std::unique_ptr<server::Shard> shard;
    std::unique_ptr<ServerTransport> transport;
    std::thread thread;
    std::atomic<bool> stop{false};
    std::atomic<int64_t> skew_ms{0};
    std::mutex view_mu;
    View view;  // under view_mu
  };

  MemoryNetwork network_;
  std::vector<std::unique_ptr<Node>> shards_;
};

}  // namespace leash::testing
