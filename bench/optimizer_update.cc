// A shard's update of one dense table, in process: ps::Table::Apply of one gradient with each
// optimizer (sgd, momentum, adam, adagrad), unweighted and weighted by a push's share of the
// global batch (work in proportion to speed: scale 3/8), and Table::Accumulate (clock steps'
// sum). What one push costs the shard beyond receiving it, per optimizer. Gradients cycle
// through --buffers of them, as pushes in flight do; the table stays the same.
//
// Prints JSON on stdout: per case the median and best µs per update over --repeats and the
// GB/s of the state it streams (values, gradient, and each optimizer's slots, read and
// written). bench/optimizer_ab.py runs two builds of it alternately.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "leash/common/flags.h"
#include "leash/common/status.h"
#include "leash/ps/table.h"

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

struct Case {
  std::string name;
  leash::OptimizerKind kind;
  float scale;
  bool accumulate;
  int streams;  // arrays of `floats` read or written once per update
};

}  // namespace

int main(int argc, char** argv) {
  int64_t floats = 401408;  // the CNN's 3136 x 128 layer
  int64_t repeats = 200;
  int64_t buffers = 8;
  std::string only;
  leash::Flags flags("leash-bench-optimizer",
                     "A shard's optimizer update of one dense table, per optimizer, in process "
                     "(JSON on stdout)");
  flags.Int("floats", &floats, "values in the table (a multiple of 64)");
  flags.Int("repeats", &repeats, "updates timed per case");
  flags.Int("buffers", &buffers, "gradients cycled through");
  flags.String("only", &only, "comma-separated case names (empty: all)");
  if (auto code = flags.ParseOrExitCode(argc, argv)) return *code;
  if (floats < 64 || floats % 64 != 0 || floats > (int64_t{1} << 30) || repeats < 1 ||
      buffers < 1 || buffers > 64) {
    std::fprintf(stderr,
                 "--floats must be a multiple of 64 in [64, 2^30], --repeats >= 1, --buffers in "
                 "[1, 64]\n");
    return 2;
  }
  using K = leash::OptimizerKind;
  // streams: sgd reads g and w, writes w (3); momentum + v read and written (5); adam + m, v
  // (7); adagrad + acc (5); accumulate reads g and the sum, writes the sum (3).
  const std::vector<Case> cases = {
      {"sgd", K::kSgd, 1.f, false, 3},
      {"momentum", K::kMomentum, 1.f, false, 5},
      {"adam", K::kAdam, 1.f, false, 7},
      {"adagrad", K::kAdagrad, 1.f, false, 5},
      {"momentum_scaled", K::kMomentum, 0.375f, false, 5},
      {"adam_scaled", K::kAdam, 0.375f, false, 7},
      {"accumulate", K::kMomentum, 0.375f, true, 3},
  };
  std::vector<std::vector<float>> grads(static_cast<size_t>(buffers),
                                        std::vector<float>(static_cast<size_t>(floats)));
  for (size_t b = 0; b < grads.size(); ++b) {
    for (size_t i = 0; i < grads[b].size(); ++i)
      grads[b][i] = 1e-3f * static_cast<float>((i * 7 + b * 13) % 101) - 0.05f;
  }
  std::printf("{\"floats\": %lld, \"repeats\": %lld, \"buffers\": %lld, \"cases\": [",
              static_cast<long long>(floats), static_cast<long long>(repeats),
              static_cast<long long>(buffers));
  bool first = true;
  for (const Case& c : cases) {
    if (!only.empty() && ("," + only + ",").find("," + c.name + ",") == std::string::npos) continue;
    leash::TableSpec spec;
    spec.name = c.name;
    spec.cols = 64;
    spec.rows = static_cast<uint64_t>(floats / 64);
    spec.optimizer.kind = c.kind;
    spec.optimizer.lr = 1e-4f;
    auto table = leash::ps::Table::Create(0, spec, leash::RowRange{0, spec.rows});
    if (!table.ok()) {
      std::fprintf(stderr, "%s\n", table.status().ToString().c_str());
      return 1;
    }
    const leash::Rows rows = leash::Rows::Range(0, spec.rows);
    std::vector<double> us;
    for (int64_t r = -repeats / 10; r < repeats; ++r) {  // the first tenth unmeasured
      const float* g = grads[static_cast<size_t>((r + repeats) % buffers)].data();
      const auto t0 = Clock::now();
      if (c.accumulate) {
        table->Accumulate(0, rows, g, c.scale);
      } else {
        table->Apply(rows, g, c.scale);
      }
      const auto t1 = Clock::now();
      if (r >= 0) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    const double med = Median(us);
    const double best = *std::min_element(us.begin(), us.end());
    const double gbps = static_cast<double>(floats) * 4.0 * c.streams / (med * 1e3);
    std::printf(
        "%s\n  {\"case\": \"%s\", \"median_us\": %.2f, \"best_us\": %.2f, \"gb_per_s\": %.3f}",
        first ? "" : ",", c.name.c_str(), med, best, gbps);
    first = false;
  }
  std::printf("\n]}\n");
  return 0;
}
