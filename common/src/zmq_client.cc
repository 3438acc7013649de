// A client's ZeroMQ connections: one DEALER socket per shard, each with a socket monitor
// whose handshake events feed the per-shard health (socket_monitor.h), and same-host
// shared memory per shard (shm_link.h). ZeroMQ sockets are not thread-safe, and their
// file descriptors signal edge-triggered: every socket operation happens under one
// mutex, a Receive that waits polls the descriptors without it, and a Send that may
// have taken a waiting Receive's edge wakes it. Thread-safety as transport.h says.
#include <poll.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <zmq.hpp>

#include "leash/common/zmq_transport.h"
#include "shm_link.h"
#include "socket_monitor.h"
#include "zmq_util.h"

namespace leash {
namespace {

using Received = std::optional<std::pair<int, Message>>;

class ZmqClient final : public ClientTransport, public ClientSharedMemory {
 public:
  ZmqClient(zmq::context_t& ctx, std::vector<std::string> endpoints, const ZmqOptions& o)
      : ctx_(ctx), endpoints_(std::move(endpoints)), options_(o), watch_(endpoints_, o) {}

  ~ZmqClient() override {
    for (size_t i = 0; i < sockets_.size(); ++i) {
      monitors_[i].reset();  // before the socket it watches (socket_monitor.h)
      sockets_[i].reset();
    }
  }

  Status Init() {
    if (options_.curve) LEASH_RETURN_IF_ERROR(CurveSupported());
    if (options_.shared_memory) shm::ShmSegment::RemoveStale();
    std::lock_guard<std::mutex> lock(mu_);
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
    if (options_.send_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.send_delay_ms));
    }
    auto idx = static_cast<size_t>(shard);
    std::vector<zmq::message_t> parts;
    parts.reserve(message.size() + 1);
    for (const Frame& f : message) parts.push_back(zmq_util::ToZmq(f));
    if (std::optional<shm::Placement> p = shm_.at(idx)->Place(message)) {
      for (const auto& moved : p->frames) parts[moved.first] = zmq::message_t();
      parts.emplace_back(p->trailer.data(), p->trailer.size());
    }
    std::lock_guard<std::mutex> lock(mu_);
    Status st = zmq_util::SendAll(*sockets_[idx], parts).WithContext(endpoints_[idx]);
    NudgeIfReadable(idx);
    return st;
  }

  Result<Received> Receive(std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        LEASH_ASSIGN_OR_RETURN(Received in, ReadReady());
        if (in) return in;
        if (timeout.count() <= 0) return Received();
        if (woken_.exchange(false)) {
          waker_.Drain();
          return Received();
        }
        fds_.clear();
        for (auto& s : sockets_) fds_.push_back({s->get(zmq::sockopt::fd), POLLIN, 0});
        for (auto& m : monitors_) {
          if (int fd = m->fd(); fd >= 0) fds_.push_back({fd, POLLIN, 0});
        }
        fds_.push_back({waker_.fd(), POLLIN, 0});
        polling_.store(true);
      }
      auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() > 0) ::poll(fds_.data(), fds_.size(), static_cast<int>(left.count()));
      polling_.store(false);
      for (size_t k = sockets_.size(); k + 1 < fds_.size(); ++k) {
        if (fds_[k].revents & POLLIN) monitors_due_.store(true);
      }
      if (fds_.back().revents & POLLIN) waker_.Drain();
      if (std::chrono::steady_clock::now() >= deadline) timeout = std::chrono::milliseconds(0);
    }
  }

  Status Reconnect(int shard) override {
    std::lock_guard<std::mutex> lock(mu_);
    LEASH_RETURN_IF_ERROR(Open(shard));
    // A shard that never answered the offer (it may have been down) hears it again.
    SendOffer(static_cast<size_t>(shard));
    if (polling_.load()) waker_.Wake();  // a waiting Receive polls the old socket
    return Status::Ok();
  }

  Status Retarget(int shard, const std::string& endpoint) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto idx = static_cast<size_t>(shard);
    std::string old = endpoints_.at(idx);
    endpoints_[idx] = endpoint;
    Status st = Open(shard);
    if (!st.ok()) {
      endpoints_[idx] = old;  // the old socket is still open (Open replaces it only on success)
      return st;
    }
    SendOffer(idx);                      // shared memory is offered to the new process afresh
    if (polling_.load()) waker_.Wake();  // a waiting Receive polls the old socket
    return Status::Ok();
  }

  void Wake() override {
    woken_.store(true);
    waker_.Wake();
  }

  ClientSharedMemory* shared_memory() override { return options_.shared_memory ? this : nullptr; }
  const ConnectionHealth* health() const override { return &watch_; }

  std::optional<WritableFrame> ReservePayload(int shard, size_t bytes) override {
    if (shard < 0 || static_cast<size_t>(shard) >= shm_.size()) return std::nullopt;
    return shm_[static_cast<size_t>(shard)]->Reserve(bytes);
  }

  bool ActiveWith(int shard) const override {
    return shard >= 0 && static_cast<size_t>(shard) < shm_.size() &&
           shm_[static_cast<size_t>(shard)]->on();
  }

 private:
  // A message from a socket that has one (round-robin, so a busy shard cannot starve the
  // others), after the monitors' events; nullopt if none. Shared-memory answers are
  // handled here. Under mu_.
  Result<Received> ReadReady() {
    // The monitors only matter around handshakes: read them when their descriptor said so,
    // after a (re)connect, and every 100 ms, not on every message (each read costs a
    // poll and a getpid system call inside ZeroMQ).
    const int64_t now = zmq_util::NowMs();
    if (monitors_due_.exchange(false) || now - monitors_read_ms_ >= 100) {
      monitors_read_ms_ = now;
      for (size_t i = 0; i < monitors_.size(); ++i) {
        while (auto e = monitors_[i]->Next()) watch_.OnEvent(static_cast<int>(i), *e);
      }
    }
    for (size_t k = 0; k < sockets_.size(); ++k) {
      size_t i = (next_ + k) % sockets_.size();
      while (sockets_[i]->get(zmq::sockopt::events) & ZMQ_POLLIN) {
        next_ = i + 1;
        LEASH_ASSIGN_OR_RETURN(Received in, ReadFrom(i));
        if (in) return in;
      }
    }
    return Received();
  }

  // After a socket operation on socket i: a Receive polling now may have lost the edge
  // of a message that is there; wake it to look. Under mu_.
  void NudgeIfReadable(size_t i) {
    if (polling_.load() && (sockets_[i]->get(zmq::sockopt::events) & ZMQ_POLLIN)) waker_.Wake();
  }

  std::string Describe(int shard) const {
    return "shard " + std::to_string(shard) + " (" + endpoints_[static_cast<size_t>(shard)] + ")";
  }

  // Under mu_.
  void SendOffer(size_t i) {
    std::optional<std::string> offer = shm_[i]->Offer();
    if (!offer) return;
    std::vector<zmq::message_t> parts;
    parts.emplace_back(offer->data(), offer->size());
    Status st = zmq_util::SendAll(*sockets_[i], parts);
    if (!st.ok()) spdlog::debug("shared-memory offer to shard {} not sent: {}", i, st.ToString());
  }

  // Under mu_.
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
      monitors_[idx] = std::move(m);  // the old monitor goes before the old socket
      sockets_[idx] = std::move(s);
      monitors_due_.store(true);
      if (!replaced) SendOffer(idx);
    } catch (const zmq::error_t& e) {
      return InvalidArgument("cannot connect to shard " + std::to_string(shard) + " at '" +
                             endpoints_[idx] + "': " + e.what() + " (expected tcp://HOST:PORT)");
    }
    watch_.Reconnecting(shard);
    return Status::Ok();
  }

  // One message of socket i; nullopt for a shared-memory answer (handled here). Under mu_.
  Result<Received> ReadFrom(size_t i) {
    std::vector<zmq::message_t> parts;
    LEASH_RETURN_IF_ERROR(zmq_util::RecvAll(*sockets_[i], &parts));
    if (parts.size() == 1 && shm::IsAnswer(parts[0].data(), parts[0].size())) {
      shm_[i]->OnAnswer(parts[0].data(), parts[0].size());
      return Received();
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
    return Received(std::make_pair(static_cast<int>(i), std::move(m)));
  }

  zmq::context_t& ctx_;
  std::mutex mu_;  // every socket operation
  std::vector<std::string> endpoints_;
  ZmqOptions options_;
  std::vector<std::unique_ptr<zmq::socket_t>> sockets_;
  std::vector<std::unique_ptr<SocketMonitor>> monitors_;
  std::vector<std::unique_ptr<shm::ClientLink>> shm_;  // per shard; never null after Init
  HandshakeWatch watch_;
  zmq_util::Waker waker_;
  std::atomic<bool> woken_{false};        // Wake() was called and no Receive returned for it yet
  std::atomic<bool> polling_{false};      // a Receive polls the descriptors (without mu_)
  std::vector<pollfd> fds_;               // the receiving thread's
  size_t next_ = 0;                       // under mu_
  std::atomic<bool> monitors_due_{true};  // a monitor's descriptor was readable, or a reconnect
  int64_t monitors_read_ms_ = 0;          // under mu_
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
