// leash-bench-garbage-flood: a misbehaving peer for bench/garbage_flood.py. Connects a
// ZeroMQ DEALER to a shard and sends it garbage (frames that are not requests) as fast as
// it can for --seconds, reading whatever replies come; prints the messages sent and the
// replies received as one JSON line. Single-threaded.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <zmq.hpp>

int main(int argc, char** argv) {
  std::string endpoint = "tcp://127.0.0.1:7000";
  double seconds = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--endpoint") {
      endpoint = argv[i + 1];
    } else if (flag == "--seconds") {
      seconds = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: leash-bench-garbage-flood [--endpoint E] [--seconds S]\n");
      return 2;
    }
  }
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  const std::string garbage = "this is not a request";
  uint64_t sent = 0, replies = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (int k = 0; k < 64; ++k) {
      if (s.send(zmq::buffer(garbage), zmq::send_flags::dontwait)) ++sent;
    }
    zmq::message_t m;
    while (s.recv(m, zmq::recv_flags::dontwait)) {
      if (!m.more()) ++replies;
    }
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN | ZMQ_POLLOUT, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(10));
  }
  std::printf("{\"sent\": %llu, \"replies\": %llu, \"seconds\": %.1f}\n",
              static_cast<unsigned long long>(sent), static_cast<unsigned long long>(replies),
              seconds);
  return 0;
}
