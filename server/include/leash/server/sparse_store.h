// The cold tier of a shard's sparse tables (a ps::RowStore) together with the checkpoints
// that tie it to the shard's snapshots: at snapshot N the store's state is frozen as
// checkpoint N before snapshot N is saved, and recovering snapshot N puts checkpoint N back
// as the live store (docs/sparse.md). RocksDbRowStore (rocksdb_row_store.h) on a server;
// MemorySparseStore for tests, fuzzing and a shard without a data directory. One thread at
// a time, like the shard that owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "leash/common/status.h"
#include "leash/ps/sparse_table.h"

namespace leash::server {

class SparseStore : public ps::RowStore {
 public:
  // A read-only view of every table's rows as they were when OpenImage was called, unchanged
  // by later writes: what a primary ships to a replica catching up (replica.cc) while it
  // goes on writing. Scan as RowStore::Scan. It must be destroyed before the store is, and
  // before the store's Restore.
  class Image {
   public:
    virtual ~Image() = default;
    virtual Status Scan(uint32_t table_id, uint64_t* cursor, size_t limit, size_t record_bytes,
                        const std::function<void(uint64_t key, const uint8_t* record)>& visit,
                        bool* wrapped) = 0;
  };
  // RocksDB: a RocksDB snapshot (no copy; the versions later writes replace are kept on disk
  // until the image is destroyed). MemorySparseStore: a copy of its rows.
  virtual Result<std::unique_ptr<Image>> OpenImage() = 0;
  // Freezes what the store holds now as checkpoint `sequence` (replacing one of that number
  // left by a crash before its snapshot was saved).
  virtual Status Checkpoint(uint64_t sequence) = 0;
  // Makes checkpoint `sequence` the live store, discarding everything written since; nullopt
  // empties the store (no snapshot to agree with). NotFound if that checkpoint is missing.
  virtual Status Restore(std::optional<uint64_t> sequence) = 0;
  // Deletes every checkpoint but `keep`.
  virtual Status Prune(uint64_t keep) = 0;
  // For logs: "rocksdb:/data/shard0/sparse".
  virtual std::string Describe() const = 0;
};

// Rows in ordered maps; a checkpoint is a copy of the map. For tests and fuzzing.
class MemorySparseStore final : public SparseStore {
 public:
  Status Read(uint32_t table_id, std::span<const uint64_t> keys, size_t record_bytes, uint8_t* out,
              std::vector<uint8_t>* found) override;
  Status Write(uint32_t table_id, std::span<const uint64_t> keys, size_t record_bytes,
               const uint8_t* records, std::span<const uint64_t> deletes) override;
  Status Scan(uint32_t table_id, uint64_t* cursor, size_t limit, size_t record_bytes,
              const std::function<void(uint64_t key, const uint8_t* record)>& visit,
              bool* wrapped) override;
  Status DropTable(uint32_t table_id) override;
  uint64_t ApproxRows(uint32_t table_id) const override;
  uint64_t MemoryBytes() const override { return 0; }

  Result<std::unique_ptr<Image>> OpenImage() override;
  Status Checkpoint(uint64_t sequence) override;
  Status Restore(std::optional<uint64_t> sequence) override;
  Status Prune(uint64_t keep) override;
  std::string Describe() const override { return "memory"; }
  size_t checkpoints() const { return checkpoints_.size(); }

 private:
  ps::MemoryRowStore live_;
  std::map<uint64_t, ps::MemoryRowStore> checkpoints_;
};

}  // namespace leash::server
