// Leash's domain model: table specs, optimizers, initializers, value encodings, data
// plans and grants, and every request and reply a worker, a shard and leashctl
// exchange, as plain C++ values. No generated code stands behind this header: the codec
// (wire.h) turns a verified message into these types once, at the edge, and encodes
// them back; the shard, the parameter-store core, the snapshot store and the public
// client API speak only these. Value types; thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "leash/common/status.h"

namespace leash {

// ---- values and tables -------------------------------------------------------------

// Encoding of values on the wire (tables always hold float32).
enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };
inline constexpr DType kMaxDType = DType::kBF16;

// Bytes per value of `dtype`; 0 for a value outside the enum.
size_t DTypeSize(DType dtype);
// "fp32", "fp16", "bf16" ("unknown" outside the enum).
const char* DTypeName(DType dtype);
// Parses "fp32"/"f32"/"float32", "fp16"/"f16"/"float16", "bf16"/"bfloat16".
// InvalidArgument naming the accepted values otherwise.
Result<DType> ParseDType(std::string_view name);

// Server-side optimizers. On a sparse table each updates only the rows a push touches;
// Adam there is lazy Adam (bias correction from each row's own step count). FTRL-Proximal
// (McMahan et al. 2013) is for sparse tables only.
enum class OptimizerKind : uint8_t { kSgd = 0, kMomentum = 1, kAdam = 2, kAdagrad = 3, kFtrl = 4 };
inline constexpr OptimizerKind kMaxOptimizerKind = OptimizerKind::kFtrl;
// "sgd", "momentum", "adam", "adagrad", "ftrl".
const char* OptimizerName(OptimizerKind kind);
// Parses the names above; InvalidArgument naming them otherwise.
Result<OptimizerKind> ParseOptimizer(std::string_view name);

// A table's server-side optimizer. Which fields count depends on `kind` (see
// SameTableSpec in the parameter-store core).
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  float lr = 0.01f;
  float momentum = 0.9f;     // Momentum
  float beta1 = 0.9f;        // Adam
  float beta2 = 0.999f;      // Adam
  float epsilon = 1e-8f;     // Adam, Adagrad
  float weight_decay = 0.f;  // L2: every optimizer adds weight_decay * value to the gradient
                             // (FTRL: the l2 of its closed form)
  float l1 = 0.f;            // FTRL's L1 strength (sparsifies rows)
  float ftrl_beta = 1.f;     // FTRL's beta (the learning rate schedule's offset)
  float clip_value = 0.f;    // > 0: every updated value is clipped to [-clip_value, clip_value]
  bool operator==(const OptimizerConfig&) const = default;
};

enum class InitKind : uint8_t { kZeros = 0, kUniform = 1, kNormal = 2, kConstant = 3 };
inline constexpr InitKind kMaxInitKind = InitKind::kConstant;

// How a table's values start: the same global row gets the same value on any shard.
struct InitConfig {
  InitKind kind = InitKind::kZeros;
  float scale = 0.f;  // Uniform: [-scale, scale]; Normal: stddev; Constant: the value
  uint64_t seed = 0;
  bool operator==(const InitConfig&) const = default;
};

// Dense: `rows` x `cols`, rows 0..rows-1, split over the shards by row ranges. Sparse: an
// embedding table of `cols`-wide rows addressed by any 64-bit key (a hashed feature id),
// a row created on its first pull by the initializer, spread over the shards by a hash of
// the key and kept in a memory tier with RocksDB behind it (`rows` is 0).
enum class TableKind : uint8_t { kDense = 0, kSparse = 1 };
inline constexpr TableKind kMaxTableKind = TableKind::kSparse;
// "dense", "sparse".
const char* TableKindName(TableKind kind);

// A sparse table's feature admission and expiry.
struct SparseConfig {
  // A key gets a row only once it has been pulled this many times (counted in a
  // count-min sketch of bounded size); until then it reads as the initializer's value and
  // its gradients are dropped and counted. 0 or 1: every key gets a row on its first pull.
  uint32_t admit_after = 0;
  // > 0: a row not pulled or pushed for this many clocks (of the shard's minimum clock) is
  // dropped; it reads as new if it comes back. 0: rows never expire.
  int64_t expire_after_clocks = 0;
  bool operator==(const SparseConfig&) const = default;
};

struct TableSpec {
  std::string name;
  uint64_t rows = 0;  // dense only; 0 for a sparse table
  uint32_t cols = 0;  // a sparse table's embedding dimension
  OptimizerConfig optimizer;
  InitConfig init;
  TableKind kind = TableKind::kDense;
  SparseConfig sparse;  // sparse tables only
  size_t size() const { return static_cast<size_t>(rows) * cols; }
  bool operator==(const TableSpec&) const = default;
};

// A set of rows of a table: [begin, end), or explicit keys.
struct Rows {
  uint64_t begin = 0;
  uint64_t end = 0;
  std::vector<uint64_t> keys;
  bool explicit_keys = false;

  static Rows Range(uint64_t b, uint64_t e) {
    Rows r;
    r.begin = b;
    r.end = e;
    return r;
  }
  static Rows Keys(std::vector<uint64_t> k) {
    Rows r;
    r.keys = std::move(k);
    r.explicit_keys = true;
    return r;
  }
  size_t size() const { return explicit_keys ? keys.size() : static_cast<size_t>(end - begin); }
  // The i-th row named.
  uint64_t at(size_t i) const { return explicit_keys ? keys[i] : begin + i; }
};

// ---- data coverage -------------------------------------------------------------------

// The job's training set in chunks, leased per epoch by shard 0. Every worker of a job
// must use the same plan.
struct DataPlan {
  uint64_t num_samples = 0;
  uint32_t chunk_size = 1024;
  uint32_t epochs = 1;
  uint64_t seed = 1;
  bool operator==(const DataPlan&) const = default;
};

// A chunk a worker reports trained.
struct ChunkDone {
  uint32_t epoch = 0;
  uint32_t chunk = 0;
  bool operator==(const ChunkDone&) const = default;
};

// The job's progress through its data.
struct CoverageProgress {
  uint32_t epochs_done = 0;  // epochs whose every chunk was trained
  uint32_t epochs = 0;
  uint32_t chunks_done = 0;  // in the first unfinished epoch
  uint32_t num_chunks = 0;
  uint32_t chunks_leased = 0;
  bool operator==(const CoverageProgress&) const = default;
};

// The answer to a chunk request: a chunk to train, wait (the epoch's remaining chunks
// are leased to others), or finished; with the job's progress after the request.
struct ChunkGrant {
  enum class Kind : uint8_t { kChunk = 0, kWait = 1, kFinished = 2 };
  Kind kind = Kind::kWait;
  uint32_t epoch = 0;
  uint32_t chunk = 0;
  uint64_t begin = 0;  // samples [begin, end) of the training set
  uint64_t end = 0;
  uint32_t epochs_done = 0;
  uint32_t chunks_done = 0;
  uint32_t num_chunks = 0;
  bool operator==(const ChunkGrant&) const = default;
};

// ---- requests (worker or leashctl -> shard) -----------------------------------------
// Tensor bytes never sit in these: a push's gradient and a pull reply's values travel
// as a payload frame beside the decoded header.

struct RegisterRequest {
  uint64_t worker_id = 0;    // chosen by the worker, unique in the job
  uint64_t incarnation = 0;  // grows every time the worker (re)joins
  std::string name;          // for logs and status only
};
struct CreateTableRequest {
  TableSpec spec;
};
struct PullRequest {
  uint32_t table_id = 0;
  Rows rows;
  uint64_t worker_id = 0;
  int64_t clock = 0;          // the iteration the worker is about to compute
  int64_t staleness = 0;      // served once the minimum clock >= clock - staleness
  DType dtype = DType::kF32;  // encoding asked for the reply's values
};
struct PushRequest {
  uint32_t table_id = 0;
  Rows rows;
  uint64_t worker_id = 0;
  uint64_t incarnation = 0;
  uint64_t seq = 0;           // per (worker, incarnation), strictly increasing
  DType dtype = DType::kF32;  // encoding of the gradient payload
  int64_t clock_after = -1;   // >= 0: also advances the worker's clock to this
  // Work in proportion to speed: the samples behind the gradient and the job's global
  // batch per clock; the shard applies it weighted by samples / global_batch. 0: unweighted.
  uint32_t samples = 0;
  uint32_t global_batch = 0;
  // Weighted: summed with the iteration's other such pushes into one optimizer step, taken
  // when the minimum clock passes the iteration (a clock step); false: a step of its own.
  bool clock_step = false;
};
// The weight of a push under work in proportion to speed (PushRequest).
struct PushWeight {
  uint32_t samples = 0;
  uint32_t global_batch = 0;
  bool clock_step = false;
};
struct ClockRequest {
  uint64_t worker_id = 0;
  int64_t clock = 0;
  float samples_per_second = 0;  // > 0: the worker's measured speed; < 0: idle (no data)
};
struct HeartbeatRequest {
  uint64_t worker_id = 0;
  uint64_t incarnation = 0;
};
struct LeaveRequest {
  uint64_t worker_id = 0;
  uint64_t incarnation = 0;
};
struct CheckpointRequest {};
struct StatsRequest {};
struct ChunkRequest {
  uint64_t worker_id = 0;
  uint64_t incarnation = 0;
  DataPlan plan;
  std::optional<ChunkDone> done;  // a chunk trained, reported with this request
  // Work in proportion to speed: this worker's samples/s and the others' together; 0
  // where unknown (the shard then leases as usual).
  float samples_per_second = 0;
  float others_samples_per_second = 0;
};

using Request =
    std::variant<RegisterRequest, CreateTableRequest, PullRequest, PushRequest, ClockRequest,
                 HeartbeatRequest, LeaveRequest, CheckpointRequest, StatsRequest, ChunkRequest>;

// ---- replies (shard -> peer) --------------------------------------------------------

struct Welcome {
  uint32_t shard = 0;
  uint32_t num_shards = 1;
  int64_t start_clock = 0;         // the clock the worker starts at (the shard's minimum)
  uint32_t lease_ms = 0;           // heartbeats must come well within it
  int64_t recovered_clock = -1;    // clock of the snapshot the shard recovered, -1 if none
  uint64_t boot_id = 0;            // changes every time the shard process starts
  uint64_t max_message_bytes = 0;  // largest request the shard accepts (0: not said)
};
struct TableCreated {
  uint32_t table_id = 0;
  bool created = false;  // false: it existed with the same spec
};
struct PullReply {
  uint32_t table_id = 0;
  uint64_t num_rows = 0;
  uint32_t cols = 0;
  DType dtype = DType::kF32;
  int64_t min_clock = 0;  // the minimum live clock the values reflect
};
struct PushReply {
  bool applied = false;       // false: a duplicate, applied once already
  uint64_t skipped_rows = 0;  // rows left out for holding NaN or Inf
};
struct ClockReply {
  int64_t min_clock = 0;
  double cluster_samples_per_second = 0;  // the speeds the live workers reported, summed
};
struct HeartbeatReply {
  int64_t min_clock = 0;
  uint64_t boot_id = 0;  // a new value tells the client the shard restarted
};
struct LeaveReply {};
struct CheckpointReply {
  int64_t clock = 0;  // the minimum clock the snapshot holds
};

// How a replica keeps its log on disk (leash-server --durable-log).
enum class DurableLogMode : uint8_t { kOff, kWrite, kFsync };

// One shard's state, for leashctl status and tests.
struct ShardStats {
  uint32_t shard = 0;
  uint32_t num_shards = 1;
  int64_t min_clock = 0;
  uint64_t parked_pulls = 0;
  uint64_t pushes_applied = 0;
  uint64_t pulls_served = 0;
  uint64_t errors = 0;
  int64_t last_snapshot_clock = -1;
  int64_t recovered_clock = -1;
  int64_t snapshot_age_ms = -1;       // since the last snapshot; -1 if none
  CoverageProgress coverage;          // shard 0 only
  uint64_t memory_budget_bytes = 0;   // --memory-budget (0: unbounded)
  uint64_t memory_used_bytes = 0;     // sparse tiers and the cold store's caches together
  uint64_t resident_bytes = 0;        // the shard process's resident memory (VmRSS); 0: unknown
  uint32_t backup_workers = 0;        // --backup-workers
  uint64_t stale_pushes_dropped = 0;  // backup workers' pushes dropped as too stale
  uint64_t pushes_summed = 0;         // weighted pushes summed into clock steps
  uint64_t clock_steps = 0;           // clock steps applied
  // A replicated shard's primary (docs/replication.md); replicas 0: not replicated.
  uint32_t replicas = 0;
  uint32_t replica = 0;
  uint64_t term = 0;
  uint64_t log_index = 0;
  uint64_t replication_lag = 0;  // log entries its slowest in-sync backup lacks
  uint32_t replicas_in_sync = 0;
  uint64_t commit_index = 0;  // the highest entry every in-sync replica holds
  // Its durable log (leash-server --durable-log): bytes written since it started, and
  // whether a write failed (it then acknowledges nothing more and will not lead).
  DurableLogMode durable_log = DurableLogMode::kOff;
  uint64_t durable_log_bytes = 0;
  bool durable_log_failed = false;
  // The primary's view of each other replica (how far behind its log it is).
  struct Backup {
    uint32_t replica = 0;
    bool in_sync = false;
    uint64_t match_index = 0;     // it holds the primary's log up to here
    uint64_t entries_behind = 0;  // log_index - match_index
    uint64_t bytes_behind = 0;    // the messages of those entries still in the log
    int64_t ms_behind = 0;        // age of the oldest entry it lacks (0: holds the whole log)
    int64_t ms_since_ack = -1;    // since its last acknowledgement this term (-1: none)
  };
  std::vector<Backup> backups;
  struct Worker {
    uint64_t id = 0;
    uint64_t incarnation = 0;
    std::string name;
    int64_t clock = 0;
    uint64_t ms_since_heartbeat = 0;
  };
  std::vector<Worker> workers;
  struct TableStat {
    uint32_t table_id = 0;
    std::string name;
    uint64_t rows = 0;
    uint32_t cols = 0;
    uint64_t local_rows = 0;  // rows held by this shard (sparse: in both tiers)
    TableKind kind = TableKind::kDense;
    // Sparse tables only:
    uint64_t resident_rows = 0;      // in the memory tier
    uint64_t memory_bytes = 0;       // the memory tier's bytes (rows, index, sketch)
    uint64_t tier_hits = 0;          // rows found in the memory tier
    uint64_t tier_misses = 0;        // rows read from RocksDB or created
    uint64_t evictions = 0;          // rows moved out of the memory tier
    uint64_t admissions = 0;         // keys that got a row
    uint64_t unadmitted_reads = 0;   // pulls of keys not admitted yet (served the initializer)
    uint64_t dropped_gradients = 0;  // gradient rows of keys not admitted, dropped
    uint64_t expired_rows = 0;       // rows dropped for going unseen
  };
  std::vector<TableStat> tables;
};

// An error reply: the request's status, and the boot id of the shard that answered.
struct ErrorReply {
  Status status;
  uint64_t boot_id = 0;
};

using Reply = std::variant<Welcome, TableCreated, PullReply, PushReply, ClockReply, HeartbeatReply,
                           LeaveReply, CheckpointReply, ShardStats, ChunkGrant, ErrorReply>;

}  // namespace leash
