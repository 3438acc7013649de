// ZeroMQ implementations of the transport seam: a ROUTER for a shard, one DEALER per
// shard for a client. The only place cppzmq is used and zmq::error_t is translated.
// Thread-safety as transport.h says for each interface.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "leash/common/curve_keys.h"
#include "leash/common/endpoint.h"
#include "leash/common/transport.h"

namespace zmq {
class context_t;
}

namespace leash {

// The most a caller may let a shared-memory ring grow to, in MiB (--shm-ring-mb and its
// likes check against it: 1 to this).
inline constexpr int64_t kMaxShmRingMb = 4096;

struct ZmqOptions {
  // Hard cap on one frame; ZeroMQ drops the connection of a peer sending more. The
  // shard's own, lower limit answers with an error reply first.
  int64_t max_message_bytes = int64_t{1} << 30;
  int send_hwm = 10000;
  int recv_hwm = 10000;
  int reconnect_ivl_ms = 100;
  int reconnect_ivl_max_ms = 2000;
  // A connection whose ZMTP/CURVE handshake is not done within this long is dropped.
  int handshake_ivl_ms = 10000;
  // A server drops (and counts) replies to a peer that already has this many bytes of
  // replies queued and unread, instead of buffering without bound. 0: no limit.
  int64_t max_queued_bytes_per_peer = 0;
  // CURVE security. A server (BindZmqServer) needs own and authorized: it becomes a
  // CURVE server and a ZAP handler in this process accepts only the authorized client
  // keys. A client (ConnectZmqClient) needs own and server_public_z85. Without it, plain
  // unauthenticated, unencrypted ZMTP.
  std::optional<CurveKeys> curve;
  // Same-host shared memory. A client with this on offers each shard a shared-memory
  // segment; a shard with it on maps the segment when it can (the peer is on this host,
  // in the same /dev/shm, as the same user) and from then on frames of at least
  // shm_min_frame_bytes travel through it in both directions, with only a descriptor on
  // the socket. Anywhere else (another host, another container) the offer is refused
  // and everything goes through the socket as without it. Frames that do not fit in a
  // ring at the moment go through the socket too.
  bool shared_memory = false;
  // The most a ring (one per direction and connection) grows to; it reserves /dev/shm
  // only as its frames in flight need it, in steps of 1 MiB. 64 MiB holds 8 pushes of 4 MB
  // in flight with room to spare (bench/results/shm_ring_size_ab.md: 16 MiB held about 3,
  // and the rest took the socket).
  int64_t shm_ring_bytes = int64_t{64} << 20;
  int64_t shm_min_frame_bytes = int64_t{32} << 10;
  // With shared_memory on both ends: every message of a same-host connection goes through
  // its segment too (a queue per direction, the reader woken through a FIFO), not only the
  // large frames, so no ZeroMQ I/O thread hands it on. The socket keeps the handshake.
  bool shm_messages = true;
  // A client with shared_memory on: offer each shard to read this client's large frames in
  // place (where the client wrote them) instead of copying them out first; each frame's room
  // comes back when the shard lets it go. For a peer that lets every frame go once it used
  // it (a backup replica applying the primary's log entries); the client's rings then never
  // take room back, so after the shard process restarted call
  // ClientSharedMemory::RenewLink (room its old process held is given up with the segment).
  bool shm_lend = false;
  // A server: which clients offering to lend their frames have them read in place: those
  // authenticated with this CURVE key name, any client ("*"), or none (empty, the default:
  // every frame is copied out and checked, and no client can change it afterwards). A
  // lender could change a frame after the server checked it: only peers trusted with the
  // server's state, as a replicated shard's replicas are (without CURVE any client could
  // append to the log anyway).
  std::string shm_lenders;
  // A server: frames of same-host clients that do not lend are read in place too, marked
  // Frame::unstable() (the client could still change them), instead of copied out and
  // checked on receipt; the server must copy each before reading it (a replicated primary
  // copies a push straight into its backups' rings, and applies that copy). Their ring's
  // room goes back to the client when the server lets go of the frame.
  bool shm_borrow_all = false;
  // Striping (common/src/stripes.h), for links faster than one connection carries: a
  // client with stripes >= 2 opens that many connections to each shard, each handled by
  // a ZeroMQ I/O thread of the context (give ZmqContext as many), and splits a message of
  // at least stripe_min_bytes over them; a shard answers such a client's large replies the
  // same way (a shard needs no setting: it follows the client). The other side delivers
  // whole messages in the order they were sent. Frames that go through shared memory are
  // not striped. 1: one connection per shard.
  int stripes = 1;
  int64_t stripe_min_bytes = int64_t{1} << 20;
  // How long the parts of a striped message are waited for once one arrived (a connection
  // that dropped under it): the message is then dropped, as on a dropped connection, and
  // the client's resend carries it.
  int stripe_timeout_ms = 5000;
  // Fault injection (a client): every Send first waits this long, a slow link made in the
  // application where the kernel offers no netem. 0: none.
  int send_delay_ms = 0;
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
// endpoint in the message if it cannot bind (e.g. the port is taken). With options.curve,
// also starts the ZAP handler thread (one CURVE server per ZmqContext): refused client
// keys are logged (once per key) and counted in counters().
Result<std::unique_ptr<ServerTransport>> BindZmqServer(ZmqContext& ctx, const std::string& endpoint,
                                                       const ZmqOptions& options = {});

// Connects one DEALER to each endpoint; shard i is endpoints[i]. Connecting never
// blocks: an unreachable shard shows up as requests that are not answered. Handshake
// failures (a refused CURVE key, CURVE on one side only) are watched through a socket
// monitor and reported by health(); with options.shared_memory, shared_memory() is set.
Result<std::unique_ptr<ClientTransport>> ConnectZmqClient(ZmqContext& ctx,
                                                          const std::vector<std::string>& endpoints,
                                                          const ZmqOptions& options = {});

}  // namespace leash
