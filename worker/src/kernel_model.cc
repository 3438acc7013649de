// The half that the built-in models share (see kernel_model.h). One thread at a time.
#include "kernel_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace leash::worker {

Status KernelModel::AddParams(const std::string& name, int64_t rows, int64_t cols, int64_t fan_in,
                              int64_t outputs, std::mt19937_64& rng) {
  const float stddev = std::sqrt(2.f / static_cast<float>(fan_in));
  params_.push_back(ParamSpec{name + "/w", static_cast<uint64_t>(rows), static_cast<uint32_t>(cols),
                              InitKind::kNormal, stddev});
  params_.push_back(
      ParamSpec{name + "/b", 1, static_cast<uint32_t>(outputs), InitKind::kZeros, 0.f});
  const auto size = static_cast<size_t>(rows * cols);
  Weights p;
  LEASH_ASSIGN_OR_RETURN(p.w, kernels::Buffer::Allocate(ctx_, size));
  LEASH_ASSIGN_OR_RETURN(p.b, kernels::Buffer::Allocate(ctx_, static_cast<size_t>(outputs)));
  LEASH_ASSIGN_OR_RETURN(p.dw, kernels::Buffer::Allocate(ctx_, size));
  LEASH_ASSIGN_OR_RETURN(p.db, kernels::Buffer::Allocate(ctx_, static_cast<size_t>(outputs)));
  std::normal_distribution<float> normal(0.f, stddev);
  std::vector<float> w(size);
  for (float& v : w) v = normal(rng);
  LEASH_RETURN_IF_ERROR(p.w.CopyFromHost(ctx_, w.data(), w.size()));
  weights_.push_back(std::move(p));
  return Status::Ok();
}

Status KernelModel::InitBuffers(size_t widest) {
  for (kernels::Buffer& d : delta_) {
    LEASH_ASSIGN_OR_RETURN(
        d, kernels::Buffer::Allocate(ctx_, static_cast<size_t>(max_batch_) * widest));
  }
  LEASH_RETURN_IF_ERROR(stager_.Init(ctx_, max_batch_, input_size_, num_classes_));
  grad_ready_.assign(params_.size(), false);
  bindings_.Init(params_.size());
  grad_bound_.assign(params_.size(), nullptr);
  grad_at_.assign(params_.size(), nullptr);
  return Status::Ok();
}

Status KernelModel::SetParam(size_t index, const float* host) {
  LEASH_RETURN_IF_ERROR(CheckParamIndex("SetParam", index, params_.size()));
  if (host == nullptr) {
    return InvalidArgument("SetParam: host data for " + params_[index].name + " is null");
  }
  LEASH_RETURN_IF_ERROR(Value(index).CopyFromHost(ctx_, host, params_[index].size()));
  bindings_.Unbind(index);
  return Status::Ok();
}

Status KernelModel::BindParam(size_t index, const float* host) {
  return bindings_.Bind(ctx_, params_, index, host);
}

Result<StepStats> KernelModel::TrainStep(const float* images_host, const int32_t* labels_host,
                                         int64_t batch,
                                         const std::function<void(size_t)>& on_grad) {
  std::fill(grad_ready_.begin(), grad_ready_.end(), false);
  // This step writes into the arrays bound for it; the next one into the own buffers
  // unless bound again.
  grad_at_.swap(grad_bound_);
  std::fill(grad_bound_.begin(), grad_bound_.end(), nullptr);
  LEASH_ASSIGN_OR_RETURN(BatchStager::Staged in,
                         stager_.Stage("TrainStep", images_host, labels_host, batch));
  LEASH_ASSIGN_OR_RETURN(const float* logits, Forward(in.x, batch));
  StepStats stats;
  LEASH_RETURN_IF_ERROR(kernels::SoftmaxCrossEntropy(
      ctx_, batch, num_classes_, logits, in.labels, delta_[0].data(), &stats.loss, &stats.correct));
  LEASH_RETURN_IF_ERROR(Backward(in.x, batch, &delta_[0], &delta_[1], on_grad));
  return stats;
}

Status KernelModel::PrefetchBatch(const float* images_host, const int32_t* labels_host,
                                  int64_t batch) {
  return stager_.StageAhead("PrefetchBatch", images_host, labels_host, batch);
}

Status KernelModel::Gradient(size_t index, float* out_host) {
  LEASH_RETURN_IF_ERROR(CheckParamIndex("Gradient", index, params_.size()));
  if (out_host == nullptr) {
    return InvalidArgument("Gradient: output for " + params_[index].name + " is null");
  }
  if (!grad_ready_[index]) {
    return FailedPrecondition("Gradient: no gradient of " + params_[index].name +
                              " yet; call TrainStep first (and wait for its on_grad)");
  }
  if (grad_at_[index] != nullptr) {
    std::copy_n(grad_at_[index], params_[index].size(), out_host);
    return Status::Ok();
  }
  return Grad(index).CopyToHost(ctx_, out_host, params_[index].size());
}

Status KernelModel::BindGradient(size_t index, float* host) {
  LEASH_RETURN_IF_ERROR(CheckParamIndex("BindGradient", index, params_.size()));
  if (host == nullptr)
    return InvalidArgument("BindGradient: the array for " + params_[index].name + " is null");
  if (ctx_.device().type != kernels::DeviceType::kCpu) {
    return FailedPrecondition("BindGradient: the model computes on " +
                              kernels::DeviceName(ctx_.device()) + ", which cannot write " +
                              params_[index].name + "'s gradient to host memory; use Gradient");
  }
  grad_bound_[index] = host;
  return Status::Ok();
}

Result<const float*> KernelModel::HostGradient(size_t index) {
  LEASH_RETURN_IF_ERROR(CheckParamIndex("HostGradient", index, params_.size()));
  if (!grad_ready_[index]) {
    return FailedPrecondition("HostGradient: no gradient of " + params_[index].name +
                              " yet; call TrainStep first (and wait for its on_grad)");
  }
  if (grad_at_[index] != nullptr) return static_cast<const float*>(grad_at_[index]);
  // Only the CPU's buffers are host memory.
  if (ctx_.device().type != kernels::DeviceType::kCpu) {
    return static_cast<const float*>(nullptr);
  }
  return static_cast<const float*>(Grad(index).data());
}

Result<StepStats> KernelModel::Evaluate(const float* images_host, const int32_t* labels_host,
                                        int64_t n) {
  return stager_.Evaluate(images_host, labels_host, n,
                          [&](const float* x, int64_t rows) { return Forward(x, rows); });
}

void KernelModel::GradientsReady(size_t layer, const std::function<void(size_t)>& on_grad) {
  grad_ready_[2 * layer + 1] = true;
  grad_ready_[2 * layer] = true;
  if (on_grad) {
    on_grad(2 * layer + 1);
    on_grad(2 * layer);
  }
}

}  // namespace leash::worker
