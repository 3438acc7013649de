// The table the push/pull benchmarks push to: `floats` values (a multiple of 64) in rows of
// 64, momentum at a tiny learning rate, so that a shard (or a backup's stand-in) applies a
// real optimizer update to every push. Shared by leash-bench-pushpull and
// leash-bench-backup-load, whose figures are compared.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "leash/common/domain.h"

namespace leash::bench {

inline TableSpec MomentumTable(std::string name, int64_t floats) {
  TableSpec t;
  t.name = std::move(name);
  t.cols = 64;
  t.rows = static_cast<uint64_t>(floats / 64);
  t.optimizer.kind = OptimizerKind::kMomentum;
  t.optimizer.lr = 1e-6f;
  return t;
}

}  // namespace leash::bench
