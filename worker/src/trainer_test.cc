// Unit tests of the training loop: straggler injection (--step-delay-factor), periodic
// evaluation (--eval-every), and parameters and gradients used in place (BindParam,
// HostGradient) against the copying path, with a local (in-process) MLP on a small
// synthetic dataset, or RemoteParams' prefetch over shards on the in-memory transport.
// Single training thread.
#include "leash/worker/trainer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include "leash/kernels/kernels.h"
#include "leash/worker/model.h"
#include "leash/worker/params.h"
#include "support/memory_cluster.h"

namespace leash::worker {
namespace {

using kernels::Context;
using kernels::Device;
using kernels::DeviceType;

Dataset Synthetic(int64_t count) {
  Dataset d;
  d.count = count;
  d.rows = 8;
  d.cols = 8;
  d.images.resize(static_cast<size_t>(count * d.features()));
  d.labels.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    d.labels[static_cast<size_t>(i)] = static_cast<int32_t>(i % 10);
    for (int64_t f = 0; f < d.features(); ++f) {
      d.images[static_cast<size_t>(i * d.features() + f)] =
          static_cast<float>((i * 31 + f * 7) % 17) / 17.f - 0.5f;
    }
  }
  return d;
}

struct TimedRun {
  TrainResult result;
  double wall_seconds = 0;
};

TimedRun TrainLocal(double factor) {
  auto ctx = Context::Create(Device{DeviceType::kCpu, 0});
  EXPECT_TRUE(ctx.ok()) << ctx.status();
  Dataset train = Synthetic(512);
  auto model = MakeMlp(**ctx, train.features(), {256, 256}, 10, 32);
  EXPECT_TRUE(model.ok()) << model.status();
  auto params = MakeLocalParams();
  OptimizerOptions opt;
  EXPECT_TRUE(params->Setup((*model)->params(), opt).ok());
  TrainOptions o;
  o.epochs = 2;
  o.batch = 32;
  o.chunk_size = 128;
  o.log_every = 0;
  o.evaluate = false;
  o.step_delay_factor = factor;
  auto t0 = std::chrono::steady_clock::now();
  auto r = Train(**model, *params, train, nullptr, o, nullptr);
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.ok()) << r.status();
  return TimedRun{r.ok() ? *r : TrainResult{}, wall};
}

// Forwards to a model; either refuses the zero-copy paths (as a GPU model does) or
// counts them, and tracks which parameters are bound.
class SpyModel final : public Model {
 public:
  SpyModel(Model& inner, bool zero_copy)
      : bound(inner.params().size()), inner_(inner), zero_copy_(zero_copy) {}
  const std::vector<ParamSpec>& params() const override { return inner_.params(); }
  int64_t input_size() const override { return inner_.input_size(); }
  int64_t num_classes() const override { return inner_.num_classes(); }
  Status SetParam(size_t index, const float* host) override {
    ++set_calls;
    Status st = inner_.SetParam(index, host);
    if (st.ok()) bound[index] = false;
    return st;
  }
  Status BindParam(size_t index, const float* host) override {
    if (!zero_copy_) return Model::BindParam(index, host);
    ++bind_calls;
    Status st = inner_.BindParam(index, host);
    if (st.ok()) bound[index] = true;
    return st;
  }
  Result<StepStats> TrainStep(const float* images_host, const int32_t* labels_host, int64_t batch,
                              const std::function<void(size_t)>& on_grad) override {
    return inner_.TrainStep(images_host, labels_host, batch, on_grad);
  }
  Status PrefetchBatch(const float* images_host, const int32_t* labels_host,
                       int64_t batch) override {
    return inner_.PrefetchBatch(images_host, labels_host, batch);
  }
  StagingStats staging() const override { return inner_.staging(); }
  Status Gradient(size_t index, float* out_host) override {
    ++gradient_copies;
    return inner_.Gradient(index, out_host);
  }
  Result<const float*> HostGradient(size_t index) override {
    if (!zero_copy_) return Model::HostGradient(index);
    Result<const float*> g = inner_.HostGradient(index);
    if (g.ok() && *g != nullptr) ++host_gradients;
    return g;
  }
  Status BindGradient(size_t index, float* host) override {
    if (!zero_copy_) return Model::BindGradient(index, host);
    Status st = inner_.BindGradient(index, host);
    if (st.ok()) ++gradient_binds;
    return st;
  }
  Result<StepStats> Evaluate(const float* images_host, const int32_t* labels_host,
                             int64_t n) override {
    return inner_.Evaluate(images_host, labels_host, n);
  }

  int64_t set_calls = 0;
  int64_t bind_calls = 0;
  int64_t gradient_copies = 0;
  int64_t host_gradients = 0;
  int64_t gradient_binds = 0;
  std::vector<bool> bound;

 private:
  Model& inner_;
  bool zero_copy_;
};

struct SpyRun {
  TrainResult result;
  std::vector<std::vector<float>> final_params;  // the tables after training
  float eval_loss_after = 0;                     // the model evaluated after Train returned
  SpyModel* spy = nullptr;
};

// Forwards everything to a store; the tests' stores below change one behaviour each.
class ForwardingParams : public ParamStore {
 public:
  explicit ForwardingParams(std::unique_ptr<ParamStore> inner) : inner_(std::move(inner)) {}
  Status Setup(const std::vector<ParamSpec>& p, const OptimizerOptions& o) override {
    return inner_->Setup(p, o);
  }
  Status PullAll(std::vector<std::vector<float>>* v) override { return inner_->PullAll(v); }
  std::span<const float> InPlace(size_t i) const override { return inner_->InPlace(i); }
  void Prefetch() override { inner_->Prefetch(); }
  void Push(size_t i, const float* g) override { inner_->Push(i, g); }
  void PushHandedOver(size_t i, std::shared_ptr<const float> g) override {
    inner_->PushHandedOver(i, std::move(g));
  }
  Status EndIteration() override { return inner_->EndIteration(); }
  Status EndIterationBeforePull() override { return inner_->EndIterationBeforePull(); }
  Status Idle() override { return inner_->Idle(); }
  Result<ChunkGrant> NextChunk(const DataPlan& plan, const ChunkDone* done) override {
    return inner_->NextChunk(plan, done);
  }
  Status Finish() override { return inner_->Finish(); }
  int64_t clock() const override { return inner_->clock(); }

 private:
  std::unique_ptr<ParamStore> inner_;
};

// RemoteParams (staleness 1, so it prefetches) over real shards on the in-memory
// transport, counting the PullAlls that swapped a prefetch in instead of pulling.
class SwapCountingParams final : public ForwardingParams {
 public:
  SwapCountingParams(std::unique_ptr<ParamStore> inner, const Client* client)
      : ForwardingParams(std::move(inner)), client_(client) {}
  Status PullAll(std::vector<std::vector<float>>* values) override {
    uint64_t pulls = client_->counters().pulls;
    Status st = ForwardingParams::PullAll(values);
    if (!st.ok()) return st;
    ++pull_alls;
    if (client_->counters().pulls == pulls) ++swaps;
    bool all = true;
    for (size_t i = 0; i < values->size(); ++i) all = all && !InPlace(i).empty();
    if (all) ++in_place;
    return st;
  }

  int64_t pull_alls = 0;
  int64_t swaps = 0;
  int64_t in_place = 0;  // PullAlls that offered every parameter in place

 private:
  const Client* client_;
};

// A store that offers room for the gradients of the even-numbered parameters, as
// RemoteParams offers a same-host shard's ring (ParamStore::PushBuffer): filled with NaN,
// so a model that did not overwrite all of it would show.
class BufferOfferingParams final : public ForwardingParams {
 public:
  using ForwardingParams::ForwardingParams;
  std::shared_ptr<float> PushBuffer(size_t i) override {
    if (i % 2 != 0 || i >= sizes.size()) return nullptr;
    auto* p = new float[sizes[i]];
    std::fill_n(p, sizes[i], std::numeric_limits<float>::quiet_NaN());
    ++offered;
    std::lock_guard<std::mutex> lock(mu);
    live.insert(p);
    return std::shared_ptr<float>(p, [this](float* q) {
      std::lock_guard<std::mutex> l(mu);
      live.erase(q);
      delete[] q;
    });
  }
  void PushHandedOver(size_t i, std::shared_ptr<const float> g) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (live.count(const_cast<float*>(g.get())) != 0) ++pushed_from_offer;
    }
    ForwardingParams::PushHandedOver(i, std::move(g));
  }

  std::vector<size_t> sizes;
  int64_t offered = 0;
  int64_t pushed_from_offer = 0;
  std::mutex mu;
  std::set<float*> live;
};

// Trains a fresh MLP through a SpyModel for 2 epochs (with per-epoch evaluation), with
// LocalParams or (prefetching) RemoteParams under staleness 1 on a one-shard in-memory
// cluster whose replies take a millisecond, so that prefetches land during steps; with
// `offering`, LocalParams inside a BufferOfferingParams kept there. `in_place`: the
// prefetching RemoteParams pulls in place (MakeRemoteParams' pull_in_place).
SpyRun TrainSpied(bool zero_copy, int64_t accumulate, std::unique_ptr<SpyModel>* keep,
                  bool prefetching = false,
                  std::unique_ptr<BufferOfferingParams>* offering = nullptr,
                  bool in_place = false) {
  SpyRun run;
  auto ctx = Context::Create(Device{DeviceType::kCpu, 0});
  EXPECT_TRUE(ctx.ok()) << ctx.status();
  Dataset train = Synthetic(320);
  Dataset test = Synthetic(70);
  auto model = MakeMlp(**ctx, train.features(), {32, 16}, 10, 32);
  EXPECT_TRUE(model.ok()) << model.status();
  *keep = std::make_unique<SpyModel>(**model, zero_copy);
  std::unique_ptr<testing::MemoryCluster> cluster;
  std::unique_ptr<Client> client;
  std::unique_ptr<ParamStore> params;
  SwapCountingParams* prefetcher = nullptr;
  if (prefetching) {
    cluster = std::make_unique<testing::MemoryCluster>(1);
    cluster->network().SetFaults(testing::Direction::kToClient, "", testing::Faults{.delay_ms = 1});
    ClientOptions co;
    co.worker_id = 1;
    co.staleness = 1;
    auto c = cluster->Connect(co);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return run;
    client = std::move(*c);
    prefetcher =
        new SwapCountingParams(MakeRemoteParams(client.get(), 1, true, in_place), client.get());
    params.reset(prefetcher);
  } else if (offering != nullptr) {
    *offering = std::make_unique<BufferOfferingParams>(MakeLocalParams());
    for (const auto& p : (*model)->params()) (*offering)->sizes.push_back(p.size());
  } else {
    params = MakeLocalParams();
  }
  ParamStore* store = offering != nullptr ? offering->get() : params.get();
  EXPECT_TRUE(store->Setup((*model)->params(), OptimizerOptions{}).ok());
  TrainOptions o;
  o.epochs = 2;
  o.batch = 32;
  o.accumulate = accumulate;
  o.chunk_size = 96;  // a chunk ends on a short last iteration when accumulating
  o.log_every = 0;
  auto r = Train(**keep, *store, train, &test, o, nullptr);
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) run.result = *r;
  if (prefetcher != nullptr) {
    EXPECT_GT(prefetcher->swaps, 0);
    // One shard and a float32 wire: every pull of a store pulling in place is offered so.
    EXPECT_EQ(prefetcher->in_place, in_place ? prefetcher->pull_alls : 0);
  }
  EXPECT_TRUE(store->PullAll(&run.final_params).ok());
  for (size_t i = 0; i < run.final_params.size(); ++i) {
    const std::span<const float> v = store->InPlace(i);
    if (!v.empty()) run.final_params[i].assign(v.begin(), v.end());
  }
  auto ev = (*keep)->Evaluate(test.images.data(), test.labels.data(), test.count);
  EXPECT_TRUE(ev.ok()) << ev.status();
  if (ev.ok()) run.eval_loss_after = ev->loss;
  run.spy = keep->get();
  return run;
}

void ExpectSameTraining(const SpyRun& a, const SpyRun& b) {
  ASSERT_EQ(a.result.epochs.size(), 2u);
  ASSERT_EQ(b.result.epochs.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    EXPECT_EQ(a.result.epochs[e].train_loss, b.result.epochs[e].train_loss) << e;
    EXPECT_EQ(a.result.epochs[e].test_loss, b.result.epochs[e].test_loss) << e;
    EXPECT_EQ(a.result.epochs[e].test_accuracy, b.result.epochs[e].test_accuracy) << e;
  }
  ASSERT_EQ(a.final_params.size(), b.final_params.size());
  for (size_t i = 0; i < a.final_params.size(); ++i) {
    ASSERT_EQ(a.final_params[i].size(), b.final_params[i].size());
    EXPECT_EQ(std::memcmp(a.final_params[i].data(), b.final_params[i].data(),
                          a.final_params[i].size() * sizeof(float)),
              0)
        << "table " << i;
  }
  EXPECT_EQ(a.eval_loss_after, b.eval_loss_after);
}

TEST(TrainerTest, BoundParamsAndHostGradientsTrainBitIdenticallyToCopies) {
  std::unique_ptr<SpyModel> copy_model, zero_model;
  SpyRun copying = TrainSpied(false, 1, &copy_model);
  SpyRun zero_copy = TrainSpied(true, 1, &zero_model);
  ExpectSameTraining(copying, zero_copy);
  // The copying run copied every parameter and gradient of every iteration.
  EXPECT_EQ(copying.spy->bind_calls, 0);
  EXPECT_GT(copying.spy->gradient_copies, 0);
  // The zero-copy run bound instead, and the model wrote every gradient into the buffer
  // it was pushed from (not read in place and copied by the push).
  EXPECT_GT(zero_copy.spy->bind_calls, 0);
  EXPECT_EQ(zero_copy.spy->gradient_copies, 0);
  EXPECT_EQ(zero_copy.spy->host_gradients, 0);
  EXPECT_EQ(zero_copy.spy->gradient_binds, copying.spy->gradient_copies);
  // Either way every gradient was handed to the store in a pooled buffer (the copying
  // model's copied into one), and the buffers were reused step after step.
  EXPECT_EQ(zero_copy.result.pushes_handed_over, copying.spy->gradient_copies);
  EXPECT_EQ(copying.result.pushes_handed_over, copying.spy->gradient_copies);
  const auto params = static_cast<int64_t>(zero_copy.final_params.size());
  EXPECT_LE(zero_copy.result.gradient_buffers, 2 * params);
  EXPECT_LE(copying.result.gradient_buffers, 2 * params);
}

TEST(TrainerTest, AccumulatedMicroBatchesStillCopyGradientsAndMatch) {
  std::unique_ptr<SpyModel> copy_model, zero_model;
  SpyRun copying = TrainSpied(false, 2, &copy_model);
  SpyRun zero_copy = TrainSpied(true, 2, &zero_model);
  ExpectSameTraining(copying, zero_copy);
  EXPECT_GT(zero_copy.spy->gradient_copies, 0);
  // 96-sample chunks of 32-sample batches end on a one-micro-batch iteration: written
  // where it is pushed from.
  EXPECT_GT(zero_copy.spy->gradient_binds, 0);
  EXPECT_EQ(zero_copy.spy->host_gradients, 0);
}

// The model is bound only to the arrays PullAll returned, never to those RemoteParams'
// prefetch is writing into while a step runs (which hold the values of two iterations
// back until it lands): bound in place, it trains exactly as it does on copies.
TEST(TrainerTest, PrefetchWritesDuringAStepNeverReachBoundParams) {
  std::unique_ptr<SpyModel> copy_model, zero_model;
  SpyRun copying = TrainSpied(false, 1, &copy_model, /*prefetching=*/true);
  SpyRun zero_copy = TrainSpied(true, 1, &zero_model, /*prefetching=*/true);
  ExpectSameTraining(copying, zero_copy);
  EXPECT_GT(zero_copy.spy->bind_calls, 0);
  // Over the client every gradient went out from the buffer backward wrote it into, and a
  // buffer came back to the pool once its push was answered: with staleness 1 and replies
  // a millisecond late, a few buffers per parameter serve the whole run (how many depends
  // on how many pushes were still unanswered at a step's start; with none reused there
  // would be one per step).
  EXPECT_EQ(zero_copy.spy->gradient_binds, copying.spy->gradient_copies);
  EXPECT_EQ(zero_copy.result.pushes_handed_over, copying.spy->gradient_copies);
  const auto params = static_cast<int64_t>(zero_copy.final_params.size());
  ASSERT_GE(zero_copy.result.iterations, 20);
  EXPECT_GE(zero_copy.result.gradient_buffers, params);
  EXPECT_LE(zero_copy.result.gradient_buffers, zero_copy.result.iterations * params / 4);
}

// Pulled in place (the replies themselves, over a prefetching RemoteParams), a model that
// binds its parameters to them and one that copies them both train exactly as on copies.
TEST(TrainerTest, ParamsPulledInPlaceTrainBitIdenticallyToCopiedOnes) {
  std::unique_ptr<SpyModel> copied_model, bound_model, copying_model;
  SpyRun copied = TrainSpied(true, 1, &copied_model, /*prefetching=*/true);
  SpyRun bound = TrainSpied(true, 1, &bound_model, true, nullptr, /*in_place=*/true);
  SpyRun copying = TrainSpied(false, 1, &copying_model, true, nullptr, /*in_place=*/true);
  ExpectSameTraining(copied, bound);
  ExpectSameTraining(copied, copying);
  EXPECT_GT(bound.spy->bind_calls, 0);
  EXPECT_EQ(copying.spy->bind_calls, 0);
  EXPECT_GT(copying.spy->set_calls, 0);
}

// The model writes each gradient the store offers room for straight into it, and the
// trainer pushes that room (no buffer of its own, no copy); the others go through its
// pool. Training is bit-identical to a model that copies every gradient out, and no
// offered buffer outlives the run. A model that cannot write where it is told (a GPU)
// leaves every offer unused.
TEST(TrainerTest, GradientsAreComputedWhereTheStoreOffersAndTrainAlike) {
  std::unique_ptr<SpyModel> copy_model, zero_model;
  std::unique_ptr<BufferOfferingParams> copy_store, zero_store;
  SpyRun copying = TrainSpied(false, 1, &copy_model, false, &copy_store);
  SpyRun zero_copy = TrainSpied(true, 1, &zero_model, false, &zero_store);
  ExpectSameTraining(copying, zero_copy);
  const auto params = static_cast<int64_t>(zero_copy.final_params.size());
  const int64_t offered_params = (params + 1) / 2;
  const int64_t iterations = zero_copy.result.iterations;
  ASSERT_GE(iterations, 20);
  EXPECT_EQ(zero_store->offered, iterations * offered_params);
  EXPECT_EQ(zero_store->pushed_from_offer, iterations * offered_params);
  EXPECT_EQ(zero_copy.result.pushes_from_shared_memory, iterations * offered_params);
  EXPECT_EQ(zero_copy.result.pushes_handed_over, iterations * params);
  EXPECT_EQ(zero_copy.spy->gradient_binds, iterations * params);
  EXPECT_EQ(zero_copy.spy->gradient_copies, 0);
  // The pool served only the parameters without an offer.
  EXPECT_LE(zero_copy.result.gradient_buffers, 2 * (params - offered_params));
  EXPECT_TRUE(zero_store->live.empty()) << zero_store->live.size() << " offered buffers kept";
  // The copying model refused its first bind: the one offer made was dropped, none pushed.
  EXPECT_LE(copy_store->offered, 1);
  EXPECT_EQ(copy_store->pushed_from_offer, 0);
  EXPECT_EQ(copying.result.pushes_from_shared_memory, 0);
  EXPECT_TRUE(copy_store->live.empty());
}

TEST(TrainerTest, ModelIsBoundToNothingAfterTrain) {
  std::unique_ptr<SpyModel> zero_model;
  SpyRun run = TrainSpied(true, 1, &zero_model);
  ASSERT_GT(run.spy->bind_calls, 0);
  for (size_t i = 0; i < run.spy->bound.size(); ++i)
    EXPECT_FALSE(run.spy->bound[i]) << "parameter " << i;
}

TEST(TrainerTest, NoStepDelayByDefault) {
  TimedRun run = TrainLocal(1.0);
  EXPECT_EQ(run.result.iterations, 2 * 512 / 32);
  EXPECT_GT(run.result.compute_seconds, 0);
  EXPECT_EQ(run.result.injected_delay_seconds, 0);
}

// The sleeps are lower bounds (a sleep never ends early), so these hold on any machine:
// the slowed worker sleeps at least (factor - 1) x its compute time, and its epochs'
// step time and its wall time include that sleep.
TEST(TrainerTest, StepDelayFactorSlowsTheWorkerByThatFactor) {
  TimedRun run = TrainLocal(3.0);
  const TrainResult& r = run.result;
  EXPECT_EQ(r.iterations, 2 * 512 / 32);
  ASSERT_GT(r.compute_seconds, 0);
  EXPECT_GE(r.injected_delay_seconds, 2.0 * r.compute_seconds);
  double step_seconds = 0;
  for (const auto& e : r.epochs) step_seconds += e.train_seconds;
  EXPECT_GE(step_seconds, 3.0 * r.compute_seconds);
  EXPECT_GE(run.wall_seconds, 3.0 * r.compute_seconds);
}

// A parameter store whose pulls and clocks take at least the given times: a shard that
// makes the worker wait (the staleness bound) or a slow link.
class SlowParams final : public ForwardingParams {
 public:
  SlowParams(std::unique_ptr<ParamStore> inner, std::chrono::milliseconds pull,
             std::chrono::milliseconds push)
      : ForwardingParams(std::move(inner)), pull_(pull), push_(push) {}
  Status PullAll(std::vector<std::vector<float>>* v) override {
    std::this_thread::sleep_for(pull_);
    return ForwardingParams::PullAll(v);
  }
  Status EndIteration() override {
    std::this_thread::sleep_for(push_);
    return ForwardingParams::EndIteration();
  }
  Status EndIterationBeforePull() override {
    std::this_thread::sleep_for(push_);
    return ForwardingParams::EndIterationBeforePull();
  }

 private:
  std::chrono::milliseconds pull_, push_;
};

// Work in proportion to speed as the shards would sum it: the cluster's speed is always
// `global / share` times this worker's own, so its share of `global` is exactly `share`.
class ShareParams final : public ForwardingParams {
 public:
  ShareParams(std::unique_ptr<ParamStore> inner, int64_t global, int64_t share)
      : ForwardingParams(std::move(inner)), ratio_(static_cast<double>(global) / share) {}
  void SetSamplesPerSecond(double rate) override { rate_ = rate; }
  double cluster_samples_per_second() const override { return rate_ * ratio_; }

 private:
  double ratio_;
  double rate_ = 0;
};

// The time an iteration spends in the parameter store is counted apart from its compute:
// at least the store's delays (sleeps never end early), and the three together within the
// epochs' step time.
TEST(TrainerTest, CountsTheTimeInPullsAndPushesApartFromCompute) {
  auto ctx = Context::Create(Device{DeviceType::kCpu, 0});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  Dataset train = Synthetic(256);
  auto model = MakeMlp(**ctx, train.features(), {64}, 10, 32);
  ASSERT_TRUE(model.ok()) << model.status();
  SlowParams params(MakeLocalParams(), std::chrono::milliseconds(4), std::chrono::milliseconds(2));
  ASSERT_TRUE(params.Setup((*model)->params(), OptimizerOptions{}).ok());
  TrainOptions o;
  o.epochs = 1;
  o.batch = 32;
  o.chunk_size = 128;
  o.log_every = 0;
  o.evaluate = false;
  auto r = Train(**model, params, train, nullptr, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->iterations, 256 / 32);
  EXPECT_GE(r->pull_seconds, 0.004 * 8);
  EXPECT_GE(r->push_seconds, 0.002 * 8);
  EXPECT_LT(r->push_seconds, r->pull_seconds);
  double step_seconds = 0;
  for (const auto& e : r->epochs) step_seconds += e.train_seconds;
  EXPECT_LE(r->pull_seconds + r->push_seconds + r->compute_seconds, step_seconds);
}

// With --global-batch every iteration trains exactly this worker's share (26 of 192, not a
// multiple of the loader's 4-sample grains, which rounded up made it 28), once its speed is
// known, except where a chunk ends; every sample of the epoch is trained once.
TEST(TrainerTest, ProportionalWorkTrainsExactlyItsShareEachIteration) {
  auto ctx = Context::Create(Device{DeviceType::kCpu, 0});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  Dataset train = Synthetic(512);
  auto model = MakeMlp(**ctx, train.features(), {32}, 10, 64);
  ASSERT_TRUE(model.ok()) << model.status();
  ShareParams params(MakeLocalParams(), 192, 26);
  ASSERT_TRUE(params.Setup((*model)->params(), OptimizerOptions{}).ok());
  TrainOptions o;
  o.epochs = 1;
  o.batch = 64;
  o.global_batch = 192;
  o.chunk_size = 128;
  o.log_every = 0;
  o.evaluate = false;
  std::vector<int64_t> sizes;
  o.on_step = [&](const StepReport& r) { sizes.push_back(r.samples); };
  auto r = Train(**model, params, train, nullptr, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_GE(sizes.size(), 2u);
  // Its speed is unknown before the first iteration ends, and the second batch is taken
  // during the first (staged while it computes): both are --batch.
  EXPECT_EQ(sizes[0], 64);
  EXPECT_EQ(sizes[1], 64);
  int64_t total = 0, exact = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    total += sizes[i];
    if (i > 1) {
      EXPECT_LE(sizes[i], 26) << "iteration " << i;
      if (sizes[i] == 26) ++exact;
    }
  }
  EXPECT_EQ(total, 512);
  // The first chunk of 128 is those two; the other three are 4 x 26 + 24 each.
  EXPECT_EQ(exact, 12);
}

// Trains a tiny MLP for one epoch with `change` applied to the options, on 64 samples
// that also serve as the test set.
Result<TrainResult> TrainTiny(const std::function<void(TrainOptions&)>& change) {
  auto ctx = Context::Create(Device{DeviceType::kCpu, 0});
  if (!ctx.ok()) return ctx.status();
  Dataset train = Synthetic(64);
  auto model = MakeMlp(**ctx, train.features(), {8}, 10, 32);
  if (!model.ok()) return model.status();
  auto params = MakeLocalParams();
  LEASH_RETURN_IF_ERROR(params->Setup((*model)->params(), OptimizerOptions{}));
  TrainOptions o;
  o.epochs = 1;
  o.batch = 32;
  o.evaluate = false;
  change(o);
  return Train(**model, *params, train, &train, o, nullptr);
}

TEST(TrainerTest, RejectsAStepDelayFactorBelowOne) {
  auto r = TrainTiny([](TrainOptions& o) { o.step_delay_factor = 0.5; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("step delay factor"), std::string::npos)
      << r.status().message();
}

// 512 training samples, batch 32, 2 epochs: 32 iterations; every 5th is followed by an
// evaluation on a test set large enough that evaluating costs more than training.
TEST(TrainerTest, EvalEveryRecordsAPointEveryNIterationsOutsideTrainingTime) {
  auto ctx = Context::Create(Device{DeviceType::kCpu, 0});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  Dataset train = Synthetic(512);
  Dataset test = Synthetic(2048);
  auto model = MakeMlp(**ctx, train.features(), {256, 256}, 10, 32);
  ASSERT_TRUE(model.ok()) << model.status();
  auto params = MakeLocalParams();
  ASSERT_TRUE(params->Setup((*model)->params(), OptimizerOptions{}).ok());
  TrainOptions o;
  o.epochs = 2;
  o.batch = 32;
  o.chunk_size = 128;
  o.log_every = 0;
  o.evaluate = false;  // periodic evaluation does not depend on the epoch-end one
  o.eval_every = 5;
  double step_seconds = 0;
  o.on_step = [&](const StepReport& r) { step_seconds += r.seconds; };
  auto t0 = std::chrono::steady_clock::now();
  auto r = Train(**model, *params, train, &test, o, nullptr);
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->iterations, 32);
  ASSERT_EQ(r->evaluations.size(), 6u);  // after steps 5, 10, ..., 30
  double point_seconds = 0, last_elapsed = 0;
  for (size_t i = 0; i < r->evaluations.size(); ++i) {
    const EvalPoint& p = r->evaluations[i];
    EXPECT_EQ(p.step, 5 * static_cast<int64_t>(i + 1));
    EXPECT_EQ(p.samples, 32 * p.step);
    EXPECT_GE(p.test_accuracy, 0.0);
    EXPECT_LE(p.test_accuracy, 1.0);
    EXPECT_GT(p.test_loss, 0.0);
    EXPECT_GE(p.elapsed_seconds, last_elapsed);
    EXPECT_GT(p.eval_seconds, 0.0);
    last_elapsed = p.elapsed_seconds;
    point_seconds += p.eval_seconds;
  }
  EXPECT_DOUBLE_EQ(r->eval_seconds, point_seconds);  // no epoch-end evaluation here
  // The epochs' training time is the iterations' time and nothing else. Evaluating costs
  // several times what training does here (2048 test samples six times against 1024
  // trained), so had it been counted as training too, training plus evaluation would
  // exceed the wall time. (No comparison of the two durations: that is a timing.)
  double train_seconds = 0;
  int64_t samples = 0;
  for (const auto& e : r->epochs) {
    train_seconds += e.train_seconds;
    samples += e.samples;
  }
  EXPECT_EQ(samples, 1024);
  EXPECT_NEAR(train_seconds, step_seconds, 1e-9);
  EXPECT_LE(train_seconds + r->eval_seconds, wall);
}

TEST(TrainerTest, EvalEveryRecordsNothingByDefault) {
  auto ctx = Context::Create(Device{DeviceType::kCpu, 0});
  ASSERT_TRUE(ctx.ok());
  Dataset train = Synthetic(256);
  Dataset test = Synthetic(64);
  auto model = MakeMlp(**ctx, train.features(), {16}, 10, 32);
  ASSERT_TRUE(model.ok());
  auto params = MakeLocalParams();
  ASSERT_TRUE(params->Setup((*model)->params(), OptimizerOptions{}).ok());
  TrainOptions o;
  o.epochs = 1;
  o.batch = 32;
  o.log_every = 0;
  auto r = Train(**model, *params, train, &test, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->evaluations.empty());
  ASSERT_EQ(r->epochs.size(), 1u);
  EXPECT_GE(r->epochs[0].test_accuracy, 0.0);  // the epoch-end evaluation still runs
  EXPECT_GT(r->eval_seconds, 0.0);
}

TEST(TrainerTest, RejectsANegativeEvalEvery) {
  auto r = TrainTiny([](TrainOptions& o) { o.eval_every = -1; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("eval_every"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace leash::worker
