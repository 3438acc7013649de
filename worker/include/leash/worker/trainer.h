// The worker's training loop: batches from the prefetching loader, parameters pulled
// under the staleness bound, gradients pushed as backward produces them, a clock per
// iteration, progress lines, and test accuracy after every epoch. One thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "leash/common/status.h"
#include "leash/worker/dataset.h"
#include "leash/worker/model.h"
#include "leash/worker/params.h"

namespace leash::worker {

struct TrainOptions {
  int64_t epochs = 3;
  int64_t batch = 64;
  int64_t worker_index = 0;   // this worker trains samples i with i % num_workers == worker_index
  int64_t num_workers = 1;
  uint64_t seed = 1;
  int64_t log_every = 100;    // steps between progress lines (0: none)
  bool evaluate = true;       // test accuracy after every epoch
  std::string label;          // prefix of progress lines, e.g. "worker 0"
};

struct EpochResult {
  int64_t epoch = 0;
  int64_t steps = 0;
  int64_t samples = 0;
  double train_loss = 0;
  double train_accuracy = 0;
  double test_loss = 0;
  double test_accuracy = -1;   // -1 when not evaluated
  double train_seconds = 0;    // training steps only, without evaluation
  double samples_per_second = 0;
  double elapsed_seconds = 0;  // since training started, at the end of this epoch
};

// Trains `model` for options.epochs epochs. Stops early, after finishing the step in
// progress, when *stop becomes true (results so far are returned).
Result<std::vector<EpochResult>> Train(Model& model, ParamStore& params, const Dataset& train, const Dataset* test,
                                       const TrainOptions& options, const std::atomic<bool>* stop);

// Writes results as JSON (one object with an "epochs" array) to `path`.
Status WriteResultsJson(const std::string& path, const std::string& mode, const TrainOptions& options,
                        const std::vector<EpochResult>& results);

}  // namespace leash::worker
