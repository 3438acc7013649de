#include "leash/ps/update_threads.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <memory>

#include "leash/common/denormals.h"
#include "leash/common/finite.h"

namespace leash::ps {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

UpdateThreads::UpdateThreads(int threads, size_t min_range)
    : min_range_(RoundUp(std::max<size_t>(min_range, 1), kAlign)) {
  for (int i = 1; i < threads; ++i) {
    helpers_.emplace_back([this, i] { Loop(static_cast<size_t>(i)); });
  }
}

UpdateThreads::~UpdateThreads() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

size_t UpdateThreads::Ranges(size_t n) const {
  const size_t most = std::min<size_t>(helpers_.size() + 1, n / min_range_);
  return std::max<size_t>(most, 1);
}

int UpdateThreads::Resolve(int setting) {
  if (setting > 0) return setting;
  int cores = 0;
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores / 2, 1, 4);
}

void UpdateThreads::RunSplit(size_t n, size_t ranges, void* fn, Trampoline call) {
  const size_t range = RoundUp((n + ranges - 1) / ranges, kAlign);
  ranges = (n + range - 1) / range;  // rounding up may leave fewer
  {
    std::lock_guard<std::mutex> l(mu_);
    fn_ = fn;
    call_ = call;
    mode_ = FloatingPointMode();
    n_ = n;
    range_ = range;
    ranges_ = ranges;
    pending_ = ranges - 1;
    ++generation_;
  }
  start_.notify_all();
  call(fn, 0, std::min(range, n));
  std::unique_lock<std::mutex> l(mu_);
  done_.wait(l, [this] { return pending_ == 0; });
}

void UpdateThreads::Loop(size_t index) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    start_.wait(l, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (index >= ranges_) continue;  // a job with fewer ranges than threads
    const size_t begin = index * range_;
    const size_t end = std::min(begin + range_, n_);
    void* fn = fn_;
    Trampoline call = call_;
    const uint64_t mode = mode_;
    l.unlock();
    {
      ScopedFloatingPointMode same_as_caller(mode);
      call(fn, begin, end);
    }
    l.lock();
    if (--pending_ == 0) done_.notify_one();
  }
}

bool AllFiniteShared(UpdateThreads* threads, const float* p, size_t n) {
  if (threads == nullptr) return AllFinite(p, n);
  std::atomic<bool> finite{true};
  threads->RunPass(n, [&](size_t b, size_t e) {
    if (!AllFinite(p + b, e - b)) finite.store(false, std::memory_order_relaxed);
  });
  return finite.load(std::memory_order_relaxed);
}

namespace {

// CopyAllFinite(dst, src, bytes) in ranges of whole floats; bytes past the last whole one go
// with the last range, whose check then says false, as one call over them all would.
bool CopyAllFiniteInRanges(UpdateThreads& threads, void* dst, const uint8_t* src, size_t bytes) {
  const size_t floats = bytes / sizeof(float);
  std::atomic<bool> finite{true};
  auto* d = static_cast<uint8_t*>(dst);
  threads.RunPass(floats, [&](size_t b, size_t e) {
    const size_t from = b * sizeof(float);
    const size_t to = e == floats ? bytes : e * sizeof(float);
    if (!CopyAllFinite(d + from, src + from, to - from))
      finite.store(false, std::memory_order_relaxed);
  });
  return finite.load(std::memory_order_relaxed);
}

bool Splits(UpdateThreads* threads, size_t bytes) {
  return threads != nullptr && threads->Ranges(bytes / sizeof(float)) > 1;
}

}  // namespace

bool CopyAllFiniteShared(UpdateThreads* threads, void* dst, const void* src, size_t bytes) {
  if (!Splits(threads, bytes)) return bytes > 0 && CopyAllFinite(dst, src, bytes);
  return CopyAllFiniteInRanges(*threads, dst, static_cast<const uint8_t*>(src), bytes);
}

Frame CopyCheckingFiniteShared(UpdateThreads* threads, const void* data, size_t bytes) {
  if (!Splits(threads, bytes)) return Frame::CopyCheckingFinite(data, bytes);
  // Uninitialized, as Frame::CopyCheckingFinite's.
  std::shared_ptr<uint8_t[]> buf(new uint8_t[bytes]);
  uint8_t* p = buf.get();
  const bool finite = CopyAllFiniteInRanges(*threads, p, static_cast<const uint8_t*>(data), bytes);
  return Frame::CopiedCheckingFinite(Frame::Wrap(p, bytes, std::move(buf)), finite);
}

void StabilizeShared(UpdateThreads* threads, Message* m) {
  for (Frame& f : *m)
    if (f.unstable()) f = CopyCheckingFiniteShared(threads, f.data(), f.size());
}

bool HasUnstable(const Message& m) {
  for (const Frame& f : m)
    if (f.unstable()) return true;
  return false;
}

}  // namespace leash::ps
