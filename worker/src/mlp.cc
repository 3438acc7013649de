// The multilayer perceptron model: dense layers y = x W + b with ReLU between them and
// softmax cross-entropy on top, all math through the kernels.h entry points so the same
// code runs on the CPU and on CUDA. Every buffer is allocated once, for max_batch rows.
// On the CPU the weights and biases may instead be read from caller-owned host arrays
// (BindParam), and gradients are handed out in place (HostGradient).
// One thread at a time (like its kernels::Context).
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

// The products go through 32-bit BLAS interfaces; keep every dimension well inside.
constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
// Fixed so that a standalone model is reproducible; a worker overwrites the values with
// the tables it pulls from the servers.
constexpr uint64_t kInitSeed = 0x1ea5'0001;

class Mlp final : public Model {
 public:
  Mlp(Context& ctx, int64_t input_size, int64_t num_classes, int64_t max_batch)
      : ctx_(ctx), input_size_(input_size), num_classes_(num_classes), max_batch_(max_batch) {}

  // Allocates every buffer for `widths` = input, hidden..., classes and He-initializes W.
  Status Init(const std::vector<int64_t>& widths) {
    std::mt19937_64 rng(kInitSeed);
    int64_t widest = 0;
    for (size_t l = 0; l + 1 < widths.size(); ++l) {
      Layer layer;
      layer.in = widths[l];
      layer.out = widths[l + 1];
      widest = std::max(widest, layer.out);
      const std::string name = "mlp/fc" + std::to_string(l + 1);
      const float stddev = std::sqrt(2.f / static_cast<float>(layer.in));
      params_.push_back(ParamSpec{name + "/w", static_cast<uint64_t>(layer.in), static_cast<uint32_t>(layer.out),
                                  InitKind::kNormal, stddev});
      params_.push_back(ParamSpec{name + "/b", 1, static_cast<uint32_t>(layer.out), InitKind::kZeros, 0.f});
      const auto in = static_cast<size_t>(layer.in), out = static_cast<size_t>(layer.out);
      LEASH_ASSIGN_OR_RETURN(layer.w, Buffer::Allocate(ctx_, in * out));
      LEASH_ASSIGN_OR_RETURN(layer.b, Buffer::Allocate(ctx_, out));
      LEASH_ASSIGN_OR_RETURN(layer.dw, Buffer::Allocate(ctx_, in * out));
      LEASH_ASSIGN_OR_RETURN(layer.db, Buffer::Allocate(ctx_, out));
      LEASH_ASSIGN_OR_RETURN(layer.act, Buffer::Allocate(ctx_, static_cast<size_t>(max_batch_) * out));
      std::normal_distribution<float> normal(0.f, stddev);
      std::vector<float> w(in * out);
      for (float& v : w) v = normal(rng);
      LEASH_RETURN_IF_ERROR(layer.w.CopyFromHost(ctx_, w.data(), w.size()));
      layers_.push_back(std::move(layer));
    }
    // The gradient flowing back ping-pongs between two buffers as wide as the widest layer.
    for (Buffer& d : delta_) {
      LEASH_ASSIGN_OR_RETURN(d, Buffer::Allocate(ctx_, static_cast<size_t>(max_batch_) * widest));
    }
    LEASH_RETURN_IF_ERROR(stager_.Init(ctx_, max_batch_, input_size_, num_classes_));
    grad_ready_.assign(params_.size(), false);
    bindings_.Init(params_.size());
    return Status::Ok();
  }

  const std::vector<ParamSpec>& params() const override { return params_; }
  int64_t input_size() const override { return input_size_; }
  int64_t num_classes() const override { return num_classes_; }

  Status SetParam(size_t index, const float* host) override {
    LEASH_RETURN_IF_ERROR(CheckParamIndex("SetParam", index, params_.size()));
    if (host == nullptr) return InvalidArgument("SetParam: host data for " + params_[index].name + " is null");
    LEASH_RETURN_IF_ERROR(Param(index).CopyFromHost(ctx_, host, params_[index].size()));
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
    LEASH_RETURN_IF_ERROR(kernels::SoftmaxCrossEntropy(ctx_, batch, num_classes_, layers_.back().act.data(),
                                                       in.labels, dz->data(), &stats.loss, &stats.correct));
    for (size_t l = layers_.size(); l-- > 0;) {
      Layer& layer = layers_[l];
      const float* x = l == 0 ? in.x : layers_[l - 1].act.data();
      // dW = x^T dz (in x out), db = column sums of dz.
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx_, Transpose::kYes, Transpose::kNo, layer.in, layer.out, batch, 1.f, x,
                                          dz->data(), 0.f, layer.dw.data()));
      LEASH_RETURN_IF_ERROR(kernels::BiasGrad(ctx_, batch, layer.out, dz->data(), layer.db.data()));
      grad_ready_[2 * l + 1] = true;
      grad_ready_[2 * l] = true;
      if (on_grad) {
        on_grad(2 * l + 1);
        on_grad(2 * l);
      }
      if (l == 0) break;  // nobody needs the gradient of the input
      // dx = dz W^T (batch x in), then through the ReLU that produced x.
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx_, Transpose::kNo, Transpose::kYes, batch, layer.in, layer.out, 1.f,
                                          dz->data(), Weight(l), 0.f, dnext->data()));
      LEASH_RETURN_IF_ERROR(kernels::ReluBackward(ctx_, batch * layer.in, x, dnext->data(), dnext->data()));
      std::swap(dz, dnext);
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
      return static_cast<const float*>(layers_.back().act.data());
    });
  }

 private:
  struct Layer {
    int64_t in = 0;
    int64_t out = 0;
    Buffer w, b, dw, db;
    Buffer act;  // this layer's output for the current batch (after ReLU, except the last)
  };
  Buffer& Param(size_t index) { return index % 2 == 0 ? layers_[index / 2].w : layers_[index / 2].b; }
  Buffer& Grad(size_t index) { return index % 2 == 0 ? layers_[index / 2].dw : layers_[index / 2].db; }
  // Where the kernels read layer l's weights and bias: a bound host array or the own buffer.
  const float* Weight(size_t l) const { return bindings_.Read(2 * l, layers_[l].w); }
  const float* Bias(size_t l) const { return bindings_.Read(2 * l + 1, layers_[l].b); }

  // Leaves the logits in layers_.back().act.
  Status Forward(const float* x, int64_t batch) {
    for (size_t l = 0; l < layers_.size(); ++l) {
      Layer& layer = layers_[l];
      LEASH_RETURN_IF_ERROR(kernels::Gemm(ctx_, Transpose::kNo, Transpose::kNo, batch, layer.out, layer.in, 1.f, x,
                                          Weight(l), 0.f, layer.act.data()));
      LEASH_RETURN_IF_ERROR(kernels::BiasAdd(ctx_, batch, layer.out, Bias(l), layer.act.data()));
      if (l + 1 < layers_.size()) {
        LEASH_RETURN_IF_ERROR(kernels::Relu(ctx_, batch * layer.out, layer.act.data(), layer.act.data()));
      }
      x = layer.act.data();
    }
    return Status::Ok();
  }

  Context& ctx_;
  const int64_t input_size_;
  const int64_t num_classes_;
  const int64_t max_batch_;
  std::vector<ParamSpec> params_;
  std::vector<Layer> layers_;
  Buffer delta_[2];
  BatchStager stager_;
  std::vector<bool> grad_ready_;
  ParamBindings bindings_;
};

}  // namespace

Result<std::unique_ptr<Model>> MakeMlp(kernels::Context& ctx, int64_t input_size, std::vector<int64_t> hidden,
                                       int64_t num_classes, int64_t max_batch) {
  if (hidden.empty()) {
    return InvalidArgument("MakeMlp: needs at least one hidden layer size, e.g. {128}");
  }
  std::vector<int64_t> widths;
  widths.push_back(input_size);
  widths.insert(widths.end(), hidden.begin(), hidden.end());
  widths.push_back(num_classes);
  for (size_t i = 0; i < widths.size(); ++i) {
    const std::string what = i == 0 ? "input_size" : i + 1 == widths.size() ? "num_classes"
                                                                              : "hidden[" + std::to_string(i - 1) + "]";
    if (widths[i] <= 0 || widths[i] > kMaxDim) {
      return InvalidArgument("MakeMlp: " + what + " must be in [1, " + std::to_string(kMaxDim) + "], got " +
                             std::to_string(widths[i]));
    }
  }
  if (max_batch <= 0 || max_batch > kMaxDim) {
    return InvalidArgument("MakeMlp: max_batch must be in [1, " + std::to_string(kMaxDim) + "], got " +
                           std::to_string(max_batch));
  }
  auto mlp = std::make_unique<Mlp>(ctx, input_size, num_classes, max_batch);
  LEASH_RETURN_IF_ERROR(mlp->Init(widths));
  return std::unique_ptr<Model>(std::move(mlp));
}

}  // namespace leash::worker
