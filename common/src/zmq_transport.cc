// The ZeroMQ transport's shared context and endpoint helpers. The server and client
// sockets live in zmq_server.cc and zmq_client.cc, CURVE's authenticator in
// zap_handler.cc, handshake diagnostics in socket_monitor.cc and the same-host
// shared-memory protocol in shm_link.cc. Thread-safe.
#include "leash/common/zmq_transport.h"

#include <zmq.hpp>

namespace leash {

ZmqContext::ZmqContext(int io_threads) : ctx_(std::make_unique<zmq::context_t>(io_threads)) {}
ZmqContext::~ZmqContext() = default;

bool IsLoopbackEndpoint(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0) return true;
  auto scheme = endpoint.find("://");
  std::string host = scheme == std::string::npos ? endpoint : endpoint.substr(scheme + 3);
  if (auto colon = host.rfind(':'); colon != std::string::npos) host = host.substr(0, colon);
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "[::1]" || host == "::1" ||
         host == "lo";
}

}  // namespace leash
