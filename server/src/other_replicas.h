// A replica's connections to the other replicas of its shard. Replicas are numbered
// 0..R-1 and the replication code addresses peer r as connection r, but a replica must not
// connect to itself: a connection to its own socket cost it two descriptors, a receive it
// polled for nothing and, with shared memory, a ring to itself (found by the soak test's
// descriptor count). OtherReplicas keeps the numbering over a transport that connects to
// the R-1 others only: Send to this replica is refused, everything else is passed through
// with the index mapped both ways.
#pragma once

#include <memory>

#include "leash/common/transport.h"

namespace leash::server {

class OtherReplicas final : public ClientTransport,
                            public ClientSharedMemory,
                            public ConnectionHealth {
 public:
  // `others` connects to the replicas other than `self`, in order: replica r is its
  // connection r below `self`, r - 1 above it.
  OtherReplicas(std::unique_ptr<ClientTransport> others, int self);

  int num_shards() const override { return others_->num_shards() + 1; }
  // FailedPrecondition for this replica itself.
  Status Send(int replica, Message message) override;
  Result<std::optional<std::pair<int, Message>>> Receive(
      std::chrono::milliseconds timeout) override;
  void Wake() override { others_->Wake(); }
  Status Reconnect(int replica) override;
  Status Retarget(int replica, const std::string& endpoint) override;
  ClientSharedMemory* shared_memory() override {
    return others_->shared_memory() != nullptr ? this : nullptr;
  }
  const ConnectionHealth* health() const override {
    return others_->health() != nullptr ? this : nullptr;
  }

  // ClientSharedMemory: nothing for this replica itself.
  std::optional<WritableFrame> ReservePayload(int replica, size_t bytes) override;
  bool ActiveWith(int replica) const override;
  size_t ring_bytes() const override;
  void RenewLink(int replica) override;

  // ConnectionHealth: this replica itself is always Ok.
  Status ShardHealth(int replica) const override;

 private:
  // The connection of `replica`, or -1 for this replica itself.
  int ToOther(int replica) const;
  int FromOther(int other) const { return other < self_ ? other : other + 1; }
  Status Self(int replica) const;

  std::unique_ptr<ClientTransport> others_;
  int self_;
};

// The peers of a group of one (an unreplicated shard with a durable log): none. Send,
// Reconnect and Retarget are refused; Receive finds nothing.
std::unique_ptr<ClientTransport> NoOtherReplicas();

}  // namespace leash::server
