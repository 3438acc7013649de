// Plain value types shared by the kernel entry points (kernels.h), the raw CPU kernels
// (cpu.h) and the CUDA backend: transposition flags, convolution geometry and optimizer
// hyper-parameters.
// Value types, thread-compatible. Kept C++17 so the CUDA sources can include it.
#pragma once

#include <cmath>
#include <cstdint>

namespace leash::kernels {

enum class Transpose { kNo, kYes };

// The geometry of a 2-D convolution over NCHW float tensors, stride 1, `pad` zero rows and
// columns on every side: x is n x c_in x h x w, weight c_out x c_in x k x k, y is
// n x c_out x h_out() x w_out().
struct Conv2dShape {
  int64_t n = 0;
  int64_t c_in = 0;
  int64_t h = 0;
  int64_t w = 0;
  int64_t c_out = 0;
  int64_t k = 0;
  int64_t pad = 0;
  int64_t h_out() const { return h + 2 * pad - k + 1; }
  int64_t w_out() const { return w + 2 * pad - k + 1; }
  // Rows of one image's patch matrix (im2col): one per weight of an output channel.
  int64_t patch_rows() const { return c_in * k * k; }
};

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
