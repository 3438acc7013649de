// Shared by the built-in models (through kernel_model.h): which parameters a model reads
// from caller-owned host arrays (Model::BindParam) instead of its own buffers. Possible
// only where the model's kernels run on the CPU, whose buffers are host memory. One thread
// at a time, like the model.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "leash/common/status.h"
#include "leash/kernels/kernels.h"
#include "leash/worker/model.h"

#include "batch_stager.h"

namespace leash::worker {

class ParamBindings {
 public:
  // For a model with `count` parameters, all read from the model's own buffers.
  void Init(size_t count) { bound_.assign(count, nullptr); }

  // Model::BindParam: records `host` as where parameter `index` is read from.
  // InvalidArgument for a bad index or null `host`; FailedPrecondition unless `ctx` is
  // the CPU (a GPU kernel cannot read pageable host memory).
  Status Bind(const kernels::Context& ctx, const std::vector<ParamSpec>& params, size_t index,
              const float* host) {
    LEASH_RETURN_IF_ERROR(CheckParamIndex("BindParam", index, params.size()));
    if (host == nullptr)
      return InvalidArgument("BindParam: host data for " + params[index].name + " is null");
    if (ctx.device().type != kernels::DeviceType::kCpu) {
      return FailedPrecondition("BindParam: the model computes on " +
                                kernels::DeviceName(ctx.device()) + ", which cannot read " +
                                params[index].name + " from host memory; use SetParam");
    }
    bound_[index] = host;
    return Status::Ok();
  }

  // Parameter `index` is read from the model's own buffer again (after a SetParam).
  // `index` must be valid.
  void Unbind(size_t index) { bound_[index] = nullptr; }

  // Where the kernels read parameter `index`: the bound host array, else `own`.
  const float* Read(size_t index, const kernels::Buffer& own) const {
    return bound_[index] != nullptr ? bound_[index] : own.data();
  }

 private:
  std::vector<const float*> bound_;  // nullptr: the model's own buffer
};

}  // namespace leash::worker
