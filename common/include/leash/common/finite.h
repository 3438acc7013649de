// Whether a block of floats holds no NaN and no Inf: the check a shard makes of every pushed
// gradient before applying it (and every backup again as it replays the push). Vectorised
// (x86-64: SSE2, AVX2 when the CPU and OS have it); a scalar loop elsewhere. Thread-safe.
#pragma once

#include <cstddef>

namespace leash {

bool AllFinite(const float* p, size_t n);

// The portable loop AllFinite runs where no vector unit is used: the reference the tests
// and leash-bench-decode16 hold the vector paths to.
bool AllFiniteScalar(const float* p, size_t n);

}  // namespace leash
