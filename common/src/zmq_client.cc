// A client's ZeroMQ connections: one DEALER socket per shard, each with a socket monitor
// whose handshake events feed the per-shard health (socket_monitor.h), and same-host
// shared memory per shard (shm_link.h). Thread-compatible, except the methods
// transport.h marks thread-safe.
#include <spdlog/spdlog.h>

#include <memory>
#include <mutex>
#include <zmq.hpp>

#include "leash/common/zmq_transport.h"
#include "shm_link.h"
#include "socket_monitor.h"
#include "zmq_util.h"

namespace leash {
namespace {

using zmq_util::FromZmq;

class ZmqClient final : public ClientTransport {
 public:
  ZmqClient(zmq::context_t& ctx, std::vector<std::string> endpoints, const ZmqOptions& o)
      : ctx_(ctx), endpoints_(std::move(endpoints)), options_(o), watch_(endpoints_, o) {}

  ~ZmqClient() override {
    for (size_t i = 0; i < sockets_.size(); ++i) {
      sockets_[i].reset();
      monitors_[i].reset();
    }
  }

  Status Init() {
    if (options_.curve) LEASH_RETURN_IF_ERROR(CurveSupported());
    if (options_.shared_memory) shm::ShmSegment::RemoveStale();
    for (size_t i = 0; i < endpoints_.size(); ++i) {
      sockets_.emplace_back();
      monitors_.emplace_back();
      shm_.push_back(options_.shared_memory ? std::make_unique<shm::ClientLink>(
                                                  static_cast<size_t>(options_.shm_ring_bytes),
                                                  static_cast<size_t>(options_.shm_min_frame_bytes),
                                                  Describe(static_cast<int>(i)))
                                            : std::make_unique<shm::ClientLink>());
      LEASH_RETURN_IF_ERROR(Open(static_cast<int>(i)));
    }
    return Status::Ok();
  }

  int num_shards() const override { return static_cast<int>(endpoints_.size()); }

  Status Send(int shard, Message message) override {
    auto idx = static_cast<size_t>(shard);
    std::vector<zmq::message_t> parts;
    parts.reserve(message.size() + 1);
    for (const Frame& f : message) parts.push_back(zmq_util::ToZmq(f));
    if (std::optional<shm::Placement> p = shm_.at(idx)->Place(message)) {
      for (const auto& moved : p->frames) parts[moved.first] = zmq::message_t();
      parts.emplace_back(p->trailer.data(), p->trailer.size());
    }
    return zmq_util::SendAll(*sockets_.at(idx), parts).WithContext(endpoints_[idx]);
  }

  std::optional<WritableFrame> ReservePayload(int shard, size_t bytes) override {
    if (shard < 0 || static_cast<size_t>(shard) >= shm_.size()) return std::nullopt;
    return shm_[static_cast<size_t>(shard)]->Reserve(bytes);
  }

  bool SharedMemoryWith(int shard) const override {
    return shard >= 0 && static_cast<size_t>(shard) < shm_.size() &&
           shm_[static_cast<size_t>(shard)]->on();
  }

  Result<std::optional<std::pair<int, Message>>> Receive(
      std::chrono::milliseconds timeout) override {
    // Shared-memory answers are handled here and come back as empty messages: look again
    // (without waiting) so a caller draining edge-triggered PollFds() misses nothing.
    while (true) {
      LEASH_ASSIGN_OR_RETURN(auto in, ReceiveOne(timeout));
      if (!in || !in->second.empty()) return in;
      timeout = std::chrono::milliseconds(0);
    }
  }

  Status Reconnect(int shard) override {
    LEASH_RETURN_IF_ERROR(Open(shard));
    // A shard that never answered the offer (it may have been down) hears it again.
    SendOffer(static_cast<size_t>(shard));
    return Status::Ok();
  }

  std::vector<int> PollFds() override {
    std::vector<int> fds;
    fds.reserve(sockets_.size());
    for (auto& s : sockets_) fds.push_back(s->get(zmq::sockopt::fd));
    for (auto& m : monitors_) {
      if (!m) continue;
      int fd = m->fd();
      if (fd >= 0) fds.push_back(fd);
    }
    return fds;
  }

  void Wake() override { waker_.Wake(); }

  Status ShardHealth(int shard) const override { return watch_.ShardHealth(shard); }

 private:
  Result<std::optional<std::pair<int, Message>>> ReceiveOne(std::chrono::milliseconds timeout) {
    std::vector<zmq::pollitem_t> items;
    items.reserve(2 * sockets_.size() + 1);
    for (auto& s : sockets_) items.push_back({s->handle(), 0, ZMQ_POLLIN, 0});
    items.push_back({nullptr, waker_.fd(), ZMQ_POLLIN, 0});
    for (auto& m : monitors_) items.push_back({m->handle(), 0, ZMQ_POLLIN, 0});
    // Serve shards round-robin so a busy shard cannot starve the others.
    for (size_t k = 0; k < sockets_.size(); ++k) {
      size_t i = (next_ + k) % sockets_.size();
      if (sockets_[i]->get(zmq::sockopt::events) & ZMQ_POLLIN) {
        next_ = i + 1;
        return ReadFrom(i);
      }
    }
    // ZMQ_EVENTS above is authoritative: with no time to wait, nothing is ready. Threads
    // that wait on PollFds() instead of polling here still need the handshake events.
    if (timeout.count() <= 0) {
      for (size_t i = 0; i < monitors_.size(); ++i) {
        if (monitors_[i]) DrainMonitor(i);
      }
      return std::optional<std::pair<int, Message>>();
    }
    try {
      zmq::poll(items.data(), items.size(), timeout);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return std::optional<std::pair<int, Message>>();
      return FromZmq(e, "zmq poll");
    }
    if (items[sockets_.size()].revents & ZMQ_POLLIN) waker_.Drain();
    for (size_t i = 0; i < monitors_.size(); ++i) {
      if (items[sockets_.size() + 1 + i].revents & ZMQ_POLLIN) DrainMonitor(i);
    }
    for (size_t k = 0; k < sockets_.size(); ++k) {
      size_t i = (next_ + k) % sockets_.size();
      if (items[i].revents & ZMQ_POLLIN) {
        next_ = i + 1;
        return ReadFrom(i);
      }
    }
    return std::optional<std::pair<int, Message>>();
  }

  std::string Describe(int shard) const {
    return "shard " + std::to_string(shard) + " (" + endpoints_[static_cast<size_t>(shard)] + ")";
  }

  void SendOffer(size_t i) {
    std::optional<std::string> offer = shm_[i]->Offer();
    if (!offer) return;
    std::vector<zmq::message_t> parts;
    parts.emplace_back(offer->data(), offer->size());
    Status st = zmq_util::SendAll(*sockets_[i], parts);
    if (!st.ok()) spdlog::debug("shared-memory offer to shard {} not sent: {}", i, st.ToString());
  }

  void DrainMonitor(size_t i) {
    while (auto e = monitors_[i]->Next()) watch_.OnEvent(static_cast<int>(i), *e);
  }

  Status Open(int shard) {
    auto idx = static_cast<size_t>(shard);
    const bool replaced = sockets_[idx] != nullptr;
    try {
      auto s = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
      zmq_util::ApplyOptions(*s, options_);
      if (options_.curve) {
        s->set(zmq::sockopt::curve_serverkey, options_.curve->server_public_z85);
        s->set(zmq::sockopt::curve_publickey, options_.curve->own.public_z85);
        s->set(zmq::sockopt::curve_secretkey, options_.curve->own.secret_z85);
      }
      auto m = std::make_unique<SocketMonitor>(
          ctx_, *s,
          ZMQ_EVENT_CONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
              ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL);
      s->connect(endpoints_[idx]);
      sockets_[idx] = std::move(s);
      monitors_[idx] = std::move(m);
      if (!replaced) SendOffer(idx);
    } catch (const zmq::error_t& e) {
      return InvalidArgument("cannot connect to shard " + std::to_string(shard) + " at '" +
                             endpoints_[idx] + "': " + e.what() + " (expected tcp://HOST:PORT)");
    }
    watch_.Reconnecting(shard);
    return Status::Ok();
  }

  Result<std::optional<std::pair<int, Message>>> ReadFrom(size_t i) {
    std::vector<zmq::message_t> parts;
    LEASH_RETURN_IF_ERROR(zmq_util::RecvAll(*sockets_[i], &parts));
    if (parts.size() == 1 && shm::IsAnswer(parts[0].data(), parts[0].size())) {
      shm_[i]->OnAnswer(parts[0].data(), parts[0].size());
      return std::optional<std::pair<int, Message>>(std::make_pair(static_cast<int>(i), Message()));
    }
    std::optional<shm::Trailer> trailer;
    if (parts.size() >= 2)
      trailer = shm::DecodeTrailer(parts.back().data(), parts.back().size(), 1);
    if (trailer) parts.pop_back();
    Message m;
    m.reserve(parts.size());
    for (auto& p : parts) m.push_back(zmq_util::ToFrame(std::move(p)));
    if (trailer) {
      Status st = shm_[i]->Fill(*trailer, &m);
      if (!st.ok()) {
        spdlog::warn("{}: a reply's shared-memory frame could not be read: {}",
                     Describe(static_cast<int>(i)), st.ToString());
      }
    }
    return std::optional<std::pair<int, Message>>(
        std::make_pair(static_cast<int>(i), std::move(m)));
  }

  zmq::context_t& ctx_;
  std::vector<std::string> endpoints_;
  ZmqOptions options_;
  std::vector<std::unique_ptr<zmq::socket_t>> sockets_;
  std::vector<std::unique_ptr<SocketMonitor>> monitors_;
  std::vector<std::unique_ptr<shm::ClientLink>> shm_;  // per shard; never null after Init
  HandshakeWatch watch_;
  zmq_util::Waker waker_;
  size_t next_ = 0;
};

}  // namespace

Result<std::unique_ptr<ClientTransport>> ConnectZmqClient(ZmqContext& ctx,
                                                          const std::vector<std::string>& endpoints,
                                                          const ZmqOptions& options) {
  if (endpoints.empty())
    return InvalidArgument("no shard endpoints given (set --servers or LEASH_SERVERS)");
  auto c = std::make_unique<ZmqClient>(ctx.get(), endpoints, options);
  LEASH_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<ClientTransport>(std::move(c));
}

}  // namespace leash
