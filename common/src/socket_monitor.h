// Watching ZeroMQ connections: SocketMonitor reads one socket's connection and handshake
// events, and the diagnostics below turn them into what a person can act on: a shard's
// log line for a failed handshake, and a client's per-shard health (a refused CURVE key,
// CURVE on one side only, a wrong server key).
// SocketMonitor is used by one thread at a time; HandshakeWatch is thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "leash/common/status.h"
#include "leash/common/zmq_transport.h"

namespace leash {

// Watches one socket's events: zmq_socket_monitor publishes them on an inproc PAIR that
// this object reads without blocking.
class SocketMonitor {
 public:
  struct Event {
    uint16_t event = 0;  // ZMQ_EVENT_*
    uint32_t value = 0;  // the event's value (an errno, a ZAP status, a protocol error)
  };

  // Throws zmq::error_t if the monitor cannot be set up. `watched` must outlive the monitor:
  // destroy the monitor before closing the socket it watches.
  SocketMonitor(zmq::context_t& ctx, zmq::socket_t& watched, int events);
  // Stops the monitoring (while the watched socket is still open), then closes the pair.
  // In that order: libzmq's I/O thread sends each event with a blocking send, so an event
  // of a socket whose monitor pair was closed first blocks that thread for good, and with it
  // every socket of the context (a worker went silent to every shard after a reconnect).
  ~SocketMonitor();
  SocketMonitor(const SocketMonitor&) = delete;
  SocketMonitor& operator=(const SocketMonitor&) = delete;

  void* handle() { return pair_.handle(); }
  // The file descriptor that signals (edge-triggered, like any ZeroMQ socket's) that
  // events may be waiting; -1 if unknown.
  int fd();

  // The next event, if one is waiting.
  std::optional<Event> Next();

 private:
  void* watched_;
  zmq::socket_t pair_;
};

// Why a client's handshake with this shard failed, for the shard's log.
std::string DescribeServerHandshakeFailure(const SocketMonitor::Event& e, bool curve);

// A client's view of its connections' handshakes, one entry per shard: the failures it
// saw, and connections that never finish a CURVE handshake (a CURVE server that cannot
// decrypt the client's HELLO just closes the connection).
class HandshakeWatch final : public ConnectionHealth {
 public:
  // `grace_ms`: how long connections may fail to finish a handshake without a definite
  // refusal (a CURVE HELLO the shard cannot decrypt, a connection reset mid-handshake)
  // before the shard is reported unavailable.
  HandshakeWatch(std::vector<std::string> endpoints, const ZmqOptions& options,
                 int64_t grace_ms = kHandshakeGraceMs);

  // A new connection to `shard` is being set up (a failure seen before is kept until a
  // handshake succeeds).
  void Reconnecting(int shard);
  // An event of `shard`'s socket monitor; a new failure is logged once.
  void OnEvent(int shard, const SocketMonitor::Event& e);
  // Unavailable with what to do if `shard` cannot be talked to; Ok if nothing is known.
  // A refusal (a key the shard does not accept, CURVE on one side only, a protocol error)
  // counts at once. A connection the shard closed or reset during the handshake counts only
  // once no handshake has succeeded for the grace period since: ZeroMQ reconnects, and a shard
  // that is starting or failing over drops connections it then accepts.
  Status ShardHealth(int shard) const override;

  static constexpr int64_t kHandshakeGraceMs = 3000;

 private:
  struct Health {
    int64_t unsecured_since_ms = -1;  // first connection since the last good handshake
    std::string failure;              // the last refusal, until a handshake succeeds
    std::string broken;               // the last connection broken mid-handshake, until then
    int64_t broken_since_ms = -1;     // when the first of those broke
  };
  std::string Describe(int shard) const;
  std::string KeyHint() const;

  const std::vector<std::string> endpoints_;
  const ZmqOptions options_;
  const int64_t grace_ms_;
  mutable std::mutex mu_;
  std::vector<Health> health_;  // guarded by mu_
};

}  // namespace leash
