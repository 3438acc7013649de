// The convolutional network for 1 x 28 x 28 images: two 3x3 convolutions, each followed
// by a channel bias, ReLU and 2x2 max pooling, then two dense layers y = x W + b (ReLU
// between them) and softmax cross-entropy. All math goes through the kernels.h entry
// points, so the same code runs on the CPU and on CUDA; every buffer is allocated once,
// for max_batch examples. On the CPU the parameters may instead be read from caller-owned
// host arrays (BindParam), and gradients are handed out in place (HostGradient). One
// thread at a time (like its kernels::Context).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "leash/kernels/kernels.h"
#include "leash/worker/model.h"

#include "batch_stager.h"
#include "param_binding.h"

namespace leash::worker {
namespace {

using kernels::Buffer;
using kernels::Context;
using kernels::DeviceType;
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
constexpr int64_t kMaxBatch = std::numeric_limits<int32_t>::max() / (kConv1Channels * kImageSize * kImageSize);
// Fixed so that a standalone model is reproducible; a worker overwrites the values with
// the tables it pulls from the servers.
constexpr uint64_t kInitSeed = 0x1ea5'0002;

class Cnn final : public Model {
 public:
  Cnn(Context& ctx, int64_t max_batch) : ctx_(ctx), max_batch_(max_batch) {}

  // Describes the parameters, allocates every buffer and He-initializes the weights.
  Status Init() {
    conv_[0] = ConvLayer{1, kConv1Channels, kImageSize, {}, {}};
    conv_[1] = ConvLayer{kConv1Channels, kConv2Channels, kImageSize / 2, {}, {}};
    const int64_t flat = kConv2Channels * (kImageSize / 4) * (kImageSize / 4);  // 64 x 7 x 7
    dense_[0] = DenseLayer{flat, kHidden, {}};
    dense_[1] = DenseLayer{kHidden, kClasses, {}};

    std::mt19937_64 rng(kInitSeed);
    const auto batch = static_cast<size_t>(max_batch_);
    size_t widest = 0;  // the largest per-example gradient that flows back
    for (int l = 0; l < 2; ++l) {
      const ConvLayer& c = conv_[l];
      const std::string name = "cnn/conv" + std::to_string(l + 1);
      const int64_t fan_in = c.c_in * kKernel * kKernel;
      LEASH_RETURN_IF_ERROR(AddParams(name, c.c_out, fan_in, fan_in, c.c_out, rng));
      const auto pixels = static_cast<size_t>(c.size * c.size);
      const auto out = static_cast<size_t>(c.c_out);
      LEASH_ASSIGN_OR_RETURN(conv_[l].act, Buffer::Allocate(ctx_, batch * out * pixels));
      LEASH_ASSIGN_OR_RETURN(conv_[l].pooled, Buffer::Allocate(ctx_, batch * out * pixels / 4));
      widest = std::max(widest, out * pixels);
    }
    for (int l = 0; l < 2; ++l) {
      const DenseLayer& d = dense_[l];
      const std::string name = "cnn/fc" + std::to_string(l + 1);
      // Stored in x out, as the MLP's.
      LEASH_RETURN_IF_ERROR(AddParams(name, d.in, d.out, d.in, d.out, rng));
      LEASH_ASSIGN_OR_RETURN(dense_[l].act, Buffer::Allocate(ctx_, batch * static_cast<size_t>(d.out)));
      widest = std::max(widest, static_cast<size_t>(std::max(d.in, d.out)));
    }
    // The gradient flowing back ping-pongs between two buffers as wide as the widest one.
    for (Buffer& d : delta_) {
      LEASH_ASSIGN_OR_RETURN(d, Buffer::Allocate(ctx_, batch * widest));
    }
    LEASH_RETURN_IF_ERROR(stager_.Init(ctx_, static_cast<int64_t>(batch), input_size(), kClasses));
    grad_ready_.assign(params_.size(), false);
    bindings_.Init(params_.size());
    return Status::Ok();
  }

  const std::vector<ParamSpec>& params() const override { return params_; }
  int64_t input_size() const override { return kImageSize * kImageSize; }
  int64_t num_classes() const override { return kClasses; }

  Status SetParam(size_t index, const float* host) override {
    LEASH_RETURN_IF_ERROR(CheckParamIndex("SetParam", index, params_.size()));
    if (host == nullptr) return InvalidArgument("SetParam: host data for " + params_[index].name + " is null");
    LEASH_RETURN_IF_ERROR(Value(index).CopyFromHost(ctx_, host, params_[index].size()));
    bindings_.Unbind(index);
    return Status::Ok();
  }

  Status BindParam(size_t index, const float* host) override { return bindings_.Bind(ctx_, params_, index, host); }

  Result<StepStats> TrainStep(const float* images_host, const int32_t* labels_host, int64_t batch,
                              const std::function<void(size_t)>& on_grad) override {
    std::fill(grad_ready_.begin(), grad_ready_.end(), false);
    LEASH_ASSIGN_OR_RETURN(BatchStager::Staged in, stager_.Stage("TrainStep", images_host, labels_host, batch));
    LEASH_RETURN_IF_ERROR(Forward(in.x, batch));
    StepStats stats;
    Buffer* dz = &delta_[0];
    Buffer* dnext = &delta_[1];
    LEASH_RETURN_IF_ERROR(kernels::SoftmaxCrossEntropy(ctx_, batch, kClasses, dense_[1].act.data(), in.labels,
                                                       dz->data(), &stats.loss, &stats.correct));
    auto announce = [&](size_t layer) {  // parameters 2 layer (weight) and 2 layer + 1 (bias)
      grad_ready_[2 * layer + 1] = true;
      grad_ready_[2 * layer] = true;
      if (on_grad) {
        on_grad(2 * layer + 1);
        on_grad(2 * layer);
      }
    };

    // Dense layers, last first; dz holds dL/d(output) of layer l.
    for (int l = 1; l >= 0; --l) {
      const DenseLayer& d = dense_[l];
      const auto pi = static_cast<size_t>(2 + l);  // index into weights_
      Weights& p = weights_[pi];
      const float* x = l == 0 ? conv_[1].pooled.data() : dense_[0].act.data();
      // dW = x^T dz (in x out), db = column sums of dz.
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx_, Transpose::kYes, Transpose::kNo, d.in, d.out, batch, 1.f, x, dz->data(),
                                          0.f, p.dw.data()));
      LEASH_RETURN_IF_ERROR(kernels::BiasGrad(ctx_, batch, d.out, dz->data(), p.db.data()));
      announce(2 + static_cast<size_t>(l));
      // dx = dz W^T (batch x in); through the ReLU that produced x for the upper layer
      // (the pooled features' ReLU came before pooling, so it is undone below).
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx_, Transpose::kNo, Transpose::kYes, batch, d.in, d.out, 1.f, dz->data(),
                                          Weight(pi), 0.f, dnext->data()));
      if (l == 1) LEASH_RETURN_IF_ERROR(kernels::ReluBackward(ctx_, batch * d.in, x, dnext->data(), dnext->data()));
      std::swap(dz, dnext);
    }

    // Convolutions, last first; dz holds dL/d(pooled output) of layer l.
    for (int l = 1; l >= 0; --l) {
      const ConvLayer& c = conv_[l];
      Weights& p = weights_[l];
      const int64_t pixels = c.size * c.size;
      const float* x = l == 0 ? in.x : conv_[0].pooled.data();
      // Back through the pooling and the ReLU into dnext = dL/d(convolution + bias).
      LEASH_RETURN_IF_ERROR(kernels::MaxPool2dBackward(ctx_, batch, c.c_out, c.size, c.size, c.act.data(),
                                                       c.pooled.data(), dz->data(), dnext->data()));
      LEASH_RETURN_IF_ERROR(
          kernels::ReluBackward(ctx_, batch * c.c_out * pixels, c.act.data(), dnext->data(), dnext->data()));
      LEASH_RETURN_IF_ERROR(kernels::Conv2dBackwardWeight(ctx_, batch, c.c_in, c.size, c.size, c.c_out, kKernel, kPad,
                                                          x, dnext->data(), p.dw.data()));
      LEASH_RETURN_IF_ERROR(kernels::BiasGradChannels(ctx_, batch, c.c_out, pixels, dnext->data(), p.db.data()));
      announce(static_cast<size_t>(l));
      if (l == 0) break;  // nobody needs the gradient of the input
      LEASH_RETURN_IF_ERROR(kernels::Conv2dBackwardData(ctx_, batch, c.c_in, c.size, c.size, c.c_out, kKernel, kPad,
                                                        dnext->data(), Weight(static_cast<size_t>(l)), dz->data()));
    }
    return stats;
  }

  Status PrefetchBatch(const float* images_host, const int32_t* labels_host, int64_t batch) override {
    return stager_.StageAhead("PrefetchBatch", images_host, labels_host, batch);
  }
  StagingStats staging() const override { return {stager_.staged_ahead(), stager_.used_ahead()}; }

  Status Gradient(size_t index, float* out_host) override {
    LEASH_RETURN_IF_ERROR(CheckParamIndex("Gradient", index, params_.size()));
    if (out_host == nullptr) return InvalidArgument("Gradient: output for " + params_[index].name + " is null");
    if (!grad_ready_[index]) {
      return FailedPrecondition("Gradient: no gradient of " + params_[index].name +
                                " yet; call TrainStep first (and wait for its on_grad)");
    }
    return Grad(index).CopyToHost(ctx_, out_host, params_[index].size());
  }

  Result<const float*> HostGradient(size_t index) override {
    return HostGradientOf(ctx_, params_, grad_ready_, index, Grad(index));
  }

  Result<StepStats> Evaluate(const float* images_host, const int32_t* labels_host, int64_t n) override {
    return stager_.Evaluate(images_host, labels_host, n, [&](const float* x, int64_t rows) -> Result<const float*> {
      LEASH_RETURN_IF_ERROR(Forward(x, rows));
      return static_cast<const float*>(dense_[1].act.data());
    });
  }

 private:
  // A layer's parameters and their gradients.
  struct Weights {
    Buffer w, b, dw, db;
  };
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
  // Adds "<name>/w" (rows x cols, He-initialized for `fan_in` inputs per output) and
  // "<name>/b" (1 x outputs, zeros), with their buffers.
  Status AddParams(const std::string& name, int64_t rows, int64_t cols, int64_t fan_in, int64_t outputs,
                   std::mt19937_64& rng) {
    const float stddev = std::sqrt(2.f / static_cast<float>(fan_in));
    params_.push_back(
        ParamSpec{name + "/w", static_cast<uint64_t>(rows), static_cast<uint32_t>(cols), InitKind::kNormal, stddev});
    params_.push_back(ParamSpec{name + "/b", 1, static_cast<uint32_t>(outputs), InitKind::kZeros, 0.f});
    const auto size = static_cast<size_t>(rows * cols);
    Weights p;
    LEASH_ASSIGN_OR_RETURN(p.w, Buffer::Allocate(ctx_, size));
    LEASH_ASSIGN_OR_RETURN(p.b, Buffer::Allocate(ctx_, static_cast<size_t>(outputs)));
    LEASH_ASSIGN_OR_RETURN(p.dw, Buffer::Allocate(ctx_, size));
    LEASH_ASSIGN_OR_RETURN(p.db, Buffer::Allocate(ctx_, static_cast<size_t>(outputs)));
    std::normal_distribution<float> normal(0.f, stddev);
    std::vector<float> w(size);
    for (float& v : w) v = normal(rng);
    LEASH_RETURN_IF_ERROR(p.w.CopyFromHost(ctx_, w.data(), w.size()));
    weights_.push_back(std::move(p));
    return Status::Ok();
  }

  Buffer& Value(size_t index) { return index % 2 == 0 ? weights_[index / 2].w : weights_[index / 2].b; }
  Buffer& Grad(size_t index) { return index % 2 == 0 ? weights_[index / 2].dw : weights_[index / 2].db; }
  // Where the kernels read weights_[i]'s weight and bias: a bound host array or the own buffer.
  const float* Weight(size_t i) const { return bindings_.Read(2 * i, weights_[i].w); }
  const float* Bias(size_t i) const { return bindings_.Read(2 * i + 1, weights_[i].b); }

  // Leaves the logits in dense_[1].act.
  Status Forward(const float* x, int64_t batch) {
    for (int l = 0; l < 2; ++l) {
      ConvLayer& c = conv_[l];
      const auto pi = static_cast<size_t>(l);
      LEASH_RETURN_IF_ERROR(kernels::Conv2dForward(ctx_, batch, c.c_in, c.size, c.size, c.c_out, kKernel, kPad, x,
                                                   Weight(pi), c.act.data()));
      LEASH_RETURN_IF_ERROR(kernels::BiasAddChannels(ctx_, batch, c.c_out, c.size * c.size, Bias(pi), c.act.data()));
      LEASH_RETURN_IF_ERROR(kernels::Relu(ctx_, batch * c.c_out * c.size * c.size, c.act.data(), c.act.data()));
      LEASH_RETURN_IF_ERROR(
          kernels::MaxPool2dForward(ctx_, batch, c.c_out, c.size, c.size, c.act.data(), c.pooled.data()));
      x = c.pooled.data();
    }
    for (int l = 0; l < 2; ++l) {
      DenseLayer& d = dense_[l];
      const auto pi = static_cast<size_t>(2 + l);
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx_, Transpose::kNo, Transpose::kNo, batch, d.out, d.in, 1.f, x, Weight(pi),
                                          0.f, d.act.data()));
      LEASH_RETURN_IF_ERROR(kernels::BiasAdd(ctx_, batch, d.out, Bias(pi), d.act.data()));
      if (l == 0) LEASH_RETURN_IF_ERROR(kernels::Relu(ctx_, batch * d.out, d.act.data(), d.act.data()));
      x = d.act.data();
    }
    return Status::Ok();
  }

  Context& ctx_;
  const int64_t max_batch_;
  std::vector<ParamSpec> params_;
  std::vector<Weights> weights_;  // conv1, conv2, fc1, fc2: parameters 2 i and 2 i + 1
  ConvLayer conv_[2];
  DenseLayer dense_[2];
  Buffer delta_[2];
  BatchStager stager_;
  std::vector<bool> grad_ready_;
  ParamBindings bindings_;
};

}  // namespace

Result<std::unique_ptr<Model>> MakeCnn(kernels::Context& ctx, int64_t max_batch) {
  if (max_batch <= 0 || max_batch > kMaxBatch) {
    return InvalidArgument("MakeCnn: max_batch must be in [1, " + std::to_string(kMaxBatch) + "], got " +
                           std::to_string(max_batch));
  }
  auto cnn = std::make_unique<Cnn>(ctx, max_batch);
  LEASH_RETURN_IF_ERROR(cnn->Init());
  return std::unique_ptr<Model>(std::move(cnn));
}

}  // namespace leash::worker
