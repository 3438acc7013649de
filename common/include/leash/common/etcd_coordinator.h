// The Coordinator and ShardDirectory of replicated shards over etcd (3.4 or newer, through
// its v3 JSON gateway; docs/replication.md). Only executables and tests construct them;
// library code sees the interfaces of coordinator.h. Thread-safe, as those interfaces.
//
// Keys, under /leash/<job>/ (values JSON unless said otherwise):
//   shape                          {"num_shards":N,"replicas":R}, written once by the first
//                                  replica to join; no lease
//   shards/<s>/live/<r>            {"replica":r,"endpoint":"tcp://...","boot_id":B}, under
//                                  replica r's lease
//   shards/<s>/primary             {"term":T,"replica":r,"endpoint":...,"boot_id":B}, under
//                                  the primary's lease
//   shards/<s>/term                the last term granted, decimal; only grows; no lease
//   shards/<s>/in_sync             [r, ...] sorted; absent means empty; no lease
// Campaign is one transaction: primary absent, in_sync and term unchanged since they were
// read (mod_revision) -> put primary (the replica's lease) and term+1. SetInSync compares the
// primary key's value (term, replica and boot id) with the one this coordinator wrote.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "leash/common/coordinator.h"
#include "leash/common/status.h"

namespace leash {

struct EtcdOptions {
  // Client URLs of the etcd cluster ("http://host:2379"); tried in turn.
  std::vector<std::string> endpoints;
  // Keys live under /leash/<job>/: several jobs may share one etcd. Letters, digits, '.',
  // '_' and '-'.
  std::string job = "default";
  // The lease TTL: a replica cut off from etcd this long loses its registration and, if it
  // was primary, the primary key. Whole seconds; etcd raises it to its minimum (2 s with
  // etcd's default election timeout), and the granted TTL is the one used.
  std::chrono::milliseconds ttl{5000};
  // Each request to etcd gives up after this long (Unavailable), so that nothing hangs while
  // etcd is down or has no quorum.
  std::chrono::milliseconds request_timeout{2000};
};

// Splits "--etcd" text: comma-separated URLs; "host:port" means http://host:port.
// InvalidArgument if empty.
Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view text);

// The shape every replica of a job must agree on (Join refuses a different one).
struct JobShape {
  uint32_t num_shards = 0;
  uint32_t replicas = 0;
};

class EtcdCoordinator final : public Coordinator {
 public:
  // Checks the options (InvalidArgument); contacts etcd only in Join.
  static Result<std::unique_ptr<EtcdCoordinator>> Create(const EtcdOptions& options,
                                                         JobShape shape);
  // Stops the keep-alives without revoking the lease: the registration (and the primary
  // key, if held) goes when the TTL has passed. Call Resign and Leave for a clean exit.
  ~EtcdCoordinator() override;

  // Coordinator. Beyond coordinator.h: if etcd reports the lease gone (this process was cut
  // off for the TTL), the keep-alive thread registers again under a new lease; a term won
  // under the lost lease is over, and LeaseValid() stays false until the caller hears so
  // (SetInSync's FailedPrecondition or Resign of that term) or wins a new term. Campaign by
  // the current primary returns its term.
  Status Join(uint32_t shard, const ReplicaAddress& self) override;
  Status Leave() override;
  bool LeaseValid() const override;
  Result<std::optional<uint64_t>> Campaign() override;
  Status SetInSync(uint64_t term, const std::vector<uint32_t>& in_sync) override;
  Status Resign(uint64_t term) override;

  // The granted TTL (valid after Join).
  std::chrono::milliseconds ttl() const;
  // Fault injection for tests: while paused, no keep-alive is sent (as if this process were
  // cut off from etcd), so the lease expires after the TTL.
  void PauseKeepAlivesForTesting(bool paused);

  struct Impl;

 private:
  explicit EtcdCoordinator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Reads a job's view from etcd (one consistent range read of /leash/<job>/) and follows it
// with a watch of that prefix.
Result<std::unique_ptr<ShardDirectory>> NewEtcdShardDirectory(const EtcdOptions& options);

// The key prefix of `job` ("/leash/<job>/").
std::string EtcdJobPrefix(std::string_view job);

}  // namespace leash
