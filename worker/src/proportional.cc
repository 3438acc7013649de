// Work in proportion to speed: the arithmetic. Not thread-safe (value types).
#include "proportional.h"

#include <algorithm>
#include <cmath>

namespace leash::worker {

void StepRate::Add(int64_t samples, double seconds) {
  if (samples <= 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  const double w = seconds_ == 0 ? 1 : weight_;  // the first iteration is the whole average
  samples_ = w * static_cast<double>(samples) + (1 - w) * samples_;
  seconds_ = w * seconds + (1 - w) * seconds_;
}

int64_t ProportionalBatch(int64_t global_batch, double rate, double total_rate, int64_t fallback) {
  const int64_t most = std::max<int64_t>(1, global_batch);
  if (!(rate > 0) || !(total_rate >= rate) || !std::isfinite(total_rate)) {
    return std::clamp<int64_t>(fallback, 1, most);
  }
  const double share = rate / total_rate * static_cast<double>(global_batch);
  return std::clamp<int64_t>(std::llround(share), 1, most);
}

OptimizerOptions ProportionalOptimizer(OptimizerOptions opt, int64_t global_batch, int64_t batch,
                                       bool clock_steps) {
  if (global_batch <= 0 || batch <= 0) return opt;
  const double up = static_cast<double>(global_batch) / static_cast<double>(batch);
  switch (opt.kind) {
    case OptimizerKind::kSgd:
      opt.learning_rate = static_cast<float>(opt.learning_rate * up);
      break;
    case OptimizerKind::kMomentum:
      if (clock_steps && opt.momentum > 0 && opt.momentum < 1) {
        // One step per clock stands for `up` BSP pushes: the velocity decays by mu^up per
        // step, as it does over that many pushes, and the rate keeps the steady step per
        // sample, lr x up / (1 - mu) per clock, with the new decay.
        const double mu = opt.momentum;
        const double mu_up = std::pow(mu, up);
        opt.learning_rate = static_cast<float>(opt.learning_rate * up * (1 - mu_up) / (1 - mu));
        opt.momentum = static_cast<float>(mu_up);
      } else {
        opt.learning_rate = static_cast<float>(opt.learning_rate * up);
      }
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kFtrl:
      break;
  }
  if (!clock_steps) opt.weight_decay = static_cast<float>(opt.weight_decay / up);
  return opt;
}

}  // namespace leash::worker
