// Work in proportion to speed (leash-worker --global-batch): a worker's measured speed, its
// share of the job's global batch per clock, and the shards' optimizer rates that keep --lr's
// step per sample. Value types and pure functions; not thread-safe.
#pragma once

#include <cstdint>

#include "leash/worker/params.h"

namespace leash::worker {

// A worker's speed in samples per second of its own work on a batch (forward, backward,
// and any injected delay), never the time it waits for pulls: a fast worker waiting for
// others must not look slow. Moving averages over iterations of the samples and of the
// seconds, each giving the newest `weight` of the say, so a change of speed shows within a
// few iterations; the speed is their ratio. Not an average of each iteration's rate: where
// a worker's time per sample varies from one iteration to the next (a worker sharing cores,
// or one whose delay multiplies its compute's jitter), the mean of samples / seconds
// exceeds samples / mean seconds, and such a worker would get more of each clock's batch
// than it can train in the others' time.
class StepRate {
 public:
  explicit StepRate(double weight = 0.5) : weight_(weight) {}
  // One iteration of `samples` that took `seconds`; ignored unless both are positive.
  void Add(int64_t samples, double seconds);
  // 0 before the first iteration.
  double samples_per_second() const { return seconds_ > 0 ? samples_ / seconds_ : 0; }

 private:
  double weight_;
  double samples_ = 0;  // moving averages, 0 before the first iteration
  double seconds_ = 0;
};

// This worker's batch for a clock: its share `rate / total_rate` of `global_batch`,
// rounded to the nearest sample, at least 1 and at most `global_batch`. `fallback` (also
// clamped so) while either speed is unknown (not positive) or the total is below this
// worker's own (a sum that does not hold it yet: it just joined).
int64_t ProportionalBatch(int64_t global_batch, double rate, double total_rate, int64_t fallback);

// The optimizer the shards get under work in proportion to speed, so that `--lr` and
// `--weight-decay` mean what they mean without it: per push of a `batch`-sample mean
// gradient, the step each of W workers makes at every clock of BSP (lr / batch per sample).
// The shards weight a push by samples / global_batch (a clock is one step on the global
// batch's mean gradient). SGD and momentum steps scale with the gradient, so their rate is
// multiplied by global_batch / batch (the linear-scaling rule: with global_batch = W x batch,
// a clock applies BSP's update to the same samples, no warmup needed); Adam and Adagrad
// divide the gradient's scale out, so theirs stays. Momentum with `clock_steps` (one step
// per clock standing for global_batch / batch = k BSP pushes) gets momentum mu^k, the decay
// of k pushes, and rate lr x k x (1 - mu^k) / (1 - mu), which keeps BSP's steady step per
// sample (lr x k / (1 - mu) per clock). Weight decay adds wd x w to the gradient
// of every step. With `clock_steps` (one step per clock on the summed pushes) it stays: SGD
// and momentum then decay by lr x global_batch / batch x wd per clock, BSP's global_batch /
// batch pushes' worth. Without (a step per push) it is multiplied by batch / global_batch
// for every kind (lr x wd per push stays BSP's). `opt` as given when either batch is not
// positive.
OptimizerOptions ProportionalOptimizer(OptimizerOptions opt, int64_t global_batch, int64_t batch,
                                       bool clock_steps);

}  // namespace leash::worker
