// Shared by the built-in models (through kernel_model.h): validates a host batch and
// stages it where the model's kernels read it (the caller's arrays on the CPU, copies in
// buffers allocated once on a GPU, made while the previous step computes when the batch
// was staged ahead), and checks parameter indices. One thread at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
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
  // with labels in [0, num_classes); unless `ctx` is the CPU, allocates two device slots
  // (one the step in progress reads, one the next batch is copied into), two pinned host
  // slots the copies start from, and a copy stream.
  Status Init(kernels::Context& ctx, int64_t max_batch, int64_t input_size, int64_t num_classes) {
    ctx_ = &ctx;
    max_batch_ = max_batch;
    input_size_ = input_size;
    num_classes_ = num_classes;
    if (ctx.device().type == kernels::DeviceType::kCpu) return Status::Ok();
    LEASH_ASSIGN_OR_RETURN(copies_, kernels::CopyStream::Create(ctx));
    for (Slot& slot : slots_) {
      LEASH_ASSIGN_OR_RETURN(
          slot.input, kernels::Buffer::Allocate(ctx, static_cast<size_t>(max_batch * input_size)));
      LEASH_ASSIGN_OR_RETURN(slot.labels,
                             kernels::Int32Buffer::Allocate(ctx, static_cast<size_t>(max_batch)));
      LEASH_ASSIGN_OR_RETURN(slot.pinned,
                             kernels::PinnedHostBuffer::Allocate(ctx, PinnedBytes(max_batch)));
    }
    return Status::Ok();
  }

  // Starts staging the batch the next Stage call will ask for, so that its copy to the
  // device overlaps the step in progress (on CUDA: into the slot the step is not reading,
  // from pinned memory, on the copy stream). Validates like Stage. The arrays are read
  // now; the Stage call with the same arrays and size then takes the staged copy.
  Status StageAhead(const char* op, const float* images_host, const int32_t* labels_host,
                    int64_t batch) {
    ahead_.reset();
    LEASH_RETURN_IF_ERROR(Check(op, images_host, labels_host, batch));
    Ahead a{images_host, labels_host, batch, 1 - current_};
    if (ctx_->device().type != kernels::DeviceType::kCpu) {
      Slot& slot = slots_[a.slot];
      // The slot's pinned memory may still be the source of the copy queued last time.
      LEASH_RETURN_IF_ERROR(copies_->Synchronize());
      auto* pinned = static_cast<char*>(slot.pinned.data());
      const size_t image_bytes = static_cast<size_t>(batch * input_size_) * sizeof(float);
      const size_t label_bytes = static_cast<size_t>(batch) * sizeof(int32_t);
      std::memcpy(pinned, images_host, image_bytes);
      std::memcpy(pinned + PinnedImageBytes(), labels_host, label_bytes);
      // Never overwrite the slot while a queued step may still read it.
      LEASH_RETURN_IF_ERROR(copies_->CopiesWaitForContext());
      LEASH_RETURN_IF_ERROR(copies_->CopyToDevice(slot.input.data(), pinned, image_bytes));
      LEASH_RETURN_IF_ERROR(
          copies_->CopyToDevice(slot.labels.data(), pinned + PinnedImageBytes(), label_bytes));
    }
    ahead_ = a;
    ++staged_ahead_;
    return Status::Ok();
  }

  // The batch where the model's kernels read it: the StageAhead copy when it was of these
  // arrays and size (the computation queued next waits for that copy on the device, the
  // host does not), otherwise a copy made now. InvalidArgument naming `op` for a batch
  // size outside [1, max_batch], null arrays or a label out of range.
  Result<Staged> Stage(const char* op, const float* images_host, const int32_t* labels_host,
                       int64_t batch) {
    if (ahead_ && ahead_->images == images_host && ahead_->labels == labels_host &&
        ahead_->batch == batch) {
      const Ahead a = *ahead_;
      ahead_.reset();
      ++used_ahead_;
      if (ctx_->device().type == kernels::DeviceType::kCpu) return Staged{images_host, labels_host};
      LEASH_RETURN_IF_ERROR(copies_->ContextWaitsForCopies());
      current_ = a.slot;
      return Staged{slots_[current_].input.data(), slots_[current_].labels.data()};
    }
    LEASH_RETURN_IF_ERROR(Check(op, images_host, labels_host, batch));
    const bool discarded = ahead_.has_value();
    ahead_.reset();
    if (ctx_->device().type == kernels::DeviceType::kCpu) return Staged{images_host, labels_host};
    // A copy started for another batch may still be writing its slot: let it finish, then
    // copy on the context's own stream, ordered after the work queued there.
    if (discarded) LEASH_RETURN_IF_ERROR(copies_->Synchronize());
    Slot& slot = slots_[current_];
    LEASH_RETURN_IF_ERROR(
        slot.input.CopyFromHost(*ctx_, images_host, static_cast<size_t>(batch * input_size_)));
    LEASH_RETURN_IF_ERROR(slot.labels.CopyFromHost(*ctx_, labels_host, static_cast<size_t>(batch)));
    return Staged{slot.input.data(), slot.labels.data()};
  }

  // Batches staged ahead, and how many of them a Stage call took (tests and metrics).
  int64_t staged_ahead() const { return staged_ahead_; }
  int64_t used_ahead() const { return used_ahead_; }

  // Mean loss and correct predictions over `n` examples, staged and evaluated in chunks of
  // max_batch. `forward(x, rows)` runs the model and returns its logits (rows x classes).
  template <typename Forward>
  Result<StepStats> Evaluate(const float* images_host, const int32_t* labels_host, int64_t n,
                             Forward forward) {
    if (n <= 0) return InvalidArgument("Evaluate: needs n > 0 examples, got " + std::to_string(n));
    double loss_sum = 0.0;
    int64_t correct = 0;
    for (int64_t start = 0; start < n; start += max_batch_) {
      const int64_t rows = std::min(max_batch_, n - start);
      LEASH_ASSIGN_OR_RETURN(
          Staged in,
          Stage("Evaluate", images_host == nullptr ? nullptr : images_host + start * input_size_,
                labels_host == nullptr ? nullptr : labels_host + start, rows));
      LEASH_ASSIGN_OR_RETURN(const float* logits, forward(in.x, rows));
      float loss = 0.f;
      int64_t right = 0;
      LEASH_RETURN_IF_ERROR(kernels::SoftmaxCrossEntropy(*ctx_, rows, num_classes_, logits,
                                                         in.labels, nullptr, &loss, &right));
      loss_sum += static_cast<double>(loss) * static_cast<double>(rows);
      correct += right;
    }
    return StepStats{static_cast<float>(loss_sum / static_cast<double>(n)), correct};
  }

 private:
  struct Slot {
    kernels::Buffer input;
    kernels::Int32Buffer labels;
    kernels::PinnedHostBuffer pinned;  // images, then labels at PinnedImageBytes()
  };
  struct Ahead {
    const float* images = nullptr;
    const int32_t* labels = nullptr;
    int64_t batch = 0;
    int slot = 0;
  };

  Status Check(const char* op, const float* images_host, const int32_t* labels_host,
               int64_t batch) const {
    if (batch <= 0 || batch > max_batch_) {
      return InvalidArgument(std::string(op) + ": batch of " + std::to_string(batch) +
                             " examples; it must be in [1, " + std::to_string(max_batch_) +
                             "] (the model's max_batch)");
    }
    if (images_host == nullptr || labels_host == nullptr) {
      return InvalidArgument(std::string(op) + ": " +
                             (images_host == nullptr ? "images" : "labels") + " are null");
    }
    for (int64_t i = 0; i < batch; ++i) {
      if (labels_host[i] < 0 || labels_host[i] >= num_classes_) {
        return InvalidArgument(std::string(op) + ": label " + std::to_string(labels_host[i]) +
                               " of example " + std::to_string(i) + " is outside [0, " +
                               std::to_string(num_classes_) + ")");
      }
    }
    return Status::Ok();
  }
  size_t PinnedImageBytes() const {
    return static_cast<size_t>(max_batch_ * input_size_) * sizeof(float);
  }
  size_t PinnedBytes(int64_t max_batch) const {
    return static_cast<size_t>(max_batch * input_size_) * sizeof(float) +
           static_cast<size_t>(max_batch) * sizeof(int32_t);
  }

  kernels::Context* ctx_ = nullptr;
  int64_t max_batch_ = 0;
  int64_t input_size_ = 0;
  int64_t num_classes_ = 0;
  std::unique_ptr<kernels::CopyStream> copies_;  // null on the CPU
  Slot slots_[2];
  int current_ = 0;  // the slot the step in progress reads
  std::optional<Ahead> ahead_;
  int64_t staged_ahead_ = 0;
  int64_t used_ahead_ = 0;
};

}  // namespace leash::worker
