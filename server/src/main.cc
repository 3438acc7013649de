// leash-server: runs one parameter-server shard on a ZeroMQ ROUTER, with its tables
// persisted in RocksDB under --data-dir, and (with --metrics-bind) its Prometheus metrics
// on HTTP. SIGTERM/SIGINT: final snapshot, then exit 0.
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <functional>
#include <memory>

#include "leash/common/flags.h"
#include "leash/common/logging.h"
#include "leash/common/metrics.h"
#include "leash/common/zmq_transport.h"
#include "leash/server/rocksdb_store.h"
#include "leash/server/shard.h"
#include "leash/server/shard_metrics.h"

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int Run(int argc, char** argv) {
  std::string bind = "tcp://127.0.0.1:7000";
  std::string data_dir = "./run/shard0";
  std::string lease = "10s";
  std::string checkpoint = "60s";
  std::string log_level = "info";
  int64_t shard = 0;
  int64_t num_shards = 1;
  int64_t max_message_mb = 512;
  bool no_sync = false;
  std::string nonfinite = "reject";
  int64_t max_keys = int64_t{1} << 24;
  int64_t max_parked = 4096;
  std::string metrics_bind;
  leash::Flags flags("leash-server", "Runs one Leash parameter-server shard.");
  flags.Int("shard", &shard, "index of this shard, 0..num-shards-1");
  flags.Int("num-shards", &num_shards, "number of shards in the job");
  flags.String("bind", &bind, "ZeroMQ endpoint to listen on, e.g. tcp://0.0.0.0:7000");
  flags.String("data-dir", &data_dir, "RocksDB directory holding this shard's snapshots");
  flags.String("lease-timeout", &lease, "evict a worker silent for this long (e.g. 10s, 500ms)");
  flags.String("checkpoint-interval", &checkpoint, "snapshot period (e.g. 60s); 0 disables periodic snapshots");
  flags.Int("max-message-mb", &max_message_mb, "largest request accepted, in MiB");
  flags.Bool("no-sync", &no_sync, "do not fsync snapshots (faster, less durable)");
  flags.String("nonfinite", &nonfinite, "pushes holding NaN/Inf: reject (the whole push) or skip-rows (apply the rest)");
  flags.Int("max-keys", &max_keys, "most keys one request may name");
  flags.Int("max-parked-per-peer", &max_parked, "most pulls one connection may have waiting for the staleness bound");
  flags.String("metrics-bind", &metrics_bind,
               "serve Prometheus metrics at http://HOST:PORT/metrics, e.g. 0.0.0.0:9100 (empty: no metrics)");
  flags.String("log-level", &log_level, "trace, debug, info, warn or error");
  if (auto st = flags.Parse(argc, argv); !st.ok()) {
    std::fprintf(stderr, "leash-server: %s\n", st.message().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  if (auto st = leash::InitLogging("server", log_level); !st.ok()) {
    std::fprintf(stderr, "leash-server: %s\n", st.message().c_str());
    return 2;
  }
  auto lease_ms = leash::ParseDurationMs(lease);
  auto ckpt_ms = leash::ParseDurationMs(checkpoint);
  if (nonfinite != "reject" && nonfinite != "skip-rows") {
    spdlog::error("--nonfinite must be reject or skip-rows, not '{}'", nonfinite);
    return 2;
  }
  if (!lease_ms.ok() || !ckpt_ms.ok() || num_shards < 1 || shard < 0 || shard >= num_shards || *lease_ms < 10 ||
      max_message_mb < 1 || max_keys < 1 || max_parked < 1) {
    spdlog::error("bad flags: need 0 <= --shard < --num-shards, --lease-timeout >= 10ms, valid durations ({} {})",
                  lease_ms.status().ToString(), ckpt_ms.status().ToString());
    return 2;
  }
  // Declared before the shard so the registry outlives it (and its last snapshot).
  std::unique_ptr<leash::MetricsServer> metrics_server;
  if (!metrics_bind.empty()) {
    if (auto a = leash::ParseMetricsBind(metrics_bind); !a.ok()) {
      spdlog::error("{}", a.status().message());
      return 2;
    }
    auto m = leash::MetricsServer::Start(metrics_bind);
    if (!m.ok()) {
      spdlog::error("{}", m.status().ToString());
      return 1;
    }
    metrics_server = std::move(*m);
  }

  leash::server::RocksDbStoreOptions so;
  so.path = data_dir;
  so.shard = static_cast<uint32_t>(shard);
  so.num_shards = static_cast<uint32_t>(num_shards);
  so.sync = !no_sync;
  auto store = leash::server::OpenRocksDbStore(so);
  if (!store.ok()) {
    spdlog::error("cannot open data directory: {}", store.status().ToString());
    return 1;
  }

  leash::server::ShardOptions opts;
  opts.shard = so.shard;
  opts.num_shards = so.num_shards;
  opts.lease_ms = *lease_ms;
  opts.checkpoint_interval_ms = *ckpt_ms;
  opts.max_message_bytes = static_cast<size_t>(max_message_mb) << 20;
  opts.limits.max_keys = static_cast<size_t>(max_keys);
  opts.limits.max_header_bytes = std::max<size_t>(opts.limits.max_header_bytes, static_cast<size_t>(max_keys) * 8 + 4096);
  opts.max_parked_per_peer = static_cast<size_t>(max_parked);
  opts.nonfinite = nonfinite == "reject" ? leash::server::NonFinitePolicy::kReject : leash::server::NonFinitePolicy::kSkipRows;
  leash::server::Shard shard_obj(opts, store->get(), SteadyMs);
  auto recovered = shard_obj.Recover();
  if (!recovered.ok()) {
    spdlog::error("cannot recover from {}: {}", data_dir, recovered.status().ToString());
    return 1;
  }

  leash::ZmqContext ctx;
  leash::ZmqOptions zo;
  zo.max_message_bytes = static_cast<int64_t>(opts.max_message_bytes) * 2;
  auto transport = leash::BindZmqServer(ctx, bind, zo);
  if (!transport.ok()) {
    spdlog::error("{}", transport.status().ToString());
    return 1;
  }
  std::unique_ptr<leash::server::ShardMetrics> metrics;
  if (metrics_server) {
    metrics = std::make_unique<leash::server::ShardMetrics>(metrics_server->registry(), shard_obj);
    spdlog::info("metrics on {}", metrics_server->url());
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  if (bind.find("127.0.0.1") != std::string::npos || bind.find("localhost") != std::string::npos) {
    spdlog::info("bound to loopback only: other hosts cannot reach this shard (use --bind tcp://0.0.0.0:PORT for a cluster)");
  }
  spdlog::info("shard {}/{} listening on {} (data {}, lease {} ms, snapshots every {} ms, {})", shard, num_shards,
               bind, data_dir, *lease_ms, *ckpt_ms,
               *recovered >= 0 ? "recovered at clock " + std::to_string(*recovered) : std::string("fresh start"));
  std::function<void(const leash::server::Shard&)> publish;
  if (metrics) publish = [&](const leash::server::Shard& s) { metrics->Publish(s); };
  leash::Status st = leash::server::Serve(shard_obj, **transport, g_stop, publish);
  if (!st.ok()) {
    spdlog::error("shard stopped: {}", st.ToString());
    return 1;
  }
  spdlog::info("shard {} stopped cleanly at clock {}", shard, shard_obj.min_clock());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
