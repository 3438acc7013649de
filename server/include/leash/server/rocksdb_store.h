// SnapshotStore on RocksDB: the only place rocksdb:: types are used and rocksdb::Status is
// translated. A snapshot is written as one WriteBatch with sync, so it replaces the
// previous one atomically. One thread at a time.
#pragma once

#include <memory>
#include <string>

#include "leash/server/snapshot.h"

namespace leash::server {

struct RocksDbStoreOptions {
  std::string path;          // data directory; created if missing
  uint32_t shard = 0;        // identity the directory must match (or is stamped with)
  uint32_t num_shards = 1;
  bool sync = true;          // fsync each snapshot
};

// Opens (creating if needed) the store at options.path. A directory that is not a Leash
// shard store, or belongs to another shard/layout, is refused with FailedPrecondition and
// a message naming both identities; it is never overwritten. IOError if RocksDB cannot
// open it (permissions, another process holds the lock).
Result<std::unique_ptr<SnapshotStore>> OpenRocksDbStore(const RocksDbStoreOptions& options);

}  // namespace leash::server
