// Staleness controller state. Not thread-safe (owned by one request loop).
#include "leash/ps/clock_table.h"

#include <algorithm>
#include <limits>

namespace leash::ps {

Result<int64_t> ClockTable::Register(uint64_t worker_id, uint64_t incarnation,
                                     const std::string& name, int64_t now_ms) {
  auto it = workers_.find(worker_id);
  if (it != workers_.end()) {
    LiveWorker& w = it->second;
    if (incarnation < w.incarnation) {
      return FailedPrecondition("worker " + std::to_string(worker_id) +
                                " registered with incarnation " + std::to_string(incarnation) +
                                " but incarnation " + std::to_string(w.incarnation) +
                                " is already live; a newer copy of this worker is running");
    }
    if (incarnation == w.incarnation) {
      w.last_seen_ms = now_ms;
      if (!name.empty()) w.name = name;
      return w.clock;
    }
    workers_.erase(it);  // a new incarnation replaces the old one from the current minimum
    Recompute();
  }
  LiveWorker w;
  w.worker_id = worker_id;
  w.incarnation = incarnation;
  w.name = name;
  w.clock = min_clock_;
  w.last_seen_ms = now_ms;
  workers_.emplace(worker_id, w);
  return w.clock;
}

void ClockTable::Restore(const LiveWorker& w) {
  workers_[w.worker_id] = w;
  Recompute();
}

Result<LiveWorker*> ClockTable::Find(uint64_t worker_id, uint64_t incarnation) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return NotRegistered(
        "worker " + std::to_string(worker_id) +
        " is not registered on this shard (it left, was evicted after its lease expired, or "
        "the shard restarted); register again");
  }
  if (it->second.incarnation != incarnation) {
    return NotRegistered("worker " + std::to_string(worker_id) + " incarnation " +
                         std::to_string(incarnation) + " was superseded by incarnation " +
                         std::to_string(it->second.incarnation) + "; register again");
  }
  return &it->second;
}

LiveWorker* ClockTable::FindAny(uint64_t worker_id) {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? nullptr : &it->second;
}

bool ClockTable::Advance(LiveWorker* w, int64_t clock) {
  if (clock <= w->clock) return false;
  w->clock = clock;
  // Always recompute: a worker restored from a snapshot may sit below the minimum (which
  // never goes back), so "was this worker the minimum" is no shortcut.
  return Recompute();
}

bool ClockTable::Remove(uint64_t worker_id) {
  if (workers_.erase(worker_id) == 0) return false;
  Recompute();
  return true;
}

std::vector<uint64_t> ClockTable::Expired(int64_t now_ms, int64_t lease_ms) const {
  std::vector<uint64_t> out;
  for (const auto& [id, w] : workers_) {
    if (now_ms - w.last_seen_ms > lease_ms) out.push_back(id);
  }
  return out;
}

double ClockTable::TotalSamplesPerSecond() const {
  double total = 0;
  for (const auto& [id, w] : workers_) {
    if (!w.speed_reported) return 0;
    total += w.samples_per_second;
  }
  return total;
}

bool ClockTable::Recompute() {
  if (workers_.empty()) return false;  // keep the last minimum as the floor
  int64_t m = std::numeric_limits<int64_t>::max();
  if (backup_ == 0) {
    for (const auto& [id, w] : workers_) m = std::min(m, w.clock);
  } else {
    // The (b+1)-th smallest clock: the b slowest are left out, but never every worker.
    const size_t skip = std::min<size_t>(backup_, workers_.size() - 1);
    scratch_.clear();
    for (const auto& [id, w] : workers_) scratch_.push_back(w.clock);
    std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(skip),
                     scratch_.end());
    m = scratch_[skip];
  }
  // A worker restored from an older snapshot may lag; the minimum never goes back.
  m = std::max(m, floor_);
  if (m == min_clock_) return false;
  bool moved = m > min_clock_;
  min_clock_ = std::max(min_clock_, m);
  return moved;
}

}  // namespace leash::ps
