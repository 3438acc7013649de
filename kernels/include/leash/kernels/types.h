// Plain value types shared by the kernel entry points (kernels.h), the raw CPU kernels
// (cpu.h) and the CUDA backend: transposition flags and optimizer hyper-parameters.
// Value types, thread-compatible. Kept C++17 so the CUDA sources can include it.
#pragma once

#include <cmath>
#include <cstdint>

namespace leash::kernels {

enum class Transpose { kNo, kYes };

// Optimizer updates of n parameters w with gradient g. Weight decay adds wd * w to g.
struct SgdParams {
  float lr = 0.01f;
  float weight_decay = 0.f;
};
struct MomentumParams {
  float lr = 0.01f;
  float momentum = 0.9f;
  float weight_decay = 0.f;
};
struct AdamParams {
  float lr = 0.001f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float weight_decay = 0.f;
};
// Adam's bias correction 1 - beta^step for the 1-based `step`, computed the same way by
// the CPU and CUDA kernels (in double, so that it stays exact for large steps).
inline float AdamBiasCorrection(float beta, int64_t step) {
  return static_cast<float>(1.0 - std::pow(static_cast<double>(beta), static_cast<double>(step)));
}
struct AdagradParams {
  float lr = 0.01f;
  float epsilon = 1e-10f;
  float weight_decay = 0.f;
};

}  // namespace leash::kernels
