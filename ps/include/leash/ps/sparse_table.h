// A sparse embedding table's rows owned by one shard: 64-bit keys, rows created on first
// pull by the initializer, a memory tier bounded in bytes with a cold tier (a RowStore:
// RocksDB on a shard) behind it, server-side sparse optimizers that touch only the rows a
// push names, feature admission (count-min sketch) and expiry of rows unseen for a number
// of clocks. No transport and no disk of its own. Not thread-safe: owned by the shard's
// request loop (a RowStore may use threads inside one call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "leash/common/domain.h"
#include "leash/common/status.h"
#include "leash/ps/table.h"

namespace leash::ps {

// A row as stored, in both tiers: `cols` float values, then OptimizerSlots(kind) x `cols`
// floats of optimizer state, then uint64 steps (updates applied to this row: lazy Adam's
// bias correction) and int64 last_clock (the shard's minimum clock when the row was last
// pulled or pushed: expiry; a pull sets it only in a table that expires rows, so that
// elsewhere reads never dirty a row). Native byte order; a record is `bytes()` long.
struct RowLayout {
  uint32_t cols = 0;
  int slots = 0;
  static RowLayout For(const TableSpec& spec);
  size_t value_bytes() const { return size_t{cols} * 4; }
  size_t bytes() const { return size_t{cols} * 4 * (1 + static_cast<size_t>(slots)) + 16; }
};

// The tier behind the memory tier. Records are opaque bytes of a fixed size per table.
// RocksDB on a shard (server/rocksdb_row_store.h); MemoryRowStore in tests and in a
// worker's local mode. One caller thread at a time.
class RowStore {
 public:
  virtual ~RowStore() = default;
  // Reads the records of `keys` of table `table_id` into `out` (keys.size() x
  // record_bytes); found[i] says whether key i exists (out's bytes for a missing key are
  // unspecified). May read the keys in parallel. IOError/DataLoss from the disk.
  virtual Status Read(uint32_t table_id, std::span<const uint64_t> keys, size_t record_bytes,
                      uint8_t* out, std::vector<uint8_t>* found) = 0;
  // Writes the records of `keys` (keys.size() x record_bytes) and deletes `deletes`, as one
  // atomic batch.
  virtual Status Write(uint32_t table_id, std::span<const uint64_t> keys, size_t record_bytes,
                       const uint8_t* records, std::span<const uint64_t> deletes) = 0;
  // Visits, in key order, up to `limit` records of table `table_id` with keys >= *cursor,
  // then sets *cursor past the last visited and *wrapped to false; at the end of the table
  // sets *cursor to 0 and *wrapped to true. For the expiry sweep.
  virtual Status Scan(uint32_t table_id, uint64_t* cursor, size_t limit, size_t record_bytes,
                      const std::function<void(uint64_t key, const uint8_t* record)>& visit,
                      bool* wrapped) = 0;
  // Deletes every record of table `table_id`.
  virtual Status DropTable(uint32_t table_id) = 0;
  // Estimated records of table `table_id` in the store.
  virtual uint64_t ApproxRows(uint32_t table_id) const = 0;
  // Memory the store itself holds (block cache, memtables), counted in the shard's budget.
  virtual uint64_t MemoryBytes() const = 0;
};

// Records in an ordered map: for tests, fuzzing and a worker's local mode.
class MemoryRowStore final : public RowStore {
 public:
  Status Read(uint32_t table_id, std::span<const uint64_t> keys, size_t record_bytes, uint8_t* out,
              std::vector<uint8_t>* found) override;
  Status Write(uint32_t table_id, std::span<const uint64_t> keys, size_t record_bytes,
               const uint8_t* records, std::span<const uint64_t> deletes) override;
  Status Scan(uint32_t table_id, uint64_t* cursor, size_t limit, size_t record_bytes,
              const std::function<void(uint64_t key, const uint8_t* record)>& visit,
              bool* wrapped) override;
  Status DropTable(uint32_t table_id) override;
  uint64_t ApproxRows(uint32_t table_id) const override;
  uint64_t MemoryBytes() const override { return 0; }
  uint64_t writes() const { return writes_; }  // records written, for tests

 private:
  struct Key {
    uint32_t table;
    uint64_t key;
    auto operator<=>(const Key&) const = default;
  };
  std::map<Key, std::vector<uint8_t>> rows_;
  uint64_t writes_ = 0;
};

// Counters of one sparse table on one shard (ShardStats::TableStat and the metrics).
struct SparseCounters {
  uint64_t resident_rows = 0;
  uint64_t memory_bytes = 0;
  uint64_t tier_hits = 0;
  uint64_t tier_misses = 0;
  uint64_t evictions = 0;
  uint64_t admissions = 0;
  uint64_t unadmitted_reads = 0;
  uint64_t dropped_gradients = 0;
  uint64_t expired_rows = 0;
  uint64_t rows_written = 0;  // records written to the store (evictions and flushes)
  uint64_t store_rows = 0;    // ApproxRows of the store
};

struct SparseTableOptions {
  // The memory tier's budget for this table: rows, their index and the admission sketch.
  // UINT64_MAX: unbounded (no eviction).
  uint64_t memory_bytes = UINT64_MAX;
  // Count-min sketch for admission (only when admit_after > 1): `sketch_depth` rows of at
  // most `sketch_width` 8-bit counters, the width rounded down to a power of two and halved
  // until the sketch takes at most a quarter of a bounded budget, here and whenever
  // SetMemoryBudget changes the budget (a resize keeps every key's count or raises it). A
  // key counts once per Read that misses the memory tier and finds no row in the store.
  uint32_t sketch_width = 1u << 20;
  uint32_t sketch_depth = 4;
};

// Updates one row with its gradient: `values` (cols floats), `slots` (OptimizerSlots x
// cols floats, slot-major), `*steps` (this row's update count, incremented), `grad`
// (cols finite floats). L2 (weight_decay) and value clipping as the config says. Exposed
// for tests against hand-computed values. Per value w with gradient g, t = *steps + 1:
//   every optimizer but FTRL first adds L2: g += weight_decay * w.
//   SGD:      w -= lr * g
//   Momentum: v = momentum * v + g; w -= lr * v                         (slot 0: v)
//   Adagrad:  a += g^2; w -= lr * g / (sqrt(a) + epsilon)               (slot 0: a)
//   Adam:     m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;               (slots: m, v)
//             w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + epsilon)
//             lazy Adam: t counts this row's own updates, not the table's.
//   FTRL-Proximal (McMahan et al. 2013), per coordinate, l2 = weight_decay: (slots: z, n)
//             sigma = (sqrt(n + g^2) - sqrt(n)) / lr; z += g - sigma * w; n += g^2;
//             w = |z| <= l1 ? 0 : -(z - sign(z) * l1) / ((ftrl_beta + sqrt(n)) / lr + l2)
//   then, if clip_value > 0: w = clamp(w, -clip_value, clip_value).
void ApplySparseRow(const OptimizerConfig& opt, uint32_t cols, float* values, float* slots,
                    uint64_t* steps, const float* grad);

// The initial values of key `key`'s row (cols floats): value c is the dense initializer's
// formula (table.h) over a 64-bit index derived from (key, c), so a row's values depend on
// the key and the spec's initializer only: the same on any shard and in a worker's local
// mode. Optimizer state starts at zero, steps at 0.
void InitSparseRow(const InitConfig& init, uint64_t key, uint32_t cols, float* out);

class SparseTable {
 public:
  // A new, empty table (TableKind::kSparse, checked by ValidateSpec). `store` must outlive
  // the table; the table's records in it are keyed by `id`.
  static Result<std::unique_ptr<SparseTable>> Create(uint32_t id, TableSpec spec, RowStore* store,
                                                     SparseTableOptions options);
  ~SparseTable();

  uint32_t id() const;
  const TableSpec& spec() const;
  uint32_t cols() const;
  RowLayout layout() const;

  // Reads rows `keys` (any keys; the shard checks ownership) into `out` (keys.size() x
  // cols), counting each key for admission. An admitted key without a row gets one from
  // the initializer; a key not admitted yet reads as the initializer's value (no row made).
  // `clock` is the shard's minimum clock (a row's last_clock for expiry). Errors from the
  // store (the table is unchanged then).
  Status Read(std::span<const uint64_t> keys, int64_t clock, float* out);
  // Applies gradient rows (keys.size() x cols, finite) with the optimizer; a key named
  // twice is updated twice, in order. Rows of keys without a row (not admitted, or
  // expired since their pull) are dropped and counted (dropped_gradients).
  Status Apply(std::span<const uint64_t> keys, const float* grad, int64_t clock);

  // Writes every row changed since the last flush to the store, in one batch, so the store
  // alone holds the table as of now. Returns the rows written.
  Result<uint64_t> FlushDirty();
  // Drops rows not seen for spec().sparse.expire_after_clocks clocks as of `clock`,
  // visiting at most `max_rows` rows of each tier (incremental: call it every tick).
  Status Expire(int64_t clock, size_t max_rows);
  // Changes the memory tier's budget, evicting rows (written back if changed) to fit, and
  // resizes the admission sketch to the new budget (SparseTableOptions).
  Status SetMemoryBudget(uint64_t bytes);

  // Copies key's record (layout().bytes(): values, optimizer state, steps, last_clock) from
  // whichever tier holds it into `record`, changing nothing (no counting, no promotion);
  // false if the key has no row. For tests, tools and recovery checks.
  Result<bool> ReadRecord(uint64_t key, uint8_t* record) const;
  // Whether key's row is in the memory tier now.
  bool Resident(uint64_t key) const;

  // The memory tier's layout without its records: which key is in which slot with its
  // GCLOCK counter, the capacity, the hand, the expiry cursors and the admission sketch
  // (native byte order, for the same binary on another replica). With the records of the
  // store (after FlushDirty every resident row's record is in it), ImportTier rebuilds the
  // table as it is, so that eviction, admission and expiry go on as they would here.
  std::vector<uint8_t> ExportTier() const;
  // Into a table just created over a store holding the records of every key the layout
  // names (ExportTier's table after FlushDirty). A budget smaller than the layout's
  // capacity keeps the slots that fit (the others stay in the store only) and narrows the
  // sketch as SetMemoryBudget does. InvalidArgument for a malformed layout; DataLoss if a
  // resident key has no record in the store; FailedPrecondition if this table has rows.
  Status ImportTier(std::span<const uint8_t> layout);

  SparseCounters counters() const;
  // The memory tier's bytes: arena + index + admission sketch (see sparse_table.cc for the
  // formula); at most SparseTableOptions::memory_bytes (or the budget last set) whenever
  // the budget holds at least the sketch.
  uint64_t memory_bytes() const;

 private:
  class Impl;
  explicit SparseTable(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace leash::ps
