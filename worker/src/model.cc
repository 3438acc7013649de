// The Model interface's default implementations of its optional zero-copy paths, for
// models that always copy. Stateless.
#include "leash/worker/model.h"

#include "batch_stager.h"

namespace leash::worker {

Status Model::BindParam(size_t index, const float* host) {
  LEASH_RETURN_IF_ERROR(CheckParamIndex("BindParam", index, params().size()));
  if (host == nullptr)
    return InvalidArgument("BindParam: host data for " + params()[index].name + " is null");
  return FailedPrecondition("BindParam: this model always copies its parameters; use SetParam");
}

Result<const float*> Model::HostGradient(size_t index) {
  LEASH_RETURN_IF_ERROR(CheckParamIndex("HostGradient", index, params().size()));
  return static_cast<const float*>(nullptr);
}

Status Model::BindGradient(size_t index, float* host) {
  LEASH_RETURN_IF_ERROR(CheckParamIndex("BindGradient", index, params().size()));
  if (host == nullptr)
    return InvalidArgument("BindGradient: the array for " + params()[index].name + " is null");
  return FailedPrecondition(
      "BindGradient: this model writes its gradients into its own buffers; use Gradient");
}

Result<std::span<const uint64_t>> Model::SparseKeys(const uint64_t*, int64_t, int64_t) {
  return FailedPrecondition("SparseKeys: this model has no embeddings (no sparse table)");
}

Status Model::SetSparseRows(const float*) {
  return FailedPrecondition("SetSparseRows: this model has no embeddings (no sparse table)");
}

Result<const float*> Model::SparseGradient() {
  return FailedPrecondition("SparseGradient: this model has no embeddings (no sparse table)");
}

}  // namespace leash::worker
