// One parameter-server shard: tables, server-side optimizers, the staleness controller,
// worker leases, exactly-once pushes and snapshots. The shard is pure request handling:
// messages come in through Handle(), replies go out through the caller's outbox, time
// comes from an injected clock and durability from an injected SnapshotStore, so tests
// drive it without sockets or disks. Serve() runs it on a ServerTransport.
// Not thread-safe: one request loop owns a Shard (Serve's stop flag is the exception).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "leash/common/message.h"
#include "leash/common/rate_limit.h"
#include "leash/common/status.h"
#include "leash/common/transport.h"
#include "leash/common/wire.h"
#include "leash/ps/clock_table.h"
#include "leash/ps/coverage.h"
#include "leash/ps/sparse_table.h"
#include "leash/ps/update_threads.h"
#include "leash/server/snapshot.h"
#include "leash/server/sparse_store.h"

namespace leash::server {

// The parameter-store core a shard serves (ps/): tables, clocks, data coverage.
using ps::ClockTable;
using ps::DataCoverage;
using ps::LiveWorker;
using ps::ParkedPulls;
using ps::Table;

// What a shard does with a push holding NaN or Inf.
enum class NonFinitePolicy {
  kReject,    // refuse the whole push with InvalidArgument
  kSkipRows,  // apply the finite rows, skip the others, report how many were skipped
};

struct ShardOptions {
  uint32_t shard = 0;
  uint32_t num_shards = 1;
  int64_t lease_ms = 10000;                // a silent worker is evicted after this long
  int64_t checkpoint_interval_ms = 60000;  // 0 disables periodic snapshots
  size_t max_message_bytes = size_t{512} << 20;
  uint64_t boot_id = 0;  // 0: a random id for this process
  NonFinitePolicy nonfinite = NonFinitePolicy::kReject;
  size_t max_parked_per_peer = 4096;  // pulls one connection may have waiting
  uint64_t max_table_values =
      uint64_t{1} << 32;  // floats of one table on this shard (optimizer state comes on top)
  WireLimits limits;
  // Memory for the sparse tables' tiers together with the cold store's block cache and
  // write buffer (SplitMemoryBudget); 0: unbounded.
  uint64_t memory_budget_bytes = 0;
  // The process's resident memory (VmRSS) for ShardStats, next to the budget; unset: 0.
  // leash-server reads /proc/self/statm.
  std::function<uint64_t()> resident_bytes;
  // What a misbehaving peer (garbage, requests over a limit) costs: the warning lines of
  // rejected requests, per peer and reason and in all, per minute; the error replies one
  // peer gets per second. The counters count every rejection all the same.
  KeyedRateLimit::Options rejection_log = {.per_key = 5, .total = 50, .window_ms = 60000};
  KeyedRateLimit::Options error_replies = {.per_key = 256, .total = 4096, .window_ms = 1000};
  // The minimum clock ignores the b slowest live workers (ClockTable); their pushes that
  // lag it by more than their staleness bound are dropped (counted in pushes_dropped_stale).
  uint32_t backup_workers = 0;
  // A replica of a replicated shard (replica.h): Tick neither evicts workers nor sweeps
  // sparse rows out; the primary decides both and logs them (ExpiredWorkers, EvictWorker,
  // SweepExpiry), so every replica applies them at the same point of the log.
  bool replicated = false;
  // Fills the replication fields of ShardStats (a Replica sets it); unset: none.
  std::function<void(ShardStats*)> replication_stats;
  // Threads that apply one large dense update together (ps::UpdateThreads), this shard's
  // request loop included: 1 applies every update on the loop alone. The tables come out
  // the same bit for bit whatever the number, so replicas may differ in it.
  int update_threads = 1;
};

// How a shard's memory budget is spent: the cold store's block cache (an eighth), its write
// buffer (a sixteenth, at most 64 MiB), and the rest shared evenly by the sparse tables'
// memory tiers (rebalanced whenever one is created). The store makes the first two one
// cache, the memtables charged to it. The cache mostly holds the index and filter
// partitions (about 2 bytes per stored row); cold data blocks in it are rarely hit again,
// so memory given to the memory tiers saves more reads (a quarter for the cache measured
// 14% more misses per batch at 4x the budget). Budget 0 (unbounded): a 64 MiB cache, a 32
// MiB write buffer and memory tiers without a bound. The one place these fractions are set.
struct MemoryBudgetSplit {
  uint64_t block_cache = 0;
  uint64_t write_buffer = 0;
  uint64_t tables = 0;  // for all sparse tables together; UINT64_MAX: unbounded
};
MemoryBudgetSplit SplitMemoryBudget(uint64_t budget_bytes);

// What leash-server with a memory budget holds beyond it (docs/sparse.md, "Memory beyond
// the budget"): its resident memory (VmRSS) stays within
//   budget + kMemoryOverheadBytes + K x SparseRequestBytesPerKey(R),
// K the keys of the largest sparse pull or push it serves, R its table's record bytes
// (ps::RowLayout::bytes(): values, optimizer state and 16). kMemoryOverheadBytes holds the
// program and its libraries (19 MiB of mapped code), the threads' stacks, RocksDB's memory
// outside its cache (flush and compaction buffers, up to 64 blocks pinned per reader
// thread while a read copies them out) and the allocator's slack, with the default 32
// reader threads. The per-key part is a request's scratch: its missed records and those written
// back, the WriteBatch and memtable they pass through, the request and reply frames.
// 96 MiB: measured 82 MiB at 20M rows and a 0.72 GB budget (bench/sparse_scale.py; the
// earlier 64 held up to 5M rows and was exceeded there by 16 MiB).
inline constexpr uint64_t kMemoryOverheadBytes = uint64_t{96} << 20;
constexpr uint64_t SparseRequestBytesPerKey(uint64_t record_bytes) {
  return 3 * record_bytes + 128;
}

struct Outgoing {
  PeerId peer;
  Message message;
};

struct ShardCounters {
  uint64_t pushes_applied = 0;
  uint64_t pushes_duplicate = 0;
  uint64_t pulls_served = 0;
  uint64_t pulls_parked = 0;
  uint64_t errors = 0;
  uint64_t evictions = 0;
  uint64_t nonfinite_pushes = 0;  // pushes that held NaN or Inf
  // pushes whose NaN/Inf check the copy out of shared memory made (Frame::finite_f32)
  uint64_t pushes_checked_in_copy = 0;
  uint64_t nonfinite_rows_skipped = 0;
  uint64_t limit_rejections =
      0;  // requests refused for exceeding a limit (the sum of the next three)
  uint64_t oversize_rejections = 0;   // message or header over --max-message-mb / the header limit
  uint64_t key_limit_rejections = 0;  // more keys than --max-keys
  uint64_t parked_limit_rejections = 0;  // a connection over --max-parked-per-peer parked pulls
  uint64_t snapshots = 0;
  uint64_t snapshot_failures = 0;
  uint64_t sparse_store_errors = 0;   // sparse pulls/pushes failed by the cold store
  uint64_t pushes_dropped_stale = 0;  // backup workers' pushes beyond the staleness bound
  uint64_t pushes_summed = 0;         // weighted pushes added into a clock step (clock_steps)
  uint64_t clock_steps = 0;           // clock steps applied, one optimizer step each
  // updates that copied a table's values first: a pull reply still queued held them
  // (Table::ReadFrame, copy on write)
  uint64_t values_copied_on_write = 0;
  // dense updates (or clock-step sums) shared by more than one thread (update_threads);
  // filled by Shard::counters() from the update threads
  uint64_t updates_split = 0;
  // passes over large frames shared by more than one thread (update_threads): pull replies
  // written into same-host rings, frames copied out of same-host peers' rings (Serve's and
  // ServeReplica's transport copier), NaN checks of pushes, a primary's copies for its
  // backups
  uint64_t passes_split = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t rejection_lines_suppressed = 0;  // warnings of rejected requests not logged
  uint64_t error_replies_suppressed = 0;    // error replies not sent (options.error_replies)
};

class Shard {
 public:
  using NowMs = std::function<int64_t()>;
  // `store` must outlive the shard. `now_ms` is a monotonic millisecond clock. `sparse`, the
  // sparse tables' cold tier (outliving the shard), checkpointed with every snapshot; null: a
  // MemorySparseStore of the shard's own.
  Shard(ShardOptions options, SnapshotStore* store, NowMs now_ms, SparseStore* sparse = nullptr);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  // Loads the store's last snapshot (tables, optimizer state, clocks) and puts the sparse
  // store back to the checkpoint that snapshot names (or empties it). Returns the
  // recovered minimum clock, or -1 for an empty store. Restored workers get a fresh
  // lease to come back. DataLoss/FailedPrecondition from the store are returned as is.
  Result<int64_t> Recover();

  // Handles one message from `peer`. Every request gets exactly one reply (now, or for a
  // parked pull when the bound allows); replies released for other peers are appended
  // too. Malformed input yields an Error reply, never a crash. A batch (wire.h
  // PackBatch) is handled message by message and its replies to `peer` are appended as
  // one batch; a malformed batch gets one Error reply with request id 0.
  void Handle(const PeerId& peer, const Message& message, std::vector<Outgoing>* out);

  // Where fp32 pull replies to a peer are written, when the transport can send some
  // memory without copying it (ServerTransport::ReservePayload); unset: ordinary memory.
  using PayloadAllocator = std::function<std::optional<WritableFrame>(const PeerId&, size_t bytes)>;
  void SetPayloadAllocator(PayloadAllocator allocator) {
    payload_allocator_ = std::move(allocator);
  }

  // Evicts workers whose lease expired (releasing pulls they held back) and writes a
  // scheduled snapshot when one is due. Returns the milliseconds until the next deadline.
  int64_t Tick(std::vector<Outgoing>* out);

  // Replication (replica.h). The workers whose lease has expired now.
  std::vector<uint64_t> ExpiredWorkers() const;
  // Evicts `worker_id` as an expired lease does (no-op for an unknown worker).
  void EvictWorker(uint64_t worker_id, std::vector<Outgoing>* out);
  // Whether a sparse expiry sweep is due now; SweepExpiry runs one.
  bool ExpirySweepDue() const;
  void SweepExpiry();
  // Gives every live worker a fresh lease from now (a new primary: its predecessor saw
  // the heartbeats).
  void RenewLeases();
  // The shard's state as a snapshot (what Checkpoint saves), without saving it.
  ShardSnapshot Snapshot() const { return MakeSnapshot(); }

  // Writes a snapshot now. Returns its minimum clock. `replica_stop`: a replica's record of
  // its clean stop, saved with this snapshot (ShardSnapshot::replica_stop).
  Result<int64_t> Checkpoint(std::string replica_stop = {});
  // The stop record of the snapshot the last Recover() loaded (empty if none).
  const std::string& recovered_replica_stop() const { return recovered_replica_stop_; }
  // The sequence and wall time of the snapshot last saved or loaded by Recover; {0, 0} if
  // none (a replica's durable log names the snapshot each of its files follows).
  std::pair<uint64_t, int64_t> snapshot_id() const {
    return {snapshot_sequence_, snapshot_unix_ms_};
  }
  // Called around the save of every snapshot Checkpoint writes (a replica's durable log,
  // replica.h): `before` with the snapshot about to be saved (an error refuses it: nothing is
  // saved and Checkpoint returns that error), `after` with whether it was saved.
  struct CheckpointHooks {
    std::function<Status(const ShardSnapshot&)> before;
    std::function<void(bool saved)> after;
  };
  void set_checkpoint_hooks(CheckpointHooks hooks) { checkpoint_hooks_ = std::move(hooks); }

  // A point-in-time image of the shard for a replica catching up (replica.cc): the
  // snapshot (dense tables copied), each sparse table's memory-tier layout (ExportTier;
  // empty for a dense table) and a view of the sparse store holding every sparse row as of
  // now (the rows changed in memory are written to the store first, as for a snapshot).
  // Errors of the sparse store.
  struct Image {
    ShardSnapshot snapshot;
    std::vector<std::vector<uint8_t>> tiers;  // by table id
    std::unique_ptr<SparseStore::Image> rows;
  };
  Result<Image> MakeImage();
  // After Recover of an image's snapshot over a store holding its rows: puts sparse table
  // `id`'s memory-tier layout back (SparseTable::ImportTier).
  Status ImportSparseTier(uint32_t id, std::span<const uint8_t> layout);

  // Called with the wall time of every snapshot written, in seconds (for a metrics
  // histogram; durations are measured on the steady clock and never steer the shard).
  using SnapshotObserver = std::function<void(double seconds)>;
  void set_snapshot_observer(SnapshotObserver observer) {
    snapshot_observer_ = std::move(observer);
  }

  int64_t min_clock() const { return clocks_.MinClock(); }
  size_t live_workers() const { return clocks_.live(); }
  // The largest clock of a live worker (the minimum clock when none is live).
  int64_t max_clock() const;
  size_t parked_pulls() const { return parked_.size(); }
  int64_t recovered_clock() const { return recovered_clock_; }
  int64_t last_snapshot_clock() const { return last_snapshot_clock_; }
  // A copy: updates_split and passes_split are read from the update threads when asked.
  ShardCounters counters() const;
  // The threads that share this shard's large updates and passes (null: its loop alone);
  // a replica's primary shares its copies for the backups with them.
  ps::UpdateThreads* update_threads() const { return update_threads_.get(); }
  const ShardOptions& options() const { return options_; }
  const DataCoverage& coverage() const { return coverage_; }
  // Table `id` if it is sparse, else null.
  const ps::SparseTable* sparse_table(uint32_t id) const {
    return id < sparse_.size() ? sparse_[id].get() : nullptr;
  }
  size_t num_tables() const { return tables_.size(); }
  // The sparse tiers and the cold store's caches (counted against memory_budget_bytes).
  uint64_t memory_used_bytes() const;

 private:
  // A pull waiting for the staleness bound: what its reply needs.
  struct ParkedPull {
    PeerId peer;
    uint64_t request_id = 0;
    uint64_t worker_id = 0;
    uint32_t table_id = 0;
    Rows rows;
    DType dtype = DType::kF32;
  };

  // The messages of a batch (wire.h), one by one; the replies to `peer` go out as one batch.
  void HandleBatch(const PeerId& peer, const Message& batch, std::vector<Outgoing>* out);
  // One decoded request to its handler. A handler answers through `out` or returns the
  // error to answer with; pulls and pushes may take their request's rows.
  Status Dispatch(const PeerId& peer, Decoded<Request>& request, std::vector<Outgoing>* out);
  Status OnRegister(const PeerId& peer, uint64_t rid, const RegisterRequest& m,
                    std::vector<Outgoing>* out);
  Status OnCreateTable(const PeerId& peer, uint64_t rid, const CreateTableRequest& m,
                       std::vector<Outgoing>* out);
  Status OnPull(const PeerId& peer, uint64_t rid, PullRequest& m, std::vector<Outgoing>* out);
  Status OnPush(const PeerId& peer, uint64_t rid, PushRequest& m, std::span<const Frame> payloads,
                std::vector<Outgoing>* out);
  Status OnClock(const PeerId& peer, uint64_t rid, const ClockRequest& m,
                 std::vector<Outgoing>* out);
  Status OnHeartbeat(const PeerId& peer, uint64_t rid, const HeartbeatRequest& m,
                     std::vector<Outgoing>* out);
  Status OnLeave(const PeerId& peer, uint64_t rid, const LeaveRequest& m,
                 std::vector<Outgoing>* out);
  Status OnCheckpoint(const PeerId& peer, uint64_t rid, std::vector<Outgoing>* out);
  Status OnStats(const PeerId& peer, uint64_t rid, std::vector<Outgoing>* out);
  Status OnChunkRequest(const PeerId& peer, uint64_t rid, const ChunkRequest& m,
                        std::vector<Outgoing>* out);

  Result<Table*> FindTable(uint32_t table_id);
  ps::SparseTable* FindSparse(uint32_t table_id) {
    return table_id < sparse_.size() ? sparse_[table_id].get() : nullptr;
  }
  const TableSpec& SpecOf(uint32_t table_id) const;
  // InvalidArgument unless `rows` names explicit keys, each owned by this shard.
  Status CheckSparseRows(const ps::SparseTable& table, const Rows& rows) const;
  // The pull reply for `rows` of sparse `table`; the cold store's error if a read fails.
  Result<Message> MakeSparsePullReply(const PeerId& peer, uint64_t rid, ps::SparseTable& table,
                                      const Rows& rows, DType dtype);
  // Gives each sparse table its share of the budget (SplitMemoryBudget).
  void RebalanceSparse();
  // The pull reply for `rows` of `table`, its values read straight into the frame sent.
  // `defer_copy`: values going into memory the transport reserved (a same-host ring) are
  // copied by the next CopyReplies, with every other reply's, instead of now.
  Message MakePullReply(const PeerId& peer, uint64_t rid, const Table& table, const Rows& rows,
                        DType dtype, bool defer_copy = false);
  // Makes the copies MakePullReply deferred, shared by the update threads.
  void CopyReplies();
  // Applies the clock steps of every iteration the minimum clock has passed, then answers
  // every parked pull the current minimum clock allows.
  void ReleasePulls(std::vector<Outgoing>* out);
  // Clock steps (PushRequest::clock_step): whether a weighted push of `w` asking for one
  // now is summed into the step of its iteration rather than applied on its own (not when
  // that step was taken already: a backup worker's late push); and applying the steps of
  // the iterations before the minimum clock (all of them once no worker is live).
  bool SumsIntoClockStep(const LiveWorker& w) const;
  void ApplyClockSteps();
  // Iterations ahead of the minimum clock with a clock step open, at most: each holds a sum
  // the size of the table.
  static constexpr int64_t kMaxClockSteps = 8;
  void Evict(uint64_t worker_id, const char* why, std::vector<Outgoing>* out);
  // Counts a push of `w` dropped as too stale (ClockTable::TooStale), with a log line at
  // most every kDroppedLogEveryMs.
  void NoteStalePushDropped(const LiveWorker& w);
  ShardSnapshot MakeSnapshot() const;
  // Adds the bytes of the replies out[from..] to counters_.bytes_out.
  void CountSent(const std::vector<Outgoing>& out, size_t from);
  // A rejected request (`rid`, 0 if unknown) of `peer`: its warning line and its error reply,
  // each within its rate limit (options_.rejection_log, options_.error_replies).
  void Reject(const PeerId& peer, uint64_t rid, const Status& st, std::vector<Outgoing>* out);

  ShardOptions options_;
  SnapshotStore* store_;
  NowMs now_ms_;
  ClockTable clocks_;
  DataCoverage coverage_;  // used on shard 0 only
  ParkedPulls<ParkedPull> parked_;
  std::vector<std::unique_ptr<Table>> tables_;            // null where the table is sparse
  std::vector<std::unique_ptr<ps::SparseTable>> sparse_;  // null where the table is dense
  std::unique_ptr<SparseStore> own_sparse_store_;
  SparseStore* sparse_store_;
  int64_t next_expire_ms_ = 0;
  std::map<std::string, uint32_t> table_by_name_;
  std::map<PeerId, size_t> parked_per_peer_;
  ShardCounters counters_;
  KeyedRateLimit rejection_log_;
  KeyedRateLimit error_replies_;
  PayloadAllocator payload_allocator_;
  std::unique_ptr<ps::UpdateThreads> update_threads_;  // null with options_.update_threads 1
  // Pull replies' copies deferred by MakePullReply, and where each starts in their sum.
  struct ReplyCopy {
    const float* from;
    float* to;
    size_t n;
  };
  std::vector<ReplyCopy> reply_copies_;
  std::vector<size_t> reply_copy_starts_;
  int64_t recovered_clock_ = -1;
  int64_t last_snapshot_clock_ = -1;
  std::string recovered_replica_stop_;
  int64_t snapshot_unix_ms_ = 0;
  CheckpointHooks checkpoint_hooks_;
  uint64_t snapshot_sequence_ = 0;
  int64_t next_snapshot_ms_ = 0;
  int64_t last_snapshot_ms_ = -1;
  SnapshotObserver snapshot_observer_;
  // The rate-limited log line of stale pushes dropped: when it was last written and the
  // count it reported.
  int64_t dropped_logged_ms_ = -1;
  uint64_t dropped_logged_ = 0;
};

// Runs `shard` on `transport` until `stop` becomes true: receives, handles, sends replies
// and ticks. Writes a final snapshot on the way out. Returns the first transport error.
// `after_tick`, if set, is called on the serving thread after every turn of the loop (at
// least every 100 ms), when the shard may be read: leash-server publishes its metrics
// there.
Status Serve(Shard& shard, ServerTransport& transport, const std::atomic<bool>& stop,
             const std::function<void(const Shard&)>& after_tick = {});

}  // namespace leash::server
