// What the entry points (kernels.cc) need from the context implementation (context.cc):
// reaching a CUDA context's backend state, and the error of a build without CUDA.
// Private to kernels/. Thread-compatible like Context itself.
#pragma once

#include <string>
#include <utility>

#include "cuda/cuda_kernels.h"
#include "leash/common/status.h"
#include "leash/kernels/kernels.h"

// Set to 1 by CMake when the CUDA backend is built.
#ifndef LEASH_WITH_CUDA
#define LEASH_WITH_CUDA 0
#endif

namespace leash::kernels::internal {

// Unavailable: this build has no CUDA support.
Status NoCuda();

// The backend state of a CUDA context made by Context::Create; null for any other.
cuda::State* CudaStateOf(Context& ctx);

// Runs `f(state)` on the CUDA backend of `ctx`. `f` is a generic lambda, so nothing of
// the CUDA backend is referenced (or linked) in a build without it.
template <typename R = Status, typename F>
R OnCuda(Context& ctx, F&& f) {
#if LEASH_WITH_CUDA
  cuda::State* state = CudaStateOf(ctx);
  if (state == nullptr) {
    return R(InvalidArgument("a context for " + DeviceName(ctx.device()) +
                             " must come from Context::Create to run CUDA kernels"));
  }
  return std::forward<F>(f)(*state);
#else
  (void)ctx;
  (void)f;
  return R(NoCuda());
#endif
}

}  // namespace leash::kernels::internal
