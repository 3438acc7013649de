// Whether a block of floats holds no NaN and no Inf: the check a shard makes of every pushed
// gradient before applying it (and every backup again as it replays the push), unless the
// copy that brought the gradient out of shared memory made it (CopyAllFinite). Vectorised
// (x86-64: SSE2, AVX2 when the CPU and OS have it); a scalar loop elsewhere. Thread-safe.
#pragma once

#include <cstddef>

namespace leash {

bool AllFinite(const float* p, size_t n);

// Copies `bytes` bytes from `src` to `dst` (which must not overlap) and says, from the same
// pass, whether they are whole float32 values none of which is NaN or Inf: false when
// `bytes` is not a multiple of 4 (the bytes are still copied). A copy that has to be made
// anyway (out of shared memory) so learns what AllFinite would, at the cost of the copy
// alone instead of a second pass over bytes no longer in cache.
bool CopyAllFinite(void* dst, const void* src, size_t bytes);

// The portable loop AllFinite runs where no vector unit is used: the reference the tests
// and leash-bench-decode16 hold the vector paths to.
bool AllFiniteScalar(const float* p, size_t n);

}  // namespace leash
