// leash-bench-failover: the pushing client of bench/replication.py. It pushes known
// gradients to one SGD (lr 1) table, one push in flight, through a leash::Client that
// follows the shard directory in etcd (--etcd, replicated shards) or talks to fixed shards
// (--servers), while the benchmark SIGKILLs shards. Push k adds 1 to element k mod N, so
// the final table, pulled when it stops (SIGTERM, or after --seconds), tells how many
// acknowledged pushes were lost and how many applied twice. It also writes the wall-clock
// gaps between consecutive acknowledgements longer than --gap-ms: the stall after a kill is
// the gap holding the kill (each printed as "gap FROM_MS TO_MS" when it ends). Writes JSON
// to --out. The pushing loop runs on the main thread.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "leash/common/etcd_coordinator.h"
#include "leash/common/flags.h"
#include "leash/common/logging.h"
#include "leash/common/zmq_transport.h"
#include "leash/worker/client.h"

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int Fail(const std::string& what, const leash::Status& st) {
  std::fprintf(stderr, "leash-bench-failover: %s: %s\n", what.c_str(), st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string etcd;
  std::string job = leash::EtcdOptions{}.job;
  std::string servers;
  std::string out = "failover.json";
  int64_t floats = 1024;
  double seconds = 600;
  int64_t gap_ms = 50;
  double rate = 0;
  leash::Flags flags("leash-bench-failover",
                     "Pushes known gradients while shards are killed; counts lost and doubled "
                     "acknowledged pushes and the gaps between acknowledgements.");
  flags.String("etcd", &etcd, "etcd client URL of replicated shards (follows their primaries)");
  flags.String("job", &job, "with --etcd: the job's name in etcd");
  flags.String("servers", &servers, "fixed shard endpoints instead of --etcd");
  flags.String("out", &out, "JSON results file");
  flags.Int("floats", &floats, "floats per push (the table's size; a multiple of 64)");
  flags.Double("seconds", &seconds, "stop after this long at the latest (SIGTERM stops it too)");
  flags.Int("gap-ms", &gap_ms, "report gaps between acknowledgements longer than this");
  flags.Double("rate", &rate, "at most this many pushes per second (0: as fast as acknowledged)");
  if (auto code = flags.ParseOrExitCode(argc, argv)) return *code;
  if (etcd.empty() == servers.empty() || floats < 64 || floats % 64 != 0) {
    std::fprintf(stderr,
                 "leash-bench-failover: pass one of --etcd or --servers, and --floats a "
                 "multiple of 64\n");
    return 2;
  }
  if (auto st = leash::InitLogging("probe", "info"); !st.ok()) return Fail("logging", st);
  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);
  leash::ZmqContext ctx;
  leash::ClientOptions co;
  co.name = "failover-probe";
  co.connect_timeout_ms = 60000;
  std::vector<std::string> endpoints = leash::SplitList(servers);
  if (!etcd.empty()) {
    leash::EtcdOptions eo;
    eo.job = job;
    auto parsed = leash::ParseEtcdEndpoints(etcd);
    if (!parsed.ok()) return Fail("--etcd", parsed.status());
    eo.endpoints = std::move(*parsed);
    auto directory = leash::NewEtcdShardDirectory(eo);
    if (!directory.ok()) return Fail("--etcd", directory.status());
    co.directory = std::move(*directory);
    auto view = leash::ResolvePrimaries(*co.directory, 60000);
    if (!view.ok()) return Fail("cannot find the shards in etcd", view.status());
    endpoints = leash::PrimaryEndpoints(*view);
    co.directory_view = std::move(*view);
  }
  auto transport = leash::ConnectZmqClient(ctx, endpoints, {});
  if (!transport.ok()) return Fail("connect", transport.status());
  auto client = leash::Client::Connect(std::move(*transport), co);
  if (!client.ok()) return Fail("connect", client.status());
  leash::TableSpec t;
  t.name = "failover_probe";
  t.cols = 64;
  t.rows = static_cast<uint64_t>(floats / 64);
  t.optimizer.kind = leash::OptimizerKind::kSgd;
  t.optimizer.lr = 1.f;
  auto table = (*client)->CreateTable(t);
  if (!table.ok()) return Fail("create table", table.status());

  const auto n = static_cast<size_t>(floats);
  std::vector<float> grad(n, 0.f);
  std::vector<int64_t> expected(n, 0);
  std::vector<std::pair<int64_t, int64_t>> gaps;  // (last ack before, first ack after), ms
  const int64_t start_ms = WallMs();
  int64_t last_ack_ms = start_ms;
  int64_t acked = 0;
  std::printf("pushing\n");
  std::fflush(stdout);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  auto next_push = std::chrono::steady_clock::now();
  const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(rate > 0 ? 1.0 / rate : 0.0));
  while (!g_stop.load() && std::chrono::steady_clock::now() < until) {
    if (rate > 0) {
      std::this_thread::sleep_until(next_push);
      next_push = std::max(next_push + period, std::chrono::steady_clock::now() - period);
    }
    const size_t j = static_cast<size_t>(acked) % n;
    grad[j] = 1.f;
    leash::Status st = (*client)->Push(*table, grad.data()).get();
    grad[j] = 0.f;
    if (!st.ok()) return Fail("push " + std::to_string(acked), st);
    const int64_t now = WallMs();
    if (now - last_ack_ms > gap_ms) {
      gaps.emplace_back(last_ack_ms, now);
      std::printf("gap %lld %lld\n", static_cast<long long>(last_ack_ms),
                  static_cast<long long>(now));
      std::fflush(stdout);
    }
    last_ack_ms = now;
    ++expected[j];
    ++acked;
  }
  std::vector<float> values(n);
  if (leash::Status st = (*client)->Pull(*table, values.data()).get(); !st.ok()) {
    return Fail("final pull", st);
  }
  int64_t lost = 0;
  int64_t doubled = 0;
  for (size_t j = 0; j < n; ++j) {
    const auto applied = static_cast<int64_t>(-values[j]);  // SGD at lr 1 subtracts each push
    lost += std::max<int64_t>(0, expected[j] - applied);
    doubled += std::max<int64_t>(0, applied - expected[j]);
  }
  const auto counters = (*client)->counters();
  std::ofstream f(out);
  f << "{\"acknowledged\": " << acked << ", \"lost\": " << lost << ", \"doubled\": " << doubled
    << ", \"floats\": " << floats << ", \"start_ms\": " << start_ms
    << ", \"end_ms\": " << last_ack_ms << ", \"resends\": " << counters.resends
    << ", \"gaps_ms\": [";
  for (size_t i = 0; i < gaps.size(); ++i) {
    f << (i ? ", " : "") << "[" << gaps[i].first << ", " << gaps[i].second << "]";
  }
  f << "]}\n";
  std::printf("%lld pushes acknowledged, %lld lost, %lld applied twice\n",
              static_cast<long long>(acked), static_cast<long long>(lost),
              static_cast<long long>(doubled));
  return f.good() ? 0 : 1;
}
