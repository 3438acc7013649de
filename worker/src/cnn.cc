// The convolutional network for 1 x 28 x 28 images: two 3x3 convolutions, each followed
// by a channel bias, ReLU and 2x2 max pooling, then two dense layers y = x W + b (ReLU
// between them) and softmax cross-entropy. All math goes through the kernels.h entry
// points, so the same code runs on the CPU and on CUDA; every buffer is allocated once,
// for max_batch examples. What every built-in model shares (parameters, staging, Gradient,
// Evaluate) is KernelModel's; this file holds the layers, forward and backward. One
// thread at a time (like its kernels::Context).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "leash/kernels/kernels.h"
#include "leash/worker/model.h"

#include "kernel_model.h"

namespace leash::worker {
namespace {

using kernels::Buffer;
using kernels::Context;
using kernels::Transpose;

constexpr int64_t kImageSize = 28;  // 1 x 28 x 28 inputs
constexpr int64_t kClasses = 10;
constexpr int64_t kKernel = 3;  // every convolution is 3x3 with "same" padding
constexpr int64_t kPad = 1;
// Output channels of the two convolutions and width of the hidden dense layer.
constexpr int64_t kConv1Channels = 32;
constexpr int64_t kConv2Channels = 64;
constexpr int64_t kHidden = 128;
// The largest activation (conv1's output, 32 x 28 x 28 per example) must stay within the
// kernels' 2^31 - 1 elements per tensor.
constexpr int64_t kMaxBatch =
    std::numeric_limits<int32_t>::max() / (kConv1Channels * kImageSize * kImageSize);
// Fixed so that a standalone model is reproducible; a worker overwrites the values with
// the tables it pulls from the servers.
constexpr uint64_t kInitSeed = 0x1ea5'0002;

class Cnn final : public KernelModel {
 public:
  Cnn(Context& ctx, int64_t max_batch)
      : KernelModel(ctx, kImageSize * kImageSize, kClasses, max_batch) {}

  // Describes the parameters, allocates every buffer and He-initializes the weights.
  Status Init() {
    conv_[0] = ConvLayer{1, kConv1Channels, kImageSize, {}, {}};
    conv_[1] = ConvLayer{kConv1Channels, kConv2Channels, kImageSize / 2, {}, {}};
    const int64_t flat = kConv2Channels * (kImageSize / 4) * (kImageSize / 4);  // 64 x 7 x 7
    dense_[0] = DenseLayer{flat, kHidden, {}};
    dense_[1] = DenseLayer{kHidden, kClasses, {}};

    std::mt19937_64 rng(kInitSeed);
    const auto batch = static_cast<size_t>(max_batch());
    size_t widest = 0;  // the largest per-example gradient that flows back
    for (int l = 0; l < 2; ++l) {
      const ConvLayer& c = conv_[l];
      const std::string name = "cnn/conv" + std::to_string(l + 1);
      const int64_t fan_in = c.c_in * kKernel * kKernel;
      LEASH_RETURN_IF_ERROR(AddParams(name, c.c_out, fan_in, fan_in, c.c_out, rng));
      const auto pixels = static_cast<size_t>(c.size * c.size);
      const auto out = static_cast<size_t>(c.c_out);
      LEASH_ASSIGN_OR_RETURN(conv_[l].act, Buffer::Allocate(ctx(), batch * out * pixels));
      LEASH_ASSIGN_OR_RETURN(conv_[l].pooled, Buffer::Allocate(ctx(), batch * out * pixels / 4));
      widest = std::max(widest, out * pixels);
    }
    for (int l = 0; l < 2; ++l) {
      const DenseLayer& d = dense_[l];
      const std::string name = "cnn/fc" + std::to_string(l + 1);
      // Stored in x out, as the MLP's.
      LEASH_RETURN_IF_ERROR(AddParams(name, d.in, d.out, d.in, d.out, rng));
      LEASH_ASSIGN_OR_RETURN(dense_[l].act,
                             Buffer::Allocate(ctx(), batch * static_cast<size_t>(d.out)));
      widest = std::max(widest, static_cast<size_t>(std::max(d.in, d.out)));
    }
    return InitBuffers(widest);
  }

 private:
  // A 3x3 "same" convolution of size x size inputs, then bias, ReLU and 2x2 pooling.
  struct ConvLayer {
    int64_t c_in = 0;
    int64_t c_out = 0;
    int64_t size = 0;
    Buffer act;     // ReLU(conv(x) + b): batch x c_out x size x size
    Buffer pooled;  // batch x c_out x size/2 x size/2; the next layer's input
  };
  struct DenseLayer {
    int64_t in = 0;
    int64_t out = 0;
    Buffer act;  // batch x out (after ReLU, except for the logits of the last layer)
  };

  // Returns the logits, in dense_[1].act.
  Result<const float*> Forward(const float* x, int64_t batch) override {
    for (int l = 0; l < 2; ++l) {
      ConvLayer& c = conv_[l];
      const auto pi = static_cast<size_t>(l);
      LEASH_RETURN_IF_ERROR(kernels::Conv2dForward(ctx(), batch, c.c_in, c.size, c.size, c.c_out,
                                                   kKernel, kPad, x, Weight(pi), c.act.data()));
      LEASH_RETURN_IF_ERROR(
          kernels::BiasAddChannels(ctx(), batch, c.c_out, c.size * c.size, Bias(pi), c.act.data()));
      LEASH_RETURN_IF_ERROR(
          kernels::Relu(ctx(), batch * c.c_out * c.size * c.size, c.act.data(), c.act.data()));
      LEASH_RETURN_IF_ERROR(kernels::MaxPool2dForward(ctx(), batch, c.c_out, c.size, c.size,
                                                      c.act.data(), c.pooled.data()));
      x = c.pooled.data();
    }
    for (int l = 0; l < 2; ++l) {
      DenseLayer& d = dense_[l];
      const auto pi = static_cast<size_t>(2 + l);
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx(), Transpose::kNo, Transpose::kNo, batch, d.out, d.in,
                                          1.f, x, Weight(pi), 0.f, d.act.data()));
      LEASH_RETURN_IF_ERROR(kernels::BiasAdd(ctx(), batch, d.out, Bias(pi), d.act.data()));
      if (l == 0)
        LEASH_RETURN_IF_ERROR(kernels::Relu(ctx(), batch * d.out, d.act.data(), d.act.data()));
      x = d.act.data();
    }
    return x;
  }

  Status Backward(const float* input, int64_t batch, Buffer* dz, Buffer* dnext,
                  const std::function<void(size_t)>& on_grad) override {
    // Dense layers, last first; dz holds dL/d(output) of layer l.
    for (int l = 1; l >= 0; --l) {
      const DenseLayer& d = dense_[l];
      const auto pi = static_cast<size_t>(2 + l);  // its weights(pi)
      const float* x = l == 0 ? conv_[1].pooled.data() : dense_[0].act.data();
      // dW = x^T dz (in x out), db = column sums of dz.
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx(), Transpose::kYes, Transpose::kNo, d.in, d.out,
                                          batch, 1.f, x, dz->data(), 0.f, WeightGradOut(pi)));
      LEASH_RETURN_IF_ERROR(kernels::BiasGrad(ctx(), batch, d.out, dz->data(), BiasGradOut(pi)));
      GradientsReady(2 + static_cast<size_t>(l), on_grad);
      // dx = dz W^T (batch x in); through the ReLU that produced x for the upper layer
      // (the pooled features' ReLU came before pooling, so it is undone below).
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx(), Transpose::kNo, Transpose::kYes, batch, d.in,
                                          d.out, 1.f, dz->data(), Weight(pi), 0.f, dnext->data()));
      if (l == 1)
        LEASH_RETURN_IF_ERROR(
            kernels::ReluBackward(ctx(), batch * d.in, x, dnext->data(), dnext->data()));
      std::swap(dz, dnext);
    }

    // Convolutions, last first; dz holds dL/d(pooled output) of layer l.
    for (int l = 1; l >= 0; --l) {
      const ConvLayer& c = conv_[l];
      const int64_t pixels = c.size * c.size;
      const float* x = l == 0 ? input : conv_[0].pooled.data();
      // Back through the pooling and the ReLU into dnext = dL/d(convolution + bias).
      LEASH_RETURN_IF_ERROR(kernels::MaxPool2dBackward(ctx(), batch, c.c_out, c.size, c.size,
                                                       c.act.data(), c.pooled.data(), dz->data(),
                                                       dnext->data()));
      LEASH_RETURN_IF_ERROR(kernels::ReluBackward(ctx(), batch * c.c_out * pixels, c.act.data(),
                                                  dnext->data(), dnext->data()));
      LEASH_RETURN_IF_ERROR(kernels::Conv2dBackwardWeight(ctx(), batch, c.c_in, c.size, c.size,
                                                          c.c_out, kKernel, kPad, x, dnext->data(),
                                                          WeightGradOut(static_cast<size_t>(l))));
      LEASH_RETURN_IF_ERROR(kernels::BiasGradChannels(ctx(), batch, c.c_out, pixels, dnext->data(),
                                                      BiasGradOut(static_cast<size_t>(l))));
      GradientsReady(static_cast<size_t>(l), on_grad);
      if (l == 0) break;  // nobody needs the gradient of the input
      LEASH_RETURN_IF_ERROR(
          kernels::Conv2dBackwardData(ctx(), batch, c.c_in, c.size, c.size, c.c_out, kKernel, kPad,
                                      dnext->data(), Weight(static_cast<size_t>(l)), dz->data()));
    }
    return Status::Ok();
  }

  // Their parameters are weights(0) to weights(3): conv1, conv2, fc1, fc2.
  ConvLayer conv_[2];
  DenseLayer dense_[2];
};

}  // namespace

Result<std::unique_ptr<Model>> MakeCnn(kernels::Context& ctx, int64_t max_batch) {
  if (max_batch <= 0 || max_batch > kMaxBatch) {
    return InvalidArgument("MakeCnn: max_batch must be in [1, " + std::to_string(kMaxBatch) +
                           "], got " + std::to_string(max_batch));
  }
  auto cnn = std::make_unique<Cnn>(ctx, max_batch);
  LEASH_RETURN_IF_ERROR(cnn->Init());
  return std::unique_ptr<Model>(std::move(cnn));
}

}  // namespace leash::worker
