// The coordinator factory of leash-server (coordination.h). Not thread-safe.
#include "coordination.h"

namespace leash::server {

Result<Coordination> ConnectCoordination(const ServerConfig& config) {
  // The etcd coordinator (common/include/leash/common/etcd_coordinator.h) is connected here
  // once it is merged: build it from config.etcd and config.job.
  return FailedPrecondition("--replicas " + std::to_string(config.replicas) +
                            " needs the etcd coordinator (--etcd " + config.etcd +
                            "), which this build does not have yet; run with --replicas 1");
}

}  // namespace leash::server
