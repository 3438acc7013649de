// Helpers shared by the ZeroMQ transport's files (private to common/src): frames to and
// from zmq::message_t without copying, socket options, whole-message send and receive
// with zmq::error_t translated to Status, an eventfd waker, and small log formatters.
// Stateless functions are thread-safe; a socket is used by one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>
#include <zmq.hpp>

#include "leash/common/message.h"
#include "leash/common/status.h"
#include "leash/common/zmq_transport.h"

namespace leash::zmq_util {

// The one translation of zmq::error_t into a Status.
Status FromZmq(const zmq::error_t& e, std::string_view what);

// A received part as a Frame, without copying unless it is tiny and unaligned.
Frame ToFrame(zmq::message_t&& msg);
// Received parts `first`.. as a Message (ToFrame each; the parts are moved from).
Message ToMessage(std::vector<zmq::message_t>& parts, size_t first);
// A frame to send; large frames are handed over without copying (the frame's owner is
// kept alive until ZeroMQ is done with it).
zmq::message_t ToZmq(const Frame& f);
// Like ToZmq, and the frame's bytes count in `queued` until ZeroMQ has written (or
// dropped) it.
zmq::message_t ToZmqCounted(const Frame& f, const std::shared_ptr<std::atomic<int64_t>>& queued);

// Linger, handshake interval, high-water marks, maximum message size, reconnect interval
// and TCP keepalive from `o`.
void ApplyOptions(zmq::socket_t& s, const ZmqOptions& o);
// Reads all parts of a message that poll said is ready.
Status RecvAll(zmq::socket_t& s, std::vector<zmq::message_t>* parts);
// Sends all parts without blocking; ResourceExhausted at the high-water mark.
Status SendAll(zmq::socket_t& s, std::vector<zmq::message_t>& parts);
// The socket's ZMQ_EVENTS (ZMQ_POLLIN, ZMQ_POLLOUT). Querying them runs ZeroMQ's pending
// commands, which a signal can interrupt (EINTR: cppzmq's get() throws then, and a worker
// stopped with SIGTERM aborted); this asks again instead. 0 if the socket cannot be asked.
int Events(zmq::socket_t& s);

// An eventfd that Wake() writes and the poll loop drains. Wake() is thread-safe.
class Waker {
 public:
  Waker();
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;
  int fd() const { return fd_; }
  void Wake();
  void Drain();

 private:
  int fd_;
};

int64_t NowMs();  // steady clock
// "0x0000abcd", for protocol error numbers in logs.
std::string Hex(uint32_t v);
// Z85 text of a 32-byte public key, for logs.
std::string Z85(const void* key32);

}  // namespace leash::zmq_util
