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
#include "leash/ps/clock_table.h"
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

// A live worker's record as a snapshot keeps it, and back: every field a snapshot carries
// goes through these two, so a field added to both structs is added here once (brace lists:
// -Wmissing-field-initializers names one left out).
inline WorkerClock ToWorkerClock(uint64_t worker_id, const ps::LiveWorker& w) {
  return {
      worker_id,   w.incarnation,        w.clock,          w.last_seq,           w.name,
      w.staleness, w.samples_per_second, w.speed_reported, w.push_decided_clock, w.push_dropped};
}
// `last_seen_ms`: when its lease starts again (a recovered worker gets a fresh one).
inline ps::LiveWorker ToLiveWorker(const WorkerClock& wc, int64_t last_seen_ms) {
  return {.worker_id = wc.worker_id,
          .incarnation = wc.incarnation,
          .name = wc.name,
          .clock = wc.clock,
          .last_seq = wc.last_seq,
          .last_seen_ms = last_seen_ms,
          .staleness = wc.staleness,
          .samples_per_second = wc.samples_per_second,
          .speed_reported = wc.speed_reported,
          .push_decided_clock = wc.push_decided_clock,
          .push_dropped = wc.push_dropped};
}

struct ShardSnapshot {
  uint32_t shard = 0;
  uint32_t num_shards = 1;
  int64_t min_clock = 0;  // minimum live clock when the snapshot was taken
  uint64_t sequence = 0;  // grows by one with every snapshot this shard writes
  int64_t unix_ms = 0;    // wall time the snapshot was taken
  std::vector<TableSnapshot> tables;
  std::vector<WorkerClock> workers;
  std::vector<uint8_t> coverage;  // data-coverage state of the job (shard 0), serialized
  // A replica's record of its clean stop (Replica::StopRecord: its term and the log it held
  // past this state), saved with the final snapshot it goes with; empty in any other snapshot.
  std::string replica_stop;
};

class SnapshotStore {
 public:
  virtual ~SnapshotStore() = default;
  // The last snapshot saved, or nullopt for an empty store. DataLoss if what is stored is
  // corrupt or incomplete; FailedPrecondition if it belongs to another shard layout.
  virtual Result<std::optional<ShardSnapshot>> Load() = 0;
  // Replaces the stored snapshot atomically: a crash during Save leaves the previous one.
  virtual Status Save(const ShardSnapshot& snapshot) = 0;
  // The stored snapshot's stop record (ShardSnapshot::replica_stop), empty if it has none or
  // there is no snapshot. Stores that can read it alone override this, so that a replica
  // finds out whether it stopped cleanly without loading its tables.
  virtual Result<std::string> LoadReplicaStop() {
    LEASH_ASSIGN_OR_RETURN(std::optional<ShardSnapshot> snap, Load());
    return snap ? snap->replica_stop : std::string();
  }
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
