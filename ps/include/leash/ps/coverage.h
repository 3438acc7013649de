// Data coverage for the job (held by shard 0): the training set is cut into chunks, and
// each epoch's chunks are leased to workers one at a time. A chunk leased to a worker
// that leaves or is evicted goes back to the front of the queue, so every sample is
// trained on at least once per epoch, and exactly once when no worker fails. The next
// epoch's chunks are handed out as soon as the current epoch's are all leased, so a
// fast worker never idles waiting for a slow one to finish its chunk. Pure state (no
// I/O); not thread-safe (owned by the shard's request loop).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "leash/common/domain.h"
#include "leash/common/status.h"

namespace leash::ps {

// The most chunks a plan may cut the training set into: each epoch keeps a few words
// per chunk, so a plan from a buggy or hostile worker must not make shard 0 allocate
// gigabytes (SetPlan refuses larger plans; use a larger --chunk-size).
inline constexpr uint64_t kMaxChunks = uint64_t{1} << 20;

// Chunks of `plan` (without overflow); valid plans have at most kMaxChunks.
inline uint64_t PlanChunks(const DataPlan& plan) {
  return plan.chunk_size == 0
             ? 0
             : plan.num_samples / plan.chunk_size + (plan.num_samples % plan.chunk_size != 0);
}
inline uint32_t PlanNumChunks(const DataPlan& plan) {
  return static_cast<uint32_t>(std::min<uint64_t>(PlanChunks(plan), kMaxChunks));
}

class DataCoverage {
 public:
  // Sets the job's plan. The same plan again is a no-op; another plan once one is set is
  // FailedPrecondition (every worker of a job must agree on data, chunking and epochs).
  // InvalidArgument for zero sizes or more than kMaxChunks chunks.
  Status SetPlan(const DataPlan& plan);
  bool has_plan() const { return plan_.has_value(); }

  // The next chunk for `worker`, kWait while the remaining chunks are leased to others,
  // or kFinished once every epoch is complete; with the progress after it. A worker holds
  // at most one chunk: while it holds one (it asked again without reporting it: a request
  // resent after a lost reply, a reconnect or a failover), the answer is that chunk again,
  // so a resent request never leases a second chunk that nobody would ever train.
  //
  // With `speeds` (work in proportion to speed: the asking worker's samples/s and the
  // others' together, both positive), a worker too slow to finish a chunk before the
  // others would finish all that is left is answered kWait instead of leased one, and
  // the chunk is left to them: it takes the next chunk only while
  //   others / own <= pending + leased_to_others / 2
  // (in chunks: the pending chunks of the open epochs, and the others' chunks in
  // progress, counted half done), and only while another worker has a chunk in progress
  // (it will ask again when done, so what is left is never left to nobody). Equal workers
  // never hold back (others / own is one less than their number); a 3x straggler among
  // two full-speed workers (6) stops taking chunks once fewer than 5 are pending, so the
  // job no longer ends with it training its last chunk alone. Coverage is unchanged:
  // every chunk is still leased until trained. Deterministic in the request and this
  // state (replicas agree).
  struct Speeds {
    double own = 0;
    double others = 0;
  };
  ChunkGrant Next(uint64_t worker, const Speeds* speeds = nullptr);
  // How many requests were answered kWait by the rule above.
  uint64_t held_back() const { return held_back_; }
  // Marks a chunk trained (idempotent; a late report of a re-leased chunk counts once).
  void Complete(uint32_t epoch, uint32_t chunk);
  // Returns every chunk `worker` holds to the queue; the number returned.
  size_t Release(uint64_t worker);

  CoverageProgress Progress() const;
  // Number of times each (epoch, chunk) was reported trained, for tests.
  uint32_t times_completed(uint32_t epoch, uint32_t chunk) const;

  // Progress only, for a shard's own snapshots: a restarted shard's workers register
  // again, so their leases are dropped and the chunks pending again.
  std::vector<uint8_t> Serialize() const;
  // The whole state, leases and the queue's order included, for a replica catching up
  // from a snapshot: it must grant the same chunks as the primary when it applies the log.
  std::vector<uint8_t> SerializeExact() const;
  // Restores the state of Serialize() (leases dropped: their chunks are pending) or of
  // SerializeExact() (as it was).
  static Result<DataCoverage> Deserialize(const std::vector<uint8_t>& bytes);

 private:
  struct Epoch {
    std::vector<uint32_t> completed;      // per chunk: times reported trained
    uint32_t done = 0;                    // chunks with completed > 0
    std::deque<uint32_t> pending;         // not leased, not done
    std::map<uint32_t, uint64_t> leased;  // chunk -> worker
  };
  ChunkGrant Lease(uint64_t worker, const Speeds* speeds);  // Next without the progress
  // Whether a worker of `speeds` leaves the remaining chunks to the others (see Next).
  bool HoldBack(const Speeds& speeds) const;
  ChunkGrant Grant(uint32_t epoch, uint32_t chunk) const;
  std::vector<uint8_t> Encode(bool exact) const;
  Epoch& Open(uint32_t e);
  void Advance();

  std::optional<DataPlan> plan_;
  uint32_t current_ = 0;              // first epoch not complete
  std::map<uint32_t, Epoch> epochs_;  // current_ and possibly current_ + 1
  uint64_t held_back_ = 0;
};

}  // namespace leash::ps
