// A shard's ZeroMQ endpoint: one ROUTER socket, with CURVE's authenticator (ZAP handler)
// when keys are configured, a socket monitor for failed handshakes, a per-peer limit on
// unread replies, and same-host shared memory (shm_link.h). Thread-compatible, except
// Wake() and counters(), which are thread-safe.
#include <poll.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <zmq.hpp>

#include "leash/common/zmq_transport.h"
#include "shm_link.h"
#include "socket_monitor.h"
#include "zap_handler.h"
#include "zmq_util.h"

namespace leash {
namespace {

using zmq_util::FromZmq;
using zmq_util::NowMs;

class ZmqServer final : public ServerTransport {
 public:
  ZmqServer(zmq::context_t& ctx, const ZmqOptions& o)
      : ctx_(ctx),
        options_(o),
        socket_(ctx, zmq::socket_type::router),
        shm_(o.shared_memory, static_cast<size_t>(o.shm_min_frame_bytes)) {
    zmq_util::ApplyOptions(socket_, o);
  }

  ~ZmqServer() override {
    monitor_.reset();
    socket_.close();
    zap_.reset();
  }

  Status Bind(const std::string& endpoint) {
    try {
      if (options_.curve) {
        LEASH_RETURN_IF_ERROR(CurveSupported());
        // The authenticator must be up before the first client connects.
        zap_ = std::make_unique<ZapHandler>(ctx_, options_.curve->authorized);
        LEASH_RETURN_IF_ERROR(zap_->Start());
        socket_.set(zmq::sockopt::curve_server, 1);
        socket_.set(zmq::sockopt::curve_secretkey, options_.curve->own.secret_z85);
        socket_.set(zmq::sockopt::zap_domain, "leash");
      }
      monitor_ = std::make_unique<SocketMonitor>(
          ctx_, socket_,
          ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL);
      socket_.bind(endpoint);
    } catch (const zmq::error_t& e) {
      return Unavailable("cannot bind " + endpoint + ": " + e.what() +
                         " (is another shard using this port, or is the address wrong?)");
    }
    return Status::Ok();
  }

  Result<std::optional<Inbound>> Receive(std::chrono::milliseconds timeout) override {
    // One ZMQ_EVENTS query when a message is already there (a busy shard); otherwise a
    // plain poll of the ROUTER's, the waker's and the monitor's descriptors, and one more
    // query after it. zmq_poll would ask ZMQ_EVENTS of both sockets before and after its
    // two polls: some five system calls more per request.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    try {
      while (!(socket_.get(zmq::sockopt::events) & ZMQ_POLLIN)) {
        pollfd fds[] = {{socket_.get(zmq::sockopt::fd), POLLIN, 0},
                        {waker_.fd(), POLLIN, 0},
                        {monitor_->fd(), POLLIN, 0}};
        auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now());
        int n = left.count() > 0 ? ::poll(fds, 3, static_cast<int>(left.count())) : 0;
        if (n < 0 && errno != EINTR) return Unavailable("poll: " + std::string(strerror(errno)));
        if (fds[1].revents & POLLIN) {
          waker_.Drain();
          return std::optional<Inbound>();
        }
        // The monitor's descriptor, like the ROUTER's, stays readable until its events are read.
        if (fds[2].revents & POLLIN) DrainMonitor();
        if (n <= 0 && std::chrono::steady_clock::now() >= deadline) {
          DrainMonitor();  // at least once per timeout, whatever its descriptor said
          if (!(socket_.get(zmq::sockopt::events) & ZMQ_POLLIN)) return std::optional<Inbound>();
          break;
        }
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return std::optional<Inbound>();
      return FromZmq(e, "zmq poll");
    }
    std::vector<zmq::message_t> parts;
    LEASH_RETURN_IF_ERROR(zmq_util::RecvAll(socket_, &parts));
    Inbound in;
    in.peer = parts[0].to_string();
    if (parts.size() == 2 && shm::IsOffer(parts[1].data(), parts[1].size())) {
      SendRaw(in.peer, shm_.AnswerOffer(in.peer, parts[1].data(), parts[1].size()));
      return std::optional<Inbound>();
    }
    std::optional<shm::Trailer> trailer;
    if (parts.size() >= 3)
      trailer = shm::DecodeTrailer(parts.back().data(), parts.back().size(), 0);
    if (trailer) parts.pop_back();
    in.message.reserve(parts.size() - 1);
    for (size_t i = 1; i < parts.size(); ++i)
      in.message.push_back(zmq_util::ToFrame(std::move(parts[i])));
    if (!shm_.empty() || trailer) {
      std::optional<std::string> answer =
          shm_.OnMessage(in.peer, trailer ? &*trailer : nullptr, &in.message);
      if (answer) SendRaw(in.peer, std::move(*answer));
    }
    return std::optional<Inbound>(std::move(in));
  }

  Status Send(const PeerId& peer, Message message) override {
    std::shared_ptr<std::atomic<int64_t>>& queued = queued_[peer];
    if (!queued) queued = std::make_shared<std::atomic<int64_t>>(0);
    if (options_.max_queued_bytes_per_peer > 0 &&
        queued->load() > options_.max_queued_bytes_per_peer) {
      // The peer does not read its replies: drop rather than buffer without bound. A
      // client that resends after silence gets the answer once it reads again.
      uint64_t n = ++replies_dropped_;
      int64_t now = NowMs();
      if (now - last_drop_log_ms_ >= 60000) {
        last_drop_log_ms_ = now;
        spdlog::warn(
            "dropped a reply: the client already has {} bytes of unread replies queued (limit {}; "
            "{} replies "
            "dropped so far; logged at most once a minute)",
            queued->load(), options_.max_queued_bytes_per_peer, n);
      }
      return Status::Ok();
    }
    std::vector<zmq::message_t> parts;
    parts.reserve(message.size() + 1);
    parts.emplace_back(peer.data(), peer.size());
    for (const Frame& f : message) parts.push_back(zmq_util::ToZmqCounted(f, queued));
    if (std::optional<shm::Placement> p = shm_.Place(peer, message)) {
      for (const auto& moved : p->frames) parts[1 + moved.first] = zmq::message_t();
      parts.emplace_back(p->trailer.data(), p->trailer.size());
    }
    Status st = zmq_util::SendAll(socket_, parts);
    if (queued_.size() > 4096) Sweep();
    return st;
  }

  void Wake() override { waker_.Wake(); }

  std::optional<WritableFrame> ReservePayload(const PeerId& peer, size_t bytes) override {
    return shm_.Reserve(peer, bytes);
  }

  TransportCounters counters() const override {
    TransportCounters c;
    c.replies_dropped = replies_dropped_.load();
    c.auth_refused = zap_ ? zap_->refused() : 0;
    c.handshake_failed = handshake_failed_.load();
    c.shm_frames_received = shm_.frames_received();
    c.shm_frames_sent = shm_.frames_sent();
    return c;
  }

 private:
  void SendRaw(const PeerId& peer, const std::string& frame) {
    std::vector<zmq::message_t> parts;
    parts.emplace_back(peer.data(), peer.size());
    parts.emplace_back(frame.data(), frame.size());
    (void)zmq_util::SendAll(socket_, parts);
  }

  // Failed handshakes other than refused keys: a client without CURVE (or with CURVE
  // against a plain shard), a wrong server key. Logged at most once a minute.
  void DrainMonitor() {
    while (auto e = monitor_->Next()) {
      uint64_t n = ++handshake_failed_;
      int64_t now = NowMs();
      if (now - last_failure_log_ms_ < 60000) continue;
      last_failure_log_ms_ = now;
      spdlog::warn(
          "handshake with a client failed: {} ({} failed handshakes so far; logged at most once a "
          "minute)",
          DescribeServerHandshakeFailure(*e, options_.curve.has_value()), n);
    }
  }

  // Forgets peers with nothing queued, so the map does not grow with every peer ever seen.
  void Sweep() {
    for (auto it = queued_.begin(); it != queued_.end();) {
      it = it->second->load() == 0 && it->second.use_count() == 1 ? queued_.erase(it)
                                                                  : std::next(it);
    }
  }

  zmq::context_t& ctx_;
  ZmqOptions options_;
  std::map<PeerId, std::shared_ptr<std::atomic<int64_t>>>
      queued_;  // reply bytes ZeroMQ still holds, per peer
  std::atomic<uint64_t> replies_dropped_{0};
  int64_t last_drop_log_ms_ = -60000;
  std::unique_ptr<ZapHandler> zap_;
  zmq::socket_t socket_;
  std::unique_ptr<SocketMonitor> monitor_;
  zmq_util::Waker waker_;
  std::atomic<uint64_t> handshake_failed_{0};
  int64_t last_failure_log_ms_ = -60000;
  shm::ServerLinks shm_;
};

}  // namespace

Result<std::unique_ptr<ServerTransport>> BindZmqServer(ZmqContext& ctx, const std::string& endpoint,
                                                       const ZmqOptions& options) {
  auto s = std::make_unique<ZmqServer>(ctx.get(), options);
  LEASH_RETURN_IF_ERROR(s->Bind(endpoint));
  return std::unique_ptr<ServerTransport>(std::move(s));
}

}  // namespace leash
