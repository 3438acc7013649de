// The definition of the CUDA backend's per-context State, shared by the .cu files of
// kernels/cuda and nothing else. One thread at a time.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "cuda_kernels.h"
#include "cuda_status.h"

namespace leash::kernels::cuda {

// What SoftmaxCrossEntropy reduces on the device and copies back in one transfer.
struct SoftmaxTotals {
  double loss_sum;
  unsigned long long correct;
  unsigned long long bad_labels;
};

// cuDNN's convolution algorithms for one shape and the workspace bytes each needs, chosen
// once (conv.cu) and reused for every later call with that shape.
struct ConvAlgos {
  cudnnConvolutionFwdAlgo_t forward;
  cudnnConvolutionBwdDataAlgo_t backward_data;
  cudnnConvolutionBwdFilterAlgo_t backward_filter;
  size_t forward_bytes;
  size_t backward_data_bytes;
  size_t backward_filter_bytes;
};
// The key of a shape in State::conv_algos: n, c_in, h, w, c_out, k, pad.
using ConvKey = std::array<int64_t, 7>;

// Device memory that grows to the largest request and is then reused (cuDNN's workspace);
// frees itself.
struct Workspace {
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() { Free(device, ptr); }

  int device = 0;
  void* ptr = nullptr;
  size_t bytes = 0;
};

// Owns its handles and memory: the destructor releases whatever creation got to.
struct State {
  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State();

  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudnnHandle_t cudnn = nullptr;
  SoftmaxTotals* totals_device = nullptr;
  SoftmaxTotals* totals_host = nullptr;  // pinned, so the copy back is a true async DMA
  // Like every member, destroyed after ~State's body has waited for the stream, so no
  // queued work still uses the workspace when it is freed.
  Workspace workspace;
  std::map<ConvKey, ConvAlgos> conv_algos;
};

// Makes the state's GPU current on the calling thread (contexts may move between threads).
inline Status Activate(State& s) {
  return FromCuda(cudaSetDevice(s.device), "selecting cuda:" + std::to_string(s.device));
}

// Grid size for a grid-stride loop over n elements with blocks of `block` threads.
inline unsigned GridFor(int64_t n, int block) {
  int64_t blocks = (n + block - 1) / block;
  const int64_t kMaxBlocks = 65536;  // enough to fill any GPU; the loop covers the rest
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

}  // namespace leash::kernels::cuda
