// Sparse-table scale driver (issue 14's "Scale" benchmark): a DLRM / HugeCTR-style
// synthetic workload against running leash-server shards: 26 categorical fields, each
// with its own vocabulary, keys drawn from a power law (Zipf, rejection-inversion) and
// hashed so hot keys scatter; one sparse table holds every field. Phases:
//   populate   pulls every key of every vocabulary once (creates the rows),
//   run        pull + push of batches (fields x batch keys) for --seconds, one clock each,
//   touch      pushes a gradient to 1 row in --touch-every of every vocabulary,
//   checkpoint asks every shard for a snapshot and times it,
//   stats      prints the shards' table counters.
// Prints one JSON object per phase on stdout; bench/sparse_scale.py orchestrates servers,
// cgroups and rounds. Single-threaded.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "leash/common/flags.h"
#include "leash/common/zmq_transport.h"
#include "leash/worker/client.h"

namespace {

using SteadyClock = std::chrono::steady_clock;

double Seconds(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// Zipf(s) over ranks 1..n by rejection-inversion (Hoermann and Derflinger 1996): O(1) per
// draw, no table, exact for any s > 0.
class Zipf {
 public:
  Zipf(uint64_t n, double s) : n_(static_cast<double>(n)), s_(s) {
    h_x1_ = HIntegral(1.5) - 1.0;
    h_n_ = HIntegral(n_ + 0.5);
    threshold_ = 2.0 - HIntegralInv(HIntegral(2.5) - H(2.0));
  }
  template <typename Rng>
  uint64_t operator()(Rng& rng) {
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    for (;;) {
      double u = h_n_ + u01(rng) * (h_x1_ - h_n_);
      double x = HIntegralInv(u);
      double k = std::floor(x + 0.5);
      if (k < 1) k = 1;
      if (k > n_) k = n_;
      if (k - x <= threshold_ || u >= HIntegral(k + 0.5) - H(k)) {
        return static_cast<uint64_t>(k) - 1;  // 0-based rank
      }
    }
  }

 private:
  static double Helper1(double x) {  // log1p(x) / x
    return std::fabs(x) > 1e-8 ? std::log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - x / 4));
  }
  static double Helper2(double x) {  // expm1(x) / x
    return std::fabs(x) > 1e-8 ? std::expm1(x) / x : 1 + x / 2 * (1 + x / 3 * (1 + x / 4));
  }
  double H(double x) const { return std::exp(-s_ * std::log(x)); }
  double HIntegral(double x) const {
    double lx = std::log(x);
    return Helper2((1 - s_) * lx) * lx;
  }
  double HIntegralInv(double x) const {
    double t = x * (1 - s_);
    if (t < -1) t = -1;
    return std::exp(Helper1(t) * x);
  }
  double n_, s_, h_x1_, h_n_, threshold_;
};

// The key of rank `rank` of field `field`: hashed, so a field's hot ranks land anywhere.
uint64_t KeyOf(uint32_t field, uint64_t rank) {
  uint64_t x = (uint64_t{field} << 40) ^ rank;
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

void Die(const leash::Status& st, const char* what) {
  std::fprintf(stderr, "leash-bench-sparse: %s: %s\n", what, st.ToString().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  std::string servers, phase = "run", table = "sparse_scale", optimizer = "adagrad";
  int64_t keys = 20'000'000, fields = 26, batch = 4096, dim = 16, seed = 1, touch_every = 100;
  double alpha = 1.1, seconds = 20;
  leash::Flags flags("leash-bench-sparse",
                     "Sparse-table scale workload (see bench/sparse_scale.py)");
  flags.String("servers", &servers, "comma-separated shard endpoints");
  flags.String("phase", &phase, "populate, run, touch, checkpoint or stats");
  flags.String("table", &table, "sparse table name");
  flags.String("optimizer", &optimizer, "sparse optimizer");
  flags.Int("keys", &keys, "distinct keys in all (split evenly over the fields)");
  flags.Int("fields", &fields, "categorical fields");
  flags.Int("batch", &batch, "samples per batch (each names one key per field)");
  flags.Int("dim", &dim, "embedding dimension");
  flags.Int("seed", &seed, "key stream seed");
  flags.Int("touch-every", &touch_every, "touch: one row in this many");
  flags.Double("alpha", &alpha, "power-law exponent of the key ranks");
  flags.Double("seconds", &seconds, "run: duration");
  if (auto code = flags.ParseOrExitCode(argc, argv)) return *code;
  if (servers.empty() || keys < fields || fields < 1 || batch < 1 || dim < 1 || alpha <= 0) {
    std::fprintf(stderr,
                 "leash-bench-sparse: need --servers, keys >= fields >= 1, batch, dim, "
                 "alpha > 0\n");
    return 2;
  }
  leash::ZmqContext ctx;
  auto transport = leash::ConnectZmqClient(ctx, leash::SplitList(servers));
  if (!transport.ok()) Die(transport.status(), "connect");
  leash::ClientOptions o;
  o.name = "sparse-bench-" + phase;
  o.staleness = 1;
  // Only the phases that train join the job (a reader must not hold the minimum clock).
  o.register_worker = phase == "populate" || phase == "run" || phase == "touch";
  auto client = leash::Client::Connect(std::move(*transport), o);
  if (!client.ok()) Die(client.status(), "connect");
  leash::Client& c = **client;

  leash::TableSpec spec;
  spec.name = table;
  spec.kind = leash::TableKind::kSparse;
  spec.cols = static_cast<uint32_t>(dim);
  auto kind = leash::ParseOptimizer(optimizer);
  if (!kind.ok()) Die(kind.status(), "--optimizer");
  spec.optimizer.kind = *kind;
  spec.optimizer.lr = 0.05f;
  spec.init.kind = leash::InitKind::kUniform;
  spec.init.scale = 0.01f;
  spec.init.seed = 7;
  auto handle = c.CreateTable(spec);
  if (!handle.ok()) Die(handle.status(), "create table");
  const leash::TableHandle& t = *handle;

  const uint64_t vocab = static_cast<uint64_t>(keys / fields);
  const size_t n = static_cast<size_t>(fields * batch);
  std::vector<uint64_t> ks(n);
  std::vector<float> values(n * static_cast<size_t>(dim));
  std::vector<float> grads(n * static_cast<size_t>(dim));
  auto t0 = SteadyClock::now();

  if (phase == "populate" || phase == "touch") {
    const bool touch = phase == "touch";
    const uint64_t step = touch ? static_cast<uint64_t>(touch_every) : 1;
    uint64_t done = 0, next_report = 0;
    std::vector<uint64_t> chunk;
    for (uint32_t f = 0; f < static_cast<uint32_t>(fields); ++f) {
      for (uint64_t r = 0; r < vocab; r += step) {
        chunk.push_back(KeyOf(f, r));
        if (chunk.size() == n || (f + 1 == fields && r + step >= vocab)) {
          if (touch) {
            grads.assign(chunk.size() * static_cast<size_t>(dim), 0.01f);
            if (auto st = c.PushSparse(t, chunk, grads.data()).get(); !st.ok()) Die(st, "push");
          } else {
            if (auto st = c.PullSparse(t, chunk, values.data()).get(); !st.ok()) Die(st, "pull");
          }
          done += chunk.size();
          chunk.clear();
          if (done >= next_report) {
            std::fprintf(stderr, "%s: %llu keys, %.0f keys/s\n", phase.c_str(),
                         static_cast<unsigned long long>(done),
                         static_cast<double>(done) / Seconds(t0));
            next_report += 2'000'000;
          }
        }
      }
    }
    double s = Seconds(t0);
    std::printf("{\"phase\":\"%s\",\"keys\":%llu,\"seconds\":%.3f,\"keys_per_s\":%.1f}\n",
                phase.c_str(), static_cast<unsigned long long>(done), s,
                static_cast<double>(done) / s);
  } else if (phase == "run") {
    std::mt19937_64 rng(static_cast<uint64_t>(seed));
    Zipf zipf(vocab, alpha);
    int64_t batches = 0;
    uint64_t unique = 0;
    std::vector<uint64_t> sorted;
    while (Seconds(t0) < seconds) {
      for (size_t i = 0; i < n; ++i) {
        ks[i] = KeyOf(static_cast<uint32_t>(i / static_cast<size_t>(batch)), zipf(rng));
      }
      if (auto st = c.PullSparse(t, ks, values.data()).get(); !st.ok()) Die(st, "pull");
      for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.001f * (values[i] > 0 ? 1.f : -1.f);
      c.HoldSends();
      leash::Future push = c.PushSparse(t, ks, grads.data());
      leash::Future clock = c.Clock();
      c.FlushSends();
      if (auto st = push.get(); !st.ok()) Die(st, "push");
      if (auto st = clock.get(); !st.ok()) Die(st, "clock");
      if (batches % 16 == 0) {
        sorted = ks;
        std::sort(sorted.begin(), sorted.end());
        unique += static_cast<uint64_t>(std::unique(sorted.begin(), sorted.end()) - sorted.begin());
      }
      ++batches;
    }
    double s = Seconds(t0);
    double k = static_cast<double>(batches) * static_cast<double>(n);
    std::printf(
        "{\"phase\":\"run\",\"alpha\":%.2f,\"batches\":%lld,\"keys\":%.0f,\"seconds\":%.3f,"
        "\"keys_per_s\":%.1f,\"unique_fraction\":%.4f}\n",
        alpha, static_cast<long long>(batches), k, s, k / s,
        static_cast<double>(unique) /
            (static_cast<double>((batches + 15) / 16) * static_cast<double>(n)));
  } else if (phase == "checkpoint") {
    auto clocks = c.Checkpoint();
    if (!clocks.ok()) Die(clocks.status(), "checkpoint");
    std::printf("{\"phase\":\"checkpoint\",\"seconds\":%.3f}\n", Seconds(t0));
  } else if (phase == "stats") {
    auto stats = c.Stats();
    if (!stats.ok()) Die(stats.status(), "stats");
    std::printf("{\"phase\":\"stats\",\"shards\":[");
    for (size_t i = 0; i < stats->size(); ++i) {
      const leash::ShardStats& sh = (*stats)[i];
      std::printf("%s{\"shard\":%u,\"memory_budget_bytes\":%llu,\"memory_used_bytes\":%llu",
                  i ? "," : "", sh.shard, static_cast<unsigned long long>(sh.memory_budget_bytes),
                  static_cast<unsigned long long>(sh.memory_used_bytes));
      for (const auto& ts : sh.tables) {
        if (ts.name != table) continue;
        std::printf(
            ",\"local_rows\":%llu,\"resident_rows\":%llu,\"memory_bytes\":%llu,"
            "\"tier_hits\":%llu,\"tier_misses\":%llu,\"evictions\":%llu",
            static_cast<unsigned long long>(ts.local_rows),
            static_cast<unsigned long long>(ts.resident_rows),
            static_cast<unsigned long long>(ts.memory_bytes),
            static_cast<unsigned long long>(ts.tier_hits),
            static_cast<unsigned long long>(ts.tier_misses),
            static_cast<unsigned long long>(ts.evictions));
      }
      std::printf("}");
    }
    std::printf("]}\n");
  } else {
    std::fprintf(stderr, "leash-bench-sparse: unknown --phase '%s'\n", phase.c_str());
    return 2;
  }
  if (o.register_worker) (void)c.Leave();
  return 0;
}
