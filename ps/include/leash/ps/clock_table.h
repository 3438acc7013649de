// The staleness controller: per-worker clocks and leases of live workers, the minimum
// live clock (optionally ignoring the b slowest: backup workers), and pulls parked until
// the staleness bound lets them through. Pure state,
// no I/O and no time source of its own (times are passed in), so it is unit-testable.
// Not thread-safe: one shard's request loop owns it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "leash/common/status.h"

namespace leash::ps {

struct LiveWorker {
  uint64_t worker_id = 0;
  uint64_t incarnation = 0;
  std::string name;
  int64_t clock = 0;
  uint64_t last_seq = 0;  // highest push sequence applied from this incarnation
  int64_t last_seen_ms = 0;
  int64_t staleness = -1;  // the bound of this worker's latest pull; -1: none seen yet
  // Work in proportion to speed: the speed it last reported, 0 while it has no data to
  // train (it waits for others to finish the job's last chunks); speed_reported: it has
  // reported one of the two.
  double samples_per_second = 0;
  bool speed_reported = false;
  // Backup workers: the iteration (clock) whose pushes were last decided on, and whether
  // they are dropped (ClockTable::DropPush). -1: none decided yet.
  int64_t push_decided_clock = -1;
  bool push_dropped = false;
};

class ClockTable {
 public:
  // `floor` is the minimum clock to start from (a recovered snapshot's, or 0).
  // `backup_workers` b: the minimum ignores the b slowest live workers (at most all but
  // one), so it is the (b+1)-th smallest live clock (Chen et al. 2016's backup workers).
  explicit ClockTable(int64_t floor = 0, uint32_t backup_workers = 0)
      : floor_(floor), backup_(backup_workers) {}

  // Adds (or re-adds with a new incarnation) a worker, starting at the current minimum
  // clock so it never holds the others back. Registering the same incarnation again
  // keeps its state. Returns the worker's clock. FailedPrecondition for an incarnation
  // older than the one registered.
  Result<int64_t> Register(uint64_t worker_id, uint64_t incarnation, const std::string& name,
                           int64_t now_ms);
  // Restores a worker from a snapshot as it was.
  void Restore(const LiveWorker& w);

  // The live worker `worker_id` of `incarnation`; NotRegistered telling it to
  // re-register if it is unknown (never registered, left, or evicted) or superseded.
  Result<LiveWorker*> Find(uint64_t worker_id, uint64_t incarnation);
  LiveWorker* FindAny(uint64_t worker_id);

  // Advances a worker's clock. Clocks never go back: a lower value is ignored.
  // Returns true if the minimum clock moved.
  bool Advance(LiveWorker* w, int64_t clock);

  // Removes a worker (graceful leave or eviction). Returns true if it was live.
  bool Remove(uint64_t worker_id);

  // Workers whose last sign of life is older than `lease_ms`.
  std::vector<uint64_t> Expired(int64_t now_ms, int64_t lease_ms) const;

  // The minimum clock over live workers, the b slowest left out; with none live, the last
  // minimum (the floor). Never decreases.
  int64_t MinClock() const { return min_clock_; }
  uint32_t backup_workers() const { return backup_; }

  // With backup workers: true when a push from `w` now, for iteration w.clock, lags the
  // minimum by more than w's staleness bound (MinClock() - w.clock > w.staleness), so it
  // is to be dropped. Only a worker the minimum ignores can lag so. Always false without
  // backup workers (the bound then holds for every worker by construction) and for a
  // worker whose bound is not known yet.
  bool TooStale(const LiveWorker& w) const {
    return backup_ > 0 && w.staleness >= 0 && w.clock < min_clock_ - w.staleness;
  }
  // Whether to drop a push of `w` for its current iteration w.clock: decided by TooStale at
  // the iteration's first push and kept for every later push of that iteration, so an
  // iteration's pushes (one per table, or early pushes sent during backward and the rest
  // with the clock) are applied or dropped together, never half of them. An iteration
  // begun within the bound is thus applied whole even if the minimum moves on meanwhile.
  bool DropPush(LiveWorker* w) const {
    if (w->push_decided_clock != w->clock) {
      w->push_decided_clock = w->clock;
      w->push_dropped = TooStale(*w);
    }
    return w->push_dropped;
  }
  size_t live() const { return workers_.size(); }
  // The speeds the live workers reported, summed (work in proportion to speed); 0 while
  // one of them has reported none (it just joined: a sum without it would give each of the
  // others too large a share of the global batch). An idle worker counts 0.
  double TotalSamplesPerSecond() const;
  const std::map<uint64_t, LiveWorker>& workers() const { return workers_; }

  // A pull for iteration `clock` under bound `staleness` may be served once
  // MinClock() >= clock - staleness.
  bool Allows(int64_t clock, int64_t staleness) const { return min_clock_ >= clock - staleness; }

 private:
  // Recomputes the minimum; returns true if it moved.
  bool Recompute();

  std::map<uint64_t, LiveWorker> workers_;
  int64_t floor_;
  int64_t min_clock_ = floor_;
  uint32_t backup_;
  std::vector<int64_t> scratch_;  // the live clocks, to select the (b+1)-th smallest
};

// Pulls waiting for the minimum clock, ordered by the minimum each one needs. `T` is the
// caller's record of the pull.
template <typename T>
class ParkedPulls {
 public:
  void Park(int64_t needed_min_clock, T pull) {
    parked_.emplace(needed_min_clock, std::move(pull));
  }
  // Removes and returns, oldest need first, every pull that `min_clock` allows.
  std::vector<T> Release(int64_t min_clock) {
    std::vector<T> out;
    auto end = parked_.upper_bound(min_clock);
    for (auto it = parked_.begin(); it != end; ++it) out.push_back(std::move(it->second));
    parked_.erase(parked_.begin(), end);
    return out;
  }
  // Drops every parked pull matching `pred` (e.g. of a worker that left).
  template <typename Pred>
  size_t DropIf(Pred pred) {
    size_t n = 0;
    for (auto it = parked_.begin(); it != parked_.end();) {
      if (pred(it->second)) {
        it = parked_.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    return n;
  }
  size_t size() const { return parked_.size(); }

 private:
  std::multimap<int64_t, T> parked_;
};

}  // namespace leash::ps
