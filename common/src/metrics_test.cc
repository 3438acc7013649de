// Tests of --metrics-bind parsing, the metrics endpoint's bind errors and CollectedValue.
#include "leash/common/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace leash {
namespace {

TEST(MetricsBindTest, AcceptsHostAndPort) {
  auto a = ParseMetricsBind("127.0.0.1:9100");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 9100);
  ASSERT_TRUE(ParseMetricsBind("0.0.0.0:0").ok());
  auto l = ParseMetricsBind("localhost:9101");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->host, "127.0.0.1");
  auto v6 = ParseMetricsBind("[::1]:9100");
  ASSERT_TRUE(v6.ok()) << v6.status().ToString();
  EXPECT_EQ(v6->host, "[::1]");
}

TEST(MetricsBindTest, RejectsMalformedAddressesWithAHint) {
  for (const char* bad : {"9100", ":9100", "127.0.0.1", "127.0.0.1:", "127.0.0.1:http",
                          "127.0.0.1:65536", "127.0.0.1:-1", "tcp://127.0.0.1:9100", "shard0:9100",
                          "300.1.1.1:9100", "[::1:9100", "[nothost]:9100"}) {
    auto a = ParseMetricsBind(bad);
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(a.status().message().find(bad), std::string::npos) << a.status().message();
    EXPECT_NE(a.status().message().find("HOST:PORT"), std::string::npos) << a.status().message();
  }
}

TEST(MetricsServerTest, ListensOnAChosenPortAndRefusesATakenOne) {
  auto s = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_GT((*s)->port(), 0);
  EXPECT_EQ((*s)->url(), "http://127.0.0.1:" + std::to_string((*s)->port()) + "/metrics");

  std::string taken = "127.0.0.1:" + std::to_string((*s)->port());
  auto again = MetricsServer::Start(taken);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(again.status().message().find(taken), std::string::npos) << again.status().message();
}

// Connects to 127.0.0.1:port, sends `request` and returns everything the server sends
// back before it closes the connection ("" if it cannot connect).
std::string Exchange(int port, const std::string& request) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return "";
  }
  (void)!send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST(MetricsServerTest, ServesTheRegistryAsPrometheusTextAndNothingElse) {
  auto s = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  prometheus::BuildCounter()
      .Name("leash_test_events_total")
      .Help("events")
      .Register((*s)->registry())
      .Add({{"shard", "3"}})
      .Increment(5);
  const int port = (*s)->port();

  std::string ok = Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << ok;
  EXPECT_NE(ok.find("# TYPE leash_test_events_total counter"), std::string::npos) << ok;
  EXPECT_NE(ok.find("leash_test_events_total{shard=\"3\"} 5"), std::string::npos) << ok;
  const size_t body = ok.find("\r\n\r\n") + 4;
  EXPECT_NE(ok.find("Content-Length: " + std::to_string(ok.size() - body) + "\r\n"),
            std::string::npos)
      << ok;

  EXPECT_EQ(Exchange(port, "GET /other HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 404", 0), 0u);
  EXPECT_EQ(Exchange(port, "POST /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 405", 0), 0u);
  EXPECT_EQ(Exchange(port, "garbage\r\n\r\n").rfind("HTTP/1.0 400", 0), 0u);
  EXPECT_EQ(Exchange(port, "GET /metrics HTTP/1.0\r\nX: " + std::string(20000, 'a'))
                .rfind("HTTP/1.0 431", 0),
            0u);
  // A peer that connects and says nothing is dropped (after 2 s), and the next scrape is
  // served.
  int idle = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(idle, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(Exchange(port, "GET /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 200", 0), 0u);
  close(idle);
}

TEST(MetricsServerTest, RefusesAnAddressNotOnThisHost) {
  auto s = MetricsServer::Start("192.0.2.1:0");  // TEST-NET-1: never a local address
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(s.status().message().find("192.0.2.1"), std::string::npos) << s.status().message();
}

TEST(CollectedValueTest, ReadsCountersGaugesAndHistograms) {
  prometheus::Registry r;
  auto& c = prometheus::BuildCounter()
                .Name("x_total")
                .Help("x")
                .Labels({{"shard", "1"}})
                .Register(r)
                .Add({});
  auto& g = prometheus::BuildGauge().Name("y").Help("y").Register(r).Add({{"worker", "w"}});
  auto& h = prometheus::BuildHistogram()
                .Name("z_seconds")
                .Help("z")
                .Register(r)
                .Add({}, prometheus::Histogram::BucketBoundaries{1, 2});
  c.Increment(3);
  g.Set(-2.5);
  h.Observe(0.5);
  h.Observe(1.5);
  EXPECT_EQ(CollectedValue(r, "x_total"), 3);
  EXPECT_EQ(CollectedValue(r, "x_total", {{"shard", "1"}}), 3);
  EXPECT_EQ(CollectedValue(r, "x_total", {{"shard", "2"}}), std::nullopt);
  EXPECT_EQ(CollectedValue(r, "y", {{"worker", "w"}}), -2.5);
  EXPECT_EQ(CollectedValue(r, "z_seconds_count"), 2);
  EXPECT_EQ(CollectedValue(r, "z_seconds_sum"), 2);
  EXPECT_EQ(CollectedValue(r, "nothing"), std::nullopt);
}

}  // namespace
}  // namespace leash
