// The math that workers and server-side optimizers run: one entry point per operation,
// dispatching on the context's device with a plain switch. The CPU implementation
// (kernels/cpu, BLAS for matrix products) is always built; the CUDA one (kernels/cuda,
// cuBLAS/cuDNN) when the toolkit is found. Every pointer argument lives on the
// context's device unless its name ends in _host. Entry points validate their
// arguments and return InvalidArgument rather than touching bad memory.
// A Context is used by one thread at a time; the free functions are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "leash/common/status.h"
#include "leash/kernels/types.h"

namespace leash::kernels {

enum class DeviceType { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
  bool operator==(const Device&) const = default;
};

// "cpu", "cuda", "cuda:N" or "auto" (the first GPU when one is present, else the CPU).
// InvalidArgument for anything else; Unavailable for a GPU that does not exist or a
// build without CUDA.
Result<Device> ParseDevice(std::string_view spec);
std::string DeviceName(Device device);
// True when this build contains the CUDA kernels.
bool CudaBuilt();
// Number of usable GPUs (0 without CUDA, a driver or a device).
int CudaDeviceCount();

namespace internal {
class HostScratch;
}  // namespace internal

// Per-device execution state: for CUDA a stream and cuBLAS/cuDNN handles; for the CPU
// the BLAS thread count. Errors of CUDA, cuBLAS and cuDNN become Status values carrying
// the library's own message. Both keep the scratch memory of the kernels that need one
// (convolutions), grown to the largest request and reused until the context is destroyed.
class Context {
 public:
  // InvalidArgument for cpu_threads < 1 or a CPU index other than 0; Unavailable for a GPU
  // that does not exist or a build without CUDA. A CPU context sets OpenBLAS's thread
  // count to `cpu_threads`; that setting is process-wide, so the last CPU context created
  // wins. `cpu_threads` is ignored for CUDA.
  static Result<std::unique_ptr<Context>> Create(Device device, int cpu_threads = 1);
  virtual ~Context() = default;
  Device device() const { return device_; }
  // Waits for all work queued on this context.
  virtual Status Synchronize() = 0;

 protected:
  explicit Context(Device device) : device_(device) {}

 private:
  friend class internal::HostScratch;
  Device device_;
  // The CPU kernels' scratch (a convolution's patch matrix), see kernels.cc.
  std::unique_ptr<float[]> host_scratch_;
  size_t host_scratch_size_ = 0;
};

// Copies `count` int32 values host -> device memory at `dst` (for labels).
Status CopyInt32FromHost(Context& ctx, const int32_t* src_host, size_t count, int32_t* dst);

namespace internal {
// The deleters of the owning pointers below: each frees memory on the device it came from
// (defined in context.cc; errors of a CUDA free go to stderr, as nobody is left to return
// them to).
struct FreeDeviceMemory {
  Device device;
  void operator()(void* p) const noexcept;
};
struct FreePinnedMemory {
  Device device;
  void operator()(void* p) const noexcept;
};
}  // namespace internal

// An owned array of T on a context's device, zero-filled: float (Buffer), int32_t (labels)
// and uint16_t (fp16 / bf16 bit patterns), the only types instantiated. Move-only; a
// moved-from array is empty. Destroying it frees the memory (for CUDA after the device
// finished the work queued on it).
// Allocate: ResourceExhausted when the memory is not there.
// CopyFromHost/CopyToHost: InvalidArgument when offset + count exceeds size(), a pointer
// is null, or `ctx` is on another device than the array. CopyToHost waits for the copy.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  static Result<DeviceArray> Allocate(Context& ctx, size_t count);

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return data_ != nullptr ? size_ : 0; }
  Device device() const { return data_.get_deleter().device; }

  // Copies `count` elements between host memory and this array at `offset`.
  Status CopyFromHost(Context& ctx, const T* src_host, size_t count, size_t offset = 0);
  Status CopyToHost(Context& ctx, T* dst_host, size_t count, size_t offset = 0) const;

 private:
  std::unique_ptr<T, internal::FreeDeviceMemory> data_;
  size_t size_ = 0;  // counts only while data_ holds memory (not once moved from)
};
extern template class DeviceArray<float>;
extern template class DeviceArray<int32_t>;
extern template class DeviceArray<uint16_t>;
using Buffer = DeviceArray<float>;
using Int32Buffer = DeviceArray<int32_t>;
using HalfBuffer = DeviceArray<uint16_t>;

// Host memory that a context's device can copy from asynchronously: page-locked
// (cudaMallocHost) for a CUDA context, plain memory for the CPU. Uninitialized. Move-only;
// a moved-from buffer is empty. Allocate: ResourceExhausted when the memory is not there.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  static Result<PinnedHostBuffer> Allocate(Context& ctx, size_t bytes);

  void* data() { return data_.get(); }
  size_t bytes() const { return data_ != nullptr ? bytes_ : 0; }

 private:
  std::unique_ptr<void, internal::FreePinnedMemory> data_;
  size_t bytes_ = 0;  // counts only while data_ holds memory (not once moved from)
};

// Host -> device copies queued beside a context's computation, so the next batch travels
// while the current step computes: on CUDA its own stream, ordered against the context's
// stream by events (device-side waits, the host does not block); on the CPU every call is
// immediate (CopyToDevice is a memcpy, the waits do nothing). Used by one thread at a time,
// together with its context, which must outlive it.
class CopyStream {
 public:
  // Unavailable for a CUDA context in a build without CUDA.
  static Result<std::unique_ptr<CopyStream>> Create(Context& ctx);
  virtual ~CopyStream() = default;

  // Queues a copy of `bytes` bytes from host memory to device memory of the context and
  // returns at once (for a truly asynchronous copy on CUDA, `src_host` must be a
  // PinnedHostBuffer, which must stay unchanged until Synchronize). InvalidArgument for a
  // null pointer with bytes > 0.
  virtual Status CopyToDevice(void* dst_device, const void* src_host, size_t bytes) = 0;
  // Work queued on the context from now on waits for the copies queued so far.
  virtual Status ContextWaitsForCopies() = 0;
  // Copies queued from now on wait for the work queued on the context so far (so a copy
  // never overwrites device memory that a queued step still reads).
  virtual Status CopiesWaitForContext() = 0;
  // Blocks until the copies queued so far are done (their host sources may be reused).
  virtual Status Synchronize() = 0;

 protected:
  CopyStream() = default;
};

// Sizes are element counts and must be >= 0 (and m, n, k, rows, cols <= INT32_MAX, the
// BLAS limit); a pointer may be null only when nothing would be read or written through
// it. Every entry point returns InvalidArgument otherwise.

// C[m x n] = alpha * op(A) * op(B) + beta * C, all row-major; op(A) is m x k, op(B) is k x n
// (Transpose is in types.h). With beta == 0, C is not read (it may hold NaN). k == 0 gives
// C = beta * C. On CUDA the product is computed in full fp32 (no TF32).
Status Gemm(Context& ctx, Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c);
// y[r, c] += bias[c] for a rows x cols matrix y.
Status BiasAdd(Context& ctx, int64_t rows, int64_t cols, const float* bias, float* y);
// db[c] = sum over r of dy[r, c].
Status BiasGrad(Context& ctx, int64_t rows, int64_t cols, const float* dy, float* db);
// y = max(x, 0); x and y may alias.
Status Relu(Context& ctx, int64_t n, const float* x, float* y);
// dx = dy where y > 0, else 0; dy and dx may alias.
Status ReluBackward(Context& ctx, int64_t n, const float* y, const float* dy, float* dx);

// ---- Convolutional layers on NCHW tensors: n examples x channels x rows x columns.

// 2-D convolution with stride 1 and `pad` zero rows and columns on every side (a
// cross-correlation, as in every deep-learning framework): x is n x c_in x h x w, weight
// c_out x c_in x k x k, y is n x c_out x h_out x w_out with h_out = h + 2 pad - k + 1 and
// w_out = w + 2 pad - k + 1, and
//   y[i, o, r, s] = sum over c, a, b of weight[o, c, a, b] * x[i, c, r + a - pad, s + b - pad]
// where x is zero outside the image. No bias (see BiasAddChannels). Requires c_in, h, w,
// c_out, k >= 1, pad >= 0, h_out, w_out >= 1, and x, y, weight and one image's patch matrix
// (c_in k k x h_out w_out) each within 2^31 - 1 elements (the 32-bit sizes of BLAS and
// cuDNN); n >= 0, and n == 0 does nothing. Outputs are overwritten and must not overlap
// the inputs. The CPU multiplies each image's patch matrix (im2col, in the context's
// scratch) with BLAS; CUDA runs cuDNN in full fp32 (no TF32) with workspace the context
// keeps and algorithms it picks once per shape, so the first call for a larger shape may
// allocate (ResourceExhausted if it cannot).
Status Conv2dForward(Context& ctx, int64_t n, int64_t c_in, int64_t h, int64_t w, int64_t c_out,
                     int64_t k, int64_t pad, const float* x, const float* weight, float* y);
// dx = dL/dx given dy = dL/dy, for Conv2dForward with the same sizes and weight.
Status Conv2dBackwardData(Context& ctx, int64_t n, int64_t c_in, int64_t h, int64_t w,
                          int64_t c_out, int64_t k, int64_t pad, const float* dy,
                          const float* weight, float* dx);
// dweight = dL/dweight given x and dy = dL/dy, summed over the n examples (n == 0 gives
// zeros).
Status Conv2dBackwardWeight(Context& ctx, int64_t n, int64_t c_in, int64_t h, int64_t w,
                            int64_t c_out, int64_t k, int64_t pad, const float* x, const float* dy,
                            float* dweight);
// y[i, ch, p] += bias[ch] for y of n x c x hw (hw: the pixels of one channel).
Status BiasAddChannels(Context& ctx, int64_t n, int64_t c, int64_t hw, const float* bias, float* y);
// db[ch] = sum over i and p of dy[i, ch, p]; zeros when n or hw is 0.
Status BiasGradChannels(Context& ctx, int64_t n, int64_t c, int64_t hw, const float* dy, float* db);
// Max pooling over 2 x 2 windows with stride 2: x is n x c x h x w, y is
// n x c x (h / 2) x (w / 2) rounded down, so an odd last row or column is left out.
// Requires h, w >= 2 and x within 2^31 - 1 elements; n, c >= 0. y must not overlap x.
Status MaxPool2dForward(Context& ctx, int64_t n, int64_t c, int64_t h, int64_t w, const float* x,
                        float* y);
// dx = dy routed to each window's maximum in x (the first in row-major order when several
// are equal), zero everywhere else, including a left-out row or column. y must be
// MaxPool2dForward's output for x (cuDNN reads it; the CPU finds the maximum again in x).
Status MaxPool2dBackward(Context& ctx, int64_t n, int64_t c, int64_t h, int64_t w, const float* x,
                         const float* y, const float* dy, float* dx);

// Mean softmax cross-entropy of `rows` examples over `classes` logits. Labels must be in
// [0, classes). Writes dlogits = (softmax - onehot) / rows unless dlogits is null, the mean
// loss to *loss_host and the number of rows whose argmax equals the label to *correct_host.
// Either host output may be null to skip it; rows == 0 gives loss 0. The argmax is the
// first index of the largest logit. On the CPU labels are checked before any output is
// written; on CUDA they are checked on the device, and a bad label there is reported as
// InvalidArgument after the call (its dlogits row is zero, the other outputs undefined).
Status SoftmaxCrossEntropy(Context& ctx, int64_t rows, int64_t classes, const float* logits,
                           const int32_t* labels, float* dlogits, float* loss_host,
                           int64_t* correct_host);

// Optimizer updates of n parameters w with gradient g (SgdParams etc. in types.h). Weight
// decay adds wd * w to g. Hyper-parameters must be finite (Adam betas in [0, 1), epsilons
// >= 0, step >= 1); InvalidArgument otherwise. The arrays must not overlap.
// w -= lr * g
Status SgdUpdate(Context& ctx, int64_t n, const SgdParams& p, const float* g, float* w);
// v = momentum * v + g; w -= lr * v
Status MomentumUpdate(Context& ctx, int64_t n, const MomentumParams& p, const float* g, float* w,
                      float* v);
// Adam with bias correction; `step` is the 1-based number of this update.
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
Status AdamUpdate(Context& ctx, int64_t n, const AdamParams& p, int64_t step, const float* g,
                  float* w, float* m, float* v);
// acc += g^2; w -= lr * g / (sqrt(acc) + eps)
Status AdagradUpdate(Context& ctx, int64_t n, const AdagradParams& p, const float* g, float* w,
                     float* acc);

// y[i] = x[i] as IEEE fp16 (bf16 = false) or bfloat16 (bf16 = true) bit patterns, rounded
// to nearest even; overflow becomes infinity, NaN stays NaN (quiet). Same bits on CPU and
// CUDA, as leash/common/half.h.
Status ConvertToHalf(Context& ctx, int64_t n, const float* x, uint16_t* y, bool bf16);
// y[i] = the exact float value of the fp16 / bf16 bit pattern x[i].
Status ConvertFromHalf(Context& ctx, int64_t n, const uint16_t* x, float* y, bool bf16);

}  // namespace leash::kernels
