// The raw CPU kernels behind kernels.h, usable without a Context: the parameter server
// links only these (OpenBLAS, no CUDA) to run its optimizers. No validation: callers pass
// non-negative sizes, valid pointers and in-range labels (kernels.h checks all that).
// Reentrant, except SetCpuThreads, which changes process-wide OpenBLAS state.
#pragma once

#include <cstdint>

#include "leash/kernels/types.h"

namespace leash::kernels::cpu {

// Sets the number of threads OpenBLAS uses for every later matrix product in the process.
void SetCpuThreads(int threads);

// C[m x n] = alpha * op(A) * op(B) + beta * C, row-major; beta == 0 does not read C.
void Gemm(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          const float* b, float beta, float* c);
// y[r, c] += bias[c].
void BiasAdd(int64_t rows, int64_t cols, const float* bias, float* y);
// db[c] = sum over r of dy[r, c].
void BiasGrad(int64_t rows, int64_t cols, const float* dy, float* db);
// y = max(x, 0); x and y may alias.
void Relu(int64_t n, const float* x, float* y);
// dx = dy where y > 0, else 0; dy and dx may alias.
void ReluBackward(int64_t n, const float* y, const float* dy, float* dx);

// Convolution (stride 1, zero padding), NCHW, exactly as documented in kernels.h. Each
// image is lowered to its patch matrix (im2col) in `scratch`, which must hold
// Conv2dScratchSize(s) floats (nothing for a 1x1 kernel without padding), then multiplied
// with BLAS. Outputs are overwritten and must not overlap the inputs or the scratch.
int64_t Conv2dScratchSize(const Conv2dShape& s);
void Conv2dForward(const Conv2dShape& s, const float* x, const float* weight, float* y,
                   float* scratch);
void Conv2dBackwardData(const Conv2dShape& s, const float* dy, const float* weight, float* dx,
                        float* scratch);
// Sums over the n images; n == 0 gives zeros.
void Conv2dBackwardWeight(const Conv2dShape& s, const float* x, const float* dy, float* dweight,
                          float* scratch);
// y[i, ch, p] += bias[ch] for y of n x c x hw.
void BiasAddChannels(int64_t n, int64_t c, int64_t hw, const float* bias, float* y);
// db[ch] = sum over i and p of dy[i, ch, p].
void BiasGradChannels(int64_t n, int64_t c, int64_t hw, const float* dy, float* db);
// 2 x 2 max pooling, stride 2, output n x c x (h / 2) x (w / 2) rounded down; h, w >= 2.
void MaxPool2dForward(int64_t n, int64_t c, int64_t h, int64_t w, const float* x, float* y);
// dx = dy at each window's first maximum of x (row-major), zero elsewhere.
void MaxPool2dBackward(int64_t n, int64_t c, int64_t h, int64_t w, const float* x, const float* dy,
                       float* dx);

// Mean softmax cross-entropy (log-sum-exp); labels in [0, classes). dlogits, loss and
// correct may each be null. rows == 0 gives loss 0 and correct 0.
void SoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits, const int32_t* labels,
                         float* dlogits, float* loss, int64_t* correct);

// Optimizer updates, exactly as documented in kernels.h. AdamUpdate's step is 1-based. The
// arrays must not overlap (the loops are vectorized on that promise).
void SgdUpdate(int64_t n, const SgdParams& p, const float* g, float* w);
void MomentumUpdate(int64_t n, const MomentumParams& p, const float* g, float* w, float* v);
void AdamUpdate(int64_t n, const AdamParams& p, int64_t step, const float* g, float* w, float* m,
                float* v);
void AdagradUpdate(int64_t n, const AdagradParams& p, const float* g, float* w, float* acc);
// y = a * x and y += a * x (a weighted push, a sum of weighted pushes); x and y must not
// overlap.
void Scale(int64_t n, float a, const float* x, float* y);
void Axpy(int64_t n, float a, const float* x, float* y);

// fp32 <-> fp16 / bf16 bit patterns, as leash/common/half.h.
void ConvertToHalf(int64_t n, const float* x, uint16_t* y, bool bf16);
void ConvertFromHalf(int64_t n, const uint16_t* x, float* y, bool bf16);

}  // namespace leash::kernels::cpu
