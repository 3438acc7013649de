// CURVE authentication for a shard: answers ZAP requests (RFC 27) on
// inproc://zeromq.zap.01 for the CURVE server sockets of its ZeroMQ context, accepting
// only the authorized client keys. Runs its own thread; refused() is thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "leash/common/curve_keys.h"
#include "leash/common/status.h"

namespace leash {

class ZapHandler {
 public:
  ZapHandler(zmq::context_t& ctx, const std::vector<AuthorizedKey>& authorized);
  ~ZapHandler();  // stops the thread
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  // Binds the ZAP endpoint and starts answering. Internal if the context already has a
  // ZAP handler (one CURVE server per ZmqContext).
  Status Start();

  // Connections refused so far: unknown keys and clients without CURVE.
  uint64_t refused() const { return refused_.load(); }

 private:
  void Loop();
  // Request frames: version, request id, domain, address, routing id, mechanism, then the
  // credentials (for CURVE, the client's 32-byte public key).
  void Answer(std::vector<zmq::message_t>& req);

  zmq::socket_t socket_;
  std::map<std::string, std::string> allowed_;  // raw public key -> name
  std::set<std::string> logged_;
  std::atomic<uint64_t> refused_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace leash
