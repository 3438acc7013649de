// Convolutions and 2 x 2 max pooling on cuDNN, and the per-channel bias kernels, for NCHW
// float tensors. Convolutions compute in plain fp32 (FMA math, no TF32) with the
// algorithms cuDNN's heuristics rank best, chosen once per shape and cached in the State
// with the workspace they need. One thread at a time per State.
#include <cstdint>
#include <initializer_list>
#include <string>

#include "cuda_state.h"

namespace leash::kernels::cuda {
namespace {

constexpr int kBlock = 256;
// A shape whose best-ranked algorithm wants more workspace than this falls back to the
// next one rather than holding gigabytes of device memory.
constexpr size_t kMaxWorkspaceBytes = size_t{1} << 30;

// A cuDNN descriptor that destroys itself.
template <typename T, cudnnStatus_t (*kCreate)(T*), cudnnStatus_t (*kDestroy)(T)>
class Descriptor {
 public:
  Descriptor() = default;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (desc_ != nullptr) kDestroy(desc_);
  }
  Status Create(const char* what) {
    return FromCudnn(kCreate(&desc_), std::string("creating a cuDNN ") + what + " descriptor");
  }
  T get() const { return desc_; }

 private:
  T desc_ = nullptr;
};
using TensorDesc =
    Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc =
    Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc = Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                            cudnnDestroyConvolutionDescriptor>;
using PoolDesc = Descriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor,
                            cudnnDestroyPoolingDescriptor>;

// Sizes were validated by the entry points to fit cuDNN's int.
int I(int64_t v) { return static_cast<int>(v); }

std::string Dims(std::initializer_list<int64_t> dims) {
  std::string out;
  for (int64_t d : dims) out += (out.empty() ? "" : "x") + std::to_string(d);
  return out;
}

std::string Describe(const Conv2dShape& s) {
  return Dims({s.n, s.c_in, s.h, s.w}) + " input, " + Dims({s.c_out, s.c_in, s.k, s.k}) +
         " weight, pad " + std::to_string(s.pad);
}

Status DescribeTensor(TensorDesc& d, int64_t n, int64_t c, int64_t h, int64_t w) {
  LEASH_RETURN_IF_ERROR(d.Create("tensor"));
  return FromCudnn(cudnnSetTensor4dDescriptor(d.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, I(n),
                                              I(c), I(h), I(w)),
                   "describing a " + Dims({n, c, h, w}) + " tensor to cuDNN");
}

// The descriptors of one convolution.
struct ConvDescs {
  TensorDesc x, y;
  FilterDesc weight;
  ConvDesc conv;

  Status Init(const Conv2dShape& s) {
    LEASH_RETURN_IF_ERROR(DescribeTensor(x, s.n, s.c_in, s.h, s.w));
    LEASH_RETURN_IF_ERROR(DescribeTensor(y, s.n, s.c_out, s.h_out(), s.w_out()));
    LEASH_RETURN_IF_ERROR(weight.Create("filter"));
    LEASH_RETURN_IF_ERROR(
        FromCudnn(cudnnSetFilter4dDescriptor(weight.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                             I(s.c_out), I(s.c_in), I(s.k), I(s.k)),
                  "describing a " + Dims({s.c_out, s.c_in, s.k, s.k}) + " filter to cuDNN"));
    LEASH_RETURN_IF_ERROR(conv.Create("convolution"));
    LEASH_RETURN_IF_ERROR(
        FromCudnn(cudnnSetConvolution2dDescriptor(conv.get(), I(s.pad), I(s.pad), 1, 1, 1, 1,
                                                  CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                  "describing a convolution with pad " + std::to_string(s.pad) + " to cuDNN"));
    // Plain fp32: TF32 tensor cores would lose the agreement with the CPU kernels.
    return FromCudnn(cudnnSetConvolutionMathType(conv.get(), CUDNN_FMA_MATH),
                     "selecting cuDNN's fp32 math");
  }
};

// Picks from cuDNN's ranked candidates the first that runs here in plain fp32 with at most
// kMaxWorkspaceBytes of workspace, preferring deterministic algorithms (the same bits on
// every run). `workspace_for(algo, &bytes)` asks cuDNN whether `algo` runs on these
// descriptors and what it needs; an algorithm it refuses is skipped, not an error.
template <typename Perf, typename Algo, typename WorkspaceFor>
Status Choose(const Perf* perf, int count, WorkspaceFor workspace_for, const std::string& what,
              Algo* algo, size_t* bytes) {
  for (bool deterministic_only : {true, false}) {
    for (int i = 0; i < count; ++i) {
      const Perf& p = perf[i];
      if (p.status != CUDNN_STATUS_SUCCESS) continue;
      if (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
        continue;
      if (deterministic_only && p.determinism != CUDNN_DETERMINISTIC) continue;
      size_t needed = 0;
      if (workspace_for(p.algo, &needed) != CUDNN_STATUS_SUCCESS || needed > kMaxWorkspaceBytes)
        continue;
      *algo = p.algo;
      *bytes = needed;
      return Status::Ok();
    }
  }
  return Unavailable("cuDNN offers no fp32 algorithm needing at most " +
                     std::to_string(kMaxWorkspaceBytes) + " bytes of workspace for " + what);
}

// The algorithms for `shape`, chosen on first use and cached in the State.
Result<const ConvAlgos*> AlgosFor(State& s, const ConvDescs& d, const Conv2dShape& shape) {
  const ConvKey key{shape.n, shape.c_in, shape.h, shape.w, shape.c_out, shape.k, shape.pad};
  auto found = s.conv_algos.find(key);
  if (found != s.conv_algos.end()) return &found->second;

  const std::string what = "the convolution of " + Describe(shape);
  ConvAlgos a{};
  {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int count = 0;
    LEASH_RETURN_IF_ERROR(FromCudnn(cudnnGetConvolutionForwardAlgorithm_v7(
                                        s.cudnn, d.x.get(), d.weight.get(), d.conv.get(), d.y.get(),
                                        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf),
                                    "ranking cuDNN's forward algorithms for " + what));
    auto workspace_for = [&](cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
      return cudnnGetConvolutionForwardWorkspaceSize(s.cudnn, d.x.get(), d.weight.get(),
                                                     d.conv.get(), d.y.get(), algo, bytes);
    };
    LEASH_RETURN_IF_ERROR(
        Choose(perf, count, workspace_for, "forward " + what, &a.forward, &a.forward_bytes));
  }
  {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int count = 0;
    LEASH_RETURN_IF_ERROR(FromCudnn(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                                        s.cudnn, d.weight.get(), d.y.get(), d.conv.get(), d.x.get(),
                                        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf),
                                    "ranking cuDNN's backward-data algorithms for " + what));
    auto workspace_for = [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
      return cudnnGetConvolutionBackwardDataWorkspaceSize(s.cudnn, d.weight.get(), d.y.get(),
                                                          d.conv.get(), d.x.get(), algo, bytes);
    };
    LEASH_RETURN_IF_ERROR(Choose(perf, count, workspace_for, "the data gradient of " + what,
                                 &a.backward_data, &a.backward_data_bytes));
  }
  {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int count = 0;
    LEASH_RETURN_IF_ERROR(FromCudnn(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                                        s.cudnn, d.x.get(), d.y.get(), d.conv.get(), d.weight.get(),
                                        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf),
                                    "ranking cuDNN's backward-filter algorithms for " + what));
    auto workspace_for = [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(
          s.cudnn, d.x.get(), d.y.get(), d.conv.get(), d.weight.get(), algo, bytes);
    };
    LEASH_RETURN_IF_ERROR(Choose(perf, count, workspace_for, "the weight gradient of " + what,
                                 &a.backward_filter, &a.backward_filter_bytes));
  }
  return &s.conv_algos.emplace(key, a).first->second;
}

// The State's workspace, grown to at least `bytes` (and never shrunk).
Result<void*> Reserve(State& s, size_t bytes) {
  Workspace& ws = s.workspace;
  if (bytes <= ws.bytes) return ws.ptr;
  // Work already queued may still use the smaller block.
  LEASH_RETURN_IF_ERROR(
      FromCuda(cudaStreamSynchronize(s.stream), "waiting to grow the cuDNN workspace"));
  Free(ws.device, ws.ptr);
  ws.ptr = nullptr;
  ws.bytes = 0;
  ws.device = s.device;
  void* p = nullptr;
  LEASH_RETURN_IF_ERROR(FromCuda(
      cudaMalloc(&p, bytes), "allocating " + std::to_string(bytes) +
                                 " bytes of cuDNN workspace on cuda:" + std::to_string(s.device)));
  ws.ptr = p;
  ws.bytes = bytes;
  return p;
}

// The descriptors of 2 x 2, stride 2 max pooling; the output size is rounded down.
struct PoolDescs {
  TensorDesc x, y;
  PoolDesc pool;

  Status Init(int64_t n, int64_t c, int64_t h, int64_t w) {
    LEASH_RETURN_IF_ERROR(DescribeTensor(x, n, c, h, w));
    LEASH_RETURN_IF_ERROR(DescribeTensor(y, n, c, h / 2, w / 2));
    LEASH_RETURN_IF_ERROR(pool.Create("pooling"));
    // The deterministic mode routes each window's gradient to one element, its first
    // maximum, as the CPU kernel does.
    return FromCudnn(cudnnSetPooling2dDescriptor(pool.get(), CUDNN_POOLING_MAX_DETERMINISTIC,
                                                 CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2),
                     "describing 2x2 max pooling to cuDNN");
  }
};

__global__ void BiasAddChannelsKernel(int64_t total, int64_t c, int64_t hw,
                                      const float* __restrict__ bias, float* __restrict__ y) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += bias[(i / hw) % c];
  }
}

// One block per channel sums that channel's n * hw values: a fixed order, so the result
// is the same on every run.
__global__ void BiasGradChannelsKernel(int64_t n, int64_t c, int64_t hw,
                                       const float* __restrict__ dy, float* __restrict__ db) {
  __shared__ float partial[kBlock];
  const int64_t ch = blockIdx.x;
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < n * hw; j += kBlock) {
    const int64_t i = j / hw;
    sum += dy[(i * c + ch) * hw + (j - i * hw)];
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kBlock / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride)
      partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[ch] = partial[0];
}

}  // namespace

Status Conv2dForward(State& s, const Conv2dShape& shape, const float* x, const float* weight,
                     float* y) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  ConvDescs d;
  LEASH_RETURN_IF_ERROR(d.Init(shape));
  LEASH_ASSIGN_OR_RETURN(const ConvAlgos* algos, AlgosFor(s, d, shape));
  LEASH_ASSIGN_OR_RETURN(void* workspace, Reserve(s, algos->forward_bytes));
  const float one = 1.f, zero = 0.f;
  return FromCudnn(
      cudnnConvolutionForward(s.cudnn, &one, d.x.get(), x, d.weight.get(), weight, d.conv.get(),
                              algos->forward, workspace, algos->forward_bytes, &zero, d.y.get(), y),
      "cudnnConvolutionForward of " + Describe(shape));
}

Status Conv2dBackwardData(State& s, const Conv2dShape& shape, const float* dy, const float* weight,
                          float* dx) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  ConvDescs d;
  LEASH_RETURN_IF_ERROR(d.Init(shape));
  LEASH_ASSIGN_OR_RETURN(const ConvAlgos* algos, AlgosFor(s, d, shape));
  LEASH_ASSIGN_OR_RETURN(void* workspace, Reserve(s, algos->backward_data_bytes));
  const float one = 1.f, zero = 0.f;
  return FromCudnn(cudnnConvolutionBackwardData(s.cudnn, &one, d.weight.get(), weight, d.y.get(),
                                                dy, d.conv.get(), algos->backward_data, workspace,
                                                algos->backward_data_bytes, &zero, d.x.get(), dx),
                   "cudnnConvolutionBackwardData of " + Describe(shape));
}

Status Conv2dBackwardWeight(State& s, const Conv2dShape& shape, const float* x, const float* dy,
                            float* dweight) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  if (shape.n == 0) {  // cuDNN rejects empty tensors; the sum over no examples is zero
    const auto bytes = static_cast<size_t>(shape.c_out * shape.patch_rows()) * sizeof(float);
    return FromCuda(cudaMemsetAsync(dweight, 0, bytes, s.stream),
                    "zeroing the weight gradient of an empty batch");
  }
  ConvDescs d;
  LEASH_RETURN_IF_ERROR(d.Init(shape));
  LEASH_ASSIGN_OR_RETURN(const ConvAlgos* algos, AlgosFor(s, d, shape));
  LEASH_ASSIGN_OR_RETURN(void* workspace, Reserve(s, algos->backward_filter_bytes));
  const float one = 1.f, zero = 0.f;
  return FromCudnn(
      cudnnConvolutionBackwardFilter(s.cudnn, &one, d.x.get(), x, d.y.get(), dy, d.conv.get(),
                                     algos->backward_filter, workspace,
                                     algos->backward_filter_bytes, &zero, d.weight.get(), dweight),
      "cudnnConvolutionBackwardFilter of " + Describe(shape));
}

Status BiasAddChannels(State& s, int64_t n, int64_t c, int64_t hw, const float* bias, float* y) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  const int64_t total = n * c * hw;
  BiasAddChannelsKernel<<<GridFor(total, kBlock), kBlock, 0, s.stream>>>(total, c, hw, bias, y);
  return LaunchStatus("BiasAddChannelsKernel");
}

Status BiasGradChannels(State& s, int64_t n, int64_t c, int64_t hw, const float* dy, float* db) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  BiasGradChannelsKernel<<<static_cast<unsigned>(c), kBlock, 0, s.stream>>>(n, c, hw, dy, db);
  return LaunchStatus("BiasGradChannelsKernel");
}

Status MaxPool2dForward(State& s, int64_t n, int64_t c, int64_t h, int64_t w, const float* x,
                        float* y) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  PoolDescs d;
  LEASH_RETURN_IF_ERROR(d.Init(n, c, h, w));
  const float one = 1.f, zero = 0.f;
  return FromCudnn(
      cudnnPoolingForward(s.cudnn, d.pool.get(), &one, d.x.get(), x, &zero, d.y.get(), y),
      "cudnnPoolingForward of a " + Dims({n, c, h, w}) + " tensor");
}

Status MaxPool2dBackward(State& s, int64_t n, int64_t c, int64_t h, int64_t w, const float* x,
                         const float* y, const float* dy, float* dx) {
  LEASH_RETURN_IF_ERROR(Activate(s));
  PoolDescs d;
  LEASH_RETURN_IF_ERROR(d.Init(n, c, h, w));
  const float one = 1.f, zero = 0.f;
  return FromCudnn(cudnnPoolingBackward(s.cudnn, d.pool.get(), &one, d.y.get(), y, d.y.get(), dy,
                                        d.x.get(), x, &zero, d.x.get(), dx),
                   "cudnnPoolingBackward of a " + Dims({n, c, h, w}) + " tensor");
}

}  // namespace leash::kernels::cuda
