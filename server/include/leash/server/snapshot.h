// A consistent snapshot of one shard (tables, optimizer state, clocks) and the store
// seam that persists it. The RocksDB store (rocksdb_store.h) is the production one; the
// in-memory store serves unit tests and fuzzing. A store is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "leash/common/status.h"
#include "leash/ps/table.h"

namespace leash::server {

using ps::TableSnapshot;

struct WorkerClock {
  uint64_t worker_id = 0;
  uint64_t incarnation = 0;
  int64_t clock = 0;
  uint64_t last_seq = 0;  // highest push sequence applied from this incarnation
  std::string name;
  // What the shard decides this worker's next requests by (ps::LiveWorker's fields of the
  // same names): the bound of its latest pull, its reported speed, and the backup-worker
  // decision on its current iteration's pushes. Replicas must agree on them, so they
  // travel in the snapshots a backup catches up from.
  int64_t staleness = -1;
  double samples_per_second = 0;
  bool speed_reported = false;
  int64_t push_decided_clock = -1;
  bool push_dropped = false;
};

struct ShardSnapshot {
  uint32_t shard = 0;
  uint32_t num_shards = 1;
  int64_t min_clock = 0;  // minimum live clock when the snapshot was taken
  uint64_t sequence = 0;  // grows by one with every snapshot this shard writes
  int64_t unix_ms = 0;    // wall time the snapshot was taken
  std::vector<TableSnapshot> tables;
  std::vector<WorkerClock> workers;
  std::vector<uint8_t> coverage;  // data-coverage state of the job (shard 0), serialized
};

class SnapshotStore {
 public:
  virtual ~SnapshotStore() = default;
  // The last snapshot saved, or nullopt for an empty store. DataLoss if what is stored is
  // corrupt or incomplete; FailedPrecondition if it belongs to another shard layout.
  virtual Result<std::optional<ShardSnapshot>> Load() = 0;
  // Replaces the stored snapshot atomically: a crash during Save leaves the previous one.
  virtual Status Save(const ShardSnapshot& snapshot) = 0;
  // Human-readable location for logs ("rocksdb:/data/shard0").
  virtual std::string Describe() const = 0;
};

// Keeps the last snapshot in memory. For tests and fuzzing.
class MemorySnapshotStore final : public SnapshotStore {
 public:
  Result<std::optional<ShardSnapshot>> Load() override { return last_; }
  Status Save(const ShardSnapshot& snapshot) override {
    last_ = snapshot;
    ++saves_;
    return Status::Ok();
  }
  std::string Describe() const override { return "memory"; }
  int saves() const { return saves_; }

 private:
  std::optional<ShardSnapshot> last_;
  int saves_ = 0;
};

}  // namespace leash::server
