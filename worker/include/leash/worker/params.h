// Where a worker's parameters live: in a Leash cluster (RemoteParams, through
// leash::Client) or in this process (LocalParams, the same tables and server-side
// optimizers with no server at all, the baseline the cluster is measured against).
// One training thread at a time.
#pragma once

#include <future>
#include <memory>
#include <vector>

#include "leash/common/status.h"
#include "leash/worker/client.h"
#include "leash/worker/model.h"

namespace leash::worker {

struct OptimizerOptions {
  wire::OptimizerKind kind = wire::OptimizerKind::SGD;
  float learning_rate = 0.01f;
  float momentum = 0.9f;
  float weight_decay = 0.f;
  uint64_t seed = 1;  // parameter initialization seed
};

// Table options for `p` trained with `opt` (initializer from the model's spec).
TableOptions MakeTableOptions(const ParamSpec& p, const OptimizerOptions& opt, size_t index);

class ParamStore {
 public:
  virtual ~ParamStore() = default;
  // Creates (or finds) one table per parameter.
  virtual Status Setup(const std::vector<ParamSpec>& params, const OptimizerOptions& opt) = 0;
  // Fills values[i] with parameter i, as the staleness bound allows for this iteration.
  virtual Status PullAll(std::vector<std::vector<float>>* values) = 0;
  // Sends the gradient of parameter i (copied before returning).
  virtual void Push(size_t i, const float* grad) = 0;
  // Ends the iteration: every push of it is sent, then the clock advances. Returns the
  // first error of an earlier push.
  virtual Status EndIteration() = 0;
  // Leaves the job (remote) or does nothing (local).
  virtual Status Finish() = 0;
  virtual int64_t clock() const = 0;
};

std::unique_ptr<ParamStore> MakeRemoteParams(Client* client);
std::unique_ptr<ParamStore> MakeLocalParams();

}  // namespace leash::worker
