// Element-wise CUDA kernels: bias add / grad, ReLU and its backward, the four optimizer
// updates and fp32 <-> fp16 / bf16 conversion. The arithmetic mirrors kernels/cpu
// expression for expression, so results agree to fp32 rounding (bit for bit for the
// conversions). One thread at a time per State.
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda_state.h"

namespace leash::kernels::cuda {
namespace {

constexpr int kBlock = 256;

// Grid-stride loop over [0, n) with 64-bit indices.
#define LEASH_FOR_EACH(i, n)                                                             \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void BiasAddKernel(int64_t rows, int64_t cols, const float* __restrict__ bias,
                              float* __restrict__ y) {
  LEASH_FOR_EACH(i, rows * cols) { y[i] += bias[i % cols]; }
}

// Column sums: threadIdx.x walks columns (coalesced), threadIdx.y strides over rows, and
// the kBiasRows partial sums of a column are added in shared memory.
constexpr int kBiasCols = 32;
constexpr int kBiasRows = 8;
__global__ void BiasGradKernel(int64_t rows, int64_t cols, const float* __restrict__ dy,
                               float* __restrict__ db) {
  __shared__ float partial[kBiasRows][kBiasCols + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kBiasCols + threadIdx.x;
  float sum = 0.f;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kBiasRows) sum += dy[r * cols + c];
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.f;
    for (int i = 0; i < kBiasRows; ++i) total += partial[i][threadIdx.x];
    db[c] = total;
  }
}

__global__ void ReluKernel(int64_t n, const float* x, float* y) {
  LEASH_FOR_EACH(i, n) { y[i] = x[i] > 0.f ? x[i] : 0.f; }
}

__global__ void ReluBackwardKernel(int64_t n, const float* y, const float* dy, float* dx) {
  LEASH_FOR_EACH(i, n) { dx[i] = y[i] > 0.f ? dy[i] : 0.f; }
}

__global__ void SgdKernel(int64_t n, SgdParams p, const float* __restrict__ g,
                          float* __restrict__ w) {
  LEASH_FOR_EACH(i, n) {
    const float gi = g[i] + p.weight_decay * w[i];
    w[i] -= p.lr * gi;
  }
}

__global__ void MomentumKernel(int64_t n, MomentumParams p, const float* __restrict__ g,
                               float* __restrict__ w, float* __restrict__ v) {
  LEASH_FOR_EACH(i, n) {
    const float gi = g[i] + p.weight_decay * w[i];
    const float vi = p.momentum * v[i] + gi;
    v[i] = vi;
    w[i] -= p.lr * vi;
  }
}

__global__ void AdamKernel(int64_t n, AdamParams p, float c1, float c2, const float* __restrict__ g,
                           float* __restrict__ w, float* __restrict__ m, float* __restrict__ v) {
  LEASH_FOR_EACH(i, n) {
    const float gi = g[i] + p.weight_decay * w[i];
    const float mi = p.beta1 * m[i] + (1.f - p.beta1) * gi;
    const float vi = p.beta2 * v[i] + (1.f - p.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] -= p.lr * (mi / c1) / (sqrtf(vi / c2) + p.epsilon);
  }
}

__global__ void AdagradKernel(int64_t n, AdagradParams p, const float* __restrict__ g,
                              float* __restrict__ w, float* __restrict__ acc) {
  LEASH_FOR_EACH(i, n) {
    const float gi = g[i] + p.weight_decay * w[i];
    const float ai = acc[i] + gi * gi;
    acc[i] = ai;
    w[i] -= p.lr * gi / (sqrtf(ai) + p.epsilon);
  }
}

// The conversions of leash/common/half.h. fp16 uses the hardware's round-to-nearest-even
// conversion (identical results), with NaN mapped to half.h's quiet NaN; bf16 is half.h's
// bit arithmetic.
__device__ inline uint16_t FloatToHalfBits(float f) {
  const uint32_t x = __float_as_uint(f);
  if (isnan(f)) return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7e00u);
  return __half_as_ushort(__float2half_rn(f));
}

__device__ inline uint16_t FloatToBf16Bits(float f) {
  const uint32_t x = __float_as_uint(f);
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x007fffffu))
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

__device__ inline float HalfBitsToFloat(uint16_t h) {
  if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) {  // NaN: keep sign and payload, as half.h
    return __uint_as_float((static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7f800000u |
                           (static_cast<uint32_t>(h & 0x3ffu) << 13));
  }
  return __half2float(__ushort_as_half(h));
}

__global__ void ToHalfKernel(int64_t n, const float* __restrict__ x, uint16_t* __restrict__ y,
                             bool bf16) {
  if (bf16) {
    LEASH_FOR_EACH(i, n) { y[i] = FloatToBf16Bits(x[i]); }
  } else {
    LEASH_FOR_EACH(i, n) { y[i] = FloatToHalfBits(x[i]); }
  }
}

__global__ void FromHalfKernel(int64_t n, const uint16_t* __restrict__ x, float* __restrict__ y,
                               bool bf16) {
  if (bf16) {
    LEASH_FOR_EACH(i, n) { y[i] = __uint_as_float(static_cast<uint32_t>(x[i]) << 16); }
  } else {
    LEASH_FOR_EACH(i, n) { y[i] = HalfBitsToFloat(x[i]); }
  }
}

#undef LEASH_FOR_EACH

}  // namespace

Status BiasAdd(State& s, int64_t rows, int64_t cols, const float* bias, float* y) {
  if (rows == 0 || cols == 0) return Status::Ok();
  LEASH_RETURN_IF_ERROR(Activate(s));
  BiasAddKernel<<<GridFor(rows * cols, kBlock), kBlock, 0, s.stream>>>(rows, cols, bias, y);
  return LaunchStatus("BiasAddKernel");
}

Status BiasGrad(State& s, int64_t rows, int64_t cols, const float* dy, float* db) {
  if (cols == 0) return Status::Ok();
  LEASH_RETURN_IF_ERROR(Activate(s));
  const dim3 block(kBiasCols, kBiasRows);
  const auto grid = static_cast<unsigned>((cols + kBiasCols - 1) / kBiasCols);
  BiasGradKernel<<<grid, block, 0, s.stream>>>(rows, cols, dy, db);
  return LaunchStatus("BiasGradKernel");
}

Status Relu(State& s, int64_t n, const float* x, float* y) {
  if (n == 0) return Status::Ok();
  LEASH_RETURN_IF_ERROR(Activate(s));
  ReluKernel<<<GridFor(n, kBlock), kBlock, 0, s.stream>>>(n, x, y);
  return LaunchStatus("ReluKernel");
}

Status ReluBackward(State& s, int64_t n, const float* y, const float* dy, float* dx) {
  if (n == 0) return Status::Ok();
  LEASH_RETURN_IF_ERROR(Activate(s));
  ReluBackwardKernel<<<GridFor(n, kBlock), kBlock, 0, s.stream>>>(n, y, dy, dx);
  return LaunchStatus("ReluBackwardKernel");
}

Status SgdUpdate(State& s, int64_t n, const SgdParams& p, const float* g, float* w) {
  if (n == 0) return Status::Ok();
  LEASH_RETURN_IF_ERROR(Activate(s));
  SgdKernel<<<GridFor(n, kBlock), kBlock, 0, s.stream>>>(n, p, g, w);
  return LaunchStatus("SgdKernel");
}

Status MomentumUpdate(State& s, int64_t n, const MomentumParams& p, const float* g, float* w,
                      float* v) {
  if (n == 0) return Status::Ok();
  LEASH_RETURN_IF_ERROR(Activate(s));
  MomentumKernel<<<GridFor(n, kBlock), kBlock, 0, s.stream>>>(n, p, g, w, v);
  return LaunchStatus("MomentumKernel");
}

Status AdamUpdate(State& s, int64_t n, const AdamParams& p, int64_t step, const float* g, float* w,
                  float* m, float* v) {
  if (n == 0) return Status::Ok();
  LEASH_RETURN_IF_ERROR(Activate(s));
  AdamKernel<<<GridFor(n, kBlock), kBlock, 0, s.stream>>>(
      n, p, AdamBiasCorrection(p.beta1, step), AdamBiasCorrection(p.beta2, step), g, w, m, v);
  return LaunchStatus("AdamKernel");
}

Status AdagradUpdate(State& s, int64_t n, const AdagradParams& p, const float* g, float* w,
                     float* acc) {
  if (n == 0) return Status::Ok();
  LEASH_RETURN_IF_ERROR(Activate(s));
  AdagradKernel<<<GridFor(n, kBlock), kBlock, 0, s.stream>>>(n, p, g, w, acc);
  return LaunchStatus("AdagradKernel");
}

Status ConvertToHalf(State& s, int64_t n, const float* x, uint16_t* y, bool bf16) {
  if (n == 0) return Status::Ok();
  LEASH_RETURN_IF_ERROR(Activate(s));
  ToHalfKernel<<<GridFor(n, kBlock), kBlock, 0, s.stream>>>(n, x, y, bf16);
  return LaunchStatus("ToHalfKernel");
}

Status ConvertFromHalf(State& s, int64_t n, const uint16_t* x, float* y, bool bf16) {
  if (n == 0) return Status::Ok();
  LEASH_RETURN_IF_ERROR(Activate(s));
  FromHalfKernel<<<GridFor(n, kBlock), kBlock, 0, s.stream>>>(n, x, y, bf16);
  return LaunchStatus("FromHalfKernel");
}

}  // namespace leash::kernels::cuda
