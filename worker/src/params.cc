// Remote (cluster) and local (in-process) parameter stores.
#include "leash/worker/params.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>

#include "leash/ps/coverage.h"
#include "leash/ps/sparse_table.h"
#include "leash/ps/table.h"

namespace leash::worker {

TableSpec MakeTableSpec(const ParamSpec& p, const OptimizerOptions& opt, size_t index) {
  TableSpec t;
  t.name = p.name;
  t.rows = p.rows;
  t.cols = p.cols;
  t.optimizer.kind = opt.kind;
  t.optimizer.lr = opt.learning_rate;
  t.optimizer.momentum = opt.momentum;
  t.optimizer.weight_decay = opt.weight_decay;
  t.init.kind = p.init;
  t.init.scale = p.init_scale;
  t.init.seed = opt.seed * 1000003ULL + index;
  return t;
}

TableSpec MakeSparseTableSpec(const ParamSpec& p, const OptimizerOptions& opt) {
  TableSpec t = MakeTableSpec(p, opt, 0);
  t.kind = TableKind::kSparse;
  t.rows = 0;
  t.init.seed = opt.seed * 1000003ULL + 999983ULL;
  return t;
}

namespace {

class RemoteParams final : public ParamStore {
 public:
  RemoteParams(Client* client, int64_t staleness, bool clock_with_pull, bool pull_in_place)
      : client_(client),
        prefetch_(staleness >= 1),
        clock_with_pull_(clock_with_pull),
        in_place_(pull_in_place) {}

  Status Setup(const std::vector<ParamSpec>& params, const OptimizerOptions& opt) override {
    for (size_t i = 0; i < params.size(); ++i) {
      LEASH_ASSIGN_OR_RETURN(TableHandle h, client_->CreateTable(MakeTableSpec(params[i], opt, i)));
      tables_.push_back(std::move(h));
    }
    copy_.assign(tables_.size(), in_place_ ? 0 : 1);
    view_.assign(tables_.size(), {});
    return Status::Ok();
  }

  std::span<const float> InPlace(size_t i) const override {
    return i < view_.size() ? view_[i] : std::span<const float>();
  }

  Status PullAll(std::vector<std::vector<float>>* values) override {
    if (!next_futures_.empty()) {
      bool usable = next_clock_ == client_->clock();
      Status st = Wait(&next_futures_);
      if (usable && st.ok()) {
        values->swap(next_);
        Settle(values, &next_pulled_);
        CatchUp(next_read_.load());
        return Status::Ok();
      }
      // A prefetch for another clock (the worker rejoined) or a failed one: pull again.
    }
    read_.store(kNoClock);
    StartPulls(values, &pulled_, -1, &futures_, {}, nullptr, &read_);
    LEASH_RETURN_IF_ERROR(Wait(&futures_));
    Settle(values, &pulled_);
    CatchUp(read_.load());
    return Status::Ok();
  }

  Status SetupSparse(const ParamSpec& p, const OptimizerOptions& opt) override {
    LEASH_ASSIGN_OR_RETURN(sparse_, client_->CreateTable(MakeSparseTableSpec(p, opt)));
    return Status::Ok();
  }

  Status PullAllSparse(std::vector<std::vector<float>>* values, std::span<const uint64_t> keys,
                       std::vector<float>* rows) override {
    if (!next_futures_.empty()) {
      const bool same_keys = !next_keys_.empty() && std::ranges::equal(keys, next_keys_);
      const bool usable = next_clock_ == client_->clock();
      Status st = Wait(&next_futures_);
      if (usable && st.ok()) {
        values->swap(next_);
        Settle(values, &next_pulled_);
        CatchUp(next_read_.load());
        if (same_keys) {
          rows->swap(next_rows_);
          return Status::Ok();
        }
        // Other keys than prefetched (an evaluation): the rows go alone.
        rows->resize(keys.size() * sparse_.cols);
        if (keys.empty()) return Status::Ok();
        return client_->PullSparse(sparse_, keys, rows->data())
            .get()
            .WithContext("pull '" + sparse_.name + "'");
      }
      // A prefetch for another clock (the worker rejoined) or a failed one: pull again.
    }
    rows->resize(keys.size() * sparse_.cols);
    read_.store(kNoClock);
    StartPulls(values, &pulled_, -1, &futures_, keys, rows->data(), &read_);
    LEASH_RETURN_IF_ERROR(Wait(&futures_));
    Settle(values, &pulled_);
    CatchUp(read_.load());
    return Status::Ok();
  }

  void PushSparse(std::span<const uint64_t> keys, const float* grad) override {
    if (keys.empty()) return;
    Hold();
    pending_.push_back(client_->PushSparse(sparse_, keys, grad, weight_));
    held_bytes_ += keys.size() * sparse_.cols * sizeof(float);
  }

  void Prefetch() override { PrefetchSparse({}); }

  void PrefetchSparse(std::span<const uint64_t> keys) override {
    if (!prefetch_ || !next_futures_.empty()) return;
    next_clock_ = client_->clock() + 1;
    next_keys_.assign(keys.begin(), keys.end());
    next_rows_.resize(next_keys_.size() * sparse_.cols);
    next_read_.store(kNoClock);
    StartPulls(&next_, &next_pulled_, next_clock_, &next_futures_, next_keys_, next_rows_.data(),
               &next_read_);
  }

  // An iteration's pushes are held and go out with its clock, one message per shard,
  // unless they add up to a bucket's worth first: those go at once, so a large gradient
  // that backward produces early (the CNN's dense layer) still travels while the layers
  // below compute, as in DDP's gradient buckets.
  void Push(size_t i, const float* grad) override {
    Hold();
    pending_.push_back(client_->Push(tables_[i], grad, weight_));
    Held(tables_[i].size() * sizeof(float));
  }

  void PushHandedOver(size_t i, std::shared_ptr<const float> grad) override {
    Hold();
    pending_.push_back(client_->Push(tables_[i], std::move(grad), weight_));
    Held(tables_[i].size() * sizeof(float));
  }

  std::shared_ptr<float> PushBuffer(size_t i) override {
    return i < tables_.size() ? client_->PushBuffer(tables_[i]) : nullptr;
  }

  Status EndIteration() override { return End(/*send=*/true); }

  // The client keeps holding the pushes and the clock: the pull's StartPulls adds its
  // requests to them and flushes the lot as one message per shard (any Wait flushes too).
  // Not with replicated shards: there a reply waits until everything logged before it has
  // committed on the backups, so the pushes and the clock go at once to commit while the
  // worker swaps its values in, and the pull that follows is not held up behind them.
  Status EndIterationBeforePull() override { return End(/*send=*/!clock_with_pull_); }

  Status Finish() override {
    holding_ = false;
    client_->FlushSends();
    (void)Wait(&next_futures_);
    Status first;
    for (auto& f : pending_) {
      Status st = f.get();
      if (!st.ok() && first.ok()) first = st;
    }
    for (auto& f : clocks_) {
      Status st = f.get();
      if (!st.ok() && first.ok()) first = st;
    }
    pending_.clear();
    clocks_.clear();
    Status leave = client_->Leave();
    return first.ok() ? leave : first;
  }

  // An iteration without data: first waits, as a pull does, until the staleness bound lets
  // this worker's clock move on (one row of a dense table: the bound's wait without the
  // model's bytes), then clocks. An idle worker so follows the others' clocks as they move
  // instead of holding the minimum back between fixed sleeps.
  Status Idle() override {
    if (const TableHandle* t = BoundTable()) {
      const uint64_t key = 0;
      idle_row_.resize(t->cols);
      LEASH_RETURN_IF_ERROR(client_->Pull(*t, std::span<const uint64_t>(&key, 1), idle_row_.data())
                                .get()
                                .WithContext("idle wait for the staleness bound"));
    }
    idle_ = true;
    Status st = EndIteration();
    idle_ = false;
    return st;
  }

  bool idle_waits_for_bound() const override { return BoundTable() != nullptr; }

  // With a measured speed, the shard may leave the job's last chunks to faster workers
  // (DataCoverage::Next): it gets this worker's speed and the others' (the shards' last sum
  // less what this worker put into it).
  Result<ChunkGrant> NextChunk(const DataPlan& plan, const ChunkDone* done) override {
    const double others = client_->cluster_samples_per_second() - reported_;
    return client_->NextChunk(plan, done, static_cast<float>(rate_),
                              static_cast<float>(std::max(0.0, others)));
  }

  bool needs_rejoin() const override { return client_->needs_rejoin(); }

  Status Rejoin() override {
    // Pushes, clocks and prefetches of the old incarnation are void now: drop them.
    holding_ = false;
    client_->FlushSends();
    (void)Wait(&next_futures_);
    for (auto& f : pending_) f.wait();
    for (auto& f : clocks_) f.wait();
    pending_.clear();
    clocks_.clear();
    previous_ = 0;
    return client_->Rejoin();
  }

  int64_t clock() const override { return client_->clock(); }

  void SetPushWeight(PushWeight weight) override { weight_ = weight; }
  void SetSamplesPerSecond(double rate) override { rate_ = rate; }
  double cluster_samples_per_second() const override {
    return client_->cluster_samples_per_second();
  }

 private:
  void Hold() {
    if (holding_) return;
    client_->HoldSends();
    holding_ = true;
    held_bytes_ = 0;
  }
  // A dense push of `bytes` joined the held ones: a bucket's worth goes at once.
  void Held(size_t bytes) {
    held_bytes_ += bytes;
    if (held_bytes_ >= kPushBucketBytes) {
      client_->FlushSends();
      client_->HoldSends();
      held_bytes_ = 0;
    }
  }

  // The dense table whose first row Idle() pulls to wait for the bound; null if none.
  const TableHandle* BoundTable() const {
    for (const TableHandle& t : tables_) {
      if (t.kind == TableKind::kDense && t.rows > 0) return &t;
    }
    return nullptr;
  }

  // Pulls every table, and the sparse table's rows of `keys` into `rows` when there are
  // keys, in one message per shard.
  // `read` is lowered to the smallest minimum clock the dense replies reflect.
  // Tables pulled in place (copy_[i] 0) go into `pulled`, the others into `values`.
  void StartPulls(std::vector<std::vector<float>>* values, std::vector<PulledValues>* pulled,
                  int64_t for_clock, std::vector<Future>* futs, std::span<const uint64_t> keys,
                  float* rows, std::atomic<int64_t>* read) {
    values->resize(tables_.size());
    pulled->resize(tables_.size());
    client_->HoldSends();
    for (size_t i = 0; i < tables_.size(); ++i) {
      std::vector<float>& v = (*values)[i];
      if (copy_[i] == 0) {
        if (!v.empty()) std::vector<float>().swap(v);  // never read: InPlace(i) is
        futs->push_back(client_->PullInPlace(tables_[i], &(*pulled)[i], for_clock, read));
        continue;
      }
      v.resize(tables_[i].size());
      futs->push_back(client_->Pull(tables_[i], v.data(), for_clock, read));
    }
    if (!keys.empty()) futs->push_back(client_->PullSparse(sparse_, keys, rows, for_clock));
    client_->FlushSends();
  }

  // After a pull of `pulled` (and `values`) completed: what it pulled in place is what
  // InPlace offers from now on, where one piece holds a table and nothing was copied to make
  // it. A table whose piece was copied or widened anyway (see MakeRemoteParams), or that
  // came in several pieces, is copied into values[i] this time and pulled into values from
  // then on: a copy into the same array each iteration, not into memory of its own. The
  // replies InPlace offered until now are let go here, never by a pull that fails, so a
  // model reading them stays on valid memory until a pull succeeds.
  void Settle(std::vector<std::vector<float>>* values, std::vector<PulledValues>* pulled) {
    shown_.resize(tables_.size());
    for (size_t i = 0; i < tables_.size(); ++i) {
      view_[i] = {};
      if ((*pulled)[i].size() == 0) {  // pulled into values[i]
        shown_[i] = PulledValues();
        continue;
      }
      shown_[i] = std::move((*pulled)[i]);
      (*pulled)[i] = PulledValues();
      const std::span<const float> whole = shown_[i].contiguous();
      if (!whole.empty() && shown_[i].copied_bytes() == 0) {
        view_[i] = whole;
        continue;
      }
      (*values)[i].resize(tables_[i].size());
      shown_[i].CopyTo((*values)[i].data());
      shown_[i] = PulledValues();
      copy_[i] = 1;
    }
  }

  // The iteration's clock, after its pushes in the same held batch; sent now, or with the
  // next pull when !send.
  Status End(bool send) {
    // With a measured speed, an idle iteration reports -1: no data to train, so the
    // workers still training share the global batch among them.
    const float speed = idle_ && rate_ > 0 ? -1.f : static_cast<float>(rate_);
    if (!send && !holding_) client_->HoldSends();  // no push this iteration: the clock alone
    clocks_.push_back(client_->Clock(speed));
    reported_ = std::max(0.f, speed);
    holding_ = false;
    if (send) client_->FlushSends();
    // The previous iteration's pushes must be done before this one's go on: it bounds
    // what is in flight to two iterations.
    Status first;
    for (size_t k = 0; k < previous_; ++k) {
      Status st = pending_.front().get();
      pending_.pop_front();
      if (!st.ok() && first.ok()) first = st.WithContext("push");
    }
    previous_ = pending_.size();
    while (clocks_.size() > 2) {
      Status st = clocks_.front().get();
      clocks_.pop_front();
      if (!st.ok() && first.ok()) first = st.WithContext("clock");
    }
    return first;
  }

  // Values read at minimum clock `read`, ahead of this worker's clock: the shards'
  // --backup-workers let the others run ahead of this one. Its clock moves up to `read`
  // (no-op otherwise, and never without backup workers, where the minimum never passes a
  // live worker), so its next pushes count as the fresh gradients they are instead of
  // being dropped as ever more stale.
  void CatchUp(int64_t read) {
    if (read == kNoClock || read <= client_->clock()) return;
    clocks_.push_back(client_->CatchUp(read));
  }

  // Waits for every future (clearing the list); the first error names its table.
  Status Wait(std::vector<Future>* futs) {
    Status first;
    for (size_t i = 0; i < futs->size(); ++i) {
      Status st = (*futs)[i].get();
      const std::string& name = i < tables_.size() ? tables_[i].name : sparse_.name;
      if (!st.ok() && first.ok()) first = st.WithContext("pull '" + name + "'");
    }
    futs->clear();
    return first;
  }

  Client* client_;
  bool prefetch_;
  bool clock_with_pull_;
  std::vector<TableHandle> tables_;
  TableHandle sparse_;               // the sparse table, with SetupSparse
  std::vector<uint64_t> next_keys_;  // the keys of the prefetched rows
  std::vector<float> next_rows_;     // their rows (prefetched with next_)
  std::vector<Future> futures_;
  std::vector<std::vector<float>> next_;  // the prefetched values of iteration next_clock_
  // Pulling in place (in_place_): copy_[i] 1 where table i is pulled into values instead.
  // pulled_ and next_pulled_ receive (as values and next_ do); shown_ holds what InPlace
  // offers, view_[i] its values (empty: in values[i]).
  bool in_place_;
  std::vector<uint8_t> copy_;
  std::vector<PulledValues> pulled_, next_pulled_, shown_;
  std::vector<std::span<const float>> view_;
  std::vector<Future> next_futures_;
  int64_t next_clock_ = -1;
  std::deque<Future> pending_;
  bool holding_ = false;  // this iteration's pushes are held until EndIteration
  size_t held_bytes_ = 0;
  static constexpr size_t kPushBucketBytes = size_t{1} << 20;
  std::deque<Future> clocks_;
  static constexpr int64_t kNoClock = INT64_MAX;
  std::atomic<int64_t> read_{kNoClock};       // the minimum clock the last pull reflects
  std::atomic<int64_t> next_read_{kNoClock};  // the same of the prefetch
  PushWeight weight_;            // of this iteration's pushes (work in proportion to speed)
  double rate_ = 0;              // this worker's speed, reported with its clocks; 0: not measured
  double reported_ = 0;          // the speed its last clock reported, 0 if idle
  std::vector<float> idle_row_;  // Idle()'s one-row pull
  bool idle_ = false;            // the iteration being ended trained nothing (Idle)
  size_t previous_ = 0;  // pushes at the front of pending_ that belong to the previous iteration
};

// The same tables, initializers and optimizers a shard runs, in this process.
class LocalParams final : public ParamStore {
 public:
  Status Setup(const std::vector<ParamSpec>& params, const OptimizerOptions& opt) override {
    for (size_t i = 0; i < params.size(); ++i) {
      TableSpec t = MakeTableSpec(params[i], opt, i);
      uint64_t rows = t.rows;
      LEASH_ASSIGN_OR_RETURN(ps::Table table,
                             ps::Table::Create(static_cast<uint32_t>(i), std::move(t), {0, rows}));
      tables_.push_back(std::make_unique<ps::Table>(std::move(table)));
    }
    return Status::Ok();
  }

  Status PullAll(std::vector<std::vector<float>>* values) override {
    values->resize(tables_.size());
    for (size_t i = 0; i < tables_.size(); ++i) {
      const ps::Table& t = *tables_[i];
      (*values)[i].resize(static_cast<size_t>(t.rows()) * t.cols());
      Rows all;
      all.end = t.rows();
      t.Read(all, (*values)[i].data());
    }
    return Status::Ok();
  }

  void Push(size_t i, const float* grad) override {
    Rows all;
    all.end = tables_[i]->rows();
    tables_[i]->Apply(all, grad);
  }

  Status SetupSparse(const ParamSpec& p, const OptimizerOptions& opt) override {
    LEASH_ASSIGN_OR_RETURN(sparse_, ps::SparseTable::Create(static_cast<uint32_t>(tables_.size()),
                                                            MakeSparseTableSpec(p, opt), &store_,
                                                            ps::SparseTableOptions{}));
    return Status::Ok();
  }

  Status PullAllSparse(std::vector<std::vector<float>>* values, std::span<const uint64_t> keys,
                       std::vector<float>* rows) override {
    LEASH_RETURN_IF_ERROR(PullAll(values));
    if (sparse_ == nullptr) return FailedPrecondition("PullAllSparse before SetupSparse");
    rows->resize(keys.size() * sparse_->cols());
    return sparse_->Read(keys, clock_, rows->data());
  }

  void PushSparse(std::span<const uint64_t> keys, const float* grad) override {
    if (sparse_ == nullptr || keys.empty()) return;
    Status st = sparse_->Apply(keys, grad, clock_);
    if (!st.ok() && push_status_.ok())
      push_status_ = st.WithContext("push '" + sparse_->spec().name + "'");
  }

  Status EndIteration() override {
    ++clock_;
    Status st = push_status_;
    push_status_ = Status::Ok();
    return st;
  }
  Status Idle() override { return Status::Ok(); }

  Result<ChunkGrant> NextChunk(const DataPlan& plan, const ChunkDone* done) override {
    LEASH_RETURN_IF_ERROR(coverage_.SetPlan(plan));
    if (done != nullptr) coverage_.Complete(done->epoch, done->chunk);
    return coverage_.Next(1);
  }

  Status Finish() override { return Status::Ok(); }
  int64_t clock() const override { return clock_; }

 private:
  std::vector<std::unique_ptr<ps::Table>> tables_;
  ps::MemoryRowStore store_;  // the sparse table's cold tier (unused: its budget is unbounded)
  std::unique_ptr<ps::SparseTable> sparse_;
  Status push_status_;  // the first error of this iteration's sparse pushes
  ps::DataCoverage coverage_;
  int64_t clock_ = 0;
};

}  // namespace

std::unique_ptr<ParamStore> MakeRemoteParams(Client* client, int64_t staleness,
                                             bool clock_with_pull, bool pull_in_place) {
  return std::make_unique<RemoteParams>(client, staleness, clock_with_pull, pull_in_place);
}
std::unique_ptr<ParamStore> MakeLocalParams() { return std::make_unique<LocalParams>(); }

}  // namespace leash::worker
