// Helpers shared by the ZeroMQ transport's files; see zmq_util.h.
#include "zmq_util.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>

namespace leash::zmq_util {

Status FromZmq(const zmq::error_t& e, std::string_view what) {
  return Unavailable(std::string(what) + ": " + e.what());
}

Frame ToFrame(zmq::message_t&& msg) {
  // Tiny messages live inside zmq_msg_t and may be unaligned; FlatBuffers and float
  // payloads want 8-byte alignment, so those few are copied.
  if (reinterpret_cast<uintptr_t>(msg.data()) % 8 != 0) return Frame::Copy(msg.data(), msg.size());
  auto holder = std::make_shared<zmq::message_t>(std::move(msg));
  const void* data = holder->data();
  size_t size = holder->size();
  return Frame::Wrap(data, size, std::shared_ptr<const void>(holder, holder.get()));
}

Message ToMessage(std::vector<zmq::message_t>& parts, size_t first) {
  Message m;
  m.reserve(parts.size() > first ? parts.size() - first : 0);
  for (size_t i = first; i < parts.size(); ++i) m.push_back(ToFrame(std::move(parts[i])));
  return m;
}

namespace {

void ReleaseOwner(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

// A frame handed to ZeroMQ whose bytes count against its peer's queue until ZeroMQ has
// written (or dropped) it: the free callback runs on a ZeroMQ I/O thread.
struct CountedFrame {
  std::shared_ptr<const void> owner;
  std::shared_ptr<std::atomic<int64_t>> queued;
  int64_t bytes;
};

void ReleaseCounted(void* /*data*/, void* hint) {
  auto* c = static_cast<CountedFrame*>(hint);
  c->queued->fetch_sub(c->bytes);
  delete c;
}

}  // namespace

zmq::message_t ToZmq(const Frame& f) {
  // Small frames are cheaper to copy than to hand over with a free callback.
  if (f.size() < 256 || !f.owner()) return zmq::message_t(f.data(), f.size());
  auto* hint = new std::shared_ptr<const void>(f.owner());
  return zmq::message_t(const_cast<uint8_t*>(f.data()), f.size(), &ReleaseOwner, hint);
}

zmq::message_t ToZmqCounted(const Frame& f, const std::shared_ptr<std::atomic<int64_t>>& queued) {
  if (f.size() < 256) return zmq::message_t(f.data(), f.size());
  Frame owned = f.owner() ? f : Frame::Copy(f.data(), f.size());
  auto* hint = new CountedFrame{owned.owner(), queued, static_cast<int64_t>(owned.size())};
  queued->fetch_add(hint->bytes);
  return zmq::message_t(const_cast<uint8_t*>(owned.data()), owned.size(), &ReleaseCounted, hint);
}

void ApplyOptions(zmq::socket_t& s, const ZmqOptions& o) {
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::handshake_ivl, o.handshake_ivl_ms);
  s.set(zmq::sockopt::sndhwm, o.send_hwm);
  s.set(zmq::sockopt::rcvhwm, o.recv_hwm);
  s.set(zmq::sockopt::maxmsgsize, o.max_message_bytes);
  s.set(zmq::sockopt::reconnect_ivl, o.reconnect_ivl_ms);
  s.set(zmq::sockopt::reconnect_ivl_max, o.reconnect_ivl_max_ms);
  s.set(zmq::sockopt::tcp_keepalive, 1);
}

Status RecvAll(zmq::socket_t& s, std::vector<zmq::message_t>* parts) {
  while (true) {
    zmq::message_t m;
    try {
      auto r = s.recv(m, zmq::recv_flags::dontwait);
      if (!r) return Unavailable("socket reported readable but had no message");
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;  // a signal interrupted ZeroMQ's command processing
      return FromZmq(e, "zmq recv");
    }
    bool more = m.more();
    parts->push_back(std::move(m));
    if (!more) return Status::Ok();
  }
}

Status SendAll(zmq::socket_t& s, std::vector<zmq::message_t>& parts) {
  for (size_t i = 0; i < parts.size(); ++i) {
    auto flags = i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    while (true) {
      try {
        if (!s.send(parts[i], flags | zmq::send_flags::dontwait)) {
          return ResourceExhausted(
              "send queue full (high-water mark reached); the peer is not reading");
        }
        break;
      } catch (const zmq::error_t& e) {
        // A signal interrupted it: the part was not taken (ZeroMQ leaves it to the caller
        // on failure), so it goes again.
        if (e.num() != EINTR) return FromZmq(e, "zmq send");
      }
    }
  }
  return Status::Ok();
}

int Events(zmq::socket_t& s) {
  int events = 0;
  size_t size = sizeof events;
  while (zmq_getsockopt(s.handle(), ZMQ_EVENTS, &events, &size) != 0) {
    if (zmq_errno() != EINTR) return 0;
    size = sizeof events;
  }
  return events;
}

Waker::Waker() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

Waker::~Waker() {
  if (fd_ >= 0) ::close(fd_);
}

void Waker::Wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(fd_, &one, sizeof one);
}

void Waker::Drain() {
  uint64_t v;
  [[maybe_unused]] ssize_t n = ::read(fd_, &v, sizeof v);
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string Z85(const void* key32) {
  char out[41] = {0};
  if (zmq_z85_encode(out, static_cast<const uint8_t*>(key32), 32) == nullptr) return "?";
  return out;
}

}  // namespace leash::zmq_util
