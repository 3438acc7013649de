// leash-worker's flags and their validation into a WorkerConfig. Not thread-safe.
#include "config.h"

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "leash/common/endpoint.h"
#include "leash/common/flags.h"
#include "leash/common/metrics.h"
#include "leash/common/zmq_transport.h"

namespace leash::worker {
namespace {

std::string JoinSizes(const std::vector<int64_t>& sizes) {
  std::string out;
  for (int64_t s : sizes) out += (out.empty() ? "" : ",") + std::to_string(s);
  return out;
}

// cpu, cuda, cuda:N or auto; whether the device exists is the kernels' business.
bool IsDeviceSpec(std::string_view spec) {
  if (spec == "cpu" || spec == "auto" || spec == "cuda") return true;
  constexpr std::string_view kPrefix = "cuda:";
  if (spec.substr(0, kPrefix.size()) != kPrefix || spec.size() == kPrefix.size()) return false;
  if (spec.size() - kPrefix.size() > 9) return false;
  for (char c : spec.substr(kPrefix.size())) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

const char* ModelName(ModelKind kind) {
  switch (kind) {
    case ModelKind::kCnn:
      return "cnn";
    case ModelKind::kCtr:
      return "ctr";
    case ModelKind::kMlp:
      break;
  }
  return "mlp";
}

WorkerCommandLine::Values WorkerCommandLine::ValuesOf(const WorkerConfig& d) {
  Values v;
  for (const auto& s : d.servers) v.servers += (v.servers.empty() ? "" : ",") + s;
  for (const auto& s : d.etcd) v.etcd += (v.etcd.empty() ? "" : ",") + s;
  v.job = d.job;
  v.local = d.local;
  v.name = d.name;
  v.connect_timeout_s = d.connect_timeout_s;
  v.leave_timeout_s = d.leave_timeout_s;
  v.no_shm = !d.shared_memory;
  v.shm_ring_mb = d.shm_ring_mb;
  v.pull_in_place = d.pull_in_place;
  v.send_delay_ms = d.send_delay_ms;
  v.stripes = d.stripes;
  v.curve_keys = d.curve_keys;
  v.curve_client = d.curve_client;
  v.insecure = d.insecure;
  v.wait_when_done = d.wait_when_done;
  v.model = ModelName(d.model);
  v.hidden = JoinSizes(d.hidden);
  v.optimizer = OptimizerName(d.optimizer);
  v.lr = d.lr;
  v.embedding_dim = d.embedding_dim;
  v.sparse_optimizer = OptimizerName(d.sparse_optimizer);
  v.sparse_lr = d.sparse_lr;
  v.embedding_scale = d.embedding_scale;
  v.momentum = d.momentum;
  v.weight_decay = d.weight_decay;
  v.staleness = d.staleness;
  v.batch = d.batch;
  v.accumulate = d.accumulate;
  v.epochs = d.epochs;
  v.chunk_size = d.chunk_size;
  v.seed = d.seed;
  v.wire_dtype = DTypeName(d.wire_dtype);
  v.data = d.data;
  v.train_limit = d.train_limit;
  v.test_limit = d.test_limit;
  v.device = d.device;
  v.threads = d.threads;
  v.log_every = d.log_every;
  v.no_eval = !d.evaluate;
  v.eval_every = d.eval_every;
  v.step_delay_factor = d.step_delay_factor;
  v.slow_spells = "";  // off
  v.global_batch = d.global_batch;
  v.clock_steps = d.clock_steps;
  v.metrics_out = d.metrics_out;
  v.metrics_bind = d.metrics_bind;
  return v;
}

WorkerCommandLine::WorkerCommandLine()
    : cli_("leash-worker",
           "Trains a model on Fashion-MNIST (or a click-through model on MovieLens-100k) with a "
           "Leash cluster (or --local, alone).",
           "worker", WorkerConfig{}.log_level) {
  Values& v = values_;
  v = ValuesOf(WorkerConfig{});

  Flags& f = cli_.flags();
  f.List("servers", &v.servers,
         "comma-separated shard endpoints in shard order, e.g. "
         "tcp://127.0.0.1:7000,tcp://127.0.0.1:7001");
  f.List("etcd", &v.etcd,
         "replicated shards: etcd client URLs (http://host:2379,...); the shards' primaries are "
         "found there and followed across failovers (instead of --servers)");
  f.String("job", &v.job, "with --etcd: the job's name in etcd (its keys are /leash/JOB/)");
  f.Bool("local", &v.local, "train in this process with no server (the baseline)");
  f.Int("staleness", &v.staleness,
        "staleness bound s: iteration c reads once every worker finished c-s-1 "
        "(0 = bulk-synchronous)");
  f.Int("batch", &v.batch, "examples per step");
  f.Double("lr", &v.lr,
           "learning rate: the step of one push of a --batch mean gradient (with --global-batch, "
           "sgd and momentum run at lr x global-batch / batch on pushes weighted by their share, "
           "the same step per sample)");
  f.String("optimizer", &v.optimizer, "server-side optimizer: sgd, momentum, adam or adagrad");
  f.Double("momentum", &v.momentum, "momentum of the momentum optimizer");
  f.Double("weight-decay", &v.weight_decay,
           "L2 weight decay (with --global-batch, x batch / global-batch on the weighted pushes: "
           "the same decay per push)");
  f.Int("epochs", &v.epochs,
        "epochs of the job: passes over the training set by all workers together");
  f.String("data", &v.data,
           "directory holding the Fashion-MNIST IDX files (Debian: dataset-fashion-mnist); with "
           "--model ctr, MovieLens-100k's ml-100k.{inter,user,item} (left at its default: "
           "/usr/local/share/leash/datasets/ml-100k, from scripts/fetch-movielens.sh)");
  f.Int("seed", &v.seed, "seed of parameter initialization and shuffling");
  f.Int("threads", &v.threads, "BLAS threads");
  f.Int("chunk-size", &v.chunk_size, "samples per data chunk leased from shard 0");
  f.Int("accumulate", &v.accumulate,
        "micro-batches of --batch examples whose gradients are averaged into one push");
  f.String("name", &v.name, "worker name in logs and status (default: host:pid)");
  f.String("model", &v.model,
           "mlp (784-hidden-10), cnn (conv32-pool-conv64-pool-dense128-dense10) or ctr (the "
           "click-through model on MovieLens-100k: embeddings in a sparse table, hidden-1)");
  f.List("hidden", &v.hidden, "hidden layer sizes of the MLP (and of the ctr model)");
  f.Int("embedding-dim", &v.embedding_dim, "ctr: embedding dimension of every field");
  f.String("sparse-optimizer", &v.sparse_optimizer,
           "ctr: server-side optimizer of the embeddings: sgd, adam (lazy), adagrad or ftrl");
  f.Double("sparse-lr", &v.sparse_lr, "ctr: learning rate of the embeddings (0: --lr)");
  f.Double("embedding-scale", &v.embedding_scale,
           "ctr: embeddings start uniform in [-scale, scale]");
  f.String("wire-dtype", &v.wire_dtype,
           "encoding of pushes and pulls on the wire: fp32, fp16 or bf16");
  f.String("device", &v.device, "cpu, cuda:N or auto");
  f.Int("log-every", &v.log_every, "steps between progress lines");
  f.Int("connect-timeout", &v.connect_timeout_s,
        "seconds to wait for every shard to answer at start");
  f.Int("leave-timeout", &v.leave_timeout_s,
        "seconds after SIGTERM/SIGINT to finish the step and leave before exiting anyway");
  f.Bool("wait-when-done", &v.wait_when_done,
         "once the job is trained, stay up (idle, metrics served) until SIGTERM/SIGINT instead "
         "of exiting: for a pod of a Kubernetes Deployment, which restarts containers that "
         "exit, even with 0");
  f.Int("train-limit", &v.train_limit, "use only the first N training samples (0: all)");
  f.Int("test-limit", &v.test_limit, "evaluate on only the first N test samples (0: all)");
  f.Double("step-delay-factor", &v.step_delay_factor,
           "straggler injection for benchmarks: sleep (factor-1) x each step's compute time "
           "(1: none)");
  f.String("slow-spells", &v.slow_spells,
           "transient straggler injection for benchmarks, FACTOR,SECONDS,WORKER/WORKERS,SEED: "
           "wall-clock time in spells of SECONDS, in each one worker of WORKERS (the same seeded "
           "pick on every worker) computes FACTOR x slower; this is worker WORKER (empty: off)");
  f.Int("global-batch", &v.global_batch,
        "work in proportion to speed: the job's samples per clock over all workers; each worker "
        "trains its share (its measured speed over the live workers' summed speeds) and the "
        "shards weight its pushes by it, so every clock is one update of this batch (--lr keeps "
        "its step per sample; with --staleness 0 a clock's update is BSP's). --batch is the "
        "batch until the speeds are known. A job setting: give every worker the same value. 0: "
        "off (every worker trains --batch)");
  f.Bool("clock-steps", &v.clock_steps,
         "with --global-batch: the shards sum an iteration's weighted pushes to a dense table "
         "and take one optimizer step on the sum once every counted worker has finished it, "
         "exactly the update of one batch of --global-batch for every optimizer (momentum then "
         "runs at momentum^(global-batch/batch)); false: one step per push, exact for sgd only "
         "(measured 0.4-0.5 points more accurate after equal samples, docs/semantics.md). A job "
         "setting: give every worker the same value");
  f.Bool("no-eval", &v.no_eval, "skip the test-set evaluation after each epoch");
  f.Bool("no-shm", &v.no_shm,
         "send every message through the socket even to a shard on this host (by default "
         "they all go through shared memory there)");
  f.Int("shm-ring-mb", &v.shm_ring_mb,
        "the most each shared-memory ring to a shard on this host grows to, in MiB (1 to " +
            std::to_string(kMaxShmRingMb) +
            "); it reserves /dev/shm only as the pushes and pulls in flight need it (where "
            "/dev/shm is a memory-backed volume, that counts toward the container's memory). "
            "Frames that find no room go through the socket");
  f.Bool("pull-in-place", &v.pull_in_place,
         "read each pulled table where the shard's reply arrived (the socket's message, or "
         "the shard's shared-memory ring on this host) instead of copying it into the worker's "
         "own array, where one shard holds the table and the --wire-dtype is fp32; false: copy "
         "every pull");
  f.Int("stripes", &v.stripes,
        "connections per shard (1 to 16), each with a ZeroMQ I/O thread of its own: pushes and "
        "pulls of 1 MiB and more are split over them and put back together in order (for links "
        "faster than one connection carries, with cores to spare on both ends; give the shards "
        "--io-threads as many). 1: one connection");
  f.Int("inject-send-delay-ms", &v.send_delay_ms,
        "fault injection: hold every message to a shard this long before sending it (a slow "
        "link, where the kernel has no netem; 0: none)");
  f.Int("eval-every", &v.eval_every,
        "also evaluate on the test set (--test-limit) every N of this worker's iterations, "
        "between them, for a finer accuracy curve in --metrics-out's \"evaluations\"; not "
        "counted as training time (0: never)");
  f.String("metrics-out", &v.metrics_out, "write per-epoch results as JSON to this file");
  f.String("metrics-bind", &v.metrics_bind,
           "serve Prometheus metrics at http://HOST:PORT/metrics, e.g. 0.0.0.0:9100 (empty: no "
           "metrics)");
  f.String("curve-keys", &v.curve_keys,
           "CURVE keys directory (leashctl keygen): encrypt and authenticate the connections "
           "with this client's key pair and DIR/server.pub");
  f.String("curve-client", &v.curve_client,
           "name of this worker's key pair in --curve-keys (DIR/NAME.key)");
  f.Bool("insecure", &v.insecure,
         "allow --servers on other hosts without --curve-keys: traffic unauthenticated and "
         "unencrypted (without it such a worker refuses to start; loopback and ipc:// need no "
         "keys)");
}

Result<WorkerConfig> WorkerCommandLine::Config() const {
  const Values& v = values_;
  auto bad = [&](const char* flag, const std::string& value, const std::string& accepted) {
    return cli_.BadValue(flag, value, accepted);
  };
  auto bad_int = [&](const char* flag, int64_t value, const std::string& accepted) {
    return bad(flag, std::to_string(value), accepted);
  };
  auto bad_double = [&](const char* flag, double value, const std::string& accepted) {
    std::ostringstream text;
    text << value;
    return bad(flag, text.str(), accepted);
  };

  WorkerConfig c;
  c.local = v.local;
  c.servers = SplitList(v.servers);
  c.etcd = SplitList(v.etcd);
  c.job = v.job;
  if (!c.servers.empty() && !c.etcd.empty()) {
    return InvalidArgument(cli_.Source("servers") + " and " + cli_.Source("etcd") +
                           " are exclusive: --servers names unreplicated shards, --etcd finds "
                           "replicated ones; give one");
  }
  if (c.local && !c.etcd.empty()) {
    return InvalidArgument("--local trains without a server: drop " + cli_.Source("etcd"));
  }
  if (!c.local && c.servers.empty() && c.etcd.empty()) {
    return InvalidArgument(
        "no shards given: set --servers (or LEASH_SERVERS, or servers: in the job file's "
        "worker: section), --etcd for replicated shards, or use --local to train without a "
        "server");
  }
  if (v.staleness < 0) return bad_int("staleness", v.staleness, "need an integer >= 0");
  c.staleness = v.staleness;
  if (v.batch < 1) return bad_int("batch", v.batch, "need an integer >= 1");
  c.batch = v.batch;
  if (!(v.lr > 0)) return bad_double("lr", v.lr, "need a number > 0");
  c.lr = v.lr;
  auto optimizer = ParseOptimizer(v.optimizer);
  if (!optimizer.ok()) return bad("optimizer", v.optimizer, "use sgd, momentum, adam or adagrad");
  c.optimizer = *optimizer;
  c.momentum = v.momentum;
  c.weight_decay = v.weight_decay;
  if (v.epochs < 1) return bad_int("epochs", v.epochs, "need an integer >= 1");
  c.epochs = v.epochs;
  c.data = v.data;
  c.seed = v.seed;
  if (v.threads < 1) return bad_int("threads", v.threads, "need an integer >= 1");
  c.threads = v.threads;
  if (v.chunk_size < 1) return bad_int("chunk-size", v.chunk_size, "need an integer >= 1");
  c.chunk_size = v.chunk_size;
  if (v.accumulate < 1) return bad_int("accumulate", v.accumulate, "need an integer >= 1");
  c.accumulate = v.accumulate;
  c.name = v.name;
  if (v.model == "mlp") {
    c.model = ModelKind::kMlp;
  } else if (v.model == "cnn") {
    c.model = ModelKind::kCnn;
  } else if (v.model == "ctr") {
    c.model = ModelKind::kCtr;
  } else {
    return bad("model", v.model, "use mlp, cnn or ctr");
  }
  if (v.embedding_dim < 1 || v.embedding_dim > 4096)
    return bad_int("embedding-dim", v.embedding_dim, "need an integer in [1, 4096]");
  c.embedding_dim = v.embedding_dim;
  auto sparse_optimizer = ParseOptimizer(v.sparse_optimizer);
  if (!sparse_optimizer.ok() || *sparse_optimizer == OptimizerKind::kMomentum)
    return bad("sparse-optimizer", v.sparse_optimizer, "use sgd, adam, adagrad or ftrl");
  c.sparse_optimizer = *sparse_optimizer;
  if (!(v.sparse_lr >= 0) || !std::isfinite(v.sparse_lr))
    return bad_double("sparse-lr", v.sparse_lr, "need a number >= 0 (0: --lr)");
  c.sparse_lr = v.sparse_lr;
  if (!(v.embedding_scale >= 0) || !std::isfinite(v.embedding_scale))
    return bad_double("embedding-scale", v.embedding_scale, "need a number >= 0");
  c.embedding_scale = v.embedding_scale;
  c.hidden.clear();
  for (const auto& h : SplitList(v.hidden)) {
    char* end = nullptr;
    long long size = std::strtoll(h.c_str(), &end, 10);
    if (*end != '\0' || size < 1) {
      return bad("hidden", v.hidden, "need a comma-separated list of positive layer sizes");
    }
    c.hidden.push_back(size);
  }
  auto dtype = ParseDType(v.wire_dtype);
  if (!dtype.ok()) return bad("wire-dtype", v.wire_dtype, "use fp32, fp16 or bf16");
  c.wire_dtype = *dtype;
  if (!IsDeviceSpec(v.device)) return bad("device", v.device, "use cpu, cuda, cuda:N or auto");
  c.device = v.device;
  c.log_every = v.log_every;
  c.connect_timeout_s = v.connect_timeout_s;
  c.leave_timeout_s = v.leave_timeout_s;
  if (v.train_limit < 0) return bad_int("train-limit", v.train_limit, "need an integer >= 0");
  c.train_limit = v.train_limit;
  if (v.test_limit < 0) return bad_int("test-limit", v.test_limit, "need an integer >= 0");
  c.test_limit = v.test_limit;
  if (!(v.step_delay_factor >= 1 && v.step_delay_factor < 1e6)) {
    return bad_double("step-delay-factor", v.step_delay_factor, "need a number in [1, 1e6)");
  }
  c.step_delay_factor = v.step_delay_factor;
  if (Result<leash::worker::SlowSpells> s = leash::worker::ParseSlowSpells(v.slow_spells); s.ok()) {
    c.slow_spells = *s;
  } else {
    return bad("slow-spells", v.slow_spells, s.status().message());
  }
  if (v.global_batch < 0 || v.global_batch >= (int64_t{1} << 31)) {
    return bad_int("global-batch", v.global_batch, "need an integer in [0, 2^31) (0: off)");
  }
  if (v.global_batch > 0 && c.accumulate != 1) {
    return bad_int("global-batch", v.global_batch,
                   "work in proportion to speed trains one batch per iteration: use it with "
                   "--accumulate 1");
  }
  c.global_batch = v.global_batch;
  c.clock_steps = v.clock_steps;
  c.evaluate = !v.no_eval;
  c.shared_memory = !v.no_shm;
  if (v.shm_ring_mb < 1 || v.shm_ring_mb > kMaxShmRingMb) {
    return bad_int("shm-ring-mb", v.shm_ring_mb,
                   "need an integer in [1, " + std::to_string(kMaxShmRingMb) + "]");
  }
  c.shm_ring_mb = v.shm_ring_mb;
  c.pull_in_place = v.pull_in_place;
  c.wait_when_done = v.wait_when_done;
  if (v.send_delay_ms < 0 || v.send_delay_ms > 10000) {
    return bad_int("inject-send-delay-ms", v.send_delay_ms, "need milliseconds in [0, 10000]");
  }
  c.send_delay_ms = v.send_delay_ms;
  if (v.stripes < 1 || v.stripes > 16) {
    return bad_int("stripes", v.stripes, "need an integer in [1, 16]");
  }
  c.stripes = static_cast<int>(v.stripes);
  if (v.eval_every < 0) {
    return bad_int("eval-every", v.eval_every,
                   "need an integer >= 0; 0: no evaluation within epochs");
  }
  c.eval_every = v.eval_every;
  c.metrics_out = v.metrics_out;
  if (!v.metrics_bind.empty()) {
    if (auto address = ParseMetricsBind(v.metrics_bind); !address.ok()) {
      return InvalidArgument("bad value for " + cli_.Source("metrics-bind") + ": " +
                             address.status().message());
    }
  }
  c.metrics_bind = v.metrics_bind;
  c.curve_keys = v.curve_keys;
  c.curve_client = v.curve_client;
  c.insecure = v.insecure;
  if (!c.local && c.etcd.empty()) {
    LEASH_RETURN_IF_ERROR(CheckSecureEndpoints(c.servers, c.curve_keys, c.insecure,
                                               cli_.Source("servers"), "connect to"));
  }
  c.log_level = cli_.log_level();
  return c;
}

Result<WorkerConfig> ParseWorkerConfig(int argc, const char* const* argv) {
  WorkerCommandLine line;
  LEASH_RETURN_IF_ERROR(line.cli().Parse(argc, argv));
  return line.Config();
}

}  // namespace leash::worker
