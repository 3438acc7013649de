// The ZeroMQ transport's shared context (endpoint checks: endpoint.cc). The server and client
// sockets live in zmq_server.cc and zmq_client.cc, CURVE's authenticator in
// zap_handler.cc, handshake diagnostics in socket_monitor.cc and the same-host
// shared-memory protocol in shm_link.cc. Thread-safe.
#include "leash/common/zmq_transport.h"

#include <zmq.hpp>

namespace leash {

ZmqContext::ZmqContext(int io_threads) : ctx_(std::make_unique<zmq::context_t>(io_threads)) {}
ZmqContext::~ZmqContext() = default;

}  // namespace leash
