// UpdateThreads: threads that share one large elementwise update (an optimizer step, a
// sum of weighted gradients) with the thread that asks for it, each taking its own range.
//
// Why: a shard applies every push on its one request loop, and a table's update is
// memory-bound: one thread streams its values, optimizer state and gradient at a fraction of
// what the memory system gives several. At staleness 0 the workers wait for that update
// before their next pull, so it is on every iteration's critical path (docs/semantics.md,
// "one shard's turnaround"), and a replica's backup applies the same updates again.
//
// Every update split here is elementwise (each value's new state depends on its own value,
// state and gradient only), so any split gives the result of one thread bit for bit; the
// bounds are multiples of kAlign elements all the same, so a vectorized loop's main part and
// tail cover the same elements as in one call, and each range runs under the caller's
// floating-point mode (rounding, flushing of subnormals: ScopedFlushDenormals is per thread).
//
// Thread-compatible: one caller at a time (a shard's request loop). OpenMP's pool would do
// the splitting, but its idle threads spin for a process-wide, environment-only time: on a
// machine whose cores the workers use, that spinning takes their cycles.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "leash/common/message.h"

namespace leash::ps {

class UpdateThreads {
 public:
  static constexpr size_t kAlign = 64;  // elements: a range's bounds are multiples of this
  // Elements a range gets at least, by default: below ~128 Ki floats per range, waking a
  // thread costs about what it saves (measured on 2 cores: 1 Mi floats of momentum update in
  // 1.1-1.2 ms on two threads against 1.5-1.9 ms on one; 256 Ki floats no faster; 64 Ki
  // slower).
  static constexpr size_t kDefaultMinRange = size_t{128} << 10;

  // `threads` in all, the caller included (1: no thread is started, Run calls fn once on the
  // caller). `min_range`: the fewest elements a range gets (rounded up to kAlign).
  explicit UpdateThreads(int threads, size_t min_range = kDefaultMinRange);
  ~UpdateThreads();
  UpdateThreads(const UpdateThreads&) = delete;
  UpdateThreads& operator=(const UpdateThreads&) = delete;

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }
  // Ranges Run splits n elements into: at most threads(), each at least min_range but the last.
  size_t Ranges(size_t n) const;
  // Updates that were split over more than one thread.
  uint64_t split_runs() const { return split_runs_; }

  // Calls fn(begin, end) for disjoint ranges covering [0, n) (Ranges(n) of them, bounds
  // multiples of kAlign but n), the first on the calling thread and the others on this
  // object's threads under the caller's floating-point mode; returns once every call has
  // returned. fn must not throw.
  template <typename Fn>
  void Run(size_t n, Fn&& fn) {
    RunCounted(n, fn, &split_runs_);
  }

  // Run for a pass that is not an update (a copy, a check; the functions below): counted by
  // split_passes() instead of split_runs().
  template <typename Fn>
  void RunPass(size_t n, Fn&& fn) {
    RunCounted(n, fn, &split_passes_);
  }
  // Passes (RunPass) that were split over more than one thread.
  uint64_t split_passes() const { return split_passes_; }

  // The number of threads for a --update-threads setting: `setting` itself if positive,
  // else (0: automatic) half the cores this process may run on, 1 to 4.
  static int Resolve(int setting);

 private:
  using Trampoline = void (*)(void*, size_t, size_t);
  // Run, adding 1 to *splits when the job is split.
  template <typename Fn>
  void RunCounted(size_t n, Fn& fn, uint64_t* splits) {
    const size_t ranges = Ranges(n);
    if (ranges <= 1) {
      if (n > 0) fn(size_t{0}, n);
      return;
    }
    ++*splits;
    RunSplit(n, ranges, &fn, [](void* f, size_t b, size_t e) { (*static_cast<Fn*>(f))(b, e); });
  }
  void RunSplit(size_t n, size_t ranges, void* fn, Trampoline call);
  void Loop(size_t index);

  const size_t min_range_;
  std::vector<std::thread> helpers_;
  std::mutex mu_;
  std::condition_variable start_;
  std::condition_variable done_;
  // The job, written under mu_ before generation_ moves.
  uint64_t generation_ = 0;
  bool stop_ = false;
  void* fn_ = nullptr;
  Trampoline call_ = nullptr;
  uint64_t mode_ = 0;  // the caller's FloatingPointMode()
  size_t n_ = 0;
  size_t range_ = 0;    // elements per range (a multiple of kAlign)
  size_t ranges_ = 0;   // ranges of the job
  size_t pending_ = 0;  // helper ranges not finished yet
  uint64_t split_runs_ = 0;
  uint64_t split_passes_ = 0;
};

// Passes over large frames on a shard's request loop, shared by `threads` as Run shares an
// update (null: on the caller alone). Copies and checks for NaN and Inf are elementwise, so
// any split gives the result of one call. Like an update, such a pass is on the critical
// path of every request behind it: a pull reply written into a same-host worker's ring, a
// primary's copy of a log entry into its backup's ring, the check of a pushed gradient.

// AllFinite(p, n).
bool AllFiniteShared(UpdateThreads* threads, const float* p, size_t n);
// CopyAllFinite(dst, src, bytes): true if the bytes written are whole float32s, all finite
// (what was checked is what was written, even if `src` changes meanwhile).
bool CopyAllFiniteShared(UpdateThreads* threads, void* dst, const void* src, size_t bytes);
// Frame::CopyCheckingFinite(data, bytes): a FrameCopier for a shard's transport.
Frame CopyCheckingFiniteShared(UpdateThreads* threads, const void* data, size_t bytes);
// Copies every unstable frame of `m` (Frame::unstable: still in its sender's ring) out, as
// CopyCheckingFiniteShared; the others stay as they are.
void StabilizeShared(UpdateThreads* threads, Message* m);
// True if a frame of `m` is unstable.
bool HasUnstable(const Message& m);

}  // namespace leash::ps
