// A client's ZeroMQ connections: one DEALER socket per shard (with striping, stripes.h, that
// many per shard, the first the main one), the main one with a socket monitor whose
// handshake events feed the per-shard health (socket_monitor.h), and same-host shared
// memory per shard (shm_link.h); and per shard, where the shard's sole in-sync backup answers
// pushes and clocks itself, a connection to that backup (ConnectBackup): connection
// n + shard, a DEALER with its own monitor and shared memory (so that on one host the
// backup's answers come through the segment's queue, as the primary's do) but no stripes,
// polled and read only while one is open. ZeroMQ sockets are
// not thread-safe, and their file descriptors signal edge-triggered: every socket operation
// happens under one mutex, a Receive that waits polls the descriptors without it, and a
// Send that may have taken a waiting Receive's edge wakes it. Thread-safety as transport.h
// says.
#include <poll.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <zmq.hpp>

#include "leash/common/zmq_transport.h"
#include "shm_link.h"
#include "socket_monitor.h"
#include "stripes.h"
#include "zmq_util.h"

namespace leash {
namespace {

using Received = std::optional<std::pair<int, Message>>;

class ZmqClient final : public ClientTransport, public ClientSharedMemory {
 public:
  ZmqClient(zmq::context_t& ctx, std::vector<std::string> endpoints, const ZmqOptions& o)
      : ctx_(ctx),
        endpoints_(std::move(endpoints)),
        n_(endpoints_.size()),
        options_(o),
        count_(static_cast<uint32_t>(std::max(1, o.stripes))),
        watch_(endpoints_, o) {}

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
    // Connections 0 .. n-1 go to the shards, n .. 2n-1 to their backups (closed for now:
    // no socket, and a link made on the first ConnectBackup).
    endpoints_.resize(2 * n_);
    for (size_t i = 0; i < 2 * n_; ++i) {
      sockets_.emplace_back();
      monitors_.emplace_back();
      notice_owed_.push_back(false);
      shm_.push_back(i < n_ ? NewLink(i) : std::make_unique<shm::ClientLink>());
    }
    stripe_.resize(n_);
    for (size_t i = 0; i < n_; ++i) LEASH_RETURN_IF_ERROR(Open(static_cast<int>(i)));
    return Status::Ok();
  }

  int num_shards() const override { return static_cast<int>(n_); }

  Status Send(int shard, Message message) override {
    if (options_.send_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.send_delay_ms));
    }
    if (shard < 0 || static_cast<size_t>(shard) >= 2 * n_) {
      return InvalidArgument("no shard " + std::to_string(shard) + " to send to (" +
                             std::to_string(n_) + " shards; n + s is shard s's backup)");
    }
    auto idx = static_cast<size_t>(shard);
    const bool backup = idx >= n_;
    // Whether a message goes through the segment's queue or the socket is decided under mu_,
    // where the notice that switches them is sent: the shard reads them in the order sent.
    // A backup's link may be made (ConnectBackup) while this runs: its frames are placed
    // under mu_ as well (a backup hears heartbeats only, small and rare).
    std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
    if (backup) {
      lock.lock();
      if (!sockets_[idx]) {
        return Unavailable("no connection to shard " + std::to_string(idx - n_) + "'s backup");
      }
    }
    shm::ClientLink& link = *shm_[idx];
    std::optional<shm::Placement> p = link.Place(message);
    if (!backup) lock.lock();
    bool detour = false;
    if (link.messages()) {
      // A reconnect (to a shard that may be a new process) is noticed here too, not only
      // by a receiving thread, so that the notice goes out before the queue fills.
      ReadMonitors(zmq_util::NowMs());
      if (notice_owed_[idx]) SendNotice(idx, link.Notice());
      Result<bool> posted = link.Post(message, p);
      if (!posted.ok() || *posted) return posted.status();
      detour = true;  // no room in the ring: a pause is queued; the socket, then the notice
    }
    if (!detour && !p && !backup && Striped(message)) return SendStriped(idx, message);
    if (detour) SendNotice(idx, link.Hello(), /*owed=*/false);
    std::vector<zmq::message_t> parts;
    parts.reserve(message.size() + 1);
    for (const Frame& f : message) parts.push_back(zmq_util::ToZmq(f));
    if (p) {
      for (const auto& moved : p->frames) parts[moved.first] = zmq::message_t();
      parts.emplace_back(p->trailer.data(), p->trailer.size());
    }
    Status st = zmq_util::SendAll(*sockets_[idx], parts).WithContext(endpoints_[idx]);
    if (detour) SendNotice(idx, link.Notice());
    NudgeIfReadable(*sockets_[idx]);
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
        for (auto& s : sockets_) {
          if (s) fds_.push_back({s->get(zmq::sockopt::fd), POLLIN, 0});
        }
        for (auto& st : stripe_) {
          for (auto& s : st.extra) fds_.push_back({s->get(zmq::sockopt::fd), POLLIN, 0});
        }
        socket_fds_ = fds_.size();
        for (auto& m : monitors_) {
          if (!m) continue;
          if (int fd = m->fd(); fd >= 0) fds_.push_back({fd, POLLIN, 0});
        }
        fds_.push_back({waker_.fd(), POLLIN, 0});
        // Replies through shared memory: a shard that queues one now rings the bell, or
        // Doze sees it and this looks again without waiting.
        dozing_.clear();
        bool queued = false;
        for (size_t i = 0; i < shm_.size() && !queued; ++i) {
          if (!shm_[i]->messages() || shm_[i]->bell_fd() < 0) continue;
          if (!shm_[i]->Doze()) {
            queued = true;
            break;
          }
          dozing_.push_back(i);
          fds_.push_back({shm_[i]->bell_fd(), POLLIN, 0});
        }
        if (queued) {
          for (size_t i : dozing_) shm_[i]->Wake();
          continue;
        }
        polling_.store(true);
      }
      auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() > 0) ::poll(fds_.data(), fds_.size(), static_cast<int>(left.count()));
      polling_.store(false);
      const size_t waker = fds_.size() - dozing_.size() - 1;
      for (size_t k = socket_fds_; k < waker; ++k) {
        if (fds_[k].revents & POLLIN) monitors_due_.store(true);
      }
      if (fds_[waker].revents & POLLIN) waker_.Drain();
      if (!dozing_.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        for (size_t i : dozing_) shm_[i]->Wake();
      }
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
    // Another process: a segment of its own (the old process may still read the old one's
    // queue), offered afresh.
    shm_[idx]->Renew();
    SendOffer(idx);
    if (polling_.load()) waker_.Wake();  // a waiting Receive polls the old socket
    return Status::Ok();
  }

  Status ConnectBackup(int shard, const std::string& endpoint) override {
    if (shard < 0 || shard >= num_shards()) {
      return InvalidArgument("no shard " + std::to_string(shard) + " to connect a backup of (" +
                             std::to_string(num_shards()) + " shards)");
    }
    const size_t idx = n_ + static_cast<size_t>(shard);
    std::lock_guard<std::mutex> lock(mu_);
    if (polling_.load()) waker_.Wake();  // a waiting Receive polls the old set of sockets
    if (sockets_[idx]) {
      monitors_[idx].reset();  // before the socket it watches
      sockets_[idx].reset();
      --backups_open_;
    }
    if (endpoint.empty()) return Status::Ok();
    endpoints_[idx] = endpoint;
    // The first backup gets a link; each later one (another process) a segment of its own,
    // offered afresh, as Retarget does for a shard.
    if (!made_[static_cast<size_t>(shard)]) {
      shm_[idx] = NewLink(idx);
      made_[static_cast<size_t>(shard)] = true;
    } else {
      shm_[idx]->Renew();
    }
    Status st = Open(static_cast<int>(idx));
    if (st.ok()) ++backups_open_;
    return st;
  }

  void Wake() override {
    woken_.store(true);
    waker_.Wake();
  }

  ClientSharedMemory* shared_memory() override { return options_.shared_memory ? this : nullptr; }
  const ConnectionHealth* health() const override { return &watch_; }

  // The shards' connections only: a backup's link may be replaced (ConnectBackup).
  std::optional<WritableFrame> ReservePayload(int shard, size_t bytes) override {
    if (shard < 0 || static_cast<size_t>(shard) >= n_) return std::nullopt;
    return shm_[static_cast<size_t>(shard)]->Reserve(bytes);
  }

  void RenewLink(int shard) override {
    if (shard < 0 || static_cast<size_t>(shard) >= n_) return;
    const auto idx = static_cast<size_t>(shard);
    std::lock_guard<std::mutex> lock(mu_);
    shm_[idx]->Renew();
    SendOffer(idx);
  }

  bool ActiveWith(int shard) const override {
    if (shard < 0 || static_cast<size_t>(shard) >= 2 * n_) return false;
    const auto idx = static_cast<size_t>(shard);
    if (idx < n_) return shm_[idx]->on();
    // A backup's link is replaced under mu_ (ConnectBackup); Receive does not hold mu_
    // while it waits.
    std::lock_guard<std::mutex> lock(mu_);
    return sockets_[idx] && shm_[idx]->messages();
  }

  size_t ring_bytes() const override { return static_cast<size_t>(options_.shm_ring_bytes); }

 private:
  // A message from a socket that has one (round-robin, so a busy shard cannot starve the
  // others), after the monitors' events; nullopt if none. Shared-memory answers are
  // handled here. Under mu_.
  Result<Received> ReadReady() {
    // The monitors only matter around handshakes: read them when their descriptor said so,
    // after a (re)connect, and every 100 ms, not on every message (each read costs a
    // poll and a getpid system call inside ZeroMQ).
    const int64_t now = zmq_util::NowMs();
    ReadMonitors(now);
    for (size_t k = 0; k < shm_.size(); ++k) {
      size_t i = (next_queue_ + k) % shm_.size();
      if (!shm_[i]->messages()) continue;
      Result<std::optional<Message>> m = shm_[i]->Take();
      if (!m.ok()) {
        spdlog::warn("{}: {}", Describe(static_cast<int>(i)), m.status().ToString());
        continue;
      }
      if (*m) {
        next_queue_ = i + 1;
        return Received(std::make_pair(static_cast<int>(i), std::move(**m)));
      }
    }
    if (count_ < 2) {
      // With backups open, backup b is connection n + b in the same round.
      const size_t total = backups_open_ > 0 ? 2 * n_ : n_;
      for (size_t k = 0; k < total; ++k) {
        size_t i = (next_ + k) % total;
        if (!sockets_[i]) continue;
        while (zmq_util::Events(*sockets_[i]) & ZMQ_POLLIN) {
          next_ = i + 1;
          LEASH_ASSIGN_OR_RETURN(Received in, ReadFrom(i));
          if (in) return in;
        }
      }
      return Received();
    }
    // Striped: whatever is complete first (and incomplete messages past their time go),
    // then every connection read into its shard's stream until a message is complete.
    if (Received in = PopAny(now)) return in;
    for (size_t k = 0; k < n_; ++k) {
      size_t i = (next_ + k) % n_;
      Stripe& st = stripe_[i];
      while (zmq_util::Events(*sockets_[i]) & ZMQ_POLLIN) {
        next_ = i + 1;
        LEASH_ASSIGN_OR_RETURN(Received in, ReadFrom(i));
        if (!in) continue;
        Status fed = st.in->OnMain(std::move(in->second), now);
        if (!fed.ok()) spdlog::warn("{}: {}", Describe(static_cast<int>(i)), fed.ToString());
        if (std::optional<Message> m = st.in->Pop(now))
          return Received(std::make_pair(static_cast<int>(i), std::move(*m)));
      }
      for (size_t e = 0; e < st.extra.size(); ++e) {
        while (zmq_util::Events(*st.extra[e]) & ZMQ_POLLIN) {
          next_ = i + 1;
          std::vector<zmq::message_t> parts;
          LEASH_RETURN_IF_ERROR(zmq_util::RecvAll(*st.extra[e], &parts));
          Status fed =
              st.in->OnPart(zmq_util::ToMessage(parts, 0), static_cast<uint32_t>(e + 1), now);
          if (!fed.ok()) spdlog::warn("{}: {}", Describe(static_cast<int>(i)), fed.ToString());
          if (std::optional<Message> done = st.in->Pop(now))
            return Received(std::make_pair(static_cast<int>(i), std::move(*done)));
        }
      }
    }
    for (size_t i = n_; i < 2 * n_ && backups_open_ > 0; ++i) {
      while (sockets_[i] && (zmq_util::Events(*sockets_[i]) & ZMQ_POLLIN)) {
        LEASH_ASSIGN_OR_RETURN(Received in, ReadFrom(i));
        if (in) return in;
      }
    }
    return Received();
  }

  // The monitors' events, when their descriptor said so, after a (re)connect, and every
  // 100 ms. Under mu_.
  void ReadMonitors(int64_t now) {
    if (!monitors_due_.exchange(false) && now - monitors_read_ms_ < 100) return;
    monitors_read_ms_ = now;
    for (size_t i = 0; i < monitors_.size(); ++i) {
      if (!monitors_[i]) continue;  // a backup's connection that is closed
      while (auto e = monitors_[i]->Next()) {
        if (i < n_) watch_.OnEvent(static_cast<int>(i), *e);
        // A new connection may lead to a new shard process: it learns of the queue (a
        // shard that reads it already ignores this).
        if (e->event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) SendNotice(i, shm_[i]->Hello(), false);
      }
    }
  }

  // The next complete message of any shard's striped stream. Under mu_.
  Received PopAny(int64_t now) {
    for (size_t k = 0; k < n_; ++k) {
      size_t i = (next_ + k) % n_;
      stripes::Assembler& in = *stripe_[i].in;
      if (in.idle()) continue;
      std::optional<Message> m = in.Pop(now);
      if (in.dropped() > stripe_[i].dropped_logged) {
        stripe_[i].dropped_logged = in.dropped();
        spdlog::warn(
            "{}: a striped reply did not arrive whole within {} ms and was dropped ({} so far); "
            "the request is resent",
            Describe(static_cast<int>(i)), options_.stripe_timeout_ms, in.dropped());
      }
      if (m) {
        next_ = i + 1;
        return Received(std::make_pair(static_cast<int>(i), std::move(*m)));
      }
    }
    return Received();
  }

  bool Striped(const Message& message) const {
    return count_ >= 2 && stripes::Worth(message, options_.stripe_min_bytes);
  }

  // Parts 1.. on their own connections, then part 0 on the main one, in the message order.
  // A side connection that cannot take its part now (its queue is full) sends the message
  // whole on the main connection instead; the parts already sent are dropped on the other
  // side when their time is up.
  // Under mu_.
  Status SendStriped(size_t idx, const Message& message) {
    Stripe& st = stripe_[idx];
    std::vector<Message> pieces = stripes::Split(message, st.seq++, count_);
    const Message* main = &pieces[0];
    for (uint32_t k = 1; k < count_; ++k) {
      std::vector<zmq::message_t> parts;
      for (const Frame& f : pieces[k]) parts.push_back(zmq_util::ToZmq(f));
      zmq::socket_t& s = *st.extra[k - 1];
      Status sent = zmq_util::SendAll(s, parts);
      NudgeIfReadable(s);
      if (!sent.ok()) {
        main = &message;
        break;
      }
    }
    std::vector<zmq::message_t> parts;
    for (const Frame& f : *main) parts.push_back(zmq_util::ToZmq(f));
    Status sent = zmq_util::SendAll(*sockets_[idx], parts).WithContext(endpoints_[idx]);
    NudgeIfReadable(*sockets_[idx]);
    return sent;
  }

  // After an operation on socket `s`: a Receive polling now may have lost the edge of a
  // message that is there; wake it to look. Under mu_.
  void NudgeIfReadable(zmq::socket_t& s) {
    if (polling_.load() && (zmq_util::Events(s) & ZMQ_POLLIN)) waker_.Wake();
  }

  // Connection i: shard i, or for i >= n shard i - n's backup.
  std::string Who(int i) const {
    const auto idx = static_cast<size_t>(i);
    return idx < n_ ? "shard " + std::to_string(i)
                    : "shard " + std::to_string(idx - n_) + "'s backup";
  }
  std::string Describe(int i) const {
    return Who(i) + " (" + endpoints_[static_cast<size_t>(i)] + ")";
  }

  // Connection i's shared-memory link (off for good where shared memory is not wanted).
  std::unique_ptr<shm::ClientLink> NewLink(size_t i) {
    if (!options_.shared_memory) return std::make_unique<shm::ClientLink>();
    return std::make_unique<shm::ClientLink>(static_cast<size_t>(options_.shm_ring_bytes),
                                             static_cast<size_t>(options_.shm_min_frame_bytes),
                                             Describe(static_cast<int>(i)), options_.shm_messages,
                                             options_.shm_lend);
  }

  // Under mu_: a notice to shard i (shm_link.h). A resume notice (`owed`) that cannot go
  // now (no connection) is owed, and sent before the next message: until it arrives the
  // shard does not read the queue after a pause. A hello that cannot go is not owed: the
  // next handshake sends one.
  void SendNotice(size_t i, const std::optional<std::string>& notice, bool owed = true) {
    if (!notice) return;
    std::vector<zmq::message_t> parts;
    parts.emplace_back(notice->data(), notice->size());
    Status st = zmq_util::SendAll(*sockets_[i], parts);
    if (owed) notice_owed_[i] = !st.ok();
    if (!st.ok()) spdlog::debug("shared-memory notice to shard {} not sent: {}", i, st.ToString());
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

  // Connection `shard` (a backup's for shard >= n: no stripes). Under mu_.
  Status Open(int shard) {
    auto idx = static_cast<size_t>(shard);
    const bool replaced = sockets_[idx] != nullptr;
    const bool striped = count_ >= 2 && idx < n_;
    try {
      // With striping every (re)connection gets a new token: the shard keeps no state of
      // the old connections' streams that could mix with the new ones.
      const uint64_t token = striped ? rng_() : 0;
      auto s = NewSocket(token, 0, striped);
      auto m = std::make_unique<SocketMonitor>(
          ctx_, *s,
          ZMQ_EVENT_CONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
              ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL);
      s->connect(endpoints_[idx]);
      std::vector<std::unique_ptr<zmq::socket_t>> extra;
      for (uint32_t k = 1; striped && k < count_; ++k) {
        extra.push_back(NewSocket(token, k, /*striped=*/true));
        extra.back()->connect(endpoints_[idx]);
      }
      monitors_[idx] = std::move(m);  // the old monitor goes before the old socket
      sockets_[idx] = std::move(s);
      if (idx < n_) {
        Stripe& st = stripe_[idx];
        st.extra = std::move(extra);
        st.seq = 0;
        st.in = std::make_unique<stripes::Assembler>(HeldLimit(), options_.stripe_timeout_ms);
        st.dropped_logged = 0;
      }
      monitors_due_.store(true);
      if (!replaced) SendOffer(idx);
    } catch (const zmq::error_t& e) {
      return InvalidArgument("cannot connect to " + Who(shard) + " at '" + endpoints_[idx] +
                             "': " + e.what() + " (expected tcp://HOST:PORT)");
    }
    if (idx < n_) watch_.Reconnecting(shard);
    return Status::Ok();
  }

  // A DEALER with this client's options; `striped`: connection k's routing id.
  std::unique_ptr<zmq::socket_t> NewSocket(uint64_t token, uint32_t k, bool striped) {
    auto s = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
    zmq_util::ApplyOptions(*s, options_);
    if (striped) s->set(zmq::sockopt::routing_id, stripes::RoutingId(token, k, count_));
    if (options_.curve) {
      s->set(zmq::sockopt::curve_serverkey, options_.curve->server_public_z85);
      s->set(zmq::sockopt::curve_publickey, options_.curve->own.public_z85);
      s->set(zmq::sockopt::curve_secretkey, options_.curve->own.secret_z85);
    }
    return s;
  }

  // The most bytes of incomplete striped replies held per shard: room for two of the
  // largest messages.
  size_t HeldLimit() const { return static_cast<size_t>(2 * options_.max_message_bytes); }

  // One message of socket i; nullopt for a shared-memory answer (handled here). Under mu_.
  Result<Received> ReadFrom(size_t i) {
    std::vector<zmq::message_t> parts;
    LEASH_RETURN_IF_ERROR(zmq_util::RecvAll(*sockets_[i], &parts));
    if (parts.size() == 1 && shm::IsAnswer(parts[0].data(), parts[0].size())) {
      shm_[i]->OnAnswer(parts[0].data(), parts[0].size());
      SendNotice(i, shm_[i]->TakeNotice());
      return Received();
    }
    std::optional<shm::Trailer> trailer;
    if (parts.size() >= 2)
      trailer = shm::DecodeTrailer(parts.back().data(), parts.back().size(), 1);
    if (trailer) parts.pop_back();
    Message m = zmq_util::ToMessage(parts, 0);
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
  mutable std::mutex mu_;               // every socket operation
  std::vector<std::string> endpoints_;  // per connection: the shards', then their backups'
  size_t n_;                            // shards
  ZmqOptions options_;
  std::vector<std::unique_ptr<zmq::socket_t>> sockets_;
  std::vector<std::unique_ptr<SocketMonitor>> monitors_;
  std::vector<std::unique_ptr<shm::ClientLink>> shm_;  // per connection; never null after Init
  // How many backups' connections (n .. 2n-1) are open (0: Receive neither polls nor reads
  // them), and per shard whether its backup's link was made. Under mu_.
  size_t backups_open_ = 0;
  std::vector<bool> made_ = std::vector<bool>(n_, false);
  // Per shard, with striping: the side connections, the next message number, and the
  // replies put back together. Under mu_.
  struct Stripe {
    std::vector<std::unique_ptr<zmq::socket_t>> extra;  // connections 1 .. count_-1
    uint64_t seq = 0;
    std::unique_ptr<stripes::Assembler> in;
    uint64_t dropped_logged = 0;
  };
  uint32_t count_;  // connections per shard
  std::vector<Stripe> stripe_;
  std::mt19937_64 rng_{std::random_device{}()};  // under mu_
  size_t socket_fds_ = 0;                        // the receiving thread's
  HandshakeWatch watch_;
  zmq_util::Waker waker_;
  std::atomic<bool> woken_{false};        // Wake() was called and no Receive returned for it yet
  std::atomic<bool> polling_{false};      // a Receive polls the descriptors (without mu_)
  std::vector<pollfd> fds_;               // the receiving thread's
  std::vector<size_t> dozing_;            // the receiving thread's: shards whose bell it polls
  size_t next_queue_ = 0;                 // under mu_
  std::vector<bool> notice_owed_;         // per shard, under mu_
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
  if (options.stripes < 1 || options.stripes > static_cast<int>(stripes::kMaxStripes))
    return InvalidArgument("stripes " + std::to_string(options.stripes) + ": need 1 to " +
                           std::to_string(stripes::kMaxStripes) + " connections per shard");
  auto c = std::make_unique<ZmqClient>(ctx.get(), endpoints, options);
  LEASH_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<ClientTransport>(std::move(c));
}

}  // namespace leash
