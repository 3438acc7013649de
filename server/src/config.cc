// leash-server's flags and their validation into a ServerConfig. Not thread-safe.
#include "config.h"

#include <cctype>

#include "leash/common/endpoint.h"
#include "leash/common/flags.h"
#include "leash/common/metrics.h"
#include "leash/common/zmq_transport.h"

namespace leash::server {
namespace {

// A duration as the flags write it: "10s", "500ms".
std::string DurationText(int64_t ms) {
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + "s" : std::to_string(ms) + "ms";
}

// The most MiB a size flag takes (a TiB): more would overflow once in bytes.
constexpr int64_t kMaxMb = int64_t{1} << 20;

}  // namespace

Result<uint64_t> ParseByteSize(const std::string& text) {
  auto bad = [&] {
    return InvalidArgument("\"" + text +
                           "\" is not a byte size; use a whole number of bytes with an optional "
                           "K, M, G or T suffix (binary), e.g. 512M or 4G");
  };
  size_t i = 0;
  uint64_t v = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return bad();
    v = v * 10 + d;
    ++i;
  }
  if (i == 0) return bad();
  std::string suffix = text.substr(i);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (suffix.empty() || suffix == "B") {
    shift = 0;
  } else if (suffix == "K" || suffix == "KB" || suffix == "KIB") {
    shift = 10;
  } else if (suffix == "M" || suffix == "MB" || suffix == "MIB") {
    shift = 20;
  } else if (suffix == "G" || suffix == "GB" || suffix == "GIB") {
    shift = 30;
  } else if (suffix == "T" || suffix == "TB" || suffix == "TIB") {
    shift = 40;
  } else {
    return bad();
  }
  if (shift > 0 && v > (UINT64_MAX >> shift)) return bad();
  return v << shift;
}

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
  v.io_threads = d.io_threads;
  v.curve_keys = d.curve_keys;
  v.insecure = d.insecure;
  v.no_shm = !d.shared_memory;
  v.shm_ring_mb = d.shm_ring_mb;
  v.replica_log_mb = d.replica_log_mb;
  v.memory_budget = std::to_string(d.memory_budget_bytes);
  v.sparse_readers = d.sparse_readers;
  v.sparse_direct_reads = d.sparse_direct_reads;
  v.backup_workers = d.backup_workers;
  v.update_threads = d.update_threads;
  v.replicas = d.replicas;
  v.replica = d.replica;
  v.etcd = d.etcd;
  v.job = d.job;
  v.etcd_ttl_s = d.etcd_ttl_s;
  v.durable_log = d.durable_log;
  v.backup_answers = d.backup_answers;
  v.backups_read_in_place = d.backups_read_in_place;
  v.primary_copies_once = d.primary_copies_once;

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
           "whose key is in DIR/authorized/; with --replicas > 1 the replicas reach each other "
           "with DIR/server.key, so every replica needs the same DIR");
  f.Bool("insecure", &v.insecure,
         "allow a --bind other hosts can reach without --curve-keys: traffic unauthenticated "
         "and unencrypted (without it such a shard refuses to start; loopback and ipc:// need "
         "no keys)");
  f.Bool("no-shm", &v.no_shm,
         "no shared memory with workers or other replicas on this host (everything through the "
         "socket)");
  f.Int("shm-ring-mb", &v.shm_ring_mb,
        "with --replicas 2 or more: the most each shared-memory ring to a same-host backup "
        "grows to, in MiB (1 to " +
            std::to_string(kMaxShmRingMb) +
            "); it reserves /dev/shm only as the entries in flight need it. Appends that find no "
            "room go through the socket");
  f.Int("io-threads", &v.io_threads,
        "ZeroMQ I/O threads for the workers' connections (1 to 16): give as many as the workers' "
        "--stripes, with cores to spare, so that a striped push or pull is read in parallel");
  f.String("memory-budget", &v.memory_budget,
           "memory for sparse tables in bytes (suffixes K, M, G, T: 512M, 4G), their memory "
           "tiers and the RocksDB cold tier's cache and write buffer together; rows beyond it "
           "live on disk under DATA_DIR/sparse. 0: unbounded");
  f.Int("sparse-readers", &v.sparse_readers,
        "threads reading sparse rows missing from memory from RocksDB in parallel: the disk's "
        "queue depth (an SSD serves 32 reads at once far faster than 8)");
  f.Bool("sparse-direct-reads", &v.sparse_direct_reads,
         "read the sparse cold tier with O_DIRECT, so the page cache does not hold it (false: "
         "buffered reads)");
  f.Int("update-threads", &v.update_threads,
        "threads that apply one large dense update together, the request loop included (a "
        "push or clock step of 256K floats and more; 1 to 64): the update streams memory, "
        "which several cores may read faster than one. They share the loop's other large "
        "passes too: a push's NaN check, copies into and out of same-host peers' shared "
        "memory. The tables are the same bit for bit whatever the number. 0: half the cores "
        "this process may use, 1 to 4. On 2 cores 2 threads were slower (docs/internals.md)");
  f.Int("backup-workers", &v.backup_workers,
        "the minimum clock ignores the b slowest live workers (backup workers, Chen et al. "
        "2016): the others never wait for them; their pushes lagging the minimum by more than "
        "their staleness bound are dropped and counted. A job setting: give every shard the "
        "same value. 0: every worker counts");
  f.Int("replicas", &v.replicas,
        "replicas of this shard (a primary and R-1 backups that hold every acknowledged "
        "update; needs --etcd and --peers). 1: not replicated");
  f.Int("replica", &v.replica, "index of this replica, 0..replicas-1 (stable across restarts)");
  f.String("peers", &v.peers,
           "every replica's endpoint as the others reach it, comma-separated, in replica order "
           "(e.g. tcp://shard0-0:7000,tcp://shard0-1:7000); --replicas > 1 only");
  f.String("etcd", &v.etcd,
           "etcd endpoint(s) coordinating replicated shards, e.g. http://etcd:2379");
  f.String("job", &v.job, "the job's name in etcd (replicated shards of one job share it)");
  f.Int("etcd-ttl", &v.etcd_ttl_s,
        "seconds: a replica cut off from etcd (or dead) this long loses its registration, and a "
        "backup takes over from such a primary (etcd raises it to its minimum, about 2 s)");
  f.String("durable-log", &v.durable_log,
           "a replica's log on disk under DATA_DIR/replica-log, each entry written before it is "
           "acknowledged, so that replicas killed all at once start again losing nothing: off, "
           "write (survives the processes: SIGKILL, OOM kills) or fsync (survives the host: a "
           "power cut; slower). With --replicas 1 an unreplicated shard SIGKILLed starts again "
           "from its snapshot and this log, losing nothing acknowledged (no etcd needed)");
  f.Bool("backup-answers", &v.backup_answers,
         "with --replicas 2 or more: while a primary has one in-sync backup, that backup sends "
         "the workers the replies to their pushes and clocks itself, once it holds them (one "
         "hop less than through the primary; not with --durable-log fsync, where the primary "
         "answers once its own disk holds the entry). On by default; =false: the primary sends "
         "every reply. Give every replica of the job the same value");
  f.Bool("backups-read-in-place", &v.backups_read_in_place,
         "with --replicas 2 or more and shared memory: a primary's backups on its host apply its "
         "log entries where it wrote them, in its shared-memory ring, without copying them out "
         "or checking them for NaN again (the primary's copy into the ring checked them); a "
         "backup lets each go once applied. On by default; =false: backups copy each entry out "
         "of the ring and check it");
  f.Int("replica-log-mb", &v.replica_log_mb,
        "with --replicas 2 or more: the committed log entries a replica keeps for a backup that "
        "falls behind or restarts, in MiB of their pushes (0 to 65536); one further behind "
        "catches up from a snapshot. Entries a backup has yet to acknowledge are kept whatever "
        "this says. Each entry held keeps its push's receive buffer: a smaller tail lets the "
        "primary reuse buffers still in its caches (docs/replication.md)");
  f.Bool("primary-copies-once", &v.primary_copies_once,
         "with --replicas 2 or more and shared memory: a primary reads a same-host worker's "
         "pushed gradients where the worker wrote them and copies them once, checking for NaN, "
         "straight into its same-host backups' rings, then applies that copy (pushes no "
         "backup's ring takes are copied out). On by default; =false: every push is copied "
         "out of the worker's ring on receipt, then again into each backup's");
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
  c.curve_keys = v.curve_keys;
  c.insecure = v.insecure;
  LEASH_RETURN_IF_ERROR(
      CheckSecureEndpoints({c.bind}, c.curve_keys, c.insecure, cli_.Source("bind"), "listen on"));
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
  c.shared_memory = !v.no_shm;
  if (v.shm_ring_mb < 1 || v.shm_ring_mb > kMaxShmRingMb) {
    return bad_int("shm-ring-mb", v.shm_ring_mb,
                   "need an integer in [1, " + std::to_string(kMaxShmRingMb) + "]");
  }
  c.shm_ring_mb = v.shm_ring_mb;
  if (v.io_threads < 1 || v.io_threads > 16) {
    return bad_int("io-threads", v.io_threads, "need an integer in [1, 16]");
  }
  c.io_threads = static_cast<int>(v.io_threads);
  auto budget = ParseByteSize(v.memory_budget);
  if (!budget.ok()) {
    return cli_.BadValue("memory-budget", v.memory_budget,
                         "need a byte size such as 536870912, 512M or 4G; 0: unbounded");
  }
  if (*budget != 0 && *budget < (uint64_t{1} << 20)) {
    return cli_.BadValue("memory-budget", v.memory_budget, "need at least 1M, or 0 (unbounded)");
  }
  c.memory_budget_bytes = *budget;
  if (v.sparse_readers < 1 || v.sparse_readers > 256) {
    return bad_int("sparse-readers", v.sparse_readers, "need an integer in [1, 256]");
  }
  c.sparse_readers = v.sparse_readers;
  c.sparse_direct_reads = v.sparse_direct_reads;
  if (v.backup_workers < 0 || v.backup_workers > 1000000) {
    return bad_int("backup-workers", v.backup_workers, "need an integer in [0, 1000000]");
  }
  c.backup_workers = v.backup_workers;
  if (v.update_threads < 0 || v.update_threads > 64) {
    return bad_int("update-threads", v.update_threads, "need an integer in [0, 64]; 0: automatic");
  }
  c.update_threads = v.update_threads;
  if (v.replicas < 1 || v.replicas > 16) {
    return bad_int("replicas", v.replicas, "need an integer in [1, 16]");
  }
  c.replicas = v.replicas;
  if (v.replica < 0 || v.replica >= v.replicas) {
    return bad_int("replica", v.replica,
                   "need 0 <= --replica < --replicas = " + std::to_string(v.replicas));
  }
  c.replica = v.replica;
  c.etcd = v.etcd;
  c.job = v.job;
  if (v.etcd_ttl_s < 1 || v.etcd_ttl_s > 3600) {
    return bad_int("etcd-ttl", v.etcd_ttl_s, "need whole seconds in [1, 3600]");
  }
  c.etcd_ttl_s = v.etcd_ttl_s;
  if (v.durable_log != "off" && v.durable_log != "write" && v.durable_log != "fsync") {
    return cli_.BadValue("durable-log", v.durable_log, "use off, write or fsync");
  }
  c.durable_log = v.durable_log;
  // Flags about backups, on by default: inert for an unreplicated shard, an error only when
  // asked for there.
  auto asked_without_backups = [&](const char* flag, bool on) {
    return on && v.replicas < 2 && !cli_.Source(flag).ends_with("(default)");
  };
  if (asked_without_backups("backup-answers", v.backup_answers)) {
    return cli_.BadValue("backup-answers", "true",
                         "a backup answers only for a replicated shard: add --replicas 2");
  }
  c.backup_answers = v.backup_answers && v.replicas >= 2;
  if (asked_without_backups("backups-read-in-place", v.backups_read_in_place)) {
    return cli_.BadValue("backups-read-in-place", "true",
                         "only a replicated shard has backups: add --replicas 2");
  }
  c.backups_read_in_place = v.backups_read_in_place && v.replicas >= 2;
  if (asked_without_backups("primary-copies-once", v.primary_copies_once)) {
    return cli_.BadValue("primary-copies-once", "true",
                         "only a replicated shard copies pushes into backups: add --replicas 2");
  }
  c.primary_copies_once = v.primary_copies_once && v.replicas >= 2;
  if (v.replica_log_mb < 0 || v.replica_log_mb > 65536) {
    return bad_int("replica-log-mb", v.replica_log_mb, "need MiB in [0, 65536]");
  }
  if (asked_without_backups("replica-log-mb", true)) {
    return cli_.BadValue("replica-log-mb", std::to_string(v.replica_log_mb),
                         "only a replicated shard keeps a log for backups: add --replicas 2");
  }
  c.replica_log_mb = v.replica_log_mb;
  if (c.replicas > 1) {
    for (size_t at = 0; at <= v.peers.size();) {
      size_t comma = v.peers.find(',', at);
      if (comma == std::string::npos) comma = v.peers.size();
      if (comma > at) c.peers.push_back(v.peers.substr(at, comma - at));
      at = comma + 1;
    }
    if (c.peers.size() != static_cast<size_t>(c.replicas)) {
      return cli_.BadValue("peers", v.peers,
                           "need " + std::to_string(c.replicas) +
                               " comma-separated endpoints, one per replica (--replicas)");
    }
    if (c.etcd.empty()) {
      return cli_.BadValue("etcd", v.etcd,
                           "replicated shards (--replicas > 1) are coordinated through etcd: "
                           "give its endpoint, e.g. http://127.0.0.1:2379");
    }
    if (c.job.empty()) return cli_.BadValue("job", v.job, "need a non-empty job name");
  }
  c.log_level = cli_.log_level();
  return c;
}

Result<ServerConfig> ParseServerConfig(int argc, const char* const* argv) {
  ServerCommandLine line;
  LEASH_RETURN_IF_ERROR(line.cli().Parse(argc, argv));
  return line.Config();
}

}  // namespace leash::server
