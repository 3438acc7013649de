// The cold tier of a shard's sparse tables on RocksDB, in a directory of its own beside the
// snapshot store (<data-dir>/sparse: live/ and checkpoints/<snapshot sequence>/), tuned for
// point lookups and with its misses read by a small pool of threads. One caller thread at a
// time (the shard's); the reader threads work only inside Read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "leash/common/status.h"
#include "leash/server/sparse_store.h"

namespace leash::server {

struct RocksDbRowStoreOptions {
  std::string path;  // the store's directory; created if missing
  // RocksDB's LRU block cache (data blocks, with index and filter blocks at high priority),
  // counted in the shard's memory budget.
  uint64_t block_cache_bytes = uint64_t{64} << 20;
  // Memtables, at most this many bytes (two buffers of half of it), counted in the budget.
  uint64_t write_buffer_bytes = uint64_t{32} << 20;
  // Threads that read a Read's keys in parallel (Debian's RocksDB has no io_uring, so one
  // MultiGet reads its keys one after another): the disk's queue depth. 1: the calling
  // thread alone.
  int readers = 32;
  // O_DIRECT reads, so the kernel's page cache does not hold the files and the block cache
  // is the only cache (a cold tier that really reads the disk). A file system without
  // O_DIRECT (tmpfs) falls back to buffered reads with a warning.
  bool direct_reads = true;
};

// Opens (creating if needed) the store. IOError/DataLoss from RocksDB; InvalidArgument for
// bad options.
Result<std::unique_ptr<SparseStore>> OpenRocksDbRowStore(const RocksDbRowStoreOptions& options);

}  // namespace leash::server
