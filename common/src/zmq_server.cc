// A shard's ZeroMQ endpoint: one ROUTER socket, with CURVE's authenticator (ZAP handler)
// when keys are configured, a socket monitor for failed handshakes, a per-peer limit on
// unread replies, same-host shared memory (shm_link.h), and striping for clients that stripe
// (stripes.h): their parts put back together in order, their large replies striped the
// same way. Thread-compatible, except
// Wake() and counters(), which are thread-safe.
#include <poll.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "leash/common/zmq_transport.h"
#include "shm_link.h"
#include "socket_monitor.h"
#include "stripes.h"
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
        shm_(o.shared_memory, static_cast<size_t>(o.shm_min_frame_bytes), o.shm_messages) {
    shm_.set_lenders(o.shm_lenders);
    shm_.set_borrow_all(o.shm_borrow_all);
    zmq_util::ApplyOptions(socket_, o);
    // A striping client's connection that comes back (under its own routing id) takes over
    // from the old one the shard may not have seen drop yet.
    socket_.set(zmq::sockopt::router_handover, 1);
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
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      if (!striped_.empty()) {
        if (std::optional<Inbound> in = PopStriped()) return in;
      }
      shm_.Sweep(NowMs());
      // Messages through shared memory first, but the socket is looked at after every few.
      if (queue_turns_ < kQueueTurns) {
        if (std::optional<Inbound> in = shm_.Take()) {
          ++queue_turns_;
          return in;
        }
      }
      queue_turns_ = 0;
      LEASH_ASSIGN_OR_RETURN(Wait w, WaitReadable(deadline));
      if (w == Wait::kQueued) continue;
      if (w == Wait::kWoken) return std::optional<Inbound>();
      if (w == Wait::kTimeout) {
        if (!striped_.empty()) return PopStriped();
        return std::optional<Inbound>();
      }
      LEASH_ASSIGN_OR_RETURN(std::optional<Inbound> in, ReadOne());
      if (in) return in;
    }
  }

  Status Send(const PeerId& peer, Message message) override {
    if (shm::ServerLinks::IsChannelPeer(peer)) {
      auto posted = shm_.Post(peer, message);
      if (!posted.ok()) {
        NoteDropped(posted.status().message());
      } else if (*posted) {  // no room in shared memory: on the socket (its frames as placed)
        return SendRouted((*posted)->first, (*posted)->second);
      }
      return Status::Ok();
    }
    // A connection of a client that now sends through its queue: the reply goes there too.
    if (std::optional<PeerId> q = shm_.QueuePeerOf(peer)) return Send(*q, std::move(message));
    std::shared_ptr<std::atomic<int64_t>>& queued = queued_[peer];
    if (!queued) queued = std::make_shared<std::atomic<int64_t>>(0);
    if (options_.max_queued_bytes_per_peer > 0 &&
        queued->load() > options_.max_queued_bytes_per_peer) {
      // The peer does not read its replies: drop rather than buffer without bound. A
      // client that resends after silence gets the answer once it reads again.
      NoteDropped("the client already has " + std::to_string(queued->load()) +
                  " bytes of unread replies queued (limit " +
                  std::to_string(options_.max_queued_bytes_per_peer) + ")");
      return Status::Ok();
    }
    std::optional<shm::Placement> p = shm_.Place(peer, message);
    if (!p) {
      if (std::optional<stripes::Route> r = stripes::ParseRoutingId(peer);
          r && r->index == 0 && stripes::Worth(message, options_.stripe_min_bytes) &&
          SendStriped(*r, message, queued)) {
        return Status::Ok();
      }
    }
    Status st = SendRouted(peer, message, &queued, p ? &*p : nullptr);
    if (queued_.size() > 4096) Sweep();
    return st;
  }

  void Wake() override { waker_.Wake(); }

  std::optional<WritableFrame> ReservePayload(const PeerId& peer, size_t bytes) override {
    return shm_.Reserve(peer, bytes);
  }

  void SetFrameCopier(FrameCopier copier) override { shm_.set_copier(std::move(copier)); }

  TransportCounters counters() const override {
    TransportCounters c;
    c.replies_dropped = replies_dropped_.load();
    c.auth_refused = zap_ ? zap_->refused() : 0;
    c.handshake_failed = handshake_failed_.load();
    c.shm_frames_received = shm_.frames_received();
    c.shm_frames_lent = shm_.frames_lent();
    c.shm_frames_sent = shm_.frames_sent();
    c.shm_messages_received = shm_.messages_received();
    c.shm_messages_sent = shm_.messages_sent();
    c.striped_received = striped_received_.load();
    c.striped_sent = striped_sent_.load();
    c.striped_dropped = striped_dropped_.load();
    return c;
  }

 private:
  enum class Wait { kReady, kTimeout, kWoken, kQueued };
  static constexpr int kQueueTurns = 8;

  void NoteDropped(const std::string& why) {
    uint64_t n = ++replies_dropped_;
    int64_t now = NowMs();
    if (now - last_drop_log_ms_ < 60000) return;
    last_drop_log_ms_ = now;
    spdlog::warn("dropped a reply: {} ({} replies dropped so far; logged at most once a minute)",
                 why, n);
  }

  // Until the ROUTER has a message, the deadline passes or Wake(). One ZMQ_EVENTS query when
  // a message is already there (a busy shard); otherwise a plain poll of the ROUTER's, the
  // waker's and the monitor's descriptors, and one more query after it. zmq_poll would ask
  // ZMQ_EVENTS of both sockets before and after its two polls: some five system calls more
  // per request.
  Result<Wait> WaitReadable(std::chrono::steady_clock::time_point deadline) {
    try {
      while (!(socket_.get(zmq::sockopt::events) & ZMQ_POLLIN)) {
        fds_.assign({{socket_.get(zmq::sockopt::fd), POLLIN, 0},
                     {waker_.fd(), POLLIN, 0},
                     {monitor_->fd(), POLLIN, 0}});
        bells_.clear();
        shm_.AddBells(&bells_);
        for (int fd : bells_) fds_.push_back({fd, POLLIN, 0});
        // A client that queues a message now rings its bell, or this sees the message.
        if (!bells_.empty() && !shm_.Doze()) return Wait::kQueued;
        auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now());
        int n =
            left.count() > 0 ? ::poll(fds_.data(), fds_.size(), static_cast<int>(left.count())) : 0;
        const int poll_errno = errno;  // before the bells' reads
        if (!bells_.empty()) {
          rang_.assign(bells_.size(), false);
          for (size_t k = 0; k < bells_.size(); ++k) rang_[k] = (fds_[3 + k].revents & POLLIN) != 0;
          shm_.Wake(rang_);
        }
        if (n < 0 && poll_errno != EINTR)
          return Unavailable("poll: " + std::string(strerror(poll_errno)));
        if (fds_[1].revents & POLLIN) {
          waker_.Drain();
          return Wait::kWoken;
        }
        // The monitor's descriptor, like the ROUTER's, stays readable until its events are read.
        if (fds_[2].revents & POLLIN) DrainMonitor();
        for (size_t k = 3; k < fds_.size(); ++k) {
          if (fds_[k].revents & POLLIN) return Wait::kQueued;
        }
        if (n <= 0 && std::chrono::steady_clock::now() >= deadline) {
          DrainMonitor();  // at least once per timeout, whatever its descriptor said
          if (!(socket_.get(zmq::sockopt::events) & ZMQ_POLLIN)) return Wait::kTimeout;
          break;
        }
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return Wait::kWoken;
      return FromZmq(e, "zmq poll");
    }
    return Wait::kReady;
  }

  // One message of the ROUTER: an inbound message, or nullopt when it was the transport's
  // own (a shared-memory offer, a part of a striped message not yet complete).
  Result<std::optional<Inbound>> ReadOne() {
    std::vector<zmq::message_t> parts;
    LEASH_RETURN_IF_ERROR(zmq_util::RecvAll(socket_, &parts));
    Inbound in;
    in.peer = parts[0].to_string();
    // Set by the CURVE authenticator (the name it gave the key) on the frames the peer sent,
    // not on the routing id, which is the socket's own; absent without CURVE. (The name
    // ZMQ_MSG_PROPERTY_USER_ID is behind libzmq's draft API.)
    if (const char* user = zmq_msg_gets(parts.back().handle(), "User-Id")) in.user = user;
    std::optional<stripes::Route> route = stripes::ParseRoutingId(in.peer);
    if (route && route->index > 0) {  // a side connection of a striping client: parts only
      PeerId main = stripes::RoutingId(route->token, 0, route->count);
      Feed(main, Assembly(main).OnPart(zmq_util::ToMessage(parts, 1), route->index, NowMs()));
      return std::optional<Inbound>();
    }
    if (parts.size() == 2 && shm::IsOffer(parts[1].data(), parts[1].size())) {
      SendRaw(in.peer, shm_.AnswerOffer(in.peer, parts[1].data(), parts[1].size(), in.user));
      return std::optional<Inbound>();
    }
    if (parts.size() == 2 && shm::IsNotice(parts[1].data(), parts[1].size())) {
      if (std::optional<std::string> answer =
              shm_.OnNotice(in.peer, in.user, parts[1].data(), parts[1].size())) {
        SendRaw(in.peer, *answer);
      }
      return std::optional<Inbound>();
    }
    std::optional<shm::Trailer> trailer;
    if (parts.size() >= 3)
      trailer = shm::DecodeTrailer(parts.back().data(), parts.back().size(), 0);
    if (trailer) parts.pop_back();
    in.message = zmq_util::ToMessage(parts, 1);
    if (!shm_.empty() || trailer) {
      bool stale = false;
      std::optional<std::string> answer =
          shm_.OnMessage(in.peer, trailer ? &*trailer : nullptr, &in.message, &stale);
      if (answer) SendRaw(in.peer, std::move(*answer));
      if (stale) return std::optional<Inbound>();  // a newer copy follows
    }
    // A client whose messages come through its queue sent this one on a detour: it waits
    // for the queue's pause.
    if (shm_.Hold(in)) return std::optional<Inbound>();
    if (route) {  // a striping client's main connection: in its stream's order
      users_[in.peer] = in.user;
      Feed(in.peer, Assembly(in.peer).OnMain(std::move(in.message), NowMs()));
      return std::optional<Inbound>();
    }
    return std::optional<Inbound>(std::move(in));
  }

  stripes::Assembler& Assembly(const PeerId& main) {
    auto it = striped_.find(main);
    if (it == striped_.end()) {
      it =
          striped_
              .emplace(main, stripes::Assembler(static_cast<size_t>(2 * options_.max_message_bytes),
                                                options_.stripe_timeout_ms,
                                                /*check_finite=*/true))
              .first;
    }
    return it->second;
  }

  void Feed(const PeerId& main, const Status& st) {
    if (st.ok()) return;
    uint64_t n = ++stripe_errors_;
    int64_t now = NowMs();
    if (now - last_stripe_log_ms_ < 60000) return;
    last_stripe_log_ms_ = now;
    spdlog::warn(
        "a striped message from client {} was dropped: {} ({} so far; logged at most "
        "once a minute)",
        zmq_util::Hex(static_cast<uint32_t>(stripes::ParseRoutingId(main)->token)), st.ToString(),
        n);
  }

  // The next complete message of a striping client, in its order; forgets streams with
  // nothing held. Incomplete messages past stripe_timeout_ms are dropped (and logged).
  std::optional<Inbound> PopStriped() {
    const int64_t now = NowMs();
    for (auto it = striped_.begin(); it != striped_.end();) {
      stripes::Assembler& a = it->second;
      const uint64_t before = a.dropped(), assembled = a.assembled();
      std::optional<Message> m = a.Pop(now);
      if (a.dropped() > before) {
        striped_dropped_ += a.dropped() - before;
        Feed(it->first, DeadlineExceeded("not every part arrived within " +
                                         std::to_string(options_.stripe_timeout_ms) + " ms"));
      }
      if (m) {
        striped_received_ += a.assembled() - assembled;
        auto user = users_.find(it->first);
        return Inbound{it->first, std::move(*m), user == users_.end() ? "" : user->second};
      }
      if (a.idle()) {
        users_.erase(it->first);
        it = striped_.erase(it);
      } else {
        ++it;
      }
    }
    return std::nullopt;
  }

  // One message through the ROUTER to `peer`: its routing id, then `frames`. With `queued`,
  // each frame's bytes count there until ZeroMQ has written it. With `p`, the frames it
  // placed in shared memory go as empty parts and its trailer goes last.
  Status SendRouted(std::string_view peer, const Message& frames,
                    const std::shared_ptr<std::atomic<int64_t>>* queued = nullptr,
                    const shm::Placement* p = nullptr) {
    std::vector<zmq::message_t> parts;
    parts.reserve(frames.size() + 2);
    parts.emplace_back(peer.data(), peer.size());
    for (const Frame& f : frames) {
      parts.push_back(queued ? zmq_util::ToZmqCounted(f, *queued) : zmq_util::ToZmq(f));
    }
    if (p) {
      for (const auto& moved : p->frames) parts[1 + moved.first] = zmq::message_t();
      parts.emplace_back(p->trailer.data(), p->trailer.size());
    }
    return zmq_util::SendAll(socket_, parts);
  }

  void SendRaw(const PeerId& peer, const std::string& frame) {
    std::vector<zmq::message_t> parts;
    parts.emplace_back(peer.data(), peer.size());
    parts.emplace_back(frame.data(), frame.size());
    (void)zmq_util::SendAll(socket_, parts);
  }

  // A reply to a striping client, striped over its connections: the side parts first, with
  // ZMQ_ROUTER_MANDATORY so that a side connection the shard does not hold (yet) says so
  // instead of dropping the part, then part 0 on the main connection. False (nothing sent
  // on the main connection) if a side part could not go: the caller sends the reply whole.
  bool SendStriped(const stripes::Route& r, const Message& message,
                   const std::shared_ptr<std::atomic<int64_t>>& queued) {
    std::vector<Message> pieces = stripes::Split(message, reply_seq_++, r.count);
    auto send = [&](uint32_t k) {  // part k on connection k
      return SendRouted(stripes::RoutingId(r.token, k, r.count), pieces[k], &queued);
    };
    socket_.set(zmq::sockopt::router_mandatory, 1);
    bool ok = true;
    for (uint32_t k = 1; k < r.count && ok; ++k) ok = send(k).ok();
    socket_.set(zmq::sockopt::router_mandatory, 0);
    if (!ok) return false;
    (void)send(0);  // a vanished peer's reply is dropped, as ever
    ++striped_sent_;
    return true;
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
  int queue_turns_ = 0;      // messages taken from shared memory since the socket was read
  std::vector<pollfd> fds_;  // WaitReadable's
  std::vector<int> bells_;   // WaitReadable's
  std::vector<bool> rang_;   // WaitReadable's
  // Striping clients' streams, by main routing id, while something is held for them.
  std::map<PeerId, stripes::Assembler> striped_;
  std::map<PeerId, std::string> users_;  // the authenticated user of each striping client
  std::atomic<uint64_t> striped_received_{0}, striped_sent_{0}, striped_dropped_{0};
  uint64_t reply_seq_ = 0;  // striped replies' numbers (unique in every client's stream)
  std::atomic<uint64_t> stripe_errors_{0};
  int64_t last_stripe_log_ms_ = -60000;
};

}  // namespace

Result<std::unique_ptr<ServerTransport>> BindZmqServer(ZmqContext& ctx, const std::string& endpoint,
                                                       const ZmqOptions& options) {
  auto s = std::make_unique<ZmqServer>(ctx.get(), options);
  LEASH_RETURN_IF_ERROR(s->Bind(endpoint));
  return std::unique_ptr<ServerTransport>(std::move(s));
}

}  // namespace leash
