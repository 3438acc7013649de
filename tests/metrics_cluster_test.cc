// End-to-end: a real leash-server and leash-worker serve Prometheus metrics on loopback
// (--metrics-bind) while they train; the test scrapes /metrics over plain HTTP, checks
// the text format and that the counters moved. Bad --metrics-bind values fail cleanly.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "support/process.h"
#include "support/scrape.h"

namespace leash {
namespace {

using namespace std::chrono_literals;
using testing::Endpoint;
using testing::FreePort;
using testing::HttpGet;
using testing::ParsePrometheusText;
using testing::Process;
using testing::Scrape;
using testing::ScrapeWhen;
using testing::TempDir;
using testing::WaitFor;

constexpr const char* kData = "/usr/share/datasets/fashion-mnist";
// Every wait below is for an event (a metric reaching a value); this deadline only ends a
// run that is stuck, however loaded the machine.
constexpr auto kStuck = 300s;

double Value(const Scrape& s, const std::string& name, const std::string& label,
             const std::string& value) {
  auto v = s.Find(name, label, value);
  EXPECT_TRUE(v.has_value()) << name << "{" << label << "=\"" << value << "\"} missing";
  return v.value_or(NAN);
}

std::vector<std::string> ServerArgs(int port, int metrics_port, const std::string& dir) {
  return {LEASH_SERVER_BIN,
          "--bind=" + Endpoint(port),
          "--data-dir=" + dir + "/shard0",
          "--no-sync",
          "--lease-timeout=5s",
          "--checkpoint-interval=1s",
          "--metrics-bind=127.0.0.1:" + std::to_string(metrics_port)};
}

TEST(MetricsEndToEndTest, ShardAndWorkerPublishTrainingProgress) {
  if (!std::filesystem::exists(std::string(kData) + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST not found at " << kData
                 << " (apt-get install dataset-fashion-mnist)";
  }
  TempDir dir;
  int port = FreePort(), shard_metrics = FreePort(), worker_metrics = FreePort();
  Process shard(ServerArgs(port, shard_metrics, dir.path()), dir.path() + "/shard0.log");
  ASSERT_TRUE(WaitFor([&] { return HttpGet(shard_metrics, "/metrics", 1000).ok(); }, kStuck))
      << shard.ReadLog();

  Process worker({LEASH_WORKER_BIN, "--servers=" + Endpoint(port), "--name=w0", "--staleness=1",
                  "--epochs=1000", "--train-limit=2000", "--chunk-size=500", "--no-eval",
                  "--log-every=0", "--metrics-bind=127.0.0.1:" + std::to_string(worker_metrics)},
                 dir.path() + "/w0.log");
  // Wait until the worker has trained past its first job epoch (2000 samples) and has
  // heard that the epoch is done; the checks below read this very scrape.
  auto scraped_w = ScrapeWhen(
      worker_metrics,
      [](const Scrape& s) {
        return s.Find("leash_worker_iterations_total").value_or(0) >= 20 &&
               s.Find("leash_worker_samples_total").value_or(0) >= 2600 &&
               s.Find("leash_worker_epochs_done").value_or(0) >= 1;
      },
      kStuck);
  ASSERT_TRUE(scraped_w.ok()) << scraped_w.status().ToString() << "\n" << worker.ReadLog();
  Scrape w = *scraped_w;
  EXPECT_EQ(w.types["leash_worker_samples_per_second"], "gauge");
  EXPECT_EQ(w.types["leash_worker_pushes_total"], "counter");
  EXPECT_EQ(w.types["leash_worker_iteration_duration_seconds"], "histogram");
  EXPECT_GT(Value(w, "leash_worker_samples_per_second", "worker", "w0"), 0);
  double loss = Value(w, "leash_worker_loss", "worker", "w0");
  EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
  const double worker_pushes = Value(w, "leash_worker_pushes_total", "worker", "w0");
  EXPECT_GT(worker_pushes, 0);
  EXPECT_GT(Value(w, "leash_worker_pulls_total", "worker", "w0"), 0);
  EXPECT_GT(Value(w, "leash_worker_sent_bytes_total", "worker", "w0"), 0);
  EXPECT_GT(Value(w, "leash_worker_received_bytes_total", "worker", "w0"), 0);
  EXPECT_GE(Value(w, "leash_worker_clock", "worker", "w0"), 20);
  double staleness = Value(w, "leash_worker_staleness_iterations", "worker", "w0");
  EXPECT_GE(staleness, 0);
  EXPECT_LE(staleness, 2);  // bound 1, plus the iteration whose pull was prefetched
  EXPECT_EQ(Value(w, "leash_worker_staleness_bound", "worker", "w0"), 1);
  EXPECT_GT(Value(w, "leash_worker_iteration_duration_seconds_count", "worker", "w0"), 0);
  EXPECT_EQ(Value(w, "leash_worker_iteration_duration_seconds_bucket", "le", "+Inf"),
            Value(w, "leash_worker_iteration_duration_seconds_count", "worker", "w0"));

  // The worker counts a push when it sends it, the shard when it has applied it: wait
  // until the shard has applied every push of that scrape (one shard: each worker push is
  // one shard push), has written a snapshot (every second; its histogram then has a
  // sample) and has counted the epoch done.
  auto scraped_s = ScrapeWhen(
      shard_metrics,
      [&](const Scrape& s) {
        return s.Find("leash_shard_pushes_total", "shard", "0").value_or(0) >= worker_pushes &&
               s.Find("leash_shard_snapshots_total", "shard", "0").value_or(0) >= 1 &&
               s.Find("leash_job_epochs_done", "shard", "0").value_or(0) >= 1;
      },
      kStuck);
  ASSERT_TRUE(scraped_s.ok()) << scraped_s.status().ToString() << "\n" << shard.ReadLog();
  Scrape s = *scraped_s;
  EXPECT_EQ(s.types["leash_shard_pushes_total"], "counter");
  EXPECT_EQ(s.types["leash_shard_live_workers"], "gauge");
  EXPECT_EQ(s.types["leash_shard_snapshot_duration_seconds"], "histogram");
  EXPECT_GT(Value(s, "leash_shard_pulls_total", "shard", "0"), 0);
  EXPECT_GT(Value(s, "leash_shard_received_bytes_total", "shard", "0"), 0);
  EXPECT_GT(Value(s, "leash_shard_sent_bytes_total", "shard", "0"), 0);
  EXPECT_EQ(Value(s, "leash_shard_live_workers", "shard", "0"), 1);
  EXPECT_GE(Value(s, "leash_shard_min_clock", "shard", "0"), 0);
  EXPECT_GE(Value(s, "leash_shard_staleness_iterations", "shard", "0"), 0);
  EXPECT_GE(Value(s, "leash_shard_parked_pulls", "shard", "0"), 0);
  EXPECT_EQ(Value(s, "leash_shard_errors_total", "shard", "0"), 0);
  // The worker is on this host: its pushes (0.94 MB) come through shared memory, whose copy
  // out checks them for NaN and Inf, so the shard does not read them again.
  EXPECT_GT(Value(s, "leash_shard_pushes_checked_in_copy_total", "shard", "0"), 0);
  // The histogram observes a snapshot in the same step that counts it.
  EXPECT_GE(Value(s, "leash_shard_snapshot_duration_seconds_count", "shard", "0"), 1);

  // A worker that leaves is no longer live: the shard drops it on its leave message, not
  // when its lease runs out.
  worker.Signal(SIGTERM);
  ASSERT_EQ(worker.Wait(kStuck), 0) << worker.ReadLog();
  auto gone = ScrapeWhen(
      shard_metrics,
      [](const Scrape& s) { return s.Find("leash_shard_live_workers", "shard", "0") == 0.0; },
      kStuck);
  EXPECT_TRUE(gone.ok()) << gone.status().ToString();
  EXPECT_NE(shard.ReadLog().find("'w0' left"), std::string::npos) << shard.ReadLog();
  EXPECT_EQ(shard.ReadLog().find("evicting worker"), std::string::npos) << shard.ReadLog();
  shard.Signal(SIGTERM);
  ASSERT_EQ(shard.Wait(kStuck), 0) << shard.ReadLog();
}

// The test's reader of the text format is strict: what it accepts, Prometheus accepts.
TEST(PrometheusTextTest, ReadsSamplesAndRejectsMalformedLines) {
  auto ok = ParsePrometheusText(
      "# HELP a_total A.\n# TYPE a_total counter\na_total{shard=\"0\"} 3\n"
      "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1.5e-3\nh_count 2\n"
      "# TYPE s summary\ns{quantile=\"0.5\"} Nan\ns_count 0\n");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->Find("a_total", "shard", "0"), 3);
  EXPECT_EQ(ok->Find("h_count"), 2);
  EXPECT_EQ(ok->Find("h_sum"), 1.5e-3);
  EXPECT_EQ(ok->types.at("h"), "histogram");
  for (const char* bad : {"a_total 3\n",                       // no TYPE before it
                          "# TYPE a counter\na{shard=0} 3\n",  // unquoted label value
                          "# TYPE a counter\na 3x\n",          // not a number
                          "# TYPE a countr\na 3\n",            // unknown type
                          "# TYPE a counter\na\n"}) {          // no value
    EXPECT_FALSE(ParsePrometheusText(bad).ok()) << bad;
  }
}

// Holds a listening TCP socket on a free loopback port.
class TakenPort {
 public:
  TakenPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~TakenPort() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

struct Outcome {
  int code = -1;
  std::string log;
};

Outcome RunToExit(std::vector<std::string> argv, const std::string& log) {
  Process p(std::move(argv), log);
  auto code = p.Wait(30s);
  EXPECT_TRUE(code.has_value()) << "still running: " << p.ReadLog();
  return {code.value_or(-1), p.ReadLog()};
}

TEST(MetricsEndToEndTest, BadMetricsBindExitsWithAClearMessage) {
  TempDir dir;
  TakenPort taken;
  std::string in_use = "127.0.0.1:" + std::to_string(taken.port());
  int port = FreePort();
  std::vector<std::string> server = {LEASH_SERVER_BIN, "--bind=" + Endpoint(port),
                                     "--data-dir=" + dir.path() + "/s"};
  std::vector<std::string> worker = {LEASH_WORKER_BIN, "--servers=" + Endpoint(port),
                                     "--connect-timeout=2"};

  int n = 0;
  for (const auto& base : {server, worker}) {
    // Malformed: a flag error, exit 2, naming the value and the expected form.
    auto argv = base;
    argv.push_back("--metrics-bind=tcp://0.0.0.0:9100");
    Outcome bad = RunToExit(argv, dir.path() + "/bad" + std::to_string(n) + ".log");
    EXPECT_EQ(bad.code, 2) << bad.log;
    EXPECT_NE(bad.log.find("--metrics-bind 'tcp://0.0.0.0:9100'"), std::string::npos) << bad.log;
    EXPECT_NE(bad.log.find("HOST:PORT"), std::string::npos) << bad.log;

    // Port in use: exit 1, naming the address.
    argv = base;
    argv.push_back("--metrics-bind=" + in_use);
    Outcome busy = RunToExit(argv, dir.path() + "/busy" + std::to_string(n) + ".log");
    EXPECT_EQ(busy.code, 1) << busy.log;
    EXPECT_NE(busy.log.find("cannot serve metrics on " + in_use), std::string::npos) << busy.log;
    EXPECT_EQ(busy.log.find("terminate called"), std::string::npos) << busy.log;
    ++n;
  }

  // The environment twin is read too.
  setenv("LEASH_METRICS_BIND", "127.0.0.1:notaport", 1);
  Outcome env = RunToExit(server, dir.path() + "/env.log");
  unsetenv("LEASH_METRICS_BIND");
  EXPECT_EQ(env.code, 2) << env.log;
  EXPECT_NE(env.log.find("127.0.0.1:notaport"), std::string::npos) << env.log;
}

}  // namespace
}  // namespace leash
