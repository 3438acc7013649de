// Test support: an in-memory network of transports (transport.h) for unit tests of the
// client and the shard without sockets. Shard endpoints are bound at addresses; clients
// connect one connection per address. Messages can be dropped, duplicated, delayed and
// reordered, at random (seeded) or by explicit rules; a shard endpoint that goes away
// (its transport destroyed) loses every message on the way to it, and one bound again at
// the same address is a restarted shard.
// Thread-safe: the network and its transports may be used from any threads, within the
// per-method rules of transport.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "leash/common/transport.h"

namespace leash::testing {

enum class Direction { kToShard, kToClient };

// One message on its way, as fault rules see it.
struct Packet {
  Direction direction = Direction::kToShard;
  std::string address;  // the shard endpoint's
  PeerId peer;          // the client connection's
  const Message* message = nullptr;
};

// What happens to a packet.
struct Verdict {
  enum Kind { kDeliver, kDrop, kDuplicate };
  Kind kind = kDeliver;
  int64_t delay_ms = 0;  // extra delay (a duplicate's second copy comes after the first)
};

// Random faults, applied to packets no rule decided. Probabilities in [0, 1].
struct Faults {
  double drop = 0;
  double duplicate = 0;
  int64_t delay_ms = 0;   // every packet
  int64_t jitter_ms = 0;  // plus a random 0..jitter_ms: packets overtake each other
};

struct NetworkStats {
  uint64_t sent = 0;        // Send calls that reached the network
  uint64_t delivered = 0;   // copies handed to a Receive
  uint64_t dropped = 0;     // by a fault, or to a missing endpoint or a closed connection
  uint64_t duplicated = 0;  // extra copies made
};

class MemoryNetwork {
 public:
  // Random faults draw from a generator seeded with `seed`.
  explicit MemoryNetwork(uint64_t seed = 1);
  ~MemoryNetwork();  // transports made here keep working, as endpoints of a dead network
  MemoryNetwork(const MemoryNetwork&) = delete;
  MemoryNetwork& operator=(const MemoryNetwork&) = delete;

  // A shard endpoint at `address`; nullptr if one is bound there already. Destroying it
  // takes the shard down: what is queued for it and what it sent that is still on the
  // way is lost, and so is what is sent to the address until one is bound there again.
  std::unique_ptr<ServerTransport> Bind(const std::string& address);
  // A client with one connection per address: shard i is addresses[i]. Connecting never
  // fails; an address nobody is bound at swallows what is sent to it. Reconnect(i) gives
  // connection i a new peer id and drops what was queued on the old one; Retarget(i, a)
  // does the same and points it at address a. ConnectBackup(i, a) opens a second connection
  // for shard i, to a, seen on the client's side as shard num_shards + i ("" closes it). The
  // shards see `user` as every message's Inbound::user (who the connection authenticated
  // as).
  std::unique_ptr<ClientTransport> Connect(const std::vector<std::string>& addresses,
                                           const std::string& user = {});

  // Random faults for packets in `direction` to or from `address` ("" for any address;
  // an address's own setting wins).
  void SetFaults(Direction direction, const std::string& address, Faults faults);
  // A rule sees every packet first; a verdict decides it, nullopt leaves it to the next
  // rule and then to the random faults. Rules run under the network's lock: they must
  // not call the network or its transports.
  using Rule = std::function<std::optional<Verdict>(const Packet&)>;
  void AddRule(Rule rule);
  void ClearRules();

  NetworkStats stats() const;

  struct State;  // shared with the transports

 private:
  std::shared_ptr<State> state_;
};

}  // namespace leash::testing
