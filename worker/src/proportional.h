// Work in proportion to speed (leash-worker --global-batch): a worker's measured speed and
// its share of the job's global batch per clock. Value types and pure functions; not
// thread-safe.
#pragma once

#include <cstdint>

namespace leash::worker {

// A worker's speed in samples per second of its own work on a batch (forward, backward,
// and any injected delay), never the time it waits for pulls: a fast worker waiting for
// others must not look slow. A moving average over iterations that gives the newest
// `weight` of the say, so a change of speed shows within a few iterations.
class StepRate {
 public:
  explicit StepRate(double weight = 0.5) : weight_(weight) {}
  // One iteration of `samples` that took `seconds`; ignored unless both are positive.
  void Add(int64_t samples, double seconds);
  // 0 before the first iteration.
  double samples_per_second() const { return rate_; }

 private:
  double weight_;
  double rate_ = 0;
};

// This worker's batch for a clock: its share `rate / total_rate` of `global_batch`,
// rounded to the nearest sample, at least 1 and at most `global_batch`. `fallback` (also
// clamped so) while either speed is unknown (not positive) or the total is below this
// worker's own (a sum that does not hold it yet: it just joined).
int64_t ProportionalBatch(int64_t global_batch, double rate, double total_rate, int64_t fallback);

}  // namespace leash::worker
