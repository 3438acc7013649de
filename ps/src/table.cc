// Dense table storage, deterministic initialization and optimizer application.
#include "leash/ps/table.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "leash/kernels/cpu.h"

namespace leash::ps {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in (0, 1) from a hash.
double Unit(uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

float InitValue(const wire::InitSpec* init, uint64_t index) {
  if (init == nullptr) return 0.f;
  uint64_t h = SplitMix64(init->seed() * 0x100000001b3ULL ^ SplitMix64(index));
  switch (init->kind()) {
    case wire::InitKind::Zeros: return 0.f;
    case wire::InitKind::Constant: return init->scale();
    case wire::InitKind::Uniform: return static_cast<float>((2.0 * Unit(h) - 1.0) * init->scale());
    case wire::InitKind::Normal: {
      double u1 = Unit(h);
      double u2 = Unit(SplitMix64(h));
      return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2) * init->scale());
    }
  }
  return 0.f;
}

OptimizerConfig ReadOptimizer(const wire::OptimizerSpec* o) {
  OptimizerConfig c;
  if (o == nullptr) return c;
  c.kind = o->kind();
  c.lr = o->learning_rate();
  c.momentum = o->momentum();
  c.beta1 = o->beta1();
  c.beta2 = o->beta2();
  c.epsilon = o->epsilon();
  c.weight_decay = o->weight_decay();
  return c;
}

const wire::TableSpec* ParseCanonical(const std::vector<uint8_t>& bytes) {
  flatbuffers::Verifier v(bytes.data(), bytes.size());
  if (!v.VerifyBuffer<wire::TableSpec>(nullptr)) return nullptr;
  return flatbuffers::GetRoot<wire::TableSpec>(bytes.data());
}

}  // namespace

int OptimizerSlots(wire::OptimizerKind kind) {
  switch (kind) {
    case wire::OptimizerKind::SGD: return 0;
    case wire::OptimizerKind::Momentum: return 1;
    case wire::OptimizerKind::Adam: return 2;
    case wire::OptimizerKind::Adagrad: return 1;
  }
  return 0;
}

Result<std::vector<uint8_t>> CanonicalSpec(const wire::TableSpec* spec) {
  if (spec == nullptr || spec->name() == nullptr || spec->name()->size() == 0) {
    return InvalidArgument("table spec needs a non-empty name");
  }
  std::string name = spec->name()->str();
  if (name.size() > 256) return InvalidArgument("table name longer than 256 bytes");
  if (spec->rows() == 0 || spec->cols() == 0) {
    return InvalidArgument("table '" + name + "' needs rows > 0 and cols > 0, got " + std::to_string(spec->rows()) +
                           " x " + std::to_string(spec->cols()));
  }
  if (spec->rows() > (uint64_t{1} << 40) || spec->cols() > (1u << 24)) {
    return InvalidArgument("table '" + name + "' is implausibly large: " + std::to_string(spec->rows()) + " x " +
                           std::to_string(spec->cols()));
  }
  OptimizerConfig o = ReadOptimizer(spec->optimizer());
  if (static_cast<int>(o.kind) > static_cast<int>(wire::OptimizerKind::MAX)) {
    return InvalidArgument("table '" + name + "' names an unknown optimizer");
  }
  for (float x : {o.lr, o.momentum, o.beta1, o.beta2, o.epsilon, o.weight_decay}) {
    if (!std::isfinite(x) || x < 0) {
      return InvalidArgument("table '" + name + "' has a negative or non-finite optimizer hyper-parameter");
    }
  }
  if (o.beta1 >= 1 || o.beta2 >= 1) return InvalidArgument("table '" + name + "': Adam betas must be < 1");
  // Adam and Adagrad divide by sqrt(state) + epsilon, and the state of a value that only
  // ever saw zero gradients is 0: epsilon 0 would turn such a value into NaN.
  if ((o.kind == wire::OptimizerKind::Adam || o.kind == wire::OptimizerKind::Adagrad) && !(o.epsilon > 0)) {
    return InvalidArgument("table '" + name + "': Adam and Adagrad need epsilon > 0");
  }
  const wire::InitSpec* init = spec->init();
  if (init != nullptr) {
    if (static_cast<int>(init->kind()) > static_cast<int>(wire::InitKind::MAX)) {
      return InvalidArgument("table '" + name + "' names an unknown initializer");
    }
    // A Normal draw reaches about 8.6 standard deviations: bound the scale so no initial
    // value overflows to Inf.
    if (!std::isfinite(init->scale()) || std::fabs(init->scale()) > 1e30f) {
      return InvalidArgument("table '" + name + "' has a non-finite init scale or one above 1e30 in magnitude");
    }
  }
  flatbuffers::FlatBufferBuilder fbb(128);
  auto n = fbb.CreateString(name);
  auto opt = wire::CreateOptimizerSpec(fbb, o.kind, o.lr, o.momentum, o.beta1, o.beta2, o.epsilon, o.weight_decay);
  auto in = init ? wire::CreateInitSpec(fbb, init->kind(), init->scale(), init->seed()) : wire::CreateInitSpec(fbb);
  fbb.Finish(wire::CreateTableSpec(fbb, n, spec->rows(), spec->cols(), opt, in));
  return std::vector<uint8_t>(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

bool SameTableSpec(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a == b) return true;
  const wire::TableSpec* x = ParseCanonical(a);
  const wire::TableSpec* y = ParseCanonical(b);
  if (x == nullptr || y == nullptr) return false;
  if (x->name()->str() != y->name()->str() || x->rows() != y->rows() || x->cols() != y->cols()) return false;
  OptimizerConfig p = ReadOptimizer(x->optimizer());
  OptimizerConfig q = ReadOptimizer(y->optimizer());
  if (p.kind != q.kind || p.lr != q.lr || p.weight_decay != q.weight_decay) return false;
  switch (p.kind) {
    case wire::OptimizerKind::SGD: break;
    case wire::OptimizerKind::Momentum:
      if (p.momentum != q.momentum) return false;
      break;
    case wire::OptimizerKind::Adam:
      if (p.beta1 != q.beta1 || p.beta2 != q.beta2 || p.epsilon != q.epsilon) return false;
      break;
    case wire::OptimizerKind::Adagrad:
      if (p.epsilon != q.epsilon) return false;
      break;
  }
  wire::InitKind ik = x->init() ? x->init()->kind() : wire::InitKind::Zeros;
  wire::InitKind jk = y->init() ? y->init()->kind() : wire::InitKind::Zeros;
  if (ik != jk || ik == wire::InitKind::Zeros) return ik == jk;
  if (x->init()->scale() != y->init()->scale()) return false;
  return ik == wire::InitKind::Constant || x->init()->seed() == y->init()->seed();
}

std::string DescribeSpec(const std::vector<uint8_t>& canonical) {
  const wire::TableSpec* s = ParseCanonical(canonical);
  if (s == nullptr) return "(unreadable spec)";
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  OptimizerConfig o = ReadOptimizer(s->optimizer());
  std::string out = std::to_string(s->rows()) + " x " + std::to_string(s->cols()) + " float32, ";
  std::string extra;
  switch (o.kind) {
    case wire::OptimizerKind::SGD: break;
    case wire::OptimizerKind::Momentum: extra = ", momentum=" + num(o.momentum); break;
    case wire::OptimizerKind::Adam:
      extra = ", beta1=" + num(o.beta1) + ", beta2=" + num(o.beta2) + ", epsilon=" + num(o.epsilon);
      break;
    case wire::OptimizerKind::Adagrad: extra = ", epsilon=" + num(o.epsilon); break;
  }
  std::string kind = wire::EnumNameOptimizerKind(o.kind);
  for (char& c : kind) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  out += kind + "(lr=" + num(o.lr) + extra + ", weight_decay=" + num(o.weight_decay) + "), init ";
  wire::InitKind ik = s->init() ? s->init()->kind() : wire::InitKind::Zeros;
  std::string init = wire::EnumNameInitKind(ik);
  for (char& c : init) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  out += init;
  if (ik == wire::InitKind::Constant) out += "(" + num(s->init()->scale()) + ")";
  if (ik == wire::InitKind::Uniform || ik == wire::InitKind::Normal) {
    out += "(scale=" + num(s->init()->scale()) + ", seed=" + std::to_string(s->init()->seed()) + ")";
  }
  return out;
}

Result<Table> Table::Create(uint32_t id, std::vector<uint8_t> canonical_spec, RowRange range, uint64_t max_values) {
  const wire::TableSpec* spec = ParseCanonical(canonical_spec);
  if (spec == nullptr) return Internal("canonical table spec does not verify");
  if (range.size() > max_values / spec->cols()) {  // cols > 0 in a canonical spec
    return ResourceExhausted("table '" + spec->name()->str() + "' of " + std::to_string(spec->rows()) + " x " +
                             std::to_string(spec->cols()) + " would put " + std::to_string(range.size()) +
                             " rows on this shard, more than its limit of " + std::to_string(max_values) +
                             " values per table; use more shards or a smaller table");
  }
  Table t;
  t.id_ = id;
  t.name_ = spec->name()->str();
  t.rows_ = spec->rows();
  t.cols_ = spec->cols();
  t.range_ = range;
  t.opt_ = ReadOptimizer(spec->optimizer());
  size_t n = static_cast<size_t>(range.size()) * t.cols_;
  t.values_.resize(n);
  uint64_t first = range.begin * t.cols_;
  for (size_t i = 0; i < n; ++i) t.values_[i] = InitValue(spec->init(), first + i);
  t.slots_.assign(static_cast<size_t>(OptimizerSlots(t.opt_.kind)), std::vector<float>(n, 0.f));
  t.spec_ = std::move(canonical_spec);
  return t;
}

Result<Table> Table::FromSnapshot(const TableSnapshot& snap) {
  const wire::TableSpec* spec = ParseCanonical(snap.spec);
  if (spec == nullptr) return DataLoss("table " + std::to_string(snap.table_id) + " has an unreadable spec");
  Table t;
  t.id_ = snap.table_id;
  t.name_ = spec->name()->str();
  t.rows_ = spec->rows();
  t.cols_ = spec->cols();
  t.range_ = {snap.row_begin, snap.row_end};
  t.opt_ = ReadOptimizer(spec->optimizer());
  size_t n = static_cast<size_t>(t.range_.size()) * t.cols_;
  if (snap.cols != t.cols_ || snap.row_end < snap.row_begin || snap.row_end > t.rows_ || snap.values.size() != n ||
      snap.slots.size() != static_cast<size_t>(OptimizerSlots(t.opt_.kind))) {
    return DataLoss("table '" + t.name_ + "' in the snapshot has inconsistent sizes");
  }
  for (const auto& s : snap.slots) {
    if (s.size() != n) return DataLoss("table '" + t.name_ + "' has an optimizer slot of the wrong size");
  }
  t.values_ = snap.values;
  t.slots_ = snap.slots;
  t.steps_ = snap.optimizer_steps;
  t.spec_ = snap.spec;
  return t;
}

TableSnapshot Table::ToSnapshot() const {
  TableSnapshot s;
  s.table_id = id_;
  s.spec = spec_;
  s.row_begin = range_.begin;
  s.row_end = range_.end;
  s.cols = cols_;
  s.values = values_;
  s.slots = slots_;
  s.optimizer_steps = steps_;
  return s;
}

Status Table::CheckOwned(const Rows& rows) const {
  auto not_owned = [&](uint64_t a, uint64_t b) {
    return InvalidArgument("rows [" + std::to_string(a) + ", " + std::to_string(b) + ") of table '" + name_ +
                           "' are not held by this shard, which holds [" + std::to_string(range_.begin) + ", " +
                           std::to_string(range_.end) + "); is --servers listed in the same order everywhere?");
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
      std::memcpy(out + i * cols_, values_.data() + (rows.keys[i] - range_.begin) * cols_, cols_ * sizeof(float));
    }
    return;
  }
  size_t n = static_cast<size_t>(rows.end - rows.begin) * cols_;
  if (n > 0) std::memcpy(out, values_.data() + (rows.begin - range_.begin) * cols_, n * sizeof(float));
}

void Table::ApplyRow(size_t offset, size_t n, const float* g) {
  auto len = static_cast<int64_t>(n);
  float* w = values_.data() + offset;
  switch (opt_.kind) {
    case wire::OptimizerKind::SGD:
      kernels::cpu::SgdUpdate(len, {opt_.lr, opt_.weight_decay}, g, w);
      break;
    case wire::OptimizerKind::Momentum:
      kernels::cpu::MomentumUpdate(len, {opt_.lr, opt_.momentum, opt_.weight_decay}, g, w, slots_[0].data() + offset);
      break;
    case wire::OptimizerKind::Adam:
      kernels::cpu::AdamUpdate(len, {opt_.lr, opt_.beta1, opt_.beta2, opt_.epsilon, opt_.weight_decay},
                               static_cast<int64_t>(steps_), g, w, slots_[0].data() + offset,
                               slots_[1].data() + offset);
      break;
    case wire::OptimizerKind::Adagrad:
      kernels::cpu::AdagradUpdate(len, {opt_.lr, opt_.epsilon, opt_.weight_decay}, g, w, slots_[0].data() + offset);
      break;
  }
}

void Table::Apply(const Rows& rows, const float* grad) {
  ++steps_;
  if (rows.explicit_keys) {
    for (size_t i = 0; i < rows.keys.size(); ++i) {
      ApplyRow((rows.keys[i] - range_.begin) * cols_, cols_, grad + i * cols_);
    }
    return;
  }
  ApplyRow((rows.begin - range_.begin) * cols_, static_cast<size_t>(rows.end - rows.begin) * cols_, grad);
}

}  // namespace leash::ps
