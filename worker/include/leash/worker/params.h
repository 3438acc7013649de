// Where a worker's parameters live: in a Leash cluster (RemoteParams, through
// leash::Client) or in this process (LocalParams, the same tables and server-side
// optimizers with no server at all, the baseline the cluster is measured against).
// One training thread at a time.
#pragma once

#include <future>
#include <memory>
#include <span>
#include <vector>

#include "leash/common/status.h"
#include "leash/worker/client.h"
#include "leash/worker/model.h"

namespace leash::worker {

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.01f;
  float momentum = 0.9f;
  float weight_decay = 0.f;
  uint64_t seed = 1;  // parameter initialization seed
};

// The table spec for parameter `p` (the `index`-th of the model) trained with `opt`
// (initializer from the model's spec, seeded from opt.seed and index).
TableSpec MakeTableSpec(const ParamSpec& p, const OptimizerOptions& opt, size_t index);
// The spec of a model's sparse embedding table `p` (Model::sparse_param) trained with
// `opt`: kind kSparse, rows 0, cols the embedding dimension, Adagrad's epsilon 1e-8.
TableSpec MakeSparseTableSpec(const ParamSpec& p, const OptimizerOptions& opt);

class ParamStore {
 public:
  virtual ~ParamStore() = default;
  // Creates (or finds) one table per parameter.
  virtual Status Setup(const std::vector<ParamSpec>& params, const OptimizerOptions& opt) = 0;
  // Fills values[i] with parameter i, as the staleness bound allows for this iteration
  // (from the prefetch, when one was started for this iteration: then the arrays are
  // swapped in, not copied). Every write into `values` is done before it returns, also on
  // error. Each values[i] keeps its table's size, so after the first call no array of
  // `values` is reallocated and a model may read them in place (Model::BindParam)
  // between calls. The one exception: a parameter the store offers where its reply
  // arrived (InPlace(i) not empty) leaves values[i] empty.
  virtual Status PullAll(std::vector<std::vector<float>>* values) = 0;
  // Parameter i's values as the last PullAll or PullAllSparse left them, where they
  // arrived instead of copied into values[i] (a store made with pull_in_place: the reply
  // itself, Client::PullInPlace). Valid and unchanged until the next PullAll,
  // PullAllSparse, Rejoin or Finish. Empty: the values are in values[i].
  virtual std::span<const float> InPlace(size_t /*i*/) const { return {}; }
  // Starts pulling the next iteration's values now, to overlap the pull with this
  // iteration's compute, when the staleness bound allows it (s >= 1). Optional. The pull
  // is written in the background (on the client's I/O thread) into arrays that the last
  // PullAll swapped out of `values`: whoever read those in place must have moved to the
  // current `values` before calling Prefetch.
  virtual void Prefetch() {}
  // Sends the gradient of parameter i (read or copied before returning, so `grad` may
  // change right after).
  virtual void Push(size_t i, const float* grad) = 0;
  // The same, sent from `grad`'s floats themselves where the store can (Client::Push of a
  // shared_ptr): the caller hands them over, must not change them, and may reuse the array
  // once it holds the last reference. The default reads them as Push(i, grad.get()).
  virtual void PushHandedOver(size_t i, std::shared_ptr<const float> grad) { Push(i, grad.get()); }
  // Room for parameter i's gradient that PushHandedOver sends from where it lies, with no
  // copy (Client::PushBuffer: the ring of a shard on this host), or null: then use memory
  // of your own. Optional.
  virtual std::shared_ptr<float> PushBuffer(size_t /*i*/) { return nullptr; }

  // Models with embeddings (Model::sparse_param): creates (or finds) the sparse table,
  // after Setup. Unimplemented in a store without sparse tables.
  virtual Status SetupSparse(const ParamSpec& /*table*/, const OptimizerOptions& /*opt*/) {
    return FailedPrecondition("this parameter store has no sparse tables");
  }
  // PullAll, and the sparse table's rows of `keys` into *rows (resized to keys x cols), in
  // the same message per shard as the dense pulls (or alone when the dense values come
  // from a prefetch).
  virtual Status PullAllSparse(std::vector<std::vector<float>>* /*values*/,
                               std::span<const uint64_t> /*keys*/, std::vector<float>* /*rows*/) {
    return FailedPrecondition("this parameter store has no sparse tables");
  }
  // Prefetch(), and the sparse table's rows of `keys` (the next iteration's, copied) in
  // the same message per shard; a PullAllSparse of the same keys then takes them. The
  // default is Prefetch().
  virtual void PrefetchSparse(std::span<const uint64_t> /*keys*/) { Prefetch(); }
  // Sends the sparse table's gradient rows of `keys` (keys x cols, copied before
  // returning) with this iteration's dense pushes.
  virtual void PushSparse(std::span<const uint64_t> /*keys*/, const float* /*grad*/) {}
  // Ends the iteration: every push of it is sent, then the clock advances. Returns the
  // first error of an earlier push.
  virtual Status EndIteration() = 0;
  // EndIteration for a caller whose next call is PullAll or PullAllSparse, with nothing
  // slow in between (the training loop between two batches of a chunk): the pushes and
  // the clock may then wait for that pull and go in the same message per shard (at
  // staleness 0 the pull itself, above it the prefetch that follows), one message and its
  // wake-ups fewer per iteration. Anything that waits for a shard sends them first. The
  // default is EndIteration().
  virtual Status EndIterationBeforePull() { return EndIteration(); }
  // Ends an iteration in which this worker had no data to train (it waits for others to
  // finish the last chunks of an epoch); under a tight staleness bound the others must
  // not wait for it.
  virtual Status Idle() = 0;
  // Whether Idle() first waits, as a pull does, for the staleness bound to let this
  // worker's clock move on (so idle iterations follow the others' clocks and may run back
  // to back); if not, an idle worker clocks once per wait for a chunk.
  virtual bool idle_waits_for_bound() const { return false; }
  // Reports `done` as trained and leases the next chunk of the job's data (from shard 0,
  // or from an in-process queue in local mode).
  virtual Result<ChunkGrant> NextChunk(const DataPlan& plan, const ChunkDone* done) = 0;
  // Work in proportion to speed: the weight (samples, global batch) the pushes carry from
  // now on, and this worker's speed, which the clocks from now on report. The summed
  // speeds of the live workers as the shards last answered (0: unknown, or local).
  virtual void SetPushWeight(PushWeight /*weight*/) {}
  virtual void SetSamplesPerSecond(double /*rate*/) {}
  virtual double cluster_samples_per_second() const { return 0; }
  // True when a shard no longer knows this worker; Rejoin() registers it again.
  virtual bool needs_rejoin() const { return false; }
  virtual Status Rejoin() { return Status::Ok(); }
  // Leaves the job (remote) or does nothing (local).
  virtual Status Finish() = 0;
  virtual int64_t clock() const = 0;
};

// `staleness` is the client's bound; prefetching is on when it is >= 1. With
// `clock_with_pull`, EndIterationBeforePull holds the iteration's pushes and clock for the
// next pull's message (one message per iteration); without it they go at once, as
// EndIteration sends them (for replicated shards, where replies wait for commits).
// With `pull_in_place`, a table that one shard holds and whose reply can be read where it
// arrived (a float32 wire: the socket's message, or a same-host shard's shared-memory ring)
// is offered there (InPlace) instead of copied into values; a table whose reply is copied or
// widened anyway (rows on several shards, a 16-bit wire, replies past the client's share of
// a ring) is pulled into values as without it, from the first pull that shows it.
std::unique_ptr<ParamStore> MakeRemoteParams(Client* client, int64_t staleness,
                                             bool clock_with_pull = true,
                                             bool pull_in_place = false);
std::unique_ptr<ParamStore> MakeLocalParams();

}  // namespace leash::worker
