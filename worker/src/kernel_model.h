// The half of the built-in models (mlp.cc, cnn.cc) that is not their own: parameters kept
// as (weight, bias) pairs with their gradients, batch staging, parameters bound in place,
// and the Model methods built on those alone (SetParam, BindParam, TrainStep up to the
// loss, PrefetchBatch, staging, Gradient, HostGradient, Evaluate). A model adds its
// layers, Forward and Backward. Private to worker/src. One thread at a time (like its
// kernels::Context).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "leash/common/status.h"
#include "leash/kernels/kernels.h"
#include "leash/worker/model.h"

#include "batch_stager.h"
#include "param_binding.h"

namespace leash::worker {

class KernelModel : public Model {
 public:
  const std::vector<ParamSpec>& params() const final { return params_; }
  int64_t input_size() const final { return input_size_; }
  int64_t num_classes() const final { return num_classes_; }
  Status SetParam(size_t index, const float* host) final;
  Status BindParam(size_t index, const float* host) final;
  // Stages the batch, runs Forward and the loss, then Backward.
  Result<StepStats> TrainStep(const float* images_host, const int32_t* labels_host, int64_t batch,
                              const std::function<void(size_t)>& on_grad) final;
  Status PrefetchBatch(const float* images_host, const int32_t* labels_host, int64_t batch) final;
  StagingStats staging() const final { return {stager_.staged_ahead(), stager_.used_ahead()}; }
  Status Gradient(size_t index, float* out_host) final;
  Result<const float*> HostGradient(size_t index) final;
  Status BindGradient(size_t index, float* host) final;
  Result<StepStats> Evaluate(const float* images_host, const int32_t* labels_host, int64_t n) final;

 protected:
  // A layer's parameters (2 layer: the weight, 2 layer + 1: the bias) and their gradients.
  struct Weights {
    kernels::Buffer w, b, dw, db;
  };

  // For batches of up to `max_batch` examples of `input_size` features and `num_classes`
  // classes.
  KernelModel(kernels::Context& ctx, int64_t input_size, int64_t num_classes, int64_t max_batch)
      : ctx_(ctx), input_size_(input_size), num_classes_(num_classes), max_batch_(max_batch) {}

  // Adds the parameters of layer weights_.size(): "<name>/w" (rows x cols, He-initialized
  // from `rng` for `fan_in` inputs per output) and "<name>/b" (1 x outputs, zeros), and
  // allocates their buffers and gradients.
  Status AddParams(const std::string& name, int64_t rows, int64_t cols, int64_t fan_in,
                   int64_t outputs, std::mt19937_64& rng);
  // Once every parameter is added: the two buffers the gradient flowing back ping-pongs
  // between, for `widest` floats per example; staging; no gradient final and no parameter
  // bound.
  Status InitBuffers(size_t widest);

  // Runs the layers on `rows` examples at `x` (where the kernels read them) and returns
  // the logits, rows x num_classes() on the device.
  virtual Result<const float*> Forward(const float* x, int64_t rows) = 0;

  // The backward pass of TrainStep after Forward(x, batch): `dz` holds the gradient of the
  // loss by the logits, `dnext` is as large and free; both may be overwritten. Calls
  // GradientsReady for each layer as its gradients become final.
  virtual Status Backward(const float* x, int64_t batch, kernels::Buffer* dz,
                          kernels::Buffer* dnext, const std::function<void(size_t)>& on_grad) = 0;

  // The gradients of layer `layer` are final: marks them so and announces them, bias first.
  void GradientsReady(size_t layer, const std::function<void(size_t)>& on_grad);

  kernels::Context& ctx() { return ctx_; }
  int64_t max_batch() const { return max_batch_; }
  Weights& weights(size_t layer) { return weights_[layer]; }
  // Where the kernels read layer `layer`'s weight and bias: a bound host array or the own
  // buffer.
  const float* Weight(size_t layer) const { return bindings_.Read(2 * layer, weights_[layer].w); }
  const float* Bias(size_t layer) const { return bindings_.Read(2 * layer + 1, weights_[layer].b); }
  // Where Backward writes layer `layer`'s weight and bias gradients in the step under way:
  // an array bound for it (BindGradient), else the own buffer.
  float* WeightGradOut(size_t layer) { return GradOut(2 * layer); }
  float* BiasGradOut(size_t layer) { return GradOut(2 * layer + 1); }

 private:
  kernels::Buffer& Value(size_t index) {
    return index % 2 == 0 ? weights_[index / 2].w : weights_[index / 2].b;
  }
  kernels::Buffer& Grad(size_t index) {
    return index % 2 == 0 ? weights_[index / 2].dw : weights_[index / 2].db;
  }
  float* GradOut(size_t index) {
    return grad_at_[index] != nullptr ? grad_at_[index] : Grad(index).data();
  }

  kernels::Context& ctx_;
  const int64_t input_size_;
  const int64_t num_classes_;
  const int64_t max_batch_;
  std::vector<ParamSpec> params_;
  std::vector<Weights> weights_;  // parameters 2 i and 2 i + 1
  kernels::Buffer delta_[2];
  BatchStager stager_;
  std::vector<bool> grad_ready_;
  ParamBindings bindings_;
  // BindGradient's arrays: for the next step, and where the step under way (or the last)
  // writes each gradient (nullptr: the own buffer).
  std::vector<float*> grad_bound_, grad_at_;
};

}  // namespace leash::worker
