// The CPU kernels: matrix products through OpenBLAS, everything else as plain loops the
// compiler vectorizes. Reentrant; SetCpuThreads changes process-wide OpenBLAS state.
#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "leash/common/half.h"
#include "leash/kernels/blas_core.h"
#include "leash/kernels/cpu.h"

namespace leash::kernels::cpu {

void SetCpuThreads(int threads) { openblas_set_num_threads(threads); }

std::string OpenBlasCore() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

void Gemm(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS rejects the zero leading dimensions this implies; the result is beta * C.
    for (int64_t i = 0; i < m * n; ++i) c[i] = beta == 0.f ? 0.f : beta * c[i];
    return;
  }
  const bool ta_yes = ta == Transpose::kYes;
  const bool tb_yes = tb == Transpose::kYes;
  // Row-major leading dimensions: the number of columns of each matrix as stored.
  const int64_t lda = ta_yes ? m : k;
  const int64_t ldb = tb_yes ? k : n;
  cblas_sgemm(CblasRowMajor, ta_yes ? CblasTrans : CblasNoTrans, tb_yes ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(n));
}

void BiasAdd(int64_t rows, int64_t cols, const float* bias, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

void BiasGrad(int64_t rows, int64_t cols, const float* dy, float* db) {
  for (int64_t c = 0; c < cols; ++c) db[c] = 0.f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = dy + r * cols;
    for (int64_t c = 0; c < cols; ++c) db[c] += row[c];
  }
}

// Both ReLU loops are written to compile without a branch per element: on activations,
// whose signs are a coin toss, mispredicted branches made them several times slower than
// the memory traffic (7 ms instead of about 1 for a 64 x 32 x 28 x 28 tensor).
void Relu(int64_t n, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    // y = x > 0 ? x : +0 (NaN and -0 give +0), as a mask on the bits; the plain select
    // is recognized as a max and compiled to a branch.
    const float v = x[i];
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    bits &= 0u - static_cast<uint32_t>(v > 0.f);
    std::memcpy(&y[i], &bits, sizeof bits);
  }
}

void ReluBackward(int64_t n, const float* y, const float* dy, float* dx) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i];  // read unconditionally, so the select needs no branch
    dx[i] = y[i] > 0.f ? g : 0.f;
  }
}

void SoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits, const int32_t* labels,
                         float* dlogits, float* loss, int64_t* correct) {
  double loss_sum = 0.0;
  int64_t right = 0;
  const float inv_rows = rows > 0 ? 1.f / static_cast<float>(rows) : 0.f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * classes;
    const int64_t label = labels[r];
    float max = x[0];
    int64_t argmax = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (x[c] > max) {
        max = x[c];
        argmax = c;
      }
    }
    const float x_label = x[label];  // read before dlogits is written, in case they alias
    float sum = 0.f;
    if (dlogits != nullptr) {
      float* d = dlogits + r * classes;
      for (int64_t c = 0; c < classes; ++c) {
        d[c] = std::exp(x[c] - max);
        sum += d[c];
      }
      const float inv_sum = 1.f / sum;
      for (int64_t c = 0; c < classes; ++c)
        d[c] = (d[c] * inv_sum - (c == label ? 1.f : 0.f)) * inv_rows;
    } else {
      for (int64_t c = 0; c < classes; ++c) sum += std::exp(x[c] - max);
    }
    // log-sum-exp: max + log(sum exp(x - max)) never overflows.
    loss_sum += static_cast<double>(max) + std::log(static_cast<double>(sum)) -
                static_cast<double>(x_label);
    if (argmax == label) ++right;
  }
  if (loss != nullptr)
    *loss = rows > 0 ? static_cast<float>(loss_sum / static_cast<double>(rows)) : 0.f;
  if (correct != nullptr) *correct = right;
}

// The update loops run in blocks of a fixed size over non-aliasing pointers, so GCC
// vectorizes them at -O2 (its cheapest cost model wants no remainder loop and no alias
// checks); the elementwise arithmetic, and so the result, is the same.
constexpr int64_t kBlock = 16;

namespace {

// Calls block(offset, length) for [0, n) in blocks of kBlock and one shorter block after
// them; inlined, each call of the full blocks has the constant length the vectorizer needs.
template <typename Block>
inline void InBlocks(int64_t n, Block&& block) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) block(i, kBlock);
  block(i, n - i);
}

inline void SgdBlock(int64_t n, float lr, float wd, const float* __restrict g,
                     float* __restrict w) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] + wd * w[i];
    w[i] -= lr * gi;
  }
}

inline void MomentumBlock(int64_t n, float lr, float mu, float wd, const float* __restrict g,
                          float* __restrict w, float* __restrict v) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] + wd * w[i];
    v[i] = mu * v[i] + gi;
    w[i] -= lr * v[i];
  }
}

// Adam and Adagrad take a square root: vectorized only where math-errno is off (this
// library is built with -fno-math-errno; nothing here reads errno). The parameters are
// copied into locals, which the stores through w, m and v cannot alias.
inline void AdamBlock(int64_t n, const AdamParams& p, float c1, float c2, const float* __restrict g,
                      float* __restrict w, float* __restrict m, float* __restrict v) {
  const float lr = p.lr, b1 = p.beta1, b2 = p.beta2, eps = p.epsilon, wd = p.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] + wd * w[i];
    m[i] = b1 * m[i] + (1.f - b1) * gi;
    v[i] = b2 * v[i] + (1.f - b2) * gi * gi;
    w[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
  }
}

inline void AdagradBlock(int64_t n, const AdagradParams& p, const float* __restrict g,
                         float* __restrict w, float* __restrict acc) {
  const float lr = p.lr, eps = p.epsilon, wd = p.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] + wd * w[i];
    acc[i] += gi * gi;
    w[i] -= lr * gi / (std::sqrt(acc[i]) + eps);
  }
}

inline void ScaleBlock(int64_t n, float a, const float* __restrict x, float* __restrict y) {
  for (int64_t i = 0; i < n; ++i) y[i] = a * x[i];
}

inline void AxpyBlock(int64_t n, float a, const float* __restrict x, float* __restrict y) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

void SgdUpdate(int64_t n, const SgdParams& p, const float* g, float* w) {
  InBlocks(n, [&](int64_t i, int64_t len) { SgdBlock(len, p.lr, p.weight_decay, g + i, w + i); });
}

void MomentumUpdate(int64_t n, const MomentumParams& p, const float* g, float* w, float* v) {
  InBlocks(n, [&](int64_t i, int64_t len) {
    MomentumBlock(len, p.lr, p.momentum, p.weight_decay, g + i, w + i, v + i);
  });
}

void AdamUpdate(int64_t n, const AdamParams& p, int64_t step, const float* g, float* w, float* m,
                float* v) {
  const float c1 = AdamBiasCorrection(p.beta1, step);
  const float c2 = AdamBiasCorrection(p.beta2, step);
  InBlocks(n,
           [&](int64_t i, int64_t len) { AdamBlock(len, p, c1, c2, g + i, w + i, m + i, v + i); });
}

void AdagradUpdate(int64_t n, const AdagradParams& p, const float* g, float* w, float* acc) {
  InBlocks(n, [&](int64_t i, int64_t len) { AdagradBlock(len, p, g + i, w + i, acc + i); });
}

void Scale(int64_t n, float a, const float* x, float* y) {
  InBlocks(n, [&](int64_t i, int64_t len) { ScaleBlock(len, a, x + i, y + i); });
}

void Axpy(int64_t n, float a, const float* x, float* y) {
  InBlocks(n, [&](int64_t i, int64_t len) { AxpyBlock(len, a, x + i, y + i); });
}

void ConvertToHalf(int64_t n, const float* x, uint16_t* y, bool bf16) {
  if (n <= 0) return;
  auto* bytes = reinterpret_cast<uint8_t*>(y);
  if (bf16) {
    FloatToBf16N(x, static_cast<size_t>(n), bytes);
  } else {
    FloatToHalfN(x, static_cast<size_t>(n), bytes);
  }
}

void ConvertFromHalf(int64_t n, const uint16_t* x, float* y, bool bf16) {
  if (n <= 0) return;
  const auto* bytes = reinterpret_cast<const uint8_t*>(x);
  if (bf16) {
    Bf16ToFloatN(bytes, static_cast<size_t>(n), y);
  } else {
    HalfToFloatN(bytes, static_cast<size_t>(n), y);
  }
}

}  // namespace leash::kernels::cpu
