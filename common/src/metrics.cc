// MetricsServer: the registry (prometheus-cpp core) and a small HTTP/1.0 endpoint of our
// own on one thread with an ordinary stack, which serializes the registry with
// prometheus-cpp's TextSerializer for every GET /metrics.
//
// Why not prometheus-cpp's Exposer: it runs civetweb, whose threads get a fixed 100 KiB
// stack; glibc refuses to create a thread whose stack cannot hold the static TLS of every
// library loaded at start, and a CUDA build of leash-worker links cuBLAS/cuBLASLt, whose
// TLS alone is about 110 KB, so the Exposer could never start there ("null context when
// constructing CivetServer").
#include "leash/common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/text_serializer.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

namespace leash {
namespace {

Status BadBind(const std::string& bind, const std::string& why) {
  return InvalidArgument(
      "--metrics-bind '" + bind + "': " + why +
      " (expected HOST:PORT, e.g. 127.0.0.1:9100 or 0.0.0.0:9100; empty turns metrics off)");
}

}  // namespace

Result<MetricsAddress> ParseMetricsBind(const std::string& bind) {
  if (bind.find("://") != std::string::npos)
    return BadBind(bind, "no scheme: give the address alone");
  size_t colon = bind.rfind(':');
  if (colon == std::string::npos || colon == 0) return BadBind(bind, "no host and port");
  MetricsAddress a;
  a.host = bind.substr(0, colon);
  std::string port = bind.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos ||
      std::atoi(port.c_str()) > 65535) {
    return BadBind(bind, "port '" + port + "' is not a number in 0..65535");
  }
  a.port = std::atoi(port.c_str());
  if (a.host == "localhost") a.host = "127.0.0.1";
  unsigned char buf[16];
  if (a.host.front() == '[') {
    if (a.host.back() != ']' ||
        inet_pton(AF_INET6, a.host.substr(1, a.host.size() - 2).c_str(), buf) != 1) {
      return BadBind(bind, "'" + a.host + "' is not a bracketed IPv6 address");
    }
  } else if (inet_pton(AF_INET, a.host.c_str(), buf) != 1) {
    return BadBind(bind,
                   "host '" + a.host + "' is not an IPv4 address (host names are not resolved)");
  }
  return a;
}

namespace {

constexpr size_t kMaxRequestBytes = 8192;  // a scrape's request line and headers fit easily
constexpr int kRequestTimeoutMs = 2000;    // a peer that sends nothing is dropped after this

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Writes all of `data` to `fd`, giving up on an error or a peer that stops reading.
void WriteAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, kRequestTimeoutMs) <= 0) return;
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

std::string Response(const char* status, const char* type, const std::string& body) {
  return std::string("HTTP/1.0 ") + status + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         body;
}

}  // namespace

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& bind) {
  LEASH_ASSIGN_OR_RETURN(MetricsAddress address, ParseMetricsBind(bind));
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->address_ = address;
  s->registry_ = std::make_shared<prometheus::Registry>();
  const std::string listen = address.host + ":" + std::to_string(address.port);
  auto fail = [&](const std::string& why) {
    return Unavailable(
        "cannot serve metrics on " + listen + " (" + why +
        "): is the port in use or the address not on this host? Pick another --metrics-bind");
  };
  const bool v6 = address.host.front() == '[';
  s->listen_fd_ = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return fail(Errno("socket"));
  int one = 1;
  ::setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(address.port));
    inet_pton(AF_INET6, address.host.substr(1, address.host.size() - 2).c_str(), &a->sin6_addr);
    len = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(address.port));
    inet_pton(AF_INET, address.host.c_str(), &a->sin_addr);
    len = sizeof *a;
  }
  if (::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&ss), len) != 0) return fail(Errno("bind"));
  if (::listen(s->listen_fd_, 16) != 0) return fail(Errno("listen"));
  len = sizeof ss;
  if (::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return fail(Errno("getsockname"));
  s->port_ = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                      : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  s->stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->stop_fd_ < 0) return fail(Errno("eventfd"));
  MetricsServer* raw = s.get();
  s->thread_ = std::thread([raw] { raw->Serve(); });
  return s;
}

void MetricsServer::Serve() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Answer(fd);
    ::close(fd);
  }
}

// One request per connection (HTTP/1.0 style): read up to the end of the headers, within
// kMaxRequestBytes and kRequestTimeoutMs, then answer and close.
void MetricsServer::Answer(int fd) {
  std::string request;
  char buf[1024];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kRequestTimeoutMs);
  while (request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos) {
    if (request.size() >= kMaxRequestBytes) {
      WriteAll(
          fd, Response("431 Request Header Fields Too Large", "text/plain", "request too large\n"));
      return;
    }
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::steady_clock::now())
                                    .count());
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, left) <= 0) return;  // silent peer: drop it
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    request.append(buf, static_cast<size_t>(n));
  }
  const size_t line_end = request.find_first_of("\r\n");
  const std::string line = request.substr(0, line_end);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
  if (sp1 == std::string::npos) {
    WriteAll(fd, Response("400 Bad Request", "text/plain", "malformed request line\n"));
    return;
  }
  const std::string method = line.substr(0, sp1);
  std::string path =
      line.substr(sp1 + 1, sp2 == std::string::npos ? std::string::npos : sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  if (method != "GET" && method != "HEAD") {
    WriteAll(fd, Response("405 Method Not Allowed", "text/plain", "only GET /metrics is served\n"));
    return;
  }
  if (path != "/metrics" && path != "/") {
    WriteAll(fd, Response("404 Not Found", "text/plain", "only GET /metrics is served\n"));
    return;
  }
  std::string body;
  try {
    body = prometheus::TextSerializer().Serialize(registry_->Collect());
  } catch (const std::exception& e) {
    WriteAll(fd, Response("500 Internal Server Error", "text/plain", std::string(e.what()) + "\n"));
    return;
  }
  std::string response = Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", body);
  if (method == "HEAD") response.resize(response.size() - body.size());
  WriteAll(fd, response);
}

MetricsServer::~MetricsServer() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof one);
    thread_.join();
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

std::string MetricsServer::url() const {
  return "http://" + address_.host + ":" + std::to_string(port_) + "/metrics";
}

std::optional<double> CollectedValue(const prometheus::Registry& registry, const std::string& name,
                                     const std::map<std::string, std::string>& labels) {
  auto matches = [&](const prometheus::ClientMetric& m) {
    for (const auto& [k, v] : labels) {
      bool found = false;
      for (const auto& l : m.label) found = found || (l.name == k && l.value == v);
      if (!found) return false;
    }
    return true;
  };
  for (const auto& family : registry.Collect()) {
    for (const auto& m : family.metric) {
      if (!matches(m)) continue;
      switch (family.type) {
        case prometheus::MetricType::Counter:
          if (family.name == name || family.name + "_total" == name) return m.counter.value;
          break;
        case prometheus::MetricType::Gauge:
          if (family.name == name) return m.gauge.value;
          break;
        case prometheus::MetricType::Histogram:
          if (family.name + "_count" == name) return static_cast<double>(m.histogram.sample_count);
          if (family.name + "_sum" == name) return m.histogram.sample_sum;
          break;
        default:
          break;
      }
    }
  }
  return std::nullopt;
}

}  // namespace leash
