// The in-memory coordinator of unit tests (memory_coordinator.h). Thread-safe (one mutex).
#include "support/memory_coordinator.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace leash::testing {

namespace {

std::string ShapeText(uint32_t num_shards, uint32_t replicas) {
  return std::to_string(num_shards) + " shards x " + std::to_string(replicas) + " replicas";
}

}  // namespace

class MemoryCoordinator final : public Coordinator {
 public:
  MemoryCoordinator(MemoryCoordinatorService* s, uint32_t num_shards, uint32_t replicas)
      : s_(s), num_shards_(num_shards), replicas_(replicas) {}
  ~MemoryCoordinator() override { (void)Leave(); }

  Status Join(uint32_t shard, const ReplicaAddress& self) override {
    if (shard >= num_shards_) {
      return InvalidArgument("shard " + std::to_string(shard) + " is outside the job's " +
                             std::to_string(num_shards_) + " shards");
    }
    if (self.replica >= replicas_) {
      return InvalidArgument("replica " + std::to_string(self.replica) + " is outside the job's " +
                             std::to_string(replicas_) + " replicas");
    }
    std::lock_guard<std::mutex> lock(s_->mu_);
    s_->RefreshLocked();
    if (s_->unavailable_) return Unavailable("memory coordinator: unavailable (fault injected)");
    if (!s_->shape_recorded_) {
      s_->num_shards_ = num_shards_;
      s_->replicas_ = replicas_;
      s_->shape_recorded_ = true;
    } else if (s_->num_shards_ != num_shards_ || s_->replicas_ != replicas_) {
      return FailedPrecondition("the job has " + ShapeText(s_->num_shards_, s_->replicas_) +
                                ", but this replica was started with " +
                                ShapeText(num_shards_, replicas_));
    }
    if (lease_ != 0) s_->leases_.erase(lease_);
    lease_ = s_->next_lease_++;
    const int64_t now = s_->now_ms_();
    s_->leases_[lease_] = {shard, self, now + s_->ttl_ms_, now, false, false, true};
    shard_ = shard;
    self_ = self.replica;
    held_term_ = 0;
    term_lost_ = false;
    s_->ChangedLocked();
    return Status::Ok();
  }

  uint64_t lease() const { return lease_; }

 private:
  // This handle's keep-alive, run as etcd's keep-alive thread would: a lease that ended
  // while the replica ran on (not cut off, keep-alives not paused, the service up) is
  // noticed once the replica's own view of it ran out, and the replica registers again
  // under a new lease. A term held under the old lease is over: LeaseValid() stays false
  // until the replica hears so (SetInSync or Resign of that term) or wins a new term.
  void NoticeLostLeaseLocked() const {
    if (s_->unavailable_) return;
    auto it = s_->leases_.find(lease_);
    if (it == s_->leases_.end() || it->second.alive || it->second.cut || it->second.paused) return;
    const int64_t now = s_->now_ms_();
    if (now - it->second.keepalive_ms < s_->ttl_ms_ - s_->margin_ms_) return;
    MemoryCoordinatorService::Lease l = it->second;
    s_->leases_.erase(it);
    l.alive = true;
    l.deadline_ms = now + s_->ttl_ms_;
    l.keepalive_ms = now;
    lease_ = s_->next_lease_++;
    s_->leases_[lease_] = l;
    if (held_term_ != 0) term_lost_ = true;
    s_->ChangedLocked();
  }

 public:
  Status Leave() override {
    std::lock_guard<std::mutex> lock(s_->mu_);
    if (lease_ == 0) return Status::Ok();
    auto& st = s_->shards_[shard_];
    if (st.primary_lease == lease_) st.primary_lease.reset();
    s_->leases_.erase(lease_);
    lease_ = 0;
    held_term_ = 0;
    term_lost_ = false;
    s_->ChangedLocked();
    return Status::Ok();
  }

  bool LeaseValid() const override {
    std::lock_guard<std::mutex> lock(s_->mu_);
    s_->RefreshLocked();
    NoticeLostLeaseLocked();
    if (term_lost_) return false;
    auto it = s_->leases_.find(lease_);
    if (it == s_->leases_.end()) return false;
    // What the replica itself knows: its last keep-alive, not the service's view.
    return s_->now_ms_() - it->second.keepalive_ms < s_->ttl_ms_ - s_->margin_ms_;
  }

  Result<std::optional<uint64_t>> Campaign() override {
    std::lock_guard<std::mutex> lock(s_->mu_);
    s_->RefreshLocked();
    LEASH_RETURN_IF_ERROR(s_->RefuseLocked(lease_));
    NoticeLostLeaseLocked();
    auto it = s_->leases_.find(lease_);
    if (it == s_->leases_.end() || !it->second.alive) {
      return FailedPrecondition("this replica's lease has expired; join again");
    }
    auto& st = s_->shards_[shard_];
    if (st.primary_lease) return std::optional<uint64_t>();
    const uint32_t me = it->second.address.replica;
    if (!st.in_sync.empty() && !std::binary_search(st.in_sync.begin(), st.in_sync.end(), me))
      return std::optional<uint64_t>();
    st.primary_lease = lease_;
    ++st.term;
    held_term_ = st.term;
    term_lost_ = false;
    s_->ChangedLocked();
    return std::optional<uint64_t>(st.term);
  }

  Status SetInSync(uint64_t term, const std::vector<uint32_t>& in_sync) override {
    std::lock_guard<std::mutex> lock(s_->mu_);
    s_->RefreshLocked();
    LEASH_RETURN_IF_ERROR(s_->RefuseLocked(lease_));
    if (s_->fail_set_in_sync_ > 0) {
      --s_->fail_set_in_sync_;
      return Unavailable("memory coordinator: SetInSync failed (fault injected)");
    }
    NoticeLostLeaseLocked();
    std::vector<uint32_t> v = in_sync;
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    if (!std::binary_search(v.begin(), v.end(), self_)) {
      return InvalidArgument("the in-sync set of shard " + std::to_string(shard_) +
                             " must hold its primary, replica " + std::to_string(self_));
    }
    if (!v.empty() && v.back() >= replicas_) {
      return InvalidArgument("replica " + std::to_string(v.back()) + " is outside the job's " +
                             std::to_string(replicas_) + " replicas");
    }
    if (term_lost_ && term == held_term_) {
      term_lost_ = false;
      held_term_ = 0;
      return FailedPrecondition("the lease under which replica " + std::to_string(self_) +
                                " became primary in term " + std::to_string(term) +
                                " expired; stop acting as primary");
    }
    auto& st = s_->shards_[shard_];
    if (st.term != term || st.primary_lease != lease_) {
      if (held_term_ == term) held_term_ = 0;
      return FailedPrecondition("term " + std::to_string(term) + " is over (the shard is at term " +
                                std::to_string(st.term) + ")");
    }
    if (v != st.in_sync) {
      st.in_sync = std::move(v);
      s_->ChangedLocked();
    }
    return Status::Ok();
  }

  Status Resign(uint64_t term) override {
    std::lock_guard<std::mutex> lock(s_->mu_);
    if (term == held_term_) {
      held_term_ = 0;
      term_lost_ = false;
    }
    auto& st = s_->shards_[shard_];
    if (st.term == term && st.primary_lease == lease_) {
      st.primary_lease.reset();
      s_->ChangedLocked();
    }
    return Status::Ok();
  }

 private:
  MemoryCoordinatorService* s_;
  const uint32_t num_shards_;
  const uint32_t replicas_;
  // The keep-alive's state (changed by NoticeLostLeaseLocked, also from LeaseValid).
  mutable uint64_t lease_ = 0;
  mutable uint64_t held_term_ = 0;  // the term this replica won and has not heard is over
  mutable bool term_lost_ = false;
  uint32_t shard_ = 0;
  uint32_t self_ = 0;
};

class MemoryDirectory final : public ShardDirectory {
 public:
  explicit MemoryDirectory(MemoryCoordinatorService* s) : s_(s) {}

  Result<ClusterView> View() override {
    std::lock_guard<std::mutex> lock(s_->mu_);
    s_->RefreshLocked();
    if (s_->unavailable_) return Unavailable("memory coordinator: unavailable (fault injected)");
    if (!s_->shape_recorded_) return NotFound("no replica of the job has registered yet");
    return s_->ViewLocked();
  }

  Result<ClusterView> WaitForChange(int64_t after_revision,
                                    std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(s_->mu_);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      s_->RefreshLocked();
      if (s_->unavailable_) return Unavailable("memory coordinator: unavailable (fault injected)");
      if (s_->revision_ > after_revision || std::chrono::steady_clock::now() >= deadline)
        return s_->ViewLocked();
      // Leases end on the injected clock, seen only when someone looks: look every 5 ms.
      s_->changed_.wait_for(lock, std::chrono::milliseconds(5));
    }
  }

 private:
  MemoryCoordinatorService* s_;
};

MemoryCoordinatorService::MemoryCoordinatorService(uint32_t num_shards, uint32_t replicas,
                                                   std::function<int64_t()> now_ms, int64_t ttl_ms,
                                                   int64_t margin_ms)
    : now_ms_(std::move(now_ms)),
      ttl_ms_(ttl_ms),
      margin_ms_(margin_ms),
      num_shards_(num_shards),
      replicas_(replicas) {}

MemoryCoordinatorService::MemoryCoordinatorService(std::function<int64_t()> now_ms, int64_t ttl_ms,
                                                   int64_t margin_ms)
    : now_ms_(std::move(now_ms)), ttl_ms_(ttl_ms), margin_ms_(margin_ms) {}

MemoryCoordinatorService::~MemoryCoordinatorService() = default;

std::unique_ptr<Coordinator> MemoryCoordinatorService::Connect() {
  return std::make_unique<MemoryCoordinator>(this, num_shards_, replicas_);
}

std::unique_ptr<Coordinator> MemoryCoordinatorService::Connect(uint32_t num_shards,
                                                               uint32_t replicas) {
  return std::make_unique<MemoryCoordinator>(this, num_shards, replicas);
}

std::unique_ptr<ShardDirectory> MemoryCoordinatorService::Directory() {
  return std::make_unique<MemoryDirectory>(this);
}

void MemoryCoordinatorService::ChangedLocked() {
  ++revision_;
  changed_.notify_all();
}

Status MemoryCoordinatorService::RefuseLocked(uint64_t lease) const {
  if (unavailable_) return leash::Unavailable("memory coordinator: unavailable (fault injected)");
  auto it = leases_.find(lease);
  if (it != leases_.end() && it->second.cut) {
    return leash::Unavailable("memory coordinator: this replica is cut off (fault injected)");
  }
  return Status::Ok();
}

void MemoryCoordinatorService::RefreshLocked() {
  // A coordinator that is down ends no lease either (etcd's leases outlive its restart).
  if (unavailable_) return;
  const int64_t now = now_ms_();
  for (auto& [id, l] : leases_) {
    if (!l.alive) continue;
    if (!l.cut && !l.paused) {
      l.deadline_ms = now + ttl_ms_;
      l.keepalive_ms = now;
      continue;
    }
    if (now < l.deadline_ms) continue;
    l.alive = false;
    auto& st = shards_[l.shard];
    if (st.primary_lease == id) st.primary_lease.reset();
    ChangedLocked();
  }
}

ClusterView MemoryCoordinatorService::ViewLocked() const {
  ClusterView v;
  v.num_shards = num_shards_;
  v.replicas = replicas_;
  v.revision = revision_;
  for (uint32_t s = 0; s < num_shards_; ++s) {
    ShardView sv;
    sv.shard = s;
    if (auto it = shards_.find(s); it != shards_.end()) {
      sv.in_sync = it->second.in_sync;
      if (it->second.primary_lease) {
        sv.term = it->second.term;
        sv.primary = leases_.at(*it->second.primary_lease).address;
      }
    }
    for (const auto& [id, l] : leases_)
      if (l.alive && l.shard == s) sv.live.push_back(l.address);
    std::sort(sv.live.begin(), sv.live.end(), [](const ReplicaAddress& a, const ReplicaAddress& b) {
      return a.replica < b.replica;
    });
    v.shards.push_back(std::move(sv));
  }
  return v;
}

ShardView MemoryCoordinatorService::View(uint32_t shard) {
  std::lock_guard<std::mutex> lock(mu_);
  RefreshLocked();
  return ViewLocked().shards.at(shard);
}

void MemoryCoordinatorService::ExpireLease(uint32_t shard, uint32_t replica) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, l] : leases_) {
    if (!l.alive || l.shard != shard || l.address.replica != replica) continue;
    l.alive = false;
    auto& st = shards_[shard];
    if (st.primary_lease == id) st.primary_lease.reset();
    ChangedLocked();
  }
}

void MemoryCoordinatorService::Partition(uint32_t shard, uint32_t replica, bool cut) {
  std::lock_guard<std::mutex> lock(mu_);
  RefreshLocked();
  for (auto& [id, l] : leases_)
    if (l.shard == shard && l.address.replica == replica) l.cut = cut;
}

void MemoryCoordinatorService::PauseKeepAlives(const Coordinator& c, bool paused) {
  const uint64_t lease = dynamic_cast<const MemoryCoordinator&>(c).lease();
  std::lock_guard<std::mutex> lock(mu_);
  RefreshLocked();
  if (auto it = leases_.find(lease); it != leases_.end()) it->second.paused = paused;
}

void MemoryCoordinatorService::FailSetInSync(int calls) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_set_in_sync_ = calls;
}

void MemoryCoordinatorService::SetUnavailable(bool unavailable) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!unavailable) {
    const int64_t now = now_ms_();
    for (auto& [id, l] : leases_)
      if (l.alive) l.deadline_ms = std::max(l.deadline_ms, now + ttl_ms_);
  }
  unavailable_ = unavailable;
  RefreshLocked();
}

}  // namespace leash::testing
