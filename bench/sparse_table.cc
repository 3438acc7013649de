// Benchmark (not a test) of one sparse table's Read + Apply keys/s over a MemoryRowStore:
// the table all in memory against a memory tier of a fraction of its size, with
// power-law keys. Single-threaded. Usage:
//   leash-bench-sparse-table [--keys N] [--cols C] [--alpha A] [--batch B] [--iters I] [--fraction
//   F]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "leash/ps/sparse_table.h"

namespace {

using leash::ps::MemoryRowStore;
using leash::ps::SparseTable;
using leash::ps::SparseTableOptions;

struct Args {
  uint64_t keys = 500000;
  uint32_t cols = 16;
  double alpha = 1.1;
  size_t batch = 26 * 512;
  int iters = 200;
  double fraction = 0.25;
};

// Ranks drawn from a Zipf(alpha) law over [0, n) by inverting a tabulated CDF, scattered
// over the key space.
class Zipf {
 public:
  Zipf(uint64_t n, double alpha) : cdf_(n) {
    double sum = 0;
    for (uint64_t i = 0; i < n; ++i)
      cdf_[i] = (sum += std::pow(static_cast<double>(i + 1), -alpha));
    for (auto& c : cdf_) c /= sum;
  }
  uint64_t operator()(std::mt19937_64& rng) {
    double u = std::uniform_real_distribution<double>(0, 1)(rng);
    auto rank = static_cast<uint64_t>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
    return rank * 0x9e3779b97f4a7c15ULL + 1;
  }

 private:
  std::vector<double> cdf_;
};

// Times the store's calls, to split the table's own time from the store's.
class TimedStore final : public leash::ps::RowStore {
 public:
  double secs = 0;
  MemoryRowStore inner;
  leash::Status Read(uint32_t t, std::span<const uint64_t> k, size_t rb, uint8_t* out,
                     std::vector<uint8_t>* found) override {
    auto t0 = std::chrono::steady_clock::now();
    leash::Status st = inner.Read(t, k, rb, out, found);
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st;
  }
  leash::Status Write(uint32_t t, std::span<const uint64_t> k, size_t rb, const uint8_t* r,
                      std::span<const uint64_t> d) override {
    auto t0 = std::chrono::steady_clock::now();
    leash::Status st = inner.Write(t, k, rb, r, d);
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st;
  }
  leash::Status Scan(uint32_t t, uint64_t* c, size_t l, size_t rb,
                     const std::function<void(uint64_t, const uint8_t*)>& v, bool* w) override {
    return inner.Scan(t, c, l, rb, v, w);
  }
  leash::Status DropTable(uint32_t t) override { return inner.DropTable(t); }
  uint64_t ApproxRows(uint32_t t) const override { return inner.ApproxRows(t); }
  uint64_t MemoryBytes() const override { return 0; }
};

struct Result {
  double keys_per_s;
  double hit_rate;
  uint64_t memory_bytes;
  uint64_t resident;
  uint64_t store_rows;
  double store_share;  // of the timed seconds, in the store's calls
};

Result Run(const Args& a, uint64_t budget) {
  leash::TableSpec spec;
  spec.name = "emb";
  spec.kind = leash::TableKind::kSparse;
  spec.cols = a.cols;
  spec.optimizer.kind = leash::OptimizerKind::kAdagrad;
  spec.optimizer.epsilon = 1e-8f;
  spec.init = {leash::InitKind::kUniform, 0.01f, 1};
  TimedStore store;
  SparseTableOptions opt;
  opt.memory_bytes = budget;
  auto t = SparseTable::Create(1, spec, &store, opt);
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", t.status().message().c_str());
    std::exit(1);
  }
  Zipf zipf(a.keys, a.alpha);
  std::mt19937_64 rng(7);
  std::vector<uint64_t> keys;
  std::vector<float> out, grad;
  // Warm up: touch every key once so both runs hold the whole table, then time.
  for (uint64_t i = 0; i < a.keys; i += a.batch) {
    keys.clear();
    for (uint64_t k = i; k < std::min(a.keys, i + a.batch); ++k)
      keys.push_back(k * 0x9e3779b97f4a7c15ULL + 1);
    out.resize(keys.size() * a.cols);
    if (!(*t)->Read(keys, 0, out.data()).ok()) std::exit(1);
  }
  double hits = 0, misses = 0;  // of the pulls (a push finds its rows resident)
  uint64_t total = 0;
  double secs = 0;
  // The first `iters` batches fill the memory tier with the stream's hot keys (the pass
  // above left it holding the coldest); the next `iters` are timed.
  for (int it = 0; it < 2 * a.iters; ++it) {
    if (it == a.iters) {
      hits = misses = secs = store.secs = 0;
      total = 0;
    }
    keys.resize(a.batch);
    for (auto& k : keys) k = zipf(rng);
    std::sort(keys.begin(), keys.end());  // the client deduplicates a batch's keys
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    std::shuffle(keys.begin(), keys.end(), rng);
    out.resize(keys.size() * a.cols);
    grad.assign(keys.size() * a.cols, 0.001f);
    // Counters outside the timed parts: counters() asks the store for its size.
    leash::ps::SparseCounters before = (*t)->counters();
    auto t0 = std::chrono::steady_clock::now();
    if (!(*t)->Read(keys, it, out.data()).ok()) std::exit(1);
    auto t1 = std::chrono::steady_clock::now();
    leash::ps::SparseCounters after = (*t)->counters();
    hits += static_cast<double>(after.tier_hits - before.tier_hits);
    misses += static_cast<double>(after.tier_misses - before.tier_misses);
    auto t2 = std::chrono::steady_clock::now();
    if (!(*t)->Apply(keys, grad.data(), it).ok()) std::exit(1);
    auto t3 = std::chrono::steady_clock::now();
    secs += std::chrono::duration<double>(t1 - t0 + (t3 - t2)).count();
    total += keys.size();
  }
  leash::ps::SparseCounters c = (*t)->counters();
  return {static_cast<double>(total) / secs,
          hits / (hits + misses),
          c.memory_bytes,
          c.resident_rows,
          c.store_rows,
          store.secs / secs};
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string f = argv[i];
    const char* v = argv[i + 1];
    if (f == "--keys")
      a.keys = std::strtoull(v, nullptr, 10);
    else if (f == "--cols")
      a.cols = static_cast<uint32_t>(std::atoi(v));
    else if (f == "--alpha")
      a.alpha = std::atof(v);
    else if (f == "--batch")
      a.batch = std::strtoull(v, nullptr, 10);
    else if (f == "--iters")
      a.iters = std::atoi(v);
    else if (f == "--fraction")
      a.fraction = std::atof(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  Result full = Run(a, UINT64_MAX);
  auto budget = static_cast<uint64_t>(static_cast<double>(full.memory_bytes) * a.fraction);
  Result part = Run(a, budget);
  std::printf("keys=%llu cols=%u alpha=%.2f batch=%zu (unique per batch varies) iters=%d\n",
              static_cast<unsigned long long>(a.keys), a.cols, a.alpha, a.batch, a.iters);
  std::printf(
      "all in memory : %10.0f keys/s  hit rate %.4f  memory %llu B  resident %llu  "
      "store time %.0f%%\n",
      full.keys_per_s, full.hit_rate, static_cast<unsigned long long>(full.memory_bytes),
      static_cast<unsigned long long>(full.resident), 100 * full.store_share);
  std::printf(
      "budget %.2f   : %10.0f keys/s  hit rate %.4f  memory %llu B (budget %llu)  "
      "resident %llu  store rows %llu  store time %.0f%%\n",
      a.fraction, part.keys_per_s, part.hit_rate,
      static_cast<unsigned long long>(part.memory_bytes), static_cast<unsigned long long>(budget),
      static_cast<unsigned long long>(part.resident),
      static_cast<unsigned long long>(part.store_rows), 100 * part.store_share);
  std::printf("ratio         : %.2f\n", part.keys_per_s / full.keys_per_s);
  return 0;
}
