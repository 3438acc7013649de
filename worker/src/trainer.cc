// Training loop over leased data chunks, and result reporting. One training thread; the
// ParamStore's client may write pulled values on its I/O thread (see LoadParams).
#include "leash/worker/trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <thread>
#include <unordered_set>
#include <utility>

#include "gradient_pool.h"
#include "proportional.h"

namespace leash::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Per-epoch accumulators of what this worker trained.
struct EpochAcc {
  int64_t steps = 0;
  int64_t samples = 0;
  double loss_sum = 0;
  int64_t correct = 0;
  double seconds = 0;
};

class Loop {
 public:
  Loop(Model& model, ParamStore& params, const Dataset& train, const Dataset* test,
       const TrainOptions& o, const std::atomic<bool>* stop)
      : model_(model),
        params_(params),
        train_(train),
        test_(test),
        o_(o),
        stop_(stop),
        sparse_(model.sparse_param() != nullptr),
        pool_(Sizes(model)) {
    for (const auto& p : model.params()) grads_.emplace_back(p.size());
    sums_.resize(grads_.size());
    bound_.assign(grads_.size(), nullptr);
    ring_bound_.resize(grads_.size());
  }

  // The model must not read values_ once the loop is gone: copies the last values into
  // the model's own buffers (which also leaves it with the parameters it trained last).
  Status ReleaseParams() {
    if (!bound_any_) return Status::Ok();
    bound_any_ = false;
    for (size_t i = 0; i < values_.size(); ++i)
      LEASH_RETURN_IF_ERROR(model_.SetParam(i, Values(i)));
    return Status::Ok();
  }

  // Parameter i's values from the last PullAll: where the store left them in place, else
  // values_[i].
  const float* Values(size_t i) const {
    const std::span<const float> in_place = params_.InPlace(i);
    return in_place.empty() ? values_[i].data() : in_place.data();
  }

  Result<TrainResult> Run() {
    DataPlan plan{static_cast<uint64_t>(train_.count), static_cast<uint32_t>(o_.chunk_size),
                  static_cast<uint32_t>(o_.epochs), o_.seed};
    start_ = Clock::now();
    window_start_ = start_;
    std::optional<ChunkDone> done;
    while (!Stopping()) {
      if (params_.needs_rejoin()) LEASH_RETURN_IF_ERROR(Rejoin());
      auto grant = params_.NextChunk(plan, done ? &*done : nullptr);
      if (!grant.ok()) {
        if (grant.status().code() == StatusCode::kNotRegistered) {
          LEASH_RETURN_IF_ERROR(Rejoin());
          continue;  // the chunk just trained goes to the queue again when the old lease lapses
        }
        return grant.status();
      }
      done.reset();
      LEASH_RETURN_IF_ERROR(ReportEpochs(*grant));
      if (grant->kind == ChunkGrant::Kind::kFinished) break;
      if (grant->kind == ChunkGrant::Kind::kWait) {
        // Others hold the job's last chunks: keep the clock moving with theirs, so that a
        // tight staleness bound never makes them wait for this idle worker. An idle
        // iteration that waits for the bound (ParamStore::Idle) is paced by the workers
        // still training, and the lease is asked for again after each; one that cannot
        // wait is followed by a 50 ms sleep.
        LEASH_RETURN_IF_ERROR(Iterate([&] { return params_.Idle(); }));
        if (!params_.idle_waits_for_bound())
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      auto trained = TrainChunk(*grant);
      if (!trained.ok()) return trained.status();
      if (*trained) {
        done = ChunkDone{grant->epoch, grant->chunk};
        ++result_.chunks_trained;
      }
    }
    result_.iterations = steps_;
    result_.pushes_handed_over = pool_.handed_over() + pushes_from_ring_;
    result_.pushes_from_shared_memory = pushes_from_ring_;
    for (size_t i = 0; i < bound_.size(); ++i) result_.gradient_buffers += pool_.allocated(i);
    return std::move(result_);
  }

 private:
  bool Stopping() const { return stop_ != nullptr && stop_->load(); }

  Status Rejoin() {
    ++result_.rejoins;
    return params_.Rejoin();
  }

  // Runs `step`; a NotRegistered failure (evicted, or a shard restarted without this
  // worker) makes the worker rejoin instead of failing.
  template <typename Step>
  Status Iterate(Step step) {
    Status st = step();
    if (st.code() == StatusCode::kNotRegistered || (st.ok() && params_.needs_rejoin()))
      return Rejoin();
    return st;
  }

  // Trains the samples of one chunk. False if stopped before the chunk was complete.
  // With --accumulate k an iteration is k micro-batches: one pull, the gradients
  // averaged, one push per parameter (sent as the last micro-batch's backward produces
  // it) and one clock.
  Result<bool> TrainChunk(const ChunkGrant& g) {
    std::vector<int64_t> indices;
    for (uint64_t i = g.begin; i < g.end; ++i) indices.push_back(static_cast<int64_t>(i));
    LoaderOptions lo;
    lo.batch_size = o_.batch;
    lo.seed = o_.seed * 7919 + g.chunk;
    if (proportional()) {
      // Grains of the loader make up each iteration's batch of this worker's share.
      lo.batch_size = kGrain;
      lo.prefetch = std::max<int64_t>(4, 2 * o_.global_batch / kGrain);
    }
    BatchLoader loader(train_, std::move(indices), lo, g.epoch);
    held_.reset();
    EpochAcc& acc = epochs_[g.epoch];
    const int64_t k = std::max<int64_t>(1, o_.accumulate);
    std::optional<Batch> batch = Take(loader);
    // A model with embeddings takes the next batch before the pull, to prefetch its rows.
    std::optional<Batch> ahead;
    while (batch) {
      if (Stopping()) return false;
      auto t0 = Clock::now();
      int64_t micro = 0;
      double work = 0;  // compute and injected delay: this worker's own time on the batch
      StepReport report;
      report.epoch = g.epoch;
      LEASH_RETURN_IF_ERROR(Iterate([&]() -> Status {
        if (sparse_ && !ahead) ahead = Take(loader);
        auto p0 = Clock::now();
        LEASH_RETURN_IF_ERROR(BeginIteration(&*batch, ahead ? &*ahead : nullptr));
        result_.pull_seconds += Seconds(p0, Clock::now());
        if (proportional()) {
          params_.SetPushWeight({static_cast<uint32_t>(batch->size),
                                 static_cast<uint32_t>(o_.global_batch), o_.clock_steps});
        }
        double compute = 0;
        while (batch && micro < k) {
          std::optional<Batch> next = ahead ? std::move(ahead) : Take(loader);
          ahead.reset();
          // The next batch travels to the device while this one computes.
          if (next)
            LEASH_RETURN_IF_ERROR(
                model_.PrefetchBatch(next->images.data(), next->labels.data(), next->size));
          bool last = micro + 1 == k || !next;
          auto c0 = Clock::now();
          LEASH_ASSIGN_OR_RETURN(StepStats stats, MicroStep(*batch, micro, last));
          compute += Seconds(c0, Clock::now());
          Account(*batch, stats, &acc);
          report.samples += batch->size;
          report.loss += static_cast<double>(stats.loss) * static_cast<double>(batch->size);
          batch = std::move(next);
          ++micro;
        }
        work = compute + InjectDelay(compute);
        auto e0 = Clock::now();
        // With another batch of this chunk to train, the next call is its pull: the
        // clock may go with it. A sparse model first takes the batch after it from the
        // loader, which may wait: its clock goes now.
        Status end = batch && !sparse_ ? params_.EndIterationBeforePull() : params_.EndIteration();
        result_.push_seconds += Seconds(e0, Clock::now());
        return end;
      }));
      auto t1 = Clock::now();
      if (proportional()) Rebalance(report.samples, work);
      acc.seconds += Seconds(t0, t1);
      ++steps_;
      if (o_.on_step) {
        report.step = steps_;
        report.clock = params_.clock();
        if (report.samples > 0) report.loss /= static_cast<double>(report.samples);
        report.seconds = Seconds(t0, t1);
        report.elapsed_seconds = Seconds(start_, t1);
        report.rejoins = result_.rejoins;
        o_.on_step(report);
      }
      if (o_.log_every > 0 && steps_ % o_.log_every == 0) Progress(g);
      LEASH_RETURN_IF_ERROR(EvaluatePeriodically(batch ? &*batch : nullptr));
    }
    return true;
  }

  // Counts the iteration's compute time and, with step_delay_factor > 1 or in one of this
  // worker's slow spells, sleeps (factor - 1) x as long before the iteration's clock, as a
  // slower machine would. Returns the seconds slept.
  double InjectDelay(double compute) {
    result_.compute_seconds += compute;
    double factor = o_.step_delay_factor;
    if (o_.slow_spells.enabled()) {
      const double now =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      factor *= SpellFactorAt(o_.slow_spells, now);
    }
    if (!(factor > 1.0)) return 0;
    auto d0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>((factor - 1.0) * compute));
    const double slept = Seconds(d0, Clock::now());
    result_.injected_delay_seconds += slept;
    return slept;
  }

  bool proportional() const { return o_.global_batch > 0; }

  // The next batch: the loader's, or with work in proportion to speed, exactly this
  // worker's current share of the global batch, made of the loader's grains (fewer at the
  // end of a chunk). The samples of a grain past the share wait for the next iteration:
  // rounding up to whole grains would give a slow worker with a small share up to
  // kGrain - 1 samples too many on every clock (12% of a 3x straggler's 26), and every
  // other worker would wait for them.
  std::optional<Batch> Take(BatchLoader& loader) {
    if (!proportional()) return loader.Next();
    std::optional<Batch> b = std::move(held_);
    held_.reset();
    if (!b) b = loader.Next();
    if (!b) return b;
    while (b->size < share_) {
      std::optional<Batch> more = loader.Next();
      if (!more) break;
      b->images.insert(b->images.end(), more->images.begin(), more->images.end());
      b->labels.insert(b->labels.end(), more->labels.begin(), more->labels.end());
      b->keys.insert(b->keys.end(), more->keys.begin(), more->keys.end());
      b->size += more->size;
    }
    if (b->size > share_) held_ = SplitOff(*b, share_);
    return b;
  }

  // Leaves the first `keep` (1 <= keep < b.size) samples in `b`; returns the rest.
  static Batch SplitOff(Batch& b, int64_t keep) {
    const size_t n = static_cast<size_t>(b.size);
    const size_t k = static_cast<size_t>(keep);
    const size_t features = b.images.size() / n;
    const size_t slots = b.keys.size() / n;
    Batch rest;
    rest.epoch = b.epoch;
    rest.index = b.index;
    rest.size = b.size - keep;
    rest.images.assign(b.images.begin() + static_cast<std::ptrdiff_t>(k * features),
                       b.images.end());
    rest.labels.assign(b.labels.begin() + static_cast<std::ptrdiff_t>(k), b.labels.end());
    rest.keys.assign(b.keys.begin() + static_cast<std::ptrdiff_t>(k * slots), b.keys.end());
    b.images.resize(k * features);
    b.labels.resize(k);
    b.keys.resize(k * slots);
    b.size = keep;
    return rest;
  }

  // After an iteration of `samples` that took this worker `seconds` of its own: its speed,
  // reported with its next clock, and its share of the global batch from the speeds the
  // shards last summed. A worker that joins, leaves or changes speed moves the sum, and
  // every worker's share follows at its next iteration.
  void Rebalance(int64_t samples, double seconds) {
    rate_.Add(samples, seconds);
    params_.SetSamplesPerSecond(rate_.samples_per_second());
    share_ = ProportionalBatch(o_.global_batch, rate_.samples_per_second(),
                               params_.cluster_samples_per_second(), o_.batch);
  }

  void Account(const Batch& batch, const StepStats& stats, EpochAcc* acc) {
    acc->steps++;
    acc->samples += batch.size;
    acc->loss_sum += static_cast<double>(stats.loss) * static_cast<double>(batch.size);
    acc->correct += stats.correct;
    window_loss_ += static_cast<double>(stats.loss) * static_cast<double>(batch.size);
    window_samples_ += batch.size;
    window_correct_ += stats.correct;
    samples_ += batch.size;
  }

  // With eval_every, after every eval_every-th iteration: pulls the parameters and
  // evaluates them exactly as the epoch ends do, between iterations, so no pull or push
  // of an iteration is in flight and the model's parameter buffers are not in use.
  // PullAll takes the prefetch started for the next iteration (RemoteParams swaps its
  // buffers into values_), so the next iteration pulls afresh under the same bound.
  // `pending` is the batch the next iteration trains, staged ahead during this one; the
  // evaluation's own batches discard that staging, so it is staged again. The time spent
  // here is in no iteration's t0..t1, hence in no train_seconds.
  Status EvaluatePeriodically(const Batch* pending) {
    if (o_.eval_every <= 0 || test_ == nullptr || test_->count < 1 || steps_ % o_.eval_every != 0 ||
        Stopping()) {
      return Status::Ok();
    }
    auto e0 = Clock::now();
    EvalPoint p;
    p.step = steps_;
    p.samples = samples_;
    p.elapsed_seconds = Seconds(start_, e0);
    std::optional<StepStats> stats;
    LEASH_RETURN_IF_ERROR(Iterate([&]() -> Status {
      auto ev = EvaluateAll(*test_);
      if (!ev.ok()) return ev.status().WithContext("evaluation at step " + std::to_string(steps_));
      stats = *ev;
      return Status::Ok();
    }));
    if (pending != nullptr) {
      LEASH_RETURN_IF_ERROR(
          model_.PrefetchBatch(pending->images.data(), pending->labels.data(), pending->size));
    }
    p.eval_seconds = Seconds(e0, Clock::now());
    result_.eval_seconds += p.eval_seconds;
    if (!stats) return Status::Ok();  // this worker rejoined the job instead: no point
    p.test_loss = stats->loss;
    p.test_auc = stats->auc;
    p.test_accuracy = static_cast<double>(stats->correct) / static_cast<double>(test_->count);
    spdlog::info(
        "{} evaluation at step {} ({} samples trained, {:.2f} s): test loss {:.4f}, test accuracy "
        "{:.2f}% "
        "({:.3f} s)",
        o_.label, p.step, p.samples, p.elapsed_seconds, p.test_loss, p.test_accuracy * 100,
        p.eval_seconds);
    result_.evaluations.push_back(p);
    return Status::Ok();
  }

  // `ahead`: a sparse model's next batch, if known, whose rows are prefetched.
  Status BeginIteration(const Batch* batch, const Batch* ahead = nullptr) {
    LEASH_RETURN_IF_ERROR(Pull(batch->keys.data(), batch->size));
    LEASH_RETURN_IF_ERROR(LoadParams());
    // The next iteration's pull overlaps this one's compute. Only after LoadParams: the
    // prefetch writes into the arrays PullAll just swapped out of values_, which the model
    // read until LoadParams bound it to values_ (see there); the same holds for a sparse
    // model's rows (Pull rebound the model to rows_ first).
    if (ahead == nullptr) {
      params_.Prefetch();
      return Status::Ok();
    }
    // The keys the model's SparseKeys will return for that batch: first seen first.
    ahead_keys_.clear();
    ahead_seen_.clear();
    for (uint64_t key : ahead->keys)
      if (key != 0 && ahead_seen_.insert(key).second) ahead_keys_.push_back(key);
    params_.PrefetchSparse(ahead_keys_);
    return Status::Ok();
  }

  // Makes the model read the pulled values (Values): bound in place where it can read host
  // memory (saving a copy of the whole model per iteration), else copied with SetParam.
  //
  // The values a store offers in place (ParamStore::InPlace) are never written at all, and
  // stay valid until the next PullAll that succeeds, after which this function rebinds.
  // Why a bound array of values_ is never written while a TrainStep or Evaluate reads it:
  // - The model reads only values_[i]'s arrays, bound here after every PullAll; nothing
  //   else is bound. values_ is written only by PullAll, on this thread, between steps.
  // - ParamStore::PullAll writes values synchronously: every pull it starts into `values`
  //   is waited for before it returns (RemoteParams::Wait, LocalParams reads in place), and
  //   a pull's reply is decoded into its array only before its future completes (a late
  //   duplicate finds no request in flight and is dropped). That holds for the pull again
  //   after a stale or failed prefetch: it writes the arrays bound last iteration, but no
  //   step runs until this function binds them again.
  // - The only asynchronous writes are RemoteParams' prefetch into its next_ arrays, on
  //   the client's I/O thread. A usable prefetch is swapped into values_ (a swap moves the
  //   heap arrays, it copies and reallocates nothing), so next_ then holds the arrays the
  //   model was bound to; BeginIteration starts the next prefetch into them only after
  //   this function has rebound every parameter to the new values_. Rejoin and Finish wait
  //   for a prefetch in flight; EvaluateAll starts none.
  // - No bound array is reallocated: PullAll resizes each values[i] to its table's size,
  //   the size it already has after the first pull, and a same-size resize keeps the
  //   array. After the first pull, values_ is never resized to another size.
  Status LoadParams() {
    for (size_t i = 0; i < values_.size(); ++i) {
      if (!params_.InPlace(i).empty()) ++result_.params_read_in_place;
      if (bind_) {
        Status st = model_.BindParam(i, Values(i));
        if (st.ok()) {
          bound_any_ = true;
          continue;
        }
        if (st.code() != StatusCode::kFailedPrecondition) return st;
        bind_ = false;  // the model cannot read host memory: copy from now on
      }
      LEASH_RETURN_IF_ERROR(model_.SetParam(i, Values(i)));
    }
    return Status::Ok();
  }

  // Pulls the dense parameters into values_ and, for a model with embeddings, the rows of
  // the `n` examples' keys (n x key_slots at `keys`) into rows_, in the same messages.
  Status Pull(const uint64_t* keys, int64_t n) {
    if (!sparse_) return params_.PullAll(&values_);
    LEASH_ASSIGN_OR_RETURN(sparse_keys_, model_.SparseKeys(keys, n, train_.key_slots));
    LEASH_RETURN_IF_ERROR(params_.PullAllSparse(&values_, sparse_keys_, &rows_));
    return model_.SetSparseRows(rows_.data());
  }

  Result<StepStats> EvaluateAll(const Dataset& test) {
    LEASH_RETURN_IF_ERROR(Pull(test.keys.data(), test.count));
    LEASH_RETURN_IF_ERROR(LoadParams());
    return model_.Evaluate(test.images.data(), test.labels.data(), test.count);
  }

  // Forward and backward of micro-batch `micro` of an iteration; on the `last` one each
  // parameter's (averaged) gradient is pushed as soon as backward produces it. Pushed
  // gradients are handed to the client in buffers of pool_ (sent from there, not copied):
  // with a single micro-batch a CPU model writes them there itself (BindGradient), or
  // straight into the shared-memory ring of a shard on this host (ParamStore::PushBuffer);
  // a GPU model's are copied to host into one, and micro-batches average into one.
  Result<StepStats> MicroStep(const Batch& batch, int64_t micro, bool last) {
    const bool single = micro == 0 && last;
    if (single) BindGradients();
    Status grad_status;
    auto failed = [&](Status s) {
      if (grad_status.ok()) grad_status = std::move(s);
    };
    auto st = model_.TrainStep(batch.images.data(), batch.labels.data(), batch.size, [&](size_t i) {
      if (single) {
        if (ring_bound_[i] != nullptr) {
          ++pushes_from_ring_;
          params_.PushHandedOver(i, std::move(ring_bound_[i]));
          return;
        }
        if (bound_[i] != nullptr) {
          params_.PushHandedOver(i, pool_.HandOver(i, std::exchange(bound_[i], nullptr)));
          return;
        }
        // A model that cannot write into our buffers but keeps its gradient in host
        // memory: pushed from there (Push copies it before returning).
        Result<const float*> host = model_.HostGradient(i);
        if (!host.ok()) return failed(host.status());
        if (*host != nullptr) return params_.Push(i, *host);
        float* buf = pool_.Take(i);
        if (Status gs = model_.Gradient(i, buf); !gs.ok()) {
          pool_.Return(i, buf);
          return failed(gs);
        }
        return params_.PushHandedOver(i, pool_.HandOver(i, buf));
      }
      std::vector<float>& g = grads_[i];
      if (Status gs = model_.Gradient(i, g.data()); !gs.ok()) return failed(gs);
      std::vector<float>& sum = sums_[i];
      if (micro == 0) {
        sum = g;
      } else {
        for (size_t j = 0; j < g.size(); ++j) sum[j] += g[j];
      }
      if (!last) return;
      float* buf = pool_.Take(i);
      const float scale = 1.f / static_cast<float>(micro + 1);
      for (size_t j = 0; j < g.size(); ++j) buf[j] = sum[j] * scale;
      params_.PushHandedOver(i, pool_.HandOver(i, buf));
    });
    // Buffers bound for gradients the step did not announce (it failed): back to the pool.
    for (size_t i = 0; i < bound_.size(); ++i) {
      if (bound_[i] != nullptr) pool_.Return(i, std::exchange(bound_[i], nullptr));
      ring_bound_[i].reset();  // its room in the ring goes back
    }
    LEASH_RETURN_IF_ERROR(grad_status);
    if (st.ok() && sparse_) {
      LEASH_ASSIGN_OR_RETURN(const float* rows_grad, model_.SparseGradient());
      params_.PushSparse(sparse_keys_, rows_grad);
    }
    return st;
  }

  static std::vector<size_t> Sizes(const Model& model) {
    std::vector<size_t> sizes;
    for (const auto& p : model.params()) sizes.push_back(p.size());
    return sizes;
  }

  // Gives the model room for each gradient of the next step: where the parameter store
  // has it, the frame it is sent from (a shard's ring on this host: backward writes the
  // gradient where the shard reads it, and the push copies nothing), else a free buffer
  // of the pool.
  void BindGradients() {
    if (!bind_gradients_) return;
    for (size_t i = 0; i < bound_.size(); ++i) {
      std::shared_ptr<float> ring = params_.PushBuffer(i);
      float* buf = ring != nullptr ? ring.get() : pool_.Take(i);
      if (Status st = model_.BindGradient(i, buf); !st.ok()) {
        if (ring == nullptr) pool_.Return(i, buf);
        spdlog::debug(
            "gradients are copied out of the model, not written where they are sent "
            "from: {}",
            st.ToString());
        bind_gradients_ = false;
        return;
      }
      if (ring != nullptr) {
        ring_bound_[i] = std::move(ring);
      } else {
        bound_[i] = buf;
      }
    }
  }

  void Progress(const ChunkGrant& g) {
    auto now = Clock::now();
    double sps = static_cast<double>(window_samples_) / std::max(1e-9, Seconds(window_start_, now));
    std::printf(
        "%s epoch %u/%lld chunk %u step %lld clock %lld loss %.4f acc %.3f %.0f samples/s\n",
        o_.label.c_str(), g.epoch + 1, static_cast<long long>(o_.epochs), g.chunk,
        static_cast<long long>(steps_), static_cast<long long>(params_.clock()),
        window_loss_ / static_cast<double>(window_samples_),
        static_cast<double>(window_correct_) / static_cast<double>(window_samples_), sps);
    std::fflush(stdout);
    window_loss_ = 0;
    window_samples_ = 0;
    window_correct_ = 0;
    window_start_ = now;
  }

  // Reports (and evaluates the model for) every epoch the job completed since last time.
  Status ReportEpochs(const ChunkGrant& g) {
    while (epochs_reported_ < g.epochs_done) {
      EpochResult r;
      r.epoch = epochs_reported_ + 1;
      const EpochAcc& acc = epochs_[epochs_reported_];
      r.steps = acc.steps;
      r.samples = acc.samples;
      r.train_seconds = acc.seconds;
      if (acc.samples > 0) {
        r.train_loss = acc.loss_sum / static_cast<double>(acc.samples);
        r.train_accuracy = static_cast<double>(acc.correct) / static_cast<double>(acc.samples);
        r.samples_per_second = static_cast<double>(acc.samples) / std::max(1e-9, acc.seconds);
      }
      bool last_pending = epochs_reported_ + 1 < g.epochs_done;  // evaluate once per report
      if (o_.evaluate && test_ != nullptr && !last_pending) {
        auto e0 = Clock::now();
        auto ev = EvaluateAll(*test_);
        result_.eval_seconds += Seconds(e0, Clock::now());
        if (!ev.ok()) return ev.status();
        r.test_loss = ev->loss;
        r.test_auc = ev->auc;
        r.test_accuracy = static_cast<double>(ev->correct) / static_cast<double>(test_->count);
      }
      r.elapsed_seconds = Seconds(start_, Clock::now());
      std::string test_part;
      if (r.test_accuracy >= 0) {
        char buf[96];
        std::snprintf(buf, sizeof buf, ", test loss %.4f, test accuracy %.2f%%", r.test_loss,
                      r.test_accuracy * 100);
        test_part = buf;
        if (r.test_auc >= 0) {
          std::snprintf(buf, sizeof buf, ", test AUC %.4f", r.test_auc);
          test_part += buf;
        }
      }
      std::printf(
          "%s job epoch %lld/%lld done after %.1f s: this worker trained %lld samples (loss %.4f, "
          "acc %.4f, "
          "%.0f samples/s)%s\n",
          o_.label.c_str(), static_cast<long long>(r.epoch), static_cast<long long>(o_.epochs),
          r.elapsed_seconds, static_cast<long long>(r.samples), r.train_loss, r.train_accuracy,
          r.samples_per_second, test_part.c_str());
      std::fflush(stdout);
      result_.epochs.push_back(r);
      ++epochs_reported_;
      if (o_.on_epoch) o_.on_epoch(r);
    }
    return Status::Ok();
  }

  Model& model_;
  ParamStore& params_;
  const Dataset& train_;
  const Dataset* test_;
  const TrainOptions& o_;
  const std::atomic<bool>* stop_;
  const bool sparse_;                      // the model has embeddings in a sparse table
  std::span<const uint64_t> sparse_keys_;  // the distinct keys of the current step
  std::vector<float> rows_;                // their rows, read by the model in place
  std::vector<uint64_t> ahead_keys_;       // the next batch's distinct keys (prefetch)
  std::unordered_set<uint64_t> ahead_seen_;
  std::vector<std::vector<float>> values_;  // the model may be bound to these: see LoadParams
  bool bind_ = true;                        // false once the model refused BindParam
  bool bound_any_ = false;                  // some parameter may be bound to values_
  std::vector<std::vector<float>> grads_;
  std::vector<std::vector<float>> sums_;  // gradient sums over an iteration's micro-batches
  GradientPool pool_;
  std::vector<float*> bound_;  // the pool's buffers the model writes this step's gradients into
  std::vector<std::shared_ptr<float>> ring_bound_;  // or the shared-memory frames it writes into
  int64_t pushes_from_ring_ = 0;                    // gradients pushed from such a frame
  bool bind_gradients_ = true;  // until the model refuses (a GPU, or a model that always copies)
  std::map<uint32_t, EpochAcc> epochs_;
  uint32_t epochs_reported_ = 0;
  TrainResult result_;
  // Work in proportion to speed: the loader's batches are grains of kGrain samples.
  static constexpr int64_t kGrain = 4;
  std::optional<Batch> held_;  // samples taken from the loader for the next batch
  StepRate rate_;
  int64_t share_ = o_.batch;  // this worker's batch for the next iteration
  Clock::time_point start_;
  Clock::time_point window_start_;
  int64_t steps_ = 0;
  int64_t samples_ = 0;  // trained by this worker, all epochs
  double window_loss_ = 0;
  int64_t window_samples_ = 0;
  int64_t window_correct_ = 0;
};

}  // namespace

Result<TrainResult> Train(Model& model, ParamStore& params, const Dataset& train,
                          const Dataset* test, const TrainOptions& o,
                          const std::atomic<bool>* stop) {
  if (o.epochs < 1 || o.batch < 1 || o.chunk_size < 1 || o.chunk_size > UINT32_MAX ||
      o.epochs > UINT32_MAX) {
    return InvalidArgument("need epochs >= 1, batch >= 1 and chunk size >= 1");
  }
  if (o.eval_every < 0) {
    return InvalidArgument("eval_every must be >= 0 (0: no periodic evaluation), got " +
                           std::to_string(o.eval_every));
  }
  if (!(o.step_delay_factor >= 1.0) || !std::isfinite(o.step_delay_factor)) {
    return InvalidArgument("the step delay factor must be finite and >= 1, got " +
                           std::to_string(o.step_delay_factor));
  }
  if (o.global_batch < 0 || o.global_batch > INT32_MAX) {
    return InvalidArgument("the global batch must be in [0, 2^31) (0: off), got " +
                           std::to_string(o.global_batch));
  }
  if (o.global_batch > 0 && o.accumulate != 1) {
    return InvalidArgument(
        "work in proportion to speed (a global batch) trains one batch per iteration; use "
        "--accumulate 1");
  }
  if (train.count < 1) return InvalidArgument("the training set is empty");
  if (model.sparse_param() != nullptr) {
    if (train.key_slots < 1 || (test != nullptr && test->key_slots != train.key_slots))
      return InvalidArgument("the model reads categorical keys; the dataset has none");
    if (o.accumulate != 1)
      return InvalidArgument(
          "a model with embeddings trains one micro-batch per iteration; use "
          "--accumulate 1");
  }
  if (train.features() != model.input_size()) {
    return InvalidArgument("dataset has " + std::to_string(train.features()) +
                           " features per sample, the model expects " +
                           std::to_string(model.input_size()));
  }
  Loop loop(model, params, train, test, o, stop);
  Result<TrainResult> result = loop.Run();
  Status released = loop.ReleaseParams();
  if (result.ok() && !released.ok()) return released;
  return result;
}

Status WriteResultsJson(const std::string& path, const std::string& mode, const TrainOptions& o,
                        const TrainResult& result,
                        const std::vector<std::pair<std::string, double>>& extra) {
  std::ofstream f(path);
  if (!f) return IOError("cannot write results to '" + path + "'");
  f << "{\n  \"mode\": \"" << mode << "\",\n  \"batch\": " << o.batch
    << ",\n  \"accumulate\": " << o.accumulate << ",\n  \"chunk_size\": " << o.chunk_size
    << ",\n  \"chunks_trained\": " << result.chunks_trained
    << ",\n  \"iterations\": " << result.iterations << ",\n  \"rejoins\": " << result.rejoins
    << ",\n  \"eval_every\": " << o.eval_every << ",\n  \"eval_seconds\": " << result.eval_seconds
    << ",\n";
  for (const auto& [key, value] : extra) f << "  \"" << key << "\": " << value << ",\n";
  f << "  \"epochs\": [\n";
  const std::vector<EpochResult>& results = result.epochs;
  for (size_t i = 0; i < results.size(); ++i) {
    const EpochResult& r = results[i];
    f << "    {\"epoch\": " << r.epoch << ", \"steps\": " << r.steps
      << ", \"samples\": " << r.samples << ", \"train_loss\": " << r.train_loss
      << ", \"train_accuracy\": " << r.train_accuracy << ", \"test_loss\": " << r.test_loss
      << ", \"test_auc\": " << r.test_auc << ", \"test_accuracy\": " << r.test_accuracy
      << ", \"train_seconds\": " << r.train_seconds
      << ", \"samples_per_second\": " << r.samples_per_second
      << ", \"elapsed_seconds\": " << r.elapsed_seconds << "}"
      << (i + 1 < results.size() ? ",\n" : "\n");
  }
  f << "  ],\n  \"evaluations\": [\n";
  const std::vector<EvalPoint>& points = result.evaluations;
  for (size_t i = 0; i < points.size(); ++i) {
    const EvalPoint& p = points[i];
    f << "    {\"step\": " << p.step << ", \"samples\": " << p.samples
      << ", \"elapsed_seconds\": " << p.elapsed_seconds
      << ", \"test_accuracy\": " << p.test_accuracy << ", \"test_loss\": " << p.test_loss
      << ", \"test_auc\": " << p.test_auc << ", \"eval_seconds\": " << p.eval_seconds << "}"
      << (i + 1 < points.size() ? ",\n" : "\n");
  }
  f << "  ]\n}\n";
  if (!f) return IOError("error writing '" + path + "'");
  return Status::Ok();
}

}  // namespace leash::worker
