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

// Per-device execution state: for CUDA a stream and cuBLAS/cuDNN handles; for the CPU
// the BLAS thread count. Errors of CUDA, cuBLAS and cuDNN become Status values carrying
// the library's own message.
class Context {
 public:
  static Result<std::unique_ptr<Context>> Create(Device device, int cpu_threads = 1);
  virtual ~Context() = default;
  Device device() const { return device_; }
  // Waits for all work queued on this context.
  virtual Status Synchronize() = 0;

 protected:
  explicit Context(Device device) : device_(device) {}

 private:
  Device device_;
};

// An owned float array on a context's device, zero-filled. Move-only.
class Buffer {
 public:
  Buffer() = default;
  static Result<Buffer> Allocate(Context& ctx, size_t count);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  Device device() const { return device_; }

  // Copies `count` floats between host memory and this buffer at `offset`.
  Status CopyFromHost(Context& ctx, const float* src_host, size_t count, size_t offset = 0);
  Status CopyToHost(Context& ctx, float* dst_host, size_t count, size_t offset = 0) const;

 private:
  void Release();
  float* data_ = nullptr;
  size_t size_ = 0;
  Device device_;
};

// Copies `count` int32 values host -> device memory at `dst` (for labels).
Status CopyInt32FromHost(Context& ctx, const int32_t* src_host, size_t count, int32_t* dst);

enum class Transpose { kNo, kYes };

// C[m x n] = alpha * op(A) * op(B) + beta * C, all row-major; op(A) is m x k, op(B) is k x n.
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
// Mean softmax cross-entropy of `rows` examples over `classes` logits. Labels must be in
// [0, classes). Writes dlogits = (softmax - onehot) / rows unless dlogits is null, the mean
// loss to *loss_host and the number of rows whose argmax equals the label to *correct_host.
Status SoftmaxCrossEntropy(Context& ctx, int64_t rows, int64_t classes, const float* logits, const int32_t* labels,
                           float* dlogits, float* loss_host, int64_t* correct_host);

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
struct AdagradParams {
  float lr = 0.01f;
  float epsilon = 1e-10f;
  float weight_decay = 0.f;
};
// w -= lr * g
Status SgdUpdate(Context& ctx, int64_t n, const SgdParams& p, const float* g, float* w);
// v = momentum * v + g; w -= lr * v
Status MomentumUpdate(Context& ctx, int64_t n, const MomentumParams& p, const float* g, float* w, float* v);
// Adam with bias correction; `step` is the 1-based number of this update.
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
Status AdamUpdate(Context& ctx, int64_t n, const AdamParams& p, int64_t step, const float* g, float* w, float* m,
                  float* v);
// acc += g^2; w -= lr * g / (sqrt(acc) + eps)
Status AdagradUpdate(Context& ctx, int64_t n, const AdagradParams& p, const float* g, float* w, float* acc);

}  // namespace leash::kernels
