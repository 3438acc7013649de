// The coordinator of an unreplicated shard that keeps a durable log (leash-server
// --replicas 1 --durable-log write|fsync; docs/replication.md, "One replica with a durable
// log"). The shard runs as a replica group of one: its primary logs every change before it
// is acknowledged, and a SIGKILLed shard starts again from its last snapshot and that log,
// losing nothing acknowledged, with no etcd and no second process.
//
// A group of one needs no election: nobody else can lead, so its "lease" never lapses
// (LeaseValid is always true) and Campaign always wins while nobody holds the primary key.
// What must outlive the process is what etcd would otherwise remember: the term counter,
// which only grows, and whether the group ever acknowledged anything (its in-sync set). They
// are kept in one small file, DIR/group, replaced atomically (written, synced, renamed, the
// directory synced) on every change: a restarted replica uses its log only if that file
// says the group existed (Replica::GroupRemembered), and a new term never repeats an old one.
// Changes are rare (a start, a stop), never per request.
//
// Thread-safe: both interfaces may be used from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "leash/common/coordinator.h"
#include "leash/common/status.h"

namespace leash::server {

class SoloGroup final : public Coordinator {
 public:
  // Reads DIR/group if it exists (creating DIR if needed). InvalidArgument for a file that
  // is not one this class wrote, naming it; IOError if DIR cannot be made or read.
  static Result<std::unique_ptr<SoloGroup>> Open(std::string dir, uint32_t shard,
                                                 uint32_t num_shards);

  // Coordinator. Join records the address (replica 0 of 1); there is no lease to keep alive.
  Status Join(uint32_t shard, const ReplicaAddress& self) override;
  Status Leave() override;
  bool LeaseValid() const override { return true; }
  // The next term, written to DIR/group before it is returned; nullopt while this replica
  // already holds the primary key.
  Result<std::optional<uint64_t>> Campaign() override;
  Status SetInSync(uint64_t term, const std::vector<uint32_t>& in_sync) override;
  Status Resign(uint64_t term) override;

  // The group as a directory: `num_shards` shards, only this one known (the others' views
  // are empty). This object must outlive it.
  std::unique_ptr<ShardDirectory> Directory();
  ClusterView View() const;
  ClusterView WaitForChange(int64_t after_revision, std::chrono::milliseconds timeout) const;

  // The term and in-sync set as DIR/group holds them (for tests and the start-up log).
  uint64_t term() const;
  std::vector<uint32_t> in_sync() const;

 private:
  SoloGroup(std::string dir, uint32_t shard, uint32_t num_shards)
      : dir_(std::move(dir)), shard_(shard), num_shards_(num_shards) {}
  // Under mu_: writes term_ and in_sync_ to DIR/group atomically.
  Status SaveLocked();
  ClusterView ViewLocked() const;

  const std::string dir_;
  const uint32_t shard_;
  const uint32_t num_shards_;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  std::optional<ReplicaAddress> self_;
  bool primary_ = false;
  uint64_t term_ = 0;
  std::vector<uint32_t> in_sync_;
  int64_t revision_ = 1;
};

}  // namespace leash::server
