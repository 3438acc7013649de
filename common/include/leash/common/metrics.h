// The Prometheus endpoint of a process (leash-server, leash-worker): a registry of
// metrics and an HTTP server answering GET /metrics with it in the Prometheus text
// format (prometheus-cpp). Only executables link this; the server and client libraries
// know nothing of Prometheus, their main.cc copies their counters into the registry.
// Thread-safe: the registry and its metrics may be updated from any thread while the
// HTTP server's own thread serializes them for a scrape.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "leash/common/status.h"

namespace leash {

struct MetricsAddress {
  std::string host;  // an IPv4 address, or an IPv6 address in brackets: "[::1]"
  int port = 0;      // 0: any free port (MetricsServer::port() tells which)
};

// Parses "HOST:PORT" as given to --metrics-bind: HOST is an IPv4 address, "localhost"
// (127.0.0.1) or a bracketed IPv6 address, PORT 0..65535. InvalidArgument saying what
// is wrong and what a valid value looks like otherwise.
Result<MetricsAddress> ParseMetricsBind(const std::string& bind);

class MetricsServer {
 public:
  // Serves the registry at http://`bind`/metrics. InvalidArgument for a malformed
  // address; Unavailable naming the address when it cannot be bound (port in use,
  // address not on this host, no permission).
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& bind);
  ~MetricsServer();  // stops the HTTP server before the registry goes away
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  prometheus::Registry& registry() { return *registry_; }
  // The port actually listened on (the chosen one for port 0).
  int port() const { return port_; }
  // "http://HOST:PORT/metrics", for logs.
  std::string url() const;

 private:
  MetricsServer() = default;
  void Serve();         // the HTTP thread: accepts until stop_fd_ is written
  void Answer(int fd);  // one request on an accepted connection

  std::shared_ptr<prometheus::Registry> registry_;
  MetricsAddress address_;
  int port_ = 0;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  std::thread thread_;
};

// Mirrors a running total that a component keeps itself (a shard's, a replica's or a
// client's count) into `counter`: adds what `total` grew by since `published`, and records
// it. A total below `published` means its owner started over (a replica's new Shard after a
// snapshot installation): the counter goes on from 0, counting the new total whole.
template <typename T>
void AdvanceCounter(prometheus::Counter& counter, T total, T& published) {
  if (total < published) published = T{};
  if (total > published) {
    counter.Increment(static_cast<double>(total - published));
    published = total;
  }
}

// The value of the sample `name` with label values containing every pair of `labels`
// (a counter, gauge, or a histogram's _count / _sum), as a scrape would show it now;
// nullopt if the registry has none. For tests and diagnostics.
std::optional<double> CollectedValue(const prometheus::Registry& registry, const std::string& name,
                                     const std::map<std::string, std::string>& labels = {});

}  // namespace leash
