// Shared by the built-in models: validates a host batch and stages it where the model's
// kernels read it (the caller's arrays on the CPU, copies in buffers allocated once on a
// GPU), and checks parameter indices. One thread at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "leash/common/status.h"
#include "leash/kernels/kernels.h"
#include "leash/worker/model.h"

namespace leash::worker {

// InvalidArgument naming `op` unless index < count.
inline Status CheckParamIndex(const char* op, size_t index, size_t count) {
  if (index >= count) {
    return InvalidArgument(std::string(op) + ": parameter index " + std::to_string(index) +
                           " is out of range; the model has " + std::to_string(count));
  }
  return Status::Ok();
}

class BatchStager {
 public:
  struct Staged {
    const float* x = nullptr;
    const int32_t* labels = nullptr;
  };

  // Prepares staging for batches of up to `max_batch` examples of `input_size` features
  // with labels in [0, num_classes); allocates device buffers unless `ctx` is the CPU.
  Status Init(kernels::Context& ctx, int64_t max_batch, int64_t input_size, int64_t num_classes) {
    ctx_ = &ctx;
    max_batch_ = max_batch;
    input_size_ = input_size;
    num_classes_ = num_classes;
    if (ctx.device().type == kernels::DeviceType::kCpu) return Status::Ok();
    LEASH_ASSIGN_OR_RETURN(input_, kernels::Buffer::Allocate(ctx, static_cast<size_t>(max_batch * input_size)));
    LEASH_ASSIGN_OR_RETURN(labels_, kernels::Int32Buffer::Allocate(ctx, static_cast<size_t>(max_batch)));
    return Status::Ok();
  }

  // InvalidArgument naming `op` for a batch size outside [1, max_batch], null arrays or a
  // label out of range.
  Result<Staged> Stage(const char* op, const float* images_host, const int32_t* labels_host, int64_t batch) {
    if (batch <= 0 || batch > max_batch_) {
      return InvalidArgument(std::string(op) + ": batch of " + std::to_string(batch) + " examples; it must be in [1, " +
                             std::to_string(max_batch_) + "] (the model's max_batch)");
    }
    if (images_host == nullptr || labels_host == nullptr) {
      return InvalidArgument(std::string(op) + ": " + (images_host == nullptr ? "images" : "labels") + " are null");
    }
    for (int64_t i = 0; i < batch; ++i) {
      if (labels_host[i] < 0 || labels_host[i] >= num_classes_) {
        return InvalidArgument(std::string(op) + ": label " + std::to_string(labels_host[i]) + " of example " +
                               std::to_string(i) + " is outside [0, " + std::to_string(num_classes_) + ")");
      }
    }
    if (ctx_->device().type == kernels::DeviceType::kCpu) return Staged{images_host, labels_host};
    LEASH_RETURN_IF_ERROR(input_.CopyFromHost(*ctx_, images_host, static_cast<size_t>(batch * input_size_)));
    LEASH_RETURN_IF_ERROR(labels_.CopyFromHost(*ctx_, labels_host, static_cast<size_t>(batch)));
    return Staged{input_.data(), labels_.data()};
  }

  // Mean loss and correct predictions over `n` examples, staged and evaluated in chunks of
  // max_batch. `forward(x, rows)` runs the model and returns its logits (rows x classes).
  template <typename Forward>
  Result<StepStats> Evaluate(const float* images_host, const int32_t* labels_host, int64_t n, Forward forward) {
    if (n <= 0) return InvalidArgument("Evaluate: needs n > 0 examples, got " + std::to_string(n));
    double loss_sum = 0.0;
    int64_t correct = 0;
    for (int64_t start = 0; start < n; start += max_batch_) {
      const int64_t rows = std::min(max_batch_, n - start);
      LEASH_ASSIGN_OR_RETURN(Staged in, Stage("Evaluate", images_host == nullptr ? nullptr : images_host + start * input_size_,
                                              labels_host == nullptr ? nullptr : labels_host + start, rows));
      LEASH_ASSIGN_OR_RETURN(const float* logits, forward(in.x, rows));
      float loss = 0.f;
      int64_t right = 0;
      LEASH_RETURN_IF_ERROR(
          kernels::SoftmaxCrossEntropy(*ctx_, rows, num_classes_, logits, in.labels, nullptr, &loss, &right));
      loss_sum += static_cast<double>(loss) * static_cast<double>(rows);
      correct += right;
    }
    return StepStats{static_cast<float>(loss_sum / static_cast<double>(n)), correct};
  }

 private:
  kernels::Context* ctx_ = nullptr;
  int64_t max_batch_ = 0;
  int64_t input_size_ = 0;
  int64_t num_classes_ = 0;
  kernels::Buffer input_;
  kernels::Int32Buffer labels_;
};

}  // namespace leash::worker
