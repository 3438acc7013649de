// The coordinator factory of leash-server (coordination.h): etcd, or for an unreplicated
// shard with a durable log its group of one (solo_group.h). Not thread-safe.
#include "coordination.h"

#include "leash/common/etcd_coordinator.h"
#include "leash/common/watched_directory.h"
#include "solo_group.h"

namespace leash::server {

Result<Coordination> ConnectCoordination(const ServerConfig& config) {
  if (config.replicas == 1) {
    LEASH_ASSIGN_OR_RETURN(
        auto group, SoloGroup::Open(ReplicaLogDir(config), static_cast<uint32_t>(config.shard),
                                    static_cast<uint32_t>(config.num_shards)));
    Coordination c;
    c.directory = group->Directory();
    c.coordinator = std::move(group);
    return c;
  }
  EtcdOptions options;
  LEASH_ASSIGN_OR_RETURN(options.endpoints, ParseEtcdEndpoints(config.etcd));
  options.job = config.job;
  options.ttl = std::chrono::seconds(config.etcd_ttl_s);
  const JobShape shape{.num_shards = static_cast<uint32_t>(config.num_shards),
                       .replicas = static_cast<uint32_t>(config.replicas)};
  Coordination c;
  LEASH_ASSIGN_OR_RETURN(c.coordinator, EtcdCoordinator::Create(options, shape));
  LEASH_ASSIGN_OR_RETURN(auto directory, NewEtcdShardDirectory(options));
  // The replica reads the directory in its request loop: from a watch of its own, so that
  // an etcd that hangs never holds the loop (and with it the log's acknowledgements).
  c.directory = std::make_unique<WatchedDirectory>(std::move(directory));
  return c;
}

}  // namespace leash::server
