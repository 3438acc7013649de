// How leash-server reaches the coordinator of replicated shards (--replicas > 1, or 1 with
// --durable-log): one
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
  std::unique_ptr<ShardDirectory> directory;  // may read `coordinator`: destroyed first
};

// The etcd coordinator at `config.etcd` for job `config.job` (etcd_coordinator.h);
// InvalidArgument for bad options. etcd itself is first contacted by Coordinator::Join.
// With `config.replicas` 1 (a durable log on an unreplicated shard), the group of one kept
// under DATA_DIR/replica-log (solo_group.h); IOError if it cannot be read.
Result<Coordination> ConnectCoordination(const ServerConfig& config);

}  // namespace leash::server
