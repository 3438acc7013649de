// leash-server's flags and their validation into a ServerConfig. Not thread-safe.
#include "config.h"

#include "leash/common/flags.h"
#include "leash/common/metrics.h"

namespace leash::server {
namespace {

// A duration as the flags write it: "10s", "500ms".
std::string DurationText(int64_t ms) {
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + "s" : std::to_string(ms) + "ms";
}

// The most MiB a size flag takes (a TiB): more would overflow once in bytes.
constexpr int64_t kMaxMb = int64_t{1} << 20;

}  // namespace

ServerCommandLine::ServerCommandLine()
    : cli_("leash-server", "Runs one Leash parameter-server shard.", "server",
           ServerConfig{}.log_level) {
  const ServerConfig d;
  Values& v = values_;
  v.shard = d.shard;
  v.num_shards = d.num_shards;
  v.bind = d.bind;
  v.data_dir = d.data_dir;
  v.lease = DurationText(d.lease_ms);
  v.checkpoint = DurationText(d.checkpoint_interval_ms);
  v.max_message_mb = d.max_message_mb;
  v.no_sync = !d.sync;
  v.nonfinite = d.nonfinite == NonFinitePolicy::kReject ? "reject" : "skip-rows";
  v.max_keys = d.max_keys;
  v.max_parked = d.max_parked_per_peer;
  v.metrics_bind = d.metrics_bind;
  v.max_queued_reply_mb = d.max_queued_reply_mb;
  v.curve_keys = d.curve_keys;
  v.no_shm = !d.shared_memory;

  Flags& f = cli_.flags();
  f.Int("shard", &v.shard, "index of this shard, 0..num-shards-1");
  f.Int("num-shards", &v.num_shards, "number of shards in the job");
  f.String("bind", &v.bind, "ZeroMQ endpoint to listen on, e.g. tcp://0.0.0.0:7000");
  f.String("data-dir", &v.data_dir, "RocksDB directory holding this shard's snapshots");
  f.String("lease-timeout", &v.lease, "evict a worker silent for this long (e.g. 10s, 500ms)");
  f.String("checkpoint-interval", &v.checkpoint,
           "snapshot period (e.g. 60s); 0 disables periodic snapshots");
  f.Int("max-message-mb", &v.max_message_mb, "largest request accepted, in MiB");
  f.Bool("no-sync", &v.no_sync, "do not fsync snapshots (faster, less durable)");
  f.String("nonfinite", &v.nonfinite,
           "pushes holding NaN/Inf: reject (the whole push) or skip-rows (apply the rest)");
  f.Int("max-keys", &v.max_keys, "most keys one request may name");
  f.Int("max-parked-per-peer", &v.max_parked,
        "most pulls one connection may have waiting for the staleness bound");
  f.String("metrics-bind", &v.metrics_bind,
           "serve Prometheus metrics at http://HOST:PORT/metrics, e.g. 0.0.0.0:9100 (empty: no "
           "metrics)");
  f.Int("max-queued-reply-mb", &v.max_queued_reply_mb,
        "replies queued for one connection that does not read them, in MiB, before further "
        "ones are dropped");
  f.String("curve-keys", &v.curve_keys,
           "CURVE keys directory (leashctl keygen): encrypt all traffic, accept only clients "
           "whose key is in DIR/authorized/");
  f.Bool("no-shm", &v.no_shm,
         "refuse shared memory with workers on this host (everything through the socket)");
}

Result<ServerConfig> ServerCommandLine::Config() const {
  const Values& v = values_;
  auto bad_int = [&](const char* flag, int64_t value, const std::string& accepted) {
    return cli_.BadValue(flag, std::to_string(value), accepted);
  };
  ServerConfig c;
  if (v.num_shards < 1) return bad_int("num-shards", v.num_shards, "need an integer >= 1");
  c.num_shards = v.num_shards;
  if (v.shard < 0 || v.shard >= v.num_shards) {
    return bad_int("shard", v.shard,
                   "need 0 <= --shard < --num-shards = " + std::to_string(v.num_shards));
  }
  c.shard = v.shard;
  c.bind = v.bind;
  c.data_dir = v.data_dir;
  auto lease = ParseDurationMs(v.lease);
  if (!lease.ok() || *lease < 10) {
    return cli_.BadValue("lease-timeout", v.lease, "need a duration of at least 10ms, e.g. 10s");
  }
  c.lease_ms = *lease;
  auto checkpoint = ParseDurationMs(v.checkpoint);
  if (!checkpoint.ok()) {
    return cli_.BadValue("checkpoint-interval", v.checkpoint,
                         "need a duration such as 60s, 500ms or 2m; 0: no periodic snapshots");
  }
  c.checkpoint_interval_ms = *checkpoint;
  if (v.max_message_mb < 1 || v.max_message_mb > kMaxMb) {
    return bad_int("max-message-mb", v.max_message_mb, "need an integer in [1, 1048576]");
  }
  c.max_message_mb = v.max_message_mb;
  c.sync = !v.no_sync;
  if (v.nonfinite == "reject") {
    c.nonfinite = NonFinitePolicy::kReject;
  } else if (v.nonfinite == "skip-rows") {
    c.nonfinite = NonFinitePolicy::kSkipRows;
  } else {
    return cli_.BadValue("nonfinite", v.nonfinite, "use reject or skip-rows");
  }
  if (v.max_keys < 1 || v.max_keys > (int64_t{1} << 40)) {
    return bad_int("max-keys", v.max_keys, "need an integer in [1, 2^40]");
  }
  c.max_keys = v.max_keys;
  if (v.max_parked < 1) return bad_int("max-parked-per-peer", v.max_parked, "need an integer >= 1");
  c.max_parked_per_peer = v.max_parked;
  if (!v.metrics_bind.empty()) {
    if (auto address = ParseMetricsBind(v.metrics_bind); !address.ok()) {
      return InvalidArgument("bad value for " + cli_.Source("metrics-bind") + ": " +
                             address.status().message());
    }
  }
  c.metrics_bind = v.metrics_bind;
  if (v.max_queued_reply_mb < 1 || v.max_queued_reply_mb > kMaxMb) {
    return bad_int("max-queued-reply-mb", v.max_queued_reply_mb, "need an integer in [1, 1048576]");
  }
  c.max_queued_reply_mb = v.max_queued_reply_mb;
  c.curve_keys = v.curve_keys;
  c.shared_memory = !v.no_shm;
  c.log_level = cli_.log_level();
  return c;
}

Result<ServerConfig> ParseServerConfig(int argc, const char* const* argv) {
  ServerCommandLine line;
  LEASH_RETURN_IF_ERROR(line.cli().Parse(argc, argv));
  return line.Config();
}

}  // namespace leash::server
