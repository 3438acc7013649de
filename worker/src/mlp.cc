// The multilayer perceptron model: dense layers y = x W + b with ReLU between them and
// softmax cross-entropy on top, all math through the kernels.h entry points so the same
// code runs on the CPU and on CUDA. Every buffer is allocated once, for max_batch rows.
// What every built-in model shares (parameters, staging, Gradient, Evaluate) is
// KernelModel's; this file holds the layers, forward and backward.
// One thread at a time (like its kernels::Context).
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

// The products go through 32-bit BLAS interfaces; keep every dimension well inside.
constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
// Fixed so that a standalone model is reproducible; a worker overwrites the values with
// the tables it pulls from the servers.
constexpr uint64_t kInitSeed = 0x1ea5'0001;

class Mlp final : public KernelModel {
 public:
  Mlp(Context& ctx, int64_t input_size, int64_t num_classes, int64_t max_batch)
      : KernelModel(ctx, input_size, num_classes, max_batch) {}

  // Allocates every buffer for `widths` = input, hidden..., classes and He-initializes W.
  Status Init(const std::vector<int64_t>& widths) {
    std::mt19937_64 rng(kInitSeed);
    size_t widest = 0;
    for (size_t l = 0; l + 1 < widths.size(); ++l) {
      Layer layer;
      layer.in = widths[l];
      layer.out = widths[l + 1];
      widest = std::max(widest, static_cast<size_t>(layer.out));
      const std::string name = "mlp/fc" + std::to_string(l + 1);
      LEASH_RETURN_IF_ERROR(AddParams(name, layer.in, layer.out, layer.in, layer.out, rng));
      const auto out = static_cast<size_t>(layer.out);
      LEASH_ASSIGN_OR_RETURN(layer.act,
                             Buffer::Allocate(ctx(), static_cast<size_t>(max_batch()) * out));
      layers_.push_back(std::move(layer));
    }
    // The gradient flowing back is as wide as the widest layer.
    return InitBuffers(widest);
  }

 private:
  // Layer l's parameters are weights(l); its shape and output are here.
  struct Layer {
    int64_t in = 0;
    int64_t out = 0;
    Buffer act;  // this layer's output for the current batch (after ReLU, except the last)
  };

  // Returns the logits, in layers_.back().act.
  Result<const float*> Forward(const float* x, int64_t batch) override {
    for (size_t l = 0; l < layers_.size(); ++l) {
      Layer& layer = layers_[l];
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx(), Transpose::kNo, Transpose::kNo, batch, layer.out,
                                          layer.in, 1.f, x, Weight(l), 0.f, layer.act.data()));
      LEASH_RETURN_IF_ERROR(kernels::BiasAdd(ctx(), batch, layer.out, Bias(l), layer.act.data()));
      if (l + 1 < layers_.size()) {
        LEASH_RETURN_IF_ERROR(
            kernels::Relu(ctx(), batch * layer.out, layer.act.data(), layer.act.data()));
      }
      x = layer.act.data();
    }
    return x;
  }

  Status Backward(const float* input, int64_t batch, Buffer* dz, Buffer* dnext,
                  const std::function<void(size_t)>& on_grad) override {
    for (size_t l = layers_.size(); l-- > 0;) {
      Layer& layer = layers_[l];
      const float* x = l == 0 ? input : layers_[l - 1].act.data();
      // dW = x^T dz (in x out), db = column sums of dz.
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx(), Transpose::kYes, Transpose::kNo, layer.in,
                                          layer.out, batch, 1.f, x, dz->data(), 0.f,
                                          WeightGradOut(l)));
      LEASH_RETURN_IF_ERROR(kernels::BiasGrad(ctx(), batch, layer.out, dz->data(), BiasGradOut(l)));
      GradientsReady(l, on_grad);
      if (l == 0) break;  // nobody needs the gradient of the input
      // dx = dz W^T (batch x in), then through the ReLU that produced x.
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx(), Transpose::kNo, Transpose::kYes, batch, layer.in,
                                          layer.out, 1.f, dz->data(), Weight(l), 0.f,
                                          dnext->data()));
      LEASH_RETURN_IF_ERROR(
          kernels::ReluBackward(ctx(), batch * layer.in, x, dnext->data(), dnext->data()));
      std::swap(dz, dnext);
    }
    return Status::Ok();
  }

  std::vector<Layer> layers_;
};

}  // namespace

Result<std::unique_ptr<Model>> MakeMlp(kernels::Context& ctx, int64_t input_size,
                                       std::vector<int64_t> hidden, int64_t num_classes,
                                       int64_t max_batch) {
  if (hidden.empty()) {
    return InvalidArgument("MakeMlp: needs at least one hidden layer size, e.g. {128}");
  }
  std::vector<int64_t> widths;
  widths.push_back(input_size);
  widths.insert(widths.end(), hidden.begin(), hidden.end());
  widths.push_back(num_classes);
  for (size_t i = 0; i < widths.size(); ++i) {
    const std::string what = i == 0                   ? "input_size"
                             : i + 1 == widths.size() ? "num_classes"
                                                      : "hidden[" + std::to_string(i - 1) + "]";
    if (widths[i] <= 0 || widths[i] > kMaxDim) {
      return InvalidArgument("MakeMlp: " + what + " must be in [1, " + std::to_string(kMaxDim) +
                             "], got " + std::to_string(widths[i]));
    }
  }
  if (max_batch <= 0 || max_batch > kMaxDim) {
    return InvalidArgument("MakeMlp: max_batch must be in [1, " + std::to_string(kMaxDim) +
                           "], got " + std::to_string(max_batch));
  }
  auto mlp = std::make_unique<Mlp>(ctx, input_size, num_classes, max_batch);
  LEASH_RETURN_IF_ERROR(mlp->Init(widths));
  return std::unique_ptr<Model>(std::move(mlp));
}

}  // namespace leash::worker
