// MetricsServer: prometheus-cpp's Exposer (civetweb) behind a Status-returning factory;
// the one place where prometheus-cpp's exceptions are turned into errors.
#include "leash/common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <prometheus/exposer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <thread>

namespace leash {
namespace {

Status BadBind(const std::string& bind, const std::string& why) {
  return InvalidArgument("--metrics-bind '" + bind + "': " + why +
                         " (expected HOST:PORT, e.g. 127.0.0.1:9100 or 0.0.0.0:9100; empty turns metrics off)");
}

}  // namespace

Result<MetricsAddress> ParseMetricsBind(const std::string& bind) {
  if (bind.find("://") != std::string::npos) return BadBind(bind, "no scheme: give the address alone");
  size_t colon = bind.rfind(':');
  if (colon == std::string::npos || colon == 0) return BadBind(bind, "no host and port");
  MetricsAddress a;
  a.host = bind.substr(0, colon);
  std::string port = bind.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::atoi(port.c_str()) > 65535) {
    return BadBind(bind, "port '" + port + "' is not a number in 0..65535");
  }
  a.port = std::atoi(port.c_str());
  if (a.host == "localhost") a.host = "127.0.0.1";
  unsigned char buf[16];
  if (a.host.front() == '[') {
    if (a.host.back() != ']' || inet_pton(AF_INET6, a.host.substr(1, a.host.size() - 2).c_str(), buf) != 1) {
      return BadBind(bind, "'" + a.host + "' is not a bracketed IPv6 address");
    }
  } else if (inet_pton(AF_INET, a.host.c_str(), buf) != 1) {
    return BadBind(bind, "host '" + a.host + "' is not an IPv4 address (host names are not resolved)");
  }
  return a;
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& bind) {
  LEASH_ASSIGN_OR_RETURN(MetricsAddress address, ParseMetricsBind(bind));
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->address_ = address;
  s->registry_ = std::make_shared<prometheus::Registry>();
  std::string listen = address.host + ":" + std::to_string(address.port);
  try {
    s->exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return Unavailable("cannot serve metrics on " + listen + " (" + e.what() +
                       "): is the port in use or the address not on this host? Pick another --metrics-bind");
  }
  s->exposer_->RegisterCollectable(s->registry_);
  auto ports = s->exposer_->GetListeningPorts();
  s->port_ = ports.empty() ? address.port : ports.front();
  return s;
}

namespace {

// Opens and closes a connection to 127.0.0.1:`port` (or `host`), to wake a listener.
void Poke(const std::string& host, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (host == "0.0.0.0" || inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  close(fd);
}

}  // namespace

MetricsServer::~MetricsServer() {
  // civetweb's listener notices that it must stop only when its poll() returns, which
  // without traffic takes up to 2 s: poke it with a connection until it is gone, so
  // that a process with metrics stops as fast as one without.
  std::atomic<bool> stopped{false};
  std::thread waker;
  if (address_.host.front() != '[' && port_ > 0) {
    waker = std::thread([&] {
      for (int i = 0; i < 100 && !stopped.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (!stopped.load()) Poke(address_.host, port_);
      }
    });
  }
  exposer_.reset();
  stopped.store(true);
  if (waker.joinable()) waker.join();
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
