// The transport seam: the server and client libraries talk through these interfaces,
// and only main.cc files (and integration tests) construct the ZeroMQ implementations
// (zmq_transport.h). Each object is used by one thread at a time unless a method says
// otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "leash/common/message.h"
#include "leash/common/status.h"

namespace leash {

// Opaque routing identity of a connected peer.
using PeerId = std::string;

// Connection-level events a transport counts (a shard's transport; zero elsewhere).
struct TransportCounters {
  uint64_t auth_refused = 0;       // CURVE clients whose key is not authorized (ZAP said no)
  uint64_t handshake_failed = 0;   // other failed handshakes (no CURVE, wrong server key)
  uint64_t replies_dropped = 0;    // replies to a peer over its queue limit (it does not read)
  uint64_t shm_frames_received = 0;  // frames read from same-host shared memory
  uint64_t shm_frames_sent = 0;      // frames written to same-host shared memory
};

// Bytes a caller fills in place before sending them as a payload frame.
struct WritableFrame {
  uint8_t* data = nullptr;
  Frame frame;  // frame.data() == data; frame.size() bytes
};

struct Inbound {
  PeerId peer;
  Message message;
};

// A shard's listening endpoint (a ROUTER socket in production).
class ServerTransport {
 public:
  virtual ~ServerTransport() = default;
  // Waits up to `timeout` for the next message. Returns nullopt on timeout or Wake().
  virtual Result<std::optional<Inbound>> Receive(std::chrono::milliseconds timeout) = 0;
  // Queues `message` for `peer`. A vanished peer's messages are dropped silently.
  virtual Status Send(const PeerId& peer, Message message) = 0;
  // Interrupts a Receive. Thread-safe.
  virtual void Wake() = 0;
  // Thread-safe.
  virtual TransportCounters counters() const { return {}; }
  // Room for a payload of `bytes` to `peer` that Send() passes without copying it (shared
  // memory with a client on this host), or nullopt: then use ordinary memory. The frame
  // may be sent to that peer only.
  virtual std::optional<WritableFrame> ReservePayload(const PeerId& /*peer*/, size_t /*bytes*/) { return std::nullopt; }
};

// A client's connections, one per shard (DEALER sockets in production).
class ClientTransport {
 public:
  virtual ~ClientTransport() = default;
  virtual int num_shards() const = 0;
  virtual Status Send(int shard, Message message) = 0;
  // Waits up to `timeout` for a message from any shard. nullopt on timeout or Wake().
  virtual Result<std::optional<std::pair<int, Message>>> Receive(std::chrono::milliseconds timeout) = 0;
  // Drops the connection to `shard` and everything queued on it, and connects again.
  virtual Status Reconnect(int shard) = 0;
  // File descriptors that become readable when a message may have arrived, for a
  // caller that waits with poll(2) instead of Receive (and may do so on another thread
  // than the one sending: the descriptors are only polled, never read). They are edge
  // triggered: after every Send or Receive, call Receive(0) until it returns nullopt
  // before waiting on them again. Valid until the next Reconnect.
  virtual std::vector<int> PollFds() = 0;
  // Interrupts a Receive. Thread-safe.
  virtual void Wake() = 0;
  // Why `shard` cannot be talked to, if the transport knows (e.g. the shard refused this
  // client's CURVE key): an Unavailable status saying what to do; Ok if nothing is known
  // to be wrong. Thread-safe.
  virtual Status ShardHealth(int /*shard*/) const { return Status::Ok(); }
  // Room for a payload of `bytes` to `shard` that Send() can pass without copying it
  // (shared memory with a shard on this host), or nullopt: then build the frame in
  // ordinary memory. The frame may be sent (and resent) to that shard only. Thread-safe.
  virtual std::optional<WritableFrame> ReservePayload(int /*shard*/, size_t /*bytes*/) { return std::nullopt; }
  // Whether large frames to `shard` go through shared memory. Thread-safe.
  virtual bool SharedMemoryWith(int /*shard*/) const { return false; }
};

}  // namespace leash
