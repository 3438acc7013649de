// The transport seam: the server and client libraries talk through these interfaces,
// and only main.cc files (and integration tests) construct the ZeroMQ implementations
// (zmq_transport.h); unit tests use the in-memory one (tests/support/memory_transport.h).
// A transport moves messages; what else one can do (same-host shared memory, handshake
// diagnostics) it offers through side interfaces that are null where it cannot.
// Thread-safety is stated per class and method.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "leash/common/message.h"
#include "leash/common/status.h"

namespace leash {

// Opaque routing identity of a connected peer.
using PeerId = std::string;

// Connection-level events a transport counts (a shard's transport; zero elsewhere).
struct TransportCounters {
  uint64_t auth_refused = 0;           // CURVE clients whose key is not authorized (ZAP said no)
  uint64_t handshake_failed = 0;       // other failed handshakes (no CURVE, wrong server key)
  uint64_t replies_dropped = 0;        // replies to a peer over its queue limit (it does not read)
  uint64_t shm_frames_received = 0;    // frames read from same-host shared memory
  uint64_t shm_frames_lent = 0;        // of those, read in place (their client lends them)
  uint64_t shm_frames_sent = 0;        // frames written to same-host shared memory
  uint64_t shm_messages_received = 0;  // whole messages read from same-host queues
  uint64_t shm_messages_sent = 0;      // whole messages written to same-host queues
  uint64_t striped_received = 0;       // messages put back together from stripes (stripes.h)
  uint64_t striped_sent = 0;           // replies sent striped
  uint64_t striped_dropped = 0;        // striped messages whose parts did not all arrive in time
};

// Bytes a caller fills in place before sending them as a payload frame.
struct WritableFrame {
  uint8_t* data = nullptr;
  Frame frame;  // frame.data() == data; frame.size() bytes
};

struct Inbound {
  PeerId peer;
  Message message;
  // Who the connection authenticated as: the name the shard's CURVE authenticator gave its
  // key (the authorized/ file it came from, or the replicas' name for the shards' own key).
  // Empty without CURVE, where nobody is authenticated.
  std::string user;
};

// A shard's listening endpoint (a ROUTER socket in production). Used by one thread at a
// time, except Wake() and counters().
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
  virtual std::optional<WritableFrame> ReservePayload(const PeerId& /*peer*/, size_t /*bytes*/) {
    return std::nullopt;
  }
  // How frames received through shared memory are copied out from now on (a shard's, with
  // its update threads), called on the thread that calls Receive; null: as
  // Frame::CopyCheckingFinite. Not thread-safe: set it between Receives. A transport that
  // copies nothing ignores it.
  virtual void SetFrameCopier(FrameCopier /*copier*/) {}
};

// Optional capability of a ClientTransport: large frames to shards on this host go
// through shared memory. Thread-safe.
class ClientSharedMemory {
 public:
  virtual ~ClientSharedMemory() = default;
  // Room for a payload of `bytes` to `shard` that Send() can pass without copying it, or
  // nullopt: then build the frame in ordinary memory. The frame may be sent (and resent)
  // to that shard only.
  virtual std::optional<WritableFrame> ReservePayload(int shard, size_t bytes) = 0;
  // Whether large frames to `shard` go through shared memory now. num_shards() + shard:
  // whether that shard's backup connection (ClientTransport::ConnectBackup) sends and
  // receives its messages through its segment's queue now.
  virtual bool ActiveWith(int shard) const = 0;
  // The most a ring grows to (one per direction and shard). A reply frame read in place
  // (Frame::lent) keeps its room in the shard's ring until released: a reader that holds
  // such frames for long should hold no more than a part of this.
  virtual size_t ring_bytes() const = 0;
  // A new segment for `shard`'s connection, offered afresh (until it is answered large frames
  // go through the socket): what the shard's process held in the old one is given up. For
  // a shard that restarted while it held frames read in place (ZmqOptions::shm_lend).
  virtual void RenewLink(int shard) = 0;
};

// Optional capability of a ClientTransport: it knows why a shard cannot be talked to
// (e.g. the shard refused this client's CURVE key). Thread-safe.
class ConnectionHealth {
 public:
  virtual ~ConnectionHealth() = default;
  // An Unavailable status saying what to do, or Ok if nothing is known to be wrong.
  virtual Status ShardHealth(int shard) const = 0;
};

// A client's connections, one per shard (DEALER sockets in production).
//
// Threads: one thread at a time may Receive. Send, Reconnect, Retarget and ConnectBackup may
// be called while another thread waits in Receive (a message that arrives meanwhile still
// ends that wait), one call at a time (the caller serializes them). Wake and the side
// interfaces are thread-safe.
class ClientTransport {
 public:
  virtual ~ClientTransport() = default;
  virtual int num_shards() const = 0;
  // Queues `message` for `shard` without blocking; ResourceExhausted if its queue is full.
  virtual Status Send(int shard, Message message) = 0;
  // Waits up to `timeout` (0: does not wait) for a message from any shard. nullopt on
  // timeout or Wake(). Messages of one shard come in the order it sent them.
  virtual Result<std::optional<std::pair<int, Message>>> Receive(
      std::chrono::milliseconds timeout) = 0;
  // Makes a Receive that waits return nullopt now, or, if none waits, the next one that
  // would wait. Never lost; may end one wait more than asked.
  virtual void Wake() = 0;
  // Drops the connection to `shard` and everything queued on it, and connects again.
  virtual Status Reconnect(int shard) = 0;
  // Points `shard`'s connection at `endpoint` from now on (a replicated shard's new
  // primary): drops the old connection and everything queued on it, and connects there.
  // InvalidArgument for a malformed endpoint; FailedPrecondition where the transport cannot.
  virtual Status Retarget(int /*shard*/, const std::string& /*endpoint*/) {
    return FailedPrecondition("this transport cannot move a shard's connection to a new endpoint");
  }
  // A second connection per shard, to the shard's sole in-sync backup where that backup
  // answers pushes and clocks itself (ReplicaAddress::answers). `endpoint` "" closes it
  // (and drops what is queued on it); another endpoint replaces it. Messages from it come
  // out of Receive as shard num_shards() + shard; Send(num_shards() + shard, m) sends on it
  // (Unavailable while none is open). No striping on it; with shared memory it offers the
  // backup a segment of its own, so that on one host the backup's replies come through the
  // segment's queue, as the primary's do.
  // InvalidArgument for a malformed endpoint (none is open then) or a shard out of range;
  // FailedPrecondition where the transport cannot.
  virtual Status ConnectBackup(int /*shard*/, const std::string& /*endpoint*/) {
    return FailedPrecondition("this transport cannot connect to a shard's backup");
  }

  // Side interfaces; null where the transport cannot. Each lives as long as the transport.
  virtual ClientSharedMemory* shared_memory() { return nullptr; }
  virtual const ConnectionHealth* health() const { return nullptr; }
};

}  // namespace leash
