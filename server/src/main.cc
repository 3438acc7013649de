// leash-server: runs one parameter-server shard on a ZeroMQ ROUTER, with its tables
// persisted in RocksDB under --data-dir, and (with --metrics-bind) its Prometheus metrics
// on HTTP. SIGTERM/SIGINT: final snapshot, then exit 0. Configuration in config.h; this
// file only wires the parts.
#include <malloc.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "config.h"
#include "coordination.h"
#include "leash/common/cli.h"
#include "leash/common/curve_keys.h"
#include "leash/common/metrics.h"
#include "leash/common/zmq_transport.h"
#include "leash/server/replica.h"
#include "leash/server/replica_metrics.h"
#include "leash/server/rocksdb_row_store.h"
#include "leash/server/rocksdb_store.h"
#include "leash/server/shard.h"
#include "leash/server/shard_metrics.h"
#include "other_replicas.h"

namespace {

using leash::server::ServerConfig;

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// With a memory budget, glibc's allocator is told to give memory back (docs/sparse.md,
// "Memory beyond the budget"): two arenas instead of eight per core (each reader and
// RocksDB thread would keep one, its freed blocks resident), set before any thread starts;
// buffers of 256 KiB and more mapped and unmapped on their own (request scratch, replies,
// memtable blocks), not carved from the heap where their holes stay resident; and, from
// the serving loop, the free pages inside the heaps returned every kTrimEveryMs
// (malloc_trim: up to 60 ms on a busy 2-core VM, so not more often). Measured at an 80 MiB
// budget holding a 4x table: 288 MiB RSS without these, 168 MiB of it free heap; with
// them (and the store's bounds) a peak of 169 MiB. MALLOC_* in the environment still win.
constexpr int64_t kTrimEveryMs = 2000;

void TuneAllocator(uint64_t memory_budget_bytes) {
  if (memory_budget_bytes == 0) return;
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 2);
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 256 << 10);
}

// The process's resident memory (VmRSS) from /proc/self/statm; 0 if it cannot be read.
uint64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long pages = 0, resident = 0;
  const int got = std::fscanf(f, "%llu %llu", &pages, &resident);
  std::fclose(f);
  return got == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

// Work done from the serving thread at most every kTrimEveryMs: returning the heaps' free
// pages to the kernel (with a budget) and publishing the resident memory (with metrics).
class Housekeeper {
 public:
  Housekeeper(bool trim, leash::server::ShardMetrics* metrics) : trim_(trim), metrics_(metrics) {}
  bool needed() const { return trim_ || metrics_ != nullptr; }
  void MaybeRun() {
    const int64_t now = SteadyMs();
    if (now - last_ms_ < kTrimEveryMs) return;
    if (trim_) {
      malloc_trim(0);
      ++trims_;
      longest_trim_ms_ = std::max(longest_trim_ms_, SteadyMs() - now);
    }
    if (metrics_) metrics_->SetResidentBytes(ResidentBytes());
    last_ms_ = SteadyMs();
  }
  ~Housekeeper() {
    if (trims_ > 0) {
      spdlog::info("returned free heap memory {} times, the longest took {} ms", trims_,
                   longest_trim_ms_);
    }
  }

 private:
  bool trim_;
  leash::server::ShardMetrics* metrics_;
  int64_t last_ms_ = 0;
  uint64_t trims_ = 0;
  int64_t longest_trim_ms_ = 0;
};

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
  std::unique_ptr<leash::ZmqContext> zmq;  // the workers' socket's (--io-threads)
  std::unique_ptr<leash::ServerTransport> transport;
  // Replicated (--replicas > 1): the other replicas' connections, the coordinator, and the
  // replica that owns the shard (`shard` stays null). The peers' connections have a ZeroMQ
  // context of their own, an I/O thread per replica: ZeroMQ resolves a peer's host name in
  // the I/O thread, synchronously, on every reconnect, and a dead peer's name (a stopped
  // container's, which the DNS may take seconds to deny) held the one thread the workers'
  // socket shared with it, so the new primary answered workers only now and then.
  std::unique_ptr<leash::ZmqContext> peers_zmq;
  std::unique_ptr<leash::ClientTransport> peers;
  leash::server::Coordination coordination;
  std::unique_ptr<leash::server::Replica> replica;
  std::unique_ptr<leash::server::ShardMetrics> metrics;
  std::unique_ptr<leash::server::ReplicaMetrics> replica_metrics;

  leash::server::Shard& serving_shard() { return replica ? replica->mutable_shard() : *shard; }
};

// Watches a replica's connections to its peers for refused handshakes (CURVE keys on one
// side only, or another cluster's keys), from the serving thread, once a second. Each
// refusal is logged once (until the connection works again). A backup that has never held
// its primary's log and whose primary refuses it cannot join the log: Check says so, once,
// and the replica stops rather than wait for ever.
class PeerWatch {
 public:
  PeerWatch(const ServerConfig& c, leash::ClientTransport& peers)
      : config_(c), peers_(peers), warned_(static_cast<size_t>(c.replicas), false) {}

  // True if this replica must stop (the reason is logged).
  bool Check(const leash::server::Replica& r) {
    const int64_t now = SteadyMs();
    // The peers' connections only send, so nothing else receives on them: a Receive that
    // does not wait reads their handshake events into health() and a peer's answer to the
    // shared-memory offer (the link turns on as it is read, so it is read every 10 ms, not
    // once a second). Replicas answer on their own connections, so nothing else arrives.
    if (now - last_read_ms_ >= 10) {
      last_read_ms_ = now;
      if (auto in = peers_.Receive(std::chrono::milliseconds(0)); in.ok() && in->has_value()) {
        spdlog::debug("a message from replica {} on a send-only connection, dropped", (*in)->first);
      }
    }
    if (now - last_ms_ < 1000) return false;
    last_ms_ = now;
    const leash::ConnectionHealth* health = peers_.health();
    if (health == nullptr) return false;
    for (int p = 0; p < config_.replicas; ++p) {
      if (p == config_.replica) continue;
      const leash::Status st = health->ShardHealth(p);
      const auto i = static_cast<size_t>(p);
      if (st.ok()) {
        warned_[i] = false;
        continue;
      }
      if (r.role() == leash::server::ReplicaRole::kBackup && r.applied_index() == 0 &&
          r.primary() == static_cast<uint32_t>(p)) {
        spdlog::error(
            "replica {} of shard {} cannot join the log: its primary, replica {} at {}, does "
            "not accept this replica's connection ({}). Every replica of a shard needs the "
            "cluster's keys (--curve-keys DIR with the same server.key), or none of them may "
            "use keys; stopping",
            config_.replica, config_.shard, p, config_.peers[i], st.message());
        return true;
      }
      if (!warned_[i]) {
        warned_[i] = true;
        spdlog::warn(
            "replica {} at {} does not accept this replica's connection ({}); no log passes "
            "between them until both run with the cluster's --curve-keys (or both without)",
            p, config_.peers[i], st.message());
      }
    }
    return false;
  }

 private:
  const ServerConfig& config_;
  leash::ClientTransport& peers_;
  std::vector<bool> warned_;
  int64_t last_ms_ = 0;
  int64_t last_read_ms_ = 0;
};

// The name under which the shards' public key is authorized as a replica's client key.
constexpr char kReplicaKeyName[] = "server (a replica of this shard)";

// The keys a replica reaches its peers with: the shards' pair as a client's, the shards'
// public key as the server's.
leash::CurveKeys ReplicaClientKeys(const leash::CurveKeys& server) {
  leash::CurveKeys k;
  k.dir = server.dir;
  k.own_name = "server";
  k.own = server.own;
  k.server_public_z85 = server.own.public_z85;
  return k;
}

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
  opts.resident_bytes = ResidentBytes;
  opts.backup_workers = static_cast<uint32_t>(c.backup_workers);
  opts.update_threads = leash::ps::UpdateThreads::Resolve(static_cast<int>(c.update_threads));
  if (c.replicas > 1 || c.durable_log != "off") {
    // A replica's state comes from its primary (a snapshot and the log), not from its own
    // snapshots (docs/replication.md). Unreplicated with a durable log, the shard is a group
    // of one: its log on disk, its term in DATA_DIR/replica-log/group, no etcd.
    auto coordination = leash::server::ConnectCoordination(c);
    if (!coordination.ok()) {
      spdlog::error("{}", coordination.status().ToString());
      return 1;
    }
    s.coordination = std::move(*coordination);
    if (c.replicas > 1) {
      leash::ZmqOptions po;
      po.max_message_bytes = int64_t{1} << 31;  // appends and snapshots carry many requests
      // A replica on this host gets the appends' pushes through shared memory as a shard gets
      // a worker's (one copy in, one out, no loopback TCP on either side's CPU); a replica on
      // another host refuses the offer and everything goes through the socket.
      po.shared_memory = c.shared_memory;
      po.shm_ring_bytes = c.shm_ring_mb << 20;
      // ...and applies them where the primary wrote them, in its ring, instead of copying
      // each out first: a backup lets an entry's frames go once it applied the entry
      // (Replica::Compact), and the primary renews the link when a backup restarts.
      po.shm_lend = c.backups_read_in_place;
      if (s.curve) {
        // CURVE between replicas (docs/replication.md): a replica is its peers' CURVE client
        // with the shards' own key pair, and every replica accepts that key as a client's
        // (below). Only a process holding server.key can therefore reach a replica as one.
        po.curve = ReplicaClientKeys(*s.curve);
        s.curve->authorized.push_back({kReplicaKeyName, s.curve->own.public_z85});
      }
      s.peers_zmq = std::make_unique<leash::ZmqContext>(static_cast<int>(c.replicas));
      std::vector<std::string> others = c.peers;
      others.erase(others.begin() + c.replica);  // no connection to itself (other_replicas.h)
      auto peers = leash::ConnectZmqClient(*s.peers_zmq, others, po);
      if (!peers.ok()) {
        spdlog::error("cannot connect to the other replicas: {}", peers.status().ToString());
        return 1;
      }
      s.peers = std::make_unique<leash::server::OtherReplicas>(std::move(*peers), c.replica);
    } else {
      s.peers = leash::server::NoOtherReplicas();
    }
    leash::server::ReplicaOptions rep;
    rep.replica = static_cast<uint32_t>(c.replica);
    rep.replicas = static_cast<uint32_t>(c.replicas);
    // With keys, replication messages must come from the replicas' own key, not a worker's.
    if (s.curve) rep.replica_user = kReplicaKeyName;
    if (c.durable_log != "off") {
      rep.durable_log_dir = leash::server::ReplicaLogDir(c);
      rep.durable_log_fsync = c.durable_log == "fsync";
    }
    rep.backup_answers = c.backup_answers;
    rep.max_log_bytes = static_cast<size_t>(c.replica_log_mb) << 20;
    s.replica = std::make_unique<leash::server::Replica>(
        rep, opts, s.store.get(), SteadyMs, s.coordination.coordinator.get(),
        s.coordination.directory.get(), s.peers.get(), s.sparse.get());
    // A replica stopped cleanly takes its state and log back from its final snapshot, one
    // killed from its durable log (--durable-log); any other starts empty and is caught up
    // by the primary.
    if (auto restored = s.replica->Restore(); !restored.ok()) {
      spdlog::error("cannot restore replica {} of shard {} from {}: {}", c.replica, c.shard,
                    c.data_dir, restored.status().ToString());
      return 1;
    }
  } else {
    s.shard = std::make_unique<leash::server::Shard>(opts, s.store.get(), SteadyMs, s.sparse.get());
    auto recovered = s.shard->Recover();
    if (!recovered.ok()) {
      spdlog::error("cannot recover from {}: {}", c.data_dir, recovered.status().ToString());
      return 1;
    }
    s.recovered_clock = *recovered;
  }

  leash::ZmqOptions zo;
  zo.max_message_bytes = static_cast<int64_t>(opts.max_message_bytes) * 2;
  zo.curve = s.curve;
  zo.max_queued_bytes_per_peer = c.max_queued_reply_mb << 20;
  zo.shared_memory = c.shared_memory;
  // A primary on this host lends a backup its entries (Replica: applied in place). Only the
  // replicas may: with CURVE those holding the shards' key; without, nothing is authenticated
  // and any client could append to the log anyway.
  if (c.replicas > 1) zo.shm_lenders = s.curve ? std::string(kReplicaKeyName) : "*";
  // A primary copies a worker's push once, from the worker's ring into its backups' (the
  // frames come unstable, Frame::unstable; the replica copies what no ring takes).
  zo.shm_borrow_all = c.primary_copies_once;
  s.zmq = std::make_unique<leash::ZmqContext>(c.io_threads);
  auto transport = leash::BindZmqServer(*s.zmq, c.bind, zo);
  if (!transport.ok()) {
    spdlog::error("{}", transport.status().ToString());
    return 1;
  }
  s.transport = std::move(*transport);
  if (s.metrics_server) {
    s.metrics = std::make_unique<leash::server::ShardMetrics>(s.metrics_server->registry(),
                                                              s.serving_shard());
    // A replica's Shard is replaced when it installs a snapshot: the replica keeps the
    // snapshot-duration observer and hands it on.
    if (s.replica) {
      s.replica->set_snapshot_observer(s.metrics->snapshot_observer());
      s.replica_metrics =
          std::make_unique<leash::server::ReplicaMetrics>(s.metrics_server->registry(), *s.replica);
    }
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
        "listening on {} WITHOUT CURVE keys (--insecure): traffic is unauthenticated and "
        "unencrypted, anyone who can reach this port can read and change the model; "
        "use --curve-keys DIR (leashctl keygen DIR)",
        c.bind);
  }
  if (loopback) {
    spdlog::info(
        "bound to loopback only: other hosts cannot reach this shard (use --bind "
        "tcp://0.0.0.0:PORT for a cluster)");
  }
  spdlog::info(
      "shard {}/{} listening on {} (data {}, lease {} ms, snapshots every {} ms, {} update "
      "thread(s), {})",
      c.shard, c.num_shards, c.bind, c.data_dir, c.lease_ms, c.checkpoint_interval_ms,
      leash::ps::UpdateThreads::Resolve(static_cast<int>(c.update_threads)),
      s.recovered_clock >= 0 ? "recovered at clock " + std::to_string(s.recovered_clock)
                             : std::string("fresh start"));
}

int Run(const ServerConfig& config) {
  TuneAllocator(config.memory_budget_bytes);
  Server s;
  if (auto code = Build(config, s)) return *code;
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  LogStart(config, s);
  Housekeeper housekeeper(config.memory_budget_bytes > 0, s.metrics.get());
  std::function<void(const leash::server::Shard&)> publish;
  if (housekeeper.needed()) {
    publish = [&s, &housekeeper](const leash::server::Shard& shard) {
      if (s.metrics) s.metrics->Publish(shard);
      housekeeper.MaybeRun();
    };
  }
  leash::Status st;
  if (s.replica) {
    std::random_device rd;
    const uint64_t boot = (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
    const auto replica = static_cast<uint32_t>(config.replica);
    const std::string self = config.replicas > 1 ? config.peers[replica] : config.bind;
    leash::Status joined = s.coordination.coordinator->Join(
        static_cast<uint32_t>(config.shard), {replica, self, boot, config.backup_answers});
    if (!joined.ok()) {
      spdlog::error("replica {} of shard {} cannot join the job '{}' at {}: {}", replica,
                    config.shard, config.job, config.etcd, joined.ToString());
      return 1;
    }
    PeerWatch watch(config, *s.peers);
    bool refused = false;
    auto after_tick = [&](const leash::server::Replica& r) {
      if (publish) publish(r.shard());
      if (s.replica_metrics) s.replica_metrics->Publish(r);
      if (!refused && watch.Check(r)) {
        refused = true;
        g_stop.store(true);
      }
    };
    st = leash::server::ServeReplica(*s.replica, *s.transport, g_stop, after_tick);  // resigns
    (void)s.coordination.coordinator->Leave();
    if (refused) return 2;
  } else {
    st = leash::server::Serve(*s.shard, *s.transport, g_stop, publish);
  }
  if (!st.ok()) {
    spdlog::error("shard stopped: {}", st.ToString());
    return 1;
  }
  auto tc = s.transport->counters();
  const auto& sc = s.serving_shard().counters();
  spdlog::info(
      "shard {} stopped cleanly at clock {}; refused: {} limit rejections ({} "
      "oversize, {} too many keys, {} too many parked pulls), {} CURVE keys refused, "
      "{} failed handshakes, {} replies dropped (unread queue); {} requests rejected ({} "
      "rejection lines not logged, {} error replies not sent over the per-peer limits); "
      "striped: {} messages received, {} replies sent, {} dropped incomplete; shared memory: {} "
      "frames received ({} read in place), {} sent, {} queued messages received, {} sent; {} "
      "pushes checked for NaN/Inf by their copy; update threads: {} updates split, {} passes "
      "split",
      config.shard, s.serving_shard().min_clock(), sc.limit_rejections, sc.oversize_rejections,
      sc.key_limit_rejections, sc.parked_limit_rejections, tc.auth_refused, tc.handshake_failed,
      tc.replies_dropped, sc.errors, sc.rejection_lines_suppressed, sc.error_replies_suppressed,
      tc.striped_received, tc.striped_sent, tc.striped_dropped, tc.shm_frames_received,
      tc.shm_frames_lent, tc.shm_frames_sent, tc.shm_messages_received, tc.shm_messages_sent,
      sc.pushes_checked_in_copy, sc.updates_split, sc.passes_split);
  if (sc.pushes_dropped_stale > 0) {
    spdlog::warn(
        "shard {}: {} stale push(es) of backup workers dropped in all, {} applied (pushes more "
        "than their staleness bound behind the minimum clock, --backup-workers)",
        config.shard, sc.pushes_dropped_stale, sc.pushes_applied);
  }
  if (sc.pushes_summed > 0) {
    spdlog::info(
        "shard {}: {} weighted push(es) summed into {} clock step(s), one optimizer step per "
        "iteration (work in proportion to speed)",
        config.shard, sc.pushes_summed, sc.clock_steps);
  }
  if (s.replica && config.durable_log != "off") {
    spdlog::info("shard {}: replica {} wrote {} durable log record(s), {:.1f} MiB ({}{})",
                 config.shard, config.replica, s.replica->durable_records(),
                 static_cast<double>(s.replica->durable_bytes()) / (1 << 20), config.durable_log,
                 s.replica->durable_failed() ? "; FAILED" : "");
  }
  if (s.replica && config.replicas > 1) {
    spdlog::info(
        "shard {}: replica {} answered {} push(es) and clock(s) itself as the primary's only "
        "in-sync backup, and left {} of its replies to its backup as the primary "
        "(--backup-answers={})",
        config.shard, config.replica, s.replica->backup_answered(),
        s.replica->replies_left_to_backup(), config.backup_answers);
  }
  if (s.replica && s.replica->entries_lent() > 0) {
    spdlog::info(
        "shard {}: replica {} applied {} log entr(ies) in place in its primary's shared-memory "
        "ring (no copy)",
        config.shard, config.replica, s.replica->entries_lent());
  }
  if (s.replica && s.replica->frames_copied_once() > 0) {
    spdlog::info(
        "shard {}: replica {} as primary copied {} pushed frame(s) once, from the worker's "
        "shared-memory ring straight into its backup's",
        config.shard, config.replica, s.replica->frames_copied_once());
  }
  if (uint64_t held = s.serving_shard().coverage().held_back(); held > 0) {
    spdlog::info(
        "shard {}: {} chunk request(s) of slower workers answered 'wait': the faster workers "
        "finished the last chunks sooner (work in proportion to speed)",
        config.shard, held);
  }
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
