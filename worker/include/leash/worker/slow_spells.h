// Transient straggler injection for benchmarks (leash-worker --slow-spells): wall-clock time
// is cut into spells of `seconds`; in each spell one worker of `workers`, picked by a seeded
// hash of the spell's number, computes `factor` times slower. Every worker derives the same
// pick from the same seed and the host's clock, so exactly one is slow at a time without any
// message between them. Value types and pure functions; thread-safe.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "leash/common/status.h"

namespace leash::worker {

struct SlowSpells {
  double factor = 1;  // 1: off
  double seconds = 1;
  int64_t worker = 0;   // this worker's number, in [0, workers)
  int64_t workers = 1;  // the workers the spells rotate among
  uint64_t seed = 0;

  bool enabled() const { return factor > 1; }
};

// The worker slowed during the spell that holds `unix_seconds` (seconds since the epoch).
inline int64_t SlowWorkerAt(const SlowSpells& s, double unix_seconds) {
  // splitmix64 of (seed, spell number): a well-mixed pick for consecutive spells.
  uint64_t z =
      s.seed + static_cast<uint64_t>(std::floor(unix_seconds / s.seconds)) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<int64_t>(z % static_cast<uint64_t>(s.workers));
}

// The factor this worker computes slower by at `unix_seconds`: `factor` in its spells, 1
// otherwise.
inline double SpellFactorAt(const SlowSpells& s, double unix_seconds) {
  if (!s.enabled()) return 1;
  return SlowWorkerAt(s, unix_seconds) == s.worker ? s.factor : 1;
}

// Parses "FACTOR,SECONDS,WORKER/WORKERS,SEED", e.g. "5,1,0/3,42": this is worker 0 of 3,
// slowed 5x in its 1-second spells under seed 42. An empty string: off. InvalidArgument
// saying what is expected otherwise.
inline Result<SlowSpells> ParseSlowSpells(const std::string& text) {
  SlowSpells s;
  if (text.empty()) return s;
  const auto bad = [&](const std::string& why) -> Result<SlowSpells> {
    return InvalidArgument("bad slow spells '" + text + "': " + why +
                           " (expected FACTOR,SECONDS,WORKER/WORKERS,SEED, e.g. 5,1,0/3,42)");
  };
  double factor = 0, seconds = 0;
  long long worker = -1, workers = 0;
  unsigned long long seed = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%lf,%lf,%lld/%lld,%llu%c", &factor, &seconds, &worker, &workers,
                  &seed, &tail) != 5) {
    return bad("not four comma-separated fields");
  }
  if (!(factor >= 1 && factor < 1e6)) return bad("FACTOR must be in [1, 1e6)");
  if (!(seconds > 0 && seconds < 1e6)) return bad("SECONDS must be in (0, 1e6)");
  if (workers < 1 || worker < 0 || worker >= workers) {
    return bad("need 0 <= WORKER < WORKERS");
  }
  s.factor = factor;
  s.seconds = seconds;
  s.worker = worker;
  s.workers = workers;
  s.seed = seed;
  return s;
}

}  // namespace leash::worker
