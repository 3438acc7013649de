// The CUDA backend as the dispatching entry points (src/kernels.cc) see it: plain C++17,
// no CUDA headers, so the dispatcher compiles with the host compiler alone. A State is
// one device's stream, cuBLAS and cuDNN handles and scratch; one thread at a time.
// Arguments have been validated by the caller. Every function returns the CUDA, cuBLAS or
// cuDNN error as a Status (see cuda_status.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "leash/common/status.h"
#include "leash/kernels/types.h"

namespace leash::kernels::cuda {

struct State;
struct StateDeleter {
  void operator()(State* state) const;
};
using StatePtr = std::unique_ptr<State, StateDeleter>;

// Number of usable GPUs; 0 when there is no driver or no device.
int DeviceCount();
// Creates the stream and handles on GPU `device`.
Result<StatePtr> CreateState(int device);
Status Synchronize(State& s);

// Zero-filled device memory of `bytes` bytes; returns once the fill is done.
Result<void*> Allocate(State& s, size_t bytes);
// Frees memory from Allocate on GPU `device`; errors are reported on stderr (called from
// destructors, which have nobody to return them to).
void Free(int device, void* ptr) noexcept;
Status CopyToDevice(State& s, void* dst, const void* src_host, size_t bytes);
// Returns once the bytes are in host memory.
Status CopyToHost(State& s, void* dst_host, const void* src, size_t bytes);

// Page-locked host memory (cudaMallocHost) for async copies to GPU `s.device`.
Result<void*> AllocatePinned(State& s, size_t bytes);
// Frees memory from AllocatePinned; errors go to stderr (called from destructors).
void FreePinned(void* ptr) noexcept;

// A second stream for host -> device copies beside a State's compute stream, and the two
// events that order them: `copied` (compute waits for the copies) and `consumed` (copies
// wait for the compute). One thread at a time, with its State, which must outlive it.
struct CopyQueue;
struct CopyQueueDeleter {
  void operator()(CopyQueue* queue) const;
};
using CopyQueuePtr = std::unique_ptr<CopyQueue, CopyQueueDeleter>;
Result<CopyQueuePtr> CreateCopyQueue(State& s);
// cudaMemcpyAsync on the copy stream; returns at once for a pinned source.
Status QueueCopy(State& s, CopyQueue& q, void* dst, const void* src_host, size_t bytes);
// The compute stream waits (on the device) for the copies queued so far.
Status ComputeWaitsForCopies(State& s, CopyQueue& q);
// Later copies wait (on the device) for the work queued on the compute stream so far.
Status CopiesWaitForCompute(State& s, CopyQueue& q);
// Blocks until the copies queued so far are done.
Status SynchronizeCopies(State& s, CopyQueue& q);

Status Gemm(State& s, Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c);
Status BiasAdd(State& s, int64_t rows, int64_t cols, const float* bias, float* y);
Status BiasGrad(State& s, int64_t rows, int64_t cols, const float* dy, float* db);
Status Relu(State& s, int64_t n, const float* x, float* y);
Status ReluBackward(State& s, int64_t n, const float* y, const float* dy, float* dx);
// Convolutions on cuDNN (full fp32), with the algorithms chosen once per shape and the
// workspace kept in the State; n >= 1 except for Conv2dBackwardWeight, where n == 0
// writes zeros.
Status Conv2dForward(State& s, const Conv2dShape& shape, const float* x, const float* weight,
                     float* y);
Status Conv2dBackwardData(State& s, const Conv2dShape& shape, const float* dy, const float* weight,
                          float* dx);
Status Conv2dBackwardWeight(State& s, const Conv2dShape& shape, const float* x, const float* dy,
                            float* dweight);
Status BiasAddChannels(State& s, int64_t n, int64_t c, int64_t hw, const float* bias, float* y);
Status BiasGradChannels(State& s, int64_t n, int64_t c, int64_t hw, const float* dy, float* db);
// 2 x 2 max pooling with stride 2 on cuDNN; n, c >= 1.
Status MaxPool2dForward(State& s, int64_t n, int64_t c, int64_t h, int64_t w, const float* x,
                        float* y);
Status MaxPool2dBackward(State& s, int64_t n, int64_t c, int64_t h, int64_t w, const float* x,
                         const float* y, const float* dy, float* dx);
// Loss and correct count are reduced on the device and copied back; InvalidArgument when
// the device found labels outside [0, classes).
Status SoftmaxCrossEntropy(State& s, int64_t rows, int64_t classes, const float* logits,
                           const int32_t* labels, float* dlogits, float* loss_host,
                           int64_t* correct_host);
Status SgdUpdate(State& s, int64_t n, const SgdParams& p, const float* g, float* w);
Status MomentumUpdate(State& s, int64_t n, const MomentumParams& p, const float* g, float* w,
                      float* v);
Status AdamUpdate(State& s, int64_t n, const AdamParams& p, int64_t step, const float* g, float* w,
                  float* m, float* v);
Status AdagradUpdate(State& s, int64_t n, const AdagradParams& p, const float* g, float* w,
                     float* acc);
Status ConvertToHalf(State& s, int64_t n, const float* x, uint16_t* y, bool bf16);
Status ConvertFromHalf(State& s, int64_t n, const uint16_t* x, float* y, bool bf16);

}  // namespace leash::kernels::cuda
