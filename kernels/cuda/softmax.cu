// Softmax cross-entropy on CUDA: one warp per row (max and argmax, log-sum-exp, dlogits),
// per-block partial sums, then one atomic add per block into the State's scratch, which
// is copied back in a single transfer. One thread at a time per State.
#include <cstdint>
#include <string>

#include "cuda_state.h"

namespace leash::kernels::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kWarps = kBlock / 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kNoIndex = INT64_MAX;

// Larger logit wins; on a tie the smaller index, so the argmax is the first maximum (as
// on the CPU) whatever order the lanes combine in.
__device__ inline void KeepMax(float& value, int64_t& index, float other_value,
                               int64_t other_index) {
  if (other_value > value || (other_value == value && other_index < index)) {
    value = other_value;
    index = other_index;
  }
}

__global__ void SoftmaxXentKernel(int64_t rows, int64_t classes, const float* logits,
                                  const int32_t* __restrict__ labels, float* dlogits,
                                  float inv_rows, SoftmaxTotals* __restrict__ totals) {
  __shared__ double warp_loss[kWarps];
  __shared__ unsigned long long warp_correct[kWarps];
  __shared__ unsigned long long warp_bad[kWarps];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  double loss = 0.0;
  unsigned long long correct = 0;
  unsigned long long bad = 0;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const float* x = logits + row * classes;
    float max = -INFINITY;
    int64_t argmax = kNoIndex;
    for (int64_t c = lane; c < classes; c += 32) {
      const float v = x[c];
      if (argmax == kNoIndex || v > max) {
        max = v;
        argmax = c;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other_max = __shfl_xor_sync(kFullMask, max, offset);
      const long long other_arg =
          __shfl_xor_sync(kFullMask, static_cast<long long>(argmax), offset);
      KeepMax(max, argmax, other_max, other_arg);
    }
    float sum = 0.f;
    for (int64_t c = lane; c < classes; c += 32) sum += expf(x[c] - max);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);

    const int64_t label = labels[row];
    const bool valid = label >= 0 && label < classes;
    const float x_label =
        valid ? x[label] : 0.f;  // read before dlogits is written, in case they alias
    __syncwarp();
    if (dlogits != nullptr) {
      float* d = dlogits + row * classes;
      const float inv_sum = 1.f / sum;
      for (int64_t c = lane; c < classes; c += 32) {
        d[c] = valid ? (expf(x[c] - max) * inv_sum - (c == label ? 1.f : 0.f)) * inv_rows : 0.f;
      }
    }
    if (lane == 0) {
      if (valid) {
        loss +=
            static_cast<double>(max) + log(static_cast<double>(sum)) - static_cast<double>(x_label);
        if (argmax == label) ++correct;
      } else {
        ++bad;
      }
    }
  }
  if (lane == 0) {
    warp_loss[warp] = loss;
    warp_correct[warp] = correct;
    warp_bad[warp] = bad;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double block_loss = 0.0;
    unsigned long long block_correct = 0;
    unsigned long long block_bad = 0;
    for (int i = 0; i < kWarps; ++i) {
      block_loss += warp_loss[i];
      block_correct += warp_correct[i];
      block_bad += warp_bad[i];
    }
    atomicAdd(&totals->loss_sum, block_loss);
    atomicAdd(&totals->correct, block_correct);
    if (block_bad != 0) atomicAdd(&totals->bad_labels, block_bad);
  }
}

}  // namespace

Status SoftmaxCrossEntropy(State& s, int64_t rows, int64_t classes, const float* logits,
                           const int32_t* labels, float* dlogits, float* loss_host,
                           int64_t* correct_host) {
  if (rows == 0) {
    if (loss_host != nullptr) *loss_host = 0.f;
    if (correct_host != nullptr) *correct_host = 0;
    return Status::Ok();
  }
  LEASH_RETURN_IF_ERROR(Activate(s));
  LEASH_RETURN_IF_ERROR(
      FromCuda(cudaMemsetAsync(s.totals_device, 0, sizeof(SoftmaxTotals), s.stream),
               "clearing the softmax reduction scratch"));
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  const auto grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
  SoftmaxXentKernel<<<grid, kBlock, 0, s.stream>>>(rows, classes, logits, labels, dlogits,
                                                   1.f / static_cast<float>(rows), s.totals_device);
  LEASH_RETURN_IF_ERROR(LaunchStatus("SoftmaxXentKernel"));
  LEASH_RETURN_IF_ERROR(
      FromCuda(cudaMemcpyAsync(s.totals_host, s.totals_device, sizeof(SoftmaxTotals),
                               cudaMemcpyDeviceToHost, s.stream),
               "copying the softmax loss back"));
  LEASH_RETURN_IF_ERROR(
      FromCuda(cudaStreamSynchronize(s.stream), "waiting for softmax cross-entropy"));
  const SoftmaxTotals& t = *s.totals_host;
  if (t.bad_labels != 0) {
    return InvalidArgument("SoftmaxCrossEntropy: " + std::to_string(t.bad_labels) + " of " +
                           std::to_string(rows) + " labels are outside [0, " +
                           std::to_string(classes) + ")");
  }
  if (loss_host != nullptr) *loss_host = static_cast<float>(t.loss_sum / static_cast<double>(rows));
  if (correct_host != nullptr) *correct_host = static_cast<int64_t>(t.correct);
  return Status::Ok();
}

}  // namespace leash::kernels::cuda
