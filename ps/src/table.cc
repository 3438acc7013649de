// Dense table storage, deterministic initialization and optimizer application.
#include "leash/ps/table.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "leash/common/denormals.h"
#include "leash/kernels/cpu.h"
#include "leash/ps/sparse_table.h"

namespace leash::ps {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in (0, 1) from a hash.
double Unit(uint64_t h) {
  return (static_cast<double>(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

float InitValue(const InitConfig& init, uint64_t index) {
  uint64_t h = SplitMix64(init.seed * 0x100000001b3ULL ^ SplitMix64(index));
  switch (init.kind) {
    case InitKind::kZeros:
      return 0.f;
    case InitKind::kConstant:
      return init.scale;
    case InitKind::kUniform:
      return static_cast<float>((2.0 * Unit(h) - 1.0) * init.scale);
    case InitKind::kNormal: {
      double u1 = Unit(h);
      double u2 = Unit(SplitMix64(h));
      return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2) *
                                init.scale);
    }
  }
  return 0.f;
}

const char* InitName(InitKind kind) {
  switch (kind) {
    case InitKind::kZeros:
      return "zeros";
    case InitKind::kUniform:
      return "uniform";
    case InitKind::kNormal:
      return "normal";
    case InitKind::kConstant:
      return "constant";
  }
  return "unknown";
}

}  // namespace

int OptimizerSlots(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kMomentum:
      return 1;
    case OptimizerKind::kAdam:
      return 2;
    case OptimizerKind::kAdagrad:
      return 1;
    case OptimizerKind::kFtrl:
      return 2;  // z and n
  }
  return 0;
}

void InitSparseRow(const InitConfig& init, uint64_t key, uint32_t cols, float* out) {
  // A 64-bit index per (key, column): the dense formula over it, so a row's values depend on
  // the key and the seed only (the same on any shard and in local mode). SplitMix64 of the
  // key first, so neighbouring keys do not share indexes.
  uint64_t base = SplitMix64(key ^ 0x5bd1e9955bd1e995ULL);
  for (uint32_t c = 0; c < cols; ++c) out[c] = InitValue(init, base + c);
}

Status ValidateSpec(const TableSpec& spec) {
  if (spec.name.empty()) return InvalidArgument("table spec needs a non-empty name");
  const std::string& name = spec.name;
  if (name.size() > 256) return InvalidArgument("table name longer than 256 bytes");
  if (static_cast<int>(spec.kind) > static_cast<int>(kMaxTableKind)) {
    return InvalidArgument("table '" + name + "' names an unknown table kind");
  }
  const bool sparse = spec.kind == TableKind::kSparse;
  if (sparse) {
    if (spec.rows != 0) {
      return InvalidArgument("sparse table '" + name + "' must have rows = 0 (its rows are " +
                             "addressed by any 64-bit key), got " + std::to_string(spec.rows));
    }
    if (spec.cols == 0) {
      return InvalidArgument("sparse table '" + name + "' needs cols (its dimension) > 0");
    }
    if (spec.cols > kMaxSparseCols) {
      return InvalidArgument("sparse table '" + name + "' has rows of " +
                             std::to_string(spec.cols) + " values; at most " +
                             std::to_string(kMaxSparseCols) +
                             " (an embedding row; split wider rows over several tables)");
    }
  } else if (spec.rows == 0 || spec.cols == 0) {
    return InvalidArgument("table '" + name + "' needs rows > 0 and cols > 0, got " +
                           std::to_string(spec.rows) + " x " + std::to_string(spec.cols));
  }
  if (spec.rows > (uint64_t{1} << 40) || spec.cols > (1u << 24)) {
    return InvalidArgument("table '" + name + "' is implausibly large: " +
                           std::to_string(spec.rows) + " x " + std::to_string(spec.cols));
  }
  const OptimizerConfig& o = spec.optimizer;
  if (static_cast<int>(o.kind) > static_cast<int>(kMaxOptimizerKind)) {
    return InvalidArgument("table '" + name + "' names an unknown optimizer");
  }
  for (float x : {o.lr, o.momentum, o.beta1, o.beta2, o.epsilon, o.weight_decay}) {
    if (!std::isfinite(x) || x < 0) {
      return InvalidArgument("table '" + name +
                             "' has a negative or non-finite optimizer hyper-parameter");
    }
  }
  const std::pair<const char*, float> extra[] = {
      {"l1", o.l1}, {"ftrl_beta", o.ftrl_beta}, {"clip_value", o.clip_value}};
  for (const auto& [field, x] : extra) {
    if (!std::isfinite(x) || x < 0) {
      return InvalidArgument("table '" + name + "': optimizer " + field +
                             " must be finite and >= 0, got " + std::to_string(x));
    }
  }
  if (!sparse) {
    auto sparse_only = [&](const std::string& what) {
      return InvalidArgument("table '" + name + "' is dense, but " + what +
                             " is for sparse tables only");
    };
    if (o.kind == OptimizerKind::kFtrl) return sparse_only("the ftrl optimizer");
    if (o.clip_value != 0) return sparse_only("clip_value");
    if (spec.sparse.admit_after > 1) return sparse_only("admit_after");
    if (spec.sparse.expire_after_clocks != 0) return sparse_only("expire_after_clocks");
  }
  if (spec.sparse.expire_after_clocks < 0) {
    return InvalidArgument("table '" + name + "': expire_after_clocks must be >= 0 (0: never), " +
                           "got " + std::to_string(spec.sparse.expire_after_clocks));
  }
  if (spec.sparse.admit_after > 255) {
    return InvalidArgument("table '" + name + "': admit_after must be at most 255 (the " +
                           "admission sketch's counters saturate there), got " +
                           std::to_string(spec.sparse.admit_after));
  }
  // FTRL divides by the learning rate.
  if (o.kind == OptimizerKind::kFtrl && !(o.lr > 0)) {
    return InvalidArgument("table '" + name + "': ftrl needs lr > 0");
  }
  if (o.beta1 >= 1 || o.beta2 >= 1)
    return InvalidArgument("table '" + name + "': Adam betas must be < 1");
  // Adam and Adagrad divide by sqrt(state) + epsilon, and the state of a value that only
  // ever saw zero gradients is 0: epsilon 0 would turn such a value into NaN.
  if ((o.kind == OptimizerKind::kAdam || o.kind == OptimizerKind::kAdagrad) && !(o.epsilon > 0)) {
    return InvalidArgument("table '" + name + "': Adam and Adagrad need epsilon > 0");
  }
  if (static_cast<int>(spec.init.kind) > static_cast<int>(kMaxInitKind)) {
    return InvalidArgument("table '" + name + "' names an unknown initializer");
  }
  // A Normal draw reaches about 8.6 standard deviations: bound the scale so no initial
  // value overflows to Inf.
  if (!std::isfinite(spec.init.scale) || std::fabs(spec.init.scale) > 1e30f) {
    return InvalidArgument("table '" + name +
                           "' has a non-finite init scale or one above 1e30 in magnitude");
  }
  return Status::Ok();
}

bool SameTableSpec(const TableSpec& x, const TableSpec& y) {
  if (x == y) return true;
  if (x.name != y.name || x.rows != y.rows || x.cols != y.cols || x.kind != y.kind) return false;
  if (x.kind == TableKind::kSparse) {
    // admit_after 0 and 1 both admit every key at once.
    if (std::max(x.sparse.admit_after, 1u) != std::max(y.sparse.admit_after, 1u) ||
        x.sparse.expire_after_clocks != y.sparse.expire_after_clocks) {
      return false;
    }
  }
  const OptimizerConfig& p = x.optimizer;
  const OptimizerConfig& q = y.optimizer;
  if (p.kind != q.kind || p.lr != q.lr || p.weight_decay != q.weight_decay ||
      p.clip_value != q.clip_value) {
    return false;
  }
  switch (p.kind) {
    case OptimizerKind::kSgd:
      break;
    case OptimizerKind::kMomentum:
      if (p.momentum != q.momentum) return false;
      break;
    case OptimizerKind::kAdam:
      if (p.beta1 != q.beta1 || p.beta2 != q.beta2 || p.epsilon != q.epsilon) return false;
      break;
    case OptimizerKind::kAdagrad:
      if (p.epsilon != q.epsilon) return false;
      break;
    case OptimizerKind::kFtrl:
      if (p.l1 != q.l1 || p.ftrl_beta != q.ftrl_beta) return false;
      break;
  }
  InitKind ik = x.init.kind;
  if (ik != y.init.kind || ik == InitKind::kZeros) return ik == y.init.kind;
  if (x.init.scale != y.init.scale) return false;
  return ik == InitKind::kConstant || x.init.seed == y.init.seed;
}

std::string DescribeSpec(const TableSpec& s) {
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  const OptimizerConfig& o = s.optimizer;
  const bool sparse = s.kind == TableKind::kSparse;
  std::string out = sparse ? "sparse, keys x " + std::to_string(s.cols) + " float32, "
                           : std::to_string(s.rows) + " x " + std::to_string(s.cols) + " float32, ";
  std::string extra;
  switch (o.kind) {
    case OptimizerKind::kSgd:
      break;
    case OptimizerKind::kMomentum:
      extra = ", momentum=" + num(o.momentum);
      break;
    case OptimizerKind::kAdam:
      extra = ", beta1=" + num(o.beta1) + ", beta2=" + num(o.beta2) + ", epsilon=" + num(o.epsilon);
      break;
    case OptimizerKind::kAdagrad:
      extra = ", epsilon=" + num(o.epsilon);
      break;
    case OptimizerKind::kFtrl:
      extra = ", l1=" + num(o.l1) + ", beta=" + num(o.ftrl_beta);
      break;
  }
  if (o.clip_value > 0) extra += ", clip_value=" + num(o.clip_value);
  out += std::string(OptimizerName(o.kind)) + "(lr=" + num(o.lr) + extra +
         ", weight_decay=" + num(o.weight_decay) + "), init ";
  InitKind ik = s.init.kind;
  out += InitName(ik);
  if (ik == InitKind::kConstant) out += "(" + num(s.init.scale) + ")";
  if (ik == InitKind::kUniform || ik == InitKind::kNormal) {
    out += "(scale=" + num(s.init.scale) + ", seed=" + std::to_string(s.init.seed) + ")";
  }
  if (sparse) {
    out += ", admit after " + std::to_string(std::max(s.sparse.admit_after, 1u)) + " pull(s)";
    if (s.sparse.expire_after_clocks > 0) {
      out += ", expire after " + std::to_string(s.sparse.expire_after_clocks) + " clocks";
    }
  }
  return out;
}

Result<Table> Table::Create(uint32_t id, TableSpec spec, RowRange range, uint64_t max_values) {
  LEASH_RETURN_IF_ERROR(ValidateSpec(spec));
  if (spec.kind != TableKind::kDense) {
    return InvalidArgument("table '" + spec.name + "' is sparse; it is held by a SparseTable");
  }
  if (range.size() > max_values / spec.cols) {  // cols > 0 in a valid spec
    return ResourceExhausted(
        "table '" + spec.name + "' of " + std::to_string(spec.rows) + " x " +
        std::to_string(spec.cols) + " would put " + std::to_string(range.size()) +
        " rows on this shard, more than its limit of " + std::to_string(max_values) +
        " values per table; use more shards or a smaller table");
  }
  Table t;
  t.id_ = id;
  t.cols_ = spec.cols;
  t.range_ = range;
  t.opt_ = spec.optimizer;
  size_t n = static_cast<size_t>(range.size()) * t.cols_;
  t.values_ = std::make_shared<std::vector<float>>(n);
  std::vector<float>& values = *t.values_;
  uint64_t first = range.begin * t.cols_;
  for (size_t i = 0; i < n; ++i) values[i] = InitValue(spec.init, first + i);
  t.slots_.assign(static_cast<size_t>(OptimizerSlots(t.opt_.kind)), std::vector<float>(n, 0.f));
  t.spec_ = std::move(spec);
  return t;
}

Result<Table> Table::FromSnapshot(const TableSnapshot& snap) {
  if (Status st = ValidateSpec(snap.spec); !st.ok()) {
    return DataLoss("table " + std::to_string(snap.table_id) +
                    " has an invalid spec: " + st.message());
  }
  if (snap.spec.kind != TableKind::kDense) {
    return DataLoss("table " + std::to_string(snap.table_id) +
                    " is sparse, but its snapshot is a dense table's");
  }
  Table t;
  t.id_ = snap.table_id;
  t.spec_ = snap.spec;
  t.cols_ = snap.spec.cols;
  t.range_ = {snap.row_begin, snap.row_end};
  t.opt_ = snap.spec.optimizer;
  size_t n = static_cast<size_t>(t.range_.size()) * t.cols_;
  if (snap.cols != t.cols_ || snap.row_end < snap.row_begin || snap.row_end > t.rows() ||
      snap.values.size() != n ||
      snap.slots.size() !=
          static_cast<size_t>(OptimizerSlots(t.opt_.kind)) + snap.pending_clocks.size()) {
    return DataLoss("table '" + t.name() + "' in the snapshot has inconsistent sizes");
  }
  for (const auto& s : snap.slots) {
    if (s.size() != n)
      return DataLoss("table '" + t.name() + "' has an optimizer slot of the wrong size");
  }
  t.values_ = std::make_shared<std::vector<float>>(snap.values);
  const size_t optimizer_slots = static_cast<size_t>(OptimizerSlots(t.opt_.kind));
  t.slots_.assign(snap.slots.begin(), snap.slots.begin() + optimizer_slots);
  for (size_t i = 0; i < snap.pending_clocks.size(); ++i) {
    if (i > 0 && snap.pending_clocks[i] <= snap.pending_clocks[i - 1]) {
      return DataLoss("table '" + t.name() + "' has pending clock steps out of order");
    }
    t.pending_[snap.pending_clocks[i]] = snap.slots[optimizer_slots + i];
  }
  t.steps_ = snap.optimizer_steps;
  return t;
}

TableSnapshot Table::ToSnapshot() const {
  TableSnapshot s;
  s.table_id = id_;
  s.spec = spec_;
  s.row_begin = range_.begin;
  s.row_end = range_.end;
  s.cols = cols_;
  s.values = *values_;
  s.slots = slots_;
  s.optimizer_steps = steps_;
  for (const auto& [clock, sum] : pending_) {
    s.pending_clocks.push_back(clock);
    s.slots.push_back(sum);
  }
  return s;
}

Status Table::CheckInTable(const Rows& rows) const {
  if (rows.explicit_keys) {
    for (uint64_t k : rows.keys) {
      if (k >= this->rows()) {
        return InvalidArgument("key " + std::to_string(k) + " is out of range for a table of " +
                               std::to_string(this->rows()) + " rows");
      }
    }
    return Status::Ok();
  }
  if (rows.begin > rows.end || rows.end > this->rows()) {
    return InvalidArgument("row range [" + std::to_string(rows.begin) + ", " +
                           std::to_string(rows.end) + ") is not inside a table of " +
                           std::to_string(this->rows()) + " rows");
  }
  return Status::Ok();
}

Status Table::CheckOwned(const Rows& rows) const {
  auto not_owned = [&](uint64_t a, uint64_t b) {
    return InvalidArgument("rows [" + std::to_string(a) + ", " + std::to_string(b) +
                           ") of table '" + name() + "' are not held by this shard, which holds [" +
                           std::to_string(range_.begin) + ", " + std::to_string(range_.end) +
                           "); is --servers listed in the same order everywhere?");
  };
  if (rows.explicit_keys) {
    for (uint64_t k : rows.keys) {
      if (k < range_.begin || k >= range_.end) return not_owned(k, k + 1);
    }
    return Status::Ok();
  }
  if (rows.begin < range_.begin || rows.end > range_.end) return not_owned(rows.begin, rows.end);
  return Status::Ok();
}

void Table::Read(const Rows& rows, float* out) const {
  if (rows.explicit_keys) {
    for (size_t i = 0; i < rows.keys.size(); ++i) {
      std::memcpy(out + i * cols_, values_->data() + (rows.keys[i] - range_.begin) * cols_,
                  cols_ * sizeof(float));
    }
    return;
  }
  size_t n = static_cast<size_t>(rows.end - rows.begin) * cols_;
  if (n > 0)
    std::memcpy(out, values_->data() + (rows.begin - range_.begin) * cols_, n * sizeof(float));
}

std::optional<std::span<const float>> Table::RangeValues(const Rows& rows) const {
  if (rows.explicit_keys) return std::nullopt;
  const size_t n = static_cast<size_t>(rows.end - rows.begin) * cols_;
  return std::span<const float>(values_->data() + (rows.begin - range_.begin) * cols_, n);
}

Frame Table::ReadFrame(const Rows& rows) const {
  if (auto span = RangeValues(rows)) {
    if (span->empty()) return Frame();
    return Frame::Wrap(span->data(), span->size_bytes(), values_);
  }
  std::shared_ptr<float[]> copy(new float[rows.size() * cols_]);
  Read(rows, copy.get());
  float* data = copy.get();
  return Frame::Wrap(data, rows.size() * cols_ * sizeof(float), std::move(copy));
}

void Table::MakeValuesWritable() {
  if (values_.use_count() > 1) {
    values_ = std::make_shared<std::vector<float>>(*values_);
    ++copies_on_write_;
  }
  // A frame may have let go of the values on another thread (a transport's, once sent): its
  // reads of them happen before the writes that follow (the release is a release operation).
  std::atomic_thread_fence(std::memory_order_acquire);
}

void Table::ApplyRow(size_t offset, size_t n, const float* g) {
  auto len = static_cast<int64_t>(n);
  float* w = values_->data() + offset;
  switch (opt_.kind) {
    case OptimizerKind::kSgd:
      kernels::cpu::SgdUpdate(len, {opt_.lr, opt_.weight_decay}, g, w);
      break;
    case OptimizerKind::kMomentum:
      kernels::cpu::MomentumUpdate(len, {opt_.lr, opt_.momentum, opt_.weight_decay}, g, w,
                                   slots_[0].data() + offset);
      break;
    case OptimizerKind::kAdam:
      kernels::cpu::AdamUpdate(
          len, {opt_.lr, opt_.beta1, opt_.beta2, opt_.epsilon, opt_.weight_decay},
          static_cast<int64_t>(steps_), g, w, slots_[0].data() + offset, slots_[1].data() + offset);
      break;
    case OptimizerKind::kAdagrad:
      kernels::cpu::AdagradUpdate(len, {opt_.lr, opt_.epsilon, opt_.weight_decay}, g, w,
                                  slots_[0].data() + offset);
      break;
    case OptimizerKind::kFtrl:
      LEASH_CHECK(false);  // ValidateSpec refuses FTRL on a dense table
      break;
  }
}

void Table::ApplyRowScaled(size_t offset, size_t n, const float* g, float scale) {
  // Every optimizer here is elementwise, so updating block by block is the whole update.
  constexpr size_t kBlock = 2048;  // 8 KB of scaled gradient
  std::array<float, kBlock> scaled;
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t len = std::min(kBlock, n - i);
    kernels::cpu::Scale(static_cast<int64_t>(len), scale, g + i, scaled.data());
    ApplyRow(offset + i, len, scaled.data());
  }
}

void Table::Apply(const Rows& rows, const float* grad, float scale, UpdateThreads* threads) {
  // Optimizer state decaying without gradient must not sink into the subnormal range (the
  // threads run under this thread's mode).
  ScopedFlushDenormals flush;
  MakeValuesWritable();
  ++steps_;
  auto apply = [&](size_t offset, size_t n, const float* g) {
    if (scale == 1.f) {
      ApplyRow(offset, n, g);
    } else {
      ApplyRowScaled(offset, n, g, scale);
    }
  };
  ForEachSpan(rows, grad, [&](size_t offset, size_t n, const float* g) {
    if (threads == nullptr) return apply(offset, n, g);
    threads->Run(n, [&](size_t b, size_t e) { apply(offset + b, e - b, g + b); });
  });
}

void Table::Accumulate(int64_t clock, const Rows& rows, const float* grad, float scale,
                       UpdateThreads* threads) {
  auto [it, fresh] = pending_.try_emplace(clock);
  std::vector<float>& sum = it->second;
  if (fresh) sum.assign(values_->size(), 0.f);
  auto add = [&](size_t offset, size_t n, const float* g) {
    kernels::cpu::Axpy(static_cast<int64_t>(n), scale, g, sum.data() + offset);
  };
  ForEachSpan(rows, grad, [&](size_t offset, size_t n, const float* g) {
    if (threads == nullptr) return add(offset, n, g);
    threads->Run(n, [&](size_t b, size_t e) { add(offset + b, e - b, g + b); });
  });
}

size_t Table::ApplyPendingBefore(int64_t clock, UpdateThreads* threads) {
  size_t steps = 0;
  while (!pending_.empty() && pending_.begin()->first < clock) {
    Apply(Rows::Range(range_.begin, range_.end), pending_.begin()->second.data(), 1.f, threads);
    pending_.erase(pending_.begin());
    ++steps;
  }
  return steps;
}

}  // namespace leash::ps
