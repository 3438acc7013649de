// ZeroMQ transport adapter (cppzmq). Frames move zero-copy in both directions. Also
// CurveZMQ: a shard's ZAP handler thread (which client keys are accepted) and the socket
// monitors that turn silent handshake failures into counters, logs and client errors.
#include "leash/common/zmq_transport.h"

#include "shm_segment.h"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
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

zmq::message_t ToZmqCounted(const Frame& f, const std::shared_ptr<std::atomic<int64_t>>& queued) {
  if (f.size() < 256) return zmq::message_t(f.data(), f.size());
  Frame owned = f.owner() ? f : Frame::Copy(f.data(), f.size());
  auto* hint = new CountedFrame{owned.owner(), queued, static_cast<int64_t>(owned.size())};
  queued->fetch_add(hint->bytes);
  return zmq::message_t(const_cast<uint8_t*>(owned.data()), owned.size(), &ReleaseCounted, hint);
}

// ---------------------------------------------------------------- same-host shared memory
// Transport-level messages between a client and a shard that both run with shared memory
// on (never seen above the transport). A FlatBuffers envelope starts with its root offset,
// which is never 0xff..., so these one-frame messages cannot be taken for one:
//   hello    client -> shard: magic, version u32, token u64, segment name
//   answer   shard -> client: magic, accepted u32 (1/0), token u64, reason
// and the trailer, the last frame of a message some of whose frames travel in the
// segment (those frames are left empty on the socket):
//   magic, token u64, name length u16, count u16, reserved u32, name, then per frame:
//   index u32, generation u32, offset u64, size u64.
constexpr char kShmHello[8] = {'\xff', 'L', 'S', 'H', 'M', 'H', 'E', 'L'};
constexpr char kShmAnswer[8] = {'\xff', 'L', 'S', 'H', 'M', 'A', 'N', 'S'};
constexpr char kShmTrailer[8] = {'\xff', 'L', 'S', 'H', 'M', 'T', 'R', 'L'};
constexpr size_t kTrailerHead = 8 + 8 + 2 + 2 + 4;
constexpr size_t kTrailerEntry = 4 + 4 + 8 + 8;

bool HasMagic(const zmq::message_t& m, const char (&magic)[8]) {
  return m.size() >= 8 && std::memcmp(m.data(), magic, 8) == 0;
}

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

struct ShmTrailer {
  uint64_t token = 0;
  std::string name;
  std::vector<std::pair<uint32_t, shm::Descriptor>> frames;  // message frame index, where it is
};

std::string EncodeTrailer(uint64_t token, const std::string& name,
                          const std::vector<std::pair<uint32_t, shm::Descriptor>>& frames) {
  std::string out(kShmTrailer, 8);
  Put(&out, token);
  Put(&out, static_cast<uint16_t>(name.size()));
  Put(&out, static_cast<uint16_t>(frames.size()));
  Put(&out, uint32_t{0});
  out += name;
  for (const auto& [index, d] : frames) {
    Put(&out, index);
    Put(&out, d.generation);
    Put(&out, d.offset);
    Put(&out, d.size);
  }
  return out;
}

// A trailer whose sizes add up, or nullopt (then the frame is an ordinary payload).
std::optional<ShmTrailer> DecodeTrailer(const zmq::message_t& m, uint32_t ring) {
  if (!HasMagic(m, kShmTrailer) || m.size() < kTrailerHead) return std::nullopt;
  const auto* p = static_cast<const uint8_t*>(m.data());
  ShmTrailer t;
  t.token = Get<uint64_t>(p + 8);
  auto name_len = Get<uint16_t>(p + 16);
  auto count = Get<uint16_t>(p + 18);
  if (m.size() != kTrailerHead + name_len + size_t{count} * kTrailerEntry) return std::nullopt;
  t.name.assign(reinterpret_cast<const char*>(p + kTrailerHead), name_len);
  const uint8_t* e = p + kTrailerHead + name_len;
  for (uint16_t i = 0; i < count; ++i, e += kTrailerEntry) {
    shm::Descriptor d;
    d.ring = ring;
    d.generation = Get<uint32_t>(e + 4);
    d.offset = Get<uint64_t>(e + 8);
    d.size = Get<uint64_t>(e + 16);
    t.frames.emplace_back(Get<uint32_t>(e), d);
  }
  return t;
}

// Puts the payload frames of `message` that are large enough into `writer`'s ring (in
// place when they were reserved there); those went: their parts (parts[first + i] is
// message[i]) become empty and the trailer is appended. Returns how many went.
size_t ToSharedMemory(std::vector<zmq::message_t>& parts, const Message& message, size_t first, size_t min_bytes,
                      shm::ShmWriter& writer, const shm::ShmSegment& segment) {
  std::vector<std::pair<uint32_t, shm::Descriptor>> moved;
  for (size_t i = 1; i < message.size(); ++i) {
    const Frame& f = message[i];
    if (f.size() < min_bytes) continue;
    std::optional<shm::Descriptor> d = writer.Stamp(f);
    if (!d) d = writer.Put(f);
    if (!d) continue;  // no room now: this frame goes through the socket
    moved.emplace_back(static_cast<uint32_t>(i), *d);
    parts[first + i] = zmq::message_t();
  }
  if (!moved.empty()) parts.emplace_back(EncodeTrailer(segment.token(), segment.name(), moved));
  return moved.size();
}

// Fills the frames a trailer names from `segment` (copied out, or borrowed in place).
// Frames that cannot be read stay empty, so the message fails its size checks above
// with a clear error instead of being taken for something else.
Status FromSharedMemory(Message& message, const ShmTrailer& t, const std::shared_ptr<shm::ShmSegment>& segment,
                        bool copy) {
  Status first;
  for (const auto& [index, d] : t.frames) {
    if (index == 0 || index >= message.size() || !message[index].empty()) {
      if (first.ok()) first = InvalidArgument("shared-memory trailer names frame " + std::to_string(index));
      continue;
    }
    Result<Frame> f = copy ? segment->CopyOut(d) : segment->Borrow(segment, d);
    if (!f.ok()) {
      if (first.ok()) first = f.status();
      continue;
    }
    message[index] = std::move(*f);
  }
  return first;
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

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Z85 text of a 32-byte public key, for logs.
std::string Z85(const void* key32) {
  char out[41] = {0};
  if (zmq_z85_encode(out, static_cast<const uint8_t*>(key32), 32) == nullptr) return "?";
  return out;
}

// Watches one socket's connection and handshake events: zmq_socket_monitor publishes them
// on an inproc PAIR that this object reads without blocking. Used by the thread that
// polls the watched socket.
class SocketMonitor {
 public:
  struct Event {
    uint16_t event = 0;
    uint32_t value = 0;
  };

  SocketMonitor(zmq::context_t& ctx, zmq::socket_t& watched, int events) {
    static std::atomic<uint64_t> next{0};
    std::string endpoint = "inproc://leash-monitor-" + std::to_string(::getpid()) + "-" + std::to_string(next++);
    if (zmq_socket_monitor(watched.handle(), endpoint.c_str(), events) != 0) throw zmq::error_t();
    pair_ = zmq::socket_t(ctx, zmq::socket_type::pair);
    pair_.set(zmq::sockopt::linger, 0);
    pair_.connect(endpoint);
  }

  void* handle() { return pair_.handle(); }

  // The next event, if one is waiting.
  std::optional<Event> Next() {
    zmq::message_t head;
    try {
      if (!pair_.recv(head, zmq::recv_flags::dontwait)) return std::nullopt;
      Event e;
      if (head.size() >= 6) {
        std::memcpy(&e.event, head.data(), 2);
        std::memcpy(&e.value, static_cast<const char*>(head.data()) + 2, 4);
      }
      while (head.more()) {  // the endpoint frame
        zmq::message_t rest;
        if (!pair_.recv(rest, zmq::recv_flags::dontwait)) break;
        head = std::move(rest);
      }
      return e;
    } catch (const zmq::error_t&) {
      return std::nullopt;
    }
  }

 private:
  zmq::socket_t pair_;
};

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

// Answers ZAP requests (RFC 27) on inproc://zeromq.zap.01 for the CURVE server sockets
// of its context: a client whose long-term public key is authorized gets 200, any other
// 400. Runs its own thread; counters are atomics read by other threads.
class ZapHandler {
 public:
  ZapHandler(zmq::context_t& ctx, const std::vector<AuthorizedKey>& authorized)
      : socket_(ctx, zmq::socket_type::rep) {
    for (const auto& k : authorized) {
      uint8_t raw[32];
      if (zmq_z85_decode(raw, k.public_z85.c_str()) != nullptr) allowed_[std::string(reinterpret_cast<char*>(raw), 32)] = k.name;
    }
    socket_.set(zmq::sockopt::linger, 0);
  }

  ~ZapHandler() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

  Status Start() {
    try {
      socket_.bind("inproc://zeromq.zap.01");
    } catch (const zmq::error_t& e) {
      return Internal(std::string("cannot start the CURVE authenticator (ZAP handler): ") + e.what() +
                      " (only one CURVE server per ZmqContext)");
    }
    thread_ = std::thread([this] { Loop(); });
    return Status::Ok();
  }

  uint64_t refused() const { return refused_.load(); }

 private:
  void Loop() {
    while (!stop_.load()) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      try {
        zmq::poll(&item, 1, std::chrono::milliseconds(100));
        if (!(item.revents & ZMQ_POLLIN)) continue;
        std::vector<zmq::message_t> req;
        if (!RecvAll(socket_, &req).ok()) continue;
        Answer(req);
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) return;
        if (e.num() != EINTR) spdlog::warn("CURVE authenticator: {}", e.what());
      }
    }
  }

  // Request frames: version, request id, domain, address, routing id, mechanism, then the
  // credentials (for CURVE, the client's 32-byte public key).
  void Answer(std::vector<zmq::message_t>& req) {
    std::string request_id = req.size() > 1 ? req[1].to_string() : "";
    std::string address = req.size() > 3 ? req[3].to_string() : "?";
    std::string mechanism = req.size() > 5 ? req[5].to_string() : "";
    std::string status = "400", text = "client key not authorized", user;
    if (req.size() < 7 || req[0].to_string() != "1.0") {
      text = "malformed ZAP request";
      spdlog::warn("CURVE authenticator: malformed ZAP request ({} frames)", req.size());
    } else if (mechanism != "CURVE" || req[6].size() != 32) {
      text = "CURVE required";
      ++refused_;
      spdlog::warn("refused a {} connection from {}: this shard accepts only CURVE clients", mechanism, address);
    } else {
      std::string key = req[6].to_string();
      auto it = allowed_.find(key);
      if (it != allowed_.end()) {
        status = "200";
        text = "OK";
        user = it->second;
      } else {
        uint64_t n = ++refused_;
        // Once per key (a refused client keeps reconnecting), at most 1000 keys remembered.
        if (logged_.size() < 1000 && logged_.insert(key).second) {
          spdlog::warn("refused CURVE client key {} from {}: not in the authorized keys (refusal #{}; further "
                       "attempts with this key are counted, not logged)",
                       Z85(key.data()), address, n);
        }
      }
    }
    std::vector<zmq::message_t> reply;
    reply.emplace_back(std::string("1.0"));
    reply.emplace_back(request_id);
    reply.emplace_back(status);
    reply.emplace_back(text);
    reply.emplace_back(user);
    reply.emplace_back();
    for (size_t i = 0; i < reply.size(); ++i) {
      socket_.send(std::move(reply[i]), i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }

  zmq::socket_t socket_;
  std::map<std::string, std::string> allowed_;  // raw public key -> name
  std::set<std::string> logged_;
  std::atomic<uint64_t> refused_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class ZmqServer final : public ServerTransport {
 public:
  ZmqServer(zmq::context_t& ctx, const ZmqOptions& o) : ctx_(ctx), options_(o), socket_(ctx, zmq::socket_type::router) {
    ApplyOptions(socket_, o);
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
          ctx_, socket_, ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL);
      socket_.bind(endpoint);
    } catch (const zmq::error_t& e) {
      return Unavailable("cannot bind " + endpoint + ": " + e.what() +
                         " (is another shard using this port, or is the address wrong?)");
    }
    return Status::Ok();
  }

  Result<std::optional<Inbound>> Receive(std::chrono::milliseconds timeout) override {
    zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, waker_.fd(), ZMQ_POLLIN, 0},
                               {monitor_->handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 3, timeout);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return std::optional<Inbound>();
      return FromZmq(e, "zmq poll");
    }
    if (items[1].revents & ZMQ_POLLIN) waker_.Drain();
    if (items[2].revents & ZMQ_POLLIN) DrainMonitor();
    if (!(items[0].revents & ZMQ_POLLIN)) return std::optional<Inbound>();
    std::vector<zmq::message_t> parts;
    LEASH_RETURN_IF_ERROR(RecvAll(socket_, &parts));
    Inbound in;
    in.peer = parts[0].to_string();
    if (parts.size() == 2 && HasMagic(parts[1], kShmHello)) {
      AnswerHello(in.peer, parts[1]);
      return std::optional<Inbound>();
    }
    std::optional<ShmTrailer> trailer;
    if (parts.size() >= 3) trailer = DecodeTrailer(parts.back(), 0);
    if (trailer) parts.pop_back();
    in.message.reserve(parts.size() - 1);
    for (size_t i = 1; i < parts.size(); ++i) in.message.push_back(ToFrame(std::move(parts[i])));
    if (!shm_links_.empty() || trailer) NoteShmPeer(in.peer, trailer ? &*trailer : nullptr, &in.message);
    return std::optional<Inbound>(std::move(in));
  }

  Status Send(const PeerId& peer, Message message) override {
    std::shared_ptr<std::atomic<int64_t>>& queued = queued_[peer];
    if (!queued) queued = std::make_shared<std::atomic<int64_t>>(0);
    if (options_.max_queued_bytes_per_peer > 0 && queued->load() > options_.max_queued_bytes_per_peer) {
      // The peer does not read its replies: drop rather than buffer without bound. A
      // client that resends after silence gets the answer once it reads again.
      uint64_t n = ++replies_dropped_;
      int64_t now = NowMs();
      if (now - last_drop_log_ms_ >= 60000) {
        last_drop_log_ms_ = now;
        spdlog::warn("dropped a reply: the client already has {} bytes of unread replies queued (limit {}; {} replies "
                     "dropped so far; logged at most once a minute)",
                     queued->load(), options_.max_queued_bytes_per_peer, n);
      }
      return Status::Ok();
    }
    std::vector<zmq::message_t> parts;
    parts.reserve(message.size() + 1);
    parts.emplace_back(peer.data(), peer.size());
    for (const Frame& f : message) parts.push_back(ToZmqCounted(f, queued));
    if (ShmLink* link = LinkOf(peer); link != nullptr && link->segment->ready()) {
      shm_frames_sent_ += ToSharedMemory(parts, message, 1, static_cast<size_t>(options_.shm_min_frame_bytes),
                                         *link->writer, *link->segment);
    }
    Status st = SendAll(socket_, parts);
    if (queued_.size() > 4096) Sweep();
    return st;
  }

  void Wake() override { waker_.Wake(); }

  std::optional<WritableFrame> ReservePayload(const PeerId& peer, size_t bytes) override {
    if (bytes < static_cast<size_t>(options_.shm_min_frame_bytes)) return std::nullopt;
    ShmLink* link = LinkOf(peer);
    if (link == nullptr) return std::nullopt;
    std::optional<Frame> f = link->writer->Reserve(bytes);
    if (!f) return std::nullopt;
    return WritableFrame{const_cast<uint8_t*>(f->data()), std::move(*f)};
  }

  TransportCounters counters() const override {
    TransportCounters c;
    c.replies_dropped = replies_dropped_.load();
    c.auth_refused = zap_ ? zap_->refused() : 0;
    c.handshake_failed = handshake_failed_.load();
    c.shm_frames_received = shm_frames_received_.load();
    c.shm_frames_sent = shm_frames_sent_.load();
    return c;
  }

 private:
  // A client's segment mapped here: its ring 1 carries this shard's large replies.
  struct ShmLink {
    std::shared_ptr<shm::ShmSegment> segment;
    std::unique_ptr<shm::ShmWriter> writer;
    int64_t last_used_ms = 0;
  };
  // Segments not used for this long are unmapped (their clients left or died; a live
  // client sends heartbeats far more often, and a client idle for longer has its
  // segment mapped again from its next trailer).
  static constexpr int64_t kShmIdleMs = 30000;

  // The segment `peer`'s replies go through, or nullptr.
  ShmLink* LinkOf(const PeerId& peer) {
    if (shm_peers_.empty()) return nullptr;
    auto p = shm_peers_.find(peer);
    if (p == shm_peers_.end()) return nullptr;
    auto l = shm_links_.find(p->second);
    return l == shm_links_.end() ? nullptr : &l->second;
  }

  void SendRaw(const PeerId& peer, std::string frame) {
    std::vector<zmq::message_t> parts;
    parts.emplace_back(peer.data(), peer.size());
    parts.emplace_back(frame.data(), frame.size());
    (void)SendAll(socket_, parts);
  }

  void SendAnswer(const PeerId& peer, bool accepted, uint64_t token, const std::string& reason) {
    std::string a(kShmAnswer, 8);
    Put(&a, static_cast<uint32_t>(accepted ? 1 : 0));
    Put(&a, token);
    a += reason;
    SendRaw(peer, std::move(a));
  }

  // Maps (or finds) the segment `name` holding `token`; nullptr and the reason if not.
  ShmLink* Link(const std::string& name, uint64_t token, Status* why) {
    auto it = shm_links_.find(name);
    if (it != shm_links_.end() && it->second.segment->token() == token) return &it->second;
    if (!options_.shared_memory) {
      *why = FailedPrecondition("shared memory is off on this shard (--shm off)");
      return nullptr;
    }
    auto seg = shm::ShmSegment::Open(name, token);
    if (!seg.ok()) {
      *why = seg.status();
      return nullptr;
    }
    ShmLink link;
    link.segment = *seg;
    link.writer = std::make_unique<shm::ShmWriter>(link.segment, 1, /*reclaim_ms=*/0);
    return &(shm_links_[name] = std::move(link));
  }

  void AnswerHello(const PeerId& peer, const zmq::message_t& hello) {
    const auto* p = static_cast<const uint8_t*>(hello.data());
    if (hello.size() < 8 + 4 + 8 || Get<uint32_t>(p + 8) != shm::kVersion) {
      SendAnswer(peer, false, 0, "unsupported shared-memory offer");
      return;
    }
    uint64_t token = Get<uint64_t>(p + 12);
    std::string name(reinterpret_cast<const char*>(p + 20), hello.size() - 20);
    Status why;
    ShmLink* link = Link(name, token, &why);
    if (link == nullptr) {
      spdlog::debug("a client's shared-memory offer ({}) refused: {}", name, why.ToString());
      SendAnswer(peer, false, token, why.message());
      return;
    }
    link->last_used_ms = NowMs();
    shm_peers_[peer] = name;
    spdlog::info("a client on this host sends and receives large frames through shared memory {}", name);
    SendAnswer(peer, true, token, "");
  }

  // Keeps a peer's segment alive and fills the frames its trailer names.
  void NoteShmPeer(const PeerId& peer, const ShmTrailer* trailer, Message* message) {
    int64_t now = NowMs();
    if (trailer != nullptr) {
      Status why;
      ShmLink* link = Link(trailer->name, trailer->token, &why);
      if (link == nullptr) {
        ShmWarn("a client sent frames through shared memory " + trailer->name + " that this shard cannot read (" +
                why.ToString() + "); told it to use the socket, its request fails");
        SendAnswer(peer, false, trailer->token, why.message());
      } else {
        shm_peers_[peer] = trailer->name;
        Status st = FromSharedMemory(*message, *trailer, link->segment, /*copy=*/true);
        if (!st.ok()) ShmWarn("a shared-memory frame could not be read: " + st.ToString() + "; the request fails");
        shm_frames_received_ += trailer->frames.size();
      }
    }
    if (auto p = shm_peers_.find(peer); p != shm_peers_.end()) {
      if (auto l = shm_links_.find(p->second); l != shm_links_.end()) l->second.last_used_ms = now;
    }
    if (now - last_shm_sweep_ms_ < 5000) return;
    last_shm_sweep_ms_ = now;
    for (auto it = shm_links_.begin(); it != shm_links_.end();) {
      if (now - it->second.last_used_ms <= kShmIdleMs) {
        ++it;
        continue;
      }
      it = shm_links_.erase(it);
    }
    for (auto it = shm_peers_.begin(); it != shm_peers_.end();) {
      it = shm_links_.count(it->second) == 0 ? shm_peers_.erase(it) : std::next(it);
    }
  }

  void ShmWarn(const std::string& what) {
    int64_t now = NowMs();
    if (now - last_shm_warn_ms_ < 60000) return;
    last_shm_warn_ms_ = now;
    spdlog::warn("{} (logged at most once a minute)", what);
  }

  // Failed handshakes other than refused keys: a client without CURVE (or with CURVE
  // against a plain shard), a wrong server key. Logged at most once a minute.
  void DrainMonitor() {
    while (auto e = monitor_->Next()) {
      uint64_t n = ++handshake_failed_;
      int64_t now = NowMs();
      if (now - last_failure_log_ms_ < 60000) continue;
      last_failure_log_ms_ = now;
      std::string why;
      if (e->event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && e->value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
        why = options_.curve ? "a client without CURVE keys tried to connect (this shard requires --curve-keys)"
                             : "a client with CURVE keys tried to connect (this shard runs without --curve-keys)";
      } else if (e->event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && e->value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC) {
        why = "a client's CURVE handshake failed to decrypt (does it use this cluster's server.pub?)";
      } else if (e->event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
        why = "protocol error " + Hex(e->value);
      } else {
        why = std::string("the connection broke during the handshake (") + zmq_strerror(static_cast<int>(e->value)) +
              (options_.curve ? "): a client without CURVE keys, or with another cluster's server.pub?" : ")");
      }
      spdlog::warn("handshake with a client failed: {} ({} failed handshakes so far; logged at most once a minute)",
                   why, n);
    }
  }

  // Forgets peers with nothing queued, so the map does not grow with every peer ever seen.
  void Sweep() {
    for (auto it = queued_.begin(); it != queued_.end();) {
      it = it->second->load() == 0 && it->second.use_count() == 1 ? queued_.erase(it) : std::next(it);
    }
  }

  zmq::context_t& ctx_;
  ZmqOptions options_;
  std::map<PeerId, std::shared_ptr<std::atomic<int64_t>>> queued_;  // reply bytes ZeroMQ still holds, per peer
  std::atomic<uint64_t> replies_dropped_{0};
  int64_t last_drop_log_ms_ = -60000;
  std::unique_ptr<ZapHandler> zap_;
  zmq::socket_t socket_;
  std::unique_ptr<SocketMonitor> monitor_;
  Waker waker_;
  std::atomic<uint64_t> handshake_failed_{0};
  int64_t last_failure_log_ms_ = -60000;
  std::map<std::string, ShmLink> shm_links_;  // by segment name
  std::map<PeerId, std::string> shm_peers_;   // peer -> the segment its replies use
  std::atomic<uint64_t> shm_frames_received_{0};
  std::atomic<uint64_t> shm_frames_sent_{0};
  int64_t last_shm_sweep_ms_ = 0;
  int64_t last_shm_warn_ms_ = -60000;
};

class ZmqClient final : public ClientTransport {
 public:
  ZmqClient(zmq::context_t& ctx, std::vector<std::string> endpoints, const ZmqOptions& o)
      : ctx_(ctx), endpoints_(std::move(endpoints)), options_(o), health_(endpoints_.size()) {}

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
      shm_.push_back(std::make_unique<ShmLink>());
      if (options_.shared_memory) {
        auto seg = shm::ShmSegment::Create(static_cast<size_t>(options_.shm_ring_bytes));
        if (seg.ok()) {
          shm_[i]->segment = *seg;
          shm_[i]->writer = std::make_unique<shm::ShmWriter>(*seg, 0, kShmReclaimMs);
          shm_[i]->state.store(kShmOffered);
        } else {
          spdlog::warn("shared memory with shard {} is off: {}", i, seg.status().ToString());
        }
      }
      LEASH_RETURN_IF_ERROR(Open(static_cast<int>(i)));
    }
    return Status::Ok();
  }

  int num_shards() const override { return static_cast<int>(endpoints_.size()); }

  Status Send(int shard, Message message) override {
    auto idx = static_cast<size_t>(shard);
    std::vector<zmq::message_t> parts;
    parts.reserve(message.size() + 1);
    for (const Frame& f : message) parts.push_back(ToZmq(f));
    ShmLink& link = *shm_.at(idx);
    if (link.state.load() == kShmOn) {
      std::lock_guard<std::mutex> lock(link.mu);
      if (link.writer) {
        ToSharedMemory(parts, message, 0, static_cast<size_t>(options_.shm_min_frame_bytes), *link.writer,
                       *link.segment);
      }
    }
    return SendAll(*sockets_.at(idx), parts).WithContext(endpoints_[idx]);
  }

  std::optional<WritableFrame> ReservePayload(int shard, size_t bytes) override {
    if (shard < 0 || static_cast<size_t>(shard) >= shm_.size()) return std::nullopt;
    ShmLink& link = *shm_[static_cast<size_t>(shard)];
    if (link.state.load() != kShmOn || bytes < static_cast<size_t>(options_.shm_min_frame_bytes)) return std::nullopt;
    std::lock_guard<std::mutex> lock(link.mu);
    if (!link.writer) return std::nullopt;
    std::optional<Frame> f = link.writer->Reserve(bytes);
    if (!f) return std::nullopt;
    return WritableFrame{const_cast<uint8_t*>(f->data()), std::move(*f)};
  }

  bool SharedMemoryWith(int shard) const override {
    return shard >= 0 && static_cast<size_t>(shard) < shm_.size() && shm_[static_cast<size_t>(shard)]->state.load() == kShmOn;
  }

  Result<std::optional<std::pair<int, Message>>> Receive(std::chrono::milliseconds timeout) override {
    // Shared-memory answers are handled here and come back as empty messages: look again
    // (without waiting) so a caller draining edge-triggered PollFds() misses nothing.
    while (true) {
      LEASH_ASSIGN_OR_RETURN(auto in, ReceiveOne(timeout));
      if (!in || !in->second.empty()) return in;
      timeout = std::chrono::milliseconds(0);
    }
  }

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

  Status Reconnect(int shard) override {
    LEASH_RETURN_IF_ERROR(Open(shard));
    // A shard that never answered the offer (it may have been down) hears it again.
    if (shm_.at(static_cast<size_t>(shard))->state.load() == kShmOffered) SendHello(static_cast<size_t>(shard));
    return Status::Ok();
  }

  std::vector<int> PollFds() override {
    std::vector<int> fds;
    fds.reserve(sockets_.size());
    for (auto& s : sockets_) fds.push_back(s->get(zmq::sockopt::fd));
    for (auto& m : monitors_) {
      if (!m) continue;
      int fd = -1;
      size_t size = sizeof fd;
      if (zmq_getsockopt(m->handle(), ZMQ_FD, &fd, &size) == 0) fds.push_back(fd);
    }
    return fds;
  }

  void Wake() override { waker_.Wake(); }

  Status ShardHealth(int shard) const override {
    std::lock_guard<std::mutex> lock(health_mu_);
    const Health& h = health_.at(static_cast<size_t>(shard));
    if (!h.failure.empty()) return Unavailable(h.failure);
    // A CURVE server that cannot decrypt our HELLO (wrong server key) just closes the
    // connection: connections that never finish the handshake are the only sign.
    if (options_.curve && h.unsecured_since_ms >= 0 && NowMs() - h.unsecured_since_ms > kHandshakeGraceMs) {
      return Unavailable(Describe(shard) + " did not complete the CURVE handshake within " +
                         std::to_string(kHandshakeGraceMs / 1000) + " s of connecting: is " + KeyHint() +
                         " in the shard's authorized keys, and is " + options_.curve->dir +
                         "/server.pub the public key of the shards' server.key?");
    }
    return Status::Ok();
  }

 private:
  static constexpr int64_t kHandshakeGraceMs = 3000;
  // Granules a shard has not given back after this long are taken back: it died (or
  // restarted) before reading the frame, or will find it gone and fail that request.
  static constexpr int64_t kShmReclaimMs = 60000;
  enum ShmState { kShmOff = 0, kShmOffered = 1, kShmOn = 2 };

  // Shared memory with one shard: this client's segment, ring 0 written here.
  struct ShmLink {
    std::mutex mu;  // guards writer (ReservePayload may come from any thread)
    std::shared_ptr<shm::ShmSegment> segment;
    std::unique_ptr<shm::ShmWriter> writer;
    std::atomic<int> state{kShmOff};
  };

  void SendHello(size_t i) {
    ShmLink& link = *shm_[i];
    std::string h(kShmHello, 8);
    Put(&h, shm::kVersion);
    Put(&h, link.segment->token());
    h += link.segment->name();
    std::vector<zmq::message_t> parts;
    parts.emplace_back(h.data(), h.size());
    Status st = SendAll(*sockets_[i], parts);
    if (!st.ok()) spdlog::debug("shared-memory offer to shard {} not sent: {}", i, st.ToString());
  }

  void OnAnswer(size_t i, const zmq::message_t& answer) {
    ShmLink& link = *shm_[i];
    const auto* p = static_cast<const uint8_t*>(answer.data());
    if (answer.size() < 8 + 4 + 8 || !link.segment || Get<uint64_t>(p + 12) != link.segment->token()) return;
    bool accepted = Get<uint32_t>(p + 8) == 1;
    std::string reason(reinterpret_cast<const char*>(p + 20), answer.size() - 20);
    if (accepted && link.state.load() == kShmOffered) {
      Status st = link.segment->Allocate();
      if (!st.ok()) {
        spdlog::warn("shared memory with {} is off: {}", Describe(static_cast<int>(i)), st.ToString());
        TurnOff(link);
        return;
      }
      link.state.store(kShmOn);
      spdlog::info("{} is on this host: frames of {} KiB and more go through shared memory {}",
                   Describe(static_cast<int>(i)), options_.shm_min_frame_bytes >> 10, link.segment->name());
    } else if (!accepted) {
      if (link.state.load() == kShmOn) {
        spdlog::warn("{} no longer reads this client's shared memory ({}): sending everything through the socket",
                     Describe(static_cast<int>(i)), reason);
      } else {
        spdlog::debug("{} declined shared memory ({}): sending everything through the socket",
                      Describe(static_cast<int>(i)), reason);
      }
      TurnOff(link);
    }
  }

  // Frames still in flight keep the segment mapped; its name goes with the last one.
  static void TurnOff(ShmLink& link) {
    link.state.store(kShmOff);
    std::lock_guard<std::mutex> lock(link.mu);
    link.writer.reset();
    link.segment.reset();
  }

  struct Health {
    int64_t unsecured_since_ms = -1;  // first connection since the last good handshake
    std::string failure;              // the last handshake failure, until one succeeds
  };

  std::string Describe(int shard) const {
    return "shard " + std::to_string(shard) + " (" + endpoints_[static_cast<size_t>(shard)] + ")";
  }

  std::string KeyHint() const {
    const CurveKeys& k = *options_.curve;
    return "this client's public key (" + k.dir + "/" + k.own_name + ".pub)";
  }

  void DrainMonitor(size_t i) {
    while (auto e = monitors_[i]->Next()) {
      int shard = static_cast<int>(i);
      std::string failure;
      switch (e->event) {
        case ZMQ_EVENT_CONNECTED: {
          std::lock_guard<std::mutex> lock(health_mu_);
          if (health_[i].unsecured_since_ms < 0) health_[i].unsecured_since_ms = NowMs();
          continue;
        }
        case ZMQ_EVENT_HANDSHAKE_SUCCEEDED: {
          std::lock_guard<std::mutex> lock(health_mu_);
          health_[i] = Health{};
          continue;
        }
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
          failure = Describe(shard) + " did not complete the CURVE handshake: it refused this client's key (status " +
                    std::to_string(e->value) + "). Is " + (options_.curve ? KeyHint() : std::string("this client's key")) +
                    " in the shard's authorized keys (DIR/authorized/*.pub, see `leashctl keygen --client`)?";
          break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
          if (e->value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
            failure = options_.curve
                          ? Describe(shard) + " does not use CURVE security: start the shards with --curve-keys "
                                              "(LEASH_CURVE_KEYS) too, or run this client without it"
                          : Describe(shard) + " requires CURVE security: pass --curve-keys DIR (or LEASH_CURVE_KEYS) "
                                              "holding this client's key pair and the shards' server.pub";
          } else {
            failure = Describe(shard) + " did not complete the " + (options_.curve ? "CURVE " : "") +
                      "handshake (protocol error " + Hex(e->value) + ")" +
                      (options_.curve ? ": is " + options_.curve->dir + "/server.pub the shards' public key?"
                                      : std::string());
          }
          break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
          // Typically the shard closed the connection during the handshake.
          failure = Describe(shard) + " did not complete the " + (options_.curve ? "CURVE " : "") + "handshake (" +
                    zmq_strerror(static_cast<int>(e->value)) + "): " +
                    (options_.curve ? "is " + KeyHint() + " in the shard's authorized keys, is " +
                                          options_.curve->dir +
                                          "/server.pub the shards' public key, and does the shard run with "
                                          "--curve-keys?"
                                    : std::string("if the shards use CURVE security, pass --curve-keys DIR (or "
                                                  "LEASH_CURVE_KEYS) holding this client's key pair and the "
                                                  "shards' server.pub"));
          break;
        default:
          continue;
      }
      bool changed;
      {
        std::lock_guard<std::mutex> lock(health_mu_);
        changed = health_[i].failure != failure;
        health_[i].failure = failure;
      }
      if (changed) spdlog::warn("{}", failure);
    }
  }

  Status Open(int shard) {
    auto idx = static_cast<size_t>(shard);
    const bool replaced = sockets_[idx] != nullptr;
    try {
      auto s = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
      ApplyOptions(*s, options_);
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
      if (!replaced && shm_[idx]->state.load() == kShmOffered) SendHello(idx);
    } catch (const zmq::error_t& e) {
      return InvalidArgument("cannot connect to shard " + std::to_string(shard) + " at '" + endpoints_[idx] +
                             "': " + e.what() + " (expected tcp://HOST:PORT)");
    }
    {
      std::lock_guard<std::mutex> lock(health_mu_);
      health_[idx].unsecured_since_ms = -1;  // a failure seen before is kept until a handshake succeeds
    }
    return Status::Ok();
  }

  Result<std::optional<std::pair<int, Message>>> ReadFrom(size_t i) {
    std::vector<zmq::message_t> parts;
    LEASH_RETURN_IF_ERROR(RecvAll(*sockets_[i], &parts));
    if (parts.size() == 1 && HasMagic(parts[0], kShmAnswer)) {
      OnAnswer(i, parts[0]);
      return std::optional<std::pair<int, Message>>(std::make_pair(static_cast<int>(i), Message()));
    }
    std::optional<ShmTrailer> trailer;
    if (parts.size() >= 2) trailer = DecodeTrailer(parts.back(), 1);
    if (trailer) parts.pop_back();
    Message m;
    m.reserve(parts.size());
    for (auto& p : parts) m.push_back(ToFrame(std::move(p)));
    if (trailer) {
      const ShmLink& link = *shm_[i];
      Status st = link.segment && link.segment->token() == trailer->token
                      ? FromSharedMemory(m, *trailer, link.segment, /*copy=*/false)
                      : InvalidArgument("the shard used shared memory this client did not offer");
      if (!st.ok()) spdlog::warn("{}: a reply's shared-memory frame could not be read: {}", Describe(static_cast<int>(i)), st.ToString());
    }
    return std::optional<std::pair<int, Message>>(std::make_pair(static_cast<int>(i), std::move(m)));
  }

  zmq::context_t& ctx_;
  std::vector<std::string> endpoints_;
  ZmqOptions options_;
  std::vector<std::unique_ptr<zmq::socket_t>> sockets_;
  std::vector<std::unique_ptr<SocketMonitor>> monitors_;
  std::vector<std::unique_ptr<ShmLink>> shm_;  // per shard; never null after Init
  mutable std::mutex health_mu_;
  std::vector<Health> health_;  // guarded by health_mu_
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

bool IsLoopbackEndpoint(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0) return true;
  auto scheme = endpoint.find("://");
  std::string host = scheme == std::string::npos ? endpoint : endpoint.substr(scheme + 3);
  if (auto colon = host.rfind(':'); colon != std::string::npos) host = host.substr(0, colon);
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "[::1]" || host == "::1" || host == "lo";
}

}  // namespace leash
