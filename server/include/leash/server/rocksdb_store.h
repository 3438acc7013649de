// SnapshotStore on RocksDB: the only place rocksdb:: types are used and rocksdb::Status is
// translated. A snapshot is written as one WriteBatch with sync, so it replaces the
// previous one atomically. One thread at a time.
#pragma once

#include <memory>
#include <string>

#include "leash/server/snapshot.h"

namespace leash::server {

struct RocksDbStoreOptions {
  std::string path;    // data directory; created if missing
  uint32_t shard = 0;  // identity the directory must match (or is stamped with)
  uint32_t num_shards = 1;
  bool sync = true;  // fsync each snapshot
  // Values and each optimizer slot are stored in pieces of at most this many bytes (a
  // positive multiple of 4), so tables of hundreds of MB never make one huge RocksDB value.
  // Recorded per snapshot: changing it does not affect loading earlier snapshots.
  uint32_t chunk_bytes = 1u << 20;
};

// Opens (creating if needed) the store at options.path. A directory that is not a Leash
// shard store, or belongs to another shard/layout, is refused with FailedPrecondition and
// a message naming both identities; it is never overwritten. An existing directory is
// first checked read-only (RocksDB's consistency checks, the identity record, the checksum
// of every table file, the write-ahead log), so a refused directory is left byte for byte
// as it was; a damaged one (flipped bytes, a missing or truncated file, no CURRENT or
// MANIFEST) is DataLoss naming the directory. A log record cut short at its end (a crash
// while writing a snapshot) is dropped and the previous snapshot recovered; a complete
// record failing its checksum is damage. RocksDB's info log goes to spdlog, not to LOG
// files in the directory. IOError if RocksDB cannot
// open it (permissions, another process holds the lock). VersionMismatch if the directory
// was written in another store format; DataLoss if RocksDB or the identity record is corrupt;
// InvalidArgument for bad options (empty path, shard >= num_shards, bad chunk_bytes).
// Save returns InvalidArgument, and keeps the previous snapshot, for a snapshot of another
// shard or whose sizes disagree (values != rows * cols, a slot not the size of values).
Result<std::unique_ptr<SnapshotStore>> OpenRocksDbStore(const RocksDbStoreOptions& options);

}  // namespace leash::server
