// Watching ZeroMQ connections and explaining failed handshakes; see socket_monitor.h.
#include "socket_monitor.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "zmq_util.h"

namespace leash {

using zmq_util::Hex;
using zmq_util::NowMs;

SocketMonitor::SocketMonitor(zmq::context_t& ctx, zmq::socket_t& watched, int events)
    : watched_(watched.handle()) {
  static std::atomic<uint64_t> next{0};
  std::string endpoint =
      "inproc://leash-monitor-" + std::to_string(::getpid()) + "-" + std::to_string(next++);
  if (zmq_socket_monitor(watched.handle(), endpoint.c_str(), events) != 0) throw zmq::error_t();
  pair_ = zmq::socket_t(ctx, zmq::socket_type::pair);
  pair_.set(zmq::sockopt::linger, 0);
  pair_.connect(endpoint);
}

SocketMonitor::~SocketMonitor() { zmq_socket_monitor(watched_, nullptr, 0); }

int SocketMonitor::fd() {
  int fd = -1;
  size_t size = sizeof fd;
  if (zmq_getsockopt(pair_.handle(), ZMQ_FD, &fd, &size) != 0) return -1;
  return fd;
}

std::optional<SocketMonitor::Event> SocketMonitor::Next() {
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

std::string DescribeServerHandshakeFailure(const SocketMonitor::Event& e, bool curve) {
  if (e.event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
      e.value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
    return curve
               ? "a client without CURVE keys tried to connect (this shard requires --curve-keys)"
               : "a client with CURVE keys tried to connect (this shard runs without --curve-keys)";
  }
  if (e.event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
      e.value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC) {
    return "a client's CURVE handshake failed to decrypt (does it use this cluster's server.pub?)";
  }
  if (e.event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) return "protocol error " + Hex(e.value);
  return std::string("the connection broke during the handshake (") +
         zmq_strerror(static_cast<int>(e.value)) +
         (curve ? "): a client without CURVE keys, or with another cluster's server.pub?" : ")");
}

HandshakeWatch::HandshakeWatch(std::vector<std::string> endpoints, const ZmqOptions& options,
                               int64_t grace_ms)
    : endpoints_(std::move(endpoints)),
      options_(options),
      grace_ms_(grace_ms),
      health_(endpoints_.size()) {}

void HandshakeWatch::Reconnecting(int shard) {
  std::lock_guard<std::mutex> lock(mu_);
  health_.at(static_cast<size_t>(shard)).unsecured_since_ms = -1;
}

std::string HandshakeWatch::Describe(int shard) const {
  return "shard " + std::to_string(shard) + " (" + endpoints_[static_cast<size_t>(shard)] + ")";
}

std::string HandshakeWatch::KeyHint() const {
  const CurveKeys& k = *options_.curve;
  return "this client's public key (" + k.dir + "/" + k.own_name + ".pub)";
}

void HandshakeWatch::OnEvent(int shard, const SocketMonitor::Event& e) {
  auto i = static_cast<size_t>(shard);
  const bool curve = options_.curve.has_value();
  std::string failure;
  switch (e.event) {
    case ZMQ_EVENT_CONNECTED: {
      std::lock_guard<std::mutex> lock(mu_);
      if (health_[i].unsecured_since_ms < 0) health_[i].unsecured_since_ms = NowMs();
      return;
    }
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED: {
      std::lock_guard<std::mutex> lock(mu_);
      health_[i] = Health{};
      return;
    }
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      failure = Describe(shard) +
                " did not complete the CURVE handshake: it refused this client's key (status " +
                std::to_string(e.value) + "). Is " +
                (curve ? KeyHint() : std::string("this client's key")) +
                " in the shard's authorized keys (DIR/authorized/*.pub, see `leashctl keygen "
                "--client`)?";
      break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      if (e.value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
        failure = curve ? Describe(shard) +
                              " does not use CURVE security: start the shards with --curve-keys "
                              "(LEASH_CURVE_KEYS) too, or run this client without it"
                        : Describe(shard) +
                              " requires CURVE security: pass --curve-keys DIR (or "
                              "LEASH_CURVE_KEYS) holding this client's key pair and the shards' "
                              "server.pub";
      } else {
        failure = Describe(shard) + " did not complete the " + (curve ? "CURVE " : "") +
                  "handshake (protocol error " + Hex(e.value) + ")" +
                  (curve ? ": is " + options_.curve->dir + "/server.pub the shards' public key?"
                         : std::string());
      }
      break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL: {
      // Typically the shard closed the connection during the handshake: a refusal of a CURVE
      // client, or a shard starting, stopping or failing over. Held until it persists.
      std::string broken =
          Describe(shard) + " did not complete the " + (curve ? "CURVE " : "") + "handshake (" +
          zmq_strerror(static_cast<int>(e.value)) + "): " +
          (curve
               ? "is " + KeyHint() + " in the shard's authorized keys, is " + options_.curve->dir +
                     "/server.pub the shards' public key, and does the shard run with "
                     "--curve-keys?"
               : std::string("if the shards use CURVE security, pass --curve-keys DIR (or "
                             "LEASH_CURVE_KEYS) holding this client's key pair and the "
                             "shards' server.pub"));
      std::lock_guard<std::mutex> lock(mu_);
      Health& h = health_[i];
      if (h.broken_since_ms < 0) h.broken_since_ms = NowMs();
      if (h.broken != broken) spdlog::debug("{} (ZeroMQ reconnects)", broken);
      h.broken = std::move(broken);
      return;
    }
    default:
      return;
  }
  bool changed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    changed = health_[i].failure != failure;
    health_[i].failure = failure;
  }
  if (changed) spdlog::warn("{}", failure);
}

Status HandshakeWatch::ShardHealth(int shard) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Health& h = health_.at(static_cast<size_t>(shard));
  if (!h.failure.empty()) return Unavailable(h.failure);
  if (!h.broken.empty() && NowMs() - h.broken_since_ms > grace_ms_) {
    return Unavailable(h.broken + " (no handshake has succeeded for " +
                       std::to_string(NowMs() - h.broken_since_ms) + " ms since)");
  }
  // A CURVE server that cannot decrypt our HELLO (wrong server key) just closes the
  // connection: connections that never finish the handshake are the only sign.
  if (options_.curve && h.unsecured_since_ms >= 0 && NowMs() - h.unsecured_since_ms > grace_ms_) {
    return Unavailable(Describe(shard) + " did not complete the CURVE handshake within " +
                       std::to_string(grace_ms_) + " ms of connecting: is " + KeyHint() +
                       " in the shard's authorized keys, and is " + options_.curve->dir +
                       "/server.pub the public key of the shards' server.key?");
  }
  return Status::Ok();
}

}  // namespace leash
