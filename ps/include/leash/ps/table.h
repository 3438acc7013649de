// One dense table's rows owned by this shard, with its server-side optimizer.
// Not thread-safe: owned by the shard's request loop.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "leash/common/domain.h"
#include "leash/common/message.h"
#include "leash/common/partition.h"
#include "leash/common/status.h"
#include "leash/ps/update_threads.h"

namespace leash::ps {

// Everything a shard must remember about one table to carry on after a restart.
struct TableSnapshot {
  uint32_t table_id = 0;
  // The table's spec as created (normalized by ValidateSpec), so a re-created table can
  // be compared with the original.
  TableSpec spec;
  uint64_t row_begin = 0;  // rows [row_begin, row_end) of the table live on this shard
  uint64_t row_end = 0;
  uint32_t cols = 0;
  std::vector<float> values;  // (row_end - row_begin) * cols
  // Optimizer state, each the size of values, followed by the table's pending clock steps
  // (Table::Accumulate): the summed weighted gradient of each, the size of values too.
  std::vector<std::vector<float>> slots;
  uint64_t optimizer_steps = 0;  // updates applied (Adam bias correction)
  // The iterations of the pending clock steps at the end of `slots`, ascending.
  std::vector<int64_t> pending_clocks;
};

// Number of optimizer state slots each optimizer keeps per value.
int OptimizerSlots(OptimizerKind kind);

// The widest row of a sparse table: its record (values and optimizer state) is allocated
// and moved whole, a chunk of rows at a time.
inline constexpr uint32_t kMaxSparseCols = 4096;

// Validates a table spec (name, positive sizes, known optimizer and initializer, sane
// hyper-parameters); InvalidArgument saying what is wrong otherwise. A sparse table has
// rows == 0 and cols > 0; FTRL, clip_value, admit_after > 1 and expire_after_clocks are
// for sparse tables only.
Status ValidateSpec(const TableSpec& spec);

// Whether two valid specs describe the same table: same name, rows and cols (values are
// always float32 on a shard; the wire dtype is chosen per request, not per table), the same
// optimizer kind and the hyper-parameters that kind uses (lr and weight decay always;
// momentum for Momentum; beta1, beta2 and epsilon for Adam; epsilon for Adagrad), and the
// same initializer (kind; scale unless Zeros; seed for Uniform and Normal); the same kind,
// clip_value, FTRL's l1 and beta, and a sparse table's admission and expiry. Fields the
// optimizer or initializer ignores do not count, so specs that behave alike match.
bool SameTableSpec(const TableSpec& a, const TableSpec& b);

// A spec for people: "784 x 256 float32, adam(lr=0.001, ...), init uniform(...)".
std::string DescribeSpec(const TableSpec& spec);

class Table {
 public:
  // Builds the table from `spec` (checked by ValidateSpec), owning rows `range`,
  // initialized by its initializer (the same global row gets the same value on any
  // shard). InvalidArgument for an invalid spec; ResourceExhausted if the rows of
  // `range` hold more than `max_values` floats.
  static Result<Table> Create(uint32_t id, TableSpec spec, RowRange range,
                              uint64_t max_values = UINT64_MAX);
  // Rebuilds a table from a snapshot; DataLoss if sizes do not add up.
  static Result<Table> FromSnapshot(const TableSnapshot& snap);
  TableSnapshot ToSnapshot() const;

  uint32_t id() const { return id_; }
  const std::string& name() const { return spec_.name; }
  uint64_t rows() const { return spec_.rows; }
  uint32_t cols() const { return spec_.cols; }
  RowRange range() const { return range_; }
  const TableSpec& spec() const { return spec_; }
  uint64_t steps() const { return steps_; }

  // InvalidArgument unless `rows` lie inside the table (keys in range, begin <= end).
  Status CheckInTable(const Rows& rows) const;
  // InvalidArgument unless every row of `rows` is owned by this shard.
  Status CheckOwned(const Rows& rows) const;
  // Copies the values of `rows` (row-major) into out (rows.size() * cols floats).
  void Read(const Rows& rows, float* out) const;
  // The values of `rows` as a frame to send, as Read would give them now. A range of rows is
  // the table's own memory, not a copy: the frame keeps it alive, and an update that finds a
  // frame still holding it copies the values first and updates the copy (copy on write), so a
  // frame never changes once made and a reply already sent costs no copy at all. Explicit
  // keys are copied. The frame may be released on any thread.
  Frame ReadFrame(const Rows& rows) const;
  // A range of rows' values in place (to encode them), valid until the next update; nullopt
  // for explicit keys.
  std::optional<std::span<const float>> RangeValues(const Rows& rows) const;
  // Updates that had to copy the values because a frame still held them (ReadFrame).
  uint64_t copies_on_write() const { return copies_on_write_; }
  // Applies one gradient (rows.size() * cols floats, finite) with the optimizer, each value
  // multiplied by `scale` first (a push weighted by its samples; 0 < scale <= 1). The result
  // is bit for bit that of applying a copy of grad so multiplied, without making the copy.
  // `threads` (optional) share a range of rows large enough to split; the result is the
  // same bit for bit with or without them, whatever their number.
  void Apply(const Rows& rows, const float* grad, float scale = 1.f,
             UpdateThreads* threads = nullptr);

  // Clock steps (work in proportion to speed): adds grad * scale into the summed gradient
  // of iteration `clock`, applied later by ApplyPendingBefore as one optimizer step, so the
  // weighted pushes of one iteration update the table exactly as one push of their sum
  // (one momentum or Adam step on the global batch). Rows no push of the iteration named
  // get a zero gradient in that step, as a dense model's rows do in one large batch.
  void Accumulate(int64_t clock, const Rows& rows, const float* grad, float scale,
                  UpdateThreads* threads = nullptr);
  // Applies the pending sum of every iteration before `clock`, oldest first, each as one
  // step over the table's rows; returns how many steps it took.
  size_t ApplyPendingBefore(int64_t clock, UpdateThreads* threads = nullptr);
  // Iterations with a pending sum.
  size_t pending() const { return pending_.size(); }

 private:
  Table() = default;
  // Before any write to the values: copies them if a frame of ReadFrame still holds them.
  void MakeValuesWritable();
  void ApplyRow(size_t offset, size_t n, const float* g);
  // ApplyRow of g * scale, scaled a block at a time into a buffer that stays in L1.
  void ApplyRowScaled(size_t offset, size_t n, const float* g, float scale);
  // Calls fn(offset into values_, floats, their gradient) for each contiguous span of `rows`
  // (one per key, or the range whole), `grad` holding rows.size() * cols floats.
  template <typename Fn>
  void ForEachSpan(const Rows& rows, const float* grad, Fn fn) const {
    if (rows.explicit_keys) {
      for (size_t i = 0; i < rows.keys.size(); ++i) {
        fn((rows.keys[i] - range_.begin) * cols_, cols_, grad + i * cols_);
      }
      return;
    }
    fn((rows.begin - range_.begin) * cols_, static_cast<size_t>(rows.end - rows.begin) * cols_,
       grad);
  }

  uint32_t id_ = 0;
  TableSpec spec_;
  uint32_t cols_ = 0;  // spec_.cols, read on every row
  RowRange range_;
  OptimizerConfig opt_;
  // Shared with the frames of ReadFrame (copy on write); never null in a built table.
  std::shared_ptr<std::vector<float>> values_;
  uint64_t copies_on_write_ = 0;
  std::vector<std::vector<float>> slots_;
  uint64_t steps_ = 0;
  // Accumulate's sums by iteration, each the size of values_.
  std::map<int64_t, std::vector<float>> pending_;
};

}  // namespace leash::ps
