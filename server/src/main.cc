// leash-server: runs one parameter-server shard on a ZeroMQ ROUTER, with its tables
// persisted in RocksDB under --data-dir, and (with --metrics-bind) its Prometheus metrics
// on HTTP. SIGTERM/SIGINT: final snapshot, then exit 0. Configuration in config.h; this
// file only wires the parts.
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>

#include "config.h"
#include "leash/common/cli.h"
#include "leash/common/curve_keys.h"
#include "leash/common/metrics.h"
#include "leash/common/zmq_transport.h"
#include "leash/server/rocksdb_row_store.h"
#include "leash/server/rocksdb_store.h"
#include "leash/server/shard.h"
#include "leash/server/shard_metrics.h"

namespace {

using leash::server::ServerConfig;

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A shard's parts, built from its config. Members are destroyed in the reverse order:
// the metrics registry outlives the shard (and its last snapshot), the store outlives
// the shard.
struct Server {
  std::unique_ptr<leash::MetricsServer> metrics_server;
  std::optional<leash::CurveKeys> curve;
  std::unique_ptr<leash::server::SnapshotStore> store;
  std::unique_ptr<leash::server::SparseStore> sparse;
  std::unique_ptr<leash::server::Shard> shard;
  int64_t recovered_clock = -1;
  leash::ZmqContext zmq;
  std::unique_ptr<leash::ServerTransport> transport;
  std::unique_ptr<leash::server::ShardMetrics> metrics;
};

// Builds the metrics endpoint, the CURVE keys, the store, the recovered shard and the
// transport. Returns the exit code on failure (after logging why): 2 for bad keys, else 1.
std::optional<int> Build(const ServerConfig& c, Server& s) {
  if (!c.metrics_bind.empty()) {
    auto m = leash::MetricsServer::Start(c.metrics_bind);
    if (!m.ok()) {
      spdlog::error("{}", m.status().ToString());
      return 1;
    }
    s.metrics_server = std::move(*m);
  }
  if (!c.curve_keys.empty()) {
    auto keys = leash::LoadCurveServerKeys(c.curve_keys);
    if (!keys.ok()) {
      spdlog::error("--curve-keys: {}", keys.status().message());
      return 2;
    }
    s.curve = std::move(*keys);
  }

  leash::server::RocksDbStoreOptions so;
  so.path = c.data_dir;
  so.shard = static_cast<uint32_t>(c.shard);
  so.num_shards = static_cast<uint32_t>(c.num_shards);
  so.sync = c.sync;
  auto store = leash::server::OpenRocksDbStore(so);
  if (!store.ok()) {
    spdlog::error("cannot open data directory: {}", store.status().ToString());
    return 1;
  }
  s.store = std::move(*store);

  // With a memory budget, two malloc arenas instead of glibc's eight per core: each reader
  // and RocksDB thread otherwise keeps an arena of its own whose freed blocks stay resident
  // (measured at a 180 MB budget, 5M rows: 465 MB RSS with the default arenas, 370 MB with
  // two). MALLOC_ARENA_MAX in the environment still wins.
  if (c.memory_budget_bytes > 0 && std::getenv("MALLOC_ARENA_MAX") == nullptr) {
    mallopt(M_ARENA_MAX, 2);
  }

  // The sparse tables' cold tier, beside the snapshots (after them: the snapshot store
  // wants its directory empty or its own when it first opens).
  const leash::server::MemoryBudgetSplit split =
      leash::server::SplitMemoryBudget(c.memory_budget_bytes);
  leash::server::RocksDbRowStoreOptions ro;
  ro.path = c.data_dir + "/sparse";
  ro.block_cache_bytes = split.block_cache;
  ro.write_buffer_bytes = split.write_buffer;
  ro.readers = static_cast<int>(c.sparse_readers);
  ro.direct_reads = c.sparse_direct_reads;
  auto sparse = leash::server::OpenRocksDbRowStore(ro);
  if (!sparse.ok()) {
    spdlog::error("cannot open the sparse store: {}", sparse.status().ToString());
    return 1;
  }
  s.sparse = std::move(*sparse);

  leash::server::ShardOptions opts;
  opts.shard = so.shard;
  opts.num_shards = so.num_shards;
  opts.lease_ms = c.lease_ms;
  opts.checkpoint_interval_ms = c.checkpoint_interval_ms;
  opts.max_message_bytes = static_cast<size_t>(c.max_message_mb) << 20;
  opts.limits.max_keys = static_cast<size_t>(c.max_keys);
  opts.limits.max_header_bytes =
      std::max<size_t>(opts.limits.max_header_bytes, static_cast<size_t>(c.max_keys) * 8 + 4096);
  opts.max_parked_per_peer = static_cast<size_t>(c.max_parked_per_peer);
  opts.nonfinite = c.nonfinite;
  opts.memory_budget_bytes = c.memory_budget_bytes;
  opts.backup_workers = static_cast<uint32_t>(c.backup_workers);
  s.shard = std::make_unique<leash::server::Shard>(opts, s.store.get(), SteadyMs, s.sparse.get());
  auto recovered = s.shard->Recover();
  if (!recovered.ok()) {
    spdlog::error("cannot recover from {}: {}", c.data_dir, recovered.status().ToString());
    return 1;
  }
  s.recovered_clock = *recovered;

  leash::ZmqOptions zo;
  zo.max_message_bytes = static_cast<int64_t>(opts.max_message_bytes) * 2;
  zo.curve = s.curve;
  zo.max_queued_bytes_per_peer = c.max_queued_reply_mb << 20;
  zo.shared_memory = c.shared_memory;
  auto transport = leash::BindZmqServer(s.zmq, c.bind, zo);
  if (!transport.ok()) {
    spdlog::error("{}", transport.status().ToString());
    return 1;
  }
  s.transport = std::move(*transport);
  if (s.metrics_server) {
    s.metrics =
        std::make_unique<leash::server::ShardMetrics>(s.metrics_server->registry(), *s.shard);
    spdlog::info("metrics on {}", s.metrics_server->url());
  }
  return std::nullopt;
}

// Logs how the shard is reachable and secured.
void LogStart(const ServerConfig& c, const Server& s) {
  bool loopback = leash::IsLoopbackEndpoint(c.bind);
  if (s.curve) {
    spdlog::info(
        "CURVE security on: traffic encrypted, {} authorized client key(s) from "
        "{}/authorized",
        s.curve->authorized.size(), c.curve_keys);
  } else if (!loopback) {
    spdlog::warn(
        "listening on {} WITHOUT CURVE keys: traffic is unauthenticated and "
        "unencrypted, anyone who can reach this port can read and change the model; "
        "use --curve-keys DIR (leashctl keygen DIR)",
        c.bind);
  }
  if (loopback) {
    spdlog::info(
        "bound to loopback only: other hosts cannot reach this shard (use --bind "
        "tcp://0.0.0.0:PORT for a cluster)");
  }
  spdlog::info("shard {}/{} listening on {} (data {}, lease {} ms, snapshots every {} ms, {})",
               c.shard, c.num_shards, c.bind, c.data_dir, c.lease_ms, c.checkpoint_interval_ms,
               s.recovered_clock >= 0 ? "recovered at clock " + std::to_string(s.recovered_clock)
                                      : std::string("fresh start"));
}

int Run(const ServerConfig& config) {
  Server s;
  if (auto code = Build(config, s)) return *code;
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  LogStart(config, s);
  std::function<void(const leash::server::Shard&)> publish;
  if (s.metrics) {
    publish = [&s](const leash::server::Shard& shard) { s.metrics->Publish(shard); };
  }
  leash::Status st = leash::server::Serve(*s.shard, *s.transport, g_stop, publish);
  if (!st.ok()) {
    spdlog::error("shard stopped: {}", st.ToString());
    return 1;
  }
  auto tc = s.transport->counters();
  const auto& sc = s.shard->counters();
  spdlog::info(
      "shard {} stopped cleanly at clock {}; refused: {} limit rejections ({} "
      "oversize, {} too many keys, {} too many parked pulls), {} CURVE keys refused, "
      "{} failed handshakes, {} replies dropped (unread queue)",
      config.shard, s.shard->min_clock(), sc.limit_rejections, sc.oversize_rejections,
      sc.key_limit_rejections, sc.parked_limit_rejections, tc.auth_refused, tc.handshake_failed,
      tc.replies_dropped);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  leash::server::ServerCommandLine line;
  auto start = leash::RunPrologue<ServerConfig>(line.cli(), argc, argv, "server",
                                                [&] { return line.Config(); });
  if (const int* code = std::get_if<int>(&start)) return *code;
  return Run(std::get<ServerConfig>(start));
}
