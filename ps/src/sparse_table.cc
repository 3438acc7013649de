// Sparse tables: the memory tier (a fixed-record arena, an open-addressing index and a
// GCLOCK hand), promotion from and write-back to a RowStore, admission (count-min sketch),
// expiry, the sparse optimizers, and MemoryRowStore. Not thread-safe (see the header).
//
// Memory accounting. The memory tier holds, and memory_bytes() counts exactly:
//   arena:  capacity x stride bytes, stride = align8(12 + RowLayout::bytes()), the 12 being
//           the slot header (key 8, GCLOCK counter 1, dirty 1, pinned 1, pad 1);
//   index:  4 bytes per bucket, buckets = max(16, next power of two >= 2 x capacity), 0 when
//           the capacity is 0 (load factor <= 1/2: short linear probes);
//   sketch: sketch_depth x sketch_width bytes when admit_after > 1, else nothing.
// So a resident row costs stride + 8..16 bytes of index, e.g. 16 columns with Adam:
// record 208 B, stride 224 B, about 232-240 B per row. The capacity is the largest one
// whose total fits the budget, so memory_bytes() <= budget always holds once the budget
// holds the sketch (the sketch is sized at Create to at most a quarter of a bounded
// budget; SetMemoryBudget resizes it likewise). Not counted (the stated fixed overhead):
// the Impl object and chunk pointers (a few hundred bytes plus 8 per 4096 rows), and
// per-call scratch proportional to the keys of one Read/Apply (their missed records) or,
// during FlushDirty, one 2 MiB batch (kFlushBatchBytes).
// Growing the arena allocates one more chunk (no copy of the others); growing the index
// rehashes it, briefly holding the old and the new bucket arrays.
#include "leash/ps/sparse_table.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "leash/common/denormals.h"
#include "leash/kernels/cpu.h"

namespace leash::ps {

// ---------------------------------------------------------------------------------------
// RowLayout, optimizers

RowLayout RowLayout::For(const TableSpec& spec) {
  return RowLayout{spec.cols, OptimizerSlots(spec.optimizer.kind)};
}

void ApplySparseRow(const OptimizerConfig& o, uint32_t cols, float* w, float* slots,
                    uint64_t* steps, const float* g) {
  auto n = static_cast<int64_t>(cols);
  ++*steps;
  switch (o.kind) {
    case OptimizerKind::kSgd:
      kernels::cpu::SgdUpdate(n, {o.lr, o.weight_decay}, g, w);
      break;
    case OptimizerKind::kMomentum:
      kernels::cpu::MomentumUpdate(n, {o.lr, o.momentum, o.weight_decay}, g, w, slots);
      break;
    case OptimizerKind::kAdam:
      kernels::cpu::AdamUpdate(n, {o.lr, o.beta1, o.beta2, o.epsilon, o.weight_decay},
                               static_cast<int64_t>(*steps), g, w, slots, slots + cols);
      break;
    case OptimizerKind::kAdagrad:
      kernels::cpu::AdagradUpdate(n, {o.lr, o.epsilon, o.weight_decay}, g, w, slots);
      break;
    case OptimizerKind::kFtrl: {
      float* z = slots;
      float* acc = slots + cols;
      const float inv_lr = 1.f / o.lr;
      for (uint32_t i = 0; i < cols; ++i) {
        const float gi = g[i];
        const float n_old = acc[i];
        const float n_new = n_old + gi * gi;
        const float sigma = (std::sqrt(n_new) - std::sqrt(n_old)) * inv_lr;
        z[i] += gi - sigma * w[i];
        acc[i] = n_new;
        const float zi = z[i];
        if (std::fabs(zi) <= o.l1) {
          w[i] = 0.f;
        } else {
          const float sign = zi < 0 ? -1.f : 1.f;
          w[i] = -(zi - sign * o.l1) / ((o.ftrl_beta + std::sqrt(n_new)) * inv_lr + o.weight_decay);
        }
      }
      break;
    }
  }
  if (o.clip_value > 0) {
    for (uint32_t i = 0; i < cols; ++i) w[i] = std::clamp(w[i], -o.clip_value, o.clip_value);
  }
}

// ---------------------------------------------------------------------------------------
// MemoryRowStore

Status MemoryRowStore::Read(uint32_t table_id, std::span<const uint64_t> keys, size_t record_bytes,
                            uint8_t* out, std::vector<uint8_t>* found) {
  found->assign(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = rows_.find(Key{table_id, keys[i]});
    if (it == rows_.end()) continue;
    if (it->second.size() != record_bytes) {
      return DataLoss("table " + std::to_string(table_id) + ": record of key " +
                      std::to_string(keys[i]) + " has " + std::to_string(it->second.size()) +
                      " bytes, expected " + std::to_string(record_bytes));
    }
    std::memcpy(out + i * record_bytes, it->second.data(), record_bytes);
    (*found)[i] = 1;
  }
  return Status::Ok();
}

Status MemoryRowStore::Write(uint32_t table_id, std::span<const uint64_t> keys, size_t record_bytes,
                             const uint8_t* records, std::span<const uint64_t> deletes) {
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint8_t* r = records + i * record_bytes;
    rows_[Key{table_id, keys[i]}].assign(r, r + record_bytes);
  }
  for (uint64_t k : deletes) rows_.erase(Key{table_id, k});
  writes_ += keys.size();
  return Status::Ok();
}

Status MemoryRowStore::Scan(uint32_t table_id, uint64_t* cursor, size_t limit, size_t record_bytes,
                            const std::function<void(uint64_t, const uint8_t*)>& visit,
                            bool* wrapped) {
  auto it = rows_.lower_bound(Key{table_id, *cursor});
  auto end = rows_.upper_bound(Key{table_id, UINT64_MAX});
  for (size_t visited = 0; it != end && visited < limit; ++it, ++visited) {
    if (it->second.size() != record_bytes) {
      return DataLoss("table " + std::to_string(table_id) + ": record of key " +
                      std::to_string(it->first.key) + " has " + std::to_string(it->second.size()) +
                      " bytes, expected " + std::to_string(record_bytes));
    }
    visit(it->first.key, it->second.data());
  }
  *wrapped = it == end;
  *cursor = *wrapped ? 0 : it->first.key;
  return Status::Ok();
}

Status MemoryRowStore::DropTable(uint32_t table_id) {
  rows_.erase(rows_.lower_bound(Key{table_id, 0}), rows_.upper_bound(Key{table_id, UINT64_MAX}));
  return Status::Ok();
}

uint64_t MemoryRowStore::ApproxRows(uint32_t table_id) const {
  return static_cast<uint64_t>(std::distance(rows_.lower_bound(Key{table_id, 0}),
                                             rows_.upper_bound(Key{table_id, UINT64_MAX})));
}

// ---------------------------------------------------------------------------------------
// SparseTable

namespace {

// The index's hash: a multiply-xorshift mixer with constants other than fmix64's, which
// SparseOwner (common/partition.h) uses to pick the shard: the keys one shard holds share
// fmix64's high bits, so reusing it here would crowd them into part of the index.
inline uint64_t IndexHash(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ULL;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ULL;
  x ^= x >> 32;
  return x;
}

// The admission sketch's hash (a third mixer: SplitMix64's finalizer over a rotated key).
inline uint64_t SketchHash(uint64_t x) {
  x = std::rotl(x, 17) + 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr uint32_t kNoSlot = UINT32_MAX;
constexpr size_t kHeader = 12;  // key (8), GCLOCK counter, dirty, pinned, pad
// Records per store write of a flush: 2 MiB (the batch, its WriteBatch copy and the
// memtable it lands in are each held at once beyond the budget).
constexpr size_t kFlushBatchBytes = size_t{2} << 20;
constexpr size_t kChunkRows = 4096;
// Eviction is GCLOCK (generalized CLOCK): each slot has a small saturating counter; a new
// row starts at 1 and each access adds 1 up to kMaxRef; the hand sweeps the slots in order,
// taking 1 from each counter it passes and evicting the first row at 0. Why not LRU: the
// keys of embedding tables follow a power law, and each batch brings a burst of tail keys
// seen once. Under LRU every such key goes to the front and a burst pushes out the hot head,
// which must then be read back from disk. Under GCLOCK a once-seen key holds 1 and goes at
// the hand's next pass, while a head key touched k times survives k passes. A hit costs a
// byte write in the slot it reads anyway (no list splicing, no pointers per row), and the
// counters live in the arena's slot headers.

constexpr uint8_t kMaxRef = 7;
// Locations of a call's keys: a slot, or kMissBit | index into the call's unique misses.
constexpr uint32_t kMissBit = 0x80000000u;
// Where a unique miss ends up.
constexpr uint32_t kTransient = 0xfffffffeu;  // no room in memory: its record stays in the
                                              // call's buffer and is written to the store
constexpr uint32_t kNoRow = 0xffffffffu;      // not admitted (Read) or no row (Apply)

uint64_t IndexBuckets(uint64_t capacity) {
  if (capacity == 0) return 0;
  return std::max<uint64_t>(16, std::bit_ceil(2 * capacity));
}

}  // namespace

class SparseTable::Impl {
 public:
  Impl(uint32_t id, TableSpec spec, RowStore* store, SparseTableOptions options)
      : id_(id), spec_(std::move(spec)), store_(store), options_(options) {
    layout_ = RowLayout::For(spec_);
    rb_ = layout_.bytes();
    stride_ = (kHeader + rb_ + 7) / 8 * 8;
    cols_ = spec_.cols;
    admit_after_ = spec_.sparse.admit_after;
    expire_ = spec_.sparse.expire_after_clocks;
    if (admit_after_ > 1) {
      depth_ = std::max(options_.sketch_depth, 1u);
      const uint32_t width = SketchWidthFor(options_.memory_bytes);
      sketch_mask_ = width - 1;
      sketch_.assign(size_t{width} * depth_, 0);
    }
    SetMaxRows(options_.memory_bytes);
  }

  // --- memory accounting -------------------------------------------------------------
  uint64_t ArenaBytes(uint64_t capacity) const { return capacity * stride_; }
  uint64_t Cost(uint64_t capacity) const {
    return ArenaBytes(capacity) + 4 * IndexBuckets(capacity) + sketch_.size();
  }
  uint64_t MemoryBytes() const {
    return ArenaBytes(capacity_) + 4 * index_.size() + sketch_.size();
  }

  // The largest capacity whose Cost fits `budget`.
  void SetMaxRows(uint64_t budget) {
    budget_ = budget;
    constexpr uint64_t kMaxSlots = kMissBit - 1;
    if (budget == UINT64_MAX) {
      max_rows_ = kMaxSlots;
      return;
    }
    uint64_t lo = 0, hi = std::min<uint64_t>(budget / stride_ + 1, kMaxSlots);
    while (lo < hi) {  // the largest c in [0, hi] with Cost(c) <= budget
      uint64_t mid = lo + (hi - lo + 1) / 2;
      if (Cost(mid) <= budget) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    max_rows_ = lo;
  }

  // --- slots ---------------------------------------------------------------------------
  uint8_t* Slot(uint32_t s) const {
    return chunks_[s / kChunkRows].get() + (s % kChunkRows) * stride_;
  }
  static uint64_t SlotKey(const uint8_t* p) {
    uint64_t k;
    std::memcpy(&k, p, 8);
    return k;
  }
  static uint8_t& Ref(uint8_t* p) { return p[8]; }
  static uint8_t& Dirty(uint8_t* p) { return p[9]; }
  static uint8_t& Pinned(uint8_t* p) { return p[10]; }
  static uint8_t* Record(uint8_t* p) { return p + kHeader; }

  // Record fields.
  float* Values(uint8_t* rec) const { return reinterpret_cast<float*>(rec); }
  float* SlotsOf(uint8_t* rec) const { return reinterpret_cast<float*>(rec) + cols_; }
  size_t StepsOffset() const { return rb_ - 16; }
  uint64_t Steps(const uint8_t* rec) const {
    uint64_t v;
    std::memcpy(&v, rec + StepsOffset(), 8);
    return v;
  }
  void SetSteps(uint8_t* rec, uint64_t v) const { std::memcpy(rec + StepsOffset(), &v, 8); }
  int64_t LastClock(const uint8_t* rec) const {
    int64_t v;
    std::memcpy(&v, rec + rb_ - 8, 8);
    return v;
  }
  void SetLastClock(uint8_t* rec, int64_t v) const { std::memcpy(rec + rb_ - 8, &v, 8); }

  void InitRecord(uint64_t key, int64_t clock, uint8_t* rec) const {
    std::memset(rec, 0, rb_);
    InitSparseRow(spec_.init, key, cols_, Values(rec));
    SetLastClock(rec, clock);
  }

  // Grows the arena's capacity by up to `want` rows within max_rows_.
  void Grow(uint64_t want) {
    uint64_t target = std::min<uint64_t>(max_rows_, capacity_ + want);
    // Grow in steps (doubling while small), so a table that stays small stays small.
    if (target > capacity_) {
      uint64_t step = capacity_ < kChunkRows ? std::max<uint64_t>(64, capacity_) : kChunkRows;
      target = std::min<uint64_t>(max_rows_, std::max(target, capacity_ + step));
    }
    if (target <= capacity_) return;
    // Every chunk but the last holds kChunkRows slots: enlarge the last, then add chunks.
    while (capacity_ < target) {
      if (!chunks_.empty() && chunk_rows_.back() < kChunkRows) {
        size_t rows = std::min<uint64_t>(kChunkRows, chunk_rows_.back() + (target - capacity_));
        auto bigger = std::make_unique<uint8_t[]>(rows * stride_);
        std::memcpy(bigger.get(), chunks_.back().get(), chunk_rows_.back() * stride_);
        capacity_ += rows - chunk_rows_.back();
        chunks_.back() = std::move(bigger);
        chunk_rows_.back() = rows;
      } else {
        size_t rows = std::min<uint64_t>(kChunkRows, target - capacity_);
        chunks_.push_back(std::make_unique<uint8_t[]>(rows * stride_));
        chunk_rows_.push_back(rows);
        capacity_ += rows;
      }
    }
    if (IndexBuckets(capacity_) != index_.size()) Rehash(IndexBuckets(capacity_));
  }

  // Shrinks the arena to `rows` >= used_ rows.
  void ShrinkTo(uint64_t rows) {
    LEASH_CHECK(rows >= used_);
    if (rows >= capacity_) return;
    size_t full = rows / kChunkRows, part = rows % kChunkRows;
    size_t keep = full + (part ? 1 : 0);
    if (part) {
      auto smaller = std::make_unique<uint8_t[]>(part * stride_);
      std::memcpy(smaller.get(), chunks_[full].get(), part * stride_);
      chunks_[full] = std::move(smaller);
      chunk_rows_[full] = part;
    }
    chunks_.resize(keep);
    chunk_rows_.resize(keep);
    chunks_.shrink_to_fit();
    capacity_ = rows;
    Rehash(IndexBuckets(capacity_));
    if (hand_ >= used_) hand_ = 0;
  }

  // --- index (linear probing over slot numbers; keys live in the slots) ----------------
  void Rehash(uint64_t buckets) {
    std::vector<uint32_t> fresh(buckets, kNoSlot);
    index_.swap(fresh);
    mask_ = buckets ? buckets - 1 : 0;
    for (uint32_t s = 0; s < used_; ++s) IndexInsert(SlotKey(Slot(s)), s);
  }
  uint32_t Find(uint64_t key) const {
    if (index_.empty()) return kNoSlot;
    for (uint64_t b = IndexHash(key) & mask_;; b = (b + 1) & mask_) {
      uint32_t s = index_[b];
      if (s == kNoSlot) return kNoSlot;
      if (SlotKey(Slot(s)) == key) return s;
    }
  }
  void IndexInsert(uint64_t key, uint32_t slot) {
    uint64_t b = IndexHash(key) & mask_;
    while (index_[b] != kNoSlot) b = (b + 1) & mask_;
    index_[b] = slot;
  }
  uint64_t BucketOf(uint64_t key) const {
    for (uint64_t b = IndexHash(key) & mask_;; b = (b + 1) & mask_) {
      LEASH_CHECK(index_[b] != kNoSlot);
      if (SlotKey(Slot(index_[b])) == key) return b;
    }
  }
  // Backward-shift deletion: no tombstones, probes stay short.
  void IndexErase(uint64_t key) {
    uint64_t hole = BucketOf(key);
    for (uint64_t b = (hole + 1) & mask_;; b = (b + 1) & mask_) {
      uint32_t s = index_[b];
      if (s == kNoSlot) break;
      uint64_t home = IndexHash(SlotKey(Slot(s))) & mask_;
      // Move s into the hole unless its home lies cyclically in (hole, b].
      if (((b - home) & mask_) >= ((b - hole) & mask_)) {
        index_[hole] = s;
        hole = b;
      }
    }
    index_[hole] = kNoSlot;
  }

  // Removes slot s's row from the memory tier, moving the last row into its place.
  void RemoveSlot(uint32_t s) {
    IndexErase(SlotKey(Slot(s)));
    uint32_t last = static_cast<uint32_t>(used_ - 1);
    if (s != last) {
      uint64_t moved = SlotKey(Slot(last));
      index_[BucketOf(moved)] = s;
      std::memcpy(Slot(s), Slot(last), stride_);
    }
    --used_;
    if (hand_ >= used_) hand_ = 0;
  }

  // --- admission sketch (count-min, conservative update) ---------------------------------
  uint8_t* SketchCell(uint64_t h, uint32_t d) {
    uint64_t h1 = h & 0xffffffffu, h2 = (h >> 32) | 1;
    return &sketch_[d * (sketch_mask_ + 1) + ((h1 + d * h2) & sketch_mask_)];
  }
  uint8_t SketchEstimate(uint64_t key) {
    uint64_t h = SketchHash(key);
    uint8_t m = 255;
    for (uint32_t d = 0; d < depth_; ++d) m = std::min(m, *SketchCell(h, d));
    return m;
  }
  void SketchAdd(uint64_t key) {
    uint64_t h = SketchHash(key);
    uint8_t m = SketchEstimate(key);
    if (m == 255) return;
    for (uint32_t d = 0; d < depth_; ++d) {
      uint8_t* c = SketchCell(h, d);
      if (*c == m) *c = static_cast<uint8_t>(m + 1);
    }
  }
  // The sketch's width for a budget: the option's width (a power of two), halved until
  // the sketch takes at most a quarter of a bounded budget.
  uint32_t SketchWidthFor(uint64_t budget) const {
    uint32_t width = std::bit_floor(std::max(options_.sketch_width, 1u));
    if (budget != UINT64_MAX) {
      while (width > 1 && uint64_t{width} * depth_ > budget / 4) width /= 2;
    }
    return width;
  }
  // Changes the sketch's width keeping every estimate or raising it: a key's cell in row d
  // is (h1 + d * h2) & mask, so halving the width folds cell j + width/2 onto cell j (the
  // larger count kept: a key may only read as seen more often), and doubling it copies
  // cell j to j and j + width (estimates unchanged).
  void ResizeSketch(uint32_t width) {
    const uint64_t old_width = sketch_mask_ + 1;
    if (sketch_.empty() || width == old_width) return;
    std::vector<uint8_t> fresh(size_t{width} * depth_, 0);
    for (uint32_t d = 0; d < depth_; ++d) {
      const uint8_t* from = sketch_.data() + d * old_width;
      uint8_t* to = fresh.data() + size_t{d} * width;
      if (width < old_width) {
        for (uint64_t j = 0; j < old_width; ++j)
          to[j & (width - 1)] = std::max(to[j & (width - 1)], from[j]);
      } else {
        for (uint64_t j = 0; j < width; ++j) to[j] = from[j & (old_width - 1)];
      }
    }
    sketch_.swap(fresh);
    sketch_mask_ = width - 1;
  }
  // Whether one more pull admits the key (without counting it).
  bool AdmitsNext(uint64_t key) {
    if (admit_after_ <= 1) return true;
    return uint32_t{SketchEstimate(key)} + 1 >= admit_after_;
  }

  // --- one Read or Apply -----------------------------------------------------------------
  // Resolves keys to locations, reads misses from the store (one Read), decides admission,
  // finds room (growing, then evicting with GCLOCK; rows beyond room stay transient),
  // runs `before_write` on transient rows, writes dirty victims and transient rows (one
  // Write) and only then changes the memory tier. On a store error nothing but GCLOCK
  // counters has changed.
  template <typename TransientFn, typename CommitFn>
  Status Run(std::span<const uint64_t> keys, int64_t clock, bool is_read, TransientFn before_write,
             CommitFn commit) {
    const size_t n = keys.size();
    loc_.resize(n);
    misses_.clear();
    pinned_.clear();
    for (size_t i = 0; i < n; ++i) {
      uint32_t s = Find(keys[i]);
      if (s != kNoSlot) {
        uint8_t* p = Slot(s);
        if (Ref(p) < kMaxRef) ++Ref(p);
        if (!Pinned(p)) {
          Pinned(p) = 1;
          pinned_.push_back(s);
        }
        loc_[i] = s;
      } else {
        misses_.push_back({keys[i], static_cast<uint32_t>(i)});
      }
    }
    uint64_t hits = n - misses_.size();
    // Unique misses, in key order.
    std::sort(misses_.begin(), misses_.end());
    ukeys_.clear();
    for (const auto& [k, i] : misses_) {
      if (ukeys_.empty() || ukeys_.back() != k) ukeys_.push_back(k);
      loc_[i] = kMissBit | static_cast<uint32_t>(ukeys_.size() - 1);
    }
    const size_t nu = ukeys_.size();
    urec_.resize(nu * rb_);
    place_.assign(nu, kNoRow);
    udirty_.assign(nu, 0);
    auto unpin = [&] {
      for (uint32_t s : pinned_) Pinned(Slot(s)) = 0;
    };
    if (nu > 0) {
      Status st = store_->Read(id_, ukeys_, rb_, urec_.data(), &found_);
      if (!st.ok()) {
        unpin();
        return st;
      }
      LEASH_CHECK(found_.size() == nu);
    }
    // Admission and creation.
    size_t need = 0;
    uint64_t created = 0, unadmitted = 0;
    for (size_t u = 0; u < nu; ++u) {
      uint8_t* rec = urec_.data() + u * rb_;
      if (found_[u]) {
        place_[u] = kTransient;
        ++need;
        if (is_read && expire_ > 0 && clock > LastClock(rec)) {
          SetLastClock(rec, clock);
          udirty_[u] = 1;
        }
      } else if (is_read && AdmitsNext(ukeys_[u])) {
        InitRecord(ukeys_[u], clock, rec);
        place_[u] = kTransient;
        udirty_[u] = 1;
        ++need;
        ++created;
      } else if (is_read) {
        ++unadmitted;
      }
    }
    // Room: free slots, growth, then GCLOCK victims among unpinned rows.
    if (used_ + need > capacity_) Grow(used_ + need - capacity_);
    size_t free_slots = capacity_ - used_;
    size_t placed_free = std::min(need, free_slots);
    size_t want_victims = need - placed_free;
    victims_.clear();
    wkeys_.clear();
    wrecs_.clear();
    if (want_victims > 0) {
      size_t evictable = used_ - pinned_.size();
      want_victims = std::min(want_victims, evictable);
      while (victims_.size() < want_victims) {
        uint8_t* p = Slot(static_cast<uint32_t>(hand_));
        if (!Pinned(p)) {
          if (Ref(p) == 0) {
            Pinned(p) = 1;  // chosen: the hand does not pick it twice
            victims_.push_back(static_cast<uint32_t>(hand_));
            if (Dirty(p)) {
              wkeys_.push_back(SlotKey(p));
              wrecs_.insert(wrecs_.end(), Record(p), Record(p) + rb_);
            }
          } else {
            --Ref(p);
          }
        }
        if (++hand_ >= used_) hand_ = 0;
      }
    }
    // Assign places: free slots first, then victims' slots, the rest stay transient.
    size_t next_free = used_, next_victim = 0;
    for (size_t u = 0; u < nu; ++u) {
      if (place_[u] != kTransient) continue;
      if (next_free < used_ + placed_free) {
        place_[u] = static_cast<uint32_t>(next_free++);
      } else if (next_victim < victims_.size()) {
        place_[u] = victims_[next_victim++];
      }
    }
    // Transient rows: update (Apply) or read out, then write them if dirty.
    before_write();
    for (size_t u = 0; u < nu; ++u) {
      if (place_[u] == kTransient && udirty_[u]) {
        wkeys_.push_back(ukeys_[u]);
        const uint8_t* rec = urec_.data() + u * rb_;
        wrecs_.insert(wrecs_.end(), rec, rec + rb_);
      }
    }
    if (!wkeys_.empty()) {
      Status st = store_->Write(id_, wkeys_, rb_, wrecs_.data(), {});
      if (!st.ok()) {
        unpin();
        for (uint32_t s : victims_) Pinned(Slot(s)) = 0;
        return st;
      }
    }
    // Commit: the store holds the victims; replace them and fill free slots.
    for (size_t u = 0; u < nu; ++u) {
      uint32_t s = place_[u];
      if (s == kTransient || s == kNoRow) continue;
      uint8_t* p = Slot(s);
      if (s < used_) IndexErase(SlotKey(p));  // a victim
      std::memcpy(p, &ukeys_[u], 8);
      std::memcpy(Record(p), urec_.data() + u * rb_, rb_);
      Ref(p) = 1;
      Dirty(p) = udirty_[u];
      Pinned(p) = 0;
      IndexInsert(ukeys_[u], s);
    }
    used_ += placed_free;
    commit();
    unpin();
    for (uint32_t s : victims_) Pinned(Slot(s)) = 0;
    // Count.
    if (is_read && admit_after_ > 1) {
      for (size_t u = 0; u < nu; ++u) {
        if (!found_[u]) SketchAdd(ukeys_[u]);
      }
    }
    c_.tier_hits += hits;
    c_.tier_misses += need;
    c_.evictions += victims_.size();
    c_.admissions += created;
    c_.unadmitted_reads += unadmitted;
    c_.rows_written += wkeys_.size();
    return Status::Ok();
  }

  // The record of key i of the current call, or null if it has no row.
  uint8_t* RecordAt(size_t i) {
    uint32_t l = loc_[i];
    if (!(l & kMissBit)) return Record(Slot(l));
    uint32_t u = l & ~kMissBit;
    uint32_t s = place_[u];
    if (s == kNoRow) return nullptr;
    if (s == kTransient) return urec_.data() + u * rb_;
    return Record(Slot(s));
  }
  bool IsTransient(size_t i) const {
    uint32_t l = loc_[i];
    return (l & kMissBit) && place_[l & ~kMissBit] == kTransient;
  }
  uint8_t* DirtyFlagAt(size_t i) {
    uint32_t l = loc_[i];
    if (!(l & kMissBit)) return &Dirty(Slot(l));
    uint32_t u = l & ~kMissBit;
    if (place_[u] == kTransient) return &udirty_[u];
    return &Dirty(Slot(place_[u]));
  }

  Status Read(std::span<const uint64_t> keys, int64_t clock, float* out) {
    const size_t vb = layout_.value_bytes();
    auto transient = [&] {
      for (size_t i = 0; i < keys.size(); ++i) {
        if (IsTransient(i)) std::memcpy(out + i * cols_, RecordAt(i), vb);
      }
    };
    auto commit = [&] {
      for (size_t i = 0; i < keys.size(); ++i) {
        if (IsTransient(i)) continue;
        uint8_t* rec = RecordAt(i);
        if (rec == nullptr) {
          InitSparseRow(spec_.init, keys[i], cols_, out + i * cols_);
          continue;
        }
        std::memcpy(out + i * cols_, rec, vb);
        if (expire_ > 0 && clock > LastClock(rec)) {
          SetLastClock(rec, clock);
          *DirtyFlagAt(i) = 1;
        }
      }
    };
    return Run(keys, clock, /*is_read=*/true, transient, commit);
  }

  Status Apply(std::span<const uint64_t> keys, const float* grad, int64_t clock) {
    uint64_t dropped = 0;
    auto update = [&](size_t i) {
      uint8_t* rec = RecordAt(i);
      uint64_t steps = Steps(rec);
      ApplySparseRow(spec_.optimizer, cols_, Values(rec), SlotsOf(rec), &steps, grad + i * cols_);
      SetSteps(rec, steps);
      if (clock > LastClock(rec)) SetLastClock(rec, clock);
      *DirtyFlagAt(i) = 1;
    };
    auto transient = [&] {
      for (size_t i = 0; i < keys.size(); ++i) {
        if (IsTransient(i)) update(i);
      }
    };
    auto commit = [&] {
      for (size_t i = 0; i < keys.size(); ++i) {
        if (IsTransient(i)) continue;
        if (RecordAt(i) == nullptr) {
          ++dropped;
          continue;
        }
        update(i);
      }
    };
    LEASH_RETURN_IF_ERROR(Run(keys, clock, /*is_read=*/false, transient, commit));
    c_.dropped_gradients += dropped;
    return Status::Ok();
  }

  // Writes the dirty rows in batches of at most kFlushBatchBytes, so a flush never holds a
  // second copy of the memory tier (the snapshot that follows needs only the sum of the
  // batches; a failed batch leaves its rows and the later ones dirty for the next flush).
  Result<uint64_t> FlushDirty() {
    const size_t per_batch = std::max<size_t>(1, kFlushBatchBytes / rb_);
    uint64_t n = 0;
    std::vector<uint32_t> slots;
    for (uint32_t s = 0; s < used_;) {
      wkeys_.clear();
      wrecs_.clear();
      slots.clear();
      for (; s < used_ && wkeys_.size() < per_batch; ++s) {
        uint8_t* p = Slot(s);
        if (!Dirty(p)) continue;
        slots.push_back(s);
        wkeys_.push_back(SlotKey(p));
        wrecs_.insert(wrecs_.end(), Record(p), Record(p) + rb_);
      }
      if (wkeys_.empty()) continue;
      LEASH_RETURN_IF_ERROR(store_->Write(id_, wkeys_, rb_, wrecs_.data(), {}));
      for (uint32_t d : slots) Dirty(Slot(d)) = 0;
      c_.rows_written += wkeys_.size();
      n += wkeys_.size();
    }
    wkeys_ = {};
    wrecs_ = {};
    return n;
  }

  Status Expire(int64_t clock, size_t max_rows) {
    if (expire_ <= 0 || max_rows == 0) return Status::Ok();
    auto expired = [&](int64_t last) { return clock - last > expire_; };
    std::vector<uint64_t> mem_keys, deletes;
    // The memory tier, from a cursor over the slots.
    size_t visit = std::min<size_t>(max_rows, used_);
    for (size_t v = 0; v < visit; ++v) {
      if (mem_cursor_ >= used_) mem_cursor_ = 0;
      uint8_t* p = Slot(static_cast<uint32_t>(mem_cursor_++));
      if (expired(LastClock(Record(p)))) mem_keys.push_back(SlotKey(p));
    }
    deletes = mem_keys;  // their older copies in the store, if any
    // The store, from a persistent key cursor; resident rows are judged by their memory copy.
    uint64_t cursor = store_cursor_;
    bool wrapped = false;
    LEASH_RETURN_IF_ERROR(store_->Scan(
        id_, &cursor, max_rows, rb_,
        [&](uint64_t key, const uint8_t* rec) {
          if (Find(key) == kNoSlot && expired(LastClock(rec))) deletes.push_back(key);
        },
        &wrapped));
    uint64_t from_store = deletes.size() - mem_keys.size();
    if (!deletes.empty()) {
      LEASH_RETURN_IF_ERROR(store_->Write(id_, {}, rb_, nullptr, deletes));
    }
    store_cursor_ = cursor;
    for (uint64_t k : mem_keys) RemoveSlot(Find(k));
    c_.expired_rows += mem_keys.size() + from_store;
    return Status::Ok();
  }

  Status SetMemoryBudget(uint64_t bytes) {
    uint64_t old_budget = budget_, old_max = max_rows_;
    if (!sketch_.empty()) ResizeSketch(SketchWidthFor(bytes));
    SetMaxRows(bytes);
    if (used_ <= max_rows_) {
      ShrinkTo(std::max<uint64_t>(used_, std::min<uint64_t>(capacity_, max_rows_)));
      return Status::Ok();
    }
    // Evict used_ - max_rows_ rows with the hand, writing back the dirty ones.
    size_t want = used_ - max_rows_;
    victims_.clear();
    wkeys_.clear();
    wrecs_.clear();
    while (victims_.size() < want) {
      uint8_t* p = Slot(static_cast<uint32_t>(hand_));
      if (!Pinned(p)) {
        if (Ref(p) == 0) {
          Pinned(p) = 1;
          victims_.push_back(static_cast<uint32_t>(hand_));
          if (Dirty(p)) {
            wkeys_.push_back(SlotKey(p));
            wrecs_.insert(wrecs_.end(), Record(p), Record(p) + rb_);
          }
        } else {
          --Ref(p);
        }
      }
      if (++hand_ >= used_) hand_ = 0;
    }
    if (!wkeys_.empty()) {
      Status st = store_->Write(id_, wkeys_, rb_, wrecs_.data(), {});
      if (!st.ok()) {
        for (uint32_t s : victims_) Pinned(Slot(s)) = 0;
        budget_ = old_budget;
        max_rows_ = old_max;
        return st;
      }
    }
    std::vector<uint64_t> gone;
    gone.reserve(victims_.size());
    for (uint32_t s : victims_) gone.push_back(SlotKey(Slot(s)));
    for (uint64_t k : gone) RemoveSlot(Find(k));
    for (uint32_t s = 0; s < used_; ++s) Pinned(Slot(s)) = 0;
    c_.evictions += gone.size();
    c_.rows_written += wkeys_.size();
    ShrinkTo(max_rows_);
    return Status::Ok();
  }

  // ExportTier's layout: a header of kTierFields uint64 (version, capacity, used, hand,
  // mem_cursor, store_cursor, sketch width, sketch depth), then per used slot its key
  // (uint64) and GCLOCK counter (uint8), then the sketch's bytes.
  static constexpr uint64_t kTierVersion = 1;
  static constexpr size_t kTierFields = 8;
  std::vector<uint8_t> ExportTier() const {
    const uint64_t width = sketch_.empty() ? 0 : sketch_mask_ + 1;
    const uint64_t head[kTierFields] = {kTierVersion, capacity_,     used_, hand_,
                                        mem_cursor_,  store_cursor_, width, depth_};
    std::vector<uint8_t> out(sizeof(head) + used_ * 9 + sketch_.size());
    std::memcpy(out.data(), head, sizeof(head));
    uint8_t* at = out.data() + sizeof(head);
    for (uint32_t s = 0; s < used_; ++s, at += 9) {
      uint8_t* p = Slot(s);
      std::memcpy(at, p, 8);
      at[8] = Ref(p);
    }
    if (!sketch_.empty()) std::memcpy(at, sketch_.data(), sketch_.size());
    return out;
  }

  Status ImportTier(std::span<const uint8_t> in) {
    if (used_ != 0) {
      return FailedPrecondition("table '" + spec_.name + "' has rows; a tier is imported " +
                                "into a new table only");
    }
    uint64_t head[kTierFields];
    if (in.size() < sizeof(head)) return InvalidArgument("sparse tier layout truncated");
    std::memcpy(head, in.data(), sizeof(head));
    const auto [version, capacity, used, hand, mem_cursor, store_cursor, width, depth] =
        std::to_array(head);
    const uint64_t my_width = sketch_.empty() ? 0 : sketch_mask_ + 1;
    if (version != kTierVersion || used > capacity || capacity >= kMissBit ||
        (width != 0) != (my_width != 0) ||
        (width != 0 && (!std::has_single_bit(width) || depth != depth_)) ||
        in.size() != sizeof(head) + used * 9 + width * depth) {
      return InvalidArgument("sparse tier layout of table '" + spec_.name +
                             "' does not fit the table (another version or spec)");
    }
    const uint8_t* slots = in.data() + sizeof(head);
    // The sketch as it was there, then resized to this table's budget.
    if (width != 0) {
      sketch_.assign(slots + used * 9, slots + used * 9 + width * depth);
      sketch_mask_ = width - 1;
      ResizeSketch(SketchWidthFor(budget_));
      SetMaxRows(budget_);
    }
    const uint64_t keep = std::min(used, max_rows_);
    const uint64_t target = std::min(capacity, max_rows_);
    while (capacity_ < target) {
      size_t rows = std::min<uint64_t>(kChunkRows, target - capacity_);
      chunks_.push_back(std::make_unique<uint8_t[]>(rows * stride_));
      chunk_rows_.push_back(rows);
      capacity_ += rows;
    }
    Rehash(IndexBuckets(capacity_));
    // The records, from the store, in batches.
    constexpr size_t kBatch = 4096;
    std::vector<uint64_t> keys;
    std::vector<uint8_t> recs;
    for (uint64_t from = 0; from < keep; from += kBatch) {
      const uint64_t n = std::min<uint64_t>(kBatch, keep - from);
      keys.resize(n);
      for (uint64_t i = 0; i < n; ++i) std::memcpy(&keys[i], slots + (from + i) * 9, 8);
      recs.resize(n * rb_);
      LEASH_RETURN_IF_ERROR(store_->Read(id_, keys, rb_, recs.data(), &found_));
      for (uint64_t i = 0; i < n; ++i) {
        if (!found_[i]) {
          return DataLoss("sparse table '" + spec_.name + "': resident key " +
                          std::to_string(keys[i]) + " has no record in the store");
        }
        uint8_t* p = Slot(static_cast<uint32_t>(from + i));
        std::memcpy(p, &keys[i], 8);
        std::memcpy(Record(p), recs.data() + i * rb_, rb_);
        Ref(p) = slots[(from + i) * 9 + 8];
        Dirty(p) = 0;
        Pinned(p) = 0;
        IndexInsert(keys[i], static_cast<uint32_t>(from + i));
        ++used_;
      }
    }
    hand_ = hand < used_ ? hand : 0;
    mem_cursor_ = mem_cursor;
    store_cursor_ = store_cursor;
    return Status::Ok();
  }

  Result<bool> ReadRecord(uint64_t key, uint8_t* record) const {
    uint32_t s = Find(key);
    if (s != kNoSlot) {
      std::memcpy(record, Record(Slot(s)), rb_);
      return true;
    }
    std::vector<uint8_t> found;
    uint64_t k = key;
    LEASH_RETURN_IF_ERROR(store_->Read(id_, std::span<const uint64_t>(&k, 1), rb_, record, &found));
    return found.size() == 1 && found[0] != 0;
  }

  SparseCounters Counters() const {
    SparseCounters c = c_;
    c.resident_rows = used_;
    c.memory_bytes = MemoryBytes();
    c.store_rows = store_->ApproxRows(id_);
    return c;
  }

  uint32_t id_;
  TableSpec spec_;
  RowStore* store_;
  SparseTableOptions options_;
  RowLayout layout_;
  size_t rb_ = 0;      // record bytes
  size_t stride_ = 0;  // slot bytes: header + record, 8-aligned
  uint32_t cols_ = 0;
  uint32_t admit_after_ = 0;
  int64_t expire_ = 0;

  // Arena: chunks of kChunkRows slots (the last may hold fewer); slots [0, used_) are rows.
  std::vector<std::unique_ptr<uint8_t[]>> chunks_;
  std::vector<size_t> chunk_rows_;
  uint64_t capacity_ = 0;
  uint64_t used_ = 0;
  uint64_t max_rows_ = 0;
  uint64_t budget_ = UINT64_MAX;
  std::vector<uint32_t> index_;
  uint64_t mask_ = 0;
  size_t hand_ = 0;
  size_t mem_cursor_ = 0;
  uint64_t store_cursor_ = 0;

  std::vector<uint8_t> sketch_;
  uint32_t depth_ = 0;
  uint64_t sketch_mask_ = 0;

  SparseCounters c_;

  // Per-call scratch, reused.
  std::vector<uint32_t> loc_;
  std::vector<std::pair<uint64_t, uint32_t>> misses_;
  std::vector<uint32_t> pinned_;
  std::vector<uint64_t> ukeys_;
  std::vector<uint8_t> urec_;
  std::vector<uint8_t> found_;
  std::vector<uint32_t> place_;
  std::vector<uint8_t> udirty_;
  std::vector<uint32_t> victims_;
  std::vector<uint64_t> wkeys_;
  std::vector<uint8_t> wrecs_;
};

Result<std::unique_ptr<SparseTable>> SparseTable::Create(uint32_t id, TableSpec spec,
                                                         RowStore* store,
                                                         SparseTableOptions options) {
  LEASH_RETURN_IF_ERROR(ValidateSpec(spec));
  if (spec.kind != TableKind::kSparse) {
    return InvalidArgument("table '" + spec.name + "' is dense; it is held by a Table");
  }
  LEASH_CHECK(store != nullptr);
  return std::unique_ptr<SparseTable>(
      new SparseTable(std::make_unique<Impl>(id, std::move(spec), store, options)));
}

SparseTable::SparseTable(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SparseTable::~SparseTable() = default;

uint32_t SparseTable::id() const { return impl_->id_; }
const TableSpec& SparseTable::spec() const { return impl_->spec_; }
uint32_t SparseTable::cols() const { return impl_->cols_; }
RowLayout SparseTable::layout() const { return impl_->layout_; }

Status SparseTable::Read(std::span<const uint64_t> keys, int64_t clock, float* out) {
  return impl_->Read(keys, clock, out);
}
Status SparseTable::Apply(std::span<const uint64_t> keys, const float* grad, int64_t clock) {
  ScopedFlushDenormals flush;  // as Table::Apply: decaying optimizer state stays normal
  return impl_->Apply(keys, grad, clock);
}
Result<uint64_t> SparseTable::FlushDirty() { return impl_->FlushDirty(); }
Status SparseTable::Expire(int64_t clock, size_t max_rows) {
  return impl_->Expire(clock, max_rows);
}
Status SparseTable::SetMemoryBudget(uint64_t bytes) { return impl_->SetMemoryBudget(bytes); }
Result<bool> SparseTable::ReadRecord(uint64_t key, uint8_t* record) const {
  return impl_->ReadRecord(key, record);
}
std::vector<uint8_t> SparseTable::ExportTier() const { return impl_->ExportTier(); }
Status SparseTable::ImportTier(std::span<const uint8_t> layout) {
  return impl_->ImportTier(layout);
}
bool SparseTable::Resident(uint64_t key) const { return impl_->Find(key) != kNoSlot; }
SparseCounters SparseTable::counters() const { return impl_->Counters(); }
uint64_t SparseTable::memory_bytes() const { return impl_->MemoryBytes(); }

}  // namespace leash::ps
