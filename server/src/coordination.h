// How leash-server reaches the coordinator of replicated shards (--replicas > 1): one
// factory, so the coordinator's implementation is chosen in one place. Not thread-safe
// (called once at start).
#pragma once

#include <memory>

#include "config.h"
#include "leash/common/coordinator.h"
#include "leash/common/status.h"

namespace leash::server {

struct Coordination {
  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<ShardDirectory> directory;
};

// The etcd coordinator at `config.etcd` for job `config.job` (etcd_coordinator.h);
// InvalidArgument for bad options. etcd itself is first contacted by Coordinator::Join.
Result<Coordination> ConnectCoordination(const ServerConfig& config);

}  // namespace leash::server
