// ZeroMQ implementations of the transport seam: a ROUTER for a shard, one DEALER per
// shard for a client. The only place cppzmq is used and zmq::error_t is translated.
// Thread-compatible, except Wake(), which is thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "leash/common/transport.h"

namespace zmq {
class context_t;
}

namespace leash {

struct ZmqOptions {
  // Hard cap on one frame; ZeroMQ drops the connection of a peer sending more. The
  // shard's own, lower limit answers with an error reply first.
  int64_t max_message_bytes = int64_t{1} << 30;
  int send_hwm = 10000;
  int recv_hwm = 10000;
  int reconnect_ivl_ms = 100;
  int reconnect_ivl_max_ms = 2000;
};

// Shared ZeroMQ context. Thread-safe.
class ZmqContext {
 public:
  explicit ZmqContext(int io_threads = 1);
  ~ZmqContext();
  zmq::context_t& get() { return *ctx_; }

 private:
  std::unique_ptr<zmq::context_t> ctx_;
};

// Binds a ROUTER to `endpoint` ("tcp://127.0.0.1:7000"). Returns Unavailable with the
// endpoint in the message if it cannot bind (e.g. the port is taken).
Result<std::unique_ptr<ServerTransport>> BindZmqServer(ZmqContext& ctx, const std::string& endpoint,
                                                      const ZmqOptions& options = {});

// Connects one DEALER to each endpoint; shard i is endpoints[i]. Connecting never
// blocks: an unreachable shard shows up as requests that are not answered.
Result<std::unique_ptr<ClientTransport>> ConnectZmqClient(ZmqContext& ctx,
                                                         const std::vector<std::string>& endpoints,
                                                         const ZmqOptions& options = {});

}  // namespace leash
