// The worker's training loop: data chunks leased from the job (shard 0), batches from the
// prefetching loader, parameters pulled under the staleness bound, gradients pushed as
// backward produces them, a clock per iteration, progress lines, and the test accuracy
// each time the job completes an epoch (and, with eval_every, every N iterations of this
// worker). Rejoins the job if a shard forgot this worker.
// One thread; the observers in TrainOptions are called on it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "leash/common/status.h"
#include "leash/worker/dataset.h"
#include "leash/worker/model.h"
#include "leash/worker/params.h"
#include "leash/worker/slow_spells.h"

namespace leash::worker {

struct EpochResult;

// One training iteration as the loop saw it, for progress observers (metrics).
struct StepReport {
  uint32_t epoch = 0;          // the job epoch of the chunk being trained, 0-based
  int64_t step = 0;            // iterations this worker trained so far, this one included
  int64_t clock = 0;           // this worker's clock after the iteration
  int64_t samples = 0;         // samples of the iteration (all its micro-batches)
  double loss = 0;             // their mean training loss
  double seconds = 0;          // wall time of the iteration: pull, compute, push, clock
  double elapsed_seconds = 0;  // since training started, at the end of the iteration
  int64_t rejoins = 0;         // times this worker rejoined the job so far
};

struct TrainOptions {
  int64_t epochs = 3;  // of the job, not of this worker
  int64_t batch = 64;
  int64_t accumulate = 1;     // micro-batches per iteration (one pull, one push, one clock)
  int64_t chunk_size = 1024;  // samples per data-chunk lease
  uint64_t seed = 1;
  int64_t log_every = 100;  // steps between progress lines (0: none)
  bool evaluate = true;     // test accuracy after every epoch
  // Periodic evaluation (for time-to-accuracy curves finer than an epoch): after every
  // eval_every-th iteration of this worker, between iterations, pull the parameters and
  // evaluate them on the test set (TrainResult::evaluations). Independent of `evaluate`;
  // needs a test set. 0 (the default): never. Negative: InvalidArgument.
  int64_t eval_every = 0;
  // Straggler injection (benchmarks): after each iteration's forward/backward, sleep
  // (factor - 1) x the time they took, so the worker computes `factor` times slower.
  // 1 (the default) injects nothing.
  double step_delay_factor = 1.0;
  // Transient straggler injection (benchmarks): in this worker's spells (SlowSpells, by the
  // wall clock) its delay factor is multiplied by slow_spells.factor. Off by default.
  SlowSpells slow_spells;
  // Work in proportion to speed: > 0 is the job's global batch per clock. The worker
  // measures its own speed (StepRate), reports it with its clocks, and trains its share
  // of this many samples per iteration (speed over the live workers' summed speeds); its
  // pushes carry their sample count so the shards weight them to the global batch's mean.
  // `batch` is the batch until the speeds are known. Needs accumulate 1. 0: off.
  int64_t global_batch = 0;
  // With global_batch: the pushes ask for clock steps (PushRequest::clock_step), one
  // optimizer step per iteration on the sum of the workers' weighted pushes to a dense table.
  bool clock_steps = false;
  std::string label;  // prefix of progress lines, e.g. "worker 0"
  // Called on the training thread after every iteration and every completed job epoch
  // (leash-worker publishes its metrics there). Optional; must not block for long.
  std::function<void(const StepReport&)> on_step;
  std::function<void(const EpochResult&)> on_epoch;
};

// One epoch of the job as this worker saw it: the samples it trained of that epoch and
// the test accuracy of the model when the job completed the epoch.
struct EpochResult {
  int64_t epoch = 0;
  int64_t steps = 0;  // steps this worker trained on the epoch's data
  int64_t samples = 0;
  double train_loss = 0;
  double train_accuracy = 0;
  double test_loss = 0;
  double test_accuracy = -1;  // -1 when not evaluated
  double test_auc = -1;       // binary models (click-through): area under the ROC curve
  double train_seconds = 0;   // time in training steps on this epoch's data
  double samples_per_second = 0;
  double elapsed_seconds = 0;  // since training started, when the job completed the epoch
};

// One evaluation of the current parameters on the test set within the job's epochs
// (TrainOptions::eval_every).
struct EvalPoint {
  int64_t step = 0;            // iterations this worker trained before it
  int64_t samples = 0;         // samples this worker trained before it, all epochs
  double elapsed_seconds = 0;  // since training started, when the parameters were pulled
  double test_accuracy = 0;    // in [0, 1]
  double test_loss = 0;
  double test_auc = -1;     // binary models only
  double eval_seconds = 0;  // the pull and the evaluation; in no train_seconds
};

// Trains `model` until the job's data plan is complete. Stops early, after the step in
// progress, when *stop becomes true (results so far are returned; the unfinished chunk
// goes to another worker when this one leaves).
struct TrainResult {
  std::vector<EpochResult> epochs;  // in order, for every epoch the job completed
  int64_t chunks_trained = 0;       // data chunks this worker trained
  int64_t iterations = 0;           // pulls, pushes and clocks this worker made
  int64_t rejoins = 0;
  double compute_seconds = 0;         // in forward/backward of training steps
  double injected_delay_seconds = 0;  // slept because of step_delay_factor
  // Iterations' time in the parameter store: waiting for and loading the pulled values
  // (the staleness bound's wait included), and pushing with the clock.
  double pull_seconds = 0;
  double push_seconds = 0;
  // Gradients sent from the buffer they were computed or averaged into (Client::Push of a
  // shared_ptr), and the buffers the worker allocated for that: they come back once a push
  // is answered, so their number stays near the pushes in flight.
  int64_t pushes_handed_over = 0;
  int64_t gradient_buffers = 0;
  // Of the pushes handed over, those computed straight into a shard's shared-memory ring
  // (ParamStore::PushBuffer) and sent from there.
  int64_t pushes_from_shared_memory = 0;
  // Parameters the model read where a shard's reply arrived (ParamStore::InPlace), not
  // from a copy: one per table per pull (evaluations' pulls too).
  int64_t params_read_in_place = 0;
  std::vector<EvalPoint> evaluations;  // with eval_every, in order
  double eval_seconds = 0;             // in test-set evaluations, the epochs' included
};

// Trains `model` on leased chunks of `train` with parameters from `params` until the job
// is finished or *stop is set; evaluates on `test` (if any) after each epoch. Where the
// model can (Model::BindParam), it reads the pulled parameters in place while training;
// on return it holds the last pulled values in its own buffers and is bound to nothing.
Result<TrainResult> Train(Model& model, ParamStore& params, const Dataset& train,
                          const Dataset* test, const TrainOptions& options,
                          const std::atomic<bool>* stop);

// Writes the result as JSON (one object with an "epochs" array, an "evaluations" array
// (empty without eval_every), "eval_seconds", plus `extra` numbers) to `path`.
Status WriteResultsJson(const std::string& path, const std::string& mode,
                        const TrainOptions& options, const TrainResult& result,
                        const std::vector<std::pair<std::string, double>>& extra = {});

}  // namespace leash::worker
