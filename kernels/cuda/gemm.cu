// Matrix products on cuBLAS. Row-major C = op(A) op(B) is computed as the column-major
// C^T = op(B)^T op(A)^T, which is the same memory: swap the operands, keep the flags.
// One thread at a time per State.
#include <string>

#include "cuda_state.h"

namespace leash::kernels::cuda {
namespace {

// C = beta * C for k == 0, where cuBLAS would reject the zero leading dimension.
__global__ void ScaleKernel(int64_t n, float beta, float* c) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    c[i] = beta == 0.f ? 0.f : beta * c[i];
  }
}

}  // namespace

Status Gemm(State& s, Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return Status::Ok();
  LEASH_RETURN_IF_ERROR(Activate(s));
  if (k == 0) {
    constexpr int kBlock = 256;
    ScaleKernel<<<GridFor(m * n, kBlock), kBlock, 0, s.stream>>>(m * n, beta, c);
    return LaunchStatus("ScaleKernel");
  }
  const bool ta_yes = ta == Transpose::kYes;
  const bool tb_yes = tb == Transpose::kYes;
  // Leading dimensions are the row-major column counts, as for CBLAS.
  const int lda = static_cast<int>(ta_yes ? m : k);
  const int ldb = static_cast<int>(tb_yes ? k : n);
  return FromCublas(
      cublasSgemm(s.cublas, tb_yes ? CUBLAS_OP_T : CUBLAS_OP_N, ta_yes ? CUBLAS_OP_T : CUBLAS_OP_N,
                  static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, ldb, a,
                  lda, &beta, c, static_cast<int>(n)),
      "cublasSgemm m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
}

}  // namespace leash::kernels::cuda
