// Test support: a job of replicated shards with real processes — leash-server replicas
// (--replicas R) of N shards coordinated through a real etcd (started by the caller, e.g.
// EtcdTest), clients and leash-worker processes that find the primaries in etcd and follow
// them. Every process is killed by PID when the object goes. Used by failover_test and the
// soak test. Not thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "leash/common/coordinator.h"
#include "leash/common/zmq_transport.h"
#include "leash/worker/client.h"
#include "support/process.h"

namespace leash::testing {

class ReplicatedCluster {
 public:
  struct Options {
    std::string dir;   // data directories and logs
    std::string etcd;  // etcd's client URL
    std::string job = "test";
    int num_shards = 1;
    int replicas = 2;
    int etcd_ttl_s = 2;
    // Replica r of shard s listens at endpoints[s * replicas + r]; empty: free loopback ports.
    std::vector<std::string> endpoints;
    std::vector<std::string> extra;  // more flags for every replica (later flags win)
    // A CURVE keys directory (leashctl keygen: "server" and an authorized "client" pair):
    // replicas run with --curve-keys and followers connect with the client pair; empty: plain.
    std::string curve_keys;
    // How replica r of shard s is run (e.g. on a host of its own); identity if empty.
    std::function<std::vector<std::string>(int s, int r, std::vector<std::string> argv)> on_host;
  };

  // Starts every replica; ready() says when every shard has a primary and all in sync.
  explicit ReplicatedCluster(Options options);
  ~ReplicatedCluster();

  // (Re)starts replica r of shard s (a fresh process: it catches up from the primary);
  // without_keys: without the cluster's CURVE keys even if it has them.
  void Start(int s, int r, bool without_keys = false);
  Process& replica(int s, int r) { return *replicas_[Index(s, r)]; }
  const std::string& endpoint(int s, int r) const { return options_.endpoints[Index(s, r)]; }
  const std::shared_ptr<ShardDirectory>& directory() const { return directory_; }

  // Shard s as etcd shows it (nullopt if it cannot be read).
  std::optional<ShardView> View(int s);
  // Shard s's primary replica (-1 while it has none) and the size of its in-sync set
  // (-1 while it has no primary).
  int Primary(int s);
  int InSync(int s);
  // Whether every shard has a primary and all its replicas in sync.
  bool AllInSync();
  // SIGKILLs shard s's primary; its replica index, or -1 if it has none.
  int KillPrimary(int s);

  // A client that finds the primaries in etcd and follows them (nullptr after a test
  // failure saying why).
  std::unique_ptr<Client> Follower(const std::string& name, bool register_worker,
                                   bool shared_memory = false);
  // A leash-worker of the job (--etcd, --job); its log is dir/<name>.log, its metrics
  // dir/<name>.json.
  std::unique_ptr<Process> StartWorker(const std::string& name, std::vector<std::string> flags);
  // Every replica's log, headed by which it is.
  std::string Logs();

 private:
  size_t Index(int s, int r) const { return static_cast<size_t>(s * options_.replicas + r); }

  Options options_;
  std::vector<std::unique_ptr<Process>> replicas_;
  std::shared_ptr<ShardDirectory> directory_;
  ZmqContext ctx_;
};

}  // namespace leash::testing
