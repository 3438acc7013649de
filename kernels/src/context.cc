// Devices, contexts and owned memory: ParseDevice, Context::Create (CPU, or CUDA through
// the kernels/cuda backend), DeviceArray (Buffer) and PinnedHostBuffer. A Context is used by one
// thread at a time; the free functions are thread-safe.
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "internal.h"
#include "leash/kernels/cpu.h"
#include "leash/kernels/kernels.h"

namespace leash::kernels {
namespace {

// The CPU has nothing to wait for: every kernel returns when its work is done.
class CpuContext final : public Context {
 public:
  CpuContext() : Context(Device{DeviceType::kCpu, 0}) {}
  Status Synchronize() override { return Status::Ok(); }
};

#if LEASH_WITH_CUDA
class CudaContext final : public Context {
 public:
  CudaContext(Device device, cuda::StatePtr state) : Context(device), state_(std::move(state)) {}
  Status Synchronize() override { return cuda::Synchronize(*state_); }
  cuda::State& state() { return *state_; }

 private:
  cuda::StatePtr state_;
};
#endif

std::string Bytes(size_t n) { return std::to_string(n) + " bytes"; }

// Raw memory behind a DeviceArray: zero-filled, on the context's device.
Result<void*> AllocateBytes(Context& ctx, size_t count, size_t element_size) {
  if (count > std::numeric_limits<size_t>::max() / element_size) {
    return InvalidArgument("cannot allocate " + std::to_string(count) +
                           " elements: the size overflows");
  }
  const size_t bytes = count * element_size;
  if (bytes == 0) return static_cast<void*>(nullptr);
  switch (ctx.device().type) {
    case DeviceType::kCpu: {
      void* p = std::calloc(count, element_size);
      if (p == nullptr) return ResourceExhausted("out of host memory allocating " + Bytes(bytes));
      return p;
    }
    case DeviceType::kCuda:
      return internal::OnCuda<Result<void*>>(ctx,
                                             [&](auto& s) { return cuda::Allocate(s, bytes); });
  }
  return InvalidArgument("unknown device type");
}

// Validates a copy of `count` elements between host memory and an array of `size`
// elements on `device`, starting at element `offset`.
Status CheckCopy(Context& ctx, const char* op, Device device, size_t size, const void* host,
                 size_t count, size_t offset) {
  if (!(ctx.device() == device)) {
    return InvalidArgument(std::string(op) + ": the array lives on " + DeviceName(device) +
                           " but the context is " + DeviceName(ctx.device()));
  }
  if (offset > size || count > size - offset) {
    return InvalidArgument(std::string(op) + ": elements [" + std::to_string(offset) + ", " +
                           std::to_string(offset) + " + " + std::to_string(count) +
                           ") are outside an array of " + std::to_string(size));
  }
  if (host == nullptr) return InvalidArgument(std::string(op) + ": the host pointer is null");
  return Status::Ok();
}

Status CopyIn(Context& ctx, Device device, void* base, size_t size, const void* src_host,
              size_t count, size_t offset, size_t element_size) {
  if (count == 0) return Status::Ok();
  LEASH_RETURN_IF_ERROR(CheckCopy(ctx, "CopyFromHost", device, size, src_host, count, offset));
  void* dst = static_cast<char*>(base) + offset * element_size;
  const size_t bytes = count * element_size;
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      std::memcpy(dst, src_host, bytes);
      return Status::Ok();
    case DeviceType::kCuda:
      return internal::OnCuda(ctx,
                              [&](auto& s) { return cuda::CopyToDevice(s, dst, src_host, bytes); });
  }
  return InvalidArgument("unknown device type");
}

Status CopyOut(Context& ctx, Device device, const void* base, size_t size, void* dst_host,
               size_t count, size_t offset, size_t element_size) {
  if (count == 0) return Status::Ok();
  LEASH_RETURN_IF_ERROR(CheckCopy(ctx, "CopyToHost", device, size, dst_host, count, offset));
  const void* src = static_cast<const char*>(base) + offset * element_size;
  const size_t bytes = count * element_size;
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      std::memcpy(dst_host, src, bytes);
      return Status::Ok();
    case DeviceType::kCuda:
      return internal::OnCuda(ctx,
                              [&](auto& s) { return cuda::CopyToHost(s, dst_host, src, bytes); });
  }
  return InvalidArgument("unknown device type");
}

}  // namespace

namespace internal {

Status NoCuda() {
  return Unavailable("this build has no CUDA support; rebuild with -DLEASH_WITH_CUDA=ON");
}

void FreeDeviceMemory::operator()(void* p) const noexcept {
  if (p == nullptr) return;
  switch (device.type) {
    case DeviceType::kCpu:
      std::free(p);
      return;
    case DeviceType::kCuda:
#if LEASH_WITH_CUDA
      cuda::Free(device.index, p);
#endif
      return;
  }
}

void FreePinnedMemory::operator()(void* p) const noexcept {
  if (p == nullptr) return;
  switch (device.type) {
    case DeviceType::kCpu:
      std::free(p);
      return;
    case DeviceType::kCuda:
#if LEASH_WITH_CUDA
      cuda::FreePinned(p);
#endif
      return;
  }
}

cuda::State* CudaStateOf(Context& ctx) {
#if LEASH_WITH_CUDA
  auto* cuda_ctx = dynamic_cast<CudaContext*>(&ctx);
  return cuda_ctx != nullptr ? &cuda_ctx->state() : nullptr;
#else
  (void)ctx;
  return nullptr;
#endif
}

}  // namespace internal

bool CudaBuilt() { return LEASH_WITH_CUDA != 0; }

int CudaDeviceCount() {
#if LEASH_WITH_CUDA
  return cuda::DeviceCount();
#else
  return 0;
#endif
}

std::string DeviceName(Device device) {
  switch (device.type) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kCuda:
      return "cuda:" + std::to_string(device.index);
  }
  return "unknown-device";
}

Result<Device> ParseDevice(std::string_view spec) {
  if (spec == "cpu") return Device{DeviceType::kCpu, 0};
  if (spec == "auto")
    return CudaDeviceCount() > 0 ? Device{DeviceType::kCuda, 0} : Device{DeviceType::kCpu, 0};
  const std::string_view prefix = "cuda:";
  if (spec == "cuda" || spec.substr(0, prefix.size()) == prefix) {
    int index = 0;
    if (spec != "cuda") {
      const std::string_view digits = spec.substr(prefix.size());
      const char* end = digits.data() + digits.size();
      auto [ptr, ec] = std::from_chars(digits.data(), end, index);
      if (digits.empty() || digits.front() < '0' || digits.front() > '9' || ec != std::errc() ||
          ptr != end) {
        return InvalidArgument("bad device \"" + std::string(spec) +
                               "\": the GPU index after \"cuda:\" must be a number >= 0");
      }
    }
    if (!CudaBuilt()) return internal::NoCuda();
    const int count = CudaDeviceCount();
    if (index >= count) {
      return Unavailable("device cuda:" + std::to_string(index) +
                         " does not exist: this machine has " + std::to_string(count) +
                         " usable GPU(s); use \"cpu\" or \"auto\"");
    }
    return Device{DeviceType::kCuda, index};
  }
  return InvalidArgument("unknown device \"" + std::string(spec) +
                         "\": expected cpu, cuda, cuda:N or auto");
}

Result<std::unique_ptr<Context>> Context::Create(Device device, int cpu_threads) {
  switch (device.type) {
    case DeviceType::kCpu: {
      if (device.index != 0) {
        return InvalidArgument("there is one CPU device, index 0; got cpu index " +
                               std::to_string(device.index));
      }
      if (cpu_threads < 1) {
        return InvalidArgument("a CPU context needs cpu_threads >= 1, got " +
                               std::to_string(cpu_threads));
      }
      cpu::SetCpuThreads(cpu_threads);
      return std::unique_ptr<Context>(std::make_unique<CpuContext>());
    }
    case DeviceType::kCuda: {
#if LEASH_WITH_CUDA
      const int count = cuda::DeviceCount();
      if (device.index < 0 || device.index >= count) {
        return Unavailable("device " + DeviceName(device) + " does not exist: this machine has " +
                           std::to_string(count) + " usable GPU(s)");
      }
      LEASH_ASSIGN_OR_RETURN(cuda::StatePtr state, cuda::CreateState(device.index));
      return std::unique_ptr<Context>(std::make_unique<CudaContext>(device, std::move(state)));
#else
      return internal::NoCuda();
#endif
    }
  }
  return InvalidArgument("unknown device type " + std::to_string(static_cast<int>(device.type)));
}

// ---- DeviceArray ----

template <typename T>
Result<DeviceArray<T>> DeviceArray<T>::Allocate(Context& ctx, size_t count) {
  LEASH_ASSIGN_OR_RETURN(void* p, AllocateBytes(ctx, count, sizeof(T)));
  DeviceArray a;
  a.data_ = {static_cast<T*>(p), internal::FreeDeviceMemory{ctx.device()}};
  a.size_ = count;
  return a;
}

template <typename T>
Status DeviceArray<T>::CopyFromHost(Context& ctx, const T* src_host, size_t count, size_t offset) {
  return CopyIn(ctx, device(), data(), size(), src_host, count, offset, sizeof(T));
}

template <typename T>
Status DeviceArray<T>::CopyToHost(Context& ctx, T* dst_host, size_t count, size_t offset) const {
  return CopyOut(ctx, device(), data(), size(), dst_host, count, offset, sizeof(T));
}

template class DeviceArray<float>;
template class DeviceArray<int32_t>;
template class DeviceArray<uint16_t>;

// ---- PinnedHostBuffer ----

Result<PinnedHostBuffer> PinnedHostBuffer::Allocate(Context& ctx, size_t bytes) {
  PinnedHostBuffer b;
  b.data_ = {nullptr, internal::FreePinnedMemory{ctx.device()}};
  b.bytes_ = bytes;
  if (bytes == 0) return b;
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      b.data_.reset(std::malloc(bytes));
      if (b.data_ == nullptr)
        return ResourceExhausted("out of host memory allocating " + Bytes(bytes));
      return b;
    case DeviceType::kCuda: {
      LEASH_ASSIGN_OR_RETURN(void* p, internal::OnCuda<Result<void*>>(ctx, [&](auto& s) {
                               return cuda::AllocatePinned(s, bytes);
                             }));
      b.data_.reset(p);
      return b;
    }
  }
  return InvalidArgument("unknown device type");
}

// ---- CopyStream ----

namespace {

Status CheckQueuedCopy(const void* dst, const void* src_host, size_t bytes) {
  if (bytes > 0 && (dst == nullptr || src_host == nullptr)) {
    return InvalidArgument(std::string("CopyStream::CopyToDevice: ") +
                           (dst == nullptr ? "the destination" : "the source") + " of a " +
                           Bytes(bytes) + " copy is null");
  }
  return Status::Ok();
}

// On the CPU the "device" is host memory and every kernel has finished when it returns.
class CpuCopyStream final : public CopyStream {
 public:
  Status CopyToDevice(void* dst_device, const void* src_host, size_t bytes) override {
    LEASH_RETURN_IF_ERROR(CheckQueuedCopy(dst_device, src_host, bytes));
    if (bytes > 0) std::memcpy(dst_device, src_host, bytes);
    return Status::Ok();
  }
  Status ContextWaitsForCopies() override { return Status::Ok(); }
  Status CopiesWaitForContext() override { return Status::Ok(); }
  Status Synchronize() override { return Status::Ok(); }
};

#if LEASH_WITH_CUDA
class CudaCopyStream final : public CopyStream {
 public:
  CudaCopyStream(Context& ctx, cuda::CopyQueuePtr queue) : ctx_(ctx), queue_(std::move(queue)) {}
  Status CopyToDevice(void* dst_device, const void* src_host, size_t bytes) override {
    LEASH_RETURN_IF_ERROR(CheckQueuedCopy(dst_device, src_host, bytes));
    if (bytes == 0) return Status::Ok();
    return internal::OnCuda(
        ctx_, [&](auto& s) { return cuda::QueueCopy(s, *queue_, dst_device, src_host, bytes); });
  }
  Status ContextWaitsForCopies() override {
    return internal::OnCuda(ctx_, [&](auto& s) { return cuda::ComputeWaitsForCopies(s, *queue_); });
  }
  Status CopiesWaitForContext() override {
    return internal::OnCuda(ctx_, [&](auto& s) { return cuda::CopiesWaitForCompute(s, *queue_); });
  }
  Status Synchronize() override {
    return internal::OnCuda(ctx_, [&](auto& s) { return cuda::SynchronizeCopies(s, *queue_); });
  }

 private:
  Context& ctx_;
  cuda::CopyQueuePtr queue_;
};
#endif

}  // namespace

Result<std::unique_ptr<CopyStream>> CopyStream::Create(Context& ctx) {
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      return std::unique_ptr<CopyStream>(std::make_unique<CpuCopyStream>());
    case DeviceType::kCuda:
#if LEASH_WITH_CUDA
      return internal::OnCuda<Result<std::unique_ptr<CopyStream>>>(
          ctx, [&](auto& s) -> Result<std::unique_ptr<CopyStream>> {
            LEASH_ASSIGN_OR_RETURN(cuda::CopyQueuePtr queue, cuda::CreateCopyQueue(s));
            return std::unique_ptr<CopyStream>(
                std::make_unique<CudaCopyStream>(ctx, std::move(queue)));
          });
#else
      return internal::NoCuda();
#endif
  }
  return InvalidArgument("unknown device type");
}

Status CopyInt32FromHost(Context& ctx, const int32_t* src_host, size_t count, int32_t* dst) {
  if (count == 0) return Status::Ok();
  if (src_host == nullptr || dst == nullptr) {
    return InvalidArgument(std::string("CopyInt32FromHost: ") +
                           (src_host == nullptr ? "src_host" : "dst") + " is null");
  }
  if (count > std::numeric_limits<size_t>::max() / sizeof(int32_t)) {
    return InvalidArgument("CopyInt32FromHost: count " + std::to_string(count) + " overflows");
  }
  const size_t bytes = count * sizeof(int32_t);
  switch (ctx.device().type) {
    case DeviceType::kCpu:
      std::memcpy(dst, src_host, bytes);
      return Status::Ok();
    case DeviceType::kCuda:
      return internal::OnCuda(ctx,
                              [&](auto& s) { return cuda::CopyToDevice(s, dst, src_host, bytes); });
  }
  return InvalidArgument("unknown device type");
}

}  // namespace leash::kernels
