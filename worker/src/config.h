// leash-worker's configuration: every flag (with its environment twin and its key in the
// worker: section of a --config job file) parsed and validated into a WorkerConfig, one
// clear error per bad value. Value types and a parser; not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "leash/common/cli.h"
#include "leash/common/curve_keys.h"
#include "leash/common/domain.h"
#include "leash/common/status.h"
#include "leash/worker/slow_spells.h"

namespace leash::worker {

enum class ModelKind { kMlp, kCnn, kCtr };

// What leash-worker runs with. The defaults here are the flags' defaults.
struct WorkerConfig {
  // The cluster: shard endpoints in shard order, or `local` (no server, the baseline).
  std::vector<std::string> servers;
  // Or replicated shards: etcd client URLs and the job's name there; the shards' primaries
  // are found (and followed across failovers) in etcd. Exclusive with `servers`.
  std::vector<std::string> etcd;
  std::string job = "leash";  // leash-server --job's default
  bool local = false;
  std::string name;  // in logs and status; empty: host:pid
  int64_t connect_timeout_s = 60;
  int64_t leave_timeout_s = 30;
  bool shared_memory = true;  // large pushes and pulls to a shard on this host
  int64_t shm_ring_mb = 64;   // the most each shared-memory ring grows to (ZmqOptions)
  bool pull_in_place = true;  // read a pulled table where its reply lies (MakeRemoteParams)
  int stripes = 1;            // connections (and ZeroMQ I/O threads) per shard
  int64_t send_delay_ms = 0;  // fault injection: each message to a shard waits this long first
  std::string curve_keys;     // empty: no CURVE
  std::string curve_client = kDefaultCurveClient;
  bool insecure = false;        // allow non-loopback --servers without --curve-keys
  bool wait_when_done = false;  // stay up, idle, after the job until SIGTERM (a Deployment's pod)

  // The job.
  ModelKind model = ModelKind::kMlp;
  std::vector<int64_t> hidden = {256, 128};  // MLP (and click-through model) hidden layer sizes
  // The click-through model's embeddings (a sparse table): dimension, optimizer and
  // learning rate (sparse_lr 0: --lr), initial values uniform in +-embedding_scale.
  int64_t embedding_dim = 16;
  OptimizerKind sparse_optimizer = OptimizerKind::kAdagrad;
  double sparse_lr = 0;
  double embedding_scale = 0.05;
  OptimizerKind optimizer = OptimizerKind::kMomentum;
  double lr = 0.01;
  double momentum = 0.9;
  double weight_decay = 0;
  int64_t staleness = 0;
  int64_t batch = 64;
  int64_t accumulate = 1;
  int64_t epochs = 3;
  int64_t chunk_size = 1024;
  int64_t seed = 1;
  DType wire_dtype = DType::kF32;
  std::string data = "/usr/share/datasets/fashion-mnist";
  int64_t train_limit = 0;  // 0: all
  int64_t test_limit = 0;   // 0: all

  // The process.
  std::string device = "auto";  // cpu, cuda, cuda:N or auto (checked for syntax only)
  int64_t threads = 1;
  int64_t log_every = 100;
  bool evaluate = true;
  int64_t eval_every = 0;
  double step_delay_factor = 1;
  leash::worker::SlowSpells slow_spells;  // transient straggler injection; off by default
  int64_t global_batch = 0;  // > 0: work in proportion to speed, this many samples per clock
  bool clock_steps = false;  // with global_batch: one optimizer step per clock (TrainOptions)
  std::string metrics_out;
  std::string metrics_bind;  // HOST:PORT, checked; empty: no metrics
  std::string log_level = "info";
};

// "mlp", "cnn" or "ctr".
const char* ModelName(ModelKind kind);

// leash-worker's command line: its flags registered on a CommandLine (defaults from
// WorkerConfig{}), and the validation of what Parse() read into a WorkerConfig.
class WorkerCommandLine {
 public:
  WorkerCommandLine();
  WorkerCommandLine(const WorkerCommandLine&) = delete;
  WorkerCommandLine& operator=(const WorkerCommandLine&) = delete;

  CommandLine& cli() { return cli_; }

  // The parsed values as a config. InvalidArgument naming the flag (or environment
  // variable, or job-file key), the value and what is accepted, for the first bad value.
  Result<WorkerConfig> Config() const;

 private:
  // The flags as read, before validation.
  struct Values {
    std::string servers, etcd, job, optimizer, wire_dtype, name, hidden, model, metrics_out,
        metrics_bind;
    std::string device, curve_keys, curve_client, data, sparse_optimizer, slow_spells;
    int64_t staleness, batch, epochs, seed, threads, chunk_size, accumulate, log_every;
    int64_t connect_timeout_s, train_limit, test_limit, leave_timeout_s, eval_every;
    int64_t embedding_dim, send_delay_ms, global_batch, stripes, shm_ring_mb;
    double lr, momentum, weight_decay, step_delay_factor, sparse_lr, embedding_scale;
    bool local, no_eval, no_shm, insecure, wait_when_done, clock_steps, pull_in_place;
  };
  // The flags' defaults: `defaults` as the flags write it.
  static Values ValuesOf(const WorkerConfig& defaults);

  Values values_;
  CommandLine cli_;
};

// Parses argv (with the environment and a --config job file) and validates: the whole
// of WorkerCommandLine for tests and tools. --help is ignored.
Result<WorkerConfig> ParseWorkerConfig(int argc, const char* const* argv);

}  // namespace leash::worker
