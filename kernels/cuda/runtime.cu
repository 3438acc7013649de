// The CUDA backend's runtime side: device discovery, per-context State (stream, cuBLAS and
// cuDNN handles, reduction scratch), device memory and host <-> device copies.
// Functions taking a State are used by one thread at a time; DeviceCount and Free are
// thread-safe.
#include <cstdio>
#include <new>
#include <string>
#include <utility>

#include "cuda_state.h"

namespace leash::kernels::cuda {
namespace {

std::string On(int device) { return " on cuda:" + std::to_string(device); }

}  // namespace

State::~State() {
  // Errors here have nobody to go to; the process is at worst leaking a handle.
  cudaSetDevice(device);
  if (stream != nullptr) cudaStreamSynchronize(stream);
  if (totals_host != nullptr) cudaFreeHost(totals_host);
  if (totals_device != nullptr) cudaFree(totals_device);
  if (cudnn != nullptr) cudnnDestroy(cudnn);
  if (cublas != nullptr) cublasDestroy(cublas);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

void StateDeleter::operator()(State* state) const { delete state; }

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for the caller, clear it
    return 0;
  }
  return count;
}

Result<StatePtr> CreateState(int device) {
  StatePtr s(new (std::nothrow) State);
  if (s == nullptr) return ResourceExhausted("out of host memory creating a CUDA context");
  s->device = device;
  LEASH_RETURN_IF_ERROR(Activate(*s));
  LEASH_RETURN_IF_ERROR(FromCuda(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking),
                                 "creating a stream" + On(device)));
  LEASH_RETURN_IF_ERROR(
      FromCublas(cublasCreate(&s->cublas), "creating a cuBLAS handle" + On(device)));
  LEASH_RETURN_IF_ERROR(
      FromCublas(cublasSetStream(s->cublas, s->stream), "binding cuBLAS to its stream"));
  // Full fp32 products: no TF32, so results match the CPU kernels to fp32 rounding.
  LEASH_RETURN_IF_ERROR(
      FromCublas(cublasSetMathMode(s->cublas, CUBLAS_DEFAULT_MATH), "setting cuBLAS math mode"));
  LEASH_RETURN_IF_ERROR(FromCudnn(cudnnCreate(&s->cudnn), "creating a cuDNN handle" + On(device)));
  LEASH_RETURN_IF_ERROR(
      FromCudnn(cudnnSetStream(s->cudnn, s->stream), "binding cuDNN to its stream"));
  LEASH_RETURN_IF_ERROR(
      FromCuda(cudaMalloc(reinterpret_cast<void**>(&s->totals_device), sizeof(SoftmaxTotals)),
               "allocating reduction scratch" + On(device)));
  LEASH_RETURN_IF_ERROR(
      FromCuda(cudaMallocHost(reinterpret_cast<void**>(&s->totals_host), sizeof(SoftmaxTotals)),
               "allocating pinned host scratch for cuda:" + std::to_string(device)));
  return Result<StatePtr>(std::move(s));
}

Status Synchronize(State& s) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  return FromCuda(cudaStreamSynchronize(s.stream), "waiting for the work queued" + On(s.device));
}

Result<void*> Allocate(State& s, size_t bytes) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  void* p = nullptr;
  LEASH_RETURN_IF_ERROR(FromCuda(cudaMalloc(&p, bytes),
                                 "allocating " + std::to_string(bytes) + " bytes" + On(s.device)));
  // Wait for the zero fill: the memory may next be used on another context's stream.
  // Allocation is rare (buffers are made once), so the wait costs nothing that matters.
  const std::string what = "zero-filling new device memory" + On(s.device);
  Status zero = FromCuda(cudaMemsetAsync(p, 0, bytes, s.stream), what);
  Status done = zero.ok() ? FromCuda(cudaStreamSynchronize(s.stream), what) : zero;
  if (!done.ok()) {
    cudaFree(p);
    return done;
  }
  return p;
}

void Free(int device, void* ptr) noexcept {
  if (ptr == nullptr) return;
  int previous = -1;
  bool restore = cudaGetDevice(&previous) == cudaSuccess && previous != device;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaFree(ptr);
  if (e != cudaSuccess) {
    std::fprintf(stderr, "leash: freeing device memory on cuda:%d failed: %s\n", device,
                 cudaGetErrorString(e));
  }
  if (restore) cudaSetDevice(previous);
}

Status CopyToDevice(State& s, void* dst, const void* src_host, size_t bytes) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  // From pageable memory this returns once the source has been staged, so the caller may
  // reuse `src_host` immediately.
  return FromCuda(
      cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, s.stream),
      "copying " + std::to_string(bytes) + " bytes to cuda:" + std::to_string(s.device));
}

Status CopyToHost(State& s, void* dst_host, const void* src, size_t bytes) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  LEASH_RETURN_IF_ERROR(FromCuda(
      cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, s.stream),
      "copying " + std::to_string(bytes) + " bytes from cuda:" + std::to_string(s.device)));
  return FromCuda(cudaStreamSynchronize(s.stream),
                  "waiting for a copy from cuda:" + std::to_string(s.device));
}

Result<void*> AllocatePinned(State& s, size_t bytes) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  void* p = nullptr;
  LEASH_RETURN_IF_ERROR(
      FromCuda(cudaMallocHost(&p, bytes),
               "allocating " + std::to_string(bytes) +
                   " bytes of pinned host memory for cuda:" + std::to_string(s.device)));
  return p;
}

void FreePinned(void* ptr) noexcept {
  if (ptr == nullptr) return;
  cudaError_t e = cudaFreeHost(ptr);
  if (e != cudaSuccess)
    std::fprintf(stderr, "leash: freeing pinned host memory failed: %s\n", cudaGetErrorString(e));
}

struct CopyQueue {
  CopyQueue() = default;
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;
  ~CopyQueue() {
    // Errors here have nobody to go to; the process is at worst leaking a handle.
    cudaSetDevice(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (copied != nullptr) cudaEventDestroy(copied);
    if (consumed != nullptr) cudaEventDestroy(consumed);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t copied = nullptr;
  cudaEvent_t consumed = nullptr;
};

void CopyQueueDeleter::operator()(CopyQueue* queue) const { delete queue; }

Result<CopyQueuePtr> CreateCopyQueue(State& s) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  CopyQueuePtr q(new (std::nothrow) CopyQueue);
  if (q == nullptr) return ResourceExhausted("out of host memory creating a copy stream");
  q->device = s.device;
  LEASH_RETURN_IF_ERROR(FromCuda(cudaStreamCreateWithFlags(&q->stream, cudaStreamNonBlocking),
                                 "creating a copy stream" + On(s.device)));
  // Timing off: these events only order the two streams, and are cheaper without it.
  LEASH_RETURN_IF_ERROR(FromCuda(cudaEventCreateWithFlags(&q->copied, cudaEventDisableTiming),
                                 "creating an event" + On(s.device)));
  LEASH_RETURN_IF_ERROR(FromCuda(cudaEventCreateWithFlags(&q->consumed, cudaEventDisableTiming),
                                 "creating an event" + On(s.device)));
  return Result<CopyQueuePtr>(std::move(q));
}

Status QueueCopy(State& s, CopyQueue& q, void* dst, const void* src_host, size_t bytes) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  return FromCuda(
      cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, q.stream),
      "queueing a copy of " + std::to_string(bytes) + " bytes to cuda:" + std::to_string(s.device));
}

Status ComputeWaitsForCopies(State& s, CopyQueue& q) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  LEASH_RETURN_IF_ERROR(
      FromCuda(cudaEventRecord(q.copied, q.stream), "recording the copies" + On(s.device)));
  return FromCuda(cudaStreamWaitEvent(s.stream, q.copied, 0),
                  "ordering compute after the copies" + On(s.device));
}

Status CopiesWaitForCompute(State& s, CopyQueue& q) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  LEASH_RETURN_IF_ERROR(
      FromCuda(cudaEventRecord(q.consumed, s.stream), "recording the compute" + On(s.device)));
  return FromCuda(cudaStreamWaitEvent(q.stream, q.consumed, 0),
                  "ordering copies after the compute" + On(s.device));
}

Status SynchronizeCopies(State& s, CopyQueue& q) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  return FromCuda(cudaStreamSynchronize(q.stream),
                  "waiting for the copies to cuda:" + std::to_string(s.device));
}

}  // namespace leash::kernels::cuda
