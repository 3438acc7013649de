// ZeroMQ transport adapter (cppzmq). Frames move zero-copy in both directions.
#include "leash/common/zmq_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <zmq.hpp>

namespace leash {
namespace {

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

void ReleaseOwner(void* /*data*/, void* hint) { delete static_cast<std::shared_ptr<const void>*>(hint); }

zmq::message_t ToZmq(const Frame& f) {
  // Small frames are cheaper to copy than to hand over with a free callback.
  if (f.size() < 256 || !f.owner()) return zmq::message_t(f.data(), f.size());
  auto* hint = new std::shared_ptr<const void>(f.owner());
  return zmq::message_t(const_cast<uint8_t*>(f.data()), f.size(), &ReleaseOwner, hint);
}

// An eventfd that Wake() writes and the poll loop drains.
class Waker {
 public:
  Waker() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~Waker() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  void Wake() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(fd_, &one, sizeof one);
  }
  void Drain() {
    uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(fd_, &v, sizeof v);
  }

 private:
  int fd_;
};

void ApplyOptions(zmq::socket_t& s, const ZmqOptions& o) {
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::sndhwm, o.send_hwm);
  s.set(zmq::sockopt::rcvhwm, o.recv_hwm);
  s.set(zmq::sockopt::maxmsgsize, o.max_message_bytes);
  s.set(zmq::sockopt::reconnect_ivl, o.reconnect_ivl_ms);
  s.set(zmq::sockopt::reconnect_ivl_max, o.reconnect_ivl_max_ms);
  s.set(zmq::sockopt::tcp_keepalive, 1);
}

// Reads all parts of a message that poll said is ready.
Status RecvAll(zmq::socket_t& s, std::vector<zmq::message_t>* parts) {
  try {
    while (true) {
      zmq::message_t m;
      auto r = s.recv(m, zmq::recv_flags::dontwait);
      if (!r) return Unavailable("socket reported readable but had no message");
      bool more = m.more();
      parts->push_back(std::move(m));
      if (!more) return Status::Ok();
    }
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "zmq recv");
  }
}

Status SendAll(zmq::socket_t& s, std::vector<zmq::message_t>& parts) {
  try {
    for (size_t i = 0; i < parts.size(); ++i) {
      auto flags = i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      if (!s.send(std::move(parts[i]), flags | zmq::send_flags::dontwait)) {
        return ResourceExhausted("send queue full (high-water mark reached); the peer is not reading");
      }
    }
    return Status::Ok();
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "zmq send");
  }
}

class ZmqServer final : public ServerTransport {
 public:
  ZmqServer(zmq::context_t& ctx, const ZmqOptions& o) : socket_(ctx, zmq::socket_type::router) {
    ApplyOptions(socket_, o);
  }

  Status Bind(const std::string& endpoint) {
    try {
      socket_.bind(endpoint);
    } catch (const zmq::error_t& e) {
      return Unavailable("cannot bind " + endpoint + ": " + e.what() +
                         " (is another shard using this port, or is the address wrong?)");
    }
    return Status::Ok();
  }

  Result<std::optional<Inbound>> Receive(std::chrono::milliseconds timeout) override {
    zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, waker_.fd(), ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, timeout);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return std::optional<Inbound>();
      return FromZmq(e, "zmq poll");
    }
    if (items[1].revents & ZMQ_POLLIN) waker_.Drain();
    if (!(items[0].revents & ZMQ_POLLIN)) return std::optional<Inbound>();
    std::vector<zmq::message_t> parts;
    LEASH_RETURN_IF_ERROR(RecvAll(socket_, &parts));
    Inbound in;
    in.peer = parts[0].to_string();
    in.message.reserve(parts.size() - 1);
    for (size_t i = 1; i < parts.size(); ++i) in.message.push_back(ToFrame(std::move(parts[i])));
    return std::optional<Inbound>(std::move(in));
  }

  Status Send(const PeerId& peer, Message message) override {
    std::vector<zmq::message_t> parts;
    parts.reserve(message.size() + 1);
    parts.emplace_back(peer.data(), peer.size());
    for (const Frame& f : message) parts.push_back(ToZmq(f));
    return SendAll(socket_, parts);
  }

  void Wake() override { waker_.Wake(); }

 private:
  zmq::socket_t socket_;
  Waker waker_;
};

class ZmqClient final : public ClientTransport {
 public:
  ZmqClient(zmq::context_t& ctx, std::vector<std::string> endpoints, const ZmqOptions& o)
      : ctx_(ctx), endpoints_(std::move(endpoints)), options_(o) {}

  Status Init() {
    for (size_t i = 0; i < endpoints_.size(); ++i) {
      sockets_.emplace_back();
      LEASH_RETURN_IF_ERROR(Open(static_cast<int>(i)));
    }
    return Status::Ok();
  }

  int num_shards() const override { return static_cast<int>(endpoints_.size()); }

  Status Send(int shard, Message message) override {
    std::vector<zmq::message_t> parts;
    parts.reserve(message.size());
    for (const Frame& f : message) parts.push_back(ToZmq(f));
    return SendAll(*sockets_.at(static_cast<size_t>(shard)), parts).WithContext(endpoints_[static_cast<size_t>(shard)]);
  }

  Result<std::optional<std::pair<int, Message>>> Receive(std::chrono::milliseconds timeout) override {
    std::vector<zmq::pollitem_t> items;
    items.reserve(sockets_.size() + 1);
    for (auto& s : sockets_) items.push_back({s->handle(), 0, ZMQ_POLLIN, 0});
    items.push_back({nullptr, waker_.fd(), ZMQ_POLLIN, 0});
    // Serve shards round-robin so a busy shard cannot starve the others.
    for (size_t k = 0; k < sockets_.size(); ++k) {
      size_t i = (next_ + k) % sockets_.size();
      if (sockets_[i]->get(zmq::sockopt::events) & ZMQ_POLLIN) {
        next_ = i + 1;
        return ReadFrom(i);
      }
    }
    // ZMQ_EVENTS above is authoritative: with no time to wait, nothing is ready.
    if (timeout.count() <= 0) return std::optional<std::pair<int, Message>>();
    try {
      zmq::poll(items.data(), items.size(), timeout);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return std::optional<std::pair<int, Message>>();
      return FromZmq(e, "zmq poll");
    }
    if (items.back().revents & ZMQ_POLLIN) waker_.Drain();
    for (size_t k = 0; k < sockets_.size(); ++k) {
      size_t i = (next_ + k) % sockets_.size();
      if (items[i].revents & ZMQ_POLLIN) {
        next_ = i + 1;
        return ReadFrom(i);
      }
    }
    return std::optional<std::pair<int, Message>>();
  }

  Status Reconnect(int shard) override { return Open(shard); }

  std::vector<int> PollFds() override {
    std::vector<int> fds;
    fds.reserve(sockets_.size());
    for (auto& s : sockets_) fds.push_back(s->get(zmq::sockopt::fd));
    return fds;
  }

  void Wake() override { waker_.Wake(); }

 private:
  Status Open(int shard) {
    auto idx = static_cast<size_t>(shard);
    try {
      auto s = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
      ApplyOptions(*s, options_);
      s->connect(endpoints_[idx]);
      sockets_[idx] = std::move(s);
    } catch (const zmq::error_t& e) {
      return InvalidArgument("cannot connect to shard " + std::to_string(shard) + " at '" + endpoints_[idx] +
                             "': " + e.what() + " (expected tcp://HOST:PORT)");
    }
    return Status::Ok();
  }

  Result<std::optional<std::pair<int, Message>>> ReadFrom(size_t i) {
    std::vector<zmq::message_t> parts;
    LEASH_RETURN_IF_ERROR(RecvAll(*sockets_[i], &parts));
    Message m;
    m.reserve(parts.size());
    for (auto& p : parts) m.push_back(ToFrame(std::move(p)));
    return std::optional<std::pair<int, Message>>(std::make_pair(static_cast<int>(i), std::move(m)));
  }

  zmq::context_t& ctx_;
  std::vector<std::string> endpoints_;
  ZmqOptions options_;
  std::vector<std::unique_ptr<zmq::socket_t>> sockets_;
  Waker waker_;
  size_t next_ = 0;
};

}  // namespace

ZmqContext::ZmqContext(int io_threads) : ctx_(std::make_unique<zmq::context_t>(io_threads)) {}
ZmqContext::~ZmqContext() = default;

Result<std::unique_ptr<ServerTransport>> BindZmqServer(ZmqContext& ctx, const std::string& endpoint,
                                                      const ZmqOptions& options) {
  auto s = std::make_unique<ZmqServer>(ctx.get(), options);
  LEASH_RETURN_IF_ERROR(s->Bind(endpoint));
  return std::unique_ptr<ServerTransport>(std::move(s));
}

Result<std::unique_ptr<ClientTransport>> ConnectZmqClient(ZmqContext& ctx, const std::vector<std::string>& endpoints,
                                                         const ZmqOptions& options) {
  if (endpoints.empty()) return InvalidArgument("no shard endpoints given (set --servers or LEASH_SERVERS)");
  auto c = std::make_unique<ZmqClient>(ctx.get(), endpoints, options);
  LEASH_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<ClientTransport>(std::move(c));
}

}  // namespace leash
