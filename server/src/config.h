// leash-server's configuration: every flag (with its environment twin and its key in the
// server: section of a --config job file) parsed and validated into a ServerConfig, one
// clear error per bad value. Value types and a parser; not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "leash/common/cli.h"
#include "leash/common/status.h"
#include "leash/common/zmq_transport.h"
#include "leash/server/replica.h"
#include "leash/server/shard.h"

namespace leash::server {

// What leash-server runs with. The defaults here are the flags' defaults.
struct ServerConfig {
  int64_t shard = 0;
  int64_t num_shards = 1;
  std::string bind = "tcp://127.0.0.1:7000";
  std::string data_dir = "./run/shard0";
  int64_t lease_ms = 10000;
  int64_t checkpoint_interval_ms = 60000;  // 0: no periodic snapshots
  int64_t max_message_mb = 512;
  bool sync = true;  // fsync snapshots
  NonFinitePolicy nonfinite = NonFinitePolicy::kReject;
  int64_t max_keys = int64_t{1} << 24;
  int64_t max_parked_per_peer = 4096;
  std::string metrics_bind;  // HOST:PORT, checked; empty: no metrics
  int64_t max_queued_reply_mb = 1024;
  std::string curve_keys;     // empty: no CURVE
  bool insecure = false;      // allow a non-loopback --bind without --curve-keys
  bool shared_memory = true;  // with workers on this host
  // The most a ring to a same-host backup grows to (ZmqOptions::shm_ring_bytes).
  int64_t shm_ring_mb = ZmqOptions{}.shm_ring_bytes >> 20;
  // Committed log entries a replica keeps for backups that fall behind, in MiB of their
  // frames (ReplicaOptions::max_log_bytes); a backup further behind catches up from a
  // snapshot. Entries not yet committed are kept whatever this says.
  int64_t replica_log_mb = static_cast<int64_t>(ReplicaOptions{}.max_log_bytes >> 20);
  int io_threads = 1;  // the workers' socket's ZeroMQ I/O threads (striping clients)
  std::string log_level = "info";
  uint64_t memory_budget_bytes = 0;  // 0: unbounded (SplitMemoryBudget in shard.h)
  int64_t sparse_readers = 32;       // threads reading cold sparse rows: the disk queue depth
  bool sparse_direct_reads = true;   // O_DIRECT for the cold tier (no page cache)
  int64_t backup_workers = 0;        // the minimum clock ignores this many slowest workers
  int64_t update_threads = 1;        // threads per large dense update; 0: automatic
  // Replicated shards (docs/replication.md): R replicas of this shard, this one's index,
  // every replica's endpoint as its peers reach it (peers[replica] is this one's), the
  // coordinator and the job's name in it. replicas 1: none of it (today's behaviour).
  int64_t replicas = 1;
  int64_t replica = 0;
  std::vector<std::string> peers;
  std::string etcd;
  std::string job = "leash";
  int64_t etcd_ttl_s = 5;  // the replicas' etcd lease TTL: failover comes this long after a death
  // A replica's log on disk as it runs (docs/replication.md): off, write (before each
  // acknowledgement: survives the process) or fsync (survives the host too). With
  // replicas 1 the shard runs as a group of one (server/src/solo_group.h), no etcd needed.
  std::string durable_log = "off";
  // A sole in-sync backup answers the workers' pushes and clocks itself (docs/replication.md,
  // "Backups that answer"): one hop less per acknowledgement. On by default; replicated
  // shards only (with --replicas 1 the default is off, and asking for it an error).
  bool backup_answers = true;
  // With shared memory: a primary lends the entries it copies into a same-host backup's ring,
  // and the backup applies each where it lies, without a copy or a NaN check of its own
  // (docs/replication.md, "Entries applied in place"). On by default; replicated shards only.
  bool backups_read_in_place = true;
  // With shared memory: a primary reads a same-host worker's pushed frames in place and
  // copies them once, straight into its backups' rings, applying that copy (docs/
  // replication.md, "One copy on the primary"), instead of copying them out first. On by
  // default; replicated shards only.
  bool primary_copies_once = true;
};

// Where a replica (or a group of one) keeps its durable log and, for a group of one, its
// group file: DATA_DIR/replica-log.
inline std::string ReplicaLogDir(const ServerConfig& c) { return c.data_dir + "/replica-log"; }

// Parses a byte size: a whole number with an optional binary suffix K, M, G or T (also
// KB/KiB...; 512M is 512 MiB). InvalidArgument otherwise.
Result<uint64_t> ParseByteSize(const std::string& text);

// leash-server's command line: its flags registered on a CommandLine (defaults from
// ServerConfig{}), and the validation of what Parse() read into a ServerConfig.
class ServerCommandLine {
 public:
  ServerCommandLine();
  ServerCommandLine(const ServerCommandLine&) = delete;
  ServerCommandLine& operator=(const ServerCommandLine&) = delete;

  CommandLine& cli() { return cli_; }

  // The parsed values as a config. InvalidArgument naming the flag (or environment
  // variable, or job-file key), the value and what is accepted, for the first bad value.
  Result<ServerConfig> Config() const;

 private:
  // The flags as read, before validation.
  struct Values {
    std::string bind, data_dir, lease, checkpoint, nonfinite, metrics_bind, curve_keys;
    std::string memory_budget, peers, etcd, job, durable_log;
    int64_t replicas, replica, etcd_ttl_s;
    bool backup_answers, backups_read_in_place, primary_copies_once;
    int64_t shard, num_shards, max_message_mb, max_keys, max_parked, max_queued_reply_mb;
    int64_t sparse_readers, backup_workers, io_threads, update_threads, shm_ring_mb;
    int64_t replica_log_mb;
    bool no_sync, no_shm, sparse_direct_reads, insecure;
  };
  Values values_;
  CommandLine cli_;
};

// Parses argv (with the environment and a --config job file) and validates: the whole
// of ServerCommandLine for tests and tools. --help is ignored.
Result<ServerConfig> ParseServerConfig(int argc, const char* const* argv);

}  // namespace leash::server
