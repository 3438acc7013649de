// Tests of --metrics-bind parsing, the metrics endpoint's bind errors and CollectedValue.
#include "leash/common/metrics.h"

#include <gtest/gtest.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

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
  for (const char* bad : {"9100", ":9100", "127.0.0.1", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:65536",
                          "127.0.0.1:-1", "tcp://127.0.0.1:9100", "shard0:9100", "300.1.1.1:9100", "[::1:9100",
                          "[nothost]:9100"}) {
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

TEST(MetricsServerTest, RefusesAnAddressNotOnThisHost) {
  auto s = MetricsServer::Start("192.0.2.1:0");  // TEST-NET-1: never a local address
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(s.status().message().find("192.0.2.1"), std::string::npos) << s.status().message();
}

TEST(CollectedValueTest, ReadsCountersGaugesAndHistograms) {
  prometheus::Registry r;
  auto& c = prometheus::BuildCounter().Name("x_total").Help("x").Labels({{"shard", "1"}}).Register(r).Add({});
  auto& g = prometheus::BuildGauge().Name("y").Help("y").Register(r).Add({{"worker", "w"}});
  auto& h = prometheus::BuildHistogram().Name("z_seconds").Help("z").Register(r).Add({}, prometheus::Histogram::BucketBoundaries{1, 2});
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
