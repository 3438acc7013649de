// Test support: a cluster of real leash-server processes on free loopback ports, real
// leash-worker processes, and an observer client for shard statistics. Everything is
// killed by PID when the objects go away. Not thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "leash/common/zmq_transport.h"
#include "leash/worker/client.h"
#include "support/process.h"

namespace leash::testing {

class Cluster {
 public:
  // Starts `n` shards with data under `dir`, each with `extra` flags.
  Cluster(int n, std::string dir, std::vector<std::string> extra = {});

  // (Re)starts shard i on its port and data directory, with `more` flags this time only.
  void Start(int i, const std::vector<std::string>& more = {});
  Process& shard(int i) { return *shards_[static_cast<size_t>(i)]; }
  int size() const { return static_cast<int>(endpoints_.size()); }
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  std::string servers() const;
  const std::string& dir() const { return dir_; }

  // A client of the cluster (registered as a worker unless register_worker is false), its
  // connections made with `zmq`.
  std::unique_ptr<Client> Connect(const std::string& name, bool register_worker = true,
                                  const ZmqOptions& zmq = {});
  // Shard statistics through an unregistered observer client.
  Result<std::vector<ShardStats>> Stats();

  // Starts a leash-worker process against this cluster; its log is dir/<name>.log and
  // its metrics dir/<name>.json.
  std::unique_ptr<Process> StartWorker(const std::string& name, std::vector<std::string> flags);
  std::string WorkerMetrics(const std::string& name) const { return dir_ + "/" + name + ".json"; }

 private:
  std::string dir_;
  std::vector<std::string> extra_;
  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<Process>> shards_;
  ZmqContext ctx_;
  std::unique_ptr<Client> observer_;
};

// A table of rows x cols with plain SGD at learning rate 1, so that a push of g changes
// every value by exactly -g (tests assert sums exactly).
TableSpec Sgd1(const std::string& name, uint64_t rows, uint32_t cols);

// The number just before `what` in a shard's final log line ("shard 0 stopped cleanly ...
// 3 limit rejections ..."); -1 if the line or the count is not there.
int64_t CountInFinalLog(const std::string& log, const std::string& what);

}  // namespace leash::testing
