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
#include <optional>

#include "leash/common/curve_keys.h"
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
  bool no_shm = false;
  std::string nonfinite = "reject";
  int64_t max_keys = int64_t{1} << 24;
  int64_t max_parked = 4096;
  std::string metrics_bind;
  std::string curve_keys;
  int64_t max_queued_reply_mb = 1024;
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
  flags.Int("max-queued-reply-mb", &max_queued_reply_mb,
            "replies queued for one connection that does not read them, in MiB, before further ones are dropped");
  flags.String("curve-keys", &curve_keys,
               "CURVE keys directory (leashctl keygen): encrypt all traffic, accept only clients whose key is in "
               "DIR/authorized/");
  flags.Bool("no-shm", &no_shm, "refuse shared memory with workers on this host (everything through the socket)");
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
      max_message_mb < 1 || max_keys < 1 || max_parked < 1 ||
      max_queued_reply_mb < 1) {
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

  std::optional<leash::CurveKeys> curve;
  if (!curve_keys.empty()) {
    auto keys = leash::LoadCurveServerKeys(curve_keys);
    if (!keys.ok()) {
      spdlog::error("--curve-keys: {}", keys.status().message());
      return 2;
    }
    curve = std::move(*keys);
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
  zo.curve = curve;
  zo.max_queued_bytes_per_peer = max_queued_reply_mb << 20;
  zo.shared_memory = !no_shm;
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
  bool loopback = leash::IsLoopbackEndpoint(bind);
  if (curve) {
    spdlog::info("CURVE security on: traffic encrypted, {} authorized client key(s) from {}/authorized", curve->authorized.size(),
                 curve_keys);
  } else if (!loopback) {
    spdlog::warn("listening on {} WITHOUT CURVE keys: traffic is unauthenticated and unencrypted, anyone who can reach "
                 "this port can read and change the model; use --curve-keys DIR (leashctl keygen DIR)",
                 bind);
  }
  if (loopback) {
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
  auto tc = (*transport)->counters();
  const auto& sc = shard_obj.counters();
  spdlog::info("shard {} stopped cleanly at clock {}; refused: {} limit rejections ({} oversize, {} too many keys, {} "
               "too many parked pulls), {} CURVE keys refused, {} failed handshakes, {} replies dropped (unread queue)",
               shard, shard_obj.min_clock(), sc.limit_rejections, sc.oversize_rejections, sc.key_limit_rejections,
               sc.parked_limit_rejections, tc.auth_refused, tc.handshake_failed, tc.replies_dropped);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
